//! The context of one resource request ([`Ctx`]: user, resource, version,
//! namespace, name, query, headers, `Accept`) and what every verb does with
//! it: decode the body (JSON, YAML, protobuf), check and fill in `apiVersion`,
//! `kind` and the namespace, read the selectors, and answer with an object in
//! the requested version.

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use hyper::{HeaderMap, Response};
use serde_json::{Value, json};

use crate::convert;
use crate::machinery::{self, FieldSel, LabelSel, User};
use crate::registry::ResourceInfo;
use crate::response::json_response;
use crate::state::SimState;
use crate::status::{ApiError, ApiResult};
use crate::store::Key;

/// Parsed `Accept` header.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Accept {
    pub table: bool,
    pub partial: bool,
}

pub(super) fn parse_accept(headers: &HeaderMap) -> ApiResult<Accept> {
    let Some(raw) = headers.get("accept").and_then(|v| v.to_str().ok()) else {
        return Ok(Accept::default());
    };
    let mut json_ok = false;
    for part in raw.split(',') {
        let p = part.trim().to_ascii_lowercase();
        let media = p.split(';').next().unwrap_or("").trim();
        if media == "application/json"
            || media == "*/*"
            || media == "application/*"
            || media.is_empty()
        {
            if p.contains("as=table") {
                return Ok(Accept {
                    table: true,
                    partial: false,
                });
            }
            if p.contains("as=partialobjectmetadata") {
                return Ok(Accept {
                    table: false,
                    partial: true,
                });
            }
            if !p.contains("as=") {
                json_ok = true;
            }
        }
        if media == "application/yaml" {
            json_ok = true;
        }
    }
    if json_ok {
        Ok(Accept::default())
    } else {
        Err(ApiError::not_acceptable())
    }
}

/// Everything a resource verb handler needs.
pub(super) struct Ctx {
    pub sh: Arc<SimState>,
    pub user: User,
    pub info: Arc<ResourceInfo>,
    pub version: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub sub: Option<String>,
    pub query: HashMap<String, String>,
    pub headers: HeaderMap,
    pub accept: Accept,
    /// `Warning` header values for the answer (errors included, as the real
    /// server sends what it warned about before failing).
    pub warnings: std::sync::Mutex<Vec<String>>,
}

impl Ctx {
    /// The `Content-Type` header, if any.
    pub(super) fn content_type(&self) -> Option<&str> {
        self.headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
    }

    /// A query parameter.
    pub(super) fn q(&self, k: &str) -> Option<&str> {
        self.query.get(k).map(String::as_str)
    }

    /// Adds a `Warning: 299 - "<text>"` to the answer.
    pub(super) fn warn(&self, text: &str) {
        let quoted = text.replace('\\', "\\\\").replace('"', "\\\"");
        self.warnings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(format!("299 - \"{quoted}\""));
    }

    /// `dryRun=All`.
    pub(super) fn dry_run(&self) -> bool {
        self.q("dryRun") == Some("All")
    }

    /// The field manager of a write: `fieldManager`, else the user agent's
    /// program name (plus `default_suffix`).
    pub(super) fn manager(&self, default_suffix: &str) -> String {
        if let Some(m) = self.q("fieldManager") {
            return m.to_string();
        }
        let ua = self
            .headers
            .get("user-agent")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("unknown");
        let base = ua.split('/').next().unwrap_or("unknown").to_string();
        if default_suffix.is_empty() {
            base
        } else {
            format!("{base}{default_suffix}")
        }
    }

    /// The store key of `name` in this request's resource and namespace.
    pub(super) fn key(&self, name: &str) -> Key {
        (
            convert::store_key(&self.info),
            self.namespace.clone().unwrap_or_default(),
            name.to_string(),
        )
    }

    /// The `apiVersion` of the request's resource version.
    pub(super) fn api_version(&self) -> String {
        self.info.api_version(&self.version)
    }

    /// The `apiVersion` recorded in `managedFields`: field sets are computed on the
    /// stored object, so for a converted resource (events.k8s.io/v1 Events) they are
    /// stored-version (core/v1) field paths and say so.
    pub(super) fn fields_api_version(&self) -> String {
        if convert::is_converted(&self.info) {
            convert::stored_api_version(&self.info)
        } else {
            self.api_version()
        }
    }

    /// Whether objects are served exactly as stored (no conversion, no apiVersion change).
    pub(super) fn served_as_stored(&self) -> bool {
        convert::served_as_stored(&self.info, &self.version)
    }
}

/// The object as served in `version` (objects are stored in the storage version;
/// events.k8s.io/v1 Events are stored as core/v1 Events, see [`crate::convert`]).
pub(super) fn present(info: &ResourceInfo, version: &str, obj: &Value) -> Value {
    convert::from_storage(info, version, obj)
}

/// Answer with an object in the requested version (no copy when it is served
/// as stored).
pub(super) fn respond(ctx: &Ctx, code: u16, obj: &Value) -> ApiResult<Response<Body>> {
    if ctx.served_as_stored() {
        ok_json(code, obj)
    } else {
        ok_json(code, &present(&ctx.info, &ctx.version, obj))
    }
}

pub(super) fn ok_json(code: u16, v: &Value) -> ApiResult<Response<Body>> {
    Ok(json_response(code, v))
}

