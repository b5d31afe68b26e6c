//! The common write path every create, update, patch and apply ends in.
//!
//! ```text
//!  new object ─► subresource rules (status vs. spec) ─► system metadata (uid, timestamps)
//!   ─► name / namespace checks ─► labels, type defaults and validation (types.rs)
//!   ─► generation ─► managedFields ─► no-op? return the old object
//!   ─► dry run? return without committing ─► size limit ─► commit at the next revision
//!   ─► record (write log, stats, wake watches) ─► CRD registration ─► finalizers done? delete
//! ```
//!
//! It runs entirely under the store lock the caller holds, so a
//! `resourceVersion` precondition checked before it stays exact.

use std::sync::Arc;

use serde_json::{Value, json};

use super::ctx::{Ctx, meta_str, now};
use super::gc::finish_delete;
use super::record::{after_write, record};
use crate::machinery;
use crate::status::{ApiError, ApiResult, Cause};
use crate::store::{EventType, Store};

/// Largest object stored (etcd's default `--max-request-bytes`, 1.5 MiB): a
/// bigger one is refused with etcd's error, as the real server passes it on.
const MAX_OBJECT: usize = 3 * 1024 * 1024 / 2;

/// Compare two objects ignoring `metadata` (and `status` when `ignore_status`).
fn content_equal(a: &Value, b: &Value, ignore_status: bool) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a == b;
    };
    let skip = |k: &String| k == "metadata" || (ignore_status && k == "status");
    let ak: Vec<_> = a.iter().filter(|(k, _)| !skip(k)).collect();
    let bk: Vec<_> = b.iter().filter(|(k, _)| !skip(k)).collect();
    ak == bk
}

