//! Server-side apply and `metadata.managedFields`, modelled on
//! `sigs.k8s.io/structured-merge-diff` as used by the API server.
//!
//! # Field sets
//!
//! Ownership is tracked per *field path*: a list of [`PathElement`]s
//! (`f:` field, `k:` associative-list key, `v:` set value, `i:` index). A
//! [`FieldSet`] is a sorted set of paths; it is stored in each managedFields
//! entry in the FieldsV1 trie format
//! (`{"f:spec":{"f:ports":{"k:{\"port\":80,\"protocol\":\"TCP\"}":{".":{},"f:port":{}}}}}`,
//! where `"."` marks a node that is itself a member and has members below it).
//!
//! Which paths an object contributes depends on the list types, which Go gets
//! from the OpenAPI schema. Here [`list_type`] is a small table per kind and
//! field path (Service `spec.ports` keyed by `port`+`protocol`, containers by
//! `name`, finalizers as a set, ...); every other list — all lists of custom
//! resources unless the caller passes its own resolver to
//! [`apply_with_list_types`] — is *atomic*: owned as a whole, replaced as a whole.
//! Missing key fields take the Kubernetes default where one exists (`protocol:
//! TCP`); a keyed list with an item lacking every key falls back to atomic.
//!
//! Not tracked (as in Kubernetes): `apiVersion`, `kind` and
//! `metadata.{name,namespace,uid,resourceVersion,generation,creationTimestamp,
//! deletionTimestamp,deletionGracePeriodSeconds,selfLink,managedFields}`.
//!
//! # Apply ([`apply`])
//!
//! 1. `S_new` = field set of the applied configuration; `S_old` = the set of
//!    the manager's previous `Apply` entry.
//! 2. Conflicts: a path in `S_new` owned by a *different* manager (any
//!    operation) whose value would change. Equal values are not conflicts: the
//!    field becomes co-owned. Without `force` any conflict fails the whole apply;
//!    with `force` the conflicting paths are taken away from the other managers.
//! 3. Paths in `S_old` but not in `S_new` are *removed from the object* unless
//!    another manager owns that path or something below it (or the new
//!    configuration still has something below it).
//! 4. The applied configuration is merged into the live object (maps
//!    recursively, keyed lists item by item, sets by union, atomic lists and
//!    scalars replaced; item order as structured-merge-diff interleaves it),
//!    and the manager's entry becomes `S_new`. Its `time` is only bumped when
//!    the object changed, so a no-op apply returns the live object unchanged.
//!
//! # Updates ([`record_update`])
//!
//! For create/update/patch: paths whose value changed (or appeared) become
//! owned by `(manager, Update, apiVersion)` and are removed from every other
//! entry; paths that disappeared are removed from all entries. As in
//! Kubernetes, a request may overwrite `managedFields` (a non-empty list
//! different from the stored one is taken as the new baseline) and
//! `managedFields: [{}]` strips them entirely.
//!
//! # Subresources and first apply
//!
//! [`apply_with`] takes a [`Scope`]: for kinds with a status subresource the
//! main resource ignores `.status` and the `status` subresource only takes
//! `.status`, and their entries are kept apart (`subresource: status`), so one
//! manager applying both never removes its own spec with a status apply. If
//! the live object has no managedFields at all, its fields are first given to
//! `before-first-apply` (as Kubernetes does), so a first apply conflicts
//! instead of silently changing values it never owned.
//!
//! Simplifications: no per-version conversion of field sets; entries are keyed
//! by (manager, operation, subresource) and, for updates, apiVersion; the
//! `ApplyConflict` message names managers without the ` using <apiVersion>`
//! suffix Kubernetes adds for `Update` entries.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::ops::Bound;

use serde_json::{Map, Value, json};

/// One step of a field path.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathElement {
    /// `f:<name>`: a map field.
    Field(String),
    /// `k:{...}`: an associative-list item, by its key fields (sorted by name,
    /// values as canonical JSON).
    Key(Vec<(String, String)>),
    /// `v:<json>`: a set item (canonical JSON).
    Value(String),
    /// `i:<n>`: a list index (only read from stored FieldsV1; never produced).
    Index(usize),
}

/// A field path.
pub type Path = Vec<PathElement>;
/// A set of field paths.
pub type FieldSet = BTreeSet<Path>;

/// The type of a list, deciding how it is owned and merged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ListType {
    /// Owned and replaced as a whole.
    Atomic,
    /// A set of scalars; each value owned separately.
    Set,
    /// An associative list keyed by these fields.
    Map(Vec<String>),
}

impl PathElement {
    /// The FieldsV1 key, e.g. `f:spec`, `k:{"port":80,"protocol":"TCP"}`.
    pub fn fields_v1_key(&self) -> String {
        match self {
            PathElement::Field(f) => format!("f:{f}"),
            PathElement::Key(kv) => format!("k:{}", key_json(kv)),
            PathElement::Value(v) => format!("v:{v}"),
            PathElement::Index(i) => format!("i:{i}"),
        }
    }

    fn parse_fields_v1_key(s: &str) -> Option<PathElement> {
        let (prefix, rest) = s.split_at_checked(2)?;
        match prefix {
            "f:" => Some(PathElement::Field(rest.to_string())),
            "k:" => {
                let v: Value = serde_json::from_str(rest).ok()?;
                let m = v.as_object()?;
                let mut kv: Vec<(String, String)> = m
                    .iter()
                    .map(|(k, v)| (k.clone(), canonical_json(v)))
                    .collect();
                kv.sort();
                Some(PathElement::Key(kv))
            }
            "v:" => {
                let v: Value = serde_json::from_str(rest).ok()?;
                Some(PathElement::Value(canonical_json(&v)))
            }
            "i:" => rest.parse().ok().map(PathElement::Index),
            _ => None,
        }
    }
}

fn key_json(kv: &[(String, String)]) -> String {
    let parts: Vec<String> = kv
        .iter()
        .map(|(k, v)| format!("{}:{v}", Value::String(k.clone())))
        .collect();
    format!("{{{}}}", parts.join(","))
}

/// Renders a path like structured-merge-diff does in conflict messages:
/// `.spec.template.spec.containers[name="app"].image`, `.spec.ports[port=80,protocol="TCP"]`,
/// `.metadata.finalizers[="x"]`.
pub fn path_string(path: &[PathElement]) -> String {
    let mut s = String::new();
    for pe in path {
        match pe {
            PathElement::Field(f) => {
                s.push('.');
                s.push_str(f);
            }
            PathElement::Key(kv) => {
                let parts: Vec<String> = kv.iter().map(|(k, v)| format!("{k}={v}")).collect();
                s.push_str(&format!("[{}]", parts.join(",")));
            }
            PathElement::Value(v) => s.push_str(&format!("[={v}]")),
            PathElement::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

/// JSON text with object keys sorted at every level (deterministic regardless
/// of serde_json's `preserve_order` feature).
pub fn canonical_json(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let sorted: BTreeMap<&String, &Value> = m.iter().collect();
            let parts: Vec<String> = sorted
                .into_iter()
                .map(|(k, v)| format!("{}:{}", Value::String(k.clone()), canonical_json(v)))
                .collect();
            format!("{{{}}}", parts.join(","))
        }
        Value::Array(a) => format!(
            "[{}]",
            a.iter().map(canonical_json).collect::<Vec<_>>().join(",")
        ),
        other => other.to_string(),
    }
}

/// The built-in list types of the kinds kube-sim stores. `path` holds field
/// names from the root, list positions omitted.
pub fn list_type(kind: &str, path: &[&str]) -> ListType {
    let keys = |k: &[&str]| ListType::Map(k.iter().map(|s| s.to_string()).collect());
    let Some((&field, parents)) = path.split_last() else {
        return ListType::Atomic;
    };
    let parent = parents.last().copied().unwrap_or("");
    match path {
        ["metadata", "finalizers"] => return ListType::Set,
        ["metadata", "ownerReferences"] => return keys(&["uid"]),
        _ => {}
    }
    let builtin = crate::patch::is_known_kind(kind);
    if !builtin {
        return ListType::Atomic;
    }
    let in_container = matches!(
        parent,
        "containers" | "initContainers" | "ephemeralContainers"
    );
    let in_pod_spec =
        (parent == "spec" && parents.len() >= 2) || (kind == "Pod" && path.len() == 2);
    match field {
        "ports" if kind == "Service" && path == ["spec", "ports"] => keys(&["port", "protocol"]),
        "ports" if in_container => keys(&["containerPort", "protocol"]),
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "imagePullSecrets"
        | "resourceClaims"
        | "schedulingGates"
            if in_pod_spec =>
        {
            keys(&["name"])
        }
        "hostAliases" if in_pod_spec => keys(&["ip"]),
        "topologySpreadConstraints" if in_pod_spec => keys(&["topologyKey", "whenUnsatisfiable"]),
        "env" if in_container => keys(&["name"]),
        "volumeMounts" if in_container => keys(&["mountPath"]),
        "volumeDevices" if in_container => keys(&["devicePath"]),
        "conditions" if parent == "status" => keys(&["type"]),
        "secrets" if kind == "ServiceAccount" && path == ["secrets"] => keys(&["name"]),
        _ => ListType::Atomic,
    }
}

fn key_default(field: &str) -> Option<Value> {
    match field {
        "protocol" => Some(Value::String("TCP".into())),
        _ => None,
    }
}

/// The key element of an associative-list item, or `None` if it has none of the keys.
fn item_key(item: &Value, keys: &[String]) -> Option<PathElement> {
    let m = item.as_object()?;
    let mut kv = Vec::new();
    for k in keys {
        if let Some(v) = m
            .get(k)
            .filter(|v| !v.is_null())
            .cloned()
            .or_else(|| key_default(k))
        {
            kv.push((k.clone(), canonical_json(&v)));
        }
    }
    if kv.is_empty() || !keys.iter().any(|k| m.contains_key(k)) {
        return None;
    }
    kv.sort();
    Some(PathElement::Key(kv))
}

fn item_matches(item: &Value, kv: &[(String, String)]) -> bool {
    let Some(m) = item.as_object() else {
        return false;
    };
    kv.iter().all(|(k, want)| {
        m.get(k)
            .filter(|v| !v.is_null())
            .cloned()
            .or_else(|| key_default(k))
            .is_some_and(|v| canonical_json(&v) == *want)
    })
}

const UNTRACKED_METADATA: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
    "managedFields",
];

