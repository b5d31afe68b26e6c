//! How a big service is split over several objects: a STABLE partition of
//! its nodes, and the per-shard content versions (issue 19 item 2).
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
//!   one endpoint comes and goes (each flip rewrites every shard); with
//!   512 KiB shards that is a service of ~10,000 x `c` endpoints changing
//!   exactly at the threshold.
//! * **FNV-1a, hand-written.** The partition is stored in objects on the API
//!   server and read back by the next binary, so the hash must never change
//!   between Rust releases or crates versions (std's `DefaultHasher` makes no
//!   such promise); FNV-1a is 6 lines and fast on short keys.
//!
//! The per-shard version ([`shard_version`]) covers everything a shard
//! `i > 0` carries that can change (its nodes, the source kind, the owner,
//! the Service-derived extras) plus its index and the count, so a shard left
//! over from another count can never match a manifest entry of this one.

use crate::model::{Node, PortExtras, PortMap, SourceKind, version_with_extras};

/// The most shards a service is split into (4096 x 512 KiB = 2 GiB of
/// nodes, far beyond what a watch can carry): the doubling stops here even
/// if a shard still does not fit (e.g. one giant node).
pub const MAX_SHARDS: u32 = 4096;

/// FNV-1a 64 of a node's host, the identity that decides its shard. Not
/// the port: an endpoint is one node per port key (`http`, `grpc`, ...),
/// and all of them must move together, so that one endpoint added or
/// removed is one shard, not one per port. Stable forever (see the module
/// docs).
pub fn node_hash(host: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut h = OFFSET;
    for b in host.as_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(PRIME);
    }
    h
}

/// The shard of `node` among `count` (>= 1) shards.
pub fn shard_index(node: &Node, count: u32) -> u32 {
    let count = u64::from(count.max(1));
    // The remainder is < count <= u32::MAX.
    u32::try_from(node_hash(&node.host) % count).unwrap_or(0)
}

/// The JSON size estimate of one port key in an object's `ports`:
/// `"key":[],` (what `crd::ports_fit` counts).
fn key_cost(port: &str) -> usize {
    port.len() + 6
}

/// How many shards `ports` needs under `max_bytes` per shard (same size
/// estimate as `crd::ports_fit`: `{}`, per port key `"key":[],`, per node
/// its JSON and a comma): 1 when it fits one object, else the smallest power
/// of two `>= 2` at which every shard of [`shard_index`] fits (at most
/// [`MAX_SHARDS`], and never more than the number of nodes rounded up to a
/// power of two, and 1 for a single node: a node cannot be split). Every port
/// key is counted in shard 0 (it carries them all, see [`partition`]).
pub fn shard_count(ports: &PortMap, max_bytes: usize, node_len: impl Fn(&Node) -> usize) -> u32 {
    // One pass: the per-node sizes and hashes, then bucket sums per count.
    let mut items: Vec<(u64, usize)> = Vec::new();
    let mut keys_cost = 2usize; // `{}`
    for (port, nodes) in ports {
        keys_cost = keys_cost.saturating_add(key_cost(port));
        for n in nodes {
            items.push((node_hash(&n.host), node_len(n) + 1));
        }
    }
    let total: usize = items
        .iter()
        .fold(keys_cost, |a, (_, c)| a.saturating_add(*c));
    if total <= max_bytes || items.len() <= 1 {
        return 1;
    }
    let cap = u32::try_from(items.len())
        .unwrap_or(u32::MAX)
        .checked_next_power_of_two()
        .unwrap_or(MAX_SHARDS)
        .clamp(2, MAX_SHARDS);
    let mut count = 2u32;
    loop {
        // Shard 0 carries every key; other shards at most each key once,
        // which this over-estimates as "every key" too (a few bytes).
        let mut sizes = vec![keys_cost; count as usize];
        for (h, c) in &items {
            let i = usize::try_from(h % u64::from(count)).unwrap_or(0);
            sizes[i] = sizes[i].saturating_add(*c);
        }
        if count >= cap || sizes.iter().all(|s| *s <= max_bytes) {
            return count;
        }
        count *= 2;
    }
}

/// `ports` split over `count` (>= 2) shards by [`shard_index`]: node order
/// within a port is kept (so each shard's lists stay sorted when `ports`'
/// are), shard 0 carries every port key (an empty list where it has no node
/// of that port, so a reader learns every key, also of a port without
/// nodes, from shard 0 alone), shard `i > 0` only the keys it has nodes of.
pub fn partition(ports: &PortMap, count: u32) -> Vec<PortMap> {
    let count = count.max(1);
    let mut out: Vec<PortMap> = (0..count).map(|_| PortMap::new()).collect();
    for (port, nodes) in ports {
        out[0].insert(port.clone(), Vec::new());
        for n in nodes {
            let i = shard_index(n, count) as usize;
            out[i].entry(port.clone()).or_default().push(n.clone());
        }
    }
    out
}

