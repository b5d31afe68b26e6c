//! Pure logic of kube-discovery: objects in, nodes out. No I/O in this crate:
//! no network, no filesystem, no environment reads (callers pass an env lookup
//! closure), no clocks (callers pass `now`).
//!
//! ```text
//!  config/     YAML text ──parse_config (serde, garde)──▶ Config ──resolve(+ CLI overrides)──▶ Plan
//!  source/     what the watches deliver, reduced to what the index needs:
//!    lean        watch line ──▶ LeanEndpoints | LeanEndpointSlice | LeanService
//!    convert/    Endpoints | EndpointSlices ──▶ PortMap (+ warnings); the incremental merge
//!    service     Service ──▶ ServiceInfo (ports only) ──▶ PortExtras (aliases, appProtocols)
//!    filter      namespace_selector / label_selector, compiled and matchable
//!  index/      apply/delete/reset events ──▶ changed ServiceKeys, desired ServiceNodes
//!              (endpoints, slices, services, relist, desired, warnings)
//!  model/      ServiceKey, Node, PortMap, ServiceNodes, parse_service_name
//!  model/version/ content versions, order-independent digests, node buckets
//!  crd/        ServiceNodes ──▶ DiscoveredService: types, naming, ownership, objects,
//!              shards (stable partition, per-shard versions), conditions, the reader rule
//!  render.rs   objects (JSON values) + config ──▶ DiscoveredServices
//!  snapshot/   the whole state ──▶ sharded ConfigMap texts + index (layout, builder); assemble
//!  yaml.rs     YAML text ◀──▶ serde values (serde-saphyr, YAML 1.2, stable layout)
//!  write_plan/ changes, write results, drift answers, leadership, time ──▶ writes to do, when
//!              record/: what the API server holds of our objects, and the drift checks over it
//!  snapshot_plan/ state changes, watched ConfigMaps, results, leadership, time ──▶ snapshot writes, when
//!  backoff.rs  the reconnect policy of every watcher
//!  xds/        one xDS (ADS) stream's requests + catalog changes ──▶ responses by name:
//!              subscriptions, nonces, ACK/NACK, what the client holds (SotW and delta)
//! ```

#![warn(missing_docs)]
#![cfg_attr(test, allow(clippy::unwrap_used, clippy::expect_used))]

pub mod backoff;
pub mod config;
pub mod crd;
#[cfg(test)]
mod golden;
pub mod index;
pub mod model;
pub mod render;
pub mod snapshot;
pub mod snapshot_plan;
pub mod source;
pub mod write_plan;
pub mod xds;
pub mod yaml;

/// The host type of [`Node`] (inline up to 24 bytes), re-exported so users of
/// the model need no direct dependency.
pub use compact_str::CompactString;
pub use config::{ClusterConfig, Config, ConfigErrors, Connection, Settings, parse_config};
pub use index::Index;
pub use model::version::{content_version, object_version};
pub use model::{
    Node, NodeQuery, NodeTargetRef, NodeTopology, ParseError, PortMap, ServiceKey, ServiceNodes,
    SourceKind, parse_service_name,
};
pub use render::{RenderError, RenderOptions, render};
pub use source::convert::{ConvertOptions, Converted, Drain};
pub use source::filter::{LabelSelector, NamespaceFilter};
