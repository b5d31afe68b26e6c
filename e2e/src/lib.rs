//! kube-sim: a small, honest Kubernetes API server for tests and demos.
//!
//! It serves a fixed set of built-in resources plus any custom resources defined by
//! stored CRDs, from memory, over HTTP or HTTPS (self-signed CA), with the real API
//! server's semantics where it claims them: one global resourceVersion, watches
//! backed by a bounded event history (410 when too old), label/field selectors,
//! pagination, JSON/merge/strategic/server-side-apply patches, status subresources,
//! generation, finalizers, ownerReference garbage collection, RBAC, `dryRun=All`,
//! Tables for kubectl, and `Status` errors for everything it does not do.
//!
//! ```text
//!            ┌──────────── server.rs: accept loop (TCP/TLS), faults, /_sim hooks
//!  request ─►│ handler.rs: auth → route → RBAC → verb ─► types.rs (defaults/validation)
//!            │                 │                          machinery.rs (apimachinery crate)
//!            │                 └─► store.rs (objects, rv, history) ─► watch.rs streams
//!            └──────────── discovery.rs / table.rs (what kubectl and helm read)
//! ```
//!
//! In-process use:
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! let sim = kube_sim::Sim::start(kube_sim::SimConfig::default()).await?;
//! let kubeconfig = sim.kubeconfig_yaml(&sim.admin_token());
//! # drop(kubeconfig); sim.shutdown().await; Ok(()) }
//! ```

pub mod convert;
pub mod discovery;
pub mod events;
pub mod handler;
pub mod machinery;
pub mod protobuf;
pub mod registry;
pub mod server;
pub mod status;
pub mod store;
pub mod table;
pub mod tls;
pub mod types;
pub mod watch;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use anyhow::Context;
use base64::Engine;
use serde_json::{Value, json};
use tokio::sync::watch as tokio_watch;
use tokio_util::sync::CancellationToken;

use crate::machinery::User;
use crate::server::Shared;
use crate::store::{EventType, Store};

/// Configuration of a kube-sim server.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Bearer token that bypasses RBAC (test setup).
    pub admin_token: String,
    /// Serve HTTPS with a generated self-signed CA.
    pub tls: bool,
    /// Number of events kept for watches; older revisions get 410 Gone.
    pub history_size: usize,
    /// Interval of BOOKMARK events on watches that allow them.
    pub bookmark_interval: Duration,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            admin_token: format!("admin-{}", uuid::Uuid::new_v4().simple()),
            tls: false,
            history_size: 10_000,
            bookmark_interval: Duration::from_secs(5),
        }
    }
}

/// A running kube-sim server. Dropping it (or [`Sim::shutdown`]) stops it.
pub struct Sim {
    shared: Arc<Shared>,
    addr: SocketAddr,
    ca_pem: Option<String>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Sim {
    /// Start on `127.0.0.1` with an ephemeral port.
    pub async fn start(cfg: SimConfig) -> anyhow::Result<Sim> {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), cfg).await
    }

    /// Start on the given address.
    pub async fn start_on(addr: SocketAddr, cfg: SimConfig) -> anyhow::Result<Sim> {
        if cfg.admin_token.is_empty() {
            anyhow::bail!("admin token must not be empty");
        }
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("binding {addr}"))?;
        let addr = listener.local_addr().context("local address")?;
        let (tls, ca_pem) = if cfg.tls {
            let m = tls::generate()?;
            (
                Some(tokio_rustls::TlsAcceptor::from(m.server_config)),
                Some(m.ca_pem),
            )
        } else {
            (None, None)
        };
        let scheme = if cfg.tls { "https" } else { "http" };
        let url = format!("{scheme}://{addr}");
        let (rv_tx, _) = tokio_watch::channel(0u64);
        let (drop_tx, _) = tokio_watch::channel(0u64);
        let (refuse_tx, _) = tokio_watch::channel(None);
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::new(cfg.history_size)),
            cfg,
            rv_tx,
            drop_tx,
            tokens: RwLock::new(Default::default()),
            faults: Mutex::new(Default::default()),
            stats: Mutex::new(Default::default()),
            open_watches: AtomicI64::new(0),
            shutdown: CancellationToken::new(),
            refuse_tx,
            url,
        });
        bootstrap(&shared);
        let task = tokio::spawn(server::accept_loop(
            shared.clone(),
            Some(listener),
            addr,
            tls,
        ));
        Ok(Sim {
            shared,
            addr,
            ca_pem,
            task: Some(task),
        })
    }

    /// `https://127.0.0.1:PORT` or `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        self.shared.url.clone()
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn admin_token(&self) -> String {
        self.shared.cfg.admin_token.clone()
    }

    /// The CA certificate (PEM) when serving TLS.
    pub fn ca_pem(&self) -> Option<String> {
        self.ca_pem.clone()
    }

    /// A kubeconfig (cluster `kube-sim`, user `kube-sim-user`, context `kube-sim`)
    /// that authenticates with `user_token`.
    pub fn kubeconfig_yaml(&self, user_token: &str) -> String {
        kubeconfig(&self.url(), self.ca_pem.as_deref(), user_token)
    }

    pub fn write_kubeconfig(&self, path: &Path, token: &str) -> anyhow::Result<()> {
        std::fs::write(path, self.kubeconfig_yaml(token))
            .with_context(|| format!("writing kubeconfig {}", path.display()))
    }

    /// A bearer token for the ServiceAccount `namespace/service_account` (the
    /// ServiceAccount object need not exist; RBAC bindings refer to it by name).
    pub fn issue_token(&self, namespace: &str, service_account: &str) -> String {
        issue_token_on(&self.shared, namespace, service_account)
    }

    /// Register a bearer token for a user with groups (`system:authenticated` is added).
    pub fn add_user_token(&self, token: &str, user: &str, groups: &[&str]) {
        let mut groups: Vec<String> = groups.iter().map(|g| g.to_string()).collect();
        if !groups.iter().any(|g| g == "system:authenticated") {
            groups.push("system:authenticated".into());
        }
        self.shared
            .tokens
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                token.to_string(),
                User {
                    name: user.to_string(),
                    groups,
                    admin: false,
                },
            );
    }

    /// Stores `object` without defaults or validation (`POST /_sim/unvalidated`):
    /// what an older or corrupted server could hold, for tests of clients
    /// that must skip such data. Returns the stored object.
    pub fn store_unvalidated(&self, object: Value) -> anyhow::Result<Value> {
        handler::store_unvalidated(&self.shared, object)
            .map(|(_, stored)| stored)
            .map_err(|e| anyhow::anyhow!("{}", e.message))
    }

    /// Stop the server: close the listener, end watches and connections.
    pub async fn shutdown(mut self) {
        self.shared.shutdown.cancel();
        if let Some(t) = self.task.take() {
            let _ = t.await;
        }
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        self.shared.shutdown.cancel();
    }
}

