//! POST (create, with `generateName`) and PUT (update, with the
//! `resourceVersion` precondition and create-on-update for the kinds that
//! allow it). Both decode the body and hand the object to the common write
//! path ([`super::commit::write`]).

use axum::body::Body;
use hyper::Response;
use serde_json::{Value, json};

use super::auth::authorize_create_on_write;
use super::commit::write;
use super::ctx::{
    Ctx, check_resource_version, check_type_meta, decoded, meta_str, parse_body, respond,
};
use crate::status::{ApiError, ApiResult, Cause};

fn random_suffix(n: usize) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let bytes = uuid::Uuid::new_v4();
    bytes
        .as_bytes()
        .iter()
        .take(n)
        .map(|b| ALPHABET[(*b as usize) % ALPHABET.len()] as char)
        .collect()
}

pub(super) fn create(ctx: &Ctx, body: &[u8]) -> ApiResult<Response<Body>> {
    let mut obj = parse_body(ctx, body)?;
    check_type_meta(ctx, &mut obj)?;
    decoded(ctx, &mut obj);
    if meta_str(&obj, "resourceVersion").is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::internal(
            "resourceVersion should not be set on objects to be created",
        ));
    }
    if meta_str(&obj, "name").unwrap_or("").is_empty() {
        match meta_str(&obj, "generateName") {
            Some(g) if !g.is_empty() => {
                let name = format!("{g}{}", random_suffix(5));
                obj["metadata"]["name"] = json!(name);
            }
            _ => {
                return Err(ApiError::invalid(
                    &ctx.info.kind,
                    &ctx.info.group,
                    "",
                    vec![Cause::new(
                        "FieldValueRequired",
                        "metadata.name",
                        "name or generateName is required",
                    )],
                ));
            }
        }
    }
    let name = meta_str(&obj, "name").unwrap_or("").to_string();
    let manager = ctx.manager("");
    let mut st = ctx.sh.lock();
    let key = ctx.key(&name);
    if st.objects.contains_key(&key) {
        return Err(ApiError::already_exists(
            &ctx.info.group,
            &ctx.info.resource,
            &name,
        ));
    }
    let out = write(ctx, &mut st, "create", None, obj, &manager, false)?;
    drop(st);
    respond(ctx, 201, &out)
}

pub(super) fn update(ctx: &Ctx, name: &str, body: &[u8]) -> ApiResult<Response<Body>> {
    let mut obj = parse_body(ctx, body)?;
    check_type_meta(ctx, &mut obj)?;
    decoded(ctx, &mut obj);
    let body_name = meta_str(&obj, "name").unwrap_or("");
    if body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    let manager = ctx.manager("");
    let status_only = ctx.sub.as_deref() == Some("status");
    let key = ctx.key(name);
    if ctx.info.create_on_update && !status_only {
        authorize_create_on_write(ctx, &key, name)?;
    }
    let mut st = ctx.sh.lock();
    let old = st.objects.get(&key).cloned();
    let Some(old) = old else {
        if ctx.info.create_on_update && !status_only {
            if let Some(m) = obj["metadata"].as_object_mut() {
                m.remove("resourceVersion");
            }
            let out = write(ctx, &mut st, "create", None, obj, &manager, false)?;
            return respond(ctx, 201, &out);
        }
        return Err(ApiError::not_found(
            &ctx.info.group,
            &ctx.info.resource,
            name,
        ));
    };
    check_unconditional_update(ctx, name, &obj)?;
    check_resource_version(ctx, name, &obj, Some(&*old))?;
    let out = write(
        ctx,
        &mut st,
        "update",
        Some(old),
        obj,
        &manager,
        status_only,
    )?;
    drop(st);
    respond(ctx, 200, &out)
}

/// A PUT of a stored object without `metadata.resourceVersion` where the
/// resource's strategy does not allow unconditional updates (custom
/// resources, Leases, ...): the real generic store's 422, whose `Invalid`
/// names the *resource* as its kind (store.go: "The Invalid error should
/// have a field for Resource"), e.g. `discoveredservices.kubediscovery.io
/// "x" is invalid: metadata.resourceVersion: Invalid value: 0: must be
/// specified for an update`. (Checked before the object's own validation,
/// as there.)
fn check_unconditional_update(ctx: &Ctx, name: &str, new: &Value) -> ApiResult<()> {
    if ctx.info.unconditional_update
        || meta_str(new, "resourceVersion").is_some_and(|rv| !rv.is_empty())
    {
        return Ok(());
    }
    Err(ApiError::invalid(
        &ctx.info.resource,
        &ctx.info.group,
        name,
        vec![Cause::new(
            "FieldValueInvalid",
            "metadata.resourceVersion",
            "Invalid value: 0: must be specified for an update",
        )],
    ))
}
