//! Chart tests on both API servers (kube-sim and the real kube-apiserver),
//! driving the real `kubectl` and `helm` binaries as a user would:
//!
//! * `kubectl apply -f rbac/ -f crds/` (the no-Helm path) and the rendered
//!   chart (default and multi-cluster values) accepted by `--dry-run=server`
//!   with kubectl v1.34 and the machine's kubectl, storing nothing;
//! * `helm install` → `helm upgrade` (changed config rolls the checksum) →
//!   `helm uninstall` leaving nothing behind but the CRD;
//! * `xds.enabled`: the xDS Service and token Secret installed, the generated
//!   token kept across an upgrade, both gone when xDS is turned off;
//! * the controller binary run the way the chart runs it: the config read
//!   back from the installed ConfigMap, the chart ServiceAccount's token, RBAC
//!   enforced by the API server; `kubectl get dsvc -A` shows the expected object.

use crate::chart_support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use chart_support::*;
use serde_json::Value;
use testenv::{Backend, Cluster, Options, both_backends};

const NS: &str = "kube-discovery";
const RELEASE: &str = "kd";
const FULLNAME: &str = "kd-kube-discovery";

/// A Service with one EndpointSlice: two ready endpoints (one with `ready`
/// absent, which means ready) and one not ready.
const BACKEND: &str = r#"apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  selector: {app: web}
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-abcde
  namespace: shop
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
  - addresses: ["10.0.0.2"]
    conditions: {ready: true}
  - addresses: ["10.0.0.1"]
  - addresses: ["10.0.0.3"]
    conditions: {ready: false}
"#;

/// An API server (kube-sim with TLS, or the real one) with an admin
/// kubeconfig in a temporary directory.
struct Env {
    api: Cluster,
    dir: tempfile::TempDir,
    kubeconfig: PathBuf,
}

