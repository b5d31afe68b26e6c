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
//!    shard <name>-i, data key "<name>-i.json":
//!      {"format":1,"index":i,"endpoints":[{"id":"","endpoints":[{"name":"ns/a","value":"{..}"}, ..]}]}
//!    index <name>, data key "index.json":
//!      {"format":1,"version":V,"clusters":[..],"services":S,"nodes":N,
//!       "shards":[{"name":"<name>-0","key":"<name>-0.json","sha256":H0,"bytes":B0}, ..]}
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
//!   ConfigMap limit). Shards are cut on service boundaries; a single service
//!   bigger than a shard is split by node ranges into parts
//!   (`"part":{"index":k,"count":n}`, in consecutive positions), which the
//!   reader concatenates per port in order.
//! * **Consistency.** Shard names are fixed (`<name>-<i>`, so a pod can mount
//!   them) and carry no version; the index lists, for the version it
//!   describes, the sha256 of every shard's text. The writer writes changed
//!   shards first and the index last, then deletes shards the index no longer
//!   lists. A reader that meets a shard being rewritten sees a hash mismatch,
//!   one that meets a deleted shard sees it missing: both are
//!   [`AssembleError::is_retryable`] ("read again"), never a silently mixed
//!   result. On top of the per-shard hashes the assembled state is re-hashed and
//!   must equal the index's `version`, and the service/node counts must match.
//! * **Cheap updates.** An unchanged shard keeps its text, so a change in one
//!   service rewrites its shard and the index only (a service added early in
//!   the order may shift later boundaries; those shards are rewritten too).

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::model::{Node, NodeQuery, PortMap, ServiceKey};
use crate::service::PortExtras;

/// Format number written into the index and every shard.
pub const FORMAT: u32 = 1;

/// Data key of the index ConfigMap.
pub const INDEX_KEY: &str = "index.json";

/// Default shard budget: 900 KiB of JSON-escaped text, under the 1 MiB
/// ConfigMap limit with room for metadata.
pub const DEFAULT_MAX_SHARD_BYTES: usize = 900 * 1024;

/// Smallest accepted shard budget (tests use small budgets to get many shards).
pub const MIN_SHARD_BYTES: usize = 1024;

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
pub fn escaped_len(s: &str) -> usize {
    s.chars()
        .map(|c| match c {
            '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
            c if (c as u32) < 0x20 => 6,
            c => c.len_utf8(),
        })
        .sum()
}

fn sha256_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
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
    /// [`Dump::version`].
    pub version: String,
    /// Text of the index document (data key [`INDEX_KEY`]).
    pub index: String,
    /// The shards, in order.
    pub shards: Vec<ShardData>,
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
    /// [`Dump::version`] of the state the shards hold.
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

/// `s` as it appears inside a JSON string (escaped, without quotes).
fn inner(s: &str) -> String {
    let q = serde_json::to_string(s).unwrap_or_default();
    q.get(1..q.len().saturating_sub(1))
        .unwrap_or_default()
        .to_string()
}

/// Fills each part as far as an upper bound of its size allows, so big
/// services use whole shards. `None` when a part misses the bound after all
/// (the caller then splits evenly).
fn split_greedy(
    name: &str,
    flat: &[(&String, &Node)],
    empty: &[&String],
    avail: usize,
) -> Result<Option<Vec<Entry>>, BuildError> {
    let fixed = entry_size(&Entry {
        name: name.to_string(),
        value: "{}".to_string(),
        part: Some(Part {
            index: u32::MAX,
            count: u32::MAX,
        }),
    })? + 16;
    // In the measured text a value character costs its escaped length twice over.
    let cost = |fragment: &str| escaped_len(&inner(fragment)) + 2;
    let port_cost = |p: &String| cost(&format!("{}:[],", json(p)));
    let mut parts: Vec<PortMap> = Vec::new();
    let mut cur = PortMap::new();
    let mut size = fixed;
    for p in empty {
        cur.insert((*p).clone(), Vec::new());
        size += port_cost(p);
    }
    for (p, n) in flat {
        let mut add = cost(&json(*n));
        if !cur.contains_key(*p) {
            add += port_cost(p);
        }
        if !cur.is_empty() && size + add > avail {
            parts.push(std::mem::take(&mut cur));
            size = fixed + port_cost(p);
            add = cost(&json(*n));
        }
        size += add;
        cur.entry((*p).clone()).or_default().push((*n).clone());
    }
    if !cur.is_empty() {
        parts.push(cur);
    }
    let count = u32::try_from(parts.len()).map_err(BuildError::TooMany)?;
    let mut out = Vec::with_capacity(parts.len());
    for (i, pm) in parts.iter().enumerate() {
        let e = Entry {
            name: name.to_string(),
            value: port_json(pm),
            part: Some(Part {
                index: u32::try_from(i).map_err(BuildError::TooMany)?,
                count,
            }),
        };
        if entry_size(&e)? > avail {
            return Ok(None);
        }
        out.push(e);
    }
    Ok((out.len() >= 2).then_some(out))
}

