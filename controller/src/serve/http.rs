//! The HTTP server (axum): probes, metrics and the APISIX-compatible debug API.
//!
//! | route | answer |
//! |---|---|
//! | `GET /healthz` | `200 ok` while every long-running task runs; `503` with `{"healthy":false,"task","cause"}` once one died (the process then exits non-zero) |
//! | `GET /readyz` | `200` once the first complete list of EVERY cluster is written, else `503`; also `503` while a watch of a cluster (endpoints or Services), or leader election's Lease, has failed for longer than `unready_after`, naming it in `unready` with a safe summary of its error; JSON detail per cluster |
//! | `GET /metrics` | Prometheus text (see [`crate::serve::metrics`]) |
//! | `GET /v1/discovery/kubernetes/dump` | APISIX dump shape: `{"endpoints":[{"id","endpoints":[{"name":"ns/name","value":"<json>"}]}],"config":[..]}` (secrets redacted) |
//! | `GET /v1/discovery/kubernetes/nodes?service=[id/]ns/name:port` | nodes JSON; `404` unknown service/port; `400` malformed name |
//!
//! The dump and nodes routes require `Authorization: Bearer <token>` when an
//! auth token is configured; probes and metrics never do. The token file is
//! re-read while running ([`ApiToken`]).
//!
//! Every connection is bounded in time and number ([`server`]). A dump is
//! built from the shared state's `Arc`s (no node list is copied) on the
//! blocking pool, at most [`MAX_CONCURRENT_DUMPS`] at once, each holding its
//! slot until its answer is written: more are answered `503` with
//! `Retry-After: 1` at once, so a loop of dumps costs bounded memory and
//! CPU and never delays the probes.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::extract::{Extension, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use kube_discovery_core::{ServiceNodes, parse_service_name};
use prometheus_client::registry::Registry;
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::state::ControllerState;
use crate::{HttpError, Result};

pub mod server;
pub mod token;

pub use server::{Conn, ServerLimits};
pub use token::ApiToken;

/// What the handlers read.
#[derive(Clone)]
pub struct AppState {
    /// Desired nodes and cluster status.
    pub shared: Arc<ControllerState>,
    /// Metrics registry.
    pub registry: Arc<Registry>,
    /// The effective configuration with secrets redacted (dump `config`;
    /// shared: the state is cloned for every request).
    pub config: Arc<Value>,
    /// Bearer token required by dump/nodes, if any.
    pub auth_token: Option<Arc<ApiToken>>,
    /// Slots of the dumps being built or sent ([`MAX_CONCURRENT_DUMPS`]).
    pub dumps: Arc<Semaphore>,
    /// The xDS server's streams (`/v1/discovery/kubernetes/xds/clients`), when it runs.
    pub xds: Option<Arc<crate::xds::hub::Hub>>,
}

/// Dumps built or being sent at once; more are answered `503` at once.
pub const MAX_CONCURRENT_DUMPS: usize = 2;

/// Connections the kernel queues before they are accepted (capped by
/// `net.core.somaxconn`, 4096 by default). Under a burst of connections a
/// full queue drops a prober's SYN, and its retry comes a second later;
/// tokio's default is 1024.
const LISTEN_BACKLOG: u32 = 4096;

impl AppState {
    /// The state with a fresh set of dump slots.
    pub fn new(
        shared: Arc<ControllerState>,
        registry: Arc<Registry>,
        config: Value,
        auth_token: Option<Arc<ApiToken>>,
    ) -> Self {
        Self {
            shared,
            registry,
            config: Arc::new(config),
            auth_token,
            dumps: Arc::new(Semaphore::new(MAX_CONCURRENT_DUMPS)),
            xds: None,
        }
    }

    /// The state with the xDS server's hub (its clients are listed).
    pub fn with_xds(mut self, hub: Arc<crate::xds::hub::Hub>) -> Self {
        self.xds = Some(hub);
        self
    }
}

/// The router (exposed for in-process tests).
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .route("/v1/discovery/kubernetes/dump", get(dump))
        .route("/v1/discovery/kubernetes/nodes", get(nodes))
        .route("/v1/discovery/kubernetes/xds/clients", get(xds_clients))
        .with_state(state)
}

/// Binds `addr` and serves until `shutdown` is cancelled. Returns the bound
/// address (useful with port 0) and the server task.
pub async fn serve(
    addr: SocketAddr,
    state: AppState,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    serve_with_limits(addr, state, ServerLimits::default(), shutdown).await
}

