//! The desired DiscoveredServices of a service, with their status.
//!
//! # Big services: shards
//!
//! The API server refuses objects over ~1.5 MiB. When the JSON of a service's
//! `ports` exceeds [`MAX_OBJECT_PORTS_BYTES`] (512 KiB, about 10,000 nodes),
//! [`desired_objects`] splits it into `count` objects (a power of two): shard
//! 0 keeps the service's object name, shard `i` is named `<name>.<i>`; each node goes to
//! the shard the hash of its `host` gives ([`crate::crd::shards`]), so one
//! endpoint added or removed changes ONE shard. Every shard has
//! `spec.shard: {index, count}` and the label `kubediscovery.io/shard: "<i>"`;
//! shard `i > 0` carries the version of its own content as `spec.version`,
//! shard 0 the whole service's plus the manifest `spec.shard.versions` (the
//! version of every shard). A change outside shard 0 is therefore two
//! writes: the changed shard, then shard 0 (its manifest changed).

use super::*;

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
/// of the shard count, [`crate::crd::shards::shard_count`]).
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
        size = size.saturating_add(crate::crd::shards::key_cost(port));
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
/// ([`crate::crd::shards`]: `count` a power of two, each node in the shard its
/// `host` hash gives, node order per port kept, shard 0 carrying
/// every port key). Every shard has `spec.shard = {index, count}` and the
/// label [`LABEL_SHARD`]; shard `i > 0` has the version of its OWN content
/// ([`crate::crd::shards::shard_version`]) as `spec.version`, so it is only
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
/// [`crate::model::version::Buckets`] (O(buckets)); [`DesiredObjects::build`] then
/// copies the nodes of the requested shards only, in one pass that hashes
/// each host once. [`DesiredObjects::all`] is exactly the eager build (every
/// reader of "all objects": `render`, the drift check, the client).
pub struct DesiredObjects<'a> {
    svc: &'a ServiceNodes,
    /// 1: one object, [`desired_object`]; else the shard count.
    count: u32,
    /// Shard `i`'s content version ([`crate::crd::shards::shard_version`]);
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
                None => crate::crd::shards::shard_count(&svc.ports, max_ports_bytes, node_json_len),
            }
        };
        let versions = if count <= 1 {
            Vec::new()
        } else {
            let computed;
            let buckets = match kept {
                Some(b) => b,
                None => {
                    computed = crate::crd::shards::Buckets::of(&svc.ports);
                    &computed
                }
            };
            (0..count)
                .map(|index| {
                    // Shard 0 carries every port key; shard `i > 0` only
                    // those it has nodes of (`shards::partition`), which its
                    // digest covers: the keys are what the version hashes.
                    crate::crd::shards::shard_version(
                        index,
                        count,
                        svc.source,
                        &crate::crd::shards::shard_keys(&svc.ports, index, count),
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
        let conditions = crate::crd::conditions::conditions(self.svc, previous, now);
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
            crate::crd::shards::partition_some(&self.svc.ports, self.count, &unique)
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

/// The objects the controller WRITES for `svc` at `now`: [`desired_objects`],
/// each with its own [`object_status`] (one server-side apply per object
/// carries both; the CRD has no status subresource). `previous` are the
/// conditions the service's object held before (empty when unknown): they
/// keep each unchanged condition's `lastTransitionTime`
/// ([`crate::crd::conditions`]). `now` comes from the caller, so this stays free
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
/// service's `conditions` ([`crate::crd::conditions::conditions`]: the same on
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
