//! The `/_sim/` test hooks (admin token only): request and write counters
//! (`stats`), the write log (`writes`), fault injection (`faults`), and
//! storing an object without validation (`unvalidated`).

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use hyper::{Method, Response};
use serde_json::{Value, json};

use super::ctx::{meta_str, now};
use super::record::record_raw;
use crate::convert;
use crate::response::json_response;
use crate::state::SimState;
use crate::status::{ApiError, ApiResult};
use crate::store::{EventType, Key, WriteRecord};

pub(super) fn sim_hook(
    sh: &Arc<SimState>,
    method: &Method,
    hook: &str,
    query: &HashMap<String, String>,
    body: &[u8],
) -> ApiResult<Response<Body>> {
    match (method, hook) {
        (&Method::GET, "stats") => Ok(json_response(200, &sh.stats_json())),
        (&Method::GET, "writes") => {
            let since: u64 = match query.get("since") {
                Some(s) => s.parse().map_err(|_| {
                    ApiError::bad_request(format!("since: not a resourceVersion: {s:?}"))
                })?,
                None => 0,
            };
            let resource = query.get("resource");
            let st = sh.lock();
            let items: Vec<&WriteRecord> = st
                .writes
                .iter()
                .filter(|w| w.resource_version.parse::<u64>().unwrap_or(0) > since)
                .filter(|w| resource.is_none_or(|r| *r == w.resource))
                .collect();
            Ok(json_response(
                200,
                &json!({"resourceVersion": st.rv.to_string(), "items": items}),
            ))
        }
        (&Method::POST, "faults") => {
            let req: crate::faults::FaultRequest = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("invalid fault request: {e}")))?;
            crate::faults::validate_faults(&req).map_err(ApiError::bad_request)?;
            sh.apply_faults(req);
            Ok(json_response(200, &json!({"ok": true})))
        }
        (&Method::POST, "unvalidated") => {
            let obj: Value = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("invalid object: {e}")))?;
            let (code, stored) = store_unvalidated(sh, obj)?;
            Ok(json_response(code, &stored))
        }
        (_, "stats" | "writes" | "faults" | "unvalidated") => Err(ApiError::method_not_allowed(
            format!("/_sim/{hook} does not allow {method}"),
        )),
        _ => Err(ApiError::no_route()),
    }
}

/// `POST /_sim/unvalidated`: stores `obj` (created, or replacing the stored
/// object of its kind, namespace and name) as it is: no defaults, no
/// validation, no admission, no managedFields; only `uid`,
/// `creationTimestamp` (kept when replacing) and the next `resourceVersion`
/// are set. Watches see it like any write. For tests of clients that must
/// cope with what an older or corrupted server could hold (a real API server
/// would refuse it). Returns the HTTP code (201 created, 200 replaced) and
/// the stored object.
pub fn store_unvalidated(sh: &SimState, mut obj: Value) -> ApiResult<(u16, Value)> {
    let s = |p: &str| obj.pointer(p).and_then(Value::as_str).map(str::to_string);
    let (Some(api_version), Some(kind), Some(name)) =
        (s("/apiVersion"), s("/kind"), s("/metadata/name"))
    else {
        return Err(ApiError::bad_request(
            "the object needs apiVersion, kind and metadata.name",
        ));
    };
    let (group, version) = api_version
        .rsplit_once('/')
        .map_or(("", api_version.as_str()), |(g, v)| (g, v));
    let mut st = sh.lock();
    let info = st
        .registry
        .resources
        .values()
        .find(|r| {
            r.group == group && r.kind == kind && r.serves(version) && !convert::is_converted(r)
        })
        .cloned()
        .ok_or_else(|| {
            ApiError::bad_request(format!("kube-sim does not store {api_version} {kind}"))
        })?;
    let namespace = s("/metadata/namespace").unwrap_or_default();
    if info.namespaced == namespace.is_empty() {
        return Err(ApiError::bad_request(if info.namespaced {
            format!("{kind} is namespaced: metadata.namespace is required")
        } else {
            format!("{kind} is cluster-scoped: metadata.namespace must be unset")
        }));
    }
    let key: Key = (convert::store_key(&info), namespace.clone(), name.clone());
    let old = st.objects.get(&key).cloned();
    let (uid, created) = match &old {
        Some(o) => (
            meta_str(o, "uid").unwrap_or("").to_string(),
            meta_str(o, "creationTimestamp").unwrap_or("").to_string(),
        ),
        None => (uuid::Uuid::new_v4().to_string(), now()),
    };
    let rv = st.next_rv();
    obj["metadata"]["uid"] = json!(uid);
    obj["metadata"]["creationTimestamp"] = json!(created);
    obj["metadata"]["resourceVersion"] = json!(rv.to_string());
    let (etype, verb, code) = match old {
        Some(_) => (EventType::Modified, "update", 200),
        None => (EventType::Added, "create", 201),
    };
    let stored = Arc::new(obj);
    st.commit(rv, etype, key, old, stored.clone());
    record_raw(
        &mut st,
        sh,
        "kube-sim-admin",
        verb,
        &info,
        &namespace,
        &name,
        rv,
    );
    Ok((code, (*stored).clone()))
}
