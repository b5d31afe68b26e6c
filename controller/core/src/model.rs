//! Domain types shared by every part of kube-discovery: which service
//! ([`ServiceKey`]), what it resolves to ([`Node`], [`PortMap`], [`ServiceNodes`]),
//! and how a gateway names a lookup ([`NodeQuery`], [`parse_service_name`]).
//!
//! There is no Kubernetes client in here; the node shape is APISIX's
//! `{host, port, weight}` and only grows optional fields (`zone`, `nodeName`,
//! `targetRef`, `draining`) that are omitted from JSON when unset, so the
//! serialized nodes of a default configuration are byte-compatible with what
//! APISIX keeps in its shared dictionary.
//!
//! ```text
//!   Endpoints / EndpointSlices ──convert──▶ PortMap ──index──▶ ServiceNodes{key, ports, version}
//!                                                               │
//!   "ns/name:port" ──parse_service_name──▶ NodeQuery ──lookup───┘──▶ [Node]
//! ```

use std::borrow::Borrow;
use std::collections::BTreeMap;
use std::fmt;

use compact_str::CompactString;
use litemap::LiteMap;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Identity of one source Service. `cluster` is the APISIX multi-cluster `id`
/// (empty in single-cluster mode).
///
/// The parts are [`CompactString`]s: a key is held several times per service
/// (index, desired state, slice bookkeeping), and namespaces and names of up
/// to 24 bytes then need no allocation of their own.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
pub struct ServiceKey {
    /// Cluster id, `""` in single-cluster mode.
    pub cluster: CompactString,
    /// Namespace of the source Service.
    pub namespace: CompactString,
    /// Name of the source Service.
    pub name: CompactString,
}

impl ServiceKey {
    /// Builds a key.
    pub fn new(
        cluster: impl Into<CompactString>,
        namespace: impl Into<CompactString>,
        name: impl Into<CompactString>,
    ) -> Self {
        Self {
            cluster: cluster.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }
}

impl fmt::Display for ServiceKey {
    /// `ns/name` (single cluster) or `id/ns/name` (multi cluster), the APISIX
    /// service name without the `:port` suffix.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.cluster.is_empty() {
            write!(f, "{}/{}", self.namespace, self.name)
        } else {
            write!(f, "{}/{}/{}", self.cluster, self.namespace, self.name)
        }
    }
}

/// Reference to the object behind an endpoint (usually a Pod), filled only
/// when topology output is enabled.
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct NodeTargetRef {
    /// Kind of the referenced object, e.g. `Pod`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    /// Namespace of the referenced object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name of the referenced object.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// UID of the referenced object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

/// One upstream node, APISIX shape `{host, port, weight}` plus optional extras.
///
/// Memory layout (one `Node` is kept per endpoint and port, at 100,000
/// endpoints this is the biggest single item of the controller): the host is
/// a [`CompactString`] (IPv4 and IPv6 addresses, up to 24 bytes, are stored
/// inline without a heap allocation), and the three topology fields, set only
/// with topology output, share ONE optional box ([`NodeTopology`]). That keeps
/// the node at 48 bytes with no allocation of its own (a unit test holds it
/// there; BENCHMARKS.md has the measured effect).
///
/// The JSON is the flat shape it always was (`host, port, weight, zone,
/// nodeName, targetRef, draining`, the optional ones absent when unset):
/// `Serialize` is written by hand in that field order, `Deserialize` and the
/// JSON schema go through the private flat `NodeWire`, whose schema is named
/// `Node` and carries the field docs, so the CRD schema is unchanged.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(from = "NodeWire")]
pub struct Node {
    /// IPv4 / IPv6 address or FQDN.
    pub host: CompactString,
    /// Port number (1..=65535).
    pub port: i32,
    /// Load-balancing weight (the configured `default_weight`).
    pub weight: u32,
    /// Zone, node name and target of the endpoint (topology output only);
    /// `None` whenever all three are unset, so equality and order are those
    /// of the flat fields (derived `Ord` compares `None` < `Some`, and an
    /// all-unset topology is never boxed).
    topology: Option<Box<NodeTopology>>,
    /// `true` when this node is a serving-but-terminating endpoint (opt-in
    /// `drain_terminating`: `true` uses them when the port has no ready
    /// endpoint; `always` publishes them next to the ready ones with weight 0).
    pub draining: Option<bool>,
}

/// The topology extras of a [`Node`] (see [`Node::topology`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeTopology {
    /// Topology zone of the endpoint.
    pub zone: Option<String>,
    /// Kubernetes node hosting the endpoint.
    pub node_name: Option<String>,
    /// Object behind the endpoint.
    pub target_ref: Option<NodeTargetRef>,
}

impl NodeTopology {
    /// Whether no field is set.
    pub fn is_empty(&self) -> bool {
        self.zone.is_none() && self.node_name.is_none() && self.target_ref.is_none()
    }

    /// `Some(boxed)` unless empty: the one place a topology gets boxed, so
    /// an empty one is never stored.
    pub fn boxed(self) -> Option<Box<NodeTopology>> {
        (!self.is_empty()).then(|| Box::new(self))
    }
}

