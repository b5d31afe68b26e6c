//! Upgrading and reading access, on the API servers:
//!
//! * `chart_upgrade_updates_the_previous_crd_and_status_appears` (both): an
//!   install made with the previous version's CRD (committed fixture from git
//!   history, with the status subresource) runs the controller and its
//!   objects lack `status`; `helm upgrade --set crds.enabled=true
//!   --take-ownership` replaces the CRD with the chart's, and the next writes
//!   carry `status.nodeCount` and `status.ports` (and, once the controller
//!   tries the stamp again, `status.observedGeneration`, which the old CRD
//!   refused). `helm uninstall` leaves the
//!   CRD (`helm.sh/resource-policy: keep`) and the objects.
//! * `reader_role_lets_a_gateway_read_discoveredservices` (both): the chart's
//!   `<fullname>-reader` bound to a gateway's ServiceAccount in one namespace.
//! * `view_role_aggregation::real` (real only: kube-sim has no built-in
//!   `view` role and no clusterrole-aggregation controller): a user bound to
//!   the built-in `view` role can list DiscoveredServices (the chart's
//!   `<fullname>-view` is aggregated into it by kube-controller-manager) but
//!   not change them, and only where the binding is.

use crate::chart_support;
use crate::install_support;

use chart_support::*;
use install_support::*;
use serde_json::Value;
use testenv::{Backend, both_backends};

const NS: &str = "kube-discovery";
const RELEASE: &str = "kd";
const FULLNAME: &str = "kd-kube-discovery";
const CRD: &str = "discoveredservices.kubediscovery.io";

fn fixture() -> String {
    repo_root()
        .join("e2e/tests/testdata/crd-previous-status-subresource.yaml")
        .display()
        .to_string()
}

/// Whether the served version of the installed CRD has a status subresource.
fn status_subresource(env: &Env) -> bool {
    let crd = env.get_json(&["crd", CRD]);
    !crd["spec"]["versions"][0]["subresources"]["status"].is_null()
}

