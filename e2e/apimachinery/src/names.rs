//! Name validation with the rules and messages of
//! `k8s.io/apimachinery/pkg/util/validation`.
//!
//! Each validator returns `Err(message)` with the exact Kubernetes text; when a
//! value breaks several rules (too long *and* bad characters) the messages are
//! joined with `"; "` in the order Kubernetes reports them (length first).
//! [`validate_object_name`] picks the rule a given kind uses for
//! `metadata.name` (Namespace: DNS-1123 label, Service: DNS-1035 label, RBAC
//! kinds: path segment, everything else: DNS-1123 subdomain), and
//! [`validate_object_meta`] checks the whole `metadata` of an incoming object
//! (name/generateName, namespace presence, labels, annotations) the way
//! `ValidateObjectMeta` does, returning [`FieldError`]s.

use std::sync::LazyLock;

use regex::Regex;
use serde_json::Value;

use crate::field::{FieldError, FieldErrorKind};

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_SUBDOMAIN_FMT: &str =
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const DNS1035_LABEL_FMT: &str = "[a-z]([-a-z0-9]*[a-z0-9])?";
const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";

/// Maximum length of a DNS-1123 / DNS-1035 label.
pub const DNS1123_LABEL_MAX_LENGTH: usize = 63;
/// Maximum length of a DNS-1123 subdomain.
pub const DNS1123_SUBDOMAIN_MAX_LENGTH: usize = 253;
/// Maximum length of the name part of a qualified name and of a label value.
pub const QUALIFIED_NAME_MAX_LENGTH: usize = 63;

fn anchored(fmt: &str) -> Regex {
    #[allow(clippy::expect_used)]
    Regex::new(&format!("^{fmt}$")).expect("static regex compiles")
}

static DNS1123_LABEL_RE: LazyLock<Regex> = LazyLock::new(|| anchored(DNS1123_LABEL_FMT));
static DNS1123_SUBDOMAIN_RE: LazyLock<Regex> = LazyLock::new(|| anchored(DNS1123_SUBDOMAIN_FMT));
static DNS1035_LABEL_RE: LazyLock<Regex> = LazyLock::new(|| anchored(DNS1035_LABEL_FMT));
static QUALIFIED_NAME_RE: LazyLock<Regex> = LazyLock::new(|| anchored(QUALIFIED_NAME_FMT));
static LABEL_VALUE_RE: LazyLock<Regex> = LazyLock::new(|| anchored(LABEL_VALUE_FMT));

fn max_len_error(n: usize) -> String {
    format!("must be no more than {n} characters")
}

fn join(errs: Vec<String>) -> Result<(), String> {
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs.join("; "))
    }
}

fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    let mut s = msg.to_string();
    if !examples.is_empty() {
        let ex: Vec<String> = examples.iter().map(|e| format!("'{e}'")).collect();
        s.push_str(&format!(" (e.g. {}, ", ex.join(",  or ")));
    } else {
        s.push_str(" (");
    }
    s.push_str(&format!("regex used for validation is '{fmt}')"));
    s
}

/// `validation.IsDNS1123Label`: at most 63 characters, `[a-z0-9]([-a-z0-9]*[a-z0-9])?`.
pub fn validate_dns1123_label(s: &str) -> Result<(), String> {
    let mut errs = Vec::new();
    if s.len() > DNS1123_LABEL_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_LABEL_MAX_LENGTH));
    }
    if !DNS1123_LABEL_RE.is_match(s) {
        errs.push(regex_error(
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character",
            DNS1123_LABEL_FMT,
            &["my-name", "123-abc"],
        ));
    }
    join(errs)
}