// The flat JSON form of a [`Node`]: what `Deserialize` reads and what the
// JSON schema (named `Node`) describes. Its doc comment below is the schema's
// description (plain comments here, so they stay out of the CRD).
#[derive(Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(rename = "Node")]
/// One upstream node, APISIX shape `{host, port, weight}` plus optional extras.
struct NodeWire {
    /// IPv4 / IPv6 address or FQDN.
    #[schemars(with = "String")]
    host: CompactString,
    /// Port number (1..=65535).
    #[schemars(range(min = 1, max = 65535))]
    port: i32,
    /// Load-balancing weight (the configured `default_weight`).
    weight: u32,
    /// Topology zone of the endpoint (topology output only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    zone: Option<String>,
    /// Kubernetes node hosting the endpoint (topology output only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    node_name: Option<String>,
    /// Object behind the endpoint (topology output only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    target_ref: Option<NodeTargetRef>,
    /// `true` when this node is a serving-but-terminating endpoint (opt-in
    /// `drain_terminating`: `true` uses them when the port has no ready
    /// endpoint; `always` publishes them next to the ready ones with weight 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    draining: Option<bool>,
}

impl From<NodeWire> for Node {
    fn from(w: NodeWire) -> Self {
        Self {
            host: w.host,
            port: w.port,
            weight: w.weight,
            topology: NodeTopology {
                zone: w.zone,
                node_name: w.node_name,
                target_ref: w.target_ref,
            }
            .boxed(),
            draining: w.draining,
        }
    }
}

impl Serialize for Node {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let zone = self.zone();
        let node_name = self.node_name();
        let target_ref = self.target_ref();
        let len = 3
            + usize::from(zone.is_some())
            + usize::from(node_name.is_some())
            + usize::from(target_ref.is_some())
            + usize::from(self.draining.is_some());
        let mut st = serializer.serialize_struct("Node", len)?;
        st.serialize_field("host", self.host.as_str())?;
        st.serialize_field("port", &self.port)?;
        st.serialize_field("weight", &self.weight)?;
        match zone {
            Some(z) => st.serialize_field("zone", z)?,
            None => st.skip_field("zone")?,
        }
        match node_name {
            Some(n) => st.serialize_field("nodeName", n)?,
            None => st.skip_field("nodeName")?,
        }
        match target_ref {
            Some(t) => st.serialize_field("targetRef", t)?,
            None => st.skip_field("targetRef")?,
        }
        match self.draining {
            Some(d) => st.serialize_field("draining", &d)?,
            None => st.skip_field("draining")?,
        }
        st.end()
    }
}

impl JsonSchema for Node {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        NodeWire::schema_name()
    }

    fn schema_id() -> std::borrow::Cow<'static, str> {
        NodeWire::schema_id()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        NodeWire::json_schema(generator)
    }
}

impl Node {
    /// A plain APISIX node without extras.
    pub fn new(host: impl Into<CompactString>, port: i32, weight: u32) -> Self {
        Self {
            host: host.into(),
            port,
            weight,
            topology: None,
            draining: None,
        }
    }

    /// This node with `topology` (stored only when some field is set).
    #[must_use]
    pub fn with_topology(mut self, topology: NodeTopology) -> Self {
        self.topology = topology.boxed();
        self
    }

    /// This node with an already boxed topology (shared by the converters,
    /// which keep one box per endpoint and clone it per port); an empty one
    /// is dropped.
    #[must_use]
    pub fn with_boxed_topology(mut self, topology: Option<Box<NodeTopology>>) -> Self {
        self.topology = topology.filter(|t| !t.is_empty());
        self
    }

    /// The topology extras, `None` when none is set.
    pub fn topology(&self) -> Option<&NodeTopology> {
        self.topology.as_deref()
    }

    /// Topology zone of the endpoint (topology output only).
    pub fn zone(&self) -> Option<&str> {
        self.topology()?.zone.as_deref()
    }

    /// Kubernetes node hosting the endpoint (topology output only).
    pub fn node_name(&self) -> Option<&str> {
        self.topology()?.node_name.as_deref()
    }

    /// Object behind the endpoint (topology output only).
    pub fn target_ref(&self) -> Option<&NodeTargetRef> {
        self.topology()?.target_ref.as_ref()
    }

    /// Sets the zone (`None` clears it).
    pub fn set_zone(&mut self, zone: Option<String>) {
        self.update_topology(|t| t.zone = zone);
    }

    /// Sets the node name (`None` clears it).
    pub fn set_node_name(&mut self, node_name: Option<String>) {
        self.update_topology(|t| t.node_name = node_name);
    }

    /// Sets the target reference (`None` clears it).
    pub fn set_target_ref(&mut self, target_ref: Option<NodeTargetRef>) {
        self.update_topology(|t| t.target_ref = target_ref);
    }

    /// Applies `f` to the topology and keeps the "no empty box" rule.
    fn update_topology(&mut self, f: impl FnOnce(&mut NodeTopology)) {
        let mut t = self.topology.take().map(|b| *b).unwrap_or_default();
        f(&mut t);
        self.topology = t.boxed();
    }
}

/// Port key -> nodes, nodes sorted by host then port.
///
/// A map sorted by key, like the `BTreeMap` it replaces, so the JSON (and
/// therefore the version hash) stays deterministic, but stored as ONE sorted
/// vector ([`LiteMap`]): a service has one to a few port keys, too few to
/// pay for a B-tree's leaf node per map (BENCHMARKS.md has the measured
/// effect).
/// The API is the subset of `BTreeMap`'s that the code uses, with the same
/// names and semantics (later duplicates win in `collect`/`insert`). The JSON
/// is an object in key order (also when empty), read from any key order; the
/// JSON schema is the `BTreeMap<String, Vec<Node>>` one, so the CRD is
/// unchanged.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct PortMap(LiteMap<String, Vec<Node>>);

impl PortMap {
    /// An empty map (no allocation).
    pub fn new() -> Self {
        Self(LiteMap::new_vec())
    }

