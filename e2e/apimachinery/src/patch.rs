//! The three PATCH flavours of the API server.
//!
//! * [`merge_patch`] — JSON merge patch (RFC 7386, `application/merge-patch+json`),
//!   delegated to the `json-patch` crate.
//! * [`json_patch()`] — JSON patch (RFC 6902, `application/json-patch+json`),
//!   delegated to the `json-patch` crate; atomic (on error nothing changes).
//! * [`strategic_merge_patch`] — `application/strategic-merge-patch+json`, what
//!   `kubectl apply` (client side), `kubectl patch`, `kubectl edit` and Helm send.
//!
//! # Strategic merge patch
//!
//! Maps merge recursively like a merge patch (`null` deletes a key). Lists are
//! where it differs: the Go structs declare a *patch strategy* per list field.
//! kube-sim has no Go structs, so [`list_strategy`] holds a small table keyed by
//! the kind and the field path (list indices skipped) for the types kube-sim
//! stores. A list is either
//!
//! * merged by a *merge key* (`containers` by `name`, Service `spec.ports` by
//!   `port`, container `ports` by `containerPort`, ...): patch items replace-merge
//!   into the live item with the same key value, new items are appended;
//! * merged as a *set of primitives* (`metadata.finalizers`): union;
//! * atomic (everything else, including every list of an unknown kind): replaced.
//!
//! Directives understood (and never stored):
//!
//! | directive                               | effect                                              |
//! |-----------------------------------------|-----------------------------------------------------|
//! | `{"$patch": "replace", ...}` in a map   | the map is replaced by the rest of the patch map    |
//! | `{"$patch": "delete"}` as a map value   | the field is removed                                |
//! | `{"$patch": "merge"}`                   | the default                                         |
//! | `{"name": "x", "$patch": "delete"}` item| removes the item with that merge key from the list  |
//! | `{"$patch": "replace"}` list item       | the list is replaced by the other patch items       |
//! | `$retainKeys: [..]`                     | after merging, drop map keys not listed             |
//! | `$setElementOrder/<f>: [..]`            | the order of list `<f>` (see below)                 |
//! | `$deleteFromPrimitiveList/<f>: [..]`    | removes those values from primitive list `<f>`      |
//!
//! Ordering follows the Go implementation (`normalizeElementOrder`): items
//! named by the patch — or by `$setElementOrder/<f>` when present — are
//! ordered as the patch lists them, live-only items keep their live order,
//! and the two are interleaved by their live positions.
//!
//! The real API server rejects strategic merge patches for custom resources
//! (415); the caller (kube-sim) is expected to do the same — here an unknown
//! kind simply treats every list as atomic.

use serde_json::{Map, Value};

/// A patch could not be applied; `Display` is suitable for a 422/400 message.
#[derive(Debug, thiserror::Error)]
pub enum PatchError {
    /// The patch document is not a valid patch of its type.
    #[error("invalid patch: {0}")]
    Invalid(String),
    /// An RFC 6902 operation failed (the `json-patch` crate's text, e.g.
    /// `operation '/1' failed at path '/spec/missing': path is invalid`); the
    /// server wraps it in its own 422 message.
    #[error("{0}")]
    JsonPatch(String),
}

/// RFC 7386 JSON merge patch.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    json_patch::merge(target, patch);
}

/// RFC 6902 JSON patch (a JSON array of operations). Atomic: on error `target`
/// is left unchanged.
///
/// As the API server's JSON patch library (`gopkg.in/evanphx/json-patch.v4`),
/// a `replace` of the whole document (`"path": ""`) with a value that is
/// neither an object nor an array does nothing (that library returns no
/// error for it and leaves the document as it was).
pub fn json_patch(target: &mut Value, patch: &Value) -> Result<(), PatchError> {
    let mut patch = patch.clone();
    if let Some(ops) = patch.as_array_mut() {
        ops.retain(|op| {
            !(op.get("op").and_then(Value::as_str) == Some("replace")
                && op.get("path").and_then(Value::as_str) == Some("")
                && op
                    .get("value")
                    .is_some_and(|v| !v.is_object() && !v.is_array()))
        });
    }
    let ops: json_patch::Patch = serde_json::from_value(patch)
        .map_err(|e| PatchError::Invalid(format!("not a JSON patch document: {e}")))?;
    json_patch::patch(target, &ops).map_err(|e| PatchError::JsonPatch(e.to_string()))
}

