//! What drift compares: an object reduced to its [`Facts`] (a 64-bit digest
//! of the WHOLE spec, whether our labels are present, digests of its owner
//! references) and a wanted object reduced to the same form
//! ([`WantedObject`]).
//!
//! ```text
//!  cached object ──Facts::of──▶ { spec digest, our labels present?, owner digests }
//!                                         │ satisfies
//!  ControllerState::desired(key) ──wanted_objects──▶ [WantedObject { ns, name, spec digest, our owners }]
//! ```
//!
//! The spec digest ([`SpecView`]) covers every field including the nodes; it
//! is built by exhaustive destructuring, so a new spec field does not compile
//! until it is hashed. "Our labels" are a function of the spec
//! ([`labels_for`] the service it describes, plus [`LABEL_SHARD`] with the
//! shard index when sharded): two objects with equal spec digests want the
//! same labels, so one bit answers "our labels present" for any wanted object
//! the spec digest matches. Labels others add are never looked at.
//!
//! No copies of the nodes: for a service that fits one object
//! (`crate::crd::ports_fit`, the size estimate `split_ports`
//! uses), the wanted spec digest is computed straight from `ServiceNodes`
//! (borrowed); only a service that needs shards is expanded with
//! `desired_objects` and each shard reduced. A sweep over every service
//! therefore clones no node.

use std::collections::BTreeMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};

use crate::crd::{
    DiscoveredService, DiscoveredServiceSpec, LABEL_INSTANCE, LABEL_SHARD, ObjectNaming, Shard,
    desired_objects_with_limit, labels_for, ports_fit,
};
use crate::write_plan::{SeenObject, WantedObjectFacts};
use crate::{PortMap, ServiceKey, ServiceNodes, SourceKind};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

/// A 64-bit fingerprint of a port map (every port key and every field of
/// every node). Process-local: only ever compared with another digest of the
/// same process (std's `DefaultHasher::new()` has fixed keys).
pub fn ports_digest(ports: &PortMap) -> u64 {
    let mut h = DefaultHasher::new();
    ports.hash(&mut h);
    h.finish()
}

/// A spec by reference: what [`SpecView::digest`] hashes. Built from an
/// object's spec ([`SpecView::of`], exhaustive destructuring) or straight
/// from a `ServiceNodes` ([`wanted_objects`], a struct literal): a new
/// spec field fails to compile in both until it is added here.
struct SpecView<'a> {
    cluster: &'a str,
    service: &'a str,
    source_namespace: &'a str,
    source_name: &'a str,
    source: SourceKind,
    ports: &'a PortMap,
    aliases: &'a BTreeMap<String, String>,
    app_protocols: &'a BTreeMap<String, String>,
    version: &'a str,
    /// `(index, count, manifest)`.
    shard: Option<(u32, u32, &'a [String])>,
}

impl<'a> SpecView<'a> {
    fn of(spec: &'a DiscoveredServiceSpec) -> Self {
        let DiscoveredServiceSpec {
            cluster,
            service,
            source_namespace,
            source_name,
            source,
            ports,
            aliases,
            app_protocols,
            version,
            shard,
        } = spec;
        SpecView {
            cluster,
            service,
            source_namespace,
            source_name,
            source: *source,
            ports,
            aliases,
            app_protocols,
            version,
            shard: shard.as_ref().map(
                |Shard {
                     index,
                     count,
                     versions,
                 }| (*index, *count, versions.as_slice()),
            ),
        }
    }

    /// 64-bit digest of every field.
    fn digest(&self) -> u64 {
        let SpecView {
            cluster,
            service,
            source_namespace,
            source_name,
            source,
            ports,
            aliases,
            app_protocols,
            version,
            shard,
        } = self;
        let mut h = DefaultHasher::new();
        cluster.hash(&mut h);
        service.hash(&mut h);
        source_namespace.hash(&mut h);
        source_name.hash(&mut h);
        source.hash(&mut h);
        ports.hash(&mut h);
        aliases.hash(&mut h);
        app_protocols.hash(&mut h);
        version.hash(&mut h);
        shard.hash(&mut h);
        h.finish()
    }
}

