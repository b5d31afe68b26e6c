//! EndpointSlice mode: slices tracked by name; every change re-merges the
//! affected Service(s) in slice-name order, or updates the kept merge of a
//! Service with many slices in O(slice) ([`INCREMENTAL_MIN_SLICES`]).

use super::*;

impl Index {
    // ----- EndpointSlices -----

    /// What the index keeps of a slice of service `service`.
    pub(super) fn stored_slice(
        &self,
        service: ServiceKey,
        s: &LeanEndpointSlice,
    ) -> Arc<StoredSlice> {
        #[cfg(test)]
        self.note(|w| w.converted += 1);
        Arc::new(StoredSlice {
            service,
            owner_uid: owner_service_uid(&s.metadata).map(CompactString::from),
            resource_version: resource_version(&s.metadata).map(CompactString::from),
            contribution: SliceContribution::new(s, &self.opts),
        })
    }

    /// Where a slice belongs: `Err(())` when it has no name; `Ok(None)` when it
    /// is not selected or has no service-name label (warned).
    pub(super) fn slice_target(
        &mut self,
        s: &LeanEndpointSlice,
    ) -> Result<(CompactString, CompactString, Option<ServiceKey>), ()> {
        let ns = CompactString::from(s.metadata.namespace.as_deref().unwrap_or_default());
        let Some(name) = s.metadata.name.as_deref().map(CompactString::from) else {
            self.skipped_nameless("EndpointSlice", &ns);
            return Err(());
        };
        let object = format!("EndpointSlice {ns}/{name}");
        let service = s
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL))
            .filter(|v| !v.is_empty())
            .cloned();
        let Some(service) = service else {
            let warning = format!("{object}: no {SERVICE_NAME_LABEL} label; slice skipped");
            self.set_warnings(
                object,
                vec![warning],
                &BTreeMap::from([(SkipReason::MissingServiceLabel, 1)]),
            );
            return Ok((ns, name, None));
        };
        if !k8s_syntax::is_dns1035_label(&service) {
            let warning = format!(
                "{object}: {SERVICE_NAME_LABEL}={service:?} is not a valid Service name (a DNS-1035 label); slice skipped"
            );
            self.set_warnings(
                object,
                vec![warning],
                &BTreeMap::from([(SkipReason::InvalidServiceName, 1)]),
            );
            return Ok((ns, name, None));
        }
        // Any earlier "no label" warning of this slice is obsolete now.
        self.set_warnings(object, Vec::new(), &BTreeMap::new());
        if !self.selected(&s.metadata) {
            return Ok((ns, name, None));
        }
        let key = self.key(&ns, &service);
        Ok((ns, name, Some(key)))
    }

    pub(super) fn recompute_service(&mut self, key: &ServiceKey) -> bool {
        // Rebuilt below when still big.
        self.big.remove(key);
        if self.external.contains(key) {
            return false;
        }
        let names = self.by_service.get(key).cloned().unwrap_or_default();
        if names.is_empty() {
            self.by_service.remove(key);
            self.warnings.remove(&merge_warnings_key(key));
            return self.store(key, None);
        }
        let slices: Vec<(&CompactString, &Arc<StoredSlice>)> = names
            .keys()
            .filter_map(|n| Some((n, self.slices.get(&(key.namespace.clone(), n.clone()))?)))
            .collect();
        #[cfg(test)]
        self.note(|w| w.merged += 1);
        let conv = merge_slices(slices.iter().map(|(_, s)| &s.contribution), &self.opts);
        let obj_owner = slices.iter().find_map(|(_, s)| s.owner());
        let owner = self.owner(key, obj_owner.clone());
        let (ports, extras) = self.build_parts(key, conv.ports);
        let big = (slices.len() >= INCREMENTAL_MIN_SLICES).then(|| BigService {
            merge: MergeState::new(
                &self.opts,
                self.weight(key),
                slices.iter().map(|(n, s)| (n.as_str(), &s.contribution)),
            ),
            obj_owner,
            spare: None,
        });
        // Kept next to the nodes of a big Service (its version, the writer's
        // shard count and versions), updated per changed node below.
        let buckets = big.as_ref().map(|_| Buckets::of(&ports));
        let nodes = ServiceNodes::with_buckets(
            key.clone(),
            SourceKind::EndpointSlice,
            ports,
            owner,
            extras,
            conv.warnings.clone(),
            buckets,
        );
        if let Some(big) = big {
            self.big.insert(key.clone(), big);
        }
        self.set_warnings(merge_warnings_key(key), conv.warnings, &conv.skipped);
        self.store(key, Some(nodes))
    }

    pub(super) fn untrack_slice(&mut self, ns: &str, name: &str) -> Option<Arc<StoredSlice>> {
        let old = self.slices.remove(&(ns.into(), name.into()))?;
        if let Some(set) = self.by_service.get_mut(&old.service) {
            set.remove(name);
        }
        Some(old)
    }

    /// Service `key` after its slice `name` changed from `old` to `new`
    /// (each `Some` only when it belongs to `key`): the incremental update
    /// when `key` keeps a [`MergeState`], else the full merge. Whether the
    /// published state changed.
    pub(super) fn slice_changed(
        &mut self,
        key: &ServiceKey,
        name: &str,
        old: Option<&Arc<StoredSlice>>,
        new: Option<&Arc<StoredSlice>>,
    ) -> bool {
        match self.update_incrementally(key, name, old, new) {
            Some(changed) => changed,
            None => self.recompute_service(key),
        }
    }

    /// The incremental path of [`Index::slice_changed`]: `None` when `key`
    /// has no [`MergeState`] (or no longer qualifies), so the caller merges
    /// in full. Gives what [`Index::recompute_service`] would (unit-tested
    /// against it): nodes, owner, extras, skipped data, warnings, version.
    pub(super) fn update_incrementally(
        &mut self,
        key: &ServiceKey,
        name: &str,
        old: Option<&Arc<StoredSlice>>,
        new: Option<&Arc<StoredSlice>>,
    ) -> Option<bool> {
        let slices = self.by_service.get(key).map_or(0, LiteMap::len);
        if self.external.contains(key) || slices < INCREMENTAL_MIN_SLICES / 2 {
            self.big.remove(key);
            return None;
        }
        let mut big = self.big.remove(key)?;
        let current = self.current(key)?;
        let patch = big.merge.replace_slice(
            name,
            old.map(|s| &s.contribution),
            new.map(|s| &s.contribution),
        );
        // The owner and the warnings come from all slices in name order;
        // a slice change that does not touch its own can only keep them.
        let slice_list = |me: &Self| -> Vec<Arc<StoredSlice>> {
            me.by_service
                .get(key)
                .into_iter()
                .flat_map(LiteMap::keys)
                .filter_map(|n| me.slices.get(&(key.namespace.clone(), n.clone())))
                .cloned()
                .collect()
        };
        if old.and_then(|s| s.owner_uid.as_ref()) != new.and_then(|s| s.owner_uid.as_ref()) {
            big.obj_owner = slice_list(self).iter().find_map(|s| s.owner());
        }
        let has_warnings =
            |s: Option<&Arc<StoredSlice>>| s.is_some_and(|s| !s.contribution.warnings().is_empty());
        let warnings = (has_warnings(old) || has_warnings(new)).then(|| {
            let mut messages = Vec::new();
            let mut skipped: BTreeMap<SkipReason, u64> = BTreeMap::new();
            for s in slice_list(self) {
                for (reason, message) in s.contribution.warnings() {
                    messages.push(message.clone());
                    *skipped.entry(*reason).or_insert(0) += 1;
                }
            }
            (messages, skipped)
        });
        let owner = self.owner(key, big.obj_owner.clone());
        if patch.is_empty()
            && owner == current.owner_uid
            && warnings.as_ref().is_none_or(|(w, _)| *w == current.skipped)
        {
            self.big.insert(key.clone(), big);
            return Some(false);
        }
        if let Some((messages, skipped)) = &warnings {
            self.set_warnings(merge_warnings_key(key), messages.clone(), skipped);
        }
        let info = self
            .service_info
            .get(&(key.namespace.to_string(), key.name.to_string()))
            .cloned();
        let aliases = self.opts.service_port_aliases;
        let published = self.services.contains_key(key);
        let map = if published {
            &mut self.services
        } else {
            &mut self.withheld
        };
        let arc = map.get_mut(key)?;
        // In place when no reader holds the value (moved, not copied, when
        // only `Weak`s do). Else on the previous value when nobody holds
        // that any more, not even a `Weak` (see `BigService::spare`; the
        // snapshot builder's cache trusts a `Weak`'s pointer to mean its
        // content), and only when that fails one copy, keeping the held
        // value as the next change's spare.
        let spare = big.spare.take();
        if Arc::strong_count(arc) > 1 {
            let mut reused = false;
            if let Some((mut old, replay)) = spare
                && let Some(value) = Arc::get_mut(&mut old)
                && catch_up(value, replay, arc)
            {
                std::mem::swap(arc, &mut old);
                big.spare = Some((old, patch.clone()));
                reused = true;
            }
            if !reused {
                big.spare = Some((Arc::clone(arc), patch.clone()));
            }
        }
        let svc = Arc::make_mut(arc);
        let before = svc.node_count();
        let Some(buckets) = svc.buckets.0.as_mut() else {
            // Built without buckets (not by `recompute_service`): merge in full.
            return None;
        };
        let mut changed = patch.apply(&mut svc.ports, Arc::make_mut(buckets));
        let after = svc.node_count();
        if svc.owner_uid != owner {
            svc.owner_uid = owner;
            changed = true;
        }
        if let Some((messages, _)) = warnings
            && svc.skipped != messages
        {
            svc.skipped = messages;
            changed = true;
        }
        let extras = info
            .map(|i| port_extras(&i, &svc.ports, aliases))
            .unwrap_or_default();
        if svc.extras != extras {
            svc.extras = extras;
            changed = true;
        }
        if changed {
            svc.refresh_version();
        }
        if published {
            self.node_total = self.node_total.saturating_add(after).saturating_sub(before);
        }
        self.big.insert(key.clone(), big);
        Some(changed && published)
    }

    /// An EndpointSlice was added or modified.
    pub fn apply_slice(&mut self, s: &(impl AsLeanSlice + ?Sized)) -> Vec<ServiceKey> {
        let s = &*s.lean();
        let Ok((ns, name, key)) = self.slice_target(s) else {
            return Vec::new();
        };
        let old = self.untrack_slice(&ns, &name);
        let new = key.map(|k| {
            let stored = self.stored_slice(k.clone(), s);
            self.slices.insert((ns, name.clone()), Arc::clone(&stored));
            self.by_service
                .entry(k)
                .or_insert_with(|| SliceNames::with_capacity(1))
                .insert(name.clone(), ());
            stored
        });
        let affected: BTreeSet<ServiceKey> = old
            .iter()
            .chain(new.iter())
            .map(|s| s.service.clone())
            .collect();
        affected
            .into_iter()
            .filter(|k| {
                let mine = |s: &Option<Arc<StoredSlice>>| s.clone().filter(|s| s.service == *k);
                self.slice_changed(k, &name, mine(&old).as_ref(), mine(&new).as_ref())
            })
            .collect()
    }

    /// An EndpointSlice was deleted.
    pub fn delete_slice(&mut self, s: &(impl Resource + ?Sized)) -> Vec<ServiceKey> {
        let ns = s.meta().namespace.clone().unwrap_or_default();
        let Some(name) = s.meta().name.clone() else {
            return Vec::new();
        };
        self.warnings.remove(&format!("EndpointSlice {ns}/{name}"));
        match self.untrack_slice(&ns, &name) {
            Some(old) if self.slice_changed(&old.service.clone(), &name, Some(&old), None) => {
                vec![old.service.clone()]
            }
            _ => Vec::new(),
        }
    }

    /// A relist of all EndpointSlices: afterwards the index holds exactly `all`.
    /// Returns the keys that changed or vanished (unchanged ones are not reported).
    pub fn reset_slices<S: AsLeanSlice>(&mut self, all: &[S]) -> Vec<ServiceKey> {
        self.begin_reset();
        for s in all {
            self.reset_add_slice(s);
        }
        self.finish_reset_slices()
    }

    /// One EndpointSlice of the relist started by [`Index::begin_reset`]
    /// (started implicitly if it was not). Only its contribution is kept.
    pub fn reset_add_slice(&mut self, s: &(impl AsLeanSlice + ?Sized)) {
        let s = &*s.lean();
        let mut p = self.reset.take().unwrap_or_default();
        if let Some(name) = s.metadata.name.as_deref() {
            let ns = s.metadata.namespace.as_deref().unwrap_or("");
            p.present.insert(format!("EndpointSlice {ns}/{name}"));
        }
        if let Ok((ns, name, Some(k))) = self.slice_target(s) {
            let id = (ns, name.clone());
            // The very slice the index holds (same resourceVersion, same
            // Service): share its contribution instead of converting again.
            let stored = match self.slices.get(&id) {
                Some(old)
                    if old.service == k
                        && old
                            .resource_version
                            .as_ref()
                            .zip(resource_version(&s.metadata))
                            .is_some_and(|(old, new)| old == new) =>
                {
                    Arc::clone(old)
                }
                _ => self.stored_slice(k.clone(), s),
            };
            if let Some(old) = p.slices.insert(id, stored) {
                // Listed twice (not from a real API server): the last wins.
                if let Some(set) = p.by_service.get_mut(&old.service) {
                    set.remove(&name);
                }
            }
            p.by_service
                .entry(k)
                .or_insert_with(|| SliceNames::with_capacity(1))
                .insert(name, ());
        }
        self.reset = Some(p);
    }

    /// Ends an EndpointSlice relist: afterwards the index holds exactly the
    /// slices added since [`Index::begin_reset`] (none added: empty). Returns
    /// the keys that changed or vanished (unchanged ones are not reported).
    pub fn finish_reset_slices(&mut self) -> Vec<ServiceKey> {
        let p = self.reset.take().unwrap_or_default();
        // A service needs a new merge when one of its slices is not the very
        // value it was (added, removed, modified, relabelled; both its old and
        // its new service), or its Service UID changed while the list arrived.
        // Every other service has the same slices, unchanged, so its current
        // desired state (and per-service warnings) is already the merge of them.
        let mut dirty: BTreeSet<ServiceKey> = BTreeSet::new();
        for (id, old) in &self.slices {
            if !p.slices.get(id).is_some_and(|new| Arc::ptr_eq(old, new)) {
                dirty.insert(old.service.clone());
            }
        }
        for (id, new) in &p.slices {
            if !self.slices.get(id).is_some_and(|old| Arc::ptr_eq(old, new)) {
                dirty.insert(new.service.clone());
            }
        }
        for (ns, name) in &p.uid_touched {
            dirty.insert(self.key(ns, name));
        }
        self.slices = compacted(p.slices);
        self.by_service = compacted(p.by_service);
        // Per-slice warnings of slices still present were compared (not
        // re-logged when unchanged), those of vanished slices are dropped; the
        // per-service ones are recomputed below for every dirty service.
        self.warnings
            .retain(|k, _| !k.starts_with("EndpointSlice ") || p.present.contains(k));
        let changed: Vec<ServiceKey> = dirty
            .into_iter()
            .filter(|k| self.recompute_service(k))
            .collect();
        // The merges above inserted every new service one at a time.
        if !changed.is_empty() {
            self.services = compacted(std::mem::take(&mut self.services));
        }
        changed
    }
}