/// How a list field is patched (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListStrategy {
    /// Replaced as a whole.
    Atomic,
    /// Merged item by item, matched on this key.
    MergeKey(&'static str),
    /// Set union of primitive values.
    MergePrimitives,
}

/// The patch strategy of the list at `path` (field names from the object root,
/// list indices omitted) in an object of `kind`.
pub fn list_strategy(kind: &str, path: &[&str]) -> ListStrategy {
    use ListStrategy::*;
    let Some((&field, parents)) = path.split_last() else {
        return Atomic;
    };
    let parent = parents.last().copied().unwrap_or("");
    match (path, field) {
        (["metadata", "finalizers"], _) => return MergePrimitives,
        (["metadata", "ownerReferences"], _) => return MergeKey("uid"),
        (["metadata", "managedFields"], _) => return Atomic,
        _ => {}
    }
    if !is_known_kind(kind) {
        return Atomic;
    }
    let in_container = matches!(
        parent,
        "containers" | "initContainers" | "ephemeralContainers"
    );
    let in_pod_spec = parent == "spec" && parents.len() >= 2 || (kind == "Pod" && path.len() == 2);
    match field {
        "ports" if kind == "Service" && path == ["spec", "ports"] => MergeKey("port"),
        "ports" if in_container => MergeKey("containerPort"),
        "containers" | "initContainers" | "ephemeralContainers" if in_pod_spec => MergeKey("name"),
        "volumes" | "imagePullSecrets" | "resourceClaims" | "schedulingGates" if in_pod_spec => {
            MergeKey("name")
        }
        "hostAliases" if in_pod_spec => MergeKey("ip"),
        "topologySpreadConstraints" if in_pod_spec => MergeKey("topologyKey"),
        "env" | "resizePolicy" if in_container => {
            if field == "env" {
                MergeKey("name")
            } else {
                MergeKey("resourceName")
            }
        }
        "volumeMounts" if in_container => MergeKey("mountPath"),
        "volumeDevices" if in_container => MergeKey("devicePath"),
        "conditions" if parent == "status" => MergeKey("type"),
        "secrets" if kind == "ServiceAccount" && path == ["secrets"] => MergeKey("name"),
        "finalizers" if kind == "Namespace" && path == ["spec", "finalizers"] => MergePrimitives,
        _ => Atomic,
    }
}

/// Built-in kinds whose list merge keys the tables here (and `ssa`) know.
pub(crate) fn is_known_kind(kind: &str) -> bool {
    matches!(
        kind,
        "Service"
            | "Endpoints"
            | "EndpointSlice"
            | "ConfigMap"
            | "Secret"
            | "Namespace"
            | "ServiceAccount"
            | "Deployment"
            | "StatefulSet"
            | "DaemonSet"
            | "ReplicaSet"
            | "Job"
            | "Pod"
            | "Role"
            | "ClusterRole"
            | "RoleBinding"
            | "ClusterRoleBinding"
            | "Lease"
            | "Event"
    )
}

const PATCH: &str = "$patch";
const RETAIN_KEYS: &str = "$retainKeys";
const SET_ORDER: &str = "$setElementOrder/";
const DELETE_PRIMITIVE: &str = "$deleteFromPrimitiveList/";

/// Kubernetes strategic merge patch for an object of kind `gvk_kind`.
/// On error `target` is left unchanged.
pub fn strategic_merge_patch(
    target: &mut Value,
    patch: &Value,
    gvk_kind: &str,
) -> Result<(), PatchError> {
    let patch_map = patch.as_object().ok_or_else(|| {
        PatchError::Invalid("a strategic merge patch must be a JSON object".into())
    })?;
    let mut work = target.clone();
    if !work.is_object() {
        work = Value::Object(Map::new());
    }
    let mut path: Vec<String> = Vec::new();
    merge_map_value(&mut work, patch_map, gvk_kind, &mut path)?;
    *target = work;
    Ok(())
}

