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
//! * **One change, one shard (issue 19 item 2).** A service whose entry is at
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
//!   renumbers or rewrites the shards after it, once. The earlier layout
//!   (format 1) packed services in order and cut big ones by node ranges, so
//!   one endpoint rewrote every shard from the change on.
//! * **Reading parts.** The reader merges a service's parts per port, in any
//!   position, each part exactly once, and sorts each port's nodes
//!   (`model::sort_nodes`, the order of the state's lists; [`build`] refuses
//!   a split service whose lists are not in it). Format 1's consecutive ranges
//!   of sorted lists come out the same, so [`assemble`] reads both formats:
//!   readers can be upgraded before the controller.
//! * **Consistency.** Shard names are fixed (`<name>-<i>`, so a pod can mount
//!   them) and carry no version; the index lists, for the version it
//!   describes, the sha256 of every shard's text. The writer writes changed
//!   shards first and the index last, then deletes shards the index no longer
//!   lists. A reader that meets a shard being rewritten sees a hash mismatch,
//!   one that meets a deleted shard sees it missing: both are
//!   [`AssembleError::is_retryable`] ("read again"), never a silently mixed
//!   result. On top of the per-shard hashes the index's `version` must be
//!   the hash of its listed shard hashes and clusters ([`layout_version`];
//!   format 1: of the whole assembled state, [`Dump::version`]), and the
//!   service/node counts must match.
//! * **CPU per change (issue 19 item 2).** [`Builder`] keeps every
//!   service's entries and every shard's text and hash across rounds and
//!   rebuilds only what changed; the version is computed from the shard
//!   hashes for the same reason (hashing the whole state per round was a
//!   third of a round's cost). A changed service split into parts is
//!   re-cut by the kept per-bucket digests of the index
//!   ([`crate::model::Buckets`]): only parts whose digest changed are
//!   copied, serialized and hashed, about 128 KiB per change. [`build`] builds from scratch and is the
//!   reference the builder is tested against.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Weak};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::model::{MAX_SHARDS, Node, NodeQuery, PortMap, PortsDigest, ServiceKey, ServiceNodes};
use crate::service::PortExtras;

/// Format number written into the index and every shard. Format 2 cuts a
/// big service by node host hash (its parts in any position, each port's
/// nodes sorted after merging); format 1 cut it by node ranges (parts in
/// order, concatenated). [`assemble`] reads both: the format-2 rule (merge,
/// then sort) gives format 1's lists too, since its ranges were cut from
/// sorted lists.
pub const FORMAT: u32 = 2;

/// The oldest format [`assemble`] still reads (what a controller before
/// format 2 wrote; read until the new one has rewritten it).
pub const OLDEST_FORMAT: u32 = 1;

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

    /// Content version: the first 16 hex digits of the sha256 of
    /// [`Dump::to_apisix_endpoints`] (compact JSON, keys sorted).
    pub fn version(&self) -> String {
        let text = self.to_apisix_endpoints().to_string();
        let mut h = hex::encode(Sha256::digest(text.as_bytes()));
        h.truncate(16);
        h
    }
}

/// Adds kube-discovery's per-service extension fields to the entries of an
/// APISIX `endpoints` array ([`Dump::to_apisix_endpoints`]): `aliases` and
/// `appProtocols` (see [`crate::service`]) next to `name` and `value`, only
/// where `extras_of` gives non-empty ones. APISIX's dump readers read
/// `name` and `value` only, and `value` is untouched, so the document stays
/// an APISIX dump (and [`Dump::version`], computed without them, unchanged).
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
    /// Format 2: [`layout_version`] of the listed shards and clusters;
    /// format 1: [`Dump::version`] of the state the shards hold.
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

fn entry_size(e: &Entry) -> Result<usize, BuildError> {
    let t = serde_json::to_string(e).map_err(|x| BuildError::Json(x.into()))?;
    Ok(escaped_len(&t))
}

/// Upper bound of the escaped size of everything in a shard but its entries.
const SHARD_OVERHEAD: usize = 96;

fn group_overhead(id: &str) -> usize {
    // {"id":"<id>","endpoints":[]},  escaped, with margin
    2 * (30 + escaped_len(id))
}

/// Compact JSON of `v` (plain data always serializes).
fn json<T: Serialize + ?Sized>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// `s` as it appears inside a JSON string (escaped, without quotes): what
/// [`escaped_twice_len`] measures without building it.
#[cfg(test)]
fn inner(s: &str) -> String {
    let q = serde_json::to_string(s).unwrap_or_default();
    q.get(1..q.len().saturating_sub(1))
        .unwrap_or_default()
        .to_string()
}

/// A service whose whole entry is bigger than this share (a quarter) of a
/// shard's room gets shard(s) of its own; smaller ones share the hash
/// buckets. Buckets are filled by hash, not packed, so an entry close to a
/// shard's size would force many more (mostly empty) buckets before it
/// lands alone; a quarter keeps the buckets reasonably full.
const OWN_SHARD_DIVISOR: usize = 4;

/// The most buckets (and the most parts of one service) the doublings go
/// to: far beyond any state a watch can carry.
const MAX_COUNT: usize = 1 << 16;

/// What one node adds to a measured shard text: its JSON inside the value
/// string (escaped once), measured escaped (twice), plus its comma.
fn node_cost(n: &Node) -> usize {
    escaped_twice_len(&json(n)) + 1
}

/// What one port key adds (`"key":[],`), measured like [`node_cost`].
fn key_cost(port: &str) -> usize {
    escaped_twice_len(&format!("{}:[],", json(port)))
}

/// `escaped_len(inner(s))` without building the escaped text: a value's
/// JSON is escaped once into the shard text, and measured escaped again.
fn escaped_twice_len(s: &str) -> usize {
    s.bytes()
        .map(|b| match b {
            // `\"` / `\\` -> 4 characters once escaped again
            b'"' | b'\\' => 4,
            // `\n` -> `\\n`
            b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 3,
            // `\u00XX` -> `\\u00XX`
            0..=0x1f => 7,
            _ => 1,
        })
        .sum()
}

/// The stable bucket hash of a small service: FNV-1a 64 of
/// `<id>/<ns>/<name>` ([`crate::crd::shards::node_hash`], the hash the
/// DiscoveredService shards use, pinned forever), so a service's bucket
/// depends on its name and the bucket count only, never on the services
/// sorting before it.
fn service_hash(id: &str, ns: &str, name: &str) -> u64 {
    crate::crd::shards::node_hash(&format!("{id}/{ns}/{name}"))
}

/// Splits one service too big for a shard into parts by the hash of each
/// node's host ([`crate::crd::shards::partition`], the partition of the
/// DiscoveredService shards): the smallest power-of-two count `>= 2` at
/// which every part fits `avail`. A node's part depends on its host and the
/// count only, so one endpoint added or removed changes one part, wherever
/// it sorts; all ports of an endpoint are in the same part; part 0 carries
/// every port key.
fn split_service(
    key: &ServiceKey,
    name: &str,
    ports: &PortMap,
    avail: usize,
    max: usize,
) -> Result<(Vec<Entry>, Split), BuildError> {
    let too_large = || BuildError::ServiceTooLarge {
        service: key.to_string(),
        max,
    };
    let fixed = part_fixed(name, ports)?;
    let items: Vec<(u64, usize)> = ports
        .values()
        .flatten()
        .map(|n| (crate::crd::shards::node_hash(&n.host), node_cost(n)))
        .collect();
    let cap = split_cap(items.len());
    let mut count = 2usize;
    let sizes = loop {
        let mut sizes = vec![fixed; count];
        for (h, c) in &items {
            sizes[bucket(*h, count)] += c;
        }
        if sizes.iter().all(|s| *s <= avail) {
            break sizes;
        }
        if count >= cap {
            return Err(too_large());
        }
        count *= 2;
    };
    let total = u32::try_from(count).map_err(BuildError::TooMany)?;
    let parts = crate::crd::shards::partition(ports, total);
    let mut out = Vec::with_capacity(count);
    for (i, pm) in parts.iter().enumerate() {
        out.push(part_entry(name, pm, i, total)?);
    }
    let split = Split {
        fixed,
        parts: parts.into_iter().zip(sizes).collect(),
        digests: None,
    };
    Ok((out, split))
}

/// The largest part count [`split_service`] tries for `nodes` nodes.
fn split_cap(nodes: usize) -> usize {
    nodes.next_power_of_two().clamp(2, MAX_COUNT)
}

/// Upper bound of a part's size but its nodes: the entry around an empty
/// value with the longest part numbers, and every port key.
fn part_fixed(name: &str, ports: &PortMap) -> Result<usize, BuildError> {
    Ok(entry_size(&Entry {
        name: name.to_string(),
        value: "{}".to_string(),
        part: Some(Part {
            index: u32::MAX,
            count: u32::MAX,
        }),
    })? + ports.keys().map(|p| key_cost(p)).sum::<usize>())
}

/// What `pm`'s nodes cost ([`node_cost`] summed), from `value_twice`, the
/// [`escaped_twice_len`] of its text ([`port_json`]), instead of
/// serializing every node again: `escaped_twice_len` adds up byte by byte,
/// and `value` is `{`, per port `"key":[` + the nodes joined by `,` + `]`,
/// joined by `,`, then `}`; the punctuation costs 1 each.
fn nodes_cost(pm: &PortMap, value_twice: usize) -> usize {
    let keys = pm.len();
    let punctuation = 2
        + pm.keys()
            .map(|k| escaped_twice_len(&json(k)) + 3)
            .sum::<usize>()
        + keys.saturating_sub(1)
        + pm.values()
            .map(|l| l.len().saturating_sub(1))
            .sum::<usize>();
    let nodes: usize = pm.values().map(Vec::len).sum();
    // Every node's text plus one comma each.
    value_twice.saturating_sub(punctuation) + nodes
}

/// Part `i` of `count` of service entry `name`.
fn part_entry(name: &str, pm: &PortMap, i: usize, count: u32) -> Result<Entry, BuildError> {
    part_entry_of(name, port_json(pm), i, count)
}

/// Part `i` of `count` of service entry `name`, its value serialized.
fn part_entry_of(name: &str, value: String, i: usize, count: u32) -> Result<Entry, BuildError> {
    Ok(Entry {
        name: name.to_string(),
        value,
        part: Some(Part {
            index: u32::try_from(i).map_err(BuildError::TooMany)?,
            count,
        }),
    })
}

