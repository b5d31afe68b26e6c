//! Building a service's desired state (owner, extras, weight, ExternalName)
//! and storing it.

use super::*;

impl Index {
    pub(super) fn selected(&self, meta: &ObjectMeta) -> bool {
        let ns = meta.namespace.as_deref().unwrap_or("");
        let empty = BTreeMap::new();
        self.filter.matches(ns) && self.labels.matches(meta.labels.as_ref().unwrap_or(&empty))
    }

    #[cfg(test)]
    pub(super) fn note(&self, f: impl FnOnce(&mut Work)) {
        let mut w = self.work.get();
        f(&mut w);
        self.work.set(w);
    }

    /// Test-only: the work done since the last call.
    #[cfg(test)]
    pub(super) fn take_work(&self) -> Work {
        self.work.take()
    }

    pub(super) fn key(&self, ns: &str, name: &str) -> ServiceKey {
        ServiceKey::new(&self.cluster, ns, name)
    }

    /// Whether `key` is published: its Service's export annotation, else
    /// the export mode (an unknown Service counts as unannotated).
    pub(super) fn exported(&self, key: &ServiceKey) -> bool {
        self.service_info
            .get(&(key.namespace.to_string(), key.name.to_string()))
            .map_or(!self.opts.export_opt_in, |i| {
                i.exported(self.opts.export_opt_in)
            })
    }

    /// The desired state of `key`, published or withheld.
    pub(super) fn current(&self, key: &ServiceKey) -> Option<&Arc<ServiceNodes>> {
        self.services.get(key).or_else(|| self.withheld.get(key))
    }

    /// Stores `new` (or removes the key when `None`); returns whether the
    /// published state changed. A value its Service keeps unpublished is
    /// stored as withheld (and its published object removed).
    pub(super) fn store(&mut self, key: &ServiceKey, new: Option<ServiceNodes>) -> bool {
        let new = match new {
            Some(n) if !self.exported(key) => {
                self.withheld.insert(key.clone(), Arc::new(n));
                None
            }
            other => {
                self.withheld.remove(key);
                other
            }
        };
        match new {
            Some(n) => {
                if self.services.get(key).is_some_and(|old| **old == n) {
                    false
                } else {
                    self.node_total = self.node_total.saturating_add(n.node_count());
                    if let Some(old) = self.services.insert(key.clone(), Arc::new(n)) {
                        self.node_total = self.node_total.saturating_sub(old.node_count());
                    }
                    true
                }
            }
            None => match self.services.remove(key) {
                Some(old) => {
                    self.node_total = self.node_total.saturating_sub(old.node_count());
                    true
                }
                None => false,
            },
        }
    }

    pub(super) fn owner(&self, key: &ServiceKey, from_object: Option<String>) -> Option<String> {
        from_object.or_else(|| {
            self.service_uids
                .get(&(key.namespace.to_string(), key.name.to_string()))
                .cloned()
        })
    }

    /// Why the ExternalName host of `info` is not published (`None`: it is,
    /// or the Service is no ExternalName, or ExternalName is disabled).
    pub(super) fn external_refusal(
        &self,
        object: &str,
        info: &ServiceInfo,
    ) -> Option<(SkipReason, String)> {
        let (Some(allow), Some(host)) = (&self.opts.external_name, &info.external_name) else {
            return None;
        };
        let bare = host.strip_suffix('.').unwrap_or(host);
        if !k8s_syntax::is_dns_name(bare) {
            return Some((
                SkipReason::InvalidExternalName,
                format!("{object}: spec.externalName {host:?} is not a DNS name; Service skipped"),
            ));
        }
        if !allow.iter().any(|r| r.is_match(host)) {
            return Some((
                SkipReason::ExternalNameRefused,
                format!(
                    "{object}: spec.externalName {host:?} matches no kube_discovery.external_name.allow regex; Service skipped"
                ),
            ));
        }
        None
    }

    /// The desired state of an allowed ExternalName Service: one node per
    /// Service port, its host the external name and its port the Service
    /// port (what a client of the Service connects to). `None` when `key` is
    /// no such Service.
    pub(super) fn external_desired(&self, key: &ServiceKey) -> Option<ServiceNodes> {
        let info = self
            .service_info
            .get(&(key.namespace.to_string(), key.name.to_string()))?;
        let host = info.external_name.as_ref()?;
        self.opts.external_name.as_ref()?;
        if self.external_refusal("", info).is_some() {
            return None;
        }
        let ports: PortMap = info
            .ports
            .iter()
            .filter(|p| (1..=65535).contains(&p.port))
            .map(|p| {
                let key = crate::source::convert::port_key(Some(&p.name), p.port);
                (key, vec![crate::model::Node::new(host.clone(), p.port, 0)])
            })
            .collect();
        Some(self.build(key.clone(), self.source, ports, None, Vec::new()))
    }

    /// The desired state of `key` from its endpoints' `ports` and the
    /// warnings of what was `skipped` converting them: with the
    /// Service-derived extras (aliases, appProtocols) when the Service is
    /// known. One hash of the service for its version.
    pub(super) fn build(
        &self,
        key: ServiceKey,
        source: SourceKind,
        ports: PortMap,
        owner: Option<String>,
        skipped: Vec<String>,
    ) -> ServiceNodes {
        let (ports, extras) = self.build_parts(&key, ports);
        ServiceNodes::with_buckets(key, source, ports, owner, extras, skipped, None)
    }

    /// The weight every node of `key` gets: its Service's annotation, else
    /// `default_weight`.
    pub(super) fn weight(&self, key: &ServiceKey) -> u32 {
        self.service_info
            .get(&(key.namespace.to_string(), key.name.to_string()))
            .and_then(|i| i.weight)
            .unwrap_or(self.opts.default_weight)
    }

    /// The extras of `key` for `ports` (empty when its Service is unknown).
    pub(super) fn extras(&self, key: &ServiceKey, ports: &PortMap) -> PortExtras {
        self.service_info
            .get(&(key.namespace.to_string(), key.name.to_string()))
            .map(|i| port_extras(i, ports, self.opts.service_port_aliases))
            .unwrap_or_default()
    }

    /// `ports` with [`Index::weight`] set, and the extras of `key`.
    pub(super) fn build_parts(&self, key: &ServiceKey, ports: PortMap) -> (PortMap, PortExtras) {
        let mut ports = ports;
        // Every node has the weight of the Service's annotation, else
        // `default_weight` (what the converters give; so rebuilding from a
        // kept value after the annotation went away restores it).
        let weight = self.weight(key);
        for node in ports.values_mut().flatten() {
            // `drain_terminating: always` publishes draining nodes with
            // weight 0 (no new traffic); the annotation does not lift that.
            let drained = self.opts.drain_terminating == crate::source::convert::Drain::Always
                && node.draining == Some(true);
            if !drained {
                node.weight = weight;
            }
        }
        let extras = self.extras(key, &ports);
        (ports, extras)
    }
}
