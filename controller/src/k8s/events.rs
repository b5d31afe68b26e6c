//! Kubernetes Events (`events.k8s.io/v1`) that explain what the controller
//! did to a service: skipped source data, a drift repair, a name owned by
//! someone else, a write that keeps failing. They are published with
//! kube-runtime's [`Recorder`] (which also turns a repeat within a few
//! minutes into a `series` patch instead of a new Event).
//!
//! Events are best-effort and never hold up a write: [`Events::emit`] only
//! puts the Event into a bounded queue ([`QUEUE`]); one task publishes them,
//! each bounded by a timeout. A full queue drops the Event; a refused or
//! timed-out publish is logged at debug. Nothing else depends on them (the
//! conditions and the metrics carry the same facts).
//!
//! Who emits decides when, so that a relist finding the same bad object
//! emits nothing new: the sink emits `SourceDataSkipped` only when the
//! object's `Degraded` condition becomes True or its message changes (the
//! condition is written, so this holds across restarts too) and
//! `DriftRepaired` after a repair write; the writer emits `NameTaken` /
//! `WriteFailed` only when the planner says a key starts failing or fails
//! for another reason (`Action::Failing`). All of them come from writes,
//! and only the leader writes (the sink is fenced), so only the leader emits.
//! The sources emit `InvalidAnnotation` / `ExternalNameRefused` on a Service
//! when the index reports its skipped annotations or refused ExternalName as
//! news (`Index::take_service_news`: new or changed, never a relist's
//! repeat), and only while this replica leads.
//!
//! Messages are built from object names, fields and API error messages;
//! they never contain request headers or tokens.

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube_discovery_core::ServiceKey;
use kube_discovery_core::crd::{GROUP, ObjectNaming, VERSION};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Events waiting to be published at most; more are dropped.
pub const QUEUE: usize = 256;

/// Largest Event note the API server accepts (1 kB).
const NOTE_LIMIT: usize = 1024;

/// The controller name in `reportingController`.
pub const REPORTING_CONTROLLER: &str = "kubediscovery.io/kube-discovery";

/// What happened, as an Event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// `Normal` or `Warning`.
    pub warning: bool,
    /// PascalCase reason (`SourceDataSkipped`, `DriftRepaired`, `NameTaken`, `WriteFailed`).
    pub reason: &'static str,
    /// PascalCase action (`Convert`, `Repair`, `Write`).
    pub action: &'static str,
    /// Human-readable note (cut to 1 kB).
    pub note: String,
}

/// The handle that queues Events; cheap to clone. [`Events::disabled`]
/// drops everything (tests, one-off commands).
#[derive(Clone, Debug, Default)]
pub struct Events {
    tx: Option<mpsc::Sender<(Report, ObjectReference)>>,
}

impl Events {
    /// Emits nothing.
    pub fn disabled() -> Self {
        Self { tx: None }
    }

    /// Starts the publishing task; it ends with `shutdown` (queued Events
    /// are dropped then). `instance` is the `reportingInstance` (the pod).
    pub fn start(
        client: Client,
        instance: String,
        timeout: Duration,
        shutdown: CancellationToken,
    ) -> (Self, tokio::task::JoinHandle<()>) {
        let (tx, mut rx) = mpsc::channel::<(Report, ObjectReference)>(QUEUE);
        let recorder = Recorder::new(
            client,
            Reporter {
                controller: REPORTING_CONTROLLER.to_string(),
                instance: Some(instance),
            },
        );
        let task = tokio::spawn(async move {
            loop {
                let (report, regarding) = tokio::select! {
                    () = shutdown.cancelled() => return,
                    next = rx.recv() => match next {
                        Some(next) => next,
                        None => return,
                    },
                };
                let ev = Event {
                    type_: if report.warning {
                        EventType::Warning
                    } else {
                        EventType::Normal
                    },
                    reason: report.reason.to_string(),
                    note: Some(report.note),
                    action: report.action.to_string(),
                    secondary: None,
                };
                let object = format!(
                    "{} {}/{}",
                    regarding.kind.as_deref().unwrap_or_default(),
                    regarding.namespace.as_deref().unwrap_or_default(),
                    regarding.name.as_deref().unwrap_or_default()
                );
                match tokio::time::timeout(timeout, recorder.publish(&ev, &regarding)).await {
                    Ok(Ok(())) => {
                        tracing::debug!(object = %object, reason = report.reason, "event published");
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(object = %object, reason = report.reason, error = %e, "event not published");
                    }
                    Err(_) => {
                        tracing::debug!(object = %object, reason = report.reason, ?timeout, "event not published: timed out");
                    }
                }
            }
        });
        (Self { tx: Some(tx) }, task)
    }

    /// Queues `report` about `regarding`; never waits (a full queue drops it).
    pub fn emit(&self, regarding: ObjectReference, mut report: Report) {
        let Some(tx) = &self.tx else { return };
        cut(&mut report.note, NOTE_LIMIT);
        if let Err(e) = tx.try_send((report, regarding)) {
            tracing::debug!(error = %e, "event dropped: queue full or closed");
        }
    }
}

/// Cuts `s` to at most `max` bytes on a character boundary (ending in `...`).
fn cut(s: &mut String, max: usize) {
    if s.len() <= max {
        return;
    }
    let mut at = max - 3;
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    s.truncate(at);
    s.push_str("...");
}

/// The DiscoveredService `namespace/name` (with its `uid` when known:
/// `kubectl describe` lists only Events whose reference carries the
/// object's uid).
pub fn discovered_service(namespace: &str, name: &str, uid: Option<String>) -> ObjectReference {
    ObjectReference {
        api_version: Some(format!("{GROUP}/{VERSION}")),
        kind: Some("DiscoveredService".to_string()),
        namespace: Some(namespace.to_string()),
        name: Some(name.to_string()),
        uid,
        ..ObjectReference::default()
    }
}

/// What an Event about `key` as a whole (a write that fails) regards: its
/// source Service when that lives on this API server (single-cluster mode;
/// `kubectl describe service` shows it), else the DiscoveredService the
/// write is for.
pub fn service_target(
    key: &ServiceKey,
    owner_uid: Option<String>,
    naming: &ObjectNaming,
) -> ObjectReference {
    if key.cluster.is_empty() {
        ObjectReference {
            api_version: Some("v1".to_string()),
            kind: Some("Service".to_string()),
            namespace: Some(key.namespace.to_string()),
            name: Some(key.name.to_string()),
            uid: owner_uid,
            ..ObjectReference::default()
        }
    } else {
        discovered_service(&naming.namespace(key), &naming.name(key), None)
    }
}

#[cfg(test)]
mod tests;
