//! How our DiscoveredServices are decoded: lean, never as whole objects.
//!
//! * [`Watched`], for the drift watch: name, namespace and resourceVersion
//!   (all the watcher itself needs), the service its spec describes and its
//!   [`Facts`]; `managedFields`, annotations and status are skipped while
//!   parsing, the labels, owner references and nodes are reduced and dropped.
//! * [`Lean`], for the sink's start-up list: the object without its nodes.
//!
//! Both implement `kube::Resource` with the CRD's URLs (`discovered_service_resource!`).

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::NamespaceResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    Condition, ManagedFieldsEntry, ObjectMeta, OwnerReference, Time,
};
use kube::Resource;
use kube_discovery_core::ServiceKey;
use kube_discovery_core::crd::{
    DiscoveredService, DiscoveredServiceSpec, DiscoveredServiceStatus, LABEL_INSTANCE,
    LABEL_MANAGED_BY, LEGACY_FIELD_MANAGER, MANAGED_BY, Owner, apply_managers, owner_from,
};

use kube_discovery_core::crd::{ObjectNaming, adopted};
use kube_discovery_core::write_plan::record::{Facts, ObjectSeen, stamp_ok};

/// A DiscoveredService as the drift watch decodes it: name, namespace and
/// resourceVersion (all the watcher itself needs), the service its spec
/// describes, and its [`Facts`]. `managedFields`, annotations and status
/// are skipped while parsing; the labels, owner references and nodes are
/// reduced and dropped. Every write of ours comes back as a watch event,
/// so this decode runs once per write.
#[derive(Debug, Clone)]
pub struct Watched {
    pub(super) meta: ObjectMeta,
    pub(super) key: ServiceKey,
    pub(super) facts: Facts,
    pub(super) mark: OwnerMark,
}

/// What says whose an object is ([`kube_discovery_core::crd::owner_from`]):
/// the instance label, the managed-by label, and the kube-discovery field
/// managers among its server-side appliers (others are dropped while
/// parsing). Usually one short string.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnerMark {
    instance: Option<Box<str>>,
    managed_by: bool,
    appliers: Vec<Box<str>>,
}

impl OwnerMark {
    fn of(labels: Option<&BTreeMap<String, String>>, fields: &[ManagedFieldsEntry]) -> Self {
        let label = |k: &str| labels.and_then(|l| l.get(k));
        OwnerMark {
            instance: label(LABEL_INSTANCE).map(|v| v.as_str().into()),
            managed_by: label(LABEL_MANAGED_BY).is_some_and(|v| v == MANAGED_BY),
            appliers: apply_managers(Some(fields))
                .filter(|m| m.starts_with(LEGACY_FIELD_MANAGER))
                .map(Into::into)
                .collect(),
        }
    }

    /// Whose the object is for the instance `instance`.
    pub fn owner(&self, instance: &str) -> Owner {
        owner_from(
            instance,
            self.instance.as_deref(),
            self.managed_by,
            self.appliers.iter().map(|m| &**m),
        )
    }
}

impl Watched {
    /// `obj` reduced as the watch reduces it.
    pub fn of(obj: &DiscoveredService) -> Self {
        Watched {
            meta: ObjectMeta {
                name: obj.metadata.name.clone(),
                namespace: obj.metadata.namespace.clone(),
                resource_version: obj.metadata.resource_version.clone(),
                generation: obj.metadata.generation,
                ..ObjectMeta::default()
            },
            key: spec_key(&obj.spec),
            facts: Facts::of_object(obj),
            mark: OwnerMark::of(
                obj.metadata.labels.as_ref(),
                obj.metadata.managed_fields.as_deref().unwrap_or_default(),
            ),
        }
    }

    pub(super) fn ns(&self) -> &str {
        self.meta.namespace.as_deref().unwrap_or_default()
    }

    pub(super) fn name(&self) -> &str {
        self.meta.name.as_deref().unwrap_or_default()
    }

    pub(super) fn resource_version(&self) -> Option<u64> {
        self.meta.resource_version.as_deref()?.parse().ok()
    }

    /// Whose it is for `naming`'s instance (its adopted instances count as
    /// ours).
    pub(super) fn owner(&self, naming: &ObjectNaming) -> Owner {
        adopted(self.mark.owner(&naming.instance), &naming.adopt)
    }

    /// The plain facts the record takes, with `owner` ([`Watched::owner`]).
    pub(super) fn seen<'a>(&'a self, owner: &'a Owner) -> ObjectSeen<'a> {
        ObjectSeen {
            ns: self.ns(),
            name: self.name(),
            key: &self.key,
            owner,
            facts: &self.facts,
            resource_version: self.resource_version(),
            generation: self.meta.generation,
        }
    }
}

