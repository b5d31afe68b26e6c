//! What the sink needs to make its objects explain themselves: the
//! conditions each service's object holds now (so a write keeps the
//! `lastTransitionTime` of every condition that did not change, and an
//! Event is emitted only for news) and the [`Events`] handle.
//!
//! The conditions come from the objects themselves: the start-up list
//! (`Sink::list_versions`, on every leadership gain) fills them, each write
//! replaces them, a delete forgets them. A restart therefore keeps the
//! times (the list reads them back), and a new leader starts from what the
//! API server holds, not from a memory of its own. Only `type`, `status`,
//! `reason` and the time are kept, plus the message of a `Degraded=True`
//! condition (compared for Events): a few dozen bytes per service.
//!
//! Kept apart from `sink.rs` (which only calls [`Explain`] at its write,
//! delete and list points) so the write mechanics and the explanations
//! change independently.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube_discovery_core::ServiceKey;
use kube_discovery_core::conditions::{DEGRADED, degraded_news};
use kube_discovery_core::crd::DiscoveredService;

use crate::events::{Events, Report, discovered_service};

/// Previous conditions per service, and the Events handle.
#[derive(Clone, Debug, Default)]
pub struct Explain {
    previous: Arc<Mutex<HashMap<ServiceKey, Vec<Condition>>>>,
    /// Where Events go ([`Events::disabled`] by default).
    pub events: Events,
}

/// The part of a condition worth keeping (see the module docs).
fn lean(mut c: Condition) -> Condition {
    if !(c.type_ == DEGRADED && c.status == "True") {
        c.message = String::new();
    }
    c
}

impl Explain {
    /// The conditions `key`'s object holds, as last listed or written.
    pub fn previous(&self, key: &ServiceKey) -> Vec<Condition> {
        self.lock().get(key).cloned().unwrap_or_default()
    }

    /// Replaces everything with what the start-up list found (conditions of
    /// shard 0 of each service).
    pub fn listed(&self, found: HashMap<ServiceKey, Vec<Condition>>) {
        *self.lock() = found
            .into_iter()
            .map(|(k, c)| (k, c.into_iter().map(lean).collect()))
            .collect();
    }

    /// `key`'s objects were deleted.
    pub fn forget(&self, key: &ServiceKey) {
        self.lock().remove(key);
    }

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
                    reason: kube_discovery_core::conditions::SOURCE_DATA_SKIPPED,
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
        self.lock()
            .insert(key.clone(), conditions.into_iter().map(lean).collect());
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

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ServiceKey, Vec<Condition>>> {
        self.previous.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
