//! Shared harness of the controller end-to-end tests (`controller_*.rs`):
//! an API server of either backend ([`testenv::Cluster`]: kube-sim in-process,
//! or the real kube-apiserver behind the fault proxy) with the
//! DiscoveredService CRD installed, the `kube-discovery` BINARY run as a
//! separate process, and small helpers to create sources, read
//! DiscoveredServices, read the write log (kube-sim's, or the real server's
//! audit log) and poll (short intervals, generous upper bound, never fixed
//! sleeps). Tests written with [`testenv::on_both!`] run on both backends.
#![allow(dead_code)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Endpoints, Namespace};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use serde_json::{Value, json};
pub use testenv::{Backend, Cluster, Options};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `kube-discovery` binary: `KUBE_DISCOVERY_BIN`, else next to the test's
/// target dir (`target/debug/deps/xxx` -> `target/debug/kube-discovery`).
pub fn bin() -> PathBuf {
    if let Ok(p) = std::env::var("KUBE_DISCOVERY_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().and_then(Path::parent).expect("target dir");
    let p = dir.join("kube-discovery");
    assert!(
        p.exists(),
        "{} not found: run `cargo build -p kube-discovery` first (or set KUBE_DISCOVERY_BIN)",
        p.display()
    );
    p
}

/// Polls `f` every 50 ms until it returns `Some`, panicking with `what` after `limit`.
pub use testenv::gateways::eventually;

/// Upper bound of most waits.
pub const LIMIT: Duration = Duration::from_secs(30);

/// The condition `type_` of the DiscoveredService `ds` (`Null` if absent).
pub fn condition(ds: &Value, type_: &str) -> Value {
    ds["status"]["conditions"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_).cloned())
        .unwrap_or(Value::Null)
}

/// An API server (kube-sim or real) with the CRD installed and an admin client.
pub struct Env {
    pub api: Cluster,
    pub admin: Client,
    pub dir: tempfile::TempDir,
}

impl Drop for Env {
    /// A control-plane process that died fails the test that ran on it.
    fn drop(&mut self) {
        if !std::thread::panicking()
            && let Err(e) = self.api.check_alive()
        {
            panic!("the API server died during the test: {e:#}");
        }
    }
}

pub fn dsvc_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubediscovery.io", "v1alpha1", "DiscoveredService"),
        "discoveredservices",
    )
}

impl Env {
    pub async fn start(backend: Backend) -> Env {
        Self::start_with(backend, Options::default()).await
    }

    /// An API server serving HTTPS (kubectl 1.32 sends no bearer token over
    /// plain HTTP).
    pub async fn start_tls(backend: Backend) -> Env {
        Env::start_with(
            backend,
            Options {
                tls: true,
                ..Options::default()
            },
        )
        .await
    }

    /// Starts `backend` with `opts` plus the DiscoveredService CRD of `crds/`.
    pub async fn start_with(backend: Backend, mut opts: Options) -> Env {
        let crd = std::fs::read_to_string(repo_root().join("crds/discoveredservices.yaml"))
            .expect("read crds/discoveredservices.yaml");
        opts.crds.push(crd);
        let api = Cluster::start(backend, opts)
            .await
            .unwrap_or_else(|e| panic!("start the {} API server: {e:#}", backend.name()));
        let dir = tempfile::tempdir().expect("tempdir");
        let admin = api.admin().clone();
        let env = Env { api, admin, dir };
        let ds = env.dsvc_api_all();
        eventually("CRD served", LIMIT, || {
            let ds = ds.clone();
            async move { ds.list(&ListParams::default()).await.ok().map(|_| ()) }
        })
        .await;
        env
    }

    pub fn is_real(&self) -> bool {
        self.api.is_real()
    }

    /// Panics with the log tail when a control-plane process died.
    pub fn assert_alive(&self) {
        if let Err(e) = self.api.check_alive() {
            panic!("the API server died: {e:#}");
        }
    }