/// Merges `patch` into `target` (which becomes an object if it is not one).
fn merge_map_value(
    target: &mut Value,
    patch: &Map<String, Value>,
    kind: &str,
    path: &mut Vec<String>,
) -> Result<(), PatchError> {
    let here = if path.is_empty() {
        "the object root".to_string()
    } else {
        path.join(".")
    };
    let at = || here.clone();
    match patch.get(PATCH) {
        None => {}
        Some(Value::String(s)) if s == "merge" => {}
        Some(Value::String(s)) if s == "replace" => {
            let mut rest = patch.clone();
            rest.remove(PATCH);
            *target = Value::Object(Map::new());
            return merge_map_value(target, &rest, kind, path);
        }
        Some(Value::String(s)) if s == "delete" => {
            // Handled by the parent; reaching here means a root-level delete.
            return Err(PatchError::Invalid(format!(
                "$patch: delete is not allowed at {}",
                at()
            )));
        }
        Some(other) => {
            return Err(PatchError::Invalid(format!(
                "unknown patch type: {other} in map at {}",
                at()
            )));
        }
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    // Live lists named by `$setElementOrder/<f>`, before anything is merged
    // (independent of the key order of the patch document).
    let originals: Map<String, Value> = patch
        .keys()
        .filter_map(|k| k.strip_prefix(SET_ORDER))
        .filter_map(|f| {
            target
                .get(f)
                .filter(|v| v.is_array())
                .map(|v| (f.to_string(), v.clone()))
        })
        .collect();
    let mut retain: Option<Vec<String>> = None;
    let mut orders: Vec<(&str, &Vec<Value>, Vec<Value>)> = Vec::new();
    for (key, pval) in patch {
        let key = key.as_str();
        if key == PATCH {
            continue;
        }
        if key == RETAIN_KEYS {
            let list = pval.as_array().ok_or_else(|| {
                PatchError::Invalid(format!("$retainKeys at {} must be a list of strings", at()))
            })?;
            let keys: Option<Vec<String>> = list
                .iter()
                .map(|v| v.as_str().map(str::to_string))
                .collect();
            retain = Some(keys.ok_or_else(|| {
                PatchError::Invalid(format!("$retainKeys at {} must be a list of strings", at()))
            })?);
            continue;
        }
        if let Some(field) = key.strip_prefix(SET_ORDER) {
            let list = pval
                .as_array()
                .ok_or_else(|| PatchError::Invalid(format!("{key} at {} must be a list", at())))?;
            let original: Vec<Value> = originals
                .get(field)
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            orders.push((field, list, original));
            continue;
        }
        if let Some(field) = key.strip_prefix(DELETE_PRIMITIVE) {
            let list = pval
                .as_array()
                .ok_or_else(|| PatchError::Invalid(format!("{key} at {} must be a list", at())))?;
            // Applied below, after the field itself is merged, if present in the patch.
            if !patch.contains_key(field)
                && let Some(Value::Array(live)) = target.get_mut(field)
            {
                live.retain(|v| !list.contains(v));
            }
            continue;
        }
        let Some(tmap) = target.as_object_mut() else {
            continue;
        };
        path.push(key.to_string());
        match pval {
            Value::Null => {
                tmap.remove(key);
            }
            Value::Object(pm) => {
                if pm.get(PATCH).and_then(Value::as_str) == Some("delete") {
                    tmap.remove(key);
                } else {
                    let slot = tmap
                        .entry(key.to_string())
                        .or_insert_with(|| Value::Object(Map::new()));
                    merge_map_value(slot, pm, kind, path)?;
                }
            }
            Value::Array(pl) => {
                let strategy = strategy_at(kind, path);
                let slot = tmap
                    .entry(key.to_string())
                    .or_insert_with(|| Value::Array(Vec::new()));
                if !slot.is_array() {
                    *slot = Value::Array(Vec::new());
                }
                merge_list(slot, pl, strategy, kind, path)?;
                if let Some(Value::Array(dels)) = patch.get(&format!("{DELETE_PRIMITIVE}{key}"))
                    && let Value::Array(live) = slot
                {
                    live.retain(|v| !dels.contains(v));
                }
            }
            scalar => {
                tmap.insert(key.to_string(), scalar.clone());
            }
        }
        path.pop();
    }
    if let Some(tmap) = target.as_object_mut() {
        for (field, order, original) in orders {
            if let Some(Value::Array(list)) = tmap.get_mut(field) {
                path.push(field.to_string());
                let strategy = strategy_at(kind, path);
                path.pop();
                let merged = std::mem::take(list);
                *list = normalize_order(
                    merged,
                    &order_keys(order, strategy),
                    &order_keys(&original, strategy),
                    strategy,
                );
            }
        }
        if let Some(keep) = retain {
            tmap.retain(|k, _| keep.iter().any(|r| r == k));
        }
    }
    Ok(())
}

fn strategy_at(kind: &str, path: &[String]) -> ListStrategy {
    let p: Vec<&str> = path.iter().map(String::as_str).collect();
    list_strategy(kind, &p)
}

fn item_key<'v>(item: &'v Value, key: &str) -> Option<&'v Value> {
    item.as_object().and_then(|m| m.get(key))
}

