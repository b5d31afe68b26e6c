//! The `DiscoveredService` custom resource (`kubediscovery.io/v1alpha1`,
//! short name `dsvc`) and how a [`ServiceNodes`] becomes one.
//!
//! One object per source Service:
//!
//! ```yaml
//! apiVersion: kubediscovery.io/v1alpha1
//! kind: DiscoveredService
//! metadata:
//!   name: plat-dev            # see "Naming" below
//!   namespace: default
//!   labels:
//!     app.kubernetes.io/managed-by: kube-discovery
//!     kubediscovery.io/cluster: ""          # cluster id, empty in single-cluster mode
//!     kubediscovery.io/service-namespace: default
//!     kubediscovery.io/service-name: plat-dev
//!     kubediscovery.io/instance: default    # `kube_discovery.instance`, see "Ownership"
//!   ownerReferences: [{apiVersion: v1, kind: Service, name: plat-dev, uid: ...}]
//! spec:
//!   cluster: ""
//!   service: default/plat-dev               # APISIX name without ":port"
//!   sourceNamespace: default
//!   sourceName: plat-dev
//!   source: Endpoints                       # or EndpointSlice
//!   ports:
//!     port: [{host: 10.5.10.109, port: 3306, weight: 50}, {host: 10.5.10.110, port: 3306, weight: 50}]
//!   version: 1f0c...                        # content hash (16 hex), equal content => equal version
//! status: {nodeCount: 2, ports: "port", lastSyncTime: ..., conditions: [...]}
//! ```
//!
//! # Status: an ordinary field, written with the spec
//!
//! A DiscoveredService is controller output end to end, like an
//! EndpointSlice: nobody else writes it, and its status (node count, port
//! keys, the `Ready` and `Degraded` conditions of [`crate::conditions`]) is
//! derived from what the controller writes into the spec. So the
//! CRD has NO status subresource ([`definition`] removes the one kube's derive
//! adds): `status` is a plain field, written in the SAME server-side apply as
//! the spec ([`desired_objects_at`]), one API request per object instead of
//! two. The printer columns still read `.status.ports`, `.status.nodeCount`
//! and the `Ready` condition. (Without the subresource every apply that
//! changes anything bumps `metadata.generation`; hence no
//! `observedGeneration`, see [`crate::conditions`].)
//!
//! # Naming
//!
//! [`ObjectNaming`] maps a [`ServiceKey`] to the object's namespace and name:
//!
//! | mode | namespace | name |
//! |---|---|---|
//! | single cluster, `namespace_mode: source` | source namespace | `<name>` |
//! | single cluster, `namespace_mode: fixed`  | the fixed namespace | `<namespace>.<name>` |
//! | multi cluster, `namespace_mode: source`  | source namespace | `<id>.<name>` |
//! | multi cluster, `namespace_mode: fixed`   | the fixed namespace | `<id>.<namespace>.<name>` |
//!
//! Namespaces, Service names and cluster ids never contain `.`, so joining the
//! parts with `.` is collision-free, and the result (at most 8+1+63+1+63
//! characters) is always a valid object name (DNS subdomain, <= 253). Should a
//! name ever not be a valid DNS name (`k8s_syntax::is_dns_name`: also no label
//! over 63 characters; e.g. hand-written input to `render`), it is
//! sanitized (lowercase, other characters -> `-`), cut to 46 characters and
//! suffixed with `-<16 hex of sha256(parts)>` (63 characters at most), which
//! stays deterministic and practically collision-free. Label values longer than
//! 63 characters are shortened the same way. The ownerReference to the source
//! Service is only set in single-cluster `source` mode (owner references cannot
//! cross namespaces or clusters) and only when the Service UID is known.
//!
//! # Ownership: instances
//!
//! Several installations may share one API server. Each has an instance name
//! (`kube_discovery.instance`, a DNS label, default [`DEFAULT_INSTANCE`]; the
//! chart sets the release name), stamped on every object as the label
//! [`LABEL_INSTANCE`] and used in the field manager
//! ([`ObjectNaming::field_manager`]). [`owner_of`] decides whose an object is;
//! an instance writes, repairs and deletes only its own objects and leaves a
//! name held by another instance or by a hand-made object alone. Renaming
//! an installation (a Helm reinstall under another release name) is an
//! explicit handover: the new name lists the old one in
//! `kube_discovery.adopt_instances` ([`ObjectNaming::adopt`]) and takes its
//! objects over; without it, the controller reports itself unready while a
//! name it needs is held by another instance (the runtime's `/readyz`).
//!
//! # Big services: shards
//!
//! The API server refuses objects over ~1.5 MiB. When the JSON of a service's
//! `ports` exceeds [`MAX_OBJECT_PORTS_BYTES`] (512 KiB, about 10,000 nodes),
//! [`desired_objects`] splits it into `count` objects (a power of two): shard
//! 0 keeps the name above, shard `i` is named `<name>.<i>`; each node goes to
//! the shard the hash of its `host` gives ([`crate::shards`]), so one
//! endpoint added or removed changes ONE shard. Every shard has
//! `spec.shard: {index, count}` and the label `kubediscovery.io/shard: "<i>"`;
//! shard `i > 0` carries the version of its own content as `spec.version`,
//! shard 0 the whole service's plus the manifest `spec.shard.versions` (the
//! version of every shard). A change outside shard 0 is therefore two
//! writes: the changed shard, then shard 0 (its manifest changed).
//!
//! # What readers accept
//!
//! [`ReaderRule::check`]: an object counts only when its namespace, name and
//! the labels above are what this module gives its spec's service, so a
//! labelled object elsewhere cannot add nodes to another namespace's service.
//! [`consistent_shards`]: of a sharded service a reader takes shard 0 and the
//! shards whose `spec.version` is the one shard 0's manifest lists; a missing
//! or different one means "not complete yet" (read again, or keep the previous
//! state), never a mix of two versions. The controller writes the changed
//! shards `1..count` first and shard 0 last, then deletes shards beyond
//! `count`.

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    Condition, ManagedFieldsEntry, ObjectMeta, OwnerReference, Time,
};
use kube::{CustomResource, CustomResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use k8s_syntax::{DNS1123_LABEL_MAX_LENGTH, LABEL_VALUE_MAX_LENGTH, is_dns_name, is_label_value};

use crate::model::{Node, PortMap, ServiceKey, ServiceNodes, SourceKind};

/// API group of the resource.
pub const GROUP: &str = "kubediscovery.io";
/// API version of the resource.
pub const VERSION: &str = "v1alpha1";
/// Label: cluster id (empty in single-cluster mode).
pub const LABEL_CLUSTER: &str = "kubediscovery.io/cluster";
/// Label: namespace of the source Service.
pub const LABEL_SERVICE_NAMESPACE: &str = "kubediscovery.io/service-namespace";
/// Label: name of the source Service.
pub const LABEL_SERVICE_NAME: &str = "kubediscovery.io/service-name";
/// Label key marking objects we manage.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Value of [`LABEL_MANAGED_BY`].
pub const MANAGED_BY: &str = "kube-discovery";
/// Label naming the installation (`kube_discovery.instance`) that writes an object.
pub const LABEL_INSTANCE: &str = "kubediscovery.io/instance";
/// The instance name when `kube_discovery.instance` is not set.
pub const DEFAULT_INSTANCE: &str = "default";
/// Field manager of objects written before instances existed (and of every
/// write of those versions).
pub const LEGACY_FIELD_MANAGER: &str = "kube-discovery";
/// Label selector matching every object we manage.
pub const MANAGED_BY_SELECTOR: &str = "app.kubernetes.io/managed-by=kube-discovery";

/// Spec of a `DiscoveredService`: the nodes of one source Service.
#[derive(CustomResource, Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[kube(
    group = "kubediscovery.io",
    version = "v1alpha1",
    kind = "DiscoveredService",
    plural = "discoveredservices",
    singular = "discoveredservice",
    shortname = "dsvc",
    namespaced,
    status = "DiscoveredServiceStatus",
    derive = "PartialEq",
    doc = "Nodes of one Kubernetes Service, discovered from its Endpoints or EndpointSlices by kube-discovery (APISIX-compatible node shape).",
    printcolumn = r#"{"name":"Ready","type":"string","description":"Whether every port has a node (condition Ready)","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Ports","type":"string","description":"Port keys","jsonPath":".status.ports"}"#,
    printcolumn = r#"{"name":"Nodes","type":"integer","description":"Number of nodes over all ports","jsonPath":".status.nodeCount"}"#,
    printcolumn = r#"{"name":"Source","type":"string","description":"Endpoints or EndpointSlice","jsonPath":".spec.source"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveredServiceSpec {
    /// Cluster id (APISIX multi-cluster `id`); empty in single-cluster mode.
    #[serde(default)]
    pub cluster: String,
    /// The APISIX service name without the port: `ns/name` or `id/ns/name`.
    pub service: String,
    /// Namespace of the source Service.
    pub source_namespace: String,
    /// Name of the source Service.
    pub source_name: String,
    /// Which resource the nodes were read from.
    pub source: SourceKind,
    /// Port key (port name, else the number as a string) -> nodes sorted by host then port.
    #[serde(default)]
    pub ports: PortMap,
    /// Service-port aliases, from the Service: a Service port number (or a
    /// name the endpoints do not use) -> the key of `ports` holding its
    /// nodes, so `ns/name:80` resolves like `ns/name:http`. Readers look a
    /// port up in `ports` first, then here; absent when there is none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub aliases: BTreeMap<String, String>,
    /// Port key -> the `appProtocol` of its Service port (e.g.
    /// `kubernetes.io/h2c`, `grpc`); absent when no port sets one.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub app_protocols: BTreeMap<String, String>,
    /// Content hash of `source`, `ports`, the owner UID, `aliases` and
    /// `appProtocols` (16 hex characters); equal version = equal object.
    pub version: String,
    /// Set when a big service is split over several objects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shard: Option<Shard>,
}

/// Position of one object among the shards of a big service.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Shard {
    /// 0-based index of this shard.
    pub index: u32,
    /// Total number of shards.
    pub count: u32,
    /// Shard 0 only: the manifest, the content version of every shard
    /// `0..count` (entry `i` = `spec.version` of shard `i` for `i > 0`; entry
    /// 0 is shard 0's own nodes, whose `spec.version` is the whole
    /// service's). A reader takes shard `i` only when its `spec.version`
    /// equals entry `i` ([`consistent_shards`]). Absent on objects written
    /// before per-shard versions (then every shard carried the service's
    /// version).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub versions: Vec<String>,
}

/// Status of a `DiscoveredService`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DiscoveredServiceStatus {
    /// Number of nodes over all ports.
    #[serde(default)]
    pub node_count: i64,
    /// Comma-separated port keys (for the `Ports` printer column).
    #[serde(default)]
    pub ports: String,
    /// When the controller last wrote this object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_sync_time: Option<Time>,
    /// Standard Kubernetes conditions: `Ready` (every port has a node) and
    /// `Degraded` (source data was skipped); see `kube_discovery_core::conditions`.
    /// Each carries the same `observedGeneration` as the status.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The `metadata.generation` this status was written with: equal to it
    /// when the object is exactly as the controller last wrote it (the
    /// controller checks every write's answer and corrects the value);
    /// lower after someone else changed the object, until the controller
    /// repairs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Stamps `obj`'s status and every condition with `generation` as their
