//! Thin adapter between the server and `kube-sim-apimachinery` (selectors, names,
//! patches, RBAC, CRD schemas, server-side apply). The server only calls the
//! functions here, so the pure machinery stays in one crate with its own tests.

use kube_sim_apimachinery::selector::LabelSelectorExt;
use kube_sim_apimachinery::{names, patch, rbac, schema, selector, ssa};
use serde_json::Value;

use crate::status::{ApiError, Cause};

/// A compiled CRD `openAPIV3Schema` (`kube_sim_apimachinery::schema`).
#[derive(Debug)]
pub struct CompiledSchema(schema::StructuralSchema);

impl CompiledSchema {
    /// Compile a raw `openAPIV3Schema`; the error says why it is refused.
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

    /// Drops `null`s the schema does not allow and cannot default, as the
    /// API server's decoder does with request bodies.
    pub fn prune_non_nullable_nulls(&self, obj: &mut Value) {
        self.0.prune_non_nullable_nulls(obj);
    }

    /// Fields of an apply configuration the schema does not declare, in
    /// structured-merge-diff's notation (`.spec.aliases`); see
    /// `StructuralSchema::undeclared_fields`.
    pub fn undeclared_fields(&self, obj: &Value) -> Vec<String> {
        self.0.undeclared_fields(obj)
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
    /// A bad selector is a 400 with `labels.Parse`'s text as is, as the real
    /// server answers (it already says `unable to parse requirement: ...`
    /// where that applies).
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        selector::LabelSelector::parse(s)
            .map(LabelSel)
            .map_err(|e| ApiError::bad_request(e.to_string()))
    }

    /// Whether `obj`'s labels match.
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.is_empty() || self.0.matches_value(obj.pointer("/metadata/labels"))
    }

    /// Whether the selector selects everything.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// A parsed field selector over the fields the real server lets a type be
/// selected by ([`selectable_fields`]), evaluated on the stored object.
#[derive(Debug, Clone)]
pub struct FieldSel {
    sel: selector::FieldSelector,
    /// Selector field -> the stored object's field (events.k8s.io/v1 names
    /// map to the stored core/v1 Event's).
    rename: &'static [(&'static str, &'static str)],
}

/// The field labels of every type: `metadata.name` and `metadata.namespace`.
pub const SUPPORTED_FIELDS: &[&str] = &["metadata.name", "metadata.namespace"];

const SERVICE_FIELDS: &[&str] = &[
    "metadata.namespace",
    "metadata.name",
    "spec.clusterIP",
    "spec.type",
];
const SECRET_FIELDS: &[&str] = &["type", "metadata.namespace", "metadata.name"];
const NAMESPACE_FIELDS: &[&str] = &["status.phase", "metadata.name"];
const CORE_EVENT_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
    "metadata.namespace",
    "metadata.name",
];
/// events.k8s.io/v1 field labels and the core/v1 Event field each selects.
const EVENTS_V1_FIELDS: &[(&str, &str)] = &[
    ("reason", "reason"),
    ("regarding.kind", "involvedObject.kind"),
    ("regarding.namespace", "involvedObject.namespace"),
    ("regarding.name", "involvedObject.name"),
    ("regarding.uid", "involvedObject.uid"),
    ("regarding.apiVersion", "involvedObject.apiVersion"),
    (
        "regarding.resourceVersion",
        "involvedObject.resourceVersion",
    ),
    ("regarding.fieldPath", "involvedObject.fieldPath"),
    ("reportingController", "reportingComponent"),
    ("type", "type"),
    ("metadata.namespace", "metadata.namespace"),
    ("metadata.name", "metadata.name"),
];

/// How a type's field selectors are checked, as the real server's field
/// label conversion functions: types with their own function name the
/// offending field (`field label not supported: spec.foo`), the others get
/// the generic `"spec.foo" is not a known field selector: only
/// "metadata.name", "metadata.namespace"`.
pub enum Selectable {
    /// Only `metadata.name` and `metadata.namespace`, the generic message.
    Meta,
    /// These field labels (read at these paths of the stored object).
    Fields(Vec<String>),
}