#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chart_upgrade_updates_the_previous_crd_and_status_appears(backend: Backend) {
    let env = Env::start(backend).await;
    let old = std::fs::read_to_string(fixture()).expect("fixture");
    assert!(
        old.contains("subresources:\n      status: {}"),
        "the fixture is the old CRD"
    );
    // Helm installs a chart's crds/ folder with a plain create, as here.
    env.kubectl_ok(&["create", "-f", &fixture()]);
    env.kubectl_ok(&["wait", "--for=condition=Established", &format!("crd/{CRD}")]);
    assert!(status_subresource(&env));
    env.apply_yaml("backend.yaml", &backend_yaml(2));

    let chart = chart_dir().display().to_string();
    env.helm_ok(&[
        "install",
        RELEASE,
        &chart,
        "--namespace",
        NS,
        "--create-namespace",
        "--set",
        "crds.enabled=false",
    ]);
    let mut pod = run_pod(&env, NS, FULLNAME, "kd-kube-discovery-0").await;
    let v = wait_nodes(&env, &mut [&mut pod], "shop", "web", &nodes(2)).await;
    // The old CRD drops the status the controller applies with the spec.
    assert!(
        v["status"]["nodeCount"].is_null() && v["status"]["ports"].is_null(),
        "the previous CRD keeps status out of the main resource: {v}"
    );
    // It does not declare `status.observedGeneration` either: the API server
    // refuses an apply carrying it (HTTP 500), so the controller said so
    // and wrote without it (the object above exists).
    let logs = pod.logs();
    assert!(
        logs.contains("does not declare status.observedGeneration"),
        "{logs}"
    );

    // The upgrade that takes the CRD over and updates it.
    let out = env.helm(&[
        "upgrade",
        RELEASE,
        &chart,
        "--namespace",
        NS,
        "--reuse-values",
        "--set",
        "crds.enabled=true",
    ]);
    assert!(
        !out.status.success() && text(&out).contains("invalid ownership metadata"),
        "without --take-ownership Helm refuses the CRD it does not own (documented):\n{}",
        text(&out)
    );
    // Helm 4 applies server-side: the old CRD's `spec.versions` (an atomic
    // list) belongs to the manager that created it ("kubectl-create" here, as
    // with Helm's crds/ install), so without --force-conflicts the apply is a
    // conflict (both API servers say so).
    let out = env.helm(&[
        "upgrade",
        RELEASE,
        &chart,
        "--namespace",
        NS,
        "--reuse-values",
        "--set",
        "crds.enabled=true",
        "--take-ownership",
    ]);
    assert!(
        !out.status.success() && text(&out).contains("conflict"),
        "the documented --force-conflicts is needed:\n{}",
        text(&out)
    );
    env.helm_ok(&[
        "upgrade",
        RELEASE,
        &chart,
        "--namespace",
        NS,
        "--reuse-values",
        "--set",
        "crds.enabled=true",
        "--take-ownership",
        "--force-conflicts",
    ]);
    wait_for(30, "the CRD without the status subresource", |last| {
        let crd = env.get_json(&["crd", CRD]);
        *last = crd["spec"]["versions"][0].to_string();
        (!status_subresource(&env)).then_some(())
    })
    .await;
    let crd = env.get_json(&["crd", CRD]);
    assert_eq!(
        crd["metadata"]["annotations"]["helm.sh/resource-policy"],
        "keep"
    );
    assert_eq!(
        crd["metadata"]["annotations"]["meta.helm.sh/release-name"],
        RELEASE
    );
    assert_eq!(
        crd["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "Helm"
    );

    // The next write of a changed object, and a new object, carry the status.
    env.apply_yaml("backend3.yaml", &backend_yaml(3));
    env.apply_yaml(
        "api.yaml",
        r#"apiVersion: v1
kind: Service
metadata: {name: api, namespace: shop}
spec:
  ports: [{name: grpc, port: 9000}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: api-1
  namespace: shop
  labels: {kubernetes.io/service-name: api}
addressType: IPv4
ports: [{name: grpc, port: 9000, protocol: TCP}]
endpoints:
  - addresses: ["10.0.1.1"]
"#,
    );
    let status = |v: &Value| {
        (
            v["status"]["nodeCount"].clone(),
            v["status"]["ports"].clone(),
        )
    };
    wait_for(60, "status on shop/web and shop/api", |last| {
        pod.assert_alive();
        let web = env.get_opt(&["dsvc", "web", "-n", "shop"]);
        let api = env.get_opt(&["dsvc", "api", "-n", "shop"]);
        let got = (web.as_ref().map(status), api.as_ref().map(status));
        *last = format!("{got:?}\n{}", pod.logs());
        (got == (
            Some((serde_json::json!(3), serde_json::json!("http"))),
            Some((serde_json::json!(1), serde_json::json!("grpc"))),
        ))
            .then_some(())
    })
    .await;
    // The columns of `kubectl get dsvc` are filled again (READY too).
    let table = env.kubectl_ok(&["get", "dsvc", "-n", "shop"]);
    let web = table
        .lines()
        .find(|l| l.starts_with("web "))
        .unwrap_or_else(|| panic!("{table}"));
    assert_eq!(
        web.split_whitespace().take(4).collect::<Vec<_>>(),
        ["web", "True", "http", "3"],
        "{table}"
    );
    // Stamping is tried again 10 s after the refusal: the next write after
    // that carries `observedGeneration` (the CRD declares it now).
    tokio::time::sleep(std::time::Duration::from_secs(11)).await;
    env.apply_yaml("backend2.yaml", &backend_yaml(2));
    wait_for(60, "observedGeneration on shop/web", |last| {
        pod.assert_alive();
        let web = env.get_opt(&["dsvc", "web", "-n", "shop"]);
        *last = format!("{web:?}\n{}", pod.logs());
        web.filter(|v| {
            v["status"]["nodeCount"] == 2
                && v["status"]["observedGeneration"] == v["metadata"]["generation"]
        })
        .map(|_| ())
    })
    .await;
    pod.assert_no_forbidden();
    drop(pod);

    // Uninstall keeps the CRD and the objects (resource-policy keep).
    let out = env.helm_ok(&["uninstall", RELEASE, "--namespace", NS]);
    assert!(out.contains("kept due to the resource policy"), "{out}");
    assert!(env.get_opt(&["crd", CRD]).is_some(), "the CRD stays");
    assert!(
        env.get_opt(&["dsvc", "web", "-n", "shop"]).is_some(),
        "its objects stay"
    );
}

/// A DiscoveredService written by hand (as the controller would), for the
/// read-access tests that need no controller.
const DSVC: &str = r#"apiVersion: kubediscovery.io/v1alpha1
kind: DiscoveredService
metadata:
  name: web
  namespace: shop
  labels: {app.kubernetes.io/managed-by: kube-discovery}
spec:
  service: shop/web
  source: EndpointSlice
  sourceName: web
  sourceNamespace: shop
  version: 0123456789abcdef
  ports:
    http: [{host: 10.0.0.1, port: 8080, weight: 50}]
"#;

/// kubectl with another identity's token (a kubeconfig of its own).
fn kubectl_as(env: &Env, who: &str, token: &str, args: &[&str]) -> std::process::Output {
    let kc = env.path(&format!("kubeconfig-{who}"));
    env.api.write_kubeconfig(&kc, token).expect("kubeconfig");
    let mut c = std::process::Command::new(tool("kubectl-1.34"));
    c.args(args).env("KUBECONFIG", &kc);
    tokio::task::block_in_place(|| run(c))
}

/// A RoleBinding in `shop` of ClusterRole `role` to one subject (YAML:
/// kube-sim takes no protobuf RoleBindings, which `kubectl create rolebinding` sends).
fn binding(name: &str, role: &str, subject: &str) -> String {
    format!(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {{name: {name}, namespace: shop}}\n\
         roleRef: {{apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: {role}}}\n\
         subjects:\n  - {subject}\n"
    )
}

fn install_with_objects(env: &Env) {
    let deploy = repo_root().join("deploy").display().to_string();
    env.kubectl_ok(&["apply", "--server-side", "-f", &deploy]);
    env.kubectl_ok(&["create", "namespace", "shop"]);
    env.kubectl_ok(&["create", "namespace", "other"]);
    env.apply_yaml("dsvc.yaml", DSVC);
    env.apply_yaml(
        "dsvc-other.yaml",
        &DSVC.replace("namespace: shop", "namespace: other"),
    );
}

#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reader_role_lets_a_gateway_read_discoveredservices(backend: Backend) {
    let env = Env::start(backend).await;
    install_with_objects(&env);
    env.kubectl_ok(&["create", "namespace", "edge"]);
    env.kubectl_ok(&["create", "serviceaccount", "gateway", "-n", "edge"]);
    let token = env.api.issue_token("edge", "gateway").await.expect("token");
    let list = |ns: &str| {
        kubectl_as(
            &env,
            "gateway",
            &token,
            &["get", "dsvc", "-n", ns, "-o", "name"],
        )
    };
    assert!(
        text(&list("shop")).contains("forbidden"),
        "no access before the binding: {}",
        text(&list("shop"))
    );
    env.apply_yaml(
        "binding.yaml",
        &binding(
            "gateway-dsvc",
            "kube-discovery-reader",
            "kind: ServiceAccount\n    name: gateway\n    namespace: edge",
        ),
    );
    let out = wait_for(30, "the gateway lists shop's DiscoveredServices", |last| {
        let out = list("shop");
        *last = text(&out);
        out.status.success().then_some(out)
    })
    .await;
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "discoveredservice.kubediscovery.io/web"
    );
    let one = kubectl_as(
        &env,
        "gateway",
        &token,
        &["get", "dsvc", "web", "-n", "shop", "-o", "json"],
    );
    assert!(one.status.success(), "get: {}", text(&one));
    assert!(
        text(&list("other")).contains("forbidden"),
        "only where bound"
    );
    let del = kubectl_as(
        &env,
        "gateway",
        &token,
        &["delete", "dsvc", "web", "-n", "shop"],
    );
    assert!(
        !del.status.success() && text(&del).contains("forbidden"),
        "read only: {}",
        text(&del)
    );
}