fn merge_list(
    target: &mut Value,
    patch: &[Value],
    strategy: ListStrategy,
    kind: &str,
    path: &mut Vec<String>,
) -> Result<(), PatchError> {
    let at = path.join(".");
    let Value::Array(live) = target else {
        return Err(PatchError::Invalid(format!("{at}: target is not a list")));
    };
    // A `{"$patch": "replace"}` element means: replace the list with the other items.
    let replace = patch.iter().any(|v| {
        v.as_object().is_some_and(|m| {
            m.len() == 1 && m.get(PATCH).and_then(Value::as_str) == Some("replace")
        })
    });
    let items: Vec<&Value> = patch
        .iter()
        .filter(|v| {
            !v.as_object().is_some_and(|m| {
                m.len() == 1 && m.get(PATCH).and_then(Value::as_str) == Some("replace")
            })
        })
        .collect();
    if replace || strategy == ListStrategy::Atomic {
        let mut out = Vec::new();
        for item in items {
            out.push(clean_value(item, kind, path)?);
        }
        *live = out;
        return Ok(());
    }
    match strategy {
        ListStrategy::Atomic => Ok(()),
        ListStrategy::MergePrimitives => {
            let server_order = live.clone();
            for item in &items {
                if item.is_object() || item.is_array() {
                    return Err(PatchError::Invalid(format!(
                        "{at}: expected a list of primitives, found {item}"
                    )));
                }
                if !live.contains(item) {
                    live.push((*item).clone());
                }
            }
            let patch_order: Vec<Value> = items.iter().map(|v| (*v).clone()).collect();
            let merged = std::mem::take(live);
            *live = normalize_order(merged, &patch_order, &server_order, strategy);
            Ok(())
        }
        ListStrategy::MergeKey(mk) => {
            let mut merges: Vec<(&Map<String, Value>, &Value)> = Vec::new();
            for item in &items {
                let Some(pm) = item.as_object() else {
                    return Err(PatchError::Invalid(format!(
                        "{at}: expected a list of maps, found {item}"
                    )));
                };
                let Some(kv) = pm.get(mk) else {
                    return Err(PatchError::Invalid(format!(
                        "{at}: map: {item} does not contain declared merge key: {mk}"
                    )));
                };
                if pm.get(PATCH).and_then(Value::as_str) == Some("delete") {
                    live.retain(|l| item_key(l, mk) != Some(kv));
                } else {
                    merges.push((pm, kv));
                }
            }
            // Server order is taken after deletions, as in `mergeSlice`.
            let server_order = order_keys(live, strategy);
            let patch_order: Vec<Value> = merges.iter().map(|(_, kv)| (*kv).clone()).collect();
            for (pm, kv) in merges {
                match live.iter().position(|l| item_key(l, mk) == Some(kv)) {
                    Some(i) => merge_map_value(&mut live[i], pm, kind, path)?,
                    None => {
                        let v = Value::Object(pm.clone());
                        live.push(clean_value(&v, kind, path)?);
                    }
                }
            }
            let merged = std::mem::take(live);
            *live = normalize_order(merged, &patch_order, &server_order, strategy);
            Ok(())
        }
    }
}

/// A patch value that lands where nothing existed: directives are interpreted
/// against an empty value so none of them is stored.
fn clean_value(v: &Value, kind: &str, path: &mut Vec<String>) -> Result<Value, PatchError> {
    match v {
        Value::Object(m) => {
            let mut out = Value::Object(Map::new());
            let mut m2 = m.clone();
            // A delete directive on a fresh map item means nothing to add.
            if m2.get(PATCH).and_then(Value::as_str) == Some("delete") {
                m2.remove(PATCH);
            }
            merge_map_value(&mut out, &m2, kind, path)?;
            Ok(out)
        }
        Value::Array(items) => {
            let mut out = Value::Array(Vec::new());
            let strategy = strategy_at(kind, path);
            merge_list(&mut out, items, strategy, kind, path)?;
            Ok(out)
        }
        other => Ok(other.clone()),
    }
}