fn spec_key(spec: &DiscoveredServiceSpec) -> ServiceKey {
    ServiceKey::new(&spec.cluster, &spec.source_namespace, &spec.source_name)
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct LeanMeta {
    name: Option<String>,
    namespace: Option<String>,
    labels: Option<BTreeMap<String, String>>,
    owner_references: Option<Vec<OwnerReference>>,
    resource_version: Option<String>,
    uid: Option<String>,
    generation: Option<i64>,
    /// Only `manager` and `operation` of each entry are read.
    managed_fields: Option<Vec<LeanManagedField>>,
}

/// A `managedFields` entry as decoded: `fieldsV1` is skipped while parsing.
#[derive(serde::Deserialize)]
struct LeanManagedField {
    manager: Option<String>,
    operation: Option<String>,
}

impl LeanManagedField {
    fn into_entry(self) -> ManagedFieldsEntry {
        ManagedFieldsEntry {
            manager: self.manager,
            operation: self.operation,
            ..ManagedFieldsEntry::default()
        }
    }
}

fn entries(fields: Option<Vec<LeanManagedField>>) -> Option<Vec<ManagedFieldsEntry>> {
    fields.map(|v| v.into_iter().map(LeanManagedField::into_entry).collect())
}

#[derive(serde::Deserialize)]
struct LeanObject {
    metadata: LeanMeta,
    spec: DiscoveredServiceSpec,
    /// Only `observedGeneration` is read.
    #[serde(default)]
    status: Option<LeanStamp>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct LeanStamp {
    #[serde(default)]
    observed_generation: Option<i64>,
}

impl<'de> serde::Deserialize<'de> for Watched {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let LeanObject {
            metadata: m,
            spec,
            status,
        } = LeanObject::deserialize(d)?;
        let fields = entries(m.managed_fields).unwrap_or_default();
        let observed = status.and_then(|s| s.observed_generation);
        Ok(Watched {
            mark: OwnerMark::of(m.labels.as_ref(), &fields),
            facts: Facts {
                stamp_ok: stamp_ok(m.generation, observed),
                ..Facts::of(m.labels.as_ref(), m.owner_references.as_deref(), &spec)
            },
            key: spec_key(&spec),
            meta: ObjectMeta {
                name: m.name,
                namespace: m.namespace,
                resource_version: m.resource_version,
                generation: m.generation,
                ..ObjectMeta::default()
            },
        })
    }
}

/// `kube::Resource` for a lean view of a DiscoveredService (`$meta` is the
/// path of its `ObjectMeta`): the watch and list URLs are the CRD's.
macro_rules! discovered_service_resource {
    ($ty:ty, $($meta:tt)+) => {
        impl Resource for $ty {
            type DynamicType = ();
            type Scope = NamespaceResourceScope;

            fn kind(dt: &()) -> Cow<'_, str> {
                DiscoveredService::kind(dt)
            }
            fn group(dt: &()) -> Cow<'_, str> {
                DiscoveredService::group(dt)
            }
            fn version(dt: &()) -> Cow<'_, str> {
                DiscoveredService::version(dt)
            }
            fn plural(dt: &()) -> Cow<'_, str> {
                DiscoveredService::plural(dt)
            }
            fn meta(&self) -> &ObjectMeta {
                &self.$($meta)+
            }
            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.$($meta)+
            }
        }
    };
}

discovered_service_resource!(Watched, meta);

/// A DiscoveredService decoded lean for the sink's start-up list
/// (`Sink::list_versions`, page by page): name, namespace, labels, owner
/// references, uid, resourceVersion, the spec WITHOUT nodes and the status
/// conditions; `managedFields`, annotations and the rest of the status are
/// skipped while parsing.
#[derive(Debug, Clone)]
pub(crate) struct Lean(DiscoveredService);

/// [`LeanObject`] and the status conditions (the sink keeps their
/// `lastTransitionTime` across restarts, `kube_discovery_core::crd::conditions`).
#[derive(serde::Deserialize)]
struct LeanListed {
    metadata: LeanMeta,
    spec: DiscoveredServiceSpec,
    #[serde(default)]
    status: Option<LeanStatus>,
}

#[derive(serde::Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct LeanStatus {
    #[serde(default)]
    conditions: Option<Vec<LeanCondition>>,
    #[serde(default)]
    observed_generation: Option<i64>,
}

/// A condition as listed, every field optional and the time parsed
/// leniently: an odd condition (edited by hand) is dropped, never a failed
/// start-up list.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct LeanCondition {
    #[serde(default, rename = "type")]
    type_: Option<String>,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    last_transition_time: Option<String>,
}

impl LeanCondition {
    fn into_condition(self) -> Option<Condition> {
        let time = self.last_transition_time?.parse::<jiff::Timestamp>().ok()?;
        Some(Condition {
            type_: self.type_?,
            status: self.status?,
            reason: self.reason.unwrap_or_default(),
            message: self.message.unwrap_or_default(),
            last_transition_time: Time(time),
            observed_generation: None,
        })
    }
}

impl<'de> serde::Deserialize<'de> for Lean {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let LeanListed {
            metadata: m,
            mut spec,
            status,
        } = LeanListed::deserialize(d)?;
        spec.ports = Default::default();
        let status = status.unwrap_or_default();
        let observed_generation = status.observed_generation;
        let conditions: Vec<Condition> = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .filter_map(LeanCondition::into_condition)
            .collect();
        let status = (!conditions.is_empty() || observed_generation.is_some()).then(|| {
            DiscoveredServiceStatus {
                conditions,
                observed_generation,
                ..DiscoveredServiceStatus::default()
            }
        });
        Ok(Lean(DiscoveredService {
            metadata: ObjectMeta {
                name: m.name,
                namespace: m.namespace,
                labels: m.labels,
                owner_references: m.owner_references,
                resource_version: m.resource_version,
                uid: m.uid,
                generation: m.generation,
                managed_fields: entries(m.managed_fields),
                ..ObjectMeta::default()
            },
            spec,
            status,
        }))
    }
}

discovered_service_resource!(Lean, 0.metadata);

impl Lean {
    /// The object (no nodes, see the type docs).
    pub(crate) fn into_inner(self) -> DiscoveredService {
        self.0
    }
}

#[cfg(test)]
mod tests;
