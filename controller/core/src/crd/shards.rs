//! How a big service is split over several objects: a STABLE partition of
//! its nodes, and the per-shard content versions.
//!
//! ```text
//!  node's host ──fnv1a64──▶ h ──h mod count──▶ shard index
//!  count = smallest power of two (>= 2) at which every shard fits max_bytes
//!  shard i ──shard_version(i, count, ...)──▶ spec.version of shard i (i > 0),
//!                                            entry i of shard 0's manifest
//! ```
//!
//! Why this shape:
//! * **One endpoint touches one shard.** A node's shard depends only on its
//!   host and the count (every port of an endpoint moves together), never on where it sorts among
//!   the others (the old scheme cut the sorted list into consecutive ranges,
//!   so one node inserted at the front moved every boundary and rewrote every
//!   shard). A weight or topology change keeps the node where it is.
//! * **Powers of two.** Because `h mod 2c` determines `h mod c`, doubling the
//!   count splits every shard in two; and "fits at `c`" implies "fits at
//!   `2c`", so the smallest fitting power of two is well defined and is a pure
//!   function of the content (the drift check and the sink compute the same
//!   objects without sharing state). The price of no state: a service whose
//!   biggest shard sits right at the limit flips between `c` and `2c` when
//!   one endpoint comes and goes (each flip rewrites every shard).
//! * **FNV-1a, hand-written.** The partition is stored in objects on the API
//!   server and read back by the next binary, so the hash must never change
//!   between Rust releases or crates versions (std's `DefaultHasher` makes no
//!   such promise); FNV-1a is 6 lines and fast on short keys.
//!
//! The per-shard version ([`shard_version`]) covers everything a shard
//! `i > 0` carries that can change (its nodes, the source kind, the owner,
//! the Service-derived extras) plus its index and the count, so a shard left
//! over from another count can never match a manifest entry of this one.
//!
//! **Buckets.** Because every count divides [`MAX_SHARDS`], a node's shard
//! under any count follows from its bucket `node_hash % MAX_SHARDS`. The
//! index keeps, per bucket, the JSON size and the [`PortsDigest`] of the
//! nodes in it ([`Buckets`], updated per changed node), so the count (sums
//! of bucket sizes), the one-object check and every shard's version (sums
//! of bucket digests, [`shard_version`]) cost O(buckets), not O(nodes):
//! writing one change of a big service measures and hashes no node again.

use crate::model::version::PortsDigest;
pub use crate::model::version::{Buckets, MAX_SHARDS, node_hash};
use crate::model::{Node, PortExtras, PortMap, SourceKind};

/// The shard of `node` among `count` (>= 1) shards.
pub fn shard_index(node: &Node, count: u32) -> u32 {
    let count = u64::from(count.max(1));
    // The remainder is < count <= u32::MAX.
    u32::try_from(node_hash(&node.host) % count).unwrap_or(0)
}

/// [`shard_index`], without a division when `count` is a power of two
/// (every count [`shard_count`] gives): `h mod 2^k` is `h & (2^k - 1)`. The
/// 64-bit division was most of the time of building one shard of a
/// 100,000-node service.
fn fast_index(node: &Node, count: u32) -> u32 {
    if count.is_power_of_two() {
        // The masked value is < count <= u32::MAX.
        u32::try_from(node_hash(&node.host) & u64::from(count - 1)).unwrap_or(0)
    } else {
        shard_index(node, count)
    }
}

/// The JSON size estimate of one port key in an object's `ports`:
/// `"key":[],` (what [`crate::crd::ports_fit`] and the shard count add per
/// key).
pub(crate) fn key_cost(port: &str) -> usize {
    port.len() + 6
}

impl Buckets {
    /// [`shard_count`] of the `ports` these buckets describe: the same
    /// result from the bucket sums, without measuring a node.
    pub fn shard_count(&self, ports: &PortMap, max_bytes: usize) -> u32 {
        let keys_cost = keys_cost(ports);
        count_from(
            keys_cost.saturating_add(self.size),
            self.total.nodes(),
            max_bytes,
            |count| {
                let mut sizes = vec![keys_cost; count as usize];
                for (b, size) in self.sizes.iter().enumerate() {
                    let i = b % count as usize;
                    sizes[i] = sizes[i].saturating_add(*size);
                }
                sizes
            },
        )
    }

    /// Whether `ports` (which these buckets describe) fits one object:
    /// `crd::ports_fit` from the sums.
    pub fn fits(&self, ports: &PortMap, max_bytes: usize) -> bool {
        keys_cost(ports).saturating_add(self.size) <= max_bytes
    }
}

/// `{}` and every port key's `"key":[],`.
fn keys_cost(ports: &PortMap) -> usize {
    ports
        .keys()
        .fold(2usize, |a, k| a.saturating_add(key_cost(k)))
}

/// The shard count rule of [`shard_count`] over `total` bytes of `nodes`
/// nodes, `sizes(count)` giving every shard's bytes at `count`.
fn count_from(
    total: usize,
    nodes: usize,
    max_bytes: usize,
    sizes: impl Fn(u32) -> Vec<usize>,
) -> u32 {
    if total <= max_bytes || nodes <= 1 {
        return 1;
    }
    let cap = u32::try_from(nodes)
        .unwrap_or(u32::MAX)
        .checked_next_power_of_two()
        .unwrap_or(MAX_SHARDS)
        .clamp(2, MAX_SHARDS);
    let mut count = 2u32;
    loop {
        if count >= cap || sizes(count).iter().all(|s| *s <= max_bytes) {
            return count;
        }
        count *= 2;
    }
}