/// The ordering identity of list items: the merge key value, or the item itself.
fn order_keys(items: &[Value], strategy: ListStrategy) -> Vec<Value> {
    items.iter().map(|v| order_key(v, strategy)).collect()
}

fn order_key(v: &Value, strategy: ListStrategy) -> Value {
    match strategy {
        ListStrategy::MergeKey(k) => item_key(v, k).cloned().unwrap_or(Value::Null),
        _ => v.clone(),
    }
}

/// `normalizeElementOrder` + `mergeSortedSlice` of the Go implementation:
/// items named by the patch (or `$setElementOrder`) are sorted by
/// `patch_order`, live-only items keep their live order, and the two runs are
/// interleaved using the live (server) positions where both are known.
fn normalize_order(
    merged: Vec<Value>,
    patch_order: &[Value],
    server_order: &[Value],
    strategy: ListStrategy,
) -> Vec<Value> {
    let index = |keys: &[Value], k: &Value| keys.iter().position(|x| x == k);
    let (mut patch_items, mut server_only): (Vec<Value>, Vec<Value>) = merged
        .into_iter()
        .partition(|v| index(patch_order, &order_key(v, strategy)).is_some());
    patch_items.sort_by_key(|v| index(patch_order, &order_key(v, strategy)).unwrap_or(usize::MAX));
    server_only.sort_by_key(|v| index(server_order, &order_key(v, strategy)).unwrap_or(usize::MAX));
    let mut out = Vec::with_capacity(patch_items.len() + server_only.len());
    let mut left = server_only.into_iter().peekable();
    let mut right = patch_items.into_iter().peekable();
    loop {
        let take_left = match (left.peek(), right.peek()) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(l), Some(r)) => {
                match (
                    index(server_order, &order_key(l, strategy)),
                    index(server_order, &order_key(r, strategy)),
                ) {
                    (Some(li), Some(ri)) => li < ri,
                    _ => false,
                }
            }
        };
        let next = if take_left { left.next() } else { right.next() };
        if let Some(v) = next {
            out.push(v);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_patch_root_replace_with_a_scalar_is_a_no_op_like_the_api_server() {
        let mut doc = json!({"a": 1});
        json_patch(
            &mut doc,
            &json!([{"op": "replace", "path": "", "value": "x"}]),
        )
        .expect("no-op");
        assert_eq!(doc, json!({"a": 1}));
        // The later operations still run.
        json_patch(
            &mut doc,
            &json!([{"op": "replace", "path": "", "value": 5}, {"op": "add", "path": "/b", "value": 2}]),
        )
        .expect("patch");
        assert_eq!(doc, json!({"a": 1, "b": 2}));
        // An array or object replaces the document.
        json_patch(
            &mut doc,
            &json!([{"op": "replace", "path": "", "value": [1]}]),
        )
        .expect("replace root");
        assert_eq!(doc, json!([1]));
    }

    #[test]
    fn merge_patch_rfc7386() {
        let mut t = json!({"a": "b", "c": {"d": "e", "f": "g"}, "l": [1, 2]});
        merge_patch(&mut t, &json!({"a": "z", "c": {"f": null}, "l": [3]}));
        assert_eq!(t, json!({"a": "z", "c": {"d": "e"}, "l": [3]}));
    }

    #[test]
    fn json_patch_ops_and_atomicity() {
        let mut t = json!({"spec": {"replicas": 1, "l": ["a"]}});
        json_patch(
            &mut t,
            &json!([
                {"op": "replace", "path": "/spec/replicas", "value": 3},
                {"op": "add", "path": "/spec/l/-", "value": "b"},
                {"op": "test", "path": "/spec/replicas", "value": 3}
            ]),
        )
        .expect("applies");
        assert_eq!(t, json!({"spec": {"replicas": 3, "l": ["a", "b"]}}));

        let before = t.clone();
        let e = json_patch(
            &mut t,
            &json!([
                {"op": "replace", "path": "/spec/replicas", "value": 9},
                {"op": "remove", "path": "/spec/missing"}
            ]),
        )
        .expect_err("second op fails");
        assert_eq!(
            e.to_string(),
            "operation '/1' failed at path '/spec/missing': path is invalid"
        );
        assert_eq!(t, before, "failed patch must not change the target");
    }

    #[test]
    fn json_patch_rejects_non_patch() {
        let mut t = json!({});
        let e = json_patch(&mut t, &json!({"op": "add"})).expect_err("not an array");
        assert!(matches!(e, PatchError::Invalid(_)), "{e}");
        let e =
            json_patch(&mut t, &json!([{"op": "frobnicate", "path": "/a"}])).expect_err("bad op");
        assert!(matches!(e, PatchError::Invalid(_)), "{e}");
    }

    #[test]
    fn smp_maps_merge_and_null_deletes() {
        let mut t = json!({"metadata": {"labels": {"a": "1", "b": "2"}}, "data": {"x": "1"}});
        strategic_merge_patch(
            &mut t,
            &json!({"metadata": {"labels": {"a": null, "c": "3"}}, "data": {"y": "2"}}),
            "ConfigMap",
        )
        .expect("ok");
        assert_eq!(
            t,
            json!({"metadata": {"labels": {"b": "2", "c": "3"}}, "data": {"x": "1", "y": "2"}})
        );
    }

    fn deployment() -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "spec": {"template": {"spec": {"containers": [
                {"name": "app", "image": "app:1", "env": [{"name": "A", "value": "1"}, {"name": "B", "value": "2"}],
                 "ports": [{"containerPort": 80, "name": "http"}], "args": ["x", "y"]},
                {"name": "sidecar", "image": "side:1"}
            ]}}}
        })
    }

    fn containers(v: &Value) -> &Vec<Value> {
        v["spec"]["template"]["spec"]["containers"]
            .as_array()
            .expect("containers")
    }

    #[test]
    fn smp_containers_merge_by_name() {
        let mut t = deployment();
        strategic_merge_patch(
            &mut t,
            &json!({"spec": {"template": {"spec": {"containers": [
                {"name": "app", "image": "app:2", "env": [{"name": "B", "value": "20"}, {"name": "C", "value": "3"}], "args": ["z"]},
                {"name": "new", "image": "new:1"}
            ]}}}}),
            "Deployment",
        )
        .expect("ok");
        let c = containers(&t);
        assert_eq!(c.len(), 3);
        // Go's normalizeElementOrder: patch items in patch order, the live-only
        // sidecar after them (it cannot be placed relative to the new item).
        let names: Vec<&Value> = c.iter().map(|x| &x["name"]).collect();
        assert_eq!(names, vec!["app", "new", "sidecar"]);
        assert_eq!(c[0]["image"], "app:2");
        assert_eq!(
            c[0]["env"],
            json!([{"name": "A", "value": "1"}, {"name": "B", "value": "20"}, {"name": "C", "value": "3"}])
        );
        assert_eq!(c[0]["args"], json!(["z"]), "args is atomic");
        assert_eq!(
            c[0]["ports"],
            json!([{"containerPort": 80, "name": "http"}]),
            "untouched"
        );
        assert_eq!(c[1], json!({"name": "new", "image": "new:1"}));
    }

    #[test]
    fn smp_delete_list_item_and_set_order() {
        let mut t = deployment();
        strategic_merge_patch(
            &mut t,
            &json!({"spec": {"template": {"spec": {
                "$setElementOrder/containers": [{"name": "sidecar"}, {"name": "app"}],
                "containers": [{"name": "app", "$setElementOrder/env": [{"name": "B"}], "env": [{"name": "A", "$patch": "delete"}]}]
            }}}}),
            "Deployment",
        )
        .expect("ok");
        let c = containers(&t);
        assert_eq!(c[0]["name"], "sidecar");
        assert_eq!(c[1]["name"], "app");
        assert_eq!(c[1]["env"], json!([{"name": "B", "value": "2"}]));
        let s = t.to_string();
        assert!(
            !s.contains("$setElementOrder") && !s.contains("$patch"),
            "{s}"
        );
    }

    #[test]
    fn smp_order_interleaves_live_only_items() {
        // Live [a, b, c, d]; the patch touches d and b: patch order [d, b];
        // live-only a and c keep their places relative to known positions.
        let mut t =
            json!({"spec": {"ports": [{"port": 1}, {"port": 2}, {"port": 3}, {"port": 4}]}});
        strategic_merge_patch(
            &mut t,
            &json!({"spec": {"ports": [{"port": 4, "name": "d"}, {"port": 2, "name": "b"}]}}),
            "Service",
        )
        .expect("ok");
        let ports: Vec<&Value> = t["spec"]["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .map(|p| &p["port"])
            .collect();
        assert_eq!(ports, vec![1, 3, 4, 2]);
        // $setElementOrder puts it back, regardless of key order in the patch.
        let patch: Value = serde_json::from_str(
            r#"{"spec": {"ports": [{"port": 3, "name": "c"}], "$setElementOrder/ports": [{"port": 1}, {"port": 2}, {"port": 3}, {"port": 4}]}}"#,
        )
        .expect("json");
        strategic_merge_patch(&mut t, &patch, "Service").expect("ok");
        let ports: Vec<&Value> = t["spec"]["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .map(|p| &p["port"])
            .collect();
        assert_eq!(ports, vec![1, 2, 3, 4]);
        assert_eq!(t["spec"]["ports"][2], json!({"port": 3, "name": "c"}));
    }

    #[test]
    fn smp_service_ports_by_port() {
        let mut t = json!({"kind": "Service", "spec": {"ports": [
            {"name": "http", "port": 80, "targetPort": 8080},
            {"name": "https", "port": 443}
        ]}});
        strategic_merge_patch(
            &mut t,
            &json!({"spec": {"ports": [{"port": 80, "targetPort": 9090}, {"port": 8443, "name": "alt"}]}}),
            "Service",
        )
        .expect("ok");
        assert_eq!(
            t["spec"]["ports"],
            json!([{"name": "http", "port": 80, "targetPort": 9090}, {"port": 8443, "name": "alt"}, {"name": "https", "port": 443}])
        );
    }

    #[test]
    fn smp_unknown_and_atomic_lists_are_replaced() {
        let mut t = json!({"subsets": [{"addresses": [{"ip": "10.0.0.1"}]}]});
        strategic_merge_patch(
            &mut t,
            &json!({"subsets": [{"addresses": [{"ip": "10.0.0.2"}]}]}),
            "Endpoints",
        )
        .expect("ok");
        assert_eq!(t, json!({"subsets": [{"addresses": [{"ip": "10.0.0.2"}]}]}));

        let mut t = json!({"spec": {"containers": [{"name": "a", "x": 1}]}});
        strategic_merge_patch(
            &mut t,
            &json!({"spec": {"containers": [{"name": "b"}]}}),
            "DiscoveredService",
        )
        .expect("ok");
        assert_eq!(
            t,
            json!({"spec": {"containers": [{"name": "b"}]}}),
            "unknown kind: atomic"
        );

        let mut t = json!({"rules": [{"verbs": ["get"]}, {"verbs": ["list"]}]});
        strategic_merge_patch(&mut t, &json!({"rules": [{"verbs": ["watch"]}]}), "Role")
            .expect("ok");
        assert_eq!(t, json!({"rules": [{"verbs": ["watch"]}]}));
    }

    #[test]
    fn smp_finalizers_union_and_delete_from_primitive_list() {
        let mut t = json!({"metadata": {"finalizers": ["a", "b"]}});
        strategic_merge_patch(
            &mut t,
            &json!({"metadata": {"finalizers": ["c", "a"]}}),
            "ConfigMap",
        )
        .expect("ok");
        // Union, ordered like Go: patch values first in patch order, then live-only ones.
        assert_eq!(t["metadata"]["finalizers"], json!(["c", "a", "b"]));
        strategic_merge_patch(
            &mut t,
            &json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["b"]}}),
            "ConfigMap",
        )
        .expect("ok");
        assert_eq!(t["metadata"]["finalizers"], json!(["c", "a"]));
        strategic_merge_patch(
            &mut t,
            &json!({"metadata": {"$setElementOrder/finalizers": ["c", "a", "d"], "finalizers": ["d"], "$deleteFromPrimitiveList/finalizers": ["a"]}}),
            "ConfigMap",
        )
        .expect("ok");
        assert_eq!(t["metadata"]["finalizers"], json!(["c", "d"]));
    }

    #[test]
    fn smp_patch_replace_and_delete_on_maps() {
        let mut t = json!({"data": {"a": "1", "b": "2"}, "metadata": {"annotations": {"x": "y"}}});
        strategic_merge_patch(
            &mut t,
            &json!({"data": {"$patch": "replace", "c": "3"}}),
            "ConfigMap",
        )
        .expect("ok");
        assert_eq!(t["data"], json!({"c": "3"}));
        strategic_merge_patch(
            &mut t,
            &json!({"metadata": {"annotations": {"$patch": "delete"}}}),
            "ConfigMap",
        )
        .expect("ok");
        assert_eq!(t["metadata"], json!({}));
    }

    #[test]
    fn smp_list_replace_directive() {
        let mut t = deployment();
        strategic_merge_patch(
            &mut t,
            &json!({"spec": {"template": {"spec": {"containers": [{"$patch": "replace"}, {"name": "only", "image": "o"}]}}}}),
            "Deployment",
        )
        .expect("ok");
        assert_eq!(containers(&t), &vec![json!({"name": "only", "image": "o"})]);
    }

    #[test]
    fn smp_retain_keys() {
        let mut t = json!({"spec": {"strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1}}}});
        strategic_merge_patch(
            &mut t,
            &json!({"spec": {"strategy": {"$retainKeys": ["type"], "type": "Recreate"}}}),
            "Deployment",
        )
        .expect("ok");
        assert_eq!(t, json!({"spec": {"strategy": {"type": "Recreate"}}}));
    }

    #[test]
    fn smp_new_values_are_cleaned_of_directives() {
        let mut t = json!({"kind": "Deployment"});
        strategic_merge_patch(
            &mut t,
            &json!({"spec": {"template": {"spec": {
                "$setElementOrder/containers": [{"name": "a"}],
                "containers": [{"name": "a", "env": [{"name": "X", "value": "1"}, {"name": "Y", "$patch": "delete"}]}]
            }}}}),
            "Deployment",
        )
        .expect("ok");
        assert_eq!(
            containers(&t),
            &vec![json!({"name": "a", "env": [{"name": "X", "value": "1"}]})]
        );
        assert!(!t.to_string().contains('$'));
    }

    #[test]
    fn smp_errors_leave_target_unchanged() {
        let mut t = deployment();
        let before = t.clone();
        let e = strategic_merge_patch(
            &mut t,
            &json!({"metadata": {"labels": {"a": "b"}}, "spec": {"template": {"spec": {"containers": [{"image": "nokey"}]}}}}),
            "Deployment",
        )
        .expect_err("missing merge key");
        assert!(
            e.to_string()
                .contains("does not contain declared merge key: name"),
            "{e}"
        );
        assert_eq!(t, before);
        let e = strategic_merge_patch(&mut t, &json!({"data": {"$patch": "explode"}}), "ConfigMap")
            .expect_err("bad");
        assert!(e.to_string().contains("unknown patch type"), "{e}");
        assert!(strategic_merge_patch(&mut t, &json!([1]), "ConfigMap").is_err());
    }

    #[test]
    fn strategy_table() {
        assert_eq!(
            list_strategy("Service", &["spec", "ports"]),
            ListStrategy::MergeKey("port")
        );
        assert_eq!(
            list_strategy("EndpointSlice", &["ports"]),
            ListStrategy::Atomic
        );
        assert_eq!(
            list_strategy(
                "Deployment",
                &["spec", "template", "spec", "containers", "ports"]
            ),
            ListStrategy::MergeKey("containerPort")
        );
        assert_eq!(
            list_strategy("Deployment", &["spec", "template", "spec", "volumes"]),
            ListStrategy::MergeKey("name")
        );
        assert_eq!(
            list_strategy("Deployment", &["status", "conditions"]),
            ListStrategy::MergeKey("type")
        );
        assert_eq!(
            list_strategy("ServiceAccount", &["secrets"]),
            ListStrategy::MergeKey("name")
        );
        assert_eq!(
            list_strategy("Endpoints", &["subsets"]),
            ListStrategy::Atomic
        );
        assert_eq!(
            list_strategy("Whatever", &["metadata", "finalizers"]),
            ListStrategy::MergePrimitives
        );
    }
}