    pub fn dsvc_api_all(&self) -> Api<DynamicObject> {
        Api::all_with(self.admin.clone(), &dsvc_resource())
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A kubeconfig file for `token`.
    pub fn kubeconfig(&self, token: &str) -> PathBuf {
        let p = self.path(&format!("kubeconfig-{}", &token[..token.len().min(12)]));
        self.api
            .write_kubeconfig(&p, token)
            .expect("write kubeconfig");
        p
    }

    /// The API server's CA as a file, if it serves TLS.
    pub fn ca_file(&self) -> Option<PathBuf> {
        let pem = self.api.ca_pem()?;
        let p = self.path("apiserver-ca.crt");
        std::fs::write(&p, pem).expect("write CA file");
        Some(p)
    }

    /// APISIX-style `service`/`client` block pointing at this API server
    /// (with `ca_file` when it serves TLS: verification stays on).
    pub fn service_block(&self, token: &str) -> String {
        let url = self.api.url();
        let (schema, rest) = url.split_once("://").expect("url");
        let (host, port) = rest.rsplit_once(':').expect("host:port");
        let ca = self
            .ca_file()
            .map(|p| format!("      ca_file: {}\n", p.display()))
            .unwrap_or_default();
        format!(
            "    service:\n      schema: {schema}\n      host: \"{host}\"\n      port: {port}\n{ca}    client:\n      token: {token}\n"
        )
    }

    /// The admin token (system:masters on the real server).
    pub fn admin_token(&self) -> String {
        self.api.admin_token()
    }

    pub async fn namespace(&self, name: &str) {
        let api: Api<Namespace> = Api::all(self.admin.clone());
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": name}})).expect("ns");
        match api.create(&PostParams::default(), &ns).await {
            Ok(_) => {}
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => panic!("create namespace {name}: {e}"),
        }
    }

    /// Creates or replaces (SSA) an Endpoints object `ns/name` with ready
    /// `ips` on the named `ports` (`(name, port)`).
    pub async fn endpoints(
        &self,
        ns: &str,
        name: &str,
        ips: &[&str],
        ports: &[(&str, i32)],
        labels: Value,
    ) {
        let subsets = if ips.is_empty() {
            json!([])
        } else {
            json!([{
                "addresses": ips.iter().map(|ip| json!({"ip": ip})).collect::<Vec<_>>(),
                "ports": ports.iter().map(|(n, p)| json!({"name": n, "port": p, "protocol": "TCP"})).collect::<Vec<_>>(),
            }])
        };
        let obj = json!({"apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": name, "namespace": ns, "labels": labels}, "subsets": subsets});
        let api: Api<Endpoints> = Api::namespaced(self.admin.clone(), ns);
        api.patch(
            name,
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&obj),
        )
        .await
        .expect("apply Endpoints");
    }

    pub async fn delete_endpoints(&self, ns: &str, name: &str) {
        let api: Api<Endpoints> = Api::namespaced(self.admin.clone(), ns);
        api.delete(name, &DeleteParams::default())
            .await
            .expect("delete Endpoints");
    }

    /// Creates or replaces (SSA) an EndpointSlice `slice` of Service `svc`;
    /// `eps` are `(ip, ready)`.
    pub async fn slice(
        &self,
        ns: &str,
        svc: &str,
        slice: &str,
        eps: &[(&str, bool)],
        ports: &[(&str, i32)],
    ) {
        let obj = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": slice, "namespace": ns, "labels": {"kubernetes.io/service-name": svc}},
            "addressType": "IPv4",
            "endpoints": eps.iter().map(|(ip, ready)| json!({"addresses": [ip], "conditions": {"ready": ready}})).collect::<Vec<_>>(),
            "ports": ports.iter().map(|(n, p)| json!({"name": n, "port": p, "protocol": "TCP"})).collect::<Vec<_>>(),
        });
        let api: Api<EndpointSlice> = Api::namespaced(self.admin.clone(), ns);
        api.patch(
            slice,
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&obj),
        )
        .await
        .expect("apply EndpointSlice");
    }

    pub async fn delete_slice(&self, ns: &str, slice: &str) {
        let api: Api<EndpointSlice> = Api::namespaced(self.admin.clone(), ns);
        api.delete(slice, &DeleteParams::default())
            .await
            .expect("delete EndpointSlice");
    }

    /// Events (events.k8s.io/v1) in `ns` with `reason` regarding the object
    /// of `kind` named `name`.
    pub async fn events(
        &self,
        ns: &str,
        reason: &str,
        kind: &str,
        name: &str,
    ) -> Vec<k8s_openapi::api::events::v1::Event> {
        let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(self.admin.clone(), ns);
        api.list(&ListParams::default())
            .await
            .expect("list events")
            .items
            .into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.regarding.as_ref().is_some_and(|r| {
                        r.kind.as_deref() == Some(kind) && r.name.as_deref() == Some(name)
                    })
            })
            .collect()
    }

    /// The DiscoveredService `ns/name` as JSON, if it exists.
    pub async fn dsvc(&self, ns: &str, name: &str) -> Option<Value> {
        let api: Api<DynamicObject> =
            Api::namespaced_with(self.admin.clone(), ns, &dsvc_resource());
        api.get_opt(name)
            .await
            .expect("get DiscoveredService")
            .map(|o| serde_json::to_value(o).expect("json"))
    }

    /// All DiscoveredServices as `ns/name`.
    pub async fn dsvc_names(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .dsvc_api_all()
            .list(&ListParams::default())
            .await
            .expect("list DiscoveredServices")
            .items
            .into_iter()
            .map(|o| {
                format!(
                    "{}/{}",
                    o.metadata.namespace.unwrap_or_default(),
                    o.metadata.name.unwrap_or_default()
                )
            })
            .collect();
        v.sort();
        v
    }

    /// Waits until `ns/name` exists with these `(port, hosts)` (hosts sorted).
    pub async fn wait_nodes(&self, ns: &str, name: &str, port: &str, hosts: &[&str]) -> Value {
        let want: Vec<String> = hosts.iter().map(|h| h.to_string()).collect();
        eventually(
            &format!("DiscoveredService {ns}/{name} port {port} = {want:?}"),
            LIMIT,
            || async {
                self.assert_alive();
                let ds = self.dsvc(ns, name).await?;
                let got: Vec<String> = ds["spec"]["ports"][port]
                    .as_array()?
                    .iter()
                    .filter_map(|n| n["host"].as_str().map(str::to_string))
                    .collect();
                (got == want).then_some(ds)
            },
        )
        .await
    }

    /// Waits until the condition `type_` of the DiscoveredService `ns/name`
    /// has `status` and `reason`; returns the object.
    pub async fn wait_condition(
        &self,
        ns: &str,
        name: &str,
        type_: &str,
        status: &str,
        reason: &str,
    ) -> Value {
        eventually(
            &format!("{ns}/{name} {type_}={status} {reason}"),
            LIMIT,
            || async {
                self.assert_alive();
                let ds = self.dsvc(ns, name).await?;
                let c = condition(&ds, type_);
                (c["status"] == status && c["reason"] == reason).then_some(ds)
            },
        )
        .await
    }

    /// How many times the Events [`Env::events`] finds were reported: a
    /// repeat folded into one Event counts its `series.count`.
    pub async fn event_count(&self, ns: &str, reason: &str, kind: &str, name: &str) -> i32 {
        self.events(ns, reason, kind, name)
            .await
            .iter()
            .map(|e| e.series.as_ref().map_or(1, |s| s.count))
            .sum()
    }

    pub async fn wait_gone(&self, ns: &str, name: &str) {
        eventually(
            &format!("DiscoveredService {ns}/{name} deleted"),
            LIMIT,
            || async {
                self.assert_alive();
                self.dsvc(ns, name).await.is_none().then_some(())
            },
        )
        .await
    }

    /// A point in the write log (see [`Env::dsvc_writes_since`]).
    pub async fn mark(&self) -> u64 {
        self.api.mark().await.expect("write log mark")
    }

    /// Writes to DiscoveredServices after `mark`.
    pub async fn dsvc_writes_since(&self, mark: u64) -> Vec<Value> {
        self.api
            .writes_since(mark)
            .await
            .expect("write log")
            .into_iter()
            .filter(|w| {
                w["resource"]
                    .as_str()
                    .is_some_and(|r| r.starts_with("discoveredservices"))
            })
            .collect()
    }

    /// Every watch must relist: the history is compacted and every watch
    /// dropped, so resuming gets 410 Gone (kube-sim: its compaction hook; real:
    /// etcd compaction and an API server restart, see `ControlPlane::compact`).
    pub async fn force_410(&self) {
        self.api
            .fault(&json!({"clear": true, "compact": true, "dropWatches": true}))
            .await
            .expect("fault");
    }
}

