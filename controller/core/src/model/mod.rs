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

mod node;
mod ports;
pub mod version;

pub use node::{Node, NodeTargetRef, NodeTopology};
pub use ports::{PortMap, PortMapEntry, PortMapIter, sort_nodes};

use self::version::{
    BIG_SERVICE_NODES, Buckets, object_version, version_of_digest, version_with_extras,
};

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
    /// (empty when it is unknown); see [`crate::source::service`].
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

/// Per-port data derived from the Service (see `crate::source::service`). Empty when
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

#[cfg(test)]
mod tests;
