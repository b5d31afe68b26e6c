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
mod tests {
    use super::*;

    #[test]
    fn notes_are_cut_to_the_api_limit_on_a_character_boundary() {
        let mut s = "é".repeat(600);
        cut(&mut s, NOTE_LIMIT);
        assert!(s.len() <= NOTE_LIMIT && s.ends_with("..."), "{}", s.len());
        let mut short = "ok".to_string();
        cut(&mut short, NOTE_LIMIT);
        assert_eq!(short, "ok");
    }

    #[test]
    fn failing_writes_regard_the_local_service_else_the_object() {
        let naming = ObjectNaming::fixed("kd");
        let local = service_target(
            &ServiceKey::new("", "shop", "web"),
            Some("u1".into()),
            &naming,
        );
        assert_eq!(
            (
                local.kind.as_deref(),
                local.namespace.as_deref(),
                local.name.as_deref()
            ),
            (Some("Service"), Some("shop"), Some("web"))
        );
        assert_eq!(local.uid.as_deref(), Some("u1"));
        let remote = service_target(&ServiceKey::new("c1", "shop", "web"), None, &naming);
        assert_eq!(
            (
                remote.kind.as_deref(),
                remote.namespace.as_deref(),
                remote.name.as_deref()
            ),
            (Some("DiscoveredService"), Some("kd"), Some("c1.shop.web"))
        );
    }

    /// `emit` never waits: a disabled handle drops the Event; on a queue
    /// nobody drains, the first [`QUEUE`] Events are queued in order (notes
    /// cut to the limit) and the rest dropped at once. The emits run on their
    /// own thread with a deadline, so an `emit` that blocks fails the test
    /// instead of hanging it.
    #[test]
    fn a_disabled_or_full_queue_never_blocks() {
        let report = |note: String| Report {
            warning: false,
            reason: "X",
            action: "Y",
            note,
        };
        let disabled = Events::disabled();
        assert!(disabled.tx.is_none());
        let (tx, mut rx) = mpsc::channel(QUEUE);
        let (done_tx, done) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            disabled.emit(discovered_service("a", "b", None), report("dropped".into()));
            let ev = Events { tx: Some(tx) };
            for i in 0..QUEUE * 2 {
                let long = if i == 0 {
                    "x".repeat(2 * NOTE_LIMIT)
                } else {
                    String::new()
                };
                ev.emit(
                    discovered_service("a", "b", None),
                    report(format!("{i} {long}")),
                );
            }
            // The handle is handed back: the queue stays open.
            let _ = done_tx.send(ev);
        });
        let _ev = done
            .recv_timeout(Duration::from_secs(10))
            .expect("emit blocked on a full queue");
        assert_eq!(rx.len(), QUEUE, "QUEUE Events are queued, the rest dropped");
        let notes: Vec<String> = std::iter::from_fn(|| rx.try_recv().ok())
            .map(|(r, _)| r.note)
            .collect();
        assert!(
            notes[0].starts_with("0 x")
                && notes[0].len() == NOTE_LIMIT
                && notes[0].ends_with("..."),
            "the first note, cut: {} bytes",
            notes[0].len()
        );
        let rest: Vec<String> = (1..QUEUE).map(|i| format!("{i} ")).collect();
        assert_eq!(notes[1..], rest[..], "the first QUEUE Events, in order");
    }
}