/// `observedGeneration` (`None` removes it).
pub fn stamp_generation(obj: &mut DiscoveredService, generation: Option<i64>) {
    let status = obj
        .status
        .get_or_insert_with(DiscoveredServiceStatus::default);
    status.observed_generation = generation;
    for c in &mut status.conditions {
        c.observed_generation = generation;
    }
}

/// The `observedGeneration` an object's status carries, if any.
pub fn stamped_generation(obj: &DiscoveredService) -> Option<i64> {
    obj.status.as_ref().and_then(|s| s.observed_generation)
}

/// What to do after a write whose answer shows `metadata.generation` =
/// `got`, when the write sent `observedGeneration` = `sent`.
///
/// The CRD has no status subresource, so spec and status are one apply and
/// every apply that changes the object bumps `metadata.generation` by
/// exactly one. The controller sends `generation + 1` of the object as it
/// last saw it; the answer tells whether that was right. When it was not
/// (someone wrote in between, the object was recreated, the memory was
/// empty), the fix is one more apply of the same object with `got + 1`,
/// which changes the object (the stamp differs) and so makes the
/// generation exactly `got + 1`. One case cannot be fixed that way: the
/// object already carries `got + 1` (a stale stamp, e.g. a hand edit) and
/// nothing else differs, so the apply changes nothing and the generation
/// stays. The fix then removes the stamp first (a change: `got + 1`), and
/// the next round stamps `got + 2`.
///
/// `None`: the stamp is right (or the answer has no generation: nothing
/// to check). `Some(stamp)`: apply again with that stamp.
pub fn generation_fix(sent: Option<i64>, got: Option<i64>) -> Option<Option<i64>> {
    let got = got?;
    if sent == Some(got) {
        return None;
    }
    let next = got.saturating_add(1);
    Some(if sent == Some(next) { None } else { Some(next) })
}

/// The CustomResourceDefinition of [`DiscoveredService`]: kube's derived CRD
/// WITHOUT the status subresource (see the module docs). kube-derive adds
/// `subresources.status` whenever the type has a status and offers no switch
/// to leave it out, so it is removed here. Use this, never
/// `DiscoveredService::crd()`.
pub fn definition() -> CustomResourceDefinition {
    let mut crd = DiscoveredService::crd();
    for v in &mut crd.spec.versions {
        v.subresources = None;
    }
    crd
}

/// The CustomResourceDefinition as YAML (what `kube-discovery crd` prints and
/// what `crds/discoveredservices.yaml` holds).
pub fn crd_yaml() -> String {
    match crate::yaml::to_string(&definition()) {
        Ok(s) => s,
        // Serializing a fixed, derived struct does not fail in practice; keep
        // the error visible instead of panicking.
        Err(e) => format!("# error: cannot serialize the DiscoveredService CRD: {e}\n"),
    }
}

/// Where DiscoveredServices are written.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NamespaceMode {
    /// Into the namespace of the source Service (default).
    #[default]
    Source,
    /// All into one namespace.
    Fixed(String),
}

/// Maps a [`ServiceKey`] to the namespace and name of its object, and says
/// which installation ([`LABEL_INSTANCE`]) writes it. See the module docs for
/// the rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectNaming {
    /// Where objects go.
    pub namespace_mode: NamespaceMode,
    /// The installation writing the objects (`kube_discovery.instance`, a
    /// DNS-1123 label).
    pub instance: String,
    /// Earlier names of this installation (`kube_discovery.adopt_instances`):
    /// their objects are this instance's ([`ObjectNaming::owner_of`]), and
    /// its next write of each relabels it.
    pub adopt: Vec<String>,
}

impl Default for ObjectNaming {
    fn default() -> Self {
        Self::source()
    }
}

impl ObjectNaming {
    /// Objects next to their source Service.
    pub fn source() -> Self {
        Self {
            namespace_mode: NamespaceMode::Source,
            instance: DEFAULT_INSTANCE.to_string(),
            adopt: Vec::new(),
        }
    }

    /// All objects in `namespace`.
    pub fn fixed(namespace: impl Into<String>) -> Self {
        Self {
            namespace_mode: NamespaceMode::Fixed(namespace.into()),
            instance: DEFAULT_INSTANCE.to_string(),
            adopt: Vec::new(),
        }
    }

    /// The same naming for the installation `instance`.
    #[must_use]
    pub fn with_instance(mut self, instance: impl Into<String>) -> Self {
        self.instance = instance.into();
        self
    }

    /// The same naming, adopting the objects of the instances `adopt`
    /// (earlier names of this installation).
    #[must_use]
    pub fn with_adopted(mut self, adopt: Vec<String>) -> Self {
        self.adopt = adopt;
        self
    }

    /// Field manager of this instance's server-side applies:
    /// `kube-discovery/<instance>`.
    pub fn field_manager(&self) -> String {
        format!("{LEGACY_FIELD_MANAGER}/{}", self.instance)
    }

    /// Field manager of this instance's repair patches:
    /// `kube-discovery-drift/<instance>`.
    pub fn drift_field_manager(&self) -> String {
        format!("{LEGACY_FIELD_MANAGER}-drift/{}", self.instance)
    }

    /// Whose an object with these `labels`, written by these server-side
    /// apply field `managers`, is ([`owner_of`] for this instance; an
    /// adopted instance's objects are ours: [`adopted`]).
    pub fn owner_of<'a>(
        &self,
        labels: Option<&BTreeMap<String, String>>,
        managers: impl IntoIterator<Item = &'a str>,
    ) -> Owner {
        adopted(owner_of(&self.instance, labels, managers), &self.adopt)
    }

    /// Whose the object with this metadata is: [`ObjectNaming::owner_of`]
    /// of its labels and its [`apply_managers`].
    pub fn owner_of_meta(&self, meta: &ObjectMeta) -> Owner {
        self.owner_of(
            meta.labels.as_ref(),
            apply_managers(meta.managed_fields.as_deref()),
        )
    }

    /// Namespace of the object for `key`.
    pub fn namespace(&self, key: &ServiceKey) -> String {
        match &self.namespace_mode {
            NamespaceMode::Source => key.namespace.to_string(),
            NamespaceMode::Fixed(ns) => ns.clone(),
        }
    }

    /// Name of the object for `key`.
    pub fn name(&self, key: &ServiceKey) -> String {
        let mut parts: Vec<&str> = Vec::with_capacity(3);
        if !key.cluster.is_empty() {
            parts.push(&key.cluster);
        }
        if matches!(self.namespace_mode, NamespaceMode::Fixed(_)) {
            parts.push(&key.namespace);
        }
        parts.push(&key.name);
        let joined = parts.join(".");
        // Every label <= 63 (stricter than an object name needs): keeps the
        // names objects have always had.
        if is_dns_name(&joined) {
            joined
        } else {
            // One RFC 1123 label (<= 63) is also a valid subdomain.
            shorten(&joined, &parts.join("\0"), DNS1123_LABEL_MAX_LENGTH, true)
        }
    }

    /// Whether objects carry an ownerReference to the source Service.
    pub fn owner_references_allowed(&self, key: &ServiceKey) -> bool {
        key.cluster.is_empty() && self.namespace_mode == NamespaceMode::Source
    }
}

/// Sanitizes `s`, cuts it so that `-<16 hex>` fits into `max`, and appends the
/// hash of `hash_input`. `lower` forces lowercase (object names).
fn shorten(s: &str, hash_input: &str, max: usize, lower: bool) -> String {
    let hash = {
        let mut h = hex::encode(Sha256::digest(hash_input.as_bytes()));
        h.truncate(16);
        h
    };
    let keep = max - hash.len() - 1;
    let mut prefix: String = s
        .chars()
        .map(|c| {
            let c = if lower { c.to_ascii_lowercase() } else { c };
            if c.is_ascii_lowercase() || c.is_ascii_digit() || (!lower && c.is_ascii_uppercase()) {
                c
            } else {
                '-'
            }
        })
        .take(keep)
        .collect();
    while prefix.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        prefix.pop();
    }
    while prefix.starts_with(|c: char| !c.is_ascii_alphanumeric()) {
        prefix.remove(0);
    }
    if prefix.is_empty() {
        hash
    } else {
        format!("{prefix}-{hash}")
    }
}

/// A valid label value for `s` (unchanged when already valid).
pub fn label_value(s: &str) -> String {
    if is_label_value(s) {
        s.to_string()
    } else {
        shorten(s, s, LABEL_VALUE_MAX_LENGTH, false)
    }
}

/// Whose an object is, as seen by one instance ([`owner_of`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// This instance's (also: written before instances existed).
    Us,
    /// Another kube-discovery installation's, by its instance name.
    Instance(String),
    /// Not kube-discovery's: made by hand or by another tool.
    Unmanaged,
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Owner::Us => f.write_str("this instance"),
            Owner::Instance(i) => write!(f, "kube-discovery instance {i:?}"),
            Owner::Unmanaged => f.write_str("not kube-discovery (made by hand or another tool)"),
        }
    }
}

/// `owner`, except that an object of one of the instances `adopt` (earlier
/// names of this installation, `kube_discovery.adopt_instances`) is ours.
pub fn adopted(owner: Owner, adopt: &[String]) -> Owner {
    match owner {
        Owner::Instance(i) if adopt.contains(&i) => Owner::Us,
        o => o,
    }
}

/// Whose an object is, for the instance `instance`, from its `labels` and the
/// field `managers` of its server-side applies (`metadata.managedFields`
/// entries with `operation: Apply`), in this order:
///
/// 1. the label [`LABEL_INSTANCE`] decides when present;
/// 2. else an apply by `kube-discovery/<name>` names the instance (someone
///    removed the label; ours when it is our name);
/// 3. else the label `app.kubernetes.io/managed-by: kube-discovery` or an
///    apply by [`LEGACY_FIELD_MANAGER`] marks an object written before
///    instances existed: every instance adopts it (the first write stamps
///    the label);
/// 4. anything else is [`Owner::Unmanaged`].
pub fn owner_of<'a>(
    instance: &str,
    labels: Option<&BTreeMap<String, String>>,
    managers: impl IntoIterator<Item = &'a str>,
) -> Owner {
    let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    owner_from(
        instance,
        label(LABEL_INSTANCE),
        label(LABEL_MANAGED_BY) == Some(MANAGED_BY),
        managers,
    )
}

/// The field managers of an object's server-side applies: the `manager` of
/// every `metadata.managedFields` entry with `operation: Apply`. Only those
/// say whose an object is ([`owner_of`]); an `Update` (kubectl edit, a merge
/// patch such as our own repair patches) does not.
pub fn apply_managers(fields: Option<&[ManagedFieldsEntry]>) -> impl Iterator<Item = &str> {
    fields
        .unwrap_or_default()
        .iter()
        .filter(|f| f.operation.as_deref() == Some("Apply"))
        .filter_map(|f| f.manager.as_deref())
}

/// [`owner_of`] from the value of [`LABEL_INSTANCE`] and whether
/// `app.kubernetes.io/managed-by: kube-discovery` is set (for readers that
/// keep only those of an object's labels).
pub fn owner_from<'a>(
    instance: &str,
    instance_label: Option<&str>,
    managed_by_label: bool,
    managers: impl IntoIterator<Item = &'a str>,
) -> Owner {
    let mine = |i: &str| {
        if i == instance {
            Owner::Us
        } else {
            Owner::Instance(i.to_string())
        }
    };
    if let Some(i) = instance_label {
        return mine(i);
    }
    let mut legacy = managed_by_label;
    let mut other = None;
    for m in managers {
        match m.strip_prefix(LEGACY_FIELD_MANAGER) {
            Some("") => legacy = true,
            Some(rest) => {
                if let Some(i) = rest.strip_prefix('/') {
                    if i == instance {
                        return Owner::Us;
                    }
                    other.get_or_insert(i);
                }
            }
            None => {}
        }
    }
    match other {
        Some(i) => mine(i),
        None if legacy => Owner::Us,
        None => Owner::Unmanaged,
    }
}