/// How many shards `ports` needs under `max_bytes` per shard (same size
/// estimate as `crd::ports_fit`: `{}`, per port key `"key":[],`, per node
/// its JSON and a comma): 1 when it fits one object, else the smallest power
/// of two `>= 2` at which every shard of [`shard_index`] fits (at most
/// [`MAX_SHARDS`], and never more than the number of nodes rounded up to a
/// power of two, and 1 for a single node: a node cannot be split). Every port
/// key is counted in shard 0 (it carries them all, see [`partition`]).
/// [`Buckets::shard_count`] gives the same from kept sums.
pub fn shard_count(ports: &PortMap, max_bytes: usize, node_len: impl Fn(&Node) -> usize) -> u32 {
    // One pass: the per-node sizes and hashes, then bucket sums per count.
    let mut items: Vec<(u64, usize)> = Vec::new();
    let keys_cost = keys_cost(ports);
    for n in ports.values().flatten() {
        items.push((node_hash(&n.host), node_len(n) + 1));
    }
    let total: usize = items
        .iter()
        .fold(keys_cost, |a, (_, c)| a.saturating_add(*c));
    count_from(total, items.len(), max_bytes, |count| {
        // Shard 0 carries every key; other shards at most each key once,
        // which this over-estimates as "every key" too (a few bytes).
        let mut sizes = vec![keys_cost; count as usize];
        for (h, c) in &items {
            let i = usize::try_from(h % u64::from(count)).unwrap_or(0);
            sizes[i] = sizes[i].saturating_add(*c);
        }
        sizes
    })
}

/// `ports` split over `count` (>= 2) shards by [`shard_index`]: node order
/// within a port is kept (so each shard's lists stay sorted when `ports`'
/// are), shard 0 carries every port key (an empty list where it has no node
/// of that port, so a reader learns every key, also of a port without
/// nodes, from shard 0 alone), shard `i > 0` only the keys it has nodes of.
pub fn partition(ports: &PortMap, count: u32) -> Vec<PortMap> {
    let count = count.max(1);
    partition_some(ports, count, &(0..count).collect::<Vec<_>>())
}

/// The shards `wanted` (in that order; each `< count` and at most once) of [`partition`],
/// in one pass over the nodes that copies only theirs: a write sends one
/// or two shards of a big service, not all of them (issue 19 item 2).
pub fn partition_some(ports: &PortMap, count: u32, wanted: &[u32]) -> Vec<PortMap> {
    let count = count.max(1);
    // Shard -> position in `wanted` (usize::MAX: not wanted).
    let mut slot = vec![usize::MAX; count as usize];
    for (pos, i) in wanted.iter().enumerate() {
        if let Some(s) = slot.get_mut(*i as usize) {
            *s = pos;
        }
    }
    let mut out: Vec<PortMap> = wanted.iter().map(|_| PortMap::new()).collect();
    for (port, nodes) in ports {
        // Per port, then one insert per shard: the key is cloned once per
        // shard, not once per node.
        let expected = nodes.len() / count as usize + nodes.len() / (4 * count as usize) + 4;
        let mut lists: Vec<Vec<Node>> = wanted
            .iter()
            .map(|_| Vec::with_capacity(expected))
            .collect();
        for n in nodes {
            let pos = slot[fast_index(n, count) as usize];
            if let Some(list) = lists.get_mut(pos) {
                list.push(n.clone());
            }
        }
        for ((list, index), part) in lists.into_iter().zip(wanted).zip(out.iter_mut()) {
            if *index == 0 || !list.is_empty() {
                part.insert(port.clone(), list);
            }
        }
    }
    out
}

/// The port keys shard `index` of `count` carries in [`partition`] (each
/// with an empty list): every key for shard 0, else the keys of which it
/// has a node. What [`shard_version`] hashes besides the digest, without
/// copying a node: per key the scan stops at the first node of the shard
/// (about `count` nodes when the port has many).
pub fn shard_keys(ports: &PortMap, index: u32, count: u32) -> PortMap {
    ports
        .iter()
        .filter(|(_, nodes)| index == 0 || nodes.iter().any(|n| fast_index(n, count) == index))
        .map(|(port, _)| (port.clone(), Vec::new()))
        .collect()
}

/// The content version of shard `index` of `count` holding `ports`, whose
/// nodes have `digest` ([`Buckets::shard_digest`]): 16 hex of sha256 over
/// the index, the count and what `model::version_of_digest` hashes of a
/// big service (the port keys, the node digest, source, owner, extras; see
/// the module docs and `model::PortsDigest` for why a digest is enough).
pub fn shard_version(
    index: u32,
    count: u32,
    source: SourceKind,
    ports: &PortMap,
    digest: &PortsDigest,
    owner_uid: Option<&str>,
    extras: &PortExtras,
) -> String {
    let content =
        crate::model::version::version_of_digest(source, ports, digest, owner_uid, extras);
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(index.to_le_bytes());
    h.update(count.to_le_bytes());
    h.update(content.as_bytes());
    hex::encode(&h.finalize()[..8])
}

#[cfg(test)]
mod tests;
