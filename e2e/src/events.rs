//! Validation of Events, as the real server's `ValidateEventCreate` and
//! `ValidateEventUpdate` (`pkg/apis/core/validation/events.go`): the legacy
//! checks for every request, and for requests through `events.k8s.io/v1` the
//! strict ones: on create `eventTime` set, `type` Normal or Warning and the
//! deprecated core fields unset; on update every field but `series` and
//! metadata immutable. Objects are in the stored (core/v1) shape, the field
//! paths the internal type's (`message`, `count`, ...), as the real errors.

use serde_json::Value;

use crate::status::Cause;

const REPORTING_INSTANCE_LIMIT: usize = 128;
const ACTION_LIMIT: usize = 128;
const REASON_LIMIT: usize = 128;
const NOTE_LIMIT: usize = 1024;

fn str_at<'a>(obj: &'a Value, path: &str) -> &'a str {
    obj.pointer(path).and_then(Value::as_str).unwrap_or("")
}

fn set(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
        Some(Value::Object(m)) => m.values().any(|v| set(Some(v))),
        Some(_) => true,
    }
}

fn invalid(field: &str, value: &str, detail: &str) -> Cause {
    Cause::new(
        "FieldValueInvalid",
        field,
        format!("Invalid value: {value}: {detail}"),
    )
}

fn required(field: &str) -> Cause {
    Cause::new("FieldValueRequired", field, "")
}

/// `"text"` as Go's `%q`.
fn quoted(s: &str) -> String {
    format!("{s:?}")
}

/// A timestamp as Go's `time.Time.String()`: `2026-01-01 00:00:00 +0000 UTC`
/// (the zero time when unset).
fn go_time(v: Option<&Value>) -> String {
    let ts = v
        .and_then(Value::as_str)
        .and_then(|s| s.parse::<jiff::Timestamp>().ok());
    match ts {
        None => "0001-01-01 00:00:00 +0000 UTC".into(),
        Some(t) => {
            let base = t.strftime("%Y-%m-%d %H:%M:%S").to_string();
            let nanos = t.subsec_nanosecond();
            let frac = if nanos == 0 {
                String::new()
            } else {
                format!(".{nanos:09}").trim_end_matches('0').to_string()
            };
            format!("{base}{frac} +0000 UTC")
        }
    }
}

/// A `core.ObjectReference` as Go's `%#v`.
fn go_object_reference(v: Option<&Value>) -> String {
    let f = |k: &str| {
        quoted(
            v.and_then(|v| v.get(k))
                .and_then(Value::as_str)
                .unwrap_or(""),
        )
    };
    format!(
        "core.ObjectReference{{Kind:{}, Namespace:{}, Name:{}, UID:{}, APIVersion:{}, ResourceVersion:{}, FieldPath:{}}}",
        f("kind"),
        f("namespace"),
        f("name"),
        f("uid"),
        f("apiVersion"),
        f("resourceVersion"),
        f("fieldPath")
    )
}

/// Validates an Event (stored shape) written through core/v1 or, with
/// `strict`, events.k8s.io/v1; `old` on updates.
pub fn validate(old: Option<&Value>, ev: &Value, strict: bool) -> Vec<Cause> {
    let mut errs = legacy(ev, strict);
    if !strict {
        return errs;
    }
    match old {
        None => create(ev, &mut errs),
        Some(old) => update(old, ev, &mut errs),
    }
    errs
}