/// The common write path: system metadata, subresource rules, type defaults,
/// validation, generation, managedFields, commit (unless dry-run), and post-commit
/// effects (CRD registration, namespace cascade, garbage collection).
pub(super) fn write(
    ctx: &Ctx,
    st: &mut Store,
    verb: &str,
    old: Option<Arc<Value>>,
    mut obj: Value,
    manager: &str,
    status_only: bool,
) -> ApiResult<Arc<Value>> {
    let info = &ctx.info;
    if info.crd.is_none() {
        // The real server decodes built-in types into Go structs, where a
        // `null` field is simply unset.
        drop_nulls(&mut obj);
    }
    let name = meta_str(&obj, "name").unwrap_or("").to_string();
    let ts = now();
    let status_sub = info.status_subresource(&ctx.version);
    // --- subresource semantics
    if let Some(old) = &old {
        if status_only {
            let mut merged = (**old).clone();
            match obj.get("status") {
                Some(s) => merged["status"] = s.clone(),
                None => {
                    if let Some(m) = merged.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
            // Status writes may not change metadata other than managedFields.
            if let Some(mf) = obj.pointer("/metadata/managedFields") {
                merged["metadata"]["managedFields"] = mf.clone();
            }
            obj = merged;
        } else if status_sub {
            match old.get("status") {
                Some(s) => obj["status"] = s.clone(),
                None => {
                    if let Some(m) = obj.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
        }
    } else if status_sub
        && info.crd.is_some()
        && let Some(m) = obj.as_object_mut()
    {
        m.remove("status");
    }
    // --- system metadata
    {
        let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
            return Err(ApiError::bad_request("metadata must be an object"));
        };
        meta.remove("resourceVersion");
        match &old {
            Some(old) => {
                for f in [
                    "uid",
                    "creationTimestamp",
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                    "generation",
                ] {
                    match old.pointer(&format!("/metadata/{f}")) {
                        Some(v) => {
                            meta.insert(f.to_string(), v.clone());
                        }
                        None => {
                            meta.remove(f);
                        }
                    }
                }
                if !meta.contains_key("managedFields")
                    && let Some(mf) = old.pointer("/metadata/managedFields")
                {
                    meta.insert("managedFields".into(), mf.clone());
                }
            }
            None => {
                meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
                meta.insert("creationTimestamp".into(), json!(ts));
                meta.remove("deletionTimestamp");
                meta.remove("generation");
            }
        }
    }
    // --- names and namespace
    if old.is_none() {
        if let Err(msg) = machinery::validate_name(&info.kind, &name) {
            return Err(ApiError::invalid(
                &info.kind,
                &info.group,
                &name,
                vec![Cause::new(
                    "FieldValueInvalid",
                    "metadata.name",
                    format!("Invalid value: {name:?}: {msg}"),
                )],
            ));
        }
        if let Some(ns) = &ctx.namespace {
            if !st
                .objects
                .contains_key(&("/namespaces".to_string(), String::new(), ns.clone()))
            {
                return Err(ApiError::not_found("", "namespaces", ns));
            }
            if let Some(nsobj) =
                st.objects
                    .get(&("/namespaces".to_string(), String::new(), ns.clone()))
                && nsobj.pointer("/metadata/deletionTimestamp").is_some()
            {
                return Err(ApiError::new(
                    403,
                    "Forbidden",
                    format!(
                        "{} {name:?} is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                        info.resource
                    ),
                ));
            }
        }
    }
    // --- labels, type-specific defaults and validation
    let causes = machinery::validate_labels(&obj);
    if !causes.is_empty() {
        return Err(ApiError::invalid(&info.kind, &info.group, &name, causes));
    }
    let mut warnings = Vec::new();
    let admitted = crate::types::admit(
        info,
        &ctx.version,
        old.as_deref(),
        &mut obj,
        st,
        ctx.q("fieldValidation"),
        &mut warnings,
    );
    for w in &warnings {
        ctx.warn(w);
    }
    admitted?;
    // --- generation
    if info.has_generation {
        let generation = match &old {
            None => 1,
            Some(old) => {
                let g = old
                    .pointer("/metadata/generation")
                    .and_then(Value::as_i64)
                    .unwrap_or(1);
                if content_equal(old, &obj, status_sub) {
                    g
                } else {
                    g + 1
                }
            }
        };
        obj["metadata"]["generation"] = json!(generation);
    }
    // --- managed fields
    if !manager.is_empty() {
        machinery::record_update(
            old.as_deref(),
            &mut obj,
            manager,
            &ts,
            &ctx.fields_api_version(),
        );
    }
    // A no-op update does not bump the revision (like the real server).
    if let Some(old) = &old
        && same_content(&obj, old)
    {
        return Ok(old.clone());
    }
    if ctx.dry_run() {
        return Ok(Arc::new(obj));
    }
    if encoded_len(&obj) > MAX_OBJECT {
        return Err(ApiError::new(500, "", "etcdserver: request is too large"));
    }
    // --- finalizers: an object being deleted goes once its finalizers are gone
    let finalize = old.is_some()
        && obj.pointer("/metadata/deletionTimestamp").is_some()
        && obj
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_none_or(|a| a.is_empty());
    let rv = st.next_rv();
    obj["metadata"]["resourceVersion"] = json!(rv.to_string());
    let key = ctx.key(&name);
    let etype = if old.is_some() {
        EventType::Modified
    } else {
        EventType::Added
    };
    let obj = Arc::new(obj);
    st.commit(rv, etype, key.clone(), old.clone(), obj.clone());
    record(ctx, st, verb, &name, rv);
    after_write(st, info, &obj, false)?;
    if finalize {
        // The last finalizer is gone: the object goes now (the write above is the
        // final state watchers see before DELETED).
        let last = finish_delete(&ctx.sh, st, &ctx.user.name, info, key, obj, false);
        return Ok(Arc::new(last));
    }
    Ok(obj)
}

/// Removes the `null` members of every object in `v` (not list items).
fn drop_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, c| !c.is_null());
            m.values_mut().for_each(drop_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

/// The length of `v` as JSON, without building the text.
fn encoded_len(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// Whether a write changes nothing: equal except `metadata.resourceVersion` and
/// the `time` of managedFields entries (compared without cloning).
fn same_content(new: &Value, old: &Value) -> bool {
    let (Some(n), Some(o)) = (new.as_object(), old.as_object()) else {
        return new == old;
    };
    if n.len() != o.len() {
        return false;
    }
    for (k, nv) in n {
        let Some(ov) = o.get(k) else { return false };
        if k != "metadata" {
            if nv != ov {
                return false;
            }
            continue;
        }
        let (Some(nm), Some(om)) = (nv.as_object(), ov.as_object()) else {
            return nv == ov;
        };
        let skip = |k: &String| k == "resourceVersion";
        if nm.keys().filter(|k| !skip(k)).count() != om.keys().filter(|k| !skip(k)).count() {
            return false;
        }
        for (mk, mv) in nm.iter().filter(|(k, _)| !skip(k)) {
            let Some(omv) = om.get(mk) else { return false };
            let equal = if mk == "managedFields" {
                managed_fields_equal(mv, omv)
            } else {
                mv == omv
            };
            if !equal {
                return false;
            }
        }
    }
    true
}

fn managed_fields_equal(a: &Value, b: &Value) -> bool {
    match (a.as_array(), b.as_array()) {
        (Some(a), Some(b)) => {
            a.len() == b.len()
                && a.iter()
                    .zip(b)
                    .all(|(x, y)| match (x.as_object(), y.as_object()) {
                        (Some(x), Some(y)) => {
                            x.iter().filter(|(k, _)| *k != "time").count()
                                == y.iter().filter(|(k, _)| *k != "time").count()
                                && x.iter()
                                    .filter(|(k, _)| *k != "time")
                                    .all(|(k, v)| y.get(k) == Some(v))
                        }
                        _ => x == y,
                    })
        }
        _ => a == b,
    }
}