/// The labels every object for `key` written by `instance` carries.
pub fn labels_for(key: &ServiceKey, instance: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
        (LABEL_INSTANCE.to_string(), instance.to_string()),
        (LABEL_CLUSTER.to_string(), label_value(&key.cluster)),
        (
            LABEL_SERVICE_NAMESPACE.to_string(),
            label_value(&key.namespace),
        ),
        (LABEL_SERVICE_NAME.to_string(), label_value(&key.name)),
    ])
}

/// The object the controller wants for `svc`, without status: the content that
/// drift checks compare and `render` prints. What is written is
/// [`desired_objects_at`] (with status).
pub fn desired_object(svc: &ServiceNodes, naming: &ObjectNaming) -> DiscoveredService {
    let key = &svc.key;
    let owner_references = match &svc.owner_uid {
        Some(uid) if naming.owner_references_allowed(key) => Some(vec![OwnerReference {
            api_version: "v1".to_string(),
            kind: "Service".to_string(),
            name: key.name.to_string(),
            uid: uid.clone(),
            controller: None,
            // `true` would need `update services/finalizers` permission.
            block_owner_deletion: None,
        }]),
        _ => None,
    };
    DiscoveredService {
        metadata: ObjectMeta {
            name: Some(naming.name(key)),
            namespace: Some(naming.namespace(key)),
            labels: Some(labels_for(key, &naming.instance)),
            owner_references,
            ..ObjectMeta::default()
        },
        spec: DiscoveredServiceSpec {
            cluster: key.cluster.to_string(),
            service: key.to_string(),
            source_namespace: key.namespace.to_string(),
            source_name: key.name.to_string(),
            source: svc.source,
            ports: svc.ports.clone(),
            aliases: svc.extras.aliases.clone(),
            app_protocols: svc.extras.app_protocols.clone(),
            version: svc.version.clone(),
            shard: None,
        },
        status: None,
    }
}

/// Label on the objects of a service split over several objects: the shard index.
pub const LABEL_SHARD: &str = "kubediscovery.io/shard";

/// Upper bound on the JSON size of one object's `spec.ports`. The API server
/// (etcd) refuses objects over ~1.5 MiB; a third of that leaves room for
/// metadata, managedFields, status and the YAML/JSON overhead of clients.
pub const MAX_OBJECT_PORTS_BYTES: usize = 512 * 1024;

/// Name of shard `index` of the object named `base`: shard 0 keeps `base`,
/// shard `i > 0` is `<base>.<i>`. Service names and cluster ids start with a
/// letter, so an all-digit last part never collides with another service's
/// name, and the result stays a valid object name (<= 63 + 1 + 10 characters
/// for a shortened base; <= 253 otherwise).
pub fn shard_name(base: &str, index: u32) -> String {
    if index == 0 {
        base.to_string()
    } else {
        format!("{base}.{index}")
    }
}

/// The shard position of an object: `(index, count)`, `(0, 1)` when unsharded.
pub fn shard_of(ds: &DiscoveredService) -> (u32, u32) {
    ds.spec
        .shard
        .as_ref()
        .map_or((0, 1), |s| (s.index, s.count.max(1)))
}

/// The exact JSON length of `node` (the size estimate of [`ports_fit`] and
/// of the shard count, [`crate::shards::shard_count`]).
pub fn node_json_len(node: &Node) -> usize {
    /// Counts the bytes instead of storing them.
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    // Exact for the node's serialization; a failure (impossible for this
    // plain struct) counts as a large node so the split stays conservative.
    let mut count = Count(0);
    serde_json::to_writer(&mut count, node).map_or(1024, |()| count.0)
}

/// Whether `ports` stays ONE object under the shard size estimate
/// (`{}`, per port key `"key":[],`, per node its JSON and a comma) with
/// `max_bytes`. Exact for that estimate, and cheap: nothing is cloned, and
/// it stops at the first byte over.
pub fn ports_fit(ports: &PortMap, max_bytes: usize) -> bool {
    let mut size: usize = 2;
    for (port, nodes) in ports {
        size = size.saturating_add(port.len() + 6);
        for node in nodes {
            size = size.saturating_add(node_json_len(node) + 1);
            if size > max_bytes {
                return false;
            }
        }
        if size > max_bytes {
            return false;
        }
    }
    true
}

/// Every object the controller wants for `svc`: one when its ports fit into
/// [`MAX_OBJECT_PORTS_BYTES`], else shards (see [`desired_objects_with_limit`]).
/// Without status (see [`desired_objects_at`] for what is written).
pub fn desired_objects(svc: &ServiceNodes, naming: &ObjectNaming) -> Vec<DiscoveredService> {
    desired_objects_with_limit(svc, naming, MAX_OBJECT_PORTS_BYTES)
}

/// [`desired_objects`] with an explicit size bound (tests use small ones).
///
/// A service that fits is exactly [`desired_object`] (no `shard` field, no
/// shard label), so small services look the same as before sharding existed.
/// A bigger one becomes `count` objects named by [`shard_name`]
/// ([`crate::shards`]: `count` a power of two, each node in the shard its
/// `host` hash gives, node order per port kept, shard 0 carrying
/// every port key). Every shard has `spec.shard = {index, count}` and the
/// label [`LABEL_SHARD`]; shard `i > 0` has the version of its OWN content
/// ([`crate::shards::shard_version`]) as `spec.version`, so it is only
/// rewritten when its nodes change; shard 0 keeps the version of the whole
/// service and carries the manifest `spec.shard.versions` (every shard's
/// content version), which makes its content change with any shard's.
/// Readers take the shards the manifest names ([`consistent_shards`]) and
/// merge their node lists per port (sorting them).
pub fn desired_objects_with_limit(
    svc: &ServiceNodes,
    naming: &ObjectNaming,
    max_ports_bytes: usize,
) -> Vec<DiscoveredService> {
    DesiredObjects::with_limit(svc, naming, max_ports_bytes).all()
}

/// The objects of [`desired_objects_with_limit`], each built only when asked
/// for ([`DesiredObjects::build`]); what a write of `svc` needs to decide
/// WHICH objects it sends (their names, count and versions) costs no node.
///
/// Why lazy: one endpoint change in a 100,000-endpoint service (16 shards)
/// sends two objects, its shard and shard 0 (`write_plan::object_ops`), but
/// building all 16 copied every node into its shard object per change
/// (1.8 ms of the 2 ms a change may cost, issue 19 item 2). The shard
/// count and every shard's version come from the index's kept
/// [`crate::model::Buckets`] (O(buckets)); [`DesiredObjects::build`] then
/// copies the nodes of the requested shards only, in one pass that hashes
/// each host once. [`DesiredObjects::all`] is exactly the eager build (every
/// reader of "all objects": `render`, the drift check, the client).
pub struct DesiredObjects<'a> {
    svc: &'a ServiceNodes,
    /// 1: one object, [`desired_object`]; else the shard count.
    count: u32,
    /// Shard `i`'s content version ([`crate::shards::shard_version`]);
    /// empty when `count` is 1.
    versions: Vec<String>,
    /// The object without nodes (shard 0's name and version, no shard
    /// field): every object is this plus its nodes and shard facts.
    template: DiscoveredService,
    /// The service's conditions and the write's time ([`DesiredObjects::at`]):
    /// each built object then carries its [`object_status`].
    status: Option<(Vec<Condition>, Time)>,
}

impl<'a> DesiredObjects<'a> {
    /// The objects of `svc` under [`MAX_OBJECT_PORTS_BYTES`].
    pub fn new(svc: &'a ServiceNodes, naming: &ObjectNaming) -> Self {
        Self::with_limit(svc, naming, MAX_OBJECT_PORTS_BYTES)
    }

    /// The objects of `svc` with an explicit size bound (tests use small
    /// ones): the shard count and versions, no node copied.
    pub fn with_limit(
        svc: &'a ServiceNodes,
        naming: &ObjectNaming,
        max_ports_bytes: usize,
    ) -> Self {
        // The index keeps the buckets of a big service; any other value (a
        // small one, or one built elsewhere) is measured node by node here.
        let kept = svc.buckets.0.as_deref();
        let fits = match kept {
            Some(b) => b.fits(&svc.ports, max_ports_bytes),
            None => ports_fit(&svc.ports, max_ports_bytes),
        };
        let count = if fits {
            1
        } else {
            match kept {
                Some(b) => b.shard_count(&svc.ports, max_ports_bytes),
                None => crate::shards::shard_count(&svc.ports, max_ports_bytes, node_json_len),
            }
        };
        let versions = if count <= 1 {
            Vec::new()
        } else {
            let computed;
            let buckets = match kept {
                Some(b) => b,
                None => {
                    computed = crate::shards::Buckets::of(&svc.ports);
                    &computed
                }
            };
            (0..count)
                .map(|index| {
                    // Shard 0 carries every port key; shard `i > 0` only
                    // those it has nodes of (`shards::partition`), which its
                    // digest covers: the keys are what the version hashes.
                    crate::shards::shard_version(
                        index,
                        count,
                        svc.source,
                        &crate::shards::shard_keys(&svc.ports, index, count),
                        &buckets.shard_digest(index, count),
                        svc.owner_uid.as_deref(),
                        &svc.extras,
                    )
                })
                .collect()
        };
        // Everything but the nodes: no object clones the whole node list
        // only to replace it.
        let template = desired_object(
            &ServiceNodes {
                key: svc.key.clone(),
                source: svc.source,
                ports: PortMap::new(),
                owner_uid: svc.owner_uid.clone(),
                version: svc.version.clone(),
                skipped: Vec::new(),
                extras: svc.extras.clone(),
                buckets: crate::model::SharedBuckets::default(),
            },
            naming,
        );
        DesiredObjects {
            svc,
            count: count.max(1),
            versions,
            template,
            status: None,
        }
    }

    /// These objects as WRITTEN at `now` ([`desired_objects_at`]): each
    /// with its [`object_status`], the conditions computed once from
    /// `previous`.
    #[must_use]
    pub fn at(mut self, previous: &[Condition], now: &Time) -> Self {
        let conditions = crate::conditions::conditions(self.svc, previous, now);
        self.status = Some((conditions, now.clone()));
        self
    }

