//! Content versions: equal content gives an equal version, so writers skip
//! no-op writes, also right after a restart. A small service's version
//! hashes its JSON; a big one's is kept up to date per changed node through
//! an order-independent digest ([`PortsDigest`]) and per-bucket facts
//! ([`Buckets`]), so one change costs no re-serialization of every node.

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::model::{Node, PortExtras, PortMap, SourceKind};

mod buckets;

pub use buckets::{Buckets, MAX_SHARDS, node_hash};

/// Content hash of a service's nodes: the first 16 hex characters of the
/// SHA-256 of the canonical JSON `{"source":..,"ports":..}` (`BTreeMap` and
/// sorted node lists make the JSON canonical). Equal content => equal version,
/// so writers can skip no-op writes, including right after a restart.
pub fn content_version(source: SourceKind, ports: &PortMap) -> String {
    object_version(source, ports, None)
}

/// The version stored in [`ServiceNodes::version`] and `spec.version`: like
/// [`content_version`] (and equal to it when `owner_uid` is `None`), but the
/// owner UID is hashed too, because it ends up in the written object (its
/// ownerReference). A writer comparing versions therefore never skips a write
/// that would change the object.
pub fn object_version(source: SourceKind, ports: &PortMap, owner_uid: Option<&str>) -> String {
    version_with_extras(source, ports, owner_uid, &PortExtras::default())
}

/// [`object_version`] covering the Service-derived `extras` too, which
/// also end up in the object (`spec.aliases`, `spec.appProtocols`); empty
/// extras are left out of the hashed JSON, so the version equals
/// [`object_version`]'s then.
pub fn version_with_extras(
    source: SourceKind,
    ports: &PortMap,
    owner_uid: Option<&str>,
    extras: &PortExtras,
) -> String {
    if ports.values().map(Vec::len).sum::<usize>() >= BIG_SERVICE_NODES {
        return version_of_digest(source, ports, &PortsDigest::of(ports), owner_uid, extras);
    }
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Canonical<'a> {
        source: SourceKind,
        ports: &'a PortMap,
        #[serde(skip_serializing_if = "Option::is_none")]
        owner_uid: Option<&'a str>,
        #[serde(skip_serializing_if = "PortExtras::is_empty")]
        extras: &'a PortExtras,
    }
    // Serializing plain structs, strings and integers into a Vec cannot fail;
    // fall back to the Debug form rather than panicking if it ever did.
    let bytes = serde_json::to_vec(&Canonical {
        source,
        ports,
        owner_uid,
        extras,
    })
    .unwrap_or_else(|_| format!("{source:?}{ports:?}{owner_uid:?}{extras:?}").into_bytes());
    let digest = Sha256::digest(&bytes);
    // The first 16 hex characters of the digest, as a 16-byte allocation
    // (encoding all 32 bytes and truncating kept a 64-byte one per service).
    hex::encode(&digest[..8])
}

/// From this many nodes on (all port keys together) a service's version is
/// [`version_of_digest`] over its [`PortsDigest`] instead of the hash of its
/// whole JSON: the index keeps the digest of a big service up to date per
/// changed node (`convert::MergeState`), so one endpoint change in a
/// 100,000-endpoint service costs no re-serialization of 100,000 nodes
/// (issue 19, item 2). Below it nothing changes: every small service keeps
/// the version it always had (and the golden files theirs).
pub const BIG_SERVICE_NODES: usize = 4096;

/// An order-independent hash of the nodes of a [`PortMap`] that can be
/// updated per node: the sum modulo 2^128 of one SHA-256-derived 128-bit
/// value per `(port key, node)` (AdHash), plus the node count.
///
/// Why this is as collision-safe as the version needs: a version only
/// decides whether content differs from what was written (equal versions
/// skip a write). For content that is not built to collide, two different
/// node sets give the same sum with probability 2^-128, far below the 2^-64
/// at which the 16 hex characters of any version collide. A set CHOSEN to
/// collide is cheaper to find for an additive hash than for SHA-256
/// (generalized birthday), but choosing nodes means writing EndpointSlices
/// of the service (pod IPs are assigned by the cluster), and whoever can do
/// that already decides the service's nodes: a collision would only keep
/// the previous content that they wrote, too. The shard versions readers
/// compare (`shards::shard_version`) stay plain SHA-256 of the content.
///
/// A node set never holds one `(port key, host, port)` twice (the merge
/// de-duplicates), so a sum of distinct elements is all there is to it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortsDigest {
    sum: u128,
    nodes: usize,
}