    /// Number of port keys.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there is no port key.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The nodes of `port`.
    pub fn get<Q>(&self, port: &Q) -> Option<&Vec<Node>>
    where
        String: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.0.get(port)
    }

    /// The nodes of `port`, mutable.
    pub fn get_mut<Q>(&mut self, port: &Q) -> Option<&mut Vec<Node>>
    where
        String: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.0.get_mut(port)
    }

    /// Whether `port` is a key.
    pub fn contains_key<Q>(&self, port: &Q) -> bool
    where
        String: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.0.contains_key(port)
    }

    /// Sets the nodes of `port`, returning the previous ones.
    pub fn insert(&mut self, port: String, nodes: Vec<Node>) -> Option<Vec<Node>> {
        self.0.insert(port, nodes)
    }

    /// Removes `port`, returning its nodes.
    pub fn remove<Q>(&mut self, port: &Q) -> Option<Vec<Node>>
    where
        String: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.0.remove(port)
    }

    /// The entry of `port` (e.g. `.entry(k).or_default().push(node)`).
    pub fn entry(&mut self, port: String) -> PortMapEntry<'_> {
        self.0.entry(port)
    }

    /// Removes every port key.
    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// Keeps the port keys for which `keep` returns `true`.
    pub fn retain(&mut self, mut keep: impl FnMut(&String, &Vec<Node>) -> bool) {
        self.0.retain(|k, v| keep(k, v));
    }

    /// `(port, nodes)` in key order.
    pub fn iter(&self) -> PortMapIter<'_> {
        self.0.as_slice().iter().map(pair)
    }

    /// `(port, nodes)` in key order, nodes mutable.
    pub fn iter_mut(
        &mut self,
    ) -> impl DoubleEndedIterator<Item = (&String, &mut Vec<Node>)> + ExactSizeIterator {
        self.0.iter_mut()
    }

    /// Port keys in order.
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &String> + ExactSizeIterator {
        self.0.keys()
    }

    /// Node lists in key order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &Vec<Node>> + ExactSizeIterator {
        self.0.values()
    }

    /// Node lists in key order, mutable.
    pub fn values_mut(
        &mut self,
    ) -> impl DoubleEndedIterator<Item = &mut Vec<Node>> + ExactSizeIterator {
        self.0.iter_mut().map(|(_, v)| v)
    }

    /// Drops spare capacity of the map and of every node list (for values
    /// that are kept for long, e.g. in the index).
    pub fn shrink_to_fit(&mut self) {
        let mut entries = std::mem::take(&mut self.0).into_tuple_vec();
        entries.shrink_to_fit();
        for (_, nodes) in &mut entries {
            nodes.shrink_to_fit();
        }
        // Taken from a LiteMap: still sorted and without duplicates.
        self.0 = LiteMap::from_sorted_store_unchecked(entries);
    }
}

impl fmt::Debug for PortMap {
    /// As a map, like the `BTreeMap` it replaces.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl FromIterator<(String, Vec<Node>)> for PortMap {
    /// Sorted by key; of duplicate keys the last wins (as for `BTreeMap`).
    /// At its exact size: `Vec::extend` reserves at least 4 entries, and the
    /// usual service has one port key.
    fn from_iter<I: IntoIterator<Item = (String, Vec<Node>)>>(iter: I) -> Self {
        let mut entries = LiteMap::<String, Vec<Node>>::from_iter(iter).into_tuple_vec();
        entries.shrink_to_fit();
        // Taken from a LiteMap: sorted and without duplicates.
        Self(LiteMap::from_sorted_store_unchecked(entries))
    }
}

impl<const N: usize> From<[(String, Vec<Node>); N]> for PortMap {
    fn from(entries: [(String, Vec<Node>); N]) -> Self {
        entries.into_iter().collect()
    }
}

impl Extend<(String, Vec<Node>)> for PortMap {
    fn extend<I: IntoIterator<Item = (String, Vec<Node>)>>(&mut self, iter: I) {
        self.0.extend(iter);
    }
}

impl IntoIterator for PortMap {
    type Item = (String, Vec<Node>);
    type IntoIter = std::vec::IntoIter<(String, Vec<Node>)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_tuple_vec().into_iter()
    }
}

/// An entry of a [`PortMap`] ([`PortMap::entry`]).
pub type PortMapEntry<'a> = litemap::Entry<'a, String, Vec<Node>, Vec<(String, Vec<Node>)>>;

