//! Real kubectl (v1.32 and v1.34 from `.tools/bin`) against kube-sim and the
//! real API server (`#[both_backends]`), over verified TLS: namespaces,
//! client-side and server-side apply, get -o json, watch, selectors, a CRD
//! with printer columns, patch, delete, and RBAC denial. The real server runs
//! without kube-controller-manager (nothing rewrites the applied Endpoints,
//! as on kube-sim).

use crate::sim_support;

use std::io::{BufRead, BufReader};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use sim_support::{Backend, Cli, Cluster, assert_alive, cluster, direct_kubeconfig, options};
use testenv::both_backends;

/// What kubectl prints for every request to v1 Endpoints (v1.33+ servers).
const ENDPOINTS_DEPRECATED: &str =
    "Warning: v1 Endpoints is deprecated in v1.33+; use discovery.k8s.io/v1 EndpointSlice";

const NS2: &str =
    "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: demo2\n  labels: {team: blue}\n";

fn workloads(ip: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Service
metadata:
  name: web
  namespace: demo
  labels: {{app: web, tier: front}}
spec:
  selector: {{app: web}}
  ports:
  - name: http
    port: 80
    targetPort: 8080
---
apiVersion: v1
kind: Endpoints
metadata:
  name: web
  namespace: demo
  labels: {{app: web}}
subsets:
- addresses:
  - ip: {ip}
  ports:
  - name: http
    port: 8080
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-abc
  namespace: demo
  labels: {{kubernetes.io/service-name: web, app: web}}
addressType: IPv4
endpoints:
- addresses: [{ip}]
  conditions: {{ready: true}}
ports:
- name: http
  port: 8080
  protocol: TCP
"#
    )
}

const SSA: &str = r#"apiVersion: v1
kind: Service
metadata:
  name: api
  namespace: demo
  labels: {app: api, tier: back}
spec:
  ports:
  - name: grpc
    port: 9000
---
apiVersion: v1
kind: Endpoints
metadata:
  name: api
  namespace: demo
  labels: {app: api}
subsets:
- addresses:
  - ip: 10.1.0.1
  - ip: 10.1.0.2
  ports:
  - name: grpc
    port: 9000
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: api-1
  namespace: demo
  labels: {kubernetes.io/service-name: api}
addressType: IPv4
endpoints:
- addresses: [10.1.0.1]
- addresses: [10.1.0.2]
ports:
- name: grpc
  port: 9000
"#;

const CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wg]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    additionalPrinterColumns:
    - {name: Size, type: integer, jsonPath: .spec.size}
    - {name: Color, type: string, jsonPath: .spec.color}
    - {name: Age, type: date, jsonPath: .metadata.creationTimestamp}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [size]
            properties:
              size: {type: integer, minimum: 1, maximum: 10}
              color: {type: string, enum: [red, blue]}
          status:
            type: object
            x-kubernetes-preserve-unknown-fields: true
"#;

const WIDGET: &str = "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w1, namespace: demo, labels: {team: a}}\nspec: {size: 3, color: red}\n";