/// How [`split_service`] cut a service: per part its nodes and measured
/// size (`fixed` plus its nodes' costs). A [`Builder`] keeps it, so that
/// one endpoint changed in a split service re-serializes and re-measures
/// only the part(s) whose nodes changed ([`Builder::resplit`]).
#[derive(Debug)]
struct Split {
    fixed: usize,
    parts: Vec<(PortMap, usize)>,
    /// Per part, the digest of its nodes from the value's kept
    /// [`crate::model::Buckets`] (`None`: the value had none, or the count does not
    /// divide [`MAX_SHARDS`]): a part whose digest did not change holds the
    /// same nodes, so [`Builder::resplit`] looks at the changed parts only.
    digests: Option<Vec<PortsDigest>>,
}

/// The digest of every part of `count` of `s`'s nodes, from its kept
/// buckets (O(buckets), no node touched): `None` without buckets, or when
/// `count` does not divide [`MAX_SHARDS`] (a node's part then does not
/// follow from its bucket).
fn part_digests(s: &ServiceNodes, count: usize) -> Option<Vec<PortsDigest>> {
    let b = s.buckets.0.as_ref()?;
    let count = u32::try_from(count).ok()?;
    if count == 0 || !count.is_power_of_two() || count > MAX_SHARDS {
        return None;
    }
    Some((0..count).map(|k| b.shard_digest(k, count)).collect())
}

/// `h mod count` as an index (`count` >= 1).
fn bucket(h: u64, count: usize) -> usize {
    let count = u64::try_from(count.max(1)).unwrap_or(u64::MAX);
    // The remainder is below `count`, itself a usize.
    usize::try_from(h % count).unwrap_or(0)
}

/// A small service on its way into a bucket: what [`bucket_count`] needs.
#[derive(Debug, Clone, Copy)]
struct Fit<'a> {
    cluster: &'a str,
    /// Its measured size with its comma.
    cost: usize,
    hash: u64,
}

/// The smallest power of two at which every bucket of `small` (by
/// [`service_hash`], in state order) fits `max_bytes` (with the shard's
/// and each cluster group's overhead). A pure function of the content, like
/// the DiscoveredService shard count: the planner needs no memory of
/// earlier layouts, at the price that a bucket crossing the limit doubles
/// the count (every bucket is rewritten once).
fn bucket_count(small: &[Fit<'_>], max_bytes: usize) -> Result<usize, BuildError> {
    let room = max_bytes.saturating_sub(SHARD_OVERHEAD);
    let mut count = 1usize;
    loop {
        let mut sizes = vec![0usize; count];
        let mut last: Vec<Option<&str>> = vec![None; count];
        for s in small {
            let i = bucket(s.hash, count);
            if last[i] != Some(s.cluster) {
                last[i] = Some(s.cluster);
                sizes[i] += group_overhead(s.cluster);
            }
            sizes[i] += s.cost;
        }
        if sizes.iter().all(|s| *s <= room) {
            return Ok(count);
        }
        if count >= MAX_COUNT {
            return Err(BuildError::Crowded { max: max_bytes });
        }
        count *= 2;
    }
}

/// Where one service goes, with its entries: the one decision [`build`]
/// and [`Builder`] share.
enum Placement {
    /// Into the bucket of `hash`, costing `cost` (with its comma).
    Small {
        entry: Entry,
        cost: usize,
        hash: u64,
    },
    /// Shard(s) of its own: the whole entry, or one entry per part and
    /// how it was split.
    Own(Vec<Entry>, Option<Split>),
}

/// Places service `id/ns/name` (see [`build`]).
fn place(
    id: &str,
    ns: &str,
    name: &str,
    ports: &PortMap,
    max_bytes: usize,
    part_bytes: usize,
) -> Result<Placement, BuildError> {
    let avail = max_bytes.saturating_sub(SHARD_OVERHEAD + group_overhead(id) + 1);
    let room = part_room(id, max_bytes, part_bytes);
    let ename = format!("{ns}/{name}");
    let whole = Entry {
        name: ename.clone(),
        value: port_json(ports),
        part: None,
    };
    // Escaping only grows a text: a value longer than the room
    // needs parts, without measuring (escaping) it all first.
    let size = if whole.value.len() > avail {
        usize::MAX
    } else {
        entry_size(&whole)?
    };
    if size <= avail / OWN_SHARD_DIVISOR {
        return Ok(Placement::Small {
            entry: whole,
            cost: size + 1,
            hash: service_hash(id, ns, name),
        });
    }
    if size <= room {
        return Ok(Placement::Own(vec![whole], None));
    }
    let key = ServiceKey::new(id, ns, name);
    // `sort_nodes` is `Node`'s own order (host, port, then the rest).
    if !ports.values().all(|n| n.is_sorted()) {
        return Err(BuildError::Unsorted {
            service: key.to_string(),
        });
    }
    split_service(&key, &ename, ports, room, max_bytes).map(|(e, s)| Placement::Own(e, Some(s)))
}

/// The room for the entry of a service with shard(s) of its own, in a
/// shard of cluster `id`: the shard budget and the part budget
/// ([`DEFAULT_MAX_PART_BYTES`]), whichever is smaller, less the shard's and
/// the cluster group's overhead.
fn part_room(id: &str, max_bytes: usize, part_bytes: usize) -> usize {
    max_bytes
        .min(part_bytes)
        .saturating_sub(SHARD_OVERHEAD + group_overhead(id) + 1)
}

/// Checks a shard text, whose [`escaped_len`] is `len`, against the budget
/// and names it: the last step of every shard, built from scratch or by a
/// [`Builder`] (which adds up the lengths of its pieces instead of reading
/// the whole text once more).
fn finish_shard(
    base: &str,
    i: usize,
    text: String,
    len: usize,
    max_bytes: usize,
) -> Result<ShardData, BuildError> {
    debug_assert_eq!(len, escaped_len(&text), "shard {i}");
    if len > max_bytes {
        // The accounting is an upper bound; reaching this is a bug.
        return Err(BuildError::ShardOverBudget {
            shard: i,
            len,
            max: max_bytes,
        });
    }
    let name = shard_name(base, i);
    Ok(ShardData {
        key: format!("{name}.json"),
        name,
        sha256: sha256_hex(&text),
        text,
    })
}

/// Format 2's `version` of a layout: the first 16 hex digits of the sha256
/// of `{"clusters":[ids],"shards":[sha256 of each shard, in order]}`
/// (compact JSON). The shard hashes pin every byte of the content and the
/// cluster list the clusters without services, so it names the state as
/// well as a hash of the whole document would, but costs a few hundred
/// bytes of hashing per round instead of the whole state (issue 19 item 2:
/// an incremental [`Builder`] must not re-read everything for it), and a
/// reader that has checked each shard against the index checks it from the
/// index alone. Format 1's version was [`Dump::version`].
pub fn layout_version<'a>(
    clusters: &[String],
    shard_sha256s: impl IntoIterator<Item = &'a str>,
) -> String {
    #[derive(Serialize)]
    struct Of<'a> {
        clusters: &'a [String],
        shards: Vec<&'a str>,
    }
    let text = json(&Of {
        clusters,
        shards: shard_sha256s.into_iter().collect(),
    });
    let mut h = sha256_hex(&text);
    h.truncate(16);
    h
}

/// The index text and the [`Layout`] around finished shards.
fn layout_of(
    clusters: Vec<String>,
    shards: Vec<Arc<ShardData>>,
    services: usize,
    nodes: usize,
) -> Result<Layout, BuildError> {
    let version = layout_version(&clusters, shards.iter().map(|s| s.sha256.as_str()));
    let index = IndexDoc {
        format: FORMAT,
        version: version.clone(),
        clusters,
        services,
        nodes,
        shards: shards
            .iter()
            .map(|s| ShardRef {
                name: s.name.clone(),
                key: s.key.clone(),
                sha256: s.sha256.clone(),
                bytes: s.text.len(),
            })
            .collect(),
    };
    let index = serde_json::to_string(&index).map_err(|e| BuildError::Json(e.into()))?;
    Ok(Layout {
        version,
        index,
        shards,
        services,
        nodes,
    })
}

/// Cuts `dump` into shards of at most `max_bytes` (escaped) each, named
/// `<base>-<i>`, and writes the index. Always at least one shard.
///
/// Shards `0..B` are the buckets of the small services (by
/// [`service_hash`], `B` the smallest fitting power of two); after them
/// come the services with shards of their own, in (cluster, namespace,
/// name) order: one shard holding the whole service, or one shard per part
/// ([`split_service`]). So one change in one service changes one shard's
/// text (its bucket or its part), and the planner writes that shard and the
/// index only.
///
/// This builds everything from scratch, through `serde` documents: it is
/// the reference the incremental [`Builder`] (what the snapshot sink runs)
/// is tested against, byte for byte.
pub fn build(dump: &Dump, base: &str, max_bytes: usize) -> Result<Layout, BuildError> {
    build_with(dump, base, max_bytes, DEFAULT_MAX_PART_BYTES)
}

/// Both budgets must be at least [`MIN_SHARD_BYTES`].
fn check_budgets(max_bytes: usize, part_bytes: usize) -> Result<(), BuildError> {
    match [max_bytes, part_bytes]
        .into_iter()
        .find(|b| *b < MIN_SHARD_BYTES)
    {
        Some(b) => Err(BuildError::BudgetTooSmall(b)),
        None => Ok(()),
    }
}

