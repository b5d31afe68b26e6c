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
//! keys, the `Ready` and `Degraded` conditions of [`crate::crd::conditions`]) is
//! derived from what the controller writes into the spec. So the
//! CRD has NO status subresource ([`definition`] removes the one kube's derive
//! adds): `status` is a plain field, written in the SAME server-side apply as
//! the spec ([`desired_objects_at`]), one API request per object instead of
//! two. The printer columns still read `.status.ports`, `.status.nodeCount`
//! and the `Ready` condition. (Without the subresource every apply that
//! changes anything bumps `metadata.generation`; hence no
//! `observedGeneration`, see [`crate::crd::conditions`].)
//!
//! Files: `naming` (object names, labels), `ownership` (instances),
//! `objects` (the desired objects of a service, sharded when big), `shards`
//! (the stable partition and per-shard versions), `conditions` (status),
//! `reader` (what readers accept).

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

mod naming;
mod objects;
mod ownership;
mod reader;

pub mod conditions;
pub mod shards;

pub use naming::{NamespaceMode, ObjectNaming, label_value, labels_for};
pub use objects::{
    DesiredObjects, LABEL_SHARD, MAX_OBJECT_PORTS_BYTES, desired_object, desired_objects,
    desired_objects_at, desired_objects_with_limit, node_json_len, object_status, ports_fit,
    shard_name, shard_of,
};
pub use ownership::{Owner, adopted, apply_managers, owner_from, owner_of};
pub use reader::{Disagreement, Incomplete, ReaderRule, ShardHead, consistent_shards};

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
    /// `Degraded` (source data was skipped); see `kube_discovery_core::crd::conditions`.
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

/// The service an existing object describes (from its spec), e.g. to rebuild
/// the "what the API server holds" cache after a restart.
pub fn key_of(ds: &DiscoveredService) -> ServiceKey {
    ServiceKey::new(
        &ds.spec.cluster,
        &ds.spec.source_namespace,
        &ds.spec.source_name,
    )
}

#[cfg(test)]
mod reader_tests;
#[cfg(test)]
mod tests;