/// `validation.IsDNS1123Subdomain`: at most 253 characters, dot-separated labels.
pub fn validate_dns1123_subdomain(s: &str) -> Result<(), String> {
    let mut errs = Vec::new();
    if s.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX_LENGTH));
    }
    if !DNS1123_SUBDOMAIN_RE.is_match(s) {
        errs.push(regex_error(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    join(errs)
}

/// `validation.IsDNS1035Label` (Service names): must start with a letter.
pub fn validate_dns1035_label(s: &str) -> Result<(), String> {
    let mut errs = Vec::new();
    if s.len() > DNS1123_LABEL_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_LABEL_MAX_LENGTH));
    }
    if !DNS1035_LABEL_RE.is_match(s) {
        errs.push(regex_error(
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character",
            DNS1035_LABEL_FMT,
            &["my-name", "abc-123"],
        ));
    }
    join(errs)
}

/// `path.IsValidPathSegmentName` (used for RBAC object names).
pub fn validate_path_segment_name(s: &str) -> Result<(), String> {
    if s == "." || s == ".." {
        return Err(format!("may not be '{s}'"));
    }
    for bad in ["/", "%"] {
        if s.contains(bad) {
            return Err(format!("may not contain '{bad}'"));
        }
    }
    Ok(())
}

/// `validation.IsQualifiedName` (label and annotation keys): `[prefix/]name`.
pub fn validate_qualified_name(s: &str) -> Result<(), String> {
    let parts: Vec<&str> = s.split('/').collect();
    let (prefix, name) = match parts.as_slice() {
        [name] => (None, *name),
        [prefix, name] => (Some(*prefix), *name),
        _ => {
            return Err(format!(
                "{} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(
                    "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
                    QUALIFIED_NAME_FMT,
                    &["MyName", "my.name", "123-abc"],
                )
            ));
        }
    };
    let mut errs = Vec::new();
    if let Some(prefix) = prefix {
        if prefix.is_empty() {
            errs.push("prefix part must be non-empty".to_string());
        } else if let Err(e) = validate_dns1123_subdomain(prefix) {
            errs.extend(e.split("; ").map(|m| format!("prefix part {m}")));
        }
    }
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else {
        if name.len() > QUALIFIED_NAME_MAX_LENGTH {
            errs.push(format!(
                "name part {}",
                max_len_error(QUALIFIED_NAME_MAX_LENGTH)
            ));
        }
        if !QUALIFIED_NAME_RE.is_match(name) {
            errs.push(format!(
                "name part {}",
                regex_error(
                    "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
                    QUALIFIED_NAME_FMT,
                    &["MyName", "my.name", "123-abc"],
                )
            ));
        }
    }
    join(errs)
}

