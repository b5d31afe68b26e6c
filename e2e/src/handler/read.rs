//! GET and LIST.
//!
//! A LIST reads the revision `resourceVersion`, `resourceVersionMatch`,
//! `limit` and `continue` ask for ([`ListRead`]): the current objects, or a
//! consistent snapshot at an older revision rebuilt from the event history
//! (the objects changed since replaced by their state then). Pages carry a
//! `continue` token with the first page's revision. Lists of objects served as
//! stored are serialized straight from the store, without copies.

use std::sync::Arc;

use axum::body::Body;
use base64::Engine;
use hyper::Response;
use serde_json::{Value, json};

use super::ctx::{Ctx, ok_json, present, selectors};
use crate::convert;
use crate::registry::ResourceInfo;
use crate::status::{ApiError, ApiResult, Cause};
use crate::store::Key;
use crate::table;

pub(super) fn get(ctx: &Ctx, name: &str) -> ApiResult<Response<Body>> {
    let obj = ctx.sh.lock().objects.get(&ctx.key(name)).cloned();
    let obj = obj.ok_or_else(|| ApiError::not_found(&ctx.info.group, &ctx.info.resource, name))?;
    let obj = present(&ctx.info, &ctx.version, &obj);
    if ctx.accept.table {
        return table_answer(ctx, &[obj], None);
    }
    if ctx.accept.partial {
        return ok_json(200, &table::partial(&obj));
    }
    ok_json(200, &obj)
}

/// The `Table` answer (`Accept: ...;as=Table`) for `items`, with the list's
/// metadata for a LIST.
fn table_answer(ctx: &Ctx, items: &[Value], list_meta: Option<Value>) -> ApiResult<Response<Body>> {
    ok_json(
        200,
        &table::table(
            &ctx.info,
            &ctx.version,
            items,
            list_meta,
            ctx.q("includeObject"),
        ),
    )
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Continue {
    rv: u64,
    ns: String,
    name: String,
}

/// What revision a LIST reads, from `resourceVersion`, `resourceVersionMatch`,
/// `limit` and `continue` (the real server's `ValidateListOptions` and
/// `ListReadConsistency`).
enum ListRead {
    /// The current state (unset: "most recent"; `"0"`: "any"; `NotOlderThan` an
    /// RV at or below the current one).
    Current,
    /// The state exactly at this revision (`Exact`, legacy paged lists, and
    /// `continue` tokens), rebuilt from the event history.
    At(u64),
    /// `NotOlderThan` a revision: current state once it is not newer than that.
    NotOlderThan(u64),
}

fn list_read(ctx: &Ctx, limit: usize, cont: Option<&Continue>) -> ApiResult<ListRead> {
    let rv = ctx.q("resourceVersion").unwrap_or("");
    let matching = ctx.q("resourceVersionMatch").unwrap_or("");
    let has_continue = ctx.q("continue").is_some_and(|c| !c.is_empty());
    let mut causes = Vec::new();
    if !matching.is_empty() {
        if rv.is_empty() {
            causes.push(Cause::new(
                "FieldValueForbidden",
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden unless resourceVersion is provided",
            ));
        }
        if has_continue {
            causes.push(Cause::new(
                "FieldValueForbidden",
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden when continue is provided",
            ));
        }
        if matching != "Exact" && matching != "NotOlderThan" {
            causes.push(Cause::new(
                "FieldValueNotSupported",
                "resourceVersionMatch",
                format!(
                    "Unsupported value: {matching:?}: supported values: \"Exact\", \"NotOlderThan\", \"\""
                ),
            ));
        }
        if matching == "Exact" && rv == "0" {
            causes.push(Cause::new(
                "FieldValueForbidden",
                "resourceVersionMatch",
                "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
            ));
        }
    }
    if ctx.q("sendInitialEvents").is_some() {
        causes.push(Cause::new(
            "FieldValueForbidden",
            "sendInitialEvents",
            "sendInitialEvents is forbidden for list",
        ));
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid("ListOptions", "meta.k8s.io", "", causes));
    }
    if let Some(c) = cont {
        if !rv.is_empty() && rv != "0" {
            return Err(ApiError::bad_request(
                "specifying resource version is not allowed when using continue",
            ));
        }
        return Ok(ListRead::At(c.rv));
    }
    if rv.is_empty() || rv == "0" {
        return Ok(ListRead::Current);
    }
    let n: u64 = rv.parse().map_err(|_| {
        ApiError::bad_request(format!(
            "invalid resource version: resourceVersion: Invalid value: {rv:?}: strconv.ParseUint: parsing {rv:?}: invalid syntax"
        ))
    })?;
    // Without a match, a paged list (limit) reads exactly at the revision and an
    // unpaged one "not older than" it (the documented legacy semantics).
    match matching {
        "Exact" => Ok(ListRead::At(n)),
        "" if limit > 0 => Ok(ListRead::At(n)),
        _ => Ok(ListRead::NotOlderThan(n)),
    }
}