/// Metadata fields never copied from an applied configuration onto a live object.
const SERVER_OWNED_METADATA: &[&str] = &[
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
    "managedFields",
];

fn is_untracked(fields: &[String], key: &str) -> bool {
    match fields {
        [] => key == "apiVersion" || key == "kind",
        [m] if m == "metadata" => UNTRACKED_METADATA.contains(&key),
        _ => false,
    }
}

/// A resolver from field path to list type.
pub type ListTypes<'a> = &'a dyn Fn(&[&str]) -> ListType;

fn resolve(lt: ListTypes<'_>, fields: &[String]) -> ListType {
    let p: Vec<&str> = fields.iter().map(String::as_str).collect();
    lt(&p)
}

/// All field paths an object sets, with list types from `lt`.
pub fn field_set(obj: &Value, lt: ListTypes<'_>) -> FieldSet {
    let mut out = FieldSet::new();
    walk(obj, &mut Vec::new(), &mut Vec::new(), lt, &mut out);
    out
}

fn walk(
    v: &Value,
    path: &mut Path,
    fields: &mut Vec<String>,
    lt: ListTypes<'_>,
    out: &mut FieldSet,
) {
    match v {
        Value::Null => {}
        Value::Object(m) => {
            if m.is_empty() && !path.is_empty() {
                out.insert(path.clone());
                return;
            }
            for (k, child) in m {
                if child.is_null() || is_untracked(fields, k) {
                    continue;
                }
                path.push(PathElement::Field(k.clone()));
                fields.push(k.clone());
                walk(child, path, fields, lt, out);
                fields.pop();
                path.pop();
            }
        }
        Value::Array(items) => {
            if items.is_empty() {
                out.insert(path.clone());
                return;
            }
            match effective_list_type(items, resolve(lt, fields)) {
                ListType::Atomic => {
                    out.insert(path.clone());
                }
                ListType::Set => {
                    for item in items {
                        path.push(PathElement::Value(canonical_json(item)));
                        out.insert(path.clone());
                        path.pop();
                    }
                }
                ListType::Map(keys) => {
                    for item in items {
                        let Some(k) = item_key(item, &keys) else {
                            continue;
                        };
                        path.push(k);
                        out.insert(path.clone());
                        walk(item, path, fields, lt, out);
                        path.pop();
                    }
                }
            }
        }
        _ => {
            out.insert(path.clone());
        }
    }
}

/// The paths of the (non-empty) maps of an object (not the root, not
/// `metadata`, nothing inside atomic lists): what an update that creates or
/// removes them owns or disowns besides their fields, as
/// structured-merge-diff's comparison reports a map that appears or
/// disappears (the `"."` of FieldsV1). Empty maps are already leaves of
/// [`field_set`].
fn map_nodes(obj: &Value, lt: ListTypes<'_>) -> FieldSet {
    fn go(
        v: &Value,
        path: &mut Path,
        fields: &mut Vec<String>,
        lt: ListTypes<'_>,
        out: &mut FieldSet,
    ) {
        match v {
            Value::Object(m) if !m.is_empty() => {
                let is_meta = path.len() == 1 && path[0] == PathElement::Field("metadata".into());
                if !path.is_empty() && !is_meta {
                    out.insert(path.clone());
                }
                for (k, child) in m {
                    if child.is_null() || is_untracked(fields, k) {
                        continue;
                    }
                    path.push(PathElement::Field(k.clone()));
                    fields.push(k.clone());
                    go(child, path, fields, lt, out);
                    fields.pop();
                    path.pop();
                }
            }
            Value::Array(items) if !items.is_empty() => {
                if let ListType::Map(keys) = effective_list_type(items, resolve(lt, fields)) {
                    for item in items {
                        let Some(k) = item_key(item, &keys) else {
                            continue;
                        };
                        path.push(k);
                        if let Value::Object(m) = item {
                            for (f, child) in m {
                                if child.is_null() {
                                    continue;
                                }
                                path.push(PathElement::Field(f.clone()));
                                fields.push(f.clone());
                                go(child, path, fields, lt, out);
                                fields.pop();
                                path.pop();
                            }
                        }
                        path.pop();
                    }
                }
            }
            _ => {}
        }
    }
    let mut out = FieldSet::new();
    go(obj, &mut Vec::new(), &mut Vec::new(), lt, &mut out);
    out
}

/// Falls back to atomic when the items do not fit the declared type.
fn effective_list_type(items: &[Value], declared: ListType) -> ListType {
    match declared {
        ListType::Set if items.iter().any(|i| i.is_object() || i.is_array()) => ListType::Atomic,
        ListType::Map(keys) if items.iter().any(|i| item_key(i, &keys).is_none()) => {
            ListType::Atomic
        }
        other => other,
    }
}

/// The value at `path`, if present.
pub fn get_at<'v>(v: &'v Value, path: &[PathElement]) -> Option<&'v Value> {
    let mut cur = v;
    for pe in path {
        cur = match pe {
            PathElement::Field(f) => cur.as_object()?.get(f)?,
            PathElement::Key(kv) => cur.as_array()?.iter().find(|i| item_matches(i, kv))?,
            PathElement::Value(s) => cur.as_array()?.iter().find(|i| canonical_json(i) == *s)?,
            PathElement::Index(i) => cur.as_array()?.get(*i)?,
        };
    }
    Some(cur)
}

fn get_at_mut<'v>(v: &'v mut Value, path: &[PathElement]) -> Option<&'v mut Value> {
    let mut cur = v;
    for pe in path {
        cur = match pe {
            PathElement::Field(f) => cur.as_object_mut()?.get_mut(f)?,
            PathElement::Key(kv) => cur
                .as_array_mut()?
                .iter_mut()
                .find(|i| item_matches(i, kv))?,
            PathElement::Value(s) => cur
                .as_array_mut()?
                .iter_mut()
                .find(|i| canonical_json(i) == *s)?,
            PathElement::Index(i) => cur.as_array_mut()?.get_mut(*i)?,
        };
    }
    Some(cur)
}

