//! kube-discovery runtime: the I/O around the pure core (`kube-discovery-core`).
//!
//! Data flows one way; every arrow is a function call or a channel:
//!
//! ```text
//!  source, per cluster                              drift
//!    watch::run(Endpoints | EndpointSlice)            watch::run(our own DiscoveredServices)
//!    (+ Service owner UIDs, Endpoints mode)           into the record (shared with the sink)
//!    │                                                │ keys whose objects were edited,
//!    ▼                                                │ deleted, orphaned
//!  core Index (pure) ── changed keys ──▶ state::ControllerState
//!    │                                    (desired nodes, cluster status)
//!    │ changed keys, first-list barrier               │
//!    ▼                                                ▼
//!  inbox::WriterHandle ═══ coalescing inbox ═══▶ writer: carries out what the core's
//!                                                      │ write_plan decides (coalesce, skip, rate
//!                                                      │ limit, retry; leader only)
//!                                                      ▼
//!                                                    sink: server-side apply / delete, a big
//!                                                      service as several objects (shard 0 last);
//!                                                      reads the record before a write,
//!                                                      feeds it the answers
//!
//!  snapshot_sink  the state ──▶ APISIX dump in sharded ConfigMaps (optional, drift-corrected)
//!  http        /healthz /readyz /metrics /v1/discovery/kubernetes/{dump,nodes}  (reads the state)
//!  leader      Lease election: gates the writer and the snapshot sink, fences each write request
//! ```
//!
//! The modules, by concern:
//!
//! ```text
//!  k8s/    client (the tower stack), watch (the one watch loop), source (endpoint watches
//!          into the core index), leader, events, redact (safe summaries of API errors)
//!  write/  inbox, writer (carries out the planner's actions), sink (DiscoveredServices),
//!          record (what the API server holds of our objects, one lock), drift (its
//!          watch and checks), generation, explain,
//!          snapshot_sink (ConfigMaps)
//!  serve/  http (the API, its server limits and token), metrics
//!  cmd/    cli (clap), run (wires everything from the configuration), demo, nodes_cmd,
//!          render_cmd, shell (plugin name, completion, man)
//!  state   ControllerState: desired nodes and health, shared by all of the above
//! ```
//!
//! `watch` is the one watch loop (backoff, 410 relist, bookmarks, idle
//! timeout): sources and the drift watch only implement its `WatchIndex`.
//!
//! Module dependencies (`use crate::..`) have no cycle (kube-sim's
//! `module_graph` unit test checks this crate's sources too).
//!
//! `anyhow` is used only in `main.rs`; everything here returns [`Result`].

#![warn(missing_docs)]
#![cfg_attr(test, allow(clippy::unwrap_used))]

use kube_discovery_core::ConfigErrors;

pub mod cmd;
pub mod k8s;
pub mod serve;
pub mod state;
pub mod write;
pub mod xds;

