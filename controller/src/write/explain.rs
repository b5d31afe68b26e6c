//! The Events that make our objects explain themselves: `SourceDataSkipped`
//! when a write's `Degraded` condition is news (compared with the
//! conditions the object held, which the sink reads from the record,
//! `crate::write::record`), `DriftRepaired` for a repair, `OrphanDeleted`
//! for a deleted orphan.
//!
//! Apart from `sink.rs`, which only calls [`Explain`] at its write and
//! delete points, so the write mechanics and the explanations change
//! independently.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube_discovery_core::ServiceKey;
use kube_discovery_core::crd::DiscoveredService;
use kube_discovery_core::crd::conditions::degraded_news;

use crate::k8s::events::{Events, Report, discovered_service};

/// The Events handle of the sink.
#[derive(Clone, Debug, Default)]
pub struct Explain {
    /// Where Events go ([`Events::disabled`] by default).
    pub events: Events,
}

impl Explain {
    /// `obj` (shard 0, with status) was written for `key` with the
    /// conditions computed from `previous`; `uid` is the object's, from
    /// the API server's answer. Emits `SourceDataSkipped` when the
    /// `Degraded` condition is news and `DriftRepaired` for a repair.
    pub fn written(
        &self,
        key: &ServiceKey,
        obj: &DiscoveredService,
        previous: &[Condition],
        uid: Option<String>,
        repair: bool,
    ) {
        let conditions = obj
            .status
            .as_ref()
            .map(|s| s.conditions.clone())
            .unwrap_or_default();
        let regarding = || {
            discovered_service(
                obj.metadata.namespace.as_deref().unwrap_or_default(),
                obj.metadata.name.as_deref().unwrap_or_default(),
                uid.clone(),
            )
        };
        if let Some(c) = degraded_news(previous, &conditions) {
            self.events.emit(
                regarding(),
                Report {
                    warning: true,
                    reason: kube_discovery_core::crd::conditions::SOURCE_DATA_SKIPPED,
                    action: "Convert",
                    note: c.message.clone(),
                },
            );
        }
        if repair {
            self.events.emit(
                regarding(),
                Report {
                    warning: false,
                    reason: "DriftRepaired",
                    action: "Repair",
                    note: format!(
                        "{key}: the object was changed or removed by someone else; the desired state was written back"
                    ),
                },
            );
        }
    }

    /// A drift repair deleted `ns/name`, an object of ours describing `key`
    /// that no source wants: `no_source` (the service has no source any
    /// more, or never had one here), else a stray object of a service that
    /// has other objects. One Event on the deleted object: `kubectl get
    /// events` keeps it after the object is gone.
    pub fn orphan_deleted(&self, key: &ServiceKey, ns: &str, name: &str, no_source: bool) {
        let why = if no_source {
            "no Service or endpoints of this cluster describe it"
        } else {
            "it is not one of the objects the service is written to (e.g. a shard the service no longer needs)"
        };
        self.events.emit(
            discovered_service(ns, name, None),
            Report {
                warning: false,
                reason: "OrphanDeleted",
                action: "Repair",
                note: format!("{key}: the DiscoveredService {ns}/{name} was deleted: {why}"),
            },
        );
    }
}
