//! Pure logic of kube-discovery: objects in, nodes out. No I/O in this crate:
//! no network, no filesystem, no environment reads (callers pass an env lookup
//! closure), no clocks (callers pass `now`).
//!
//! ```text
//!  config/     YAML text ──parse_config (serde, garde)──▶ Config ──resolve(+ CLI overrides)──▶ Plan
//!  filter.rs   namespace_selector / label_selector, compiled and matchable
//!  lean.rs     watch line ──▶ LeanEndpoints | LeanEndpointSlice (only what convert/ reads)
//!  convert/    Endpoints | EndpointSlices ──▶ PortMap (+ warnings)
//!  index.rs    apply/delete/reset events ──▶ changed ServiceKeys, desired ServiceNodes
//!  conditions.rs ServiceNodes (+ skipped data, previous conditions) ──▶ Ready, Degraded
//!  crd.rs      ServiceNodes ──▶ DiscoveredService (name, labels, ownerReference); crd_yaml()
//!  shards.rs   a big service's nodes ──stable hash──▶ shards; per-shard versions
//!  service.rs  Service ──▶ ServiceInfo (ports only) ──▶ PortExtras (aliases, appProtocols)
//!  model.rs    ServiceKey, Node, PortMap, parse_service_name, content_version
//!  render.rs   objects (JSON values) + config ──▶ DiscoveredServices
//!  dump.rs     Dump (all services) ──▶ sharded ConfigMap texts + index; assemble (reader)
//!  yaml.rs     YAML text ◀──▶ serde values (serde-saphyr, YAML 1.2, stable layout)
//!  write_plan/ changes, write results, drift answers, leadership, time ──▶ writes to do, when
//!  snapshot_plan/ state changes, watched ConfigMaps, results, leadership, time ──▶ snapshot writes, when
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
pub mod version;
pub mod write_plan;
pub mod yaml;

/// The host type of [`Node`] (inline up to 24 bytes), re-exported so users of
/// the model need no direct dependency.
pub use compact_str::CompactString;
pub use config::{ClusterConfig, Config, ConfigErrors, Connection, Settings, parse_config};
pub use index::Index;
pub use model::{
    Node, NodeQuery, NodeTargetRef, NodeTopology, ParseError, PortMap, ServiceKey, ServiceNodes,
    SourceKind, parse_service_name,
};
pub use render::{RenderError, RenderOptions, render};
pub use source::convert::{ConvertOptions, Converted, Drain};
pub use source::filter::{LabelSelector, NamespaceFilter};
pub use version::{content_version, object_version};