/// Every error of the runtime. Display strings never contain credentials and
/// carry their cause's text (`main` prints only the top error).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("kubernetes API error: {0}")]
    Kube(#[from] kube::Error),
    /// The configuration file is invalid (one `path: message` line per problem).
    #[error("{0}")]
    Config(#[from] ConfigErrors),
    /// A configured setting cannot be used on this machine.
    #[error(transparent)]
    Setting(#[from] SettingError),
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
    #[error(transparent)]
    Input(#[from] InputError),
    /// JSON (de)serialization failed.
    #[error("JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// YAML serialization failed.
    #[error("YAML: {0}")]
    Yaml(#[from] kube_discovery_core::yaml::WriteError),
    /// A looked-up service and port has no nodes.
    #[error("no nodes for {query}: {reason}")]
    NoNodes {
        /// The service name as given.
        query: String,
        /// Why (`no such service and port`, ...).
        reason: &'static str,
    },
    /// The HTTP server could not start.
    #[error("HTTP server: {0}")]
    Http(#[from] HttpError),
    /// The xDS server could not start.
    #[error(transparent)]
    Xds(#[from] xds::XdsError),
    /// A gateway sync (`kube-discovery sync ...`) failed.
    #[error("{0}")]
    Sync(#[source] kube_discovery_client::sync::Error),
    /// Reading what the controller published (the client crate) failed.
    #[error(transparent)]
    Client(#[from] kube_discovery_client::Error),
    /// The ConfigMap snapshot cannot be built.
    #[error("{0}")]
    Snapshot(#[from] kube_discovery_core::snapshot::BuildError),
    /// The name of a service's object is held by an object that is not this
    /// instance's (`kube_discovery.instance`); it is left alone.
    #[error("DiscoveredService {object} belongs to {owner}; this instance leaves it alone")]
    NameTaken {
        /// `namespace/name` of the object.
        object: String,
        /// Whose it is.
        owner: kube_discovery_core::crd::Owner,
    },
    /// A write was dropped because this replica does not lead (any more):
    /// not a failure, nothing was sent after the loss.
    #[error(transparent)]
    Fenced(#[from] k8s::leader::Fenced),
    /// A write task panicked (its key is retried like a failed write).
    #[error("the write panicked: {0}")]
    WritePanicked(String),
    /// A long-running task of `run` ended or panicked while the controller
    /// was not shutting down; the process exits non-zero so that it is restarted.
    #[error("the {task} task died: {cause}")]
    TaskDied {
        /// The task (`source <cluster>`, `writer`, `leader election`, ...).
        task: String,
        /// What happened (the panic message, or that it returned).
        cause: String,
    },
}

/// A setting of a valid configuration that this machine or process cannot
/// honour; each message starts with the setting's path.
#[derive(Debug, thiserror::Error)]
pub enum SettingError {
    /// `service.host`/`port` do not form a URL.
    #[error("discovery.kubernetes.service: cannot build URL {url}: {source}")]
    ServiceUrl {
        /// The URL built from the settings.
        url: String,
        /// The cause.
        #[source]
        source: ::http::uri::InvalidUri,
    },
    /// A file named by a setting does not exist.
    #[error("{setting}: {} does not exist", .path.display())]
    MissingFile {
        /// The setting's path.
        setting: &'static str,
        /// The file.
        path: std::path::PathBuf,
    },
    /// A file named by a setting cannot be read.
    #[error("{setting}: cannot read {}: {source}", .path.display())]
    Unreadable {
        /// The setting's path.
        setting: &'static str,
        /// The file.
        path: std::path::PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A file named by a setting is empty.
    #[error("{setting}: {} is empty", .path.display())]
    EmptyFile {
        /// The setting's path.
        setting: &'static str,
        /// The file.
        path: std::path::PathBuf,
    },
    /// The snapshot name leaves no room for shard suffixes.
    #[error(
        "kube_discovery.sinks.configmap.name: at most {max} characters (shards are named <name>-<i>), got {len}"
    )]
    SnapshotNameTooLong {
        /// The limit.
        max: usize,
        /// The name's length.
        len: usize,
    },
    /// The hidden shard-size override is not a number.
    #[error("{variable}: not a number of bytes: {value:?}")]
    ShardBytesNotANumber {
        /// The environment variable.
        variable: &'static str,
        /// Its value.
        value: String,
        /// The cause.
        #[source]
        source: std::num::ParseIntError,
    },
    /// The hidden shard-size override is out of range.
    #[error("{variable}: {value} is outside {min}..={max}")]
    ShardBytesOutOfRange {
        /// The environment variable.
        variable: &'static str,
        /// Its value.
        value: usize,
        /// The smallest accepted value.
        min: usize,
        /// The largest accepted value.
        max: usize,
    },
    /// Leader election needs a namespace and none is known.
    #[error(
        "kube_discovery.leader_election.lease_namespace: not set and the own namespace is unknown \
         (set it, or POD_NAMESPACE)"
    )]
    LeaseNamespaceUnknown,
}

/// Malformed input of a command (`render`, `nodes`, `demo`).
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    /// A service name (`[id/]ns/name:port`) is malformed.
    #[error("{0}")]
    ServiceName(#[source] kube_discovery_core::ParseError),
    /// The service name given to `--nodes` is malformed.
    #[error("--nodes: {0}")]
    NodesFlag(#[source] kube_discovery_core::ParseError),
    /// `--nodes` names a cluster id the configuration does not have.
    #[error("--nodes: cluster id {0:?} is not in the configuration")]
    UnknownCluster(String),
    /// A document of the `render` input is not YAML or JSON.
    #[error("input document #{index}: {source}")]
    Document {
        /// Position among the non-empty documents, from 1.
        index: usize,
        /// The cause.
        #[source]
        source: kube_discovery_core::yaml::ParseError,
    },
    /// An object of the `render` input cannot be converted.
    #[error("{0}")]
    Render(#[from] kube_discovery_core::RenderError),
    /// `demo` in a binary built without it.
    #[error(
        "this kube-discovery binary was built without the embedded demo (cargo feature `demo`; \
         release binaries and the image leave it out): run `cargo run -- demo` in a checkout"
    )]
    NoDemo,
    /// A failure injected by a test.
    #[cfg(test)]
    #[error("injected failure")]
    Injected,
}

/// The HTTP server (or the demo's API server) could not start.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// The listen address cannot be bound.
    #[error("cannot bind {addr}: {source}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The bound socket has no local address.
    #[error("{0}")]
    LocalAddr(#[source] std::io::Error),
    /// The demo's in-process kube-sim failed (start, certificates, kubeconfig).
    #[cfg(feature = "demo")]
    #[error("kube-sim: {0}")]
    Sim(#[source] kube_sim::Error),
    /// The demo's CRD was not served in time.
    #[error("the DiscoveredService CRD was not served in time")]
    CrdNotServed,
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
            Error::Config(_) | Error::Setting(_) => "config",
            Error::Kubeconfig(_) => "kubeconfig",
            Error::Io { .. } | Error::Write { .. } => "io",
            Error::Input(_) => "input",
            Error::Json(_) | Error::Yaml(_) => "serialization",
            Error::NoNodes { .. } => "not_found",
            Error::Http(_) => "http",
            Error::Xds(_) => "xds",
            Error::Sync(_) => "sync",
            Error::Client(_) => "client",
            Error::Snapshot(_) => "snapshot",
            Error::NameTaken { .. } => "name_taken",
            Error::Fenced(_) => "fenced",
            Error::WritePanicked(_) => "panic",
            Error::TaskDied { .. } => "task_died",
        }
    }

    /// A write dropped by the leadership fence ([`k8s::leader::Fence`]).
    pub fn is_fenced(&self) -> bool {
        matches!(self, Error::Fenced(_))
    }

    /// The API server answered 429 (too many requests).
    pub fn is_throttled(&self) -> bool {
        matches!(self, Error::Kube(kube::Error::Api(s)) if s.code == 429)
    }

    /// The configuration or the command's input is wrong (exit code 2): the
    /// message names the problem, one line each, never a token.
    pub fn is_usage(&self) -> bool {
        matches!(self, Error::Config(_) | Error::Setting(_) | Error::Input(_))
    }
}

/// The text of a panic's payload (`panic!` with a message gives a `&str`
/// or a `String`).
pub fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".to_string())
}

/// Result with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the unit tests of several modules share.
#[cfg(test)]
pub(crate) mod test_support {
    use kube::Client;

    /// A fresh kube-sim and a client of its admin.
    pub(crate) async fn sim_client() -> (kube_sim::Sim, Client) {
        let sim = kube_sim::Sim::start(kube_sim::SimConfig::default())
            .await
            .expect("kube-sim starts");
        let kc = kube::config::Kubeconfig::from_yaml(&sim.kubeconfig_yaml(&sim.admin_token()))
            .expect("kube-sim's kubeconfig");
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .expect("kube-sim's client config");
        (sim, Client::try_from(cfg).expect("a client of kube-sim"))
    }
}

#[cfg(test)]
mod tests;
