//! One node (APISIX's `{host, port, weight}` plus optional fields omitted
//! when unset) and its JSON shape.

use super::*;

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