/// Interleave two key-ordered iterators with disjoint keys.
fn merge_by_key<'a>(
    a: impl Iterator<Item = (&'a Key, &'a Arc<Value>)>,
    b: impl Iterator<Item = (&'a Key, &'a Arc<Value>)>,
) -> impl Iterator<Item = (&'a Key, &'a Arc<Value>)> {
    let mut a = a.peekable();
    let mut b = b.peekable();
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (Some(x), Some(y)) => {
            if x.0 <= y.0 {
                a.next()
            } else {
                b.next()
            }
        }
        (Some(_), None) => a.next(),
        (None, _) => b.next(),
    })
}

pub(super) fn list(ctx: &Ctx) -> ApiResult<Response<Body>> {
    let (label, field) = selectors(ctx)?;
    let limit: usize = match ctx.q("limit") {
        Some(l) if !l.is_empty() => l
            .parse::<usize>()
            .map_err(|_| ApiError::bad_request(format!("limit: invalid value {l:?}")))?,
        _ => 0,
    };
    let cont: Option<Continue> = match ctx.q("continue") {
        Some(c) if !c.is_empty() => {
            let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(c)
                .map_err(|_| ApiError::bad_request("continue key is not valid"))?;
            Some(
                serde_json::from_slice(&raw)
                    .map_err(|_| ApiError::bad_request("continue key is not valid"))?,
            )
        }
        _ => None,
    };
    let read = list_read(ctx, limit, cont.as_ref())?;
    if cont.is_some() && ctx.sh.faults().take_expired_continue() {
        return Err(crate::faults::expired_continue());
    }
    let res = convert::store_key(&ctx.info);
    let st = ctx.sh.lock();
    // The revision this list is a consistent snapshot at. A continued list
    // (and an `Exact` one) is served as of its revision: the current objects,
    // with those changed since replaced by their state then (from the history).
    let at = match read {
        ListRead::NotOlderThan(n) | ListRead::At(n) if n > st.rv => {
            return Err(ApiError::too_large_rv(n, st.rv));
        }
        ListRead::Current | ListRead::NotOlderThan(_) => None,
        ListRead::At(n) if !st.can_watch_from(n) => {
            return Err(ApiError::new(
                410,
                "Expired",
                if cont.is_some() {
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter."
                } else {
                    "The resourceVersion for the provided list is too old."
                },
            ));
        }
        ListRead::At(n) => Some(n),
    };
    let changed = match at {
        Some(n) if n < st.rv => st.changed_since(&res, ctx.namespace.as_deref(), n),
        _ => Default::default(),
    };
    let mut items = Vec::new();
    let mut next: Option<Continue> = None;
    // Like the real API server, `remainingItemCount` is sent only without
    // selectors (with one, it would need a scan of the rest).
    let after = cont.as_ref().map(|c| (c.ns.as_str(), c.name.as_str()));
    let then = {
        use std::ops::Bound;
        let from = match after {
            Some((ns, name)) => Bound::Excluded((res.clone(), ns.to_string(), name.to_string())),
            None => Bound::Unbounded,
        };
        changed
            .range((from, Bound::Unbounded))
            .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
    };
    let now = st
        .range_after(&res, ctx.namespace.as_deref(), after)
        .filter(|(k, _)| !changed.contains_key(*k));
    let mut rest = merge_by_key(now, then);
    for (_, obj) in rest.by_ref() {
        if !label.matches(obj) || !field.matches(obj) {
            continue;
        }
        if limit > 0 && items.len() >= limit {
            if let Some(last) = items.last() {
                let last: &Arc<Value> = last;
                next = Some(Continue {
                    rv: at.unwrap_or(st.rv),
                    ns: last
                        .pointer("/metadata/namespace")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    name: last
                        .pointer("/metadata/name")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                });
            }
            break;
        }
        items.push(obj.clone());
    }
    let remaining = if next.is_some() && label.is_empty() && field.is_empty() {
        // This object plus everything after it.
        Some(1 + rest.count() as u64)
    } else {
        drop(rest);
        None
    };
    let rv = at.unwrap_or(st.rv);
    drop(st);
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if let Some(n) = next {
        let token = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(serde_json::to_vec(&n).unwrap_or_default());
        metadata["continue"] = json!(token);
        if let Some(remaining) = remaining {
            metadata["remainingItemCount"] = json!(remaining);
        }
    }
    if !ctx.accept.table && !ctx.accept.partial && ctx.served_as_stored() {
        // Large lists: serialize the stored objects directly, without copies.
        let head = json!({"kind": ctx.info.list_kind, "apiVersion": ctx.api_version(), "metadata": metadata});
        let mut out = serde_json::to_vec(&head).map_err(|e| ApiError::internal(e.to_string()))?;
        out.pop();
        out.extend_from_slice(b",\"items\":[");
        let typed = ctx.info.crd.is_none();
        for (i, o) in items.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            let written = if typed {
                serde_json::to_writer(&mut out, &WithoutTypeMeta(o))
            } else {
                serde_json::to_writer(&mut out, &**o)
            };
            written.map_err(|e| ApiError::internal(e.to_string()))?;
        }
        out.extend_from_slice(b"]}");
        return Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(Body::from(out))
            .map_err(|e| ApiError::internal(e.to_string()));
    }
    let items: Vec<Value> = items
        .iter()
        .map(|o| present(&ctx.info, &ctx.version, o))
        .collect();
    if ctx.accept.table {
        return table_answer(ctx, &items, Some(metadata));
    }
    if ctx.accept.partial {
        let items: Vec<Value> = items.iter().map(table::partial).collect();
        return ok_json(
            200,
            &json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": metadata, "items": items}),
        );
    }
    let items: Vec<Value> = items.into_iter().map(|o| list_item(&ctx.info, o)).collect();
    ok_json(
        200,
        &json!({"kind": ctx.info.list_kind, "apiVersion": ctx.api_version(), "metadata": metadata, "items": items}),
    )
}

/// An object as an item of a list: built-in types carry no `apiVersion` and
/// `kind` there (the real server encodes list items of its Go types with an
/// empty TypeMeta); custom resources keep theirs.
pub(super) fn list_item(info: &ResourceInfo, mut obj: Value) -> Value {
    if info.crd.is_none()
        && let Some(m) = obj.as_object_mut()
    {
        m.remove("apiVersion");
        m.remove("kind");
    }
    obj
}

/// Serializes an object without its `apiVersion` and `kind` ([`list_item`]
/// without a copy).
struct WithoutTypeMeta<'a>(&'a Value);

impl serde::Serialize for WithoutTypeMeta<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let Some(m) = self.0.as_object() else {
            return self.0.serialize(s);
        };
        let fields = m.iter().filter(|(k, _)| *k != "apiVersion" && *k != "kind");
        let mut map = s.serialize_map(None)?;
        for (k, v) in fields {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}