fn remove_at(v: &mut Value, path: &[PathElement]) {
    let Some((last, parent_path)) = path.split_last() else {
        return;
    };
    let Some(parent) = get_at_mut(v, parent_path) else {
        return;
    };
    match (last, parent) {
        (PathElement::Field(f), Value::Object(m)) => {
            m.remove(f);
        }
        (PathElement::Key(kv), Value::Array(a)) => a.retain(|i| !item_matches(i, kv)),
        (PathElement::Value(s), Value::Array(a)) => a.retain(|i| canonical_json(i) != *s),
        (PathElement::Index(i), Value::Array(a)) if *i < a.len() => {
            a.remove(*i);
        }
        _ => {}
    }
}

fn has_descendant(set: &FieldSet, p: &Path) -> bool {
    set.range::<Path, _>((Bound::Excluded(p), Bound::Unbounded))
        .next()
        .is_some_and(|q| q.starts_with(p))
}

/// `p` itself or anything below it is in `set`.
fn covers(set: &FieldSet, p: &Path) -> bool {
    set.contains(p) || has_descendant(set, p)
}

/// Serialises a field set in the FieldsV1 format.
pub fn to_fields_v1(set: &FieldSet) -> Value {
    let mut root = Map::new();
    fn insert(node: &mut Map<String, Value>, path: &[PathElement]) {
        match path.split_first() {
            None => {
                node.insert(".".to_string(), Value::Object(Map::new()));
            }
            Some((pe, rest)) => {
                let entry = node
                    .entry(pe.fields_v1_key())
                    .or_insert_with(|| Value::Object(Map::new()));
                if let Value::Object(next) = entry {
                    insert(next, rest);
                }
            }
        }
    }
    for p in set {
        insert(&mut root, p);
    }
    fn finish(m: &mut Map<String, Value>) {
        for (k, v) in m.iter_mut() {
            if k == "." {
                continue;
            }
            if let Value::Object(child) = v {
                if child.len() == 1 && child.contains_key(".") {
                    child.clear();
                } else {
                    finish(child);
                }
            }
        }
    }
    finish(&mut root);
    Value::Object(root)
}

/// Parses a FieldsV1 trie; unknown keys are skipped.
pub fn from_fields_v1(v: &Value) -> FieldSet {
    fn go(node: &Map<String, Value>, path: &mut Path, out: &mut FieldSet) {
        if !path.is_empty() && (node.is_empty() || node.contains_key(".")) {
            out.insert(path.clone());
        }
        for (k, child) in node {
            if k == "." {
                continue;
            }
            let (Some(pe), Some(cm)) = (PathElement::parse_fields_v1_key(k), child.as_object())
            else {
                continue;
            };
            path.push(pe);
            go(cm, path, out);
            path.pop();
        }
    }
    let mut out = FieldSet::new();
    if let Some(m) = v.as_object() {
        go(m, &mut Vec::new(), &mut out);
    }
    out
}

/// One entry of `metadata.managedFields`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagedFieldsEntry {
    /// The field manager name.
    pub manager: String,
    /// `Apply` or `Update`.
    pub operation: String,
    /// The API version the fields were recorded in.
    pub api_version: String,
    /// RFC 3339 time of the last change.
    pub time: String,
    /// `status`, `scale`, ... or empty for the main resource.
    pub subresource: String,
    /// The owned fields.
    pub fields: FieldSet,
}

impl ManagedFieldsEntry {
    fn from_value(v: &Value) -> Option<Self> {
        let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
        let manager = s("manager");
        let operation = s("operation");
        if operation.is_empty() {
            return None;
        }
        Some(ManagedFieldsEntry {
            manager,
            operation,
            api_version: s("apiVersion"),
            time: s("time"),
            subresource: s("subresource"),
            fields: v.get("fieldsV1").map(from_fields_v1).unwrap_or_default(),
        })
    }

    /// The entry as stored in `metadata.managedFields`.
    pub fn to_value(&self) -> Value {
        let mut m = Map::new();
        m.insert("manager".into(), json!(self.manager));
        m.insert("operation".into(), json!(self.operation));
        m.insert("apiVersion".into(), json!(self.api_version));
        if !self.time.is_empty() {
            m.insert("time".into(), json!(self.time));
        }
        m.insert("fieldsType".into(), json!("FieldsV1"));
        m.insert("fieldsV1".into(), to_fields_v1(&self.fields));
        if !self.subresource.is_empty() {
            m.insert("subresource".into(), json!(self.subresource));
        }
        Value::Object(m)
    }

    fn is(&self, manager: &str, operation: &str, api_version: &str, subresource: &str) -> bool {
        self.manager == manager
            && self.operation == operation
            && self.subresource == subresource
            && (operation == "Apply" || self.api_version == api_version)
    }
}

/// Reads `metadata.managedFields` of an object (malformed entries are skipped).
pub fn managed_fields(obj: &Value) -> Vec<ManagedFieldsEntry> {
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(ManagedFieldsEntry::from_value)
                .collect()
        })
        .unwrap_or_default()
}

fn set_managed_fields(obj: &mut Value, entries: &[ManagedFieldsEntry]) {
    if !obj.is_object() {
        return;
    }
    let Some(root) = obj.as_object_mut() else {
        return;
    };
    let meta = root
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    let Some(meta) = meta.as_object_mut() else {
        return;
    };
    let live: Vec<Value> = entries
        .iter()
        .filter(|e| !e.fields.is_empty())
        .map(ManagedFieldsEntry::to_value)
        .collect();
    if live.is_empty() {
        meta.remove("managedFields");
    } else {
        meta.insert("managedFields".into(), Value::Array(live));
    }
}

/// A failed apply: the fields other managers own and the apply would change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApplyConflict {
    /// (other manager, field path like `.spec.replicas`), in a stable order.
    pub conflicts: Vec<(String, String)>,
}

impl ApplyConflict {
    /// The 409 message, e.g.
    /// `Apply failed with 1 conflict: conflict with "other-manager": .spec.foo`.
    pub fn message(&self) -> String {
        match self.conflicts.as_slice() {
            [(m, p)] => format!("Apply failed with 1 conflict: conflict with {m:?}: {p}"),
            all => {
                let mut by_manager: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
                for (m, p) in all {
                    by_manager.entry(m).or_default().push(p);
                }
                let mut s = format!("Apply failed with {} conflicts: conflicts with", all.len());
                if by_manager.len() == 1 {
                    for (m, paths) in &by_manager {
                        s.push_str(&format!(" {m:?}"));
                        for p in paths {
                            s.push_str(&format!("\n- {p}"));
                        }
                    }
                } else {
                    for (m, paths) in &by_manager {
                        s.push_str(&format!("\n{m:?}:"));
                        for p in paths {
                            s.push_str(&format!("\n- {p}"));
                        }
                    }
                }
                s
            }
        }
    }

    /// `Status.details.causes` for the 409 response.
    pub fn causes(&self) -> Vec<Value> {
        self.conflicts
            .iter()
            .map(|(m, p)| json!({"type": "FieldManagerConflict", "message": format!("conflict with {m:?}"), "field": p}))
            .collect()
    }
}

impl fmt::Display for ApplyConflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message())
    }
}

impl std::error::Error for ApplyConflict {}

fn without_managed_fields(v: &Value) -> Value {
    let mut out = v.clone();
    if let Some(meta) = out.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.remove("managedFields");
    }
    out
}

fn strip_nulls(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(_, v)| !v.is_null())
                .map(|(k, v)| (k.clone(), strip_nulls(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_nulls).collect()),
        other => other.clone(),
    }
}

fn merge_applied(live: &mut Value, applied: &Value, fields: &mut Vec<String>, lt: ListTypes<'_>) {
    match (live, applied) {
        (Value::Object(lm), Value::Object(am)) => {
            for (k, av) in am {
                if av.is_null() {
                    continue;
                }
                if fields.len() == 1
                    && fields[0] == "metadata"
                    && SERVER_OWNED_METADATA.contains(&k.as_str())
                {
                    continue;
                }
                match lm.get_mut(k) {
                    Some(lv) => {
                        fields.push(k.clone());
                        merge_applied(lv, av, fields, lt);
                        fields.pop();
                    }
                    None => {
                        lm.insert(k.clone(), strip_nulls(av));
                    }
                }
            }
        }
        (Value::Array(ll), Value::Array(al)) => {
            let declared = resolve(lt, fields);
            let lt_live = effective_list_type(ll, declared.clone());
            match effective_list_type(al, declared) {
                ListType::Set if lt_live == ListType::Set => {
                    let pe = |v: &Value| Some(PathElement::Value(canonical_json(v)));
                    let lhs = std::mem::take(ll);
                    *ll = merge_list_items(lhs, al, pe, |_, r| strip_nulls(r));
                }
                ListType::Map(keys) if matches!(lt_live, ListType::Map(_)) => {
                    let pe = |v: &Value| item_key(v, &keys);
                    let lhs = std::mem::take(ll);
                    *ll = merge_list_items(lhs, al, pe, |l, r| match l {
                        Some(mut l) => {
                            merge_applied(&mut l, r, fields, lt);
                            l
                        }
                        None => strip_nulls(r),
                    });
                }
                _ => *ll = al.iter().map(strip_nulls).collect(),
            }
        }
        (l, a) => *l = strip_nulls(a),
    }
}