/// A `kube-discovery run` process.
pub struct Controller {
    pub child: tokio::process::Child,
    pub http: SocketAddr,
    pub log: PathBuf,
}

impl Controller {
    /// Starts `kube-discovery run --config <config_yaml> --http-addr 127.0.0.1:0 [extra]`
    /// and waits until its HTTP server listens.
    pub async fn start(env: &Env, name: &str, config_yaml: &str, extra: &[&str]) -> Controller {
        Self::start_with_env(env, name, config_yaml, extra, &[]).await
    }

    /// [`Controller::start`] with extra environment variables (test-only
    /// knobs such as `KUBE_DISCOVERY_SNAPSHOT_MAX_SHARD_BYTES`, which is
    /// otherwise removed so the machine's environment cannot leak in).
    pub async fn start_with_env(
        env: &Env,
        name: &str,
        config_yaml: &str,
        extra: &[&str],
        vars: &[(&str, &str)],
    ) -> Controller {
        let cfg = env.path(&format!("{name}.yaml"));
        std::fs::write(&cfg, config_yaml).expect("write config");
        let log = env.path(&format!("{name}.log"));
        let logf = std::fs::File::create(&log).expect("log file");
        let mut cmd = tokio::process::Command::new(bin());
        cmd.args(["--log-format", "json", "run", "--config"])
            .arg(&cfg)
            .args(["--http-addr", "127.0.0.1:0"])
            .args(extra)
            .env_remove("KUBECONFIG")
            .env_remove("KUBE_DISCOVERY_SNAPSHOT_MAX_SHARD_BYTES")
            .env("RUST_LOG", "info,kube_discovery=debug")
            .stdout(Stdio::null())
            .stderr(logf)
            .kill_on_drop(true);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn kube-discovery");
        let mut c = Controller {
            child,
            http: SocketAddr::from(([127, 0, 0, 1], 0)),
            log,
        };
        let log = c.log.clone();
        let http = eventually("controller HTTP server listening", LIMIT, || {
            let log = log.clone();
            let exited = c.child.try_wait().ok().flatten();
            async move {
                if let Some(status) = exited {
                    panic!(
                        "kube-discovery exited with {status}: {}",
                        std::fs::read_to_string(&log).unwrap_or_default()
                    );
                }
                let text = std::fs::read_to_string(&log).ok()?;
                text.lines()
                    .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                    .find(|v| v["message"] == "HTTP server listening")
                    .and_then(|v| v["addr"].as_str().and_then(|a| a.parse().ok()))
            }
        })
        .await;
        c.http = http;
        c
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The xDS server's address (from its "xDS server listening" log line;
    /// the config sets `kube_discovery.xds.addr`, port 0 for any).
    pub async fn xds_addr(&self) -> SocketAddr {
        eventually("controller xDS server listening", LIMIT, || async {
            self.logs()
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find(|v| v["message"] == "xDS server listening")
                .and_then(|v| v["addr"].as_str().and_then(|a| a.parse().ok()))
        })
        .await
    }

    /// GET `path` on the controller's HTTP server: (status, body).
    pub async fn get(&self, path: &str) -> (u16, String) {
        http_get(self.http, path, None).await
    }

    pub async fn wait_ready(&self) {
        eventually("controller /readyz = 200", LIMIT, || async {
            (self.get("/readyz").await.0 == 200).then_some(())
        })
        .await;
    }

    /// SIGTERM, then wait for a clean exit.
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        let status = tokio::time::timeout(LIMIT, self.child.wait())
            .await
            .expect("controller did not stop")
            .expect("wait");
        assert!(
            status.success(),
            "controller exit status {status}; log:\n{}",
            self.logs()
        );
    }
}

impl Drop for Controller {
    /// A failing test shows the end of the controller's log.
    fn drop(&mut self) {
        if std::thread::panicking() {
            let logs = self.logs();
            let lines: Vec<&str> = logs.lines().collect();
            let from = lines.len().saturating_sub(40);
            eprintln!(
                "--- last lines of {}:\n{}",
                self.log.display(),
                lines[from..].join("\n")
            );
        }
    }
}

/// Minimal HTTP/1.1 GET (the tests need no HTTP client crate).
pub async fn http_get(addr: SocketAddr, path: &str, bearer: Option<&str>) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let auth = bearer
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await.expect("write");
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.expect("read");
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    (code, body)
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((len, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}
