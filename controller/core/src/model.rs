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

use std::collections::BTreeMap;
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Identity of one source Service. `cluster` is the APISIX multi-cluster `id`
/// (empty in single-cluster mode).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
pub struct ServiceKey {
    /// Cluster id, `""` in single-cluster mode.
    pub cluster: String,
    /// Namespace of the source Service.
    pub namespace: String,
    /// Name of the source Service.
    pub name: String,
}

impl ServiceKey {
    /// Builds a key.
    pub fn new(
        cluster: impl Into<String>,
        namespace: impl Into<String>,
        name: impl Into<String>,
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
#[derive(
    Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "camelCase")]
pub struct Node {
    /// IPv4 / IPv6 address or FQDN.
    pub host: String,
    /// Port number (1..=65535).
    #[schemars(range(min = 1, max = 65535))]
    pub port: i32,
    /// Load-balancing weight (the configured `default_weight`).
    pub weight: u32,
    /// Topology zone of the endpoint (topology output only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zone: Option<String>,
    /// Kubernetes node hosting the endpoint (topology output only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_name: Option<String>,
    /// Object behind the endpoint (topology output only).
    // Boxed: rarely set, and a node is kept per endpoint (96 bytes less per node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_ref: Option<Box<NodeTargetRef>>,
    /// `true` when this node is a serving-but-terminating fallback used because
    /// the port had no ready endpoint (opt-in `drain_terminating`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draining: Option<bool>,
}

impl Node {
    /// A plain APISIX node without extras.
    pub fn new(host: impl Into<String>, port: i32, weight: u32) -> Self {
        Self {
            host: host.into(),
            port,
            weight,
            zone: None,
            node_name: None,
            target_ref: None,
            draining: None,
        }
    }
}

/// Port key -> nodes, nodes sorted by host then port. `BTreeMap` keeps the
/// JSON (and therefore the version hash) deterministic.
pub type PortMap = BTreeMap<String, Vec<Node>>;

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
    /// [`content_version`] when the owner is unknown).
    pub version: String,
}

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
        }
    }

    /// Total number of nodes over all port keys.
    pub fn node_count(&self) -> usize {
        self.ports.values().map(Vec::len).sum()
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
    #[derive(Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Canonical<'a> {
        source: SourceKind,
        ports: &'a PortMap,
        #[serde(skip_serializing_if = "Option::is_none")]
        owner_uid: Option<&'a str>,
    }
    // Serializing plain structs, strings and integers into a Vec cannot fail;
    // fall back to the Debug form rather than panicking if it ever did.
    let bytes = serde_json::to_vec(&Canonical {
        source,
        ports,
        owner_uid,
    })
    .unwrap_or_else(|_| format!("{source:?}{ports:?}{owner_uid:?}").into_bytes());
    let digest = Sha256::digest(&bytes);
    let mut hex = hex::encode(digest);
    hex.truncate(16);
    hex
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

    #[test]
    fn node_serializes_as_apisix_shape_without_extras() {
        let n = Node::new("10.0.0.1", 80, 50);
        assert_eq!(
            serde_json::to_string(&n).unwrap(),
            r#"{"host":"10.0.0.1","port":80,"weight":50}"#
        );
        let mut n = n;
        n.zone = Some("z1".into());
        n.node_name = Some("n1".into());
        n.draining = Some(true);
        let v = serde_json::to_value(&n).unwrap();
        assert_eq!(v["zone"], "z1");
        assert_eq!(v["nodeName"], "n1");
        assert_eq!(v["draining"], true);
        let back: Node = serde_json::from_value(v).unwrap();
        assert_eq!(back, n);
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