/// Merges the items of a keyed list or set like structured-merge-diff's
/// `visitListItems`: items are matched by path element, applied (rhs) items
/// keep their relative order, live-only (lhs) items stay where they were
/// relative to the shared ones.
fn merge_list_items(
    lhs: Vec<Value>,
    rhs: &[Value],
    pe_of: impl Fn(&Value) -> Option<PathElement>,
    mut merge: impl FnMut(Option<Value>, &Value) -> Value,
) -> Vec<Value> {
    use std::collections::{HashMap, HashSet, VecDeque};
    let lhs_pes: Vec<Option<PathElement>> = lhs.iter().map(&pe_of).collect();
    let rhs_pes: Vec<Option<PathElement>> = rhs.iter().map(&pe_of).collect();
    let mut observed_lhs: HashMap<&PathElement, usize> = HashMap::new();
    for (i, pe) in lhs_pes.iter().enumerate() {
        if let Some(pe) = pe {
            observed_lhs.entry(pe).or_insert(i);
        }
    }
    let observed_rhs: HashSet<&PathElement> = rhs_pes.iter().flatten().collect();
    let mut shared: VecDeque<&PathElement> = rhs_pes
        .iter()
        .flatten()
        .filter(|pe| observed_lhs.contains_key(pe))
        .collect();
    let mut next_shared = shared.pop_front();
    let mut merged_rhs: HashSet<&PathElement> = HashSet::new();
    let mut out = Vec::with_capacity(lhs.len() + rhs.len());
    let (mut li, mut ri) = (0, 0);
    while li < lhs.len() || ri < rhs.len() {
        if li < lhs.len() && ri < rhs.len() {
            if let (Some(l), Some(r)) = (&lhs_pes[li], &rhs_pes[ri])
                && l == r
            {
                merged_rhs.insert(r);
                out.push(merge(Some(lhs[li].clone()), &rhs[ri]));
                li += 1;
                ri += 1;
                next_shared = shared.pop_front();
                continue;
            }
            if let Some(l) = &lhs_pes[li]
                && observed_rhs.contains(l)
                && next_shared.is_some_and(|n| n != l)
            {
                li += 1;
                continue;
            }
        }
        if li < lhs.len() {
            match &lhs_pes[li] {
                Some(l) if observed_rhs.contains(l) => {
                    if merged_rhs.contains(l) {
                        li += 1;
                        continue;
                    }
                }
                _ => {
                    out.push(lhs[li].clone());
                    li += 1;
                    continue;
                }
            }
        }
        if ri < rhs.len() {
            let lchild = rhs_pes[ri].as_ref().and_then(|pe| {
                merged_rhs.insert(pe);
                observed_lhs.get(pe).map(|&i| lhs[i].clone())
            });
            out.push(merge(lchild, &rhs[ri]));
            if let (Some(n), Some(pe)) = (next_shared, &rhs_pes[ri])
                && n == pe
            {
                next_shared = shared.pop_front();
            }
            ri += 1;
        }
    }
    out
}

/// Which part of an object a request may change, for kinds with a `status`
/// subresource (the API server's "reset fields").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scope {
    /// The whole object (kinds without a status subresource).
    #[default]
    All,
    /// The main resource of a kind with a status subresource: `.status` in the
    /// applied configuration is ignored.
    MainResource,
    /// The `status` subresource: only `.status` of the applied configuration counts.
    Status,
}

/// Everything [`apply_with`] needs besides the objects.
pub struct ApplyOptions<'a> {
    /// The field manager (`?fieldManager=`).
    pub manager: &'a str,
    /// `?force=true`.
    pub force: bool,
    /// Timestamp recorded in the manager's entry.
    pub now_rfc3339: &'a str,
    /// API version of the request, recorded in the entry.
    pub api_version: &'a str,
    /// Main resource or status subresource (entries are kept per subresource).
    pub scope: Scope,
    /// List types; `None` = the built-in table for the object's kind.
    pub list_types: Option<ListTypes<'a>>,
}

