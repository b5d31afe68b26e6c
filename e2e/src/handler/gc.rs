//! Deletion and what follows it, as the real server and its garbage
//! collector do it.
//!
//! An object with finalizers only gets a `deletionTimestamp`; it goes once the
//! last finalizer is removed. A removed object's dependents are then orphaned
//! (`propagationPolicy=Orphan`: the owner reference is dropped) or deleted when
//! all their owners are gone (transitively), a namespace's contents and a
//! CRD's objects go with it, and a Service takes its Endpoints along.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Value, json};

use super::ctx::{meta_str, now};
use super::record::{after_write, record_raw};
use crate::registry::{self, ResourceInfo};
use crate::state::SimState;
use crate::store::{EventType, Key, Store};

/// Remove an object now (no finalizers left): DELETED event, then cascade to
/// namespace contents and garbage-collect dependents.
fn remove_now(st: &mut Store, info: &ResourceInfo, key: Key, obj: Arc<Value>) -> Value {
    let rv = st.next_rv();
    let mut last = (*obj).clone();
    last["metadata"]["resourceVersion"] = json!(rv.to_string());
    let last = Arc::new(last);
    st.commit(rv, EventType::Deleted, key, Some(obj), last.clone());
    let _ = after_write(st, info, &last, true);
    (*last).clone()
}

/// Remove an object, record the delete, then orphan or collect its dependents
/// (and a namespace's contents, a CRD's objects).
pub(super) fn finish_delete(
    sh: &SimState,
    st: &mut Store,
    user: &str,
    info: &ResourceInfo,
    key: Key,
    obj: Arc<Value>,
    orphan: bool,
) -> Value {
    let last = remove_now(st, info, key.clone(), obj);
    let rv = st.rv;
    record_raw(st, sh, user, "delete", info, &key.1, &key.2, rv);
    // As the real Service storage's afterDelete hook: deleting a Service
    // deletes the Endpoints of the same name (an internal write, no request).
    if info.group.is_empty() && info.resource == "services" {
        let ep_key: Key = ("/endpoints".to_string(), key.1.clone(), key.2.clone());
        if st.objects.contains_key(&ep_key)
            && let Some(ri) = st.registry.get("", "endpoints")
        {
            delete_key(sh, st, "system:apiserver", &ri, ep_key, false, false);
        }
    }
    if orphan {
        orphan_dependents(sh, st, &last);
    } else {
        for (ri, k) in collect_cascade(st, &last, info) {
            delete_key(
                sh,
                st,
                "system:serviceaccount:kube-system:generic-garbage-collector",
                &ri,
                k,
                false,
                false,
            );
        }
    }
    last
}

/// Objects to delete after `deleted` is gone: namespace contents and
/// dependents whose owners are all gone. Returns keys with their resource info.
fn collect_cascade(
    st: &Store,
    deleted: &Value,
    info: &ResourceInfo,
) -> Vec<(Arc<ResourceInfo>, Key)> {
    let mut out = Vec::new();
    if info.resource == "namespaces" && info.group.is_empty() {
        let ns = meta_str(deleted, "name").unwrap_or("");
        for (k, _) in st
            .objects
            .iter()
            .filter(|(k, _)| k.1 == ns && !ns.is_empty())
        {
            if let Some((g, r)) = k.0.split_once('/')
                && let Some(ri) = st.registry.get(g, r)
            {
                out.push((ri, k.clone()));
            }
        }
        return out;
    }
    if info.resource == "customresourcedefinitions" && info.group == "apiextensions.k8s.io" {
        // The registry entry is already gone; rebuild it from the deleted CRD.
        if let Ok(ri) = registry::from_crd(deleted) {
            let ri = Arc::new(ri);
            for (k, _) in st.range(&ri.key(), None) {
                out.push((ri.clone(), k.clone()));
            }
        }
    }
    let Some(uid) = meta_str(deleted, "uid") else {
        return out;
    };
    // As the real garbage collector, an owner reference is live only when
    // an object of its kind and name has its uid (a reference naming
    // another object is dangling).
    let live: HashMap<&str, (&str, &str)> = st
        .objects
        .values()
        .filter_map(|o| {
            Some((
                meta_str(o, "uid")?,
                (
                    meta_str(o, "name").unwrap_or(""),
                    o.get("kind").and_then(Value::as_str).unwrap_or(""),
                ),
            ))
        })
        .collect();
    let is_live = |r: &Value| {
        let s = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("");
        live.get(s("uid"))
            .is_some_and(|(name, kind)| *name == s("name") && *kind == s("kind"))
    };
    for (k, o) in &st.objects {
        let Some(refs) = o
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
        else {
            continue;
        };
        if !refs
            .iter()
            .any(|r| r.get("uid").and_then(Value::as_str) == Some(uid))
        {
            continue;
        }
        let all_gone = refs.iter().all(|r| !is_live(r));
        if all_gone
            && let Some((g, r)) = k.0.split_once('/')
            && let Some(ri) = st.registry.get(g, r)
        {
            out.push((ri, k.clone()));
        }
    }
    out
}

/// Delete one object (honouring finalizers) and cascade. Returns the final state.
pub(super) fn delete_key(
    sh: &SimState,
    st: &mut Store,
    user: &str,
    info: &ResourceInfo,
    key: Key,
    dry_run: bool,
    orphan: bool,
) -> Option<(Value, bool)> {
    let obj = st.objects.get(&key).cloned()?;
    if dry_run {
        return Some(((*obj).clone(), true));
    }
    let has_finalizers = obj
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    if has_finalizers {
        if obj.pointer("/metadata/deletionTimestamp").is_some() {
            return Some(((*obj).clone(), false));
        }
        let mut o = (*obj).clone();
        o["metadata"]["deletionTimestamp"] = json!(now());
        o["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        let rv = st.next_rv();
        o["metadata"]["resourceVersion"] = json!(rv.to_string());
        let o = Arc::new(o);
        st.commit(rv, EventType::Modified, key.clone(), Some(obj), o.clone());
        record_raw(st, sh, user, "delete", info, &key.1, &key.2, rv);
        return Some(((*o).clone(), false));
    }
    let last = finish_delete(sh, st, user, info, key, obj, orphan);
    Some((last, true))
}

fn orphan_dependents(sh: &SimState, st: &mut Store, deleted: &Value) {
    let Some(uid) = meta_str(deleted, "uid").map(str::to_string) else {
        return;
    };
    let keys: Vec<Key> = st
        .objects
        .iter()
        .filter(|(_, o)| {
            o.pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .is_some_and(|a| {
                    a.iter()
                        .any(|r| r.get("uid").and_then(Value::as_str) == Some(uid.as_str()))
                })
        })
        .map(|(k, _)| k.clone())
        .collect();
    for k in keys {
        let Some(old) = st.objects.get(&k).cloned() else {
            continue;
        };
        let mut o = (*old).clone();
        if let Some(a) = o
            .pointer_mut("/metadata/ownerReferences")
            .and_then(Value::as_array_mut)
        {
            a.retain(|r| r.get("uid").and_then(Value::as_str) != Some(uid.as_str()));
        }
        let rv = st.next_rv();
        o["metadata"]["resourceVersion"] = json!(rv.to_string());
        st.commit(rv, EventType::Modified, k.clone(), Some(old), Arc::new(o));
        if let Some((g, r)) = k.0.split_once('/')
            && let Some(ri) = st.registry.get(g, r)
        {
            record_raw(
                st,
                sh,
                "system:serviceaccount:kube-system:generic-garbage-collector",
                "update",
                &ri,
                &k.1,
                &k.2,
                rv,
            );
        }
    }
}
