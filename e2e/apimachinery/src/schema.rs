//! Custom resource validation against a CRD version's `openAPIV3Schema`.
//!
//! Three steps, in the order the API server runs them on create/update:
//!
//! 1. [`StructuralSchema::prune`] — drop fields the schema does not declare,
//!    honouring `x-kubernetes-preserve-unknown-fields`, `additionalProperties`
//!    schemas and `x-kubernetes-embedded-resource`; `apiVersion`, `kind` and
//!    `metadata` at the root are never pruned. This is a plain schema walk
//!    (JSON Schema has no notion of pruning).
//! 2. [`StructuralSchema::default`] — fill in `default:` values of absent (or
//!    `null` and not nullable) properties, top-down.
//! 3. [`StructuralSchema::validate`] — the actual checks are done by the
//!    `jsonschema` crate (draft 4, the dialect OpenAPI v3.0 is based on) on a
//!    *translated* schema: `nullable: true` becomes a `"null"` type (and enum
//!    member), `x-kubernetes-int-or-string` becomes `type: [integer, string]`,
//!    the other `x-kubernetes-*` keys are removed, and only the formats
//!    Kubernetes checks and that are cheap are kept (`date-time`, `date`,
//!    `ipv4`, `ipv6`, `uuid`, `byte`). Its errors are mapped to Kubernetes field
//!    paths (`spec.ports[0].port`) and messages
//!    (`spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer: "string"`).
//!
//! [`StructuralSchema::compile`] rejects what the real API server rejects most
//! commonly: a non-object root and nodes without `type` (that are not
//! int-or-string or preserve-unknown-fields), plus anything `jsonschema` cannot
//! compile (e.g. an invalid `pattern`).
//!
//! Not supported (documented gaps): `x-kubernetes-validations` (CEL rules) are
//! ignored; `metadata` of embedded resources is not validated. Duplicates in
//! `x-kubernetes-list-type: set|map` lists are reported by a separate schema
//! walk (`spec.ports[1]: Duplicate value: {"port":80}`).

use std::fmt;
use std::sync::LazyLock;

use regex::Regex;
use serde_json::{Map, Value};

use crate::ssa::ListType;

pub use crate::field::{FieldError, FieldErrorKind, invalid_message};

/// A compiled CRD version schema.
pub struct StructuralSchema {
    raw: Value,
    validator: jsonschema::Validator,
}

impl fmt::Debug for StructuralSchema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StructuralSchema")
            .field("schema", &self.raw)
            .finish()
    }
}

const KEPT_FORMATS: &[&str] = &["date-time", "date", "ipv4", "ipv6", "uuid", "byte"];

