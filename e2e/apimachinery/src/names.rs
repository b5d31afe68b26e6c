//! Object name and `metadata` validation. The name rules themselves (DNS-1123
//! label/subdomain, DNS-1035 label, qualified name, label value, path segment,
//! with the exact Kubernetes texts) are `k8s_syntax::names`, re-exported here;
//! a value that breaks several rules gets their messages joined with `"; "`.
//! [`validate_object_name`] picks the rule a given kind uses for
//! `metadata.name` (Namespace: DNS-1123 label, Service: DNS-1035 label, RBAC
//! kinds: path segment, everything else: DNS-1123 subdomain), and
//! [`validate_object_meta`] checks the whole `metadata` of an incoming object
//! (name/generateName, namespace presence, labels, annotations) the way
//! `ValidateObjectMeta` does, returning [`FieldError`]s.

use serde_json::Value;

use crate::field::{FieldError, FieldErrorKind};

pub use k8s_syntax::names::{
    DNS1123_LABEL_MAX_LENGTH, DNS1123_SUBDOMAIN_MAX_LENGTH, QUALIFIED_NAME_MAX_LENGTH,
    validate_dns1035_label, validate_dns1123_label, validate_dns1123_subdomain,
    validate_label_value, validate_path_segment_name, validate_qualified_name,
};

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
