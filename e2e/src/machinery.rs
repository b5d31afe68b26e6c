//! Thin adapter between the server and `kube-sim-apimachinery` (selectors, names,
//! patches, RBAC, CRD schemas, server-side apply). The server only calls the
//! functions here, so the pure machinery stays in one crate with its own tests.
//!
//! SHIM: parts of `kube-sim-apimachinery` had not landed when this was written;
//! functions marked `SHIM` are temporary minimal stand-ins, replaced as modules land.

use kube_sim_apimachinery::{names, patch, rbac, schema, selector, ssa};
use serde_json::Value;

use crate::status::{ApiError, Cause};

/// A compiled CRD `openAPIV3Schema` (`kube_sim_apimachinery::schema`).
#[derive(Debug)]
pub struct CompiledSchema(schema::StructuralSchema);

impl CompiledSchema {
    pub fn compile(raw: &Value) -> Result<Self, String> {
        schema::StructuralSchema::compile(raw).map(CompiledSchema)
    }

    /// Prune unknown fields, apply defaults, validate (the real server's order).
    /// Returns the pruned field paths and the field errors.
    pub fn admit(&self, obj: &mut Value) -> (Vec<String>, Vec<Cause>) {
        let pruned = self.0.prune_with_paths(obj);
        self.0.default(obj);
        let causes = self
            .0
            .validate(obj)
            .into_iter()
            .map(|e| Cause::new(e.kind.reason(), &e.field, e.detail().to_string()))
            .collect();
        (pruned, causes)
    }

    /// List types declared by the schema, for server-side apply.
    pub fn list_type_at(&self, path: &[&str]) -> ssa::ListType {
        self.0.list_type_at(path)
    }
}

/// A parsed label selector (`kube_sim_apimachinery::selector`).
#[derive(Debug, Clone)]
pub struct LabelSel(selector::LabelSelector);

impl LabelSel {
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        selector::LabelSelector::parse(s)
            .map(LabelSel)
            .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.is_empty() || self.0.matches_value(obj.pointer("/metadata/labels"))
    }

    /// Whether the selector selects everything.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A parsed field selector over `metadata.name` / `metadata.namespace`.
#[derive(Debug, Clone)]
pub struct FieldSel(selector::FieldSelector);

pub const SUPPORTED_FIELDS: &[&str] = &["metadata.name", "metadata.namespace"];

impl FieldSel {
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        selector::FieldSelector::parse(s, SUPPORTED_FIELDS)
            .map(FieldSel)
            .map_err(|e| ApiError::bad_request(e.to_string()))
    }

    /// Whether the selector selects everything.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.is_empty()
            || self.0.matches(|f| match f {
                "metadata.name" => obj
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .map(str::to_string),
                "metadata.namespace" => Some(
                    obj.pointer("/metadata/namespace")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                ),
                _ => None,
            })
    }
}

/// Kubernetes object-name validation for `kind`.
pub fn validate_name(kind: &str, name: &str) -> Result<(), String> {
    names::validate_object_name(kind, name)
}

/// Validate `metadata.labels` keys and values; returns field causes.
pub fn validate_labels(obj: &Value) -> Vec<Cause> {
    let mut out = Vec::new();
    if let Some(labels) = obj.pointer("/metadata/labels").and_then(Value::as_object) {
        for (k, v) in labels {
            if let Err(e) = names::validate_qualified_name(k) {
                out.push(Cause::new(
                    "FieldValueInvalid",
                    "metadata.labels",
                    format!("Invalid value: {k:?}: {e}"),
                ));
            }
            match v.as_str() {
                Some(v) => {
                    if let Err(e) = names::validate_label_value(v) {
                        out.push(Cause::new(
                            "FieldValueInvalid",
                            "metadata.labels",
                            format!("Invalid value: {v:?}: {e}"),
                        ));
                    }
                }
                None => out.push(Cause::new(
                    "FieldValueTypeInvalid",
                    "metadata.labels",
                    format!("Invalid value: label {k:?} must be a string"),
                )),
            }
        }
    }
    out
}

pub fn merge_patch(target: &mut Value, patch: &Value) {
    patch::merge_patch(target, patch);
}

/// RFC 6902 JSON patch; the error text is the Status message.
pub fn json_patch(target: &mut Value, patch_doc: &Value) -> Result<(), String> {
    patch::json_patch(target, patch_doc).map_err(|e| e.to_string())
}

/// Strategic merge patch for `kind` (list merge keys of the built-in types).
pub fn strategic_merge_patch(
    target: &mut Value,
    patch_doc: &Value,
    kind: &str,
) -> Result<(), String> {
    patch::strategic_merge_patch(target, patch_doc, kind).map_err(|e| e.to_string())
}

/// The authenticated user of a request.
#[derive(Debug, Clone)]
pub struct User {
    pub name: String,
    pub groups: Vec<String>,
    pub admin: bool,
}

impl User {
    fn info(&self) -> rbac::UserInfo {
        rbac::UserInfo {
            name: self.name.clone(),
            groups: self.groups.clone(),
        }
    }
}

/// What a request does, for RBAC.
pub type Attributes = rbac::RequestAttributes;

/// Evaluate the stored RBAC objects (`kube_sim_apimachinery::rbac`).
pub fn authorize(user: &User, attrs: &Attributes, objs: &RbacObjects) -> bool {
    rbac::authorize(
        &user.info(),
        attrs,
        &objs.roles,
        &objs.cluster_roles,
        &objs.role_bindings,
        &objs.cluster_role_bindings,
    )
}

/// The 403 message, exactly as the real server writes it.
pub fn forbidden_message(user: &User, attrs: &Attributes) -> String {
    rbac::forbidden_message(&user.info(), attrs)
}

/// The RBAC objects currently stored.
#[derive(Debug, Default)]
pub struct RbacObjects {
    pub roles: Vec<Value>,
    pub cluster_roles: Vec<Value>,
    pub role_bindings: Vec<Value>,
    pub cluster_role_bindings: Vec<Value>,
}

/// Server-side apply conflict (`kube_sim_apimachinery::ssa::ApplyConflict`).
pub type Conflicts = ssa::ApplyConflict;

/// Server-side apply: the new object with updated managedFields, or the conflicts.
/// Custom resources use their schema's list types; built-in kinds the crate's table.
pub fn ssa_apply(
    live: Option<&Value>,
    applied: &Value,
    manager: &str,
    force: bool,
    now: &str,
    api_version: &str,
    schema: Option<&CompiledSchema>,
) -> Result<Value, Conflicts> {
    match schema {
        Some(s) => {
            let lt = |p: &[&str]| s.list_type_at(p);
            ssa::apply_with_list_types(live, applied, manager, force, now, api_version, &lt)
        }
        None => ssa::apply(live, applied, manager, force, now, api_version),
    }
}

/// Record a create/update/patch by `manager` in `new`'s managedFields.
pub fn record_update(
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    now: &str,
    api_version: &str,
) {
    ssa::record_update(old, new, manager, now, api_version);
}
