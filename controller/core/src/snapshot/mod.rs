//! The ConfigMap snapshot, pure part: the whole discovered state in APISIX's
//! dump shape, cut into ConfigMap-sized shards, and the reader that puts the
//! shards back together and refuses anything inconsistent.
//!
//! ```text
//!  Dump (cluster id -> ns/name -> PortMap)
//!    │ to_apisix_endpoints()   exactly the "endpoints" part of GET /v1/discovery/kubernetes/dump
//!    │ version()               sha256 of that JSON (16 hex)
//!    ▼
//!  build(dump, name, max)  ──▶ Layout { index.json, shards [<name>-0 .. <name>-k] }
//!  Builder::build(clusters, state's Arcs)  the same bytes, incrementally (the sink's)
//!    shards 0..B: small services in hash buckets  (FNV-1a 64 of "id/ns/name" mod B)
//!    then, per big service in order: its own shard, or one per part
//!                                    (FNV-1a 64 of each node's host mod P)
//!    shard <name>-i, data key "<name>-i.json":
//!      {"format":2,"index":i,"endpoints":[{"id":"","endpoints":[{"name":"ns/a","value":"{..}"}, ..]}]}
//!    index <name>, data key "index.json":
//!      {"format":2,"version":V,"clusters":[..],"services":S,"nodes":N,
//!       "shards":[{"name":"<name>-0","key":"<name>-0.json","sha256":H0,"bytes":B0}, ..]}
//!      V = layout_version: sha256 (16 hex) of {"clusters":[..],"shards":[H0,..]}
//!  assemble(index.json, |shard| text) ──▶ Dump   (or an error naming the shard and version)
//! ```
//!
//! * **Shape.** Entries are APISIX dump entries: `name` is `ns/name`, `value`
//!   is the port map serialized as a JSON *string* (APISIX keeps strings in its
//!   shared dictionary), grouped per cluster `id`. Assembled, the document is
//!   byte-for-byte what `GET /dump` serves under `endpoints`.
//! * **Size.** Every shard's data, measured as its JSON-escaped length (what a
//!   request body carries; never less than the stored bytes), stays within
//!   `max_bytes` ([`DEFAULT_MAX_SHARD_BYTES`] = 900 KiB, under the 1 MiB
//!   ConfigMap limit).
//! * **One change, one shard.** A service whose entry is at
//!   most a quarter of a shard lives in the bucket given by the hash of its
//!   name; the bucket count `B` is the smallest power of two at which every
//!   bucket fits. A bigger service has shards of its own after the buckets:
//!   one if it fits a part ([`DEFAULT_MAX_PART_BYTES`], 128 KiB, smaller
//!   than a shard so that a change rebuilds and hashes little), else `P`
//!   parts (the smallest power of two at which each fits) by
//!   the hash of each node's host, the partition of the DiscoveredService
//!   shards ([`crate::crd::shards::partition`]; every port of an endpoint in one
//!   part, part 0 carrying every port key), as entries with
//!   `"part":{"index":k,"count":P}`. Where a service or node goes depends on
//!   its name or host and the count only, never on what sorts before it, and
//!   a shard's text only on what it holds: one endpoint or one small service
//!   changed rewrites one shard, byte-identical otherwise, and the index. The
//!   counts are pure functions of the content (no memory of earlier layouts
//!   needed after a restart); the price is that a count doubling or halving
//!   (a bucket or part crossing the limit), or a service becoming big or small,
//!   renumbers or rewrites the shards after it, once.
//! * **Reading parts.** The reader merges a service's parts per port, in any
//!   position, each part exactly once, and sorts each port's nodes
//!   (`model::sort_nodes`, the order of the state's lists; [`build`] refuses
//!   a split service whose lists are not in it).
//! * **Format.** Only [`FORMAT`] is read; an index written by an older
//!   controller (format 1) is refused with an error that says to re-sync
//!   with the current controller, which rewrites it.
//! * **Consistency.** Shard names are fixed (`<name>-<i>`, so a pod can mount
//!   them) and carry no version; the index lists, for the version it
//!   describes, the sha256 of every shard's text. The writer writes changed
//!   shards first and the index last, then deletes shards the index no longer
//!   lists. A reader that meets a shard being rewritten sees a hash mismatch,
//!   one that meets a deleted shard sees it missing: both are
//!   [`AssembleError::is_retryable`] ("read again"), never a silently mixed
//!   result. On top of the per-shard hashes the index's `version` must be
//!   the hash of its listed shard hashes and clusters ([`layout_version`]),
//!   and the service/node counts must match.
//! * **CPU per change.** [`Builder`] keeps every service's entries and every
//!   shard's text and hash across rounds and rebuilds only what changed; the
//!   version is computed from the shard hashes, not the whole state. A
//!   changed service split into parts is re-cut by the index's per-bucket
//!   digests ([`crate::model::version::Buckets`]): only parts whose digest changed are
//!   copied, serialized and hashed. [`build`] builds from scratch and is the
//!   reference the builder is tested against.
//!
//! Files: `layout` (placement, costs, [`build`]), `builder` ([`Builder`]),
//! `assemble` (the reader).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Weak};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::model::version::{MAX_SHARDS, PortsDigest};
use crate::model::{Node, NodeQuery, PortMap, ServiceKey, ServiceNodes};
use crate::source::service::PortExtras;

