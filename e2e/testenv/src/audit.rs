//! The real API server's audit log, read as kube-sim's write log and request
//! statistics (`/_sim/writes`, `/_sim/stats`), so the same assertions run on
//! both servers.
//!
//! kube-apiserver writes one JSON event per request stage (the policy of
//! [`policy`]: every request at `Metadata` level, `RequestReceived` omitted):
//! `ResponseComplete` for every request, plus `ResponseStarted` for watches.
//! A request counts when the authorizer allowed it (the
//! `authorization.k8s.io/decision` annotation), as kube-sim counts requests
//! that passed RBAC; a write counts when its answer was 2xx.
//!
//! Marks are wall-clock microseconds: "since a mark" means "received by the
//! server after it". A write that caused what a test observed was received
//! before the test looked, so it never counts as later.

use std::collections::{BTreeMap, HashSet};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::Deserialize;
use serde_json::{Value, json};

/// The audit policy the harness starts kube-apiserver with: every request at
/// `Metadata` level; writes to the `(group, plural)` resources of
/// `write_bodies` at `RequestResponse`, so their answers' resourceVersion is
/// known (a benchmark maps a source change to its revision).
pub fn policy(write_bodies: &[(&str, &str)]) -> String {
    let mut p = String::from(
        "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  # The API server's own loopback client (its controllers and post-start hooks).
  - level: None
    users: [\"system:apiserver\"]
",
    );
    for (group, resource) in write_bodies {
        p.push_str(&format!(
            "  - level: RequestResponse
    verbs: [create, update, patch, delete]
    resources: [{{group: \"{group}\", resources: [\"{resource}\"]}}]
"
        ));
    }
    p.push_str("  - level: Metadata\n");
    p
}

/// Users whose requests the statistics leave out: the control plane's own
/// controllers, which kube-sim does not have (their writes stay in the write
/// log: garbage collection deletes are part of what a test observes).
fn is_control_plane(user: &str) -> bool {
    user == "system:kube-controller-manager"
        || user == "system:kube-scheduler"
        || user == "kwok"
        || user.starts_with("system:serviceaccount:kube-system:")
        || user.starts_with("system:node:")
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawEvent {
    #[serde(rename = "auditID")]
    audit_id: String,
    stage: String,
    verb: String,
    #[serde(default)]
    user: RawUser,
    #[serde(default)]
    object_ref: Option<RawRef>,
    #[serde(default)]
    response_status: Option<RawStatus>,
    #[serde(default)]
    request_received_timestamp: String,
    #[serde(default)]
    stage_timestamp: String,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    /// Only at `RequestResponse` level ([`policy`] with write bodies).
    #[serde(default)]
    response_object: Option<RawObject>,
}

#[derive(Debug, Default, Deserialize)]
struct RawObject {
    #[serde(default)]
    metadata: RawObjectMeta,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawObjectMeta {
    #[serde(default)]
    resource_version: String,
}

#[derive(Debug, Default, Deserialize)]
struct RawUser {
    #[serde(default)]
    username: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawRef {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    api_group: String,
    #[serde(default)]
    subresource: String,
}

#[derive(Debug, Deserialize)]
struct RawStatus {
    #[serde(default)]
    code: u16,
}

/// One audited request stage.
#[derive(Debug, Clone)]
pub struct Event {
    /// The request's audit id (the same for all its stages).
    pub audit_id: String,
    /// `RequestReceived`, `ResponseStarted`, `ResponseComplete` or `Panic`.
    pub stage: String,
    /// Kubernetes verb (`get`, `list`, `watch`, `patch`, ...).
    pub verb: String,
    /// The authenticated user name.
    pub user: String,
    /// Plural resource, `resource/subresource` for subresources, `nonresource`
    /// for non-resource URLs (as kube-sim counts them).
    pub resource: String,
    /// API group (empty for the core group).
    pub group: String,
    /// Namespace of the object (empty for cluster-scoped requests).
    pub namespace: String,
    /// Object name (empty for lists and watches).
    pub name: String,
    /// HTTP status code of the answer (0 before it is known).
    pub code: u16,
    /// Whether authorization allowed the request.
    pub allowed: bool,
    /// When the server received the request, microseconds since the epoch.
    pub received_micros: u64,
    /// When this stage was reached (for `ResponseComplete` of a write: just
    /// after the commit), microseconds since the epoch.
    pub stage_micros: u64,
    /// The answer's `metadata.resourceVersion` (the revision of a write),
    /// when the policy logs answer bodies for this resource; else empty.
    pub response_rv: String,
}

impl Event {
    fn from_raw(r: RawEvent) -> Event {
        let (resource, group, namespace, name) = match r.object_ref {
            Some(o) if !o.resource.is_empty() => {
                let res = if o.subresource.is_empty() {
                    o.resource
                } else {
                    format!("{}/{}", o.resource, o.subresource)
                };
                (res, o.api_group, o.namespace, o.name)
            }
            _ => (
                "nonresource".into(),
                String::new(),
                String::new(),
                String::new(),
            ),
        };
        Event {
            audit_id: r.audit_id,
            stage: r.stage,
            verb: r.verb,
            user: r.user.username,
            resource,
            group,
            namespace,
            name,
            code: r.response_status.map(|s| s.code).unwrap_or(0),
            allowed: r
                .annotations
                .get("authorization.k8s.io/decision")
                .is_some_and(|d| d == "allow"),
            received_micros: micros(&r.request_received_timestamp),
            stage_micros: micros(&r.stage_timestamp),
            response_rv: r
                .response_object
                .map(|o| o.metadata.resource_version)
                .unwrap_or_default(),
        }
    }

    fn is_write(&self) -> bool {
        self.stage == "ResponseComplete"
            && matches!(
                self.verb.as_str(),
                "create" | "update" | "patch" | "delete" | "deletecollection"
            )
            && (200..300).contains(&self.code)
    }

    /// The stage at which a request is counted once: watches when they start
    /// (they complete only when they end), everything else when complete.
    fn counts_as_request(&self) -> bool {
        self.allowed
            && if self.verb == "watch" {
                self.stage == "ResponseStarted"
            } else {
                self.stage == "ResponseComplete"
            }
    }
}

/// RFC 3339 timestamp -> microseconds since the epoch (0 when unparsable).
fn micros(ts: &str) -> u64 {
    ts.parse::<jiff::Timestamp>()
        .map(|t| u64::try_from(t.as_microsecond()).unwrap_or(0))
        .unwrap_or(0)
}

/// Now, in the marks' unit.
pub fn now_micros() -> u64 {
    u64::try_from(jiff::Timestamp::now().as_microsecond()).unwrap_or(0)
}

/// A reader of one audit log file. It parses each line once: a read picks up
/// only what was appended since the last one (a benchmark polls a log of
/// hundreds of thousands of events).
#[derive(Debug, Clone)]
pub struct AuditLog {
    path: PathBuf,
    parsed: Arc<Mutex<Parsed>>,
}

#[derive(Debug, Default)]
struct Parsed {
    /// Bytes of the file consumed (complete lines only).
    offset: u64,
    events: Vec<Event>,
}

impl AuditLog {
    /// A reader of the audit log file at `path` (parsed on demand).
    pub fn new(path: &Path) -> AuditLog {
        AuditLog {
            path: path.to_path_buf(),
            parsed: Arc::default(),
        }
    }

    /// The audit log file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Calls `f` with every complete event of the log so far (a line still
    /// being written waits for the next read).
    pub fn with_events<T>(&self, f: impl FnOnce(&[Event]) -> T) -> T {
        let mut p = self.parsed.lock().unwrap_or_else(|e| e.into_inner());
        if let Ok(mut file) = std::fs::File::open(&self.path)
            && file.seek(SeekFrom::Start(p.offset)).is_ok()
        {
            let mut buf = Vec::new();
            if file.read_to_end(&mut buf).is_ok()
                && let Some(end) = buf.iter().rposition(|b| *b == b'\n')
            {
                for line in buf[..end].split(|b| *b == b'\n') {
                    if let Ok(raw) = serde_json::from_slice::<RawEvent>(line) {
                        p.events.push(Event::from_raw(raw));
                    }
                }
                p.offset += end as u64 + 1;
            }
        }
        f(&p.events)
    }

    /// Every complete event line of the log (a line being written is skipped).
    pub fn events(&self) -> Vec<Event> {
        self.with_events(<[Event]>::to_vec)
    }

    /// Writes received after `mark`, in kube-sim's `/_sim/writes` item shape
    /// (`resourceVersion` is empty unless the policy logs that resource's
    /// answer bodies: the `Metadata` level has none).
    /// A patch or update answered `201 Created` (a server-side apply, or a
    /// PUT, that created the object) is a `create`, as kube-sim logs it.
    pub fn writes_since(&self, mark: u64) -> Vec<Value> {
        self.events()
            .into_iter()
            .filter(|e| e.is_write() && e.received_micros > mark)
            .map(|e| {
                let verb = if e.code == 201 && matches!(e.verb.as_str(), "patch" | "update") {
                    "create"
                } else {
                    e.verb.as_str()
                };
                json!({
                    // ResponseComplete of a write: just after its commit.
                    "timeNanos": e.stage_micros.max(e.received_micros).saturating_mul(1000),
                    "verb": verb,
                    "group": e.group,
                    "resource": e.resource,
                    "namespace": e.namespace,
                    "name": e.name,
                    "resourceVersion": e.response_rv,
                    "user": e.user,
                })
            })
            .collect()
    }

    /// Request statistics in kube-sim's `/_sim/stats` shape.
    pub fn stats(&self, mark_now: u64) -> Value {
        let mut requests: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
        let mut by_user: BTreeMap<String, BTreeMap<String, BTreeMap<String, u64>>> =
            BTreeMap::new();
        let mut writes: BTreeMap<String, u64> = BTreeMap::new();
        let mut started: HashSet<String> = HashSet::new();
        let mut open = 0i64;
        for e in self.events() {
            if e.verb == "watch" {
                match e.stage.as_str() {
                    "ResponseStarted" => {
                        started.insert(e.audit_id.clone());
                        open += 1;
                    }
                    "ResponseComplete" | "Panic" if started.remove(&e.audit_id) => open -= 1,
                    _ => {}
                }
            }
            if e.is_write() {
                *writes.entry(e.resource.clone()).or_default() += 1;
            }
            if !e.counts_as_request() || is_control_plane(&e.user) {
                continue;
            }
            *requests
                .entry(e.verb.clone())
                .or_default()
                .entry(e.resource.clone())
                .or_default() += 1;
            if e.resource != "nonresource" {
                *by_user
                    .entry(e.user.clone())
                    .or_default()
                    .entry(e.verb.clone())
                    .or_default()
                    .entry(e.resource.clone())
                    .or_default() += 1;
            }
        }
        json!({
            "requests": requests,
            "requestsByUser": by_user,
            "writes": writes,
            "resourceVersion": mark_now.to_string(),
            "openWatches": open,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(stage: &str, verb: &str, res: &str, code: u16, ts: &str, allow: bool) -> String {
        json!({"kind": "Event", "auditID": format!("{verb}-{res}"), "stage": stage, "verb": verb,
               "user": {"username": "u"}, "objectRef": {"resource": res, "namespace": "n", "name": "x", "apiGroup": "g"},
               "responseStatus": {"code": code}, "requestReceivedTimestamp": ts,
               "annotations": {"authorization.k8s.io/decision": if allow {"allow"} else {"forbid"}}})
        .to_string()
    }

    #[test]
    fn writes_and_stats_from_a_log() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let p = dir.path().join("audit.log");
        let lines = [
            line(
                "ResponseComplete",
                "patch",
                "widgets",
                200,
                "2026-01-01T00:00:01.000001Z",
                true,
            ),
            line(
                "ResponseComplete",
                "patch",
                "widgets",
                409,
                "2026-01-01T00:00:02Z",
                true,
            ),
            line(
                "ResponseStarted",
                "watch",
                "widgets",
                200,
                "2026-01-01T00:00:03Z",
                true,
            ),
            line(
                "ResponseComplete",
                "list",
                "widgets",
                403,
                "2026-01-01T00:00:04Z",
                false,
            ),
            line(
                "ResponseComplete",
                "delete",
                "widgets",
                200,
                "2026-01-01T00:00:05Z",
                true,
            ),
            // A server-side apply that created the object.
            line(
                "ResponseComplete",
                "patch",
                "gadgets",
                201,
                "2026-01-01T00:00:06Z",
                true,
            ),
        ];
        // The last line is still being written: no newline yet.
        std::fs::write(&p, format!("{}\n{{\"partial", lines.join("\n")))?;
        let log = AuditLog::new(&p);
        let all = log.writes_since(0);
        assert_eq!(all.len(), 3, "{all:?}");
        assert_eq!(all[0]["verb"], "patch");
        assert_eq!(all[0]["timeNanos"], json!(1_767_225_601_000_001_000u64));
        assert_eq!(all[2]["verb"], "create", "an apply that created");
        let later = log.writes_since(micros("2026-01-01T00:00:04Z"));
        assert_eq!(later.len(), 2);
        assert_eq!(later[0]["verb"], "delete");
        let s = log.stats(7);
        assert_eq!(s["requests"]["patch"]["widgets"], 2);
        assert_eq!(
            s["requests"]["patch"]["gadgets"], 1,
            "requests keep their verb"
        );
        assert_eq!(s["requests"]["watch"]["widgets"], 1);
        assert!(
            s["requests"]["list"].is_null(),
            "denied requests do not count"
        );
        assert_eq!(s["writes"]["widgets"], 2);
        assert_eq!(s["openWatches"], 1);
        assert_eq!(s["requestsByUser"]["u"]["delete"]["widgets"], 1);
        Ok(())
    }
}