/// [`build`] with parts of at most `part_bytes` (the part budget is capped
/// by `max_bytes`; with `part_bytes >= max_bytes` parts fill whole shards,
/// the layout of releases before [`DEFAULT_MAX_PART_BYTES`], which readers
/// read the same way).
pub fn build_with(
    dump: &Dump,
    base: &str,
    max_bytes: usize,
    part_bytes: usize,
) -> Result<Layout, BuildError> {
    check_budgets(max_bytes, part_bytes)?;
    let mut small: Vec<(Fit<'_>, Entry)> = Vec::new();
    let mut own: Vec<Vec<Group>> = Vec::new();
    for (id, services) in &dump.clusters {
        for ((ns, name), ports) in services {
            match place(id, ns, name, ports, max_bytes, part_bytes)? {
                Placement::Small { entry, cost, hash } => small.push((
                    Fit {
                        cluster: id,
                        cost,
                        hash,
                    },
                    entry,
                )),
                Placement::Own(entries, _) => own.extend(entries.into_iter().map(|e| {
                    vec![Group {
                        id: id.clone(),
                        endpoints: vec![e],
                    }]
                })),
            }
        }
    }
    let fits: Vec<Fit<'_>> = small.iter().map(|(f, _)| *f).collect();
    let buckets = bucket_count(&fits, max_bytes)?;
    let mut shards: Vec<Vec<Group>> = (0..buckets).map(|_| Vec::new()).collect();
    for (s, entry) in small {
        let b = &mut shards[bucket(s.hash, buckets)];
        if b.last().is_none_or(|g| g.id != s.cluster) {
            b.push(Group {
                id: s.cluster.to_string(),
                endpoints: Vec::new(),
            });
        }
        if let Some(g) = b.last_mut() {
            g.endpoints.push(entry);
        }
    }
    shards.extend(own);
    let mut out = Vec::with_capacity(shards.len());
    for (i, groups) in shards.into_iter().enumerate() {
        let doc = ShardDoc {
            format: FORMAT,
            index: i,
            endpoints: groups,
        };
        let text = serde_json::to_string(&doc).map_err(|e| BuildError::Json(e.into()))?;
        let len = escaped_len(&text);
        out.push(Arc::new(finish_shard(base, i, text, len, max_bytes)?));
    }
    layout_of(
        dump.clusters.keys().cloned().collect(),
        out,
        dump.services(),
        dump.nodes(),
    )
}

/// What a [`Builder`] keeps of one service between rounds.
#[derive(Debug)]
struct CachedService {
    /// The state's value it was built from. A `Weak` keeps the allocation
    /// (not the nodes) alive, so its address cannot be reused by another
    /// value while cached, and a live `Arc<ServiceNodes>` is never changed
    /// in place while a `Weak` to it exists (`Arc::get_mut` refuses,
    /// `Arc::make_mut` moves it): the same address is the same content.
    of: Weak<ServiceNodes>,
    nodes: usize,
    placed: Cached,
}

/// A service's entries as compact JSON texts, each with an id that is new
/// whenever its text is (a shard's members are a list of ids).
#[derive(Debug)]
enum Cached {
    Small {
        id: u64,
        text: String,
        cost: usize,
        hash: u64,
    },
    /// Per entry: its id, text and [`escaped_len`].
    Own(Vec<(u64, String, usize)>, Option<Split>),
}

/// A built shard and the ids of the entries it holds, in order.
#[derive(Debug)]
struct CachedShard {
    members: Vec<u64>,
    data: Arc<ShardData>,
}

/// One entry on its way into a shard: its cluster, id, text and the
/// text's [`escaped_len`].
type Member<'a> = (&'a str, u64, &'a str, usize);

/// The incremental [`build`] (issue 19 item 2), what the snapshot sink
/// runs: it keeps, across rounds, every service's entry texts and sizes
/// (keyed by the identity of the state's `Arc<ServiceNodes>`, which the
/// index replaces on every change of a service and keeps otherwise) and
/// every shard's text and sha256 (keyed by its index and the ids of the
/// entries it holds). A round after one change serializes only the changed
/// services and re-concatenates and hashes only the shards whose members
/// changed; what stays proportional to the state is walking the list of
/// services (a pointer compare each) and the bucket count's arithmetic over
/// the small ones. The layout is byte-identical to [`build`] of the same
/// state (tested over random sequences of changes). A failed round drops
/// the cache (the next one builds everything).
#[derive(Debug)]
pub struct Builder {
    base: String,
    max_bytes: usize,
    part_bytes: usize,
    /// In key order, like the state.
    services: Vec<(ServiceKey, CachedService)>,
    /// By shard index.
    shards: Vec<CachedShard>,
    next_id: u64,
    /// How many changed split services [`Builder::resplit`] re-cut (tests
    /// check that the incremental path ran).
    #[cfg(test)]
    resplits: usize,
    /// How many of those found the changed parts by their digests alone.
    #[cfg(test)]
    by_digest: usize,
}

impl Builder {
    /// A builder of snapshot `base` with shards of at most `max_bytes` and
    /// parts of at most [`DEFAULT_MAX_PART_BYTES`].
    pub fn new(base: &str, max_bytes: usize) -> Result<Self, BuildError> {
        Self::with_part_bytes(base, max_bytes, DEFAULT_MAX_PART_BYTES)
    }

    /// [`Builder::new`] with parts of at most `part_bytes` ([`build_with`]).
    pub fn with_part_bytes(
        base: &str,
        max_bytes: usize,
        part_bytes: usize,
    ) -> Result<Self, BuildError> {
        check_budgets(max_bytes, part_bytes)?;
        Ok(Self {
            base: base.to_string(),
            max_bytes,
            part_bytes,
            services: Vec::new(),
            shards: Vec::new(),
            next_id: 0,
            #[cfg(test)]
            resplits: 0,
            #[cfg(test)]
            by_digest: 0,
        })
    }

    /// The layout of `services` (the state's values in key order, as
    /// `ControllerState::with_desired` lists them) over `clusters` (every
    /// registered cluster; a service's own cluster is added if missing, as
    /// [`Dump::insert`] does).
    pub fn build<'a>(
        &mut self,
        clusters: impl IntoIterator<Item = &'a str>,
        services: impl IntoIterator<Item = &'a Arc<ServiceNodes>>,
    ) -> Result<Layout, BuildError> {
        let result = self.update(services).and_then(|()| self.assemble(clusters));
        if result.is_err() {
            self.services.clear();
            self.shards.clear();
        }
        result
    }

    /// Replaces the cached services by those of `services`, placing only
    /// the ones whose value is not the cached one (a merge of two lists in
    /// key order).
    fn update<'a>(
        &mut self,
        services: impl IntoIterator<Item = &'a Arc<ServiceNodes>>,
    ) -> Result<(), BuildError> {
        let mut old = std::mem::take(&mut self.services).into_iter().peekable();
        let mut new: Vec<(ServiceKey, CachedService)> = Vec::with_capacity(old.len());
        for s in services {
            if new.last().is_some_and(|(prev, _)| *prev >= s.key) {
                return Err(BuildError::Unordered {
                    service: s.key.to_string(),
                });
            }
            // The same value as cached (an unchanged service, the common
            // case): its key is the cached one, no key compared.
            let unchanged =
                |(_, c): &(ServiceKey, CachedService)| std::ptr::eq(c.of.as_ptr(), Arc::as_ptr(s));
            if let Some(kept) = old.next_if(unchanged) {
                new.push(kept);
                continue;
            }
            while old.next_if(|(k, _)| *k < s.key).is_some() {}
            // Behind removed services, or a changed value (`prev`: what
            // was built of the old one, reused where the text is the same).
            let mut prev = match old.next_if(|(k, _)| *k == s.key) {
                Some(kept) if std::ptr::eq(kept.1.of.as_ptr(), Arc::as_ptr(s)) => {
                    new.push(kept);
                    continue;
                }
                other => other.map(|(_, c)| c.placed),
            };
            let k = &s.key;
            if let Some(placed) = self.resplit(s, &mut prev)? {
                new.push((
                    k.clone(),
                    CachedService {
                        of: Arc::downgrade(s),
                        nodes: s.node_count(),
                        placed,
                    },
                ));
                continue;
            }
            let placed = match place(
                &k.cluster,
                &k.namespace,
                &k.name,
                &s.ports,
                self.max_bytes,
                self.part_bytes,
            )? {
                Placement::Small { entry, cost, hash } => {
                    let text = json(&entry);
                    let id = match &prev {
                        Some(Cached::Small { id, text: t, .. }) if *t == text => *id,
                        _ => self.fresh_id(),
                    };
                    Cached::Small {
                        id,
                        text,
                        cost,
                        hash,
                    }
                }
                Placement::Own(entries, mut split) => {
                    if let Some(split) = split.as_mut() {
                        split.digests = part_digests(s, split.parts.len());
                    }
                    let before = match &prev {
                        Some(Cached::Own(v, _)) => v.as_slice(),
                        _ => &[],
                    };
                    let mut texts = Vec::with_capacity(entries.len());
                    for (i, e) in entries.iter().enumerate() {
                        let text = json(e);
                        // A part whose text is unchanged keeps its id, so
                        // its shard is not rebuilt (one endpoint changed in
                        // a split service: one part differs).
                        let id = match before.get(i) {
                            Some((id, t, _)) if *t == text => *id,
                            _ => self.fresh_id(),
                        };
                        let len = escaped_len(&text);
                        texts.push((id, text, len));
                    }
                    Cached::Own(texts, split)
                }
            };
            new.push((
                s.key.clone(),
                CachedService {
                    of: Arc::downgrade(s),
                    nodes: s.node_count(),
                    placed,
                },
            ));
        }
        self.services = new;
        Ok(())
    }

    /// A service split into parts whose value changed, re-cut at its
    /// cached part count; only the parts that differ are copied, measured
    /// and serialized (one endpoint changed among 100,000: one part).
    ///
    /// Which parts differ: with the value's kept [`crate::model::Buckets`] (the index
    /// keeps them for a big service) and the parts' digests cached, the
    /// parts whose digest changed, found without touching a node, and their
    /// nodes copied in one pass ([`crate::crd::shards::partition_some`]). Else
    /// the nodes are partitioned by reference and compared with the cached
    /// parts. The digest path trusts the state's lists to be sorted (the
    /// index sorts them; checking it is a pass over every node, what this
    /// path avoids) and checks the changed parts' lists only: should an
    /// unchanged part's list be out of order, the cached sorted text stays,
    /// which is what a reader assembles anyway, where [`build`] would refuse.
    ///
    /// `Ok(None)` (and `prev`'s entries untouched) when that may not be what
    /// [`split_service`] would do, which [`place`] then does from scratch:
    /// the port keys changed, a list is out of order, a part no longer fits
    /// (the count doubles), half the count would fit (it halves), or the
    /// service may have become small enough not to split.
    fn resplit(
        &mut self,
        s: &ServiceNodes,
        prev: &mut Option<Cached>,
    ) -> Result<Option<Cached>, BuildError> {
        let (key, ports) = (&s.key, &s.ports);
        let Some(Cached::Own(entries, Some(split))) = prev.as_mut() else {
            return Ok(None);
        };
        let count = split.parts.len();
        if count < 2 || entries.len() != count {
            return Ok(None);
        }
        let name = format!("{}/{}", key.namespace, key.name);
        let fixed = part_fixed(&name, ports)?;
        let keys_same = split.parts[0].0.keys().eq(ports.keys());
        if fixed != split.fixed || !keys_same {
            return Ok(None);
        }
        let digests = part_digests(s, count);
        // Per part: `Some(its new nodes)` where it changed.
        let changed: Vec<Option<PortMap>> = match (&split.digests, &digests) {
            (Some(old), Some(new)) if old.len() == count => {
                let wanted: Vec<u32> = (0..count)
                    .filter(|k| old[*k] != new[*k])
                    .map(|k| u32::try_from(k).map_err(BuildError::TooMany))
                    .collect::<Result<_, _>>()?;
                let total = u32::try_from(count).map_err(BuildError::TooMany)?;
                // No part changed (the owner or extras did): no pass at all.
                let fresh = if wanted.is_empty() {
                    Vec::new()
                } else {
                    crate::crd::shards::partition_some(ports, total, &wanted)
                };
                let mut fresh = fresh.into_iter();
                #[cfg(test)]
                {
                    self.by_digest += 1;
                }
                let mut out: Vec<Option<PortMap>> = (0..count).map(|_| None).collect();
                for k in &wanted {
                    out[*k as usize] = fresh.next();
                }
                if out
                    .iter()
                    .flatten()
                    .flat_map(PortMap::values)
                    .any(|l| !l.is_sorted())
                {
                    return Ok(None);
                }
                out
            }
            _ => {
                if !ports.values().all(|l| l.is_sorted()) {
                    return Ok(None);
                }
                Self::changed_by_compare(ports, split)
            }
        };
        let nodes = s.node_count();
        // The changed parts, serialized once: their size is measured on
        // that text.
        let mut fresh: Vec<Option<(PortMap, String, usize)>> = Vec::with_capacity(count);
        let mut sizes = Vec::with_capacity(count);
        for (k, part) in changed.into_iter().enumerate() {
            if let Some(pm) = part {
                let value = port_json(&pm);
                let twice = escaped_twice_len(&value);
                sizes.push(fixed + nodes_cost(&pm, twice));
                fresh.push(Some((pm, value, twice)));
            } else {
                sizes.push(split.parts[k].1);
                fresh.push(None);
            }
        }
        let avail = self
            .max_bytes
            .saturating_sub(SHARD_OVERHEAD + group_overhead(&key.cluster) + 1);
        let room = part_room(&key.cluster, self.max_bytes, self.part_bytes);
        let half = count / 2;
        let halves_fit = half >= 2 && (0..half).all(|k| sizes[k] + sizes[k + half] - fixed <= room);
        // A lower bound of the whole entry's measured size (every node's
        // cost but one comma per port): above the room of a whole entry
        // and of a small one, it is split.
        let content: usize = sizes.iter().map(|x| x - fixed).sum();
        let still_split = content.saturating_sub(ports.len()) > room.max(avail / OWN_SHARD_DIVISOR);
        if sizes.iter().any(|x| *x > room) || halves_fit || count > split_cap(nodes) || !still_split
        {
            return Ok(None);
        }
        let total = u32::try_from(count).map_err(BuildError::TooMany)?;
        let mut texts = Vec::with_capacity(count);
        let mut parts = Vec::with_capacity(count);
        for (k, (size, fresh)) in sizes.into_iter().zip(fresh).enumerate() {
            if let Some((pm, value, twice)) = fresh {
                // The entry's escaped length: its text around an empty
                // value, plus the value as it appears in it (escaped once,
                // measured escaped again).
                let around = entry_size(&part_entry_of(&name, String::new(), k, total)?)?;
                let text = json(&part_entry_of(&name, value, k, total)?);
                // Changed back to the cached text (a node removed and
                // added again): the same id, the shard is not rebuilt.
                let id = if text == entries[k].1 {
                    entries[k].0
                } else {
                    self.fresh_id()
                };
                texts.push((id, text, around + twice));
                parts.push((pm, size));
            } else {
                texts.push(std::mem::take(&mut entries[k]));
                parts.push((std::mem::take(&mut split.parts[k].0), size));
            }
        }
        #[cfg(test)]
        {
            self.resplits += 1;
        }
        Ok(Some(Cached::Own(
            texts,
            Some(Split {
                fixed,
                parts,
                digests,
            }),
        )))
    }

    /// The parts of `split`'s count whose nodes in `ports` differ from the
    /// cached ones, with their new nodes: every node partitioned by
    /// reference ([`crate::crd::shards::partition`]'s rule) and compared.
    fn changed_by_compare(ports: &PortMap, split: &Split) -> Vec<Option<PortMap>> {
        let count = split.parts.len();
        let mut cut: Vec<Vec<(&String, Vec<&Node>)>> = vec![Vec::new(); count];
        for (port, list) in ports {
            cut[0].push((port, Vec::new()));
            for n in list {
                let part = &mut cut[bucket(crate::crd::shards::node_hash(&n.host), count)];
                if part.last().is_none_or(|(p, _)| *p != port) {
                    part.push((port, Vec::new()));
                }
                if let Some((_, l)) = part.last_mut() {
                    l.push(n);
                }
            }
        }
        cut.into_iter()
            .zip(&split.parts)
            .map(|(new, (old, _))| {
                let same = old.len() == new.len()
                    && old.iter().zip(&new).all(|((p, l), (q, m))| {
                        p == *q && l.len() == m.len() && l.iter().zip(m).all(|(a, b)| a == *b)
                    });
                (!same).then(|| {
                    new.into_iter()
                        .map(|(p, l)| (p.clone(), l.into_iter().cloned().collect()))
                        .collect()
                })
            })
            .collect()
    }

    fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// The shards of the cached services: the cached text of every shard
    /// whose members are unchanged, a new one for the others.
    fn assemble<'a>(
        &mut self,
        clusters: impl IntoIterator<Item = &'a str>,
    ) -> Result<Layout, BuildError> {
        let mut ids: BTreeSet<&str> = clusters.into_iter().collect();
        let mut fits: Vec<Fit<'_>> = Vec::new();
        let mut small: Vec<Member<'_>> = Vec::new();
        let mut own: Vec<Member<'_>> = Vec::new();
        let mut nodes = 0;
        for (k, s) in &self.services {
            ids.insert(&k.cluster);
            nodes += s.nodes;
            match &s.placed {
                Cached::Small {
                    id,
                    text,
                    cost,
                    hash,
                } => {
                    fits.push(Fit {
                        cluster: &k.cluster,
                        cost: *cost,
                        hash: *hash,
                    });
                    // A small entry's cost is its escaped length and a comma.
                    small.push((&k.cluster, *id, text, cost - 1));
                }
                Cached::Own(entries, _) => {
                    own.extend(
                        entries
                            .iter()
                            .map(|(id, t, len)| (k.cluster.as_str(), *id, t.as_str(), *len)),
                    );
                }
            }
        }
        let buckets = bucket_count(&fits, self.max_bytes)?;
        let mut members: Vec<Vec<Member<'_>>> = vec![Vec::new(); buckets];
        for (f, m) in fits.iter().zip(small) {
            members[bucket(f.hash, buckets)].push(m);
        }
        members.extend(own.into_iter().map(|m| vec![m]));
        let mut cache = Vec::with_capacity(members.len());
        let mut out = Vec::with_capacity(members.len());
        for (i, m) in members.iter().enumerate() {
            let ids: Vec<u64> = m.iter().map(|(_, id, _, _)| *id).collect();
            let data = match self.shards.get(i) {
                Some(c) if c.members == ids => c.data.clone(),
                _ => {
                    let (text, len) = shard_text(i, m);
                    Arc::new(finish_shard(&self.base, i, text, len, self.max_bytes)?)
                }
            };
            out.push(data.clone());
            cache.push(CachedShard { members: ids, data });
        }
        let clusters = ids.into_iter().map(str::to_string).collect();
        let services = self.services.len();
        self.shards = cache;
        layout_of(clusters, out, services, nodes)
    }
}