    /// The service they describe.
    pub fn service(&self) -> &'a ServiceNodes {
        self.svc
    }

    /// How many objects (1 when unsharded, else the shard count).
    pub fn len(&self) -> u32 {
        self.count
    }

    /// Never: a service is at least one object.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Whether object `index` is a shard `i > 0` (its version is that of
    /// its own content).
    pub fn is_later_shard(&self, index: u32) -> bool {
        self.count > 1 && index > 0
    }

    /// `(namespace, name)` of object `index`.
    pub fn name(&self, index: u32) -> (String, String) {
        let m = &self.template.metadata;
        (
            m.namespace.clone().unwrap_or_default(),
            shard_name(m.name.as_deref().unwrap_or_default(), index),
        )
    }

    /// `spec.version` of object `index`: the service's version for shard 0
    /// and an unsharded object, the shard's content version otherwise.
    pub fn version(&self, index: u32) -> &str {
        if self.is_later_shard(index) {
            self.versions.get(index as usize).map_or("", String::as_str)
        } else {
            &self.template.spec.version
        }
    }

    /// Objects `indices` (each `< len()`; others are skipped), in that
    /// order, nodes and status included: one pass over the nodes, copying
    /// only those of the requested shards.
    pub fn build(&self, indices: &[u32]) -> Vec<DiscoveredService> {
        let asked: Vec<u32> = indices
            .iter()
            .copied()
            .filter(|i| *i < self.count)
            .collect();
        let mut unique: Vec<u32> = Vec::with_capacity(asked.len());
        for i in &asked {
            if !unique.contains(i) {
                unique.push(*i);
            }
        }
        let parts = if self.count == 1 {
            unique.iter().map(|_| self.svc.ports.clone()).collect()
        } else {
            crate::shards::partition_some(&self.svc.ports, self.count, &unique)
        };
        let built: Vec<DiscoveredService> = unique
            .iter()
            .zip(parts)
            .map(|(index, ports)| self.object_with(*index, ports))
            .collect();
        if unique.len() == asked.len() {
            return built;
        }
        // An index asked twice: the same object twice.
        asked
            .iter()
            .filter_map(|i| unique.iter().position(|u| u == i))
            .filter_map(|pos| built.get(pos).cloned())
            .collect()
    }

    /// Object `index` (see [`DesiredObjects::build`]).
    pub fn object(&self, index: u32) -> Option<DiscoveredService> {
        self.build(&[index]).pop()
    }

    /// Every object, shard 0 first: the eager build.
    pub fn all(&self) -> Vec<DiscoveredService> {
        self.build(&(0..self.count).collect::<Vec<_>>())
    }

    fn object_with(&self, index: u32, ports: PortMap) -> DiscoveredService {
        let mut obj = self.template.clone();
        obj.spec.ports = ports;
        if self.count > 1 {
            obj.metadata.name = Some(self.name(index).1);
            if let Some(labels) = obj.metadata.labels.as_mut() {
                labels.insert(LABEL_SHARD.to_string(), index.to_string());
            }
            if index > 0 {
                obj.spec.version = self.version(index).to_string();
            }
            obj.spec.shard = Some(Shard {
                index,
                count: self.count,
                versions: if index == 0 {
                    self.versions.clone()
                } else {
                    Vec::new()
                },
            });
        }
        if let Some((conditions, now)) = &self.status {
            obj.status = Some(object_status(&obj, conditions.clone(), now.clone()));
        }
        obj
    }
}

/// Why the objects of a sharded service do not form one version yet
/// ([`consistent_shards`]): a reader reads again (or keeps what it had).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Incomplete {
    /// No shard 0 (it is written last and carries the manifest).
    #[error("shard 0 is missing")]
    NoShardZero,
    /// Shard `index` of shard 0's count is not there.
    #[error("shard {index} of {count} is missing")]
    Missing {
        /// The missing shard.
        index: u32,
        /// Shard 0's count.
        count: u32,
    },
    /// Shard `index` holds another version than shard 0's manifest names
    /// (it is being rewritten, or shard 0 is not written yet).
    #[error("shard {index} has version {actual:?}, shard 0 lists {expected:?}")]
    Mismatch {
        /// The shard.
        index: u32,
        /// What shard 0's manifest (or, for objects of the old scheme,
        /// shard 0's `spec.version`) says.
        expected: String,
        /// Its `spec.version`.
        actual: String,
    },
}

/// The shard position and version facts [`consistent_shards`] needs of one
/// object (the start-up list keeps only these, not the objects).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardHead<'a> {
    /// `spec.shard.index` (0 when unsharded).
    pub index: u32,
    /// `spec.shard.count` (1 when unsharded).
    pub count: u32,
    /// `spec.version`.
    pub version: &'a str,
    /// `spec.shard.versions` (shard 0's manifest; empty elsewhere and on
    /// objects of the old scheme).
    pub manifest: &'a [String],
}

impl<'a> ShardHead<'a> {
    /// The facts of `ds`.
    pub fn of(ds: &'a DiscoveredService) -> Self {
        let (index, count) = shard_of(ds);
        ShardHead {
            index,
            count,
            version: &ds.spec.version,
            manifest: ds
                .spec
                .shard
                .as_ref()
                .map_or(&[], |s| s.versions.as_slice()),
        }
    }
}

/// Which objects of ONE service (already accepted by [`ReaderRule::check`])
/// a reader takes so it never mixes two versions: THE reader rule of big
/// services, used by every reader (client lookup, resolver, `nodes`) and by
/// the controller's start-up list. Returns the positions in `heads` of
/// shards `0..count` (shard 0 first), and whether shard 0 is of the old
/// scheme (no manifest: then every shard must carry shard 0's
/// `spec.version`, the rule before per-shard versions; the controller
/// rewrites such a service once).
///
/// Shard 0 decides: its `count`, and per shard `i > 0` the version its
/// manifest lists; an object whose version differs (being rewritten) or a
/// missing one makes the set [`Incomplete`], never silently mixed. Objects
/// beyond shard 0's count (surplus of a shrink, deleted after shard 0 is
/// written) are ignored.
pub fn consistent_shards(heads: &[ShardHead<'_>]) -> Result<(Vec<usize>, bool), Incomplete> {
    let zero = heads
        .iter()
        .position(|h| h.index == 0)
        .ok_or(Incomplete::NoShardZero)?;
    let head = &heads[zero];
    let count = head.count.max(1);
    let legacy = count > 1 && head.manifest.is_empty();
    let mut out = vec![zero];
    for index in 1..count {
        let expected = if legacy {
            head.version
        } else {
            head.manifest.get(index as usize).map_or("", String::as_str)
        };
        let mut candidates = heads
            .iter()
            .enumerate()
            .filter(|(_, h)| h.index == index && h.count == count);
        let Some((pos, h)) = candidates.next() else {
            return Err(Incomplete::Missing { index, count });
        };
        if h.version != expected {
            return Err(Incomplete::Mismatch {
                index,
                expected: expected.to_string(),
                actual: h.version.to_string(),
            });
        }
        out.push(pos);
    }
    Ok((out, legacy))
}

/// The objects the controller WRITES for `svc` at `now`: [`desired_objects`],
/// each with its own [`object_status`] (one server-side apply per object
/// carries both; the CRD has no status subresource). `previous` are the
/// conditions the service's object held before (empty when unknown): they
/// keep each unchanged condition's `lastTransitionTime`
/// ([`crate::conditions`]). `now` comes from the caller, so this stays free
/// of clocks.
pub fn desired_objects_at(
    svc: &ServiceNodes,
    naming: &ObjectNaming,
    previous: &[Condition],
    now: &Time,
) -> Vec<DiscoveredService> {
    DesiredObjects::new(svc, naming).at(previous, now).all()
}

/// The status of one written object (`obj` from [`desired_objects`]): node
/// count and port keys of THAT object (a shard counts its own nodes), the
/// service's `conditions` ([`crate::conditions::conditions`]: the same on
/// every shard, they describe the whole service) and `lastSyncTime`: `now`,
/// the time of this write. `lastSyncTime` moves on every write (a write
/// only happens when the content changed, on a drift repair, or to stamp an
/// object written by an older version), the conditions' times only on a
/// transition.
pub fn object_status(
    obj: &DiscoveredService,
    conditions: Vec<Condition>,
    now: Time,
) -> DiscoveredServiceStatus {
    let nodes: usize = obj.spec.ports.values().map(Vec::len).sum();
    let node_count = i64::try_from(nodes).unwrap_or(i64::MAX);
    DiscoveredServiceStatus {
        node_count,
        ports: obj.spec.ports.keys().cloned().collect::<Vec<_>>().join(","),
        last_sync_time: Some(now),
        conditions,
        // Stamped by the writer, which knows the object's generation.
        observed_generation: None,
    }
}

/// The service an existing object describes (from its spec), e.g. to rebuild
/// the "what the API server holds" cache after a restart.
pub fn key_of(ds: &DiscoveredService) -> ServiceKey {
    ServiceKey::new(
        &ds.spec.cluster,
        &ds.spec.source_namespace,
        &ds.spec.source_name,
    )
}

/// What a reader accepts: the ONE place where the rule "an object counts only
/// when its namespace, name, labels and spec agree" lives
/// ([`ReaderRule::check`]). Every reader goes through it:
/// `kube_discovery_client::lookup` (so `kube-discovery nodes`,
/// `render --nodes`), the client's `NodesResolver` (the syncs, the Rust
/// gateways). Without it, anyone allowed to create a labelled
/// DiscoveredService in ANY namespace could add nodes to another namespace's
/// service (the spec alone names the service).
///
/// With an instance ([`ReaderRule::for_instance`]), only that
/// installation's objects count (label [`LABEL_INSTANCE`]); without one, any
/// kube-discovery installation's.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReaderRule {
    /// How the writer names its objects (`namespace_mode` of
    /// `sinks.discoveredservices`): where an object of a service must live
    /// and what it must be called. Its `instance` is not used: see
    /// [`ReaderRule::instance`].
    pub naming: ObjectNaming,
    /// Only objects of this installation (`kube_discovery.instance`) count;
    /// `None`: any installation's.
    pub instance: Option<String>,
}

/// Why [`ReaderRule::check`] refuses an object. Display strings name the
/// object's field and both values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Disagreement {
    /// `spec.service` is not `[cluster/]sourceNamespace/sourceName`.
    #[error(
        "spec.service {actual:?} is not {expected:?} (from spec.cluster, sourceNamespace, sourceName)"
    )]
    Service {
        /// What the spec's parts give.
        expected: String,
        /// What `spec.service` says.
        actual: String,
    },
    /// `spec.shard` is impossible (`index >= count`).
    #[error("spec.shard {index} of {count} is impossible")]
    Shard {
        /// `spec.shard.index`.
        index: u32,
        /// `spec.shard.count`.
        count: u32,
    },
    /// The object is not in the namespace the writer puts `service` in.
    #[error("{service} belongs in namespace {expected:?}, not {actual:?}")]
    Namespace {
        /// The service the spec claims.
        service: String,
        /// Where its objects live.
        expected: String,
        /// Where this one is.
        actual: String,
    },
    /// The object's name is not the one the writer gives this spec.
    #[error("{service} is named {expected:?}, not {actual:?}")]
    Name {
        /// The service the spec claims.
        service: String,
        /// The name the naming scheme gives (shard suffix included).
        expected: String,
        /// The object's name.
        actual: String,
    },
    /// A label the writer sets disagrees with the spec (or is missing).
    #[error(
        "label {label} is {}, the spec of {service} wants {}",
        shown(actual.as_deref()),
        shown(expected.as_deref())
    )]
    Label {
        /// The service the spec claims.
        service: String,
        /// The label key.
        label: &'static str,
        /// The value the writer sets for this spec (`None`: must be absent).
        expected: Option<String>,
        /// The object's value (`None`: absent).
        actual: Option<String>,
    },
}

/// A label value for messages: quoted, or `absent`.
fn shown(v: Option<&str>) -> String {
    v.map_or_else(|| "absent".to_string(), |v| format!("{v:?}"))
}

impl ReaderRule {
    /// The rule for objects named by `naming`, of any installation.
    pub fn new(naming: ObjectNaming) -> Self {
        Self {
            naming,
            instance: None,
        }
    }