mod assemble;
mod builder;
mod layout;

/// The value of the snapshot ConfigMaps' label `kubediscovery.io/snapshot`:
/// the snapshot's name, shortened with a hash beyond 63 characters (the one
/// scheme of the DiscoveredService labels).
pub use crate::crd::label_value;
pub use assemble::{AssembleError, assemble, parse_index};
pub use builder::Builder;
pub use layout::{build, build_with, layout_version};

/// Format number written into the index and every shard, the only one
/// [`assemble`] reads. Format 2 cuts a big service by node host hash (its
/// parts in any position, each port's nodes sorted after merging); format 1
/// (older controllers) cut it by node ranges and is refused.
pub const FORMAT: u32 = 2;

/// Data key of the index ConfigMap.
pub const INDEX_KEY: &str = "index.json";

/// Default shard budget: 900 KiB of JSON-escaped text, under the 1 MiB
/// ConfigMap limit with room for metadata.
pub const DEFAULT_MAX_SHARD_BYTES: usize = 900 * 1024;

/// Smallest accepted shard budget (tests use small budgets to get many shards).
pub const MIN_SHARD_BYTES: usize = 1024;

/// Default budget of one part of a service with shards of its own (escaped
/// JSON bytes, like the shard budget, and never above it): such a service is
/// cut into the smallest power-of-two number of parts of at most this size,
/// each in a shard of its own.
///
/// Why smaller than a shard (issue 19 item 2): one endpoint changed in a
/// split service rewrites exactly one part, and what that costs is
/// re-serializing, measuring and sha256-hashing that part's text (about
/// 1.7 ms per 900 KiB here, most of a change's snapshot cost when parts
/// filled whole shards). At 128 KiB a 100,000-endpoint service is 64 parts
/// instead of 8. The price is objects: a reader reads one ConfigMap per part
/// (their total bytes stay the same) and a mounting pod lists one projected
/// source per shard. Small services still share full-size bucket shards.
pub const DEFAULT_MAX_PART_BYTES: usize = 128 * 1024;

/// Services of one cluster: `(namespace, name)` -> ports.
pub type ClusterServices = BTreeMap<(String, String), PortMap>;

/// The whole discovered state: cluster id (`""` single cluster) -> services.
/// Clusters without services are kept (the dump lists them too).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dump {
    /// Cluster id -> services.
    pub clusters: BTreeMap<String, ClusterServices>,
}