fn legacy(ev: &Value, strict: bool) -> Vec<Cause> {
    let mut errs = Vec::new();
    let ns = str_at(ev, "/metadata/namespace");
    let involved_ns = str_at(ev, "/involvedObject/namespace");
    let mismatch = || {
        invalid(
            "involvedObject.namespace",
            &quoted(involved_ns),
            "does not match event.namespace",
        )
    };
    if !set(ev.get("eventTime")) {
        if involved_ns.is_empty() {
            if !ns.is_empty() && ns != "default" {
                errs.push(mismatch());
            }
        } else if ns != involved_ns {
            errs.push(mismatch());
        }
    } else {
        if involved_ns.is_empty() && ns != "default" && ns != "kube-system" {
            errs.push(mismatch());
        }
        let controller_field = if strict {
            "reportingController"
        } else {
            "reportingComponent"
        };
        let controller = str_at(ev, "/reportingComponent");
        if controller.is_empty() {
            errs.push(required(controller_field));
        }
        if let Err(e) = kube_sim_apimachinery::names::validate_qualified_name(controller) {
            errs.push(invalid(controller_field, &quoted(controller), &e));
        }
        let instance = str_at(ev, "/reportingInstance");
        if instance.is_empty() {
            errs.push(required("reportingInstance"));
        }
        if instance.len() > REPORTING_INSTANCE_LIMIT {
            errs.push(invalid(
                "reportingInstance",
                "\"\"",
                &format!("can have at most {REPORTING_INSTANCE_LIMIT} characters"),
            ));
        }
        let action = str_at(ev, "/action");
        if action.is_empty() {
            errs.push(required("action"));
        }
        if action.len() > ACTION_LIMIT {
            errs.push(invalid(
                "action",
                "\"\"",
                &format!("can have at most {ACTION_LIMIT} characters"),
            ));
        }
        let reason = str_at(ev, "/reason");
        if reason.is_empty() {
            errs.push(required("reason"));
        }
        if reason.len() > REASON_LIMIT {
            errs.push(invalid(
                "reason",
                "\"\"",
                &format!("can have at most {REASON_LIMIT} characters"),
            ));
        }
        if str_at(ev, "/message").len() > NOTE_LIMIT {
            errs.push(invalid(
                "message",
                "\"\"",
                &format!("can have at most {NOTE_LIMIT} characters"),
            ));
        }
    }
    errs
}

fn series(ev: &Value, errs: &mut Vec<Cause>) {
    let Some(s) = ev.get("series").filter(|s| !s.is_null()) else {
        return;
    };
    if s.get("count").and_then(Value::as_i64).unwrap_or(0) < 2 {
        errs.push(invalid("series.count", "\"\"", "should be at least 2"));
    }
    if !set(s.get("lastObservedTime")) {
        errs.push(required("series.lastObservedTime"));
    }
}

fn create(ev: &Value, errs: &mut Vec<Cause>) {
    series(ev, errs);
    if !set(ev.get("eventTime")) {
        errs.push(required("eventTime"));
    }
    let t = str_at(ev, "/type");
    if t != "Normal" && t != "Warning" {
        errs.push(invalid("type", "\"\"", &format!("has invalid value: {t}")));
    }
    for (field, path) in [
        ("firstTimestamp", "firstTimestamp"),
        ("lastTimestamp", "lastTimestamp"),
        ("count", "count"),
        ("source", "source"),
    ] {
        if set(ev.get(path)) {
            errs.push(invalid(field, "\"\"", "needs to be unset"));
        }
    }
}

fn update(old: &Value, ev: &Value, errs: &mut Vec<Cause>) {
    if ev.get("series") != old.get("series") {
        series(ev, errs);
    }
    let same = |k: &str| {
        let norm = |v: Option<&Value>| if set(v) { v.cloned() } else { None };
        norm(ev.get(k)) == norm(old.get(k))
    };
    let string = |k: &str| quoted(ev.get(k).and_then(Value::as_str).unwrap_or(""));
    let count = || {
        ev.get("count")
            .and_then(Value::as_i64)
            .unwrap_or(0)
            .to_string()
    };
    let source = || {
        let f = |k: &str| quoted(str_at(ev, &format!("/source/{k}")));
        format!(
            "core.EventSource{{Component:{}, Host:{}}}",
            f("component"),
            f("host")
        )
    };
    let related = || match ev.get("related").filter(|r| !r.is_null()) {
        None => "null".to_string(),
        Some(r) => go_object_reference(Some(r)),
    };
    // The real validation's order (`reason` is checked twice).
    let checks: [(&str, &str, String); 14] = [
        (
            "involvedObject",
            "involvedObject",
            go_object_reference(ev.get("involvedObject")),
        ),
        ("reason", "reason", string("reason")),
        ("message", "message", string("message")),
        ("source", "source", source()),
        (
            "firstTimestamp",
            "firstTimestamp",
            go_time(ev.get("firstTimestamp")),
        ),
        (
            "lastTimestamp",
            "lastTimestamp",
            go_time(ev.get("lastTimestamp")),
        ),
        ("count", "count", count()),
        ("reason", "reason", string("reason")),
        ("type", "type", string("type")),
        ("eventTime", "eventTime", go_time(ev.get("eventTime"))),
        ("action", "action", string("action")),
        ("related", "related", related()),
        (
            "reportingController",
            "reportingComponent",
            string("reportingComponent"),
        ),
        (
            "reportingInstance",
            "reportingInstance",
            string("reportingInstance"),
        ),
    ];
    for (field, key, value) in checks {
        if !same(key) {
            errs.push(invalid(field, &value, "field is immutable"));
        }
    }
}