/// Shard `i`'s text from its entries' compact JSON: the bytes `serde_json`
/// writes for the [`ShardDoc`] of those entries (entries of one cluster
/// in a row form one group), without serializing them again; and its
/// [`escaped_len`], added up from the pieces (the entries' are known).
fn shard_text(i: usize, members: &[Member<'_>]) -> (String, usize) {
    let len: usize = members.iter().map(|(_, _, t, _)| t.len() + 1).sum();
    let mut t = String::with_capacity(len + 64);
    let mut esc = 0;
    let mut put = |t: &mut String, piece: &str| {
        esc += escaped_len(piece);
        t.push_str(piece);
    };
    put(
        &mut t,
        &format!("{{\"format\":{FORMAT},\"index\":{i},\"endpoints\":["),
    );
    let mut last: Option<&str> = None;
    let mut entries = 0;
    for (cluster, _, text, len) in members {
        if last == Some(*cluster) {
            put(&mut t, ",");
        } else {
            if last.is_some() {
                put(&mut t, "]},");
            }
            put(&mut t, "{\"id\":");
            put(&mut t, &json(*cluster));
            put(&mut t, ",\"endpoints\":[");
            last = Some(cluster);
        }
        t.push_str(text);
        entries += len;
    }
    if last.is_some() {
        put(&mut t, "]}");
    }
    put(&mut t, "]}");
    (t, esc + entries)
}

/// Name of shard `i` of snapshot `base`.
pub fn shard_name(base: &str, i: usize) -> String {
    format!("{base}-{i}")
}

/// Why shards could not be assembled. Every message names the version and,
/// where one is at fault, the shard.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssembleError {
    /// The index is not a valid index document.
    #[error("snapshot index: {0}")]
    Index(String),
    /// A listed shard does not exist (deleted after a newer version): read again.
    #[error(
        "snapshot version {version}: shard {shard} is missing (a newer version replaced it; read again)"
    )]
    ShardMissing {
        /// Version the index describes.
        version: String,
        /// Shard name.
        shard: String,
    },
    /// A shard's content is not the one the index lists (being rewritten for a
    /// newer version, or edited): read again.
    #[error(
        "snapshot version {version}: shard {shard} does not match the index (being rewritten; read again)"
    )]
    ShardMismatch {
        /// Version the index describes.
        version: String,
        /// Shard name.
        shard: String,
    },
    /// A shard matches its hash but its content is invalid.
    #[error("snapshot version {version}: shard {shard}: {reason}")]
    BadShard {
        /// Version the index describes.
        version: String,
        /// Shard name.
        shard: String,
        /// What is wrong.
        reason: String,
    },
    /// The assembled state is not the state the index describes.
    #[error("snapshot version {version}: {reason}")]
    Inconsistent {
        /// Version the index describes.
        version: String,
        /// What is wrong.
        reason: String,
    },
}