/// [`serve`] with other [`ServerLimits`] than the defaults.
pub async fn serve_with_limits(
    addr: SocketAddr,
    state: AppState,
    limits: ServerLimits,
    shutdown: CancellationToken,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let bind = || {
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        socket.listen(LISTEN_BACKLOG)
    };
    let listener = bind().map_err(|source| HttpError::Bind { addr, source })?;
    let local = listener.local_addr().map_err(HttpError::LocalAddr)?;
    let app = router(state);
    let task = tokio::spawn(server::serve(listener, app, limits, shutdown));
    Ok((local, task))
}

async fn healthz(State(st): State<AppState>) -> Response {
    match st.shared.task_died() {
        None => "ok".into_response(),
        Some(d) => (
            StatusCode::SERVICE_UNAVAILABLE,
            Json(json!({"healthy": false, "task": d.task, "cause": d.cause})),
        )
            .into_response(),
    }
}

async fn readyz(State(st): State<AppState>) -> Response {
    let clusters = st.shared.clusters();
    let ready = st.shared.ready();
    let now = std::time::Instant::now();
    // Each entry names the cluster and the watch (or the Lease), with a safe
    // summary of its last error (`crate::k8s::redact`: never raw error text, this
    // route needs no token).
    let mut failing: Vec<String> = st
        .shared
        .failing_too_long(now)
        .iter()
        .map(ToString::to_string)
        .collect();
    failing.extend(st.shared.held_by_others());
    let detail: serde_json::Map<String, Value> = clusters
        .iter()
        .map(|(id, c)| {
            let state = if let Some(d) = c.failing_for(now) {
                let kinds: Vec<&str> = c.failing_watches.keys().map(String::as_str).collect();
                format!("{} watch failing for {}s", kinds.join(", "), d.as_secs())
            } else if c.synced {
                "synced".to_string()
            } else if c.listed {
                "writing first list".to_string()
            } else {
                "waiting for first list".to_string()
            };
            (id.clone(), json!({"state": state, "status": c}))
        })
        .collect();
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (
        code,
        Json(json!({
            "ready": ready,
            "standby": st.shared.standby(),
            "lease_failing": st.shared.lease_failing(),
            "clusters": detail,
            "unready": failing,
        })),
    )
        .into_response()
}

async fn metrics(State(st): State<AppState>) -> Response {
    // Gauges are refreshed from the shared state at scrape time.
    let body = crate::serve::metrics::encode(&st.registry);
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

fn authorized(st: &AppState, headers: &HeaderMap) -> bool {
    let Some(want) = &st.auth_token else {
        return true;
    };
    let got = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    want.matches(got)
}

fn unauthorized() -> Response {
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer")],
        Json(json!({"error": "missing or wrong bearer token"})),
    )
        .into_response()
}

/// The APISIX dump document of the shared state, as JSON bytes (the
/// endpoints part is what [`kube_discovery_core::snapshot::Dump`] and the
/// ConfigMap snapshot publish), each entry extended with its Service-port
/// `aliases` and `appProtocols` where there are any
/// ([`kube_discovery_core::snapshot::with_port_extras`]). The services are taken
/// under the state's lock as `Arc`s and written out from there: no node list
/// is copied, and the lock is not held while writing.
pub fn dump_json(shared: &ControllerState, config: &Value) -> serde_json::Result<Vec<u8>> {
    let clusters: Vec<String> = shared.clusters().into_keys().collect();
    let services: Vec<Arc<ServiceNodes>> = shared.with_desired(|d| d.values().cloned().collect());
    serde_json::to_vec(&DumpDoc {
        clusters: &clusters,
        services: &services,
        config,
    })
}

/// What [`dump_json`] writes: `{"endpoints":[{"id","endpoints":[..]}],"config":[..]}`.
struct DumpDoc<'a> {
    /// Every registered cluster (also those without services).
    clusters: &'a [String],
    /// The desired services, in key order (cluster first).
    services: &'a [Arc<ServiceNodes>],
    config: &'a Value,
}

impl Serialize for DumpDoc<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        // Cluster id -> its run of the key-ordered services.
        let mut by_cluster: BTreeMap<&str, &[Arc<ServiceNodes>]> = self
            .clusters
            .iter()
            .map(|c| (c.as_str(), &[][..]))
            .collect();
        let mut rest = self.services;
        while let Some(first) = rest.first() {
            let n = rest
                .iter()
                .take_while(|x| x.key.cluster == first.key.cluster)
                .count();
            let (run, tail) = rest.split_at(n);
            by_cluster.insert(first.key.cluster.as_str(), run);
            rest = tail;
        }
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry(
            "endpoints",
            &SerializeSeqOf(by_cluster.iter().map(|(id, run)| ClusterDoc { id, run })),
        )?;
        match self.config {
            Value::Array(_) => m.serialize_entry("config", self.config)?,
            Value::Null => m.serialize_entry("config", &[(); 0])?,
            other => m.serialize_entry("config", &[other])?,
        }
        m.end()
    }
}