/// The content version of shard `index` of `count` holding `ports`: 16 hex
/// of sha256 over the index, the count and what `model::version_with_extras`
/// hashes of a service (see the module docs).
pub fn shard_version(
    index: u32,
    count: u32,
    source: SourceKind,
    ports: &PortMap,
    owner_uid: Option<&str>,
    extras: &PortExtras,
) -> String {
    let content = version_with_extras(source, ports, owner_uid, extras);
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update(index.to_le_bytes());
    h.update(count.to_le_bytes());
    h.update(content.as_bytes());
    hex::encode(&h.finalize()[..8])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ports(n: usize) -> PortMap {
        let nodes = (0..n)
            .map(|i| Node::new(format!("10.0.{}.{}", i / 256, i % 256), 8080, 1))
            .collect();
        PortMap::from([("http".to_string(), nodes)])
    }

    fn len(_: &Node) -> usize {
        40
    }

    const PINNED: u64 = 0x87f7_ef5d_e06f_f78d;

    #[test]
    fn the_hash_is_fnv1a_and_never_changes() {
        // The published FNV-1a 64 test vector: "a" -> 0xaf63dc4c8601ec8c.
        assert_eq!(node_hash("a"), 0xaf63_dc4c_8601_ec8c);
        // Pinned: objects on API servers depend on it.
        assert_eq!(node_hash("10.0.0.1"), PINNED);
        assert_ne!(node_hash("10.0.0.1"), node_hash("10.0.0.10"));
        // Every port of one endpoint is in one shard.
        let a = Node::new("10.0.0.1", 80, 1);
        let b = Node::new("10.0.0.1", 9090, 1);
        assert!((1..64).all(|c| shard_index(&a, c) == shard_index(&b, c)));
    }

    #[test]
    fn counts_are_powers_of_two_and_every_shard_fits() {
        let p = ports(1000);
        assert_eq!(shard_count(&p, 1_000_000, len), 1);
        for max in [5_000, 10_000, 20_000] {
            let c = shard_count(&p, max, len);
            assert!(c.is_power_of_two() && c >= 2, "{c}");
            for (i, s) in partition(&p, c).iter().enumerate() {
                let nodes: usize = s.values().map(Vec::len).sum();
                assert!(nodes * 41 + 2 + 10 <= max, "shard {i} of {c}: {nodes}");
            }
            // The next smaller power of two does not fit (smallest count).
            if c > 2 {
                let half = partition(&p, c / 2);
                assert!(
                    half.iter()
                        .any(|s| { s.values().map(Vec::len).sum::<usize>() * 41 + 2 + 10 > max })
                );
            }
        }
        // A single node over the limit: one object is all there is.
        assert_eq!(shard_count(&ports(1), 10, len), 1);
        assert_eq!(shard_count(&ports(3), 10, len), 4);
    }

    #[test]
    fn one_node_more_changes_one_shard_and_order_is_kept() {
        let mut p = ports(1000);
        let before = partition(&p, 8);
        p.get_mut("http")
            .unwrap()
            .insert(0, Node::new("10.0.0.0", 1, 1));
        let after = partition(&p, 8);
        let changed: Vec<usize> = (0..8).filter(|i| before[*i] != after[*i]).collect();
        assert_eq!(changed.len(), 1, "{changed:?}");
        // Shard 0 has every key; the lists are subsequences of the input.
        assert!(after[0].contains_key("http"));
        let mut back: Vec<Node> = after
            .iter()
            .flat_map(|s| s.values().flatten().cloned())
            .collect();
        crate::model::sort_nodes(&mut back);
        let mut want = p.get("http").unwrap().clone();
        crate::model::sort_nodes(&mut want);
        assert_eq!(back, want);
    }

    #[test]
    fn shard_versions_depend_on_content_index_and_count() {
        let p = ports(10);
        let e = PortExtras::default();
        let v = |i, c, p: &PortMap| shard_version(i, c, SourceKind::EndpointSlice, p, None, &e);
        assert_eq!(v(1, 4, &p), v(1, 4, &p));
        assert_ne!(v(1, 4, &p), v(2, 4, &p));
        assert_ne!(v(1, 4, &p), v(1, 8, &p));
        assert_ne!(v(1, 4, &p), v(1, 4, &ports(11)));
        assert_eq!(v(1, 4, &p).len(), 16);
    }
}