impl Dump {
    /// An empty dump listing these clusters.
    pub fn with_clusters<'a>(ids: impl IntoIterator<Item = &'a str>) -> Self {
        Self {
            clusters: ids
                .into_iter()
                .map(|id| (id.to_string(), ClusterServices::new()))
                .collect(),
        }
    }

    /// Adds (or replaces) one service; its cluster is added if needed.
    pub fn insert(&mut self, key: &ServiceKey, ports: PortMap) {
        self.clusters
            .entry(key.cluster.to_string())
            .or_default()
            .insert((key.namespace.to_string(), key.name.to_string()), ports);
    }

    /// Number of services.
    pub fn services(&self) -> usize {
        self.clusters.values().map(BTreeMap::len).sum()
    }

    /// Number of nodes over all services and ports.
    pub fn nodes(&self) -> usize {
        self.clusters
            .values()
            .flat_map(BTreeMap::values)
            .flat_map(PortMap::values)
            .map(Vec::len)
            .sum()
    }

    /// The nodes of `[id/]ns/name:port`, like `GET /nodes` answers.
    pub fn lookup(&self, q: &NodeQuery) -> Option<&[Node]> {
        self.clusters
            .get(&q.cluster)?
            .get(&(q.namespace.clone(), q.name.clone()))?
            .get(&q.port)
            .map(Vec::as_slice)
    }

    /// The `endpoints` array of APISIX's dump (`GET /v1/discovery/kubernetes/dump`):
    /// `[{"id": id, "endpoints": [{"name": "ns/name", "value": "<port map JSON>"}]}]`.
    pub fn to_apisix_endpoints(&self) -> Value {
        Value::Array(
            self.clusters
                .iter()
                .map(|(id, services)| {
                    let eps: Vec<Value> = services
                        .iter()
                        .map(|((ns, name), ports)| {
                            json!({"name": format!("{ns}/{name}"), "value": port_json(ports)})
                        })
                        .collect();
                    json!({"id": id, "endpoints": eps})
                })
                .collect(),
        )
    }
}

/// Adds kube-discovery's per-service extension fields to the entries of an
/// APISIX `endpoints` array ([`Dump::to_apisix_endpoints`]): `aliases` and
/// `appProtocols` (see [`crate::source::service`]) next to `name` and `value`, only
/// where `extras_of` gives non-empty ones. APISIX's dump readers read
/// `name` and `value` only, and `value` is untouched, so the document stays
/// an APISIX dump.
pub fn with_port_extras(
    mut endpoints: Value,
    extras_of: impl Fn(&ServiceKey) -> Option<PortExtras>,
) -> Value {
    for cluster in endpoints.as_array_mut().into_iter().flatten() {
        let id = cluster
            .get("id")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let entries = cluster.get_mut("endpoints").and_then(Value::as_array_mut);
        for entry in entries.into_iter().flatten() {
            let Some((ns, name)) = entry
                .get("name")
                .and_then(Value::as_str)
                .and_then(|n| n.split_once('/'))
            else {
                continue;
            };
            let Some(x) = extras_of(&ServiceKey::new(id.as_str(), ns, name)) else {
                continue;
            };
            if let Some(obj) = entry.as_object_mut() {
                if !x.aliases.is_empty() {
                    obj.insert("aliases".to_string(), json!(x.aliases));
                }
                if !x.app_protocols.is_empty() {
                    obj.insert("appProtocols".to_string(), json!(x.app_protocols));
                }
            }
        }
    }
    endpoints
}

/// A port map as the JSON string APISIX stores.
fn port_json(ports: &PortMap) -> String {
    // Maps of strings to plain structs always serialize; the fallback is never
    // taken but keeps this total.
    serde_json::to_string(ports).unwrap_or_else(|_| "{}".to_string())
}

/// Length of `s` once written as a JSON string (without the quotes).
///
/// Byte by byte: every byte of a multi-byte UTF-8 character is >= 0x80 and
/// stays as it is, so only ASCII needs a look (this runs over every shard's
/// text, megabytes per build: a per-`char` loop was a fifth of the build).
pub fn escaped_len(s: &str) -> usize {
    s.bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 2,
            0..=0x1f => 6,
            _ => 1,
        })
        .sum()
}

fn sha256_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// The sha256 (hex) an index lists for a shard's text (what a reader
/// compares; public for tests that write a layout by hand).
pub fn shard_sha256(text: &str) -> String {
    sha256_hex(text)
}