mod view_role_aggregation {
    use super::*;

    /// The real control plane only (see the file's doc): test name `::real`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn real() {
        let env = Env::start(Backend::Real).await;
        install_with_objects(&env);
        let token = env.api.user_token("alice").expect("alice's token");
        let as_alice = |args: &[&str]| kubectl_as(&env, "alice", &token, args);
        let before = as_alice(&["get", "dsvc", "-n", "shop"]);
        assert!(
            text(&before).contains("forbidden"),
            "alice has no access yet: {}",
            text(&before)
        );
        env.apply_yaml(
            "binding.yaml",
            &binding(
                "alice-view",
                "view",
                "kind: User\n    name: alice\n    apiGroup: rbac.authorization.k8s.io",
            ),
        );
        // kube-controller-manager aggregates kube-discovery-view into view (and edit, admin).
        let out = wait_for(
            60,
            "alice (view in shop) lists DiscoveredServices",
            |last| {
                let out = as_alice(&["get", "dsvc", "-n", "shop", "-o", "name"]);
                *last = text(&out);
                out.status.success().then_some(out)
            },
        )
        .await;
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "discoveredservice.kubediscovery.io/web"
        );
        let watch = as_alice(&[
            "get",
            "dsvc",
            "-n",
            "shop",
            "--watch-only",
            "--request-timeout=2s",
        ]);
        assert!(
            !text(&watch).contains("forbidden"),
            "view includes watch: {}",
            text(&watch)
        );
        assert!(
            text(&as_alice(&["get", "dsvc", "-n", "other"])).contains("forbidden"),
            "only where bound"
        );
        let del = as_alice(&["delete", "dsvc", "web", "-n", "shop"]);
        assert!(
            text(&del).contains("forbidden"),
            "view is read only: {}",
            text(&del)
        );
        for role in ["view", "edit", "admin"] {
            let r = env.get_json(&["clusterrole", role]);
            let has = r["rules"].as_array().into_iter().flatten().any(|rule| {
                rule["resources"]
                    .as_array()
                    .is_some_and(|rs| rs.iter().any(|x| x == "discoveredservices"))
                    && rule["verbs"].as_array().is_some_and(|v| {
                        ["get", "list", "watch"]
                            .iter()
                            .all(|w| v.iter().any(|x| x == w))
                    })
            });
            assert!(
                has,
                "{role} aggregates the DiscoveredService read rule: {}",
                r["rules"]
            );
        }
    }
}