/// Splits one service into parts of at most `avail` escaped bytes each.
fn split_service(
    key: &ServiceKey,
    name: &str,
    ports: &PortMap,
    avail: usize,
    max: usize,
) -> Result<Vec<Entry>, BuildError> {
    let flat: Vec<(&String, &Node)> = ports
        .iter()
        .flat_map(|(p, nodes)| nodes.iter().map(move |n| (p, n)))
        .collect();
    let empty: Vec<&String> = ports
        .iter()
        .filter(|(_, n)| n.is_empty())
        .map(|(p, _)| p)
        .collect();
    let too_large = || BuildError::ServiceTooLarge {
        service: key.to_string(),
        max,
    };
    if let Some(parts) = split_greedy(name, &flat, &empty, avail)? {
        return Ok(parts);
    }
    let whole = entry_size(&Entry {
        name: name.to_string(),
        value: port_json(ports),
        part: None,
    })?;
    let mut k = whole.div_ceil(avail.max(1)).max(2);
    loop {
        if k > flat.len().max(1) {
            return Err(too_large());
        }
        let count = u32::try_from(k).map_err(|_| too_large())?;
        let per = flat.len().div_ceil(k);
        let mut parts = Vec::with_capacity(k);
        let mut fits = true;
        for (i, chunk) in flat.chunks(per.max(1)).enumerate() {
            let mut pm = PortMap::new();
            if i == 0 {
                for p in &empty {
                    pm.insert((*p).clone(), Vec::new());
                }
            }
            for (p, n) in chunk {
                pm.entry((*p).clone()).or_default().push((*n).clone());
            }
            let e = Entry {
                name: name.to_string(),
                value: port_json(&pm),
                part: Some(Part {
                    index: u32::try_from(i).map_err(|_| too_large())?,
                    count,
                }),
            };
            if entry_size(&e)? > avail {
                fits = false;
                break;
            }
            parts.push(e);
        }
        // chunks() may give fewer than k pieces; the count must be exact.
        if fits && parts.len() == k {
            return Ok(parts);
        }
        if fits {
            // Fewer chunks than k: renumber with the real count.
            let real = u32::try_from(parts.len()).map_err(|_| too_large())?;
            for p in &mut parts {
                if let Some(part) = &mut p.part {
                    part.count = real;
                }
            }
            return Ok(parts);
        }
        k += (k / 4).max(1);
    }
}

