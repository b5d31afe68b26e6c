//! Conversion between API versions that share one storage.
//!
//! The real API server stores one Event: `core/v1` is the storage shape and
//! `events.k8s.io/v1` is converted to and from it (`pkg/apis/events/v1/conversion.go`
//! plus the generated field copies). kube-sim does the same at the API boundary:
//! request bodies (and the result of a patch, which is applied in the request's
//! shape) go through [`to_storage`], every object served (get, list, watch, write
//! answers) through [`from_storage`]. Both APIs therefore read and write the same
//! stored object, under one key and one resourceVersion sequence.
//!
//! Field map, `core/v1` <-> `events.k8s.io/v1` (all other fields keep their name:
//! `metadata`, `type`, `reason`, `action`, `related`, `eventTime`, `series`,
//! `reportingInstance`):
//! ```text
//! message            <-> note
//! involvedObject     <-> regarding
//! source             <-> deprecatedSource
//! firstTimestamp     <-> deprecatedFirstTimestamp
//! lastTimestamp      <-> deprecatedLastTimestamp
//! count              <-> deprecatedCount
//! reportingComponent <-> reportingController
//! ```
//! A field that exists only in the other version (say `message` sent to
//! `events.k8s.io/v1`) is an unknown field there and is dropped, as the real
//! server drops unknown fields of built-in types.

use serde_json::{Value, json};

use crate::registry::ResourceInfo;

/// `(core/v1 name, events.k8s.io/v1 name)` of the fields that are renamed.
const EVENT_FIELDS: &[(&str, &str)] = &[
    ("message", "note"),
    ("involvedObject", "regarding"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
    ("reportingComponent", "reportingController"),
];

/// The store key (`group/resource`) of core/v1 Events, the storage of both Event APIs.
const CORE_EVENTS: &str = "/events";

/// Whether `info` is stored as another resource (today: `events.k8s.io/v1` Events,
/// stored as core/v1 Events).
pub fn is_converted(info: &ResourceInfo) -> bool {
    info.group == "events.k8s.io" && info.resource == "events"
}

fn is_core_event(info: &ResourceInfo) -> bool {
    info.group.is_empty() && info.resource == "events"
}

/// Whether `info`'s objects in `version` are served exactly as stored (no
/// conversion, no apiVersion change): the answer can reuse the stored bytes.
pub fn served_as_stored(info: &ResourceInfo, version: &str) -> bool {
    version == info.storage_version() && !is_converted(info)
}

/// The key objects of `info` are stored under.
pub fn store_key(info: &ResourceInfo) -> String {
    if is_converted(info) {
        CORE_EVENTS.to_string()
    } else {
        info.key()
    }
}

/// The `apiVersion` of `info`'s objects as stored.
pub fn stored_api_version(info: &ResourceInfo) -> String {
    if is_converted(info) {
        "v1".to_string()
    } else {
        info.api_version(info.storage_version())
    }
}

/// Move `obj[from]` to `obj[to]`, after dropping any `obj[to]` (a field of the
/// other version, unknown in this one).
fn rename(obj: &mut serde_json::Map<String, Value>, from: &str, to: &str) {
    obj.remove(to);
    if let Some(v) = obj.remove(from) {
        obj.insert(to.to_string(), v);
    }
}

/// A request body (already checked against the request's apiVersion and kind) in
/// the stored shape. Only Events change: an `events.k8s.io/v1` Event becomes a
/// core/v1 one; a core/v1 Event loses the `events.k8s.io/v1`-only field names.
pub fn to_storage(info: &ResourceInfo, obj: &mut Value) {
    if !is_converted(info) && !is_core_event(info) {
        return;
    }
    let Some(m) = obj.as_object_mut() else {
        return;
    };
    if is_converted(info) {
        for (core, events) in EVENT_FIELDS {
            rename(m, events, core);
        }
        m.insert("apiVersion".into(), json!("v1"));
    } else {
        for (_, events) in EVENT_FIELDS {
            m.remove(*events);
        }
    }
}

/// A stored object as served by `info` in `version`.
pub fn from_storage(info: &ResourceInfo, version: &str, obj: &Value) -> Value {
    let mut out = obj.clone();
    if is_converted(info)
        && let Some(m) = out.as_object_mut()
    {
        for (core, events) in EVENT_FIELDS {
            rename(m, core, events);
        }
    }
    if is_converted(info) || version != info.storage_version() {
        out["apiVersion"] = json!(info.api_version(version));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Registry;

    #[test]
    fn events_round_trip_between_the_two_apis() {
        let reg = Registry::with_builtins();
        let core = reg.get("", "events").expect("core events");
        let new = reg
            .get("events.k8s.io", "events")
            .expect("events.k8s.io events");
        assert_eq!(store_key(&core), store_key(&new));
        let mut body = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
            "metadata": {"name": "e"}, "note": "n", "regarding": {"name": "web"},
            "deprecatedSource": {"component": "c"}, "deprecatedCount": 2,
            "deprecatedFirstTimestamp": "2026-01-01T00:00:00Z",
            "deprecatedLastTimestamp": "2026-01-02T00:00:00Z",
            "reportingController": "kd", "reportingInstance": "kd-0", "action": "Sync",
            "reason": "Synced", "type": "Normal", "eventTime": "2026-01-01T00:00:00.000000Z",
            "series": {"count": 3, "lastObservedTime": "2026-01-02T00:00:00.000000Z"},
            "related": {"name": "x"},
            // core-only name: unknown in events.k8s.io/v1, dropped
            "message": "dropped"});
        let sent = body.clone();
        to_storage(&new, &mut body);
        assert_eq!(
            body,
            json!({"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": "e"}, "message": "n", "involvedObject": {"name": "web"},
            "source": {"component": "c"}, "count": 2,
            "firstTimestamp": "2026-01-01T00:00:00Z",
            "lastTimestamp": "2026-01-02T00:00:00Z",
            "reportingComponent": "kd", "reportingInstance": "kd-0", "action": "Sync",
            "reason": "Synced", "type": "Normal", "eventTime": "2026-01-01T00:00:00.000000Z",
            "series": {"count": 3, "lastObservedTime": "2026-01-02T00:00:00.000000Z"},
            "related": {"name": "x"}})
        );
        assert_eq!(from_storage(&core, "v1", &body), body);
        let mut back = sent;
        back.as_object_mut().expect("object").remove("message");
        assert_eq!(from_storage(&new, "v1", &body), back);
        // A core/v1 body loses events.k8s.io/v1-only names.
        let mut core_body =
            json!({"apiVersion": "v1", "kind": "Event", "message": "m", "note": "x"});
        to_storage(&core, &mut core_body);
        assert_eq!(
            core_body,
            json!({"apiVersion": "v1", "kind": "Event", "message": "m"})
        );
    }
}
