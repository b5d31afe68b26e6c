//! WATCH: the streams of watch events.
//!
//! A watch replays the history after its starting revision and then follows new
//! events: it wakes on the revision channel, copies the events after its cursor out
//! of the history under the lock, filters them (namespace, label and field
//! selectors; an object moving out of a selector is sent as DELETED, into it as
//! ADDED, like the real watch cache) and writes one JSON line per event.
//!
//! Start semantics (as the real server):
//! - `resourceVersion` unset or `"0"`, or `sendInitialEvents=true`: synthetic ADDED
//!   events for the current state first; with `sendInitialEvents=true` followed by a
//!   BOOKMARK annotated `k8s.io/initial-events-end: "true"`.
//! - exact `resourceVersion`: events after it; if that revision is no longer in the
//!   history, an `ERROR` event with a 410 `Expired` Status ends the stream.
//!
//! If a watch falls behind the bounded history it also gets the 410 ERROR event.
//! Bookmarks (`allowWatchBookmarks=true`) carry the revision of the last event this
//! watch has processed, so resuming from a bookmark never skips an event.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use bytes::Bytes;
use hyper::Response;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::ctx::{Ctx, present, selectors};
use crate::machinery::{FieldSel, LabelSel};
use crate::registry::ResourceInfo;
use crate::state::{SimState, WatchGuard};
use crate::status::{ApiError, ApiResult};
use crate::store::{Event, EventType};
use crate::table;

struct Spec {
    info: Arc<ResourceInfo>,
    version: String,
    res: String,
    namespace: Option<String>,
    name: Option<String>,
    label: LabelSel,
    field: FieldSel,
    bookmarks: bool,
    table: bool,
}

impl Spec {
    fn matches(&self, ns: &str, obj: &Value) -> bool {
        if self.namespace.as_deref().is_some_and(|n| n != ns) {
            return false;
        }
        if let Some(name) = &self.name
            && obj.pointer("/metadata/name").and_then(Value::as_str) != Some(name.as_str())
        {
            return false;
        }
        self.label.matches(obj) && self.field.matches(obj)
    }

    fn line(&self, etype: &str, obj: &Value, first_table: &mut bool) -> Bytes {
        let obj = if self.table {
            let mut t = table::table(
                &self.info,
                &self.version,
                std::slice::from_ref(obj),
                None,
                None,
            );
            if !*first_table {
                t["columnDefinitions"] = Value::Null;
            }
            *first_table = false;
            t
        } else {
            present(&self.info, &self.version, obj)
        };
        let mut v = serde_json::to_vec(&json!({"type": etype, "object": obj})).unwrap_or_default();
        v.push(b'\n');
        Bytes::from(v)
    }

    /// Fast path: reuse the event's pre-serialized object.
    fn event_line(&self, etype: &str, e: &Event, first_table: &mut bool) -> Bytes {
        if self.table || !crate::convert::served_as_stored(&self.info, &self.version) {
            return self.line(etype, &e.object, first_table);
        }
        let mut v = Vec::with_capacity(e.object_json.len() + 32);
        v.extend_from_slice(b"{\"type\":\"");
        v.extend_from_slice(etype.as_bytes());
        v.extend_from_slice(b"\",\"object\":");
        v.extend_from_slice(&e.object_json);
        v.extend_from_slice(b"}\n");
        Bytes::from(v)
    }