/// Cuts `dump` into shards of at most `max_bytes` (escaped) each, named
/// `<base>-<i>`, and writes the index. Always at least one shard.
pub fn build(dump: &Dump, base: &str, max_bytes: usize) -> Result<Layout, BuildError> {
    if max_bytes < MIN_SHARD_BYTES {
        return Err(BuildError::BudgetTooSmall(max_bytes));
    }
    let mut shards: Vec<Vec<Group>> = Vec::new();
    let mut cur: Vec<Group> = Vec::new();
    let mut size = SHARD_OVERHEAD;
    for (id, services) in &dump.clusters {
        let g_over = group_overhead(id);
        let avail = max_bytes.saturating_sub(SHARD_OVERHEAD + g_over + 1);
        for ((ns, name), ports) in services {
            let ename = format!("{ns}/{name}");
            let whole = Entry {
                name: ename.clone(),
                value: port_json(ports),
                part: None,
            };
            let entries = if entry_size(&whole)? <= avail {
                vec![whole]
            } else {
                let key = ServiceKey::new(id.as_str(), ns.as_str(), name.as_str());
                split_service(&key, &ename, ports, avail, max_bytes)?
            };
            for e in entries {
                let cost = entry_size(&e)? + 1;
                let new_group = cur.last().is_none_or(|g| &g.id != id);
                let add = cost + if new_group { g_over } else { 0 };
                if !cur.is_empty() && size + add > max_bytes {
                    shards.push(std::mem::take(&mut cur));
                    size = SHARD_OVERHEAD;
                }
                if cur.last().is_none_or(|g| &g.id != id) {
                    cur.push(Group {
                        id: id.clone(),
                        endpoints: Vec::new(),
                    });
                    size += g_over;
                }
                size += cost;
                if let Some(g) = cur.last_mut() {
                    g.endpoints.push(e);
                }
            }
        }
    }
    if !cur.is_empty() || shards.is_empty() {
        shards.push(cur);
    }
    let mut out = Vec::with_capacity(shards.len());
    for (i, groups) in shards.into_iter().enumerate() {
        let doc = ShardDoc {
            format: FORMAT,
            index: i,
            endpoints: groups,
        };
        let text = serde_json::to_string(&doc).map_err(|e| BuildError::Json(e.into()))?;
        if escaped_len(&text) > max_bytes {
            // The accounting above is an upper bound; reaching this is a bug.
            return Err(BuildError::ShardOverBudget {
                shard: i,
                len: escaped_len(&text),
                max: max_bytes,
            });
        }
        let name = shard_name(base, i);
        out.push(ShardData {
            key: format!("{name}.json"),
            name,
            sha256: sha256_hex(&text),
            text,
        });
    }
    let version = dump.version();
    let index = IndexDoc {
        format: FORMAT,
        version: version.clone(),
        clusters: dump.clusters.keys().cloned().collect(),
        services: dump.services(),
        nodes: dump.nodes(),
        shards: out
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
        shards: out,
        services: dump.services(),
        nodes: dump.nodes(),
    })
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
    if idx.format != FORMAT {
        return Err(AssembleError::Index(format!(
            "{INDEX_KEY}: format {} is not supported (this reader knows {FORMAT})",
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
    // Services split into parts: (cluster, ns, name) -> (next part, count).
    let mut open: HashMap<(String, String, String), (u32, u32)> = HashMap::new();
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
        if doc.format != FORMAT || doc.index != i {
            return Err(bad(format!(
                "format {} index {} (want format {FORMAT} index {i})",
                doc.format, doc.index
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
                match e.part {
                    None | Some(Part { index: 0, .. }) => {
                        if services.contains_key(&skey) {
                            return Err(bad(format!("{} appears twice", e.name)));
                        }
                        if let Some(p) = e.part {
                            if p.count < 2 {
                                return Err(bad(format!("{}: part count {}", e.name, p.count)));
                            }
                            open.insert(okey, (1, p.count));
                        }
                        services.insert(skey, ports);
                    }
                    Some(p) => {
                        let Some(next) = open.get_mut(&okey) else {
                            return Err(bad(format!(
                                "{}: part {} without part 0",
                                e.name, p.index
                            )));
                        };
                        if next.0 != p.index || next.1 != p.count {
                            return Err(bad(format!(
                                "{}: part {}/{} where {}/{} was expected",
                                e.name, p.index, p.count, next.0, next.1
                            )));
                        }
                        next.0 += 1;
                        if next.0 == next.1 {
                            open.remove(&okey);
                        }
                        let target = services.entry(skey).or_default();
                        for (port, nodes) in ports {
                            target.entry(port).or_default().extend(nodes);
                        }
                    }
                }
            }
        }
    }
    if let Some(((id, ns, name), (next, count))) = open.into_iter().next() {
        return Err(AssembleError::Inconsistent {
            version,
            reason: format!("service {id:?} {ns}/{name} has {next} of {count} parts"),
        });
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
    let got = dump.version();
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

    fn node(i: u32) -> Node {
        Node::new(
            format!("10.{}.{}.{}", i >> 16, (i >> 8) & 0xff, i & 0xff),
            8080,
            100,
        )
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
        assert_eq!(idx.version, d.version());
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

    #[test]
    fn one_service_bigger_than_a_shard_is_split_by_node_ranges() {
        let d = dump_of(&[
            ("", "a", "small", &[("http", 1)]),
            (
                "",
                "big",
                "svc",
                &[("http", 300), ("grpc", 200), ("none", 0)],
            ),
            ("", "z", "after", &[("http", 3)]),
        ]);
        let l = roundtrip(&d, 4096);
        assert!(l.shards.len() >= 8, "{} shards", l.shards.len());
        assert!(
            l.shards
                .iter()
                .filter(|s| s.text.contains("\"part\""))
                .count()
                >= 8
        );
    }

    #[test]
    fn a_split_service_fills_its_first_shard() {
        // A bit more than one shard: an even split would give two half-empty parts.
        let d = dump_of(&[("", "big", "svc", &[("http", 62)])]);
        let whole = escaped_len(&serde_json::to_string(&d.to_apisix_endpoints()).unwrap());
        assert!(whole > 4096 && whole < 4096 * 3 / 2, "{whole}");
        let l = roundtrip(&d, 4096);
        assert_eq!(l.shards.len(), 2);
        let first = escaped_len(&l.shards[0].text);
        assert!(first > 4096 * 85 / 100, "first shard only {first} of 4096");
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
        assert_eq!(changed, vec![a.shards.last().unwrap().name.clone()]);
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

    #[test]
    fn property_round_trip_over_generated_states() {
        // A small deterministic generator (no external crate): many shapes,
        // several budgets, including services split into parts.
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move |m: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % m.max(1)
        };
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
    fn escaped_len_matches_serde_json() {
        for s in ["plain", "q\"uo\\te", "ctl\u{1}\n", "ünï"] {
            assert_eq!(
                escaped_len(s) + 2,
                serde_json::to_string(s).unwrap().len(),
                "{s:?}"
            );
        }
    }
}
