//! Endpoints mode: one object per Service, converted with
//! [`crate::source::convert::from_endpoints`].

use super::*;

impl Index {
    // ----- Endpoints -----

    /// The desired state of one Endpoints object; its owner UID and
    /// resourceVersion are recorded in `owners` (the live map, or a pending
    /// relist's).
    pub(super) fn endpoints_desired(
        &mut self,
        ep: &LeanEndpoints,
        owners: &mut BTreeMap<ServiceKey, EndpointsMeta>,
    ) -> Option<(ServiceKey, Option<ServiceNodes>)> {
        let ns = ep.metadata.namespace.as_deref().unwrap_or("");
        let Some(name) = ep.metadata.name.as_deref() else {
            self.skipped_nameless("Endpoints", ns);
            return None;
        };
        let object = format!("Endpoints {ns}/{name}");
        if !k8s_syntax::is_dns1035_label(name) {
            let warning = format!(
                "{object}: the name is not a valid Service name (a DNS-1035 label), so no Service owns it; skipped"
            );
            self.set_warnings(
                object,
                vec![warning],
                &BTreeMap::from([(SkipReason::InvalidServiceName, 1)]),
            );
            return None;
        }
        let key = self.key(ns, name);
        if !self.selected(&ep.metadata) {
            self.set_warnings(object, Vec::new(), &BTreeMap::new());
            owners.remove(&key);
            return Some((key, None));
        }
        #[cfg(test)]
        self.note(|w| w.converted += 1);
        let conv = from_endpoints(ep, &self.opts);
        let skipped = conv.warnings.clone();
        self.set_warnings(object, conv.warnings, &conv.skipped);
        let obj_owner = owner_service_uid(&ep.metadata);
        owners.insert(
            key.clone(),
            EndpointsMeta {
                owner: obj_owner.clone(),
                resource_version: resource_version(&ep.metadata).map(Box::from),
            },
        );
        let owner = self.owner(&key, obj_owner);
        Some((
            key.clone(),
            Some(self.build(key, SourceKind::Endpoints, conv.ports, owner, skipped)),
        ))
    }

    /// An Endpoints object was added or modified.
    pub fn apply_endpoints(&mut self, ep: &(impl AsLeanEndpoints + ?Sized)) -> Vec<ServiceKey> {
        let ep = ep.lean();
        let mut owners = std::mem::take(&mut self.endpoints_owner);
        let desired = self.endpoints_desired(&ep, &mut owners);
        self.endpoints_owner = owners;
        match desired {
            Some((key, _)) if self.external.contains(&key) => Vec::new(),
            Some((key, new)) => {
                if self.store(&key, new) {
                    vec![key]
                } else {
                    Vec::new()
                }
            }
            None => Vec::new(),
        }
    }

    /// An Endpoints object was deleted.
    pub fn delete_endpoints(&mut self, ep: &(impl Resource + ?Sized)) -> Vec<ServiceKey> {
        let ns = ep.meta().namespace.as_deref().unwrap_or("");
        let Some(name) = ep.meta().name.as_deref() else {
            return Vec::new();
        };
        self.warnings.remove(&format!("Endpoints {ns}/{name}"));
        if !k8s_syntax::is_dns1035_label(name) {
            // Never indexed (see `endpoints_desired`); its key may name
            // another service's shard.
            return Vec::new();
        }
        let key = self.key(ns, name);
        self.endpoints_owner.remove(&key);
        if self.external.contains(&key) {
            return Vec::new();
        }
        if self.store(&key, None) {
            vec![key]
        } else {
            Vec::new()
        }
    }

    /// A relist of all Endpoints: afterwards the index holds exactly `all`.
    /// Returns the keys that changed or vanished (unchanged ones are not reported).
    pub fn reset_endpoints<E: AsLeanEndpoints>(&mut self, all: &[E]) -> Vec<ServiceKey> {
        self.begin_reset();
        for ep in all {
            self.reset_add_endpoints(ep);
        }
        self.finish_reset_endpoints()
    }

    /// One Endpoints object of the relist started by [`Index::begin_reset`]
    /// (started implicitly if it was not).
    pub fn reset_add_endpoints(&mut self, ep: &(impl AsLeanEndpoints + ?Sized)) {
        let ep = ep.lean();
        let mut p = self.reset.take().unwrap_or_default();
        if let Some(name) = ep.metadata.name.as_deref() {
            let ns = ep.metadata.namespace.as_deref().unwrap_or("");
            p.present.insert(format!("Endpoints {ns}/{name}"));
            // The very object the index holds (same resourceVersion): its
            // desired state, owner and warnings stay as they are.
            let key = self.key(ns, name);
            if let (Some(meta), Some(current)) =
                (self.endpoints_owner.get(&key), self.current(&key))
                && same_version(meta.resource_version.as_deref(), &ep.metadata)
            {
                p.endpoints_owner.insert(key.clone(), meta.clone());
                p.desired.insert(key, Arc::clone(current));
                self.reset = Some(p);
                return;
            }
        }
        if let Some((key, Some(nodes))) = self.endpoints_desired(&ep, &mut p.endpoints_owner) {
            // An unchanged service keeps sharing its current allocation.
            let value = match self.current(&key) {
                Some(old) if **old == nodes => Arc::clone(old),
                _ => Arc::new(nodes),
            };
            p.desired.insert(key, value);
        }
        self.reset = Some(p);
    }

    /// Ends an Endpoints relist: afterwards the index holds exactly the objects
    /// added since [`Index::begin_reset`] (none added: empty). Returns the
    /// keys that changed or vanished.
    pub fn finish_reset_endpoints(&mut self) -> Vec<ServiceKey> {
        let mut p = self.reset.take().unwrap_or_default();
        // A Service UID that changed while the list arrived: the live state
        // already has it (`set_service_uid`), the listed desired states that
        // were built before it must get it too.
        for (ns, name) in &p.uid_touched {
            let key = self.key(ns, name);
            let Some(desired) = p.desired.get_mut(&key) else {
                continue;
            };
            let obj_owner = p.endpoints_owner.get(&key).and_then(|m| m.owner.clone());
            let owner = self.owner(&key, obj_owner);
            let next = self.build(
                key,
                desired.source,
                desired.ports.clone(),
                owner,
                desired.skipped.clone(),
            );
            if **desired != next {
                *desired = Arc::new(next);
            }
        }
        self.endpoints_owner = compacted(p.endpoints_owner);
        // Warnings of objects still present were compared (not re-logged when
        // unchanged); those of vanished objects are dropped.
        self.warnings
            .retain(|k, _| !k.starts_with("Endpoints ") || p.present.contains(k));
        self.replace_all(p.desired)
    }
}