/// Iterator over `(port, nodes)` of a [`PortMap`], in key order.
pub type PortMapIter<'a> = std::iter::Map<
    std::slice::Iter<'a, (String, Vec<Node>)>,
    fn(&'a (String, Vec<Node>)) -> (&'a String, &'a Vec<Node>),
>;

fn pair(entry: &(String, Vec<Node>)) -> (&String, &Vec<Node>) {
    (&entry.0, &entry.1)
}

impl<'a> IntoIterator for &'a PortMap {
    type Item = (&'a String, &'a Vec<Node>);
    type IntoIter = PortMapIter<'a>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<Q> std::ops::Index<&Q> for PortMap
where
    String: Borrow<Q>,
    Q: Ord + ?Sized,
{
    type Output = Vec<Node>;

    /// The nodes of `port`; panics when absent, like `BTreeMap` (tests and
    /// lookups of keys known to exist).
    fn index(&self, port: &Q) -> &Vec<Node> {
        match self.0.get(port) {
            Some(nodes) => nodes,
            None => panic!("no such port key in PortMap"),
        }
    }
}

impl Serialize for PortMap {
    /// A JSON object in key order, `{}` when empty (LiteMap's own impl would
    /// write an empty map as `[]`).
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for PortMap {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MapVisitor;
        impl<'de> serde::de::Visitor<'de> for MapVisitor {
            type Value = PortMap;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of port key to a list of nodes")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut access: A,
            ) -> Result<PortMap, A::Error> {
                // Keys usually come sorted (we write them so): then every
                // insert is an append.
                let mut map = LiteMap::with_capacity(access.size_hint().unwrap_or(0).min(1024));
                while let Some((port, nodes)) = access.next_entry::<String, Vec<Node>>()? {
                    map.insert(port, nodes);
                }
                Ok(PortMap(map))
            }
        }
        deserializer.deserialize_map(MapVisitor)
    }
}

impl JsonSchema for PortMap {
    fn inline_schema() -> bool {
        <BTreeMap<String, Vec<Node>>>::inline_schema()
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        <BTreeMap<String, Vec<Node>>>::schema_name()
    }

    fn schema_id() -> std::borrow::Cow<'static, str> {
        <BTreeMap<String, Vec<Node>>>::schema_id()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        <BTreeMap<String, Vec<Node>>>::json_schema(generator)
    }
}

/// Sorts nodes the way APISIX does (host, then port) and breaks remaining ties
/// on the other fields so the order is total.
pub fn sort_nodes(nodes: &mut [Node]) {
    nodes.sort_by(|a, b| {
        (&a.host, a.port)
            .cmp(&(&b.host, b.port))
            .then_with(|| a.cmp(b))
    });
}

/// Which Kubernetes resource the nodes were read from.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    JsonSchema,
    Default,
)]
pub enum SourceKind {
    /// `v1/Endpoints` (APISIX default, deprecated since Kubernetes 1.33).
    #[default]
    Endpoints,
    /// `discovery.k8s.io/v1/EndpointSlice`.
    EndpointSlice,
}

impl SourceKind {
    /// The serialized name (`Endpoints` / `EndpointSlice`).
    pub fn as_str(self) -> &'static str {
        match self {
            SourceKind::Endpoints => "Endpoints",
            SourceKind::EndpointSlice => "EndpointSlice",
        }
    }
}

impl fmt::Display for SourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The desired state of one service: everything a sink needs to write it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceNodes {
    /// Which service.
    pub key: ServiceKey,
    /// Which resource kind the nodes came from.
    pub source: SourceKind,
    /// Port key -> sorted nodes.
    pub ports: PortMap,
    /// UID of the source Service, when known (from ownerReferences).
    pub owner_uid: Option<String>,
    /// [`object_version`] of `source` + `ports` + `owner_uid` (equals
    /// [`content_version`] when the owner is unknown), and `extras` when
    /// there are any ([`ServiceNodes::with_extras`]), mixed with `skipped`
    /// when there is any ([`ServiceNodes::with_skipped`]).
    pub version: String,
    /// What the conversion skipped of this service's source objects (one
    /// warning per skipped item, naming the object and the field; see
    /// `convert`). It feeds the written object's `Degraded` condition
    /// (`crd::conditions`), so it is part of `version`: a service whose
    /// nodes stay the same but whose skipped data changes is written again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<String>,
    /// Service-port aliases and appProtocols derived from the Service
    /// (empty when it is unknown); see [`crate::service`].
    #[serde(default, skip_serializing_if = "PortExtras::is_empty")]
    pub extras: PortExtras,
    /// What the index keeps up to date of a big service's nodes, per node
    /// bucket ([`Buckets`]): its digest (the version) and
    /// what the shard count, the shard versions and the one-object check
    /// need, so that writing one change does not hash or measure every node
    /// again. Derived from `ports` (never serialized, never compared: equal
    /// ports give equal buckets); absent, the writer derives it itself.
    #[serde(skip)]
    pub buckets: SharedBuckets,
}

/// [`ServiceNodes::buckets`]: shared between the index and the values it
/// hands out, copied only when a change meets a value still held.
#[derive(Clone, Default)]
pub struct SharedBuckets(pub Option<std::sync::Arc<Buckets>>);

impl fmt::Debug for SharedBuckets {
    /// Not the 4,096 buckets: derived data, like equality (below).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SharedBuckets")
    }
}

impl PartialEq for SharedBuckets {
    /// Always: the buckets are a function of the ports they sit next to.
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for SharedBuckets {}

impl ServiceNodes {
    /// Builds the value and computes its version.
    pub fn new(
        key: ServiceKey,
        source: SourceKind,
        ports: PortMap,
        owner_uid: Option<String>,
    ) -> Self {
        let version = object_version(source, &ports, owner_uid.as_deref());
        Self {
            key,
            source,
            ports,
            owner_uid,
            version,
            skipped: Vec::new(),
            extras: PortExtras::default(),
            buckets: SharedBuckets::default(),
        }
    }

    /// The same service with the conversion warnings `skipped` (see the
    /// field), its version recomputed. With none, the version is the one
    /// without them, so services without skipped data keep the versions
    /// they always had; with some, it is the hash of that version and the
    /// warnings.
    #[must_use]
    pub fn with_skipped(mut self, skipped: Vec<String>) -> Self {
        self.skipped = skipped;
        self.recompute_version();
        self
    }

    /// This value with `extras`, its version recomputed. Empty extras hash
    /// to the version [`ServiceNodes::new`] gives, so a service whose
    /// Service adds nothing keeps the version (and object) it always had.
    #[must_use]
    pub fn with_extras(mut self, extras: PortExtras) -> Self {
        self.extras = extras;
        self.recompute_version();
        self
    }

