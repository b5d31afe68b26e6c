//! Thin adapter between the server and `kube-sim-apimachinery` (selectors, names,
//! patches, RBAC, CRD schemas, server-side apply). The server only calls the
//! functions here, so the pure machinery stays in one crate with its own tests.
//!
//! SHIM: parts of `kube-sim-apimachinery` had not landed when this was written;
//! functions marked `SHIM` are temporary minimal stand-ins, replaced as modules land.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::status::{ApiError, Cause};

/// A compiled CRD `openAPIV3Schema`.
#[derive(Debug)]
pub struct CompiledSchema {
    raw: Value,
}

impl CompiledSchema {
    /// SHIM: accepts any schema.
    pub fn compile(raw: &Value) -> Result<Self, String> {
        Ok(CompiledSchema { raw: raw.clone() })
    }

    /// Prune unknown fields, apply defaults, validate. Returns the pruned field paths
    /// and the field errors.
    pub fn admit(&self, _obj: &mut Value) -> (Vec<String>, Vec<Cause>) {
        let _ = &self.raw;
        (Vec::new(), Vec::new())
    }
}

/// A parsed label selector.
#[derive(Debug, Clone, Default)]
pub struct LabelSel {
    reqs: Vec<(String, Option<String>)>,
}

impl LabelSel {
    /// SHIM: equality and existence only.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part.split_once('=') {
                Some((k, v)) => reqs.push((k.trim().to_string(), Some(v.trim_start_matches('=').trim().to_string()))),
                None => reqs.push((part.to_string(), None)),
            }
        }
        Ok(LabelSel { reqs })
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        self.reqs.iter().all(|(k, v)| {
            let actual = labels.and_then(|l| l.get(k)).and_then(Value::as_str);
            match v {
                Some(v) => actual == Some(v.as_str()),
                None => actual.is_some(),
            }
        })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }
}

/// A parsed field selector over `metadata.name` / `metadata.namespace`.
#[derive(Debug, Clone, Default)]
pub struct FieldSel {
    reqs: Vec<(String, bool, String)>,
}

pub const SUPPORTED_FIELDS: &[&str] = &["metadata.name", "metadata.namespace"];

impl FieldSel {
    /// SHIM
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, neg, v) = if let Some((k, v)) = part.split_once("!=") {
                (k, true, v)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, false, v)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, false, v)
            } else {
                return Err(ApiError::bad_request(format!("invalid selector: '{part}'; can't understand '{part}'")));
            };
            if !SUPPORTED_FIELDS.contains(&k) {
                return Err(ApiError::bad_request(format!("field label not supported: {k}")));
            }
            reqs.push((k.to_string(), neg, v.to_string()));
        }
        Ok(FieldSel { reqs })
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.reqs.iter().all(|(k, neg, v)| {
            let actual = match k.as_str() {
                "metadata.name" => obj.pointer("/metadata/name"),
                _ => obj.pointer("/metadata/namespace"),
            }
            .and_then(Value::as_str)
            .unwrap_or("");
            (actual == v) != *neg
        })
    }
}

/// Kubernetes object-name validation; `label` for DNS-1123 labels (namespaces, services).
pub fn validate_name(name: &str, label: bool) -> Result<(), String> {
    // SHIM
    let ok_len = if label { name.len() <= 63 } else { name.len() <= 253 };
    let ok_chars = name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || (!label && c == '.'));
    let ok_ends = name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.chars().last().is_some_and(|c| c.is_ascii_alphanumeric());
    if ok_len && ok_chars && ok_ends {
        Ok(())
    } else {
        Err(format!("{name:?}: a lowercase RFC 1123 name is required"))
    }
}

pub fn merge_patch(target: &mut Value, patch: &Value) {
    json_patch::merge(target, patch);
}

pub fn json_patch(target: &mut Value, patch: &Value) -> Result<(), String> {
    let p: json_patch::Patch = serde_json::from_value(patch.clone()).map_err(|e| e.to_string())?;
    json_patch::patch(target, &p).map_err(|e| e.to_string())
}

/// SHIM: merge semantics.
pub fn strategic_merge_patch(target: &mut Value, patch: &Value, _kind: &str) -> Result<(), String> {
    json_patch::merge(target, patch);
    Ok(())
}

/// The authenticated user of a request.
#[derive(Debug, Clone)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
    pub admin: bool,
}

/// What a request does, for RBAC.
#[derive(Debug, Clone, Default)]
pub struct Attributes {
    pub verb: String,
    pub api_group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    pub resource_request: bool,
    pub path: String,
}

/// SHIM: allow everything.
pub fn authorize(_user: &User, _attrs: &Attributes, _rbac: &RbacObjects) -> bool {
    true
}

pub fn forbidden_message(user: &User, attrs: &Attributes) -> String {
    format!("User {:?} cannot {} resource {:?}", user.name, attrs.verb, attrs.resource)
}

/// The RBAC objects currently stored.
#[derive(Debug, Default)]
pub struct RbacObjects {
    pub roles: Vec<Value>,
    pub cluster_roles: Vec<Value>,
    pub role_bindings: Vec<Value>,
    pub cluster_role_bindings: Vec<Value>,
}

/// Server-side apply conflict: (manager, field path) pairs.
#[derive(Debug)]
pub struct Conflicts(pub Vec<(String, String)>);

/// SHIM: merge semantics, no conflicts.
pub fn ssa_apply(live: Option<&Value>, applied: &Value, _manager: &str, _force: bool, _now: &str, _api_version: &str) -> Result<Value, Conflicts> {
    let mut out = live.cloned().unwrap_or_else(|| Value::Object(Default::default()));
    json_patch::merge(&mut out, applied);
    Ok(out)
}

/// SHIM: no-op.
pub fn record_update(_old: Option<&Value>, _new: &mut Value, _manager: &str, _now: &str, _api_version: &str) {}

#[allow(dead_code)]
fn _unused(_: BTreeMap<String, String>) {}