impl Env {
    async fn start(backend: Backend) -> Env {
        let api = Cluster::start(
            backend,
            Options {
                tls: true,
                ..Options::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("start the {} API server: {e:#}", backend.name()));
        let dir = tempfile::tempdir().expect("temp dir");
        let kubeconfig = dir.path().join("kubeconfig");
        api.write_kubeconfig(&kubeconfig, &api.admin_token())
            .expect("kubeconfig");
        Env {
            api,
            dir,
            kubeconfig,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Runs a command without blocking the runtime's other workers (kube-sim
    /// serves on them).
    fn exec(&self, mut cmd: Command) -> Output {
        cmd.env("KUBECONFIG", &self.kubeconfig);
        tokio::task::block_in_place(|| run(cmd))
    }

    fn kubectl_bin(&self, bin: &str, args: &[&str]) -> Output {
        let mut c = Command::new(tool(bin));
        c.args(args);
        self.exec(c)
    }

    fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_bin("kubectl-1.34", args)
    }

    /// kubectl that must succeed; returns stdout.
    fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed:\n{}",
            text(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn helm_ok(&self, args: &[&str]) -> String {
        let mut c = helm();
        c.args(args);
        let out = self.exec(c);
        assert!(
            out.status.success(),
            "helm {args:?} failed:\n{}",
            text(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl get <kind> <name> [-n ns]` exit status as "exists".
    fn exists(&self, kind: &str, name: &str, ns: Option<&str>) -> bool {
        let mut args = vec!["get", kind, name, "-o", "name"];
        if let Some(ns) = ns {
            args.extend(["-n", ns]);
        }
        let out = self.kubectl(&args);
        if out.status.success() {
            return true;
        }
        let t = text(&out);
        assert!(
            t.contains("NotFound") || t.contains("not found"),
            "kubectl {args:?}: unexpected error:\n{t}"
        );
        false
    }
}

/// The release's objects: (kubectl kind, name, namespace).
fn release_objects() -> Vec<(&'static str, String, Option<&'static str>)> {
    vec![
        ("serviceaccount", FULLNAME.into(), Some(NS)),
        ("configmap", FULLNAME.into(), Some(NS)),
        ("clusterrole", FULLNAME.into(), None),
        ("clusterrolebinding", FULLNAME.into(), None),
        ("role", format!("{FULLNAME}-leader-election"), Some(NS)),
        (
            "rolebinding",
            format!("{FULLNAME}-leader-election"),
            Some(NS),
        ),
        ("service", FULLNAME.into(), Some(NS)),
        ("deployment", FULLNAME.into(), Some(NS)),
        ("poddisruptionbudget", FULLNAME.into(), Some(NS)),
        ("secret", format!("{FULLNAME}-api-token"), Some(NS)),
        ("clusterrole", format!("{FULLNAME}-view"), None),
        ("clusterrole", format!("{FULLNAME}-reader"), None),
    ]
}

fn write_rendered(env: &Env, name: &str, args: &[&str]) -> (PathBuf, usize) {
    let out = run(template_cmd(RELEASE, NS, args));
    assert!(
        out.status.success(),
        "helm template {args:?}:\n{}",
        text(&out)
    );
    let yaml = String::from_utf8_lossy(&out.stdout).into_owned();
    let count = parse_docs(&yaml).len();
    let p = env.path(name);
    std::fs::write(&p, yaml).expect("write rendered chart");
    (p, count)
}

#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chart_plain_rbac_applies_and_rendered_chart_passes_server_dry_run(backend: Backend) {
    let env = Env::start(backend).await;
    let root = repo_root();
    let (rbac, crds) = (root.join("rbac"), root.join("crds"));
    // The no-Helm path from the README.
    let out = env.kubectl_ok(&[
        "apply",
        "-f",
        &rbac.display().to_string(),
        "-f",
        &crds.display().to_string(),
    ]);
    for obj in [
        "namespace/kube-discovery",
        "serviceaccount/kube-discovery",
        "clusterrole.rbac.authorization.k8s.io/kube-discovery",
        "clusterrolebinding.rbac.authorization.k8s.io/kube-discovery",
        "role.rbac.authorization.k8s.io/kube-discovery-leader-election",
        "rolebinding.rbac.authorization.k8s.io/kube-discovery-leader-election",
        "customresourcedefinition.apiextensions.k8s.io/discoveredservices.kubediscovery.io",
    ] {
        assert!(
            out.contains(&format!("{obj} created")),
            "apply output lacks {obj}:\n{out}"
        );
    }
    for f in [
        "rbac/optional/configmap-snapshot.yaml",
        "rbac/remote/remote-reader.yaml",
    ] {
        env.kubectl_ok(&[
            "apply",
            "--dry-run=server",
            "-f",
            &root.join(f).display().to_string(),
        ]);
    }

    let multi = chart_dir()
        .join("ci/multi-cluster-values.yaml")
        .display()
        .to_string();
    for (file, args) in [
        ("default.yaml", vec![]),
        ("multi.yaml", vec!["-f", multi.as_str()]),
        // xDS on with the objects it adds (Service with appProtocol, token
        // Secret, TLS volumes; not the NetworkPolicy: kube-sim serves no
        // networking.k8s.io).
        (
            "xds.yaml",
            vec![
                "--set",
                "xds.enabled=true,xds.tls.secretName=xds-cert,xds.tls.clientCA.secretName=xds-cert",
            ],
        ),
    ] {
        let (path, count) = write_rendered(&env, file, &args);
        assert!(count >= 9, "{file}: {count} objects");
        for bin in ["kubectl-1.34", "kubectl"] {
            let out = env.kubectl_bin(
                bin,
                &[
                    "apply",
                    "--dry-run=server",
                    "-f",
                    &path.display().to_string(),
                ],
            );
            let t = text(&out);
            assert!(
                out.status.success(),
                "{bin} apply --dry-run=server {file} failed:\n{t}"
            );
            assert_eq!(
                t.matches("(server dry run)").count(),
                count,
                "{bin} {file}: one line per object:\n{t}"
            );
        }
    }
    // A dry run stores nothing.
    for (kind, name, ns) in release_objects() {
        assert!(
            !env.exists(kind, &name, ns),
            "{kind}/{name} exists after a dry run"
        );
    }
}

#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chart_helm_install_upgrade_uninstall_leaves_only_the_crd(backend: Backend) {
    let env = Env::start(backend).await;
    let chart = chart_dir().display().to_string();
    env.helm_ok(&[
        "install",
        RELEASE,
        &chart,
        "--namespace",
        NS,
        "--create-namespace",
    ]);
    assert!(
        env.exists("crd", "discoveredservices.kubediscovery.io", None),
        "helm installs the CRD (templates/crd.yaml, crds.enabled)"
    );
    for (kind, name, ns) in release_objects() {
        assert!(
            env.exists(kind, &name, ns),
            "{kind}/{name} missing after helm install"
        );
    }
    let checksum = |env: &Env| {
        env.kubectl_ok(&[
            "get",
            "deployment",
            FULLNAME,
            "-n",
            NS,
            "-o",
            "jsonpath={.spec.template.metadata.annotations.checksum/config}",
        ])
    };
    let config = |env: &Env| {
        env.kubectl_ok(&[
            "get",
            "configmap",
            FULLNAME,
            "-n",
            NS,
            "-o",
            "jsonpath={.data.config\\.yaml}",
        ])
    };
    let api_token = |env: &Env| {
        env.kubectl_ok(&[
            "get",
            "secret",
            &format!("{FULLNAME}-api-token"),
            "-n",
            NS,
            "-o",
            "jsonpath={.data.token}",
        ])
    };
    let token_before = api_token(&env);
    assert!(!token_before.is_empty(), "the generated API token");
    let before = checksum(&env);
    assert_eq!(before.len(), 64, "checksum annotation: {before:?}");
    assert!(config(&env).contains("drain_terminating: false"));

    env.helm_ok(&[
        "upgrade",
        RELEASE,
        &chart,
        "--namespace",
        NS,
        "--set",
        "controller.drainTerminating=true",
    ]);
    assert!(
        config(&env).contains("drain_terminating: true"),
        "upgrade changed the ConfigMap"
    );
    let after = checksum(&env);
    assert_ne!(
        before, after,
        "a config change must change the pod template (rolls the pods)"
    );
    assert_eq!(
        api_token(&env),
        token_before,
        "the generated API token survives an upgrade (lookup)"
    );
    let history = env.helm_ok(&["history", RELEASE, "--namespace", NS, "-o", "json"]);
    let history: Value = serde_json::from_str(&history).expect("helm history json");
    assert_eq!(history.as_array().map(Vec::len), Some(2), "{history}");

    env.helm_ok(&["uninstall", RELEASE, "--namespace", NS]);
    for (kind, name, ns) in release_objects() {
        assert!(
            !env.exists(kind, &name, ns),
            "{kind}/{name} left after helm uninstall"
        );
    }
    let left = env.kubectl_ok(&["get", "secrets", "-n", NS, "-l", "owner=helm", "-o", "name"]);
    assert!(left.trim().is_empty(), "helm release secrets left: {left}");
    let left = env.kubectl_ok(&[
        "get",
        "clusterroles,clusterrolebindings",
        "-l",
        &format!("app.kubernetes.io/instance={RELEASE}"),
        "-o",
        "name",
    ]);
    assert!(left.trim().is_empty(), "cluster objects left: {left}");
    assert!(
        env.exists("crd", "discoveredservices.kubediscovery.io", None),
        "the CRD stays on uninstall (helm.sh/resource-policy: keep)"
    );
}

/// The controller binary built by `./test.sh` (`cargo build --workspace --bins`).
/// `xds.enabled`: the API server takes the xDS Service (`appProtocol: grpc`),
/// and the generated xDS token survives an upgrade (`lookup`), as the API
/// token does.
#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chart_xds_service_and_token_survive_an_upgrade(backend: Backend) {
    let env = Env::start(backend).await;
    let chart = chart_dir().display().to_string();
    let xds_token = |env: &Env| {
        env.kubectl_ok(&[
            "get",
            "secret",
            &format!("{FULLNAME}-xds-token"),
            "-n",
            NS,
            "-o",
            "jsonpath={.data.token}",
        ])
    };
    env.helm_ok(&[
        "install",
        RELEASE,
        &chart,
        "--namespace",
        NS,
        "--create-namespace",
        "--set",
        "xds.enabled=true",
    ]);
    let before = xds_token(&env);
    assert_eq!(before.len(), 44, "32 characters, base64: {before:?}");
    let svc = env.kubectl_ok(&[
        "get",
        "service",
        &format!("{FULLNAME}-xds"),
        "-n",
        NS,
        "-o",
        "jsonpath={.spec.ports[0].name} {.spec.ports[0].port} {.spec.ports[0].appProtocol} {.spec.selector}",
    ]);
    assert_eq!(
        svc,
        r#"grpc-xds 18000 grpc {"app.kubernetes.io/instance":"kd","app.kubernetes.io/name":"kube-discovery"}"#
    );
    env.helm_ok(&[
        "upgrade",
        RELEASE,
        &chart,
        "--namespace",
        NS,
        "--set",
        "xds.enabled=true,xds.port=18001",
    ]);
    assert_eq!(
        xds_token(&env),
        before,
        "the generated xDS token survives an upgrade (lookup)"
    );
    let config = env.kubectl_ok(&[
        "get",
        "configmap",
        FULLNAME,
        "-n",
        NS,
        "-o",
        "jsonpath={.data.config\\.yaml}",
    ]);
    assert!(config.contains("addr: 0.0.0.0:18001"), "{config}");
    // Turned off again (the defaults): the xDS objects go.
    env.helm_ok(&[
        "upgrade",
        RELEASE,
        &chart,
        "--namespace",
        NS,
        "--reset-values",
    ]);
    assert!(!env.exists("service", &format!("{FULLNAME}-xds"), Some(NS)));
    assert!(!env.exists("secret", &format!("{FULLNAME}-xds-token"), Some(NS)));
}

fn controller_bin() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    let p = target.join("debug/kube-discovery");
    assert!(
        p.exists(),
        "{} is missing: build it with `cargo build -p kube-discovery` (./test.sh does)",
        p.display()
    );
    p
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// Minimal HTTP/1.1 GET: (status, body).
fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    http_get_with(port, path, None)
}

/// [`http_get`] with a bearer token.
fn http_get_with(port: u16, path: &str, token: Option<&str>) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Connection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let status = buf.split_whitespace().nth(1)?.parse().ok()?;
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

/// Stops the controller (SIGTERM, then SIGKILL) when the test ends.
struct Controller(Child);

impl Drop for Controller {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.0.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            #[expect(
                clippy::disallowed_methods,
                reason = "Drop cannot await: waits at most 5 s for the child to exit"
            )]
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// A controller started from the installed chart's config with the chart
/// ServiceAccount's token.
struct Running {
    controller: Controller,
    config: String,
    http_port: u16,
    stdout: PathBuf,
    stderr: PathBuf,
    token: String,
    /// The bearer token of the dump and nodes APIs (the chart's generated
    /// Secret, as the pod mounts it).
    api_token: Option<String>,
}

impl Running {
    fn logs(&self) -> String {
        format!(
            "stderr:\n{}\nstdout:\n{}",
            read(&self.stderr),
            read(&self.stdout)
        )
    }

    /// Panics with the logs when the controller has exited.
    fn assert_alive(&mut self) {
        if let Ok(Some(status)) = self.controller.0.try_wait() {
            panic!(
                "controller exited early ({status}) with the chart config\nconfig:\n{}\n{}",
                self.config,
                self.logs()
            );
        }
    }
}

/// `helm install` with the connection pointed at the test API server instead of
/// in-cluster (everything else default), then runs `kube-discovery run` exactly as the
/// pod would: the config read back from the installed ConfigMap, the
/// ServiceAccount's token file, the pod's environment.
async fn install_and_run(env: &Env, extra_sets: &[&str]) -> Running {
    let (token_file, ca_file) = (env.path("token"), env.path("ca.crt"));
    std::fs::write(&ca_file, env.api.ca_pem().expect("TLS CA")).expect("write CA");
    let port = env.api.addr().port().to_string();
    let chart = chart_dir().display().to_string();
    let sets = [
        "discovery.kubernetes.service.schema=https".to_string(),
        "discovery.kubernetes.service.host=127.0.0.1".to_string(),
        format!("discovery.kubernetes.service.port={port}"),
        "discovery.kubernetes.service.ssl_verify=true".to_string(),
        format!("discovery.kubernetes.service.ca_file={}", ca_file.display()),
        format!(
            "discovery.kubernetes.client.token_file={}",
            token_file.display()
        ),
    ];
    let mut args = vec![
        "install",
        RELEASE,
        chart.as_str(),
        "--namespace",
        NS,
        "--create-namespace",
    ];
    for s in sets
        .iter()
        .map(String::as_str)
        .chain(extra_sets.iter().copied())
    {
        args.extend(["--set", s]);
    }
    env.helm_ok(&args);
    // The chart's ServiceAccount token (the API server enforces RBAC for it;
    // the real one issues it through the TokenRequest API, so the
    // ServiceAccount the chart installed must exist first).
    let token = env
        .api
        .issue_token(NS, FULLNAME)
        .await
        .expect("ServiceAccount token");
    std::fs::write(&token_file, &token).expect("write token");
    spawn_from_chart(env, token, None, "kd-kube-discovery-0")
}

/// Runs `kube-discovery run` with the config read back from the installed
/// ConfigMap and the pod's environment; `home_kubeconfig` (multi-cluster mode)
/// is where DiscoveredServices are written (in a pod: in-cluster).
fn spawn_from_chart(
    env: &Env,
    token: String,
    home_kubeconfig: Option<&Path>,
    pod: &str,
) -> Running {
    let bin = controller_bin();
    let config = env.kubectl_ok(&[
        "get",
        "configmap",
        FULLNAME,
        "-n",
        NS,
        "-o",
        "jsonpath={.data.config\\.yaml}",
    ]);
    // The API token Secret, as the pod mounts it: the config names its file.
    let mut config = config;
    let mut api_token = None;
    const MOUNTED_TOKEN: &str = "/etc/kube-discovery/http-auth/token";
    if config.contains(MOUNTED_TOKEN) {
        let b64 = env.kubectl_ok(&[
            "get",
            "secret",
            &format!("{FULLNAME}-api-token"),
            "-n",
            NS,
            "-o",
            "jsonpath={.data.token}",
        ]);
        use base64::Engine;
        let t = String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .expect("base64 token"),
        )
        .expect("utf-8 token");
        let local = env.path(&format!("{pod}.api-token"));
        std::fs::write(&local, &t).expect("write API token");
        config = config.replace(MOUNTED_TOKEN, &local.display().to_string());
        api_token = Some(t);
    }
    let config_file = env.path("config.yaml");
    std::fs::write(&config_file, &config).expect("write config");

    // The container's args and env exactly as the installed Deployment has
    // them; only the mounted config path and the pod's field refs are local.
    let dep = env.kubectl_ok(&["get", "deployment", FULLNAME, "-n", NS, "-o", "json"]);
    let dep: Value = serde_json::from_str(&dep).expect("deployment json");
    let container = &dep["spec"]["template"]["spec"]["containers"][0];
    let args: Vec<String> = container["args"]
        .as_array()
        .expect("container args")
        .iter()
        .map(|a| {
            let a = a.as_str().expect("string arg");
            if a == "/etc/kube-discovery/config.yaml" {
                config_file.display().to_string()
            } else {
                a.to_string()
            }
        })
        .collect();
    assert!(
        args.contains(&config_file.display().to_string()),
        "the chart passes --config: {args:?}"
    );

    let http_port = free_port();
    let (stdout, stderr) = (
        env.path(&format!("{pod}.out")),
        env.path(&format!("{pod}.err")),
    );
    let mut cmd = Command::new(&bin);
    cmd.args(&args)
        .args(["--http-addr", &format!("127.0.0.1:{http_port}")])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .stdout(Stdio::from(
            std::fs::File::create(&stdout).expect("stdout file"),
        ))
        .stderr(Stdio::from(
            std::fs::File::create(&stderr).expect("stderr file"),
        ));
    for e in container["env"].as_array().expect("container env") {
        let name = e["name"].as_str().expect("env name");
        let value = match (
            e["value"].as_str(),
            e["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        ) {
            (Some(v), _) => v.to_string(),
            (None, Some("metadata.name")) => pod.to_string(),
            (None, Some("metadata.namespace")) => NS.to_string(),
            other => panic!("env {name}: unexpected source {other:?}"),
        };
        cmd.env(name, value);
    }
    if let Some(kc) = home_kubeconfig {
        // Found through $HOME/.kube/config: `run` reads $KUBECONFIG as its
        // `--kubeconfig` flag, which is single-cluster only.
        let home = env.path("home");
        std::fs::create_dir_all(home.join(".kube")).expect("mkdir .kube");
        std::fs::copy(kc, home.join(".kube/config")).expect("copy kubeconfig");
        cmd.env("HOME", home);
    }
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
    Running {
        controller: Controller(child),
        config,
        http_port,
        stdout,
        stderr,
        token,
        api_token,
    }
}

#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chart_controller_works_with_chart_config_and_service_account_rbac(backend: Backend) {
    controller_works_with_the_charts_rbac(backend, &[]).await;
}

/// `rbac.namespaced`: the controller watches only `shop` and is granted only
/// Roles (in `shop`, and the leader-election Role in the release namespace);
/// no ClusterRoleBinding names its ServiceAccount, and it still does all of
/// its job without one forbidden request.
#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chart_namespaced_rbac_controller_works_with_roles_only(backend: Backend) {
    let env = controller_works_with_the_charts_rbac(
        backend,
        &[
            "rbac.namespaced=true",
            "discovery.kubernetes.namespace_selector.equal=shop",
        ],
    )
    .await;
    let sa = format!("{NS}/{FULLNAME}");
    let names_sa = |binding: &Value| {
        binding["subjects"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| {
                s["kind"] == "ServiceAccount"
                    && format!(
                        "{}/{}",
                        s["namespace"].as_str().unwrap_or_default(),
                        s["name"].as_str().unwrap_or_default()
                    ) == sa
            })
    };
    let crbs: Value =
        serde_json::from_str(&env.kubectl_ok(&["get", "clusterrolebindings", "-o", "json"]))
            .expect("clusterrolebindings json");
    let cluster_wide: Vec<&Value> = crbs["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| names_sa(b))
        .map(|b| &b["metadata"]["name"])
        .collect();
    assert!(
        cluster_wide.is_empty(),
        "rbac.namespaced binds {sa} cluster-wide: {cluster_wide:?}"
    );
    let rbs: Value =
        serde_json::from_str(&env.kubectl_ok(&["get", "rolebindings", "-A", "-o", "json"]))
            .expect("rolebindings json");
    let mut granted: Vec<String> = rbs["items"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|b| names_sa(b))
        .map(|b| {
            format!(
                "{}/{}",
                b["metadata"]["namespace"].as_str().unwrap_or_default(),
                b["roleRef"]["name"].as_str().unwrap_or_default()
            )
        })
        .collect();
    granted.sort();
    assert_eq!(
        granted,
        [
            format!("{NS}/{FULLNAME}-leader-election"),
            format!("shop/{FULLNAME}-output"),
            format!("shop/{FULLNAME}-sources"),
        ],
        "the Roles bound to {sa}"
    );
}

/// Installs the chart (with `extra_sets`) and runs its controller with the
/// chart's config and ServiceAccount: it publishes exactly the ready
/// endpoints of `shop/web`, the HTTP API and readiness agree, nothing is
/// forbidden, and deleting the slice empties the object.
async fn controller_works_with_the_charts_rbac(backend: Backend, extra_sets: &[&str]) -> Env {
    let env = Env::start(backend).await;
    // A Service with one EndpointSlice: two ready endpoints (one with `ready`
    // absent, which means ready) and one not ready.
    let backend = env.path("backend.yaml");
    std::fs::write(&backend, BACKEND).expect("write backend");
    env.kubectl_ok(&["apply", "-f", &backend.display().to_string()]);
    let mut run = install_and_run(&env, extra_sets).await;

    // Wait for the DiscoveredService with exactly the ready endpoints.
    let deadline = Instant::now() + Duration::from_secs(60);
    let want = serde_json::json!([
        {"host": "10.0.0.1", "port": 8080, "weight": 50},
        {"host": "10.0.0.2", "port": 8080, "weight": 50},
    ]);
    loop {
        run.assert_alive();
        let out = env.kubectl(&[
            "get",
            "discoveredservices",
            "web",
            "-n",
            "shop",
            "-o",
            "json",
        ]);
        let last = if out.status.success() {
            let v: Value = serde_json::from_slice(&out.stdout).expect("dsvc json");
            if v["spec"]["ports"]["http"] == want {
                assert_eq!(v["spec"]["service"], "shop/web");
                break;
            }
            v["spec"].to_string()
        } else {
            text(&out)
        };
        assert!(
            Instant::now() < deadline,
            "no DiscoveredService shop/web with {want} after 60s; last: {last}\n{}",
            run.logs()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    // What a user sees.
    let table = env.kubectl_ok(&["get", "dsvc", "-A"]);
    assert!(
        table
            .lines()
            .any(|l| l.split_whitespace().take(2).eq(["shop", "web"])),
        "kubectl get dsvc -A lacks shop/web:\n{table}"
    );
    // The HTTP API agrees, and the controller is ready.
    // The chart's default: the nodes API wants the generated token.
    let (code, _) = http_get(
        run.http_port,
        "/v1/discovery/kubernetes/nodes?service=shop/web:http",
    )
    .expect("HTTP API answers");
    assert_eq!(code, 401, "no token, no nodes");
    let (code, body) = http_get_with(
        run.http_port,
        "/v1/discovery/kubernetes/nodes?service=shop/web:http",
        Some(
            run.api_token
                .as_deref()
                .expect("the chart mounts an API token"),
        ),
    )
    .expect("HTTP API answers");
    assert_eq!(code, 200, "{body}");
    let nodes: Value =
        serde_json::from_str(body.trim()).unwrap_or_else(|e| panic!("nodes JSON ({e}): {body}"));
    assert_eq!(nodes, want);
    let (code, body) = http_get(run.http_port, "/readyz").expect("readyz answers");
    assert_eq!(code, 200, "/readyz: {body}");
    // Exactly the chart's permissions were enough: nothing was forbidden.
    let logs = run.logs();
    assert!(
        !logs.contains("Forbidden") && !logs.contains("forbidden") && !logs.contains(" 403"),
        "the controller hit a permission error with the chart's RBAC:\n{logs}"
    );
    assert!(!logs.contains(&run.token), "the token must never be logged");
    // Deleting the Service's slice empties the object (the controller keeps writing with the same RBAC).
    env.kubectl_ok(&["delete", "endpointslice", "web-abcde", "-n", "shop"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        run.assert_alive();
        let out = env.kubectl(&[
            "get",
            "discoveredservices",
            "web",
            "-n",
            "shop",
            "-o",
            "json",
        ]);
        let gone_or_empty = if out.status.success() {
            let v: Value = serde_json::from_slice(&out.stdout).expect("dsvc json");
            v["spec"]["ports"]["http"]
                .as_array()
                .is_none_or(Vec::is_empty)
        } else {
            text(&out).contains("NotFound")
        };
        if gone_or_empty {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "shop/web still has nodes 30s after its slice was deleted\n{}",
            run.logs()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    drop(run);
    env
}

/// The chart's default: 2 replicas with leader election. Exactly one holds
/// the Lease (which the chart's Role allows), the objects get written, and
/// BOTH replicas become ready — a follower that never turns ready would block
/// every rolling update (the new pod waits for readiness) and, with the
/// PodDisruptionBudget, every node drain.
#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chart_default_two_replicas_elect_one_leader_and_both_become_ready(backend: Backend) {
    let env = Env::start(backend).await;
    let backend = env.path("backend.yaml");
    std::fs::write(&backend, BACKEND).expect("write backend");
    env.kubectl_ok(&["apply", "-f", &backend.display().to_string()]);
    let replicas = find(&render("kd", NS, &[]), "Deployment", None)["spec"]["replicas"].clone();
    assert_eq!(replicas, 2, "the chart's default replica count");
    let mut first = install_and_run(&env, &[]).await;
    let mut second = spawn_from_chart(&env, first.token.clone(), None, "kd-kube-discovery-1");
    let pods = ["kd-kube-discovery-0", "kd-kube-discovery-1"];

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        first.assert_alive();
        second.assert_alive();
        let out = env.kubectl(&[
            "get",
            "lease",
            FULLNAME,
            "-n",
            NS,
            "-o",
            "jsonpath={.spec.holderIdentity}",
        ]);
        let holder = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let leader = out.status.success() && !holder.is_empty();
        let written = env.exists("dsvc", "web", Some("shop"));
        let ready = [&first, &second]
            .map(|r| http_get(r.http_port, "/readyz").is_some_and(|(c, _)| c == 200));
        if leader && written && ready == [true, true] {
            assert!(
                pods.iter().any(|p| holder.contains(p)),
                "the Lease holder {holder:?} is one of the replicas {pods:?}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after 60s: Lease {NS}/{FULLNAME} holder {holder:?} (leader elected: {leader}), \
             DiscoveredService shop/web written: {written}, /readyz 200 on [replica 0, replica 1]: {ready:?}\n\
             replica 0 {}\nreplica 1 {}",
            first.logs(),
            second.logs()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    for r in [&first, &second] {
        let logs = r.logs();
        assert!(
            !logs.contains("Forbidden") && !logs.contains("forbidden") && !logs.contains(" 403"),
            "permission error with the chart's RBAC:\n{logs}"
        );
    }

    // Uninstall after the controller ran: exactly what the chart README
    // ("Uninstalling") says stays, stays, and its cleanup commands remove it.
    drop(first);
    drop(second);
    env.helm_ok(&["uninstall", RELEASE, "--namespace", NS]);
    for (kind, name, ns) in release_objects() {
        assert!(
            !env.exists(kind, &name, ns),
            "{kind}/{name} left after helm uninstall"
        );
    }
    let in_ns = "deployments,services,configmaps,secrets,serviceaccounts,roles,rolebindings,leases,poddisruptionbudgets";
    let left = ours(&env.kubectl_ok(&["get", in_ns, "-n", NS, "-o", "name"]));
    assert_eq!(
        left,
        format!("lease.coordination.k8s.io/{FULLNAME}"),
        "after uninstall only the controller's Lease stays in {NS} (documented)"
    );
    assert!(
        env.exists("dsvc", "web", Some("shop")),
        "DiscoveredServices stay with the CRD"
    );
    let readme = read(&chart_dir().join("README.md"));
    let cleanup: Vec<&str> = readme
        .lines()
        .filter(|l| l.starts_with("kubectl ") && l.contains(" delete "))
        .filter(|l| !l.contains("namespace kube-discovery"))
        .collect();
    assert_eq!(
        cleanup.len(),
        3,
        "the README's cleanup commands: {cleanup:?}"
    );
    for line in cleanup {
        let line = line.split(" #").next().unwrap_or(line).trim();
        // The README's release is `kube-discovery`; this test's is `kd`.
        let line = line.replacen("lease kube-discovery", &format!("lease {FULLNAME}"), 1);
        let args: Vec<&str> = line.split_whitespace().skip(1).collect();
        env.kubectl_ok(&args);
    }
    let left = ours(&env.kubectl_ok(&["get", in_ns, "-n", NS, "-o", "name"]));
    assert!(left.is_empty(), "left after the documented cleanup: {left}");
    assert!(!env.exists("crd", "discoveredservices.kubediscovery.io", None));
}

/// Objects of a `kubectl get -o name` listing, without those Kubernetes puts
/// into every namespace itself (the `default` ServiceAccount and the
/// `kube-root-ca.crt` ConfigMap of kube-controller-manager; kube-sim has none).
fn ours(listing: &str) -> String {
    listing
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .filter(|l| *l != "serviceaccount/default" && *l != "configmap/kube-root-ca.crt")
        .collect::<Vec<_>>()
        .join("\n")
}

/// Multi-cluster mode as the chart renders it: a remote cluster (a second
/// API server) read with the read-only identity from `rbac/remote/`, objects
/// written into the home cluster with the chart ServiceAccount's RBAC.
#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chart_multi_cluster_reads_a_remote_cluster_with_the_remote_reader_role(backend: Backend) {
    let home = Env::start(backend).await;
    let remote = Env::start(backend).await;
    let root = repo_root();

    // Remote cluster: the read-only identity and a backend.
    remote.kubectl_ok(&[
        "apply",
        "-f",
        &root.join("rbac/remote").display().to_string(),
    ]);
    let backend = remote.path("backend.yaml");
    std::fs::write(
        &backend,
        r#"apiVersion: v1
kind: Namespace
metadata: {name: shop}
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  ports: [{name: http, port: 80, targetPort: 8080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-remote
  namespace: shop
  labels: {kubernetes.io/service-name: web}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints:
  - addresses: ["10.1.0.7"]
    conditions: {ready: true}
"#,
    )
    .expect("write backend");
    remote.kubectl_ok(&["apply", "-f", &backend.display().to_string()]);
    let remote_token = remote
        .api
        .issue_token("kube-discovery", "kube-discovery-remote-reader")
        .await
        .expect("remote reader token");
    let (remote_token_file, remote_ca) = (home.path("east-token"), home.path("east-ca.crt"));
    std::fs::write(&remote_token_file, &remote_token).expect("write remote token");
    std::fs::write(&remote_ca, remote.api.ca_pem().expect("CA")).expect("write remote CA");

    // Home cluster: the chart, multi-cluster, objects in the release namespace.
    let clusters = serde_json::json!([{
        "id": "east",
        "service": {"schema": "https", "host": "127.0.0.1", "port": remote.api.addr().port(),
                    "ssl_verify": true, "ca_file": remote_ca.display().to_string()},
        "client": {"token_file": remote_token_file.display().to_string()},
        "watch_endpoint_slices": true,
    }]);
    let chart = chart_dir().display().to_string();
    let clusters_arg = format!("discovery.clusters={clusters}");
    home.helm_ok(&[
        "install",
        RELEASE,
        &chart,
        "--namespace",
        NS,
        "--create-namespace",
        "--set-json",
        &clusters_arg,
        "--set",
        "controller.discoveredServices.namespaceMode=fixed",
    ]);
    let home_token = home
        .api
        .issue_token(NS, FULLNAME)
        .await
        .expect("home token");
    let home_kubeconfig = home.path("home-kubeconfig");
    home.api
        .write_kubeconfig(&home_kubeconfig, &home_token)
        .expect("home kubeconfig");
    let mut run = spawn_from_chart(
        &home,
        home_token,
        Some(&home_kubeconfig),
        "kd-kube-discovery-0",
    );

    let want = serde_json::json!([{"host": "10.1.0.7", "port": 8080, "weight": 50}]);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        run.assert_alive();
        let out = home.kubectl(&["get", "dsvc", "east.shop.web", "-n", NS, "-o", "json"]);
        let last = if out.status.success() {
            let v: Value = serde_json::from_slice(&out.stdout).expect("dsvc json");
            if v["spec"]["ports"]["http"] == want {
                assert_eq!(v["spec"]["service"], "east/shop/web");
                assert_eq!(v["spec"]["cluster"], "east");
                break;
            }
            v["spec"].to_string()
        } else {
            text(&out)
        };
        assert!(
            Instant::now() < deadline,
            "no DiscoveredService {NS}/east.shop.web with {want} after 60s; last: {last}\n{}",
            run.logs()
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let (code, body) = http_get_with(
        run.http_port,
        "/v1/discovery/kubernetes/nodes?service=east/shop/web:http",
        run.api_token.as_deref(),
    )
    .expect("HTTP API answers");
    assert_eq!(
        (code, serde_json::from_str::<Value>(body.trim()).ok()),
        (200, Some(want)),
        "{body}"
    );
    let logs = run.logs();
    assert!(
        !logs.contains("Forbidden") && !logs.contains("forbidden") && !logs.contains(" 403"),
        "permission error with rbac/remote or the chart's RBAC:\n{logs}"
    );
    assert!(
        !logs.contains(&remote_token) && !logs.contains(&run.token),
        "a token was logged"
    );
}

/// The counter-check of the RBAC tests above: without the chart's RBAC
/// (`rbac.create=false`) the API server forbids the controller's requests and no
/// DiscoveredService appears, so "nothing forbidden" there means something.
#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chart_controller_without_the_chart_rbac_is_forbidden(backend: Backend) {
    let env = Env::start(backend).await;
    let backend = env.path("backend.yaml");
    std::fs::write(&backend, BACKEND).expect("write backend");
    env.kubectl_ok(&["apply", "-f", &backend.display().to_string()]);
    let mut run = install_and_run(&env, &["rbac.create=false"]).await;
    assert!(!env.exists("clusterrole", FULLNAME, None));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        run.assert_alive();
        let logs = run.logs();
        if logs.contains("forbidden") || logs.contains("Forbidden") || logs.contains("403") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no permission error logged without RBAC after 30s\n{logs}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    assert!(
        !env.exists("dsvc", "web", Some("shop")),
        "written without permission"
    );
    let (code, _) = http_get(run.http_port, "/readyz").expect("readyz answers");
    assert_ne!(code, 200, "not ready while it cannot list");
}