/// The field labels of `group`/`resource` (custom resources: `metadata.*`
/// plus the CRD version's `selectableFields`).
pub fn selectable_fields(group: &str, resource: &str, crd_fields: Option<&[String]>) -> Selectable {
    let own = |l: &[&str]| Selectable::Fields(l.iter().map(|f| f.to_string()).collect());
    if let Some(extra) = crd_fields {
        let mut f: Vec<String> = SUPPORTED_FIELDS.iter().map(|f| f.to_string()).collect();
        f.extend(extra.iter().cloned());
        return Selectable::Fields(f);
    }
    match (group, resource) {
        ("", "services") => own(SERVICE_FIELDS),
        ("", "secrets") => own(SECRET_FIELDS),
        ("", "namespaces") => own(NAMESPACE_FIELDS),
        ("", "events") => own(CORE_EVENT_FIELDS),
        ("events.k8s.io", "events") => Selectable::Fields(
            EVENTS_V1_FIELDS
                .iter()
                .map(|(f, _)| f.to_string())
                .collect(),
        ),
        _ => Selectable::Meta,
    }
}

impl FieldSel {
    /// Parse a `fieldSelector` of a resource of `group` whose field labels are `selectable`.
    pub fn parse(s: &str, group: &str, selectable: &Selectable) -> Result<Self, ApiError> {
        let owned: Vec<&str> = match selectable {
            Selectable::Meta => SUPPORTED_FIELDS.to_vec(),
            Selectable::Fields(f) => f.iter().map(String::as_str).collect(),
        };
        let sel = selector::FieldSelector::parse(s, &owned).map_err(|e| {
            let msg = e.to_string();
            match (selectable, msg.strip_prefix("field label not supported: ")) {
                (Selectable::Meta, Some(field)) => ApiError::bad_request(format!(
                    "{field:?} is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
                )),
                _ => ApiError::bad_request(msg),
            }
        })?;
        let rename: &'static [(&'static str, &'static str)] = if group == "events.k8s.io" {
            EVENTS_V1_FIELDS
        } else {
            &[]
        };
        Ok(FieldSel { sel, rename })
    }

    /// Whether the selector selects everything.
    pub fn is_empty(&self) -> bool {
        self.sel.is_empty()
    }

    /// Whether `obj`'s fields match.
    pub fn matches(&self, obj: &Value) -> bool {
        self.sel.is_empty()
            || self.sel.matches(|f| {
                let f = self
                    .rename
                    .iter()
                    .find(|(from, _)| *from == f)
                    .map_or(f, |(_, to)| to);
                field_value(obj, f)
            })
    }
}

/// The value of field label `f` in a stored object: the string (or number,
/// boolean) at its dotted path; an Event's `source` is `source.component`;
/// a missing namespace is empty.
fn field_value(obj: &Value, f: &str) -> Option<String> {
    let path = match f {
        "source" => "source.component",
        other => other,
    };
    let mut cur = obj;
    for part in path.split('.') {
        cur = match cur.get(part) {
            Some(v) => v,
            None if f == "metadata.namespace" => return Some(String::new()),
            None => return None,
        };
    }
    match cur {
        Value::String(s) => Some(s.clone()),
        Value::Null => None,
        Value::Bool(_) | Value::Number(_) => Some(cur.to_string()),
        _ => None,
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

/// RFC 7386 JSON merge patch.
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
    /// User name (`system:serviceaccount:ns:name` for ServiceAccounts).
    pub name: String,
    /// Groups of the user.
    pub groups: Vec<String>,
    /// The admin token's user: RBAC is not consulted.
    pub admin: bool,
}

impl User {
    /// `system:anonymous` (group `system:unauthenticated`): a request
    /// without a bearer token.
    pub fn anonymous() -> User {
        User {
            name: "system:anonymous".into(),
            groups: vec!["system:unauthenticated".into()],
            admin: false,
        }
    }

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
    /// Roles.
    pub roles: Vec<Value>,
    /// ClusterRoles.
    pub cluster_roles: Vec<Value>,
    /// RoleBindings.
    pub role_bindings: Vec<Value>,
    /// ClusterRoleBindings.
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The real kube-apiserver v1.34 answers a bad `labelSelector` with a 400
    /// whose message is `labels.Parse`'s error as is (checked against it).
    #[test]
    fn a_bad_label_selector_is_a_400_with_the_parse_error() {
        let e = LabelSel::parse("a in (").expect_err("bad");
        assert_eq!((e.code, e.reason), (400, "BadRequest"));
        assert_eq!(
            e.message,
            "unable to parse requirement: found '', expected: ',', ')' or identifier"
        );
        let e = LabelSel::parse("a=b,").expect_err("bad");
        assert_eq!(e.message, "found '', expected: identifier after ','");
        assert!(LabelSel::parse("a>1").is_ok());
    }
}