static BASE64_RE: LazyLock<Regex> = LazyLock::new(|| {
    #[allow(clippy::expect_used)]
    Regex::new(r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$")
        .expect("static regex compiles")
});

fn truthy(schema: &Value, key: &str) -> bool {
    schema.get(key).and_then(Value::as_bool).unwrap_or(false)
}

/// Checks the structural rules, collecting errors with CRD-style paths.
fn check_structural(schema: &Value, at: &str, errs: &mut Vec<String>) {
    let Some(m) = schema.as_object() else {
        errs.push(format!("{at}: Invalid value: must be a schema object"));
        return;
    };
    let typed = m
        .get("type")
        .and_then(Value::as_str)
        .is_some_and(|t| !t.is_empty());
    if !typed
        && !truthy(schema, "x-kubernetes-int-or-string")
        && !truthy(schema, "x-kubernetes-preserve-unknown-fields")
    {
        errs.push(format!(
            "{at}.type: Required value: must not be empty for specified object fields"
        ));
    }
    if let Some(t) = m.get("type").and_then(Value::as_str)
        && !matches!(
            t,
            "object" | "array" | "string" | "integer" | "number" | "boolean"
        )
    {
        errs.push(format!(
            "{at}.type: Unsupported value: {t:?}: supported values: \"array\", \"boolean\", \"integer\", \"number\", \"object\", \"string\""
        ));
    }
    if let Some(props) = m.get("properties").and_then(Value::as_object) {
        for (k, v) in props {
            check_structural(v, &format!("{at}.properties[{k}]"), errs);
        }
    }
    if let Some(items) = m.get("items") {
        if items.is_array() {
            errs.push(format!(
                "{at}.items: Forbidden: items must be a schema object and not an array"
            ));
        } else {
            check_structural(items, &format!("{at}.items"), errs);
        }
    }
    if let Some(ap) = m.get("additionalProperties")
        && ap.is_object()
    {
        check_structural(ap, &format!("{at}.additionalProperties"), errs);
    }
}

/// Translates the Kubernetes dialect into plain JSON Schema draft 4.
fn translate(schema: &Value) -> Value {
    let Some(m) = schema.as_object() else {
        return schema.clone();
    };
    let mut out = Map::new();
    for (k, v) in m {
        if k.starts_with("x-kubernetes-")
            || matches!(
                k.as_str(),
                "nullable" | "default" | "example" | "externalDocs"
            )
        {
            continue;
        }
        match k.as_str() {
            "properties" | "patternProperties" | "definitions" => {
                let mapped = v
                    .as_object()
                    .map(|p| {
                        p.iter()
                            .map(|(n, s)| (n.clone(), translate(s)))
                            .collect::<Map<_, _>>()
                    })
                    .unwrap_or_default();
                out.insert(k.clone(), Value::Object(mapped));
            }
            "items" | "additionalProperties" | "not" if v.is_object() => {
                out.insert(k.clone(), translate(v));
            }
            "allOf" | "anyOf" | "oneOf" => {
                let mapped = v
                    .as_array()
                    .map(|a| a.iter().map(translate).collect())
                    .unwrap_or_default();
                out.insert(k.clone(), Value::Array(mapped));
            }
            "format" => {
                if v.as_str().is_some_and(|f| KEPT_FORMATS.contains(&f)) {
                    out.insert(k.clone(), v.clone());
                }
            }
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    if truthy(schema, "x-kubernetes-int-or-string") {
        out.insert("type".into(), serde_json::json!(["integer", "string"]));
    }
    if truthy(schema, "nullable") {
        if let Some(t) = out.get("type").cloned() {
            let mut types = match t {
                Value::Array(a) => a,
                other => vec![other],
            };
            types.push(Value::String("null".into()));
            out.insert("type".into(), Value::Array(types));
        }
        if let Some(Value::Array(e)) = out.get_mut("enum")
            && !e.contains(&Value::Null)
        {
            e.push(Value::Null);
        }
    }
    Value::Object(out)
}

fn json_type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// Go-ish rendering of a value in `Invalid value: ...`; whole floats print
/// without a fraction (`65535`, not `65535.0`), as Go's `%v` does.
fn show(v: &Value) -> String {
    match v {
        Value::String(s) => format!("{s:?}"),
        Value::Array(_) | Value::Object(_) => json_type_name(v).to_string(),
        Value::Number(n) => match n.as_f64() {
            Some(f) if !n.is_i64() && !n.is_u64() && f.fract() == 0.0 && f.abs() < 1e15 => {
                format!("{}", f as i64)
            }
            _ => n.to_string(),
        },
        other => other.to_string(),
    }
}

fn field_path(loc: &jsonschema::paths::Location) -> String {
    let mut s = String::new();
    for seg in loc.iter() {
        match seg {
            jsonschema::paths::LocationSegment::Property(p) => {
                if !s.is_empty() {
                    s.push('.');
                }
                s.push_str(&p);
            }
            jsonschema::paths::LocationSegment::Index(i) => s.push_str(&format!("[{i}]")),
        }
    }
    s
}

fn join_field(parent: &str, child: &str) -> String {
    if parent.is_empty() {
        child.to_string()
    } else {
        format!("{parent}.{child}")
    }
}

fn fe(field: String, kind: FieldErrorKind, detail: String) -> FieldError {
    FieldError::new(field, kind, detail)
}

fn map_error(e: &jsonschema::ValidationError<'_>) -> FieldError {
    use jsonschema::error::{TypeKind, ValidationErrorKind as K};
    let field = field_path(e.instance_path());
    let inst: &Value = e.instance();
    let body = if field.is_empty() {
        "body".to_string()
    } else {
        format!("{field} in body")
    };
    let invalid = |detail: String| {
        fe(
            field.clone(),
            FieldErrorKind::Invalid,
            format!("Invalid value: {}: {detail}", show(inst)),
        )
    };
    match e.kind() {
        K::Required { property } => {
            let p = property
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| property.to_string());
            fe(
                join_field(&field, &p),
                FieldErrorKind::Required,
                "Required value".to_string(),
            )
        }
        K::Type { kind } => {
            let expected = match kind {
                TypeKind::Single(t) => t.to_string(),
                TypeKind::Multiple(ts) => ts
                    .iter()
                    .map(|t| t.to_string())
                    .filter(|t| t != "null")
                    .collect::<Vec<_>>()
                    .join("/"),
            };
            let got = json_type_name(inst);
            fe(
                field.clone(),
                FieldErrorKind::TypeInvalid,
                format!("Invalid value: {got:?}: {body} must be of type {expected}: {got:?}"),
            )
        }
        K::Enum { options } => {
            let opts: Vec<String> = options
                .as_array()
                .map(|a| a.iter().map(show).collect())
                .unwrap_or_default();
            fe(
                field.clone(),
                FieldErrorKind::NotSupported,
                format!(
                    "Unsupported value: {}: supported values: {}",
                    show(inst),
                    opts.join(", ")
                ),
            )
        }
        K::Pattern { pattern } => invalid(format!("{body} should match '{pattern}'")),
        K::MaxLength { limit } => fe(
            field.clone(),
            FieldErrorKind::TooLong,
            format!("Too long: may not be more than {limit} bytes"),
        ),
        K::MinLength { limit } => invalid(format!("{body} should be at least {limit} chars long")),
        K::MaxItems { limit } => {
            let n = inst.as_array().map_or(0, Vec::len);
            fe(
                field.clone(),
                FieldErrorKind::TooMany,
                format!("Too many: {n}: must have at most {limit} items"),
            )
        }
        K::MinItems { limit } => invalid(format!("{body} should have at least {limit} items")),
        K::MaxProperties { limit } => {
            let n = inst.as_object().map_or(0, Map::len);
            fe(
                field.clone(),
                FieldErrorKind::TooMany,
                format!("Too many: {n}: must have at most {limit} items"),
            )
        }
        K::MinProperties { limit } => {
            invalid(format!("{body} should have at least {limit} properties"))
        }
        K::Maximum { limit } => invalid(format!(
            "{body} should be less than or equal to {}",
            show(limit)
        )),
        K::Minimum { limit } => invalid(format!(
            "{body} should be greater than or equal to {}",
            show(limit)
        )),
        K::ExclusiveMaximum { limit } => {
            invalid(format!("{body} should be less than {}", show(limit)))
        }
        K::ExclusiveMinimum { limit } => {
            invalid(format!("{body} should be greater than {}", show(limit)))
        }
        K::MultipleOf { multiple_of } => {
            invalid(format!("{body} should be a multiple of {multiple_of}"))
        }
        K::Format { format } => invalid(format!("{body} must be of type {format}: {}", show(inst))),
        K::UniqueItems => fe(
            field.clone(),
            FieldErrorKind::Duplicate,
            format!("Duplicate value: {}", show(inst)),
        ),
        _ => invalid(e.to_string()),
    }
}

impl StructuralSchema {
    /// Compiles a CRD version's `openAPIV3Schema`.
    pub fn compile(open_api_v3_schema: &Value) -> Result<Self, String> {
        if open_api_v3_schema.get("type").and_then(Value::as_str) != Some("object") {
            return Err(
                "openAPIV3Schema.type: Unsupported value: must be \"object\" at the root"
                    .to_string(),
            );
        }
        let mut errs = Vec::new();
        check_structural(open_api_v3_schema, "openAPIV3Schema", &mut errs);
        if !errs.is_empty() {
            return Err(errs.join(", "));
        }
        let translated = translate(open_api_v3_schema);
        let validator = jsonschema::options()
            .with_draft(jsonschema::Draft::Draft4)
            .should_validate_formats(true)
            .should_ignore_unknown_formats(true)
            .with_format("byte", |s: &str| BASE64_RE.is_match(s))
            .build(&translated)
            .map_err(|e| format!("openAPIV3Schema: Invalid value: {e}"))?;
        Ok(StructuralSchema {
            raw: open_api_v3_schema.clone(),
            validator,
        })
    }

    /// The schema as given.
    pub fn raw(&self) -> &Value {
        &self.raw
    }

    /// Removes fields the schema does not declare.
    pub fn prune(&self, obj: &mut Value) {
        self.prune_with_paths(obj);
    }

    /// [`prune`](Self::prune), returning the removed field paths
    /// (`spec.ports[0].extra`) in document order — the API server turns each into
    /// a warning `unknown field "<path>"` (or, with `fieldValidation=Strict`, a
    /// 400 `strict decoding error: unknown field "<path>"`).
    pub fn prune_with_paths(&self, obj: &mut Value) -> Vec<String> {
        let mut removed = Vec::new();
        prune(&self.raw, obj, true, "", &mut removed);
        removed
    }

    /// The fields of `obj` the schema does not declare, as the real server's
    /// server-side apply finds them when it converts the apply configuration
    /// to a typed value (structured-merge-diff's `validatingObjectWalker`):
    /// paths like `.spec.aliases`, `.spec.ports[0].extra`, or
    /// `.spec.ports[name="http"].extra` in a `map` list. Unlike
    /// [`prune_with_paths`](Self::prune_with_paths), which drops every
    /// unknown field, the walker stops at the first unknown field of an
    /// object (the real server's pick among several is Go map order, i.e.
    /// random; kube-sim takes the first in sorted order so it is stable).
    pub fn undeclared_fields(&self, obj: &Value) -> Vec<String> {
        let mut out = Vec::new();
        undeclared(&self.raw, obj, true, "", &mut out);
        out
    }

    /// Applies `default:` values.
    pub fn default(&self, obj: &mut Value) {
        apply_defaults(&self.raw, obj);
    }

    /// Removes `null` values of fields that are neither `nullable` nor have
    /// a `default` (`PruneNonNullableNullsWithoutDefaults`): what the API
    /// server's decoder does to a request body (not to the result of a
    /// server-side apply, which is validated as merged).
    pub fn prune_non_nullable_nulls(&self, obj: &mut Value) {
        prune_nulls(&self.raw, obj);
    }

    /// Validates `obj`, returning every error (empty = valid), sorted by field.
    pub fn validate(&self, obj: &Value) -> Vec<FieldError> {
        let mut out: Vec<FieldError> = self
            .validator
            .iter_errors(obj)
            .map(|e| map_error(&e))
            .collect();
        list_uniqueness(&self.raw, obj, "", &mut out);
        out.sort_by(|a, b| {
            a.field
                .cmp(&b.field)
                .then_with(|| a.message.cmp(&b.message))
        });
        out.dedup();
        out
    }

    /// The list type declared at a field path (names only, list positions
    /// omitted) through `x-kubernetes-list-type` / `x-kubernetes-list-map-keys`;
    /// lists without one are atomic. Feed this to
    /// [`crate::ssa::apply_with_list_types`] for custom resources.
    pub fn list_type_at(&self, path: &[&str]) -> ListType {
        let mut node = &self.raw;
        for f in path {
            // Step through list items transparently.
            while node.get("type").and_then(Value::as_str) == Some("array") {
                match node.get("items") {
                    Some(i) => node = i,
                    None => return ListType::Atomic,
                }
            }
            node = match node.get("properties").and_then(|p| p.get(*f)) {
                Some(n) => n,
                None => match node.get("additionalProperties") {
                    Some(ap) if ap.is_object() => ap,
                    _ => return ListType::Atomic,
                },
            };
        }
        match node.get("x-kubernetes-list-type").and_then(Value::as_str) {
            Some("set") => ListType::Set,
            Some("map") => {
                let keys: Vec<String> = node
                    .get("x-kubernetes-list-map-keys")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|k| k.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                if keys.is_empty() {
                    ListType::Atomic
                } else {
                    ListType::Map(keys)
                }
            }
            _ => ListType::Atomic,
        }
    }
}

/// `x-kubernetes-list-type: set` items must be unique, `map` items unique by
/// their `x-kubernetes-list-map-keys` (JSON Schema cannot express the latter).
fn list_uniqueness(schema: &Value, v: &Value, at: &str, out: &mut Vec<FieldError>) {
    match v {
        Value::Object(m) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            for (k, child) in m {
                if let Some(s) = props.and_then(|p| p.get(k)).or(additional) {
                    list_uniqueness(s, child, &join_field(at, k), out);
                }
            }
        }
        Value::Array(items) => {
            let keys: Option<Vec<&str>> =
                match schema.get("x-kubernetes-list-type").and_then(Value::as_str) {
                    Some("set") => Some(Vec::new()),
                    Some("map") => Some(
                        schema
                            .get("x-kubernetes-list-map-keys")
                            .and_then(Value::as_array)
                            .map(|a| a.iter().filter_map(Value::as_str).collect())
                            .unwrap_or_default(),
                    ),
                    _ => None,
                };
            if let Some(keys) = keys {
                let mut seen: Vec<Value> = Vec::new();
                for (i, item) in items.iter().enumerate() {
                    let identity = if keys.is_empty() {
                        item.clone()
                    } else {
                        Value::Object(
                            keys.iter()
                                .filter_map(|k| item.get(*k).map(|v| (k.to_string(), v.clone())))
                                .collect(),
                        )
                    };
                    if seen.contains(&identity) {
                        out.push(FieldError::new(
                            format!("{at}[{i}]"),
                            FieldErrorKind::Duplicate,
                            format!("Duplicate value: {identity}"),
                        ));
                    } else {
                        seen.push(identity);
                    }
                }
            }
            if let Some(is) = schema.get("items").filter(|i| i.is_object()) {
                for (i, item) in items.iter().enumerate() {
                    list_uniqueness(is, item, &format!("{at}[{i}]"), out);
                }
            }
        }
        _ => {}
    }
}

fn prune(schema: &Value, v: &mut Value, keep_type_meta: bool, at: &str, removed: &mut Vec<String>) {
    let preserve = truthy(schema, "x-kubernetes-preserve-unknown-fields");
    let embedded = truthy(schema, "x-kubernetes-embedded-resource");
    match v {
        Value::Object(m) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                if (keep_type_meta || embedded)
                    && matches!(k.as_str(), "apiVersion" | "kind" | "metadata")
                {
                    // metadata itself is validated by the server's ObjectMeta rules.
                    if let Some(ps) = props.and_then(|p| p.get(&k))
                        && k != "metadata"
                        && let Some(child) = m.get_mut(&k)
                    {
                        prune(ps, child, false, &join_field(at, &k), removed);
                    }
                    continue;
                }
                let sub = props.and_then(|p| p.get(&k)).or(additional);
                match sub {
                    Some(s) => {
                        if let Some(child) = m.get_mut(&k) {
                            prune(s, child, false, &join_field(at, &k), removed);
                        }
                    }
                    None if preserve => {}
                    None => {
                        m.remove(&k);
                        removed.push(join_field(at, &k));
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = schema.get("items").filter(|i| i.is_object()) {
                for (i, item) in items.iter_mut().enumerate() {
                    prune(is, item, false, &format!("{at}[{i}]"), removed);
                }
            }
        }
        _ => {}
    }
}

/// See [`StructuralSchema::undeclared_fields`]; `at` is the path so far in
/// structured-merge-diff's notation.
fn undeclared(schema: &Value, v: &Value, root: bool, at: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            let preserve = truthy(schema, "x-kubernetes-preserve-unknown-fields");
            let embedded = truthy(schema, "x-kubernetes-embedded-resource");
            let props = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|a| a.is_object());
            let mut keys: Vec<&String> = m.keys().collect();
            keys.sort();
            for k in keys {
                let path = format!("{at}.{k}");
                match props.and_then(|p| p.get(k)).or(additional) {
                    // metadata is checked by the server's ObjectMeta rules.
                    _ if (root || embedded) && k == "metadata" => {}
                    Some(s) => undeclared(s, &m[k], false, &path, out),
                    None if (root || embedded) && matches!(k.as_str(), "apiVersion" | "kind") => {}
                    None if preserve => {}
                    None => {
                        out.push(path);
                        return;
                    }
                }
            }
        }
        Value::Array(items) => {
            let Some(is) = schema.get("items").filter(|i| i.is_object()) else {
                return;
            };
            let keys: Vec<&str> =
                if schema.get("x-kubernetes-list-type").and_then(Value::as_str) == Some("map") {
                    schema
                        .get("x-kubernetes-list-map-keys")
                        .and_then(Value::as_array)
                        .map(|ks| ks.iter().filter_map(Value::as_str).collect())
                        .unwrap_or_default()
                } else {
                    Vec::new()
                };
            for (i, item) in items.iter().enumerate() {
                let element = if keys.is_empty() {
                    format!("[{i}]")
                } else {
                    let kv: Vec<String> = keys
                        .iter()
                        .filter_map(|k| item.get(*k).map(|val| format!("{k}={val}")))
                        .collect();
                    format!("[{}]", kv.join(","))
                };
                undeclared(is, item, false, &format!("{at}{element}"), out);
            }
        }
        _ => {}
    }
}