/// One cluster of the dump: `{"id","endpoints":[{"name","value",..}]}`.
struct ClusterDoc<'a> {
    id: &'a str,
    run: &'a [Arc<ServiceNodes>],
}

impl Serialize for ClusterDoc<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry("id", self.id)?;
        m.serialize_entry(
            "endpoints",
            &SerializeSeqOf(self.run.iter().map(|x| EntryDoc(x))),
        )?;
        m.end()
    }
}

/// One service of the dump: APISIX's `name` and `value` (the port map as a
/// JSON string), and the extension fields where there are any.
struct EntryDoc<'a>(&'a ServiceNodes);

impl Serialize for EntryDoc<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        let svc = self.0;
        let value = serde_json::to_string(&svc.ports).map_err(serde::ser::Error::custom)?;
        let mut m = s.serialize_map(None)?;
        m.serialize_entry("name", &format!("{}/{}", svc.key.namespace, svc.key.name))?;
        m.serialize_entry("value", &value)?;
        if !svc.extras.aliases.is_empty() {
            m.serialize_entry("aliases", &svc.extras.aliases)?;
        }
        if !svc.extras.app_protocols.is_empty() {
            m.serialize_entry("appProtocols", &svc.extras.app_protocols)?;
        }
        m.end()
    }
}

/// A sequence written from an iterator (each element serialized as it comes).
struct SerializeSeqOf<I>(I);

impl<I> Serialize for SerializeSeqOf<I>
where
    I: Iterator + Clone,
    I::Item: Serialize,
{
    fn serialize<S: Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_seq(self.0.clone())
    }
}

async fn dump(
    State(st): State<AppState>,
    conn: Option<Extension<Arc<Conn>>>,
    headers: HeaderMap,
) -> Response {
    if !authorized(&st, &headers) {
        return unauthorized();
    }
    let Ok(slot) = st.dumps.clone().try_acquire_owned() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::RETRY_AFTER, "1")],
            Json(json!({"error": format!("{MAX_CONCURRENT_DUMPS} dumps are being sent; retry")})),
        )
            .into_response();
    };
    // Off the async workers: a big dump takes a while to write, and the
    // probes are answered meanwhile.
    let built = tokio::task::spawn_blocking(move || dump_json(&st.shared, &st.config)).await;
    match built {
        Ok(Ok(body)) => {
            // The slot is kept until the answer is written (it is memory
            // until then); without a connection (in-process tests) it ends here.
            if let Some(Extension(conn)) = conn {
                conn.hold_until_written(slot);
            }
            ([(header::CONTENT_TYPE, "application/json")], body).into_response()
        }
        Ok(Err(e)) => internal_error(&e.to_string()),
        Err(e) => internal_error(&e.to_string()),
    }
}

fn internal_error(cause: &str) -> Response {
    tracing::error!(cause, "building the dump failed");
    (
        StatusCode::INTERNAL_SERVER_ERROR,
        Json(json!({"error": format!("building the dump failed: {cause}")})),
    )
        .into_response()
}

#[derive(Deserialize)]
struct NodesQuery {
    service: Option<String>,
}

/// The connected xDS clients (404 when xDS is off); the same token as the dump.
async fn xds_clients(State(st): State<AppState>, headers: HeaderMap) -> Response {
    if !authorized(&st, &headers) {
        return unauthorized();
    }
    match &st.xds {
        Some(hub) => Json(json!({
            "serving": hub.is_ready(),
            "clients": hub.clients(),
        }))
        .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            Json(json!({"error": "xDS is off (kube_discovery.xds.addr is not set)"})),
        )
            .into_response(),
    }
}

async fn nodes(
    State(st): State<AppState>,
    headers: HeaderMap,
    Query(q): Query<NodesQuery>,
) -> Response {
    if !authorized(&st, &headers) {
        return unauthorized();
    }
    let Some(service) = q.service else {
        return (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": "missing query parameter 'service' (expected [id/]namespace/name:port)"})),
        )
            .into_response();
    };
    let query = match parse_service_name(&service) {
        Ok(q) => q,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                Json(json!({"error": e.to_string()})),
            )
                .into_response();
        }
    };
    let Some(svc) = st.shared.desired(&query.key()) else {
        return (
            StatusCode::NOT_FOUND,
            Json(json!({"error": format!("service {} not found", query.key())})),
        )
            .into_response();
    };
    match svc.nodes(&query.port) {
        Some(nodes) => Json(nodes).into_response(),
        None => (
            StatusCode::NOT_FOUND,
            Json(json!({
                "error": format!("service {} has no port {:?}", query.key(), query.port),
                "ports": svc.ports.keys().collect::<Vec<_>>(),
            })),
        )
            .into_response(),
    }
}

#[cfg(test)]
mod tests;