/// Brings `spare`, a big service's previous value, up to `current` by
/// replaying `replay`, the patch that made `current` of it (see
/// `BigService::spare`). `false` when that does not give `current`'s nodes
/// (a path other than the incremental one replaced the value meanwhile):
/// checked in O(buckets) by the kept digest, the port keys and list lengths,
/// so a stale spare is never published.
pub(super) fn catch_up(spare: &mut ServiceNodes, replay: Patch, current: &ServiceNodes) -> bool {
    let (Some(mine), Some(theirs)) = (spare.buckets.0.as_mut(), current.buckets.0.as_ref()) else {
        return false;
    };
    let mine = Arc::make_mut(mine);
    replay.apply(&mut spare.ports, mine);
    let same = mine.digest() == theirs.digest()
        && mine.size == theirs.size
        && spare.ports.len() == current.ports.len()
        && spare
            .ports
            .iter()
            .zip(current.ports.iter())
            .all(|((k, a), (l, b))| k == l && a.len() == b.len());
    if same {
        spare.key.clone_from(&current.key);
        spare.source = current.source;
        spare.owner_uid.clone_from(&current.owner_uid);
        spare.version.clone_from(&current.version);
        spare.skipped.clone_from(&current.skipped);
        spare.extras.clone_from(&current.extras);
    }
    same
}