/// One shard as written to the API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardData {
    /// ConfigMap name `<name>-<i>`.
    pub name: String,
    /// Data key `<name>-<i>.json` (unique, so all shards fit one projected volume).
    pub key: String,
    /// The shard document.
    pub text: String,
    /// sha256 (hex) of `text`, as listed in the index.
    pub sha256: String,
}

/// Everything the writer publishes for one version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// [`layout_version`] of the shards.
    pub version: String,
    /// Text of the index document (data key [`INDEX_KEY`]).
    pub index: String,
    /// The shards, in order; shared, so that a [`Builder`] hands out the
    /// unchanged shards of the previous round without copying their texts.
    pub shards: Vec<Arc<ShardData>>,
    /// Services in the dump.
    pub services: usize,
    /// Nodes in the dump.
    pub nodes: usize,
}

impl Layout {
    /// Total bytes of all shard texts.
    pub fn shard_bytes(&self) -> usize {
        self.shards.iter().map(|s| s.text.len()).sum()
    }
}

/// The index document.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexDoc {
    /// [`FORMAT`].
    pub format: u32,
    /// [`layout_version`] of the listed shards and clusters.
    pub version: String,
    /// Every cluster id (also those without services).
    pub clusters: Vec<String>,
    /// Number of services.
    pub services: usize,
    /// Number of nodes.
    pub nodes: usize,
    /// The shards, in order.
    pub shards: Vec<ShardRef>,
}

/// One shard as listed in the index.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardRef {
    /// ConfigMap name.
    pub name: String,
    /// Data key holding the shard text.
    pub key: String,
    /// sha256 (hex) of the shard text.
    pub sha256: String,
    /// Length of the shard text.
    pub bytes: usize,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct ShardDoc {
    format: u32,
    index: usize,
    endpoints: Vec<Group>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Group {
    id: String,
    endpoints: Vec<Entry>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Entry {
    name: String,
    value: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    part: Option<Part>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Part {
    index: u32,
    count: u32,
}

/// Why a layout cannot be built.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BuildError {
    /// The budget is below [`MIN_SHARD_BYTES`].
    #[error("snapshot shard size {0} is below the minimum of {MIN_SHARD_BYTES} bytes")]
    BudgetTooSmall(usize),
    /// One node of a service does not fit in a shard on its own.
    #[error("snapshot: service {service} cannot be split into shards of at most {max} bytes")]
    ServiceTooLarge {
        /// `[id/]ns/name`.
        service: String,
        /// The budget.
        max: usize,
    },
    /// Serializing failed (not expected for these types).
    #[error("snapshot: cannot serialize: {0}")]
    Json(#[source] std::sync::Arc<serde_json::Error>),
    /// More shards or endpoints than a shard document can number.
    #[error("snapshot: cannot serialize: {0}")]
    TooMany(#[source] std::num::TryFromIntError),
    /// A service too big for one shard has a port whose nodes are not in
    /// the state's order (`model::sort_nodes`): its parts, merged and
    /// sorted by a reader, would not give back its lists (not expected:
    /// conversion sorts them).
    #[error("snapshot: service {service} has a node list out of order; it cannot be split")]
    Unsorted {
        /// `[id/]ns/name`.
        service: String,
    },
    /// The small services cannot be spread over buckets that fit (not
    /// expected: every one is at most a quarter of a shard).
    #[error("snapshot: the services cannot be spread over shards of at most {max} bytes")]
    Crowded {
        /// The budget.
        max: usize,
    },
    /// A [`Builder`] was handed services out of key order (a bug of the
    /// caller: the state lists them in order).
    #[error("snapshot: service {service} is out of key order")]
    Unordered {
        /// `[id/]ns/name`.
        service: String,
    },
    /// A shard came out over the budget the split allowed for (a bug).
    #[error("snapshot: cannot serialize: shard {shard} is {len} bytes, over the {max} budget")]
    ShardOverBudget {
        /// The shard's index.
        shard: usize,
        /// Its escaped length.
        len: usize,
        /// The budget.
        max: usize,
    },
}

#[cfg(test)]
mod tests;