/// Register a fresh token for a ServiceAccount.
pub fn issue_token_on(shared: &Shared, namespace: &str, service_account: &str) -> String {
    let token = format!("sa-{}", uuid::Uuid::new_v4().simple());
    let user = User {
        name: format!("system:serviceaccount:{namespace}:{service_account}"),
        groups: vec![
            "system:serviceaccounts".into(),
            format!("system:serviceaccounts:{namespace}"),
            "system:authenticated".into(),
        ],
        admin: false,
    };
    shared
        .tokens
        .write()
        .unwrap_or_else(|p| p.into_inner())
        .insert(token.clone(), user);
    token
}

/// Render a kubeconfig.
pub fn kubeconfig(url: &str, ca_pem: Option<&str>, token: &str) -> String {
    let mut cluster = json!({"server": url});
    if let Some(ca) = ca_pem {
        cluster["certificate-authority-data"] =
            json!(base64::engine::general_purpose::STANDARD.encode(ca));
    }
    let cfg = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kube-sim", "cluster": cluster}],
        "users": [{"name": "kube-sim-user", "user": {"token": token}}],
        "contexts": [{"name": "kube-sim", "context": {"cluster": "kube-sim", "user": "kube-sim-user", "namespace": "default"}}],
        "current-context": "kube-sim",
        "preferences": {},
    });
    serde_saphyr::to_string(&cfg).unwrap_or_default()
}

/// Objects every cluster has: the usual namespaces and the discovery ClusterRoles
/// that let any authenticated user read discovery, OpenAPI and /version.
fn bootstrap(shared: &Shared) {
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let mut objs: Vec<(&str, Value)> = Vec::new();
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        objs.push(("/namespaces", json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}}, "spec": {}, "status": {"phase": "Active"}})));
    }
    let rbac = "rbac.authorization.k8s.io/";
    objs.push((
        "rbac.authorization.k8s.io/clusterroles",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "system:discovery"},
               "rules": [{"verbs": ["get"], "nonResourceURLs": ["/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/readyz", "/openapi", "/openapi/*", "/version", "/version/"]}]}),
    ));
    objs.push((
        "rbac.authorization.k8s.io/clusterrolebindings",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "system:discovery"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:discovery"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"}]}),
    ));
    objs.push((
        "rbac.authorization.k8s.io/clusterroles",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "system:public-info-viewer"},
               "rules": [{"verbs": ["get"], "nonResourceURLs": ["/healthz", "/livez", "/readyz", "/version", "/version/"]}]}),
    ));
    objs.push((
        "rbac.authorization.k8s.io/clusterrolebindings",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "system:public-info-viewer"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:public-info-viewer"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"},
                            {"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:unauthenticated"}]}),
    ));
    objs.push((
        "rbac.authorization.k8s.io/clusterroles",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "system:basic-user"},
               "rules": [{"apiGroups": ["authorization.k8s.io"], "resources": ["selfsubjectaccessreviews"], "verbs": ["create"]}]}),
    ));
    objs.push((
        "rbac.authorization.k8s.io/clusterrolebindings",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "system:basic-user"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:basic-user"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:authenticated"}]}),
    ));
    objs.push((
        "rbac.authorization.k8s.io/clusterroles",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": "cluster-admin"},
               "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]}, {"nonResourceURLs": ["*"], "verbs": ["*"]}]}),
    ));
    objs.push((
        "rbac.authorization.k8s.io/clusterrolebindings",
        json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": "cluster-admin"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
               "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:masters"}]}),
    ));
    let _ = rbac;
    let mut st = shared.store.lock().unwrap_or_else(|p| p.into_inner());
    for (res, mut obj) in objs {
        let rv = st.next_rv();
        let name = obj["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        obj["metadata"]["uid"] = json!(uuid::Uuid::new_v4().to_string());
        obj["metadata"]["creationTimestamp"] = json!(now);
        obj["metadata"]["resourceVersion"] = json!(rv.to_string());
        st.commit(
            rv,
            EventType::Added,
            (res.to_string(), String::new(), name),
            None,
            Arc::new(obj),
        );
    }
    let rv = st.rv;
    drop(st);
    shared.rv_tx.send_replace(rv);
}
