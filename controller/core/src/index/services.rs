//! Services: UIDs (owner references in Endpoints mode), ports, annotations
//! and ExternalName.

use super::*;

impl Index {
    // ----- Services -----

    /// Tells the index the UID of Service `namespace/name` (`None`: unknown or
    /// deleted). Used as the owner UID when the endpoint objects carry no
    /// ownerReference. Returns the keys whose desired state changed.
    pub fn set_service_uid(
        &mut self,
        namespace: &str,
        name: &str,
        uid: Option<String>,
    ) -> Vec<ServiceKey> {
        let id = (namespace.to_string(), name.to_string());
        let uid = uid.filter(|u| !u.is_empty() && self.filter.matches(namespace));
        if !set_entry(&mut self.service_uids, &id, uid) {
            return Vec::new();
        }
        self.service_touched(id)
    }

    /// [`Index::service_touched`] for each of `ids` (a Service relist).
    fn services_touched(&mut self, ids: BTreeSet<(String, String)>) -> Vec<ServiceKey> {
        ids.into_iter()
            .flat_map(|id| self.service_touched(id))
            .collect()
    }

    /// After the known UID or ports of Service `id` changed: a relist being
    /// received must rebuild it too; the live state is refreshed now.
    pub(super) fn service_touched(&mut self, id: (String, String)) -> Vec<ServiceKey> {
        if let Some(p) = &mut self.reset {
            p.uid_touched.insert(id.clone());
        }
        self.refresh_owner(&id.0, &id.1)
    }

    /// After a (re)list of all Services: afterwards the known UIDs are exactly
    /// `all` (`(namespace, name, uid)`). Returns the keys whose desired state
    /// changed (a Service re-created with a new UID, or gone).
    pub fn reset_service_uids(
        &mut self,
        all: impl IntoIterator<Item = (String, String, String)>,
    ) -> Vec<ServiceKey> {
        let next: BTreeMap<(String, String), String> = all
            .into_iter()
            .filter(|(ns, _, uid)| !uid.is_empty() && self.filter.matches(ns))
            .map(|(ns, name, uid)| ((ns, name), uid))
            .collect();
        let touched = replace_ids(&mut self.service_uids, next);
        self.services_touched(touched)
    }

    /// Tells the index the ports of Service `namespace/name` (`None`:
    /// unknown or deleted), from which its aliases and appProtocols are
    /// derived ([`crate::source::service`]). Returns the keys whose desired state
    /// changed.
    pub fn set_service(
        &mut self,
        namespace: &str,
        name: &str,
        info: Option<ServiceInfo>,
    ) -> Vec<ServiceKey> {
        let id = (namespace.to_string(), name.to_string());
        let object = format!("Service {namespace}/{name}");
        let info = info.filter(|_| self.filter.matches(namespace));
        if self.service_info.get(&id) == info.as_ref() {
            return Vec::new();
        }
        match &info {
            Some(i) => self.service_warnings(namespace, name, object, i),
            None => {
                self.warnings.remove(&object);
            }
        }
        set_entry(&mut self.service_info, &id, info);
        self.service_touched(id)
    }

    /// After a (re)list of all Services: afterwards the known Service ports
    /// are exactly `all` (`(namespace, name, info)`). Returns the keys whose
    /// desired state changed.
    pub fn reset_services(
        &mut self,
        all: impl IntoIterator<Item = (String, String, ServiceInfo)>,
    ) -> Vec<ServiceKey> {
        let next: BTreeMap<(String, String), ServiceInfo> = all
            .into_iter()
            .filter(|(ns, _, _)| self.filter.matches(ns))
            .map(|(ns, name, info)| ((ns, name), info))
            .collect();
        // Annotation warnings: logged and counted when new or changed (not
        // again for the same bad Service on a relist), dropped with the Service.
        self.warnings.retain(|k, _| {
            k.strip_prefix("Service ")
                .and_then(|s| s.split_once('/'))
                .is_none_or(|(ns, name)| next.contains_key(&(ns.to_string(), name.to_string())))
        });
        for ((ns, name), info) in &next {
            let news = self.service_news_of(ns, name, format!("Service {ns}/{name}"), info);
            self.service_news.extend(news);
        }
        let touched = replace_ids(&mut self.service_info, next);
        self.services_touched(touched)
    }

    /// Number of Services whose ports are known.
    pub fn service_count(&self) -> usize {
        self.service_info.len()
    }

    /// Recomputes the desired state of service `namespace/name` after its
    /// known UID or ports changed.
    pub(super) fn refresh_owner(&mut self, namespace: &str, name: &str) -> Vec<ServiceKey> {
        let key = self.key(namespace, name);
        if let Some(ext) = self.external_desired(&key) {
            self.external.insert(key.clone());
            // Its slices are ignored from now on, so what their merge
            // skipped is no current warning: drop it, as an index that
            // learned the Service before the slices never records it
            // (`recompute_service` stops at an external key). Merged again,
            // with their warnings, when it stops being ExternalName.
            self.warnings.remove(&merge_warnings_key(&key));
            return if self.store(&key, Some(ext)) {
                vec![key]
            } else {
                Vec::new()
            };
        }
        if self.external.remove(&key) {
            // No longer an allowed ExternalName: its nodes go. Slices are
            // merged again now; Endpoints (not kept) are published again on
            // their next event or relist.
            let changed = if self.source == SourceKind::EndpointSlice {
                self.recompute_service(&key)
            } else {
                self.store(&key, None)
            };
            return if changed { vec![key] } else { Vec::new() };
        }
        let Some(current) = self.current(&key) else {
            return Vec::new();
        };
        let changed = if current.source == SourceKind::Endpoints {
            let obj_owner = self.endpoints_owner.get(&key).and_then(|m| m.owner.clone());
            let owner = self.owner(&key, obj_owner);
            let next = self.build(
                key.clone(),
                current.source,
                current.ports.clone(),
                owner,
                current.skipped.clone(),
            );
            self.store(&key, Some(next))
        } else {
            self.recompute_service(&key)
        };
        if changed { vec![key] } else { Vec::new() }
    }
}