impl PortsDigest {
    /// The digest of every node of `ports` (O(nodes); kept per node by
    /// [`Buckets`]). Summed directly: going through [`Buckets::of`] would
    /// allocate and fill 4,096 buckets only to read their total.
    pub fn of(ports: &PortMap) -> Self {
        let mut d = Self::default();
        for (key, nodes) in ports {
            for n in nodes {
                d.add_element(element_hash(key, &node_json(n)));
            }
        }
        d
    }

    /// An element of [`element_hash`] joined the set.
    pub(crate) fn add_element(&mut self, h: u128) {
        self.sum = self.sum.wrapping_add(h);
        self.nodes = self.nodes.saturating_add(1);
    }

    /// An element of [`element_hash`] left the set.
    pub(crate) fn remove_element(&mut self, h: u128) {
        self.sum = self.sum.wrapping_sub(h);
        self.nodes = self.nodes.saturating_sub(1);
    }

    /// The union of two disjoint sets.
    pub(crate) fn merge(&mut self, other: &PortsDigest) {
        self.sum = self.sum.wrapping_add(other.sum);
        self.nodes = self.nodes.saturating_add(other.nodes);
    }

    /// How many nodes the set holds.
    pub fn nodes(&self) -> usize {
        self.nodes
    }
}

/// The JSON of `node` as written into objects (its `Debug` form if that
/// ever failed: still a function of the node, so digests stay consistent).
pub(crate) fn node_json(node: &Node) -> Vec<u8> {
    serde_json::to_vec(node).unwrap_or_else(|_| format!("{node:?}").into_bytes())
}

/// 128 bits of SHA-256 over the port key and the node's JSON ([`node_json`]:
/// what the object carries, so any change a reader can see changes it).
pub(crate) fn element_hash(key: &str, json: &[u8]) -> u128 {
    let mut h = Sha256::new();
    h.update(key.as_bytes());
    h.update([0u8]);
    h.update(json);
    let d = h.finalize();
    let mut first = [0u8; 16];
    first.copy_from_slice(&d[..16]);
    u128::from_le_bytes(first)
}

/// The version of a big service (see [`BIG_SERVICE_NODES`]): 16 hex of
/// SHA-256 over a marker, the source, the port keys (a port without nodes
/// is content too), the node digest, the owner UID and the extras.
/// `digest` must be [`PortsDigest::of`] `ports` (the index passes the one it
/// keeps up to date instead of recomputing it).
pub fn version_of_digest(
    source: SourceKind,
    ports: &PortMap,
    digest: &PortsDigest,
    owner_uid: Option<&str>,
    extras: &PortExtras,
) -> String {
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Canonical<'a> {
        scheme: &'static str,
        source: SourceKind,
        port_keys: Vec<&'a String>,
        node_digest: String,
        node_count: usize,
        #[serde(skip_serializing_if = "Option::is_none")]
        owner_uid: Option<&'a str>,
        #[serde(skip_serializing_if = "PortExtras::is_empty")]
        extras: &'a PortExtras,
    }
    let canonical = Canonical {
        scheme: "adhash128",
        source,
        port_keys: ports.keys().collect(),
        node_digest: format!("{:032x}", digest.sum),
        node_count: digest.nodes,
        owner_uid,
        extras,
    };
    let bytes = serde_json::to_vec(&canonical)
        .unwrap_or_else(|_| format!("{source:?}{ports:?}{owner_uid:?}{extras:?}").into_bytes());
    hex::encode(&Sha256::digest(&bytes)[..8])
}