impl AssembleError {
    /// A newer version is being written: reading again will succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            AssembleError::ShardMissing { .. } | AssembleError::ShardMismatch { .. }
        )
    }
}

/// Parses an index document.
pub fn parse_index(text: &str) -> Result<IndexDoc, AssembleError> {
    let idx: IndexDoc = serde_json::from_str(text)
        .map_err(|e| AssembleError::Index(format!("{INDEX_KEY}: {e}")))?;
    if !(OLDEST_FORMAT..=FORMAT).contains(&idx.format) {
        return Err(AssembleError::Index(format!(
            "{INDEX_KEY}: format {} is not supported (this reader knows {OLDEST_FORMAT} to {FORMAT})",
            idx.format
        )));
    }
    Ok(idx)
}

/// Reassembles the dump from the index text and a lookup of shard texts
/// (`None`: the shard does not exist). Refuses mixed versions: every shard
/// must hash to what the index lists and the result must hash to the index's
/// version.
pub fn assemble(
    index_text: &str,
    mut shard: impl FnMut(&ShardRef) -> Option<String>,
) -> Result<Dump, AssembleError> {
    let idx = parse_index(index_text)?;
    let version = idx.version.clone();
    let mut dump = Dump::with_clusters(idx.clusters.iter().map(String::as_str));
    // Services split into parts: (cluster, ns, name) -> (count, parts seen).
    let mut split: HashMap<(String, String, String), (u32, BTreeSet<u32>)> = HashMap::new();
    for (i, r) in idx.shards.iter().enumerate() {
        let text = shard(r).ok_or_else(|| AssembleError::ShardMissing {
            version: version.clone(),
            shard: r.name.clone(),
        })?;
        if sha256_hex(&text) != r.sha256 {
            return Err(AssembleError::ShardMismatch {
                version: version.clone(),
                shard: r.name.clone(),
            });
        }
        let bad = |reason: String| AssembleError::BadShard {
            version: version.clone(),
            shard: r.name.clone(),
            reason,
        };
        let doc: ShardDoc = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if doc.format != idx.format || doc.index != i {
            return Err(bad(format!(
                "format {} index {} (want format {} index {i})",
                doc.format, doc.index, idx.format
            )));
        }
        for g in doc.endpoints {
            let Some(services) = dump.clusters.get_mut(&g.id) else {
                return Err(bad(format!("cluster {:?} is not in the index", g.id)));
            };
            for e in g.endpoints {
                let Some((ns, name)) = e.name.split_once('/') else {
                    return Err(bad(format!("entry name {:?} is not ns/name", e.name)));
                };
                let ports: PortMap = serde_json::from_str(&e.value)
                    .map_err(|x| bad(format!("value of {}: {x}", e.name)))?;
                let skey = (ns.to_string(), name.to_string());
                let okey = (g.id.clone(), ns.to_string(), name.to_string());
                let Some(p) = e.part else {
                    if services.contains_key(&skey) {
                        return Err(bad(format!("{} appears twice", e.name)));
                    }
                    services.insert(skey, ports);
                    continue;
                };
                if p.count < 2 || p.index >= p.count {
                    return Err(bad(format!("{}: part {}/{}", e.name, p.index, p.count)));
                }
                if services.contains_key(&skey) && !split.contains_key(&okey) {
                    return Err(bad(format!("{} appears twice", e.name)));
                }
                let (count, seen) = split.entry(okey).or_insert((p.count, BTreeSet::new()));
                if *count != p.count || !seen.insert(p.index) {
                    return Err(bad(format!(
                        "{}: part {}/{} again or of another count ({count})",
                        e.name, p.index, p.count
                    )));
                }
                let target = services.entry(skey).or_default();
                for (port, nodes) in ports {
                    target.entry(port).or_default().extend(nodes);
                }
            }
        }
    }
    for ((id, ns, name), (count, seen)) in split {
        if seen.len() != count as usize {
            return Err(AssembleError::Inconsistent {
                version,
                reason: format!(
                    "service {id:?} {ns}/{name} has {} of {count} parts",
                    seen.len()
                ),
            });
        }
        // Parts hold each port's nodes by host hash (format 2): the merged
        // lists are sorted like the state's (`model::sort_nodes`). Format 1's
        // consecutive ranges of a sorted list come out the same.
        if let Some(ports) = dump
            .clusters
            .get_mut(&id)
            .and_then(|s| s.get_mut(&(ns, name)))
        {
            for nodes in ports.values_mut() {
                crate::model::sort_nodes(nodes);
            }
        }
    }
    if dump.services() != idx.services || dump.nodes() != idx.nodes {
        return Err(AssembleError::Inconsistent {
            version,
            reason: format!(
                "{} services / {} nodes assembled, the index lists {} / {}",
                dump.services(),
                dump.nodes(),
                idx.services,
                idx.nodes
            ),
        });
    }
    // Format 2: the version names the listed shard hashes and clusters
    // (each shard was checked against its hash above); format 1: the hash
    // of the whole assembled state.
    let got = if idx.format >= 2 {
        layout_version(&idx.clusters, idx.shards.iter().map(|s| s.sha256.as_str()))
    } else {
        dump.version()
    };
    if got != version {
        return Err(AssembleError::Inconsistent {
            reason: format!("the assembled state has version {got}"),
            version,
        });
    }
    Ok(dump)
}