pub(super) fn selectors(ctx: &Ctx) -> ApiResult<(LabelSel, FieldSel)> {
    let label = LabelSel::parse(ctx.q("labelSelector").unwrap_or(""))?;
    let crd_fields = ctx.info.crd.as_ref().map(|c| {
        c.versions
            .get(&ctx.version)
            .map(|v| v.selectable_fields.clone())
            .unwrap_or_default()
    });
    let selectable =
        machinery::selectable_fields(&ctx.info.group, &ctx.info.resource, crd_fields.as_deref());
    let field = FieldSel::parse(
        ctx.q("fieldSelector").unwrap_or(""),
        &ctx.info.group,
        &selectable,
    )?;
    Ok((label, field))
}

/// The media type of a `Content-Type` value: lowercase, without parameters.
pub(super) fn media_type(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

pub(super) fn parse_body(ctx: &Ctx, body: &[u8]) -> ApiResult<Value> {
    let media = media_type(ctx.content_type().unwrap_or("application/json"));
    let v: Value = match media.as_str() {
        "application/json" | "" => serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!(
                "the body of the request could not be decoded as JSON: {e}"
            ))
        })?,
        "application/yaml" | "application/apply-patch+yaml" => yaml_body(body).map_err(|e| {
            ApiError::bad_request(format!(
                "the body of the request could not be decoded as YAML: {e}"
            ))
        })?,
        "application/vnd.kubernetes.protobuf" => {
            crate::protobuf::decode(body).map_err(|(code, msg)| {
                if code == 415 {
                    ApiError::new(415, "UnsupportedMediaType", msg)
                } else {
                    ApiError::bad_request(msg)
                }
            })?
        }
        _ => serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!("the body of the request could not be decoded: {e}"))
        })?,
    };
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON object",
        ));
    }
    Ok(v)
}

pub(super) fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

pub(super) fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
}

pub(super) fn check_type_meta(ctx: &Ctx, obj: &mut Value) -> ApiResult<()> {
    let expected_av = ctx.api_version();
    let av = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
    if !av.is_empty() && av != expected_av {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({av}) does not match the expected API version ({expected_av})"
        )));
    }
    if !kind.is_empty() && kind != ctx.info.kind {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({kind}) does not match the expected kind ({})",
            ctx.info.kind
        )));
    }
    obj["apiVersion"] = json!(ctx.info.api_version(ctx.info.storage_version()));
    obj["kind"] = json!(ctx.info.kind);
    // The request's shape -> the stored shape (events.k8s.io/v1 -> core/v1 Events).
    convert::to_storage(&ctx.info, obj);
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    if let Some(ns) = meta_str(obj, "namespace") {
        match &ctx.namespace {
            Some(path_ns) if ns != path_ns => {
                return Err(ApiError::bad_request("the namespace of the provided object does not match the namespace sent on the request".to_string()));
            }
            None if !ns.is_empty() && !ctx.info.namespaced => {
                if let Some(m) = obj["metadata"].as_object_mut() {
                    m.remove("namespace");
                }
            }
            _ => {}
        }
    }
    if let Some(ns) = &ctx.namespace {
        obj["metadata"]["namespace"] = json!(ns);
    }
    Ok(())
}

/// The optimistic-concurrency check of an update, patch or apply: a
/// `resourceVersion` in the new object must be the stored object's (a 409
/// `Conflict` otherwise; none stored counts as different).
pub(super) fn check_resource_version(
    ctx: &Ctx,
    name: &str,
    new: &Value,
    old: Option<&Value>,
) -> ApiResult<()> {
    if let Some(rv) = meta_str(new, "resourceVersion").filter(|s| !s.is_empty())
        && old.and_then(|o| meta_str(o, "resourceVersion")) != Some(rv)
    {
        return Err(ApiError::conflict(
            &ctx.info.group,
            &ctx.info.resource,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        ));
    }
    Ok(())
}

/// A custom resource as the real server decodes a request body (and a
/// patched object): `null`s of fields that are not nullable and have no
/// default are dropped. (The result of a server-side apply is not decoded
/// again: it keeps them, and its schema may refuse them.)
pub(super) fn decoded(ctx: &Ctx, obj: &mut Value) {
    if let Some(schema) = ctx
        .info
        .crd
        .as_ref()
        .and_then(|c| c.versions.get(&ctx.version))
        .and_then(|v| v.schema.as_ref())
    {
        schema.prune_non_nullable_nulls(obj);
    }
}

/// A YAML request body as JSON, read as YAML 1.2 (`yes` stays a string; a
/// repeated key keeps its last value).
pub(crate) fn yaml_body(body: &[u8]) -> Result<Value, serde_saphyr::Error> {
    // `Options` is non-exhaustive: start from the defaults.
    let mut o = serde_saphyr::Options::default();
    o.strict_booleans = true;
    o.leading_zero_numbers_as_strings = true;
    o.underscored_numbers_as_strings = true;
    o.merge_keys = serde_saphyr::MergeKeyPolicy::AsOrdinary;
    o.duplicate_keys = serde_saphyr::DuplicateKeyPolicy::LastWins;
    o.with_snippet = false;
    serde_saphyr::from_slice_with_options(body, o)
}