    /// The same rule, counting only objects of the installation `instance`
    /// (`None`: of any).
    #[must_use]
    pub fn for_instance(mut self, instance: Option<String>) -> Self {
        self.instance = instance;
        self
    }

    /// The service `ds` describes, if the object agrees with itself the way
    /// the writer makes it: `spec.service` matches the spec's parts,
    /// `metadata.namespace` and `metadata.name` are what the naming scheme
    /// gives that service (shard `i > 0`: [`shard_name`]), and the labels the
    /// writer sets ([`labels_for`], [`LABEL_SHARD`]) match the spec (an
    /// unsharded object may keep `kubediscovery.io/shard: "0"`: someone else
    /// co-owns the label, or a writer before issue 29 item 2 is between its
    /// two requests). Other labels are ignored. Pure; the caller reports a refusal (naming the
    /// object) and skips it.
    pub fn check(&self, ds: &DiscoveredService) -> Result<ServiceKey, Disagreement> {
        let key = key_of(ds);
        let service = key.to_string();
        if ds.spec.service != service {
            return Err(Disagreement::Service {
                expected: service,
                actual: ds.spec.service.clone(),
            });
        }
        let shard = match &ds.spec.shard {
            Some(s) if s.index >= s.count => {
                return Err(Disagreement::Shard {
                    index: s.index,
                    count: s.count,
                });
            }
            Some(s) => Some(s.index),
            None => None,
        };
        let namespace = self.naming.namespace(&key);
        let actual_ns = ds.metadata.namespace.as_deref().unwrap_or_default();
        if actual_ns != namespace {
            return Err(Disagreement::Namespace {
                service,
                expected: namespace,
                actual: actual_ns.to_string(),
            });
        }
        let name = shard_name(&self.naming.name(&key), shard.unwrap_or(0));
        let actual_name = ds.metadata.name.as_deref().unwrap_or_default();
        if actual_name != name {
            return Err(Disagreement::Name {
                service,
                expected: name,
                actual: actual_name.to_string(),
            });
        }
        let labels = ds.metadata.labels.as_ref();
        let label = |k: &str| labels.and_then(|l| l.get(k)).cloned();
        // The values of `labels_for(&key)`.
        for (k, v) in [
            (LABEL_MANAGED_BY, MANAGED_BY.to_string()),
            (LABEL_CLUSTER, label_value(&key.cluster)),
            (LABEL_SERVICE_NAMESPACE, label_value(&key.namespace)),
            (LABEL_SERVICE_NAME, label_value(&key.name)),
        ] {
            let actual = label(k);
            if actual.as_deref() != Some(v.as_str()) {
                return Err(Disagreement::Label {
                    service,
                    label: k,
                    expected: Some(v),
                    actual,
                });
            }
        }
        if let Some(want) = &self.instance {
            let actual = label(LABEL_INSTANCE);
            if actual.as_deref() != Some(want.as_str()) {
                return Err(Disagreement::Label {
                    service,
                    label: LABEL_INSTANCE,
                    expected: Some(want.clone()),
                    actual,
                });
            }
        }
        // Sharded: the index. Unsharded: none, or "0": the apply that unshards
        // drops the label unless someone else co-owns it (and writers before
        // issue 29 item 2 removed `spec.shard` one request earlier); refusing
        // that would hide the service.
        let shard_label = label(LABEL_SHARD);
        let agrees = match shard {
            Some(i) => shard_label == Some(i.to_string()),
            None => shard_label.as_deref().is_none_or(|l| l == "0"),
        };
        if !agrees {
            return Err(Disagreement::Label {
                service,
                label: LABEL_SHARD,
                expected: shard.map(|i| i.to_string()),
                actual: shard_label,
            });
        }
        Ok(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::PortMap;

    fn svc(cluster: &str, ns: &str, name: &str, uid: Option<&str>) -> ServiceNodes {
        let mut ports = PortMap::new();
        ports.insert(
            "port".into(),
            vec![
                Node::new("10.5.10.109", 3306, 50),
                Node::new("10.5.10.110", 3306, 50),
            ],
        );
        ServiceNodes::new(
            ServiceKey::new(cluster, ns, name),
            SourceKind::Endpoints,
            ports,
            uid.map(str::to_string),
        )
    }

    /// Set `UPDATE_CRDS=1` to rewrite the file after an intended change.
    #[test]
    fn crd_file_is_up_to_date() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../crds/discoveredservices.yaml"
        );
        let want = crd_yaml();
        if std::env::var("UPDATE_CRDS").as_deref() == Ok("1") {
            std::fs::write(path, &want).unwrap();
        }
        let have = std::fs::read_to_string(path).unwrap_or_else(|e| {
            panic!("cannot read {path}: {e}; run with UPDATE_CRDS=1 to generate it")
        });
        assert!(
            have == want,
            "{path} is stale; regenerate it with `UPDATE_CRDS=1 cargo nextest run -p kube-discovery-core crd_file_is_up_to_date`"
        );
    }

    #[test]
    fn crd_has_names_columns_and_status_but_no_status_subresource() {
        let crd = definition();
        assert_eq!(crd.spec.group, GROUP);
        assert_eq!(crd.spec.names.plural, "discoveredservices");
        assert_eq!(crd.spec.names.kind, "DiscoveredService");
        assert_eq!(crd.spec.names.short_names, Some(vec!["dsvc".to_string()]));
        assert_eq!(crd.spec.scope, "Namespaced");
        let v = &crd.spec.versions[0];
        assert_eq!(v.name, VERSION);
        assert_eq!(crd.spec.versions.len(), 1);
        // kube's derive adds the subresource; `definition` must remove it.
        assert!(
            DiscoveredService::crd().spec.versions[0]
                .subresources
                .is_some(),
            "kube-derive no longer adds a status subresource: simplify `definition`"
        );
        assert!(v.subresources.is_none(), "{:?}", v.subresources);
        // `status` stays in the schema as an ordinary field.
        let props = v
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .and_then(|s| s.properties.as_ref())
            .unwrap();
        assert!(props.contains_key("status"), "{:?}", props.keys());
        let cols: Vec<_> = v
            .additional_printer_columns
            .as_ref()
            .unwrap()
            .iter()
            .map(|c| (c.name.as_str(), c.json_path.as_str()))
            .collect();
        assert_eq!(
            cols,
            vec![
                ("Ready", r#".status.conditions[?(@.type=="Ready")].status"#),
                ("Ports", ".status.ports"),
                ("Nodes", ".status.nodeCount"),
                ("Source", ".spec.source"),
                ("Age", ".metadata.creationTimestamp")
            ]
        );
        let yaml = crd_yaml();
        assert!(yaml.contains("sourceNamespace"));
        assert!(yaml.contains("lastSyncTime"));
        assert!(!yaml.contains("subresources"), "{yaml}");
    }

    #[test]
    fn single_cluster_object_mirrors_source_with_owner() {
        let s = svc("", "default", "plat-dev", Some("uid-1"));
        let ds = desired_object(&s, &ObjectNaming::source());
        assert_eq!(ds.metadata.name.as_deref(), Some("plat-dev"));
        assert_eq!(ds.metadata.namespace.as_deref(), Some("default"));
        let owners = ds.metadata.owner_references.unwrap();
        assert_eq!(owners.len(), 1);
        assert_eq!(
            (
                owners[0].kind.as_str(),
                owners[0].name.as_str(),
                owners[0].uid.as_str()
            ),
            ("Service", "plat-dev", "uid-1")
        );
        let labels = ds.metadata.labels.unwrap();
        assert_eq!(labels[LABEL_SERVICE_NAMESPACE], "default");
        assert_eq!(labels[LABEL_SERVICE_NAME], "plat-dev");
        assert_eq!(labels[LABEL_CLUSTER], "");
        assert_eq!(labels[LABEL_MANAGED_BY], MANAGED_BY);
        assert_eq!(ds.spec.service, "default/plat-dev");
        assert_eq!(ds.spec.version, s.version);
        assert_eq!(ds.spec.ports, s.ports);
        assert_eq!(
            key_of(&DiscoveredService {
                metadata: ObjectMeta::default(),
                spec: ds.spec,
                status: None
            }),
            s.key
        );
    }

    #[test]
    fn no_owner_without_uid_or_across_namespaces_or_clusters() {
        let s = svc("", "default", "web", None);
        assert!(
            desired_object(&s, &ObjectNaming::source())
                .metadata
                .owner_references
                .is_none()
        );
        let s = svc("", "default", "web", Some("u"));
        assert!(
            desired_object(&s, &ObjectNaming::fixed("kd"))
                .metadata
                .owner_references
                .is_none()
        );
        let s = svc("c1", "default", "web", Some("u"));
        assert!(
            desired_object(&s, &ObjectNaming::source())
                .metadata
                .owner_references
                .is_none()
        );
    }

    #[test]
    fn naming_table() {
        let k1 = ServiceKey::new("", "ns", "web");
        let k2 = ServiceKey::new("c1", "ns", "web");
        let src = ObjectNaming::source();
        let fixed = ObjectNaming::fixed("kd");
        assert_eq!(
            (src.namespace(&k1), src.name(&k1)),
            ("ns".into(), "web".into())
        );
        assert_eq!(
            (fixed.namespace(&k1), fixed.name(&k1)),
            ("kd".into(), "ns.web".into())
        );
        assert_eq!(
            (src.namespace(&k2), src.name(&k2)),
            ("ns".into(), "c1.web".into())
        );
        assert_eq!(
            (fixed.namespace(&k2), fixed.name(&k2)),
            ("kd".into(), "c1.ns.web".into())
        );
        let ds = desired_object(&svc("c1", "ns", "web", None), &src);
        assert_eq!(ds.metadata.labels.unwrap()[LABEL_CLUSTER], "c1");
        assert_eq!(ds.spec.service, "c1/ns/web");
    }

    #[test]
    fn naming_is_collision_free_where_dashes_would_collide() {
        let fixed = ObjectNaming::fixed("kd");
        let a = fixed.name(&ServiceKey::new("", "a-b", "c"));
        let b = fixed.name(&ServiceKey::new("", "a", "b-c"));
        assert_ne!(a, b);
    }

    #[test]
    fn naming_handles_any_length_deterministically() {
        let long = "x".repeat(300);
        let fixed = ObjectNaming::fixed("kd");
        let k = ServiceKey::new("c1", &long, &long);
        let n = fixed.name(&k);
        assert!(is_dns_name(&n), "{n}");
        assert!(n.len() <= 253);
        assert_eq!(n, fixed.name(&k));
        let k2 = ServiceKey::new("c1", &long, format!("{long}y"));
        assert_ne!(n, fixed.name(&k2));
        let odd = ObjectNaming::source().name(&ServiceKey::new("", "ns", "Bad_Name"));
        assert!(is_dns_name(&odd), "{odd}");
    }

    #[test]
    fn label_values_are_valid() {
        assert_eq!(label_value("web"), "web");
        assert_eq!(label_value(""), "");
        let v = label_value(&"a".repeat(100));
        assert!(is_label_value(&v) && v.len() <= 63, "{v}");
        assert_ne!(v, label_value(&"a".repeat(101)));
    }

    #[test]
    fn written_objects_carry_their_status() {
        let mut s = svc("", "default", "plat-dev", None);
        s.ports
            .insert("admin".into(), vec![Node::new("10.5.10.111", 9000, 1)]);
        let s = ServiceNodes::new(s.key.clone(), s.source, s.ports.clone(), None);
        let now = Time(jiff::Timestamp::UNIX_EPOCH);
        let written = desired_objects_at(&s, &ObjectNaming::source(), &[], &now);
        let plain = desired_objects(&s, &ObjectNaming::source());
        assert_eq!(written.len(), 1);
        assert!(plain[0].status.is_none());
        // Same object as compared/rendered, plus the status.
        let mut without = written[0].clone();
        let st = without.status.take().unwrap();
        assert_eq!(without, plain[0]);
        assert_eq!(st.node_count, 3);
        assert_eq!(st.ports, "admin,port");
        assert_eq!(st.last_sync_time, Some(now.clone()));
        assert_eq!(st.conditions, crate::conditions::conditions(&s, &[], &now));
        let c = &st.conditions[0];
        assert_eq!(
            (c.type_.as_str(), c.status.as_str(), c.reason.as_str()),
            ("Ready", "True", crate::conditions::ALL_PORTS_HAVE_NODES)
        );
        assert_eq!(c.message, "3 node(s) on port(s) admin, port");
        assert_eq!(c.last_transition_time, now);
        // A later write keeps the transition time of an unchanged condition.
        let later = Time(jiff::Timestamp::from_second(60).unwrap());
        let again = desired_objects_at(&s, &ObjectNaming::source(), &st.conditions, &later);
        let st2 = again[0].status.as_ref().unwrap();
        assert_eq!(st2.last_sync_time, Some(later));
        assert_eq!(st2.conditions[0].last_transition_time, now);
        // It serializes as a top-level `status` next to `spec` (one apply body).
        let json = serde_json::to_value(&written[0]).unwrap();
        assert_eq!(json["status"]["nodeCount"], 3);
        assert_eq!(json["status"]["ports"], "admin,port");
    }

    /// 20,000 endpoints x 3 ports: the nodes of every port, in order, over shards.
    fn big(endpoints: usize) -> ServiceNodes {
        let mut ports = PortMap::new();
        for (name, port) in [("http", 8080), ("grpc", 9090), ("metrics", 9100)] {
            let mut nodes: Vec<Node> = (0..endpoints)
                .map(|i| {
                    Node::new(
                        format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256),
                        port,
                        100,
                    )
                })
                .collect();
            crate::model::sort_nodes(&mut nodes);
            ports.insert(name.to_string(), nodes);
        }
        ServiceNodes::new(
            ServiceKey::new("", "shop", "big"),
            SourceKind::EndpointSlice,
            ports,
            Some("uid-1".into()),
        )
    }

