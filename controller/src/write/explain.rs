//! What the sink needs to make its objects explain themselves: the
//! conditions each service's object holds now (so a write keeps the
//! `lastTransitionTime` of every condition that did not change, and an
//! Event is emitted only for news) and the [`Events`] handle.
//!
//! The conditions come from the objects themselves: the start-up list fills
//! them on every leadership gain, each write replaces them, a delete forgets
//! them; so a restart or a new leader keeps the times. Only what the
//! decisions read is kept (status and time of `Ready` and `Degraded`, the
//! message of `Degraded=True`), under a 64-bit hash of the service key: a
//! collision could only carry a time or an Event decision over to another
//! service. What both save is in BENCHMARKS.md ("what each piece buys").
//!
//! Apart from `sink.rs`, which only calls [`Explain`] at its write, delete
//! and list points, so the write mechanics and the explanations change
//! independently.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube_discovery_core::ServiceKey;
use kube_discovery_core::crd::DiscoveredService;
use kube_discovery_core::crd::conditions::{DEGRADED, READY, degraded_news};

use crate::k8s::events::{Events, Report, discovered_service};

/// Previous conditions per service, and the Events handle.
#[derive(Clone, Debug, Default)]
pub struct Explain {
    previous: Arc<Mutex<HashMap<u64, Kept>>>,
    /// Where Events go ([`Events::disabled`] by default).
    pub events: Events,
}

/// What is kept of one service's conditions (see the module docs).
#[derive(Clone, Debug, Default, PartialEq)]
struct Kept {
    /// `Ready`, `Degraded`: status and `lastTransitionTime`.
    conds: [Option<(Status, jiff::Timestamp)>; 2],
    /// The message of `Degraded=True`.
    degraded_message: Option<Box<str>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Status {
    True,
    False,
    Unknown,
}

impl Status {
    fn of(s: &str) -> Option<Status> {
        match s {
            "True" => Some(Status::True),
            "False" => Some(Status::False),
            "Unknown" => Some(Status::Unknown),
            _ => None,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Status::True => "True",
            Status::False => "False",
            Status::Unknown => "Unknown",
        }
    }
}

const TYPES: [&str; 2] = [READY, DEGRADED];

impl Kept {
    fn of(conditions: &[Condition]) -> Kept {
        let mut k = Kept::default();
        for c in conditions {
            let (Some(i), Some(status)) = (
                TYPES.iter().position(|t| *t == c.type_),
                Status::of(&c.status),
            ) else {
                continue;
            };
            k.conds[i] = Some((status, c.last_transition_time.0));
            if i == 1 && status == Status::True {
                k.degraded_message = Some(c.message.as_str().into());
            }
        }
        k
    }

    /// The kept conditions as `Condition`s (reason empty: never read back).
    fn conditions(&self) -> Vec<Condition> {
        TYPES
            .iter()
            .zip(&self.conds)
            .filter_map(|(type_, c)| {
                let (status, time) = (*c)?;
                let message = match (*type_ == DEGRADED, status, &self.degraded_message) {
                    (true, Status::True, Some(m)) => m.to_string(),
                    _ => String::new(),
                };
                Some(Condition {
                    type_: (*type_).to_string(),
                    status: status.as_str().to_string(),
                    reason: String::new(),
                    message,
                    last_transition_time: Time(time),
                    observed_generation: None,
                })
            })
            .collect()
    }
}

fn slot(key: &ServiceKey) -> u64 {
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}

impl Explain {
    /// The conditions `key`'s object holds, as last listed or written.
    pub fn previous(&self, key: &ServiceKey) -> Vec<Condition> {
        self.lock()
            .get(&slot(key))
            .map(Kept::conditions)
            .unwrap_or_default()
    }

    /// Replaces everything with what the start-up list found (conditions of
    /// shard 0 of each service).
    pub fn listed(&self, found: HashMap<ServiceKey, Vec<Condition>>) {
        *self.lock() = found
            .into_iter()
            .map(|(k, c)| (slot(&k), Kept::of(&c)))
            .collect();
    }

    /// `key`'s objects were deleted.
    pub fn forget(&self, key: &ServiceKey) {
        self.lock().remove(&slot(key));
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
        self.lock().insert(slot(key), Kept::of(&conditions));
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

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Kept>> {
        self.previous.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests;
