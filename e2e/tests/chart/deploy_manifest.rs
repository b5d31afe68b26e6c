//! `deploy/kube-discovery.yaml`, the static install manifest:
//!
//! * it is exactly `helm template` of the chart (`deploy/render.sh`'s
//!   command) after the Namespace, so it never drifts from the chart;
//! * on both API servers, `kubectl apply --server-side -f deploy/` installs
//!   it, and the controller run as its Deployment says (both replicas, the
//!   in-cluster connection with the ServiceAccount token the kubelet would
//!   mount, see `install_support::run_pod`) elects a leader, passes its
//!   startup and readiness probes and writes the DiscoveredService; its dump
//!   and nodes APIs require the token of the Secret the README says to create.

use crate::chart_support;
use crate::install_support;

use chart_support::*;
use install_support::*;
use testenv::{Backend, both_backends};

const NS: &str = "kube-discovery";

/// The Secret holding the API token that `deploy/` requires (the user creates it).
const API_TOKEN_SECRET: &str = "kube-discovery-api-token";

/// The arguments `deploy/render.sh` gives `helm template` (and the README documents).
const HELM_ARGS: [&str; 6] = [
    "template",
    "kube-discovery",
    "CHART",
    "--namespace",
    NS,
    "--set=http.authTokenSecret.name=kube-discovery-api-token",
];

#[test]
fn deploy_manifest_is_the_rendered_chart() {
    let file = std::fs::read_to_string(repo_root().join("deploy/kube-discovery.yaml"))
        .expect("deploy/kube-discovery.yaml");
    let mut c = helm();
    let chart = chart_dir().display().to_string();
    c.args(HELM_ARGS.map(|a| if a == "CHART" { chart.as_str() } else { a }));
    let out = run(c);
    assert!(out.status.success(), "helm template:\n{}", text(&out));
    let rendered = String::from_utf8_lossy(&out.stdout).into_owned();
    let namespace =
        std::fs::read_to_string(repo_root().join("rbac/namespace.yaml")).expect("namespace");
    let Some(head) = file.strip_suffix(&rendered) else {
        panic!(
            "deploy/kube-discovery.yaml is not `helm {}` at its end: run deploy/render.sh",
            HELM_ARGS.join(" ")
        );
    };
    let Some(comments) = head.strip_suffix(&namespace) else {
        panic!("deploy/kube-discovery.yaml must start with rbac/namespace.yaml (after its header)");
    };
    assert!(
        comments.lines().all(|l| l.starts_with('#') || l == "---"),
        "only comments before the Namespace:\n{comments}"
    );
    // What it holds: everything a running controller needs, and no secret.
    let docs = parse_docs(&file);
    let kinds = kinds(&docs);
    for want in [
        "Namespace/kube-discovery",
        "CustomResourceDefinition/discoveredservices.kubediscovery.io",
        "ServiceAccount/kube-discovery",
        "ClusterRole/kube-discovery",
        "ClusterRoleBinding/kube-discovery",
        "Role/kube-discovery-leader-election",
        "RoleBinding/kube-discovery-leader-election",
        "ClusterRole/kube-discovery-view",
        "ClusterRole/kube-discovery-reader",
        "ConfigMap/kube-discovery",
        "Deployment/kube-discovery",
        "Service/kube-discovery",
        "PodDisruptionBudget/kube-discovery",
    ] {
        assert!(
            kinds.contains(&want.to_string()),
            "{want} missing: {kinds:?}"
        );
    }
    assert!(
        !kinds.iter().any(|k| k.starts_with("Secret/")),
        "a static manifest carries no secret: {kinds:?}"
    );
    // ... and is as safe as the chart (issue 29 item 4): the dump and nodes
    // APIs require the token of a Secret the user creates.
    let pod = &find(&docs, "Deployment", Some(NS))["spec"]["template"]["spec"];
    let auth = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == "http-auth");
    assert_eq!(
        auth.map(|v| &v["secret"]["secretName"]),
        Some(&serde_json::json!(API_TOKEN_SECRET)),
        "deploy/ must require an API token (the Secret {API_TOKEN_SECRET}): {auth:?}"
    );
    let config = find(&docs, "ConfigMap", Some(NS))["data"]["config.yaml"]
        .as_str()
        .expect("config.yaml");
    assert!(
        config.contains("auth_token_file: /etc/kube-discovery/http-auth/token"),
        "{config}"
    );
    // The script says the same (it is what the README tells to run).
    let out = run({
        let mut c = std::process::Command::new("bash");
        c.arg(repo_root().join("deploy/render.sh")).arg("--check");
        c
    });
    assert!(
        out.status.success(),
        "deploy/render.sh --check:\n{}",
        text(&out)
    );
}