    /// What a reader assembles: the node lists of every shard per port, sorted.
    fn merged(objs: &[DiscoveredService]) -> PortMap {
        let mut out = PortMap::new();
        for o in objs {
            for (p, n) in &o.spec.ports {
                out.entry(p.clone()).or_default().extend(n.iter().cloned());
            }
        }
        for nodes in out.values_mut() {
            crate::model::sort_nodes(nodes);
        }
        out
    }

    #[test]
    fn small_service_is_one_unsharded_object() {
        let s = svc("", "default", "plat-dev", Some("u"));
        let objs = desired_objects(&s, &ObjectNaming::source());
        assert_eq!(objs, vec![desired_object(&s, &ObjectNaming::source())]);
        assert_eq!(shard_of(&objs[0]), (0, 1));
        assert!(
            !objs[0]
                .metadata
                .labels
                .as_ref()
                .unwrap()
                .contains_key(LABEL_SHARD)
        );
    }

    #[test]
    fn big_service_is_split_under_the_limit_and_merges_back() {
        let s = big(20_000);
        let whole = serde_json::to_vec(&s.ports).unwrap().len();
        assert!(
            whole > 1_572_864,
            "the test service must not fit one object ({whole} bytes)"
        );
        let objs = desired_objects(&s, &ObjectNaming::source());
        let count = objs.len();
        assert!(
            count >= whole / MAX_OBJECT_PORTS_BYTES,
            "{count} shards for {whole} bytes"
        );
        for (i, o) in objs.iter().enumerate() {
            let i = u32::try_from(i).unwrap();
            let ports_len = serde_json::to_vec(&o.spec.ports).unwrap().len();
            assert!(
                ports_len <= MAX_OBJECT_PORTS_BYTES,
                "shard {i}: {ports_len} bytes"
            );
            assert!(serde_json::to_vec(o).unwrap().len() < 1_572_864);
            assert_eq!(shard_of(o), (i, u32::try_from(count).unwrap()));
            assert_eq!(
                o.metadata.name.as_deref(),
                Some(shard_name("big", i).as_str())
            );
            assert_eq!(
                o.metadata.labels.as_ref().unwrap()[LABEL_SHARD],
                i.to_string()
            );
            // Shard 0: the service's version and the manifest; others their own.
            let manifest = &objs[0].spec.shard.as_ref().unwrap().versions;
            assert_eq!(manifest.len(), count);
            if i == 0 {
                assert_eq!(o.spec.version, s.version);
            } else {
                assert_eq!(o.spec.version, manifest[i as usize]);
                assert!(o.spec.shard.as_ref().unwrap().versions.is_empty());
            }
            assert_eq!(
                o.metadata.owner_references.as_ref().unwrap()[0].uid,
                "uid-1"
            );
            assert!(o.spec.ports.values().all(|n| !n.is_empty()));
            for nodes in o.spec.ports.values() {
                assert!(nodes.is_sorted_by(|a, b| (&a.host, a.port) <= (&b.host, b.port)));
            }
            assert_eq!(key_of(o), s.key);
        }
        assert_eq!(merged(&objs), s.ports);
        // Per-object status counts that object's nodes; the conditions are
        // the whole service's, the same on every shard.
        let now = Time(jiff::Timestamp::UNIX_EPOCH);
        let written = desired_objects_at(&s, &ObjectNaming::source(), &[], &now);
        assert_eq!(written.len(), count);
        let mut total = 0;
        for (w, o) in written.iter().zip(&objs) {
            let st = w.status.as_ref().unwrap();
            let nodes: usize = o.spec.ports.values().map(Vec::len).sum();
            assert_eq!(st.node_count, i64::try_from(nodes).unwrap());
            assert_eq!(
                st.conditions[0].message,
                "60000 node(s) on port(s) grpc, http, metrics"
            );
            assert_eq!(w.spec, o.spec);
            total += st.node_count;
        }
        assert_eq!(total, 60_000);
    }

    /// The lazy objects ([`DesiredObjects`]) against an eager build written
    /// out here from the shard rules (partition every node, version every
    /// part from its own nodes): every shard built alone, in any order and
    /// in pairs, is that object, status included; names and versions come
    /// without building one. With and without the index's kept buckets, with
    /// a port of few nodes (absent from most shards) and unsharded.
    #[test]
    fn lazy_objects_are_the_eager_build_one_shard_at_a_time() {
        use crate::model::{Buckets, PortsDigest, SharedBuckets};
        let now = Time(jiff::Timestamp::UNIX_EPOCH);
        let naming = ObjectNaming::source();
        let mut sparse = big(20_000);
        sparse.ports.insert(
            "admin".into(),
            vec![Node::new("10.0.0.3", 1, 1), Node::new("10.0.0.9", 1, 1)],
        );
        let sparse = ServiceNodes::new(sparse.key, sparse.source, sparse.ports, sparse.owner_uid);
        let mut kept = sparse.clone();
        kept.buckets = SharedBuckets(Some(std::sync::Arc::new(Buckets::of(&kept.ports))));
        let small = svc("", "default", "plat-dev", Some("u"));
        for (what, s, limit) in [
            ("sharded", &sparse, MAX_OBJECT_PORTS_BYTES),
            ("kept buckets", &kept, MAX_OBJECT_PORTS_BYTES),
            ("tiny limit", &small, 1),
            ("unsharded", &small, MAX_OBJECT_PORTS_BYTES),
        ] {
            let lazy = DesiredObjects::with_limit(s, &naming, limit).at(&[], &now);
            let count = lazy.len();
            // The eager build, from the rules.
            let want: Vec<DiscoveredService> = if count == 1 {
                let mut o = desired_object(s, &naming);
                let conditions = crate::conditions::conditions(s, &[], &now);
                o.status = Some(object_status(&o, conditions, now.clone()));
                vec![o]
            } else {
                let parts = crate::shards::partition(&s.ports, count);
                let versions: Vec<String> = parts
                    .iter()
                    .zip(0u32..)
                    .map(|(p, i)| {
                        crate::shards::shard_version(
                            i,
                            count,
                            s.source,
                            p,
                            &PortsDigest::of(p),
                            s.owner_uid.as_deref(),
                            &s.extras,
                        )
                    })
                    .collect();
                parts
                    .into_iter()
                    .zip(0u32..)
                    .map(|(p, i)| {
                        let mut o = desired_object(s, &naming);
                        o.metadata.name = Some(shard_name("plat-dev", i))
                            .filter(|_| s.key.name == "plat-dev")
                            .or_else(|| Some(shard_name("big", i)));
                        o.metadata
                            .labels
                            .as_mut()
                            .unwrap()
                            .insert(LABEL_SHARD.into(), i.to_string());
                        o.spec.ports = p;
                        if i > 0 {
                            o.spec.version = versions[i as usize].clone();
                        }
                        o.spec.shard = Some(Shard {
                            index: i,
                            count,
                            versions: if i == 0 { versions.clone() } else { Vec::new() },
                        });
                        let conditions = crate::conditions::conditions(s, &[], &now);
                        o.status = Some(object_status(&o, conditions, now.clone()));
                        o
                    })
                    .collect()
            };
            assert!(lazy.all() == want, "{what}");
            assert!(
                limit != MAX_OBJECT_PORTS_BYTES
                    || desired_objects_at(s, &naming, &[], &now) == want,
                "{what}"
            );
            for (i, w) in (0u32..).zip(&want) {
                assert!(lazy.object(i).as_ref() == Some(w), "{what} {i}");
                assert_eq!(lazy.version(i), w.spec.version, "{what} {i}");
                assert_eq!(
                    lazy.name(i),
                    (
                        w.metadata.namespace.clone().unwrap(),
                        w.metadata.name.clone().unwrap()
                    )
                );
                assert_eq!(lazy.is_later_shard(i), i > 0);
                // In pairs, shard 0 last (how a write sends them).
                let pair = lazy.build(&[i, 0]);
                assert!(pair == [w.clone(), want[0].clone()], "{what} {i}");
            }
            assert!(lazy.object(count).is_none());
            match what {
                "unsharded" => assert_eq!(count, 1),
                "tiny limit" => assert_eq!(count, 2),
                _ => {
                    assert!(count >= 4, "{what}: {count}");
                    // The sparse port sits in shard 0 (every key) and in
                    // the shards of its nodes only.
                    let with_admin = want
                        .iter()
                        .filter(|o| o.spec.ports.contains_key("admin"))
                        .count();
                    assert!(with_admin <= 3, "{with_admin}");
                }
            }
        }
    }

    #[test]
    fn tiny_limit_splits_by_node_and_shard_zero_keeps_every_port_key() {
        let mut s = svc("", "default", "plat-dev", None);
        s.ports.insert("admin".into(), Vec::new());
        let s = ServiceNodes::new(s.key.clone(), s.source, s.ports.clone(), None);
        let objs = desired_objects_with_limit(&s, &ObjectNaming::source(), 1);
        // Two nodes: the count stops at 2 (a node cannot be split).
        assert_eq!(objs.len(), 2, "{objs:#?}");
        assert_eq!(merged(&objs), s.ports);
        assert_eq!(
            objs[0].spec.ports.keys().collect::<Vec<_>>(),
            ["admin", "port"]
        );
    }