/// Digest of one ownerReference as [`matches()`] compares it.
fn owner_digest(api_version: &str, kind: &str, name: &str, uid: &str) -> u64 {
    let mut h = DefaultHasher::new();
    api_version.hash(&mut h);
    kind.hash(&mut h);
    name.hash(&mut h);
    uid.hash(&mut h);
    h.finish()
}

/// Owner-reference digests of an object; one inline (the usual case).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owners {
    /// No owner reference.
    None,
    /// One (the usual case).
    One(u64),
    // A thin pointer keeps the slot small; more than one owner is rare.
    #[allow(clippy::box_collection)]
    /// More than one, sorted.
    Many(Box<Vec<u64>>),
}

impl Owners {
    fn of(refs: &[OwnerReference]) -> Self {
        let mut digests: Vec<u64> = refs
            .iter()
            .map(|o| owner_digest(&o.api_version, &o.kind, &o.name, &o.uid))
            .collect();
        match digests.len() {
            0 => Owners::None,
            1 => Owners::One(digests[0]),
            _ => {
                digests.sort_unstable();
                digests.dedup();
                Owners::Many(Box::new(digests))
            }
        }
    }

    fn contains(&self, d: u64) -> bool {
        match self {
            Owners::None => false,
            Owners::One(o) => *o == d,
            Owners::Many(v) => v.binary_search(&d).is_ok(),
        }
    }

    /// The digests, for the planner's drift check.
    pub(crate) fn to_vec(&self) -> Vec<u64> {
        match self {
            Owners::None => Vec::new(),
            Owners::One(o) => vec![*o],
            Owners::Many(v) => v.to_vec(),
        }
    }
}

/// Whether `labels` carry our labels for `spec` with our values: the
/// labels of [`labels_for`] the service the spec describes, plus
/// [`LABEL_SHARD`] = index when the spec is a shard (what
/// `desired_objects` sets).
fn our_labels_present(
    labels: Option<&BTreeMap<String, String>>,
    spec: &DiscoveredServiceSpec,
) -> bool {
    let key = ServiceKey::new(&spec.cluster, &spec.source_namespace, &spec.source_name);
    let get = |k: &str| labels.and_then(|l| l.get(k));
    // The instance label only has to be there: an object with another
    // instance's value is not ours and never reaches the cache
    // (`OwnerMark::owner`).
    labels_for(&key, "").iter().all(|(k, v)| {
        if k == LABEL_INSTANCE {
            get(k).is_some()
        } else {
            get(k) == Some(v)
        }
    }) && spec
        .shard
        .as_ref()
        .is_none_or(|s| get(LABEL_SHARD).is_some_and(|v| *v == s.index.to_string()))
}

/// What drift compares of an object (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Facts {
    /// The digest of the whole spec.
    pub spec: u64,
    /// The digests of its owner references.
    pub owners: Owners,
    /// Our labels are present with our values.
    pub labels_ok: bool,
    /// `status.observedGeneration` is absent (an object written before the
    /// stamp existed: the start-up list has it rewritten, without a repair)
    /// or equals `metadata.generation`. A different value means someone
    /// changed the object after our last write (also only its status,
    /// which the spec digest does not see).
    pub stamp_ok: bool,
}

/// Whether an object's `observedGeneration` agrees with its generation
/// ([`Facts::stamp_ok`]).
pub fn stamp_ok(generation: Option<i64>, observed: Option<i64>) -> bool {
    observed.is_none() || observed == generation
}

impl Facts {
    /// The facts of an object with these labels, owner references and
    /// spec (`stamp_ok` true: the caller knows better).
    pub fn of(
        labels: Option<&BTreeMap<String, String>>,
        owners: Option<&[OwnerReference]>,
        spec: &DiscoveredServiceSpec,
    ) -> Self {
        Facts {
            spec: SpecView::of(spec).digest(),
            owners: Owners::of(owners.unwrap_or(&[])),
            labels_ok: our_labels_present(labels, spec),
            stamp_ok: true,
        }
    }