    /// `version` from everything it covers: nodes, source, owner, extras,
    /// then the skipped data and unresolved Service ports when there are any (in whichever order
    /// [`ServiceNodes::with_extras`] and [`ServiceNodes::with_skipped`] are
    /// called).
    fn recompute_version(&mut self) {
        self.version = version_with_extras(
            self.source,
            &self.ports,
            self.owner_uid.as_deref(),
            &self.extras,
        );
        self.mix_skipped();
    }

    /// Mixes the skipped data and unresolved Service ports into `version`.
    fn mix_skipped(&mut self) {
        // Not written to the object's spec, but to its conditions: a change
        // of either must change the version, or the object is not rewritten.
        if !self.skipped.is_empty() || !self.extras.unresolved.is_empty() {
            let mut h = Sha256::new();
            h.update(self.version.as_bytes());
            for w in &self.skipped {
                h.update(b"\0");
                h.update(w.as_bytes());
            }
            for u in &self.extras.unresolved {
                h.update(b"\x01");
                h.update(u.as_bytes());
            }
            self.version = hex::encode(&h.finalize()[..8]);
        }
    }

    /// The value [`ServiceNodes::new`], [`ServiceNodes::with_extras`] and
    /// [`ServiceNodes::with_skipped`] give, with ONE hash of the service
    /// instead of three; with `buckets` ([`Buckets::of`]
    /// `ports`, kept up to date by the caller) a big service's
    /// ([`BIG_SERVICE_NODES`]) version comes from their digest, so none of
    /// its nodes is hashed again.
    pub fn with_buckets(
        key: ServiceKey,
        source: SourceKind,
        ports: PortMap,
        owner_uid: Option<String>,
        extras: PortExtras,
        skipped: Vec<String>,
        buckets: Option<Buckets>,
    ) -> Self {
        let mut s = Self {
            key,
            source,
            ports,
            owner_uid,
            version: String::new(),
            skipped,
            extras,
            buckets: SharedBuckets(buckets.map(std::sync::Arc::new)),
        };
        s.refresh_version();
        s
    }

    /// Recomputes `version` after `ports` (and `buckets` with them), owner,
    /// extras or skipped changed in place.
    pub fn refresh_version(&mut self) {
        let Some(digest) = self
            .buckets
            .0
            .as_ref()
            .map(|b| *b.digest())
            .filter(|d| d.nodes() >= BIG_SERVICE_NODES)
        else {
            self.recompute_version();
            return;
        };
        self.version = version_of_digest(
            self.source,
            &self.ports,
            &digest,
            self.owner_uid.as_deref(),
            &self.extras,
        );
        self.mix_skipped();
    }

    /// The nodes of `port`: a port key, else a Service-port alias
    /// ([`PortExtras::resolve`]); `None` when neither.
    pub fn nodes(&self, port: &str) -> Option<&Vec<Node>> {
        self.ports.get(self.extras.resolve(&self.ports, port)?)
    }

    /// Total number of nodes over all port keys.
    pub fn node_count(&self) -> usize {
        self.ports.values().map(Vec::len).sum()
    }
}

/// Per-port data derived from the Service (see `crate::service`). Empty when
/// the Service is unknown or gives nothing beyond the port keys.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PortExtras {
    /// Service-port name or number -> the port key holding its nodes.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub aliases: BTreeMap<String, String>,
    /// Port key -> `appProtocol` of its Service port.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub app_protocols: BTreeMap<String, String>,
    /// Service ports whose target has no port key (not written to objects).
    #[serde(skip)]
    pub unresolved: Vec<String>,
}

impl PortExtras {
    /// Whether there are no aliases and no appProtocols (what objects carry).
    pub fn is_empty(&self) -> bool {
        self.aliases.is_empty() && self.app_protocols.is_empty()
    }

    /// The port key `port` names: itself when it is a key of `ports`, else
    /// its alias target; `None` when neither. The one rule every reader uses.
    pub fn resolve<'a>(&'a self, ports: &PortMap, port: &'a str) -> Option<&'a str> {
        if ports.contains_key(port) {
            return Some(port);
        }
        self.aliases
            .get(port)
            .map(String::as_str)
            .filter(|k| ports.contains_key(*k))
    }
}

/// A parsed gateway lookup `[id/]ns/name:port`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct NodeQuery {
    /// Cluster id, `""` for the single-cluster form.
    pub cluster: String,
    /// Namespace.
    pub namespace: String,
    /// Service name.
    pub name: String,
    /// Port key (port name, targetPort or number as string).
    pub port: String,
}

impl NodeQuery {
    /// The service this query is about.
    pub fn key(&self) -> ServiceKey {
        ServiceKey::new(&self.cluster, &self.namespace, &self.name)
    }
}

impl fmt::Display for NodeQuery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.key(), self.port)
    }
}

/// Why a service name could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// No `:` at all.
    #[error("service name {0:?} is missing ':<port>' (expected [id/]namespace/name:port)")]
    MissingPort(String),
    /// A part is empty.
    #[error("service name {input:?} has an empty {part} (expected [id/]namespace/name:port)")]
    EmptyPart {
        /// The input.
        input: String,
        /// Which part (`port`, `namespace`, `name`, `cluster id`).
        part: &'static str,
    },
    /// Not one or two `/` before the port.
    #[error("service name {0:?} must have the form namespace/name:port or id/namespace/name:port")]
    BadShape(String),
    /// Whitespace or control characters.
    #[error("service name {0:?} contains whitespace or control characters")]
    BadCharacters(String),
}

