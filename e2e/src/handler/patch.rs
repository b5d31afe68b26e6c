//! PATCH: JSON merge, JSON patch, strategic merge and server-side apply.
//!
//! A patch is applied to the object as served in the request's version, then
//! goes through the common write path ([`super::commit::write`]). An apply
//! (`application/apply-patch+yaml`) merges by field ownership
//! (`managedFields`), may create the object, and answers 409 on a conflict
//! unless `force=true`. Documents of the wrong shape get the real server's 400
//! texts.

use axum::body::Body;
use hyper::Response;
use serde_json::{Value, json};

use super::auth::authorize_create_on_write;
use super::commit::write;
use super::ctx::{
    Ctx, check_resource_version, check_type_meta, decoded, media_type, meta_str, now, present,
    respond, yaml_body,
};
use crate::convert;
use crate::machinery;
use crate::status::{ApiError, ApiResult, Cause};

pub(super) fn patch(ctx: &Ctx, name: &str, body: &[u8]) -> ApiResult<Response<Body>> {
    let ct = ctx.content_type().unwrap_or("").to_string();
    let media = media_type(&ct);
    let status_only = ctx.sub.as_deref() == Some("status");
    let patch_doc: Value = match media.as_str() {
        "application/apply-patch+yaml" => yaml_body(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?,
        "application/merge-patch+json"
        | "application/strategic-merge-patch+json"
        | "application/json-patch+json" => serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?,
        _ => return Err(ApiError::unsupported_media_type(&ct)),
    };
    check_patch_shape(&media, &patch_doc)?;
    let force = ctx.q("force") == Some("true");
    let key = ctx.key(name);
    if media == "application/apply-patch+yaml" {
        authorize_create_on_write(ctx, &key, name)?;
    }
    let mut st = ctx.sh.lock();
    let old = st.objects.get(&key).cloned();
    if media == "application/apply-patch+yaml" {
        let Some(manager) = ctx.q("fieldManager").map(str::to_string) else {
            return Err(ApiError::invalid(
                "PatchOptions",
                "meta.k8s.io",
                "",
                vec![Cause::new(
                    "FieldValueRequired",
                    "fieldManager",
                    "is required for apply patch",
                )],
            ));
        };
        // Checked as sent: the namespace in the message is the document's.
        check_declared(ctx, &patch_doc)?;
        let mut applied = patch_doc;
        check_type_meta(ctx, &mut applied)?;
        let applied_name = meta_str(&applied, "name").unwrap_or("").to_string();
        if applied_name.is_empty() {
            // Like the real server: the object's name comes from the URL.
            applied["metadata"]["name"] = json!(name);
        } else if applied_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({applied_name}) does not match the name on the URL ({name})"
            )));
        }
        check_resource_version(ctx, name, &applied, old.as_deref())?;
        let av = ctx.fields_api_version();
        let schema = crd_schema(ctx);
        let mut merged = match machinery::ssa_apply(
            old.as_deref(),
            &applied,
            &manager,
            force,
            &now(),
            &av,
            schema.as_deref(),
        ) {
            Ok(v) => v,
            Err(c) => {
                return Err(ApiError::new(409, "Conflict", c.message())
                    .with_details(json!({"causes": c.causes()})));
            }
        };
        merged["apiVersion"] = json!(convert::stored_api_version(&ctx.info));
        let out = match old {
            None => {
                if let Some(m) = merged["metadata"].as_object_mut() {
                    m.remove("resourceVersion");
                }
                write(ctx, &mut st, "create", None, merged, "", status_only).map(|o| (201, o))
            }
            Some(old) => {
                write(ctx, &mut st, "patch", Some(old), merged, "", status_only).map(|o| (200, o))
            }
        }?;
        drop(st);
        return respond(ctx, out.0, &out.1);
    }
    let Some(old) = old else {
        return Err(ApiError::not_found(
            &ctx.info.group,
            &ctx.info.resource,
            name,
        ));
    };
    let mut target = present(&ctx.info, &ctx.version, &old);
    match media.as_str() {
        "application/merge-patch+json" => machinery::merge_patch(&mut target, &patch_doc),
        "application/json-patch+json" => {
            machinery::json_patch(&mut target, &patch_doc).map_err(|e| {
                ApiError::new(
                    422,
                    "Invalid",
                    format!("the server rejected our request due to an error in our request: {e}"),
                )
            })?
        }
        _ => machinery::strategic_merge_patch(&mut target, &patch_doc, &ctx.info.kind).map_err(
            |e| {
                ApiError::new(
                    422,
                    "Invalid",
                    format!("the server rejected our request due to an error in our request: {e}"),
                )
            },
        )?,
    }
    check_resource_version(ctx, name, &target, Some(&*old))?;
    if !target.is_object() {
        return Err(ApiError::new(
            422,
            "Invalid",
            "the patched object must be a JSON object",
        ));
    }
    check_type_meta(ctx, &mut target)?;
    check_strict_patch(ctx, &target)?;
    decoded(ctx, &mut target);
    if meta_str(&target, "name") != Some(name) {
        return Err(ApiError::bad_request(
            "metadata.name: the name of a patched object cannot change",
        ));
    }
    let manager = ctx.manager("");
    let out = write(
        ctx,
        &mut st,
        "patch",
        Some(old),
        target,
        &manager,
        status_only,
    )?;
    drop(st);
    respond(ctx, 200, &out)
}