/// Label value identifying the ConfigMaps of snapshot `name` (an object name):
/// the name itself when it is a valid label value (<= 63 characters), else a
/// shortened name plus a hash of the full name.
pub fn label_value(name: &str) -> String {
    if k8s_syntax::is_label_value(name) {
        return name.to_string();
    }
    let mut h = sha256_hex(name);
    h.truncate(16);
    let head: String = name.chars().take(40).collect();
    let head = head.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    format!("{head}-{h}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    /// Node `i`; its host sorts like `i` (the state's node lists are sorted,
    /// and the lists of a split service are sorted again when assembled).
    fn node(i: u32) -> Node {
        Node::new(format!("h{i:07}.example"), 8080, 100)
    }

    /// `(cluster, namespace, name, [(port, node count)])`.
    type Spec<'a> = (&'a str, &'a str, &'a str, &'a [(&'a str, u32)]);

    fn dump_of(spec: &[Spec<'_>]) -> Dump {
        let mut d = Dump::with_clusters([""]);
        let mut n = 0;
        for (c, ns, name, ports) in spec {
            let mut pm = PortMap::new();
            for (p, count) in *ports {
                let nodes = (0..*count)
                    .map(|_| {
                        n += 1;
                        node(n)
                    })
                    .collect();
                pm.insert((*p).to_string(), nodes);
            }
            d.insert(&ServiceKey::new(*c, *ns, *name), pm);
        }
        d
    }

    fn files(l: &Layout) -> HashMap<String, String> {
        l.shards
            .iter()
            .map(|s| (s.name.clone(), s.text.clone()))
            .collect()
    }

    fn roundtrip(d: &Dump, max: usize) -> Layout {
        let l = build(d, "snap", max).unwrap();
        let f = files(&l);
        let back = assemble(&l.index, |r| f.get(&r.name).cloned()).unwrap();
        assert_eq!(&back, d);
        assert_eq!(back.to_apisix_endpoints(), d.to_apisix_endpoints());
        for s in &l.shards {
            assert!(escaped_len(&s.text) <= max, "{} over {max}", s.name);
        }
        l
    }

    #[test]
    fn apisix_shape_and_small_state_is_one_shard() {
        let d = dump_of(&[("", "default", "web", &[("http", 2), ("admin", 0)])]);
        let v = d.to_apisix_endpoints();
        assert_eq!(v[0]["id"], "");
        assert_eq!(v[0]["endpoints"][0]["name"], "default/web");
        let inner: PortMap =
            serde_json::from_str(v[0]["endpoints"][0]["value"].as_str().unwrap()).unwrap();
        assert_eq!(inner["http"].len(), 2);
        assert!(inner["admin"].is_empty());
        let l = roundtrip(&d, DEFAULT_MAX_SHARD_BYTES);
        assert_eq!(l.shards.len(), 1);
        assert_eq!(l.shards[0].name, "snap-0");
        assert_eq!(l.shards[0].key, "snap-0.json");
        let idx = parse_index(&l.index).unwrap();
        assert_eq!((idx.services, idx.nodes), (1, 2));
        // Format 2's version names the shard hashes and the clusters.
        let shas = [shard_sha256(&l.shards[0].text)];
        assert_eq!(
            idx.version,
            layout_version(&[String::new()], shas.iter().map(String::as_str))
        );
        assert_eq!(l.version, idx.version);
    }

    #[test]
    fn empty_state_and_empty_clusters_round_trip() {
        let d = Dump::with_clusters(["east", "west"]);
        let l = roundtrip(&d, MIN_SHARD_BYTES);
        assert_eq!(l.shards.len(), 1);
        assert_eq!(d.to_apisix_endpoints()[1]["id"], "west");
    }

    #[test]
    fn many_services_make_several_shards_under_the_budget() {
        let spec: Vec<(String, u32)> = (0..200).map(|i| (format!("svc-{i}"), i % 7 + 1)).collect();
        let mut d = Dump::with_clusters(["a", "b"]);
        let mut n = 0;
        for (i, (name, k)) in spec.iter().enumerate() {
            let c = if i % 3 == 0 { "a" } else { "b" };
            let nodes = (0..*k).map(|_| {
                n += 1;
                node(n)
            });
            d.insert(
                &ServiceKey::new(c, "ns", name.as_str()),
                PortMap::from([("http".to_string(), nodes.collect())]),
            );
        }
        let l = roundtrip(&d, 4096);
        assert!(l.shards.len() > 5, "{} shards", l.shards.len());
        let names: Vec<_> = l.shards.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names[2], "snap-2");
    }

    /// Names of the shards whose text differs between `a` and `b` (or that
    /// only one of them has).
    fn changed(a: &Layout, b: &Layout) -> Vec<String> {
        let (fa, fb) = (files(a), files(b));
        let mut names: BTreeSet<&String> = fa.keys().collect();
        names.extend(fb.keys());
        names
            .into_iter()
            .filter(|n| fa.get(*n) != fb.get(*n))
            .cloned()
            .collect()
    }

    /// A service of `n` endpoints (nodes `from..from + n`) on ports `http`
    /// and `metrics` (the same hosts), plus a port without nodes.
    fn two_port_service(from: u32, n: u32) -> PortMap {
        let http: Vec<Node> = (from..from + n).map(node).collect();
        let metrics = http
            .iter()
            .map(|x| Node::new(x.host.as_str(), 9090, 1))
            .collect();
        PortMap::from([
            ("http".to_string(), http),
            ("metrics".to_string(), metrics),
            ("none".to_string(), Vec::new()),
        ])
    }

    #[test]
    fn one_service_bigger_than_a_shard_is_split_by_node_host_hash() {
        let mut d = dump_of(&[
            ("", "a", "small", &[("http", 1)]),
            ("", "z", "after", &[("http", 3)]),
        ]);
        d.insert(
            &ServiceKey::new("", "big", "svc"),
            two_port_service(100, 500),
        );
        let l = roundtrip(&d, 4096);
        // The small services share bucket 0; the big one's parts follow, a
        // power of two of them, all in order.
        let parts: Vec<&ShardData> = l
            .shards
            .iter()
            .map(|s| &**s)
            .filter(|s| s.text.contains("\"part\""))
            .collect();
        assert!(
            parts.len() >= 8 && parts.len().is_power_of_two(),
            "{} parts",
            parts.len()
        );
        assert_eq!(l.shards.len(), parts.len() + 1);
        assert!(!l.shards[0].text.contains("\"part\""));
        // Every endpoint's ports are in one part: the part holding a host's
        // http node holds its metrics node.
        for p in &parts {
            let doc: ShardDoc = serde_json::from_str(&p.text).unwrap();
            let pm: PortMap = serde_json::from_str(&doc.endpoints[0].endpoints[0].value).unwrap();
            let hosts = |k: &str| -> Vec<String> {
                pm.get(k)
                    .into_iter()
                    .flatten()
                    .map(|n| n.host.to_string())
                    .collect()
            };
            assert_eq!(hosts("http"), hosts("metrics"), "{}", p.name);
            assert!(!hosts("http").is_empty(), "{} is empty", p.name);
        }
        // Part 0 carries every port key, the empty one too.
        assert!(parts[0].text.contains("none"));
    }

    fn big(d: &mut Dump) -> &mut PortMap {
        d.clusters
            .get_mut("")
            .unwrap()
            .get_mut(&("big".into(), "svc".into()))
            .unwrap()
    }

    #[test]
    fn one_endpoint_change_in_a_big_service_changes_one_shard() {
        // 5,000 endpoints x 2 ports in 16 KiB shards, among small services
        // (the 100,000-endpoint case is in the planner's tests).
        let mut d = dump_of(&[
            ("", "a", "small", &[("http", 2)]),
            ("", "z", "after", &[("http", 3)]),
        ]);
        let key = ServiceKey::new("", "big", "svc");
        d.insert(&key, two_port_service(1000, 5_000));
        let max = 16 * 1024;
        let base = roundtrip(&d, max);

        let add = |d: &mut Dump, i: u32| {
            let p = big(d);
            let n = node(i);
            let m = Node::new(n.host.as_str(), 9090, 1);
            for (k, x) in [("http", n), ("metrics", m)] {
                let list = p.get_mut(k).unwrap();
                let at = list.binary_search(&x).unwrap_err();
                list.insert(at, x);
            }
        };
        let mut cases: Vec<(&str, Dump)> = Vec::new();
        let mut first = d.clone();
        add(&mut first, 0);
        cases.push(("added, sorting first", first));
        let mut last = d.clone();
        add(&mut last, 900_000);
        cases.push(("added, sorting last", last));
        let mut removed = d.clone();
        for k in ["http", "metrics"] {
            big(&mut removed).get_mut(k).unwrap().remove(2_000);
        }
        cases.push(("removed", removed));
        let mut weight = d.clone();
        big(&mut weight).get_mut("http").unwrap()[4_321].weight = 5;
        cases.push(("weight changed", weight));
        for (what, changed_dump) in cases {
            let l = build(&changed_dump, "snap", max).unwrap();
            assert_eq!(l.shards.len(), base.shards.len(), "{what}");
            assert_eq!(
                changed(&base, &l).len(),
                1,
                "{what}: {:?}",
                changed(&base, &l)
            );
            assert_ne!(l.index, base.index, "{what}");
        }
    }

    #[test]
    fn one_change_among_many_small_services_changes_one_shard() {
        // 2,000 services in two clusters over 64 KiB shards (the planner's
        // tests count the writes among 10,000 at the default budget).
        let mut d = Dump::with_clusters(["", "east"]);
        for i in 0..2_000u32 {
            let c = if i % 4 == 0 { "east" } else { "" };
            let nodes = (0..2).map(|k| node(i * 2 + k)).collect();
            d.insert(
                &ServiceKey::new(c, format!("ns{}", i % 7), format!("svc-{i:05}")),
                PortMap::from([("http".to_string(), nodes)]),
            );
        }
        let base = roundtrip(&d, 64 * 1024);
        assert!(base.shards.len() >= 8, "{} shards", base.shards.len());
        assert!(base.shards.len().is_power_of_two());
        // One node more in a service, a service added, one removed.
        let mut grown = d.clone();
        let k = ("ns3".to_string(), "svc-00003".to_string());
        grown
            .clusters
            .get_mut("")
            .unwrap()
            .get_mut(&k)
            .unwrap()
            .get_mut("http")
            .unwrap()
            .push(node(999_999));
        let mut added = d.clone();
        added.insert(
            &ServiceKey::new("", "aaa", "first"),
            PortMap::from([("http".to_string(), vec![node(1)])]),
        );
        let mut removed = d.clone();
        removed
            .clusters
            .get_mut("east")
            .unwrap()
            .remove(&("ns0".to_string(), "svc-00000".to_string()));
        for (what, x) in [("grown", grown), ("added", added), ("removed", removed)] {
            let l = build(&x, "snap", 64 * 1024).unwrap();
            assert_eq!(
                changed(&base, &l).len(),
                1,
                "{what}: {:?}",
                changed(&base, &l)
            );
        }
    }

    #[test]
    fn a_split_service_out_of_order_is_an_error_naming_it() {
        let mut d = Dump::with_clusters(["c1"]);
        let mut p = two_port_service(0, 200);
        p.get_mut("http").unwrap().reverse();
        d.insert(&ServiceKey::new("c1", "ns", "big"), p);
        let e = build(&d, "snap", 4096).unwrap_err();
        assert!(matches!(e, BuildError::Unsorted { .. }), "{e}");
        assert!(e.to_string().contains("c1/ns/big"), "{e}");
    }

    #[test]
    fn format_1_layouts_are_still_read() {
        // What a controller before format 2 wrote: a service split by node
        // ranges into consecutive parts, concatenated by the reader.
        let d = dump_of(&[
            ("", "a", "small", &[("http", 2)]),
            ("", "big", "svc", &[("http", 40), ("grpc", 5)]),
        ]);
        let all = &d.clusters[""];
        let big = &all[&("big".to_string(), "svc".to_string())];
        let flat: Vec<(&String, &Node)> = big
            .iter()
            .flat_map(|(p, ns)| ns.iter().map(move |n| (p, n)))
            .collect();
        let entry = |name: &str, pm: &PortMap, part: Option<Part>| Entry {
            name: name.to_string(),
            value: port_json(pm),
            part,
        };
        let mut entries = vec![entry(
            "a/small",
            &all[&("a".to_string(), "small".to_string())],
            None,
        )];
        for (i, chunk) in flat.chunks(16).enumerate() {
            let mut pm = PortMap::new();
            for (p, n) in chunk {
                pm.entry((*p).clone()).or_default().push((*n).clone());
            }
            entries.push(entry(
                "big/svc",
                &pm,
                Some(Part {
                    index: i as u32,
                    count: 3,
                }),
            ));
        }
        let texts: Vec<String> = entries
            .chunks(2)
            .enumerate()
            .map(|(i, es)| {
                json(&ShardDoc {
                    format: 1,
                    index: i,
                    endpoints: vec![Group {
                        id: String::new(),
                        endpoints: es.to_vec(),
                    }],
                })
            })
            .collect();
        let index = json(&IndexDoc {
            format: 1,
            version: d.version(),
            clusters: vec![String::new()],
            services: d.services(),
            nodes: d.nodes(),
            shards: texts
                .iter()
                .enumerate()
                .map(|(i, t)| ShardRef {
                    name: shard_name("snap", i),
                    key: format!("snap-{i}.json"),
                    sha256: sha256_hex(t),
                    bytes: t.len(),
                })
                .collect(),
        });
        let back = assemble(&index, |r| {
            texts.get(r.name[5..].parse::<usize>().unwrap()).cloned()
        })
        .unwrap();
        assert_eq!(back, d);
        // A format this reader does not know is refused, naming both.
        let e = assemble(&index.replace("\"format\":1", "\"format\":3"), |_| None).unwrap_err();
        assert!(e.to_string().contains("format 3"), "{e}");
    }

    #[test]
    fn a_node_that_cannot_fit_is_an_error_naming_the_service() {
        let mut d = Dump::with_clusters([""]);
        let mut n = Node::new("x".repeat(2000), 80, 1);
        n.set_zone(Some("z".into()));
        d.insert(
            &ServiceKey::new("", "ns", "huge"),
            PortMap::from([("p".to_string(), vec![n.clone(), n])]),
        );
        let e = build(&d, "snap", MIN_SHARD_BYTES).unwrap_err();
        assert!(e.to_string().contains("ns/huge"), "{e}");
        assert!(
            build(&d, "snap", 10)
                .unwrap_err()
                .to_string()
                .contains("minimum")
        );
    }

    #[test]
    fn unchanged_shards_keep_their_text() {
        let spec: Vec<String> = (0..100).map(|i| format!("svc-{i:03}")).collect();
        let mut d = Dump::with_clusters([""]);
        for (i, s) in spec.iter().enumerate() {
            d.insert(
                &ServiceKey::new("", "ns", s.as_str()),
                PortMap::from([("http".to_string(), vec![node(i as u32)])]),
            );
        }
        let a = build(&d, "snap", 2048).unwrap();
        // Change the last service only.
        d.insert(
            &ServiceKey::new("", "ns", "svc-099"),
            PortMap::from([("http".to_string(), vec![node(9999)])]),
        );
        let b = build(&d, "snap", 2048).unwrap();
        assert_ne!(a.version, b.version);
        assert_eq!(a.shards.len(), b.shards.len());
        let changed: Vec<_> = a
            .shards
            .iter()
            .zip(&b.shards)
            .filter(|(x, y)| x.text != y.text)
            .map(|(x, _)| x.name.clone())
            .collect();
        // Only the shard holding svc-099 (its hash bucket), wherever it is.
        let holder: Vec<_> = a
            .shards
            .iter()
            .filter(|s| s.text.contains("ns/svc-099"))
            .map(|s| s.name.clone())
            .collect();
        assert_eq!(changed, holder);
    }

    #[test]
    fn mixed_versions_are_refused_naming_shard_and_version() {
        let d1 = dump_of(&[
            ("", "ns", "a", &[("http", 60)]),
            ("", "ns", "b", &[("http", 60)]),
        ]);
        let mut d2 = d1.clone();
        d2.insert(
            &ServiceKey::new("", "ns", "b"),
            PortMap::from([("http".to_string(), vec![node(77_777)])]),
        );
        let l1 = build(&d1, "snap", 2048).unwrap();
        let l2 = build(&d2, "snap", 2048).unwrap();
        // Shards of version 2 written, index still version 1: refused, retryable.
        let f2 = files(&l2);
        let e = assemble(&l1.index, |r| f2.get(&r.name).cloned()).unwrap_err();
        assert!(e.is_retryable(), "{e}");
        assert!(e.to_string().contains(&l1.version), "{e}");
        assert!(e.to_string().contains("snap-"), "{e}");
        // A shard the index lists is gone.
        let f1 = files(&l1);
        let last = l1.shards.last().unwrap().name.clone();
        let e = assemble(&l1.index, |r| {
            (r.name != last).then(|| f1.get(&r.name).cloned()).flatten()
        })
        .unwrap_err();
        assert!(matches!(e, AssembleError::ShardMissing { ref shard, .. } if *shard == last));
        // An index whose hashes match but whose version lies: not retryable.
        let mut idx = parse_index(&l1.index).unwrap();
        idx.version = "0000000000000000".into();
        let e = assemble(&serde_json::to_string(&idx).unwrap(), |r| {
            f1.get(&r.name).cloned()
        })
        .unwrap_err();
        assert!(!e.is_retryable());
        assert!(e.to_string().contains("0000000000000000"), "{e}");
        // Garbage index.
        assert!(matches!(
            assemble("{", |_| None),
            Err(AssembleError::Index(_))
        ));
    }

    /// A small deterministic generator (no external crate): `next(m)` is
    /// in `0..m`.
    fn xorshift(mut seed: u64) -> impl FnMut(u64) -> u64 {
        move |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % m.max(1)
        }
    }

    #[test]
    fn property_round_trip_over_generated_states() {
        // A small deterministic generator (no external crate): many shapes,
        // several budgets, including services split into parts.
        let mut next = xorshift(0x9e37_79b9_7f4a_7c15);
        for case in 0..60 {
            let clusters: Vec<String> = (0..=next(3)).map(|i| format!("c{i}")).collect();
            let mut d = Dump::with_clusters(clusters.iter().map(String::as_str));
            let services = next(40);
            let mut n = 0u32;
            for s in 0..services {
                let c = &clusters[next(clusters.len() as u64) as usize];
                let ports = next(4);
                let mut pm = PortMap::new();
                for p in 0..ports {
                    let count = if next(10) == 0 { next(400) } else { next(6) };
                    let nodes = (0..count)
                        .map(|_| {
                            n += 1;
                            node(n)
                        })
                        .collect();
                    pm.insert(format!("p{p}"), nodes);
                }
                d.insert(
                    &ServiceKey::new(c.as_str(), format!("ns{}", next(5)), format!("s{s}")),
                    pm,
                );
            }
            let max = [MIN_SHARD_BYTES, 1500, 4096, 65536][case % 4];
            let l = roundtrip(&d, max);
            let names: BTreeSet<_> = l.shards.iter().map(|s| s.name.clone()).collect();
            assert_eq!(names.len(), l.shards.len());
        }
    }

    #[test]
    fn label_value_is_a_valid_label() {
        assert_eq!(label_value("kube-discovery-nodes"), "kube-discovery-nodes");
        let long = format!("{}.x", "a".repeat(70));
        let v = label_value(&long);
        assert!(v.len() <= 63, "{v}");
        assert_ne!(v, label_value(&format!("{}.y", "a".repeat(70))));
    }

    #[test]
    fn nodes_cost_from_the_text_is_the_sum_of_node_costs() {
        let mut odd = Node::new("h\"q\\u\u{1}ü.example", 80, 3);
        odd.set_zone(Some("z\n".into()));
        for pm in [
            PortMap::new(),
            PortMap::from([("http".to_string(), Vec::new())]),
            PortMap::from([("a\"b".to_string(), vec![odd.clone()])]),
            two_port_service(0, 7),
            PortMap::from([
                ("".to_string(), vec![node(1), odd.clone(), node(2)]),
                ("x".to_string(), Vec::new()),
                ("y".to_string(), vec![odd]),
            ]),
        ] {
            let want: usize = pm.values().flatten().map(node_cost).sum();
            let twice = escaped_twice_len(&port_json(&pm));
            assert_eq!(nodes_cost(&pm, twice), want, "{pm:?}");
        }
    }

    #[test]
    fn escaped_len_matches_serde_json() {
        for s in [
            "plain",
            "q\"uo\\te",
            "ctl\u{1}\n\u{8}\u{c}\u{1f}\u{7f}\r\t",
            "ünï€𝄞",
        ] {
            assert_eq!(
                escaped_len(s) + 2,
                serde_json::to_string(s).unwrap().len(),
                "{s:?}"
            );
            assert_eq!(escaped_twice_len(s), escaped_len(&inner(s)), "{s:?}");
        }
    }

    /// The state a [`Builder`] reads: values behind `Arc`s, in key order.
    type State = BTreeMap<ServiceKey, Arc<ServiceNodes>>;

    fn dump_from(clusters: &BTreeSet<String>, state: &State) -> Dump {
        let mut d = Dump::with_clusters(clusters.iter().map(String::as_str));
        for s in state.values() {
            d.insert(&s.key, s.ports.clone());
        }
        d
    }

    fn value(key: &ServiceKey, ports: PortMap) -> Arc<ServiceNodes> {
        Arc::new(ServiceNodes::new(
            key.clone(),
            crate::model::SourceKind::EndpointSlice,
            ports,
            None,
        ))
    }

    /// [`value`], with the kept buckets when `buckets`.
    fn value_any(key: &ServiceKey, ports: PortMap, buckets: bool) -> Arc<ServiceNodes> {
        if buckets {
            value_with_buckets(key, ports)
        } else {
            value(key, ports)
        }
    }

    /// [`value`] with the kept buckets the index gives a big service.
    fn value_with_buckets(key: &ServiceKey, ports: PortMap) -> Arc<ServiceNodes> {
        let b = crate::model::Buckets::of(&ports);
        Arc::new(ServiceNodes::with_buckets(
            key.clone(),
            crate::model::SourceKind::EndpointSlice,
            ports,
            None,
            crate::model::PortExtras::default(),
            Vec::new(),
            Some(b),
        ))
    }

    /// Issue 19 item 2: the incremental builder gives exactly what `build`
    /// gives, over random sequences of changes that move services between
    /// buckets and shards of their own (growing big, shrinking small),
    /// double and halve the bucket count, and add and remove clusters
    /// (with services of their own and without), at several budgets.
    #[test]
    fn builder_equals_build_over_random_sequences_of_changes() {
        let mut next = xorshift(0x2545_f491_4f6c_dd1d);
        let mut kinds = [0usize; 9];
        let mut resplits = 0;
        let mut by_digest = 0;
        for case in 0..16 {
            let max = [MIN_SHARD_BYTES, 1500, 4096, 16 * 1024][case % 4];
            let mut b = Builder::new("snap", max).unwrap();
            let mut clusters: BTreeSet<String> = ["".to_string(), "c1".to_string()].into();
            let mut state = State::new();
            let mut n = 0u32;
            let mut nodes = |count: u64| -> Vec<Node> {
                (0..count)
                    .map(|_| {
                        n += 1;
                        node(n)
                    })
                    .collect()
            };
            for step in 0..40 {
                let pick = |state: &State, r: u64| state.keys().nth(r as usize).cloned();
                let r = next(1 << 20);
                let kind = next(9) as usize;
                kinds[kind] += 1;
                match kind {
                    // A service added, small.
                    0 | 1 => {
                        let c = clusters
                            .iter()
                            .nth(next(clusters.len() as u64) as usize)
                            .unwrap();
                        let k =
                            ServiceKey::new(c.as_str(), format!("ns{}", next(4)), format!("s{r}"));
                        let ports = PortMap::from([("http".to_string(), nodes(next(4)))]);
                        state.insert(k.clone(), value_any(&k, ports, next(3) > 0));
                    }
                    // One removed.
                    2 => {
                        if let Some(k) = pick(&state, r % (state.len() as u64).max(1)) {
                            state.remove(&k);
                        }
                    }
                    // One growing big (a shard of its own, or parts).
                    3 => {
                        if let Some(k) = pick(&state, r % (state.len() as u64).max(1)) {
                            let mut p = state[&k].ports.clone();
                            let grow = nodes(20 + next(300));
                            p.entry("http".to_string()).or_default().extend(grow);
                            p.insert("grpc".to_string(), nodes(next(3)));
                            state.insert(k.clone(), value_any(&k, p, next(3) > 0));
                        }
                    }
                    // One shrinking back to small.
                    4 => {
                        if let Some(k) = pick(&state, r % (state.len() as u64).max(1)) {
                            let p = PortMap::from([("http".to_string(), nodes(1))]);
                            state.insert(k.clone(), value_any(&k, p, next(3) > 0));
                        }
                    }
                    // Many small services at once (the bucket count doubles).
                    5 => {
                        for i in 0..(10 + next(40)) {
                            let k = ServiceKey::new("", "bulk", format!("b{r}-{i}"));
                            let p = PortMap::from([("http".to_string(), nodes(2))]);
                            state.insert(k.clone(), value_any(&k, p, next(3) > 0));
                        }
                    }
                    // A cluster added (empty) or removed with its services.
                    6 => {
                        if next(2) == 0 {
                            clusters.insert(format!("c{}", next(4)));
                        } else if clusters.len() > 1
                            && let Some(c) = clusters
                                .iter()
                                .nth(next(clusters.len() as u64) as usize)
                                .cloned()
                        {
                            clusters.remove(&c);
                            state.retain(|k, _| k.cluster != c);
                        }
                    }
                    // One node changed in place (a weight), removed, or
                    // added (sorting last), in a random service: in a split
                    // one, one part changes.
                    7 => {
                        // Half of the time in the biggest service.
                        let biggest = state
                            .iter()
                            .max_by_key(|(_, v)| v.node_count())
                            .map(|(k, _)| k.clone());
                        let k = if next(2) == 0 {
                            biggest
                        } else {
                            pick(&state, r % (state.len() as u64).max(1))
                        };
                        if let Some(k) = k {
                            let mut p = state[&k].ports.clone();
                            let how = next(3);
                            let added = nodes(1);
                            if let Some(list) = p.values_mut().find(|l| !l.is_empty()) {
                                let i = next(list.len() as u64) as usize;
                                match how {
                                    0 => list[i].weight = list[i].weight.wrapping_add(1),
                                    1 => drop(list.remove(i)),
                                    _ => list.extend(added),
                                }
                            }
                            state.insert(k.clone(), value_any(&k, p, next(3) > 0));
                        }
                    }
                    // Same content, new value (the builder must not care).
                    _ => {
                        if let Some(k) = pick(&state, r % (state.len() as u64).max(1)) {
                            let v = value_any(&k, state[&k].ports.clone(), next(3) > 0);
                            state.insert(k, v);
                        }
                    }
                }
                let want = build(&dump_from(&clusters, &state), "snap", max).unwrap();
                let got = b
                    .build(clusters.iter().map(String::as_str), state.values())
                    .unwrap();
                assert_eq!(got, want, "case {case} step {step} (change kind {kind})");
            }
            resplits += b.resplits;
            by_digest += b.by_digest;
        }
        assert!(resplits > 10, "the incremental split ran {resplits} times");
        assert!(
            by_digest > 10,
            "the changed parts were found by their digests {by_digest} times"
        );
        assert!(
            kinds.iter().all(|k| *k > 20),
            "every kind of change ran: {kinds:?}"
        );
    }

    /// The builder is incremental: after one change it hands out the very
    /// shards (the same allocations) of the previous round but the changed
    /// one, for a service split into parts and among many small services.
    #[test]
    fn builder_rebuilds_only_the_shards_that_changed() {
        let max = 16 * 1024;
        let mut state = State::new();
        let big = ServiceKey::new("", "big", "svc");
        state.insert(big.clone(), value(&big, two_port_service(1000, 2_000)));
        for i in 0..300u32 {
            let k = ServiceKey::new("", "ns", format!("s{i:03}"));
            state.insert(
                k.clone(),
                value(&k, PortMap::from([("http".to_string(), vec![node(i)])])),
            );
        }
        let clusters = [""];
        let mut b = Builder::new("snap", max).unwrap();
        let first = b.build(clusters, state.values()).unwrap();
        assert!(first.shards.len() >= 8, "{} shards", first.shards.len());
        let rebuilt = |a: &Layout, b: &Layout| -> Vec<String> {
            a.shards
                .iter()
                .zip(&b.shards)
                .filter(|(x, y)| !Arc::ptr_eq(x, y))
                .map(|(x, _)| x.name.clone())
                .collect()
        };
        // Unchanged: nothing rebuilt.
        let again = b.build(clusters, state.values()).unwrap();
        assert_eq!(rebuilt(&first, &again), Vec::<String>::new());
        // One endpoint added to the big service: its part only.
        let mut p = state[&big].ports.clone();
        for (k, n) in [
            ("http", node(900_000)),
            ("metrics", Node::new(node(900_000).host.as_str(), 9090, 1)),
        ] {
            p.get_mut(k).unwrap().push(n);
        }
        state.insert(big.clone(), value(&big, p));
        let one = b.build(clusters, state.values()).unwrap();
        assert_eq!(b.resplits, 1, "re-cut at its part count, not from scratch");
        assert_eq!(
            one,
            build(&dump_from(&[String::new()].into(), &state), "snap", max).unwrap()
        );
        assert_eq!(one.shards.len(), first.shards.len());
        assert_eq!(
            rebuilt(&again, &one).len(),
            1,
            "{:?}",
            rebuilt(&again, &one)
        );
        // One small service changed: its bucket only.
        let k = ServiceKey::new("", "ns", "s123");
        state.insert(
            k.clone(),
            value(&k, PortMap::from([("http".to_string(), vec![node(77)])])),
        );
        let two = b.build(clusters, state.values()).unwrap();
        assert_eq!(rebuilt(&one, &two).len(), 1, "{:?}", rebuilt(&one, &two));
        assert_eq!(
            two,
            build(&dump_from(&[String::new()].into(), &state), "snap", max).unwrap()
        );
    }

    #[test]
    fn builder_names_a_service_out_of_order() {
        let (a, z) = (
            ServiceKey::new("", "ns", "a"),
            ServiceKey::new("", "ns", "z"),
        );
        let (va, vz) = (value(&a, PortMap::new()), value(&z, PortMap::new()));
        let mut b = Builder::new("snap", MIN_SHARD_BYTES).unwrap();
        let e = b.build([""], [&vz, &va]).unwrap_err();
        assert!(e.to_string().contains("ns/a"), "{e}");
        assert!(b.build([""], [&va, &vz]).is_ok());
        assert!(
            Builder::new("snap", 10)
                .unwrap_err()
                .to_string()
                .contains("minimum")
        );
        // A part budget too small is refused the same way, naming it.
        let e = Builder::with_part_bytes("snap", 4096, 10).unwrap_err();
        assert!(e.to_string().contains("size 10 is below"), "{e}");
        let e = build_with(&Dump::default(), "snap", 4096, 20).unwrap_err();
        assert!(e.to_string().contains("size 20 is below"), "{e}");
    }

    /// Upgrading from a release whose parts filled whole shards (before
    /// [`DEFAULT_MAX_PART_BYTES`]; the same format): this reader reads that
    /// layout, and while the new layout replaces it the way the planner
    /// writes (changed shards in order, the index last, then stale shards
    /// deleted), every read gives the old state, the new one or "read
    /// again", never a mix; and back (a downgrade, fewer shards).
    #[test]
    fn an_old_layout_is_read_and_replaced_without_a_mixed_read() {
        let max = 16 * 1024;
        let mut d0 = dump_of(&[("", "a", "small", &[("http", 2)])]);
        d0.insert(
            &ServiceKey::new("", "big", "svc"),
            two_port_service(1000, 2_000),
        );
        let mut d1 = d0.clone();
        big(&mut d1).get_mut("http").unwrap().push(node(900_000));
        let old = build_with(&d0, "snap", max, max).unwrap();
        let new = build_with(&d1, "snap", max, 4096).unwrap();
        assert!(
            new.shards.len() > 2 * old.shards.len(),
            "{} -> {} shards",
            old.shards.len(),
            new.shards.len()
        );
        for (from, to, a, b) in [(&old, &new, &d0, &d1), (&new, &old, &d1, &d0)] {
            let mut server = files(from);
            let read = |index: &str, server: &HashMap<String, String>| {
                assemble(index, |r| server.get(&r.name).cloned())
            };
            assert_eq!(&read(&from.index, &server).unwrap(), a);
            let mut again = 0;
            for s in &to.shards {
                if server.get(&s.name) != Some(&s.text) {
                    server.insert(s.name.clone(), s.text.clone());
                    match read(&from.index, &server) {
                        Ok(d) => assert_eq!(&d, a, "after writing {}", s.name),
                        Err(e) => {
                            assert!(e.is_retryable(), "after writing {}: {e}", s.name);
                            again += 1;
                        }
                    }
                }
            }
            assert!(again > 0, "the old index met rewritten shards");
            assert_eq!(&read(&to.index, &server).unwrap(), b);
            let listed: BTreeSet<&String> = to.shards.iter().map(|s| &s.name).collect();
            let stale: Vec<String> = server
                .keys()
                .filter(|n| !listed.contains(n))
                .cloned()
                .collect();
            for n in stale {
                server.remove(&n);
                assert_eq!(&read(&to.index, &server).unwrap(), b, "after deleting {n}");
            }
        }
    }

    /// Format 2's version is checked from the index: an index listing
    /// another cluster set than its version names is refused.
    #[test]
    fn a_format_2_version_that_does_not_name_its_shards_is_refused() {
        let d = dump_of(&[("", "ns", "a", &[("http", 3)])]);
        let l = build(&d, "snap", 4096).unwrap();
        let f = files(&l);
        let mut idx = parse_index(&l.index).unwrap();
        idx.clusters.push("east".into());
        let e = assemble(&serde_json::to_string(&idx).unwrap(), |r| {
            f.get(&r.name).cloned()
        })
        .unwrap_err();
        assert!(!e.is_retryable(), "{e}");
        assert!(e.to_string().contains(&l.version), "{e}");
    }
}