/// Parses an APISIX service name.
///
/// APISIX splits single-cluster names with `^(.*):(.*)$` (`ns/name:port`) and
/// multi-cluster names with `^(.*)/(.*/.*):(.*)$` (`id/ns/name:port`). Since
/// Kubernetes names can contain neither `/` nor `:`, we split on the LAST `:`
/// and then count the slashes: one means single cluster, two means multi
/// cluster; anything else is an error with a message saying what is wrong.
pub fn parse_service_name(s: &str) -> Result<NodeQuery, ParseError> {
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(ParseError::BadCharacters(s.to_string()));
    }
    let (svc, port) = s
        .rsplit_once(':')
        .ok_or_else(|| ParseError::MissingPort(s.to_string()))?;
    let empty = |part| ParseError::EmptyPart {
        input: s.to_string(),
        part,
    };
    if port.is_empty() {
        return Err(empty("port"));
    }
    let parts: Vec<&str> = svc.split('/').collect();
    let (cluster, namespace, name) = match parts.as_slice() {
        [ns, name] => ("", *ns, *name),
        [id, ns, name] => {
            if id.is_empty() {
                return Err(empty("cluster id"));
            }
            (*id, *ns, *name)
        }
        _ => return Err(ParseError::BadShape(s.to_string())),
    };
    if namespace.is_empty() {
        return Err(empty("namespace"));
    }
    if name.is_empty() {
        return Err(empty("name"));
    }
    Ok(NodeQuery {
        cluster: cluster.to_string(),
        namespace: namespace.to_string(),
        name: name.to_string(),
        port: port.to_string(),
    })
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_key_display_single_and_multi() {
        assert_eq!(
            ServiceKey::new("", "default", "web").to_string(),
            "default/web"
        );
        assert_eq!(
            ServiceKey::new("c1", "default", "web").to_string(),
            "c1/default/web"
        );
    }

    /// Keys are kept several times per service (index, desired state,
    /// slices): typical names live inside the key, and the JSON is the same
    /// strings as before.
    #[test]
    fn service_key_is_inline_and_serializes_as_strings() {
        let k = ServiceKey::new("", "default", "svc-1234");
        assert!(!k.namespace.is_heap_allocated() && !k.name.is_heap_allocated());
        let json = r#"{"cluster":"","namespace":"default","name":"svc-1234"}"#;
        assert_eq!(serde_json::to_string(&k).unwrap(), json);
        assert_eq!(serde_json::from_str::<ServiceKey>(json).unwrap(), k);
        // Order is the string order (BTreeMap keys, merge order).
        assert!(ServiceKey::new("", "a", "b") < ServiceKey::new("", "a", "ba"));
        let long = "n".repeat(63);
        assert_eq!(ServiceKey::new("", &long, "x").namespace, long);
    }

    #[test]
    fn node_serializes_as_apisix_shape_without_extras() {
        let n = Node::new("10.0.0.1", 80, 50);
        assert_eq!(
            serde_json::to_string(&n).unwrap(),
            r#"{"host":"10.0.0.1","port":80,"weight":50}"#
        );
        let mut n = n;
        n.set_zone(Some("z1".into()));
        n.set_node_name(Some("n1".into()));
        n.draining = Some(true);
        let v = serde_json::to_value(&n).unwrap();
        assert_eq!(v["zone"], "z1");
        assert_eq!(v["nodeName"], "n1");
        assert_eq!(v["draining"], true);
        let back: Node = serde_json::from_value(v).unwrap();
        assert_eq!(back, n);
    }

    /// The layout goal of issue 6: a node is at most 48 bytes, and typical
    /// IPv4/IPv6 hosts live inside it (no heap allocation of their own).
    #[test]
    fn node_is_small_and_ip_hosts_are_inline() {
        assert!(
            std::mem::size_of::<Node>() <= 48,
            "Node is {} bytes",
            std::mem::size_of::<Node>()
        );
        for host in [
            "10.0.0.1",
            "255.255.255.255",
            "fd00::1",
            "fd00:10:244:1::a3",
            "2001:db8:85a3::8a2e:370",
        ] {
            assert!(
                !Node::new(host, 80, 1).host.is_heap_allocated(),
                "{host} is on the heap"
            );
        }
        // A long FQDN still works (on the heap).
        let fqdn = "a-rather-long-service-name.namespace.svc.cluster.local";
        assert_eq!(Node::new(fqdn, 80, 1).host, fqdn);
    }

    /// Byte-exact JSON, field order `host, port, weight, zone, nodeName,
    /// targetRef, draining` as the flat struct had it, and back.
    #[test]
    fn node_json_round_trip_with_and_without_topology() {
        let plain = Node::new("fd00::1", 8080, 1);
        let json = r#"{"host":"fd00::1","port":8080,"weight":1}"#;
        assert_eq!(serde_json::to_string(&plain).unwrap(), json);
        assert_eq!(serde_json::from_str::<Node>(json).unwrap(), plain);
        assert!(plain.topology().is_none());

        let full = Node::new("10.0.0.1", 80, 50).with_topology(NodeTopology {
            zone: Some("z1".into()),
            node_name: Some("n1".into()),
            target_ref: Some(NodeTargetRef {
                kind: "Pod".into(),
                namespace: Some("ns".into()),
                name: "web-1".into(),
                uid: Some("u1".into()),
            }),
        });
        let mut full = full;
        full.draining = Some(true);
        let json = concat!(
            r#"{"host":"10.0.0.1","port":80,"weight":50,"zone":"z1","nodeName":"n1","#,
            r#""targetRef":{"kind":"Pod","namespace":"ns","name":"web-1","uid":"u1"},"#,
            r#""draining":true}"#
        );
        assert_eq!(serde_json::to_string(&full).unwrap(), json);
        assert_eq!(serde_json::from_str::<Node>(json).unwrap(), full);

        // One topology field alone, out of order on input: normalized output.
        let only_ref = serde_json::from_str::<Node>(
            r#"{"targetRef":{"name":"p"},"weight":1,"port":1,"host":"h"}"#,
        )
        .unwrap();
        assert_eq!((only_ref.zone(), only_ref.node_name()), (None, None));
        assert_eq!(
            serde_json::to_string(&only_ref).unwrap(),
            r#"{"host":"h","port":1,"weight":1,"targetRef":{"name":"p"}}"#
        );
        // Explicit nulls read as unset, and an all-unset topology is not kept,
        // so the node equals the plain one.
        let nulls: Node = serde_json::from_str(
            r#"{"host":"fd00::1","port":8080,"weight":1,"zone":null,"nodeName":null}"#,
        )
        .unwrap();
        assert_eq!(nulls, plain);
        // Missing required fields are named.
        let err = serde_json::from_str::<Node>(r#"{"host":"h","port":1}"#).unwrap_err();
        assert!(err.to_string().contains("weight"), "{err}");
    }

    /// The same content as a `PortMap` and as the `BTreeMap` it replaced
    /// serializes to the same bytes (so versions and objects are unchanged),
    /// including the empty map, and reads back from any key order.
    #[test]
    fn port_map_json_equals_btreemap_json() {
        let entries = [
            ("metrics".to_string(), vec![Node::new("10.0.0.2", 9090, 1)]),
            ("http".to_string(), vec![Node::new("10.0.0.1", 80, 1)]),
            ("80".to_string(), vec![]),
            ("grpc".to_string(), vec![Node::new("fd00::1", 81, 2)]),
        ];
        let bt: BTreeMap<String, Vec<Node>> = entries.clone().into_iter().collect();
        let pm: PortMap = entries.clone().into_iter().collect();
        let json = serde_json::to_string(&pm).unwrap();
        assert_eq!(json, serde_json::to_string(&bt).unwrap());
        assert!(json.starts_with(r#"{"80":[],"grpc":"#), "{json}");
        assert_eq!(
            pm.keys().map(String::as_str).collect::<Vec<_>>(),
            ["80", "grpc", "http", "metrics"]
        );
        assert_eq!(format!("{pm:?}"), format!("{bt:?}"));
        for source in [SourceKind::Endpoints, SourceKind::EndpointSlice] {
            #[derive(Serialize)]
            struct Canonical<'a> {
                source: SourceKind,
                ports: &'a BTreeMap<String, Vec<Node>>,
            }
            let bytes = serde_json::to_vec(&Canonical { source, ports: &bt }).unwrap();
            let want = hex::encode(Sha256::digest(&bytes))[..16].to_string();
            assert_eq!(content_version(source, &pm), want);
        }

        // Empty: an object, not LiteMap's `[]`.
        assert_eq!(serde_json::to_string(&PortMap::new()).unwrap(), "{}");
        assert_eq!(
            serde_json::from_str::<PortMap>("{}").unwrap(),
            PortMap::new()
        );

        // Unsorted input with a duplicate key: sorted, the last one wins.
        let back: PortMap = serde_json::from_str(
            r#"{"http":[],"80":[{"host":"h","port":1,"weight":1}],"http":[{"host":"h","port":2,"weight":1}]}"#,
        )
        .unwrap();
        assert_eq!(back.keys().collect::<Vec<_>>(), ["80", "http"]);
        assert_eq!(back["http"][0].port, 2);
        let bt_back: BTreeMap<String, Vec<Node>> = serde_json::from_str(
            r#"{"http":[],"80":[{"host":"h","port":1,"weight":1}],"http":[{"host":"h","port":2,"weight":1}]}"#,
        )
        .unwrap();
        assert_eq!(
            serde_json::to_string(&back).unwrap(),
            serde_json::to_string(&bt_back).unwrap()
        );
        // A list is not a port map.
        assert!(serde_json::from_str::<PortMap>("[]").is_err());
    }

    /// The BTreeMap operations the code relies on behave the same.
    #[test]
    fn port_map_behaves_like_the_btreemap() {
        let mut pm = PortMap::new();
        let mut bt = BTreeMap::new();
        for (k, port) in [("b", 1), ("a", 2), ("c", 3), ("a", 4)] {
            let n = vec![Node::new("h", port, 1)];
            assert_eq!(pm.insert(k.into(), n.clone()), bt.insert(k.to_string(), n));
        }
        pm.entry("d".into()).or_default().push(Node::new("h", 5, 1));
        bt.entry("d".to_string())
            .or_default()
            .push(Node::new("h", 5, 1));
        assert_eq!(pm.get("a"), bt.get("a"));
        assert_eq!(pm.contains_key("zz"), bt.contains_key("zz"));
        assert_eq!(pm.remove("b"), bt.remove("b"));
        assert_eq!(pm.len(), bt.len());
        pm.values_mut().for_each(|v| v[0].weight = 7);
        bt.values_mut().for_each(|v| v[0].weight = 7);
        assert!(pm.iter().eq(bt.iter()));
        assert!((&pm).into_iter().rev().eq(bt.iter().rev()));
        pm.shrink_to_fit();
        assert!(pm.clone().into_iter().eq(bt.clone()));
        pm.retain(|k, _| k != "c");
        bt.retain(|k, _| k != "c");
        assert!(pm.iter().eq(bt.iter()));
        pm.clear();
        assert!(pm.is_empty() && pm == PortMap::default());
    }

    /// The CRD schema of the spec's `ports` is the `BTreeMap` one.
    #[test]
    fn port_map_schema_is_the_btreemap_schema() {
        assert_eq!(
            schemars::schema_for!(PortMap),
            schemars::schema_for!(BTreeMap<String, Vec<Node>>)
        );
    }

    /// Setters keep the "no empty box" rule, so equality and order are those
    /// of the flat fields.
    #[test]
    fn topology_setters_normalize() {
        let mut n = Node::new("10.0.0.1", 80, 1);
        n.set_zone(Some("z".into()));
        assert_eq!(n.zone(), Some("z"));
        assert!(n > Node::new("10.0.0.1", 80, 1));
        n.set_zone(None);
        assert!(n.topology().is_none());
        assert_eq!(n, Node::new("10.0.0.1", 80, 1));
        let with_empty = Node::new("10.0.0.1", 80, 1).with_boxed_topology(Some(Box::default()));
        assert_eq!(with_empty, n);
        // Flat-field order: zone decides before nodeName.
        let mut a = Node::new("h", 1, 1);
        a.set_node_name(Some("zz".into()));
        let mut b = Node::new("h", 1, 1);
        b.set_zone(Some("a".into()));
        assert!(a < b);
    }

    #[test]
    fn source_kind_serde_names() {
        assert_eq!(
            serde_json::to_string(&SourceKind::Endpoints).unwrap(),
            r#""Endpoints""#
        );
        assert_eq!(
            serde_json::to_string(&SourceKind::EndpointSlice).unwrap(),
            r#""EndpointSlice""#
        );
    }

    #[test]
    fn parse_single_cluster() {
        let q = parse_service_name("default/plat-dev:port").unwrap();
        assert_eq!(q.cluster, "");
        assert_eq!(q.namespace, "default");
        assert_eq!(q.name, "plat-dev");
        assert_eq!(q.port, "port");
        assert_eq!(q.to_string(), "default/plat-dev:port");
    }

    #[test]
    fn parse_multi_cluster() {
        let q = parse_service_name("c1/default/web:8080").unwrap();
        assert_eq!(
            (
                q.cluster.as_str(),
                q.namespace.as_str(),
                q.name.as_str(),
                q.port.as_str()
            ),
            ("c1", "default", "web", "8080")
        );
        assert_eq!(q.to_string(), "c1/default/web:8080");
    }

    #[test]
    fn parse_errors_are_specific() {
        let msg = |s: &str| parse_service_name(s).unwrap_err().to_string();
        assert!(
            msg("default/web").contains("missing ':<port>'"),
            "{}",
            msg("default/web")
        );
        assert!(msg("default/web:").contains("empty port"));
        assert!(msg("/web:http").contains("empty namespace"));
        assert!(msg("default/:http").contains("empty name"));
        assert!(msg("/default/web:http").contains("empty cluster id"));
        assert!(msg("web:http").contains("must have the form"));
        assert!(msg("a/b/c/d:http").contains("must have the form"));
        assert!(msg("default/w eb:http").contains("whitespace"));
    }

    #[test]
    fn content_version_is_stable_and_content_sensitive() {
        let mut ports = PortMap::new();
        ports.insert("http".into(), vec![Node::new("10.0.0.1", 80, 50)]);
        let v1 = content_version(SourceKind::Endpoints, &ports);
        assert_eq!(v1.len(), 16);
        assert!(v1.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(v1, content_version(SourceKind::Endpoints, &ports.clone()));
        assert_ne!(v1, content_version(SourceKind::EndpointSlice, &ports));
        ports.insert("http".into(), vec![Node::new("10.0.0.1", 80, 51)]);
        assert_ne!(v1, content_version(SourceKind::Endpoints, &ports));
        assert_ne!(v1, content_version(SourceKind::Endpoints, &PortMap::new()));
    }

    #[test]
    fn object_version_covers_the_owner() {
        let mut ports = PortMap::new();
        ports.insert("http".into(), vec![Node::new("10.0.0.1", 80, 50)]);
        let key = ServiceKey::new("", "ns", "web");
        let plain = ServiceNodes::new(key.clone(), SourceKind::Endpoints, ports.clone(), None);
        assert_eq!(
            plain.version,
            content_version(SourceKind::Endpoints, &ports)
        );
        let owned = ServiceNodes::new(
            key.clone(),
            SourceKind::Endpoints,
            ports.clone(),
            Some("u1".into()),
        );
        assert_ne!(owned.version, plain.version);
        let other = ServiceNodes::new(key, SourceKind::Endpoints, ports, Some("u2".into()));
        assert_ne!(owned.version, other.version);
    }

    #[test]
    fn sort_nodes_by_host_then_port() {
        let mut nodes = vec![
            Node::new("10.0.0.2", 80, 1),
            Node::new("10.0.0.1", 90, 1),
            Node::new("10.0.0.1", 80, 1),
        ];
        sort_nodes(&mut nodes);
        let got: Vec<_> = nodes.iter().map(|n| (n.host.as_str(), n.port)).collect();
        assert_eq!(
            got,
            vec![("10.0.0.1", 80), ("10.0.0.1", 90), ("10.0.0.2", 80)]
        );
    }
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

// The node buckets of a big service (issue 19, item 2). They live here, not
// in `shards` (which reads them for the shard count and versions), because a
// `ServiceNodes` carries them: `shards` depends on `model`, never the reverse.

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