    /// What a reader assembles of `objs` under [`consistent_shards`].
    fn assembled(objs: &[&DiscoveredService]) -> Result<PortMap, Incomplete> {
        let hs: Vec<ShardHead<'_>> = objs.iter().map(|o| ShardHead::of(o)).collect();
        let (take, legacy) = consistent_shards(&hs)?;
        assert!(!legacy);
        Ok(merged(
            &take.iter().map(|i| objs[*i].clone()).collect::<Vec<_>>(),
        ))
    }

    /// The shard count and the manifest: one endpoint more changes exactly
    /// one shard `i > 0` (and shard 0, whose manifest lists it), wherever
    /// it sorts; a reader takes a consistent set only.
    #[test]
    fn one_endpoint_more_changes_one_shard_and_shard_zero() {
        let s = big(20_000);
        let before = desired_objects(&s, &ObjectNaming::source());
        assert!(before.len() >= 4 && before.len().is_power_of_two());
        fn all(objs: &[DiscoveredService]) -> Vec<&DiscoveredService> {
            objs.iter().collect()
        }
        assert_eq!(assembled(&all(&before)).unwrap(), s.ports);
        for host in ["0.0.0.1", "10.0.0.0", "99.9.9.9", "10.0.0.1"] {
            // The endpoint on all three ports.
            let mut ports = s.ports.clone();
            for (port, nodes) in ports.iter_mut() {
                if host == "10.0.0.1" {
                    // A removal.
                    nodes.retain(|n| n.host != host);
                } else {
                    let number = nodes[0].port;
                    nodes.push(Node::new(host, number, 100));
                }
                crate::model::sort_nodes(nodes);
                assert!(!port.is_empty());
            }
            let t = ServiceNodes::new(s.key.clone(), s.source, ports, s.owner_uid.clone());
            let after = desired_objects(&t, &ObjectNaming::source());
            assert_eq!(after.len(), before.len());
            let changed: Vec<usize> = (0..after.len())
                .filter(|i| after[*i].spec != before[*i].spec)
                .collect();
            assert!(changed[0] == 0 && changed.len() <= 2, "{host}: {changed:?}");
            // Readers: the new set, the old set, and never the mixes.
            assert_eq!(assembled(&all(&after)).unwrap(), t.ports);
            if let [_, i] = changed[..] {
                // The changed shard written, shard 0 not yet.
                let mut mid = all(&before);
                mid[i] = &after[i];
                assert!(matches!(assembled(&mid), Err(Incomplete::Mismatch { .. })));
                // Shard 0 written, the changed shard not (or deleted).
                let mut mid = all(&after);
                mid[i] = &before[i];
                assert!(matches!(assembled(&mid), Err(Incomplete::Mismatch { .. })));
                mid.remove(i);
                assert_eq!(
                    assembled(&mid),
                    Err(Incomplete::Missing {
                        index: u32::try_from(i).unwrap(),
                        count: u32::try_from(after.len()).unwrap()
                    })
                );
            }
        }
    }

    #[test]
    fn objects_of_the_old_scheme_are_taken_when_their_versions_agree() {
        let s = big(20_000);
        let mut old = desired_objects(&s, &ObjectNaming::source());
        for o in &mut old {
            o.spec.version = s.version.clone();
            o.spec.shard.as_mut().unwrap().versions.clear();
        }
        let hs: Vec<ShardHead<'_>> = old.iter().map(ShardHead::of).collect();
        let (take, legacy) = consistent_shards(&hs).unwrap();
        assert!(legacy);
        assert_eq!(take, (0..old.len()).collect::<Vec<_>>());
        old[1].spec.version = "other".into();
        let hs: Vec<ShardHead<'_>> = old.iter().map(ShardHead::of).collect();
        assert!(matches!(
            consistent_shards(&hs),
            Err(Incomplete::Mismatch { index: 1, .. })
        ));
        // No shard 0 is incomplete; surplus shards of another count are ignored.
        let hs: Vec<ShardHead<'_>> = old.iter().skip(1).map(ShardHead::of).collect();
        assert_eq!(consistent_shards(&hs), Err(Incomplete::NoShardZero));
        let one = desired_objects(
            &svc("", "default", "plat-dev", None),
            &ObjectNaming::source(),
        );
        let mut with_surplus: Vec<ShardHead<'_>> = one.iter().map(ShardHead::of).collect();
        with_surplus.push(ShardHead::of(&old[1]));
        assert_eq!(consistent_shards(&with_surplus), Ok((vec![0], false)));
    }

    #[test]
    fn ports_fit_is_exactly_a_shard_count_of_one() {
        let s = big(30);
        let empty_lists = PortMap::from([("p".to_string(), vec![]), ("q".to_string(), vec![])]);
        for max in 0..4000 {
            assert_eq!(
                ports_fit(&s.ports, max),
                crate::shards::shard_count(&s.ports, max, node_json_len) == 1,
                "max {max}"
            );
            // Nothing to split: one object, fitting or not.
            assert_eq!(
                crate::shards::shard_count(&empty_lists, max, node_json_len),
                1
            );
        }
        assert!(ports_fit(&s.ports, MAX_OBJECT_PORTS_BYTES));
        assert!(ports_fit(&PortMap::new(), 0));
    }

    #[test]
    fn one_node_over_the_limit_stays_one_unsharded_object() {
        let s = svc("", "default", "plat-dev", None);
        let one = ServiceNodes::new(
            s.key.clone(),
            s.source,
            PortMap::from([("port".to_string(), vec![Node::new("10.0.0.1", 80, 1)])]),
            None,
        );
        assert!(!ports_fit(&one.ports, 8));
        let objs = desired_objects_with_limit(&one, &ObjectNaming::source(), 8);
        assert_eq!(objs, vec![desired_object(&one, &ObjectNaming::source())]);
    }

    #[test]
    fn shard_names_stay_valid_for_long_names() {
        let long = ServiceKey::new("c1", "n".repeat(63), "s".repeat(63));
        let base = ObjectNaming::fixed("kd").name(&long);
        let name = shard_name(&base, 4_000_000_000);
        assert!(is_dns_name(&name), "{name}");
        assert_ne!(shard_name(&base, 1), base);
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn whose_an_object_is_follows_the_instance_label_then_the_appliers_then_the_legacy_marks() {
        let managed = (LABEL_MANAGED_BY, MANAGED_BY);
        let none: [&str; 0] = [];
        // 1. The instance label decides, whoever applied.
        let ours = labels(&[managed, (LABEL_INSTANCE, "a")]);
        assert_eq!(owner_of("a", Some(&ours), ["kube-discovery/b"]), Owner::Us);
        assert_eq!(
            owner_of("b", Some(&ours), ["kube-discovery/b"]),
            Owner::Instance("a".into())
        );
        // 2. Label removed by someone: the applier names the instance.
        let stripped = labels(&[("app", "x")]);
        assert_eq!(
            owner_of("a", Some(&stripped), ["kubectl-edit", "kube-discovery/a"]),
            Owner::Us
        );
        assert_eq!(
            owner_of("a", Some(&stripped), ["kube-discovery/b"]),
            Owner::Instance("b".into())
        );
        // The drift manager and look-alikes are not instances.
        assert_eq!(
            owner_of(
                "a",
                Some(&stripped),
                ["kube-discovery-drift/b", "kube-discoveryx/a"]
            ),
            Owner::Unmanaged
        );
        // 3. Written before instances existed: adopted by every instance.
        let legacy = labels(&[managed]);
        assert_eq!(owner_of("a", Some(&legacy), none), Owner::Us);
        assert_eq!(owner_of("b", None, ["kube-discovery"]), Owner::Us);
        // 4. Anything else is not ours.
        assert_eq!(owner_of("a", None, none), Owner::Unmanaged);
        assert_eq!(
            owner_of(
                "a",
                Some(&labels(&[(LABEL_MANAGED_BY, "helm")])),
                ["kubectl-create"]
            ),
            Owner::Unmanaged
        );
    }

    #[test]
    fn only_server_side_apply_managers_say_whose_an_object_is() {
        let entry = |manager: Option<&str>, operation: &str| ManagedFieldsEntry {
            manager: manager.map(str::to_string),
            operation: Some(operation.to_string()),
            ..ManagedFieldsEntry::default()
        };
        let fields = vec![
            entry(Some("kube-discovery/b"), "Update"),
            entry(Some("kubectl-client-side-apply"), "Apply"),
            entry(None, "Apply"),
            entry(Some("kube-discovery/a"), "Apply"),
        ];
        let got: Vec<&str> = apply_managers(Some(&fields)).collect();
        assert_eq!(got, ["kubectl-client-side-apply", "kube-discovery/a"]);
        assert_eq!(apply_managers(None).count(), 0);
        let meta = ObjectMeta {
            managed_fields: Some(fields),
            ..ObjectMeta::default()
        };
        let a = ObjectNaming::source().with_instance("a");
        assert_eq!(a.owner_of_meta(&meta), Owner::Us);
        // The `Update` by instance b does not make it b's.
        let c = ObjectNaming::source().with_instance("c");
        assert_eq!(c.owner_of_meta(&meta), Owner::Instance("a".into()));
        // Issue 29 item 5: an instance that adopts `a` (its earlier name)
        // owns `a`'s objects; others' stay others'.
        let renamed = c.clone().with_adopted(vec!["a".into()]);
        assert_eq!(renamed.owner_of_meta(&meta), Owner::Us);
        let labelled = BTreeMap::from([(LABEL_INSTANCE.to_string(), "b".to_string())]);
        assert_eq!(
            renamed.owner_of(Some(&labelled), []),
            Owner::Instance("b".into())
        );
        assert_eq!(adopted(Owner::Unmanaged, &["a".into()]), Owner::Unmanaged);
    }

    #[test]
    fn objects_carry_the_instance_label_and_field_manager() {
        let naming = ObjectNaming::source().with_instance("edge");
        let obj = desired_object(&svc("", "default", "web", None), &naming);
        let l = obj.metadata.labels.unwrap();
        assert_eq!(l[LABEL_INSTANCE], "edge");
        assert_eq!(naming.owner_of(Some(&l), []), Owner::Us);
        assert_eq!(naming.field_manager(), "kube-discovery/edge");
        assert_eq!(naming.drift_field_manager(), "kube-discovery-drift/edge");
        assert_eq!(ObjectNaming::default().instance, DEFAULT_INSTANCE);
    }

    #[test]
    fn a_64_character_cluster_id_gives_valid_names_and_labels_and_stays_whole_in_the_spec() {
        let id = "a123456789b123456789c123456789d123456789e123456789f123456789abcd";
        assert_eq!(id.len(), 64);
        for naming in [ObjectNaming::source(), ObjectNaming::fixed("kd")] {
            let obj = desired_object(&svc(id, "default", "web", None), &naming);
            let name = obj.metadata.name.as_deref().unwrap();
            assert!(is_dns_name(name) && name.len() <= 63, "{name}");
            let labels = obj.metadata.labels.as_ref().unwrap();
            let cluster = &labels[LABEL_CLUSTER];
            assert!(is_label_value(cluster) && cluster.len() <= 63, "{cluster}");
            assert_ne!(cluster, id);
            assert_eq!(obj.spec.cluster, id);
            assert_eq!(obj.spec.service, format!("{id}/default/web"));
            // Another long id gets other names.
            let other = id.replace('a', "z");
            let o2 = desired_object(&svc(&other, "default", "web", None), &naming);
            assert_ne!(o2.metadata.name, obj.metadata.name);
            assert_ne!(o2.metadata.labels.unwrap()[LABEL_CLUSTER], *cluster);
        }
    }

    #[test]
    fn stamp_sets_status_and_every_condition() {
        let s = svc("", "default", "web", None);
        let now = Time(jiff::Timestamp::UNIX_EPOCH);
        let mut obj = desired_objects_at(&s, &ObjectNaming::source(), &[], &now).remove(0);
        assert_eq!(stamped_generation(&obj), None);
        stamp_generation(&mut obj, Some(7));
        let st = obj.status.as_ref().unwrap();
        assert_eq!(st.observed_generation, Some(7));
        assert!(!st.conditions.is_empty());
        assert!(
            st.conditions
                .iter()
                .all(|c| c.observed_generation == Some(7))
        );
        stamp_generation(&mut obj, None);
        assert_eq!(stamped_generation(&obj), None);
        let json = serde_json::to_value(&obj).unwrap();
        assert!(json["status"].get("observedGeneration").is_none());
    }

    /// The API server as far as generations go: an apply bumps the
    /// generation by one when it changes the object (here: the stamp or the
    /// content), else leaves it.
    struct Server {
        generation: i64,
        stamp: Option<i64>,
        content: u32,
    }

    impl Server {
        fn apply(&mut self, content: u32, stamp: Option<i64>) -> i64 {
            if (content, stamp) != (self.content, self.stamp) {
                self.generation += 1;
            }
            (self.content, self.stamp) = (content, stamp);
            self.generation
        }
    }

    /// From every starting state (what the server holds, what the writer
    /// remembers, whether the content changes) the writer's first apply
    /// plus at most two corrections end with `observedGeneration ==
    /// generation`, and a right guess needs no correction.
    #[test]
    fn generation_fix_always_settles_within_two_more_applies() {
        for generation in 1..6_i64 {
            for stamp in [
                None,
                Some(0),
                Some(generation - 1),
                Some(generation),
                Some(generation + 1),
                Some(generation + 2),
            ] {
                for remembered in [
                    None,
                    Some(generation - 2),
                    Some(generation - 1),
                    Some(generation),
                    Some(generation + 3),
                ] {
                    for content in [1_u32, 2] {
                        let mut server = Server {
                            generation,
                            stamp,
                            content: 1,
                        };
                        let mut sent = Some(remembered.map_or(1, |g| g + 1));
                        let mut got = server.apply(content, sent);
                        let mut extra = 0;
                        while let Some(next) = generation_fix(sent, Some(got)) {
                            extra += 1;
                            assert!(
                                extra <= 2,
                                "no end: g{generation} s{stamp:?} m{remembered:?} c{content}"
                            );
                            sent = next;
                            got = server.apply(content, sent);
                        }
                        assert_eq!(sent, Some(got));
                        assert_eq!((server.generation, server.stamp), (got, Some(got)));
                        let right = remembered == Some(generation)
                            && (content != 1 || stamp != Some(generation + 1));
                        if right {
                            assert_eq!(extra, 0, "g{generation} s{stamp:?} c{content}");
                        }
                    }
                }
            }
        }
        assert_eq!(
            generation_fix(Some(3), None),
            None,
            "no generation in the answer: nothing to check"
        );
    }
}

#[cfg(test)]
mod reader_rule_tests {
    //! [`ReaderRule`]: everything the writer produces is accepted, in every
    //! naming mode; each way of claiming another service is refused.

