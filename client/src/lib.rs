//! What outside Rust users depend on to read what kube-discovery publishes,
//! and what the controller's own readers (`kube-discovery nodes`,
//! `kube-discovery sync`) are built from. Nothing here writes to the API
//! server, and nothing depends on the controller crate.
//!
//! kube-discovery writes one `DiscoveredService` per Kubernetes Service
//! (optionally also a ConfigMap snapshot of the whole state). This crate reads
//! them in every way a consumer needs:
//!
//! ```text
//!  DiscoveredServices ──reflector──▶ resolver::NodesResolver   live: nodes("ns/name:port"), change signal
//!                     ──paged list─▶ list::list_managed        once
//!  ConfigMap snapshot ──API / dir──▶ snapshot::{read, read_dir} -> Dump (consistent or "read again")
//!  [DiscoveredService] ──lookup────▶ [Node]   merges the shards of a big service
//!  nodes::NodesFrom                  one read + lookup from any of the three sources
//!  policy                            usable nodes, what to do when none are (EmptyPolicy)
//!  sync::{nginx, haproxy}            keep real gateways following the resolver (feature `sync`)
//!  connect                           a kube Client from a kubeconfig (or in-cluster)
//! ```
//!
//! ```no_run
//! # async fn f() -> kube_discovery_client::Result<()> {
//! let client = kube_discovery_client::connect::client(None, None).await?;
//! let resolver = kube_discovery_client::NodesResolver::start(client, None);
//! resolver.wait_ready().await;
//! let nodes = resolver.nodes("default/web:http")?; // Option<Vec<Node>>
//! # Ok(()) }
//! ```
//!
//! Every reader here counts only DiscoveredServices that agree with
//! themselves (namespace, name and labels match the spec:
//! [`kube_discovery_core::crd::ReaderRule`]); others are skipped with a
//! warning naming them ([`lookup::accept`]).
//!
//! Features: `sync` (default) adds the nginx and HAProxy syncs with their
//! clap arguments (clap, glob); `default-features = false` is the
//! readers alone. The types come from `kube-discovery-core` and are
//! re-exported here ([`Node`], [`NodeQuery`], [`DiscoveredService`],
//! [`Dump`]), so this crate is the only dependency a consumer needs.

#![warn(missing_docs)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod connect;
pub mod list;
pub mod lookup;
pub mod nodes;
pub mod policy;
pub mod resolver;
pub mod snapshot;
#[cfg(feature = "sync")]
pub mod sync;

pub use kube_discovery_core::crd::{DiscoveredService, MANAGED_BY_SELECTOR};
use kube_discovery_core::snapshot::AssembleError;
pub use kube_discovery_core::snapshot::Dump;
pub use kube_discovery_core::{Node, NodeQuery, ParseError, parse_service_name};
pub use lookup::lookup;
pub use nodes::NodesFrom;
pub use resolver::NodesResolver;

/// Every error of this crate. Display strings never contain credentials.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed.
    #[error("kubernetes API error: {0}")]
    Kube(#[from] kube::Error),
    /// A kubeconfig could not be loaded.
    #[error("kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    /// No kubeconfig was given or found, and this is not a pod.
    #[error("no kubeconfig and not in a cluster: {0}")]
    NoConfig(#[source] kube::config::InferConfigError),
    /// Reading a file failed.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A service name (`[id/]ns/name:port`) is malformed.
    #[error("{0}")]
    ServiceName(#[from] ParseError),
    /// `--snapshot` is not `NAMESPACE/NAME`.
    #[error("--snapshot {0:?}: expected NAMESPACE/NAME")]
    SnapshotFlag(String),
    /// Reading from the API server was asked for without a client.
    #[error("reading from the API server needs a client")]
    NoClient,
    /// The snapshot's index ConfigMap does not exist.
    #[error("snapshot index ConfigMap {namespace}/{name} not found")]
    SnapshotNotFound {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// The snapshot's index ConfigMap has no index key.
    #[error("ConfigMap {namespace}/{name} has no {key}")]
    NoSnapshotIndex {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// The missing key.
        key: &'static str,
    },
    /// The snapshot is malformed or does not fit together.
    #[error("{0}")]
    Snapshot(#[from] AssembleError),
    /// The snapshot's ConfigMaps kept changing while read and there was no
    /// other problem to report.
    #[error("snapshot {namespace}/{name}: no consistent read")]
    SnapshotUnsettled {
        /// The index ConfigMap's namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// The mounted snapshot files kept changing while read.
    #[error("snapshot in {}: no consistent read", .0.display())]
    SnapshotDirUnsettled(std::path::PathBuf),
    /// A blocking reader task panicked or was cancelled.
    #[error("reader task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
    /// The objects of a big service do not form one version yet (a shard
    /// is being rewritten): read again.
    #[error("the DiscoveredServices of {service} are being rewritten ({why}); read again")]
    Incomplete {
        /// The service (`[id/]ns/name`).
        service: String,
        /// What does not fit together.
        #[source]
        why: kube_discovery_core::crd::Incomplete,
    },
    /// The reflector's task ended.
    #[error("DiscoveredService watch stopped")]
    WatchStopped,
    /// The first complete list did not arrive in time.
    #[error(
        "no complete list of DiscoveredServices within {0:?} (API server reachable? CRD installed? RBAC allows list/watch?)"
    )]
    NotListed(std::time::Duration),
}

/// Result with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;