/// The schema of the custom resource version of the request, if any.
fn crd_schema(ctx: &Ctx) -> Option<std::sync::Arc<machinery::CompiledSchema>> {
    ctx.info
        .crd
        .as_ref()
        .and_then(|c| c.versions.get(&ctx.version))
        .and_then(|v| v.schema.clone())
}

/// An apply configuration of a custom resource may only hold fields its
/// schema declares. The real server converts it to a typed value before it
/// merges anything, whatever `fieldValidation` says, and a field the schema
/// lacks fails that conversion: a 500 with no reason,
/// `failed to create typed patch object (<ns>/<name>; <group>/<version>,
/// Kind=<kind>): .spec.aliases: field not declared in schema` (several
/// fields: `errors:` and one indented line each). It is how an apply of a
/// newer object against an older CRD fails (kubernetes#139253); writes that
/// are not applies prune the field instead.
fn check_declared(ctx: &Ctx, applied: &Value) -> ApiResult<()> {
    let Some(schema) = crd_schema(ctx) else {
        return Ok(());
    };
    let errs: Vec<String> = schema
        .undeclared_fields(applied)
        .into_iter()
        .map(|p| format!("{p}: field not declared in schema"))
        .collect();
    let detail = match errs.as_slice() {
        [] => return Ok(()),
        [one] => one.clone(),
        many => format!("errors:\n  {}", many.join("\n  ")),
    };
    Err(ApiError::new(
        500,
        "",
        format!(
            "failed to create typed patch object ({}/{}; {}/{}, Kind={}): {detail}",
            meta_str(applied, "namespace").unwrap_or(""),
            meta_str(applied, "name").unwrap_or(""),
            ctx.info.group,
            ctx.version,
            ctx.info.kind
        ),
    ))
}

/// `fieldValidation=Strict` on a JSON or merge patch of a custom resource:
/// the real server decodes the patched object strictly and refuses unknown
/// fields with a 422 on the field `patch` whose value is the whole patched
/// object (not the 400 of a create or update).
fn check_strict_patch(ctx: &Ctx, target: &Value) -> ApiResult<()> {
    let Some(schema) = crd_schema(ctx).filter(|_| ctx.q("fieldValidation") == Some("Strict"))
    else {
        return Ok(());
    };
    let (pruned, _) = schema.admit(&mut target.clone());
    if pruned.is_empty() {
        return Ok(());
    }
    let unknown: Vec<String> = pruned
        .iter()
        .map(|p| format!("unknown field {p:?}"))
        .collect();
    let body = format!(
        "Invalid value: {:?}: strict decoding error: {}",
        target.to_string(),
        unknown.join(", ")
    );
    Err(
        ApiError::new(422, "Invalid", format!(" \"\" is invalid: patch: {body}")).with_details(
            json!({"causes": [{"reason": "FieldValueInvalid", "message": body, "field": "patch"}]}),
        ),
    )
}

/// The JSON type name Go's `encoding/json` reports for `v`.
fn go_json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The patch document has the shape its type needs, else the real server's
/// 400: merge patches, strategic merge patches and apply configurations are
/// objects, a JSON patch is a list of operation objects.
fn check_patch_shape(media: &str, doc: &Value) -> ApiResult<()> {
    const MAP: &str = "Go value of type map[string]interface {}";
    let t = go_json_type(doc);
    let msg = match (media, doc) {
        (_, Value::Object(_)) if media != "application/json-patch+json" => return Ok(()),
        ("application/merge-patch+json", Value::Null) => "Invalid JSON Patch".to_string(),
        ("application/merge-patch+json", _) => {
            format!("error decoding patch: json: cannot unmarshal {t} into {MAP}")
        }
        ("application/strategic-merge-patch+json", Value::Null) => return Ok(()),
        ("application/strategic-merge-patch+json", _) => {
            format!("json: cannot unmarshal {t} into {MAP}")
        }
        ("application/apply-patch+yaml", _) => format!(
            "error decoding YAML: error unmarshaling JSON: while decoding JSON: json: cannot unmarshal {t} into {MAP}"
        ),
        ("application/json-patch+json", Value::Array(ops)) => {
            match ops.iter().find(|op| !op.is_object()) {
                None => return Ok(()),
                Some(op) => format!(
                    "error decoding patch: json: cannot unmarshal {} into Go value of type handlers.jsonPatchOp",
                    go_json_type(op)
                ),
            }
        }
        ("application/json-patch+json", Value::Null) => return Ok(()),
        (_, _) => format!(
            "error decoding patch: json: cannot unmarshal {t} into Go value of type []handlers.jsonPatchOp"
        ),
    };
    Err(ApiError::bad_request(msg))
}
