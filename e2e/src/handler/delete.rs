//! DELETE of one object and of a collection: DeleteOptions (query or body,
//! JSON or protobuf), preconditions on `uid` and `resourceVersion`, and the
//! answer (the object while finalizers keep it, else a success `Status` for
//! built-in types). The deletion itself is [`super::gc`]'s.

use axum::body::Body;
use hyper::Response;
use serde_json::{Value, json};

use super::ctx::{Ctx, meta_str, ok_json, present, selectors};
use super::gc::delete_key;
use super::read::list_item;
use crate::convert;
use crate::status::{ApiError, ApiResult, success_status};
use crate::store::Key;

/// (orphan dependents, preconditions, dry run) from query and DeleteOptions body.
fn delete_options(ctx: &Ctx, body: &[u8]) -> ApiResult<(bool, Option<Value>, bool)> {
    let mut policy = ctx.q("propagationPolicy").map(str::to_string);
    let mut preconditions = None;
    let mut dry_run = ctx.dry_run();
    if !body.iter().all(u8::is_ascii_whitespace) {
        let opts: Value = if body.starts_with(b"k8s\0") {
            crate::protobuf::decode(body)
                .map_err(|(_, m)| ApiError::bad_request(format!("invalid DeleteOptions: {m}")))?
        } else {
            serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?
        };
        if let Some(p) = opts.get("propagationPolicy").and_then(Value::as_str) {
            policy = Some(p.to_string());
        }
        if opts.get("orphanDependents").and_then(Value::as_bool) == Some(true) {
            policy = Some("Orphan".into());
        }
        preconditions = opts.get("preconditions").cloned();
        if let Some(dr) = opts.get("dryRun").and_then(Value::as_array) {
            for d in dr {
                match d.as_str() {
                    Some("All") => dry_run = true,
                    other => {
                        return Err(ApiError::bad_request(format!(
                            "dryRun: Unsupported value: {other:?}: supported values: \"All\""
                        )));
                    }
                }
            }
        }
    }
    match policy.as_deref() {
        None | Some("Background" | "Foreground" | "Orphan") => {}
        Some(p) => {
            return Err(ApiError::bad_request(format!(
                "propagationPolicy: Unsupported value: {p:?}"
            )));
        }
    }
    Ok((policy.as_deref() == Some("Orphan"), preconditions, dry_run))
}

pub(super) fn delete(ctx: &Ctx, name: &str, body: &[u8]) -> ApiResult<Response<Body>> {
    let (orphan, pre, dry_run) = delete_options(ctx, body)?;
    let mut st = ctx.sh.lock();
    let key = ctx.key(name);
    let Some(obj) = st.objects.get(&key).cloned() else {
        return Err(ApiError::not_found(
            &ctx.info.group,
            &ctx.info.resource,
            name,
        ));
    };
    if let Some(pre) = pre {
        if let Some(uid) = pre.get("uid").and_then(Value::as_str)
            && meta_str(&obj, "uid") != Some(uid)
        {
            return Err(ApiError::conflict(
                &ctx.info.group,
                &ctx.info.resource,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(&obj, "uid").unwrap_or("")
                ),
            ));
        }
        if let Some(rv) = pre.get("resourceVersion").and_then(Value::as_str)
            && meta_str(&obj, "resourceVersion") != Some(rv)
        {
            return Err(ApiError::conflict(
                &ctx.info.group,
                &ctx.info.resource,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta_str(&obj, "resourceVersion").unwrap_or("")
                ),
            ));
        }
    }
    let user = ctx.user.name.clone();
    let Some((last, gone)) = delete_key(&ctx.sh, &mut st, &user, &ctx.info, key, dry_run, orphan)
    else {
        return Err(ApiError::not_found(
            &ctx.info.group,
            &ctx.info.resource,
            name,
        ));
    };
    drop(st);
    if !gone || ctx.info.crd.is_some() {
        return ok_json(200, &present(&ctx.info, &ctx.version, &last));
    }
    ok_json(
        200,
        &success_status(
            &ctx.info.group,
            &ctx.info.resource,
            name,
            meta_str(&last, "uid").unwrap_or(""),
        ),
    )
}

pub(super) fn delete_collection(ctx: &Ctx, body: &[u8]) -> ApiResult<Response<Body>> {
    let (orphan, _, dry_run) = delete_options(ctx, body)?;
    let (label, field) = selectors(ctx)?;
    let mut st = ctx.sh.lock();
    let res = convert::store_key(&ctx.info);
    let keys: Vec<Key> = st
        .range(&res, ctx.namespace.as_deref())
        .filter(|(_, o)| label.matches(o) && field.matches(o))
        .map(|(k, _)| k.clone())
        .collect();
    let user = ctx.user.name.clone();
    let mut items = Vec::new();
    for k in keys {
        if let Some((last, _)) = delete_key(&ctx.sh, &mut st, &user, &ctx.info, k, dry_run, orphan)
        {
            items.push(list_item(
                &ctx.info,
                present(&ctx.info, &ctx.version, &last),
            ));
        }
    }
    let rv = st.rv;
    drop(st);
    ok_json(
        200,
        &json!({"kind": ctx.info.list_kind, "apiVersion": ctx.api_version(), "metadata": {"resourceVersion": rv.to_string()}, "items": items}),
    )
}
