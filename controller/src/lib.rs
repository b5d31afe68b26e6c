//! kube-discovery runtime: the I/O around the pure core (`kube-discovery-core`).
//!
//! Data flows one way; every arrow is a function call or a channel:
//!
//! ```text
//!  source, per cluster                              drift
//!    watch::run(Endpoints | EndpointSlice)            watch::run(our own DiscoveredServices)
//!    (+ Service owner UIDs, Endpoints mode)           into its cache, the DriftView
//!    │                                                │ keys whose objects were edited,
//!    ▼                                                │ deleted, orphaned
//!  core Index (pure) ── changed keys ──▶ state::Shared (desired nodes, cluster status)
//!    │ changed keys, first-list barrier               │
//!    ▼                                                ▼
//!  inbox::WriterHandle ════════ one channel ════════▶ writer: coalesce ▶ skip no-ops ▶ rate
//!                                                      │ limit ▶ retry (reads Shared; leader only)
//!                                                      ▼
//!                                                    sink: server-side apply / delete, a big
//!                                                      service as several objects (shard 0 last);
//!                                                      asks the DriftView if a key really differs
//!
//!  snapshot    Shared ──▶ APISIX dump in sharded ConfigMaps (optional sink, drift-corrected)
//!  http        /healthz /readyz /metrics /v1/discovery/kubernetes/{dump,nodes}  (reads Shared)
//!  leader      Lease election: gates the writer and the snapshot sink
//!  run         wires all of the above (`RunOptions`, from the configuration)
//!  nodes       `kube-discovery nodes` (reads through kube-discovery-client)
//!  render_cmd  `kube-discovery render` (the core's pure render on files)
//!  shell       the `kubectl-discovery` plugin name, `completion` and `man` (from the clap definition)
//! ```
//!
//! `watch` is the one watch loop (backoff, 410 relist, bookmarks, idle
//! timeout): sources and the drift watch only implement its `WatchIndex`.
//!
//! Module dependencies (`use crate::..`) have no cycle: a module uses only
//! modules on lines below its own.
//!
//! ```text
//!  demo ─▶ run, client                 (feature `demo`: kube-sim in process)
//!  run ─▶ source, drift, writer, sink, snapshot, http, leader, state, metrics, client
//!  writer ─▶ sink, drift, inbox, state, metrics         nodes ─▶ client
//!  sink ─▶ drift, client                                http ─▶ snapshot, state, metrics
//!  source ─▶ watch, inbox, state, metrics    drift ─▶ watch, inbox, state
//!  snapshot ─▶ state, metrics, client
//!  watch ─▶ client                           metrics ─▶ state       render_cmd ─▶ cli
//!  shell ─▶ cli
//!  state   inbox   client   leader   cli             (nothing of the crate)
//!  (readers of what it writes are the kube-discovery-client crate)
//! ```
//!
//! `anyhow` is used only in `main.rs`; everything here returns [`Result`].

#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod cli;
pub mod client;
#[cfg(feature = "demo")]
pub mod demo;
pub mod drift;
pub mod http;
pub mod inbox;
pub mod leader;
pub mod metrics;
pub mod nodes;
pub mod render_cmd;
pub mod run;
pub mod shell;
pub mod sink;
pub mod snapshot;
pub mod source;
pub mod state;
pub mod watch;
pub mod writer;

/// Every error of the runtime. Display strings never contain credentials.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("kubernetes API error: {0}")]
    Kube(#[from] kube::Error),
    /// The configuration is invalid (one line per problem).
    #[error("{0}")]
    Config(String),
    /// A kubeconfig could not be loaded.
    #[error("kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    /// Reading a file failed.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Writing output (stdout, generated files) failed.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file or directory (`stdout` for the standard output).
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// User input (a file given to `render`, a service name) is malformed.
    #[error("{0}")]
    Input(String),
    /// JSON (de)serialization failed.
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// YAML (de)serialization failed.
    #[error("YAML: {0}")]
    Yaml(#[from] serde_yaml::Error),
    /// A looked-up service or port does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The HTTP server could not start.
    #[error("HTTP server: {0}")]
    Http(String),
    /// A gateway sync (`kube-discovery sync ...`) failed.
    #[error("{0}")]
    Sync(String),
    /// Reading what the controller published (the client crate) failed.
    #[error(transparent)]
    Client(#[from] kube_discovery_client::Error),
    /// The ConfigMap snapshot cannot be built or read.
    #[error("{0}")]
    Snapshot(String),
}

impl Error {
    /// A short, stable label for the failure counters.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(s)) if s.code == 409 => "conflict",
            Error::Kube(kube::Error::Api(s)) if s.code == 403 => "forbidden",
            Error::Kube(kube::Error::Api(s)) if s.code == 404 => "not_found",
            Error::Kube(kube::Error::Api(s)) if s.code == 429 => "throttled",
            Error::Kube(kube::Error::Api(_)) => "api_error",
            Error::Kube(_) => "transport_error",
            Error::Config(_) => "config",
            Error::Kubeconfig(_) => "kubeconfig",
            Error::Io { .. } | Error::Write { .. } => "io",
            Error::Input(_) => "input",
            Error::Json(_) | Error::Yaml(_) => "serialization",
            Error::NotFound(_) => "not_found",
            Error::Http(_) => "http",
            Error::Sync(_) => "sync",
            Error::Client(_) => "client",
            Error::Snapshot(_) => "snapshot",
        }
    }
}

/// Result with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;
