//! The node buckets of a big service: a node's bucket is the hash of its
//! host modulo [`MAX_SHARDS`], so its shard under every shard count follows
//! from it. They live here, not in `crd::shards` (which reads them), because
//! a `ServiceNodes` carries them.

use super::*;

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

/// The bucket of a host: its shard among [`MAX_SHARDS`] (see the module docs).
fn bucket(host: &str) -> usize {
    // The remainder is < MAX_SHARDS.
    usize::try_from(node_hash(host) % u64::from(MAX_SHARDS)).unwrap_or(0)
}

/// Per-bucket facts of a service's nodes (see the module docs): kept by the
/// index next to a big service's nodes ([`crate::model::ServiceNodes::buckets`]),
/// updated per node with [`Buckets::add`] / [`Buckets::remove`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Buckets {
    /// Per bucket: the sum of `JSON length + 1` (the comma) of its nodes.
    pub(crate) sizes: Vec<usize>,
    /// Per bucket: the digest of its `(port key, node)`s.
    digests: Vec<PortsDigest>,
    /// The digest of all nodes (the sum of `digests`).
    pub(crate) total: PortsDigest,
    /// The sum of `sizes`.
    pub(crate) size: usize,
}

impl Default for Buckets {
    fn default() -> Self {
        Self {
            sizes: vec![0; MAX_SHARDS as usize],
            digests: vec![PortsDigest::default(); MAX_SHARDS as usize],
            total: PortsDigest::default(),
            size: 0,
        }
    }
}

impl Buckets {
    /// The buckets of every node of `ports` (O(nodes)).
    pub fn of(ports: &PortMap) -> Self {
        let mut b = Self::default();
        for (key, nodes) in ports {
            for n in nodes {
                b.add(key, n);
            }
        }
        b
    }

    /// `node` of port `key` joined the nodes.
    pub fn add(&mut self, key: &str, node: &Node) {
        self.change(key, node, true);
    }

    /// `node` of port `key` left the nodes (it was added before).
    pub fn remove(&mut self, key: &str, node: &Node) {
        self.change(key, node, false);
    }

    fn change(&mut self, key: &str, node: &Node, added: bool) {
        let json = node_json(node);
        let (i, h, len) = (bucket(&node.host), element_hash(key, &json), json.len() + 1);
        if added {
            self.sizes[i] = self.sizes[i].saturating_add(len);
            self.size = self.size.saturating_add(len);
            self.digests[i].add_element(h);
            self.total.add_element(h);
        } else {
            self.sizes[i] = self.sizes[i].saturating_sub(len);
            self.size = self.size.saturating_sub(len);
            self.digests[i].remove_element(h);
            self.total.remove_element(h);
        }
    }

    /// The digest of all nodes (what the service's version covers).
    pub fn digest(&self) -> &PortsDigest {
        &self.total
    }

    /// The digest of the nodes of shard `index` of `count` (a power of two).
    pub fn shard_digest(&self, index: u32, count: u32) -> PortsDigest {
        let mut d = PortsDigest::default();
        for b in (index as usize..self.digests.len()).step_by(count.max(1) as usize) {
            d.merge(&self.digests[b]);
        }
        d
    }
}