    /// The facts of a whole object.
    pub fn of_object(o: &DiscoveredService) -> Self {
        Facts {
            stamp_ok: stamp_ok(o.metadata.generation, crate::crd::stamped_generation(o)),
            ..Facts::of(
                o.metadata.labels.as_ref(),
                o.metadata.owner_references.as_deref(),
                &o.spec,
            )
        }
    }

    /// Whether an object with these facts is what `w` wants.
    pub fn satisfies(&self, w: &WantedObject) -> bool {
        satisfies(self.spec, &self.owners, self.labels_ok && self.stamp_ok, w)
    }
}

/// `marks_ok`: our labels are present and the generation stamp agrees.
pub(crate) fn satisfies(spec: u64, owners: &Owners, marks_ok: bool, w: &WantedObject) -> bool {
    spec == w.spec && marks_ok && w.owners.iter().all(|o| owners.contains(*o))
}

/// One object we want, reduced like a cached one: its name, the digest of
/// its spec and its owner references (its labels are ours for that spec).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WantedObject {
    /// Its namespace.
    pub ns: String,
    /// Its name.
    pub name: String,
    spec: u64,
    owners: Vec<u64>,
}

impl WantedObject {
    /// What the planner's drift check compares of it, with what the watch
    /// shows under its name.
    pub fn facts(&self, seen: Option<SeenObject>) -> WantedObjectFacts {
        WantedObjectFacts {
            name: (self.ns.clone(), self.name.clone()),
            spec: self.spec,
            owners: self.owners.clone(),
            seen,
        }
    }

    /// `o` (an object of `desired_objects`) reduced.
    pub fn of(o: &DiscoveredService) -> Self {
        WantedObject {
            ns: o.metadata.namespace.clone().unwrap_or_default(),
            name: o.metadata.name.clone().unwrap_or_default(),
            spec: SpecView::of(&o.spec).digest(),
            owners: o
                .metadata
                .owner_references
                .iter()
                .flatten()
                .map(|r| owner_digest(&r.api_version, &r.kind, &r.name, &r.uid))
                .collect(),
        }
    }
}

/// Whether `actual` is what `want` (an object of `desired_objects`) says:
/// equal spec (by digest, nodes included), our labels and owner references
/// present (others' additions tolerated).
pub fn matches(actual: &DiscoveredService, want: &DiscoveredService) -> bool {
    Facts::of_object(actual).satisfies(&WantedObject::of(want))
}

/// The objects wanted for `d`, reduced ([`WantedObject`]), in `desired_objects` order.
pub fn wanted_objects(
    d: &ServiceNodes,
    naming: &ObjectNaming,
    max_ports_bytes: usize,
) -> Vec<WantedObject> {
    if !ports_fit(&d.ports, max_ports_bytes) {
        return desired_objects_with_limit(d, naming, max_ports_bytes)
            .iter()
            .map(WantedObject::of)
            .collect();
    }
    // One object: `desired_object` without building it (no node cloned).
    let key = &d.key;
    let service = key.to_string();
    let spec = SpecView {
        cluster: &key.cluster,
        service: &service,
        source_namespace: &key.namespace,
        source_name: &key.name,
        source: d.source,
        ports: &d.ports,
        aliases: &d.extras.aliases,
        app_protocols: &d.extras.app_protocols,
        version: &d.version,
        shard: None,
    };
    let owners = match &d.owner_uid {
        Some(uid) if naming.owner_references_allowed(key) => {
            vec![owner_digest("v1", "Service", &key.name, uid)]
        }
        _ => Vec::new(),
    };
    vec![WantedObject {
        ns: naming.namespace(key),
        name: naming.name(key),
        spec: spec.digest(),
        owners,
    }]
}

#[cfg(test)]
mod tests;