    use super::*;
    use crate::model::PortMap;

    fn web(cluster: &str) -> ServiceNodes {
        ServiceNodes::new(
            ServiceKey::new(cluster, "default", "web"),
            SourceKind::EndpointSlice,
            PortMap::from([(
                "http".to_string(),
                vec![
                    Node::new("10.0.0.1", 8080, 1),
                    Node::new("10.0.0.2", 8080, 1),
                ],
            )]),
            Some("uid-1".into()),
        )
    }

    fn namings() -> [ObjectNaming; 2] {
        [ObjectNaming::source(), ObjectNaming::fixed("kd")]
    }

    #[test]
    fn the_writers_objects_are_accepted_in_every_naming_mode() {
        let long = "s".repeat(70);
        for naming in namings() {
            let rule = ReaderRule::new(naming.clone());
            for cluster in ["", "c1"] {
                let s = web(cluster);
                // Unsharded, and sharded (one node per shard).
                for objs in [
                    desired_objects(&s, &naming),
                    desired_objects_with_limit(&s, &naming, 1),
                ] {
                    for o in &objs {
                        assert_eq!(rule.check(o), Ok(s.key.clone()), "{naming:?} {o:?}");
                    }
                }
                // A name the naming scheme shortens and hashes.
                let odd = ServiceNodes::new(
                    ServiceKey::new(cluster, "default", format!("Bad_{long}")),
                    SourceKind::Endpoints,
                    s.ports.clone(),
                    None,
                );
                for o in desired_objects_with_limit(&odd, &naming, 1) {
                    assert_eq!(rule.check(&o), Ok(odd.key.clone()), "{naming:?} {o:?}");
                }
            }
        }
    }

    #[test]
    fn an_object_in_another_namespace_is_refused() {
        let naming = ObjectNaming::source();
        let mut evil = desired_object(&web(""), &naming);
        evil.metadata.namespace = Some("evil".into());
        assert_eq!(
            ReaderRule::new(naming).check(&evil),
            Err(Disagreement::Namespace {
                service: "default/web".into(),
                expected: "default".into(),
                actual: "evil".into()
            })
        );
        // Fixed mode: only the configured namespace, not the source's.
        let fixed = ObjectNaming::fixed("kd");
        let mut other = desired_object(&web(""), &fixed);
        other.metadata.namespace = Some("default".into());
        let e = ReaderRule::new(fixed).check(&other).unwrap_err();
        assert!(matches!(e, Disagreement::Namespace { .. }), "{e}");
        // A fixed-mode object read with the source rule (wrong namespace).
        let kd = desired_object(&web(""), &ObjectNaming::fixed("kd"));
        let e = ReaderRule::default().check(&kd).unwrap_err();
        assert!(matches!(e, Disagreement::Namespace { .. }), "{e}");
        assert_eq!(
            e.to_string(),
            "default/web belongs in namespace \"default\", not \"kd\""
        );
    }

    #[test]
    fn a_wrong_name_is_refused() {
        let rule = ReaderRule::default();
        let base = desired_object(&web(""), &rule.naming);
        for (name, expected) in [
            ("web-evil", "web"),
            ("web.1", "web"),
            ("c1.web", "web"),
            ("", "web"),
        ] {
            let mut o = base.clone();
            o.metadata.name = Some(name.into());
            assert_eq!(
                rule.check(&o),
                Err(Disagreement::Name {
                    service: "default/web".into(),
                    expected: expected.into(),
                    actual: name.into()
                })
            );
        }
        // A shard must carry its shard name.
        let sharded = desired_objects_with_limit(&web(""), &rule.naming, 1);
        let mut second = sharded[1].clone();
        second.metadata.name = Some("web".into());
        assert!(matches!(
            rule.check(&second),
            Err(Disagreement::Name { expected, .. }) if expected == "web.1"
        ));
        // Multi-cluster: the cluster is part of the name.
        let mut c1 = desired_object(&web("c1"), &rule.naming);
        c1.metadata.name = Some("web".into());
        assert!(matches!(rule.check(&c1), Err(Disagreement::Name { .. })));
    }

    #[test]
    fn labels_that_disagree_with_the_spec_are_refused() {
        let rule = ReaderRule::default();
        let base = desired_object(&web(""), &rule.naming);
        let cases: [(&str, Option<&str>); 6] = [
            (LABEL_SERVICE_NAME, Some("api")),
            (LABEL_SERVICE_NAMESPACE, Some("evil")),
            (LABEL_CLUSTER, Some("c1")),
            (LABEL_MANAGED_BY, Some("someone-else")),
            (LABEL_SERVICE_NAME, None),
            (LABEL_SHARD, Some("1")),
        ];
        for (label, value) in cases {
            let mut o = base.clone();
            let labels = o.metadata.labels.get_or_insert_default();
            match value {
                Some(v) => labels.insert(label.into(), v.into()),
                None => labels.remove(label),
            };
            let e = rule.check(&o).unwrap_err();
            assert!(
                matches!(&e, Disagreement::Label { label: l, .. } if *l == label),
                "{label}={value:?}: {e}"
            );
        }
        // No labels at all.
        let mut bare = base.clone();
        bare.metadata.labels = None;
        let e = rule.check(&bare).unwrap_err();
        assert!(matches!(e, Disagreement::Label { .. }));
        assert_eq!(
            e.to_string(),
            "label app.kubernetes.io/managed-by is absent, the spec of default/web wants \"kube-discovery\""
        );
        // A shard whose label names another shard.
        let mut sharded = desired_objects_with_limit(&web(""), &rule.naming, 1);
        sharded[1]
            .metadata
            .labels
            .get_or_insert_default()
            .insert(LABEL_SHARD.into(), "0".into());
        assert!(matches!(
            rule.check(&sharded[1]),
            Err(Disagreement::Label {
                label: LABEL_SHARD,
                ..
            })
        ));
        // Extra labels are someone else's business.
        let mut extra = base.clone();
        extra
            .metadata
            .labels
            .get_or_insert_default()
            .insert("team".into(), "x".into());
        assert!(rule.check(&extra).is_ok());
    }

    #[test]
    fn an_unsharded_object_may_keep_shard_label_zero_while_unsharding() {
        let rule = ReaderRule::default();
        let mut o = desired_object(&web(""), &rule.naming);
        o.metadata
            .labels
            .get_or_insert_default()
            .insert(LABEL_SHARD.into(), "0".into());
        assert!(rule.check(&o).is_ok());
    }

    #[test]
    fn a_spec_that_disagrees_with_itself_is_refused() {
        let rule = ReaderRule::default();
        let mut o = desired_object(&web(""), &rule.naming);
        o.spec.service = "default/api".into();
        assert!(matches!(rule.check(&o), Err(Disagreement::Service { .. })));
        let mut o = desired_objects_with_limit(&web(""), &rule.naming, 1)[1].clone();
        o.spec.shard = Some(Shard {
            index: 2,
            count: 2,
            versions: Vec::new(),
        });
        assert_eq!(
            rule.check(&o),
            Err(Disagreement::Shard { index: 2, count: 2 })
        );
    }

    #[test]
    fn a_reader_told_the_instance_counts_only_that_installations_objects() {
        let obj = desired_object(&web(""), &ObjectNaming::source().with_instance("edge"));
        let any = ReaderRule::new(ObjectNaming::source());
        assert!(any.check(&obj).is_ok());
        let edge = any.clone().for_instance(Some("edge".into()));
        assert!(edge.check(&obj).is_ok());
        let other = any.for_instance(Some("other".into()));
        let err = other.check(&obj).unwrap_err();
        assert_eq!(
            err.to_string(),
            "label kubediscovery.io/instance is \"edge\", the spec of default/web wants \"other\""
        );
        let mut unlabelled = obj.clone();
        unlabelled
            .metadata
            .labels
            .as_mut()
            .unwrap()
            .remove(LABEL_INSTANCE);
        assert!(
            other.check(&unlabelled).is_err(),
            "no label: not that instance's"
        );
    }
}