#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deploy_manifest_installs_a_running_controller(backend: Backend) {
    let env = Env::start(backend).await;
    let deploy = repo_root().join("deploy").display().to_string();
    let out = env.kubectl_ok(&["apply", "--server-side", "-f", &deploy]);
    for obj in [
        "namespace/kube-discovery",
        "customresourcedefinition.apiextensions.k8s.io/discoveredservices.kubediscovery.io",
        "deployment.apps/kube-discovery",
        "clusterrole.rbac.authorization.k8s.io/kube-discovery-view",
    ] {
        assert!(
            out.contains(&format!("{obj} serverside-applied")),
            "apply output lacks {obj}:\n{out}"
        );
    }
    env.apply_yaml("backend.yaml", &backend_yaml(2));
    // The API token the README tells to create (the pods start once it exists).
    env.kubectl_ok(&[
        "-n",
        NS,
        "create",
        "secret",
        "generic",
        API_TOKEN_SECRET,
        "--from-literal=token=deploy-s3cret-token",
    ]);

    let dep = env.get_json(&["deployment", "kube-discovery", "-n", NS]);
    let replicas = dep["spec"]["replicas"].as_u64().expect("replicas");
    assert_eq!(replicas, 2, "the manifest runs two replicas");
    let container = dep["spec"]["template"]["spec"]["containers"][0].clone();
    let mut pods = Vec::new();
    for i in 0..replicas {
        pods.push(run_pod(&env, NS, "kube-discovery", &format!("kube-discovery-{i}")).await);
    }
    assert!(
        pods.iter()
            .all(|p| p.api_token.as_deref() == Some("deploy-s3cret-token")),
        "every replica requires the created API token"
    );
    {
        let mut refs: Vec<&mut Pod> = pods.iter_mut().collect();
        wait_nodes(&env, &mut refs, "shop", "web", &nodes(2)).await;
    }
    // One leader (the Lease the manifest's Role allows), every replica ready
    // by the Deployment's own probes.
    wait_for(60, "a Lease holder and every replica ready", |last| {
        for p in pods.iter_mut() {
            p.assert_alive();
        }
        let holder = env
            .get_opt(&["lease", "kube-discovery", "-n", NS])
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_string))
            .unwrap_or_default();
        let started = pods.iter().all(|p| p.probe_ok(&container["startupProbe"]));
        let ready = pods
            .iter()
            .all(|p| p.probe_ok(&container["readinessProbe"]));
        let live = pods.iter().all(|p| p.probe_ok(&container["livenessProbe"]));
        *last = format!("holder {holder:?}, started {started}, ready {ready}, live {live}");
        (pods.iter().any(|p| holder.starts_with(&p.name)) && started && ready && live).then_some(())
    })
    .await;
    // The API and `kubectl get dsvc -A` show it; the manifest's RBAC was enough.
    let (code, body) = pods[0]
        .get("/v1/discovery/kubernetes/nodes?service=shop/web:http")
        .expect("HTTP API");
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(body.trim()).expect("nodes JSON"),
        nodes(2)
    );
    let (code, body) = http_get(
        pods[0].http_port,
        "/v1/discovery/kubernetes/nodes?service=shop/web:http",
        None,
    )
    .expect("HTTP API");
    assert_eq!(code, 401, "no token, no nodes: {body}");
    let table = env.kubectl_ok(&["get", "dsvc", "-A"]);
    assert!(
        table
            .lines()
            .any(|l| l.split_whitespace().take(2).eq(["shop", "web"])),
        "{table}"
    );
    // It follows a change (the leader keeps writing with the manifest's RBAC).
    env.apply_yaml("backend3.yaml", &backend_yaml(3));
    {
        let mut refs: Vec<&mut Pod> = pods.iter_mut().collect();
        let v = wait_nodes(&env, &mut refs, "shop", "web", &nodes(3)).await;
        assert_eq!(
            v["status"]["nodeCount"], 3,
            "status written with the spec: {v}"
        );
    }
    for p in &pods {
        p.assert_no_forbidden();
    }
}