/// The applied configuration restricted to what `scope` may change.
fn scoped(applied: &Value, scope: Scope) -> Value {
    let Some(m) = applied.as_object() else {
        return applied.clone();
    };
    let keep = |k: &str| match scope {
        Scope::All => true,
        Scope::MainResource => k != "status",
        Scope::Status => matches!(k, "apiVersion" | "kind" | "status") || k == "metadata",
    };
    let mut out: Map<String, Value> = m
        .iter()
        .filter(|(k, _)| keep(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if scope == Scope::Status
        && let Some(Value::Object(meta)) = out.get_mut("metadata")
    {
        // Only the identifying fields; labels etc. belong to the main resource.
        meta.retain(|k, _| UNTRACKED_METADATA.contains(&k.as_str()));
    }
    Value::Object(out)
}

/// The manager name Kubernetes gives to fields that existed before the first
/// server-side apply to an object without managedFields.
pub const BEFORE_FIRST_APPLY: &str = "before-first-apply";

/// Server-side apply with the built-in list types of `applied.kind`, on the
/// whole object.
///
/// `live` is the stored object (`None` on create). Returns the new object,
/// including the updated `metadata.managedFields`.
pub fn apply(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    now_rfc3339: &str,
    api_version: &str,
) -> Result<Value, ApplyConflict> {
    apply_with(
        live,
        applied,
        &ApplyOptions {
            manager,
            force,
            now_rfc3339,
            api_version,
            scope: Scope::All,
            list_types: None,
        },
    )
}

/// [`apply`] with a caller-supplied list-type resolver (e.g.
/// [`crate::schema::StructuralSchema::list_type_at`] for custom resources).
pub fn apply_with_list_types(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    now_rfc3339: &str,
    api_version: &str,
    lt: ListTypes<'_>,
) -> Result<Value, ApplyConflict> {
    apply_with(
        live,
        applied,
        &ApplyOptions {
            manager,
            force,
            now_rfc3339,
            api_version,
            scope: Scope::All,
            list_types: Some(lt),
        },
    )
}

/// The general form of [`apply`]: scope (main resource / status subresource)
/// and list types configurable.
///
/// With [`Scope::Status`] the result still contains the live `spec` etc.
/// unchanged; with [`Scope::MainResource`] the live `status` is kept.
pub fn apply_with(
    live: Option<&Value>,
    applied: &Value,
    opts: &ApplyOptions<'_>,
) -> Result<Value, ApplyConflict> {
    let kind = applied
        .get("kind")
        .and_then(Value::as_str)
        .or_else(|| live.and_then(|l| l.get("kind")).and_then(Value::as_str))
        .unwrap_or("")
        .to_string();
    let builtin = move |p: &[&str]| list_type(&kind, p);
    let lt: ListTypes<'_> = opts.list_types.unwrap_or(&builtin);
    let manager = opts.manager;
    let api_version = opts.api_version;
    let subresource = if opts.scope == Scope::Status {
        "status"
    } else {
        ""
    };
    let applied = &scoped(applied, opts.scope);

    let empty = Value::Object(Map::new());
    let live_obj = live.unwrap_or(&empty);
    let mut entries = managed_fields(live_obj);
    if live.is_some() && entries.is_empty() {
        // As Kubernetes: fields of an object nobody tracked yet are owned by
        // `before-first-apply`, so the first apply cannot silently change them.
        let fields = field_set(live_obj, lt);
        if !fields.is_empty() {
            entries.push(ManagedFieldsEntry {
                manager: BEFORE_FIRST_APPLY.into(),
                operation: "Update".into(),
                api_version: api_version.into(),
                time: opts.now_rfc3339.into(),
                subresource: String::new(),
                fields,
            });
        }
    }
    let s_new = field_set(applied, lt);
    let own_idx = entries
        .iter()
        .position(|e| e.is(manager, "Apply", api_version, subresource));
    let s_old = own_idx
        .map(|i| entries[i].fields.clone())
        .unwrap_or_default();

    // Conflicts: paths others own whose value the apply would change.
    let changes = |p: &Path| -> bool {
        if has_descendant(&s_new, p) {
            get_at(live_obj, p).is_none()
        } else {
            get_at(live_obj, p) != get_at(applied, p)
        }
    };
    let mut conflicts: Vec<(usize, Path)> = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if e.manager == manager {
            continue;
        }
        for p in s_new.intersection(&e.fields) {
            if changes(p) {
                conflicts.push((i, p.clone()));
            }
        }
    }
    if !conflicts.is_empty() {
        if !opts.force {
            let mut list: Vec<(String, String)> = conflicts
                .iter()
                .map(|(i, p)| (entries[*i].manager.clone(), path_string(p)))
                .collect();
            list.dedup();
            return Err(ApplyConflict { conflicts: list });
        }
        for (i, p) in &conflicts {
            let e = &mut entries[*i];
            e.fields.remove(p);
            // Children of a forced path (e.g. an atomic value taken over) go too.
            e.fields.retain(|q| !q.starts_with(p));
        }
    }

    // Fields this manager stopped applying and nobody else owns are removed.
    let others: FieldSet = entries
        .iter()
        .filter(|e| !e.is(manager, "Apply", api_version, subresource))
        .flat_map(|e| e.fields.iter().cloned())
        .collect();
    let mut result = live_obj.clone();
    let owned: FieldSet = others.union(&s_new).cloned().collect();
    for p in s_old.difference(&s_new) {
        if covers(&s_new, p) || covers(&others, p) {
            continue;
        }
        remove_at(&mut result, p);
        // A map left empty goes too, unless a manager owns the map itself
        // (an update created it): then, as in structured-merge-diff, it
        // stays, as `null` (which a schema may refuse; the API server drops
        // it from built-in types).
        let mut parent = &p[..p.len() - 1];
        while !parent.is_empty() {
            if !get_at(&result, parent).is_some_and(|v| v.as_object().is_some_and(Map::is_empty)) {
                break;
            }
            if owned.contains(parent) {
                if let Some(v) = get_at_mut(&mut result, parent) {
                    *v = Value::Null;
                }
                break;
            }
            remove_at(&mut result, parent);
            parent = &parent[..parent.len() - 1];
        }
    }
    if !result.is_object() {
        result = Value::Object(Map::new());
    }
    merge_applied(&mut result, applied, &mut Vec::new(), lt);

    // As Kubernetes: a no-op apply keeps the entry's time, so an unchanged
    // object stays byte-identical and the server can skip the write.
    let time = match own_idx {
        Some(i) if without_managed_fields(&result) == without_managed_fields(live_obj) => {
            entries[i].time.clone()
        }
        _ => opts.now_rfc3339.to_string(),
    };
    let own = ManagedFieldsEntry {
        manager: manager.to_string(),
        operation: "Apply".into(),
        api_version: api_version.to_string(),
        time,
        subresource: subresource.to_string(),
        fields: s_new,
    };
    match own_idx {
        Some(i) => entries[i] = own,
        None => entries.push(own),
    }
    set_managed_fields(&mut result, &entries);
    Ok(result)
}

/// Records a create/update/patch by `manager` in `new`'s `metadata.managedFields`,
/// with the built-in list types of the object's kind.
pub fn record_update(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    now_rfc3339: &str,
    api_version: &str,
) {
    let kind = new
        .get("kind")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let lt = move |p: &[&str]| list_type(&kind, p);
    record_update_with(old, new, manager, now_rfc3339, api_version, "", &lt);
}

/// [`record_update`] for a subresource (`"status"`, or `""` for the main
/// resource) and with a caller-supplied list-type resolver.
pub fn record_update_with(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    now_rfc3339: &str,
    api_version: &str,
    subresource: &str,
    lt: ListTypes<'_>,
) {
    let empty = Value::Object(Map::new());
    let old_obj = old.unwrap_or(&empty);
    let old_entries = managed_fields(old_obj);
    let requested = new.pointer("/metadata/managedFields").cloned();
    let mut entries = match &requested {
        Some(Value::Array(a)) if a.len() == 1 && a[0].as_object().is_some_and(Map::is_empty) => {
            // `[{}]`: the client asks to strip managedFields.
            set_managed_fields(new, &[]);
            return;
        }
        Some(Value::Array(a))
            if !a.is_empty()
                && old_obj.pointer("/metadata/managedFields") != requested.as_ref() =>
        {
            a.iter()
                .filter_map(ManagedFieldsEntry::from_value)
                .collect()
        }
        _ => old_entries,
    };

    let s_old = field_set(old_obj, lt);
    let s_new = field_set(new, lt);
    let mut changed: FieldSet = s_new
        .iter()
        .filter(|p| {
            if !s_old.contains(*p) {
                return true;
            }
            !has_descendant(&s_new, p) && get_at(old_obj, p) != get_at(new, p)
        })
        .cloned()
        .collect();
    let mut removed: FieldSet = s_old.difference(&s_new).cloned().collect();
    // Maps that appear are owned by the updater too, maps that disappear
    // are disowned (structured-merge-diff's comparison reports map nodes).
    let (n_old, n_new) = (map_nodes(old_obj, lt), map_nodes(new, lt));
    changed.extend(
        n_new
            .iter()
            .filter(|p| get_at(old_obj, p).is_none())
            .cloned(),
    );
    removed.extend(n_old.iter().filter(|p| get_at(new, p).is_none()).cloned());

    let own_idx = entries
        .iter()
        .position(|e| e.is(manager, "Update", api_version, subresource));
    for (i, e) in entries.iter_mut().enumerate() {
        if Some(i) == own_idx {
            continue;
        }
        e.fields
            .retain(|p| !changed.contains(p) && !removed.contains(p));
    }
    match own_idx {
        Some(i) => {
            let e = &mut entries[i];
            e.fields.retain(|p| !removed.contains(p));
            if !changed.is_empty() {
                e.fields.extend(changed);
                e.time = now_rfc3339.to_string();
            }
        }
        None if !changed.is_empty() => entries.push(ManagedFieldsEntry {
            manager: manager.to_string(),
            operation: "Update".into(),
            api_version: api_version.to_string(),
            time: now_rfc3339.to_string(),
            subresource: subresource.to_string(),
            fields: changed,
        }),
        None => {}
    }
    set_managed_fields(new, &entries);
}

#[cfg(test)]
mod tests {
    use super::*;

    const T0: &str = "2026-01-01T00:00:00Z";
    const T1: &str = "2026-01-01T00:01:00Z";

    fn cm(data: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "kd"}, "data": data})
    }

    fn entry<'v>(obj: &'v Value, manager: &str) -> Option<&'v Value> {
        obj.pointer("/metadata/managedFields")?
            .as_array()?
            .iter()
            .find(|e| e["manager"] == manager)
    }

    #[test]
    fn create_records_apply_entry_in_fields_v1() {
        let applied = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "kd", "labels": {"app": "x"}}, "data": {"a": "1"}});
        let out = apply(None, &applied, "ctl", false, T0, "v1").expect("no conflicts");
        assert_eq!(out["data"], json!({"a": "1"}));
        assert_eq!(out["metadata"]["name"], "c");
        let e = entry(&out, "ctl").expect("entry");
        assert_eq!(e["operation"], "Apply");
        assert_eq!(e["apiVersion"], "v1");
        assert_eq!(e["time"], T0);
        assert_eq!(e["fieldsType"], "FieldsV1");
        assert_eq!(
            e["fieldsV1"],
            json!({"f:data": {"f:a": {}}, "f:metadata": {"f:labels": {"f:app": {}}}})
        );
    }

    #[test]
    fn fields_no_longer_applied_are_removed() {
        let live = apply(
            None,
            &cm(json!({"a": "1", "b": "2"})),
            "ctl",
            false,
            T0,
            "v1",
        )
        .expect("create");
        let out =
            apply(Some(&live), &cm(json!({"a": "1"})), "ctl", false, T1, "v1").expect("apply");
        assert_eq!(out["data"], json!({"a": "1"}));
        assert_eq!(
            entry(&out, "ctl").expect("entry")["fieldsV1"],
            json!({"f:data": {"f:a": {}}})
        );
    }

    #[test]
    fn removal_keeps_fields_other_managers_own() {
        let live = apply(
            None,
            &cm(json!({"a": "1", "b": "2"})),
            "ctl",
            false,
            T0,
            "v1",
        )
        .expect("create");
        // Another manager co-owns b with the same value.
        let live = apply(
            Some(&live),
            &cm(json!({"b": "2"})),
            "other",
            false,
            T0,
            "v1",
        )
        .expect("shared");
        let out =
            apply(Some(&live), &cm(json!({"a": "1"})), "ctl", false, T1, "v1").expect("apply");
        assert_eq!(out["data"], json!({"a": "1", "b": "2"}));
        // Fields set by an Update manager are not removed either.
        let mut upd = out.clone();
        upd["data"]["c"] = json!("3");
        record_update(Some(&out), &mut upd, "kubectl-edit", T1, "v1");
        let out2 =
            apply(Some(&upd), &cm(json!({"a": "1"})), "ctl", false, T1, "v1").expect("apply");
        assert_eq!(out2["data"]["c"], "3");
    }

    #[test]
    fn conflict_with_other_manager_and_message() {
        let live = apply(
            None,
            &cm(json!({"a": "1"})),
            "other-manager",
            false,
            T0,
            "v1",
        )
        .expect("create");
        let e = apply(Some(&live), &cm(json!({"a": "2"})), "ctl", false, T1, "v1")
            .expect_err("conflict");
        assert_eq!(
            e.conflicts,
            vec![("other-manager".to_string(), ".data.a".to_string())]
        );
        assert_eq!(
            e.message(),
            r#"Apply failed with 1 conflict: conflict with "other-manager": .data.a"#
        );
        assert_eq!(e.causes()[0]["field"], ".data.a");
    }

    #[test]
    fn multiple_conflicts_message() {
        let live = apply(
            None,
            &cm(json!({"a": "1", "b": "1"})),
            "m1",
            false,
            T0,
            "v1",
        )
        .expect("create");
        let e = apply(
            Some(&live),
            &cm(json!({"a": "2", "b": "2"})),
            "ctl",
            false,
            T1,
            "v1",
        )
        .expect_err("conflict");
        assert_eq!(
            e.message(),
            "Apply failed with 2 conflicts: conflicts with \"m1\"\n- .data.a\n- .data.b"
        );
        let live = apply(Some(&live), &cm(json!({"c": "1"})), "m2", false, T0, "v1").expect("m2");
        let e = apply(
            Some(&live),
            &cm(json!({"a": "2", "c": "2"})),
            "ctl",
            false,
            T1,
            "v1",
        )
        .expect_err("conflict");
        assert_eq!(
            e.message(),
            "Apply failed with 2 conflicts: conflicts with\n\"m1\":\n- .data.a\n\"m2\":\n- .data.c"
        );
    }

    #[test]
    fn force_moves_ownership() {
        let live = apply(
            None,
            &cm(json!({"a": "1", "b": "1"})),
            "other",
            false,
            T0,
            "v1",
        )
        .expect("create");
        let out =
            apply(Some(&live), &cm(json!({"a": "2"})), "ctl", true, T1, "v1").expect("forced");
        assert_eq!(out["data"], json!({"a": "2", "b": "1"}));
        assert_eq!(
            entry(&out, "ctl").expect("ctl")["fieldsV1"],
            json!({"f:data": {"f:a": {}}})
        );
        assert_eq!(
            entry(&out, "other").expect("other")["fieldsV1"],
            json!({"f:data": {"f:b": {}}})
        );
        // The previous owner now conflicts in turn.
        let e = apply(
            Some(&out),
            &cm(json!({"a": "1", "b": "1"})),
            "other",
            false,
            T1,
            "v1",
        )
        .expect_err("conflict");
        assert_eq!(
            e.conflicts,
            vec![("ctl".to_string(), ".data.a".to_string())]
        );
        // When a manager loses all its fields, its entry disappears.
        let out = apply(
            Some(&live),
            &cm(json!({"a": "2", "b": "2"})),
            "ctl",
            true,
            T1,
            "v1",
        )
        .expect("forced");
        assert!(entry(&out, "other").is_none());
    }

    #[test]
    fn same_value_is_shared_ownership() {
        let live = apply(None, &cm(json!({"a": "1"})), "other", false, T0, "v1").expect("create");
        let out = apply(Some(&live), &cm(json!({"a": "1"})), "ctl", false, T1, "v1")
            .expect("no conflict");
        assert_eq!(
            entry(&out, "ctl").expect("ctl")["fieldsV1"],
            json!({"f:data": {"f:a": {}}})
        );
        assert_eq!(
            entry(&out, "other").expect("other")["fieldsV1"],
            json!({"f:data": {"f:a": {}}})
        );
        // Now ctl stops applying it: other still owns it, so it stays.
        let out = apply(Some(&out), &cm(json!({"z": "9"})), "ctl", false, T1, "v1").expect("apply");
        assert_eq!(out["data"], json!({"a": "1", "z": "9"}));
    }

    fn svc(ports: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "kd"},
               "spec": {"ports": ports}})
    }

    #[test]
    fn keyed_lists_use_k_elements_and_merge_per_item() {
        let live = apply(
            None,
            &svc(json!([{"port": 80, "targetPort": 8080}])),
            "ctl",
            false,
            T0,
            "v1",
        )
        .expect("create");
        assert_eq!(
            entry(&live, "ctl").expect("e")["fieldsV1"],
            json!({"f:spec": {"f:ports": {"k:{\"port\":80,\"protocol\":\"TCP\"}": {".": {}, "f:port": {}, "f:targetPort": {}}}}})
        );
        // A second manager adds a port; both coexist.
        let live = apply(
            Some(&live),
            &svc(json!([{"port": 443, "protocol": "TCP", "name": "https"}])),
            "other",
            false,
            T0,
            "v1",
        )
        .expect("other");
        assert_eq!(live["spec"]["ports"].as_array().expect("ports").len(), 2);
        // Conflict on an item field: path names the key.
        let e = apply(
            Some(&live),
            &svc(json!([{"port": 80, "targetPort": 9090}, {"port": 443, "name": "tls"}])),
            "ctl",
            false,
            T1,
            "v1",
        )
        .expect_err("conflict");
        assert_eq!(
            e.conflicts,
            vec![(
                "other".to_string(),
                r#".spec.ports[port=443,protocol="TCP"].name"#.to_string()
            )]
        );
        // ctl drops its port: removed, other's stays.
        let out = apply(
            Some(&live),
            &svc(json!([{"port": 443, "protocol": "TCP", "name": "https"}])),
            "ctl",
            false,
            T1,
            "v1",
        )
        .expect("apply");
        assert_eq!(
            out["spec"]["ports"],
            json!([{"port": 443, "protocol": "TCP", "name": "https"}])
        );
    }

    #[test]
    fn nested_maps_and_containers() {
        let dep = |image: &str, env: Value| {
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
                   "spec": {"replicas": 1, "template": {"spec": {"containers": [{"name": "app", "image": image, "env": env}]}}}})
        };
        let live = apply(
            None,
            &dep(
                "a:1",
                json!([{"name": "X", "value": "1"}, {"name": "Y", "value": "2"}]),
            ),
            "ctl",
            false,
            T0,
            "apps/v1",
        )
        .expect("create");
        let out = apply(
            Some(&live),
            &dep("a:2", json!([{"name": "X", "value": "1"}])),
            "ctl",
            false,
            T1,
            "apps/v1",
        )
        .expect("apply");
        let c = &out["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(c["image"], "a:2");
        assert_eq!(c["env"], json!([{"name": "X", "value": "1"}]));
        let f = &entry(&out, "ctl").expect("e")["fieldsV1"];
        assert!(f["f:spec"]["f:template"]["f:spec"]["f:containers"]["k:{\"name\":\"app\"}"]["f:env"]["k:{\"name\":\"X\"}"].is_object(), "{f}");
        // HPA-style manager takes replicas via Update; ctl applying another value conflicts.
        let mut scaled = out.clone();
        scaled["spec"]["replicas"] = json!(5);
        record_update(Some(&out), &mut scaled, "hpa", T1, "apps/v1");
        let e = apply(
            Some(&scaled),
            &dep("a:2", json!([{"name": "X", "value": "1"}])),
            "ctl",
            false,
            T1,
            "apps/v1",
        )
        .expect_err("replicas conflict");
        assert_eq!(
            e.message(),
            r#"Apply failed with 1 conflict: conflict with "hpa": .spec.replicas"#
        );
    }

    #[test]
    fn atomic_lists_are_owned_whole() {
        let es = |addrs: Value| {
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {"name": "e"},
                   "addressType": "IPv4", "endpoints": [{"addresses": addrs}]})
        };
        let live = apply(
            None,
            &es(json!(["10.0.0.1"])),
            "ctl",
            false,
            T0,
            "discovery.k8s.io/v1",
        )
        .expect("create");
        assert_eq!(
            entry(&live, "ctl").expect("e")["fieldsV1"],
            json!({"f:addressType": {}, "f:endpoints": {}})
        );
        let out = apply(
            Some(&live),
            &es(json!(["10.0.0.2"])),
            "ctl",
            false,
            T1,
            "discovery.k8s.io/v1",
        )
        .expect("apply");
        assert_eq!(out["endpoints"], json!([{"addresses": ["10.0.0.2"]}]));
        let e = apply(
            Some(&out),
            &es(json!(["10.0.0.3"])),
            "other",
            false,
            T1,
            "discovery.k8s.io/v1",
        )
        .expect_err("atomic conflict");
        assert_eq!(
            e.conflicts,
            vec![("ctl".to_string(), ".endpoints".to_string())]
        );
    }

    #[test]
    fn keyed_list_order_follows_structured_merge_diff() {
        // Live [80, 443, 8080]; another manager applies [8080, 9000]: 8080 is
        // shared, 9000 is new and follows it; live-only items keep their place.
        let live = apply(
            None,
            &svc(json!([{"port": 80}, {"port": 443}, {"port": 8080}])),
            "a",
            false,
            T0,
            "v1",
        )
        .expect("create");
        let out = apply(
            Some(&live),
            &svc(json!([{"port": 8080}, {"port": 9000}])),
            "b",
            false,
            T1,
            "v1",
        )
        .expect("apply");
        let ports: Vec<&Value> = out["spec"]["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .map(|p| &p["port"])
            .collect();
        assert_eq!(ports, vec![80, 443, 8080, 9000]);
        // Applied order wins among shared items; the live-only 8080 is emitted
        // as soon as the walk passes it (SMD's interleave), before 80.
        let out = apply(
            Some(&live),
            &svc(json!([{"port": 443}, {"port": 80}])),
            "b",
            false,
            T1,
            "v1",
        )
        .expect("apply");
        let ports: Vec<&Value> = out["spec"]["ports"]
            .as_array()
            .expect("ports")
            .iter()
            .map(|p| &p["port"])
            .collect();
        assert_eq!(ports, vec![443, 8080, 80]);
    }

    #[test]
    fn finalizers_are_a_set() {
        let obj = |f: Value| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "finalizers": f}});
        let live = apply(None, &obj(json!(["a"])), "m1", false, T0, "v1").expect("create");
        let live = apply(Some(&live), &obj(json!(["b"])), "m2", false, T0, "v1").expect("m2");
        assert_eq!(live["metadata"]["finalizers"], json!(["a", "b"]));
        assert_eq!(
            entry(&live, "m2").expect("e")["fieldsV1"],
            json!({"f:metadata": {"f:finalizers": {"v:\"b\"": {}}}})
        );
        let out = apply(Some(&live), &obj(json!([])), "m1", false, T1, "v1").expect("m1 drops a");
        assert_eq!(out["metadata"]["finalizers"], json!(["b"]));
    }

    #[test]
    fn untracked_metadata_is_not_owned_and_not_overwritten() {
        let live = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "kd", "uid": "u1", "resourceVersion": "7", "creationTimestamp": T0}});
        let applied = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "c", "namespace": "kd", "uid": "forged", "resourceVersion": "1"}, "data": {"a": "1"}});
        let out = apply(Some(&live), &applied, "ctl", false, T1, "v1").expect("apply");
        assert_eq!(out["metadata"]["uid"], "u1");
        assert_eq!(out["metadata"]["resourceVersion"], "7");
        assert_eq!(
            entry(&out, "ctl").expect("e")["fieldsV1"],
            json!({"f:data": {"f:a": {}}})
        );
    }

    #[test]
    fn record_update_takes_changed_fields_from_others() {
        let live = apply(
            None,
            &cm(json!({"a": "1", "b": "1"})),
            "ctl",
            false,
            T0,
            "v1",
        )
        .expect("create");
        let mut new = live.clone();
        new["data"]["a"] = json!("2");
        new["data"]["c"] = json!("3");
        new["data"].as_object_mut().expect("data").remove("b");
        record_update(Some(&live), &mut new, "kubectl-edit", T1, "v1");
        let e = entry(&new, "kubectl-edit").expect("update entry");
        assert_eq!(e["operation"], "Update");
        assert_eq!(e["time"], T1);
        assert_eq!(e["fieldsV1"], json!({"f:data": {"f:a": {}, "f:c": {}}}));
        // ctl lost a (changed) and b (removed): nothing left -> entry dropped.
        assert!(entry(&new, "ctl").is_none(), "{new}");
        // Unchanged update keeps ownership and time.
        let mut same = new.clone();
        record_update(Some(&new), &mut same, "someone", T1, "v1");
        assert!(entry(&same, "someone").is_none());
        assert_eq!(
            same["metadata"]["managedFields"],
            new["metadata"]["managedFields"]
        );
    }

    #[test]
    fn record_update_on_create_and_status_subresource() {
        let mut obj = cm(json!({"a": "1"}));
        record_update(None, &mut obj, "kubectl-create", T0, "v1");
        // The map the update created is owned too (`.`), as on the API server.
        assert_eq!(
            entry(&obj, "kubectl-create").expect("e")["fieldsV1"],
            json!({"f:data": {".": {}, "f:a": {}}})
        );
        let mut st = obj.clone();
        st["status"] = json!({"phase": "Ready"});
        let lt = |_: &[&str]| ListType::Atomic;
        record_update_with(Some(&obj), &mut st, "ctl", T1, "v1", "status", &lt);
        let e = entry(&st, "ctl").expect("status entry");
        assert_eq!(e["subresource"], "status");
        assert_eq!(e["fieldsV1"], json!({"f:status": {".": {}, "f:phase": {}}}));
    }

    /// As structured-merge-diff: a map emptied by an applier's field removal
    /// goes when nobody owns it, and stays as `null` when an update created
    /// (owns) it.
    #[test]
    fn emptied_maps_go_unless_owned() {
        let obj = |extra: Value| {
            json!({"apiVersion": "test.io/v1", "kind": "Gizmo",
                   "metadata": {"name": "g", "namespace": "kd"},
                   "spec": {"size": 3, "extra": extra}})
        };
        let lt = |_: &[&str]| ListType::Atomic;
        let apply = |live: Option<&Value>, cfg: &Value, force| {
            apply_with_list_types(live, cfg, "ctl", force, T1, "test.io/v1", &lt).expect("apply")
        };
        let created = apply(None, &obj(json!({"a": "x"})), false);
        let mut without = obj(json!({}));
        without["spec"]
            .as_object_mut()
            .expect("spec")
            .remove("extra");
        let o = apply(Some(&created), &without, false);
        assert!(o["spec"].get("extra").is_none(), "{o}");
        // Created by an update, taken over by the applier, then dropped by it.
        let mut by_update = obj(json!({"a": "x"}));
        by_update["spec"]["size"] = json!(1);
        record_update_with(None, &mut by_update, "curl", T0, "test.io/v1", "", &lt);
        let taken = apply(Some(&by_update), &obj(json!({"a": "y"})), true);
        assert_eq!(
            entry(&taken, "curl").expect("curl")["fieldsV1"],
            json!({"f:spec": {".": {}, "f:extra": {}}})
        );
        let o = apply(Some(&taken), &without, false);
        assert_eq!(o["spec"]["extra"], Value::Null, "{o}");
    }

    #[test]
    fn record_update_strip_and_overwrite_managed_fields() {
        let live = apply(None, &cm(json!({"a": "1"})), "ctl", false, T0, "v1").expect("create");
        let mut stripped = live.clone();
        stripped["metadata"]["managedFields"] = json!([{}]);
        record_update(Some(&live), &mut stripped, "x", T1, "v1");
        assert!(stripped["metadata"].get("managedFields").is_none());
        // An empty list is not a reset: the stored entries are kept.
        let mut kept = live.clone();
        kept["metadata"]["managedFields"] = json!([]);
        record_update(Some(&live), &mut kept, "x", T1, "v1");
        assert_eq!(
            kept["metadata"]["managedFields"],
            live["metadata"]["managedFields"]
        );
    }

    #[test]
    fn fields_v1_roundtrip() {
        let mut set = FieldSet::new();
        let f = |s: &str| PathElement::Field(s.into());
        let k = PathElement::Key(vec![
            ("port".into(), "80".into()),
            ("protocol".into(), "\"TCP\"".into()),
        ]);
        set.insert(vec![f("spec"), f("ports"), k.clone()]);
        set.insert(vec![f("spec"), f("ports"), k.clone(), f("port")]);
        set.insert(vec![
            f("metadata"),
            f("finalizers"),
            PathElement::Value("\"x\"".into()),
        ]);
        let v = to_fields_v1(&set);
        assert_eq!(
            v,
            json!({"f:spec": {"f:ports": {"k:{\"port\":80,\"protocol\":\"TCP\"}": {".": {}, "f:port": {}}}},
                   "f:metadata": {"f:finalizers": {"v:\"x\"": {}}}})
        );
        assert_eq!(from_fields_v1(&v), set);
        assert_eq!(
            path_string(&[f("spec"), f("ports"), k, f("port")]),
            r#".spec.ports[port=80,protocol="TCP"].port"#
        );
        // Real-world FieldsV1 with i: elements parses too.
        let parsed = from_fields_v1(&json!({"f:spec": {"f:args": {"i:0": {}}}}));
        assert!(parsed.contains(&vec![f("spec"), f("args"), PathElement::Index(0)]));
    }

    #[test]
    fn list_type_table() {
        assert_eq!(
            list_type("Service", &["spec", "ports"]),
            ListType::Map(vec!["port".into(), "protocol".into()])
        );
        assert_eq!(list_type("EndpointSlice", &["ports"]), ListType::Atomic);
        assert_eq!(
            list_type("DiscoveredService", &["status", "conditions"]),
            ListType::Atomic
        );
        assert_eq!(
            list_type("Deployment", &["status", "conditions"]),
            ListType::Map(vec!["type".into()])
        );
        assert_eq!(list_type("X", &["metadata", "finalizers"]), ListType::Set);
    }

    fn opts<'a>(manager: &'a str, scope: Scope) -> ApplyOptions<'a> {
        ApplyOptions {
            manager,
            force: false,
            now_rfc3339: T1,
            api_version: "kubediscovery.io/v1alpha1",
            scope,
            list_types: None,
        }
    }

    #[test]
    fn custom_resource_list_types_from_schema() {
        let schema = crate::schema::StructuralSchema::compile(&json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "ports": {"type": "array", "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"],
                      "items": {"type": "object", "properties": {"name": {"type": "string"}, "port": {"type": "integer"}}}}}}}}))
        .expect("schema");
        let lt = |p: &[&str]| schema.list_type_at(p);
        let obj = |ports: Value| json!({"apiVersion": "x.io/v1", "kind": "Thing", "metadata": {"name": "t"}, "spec": {"ports": ports}});
        let o = |m| ApplyOptions {
            manager: m,
            force: false,
            now_rfc3339: T0,
            api_version: "x.io/v1",
            scope: Scope::All,
            list_types: Some(&lt),
        };
        let live =
            apply_with(None, &obj(json!([{"name": "a", "port": 1}])), &o("m1")).expect("create");
        let live = apply_with(
            Some(&live),
            &obj(json!([{"name": "b", "port": 2}])),
            &o("m2"),
        )
        .expect("second manager");
        assert_eq!(
            live["spec"]["ports"],
            json!([{"name": "a", "port": 1}, {"name": "b", "port": 2}]),
            "merged by key, not replaced"
        );
        // Without the schema the list would be atomic: m2 would conflict with m1.
        let atomic = apply(
            None,
            &obj(json!([{"name": "a", "port": 1}])),
            "m1",
            false,
            T0,
            "x.io/v1",
        )
        .expect("create");
        let e = apply(
            Some(&atomic),
            &obj(json!([{"name": "b", "port": 2}])),
            "m2",
            false,
            T0,
            "x.io/v1",
        )
        .expect_err("atomic");
        assert_eq!(
            e.conflicts,
            vec![("m1".to_string(), ".spec.ports".to_string())]
        );
    }

    #[test]
    fn noop_apply_is_byte_identical() {
        let live = apply(None, &cm(json!({"a": "1"})), "ctl", true, T0, "v1").expect("create");
        let again =
            apply(Some(&live), &cm(json!({"a": "1"})), "ctl", true, T1, "v1").expect("same");
        assert_eq!(again, live, "no-op apply must not touch managedFields time");
        let changed =
            apply(Some(&live), &cm(json!({"a": "2"})), "ctl", true, T1, "v1").expect("changed");
        assert_eq!(entry(&changed, "ctl").expect("e")["time"], T1);
    }

    #[test]
    fn status_and_main_resource_are_tracked_separately() {
        let ds = |spec: Value, status: Value| {
            json!({"apiVersion": "kubediscovery.io/v1alpha1", "kind": "DiscoveredService",
                   "metadata": {"name": "web", "namespace": "kd"}, "spec": spec, "status": status})
        };
        // Main resource: .status in the applied config is ignored.
        let live = apply_with(
            None,
            &ds(json!({"a": 1}), json!({"x": "ignored"})),
            &opts("kd", Scope::MainResource),
        )
        .expect("create");
        assert!(live.get("status").is_none(), "{live}");
        // Status apply by the same manager must not remove the spec it applied.
        let live = apply_with(
            Some(&live),
            &ds(json!({"a": 99}), json!({"ready": true})),
            &opts("kd", Scope::Status),
        )
        .expect("status");
        assert_eq!(
            live["spec"],
            json!({"a": 1}),
            "spec untouched by a status apply"
        );
        assert_eq!(live["status"], json!({"ready": true}));
        let entries = managed_fields(&live);
        assert_eq!(entries.len(), 2, "{entries:?}");
        let st = entries
            .iter()
            .find(|e| e.subresource == "status")
            .expect("status entry");
        assert_eq!(
            to_fields_v1(&st.fields),
            json!({"f:status": {"f:ready": {}}})
        );
        // Re-applying the main resource keeps status, and vice versa.
        let live = apply_with(
            Some(&live),
            &ds(json!({"a": 2}), json!({})),
            &opts("kd", Scope::MainResource),
        )
        .expect("main");
        assert_eq!(live["status"], json!({"ready": true}));
        assert_eq!(live["spec"], json!({"a": 2}));
        let live = apply_with(
            Some(&live),
            &ds(json!({}), json!({"count": 3})),
            &opts("kd", Scope::Status),
        )
        .expect("status 2");
        assert_eq!(
            live["status"],
            json!({"count": 3}),
            "ready no longer applied -> removed"
        );
        assert_eq!(live["spec"], json!({"a": 2}));
    }

    #[test]
    fn before_first_apply_owns_untracked_fields() {
        let live = cm(json!({"a": "1"}));
        let e = apply(Some(&live), &cm(json!({"a": "2"})), "ctl", false, T1, "v1")
            .expect_err("conflict");
        assert_eq!(
            e.message(),
            r#"Apply failed with 1 conflict: conflict with "before-first-apply": .data.a"#
        );
        let out =
            apply(Some(&live), &cm(json!({"b": "2"})), "ctl", false, T1, "v1").expect("no overlap");
        assert_eq!(out["data"], json!({"a": "1", "b": "2"}));
        assert_eq!(
            entry(&out, BEFORE_FIRST_APPLY).expect("seeded")["fieldsV1"],
            json!({"f:data": {"f:a": {}}})
        );
    }

    #[test]
    fn keyed_list_item_without_key_falls_back_to_atomic() {
        let live = apply(
            None,
            &svc(json!([{"name": "noport"}])),
            "ctl",
            false,
            T0,
            "v1",
        )
        .expect("create");
        assert_eq!(
            entry(&live, "ctl").expect("e")["fieldsV1"],
            json!({"f:spec": {"f:ports": {}}})
        );
    }
}