fn prune_nulls(schema: &Value, v: &mut Value) {
    match v {
        Value::Object(m) => {
            let props = schema.get("properties").and_then(Value::as_object);
            let extra = schema.get("additionalProperties").filter(|a| a.is_object());
            m.retain(|k, child| {
                let s = props.and_then(|p| p.get(k)).or(extra);
                !(child.is_null()
                    && s.is_some_and(|s| !truthy(s, "nullable") && s.get("default").is_none()))
            });
            for (k, child) in m.iter_mut() {
                if let Some(s) = props.and_then(|p| p.get(k)).or(extra) {
                    prune_nulls(s, child);
                }
            }
        }
        Value::Array(items) => {
            if let Some(s) = schema.get("items") {
                for item in items {
                    prune_nulls(s, item);
                }
            }
        }
        _ => {}
    }
}

fn apply_defaults(schema: &Value, v: &mut Value) {
    match v {
        Value::Object(m) => {
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (k, ps) in props {
                    let Some(d) = ps.get("default") else { continue };
                    let absent = match m.get(k) {
                        None => true,
                        Some(Value::Null) => !truthy(ps, "nullable"),
                        Some(_) => false,
                    };
                    if absent {
                        m.insert(k.clone(), d.clone());
                    }
                }
                for (k, ps) in props {
                    if let Some(child) = m.get_mut(k) {
                        apply_defaults(ps, child);
                    }
                }
            } else if let Some(ap) = schema.get("additionalProperties").filter(|a| a.is_object()) {
                for child in m.values_mut() {
                    apply_defaults(ap, child);
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = schema.get("items").filter(|i| i.is_object()) {
                for item in items {
                    apply_defaults(is, item);
                }
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> Value {
        json!({
            "type": "object",
            "properties": {
                "spec": {
                    "type": "object",
                    "required": ["service"],
                    "properties": {
                        "service": {"type": "string", "minLength": 1, "maxLength": 10, "pattern": "^[a-z-]+$"},
                        "replicas": {"type": "integer", "minimum": 0, "maximum": 5, "default": 1},
                        "mode": {"type": "string", "enum": ["a", "b"]},
                        "target": {"x-kubernetes-int-or-string": true},
                        "note": {"type": "string", "nullable": true},
                        "since": {"type": "string", "format": "date-time"},
                        "ports": {
                            "type": "array", "maxItems": 2,
                            "x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["port"],
                            "items": {"type": "object", "required": ["port"],
                                      "properties": {"port": {"type": "integer"}, "name": {"type": "string", "default": "p"}}}
                        },
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                                 "properties": {"known": {"type": "object", "properties": {"a": {"type": "string"}}}}}
                    }
                },
                "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}}
            }
        })
    }

    fn compiled() -> StructuralSchema {
        StructuralSchema::compile(&schema()).expect("valid schema")
    }

    fn messages(obj: Value) -> Vec<String> {
        compiled()
            .validate(&obj)
            .into_iter()
            .map(|e| e.message)
            .collect()
    }

    #[test]
    fn valid_object_has_no_errors() {
        let errs = messages(
            json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "n"},
            "spec": {"service": "web", "replicas": 2, "mode": "a", "target": "http", "note": null,
                     "since": "2026-01-01T00:00:00Z", "ports": [{"port": 80}], "labels": {"a": "b"}}}),
        );
        assert!(errs.is_empty(), "{errs:?}");
        assert!(messages(json!({"spec": {"service": "web", "target": 8080}})).is_empty());
    }

    #[test]
    fn type_error_has_kubernetes_format() {
        let errs = messages(json!({"spec": {"service": "web", "replicas": "string"}}));
        assert_eq!(
            errs,
            vec![
                r#"spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer: "string""#
            ]
        );
        let e = &compiled().validate(&json!({"spec": {"service": "web", "replicas": "x"}}))[0];
        assert_eq!(e.field, "spec.replicas");
        assert_eq!(e.kind, FieldErrorKind::TypeInvalid);
        assert_eq!(e.kind.reason(), "FieldValueTypeInvalid");
    }

    #[test]
    fn required_fields_name_the_missing_child() {
        assert_eq!(
            messages(json!({"spec": {}})),
            vec!["spec.service: Required value"]
        );
        let e = compiled().validate(&json!({"spec": {"service": "w", "ports": [{"name": "x"}]}}));
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].field, "spec.ports[0].port");
        assert_eq!(e[0].kind, FieldErrorKind::Required);
        assert_eq!(e[0].message, "spec.ports[0].port: Required value");
    }

    #[test]
    fn enum_pattern_lengths_and_bounds() {
        assert_eq!(
            messages(json!({"spec": {"service": "w", "mode": "c"}})),
            vec![r#"spec.mode: Unsupported value: "c": supported values: "a", "b""#]
        );
        assert_eq!(
            messages(json!({"spec": {"service": "Web"}})),
            vec![
                r#"spec.service: Invalid value: "Web": spec.service in body should match '^[a-z-]+$'"#
            ]
        );
        assert_eq!(
            messages(json!({"spec": {"service": "abcdefghijk"}})),
            vec!["spec.service: Too long: may not be more than 10 bytes"]
        );
        assert!(
            messages(json!({"spec": {"service": ""}}))
                .iter()
                .any(|m| m.contains("should be at least 1 chars long"))
        );
        assert_eq!(
            messages(json!({"spec": {"service": "w", "replicas": 6}})),
            vec![
                "spec.replicas: Invalid value: 6: spec.replicas in body should be less than or equal to 5"
            ]
        );
        assert_eq!(
            messages(json!({"spec": {"service": "w", "replicas": -1}})),
            vec![
                "spec.replicas: Invalid value: -1: spec.replicas in body should be greater than or equal to 0"
            ]
        );
        assert_eq!(
            messages(
                json!({"spec": {"service": "w", "ports": [{"port": 1}, {"port": 2}, {"port": 3}]}})
            ),
            vec!["spec.ports: Too many: 3: must have at most 2 items"]
        );
    }

    #[test]
    fn non_nullable_nulls_without_defaults_are_pruned() {
        let s = StructuralSchema::compile(&json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "a": {"type": "object"},
                "b": {"type": "string", "nullable": true},
                "c": {"type": "string", "default": "x"},
                "m": {"type": "object", "additionalProperties": {"type": "object"}}}}}}))
        .expect("schema");
        let mut obj = json!({"spec": {"a": null, "b": null, "c": null, "m": {"k": null}}});
        s.prune_non_nullable_nulls(&mut obj);
        assert_eq!(obj, json!({"spec": {"b": null, "c": null, "m": {}}}));
    }

    #[test]
    fn nullable_int_or_string_and_format() {
        let errs = messages(json!({"spec": {"service": "w", "replicas": null}}));
        assert_eq!(errs.len(), 1, "replicas is not nullable: {errs:?}");
        assert!(
            errs[0].starts_with("spec.replicas: Invalid value: \"null\""),
            "{errs:?}"
        );
        assert!(
            messages(json!({"spec": {"service": "w", "target": true}}))[0]
                .contains("must be of type integer/string")
        );
        let errs = messages(json!({"spec": {"service": "w", "since": "yesterday"}}));
        assert_eq!(
            errs,
            vec![
                r#"spec.since: Invalid value: "yesterday": spec.since in body must be of type date-time: "yesterday""#
            ]
        );
        let errs = messages(json!({"spec": {"service": "w", "labels": {"a": 1}}}));
        assert_eq!(
            errs,
            vec![
                r#"spec.labels.a: Invalid value: "integer": spec.labels.a in body must be of type string: "integer""#
            ]
        );
    }

    #[test]
    fn several_errors_and_invalid_message() {
        let errs = compiled().validate(&json!({"spec": {"replicas": "x", "mode": "z"}}));
        assert_eq!(errs.len(), 3, "{errs:?}");
        let msg = invalid_message("DiscoveredService", "kubediscovery.io", "web", &errs);
        assert!(msg.starts_with(r#"DiscoveredService.kubediscovery.io "web" is invalid: [spec.mode: Unsupported value"#), "{msg}");
        assert_eq!(
            invalid_message("ConfigMap", "", "c", &errs[..1]),
            format!("ConfigMap \"c\" is invalid: {}", errs[0].message)
        );
    }

    #[test]
    fn prune_drops_unknown_fields_but_keeps_root_meta() {
        let mut obj = json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "n", "labels": {"a": "b"}},
            "spec": {"service": "w", "bogus": 1, "ports": [{"port": 80, "extra": true}], "labels": {"any": "x"},
                     "free": {"anything": {"deep": 1}, "known": {"a": "x", "b": "pruned"}}},
            "status": {"ready": true, "junk": 1},
            "top": "level"});
        let removed = compiled().prune_with_paths(&mut obj);
        let mut sorted = removed.clone();
        sorted.sort();
        assert_eq!(
            sorted,
            vec![
                "spec.bogus",
                "spec.free.known.b",
                "spec.ports[0].extra",
                "status.junk",
                "top"
            ]
        );
        assert_eq!(
            obj,
            json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "n", "labels": {"a": "b"}},
            "spec": {"service": "w", "ports": [{"port": 80}], "labels": {"any": "x"},
                     "free": {"anything": {"deep": 1}, "known": {"a": "x"}}},
            "status": {"ready": true}})
        );
    }

    #[test]
    fn undeclared_fields_stop_at_the_first_unknown_field_of_an_object() {
        let obj = json!({"apiVersion": "x/v1", "kind": "K", "metadata": {"name": "n", "junk": 1},
            "spec": {"service": "w", "zbogus": 1, "abogus": 2, "ports": [{"port": 80, "extra": true}],
                     "labels": {"any": "x"}, "free": {"anything": {"deep": 1}}},
            "status": {"ready": true, "junk": 1},
            "top": "level"});
        // `spec.abogus` ends the walk of `spec` (sorted: before `ports`);
        // `status` and the root go on past their own unknown fields' siblings.
        assert_eq!(
            compiled().undeclared_fields(&obj),
            vec![".spec.abogus", ".status.junk", ".top"]
        );
        let obj =
            json!({"spec": {"service": "w", "ports": [{"port": 80}, {"port": 81, "extra": 1}]}});
        assert_eq!(
            compiled().undeclared_fields(&obj),
            vec![".spec.ports[port=81].extra"]
        );
        // Under x-kubernetes-preserve-unknown-fields only declared subtrees are checked.
        let obj = json!({"spec": {"service": "w", "free": {"x": 1, "known": {"a": "x", "b": 1}}}});
        assert_eq!(
            compiled().undeclared_fields(&obj),
            vec![".spec.free.known.b"]
        );
        let keyed = StructuralSchema::compile(&json!({"type": "object", "properties": {
            "ports": {"type": "array", "x-kubernetes-list-type": "map",
                      "x-kubernetes-list-map-keys": ["name"],
                      "items": {"type": "object", "required": ["name"],
                                "properties": {"name": {"type": "string"}}}}}}))
        .expect("schema");
        assert_eq!(
            keyed.undeclared_fields(&json!({"ports": [{"name": "http", "x": 1}]})),
            vec![r#".ports[name="http"].x"#]
        );
        let clean = json!({"spec": {"service": "w", "ports": [{"port": 80}, {"port": 81}]}});
        assert!(compiled().undeclared_fields(&clean).is_empty());
    }

    #[test]
    fn prune_object_without_properties_and_embedded_resources() {
        let s = StructuralSchema::compile(&json!({"type": "object", "properties": {
            "spec": {"type": "object", "properties": {
                "empty": {"type": "object"},
                "tpl": {"type": "object", "x-kubernetes-embedded-resource": true, "x-kubernetes-preserve-unknown-fields": true}
            }}}}))
        .expect("schema");
        let mut obj = json!({"spec": {"empty": {"x": 1}, "tpl": {"apiVersion": "v1", "kind": "Pod", "spec": {"a": 1}}}});
        s.prune(&mut obj);
        assert_eq!(
            obj,
            json!({"spec": {"empty": {}, "tpl": {"apiVersion": "v1", "kind": "Pod", "spec": {"a": 1}}}})
        );
    }

    #[test]
    fn defaults_are_applied() {
        let mut obj =
            json!({"spec": {"service": "w", "ports": [{"port": 80}, {"port": 81, "name": "x"}]}});
        compiled().default(&mut obj);
        assert_eq!(obj["spec"]["replicas"], 1);
        assert_eq!(
            obj["spec"]["ports"],
            json!([{"port": 80, "name": "p"}, {"port": 81, "name": "x"}])
        );
        let mut obj = json!({"spec": {"service": "w", "replicas": null}});
        compiled().default(&mut obj);
        assert_eq!(
            obj["spec"]["replicas"], 1,
            "null on a non-nullable field is defaulted"
        );
        let mut obj = json!({"spec": {"service": "w", "replicas": 3}});
        compiled().default(&mut obj);
        assert_eq!(obj["spec"]["replicas"], 3);
    }

    #[test]
    fn compile_rejects_non_structural_schemas() {
        let e = StructuralSchema::compile(
            &json!({"type": "object", "properties": {"spec": {"properties": {}}}}),
        )
        .expect_err("no type");
        assert_eq!(
            e,
            "openAPIV3Schema.properties[spec].type: Required value: must not be empty for specified object fields"
        );
        assert!(StructuralSchema::compile(&json!({"type": "string"})).is_err());
        let e = StructuralSchema::compile(
            &json!({"type": "object", "properties": {"s": {"type": "string", "pattern": "(["}}}),
        )
        .expect_err("bad regex");
        assert!(e.starts_with("openAPIV3Schema: Invalid value"), "{e}");
        assert!(
            StructuralSchema::compile(
                &json!({"type": "object", "properties": {"x": {"type": "strin"}}})
            )
            .is_err()
        );
    }

    #[test]
    fn exclusive_bounds_openapi_v3_0_style() {
        let s = StructuralSchema::compile(&json!({"type": "object", "properties": {
            "n": {"type": "number", "maximum": 5, "exclusiveMaximum": true, "minimum": 0.0, "exclusiveMinimum": true}}}))
        .expect("schema");
        assert!(s.validate(&json!({"n": 4.5})).is_empty());
        let e = s.validate(&json!({"n": 5}));
        assert_eq!(e.len(), 1, "{e:?}");
        assert_eq!(
            e[0].message,
            "n: Invalid value: 5: n in body should be less than 5"
        );
        let e = s.validate(&json!({"n": 0}));
        assert_eq!(
            e[0].message,
            "n: Invalid value: 0: n in body should be greater than 0"
        );
    }

    #[test]
    fn byte_format_is_base64() {
        let s = StructuralSchema::compile(&json!({"type": "object", "properties": {"b": {"type": "string", "format": "byte"}, "i": {"type": "integer", "format": "int32"}}}))
            .expect("schema");
        assert!(s.validate(&json!({"b": "aGVsbG8=", "i": 1})).is_empty());
        let e = s.validate(&json!({"b": "not base64!"}));
        assert_eq!(
            e[0].message,
            r#"b: Invalid value: "not base64!": b in body must be of type byte: "not base64!""#
        );
    }

    /// The project's own CRD (generated by `controller/core`) must compile and
    /// validate the objects the controller writes.
    #[test]
    fn project_crd_compiles_and_validates() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../crds/discoveredservices.yaml"
        );
        let text =
            std::fs::read_to_string(path).unwrap_or_else(|e| panic!("cannot read {path}: {e}"));
        let crd: Value =
            serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("{path} is not YAML: {e}"));
        let schema = crd
            .pointer("/spec/versions/0/schema/openAPIV3Schema")
            .unwrap_or_else(|| panic!("{path}: no spec.versions[0].schema.openAPIV3Schema"));
        let s = StructuralSchema::compile(schema).expect("project CRD schema compiles");
        let mut obj = json!({"apiVersion": "kubediscovery.io/v1alpha1", "kind": "DiscoveredService",
            "metadata": {"name": "web", "namespace": "kd"},
            "spec": {"service": "kd/web", "source": "EndpointSlice", "sourceName": "web", "sourceNamespace": "kd",
                     "version": "0123456789abcdef", "ports": {"http": [{"host": "10.0.0.1", "port": 8080, "weight": 100}]},
                     "unknown": 1}});
        s.prune(&mut obj);
        assert!(obj["spec"].get("unknown").is_none());
        s.default(&mut obj);
        assert_eq!(obj["spec"]["cluster"], "");
        assert!(s.validate(&obj).is_empty(), "{:?}", s.validate(&obj));
        obj["spec"]["ports"]["http"][0]["port"] = json!(70000);
        obj["spec"]["source"] = json!("Pods");
        let msgs: Vec<String> = s.validate(&obj).into_iter().map(|e| e.message).collect();
        assert_eq!(
            msgs,
            vec![
                "spec.ports.http[0].port: Invalid value: 70000: spec.ports.http[0].port in body should be less than or equal to 65535".to_string(),
                r#"spec.source: Unsupported value: "Pods": supported values: "Endpoints", "EndpointSlice""#.to_string(),
            ]
        );
    }

    #[test]
    fn list_type_duplicates() {
        let e = compiled().validate(&json!({"spec": {"service": "w", "ports": [{"port": 80, "name": "a"}, {"port": 80, "name": "b"}]}}));
        assert_eq!(e.len(), 1, "{e:?}");
        assert_eq!(
            e[0].message,
            r#"spec.ports[1]: Duplicate value: {"port":80}"#
        );
        assert_eq!(e[0].kind.reason(), "FieldValueDuplicate");
        let s = StructuralSchema::compile(&json!({"type": "object", "properties": {
            "tags": {"type": "array", "x-kubernetes-list-type": "set", "items": {"type": "string"}}}}))
        .expect("schema");
        assert!(s.validate(&json!({"tags": ["a", "b"]})).is_empty());
        assert_eq!(
            s.validate(&json!({"tags": ["a", "a"]}))[0].message,
            r#"tags[1]: Duplicate value: "a""#
        );
    }

    #[test]
    fn list_types_from_schema() {
        let s = compiled();
        assert_eq!(
            s.list_type_at(&["spec", "ports"]),
            ListType::Map(vec!["port".into()])
        );
        assert_eq!(s.list_type_at(&["spec", "service"]), ListType::Atomic);
        assert_eq!(s.list_type_at(&["spec", "nope"]), ListType::Atomic);
    }
}