/// The client version of `bin` (`kubectl version --client -o json`) must be
/// `want` (`"1.32"`): a test named after a kubectl version really runs it.
fn assert_kubectl_version(bin: &str, want: &str) {
    let path = sim_support::tool(bin);
    let out = std::process::Command::new(&path)
        .args(["version", "--client", "-o", "json"])
        .output()
        .unwrap_or_else(|e| panic!("{} does not run: {e}", path.display()));
    assert!(
        out.status.success(),
        "{} version failed: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("version JSON");
    let git = v["clientVersion"]["gitVersion"].as_str().unwrap_or("");
    assert!(
        git.starts_with(&format!("v{want}.")),
        "{} is kubectl {git:?}, not v{want}: this test needs kubectl v{want} there \
         (e2e/tools/install-tools.sh links .tools/bin/kubectl to the machine's kubectl, \
         expected to be v1.32, and installs kubectl-1.34)",
        path.display()
    );
}

/// Polls `cli args` until it succeeds (RBAC grants take effect a moment
/// later on the real server: its authorizer reads them through an informer).
fn eventually_ok(cli: &Cli, args: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = cli.run(args);
        if out.status.success() {
            return String::from_utf8_lossy(&out.stdout).into_owned();
        }
        assert!(
            Instant::now() < deadline,
            "{args:?} kept failing: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        #[expect(
            clippy::disallowed_methods,
            reason = "a synchronous test helper retrying a kubectl command"
        )]
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The scenario (blocking: run it in `block_in_place`).
fn scenario(cl: &Cluster, bin: &'static str) {
    let rt = tokio::runtime::Handle::current();
    let k = Cli::with_kubeconfig(&direct_kubeconfig(cl, &cl.admin_token()), bin);

    // Namespaces: the generator (protobuf body) and a manifest.
    assert!(
        k.ok(&["create", "namespace", "demo"])
            .contains("namespace/demo created")
    );
    let ns2 = k.write("ns2.yaml", NS2);
    k.ok(&["apply", "-f", ns2.to_str().expect("path")]);
    let names = k.ok(&["get", "namespaces", "-o", "name"]);
    for ns in ["namespace/default", "namespace/demo", "namespace/demo2"] {
        assert!(names.lines().any(|l| l == ns), "{ns} missing in {names}");
    }
    assert_eq!(
        k.ok(&["get", "ns", "-l", "team=blue", "-o", "name"]).trim(),
        "namespace/demo2"
    );

    // Client-side apply: created, unchanged, configured.
    let m1 = k.write("w1.yaml", &workloads("10.0.0.1"));
    let m1 = m1.to_str().expect("path");
    let (out, err) = k.ok_with_stderr(&["apply", "-f", m1]);
    assert!(
        err.lines().any(|l| l == ENDPOINTS_DEPRECATED),
        "the deprecation warning of v1 Endpoints: {err}"
    );
    for line in [
        "service/web created",
        "endpoints/web created",
        "endpointslice.discovery.k8s.io/web-abc created",
    ] {
        assert!(out.contains(line), "{line:?} not in {out}");
    }
    // Applying the same manifest again: unchanged, but for the Endpoints,
    // whose ports the server gave their default protocol (TCP): `subsets`
    // has no patch merge key, so kubectl's three-way patch replaces it.
    let out = k.ok(&["apply", "-f", m1]);
    for line in [
        "service/web unchanged",
        "endpoints/web configured",
        "endpointslice.discovery.k8s.io/web-abc unchanged",
    ] {
        assert!(out.contains(line), "{line:?} not in {out}");
    }
    let m2 = k.write("w2.yaml", &workloads("10.0.0.2"));
    let out = k.ok(&["apply", "-f", m2.to_str().expect("path")]);
    assert!(
        out.contains("endpointslice.discovery.k8s.io/web-abc configured"),
        "{out}"
    );
    assert!(out.contains("service/web unchanged"), "{out}");

    // get -o json returns what was applied, with server-filled fields.
    let slice = k.json(&[
        "-n",
        "demo",
        "get",
        "endpointslice",
        "web-abc",
        "-o",
        "json",
    ]);
    assert_eq!(slice["endpoints"][0]["addresses"][0], "10.0.0.2");
    assert!(
        slice["metadata"]["uid"]
            .as_str()
            .is_some_and(|u| !u.is_empty())
    );
    let svc = k.json(&["-n", "demo", "get", "svc", "web", "-o", "json"]);
    assert!(
        svc["spec"]["clusterIP"]
            .as_str()
            .is_some_and(|ip| ip.starts_with("10.96.")),
        "{svc}"
    );
    assert_eq!(svc["spec"]["ports"][0]["protocol"], "TCP");

    // Server-side apply.
    let ssa = k.write("ssa.yaml", SSA);
    let out = k.ok(&["apply", "--server-side", "-f", ssa.to_str().expect("path")]);
    for line in [
        "service/api serverside-applied",
        "endpoints/api serverside-applied",
        "endpointslice.discovery.k8s.io/api-1 serverside-applied",
    ] {
        assert!(out.contains(line), "{line:?} not in {out}");
    }
    let ep = k.json(&[
        "-n",
        "demo",
        "get",
        "endpoints",
        "api",
        "-o",
        "json",
        "--show-managed-fields",
    ]);
    let ips: Vec<&str> = ep["subsets"][0]["addresses"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x["ip"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(ips, ["10.1.0.1", "10.1.0.2"], "{ep}");
    assert_eq!(ep["subsets"][0]["ports"][0]["port"], 9000, "{ep}");
    assert!(
        ep["metadata"]["managedFields"].as_array().is_some_and(|m| m
            .iter()
            .any(|f| f["manager"] == "kubectl" && f["operation"] == "Apply")),
        "no kubectl Apply entry in {ep}"
    );
    let api = k.json(&[
        "-n",
        "demo",
        "get",
        "endpointslice",
        "api-1",
        "-o",
        "json",
        "--show-managed-fields",
    ]);
    assert_eq!(api["endpoints"].as_array().map(Vec::len), Some(2));

    // Label and field selectors.
    let by_label = |sel: &str| k.ok(&["-n", "demo", "get", "svc", "-l", sel, "-o", "name"]);
    assert_eq!(by_label("tier in (front)").trim(), "service/web");
    assert_eq!(by_label("tier notin (front)").trim(), "service/api");
    assert_eq!(by_label("app,!missing").lines().count(), 2);
    assert_eq!(by_label("app!=web").trim(), "service/api");
    let by_field = |sel: &str| k.ok(&["get", "svc", "-A", "--field-selector", sel, "-o", "name"]);
    assert_eq!(by_field("metadata.name=api").trim(), "service/api");
    assert_eq!(
        by_field("metadata.name!=api,metadata.namespace==demo").trim(),
        "service/web"
    );
    // Services can also be selected by spec.type and spec.clusterIP.
    let out = k.ok(&[
        "-n",
        "demo",
        "get",
        "svc",
        "--field-selector",
        "spec.type=ClusterIP",
        "-o",
        "name",
    ]);
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        ["service/api", "service/web"]
    );
    let ip = svc["spec"]["clusterIP"].as_str().expect("clusterIP");
    assert_eq!(
        by_field(&format!("spec.clusterIP={ip}")).trim(),
        "service/web"
    );
    let err = k.fails(&["get", "svc", "-A", "--field-selector", "spec.selector=x"]);
    assert!(
        err.contains("field label not supported: spec.selector"),
        "{err}"
    );
    let err = k.fails(&["get", "cm", "-A", "--field-selector", "data.k=v"]);
    assert!(
        err.contains(
            r#""data.k" is not a known field selector: only "metadata.name", "metadata.namespace""#
        ),
        "{err}"
    );

    // get --watch sees a change.
    let mut child = k.spawn(&[
        "-n",
        "demo",
        "get",
        "endpoints",
        "web",
        "--watch",
        "-o",
        "jsonpath={.subsets[0].addresses[0].ip}{\"\\n\"}",
    ]);
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    assert_eq!(
        rx.recv_timeout(Duration::from_secs(20))
            .expect("initial watch line"),
        "10.0.0.2"
    );
    k.ok(&[
        "-n",
        "demo",
        "patch",
        "endpoints",
        "web",
        "--type=json",
        "-p",
        r#"[{"op":"replace","path":"/subsets/0/addresses/0/ip","value":"10.0.0.9"}]"#,
    ]);
    let seen = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("watch saw the change");
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(seen, "10.0.0.9");

    // A CRD: served after apply, printer columns, patch, delete.
    let crd = k.write("crd.yaml", CRD);
    k.ok(&["apply", "-f", crd.to_str().expect("path")]);
    k.ok(&[
        "wait",
        "--for=condition=Established",
        "crd/widgets.example.com",
        "--timeout=20s",
    ]);
    let crds = k.ok(&["get", "crd"]);
    let header: Vec<&str> = crds
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(header, ["NAME", "CREATED", "AT"], "{crds}");
    assert!(crds.contains("widgets.example.com"), "{crds}");
    let w = k.write("widget.yaml", WIDGET);
    assert!(
        k.ok(&["apply", "-f", w.to_str().expect("path")])
            .contains("widget.example.com/w1 created")
    );
    let table = k.ok(&["-n", "demo", "get", "widgets"]);
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().expect("header").split_whitespace().collect();
    assert_eq!(header, ["NAME", "SIZE", "COLOR", "AGE"], "{table}");
    let row: Vec<&str> = lines.next().expect("row").split_whitespace().collect();
    assert_eq!(&row[..3], ["w1", "3", "red"], "{table}");
    k.ok(&[
        "-n",
        "demo",
        "patch",
        "wg",
        "w1",
        "--type=merge",
        "-p",
        r#"{"spec":{"size":5}}"#,
    ]);
    let got = k.ok(&[
        "-n",
        "demo",
        "get",
        "widget",
        "w1",
        "-o",
        "jsonpath={.spec.size}/{.metadata.generation}",
    ]);
    assert_eq!(got, "5/2");
    assert_eq!(
        k.ok(&["-n", "demo", "get", "widgets", "-l", "team=a", "-o", "name"])
            .trim(),
        "widget.example.com/w1"
    );
    assert!(
        k.ok(&["-n", "demo", "delete", "widget", "w1"])
            .contains("widget.example.com \"w1\" deleted")
    );
    let err = k.fails(&["-n", "demo", "get", "widget", "w1"]);
    assert!(
        err.contains("NotFound") && err.contains("widgets.example.com \"w1\" not found"),
        "{err}"
    );

    // delete
    k.ok(&["-n", "demo", "delete", "svc", "web"]);
    let err = k.fails(&["-n", "demo", "get", "svc", "web"]);
    assert!(err.contains("services \"web\" not found"), "{err}");

    // RBAC: a ServiceAccount token is denied until a Role grants access.
    let token = rt
        .block_on(cl.issue_token("demo", "viewer"))
        .expect("token");
    let viewer = Cli::with_kubeconfig(&direct_kubeconfig(cl, &token), bin);
    let err = viewer.fails(&["-n", "demo", "get", "configmaps"]);
    assert!(
        err.contains(r#"Error from server (Forbidden): configmaps is forbidden: User "system:serviceaccount:demo:viewer" cannot list resource "configmaps" in API group "" in the namespace "demo""#),
        "{err}"
    );
    let can_i = |cli: &Cli| {
        let out = cli.run(&["auth", "can-i", "list", "configmaps", "-n", "demo"]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(can_i(&viewer), "no");
    let rbac = k.write(
        "rbac.yaml",
        r#"apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: cm-reader, namespace: demo}
rules:
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: viewer-cm, namespace: demo}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: cm-reader}
subjects:
- {kind: ServiceAccount, name: viewer, namespace: demo}
"#,
    );
    k.ok(&["apply", "-f", rbac.to_str().expect("path")]);
    k.ok(&[
        "-n",
        "demo",
        "create",
        "configmap",
        "c1",
        "--from-literal=a=b",
    ]);
    assert_eq!(
        eventually_ok(&viewer, &["-n", "demo", "get", "configmaps", "-o", "name"]).trim(),
        "configmap/c1"
    );
    assert_eq!(can_i(&viewer), "yes");
    assert_eq!(can_i(&k), "yes");
    let err = viewer.fails(&["-n", "demo2", "get", "configmaps"]);
    assert!(err.contains("(Forbidden)"), "{err}");
    let err = viewer.fails(&["-n", "demo", "delete", "configmap", "c1"]);
    assert!(err.contains(r#"configmaps "c1" is forbidden"#), "{err}");

    // Server-side apply recorded its field manager.
    let managers: Vec<&str> = api["metadata"]["managedFields"]
        .as_array()
        .map(|a| a.iter().filter_map(|m| m["manager"].as_str()).collect())
        .unwrap_or_default();
    assert!(
        managers.contains(&"kubectl"),
        "managedFields managers: {managers:?}"
    );
}

async fn against(backend: Backend, bin: &'static str, version: &str) {
    assert_kubectl_version(bin, version);
    let cl = cluster(backend, options(true)).await;
    tokio::task::block_in_place(|| scenario(&cl, bin));
    assert_alive(&cl);
}

#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_32(backend: Backend) {
    against(backend, "kubectl", "1.32").await;
}

#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_1_34(backend: Backend) {
    against(backend, "kubectl-1.34", "1.34").await;
}