/// `validation.IsValidLabelValue`: empty, or at most 63 characters of `[-A-Za-z0-9_.]`
/// starting and ending alphanumeric.
pub fn validate_label_value(s: &str) -> Result<(), String> {
    let mut errs = Vec::new();
    if s.len() > QUALIFIED_NAME_MAX_LENGTH {
        errs.push(max_len_error(QUALIFIED_NAME_MAX_LENGTH));
    }
    if !LABEL_VALUE_RE.is_match(s) {
        errs.push(regex_error(
            "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    join(errs)
}

/// Validates `metadata.name` for an object of `kind` with the rule the real API
/// server applies to that kind.
pub fn validate_object_name(kind: &str, name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("name or generateName is required".to_string());
    }
    match kind {
        "Namespace" => validate_dns1123_label(name),
        "Service" => validate_dns1035_label(name),
        "Role" | "ClusterRole" | "RoleBinding" | "ClusterRoleBinding" => {
            validate_path_segment_name(name)
        }
        _ => validate_dns1123_subdomain(name),
    }
}

/// Maximum total size of all annotation keys and values.
pub const TOTAL_ANNOTATION_SIZE_LIMIT_BYTES: usize = 256 * 1024;

fn invalid(field: &str, value: &str, msg: &str) -> FieldError {
    FieldError::new(
        field,
        FieldErrorKind::Invalid,
        format!("Invalid value: {value:?}: {msg}"),
    )
}

/// `ValidateObjectMeta` for an object of `kind`: `metadata.name` (or
/// `generateName`, validated with its trailing `-` masked), `metadata.namespace`
/// (required and a DNS label for namespaced kinds, forbidden otherwise), label
/// keys and values, annotation keys and total size. Only `metadata` is looked at.
pub fn validate_object_meta(kind: &str, obj: &Value, namespaced: bool) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let meta = obj.get("metadata");
    let text = |k: &str| {
        meta.and_then(|m| m.get(k))
            .and_then(Value::as_str)
            .unwrap_or("")
    };
    let name = text("name");
    let generate_name = text("generateName");
    if name.is_empty() && generate_name.is_empty() {
        errs.push(FieldError::new(
            "metadata.name",
            FieldErrorKind::Required,
            "Required value: name or generateName is required",
        ));
    }
    if !name.is_empty()
        && let Err(e) = validate_object_name(kind, name)
    {
        errs.push(invalid("metadata.name", name, &e));
    }
    if !generate_name.is_empty() {
        let masked = generate_name
            .strip_suffix('-')
            .map(|p| format!("{p}a"))
            .unwrap_or_else(|| generate_name.to_string());
        if let Err(e) = validate_object_name(kind, &masked) {
            errs.push(invalid("metadata.generateName", generate_name, &e));
        }
    }
    let namespace = text("namespace");
    if namespaced {
        if namespace.is_empty() {
            errs.push(FieldError::new(
                "metadata.namespace",
                FieldErrorKind::Required,
                "Required value",
            ));
        } else if let Err(e) = validate_dns1123_label(namespace) {
            errs.push(invalid("metadata.namespace", namespace, &e));
        }
    } else if !namespace.is_empty() {
        errs.push(FieldError::new(
            "metadata.namespace",
            FieldErrorKind::Forbidden,
            "Forbidden: not allowed on this type",
        ));
    }
    if let Some(labels) = meta.and_then(|m| m.get("labels")).filter(|v| !v.is_null()) {
        match labels.as_object() {
            None => errs.push(FieldError::new(
                "metadata.labels",
                FieldErrorKind::Invalid,
                "Invalid value: must be an object of strings",
            )),
            Some(map) => {
                for (k, v) in map {
                    if let Err(e) = validate_qualified_name(k) {
                        errs.push(invalid("metadata.labels", k, &e));
                    }
                    match v.as_str() {
                        Some(v) => {
                            if let Err(e) = validate_label_value(v) {
                                errs.push(invalid("metadata.labels", v, &e));
                            }
                        }
                        None => errs.push(FieldError::new(
                            format!("metadata.labels.{k}"),
                            FieldErrorKind::Invalid,
                            format!("Invalid value: {v}: must be a string"),
                        )),
                    }
                }
            }
        }
    }
    if let Some(annotations) = meta
        .and_then(|m| m.get("annotations"))
        .filter(|v| !v.is_null())
    {
        match annotations.as_object() {
            None => errs.push(FieldError::new(
                "metadata.annotations",
                FieldErrorKind::Invalid,
                "Invalid value: must be an object of strings",
            )),
            Some(map) => {
                let mut total = 0;
                for (k, v) in map {
                    if let Err(e) = validate_qualified_name(&k.to_lowercase()) {
                        errs.push(invalid("metadata.annotations", k, &e));
                    }
                    match v.as_str() {
                        Some(v) => total += k.len() + v.len(),
                        None => errs.push(FieldError::new(
                            format!("metadata.annotations.{k}"),
                            FieldErrorKind::Invalid,
                            format!("Invalid value: {v}: must be a string"),
                        )),
                    }
                }
                if total > TOTAL_ANNOTATION_SIZE_LIMIT_BYTES {
                    errs.push(FieldError::new(
                        "metadata.annotations",
                        FieldErrorKind::TooLong,
                        format!("Too long: may not be more than {TOTAL_ANNOTATION_SIZE_LIMIT_BYTES} bytes"),
                    ));
                }
            }
        }
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns1123_label_accepts_and_rejects() {
        assert!(validate_dns1123_label("my-name").is_ok());
        assert!(validate_dns1123_label("123-abc").is_ok());
        assert!(validate_dns1123_label(&"a".repeat(63)).is_ok());
        for bad in ["", "-a", "a-", "A", "a.b", "a_b"] {
            assert!(validate_dns1123_label(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            validate_dns1123_label("Foo").expect_err("upper"),
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')"
        );
        assert_eq!(
            validate_dns1123_label(&"a".repeat(64)).expect_err("long"),
            "must be no more than 63 characters"
        );
    }

    #[test]
    fn dns1123_subdomain_accepts_and_rejects() {
        assert!(validate_dns1123_subdomain("example.com").is_ok());
        assert!(validate_dns1123_subdomain("a").is_ok());
        let max = format!(
            "{}.{}.{}.{}",
            "a".repeat(63),
            "b".repeat(63),
            "c".repeat(63),
            "d".repeat(61)
        );
        assert_eq!(max.len(), 253);
        assert!(validate_dns1123_subdomain(&max).is_ok());
        assert_eq!(
            validate_dns1123_subdomain(&format!("{max}e")).expect_err("254"),
            "must be no more than 253 characters"
        );
        for bad in ["", ".a", "a.", "a..b", "A.com", "a_b"] {
            assert!(validate_dns1123_subdomain(bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            validate_dns1123_subdomain("Bad_Name").expect_err("bad"),
            r"a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
        );
    }

    #[test]
    fn both_errors_are_reported() {
        let e = validate_dns1123_label(&"A".repeat(64)).expect_err("bad");
        assert!(
            e.starts_with("must be no more than 63 characters; a lowercase RFC 1123 label"),
            "{e}"
        );
    }

    #[test]
    fn dns1035_label() {
        assert!(validate_dns1035_label("web").is_ok());
        let e = validate_dns1035_label("1web").expect_err("digit first");
        assert!(e.starts_with("a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character"), "{e}");
    }

    #[test]
    fn qualified_names() {
        assert!(validate_qualified_name("app").is_ok());
        assert!(validate_qualified_name("app.kubernetes.io/name").is_ok());
        assert!(validate_qualified_name("My_Name.x").is_ok());
        assert_eq!(
            validate_qualified_name("/x").expect_err("empty prefix"),
            "prefix part must be non-empty"
        );
        assert_eq!(
            validate_qualified_name("x/").expect_err("empty name"),
            "name part must be non-empty"
        );
        assert!(
            validate_qualified_name("a/b/c")
                .expect_err("slashes")
                .contains("with an optional DNS subdomain prefix")
        );
        assert!(
            validate_qualified_name("UP/x")
                .expect_err("prefix")
                .starts_with("prefix part a lowercase RFC 1123 subdomain")
        );
        assert_eq!(
            validate_qualified_name(&"n".repeat(64)).expect_err("long"),
            "name part must be no more than 63 characters"
        );
    }

    #[test]
    fn label_values() {
        assert!(validate_label_value("").is_ok());
        assert!(validate_label_value("MyValue").is_ok());
        assert!(validate_label_value("a-b_c.d").is_ok());
        assert!(validate_label_value("-a").is_err());
        assert!(validate_label_value("a b").is_err());
        assert!(validate_label_value(&"v".repeat(64)).is_err());
    }

    #[test]
    fn object_names_per_kind() {
        assert!(validate_object_name("Namespace", "kd").is_ok());
        assert!(validate_object_name("Namespace", "a.b").is_err());
        assert!(validate_object_name("Service", "1svc").is_err());
        assert!(validate_object_name("ConfigMap", "a.b").is_ok());
        assert!(validate_object_name("ClusterRole", "system:controller:x").is_ok());
        assert_eq!(
            validate_object_name("ClusterRole", "a/b").expect_err("slash"),
            "may not contain '/'"
        );
        assert!(validate_object_name("ConfigMap", "").is_err());
    }

    fn meta(m: Value) -> Value {
        serde_json::json!({"metadata": m})
    }

    fn msgs(kind: &str, obj: &Value, namespaced: bool) -> Vec<String> {
        validate_object_meta(kind, obj, namespaced)
            .into_iter()
            .map(|e| e.message)
            .collect()
    }

    #[test]
    fn object_meta_valid() {
        let obj = meta(
            serde_json::json!({"name": "web", "namespace": "kd", "labels": {"app.kubernetes.io/name": "web"},
                                           "annotations": {"Example.com/Note": "anything at all"}}),
        );
        assert!(msgs("ConfigMap", &obj, true).is_empty());
        assert!(
            msgs(
                "ConfigMap",
                &meta(serde_json::json!({"generateName": "web-", "namespace": "kd"})),
                true
            )
            .is_empty()
        );
    }

    #[test]
    fn object_meta_name_and_namespace() {
        assert_eq!(
            msgs(
                "ConfigMap",
                &meta(serde_json::json!({"namespace": "kd"})),
                true
            ),
            vec!["metadata.name: Required value: name or generateName is required"]
        );
        let m = msgs(
            "Service",
            &meta(serde_json::json!({"name": "1web", "namespace": "kd"})),
            true,
        );
        assert_eq!(m.len(), 1);
        assert!(
            m[0].starts_with(r#"metadata.name: Invalid value: "1web": a DNS-1035 label"#),
            "{m:?}"
        );
        assert_eq!(
            msgs("ConfigMap", &meta(serde_json::json!({"name": "c"})), true),
            vec!["metadata.namespace: Required value"]
        );
        assert_eq!(
            msgs(
                "ClusterRole",
                &meta(serde_json::json!({"name": "c", "namespace": "kd"})),
                false
            ),
            vec!["metadata.namespace: Forbidden: not allowed on this type"]
        );
        assert!(
            msgs(
                "ConfigMap",
                &meta(serde_json::json!({"name": "c", "namespace": "Bad_NS"})),
                true
            )[0]
            .starts_with(
                r#"metadata.namespace: Invalid value: "Bad_NS": a lowercase RFC 1123 label"#
            )
        );
        assert!(
            msgs(
                "ConfigMap",
                &meta(serde_json::json!({"generateName": "Bad-", "namespace": "kd"})),
                true
            )[0]
            .starts_with(r#"metadata.generateName: Invalid value: "Bad-""#)
        );
    }

    #[test]
    fn object_meta_labels_and_annotations() {
        let obj = meta(
            serde_json::json!({"name": "c", "namespace": "kd", "labels": {"-k": "v", "k": "-v", "n": 1}}),
        );
        let m = msgs("ConfigMap", &obj, true);
        assert_eq!(m.len(), 3, "{m:?}");
        assert!(
            m.iter().any(|e| e
                .starts_with(r#"metadata.labels: Invalid value: "-k": name part must consist of"#)),
            "{m:?}"
        );
        assert!(
            m.iter()
                .any(|e| e
                    .starts_with(r#"metadata.labels: Invalid value: "-v": a valid label must be"#)),
            "{m:?}"
        );
        assert!(
            m.contains(&"metadata.labels.n: Invalid value: 1: must be a string".to_string()),
            "{m:?}"
        );
        let big = "x".repeat(TOTAL_ANNOTATION_SIZE_LIMIT_BYTES);
        let obj = meta(
            serde_json::json!({"name": "c", "namespace": "kd", "annotations": {"a": big, "b/c/d": "x"}}),
        );
        let m = msgs("ConfigMap", &obj, true);
        assert!(
            m.contains(
                &"metadata.annotations: Too long: may not be more than 262144 bytes".to_string()
            ),
            "{m:?}"
        );
        assert!(
            m.iter()
                .any(|e| e.starts_with(r#"metadata.annotations: Invalid value: "b/c/d""#)),
            "{m:?}"
        );
    }
}