    fn bookmark(&self, rv: u64, initial_end: bool) -> Bytes {
        let mut meta = json!({"resourceVersion": rv.to_string()});
        if initial_end {
            meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        let obj = json!({"kind": self.info.kind, "apiVersion": self.info.api_version(&self.version), "metadata": meta});
        let mut v =
            serde_json::to_vec(&json!({"type": "BOOKMARK", "object": obj})).unwrap_or_default();
        v.push(b'\n');
        Bytes::from(v)
    }
}

fn error_line(e: &ApiError) -> Bytes {
    let mut v =
        serde_json::to_vec(&json!({"type": "ERROR", "object": e.to_status()})).unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

/// Start a watch; returns the streaming response.
pub(super) fn start(ctx: &Ctx) -> ApiResult<Response<Body>> {
    let (label, field) = selectors(ctx)?;
    let q = |k: &str| ctx.query.get(k).map(String::as_str);
    let send_initial = q("sendInitialEvents") == Some("true");
    let bookmarks = q("allowWatchBookmarks") == Some("true");
    let forbidden = |field: &str, message: &str| {
        ApiError::invalid(
            "ListOptions",
            "meta.k8s.io",
            "",
            vec![crate::status::Cause::new(
                "FieldValueForbidden",
                field,
                message,
            )],
        )
    };
    if send_initial && q("resourceVersionMatch") != Some("NotOlderThan") {
        return Err(forbidden(
            "resourceVersionMatch",
            "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
        ));
    }
    if send_initial && !bookmarks {
        return Err(forbidden(
            "allowWatchBookmarks",
            "sendInitialEvents requires setting allowWatchBookmarks to true",
        ));
    }
    let rv: Option<u64> = match q("resourceVersion") {
        None | Some("") | Some("0") => None,
        Some(s) => Some(s.parse().map_err(|_| {
            ApiError::bad_request(format!(
                "resourceVersion: Invalid value: {s:?}: must be a number"
            ))
        })?),
    };
    let timeout =
        match q("timeoutSeconds") {
            Some(s) => Duration::from_secs(s.parse::<u64>().map_err(|_| {
                ApiError::bad_request(format!("timeoutSeconds: Invalid value: {s:?}"))
            })?),
            // The real server picks a random timeout of 30-60 minutes.
            None => Duration::from_secs(1800),
        };
    let spec = Spec {
        info: ctx.info.clone(),
        version: ctx.version.clone(),
        res: crate::convert::store_key(&ctx.info),
        namespace: ctx.namespace.clone(),
        name: ctx.name.clone(),
        label,
        field,
        bookmarks,
        table: ctx.accept.table,
    };
    // Snapshot under the lock: initial state (if any) and the cursor.
    let sh = ctx.sh.clone();
    let mut first = Vec::new();
    let mut first_table = true;
    let cursor;
    {
        let st = sh.lock();
        if rv.is_none() || send_initial {
            for ((_, ns, _), obj) in st.range(&spec.res, spec.namespace.as_deref()) {
                if spec.matches(ns, obj) {
                    first.push(spec.line("ADDED", obj, &mut first_table));
                }
            }
            cursor = st.rv;
            if send_initial {
                first.push(spec.bookmark(cursor, true));
            }
        } else {
            let r = rv.unwrap_or(0);
            if !st.can_watch_from(r) {
                first.push(error_line(&ApiError::gone(r, st.compacted + 1)));
                cursor = u64::MAX;
            } else if r > st.rv {
                return Err(ApiError::too_large_rv(r, st.rv));
            } else {
                cursor = r;
            }
        }
    }
    let (tx, rx) = mpsc::channel::<Result<Bytes, std::io::Error>>(256);
    let guard = WatchGuard::new(sh.clone());
    let bookmark_every = sh.cfg.bookmark_interval;
    tokio::spawn(async move {
        let _guard = guard;
        for line in first {
            if tx.send(Ok(line)).await.is_err() {
                return;
            }
        }
        if cursor == u64::MAX {
            return;
        }
        run(sh, spec, cursor, tx, timeout, bookmark_every, first_table).await;
    });
    let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
    Response::builder()
        .status(200)
        .header("content-type", "application/json")
        .header("cache-control", "no-cache, private")
        .body(Body::from_stream(stream))
        .map_err(|e| ApiError::internal(e.to_string()))
}

async fn run(
    sh: Arc<SimState>,
    spec: Spec,
    mut cursor: u64,
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    timeout: Duration,
    bookmark_every: Duration,
    mut first_table: bool,
) {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut rv_rx = sh.rv_tx.subscribe();
    let mut drop_rx = sh.drop_tx.subscribe();
    drop_rx.borrow_and_update();
    let mut ticker = tokio::time::interval(bookmark_every.max(Duration::from_millis(10)));
    ticker.tick().await;
    loop {
        // Catch up with everything after the cursor.
        loop {
            let batch = {
                let st = sh.lock();
                if st.can_watch_from(cursor) {
                    Ok(st.events_after(cursor, 512))
                } else {
                    Err(ApiError::gone(cursor, st.compacted + 1))
                }
            };
            let batch = match batch {
                Ok(b) => b,
                Err(e) => {
                    let _ = tx.send(Ok(error_line(&e))).await;
                    return;
                }
            };
            if batch.is_empty() {
                break;
            }
            // A watch dropped by a fault sends nothing after the fault
            // request has returned, even when an event woke it first.
            if drop_rx.has_changed().unwrap_or(true) || !stall(&sh, &mut drop_rx).await {
                return;
            }
            for e in batch {
                cursor = e.rv;
                if e.res != spec.res {
                    continue;
                }
                let now_match =
                    e.etype != EventType::Deleted && spec.matches(&e.namespace, &e.object);
                let was_match = e
                    .old
                    .as_ref()
                    .is_some_and(|o| spec.matches(&e.namespace, o));
                let line = match (e.etype, was_match, now_match) {
                    (EventType::Deleted, true, _) => {
                        spec.event_line("DELETED", &e, &mut first_table)
                    }
                    (EventType::Deleted, false, _) => continue,
                    (_, true, true) => spec.event_line("MODIFIED", &e, &mut first_table),
                    (_, false, true) => spec.event_line("ADDED", &e, &mut first_table),
                    (_, true, false) => spec.event_line("DELETED", &e, &mut first_table),
                    (_, false, false) => continue,
                };
                if tx.send(Ok(line)).await.is_err() {
                    return;
                }
            }
        }
        tokio::select! {
            biased;
            _ = sh.shutdown.cancelled() => return,
            _ = drop_rx.changed() => return,
            // A stalled watch does not even end on time: nothing passes the
            // stalled connection (as with the fault proxy of the real backend).
            _ = tokio::time::sleep_until(deadline) => {
                let _ = stall(&sh, &mut drop_rx).await;
                return;
            }
            _ = tx.closed() => return,
            changed = rv_rx.changed() => { if changed.is_err() { return; } }
            _ = ticker.tick(), if spec.bookmarks && !spec.table => {
                if !stall(&sh, &mut drop_rx).await { return; }
                if tx.send(Ok(spec.bookmark(cursor, false))).await.is_err() { return; }
            }
        }
    }
}

/// Honour a `stallWatchesSeconds` fault: keep the connection, send nothing.
/// Returns false when the watch must end (dropped or shutting down) meanwhile.
async fn stall(sh: &SimState, drop_rx: &mut tokio::sync::watch::Receiver<u64>) -> bool {
    loop {
        let until = sh.faults().stall_until;
        match until {
            Some(t) if t > Instant::now() => {
                tokio::select! {
                    _ = tokio::time::sleep_until(t.into()) => {}
                    _ = drop_rx.changed() => return false,
                    _ = sh.shutdown.cancelled() => return false,
                }
            }
            _ => return true,
        }
    }
}
