//! Kubernetes field errors (`k8s.io/apimachinery/pkg/util/validation/field`),
//! shared by schema validation and object-meta validation.
//!
//! A [`FieldError`] carries the field path, the error type (whose
//! [`FieldErrorKind::reason`] is the `Status.details.causes[].reason`) and the
//! complete rendered message (`metadata.name: Required value: name or
//! generateName is required`). [`invalid_message`] renders the 422
//! `Status.message` the way the API server does.

use std::fmt;

/// Kubernetes `field.ErrorType`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldErrorKind {
    /// `Required value`
    Required,
    /// `Invalid value`
    Invalid,
    /// `Invalid value` of the wrong type (a schema's `type`)
    TypeInvalid,
    /// `Unsupported value` (enum)
    NotSupported,
    /// `Too long`
    TooLong,
    /// `Too many`
    TooMany,
    /// `Forbidden`
    Forbidden,
    /// `Duplicate value`
    Duplicate,
}

impl FieldErrorKind {
    /// The `reason` of a `Status` cause, e.g. `FieldValueRequired`.
    pub fn reason(self) -> &'static str {
        match self {
            FieldErrorKind::Required => "FieldValueRequired",
            FieldErrorKind::Invalid => "FieldValueInvalid",
            FieldErrorKind::TypeInvalid => "FieldValueTypeInvalid",
            FieldErrorKind::NotSupported => "FieldValueNotSupported",
            FieldErrorKind::TooLong => "FieldValueTooLong",
            FieldErrorKind::TooMany => "FieldValueTooMany",
            FieldErrorKind::Forbidden => "FieldValueForbidden",
            FieldErrorKind::Duplicate => "FieldValueDuplicate",
        }
    }
}

/// One validation error. `message` is the complete Kubernetes text including
/// the field, e.g. `spec.ports[0].port: Required value`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    /// The field path, e.g. `spec.ports[0].port` (empty for the root).
    pub field: String,
    /// The error type.
    pub kind: FieldErrorKind,
    /// The full message.
    pub message: String,
}

impl FieldError {
    /// Builds an error; `detail` is the text after `<field>: `, e.g. `Required value`.
    pub fn new(field: impl Into<String>, kind: FieldErrorKind, detail: impl AsRef<str>) -> Self {
        let field = field.into();
        let label = if field.is_empty() {
            "<root>"
        } else {
            field.as_str()
        };
        FieldError {
            message: format!("{label}: {}", detail.as_ref()),
            field,
            kind,
        }
    }

    /// The text after `<field>: `.
    pub fn detail(&self) -> &str {
        self.message
            .split_once(": ")
            .map_or(self.message.as_str(), |(_, d)| d)
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// The 422 message for an invalid object:
/// `DiscoveredService.kubediscovery.io "web" is invalid: spec.x: Required value`
/// (several errors are wrapped in `[..]`, comma-separated, like the API server).
pub fn invalid_message(kind: &str, group: &str, name: &str, errors: &[FieldError]) -> String {
    let qualified = if group.is_empty() {
        kind.to_string()
    } else {
        format!("{kind}.{group}")
    };
    let list: Vec<&str> = errors.iter().map(|e| e.message.as_str()).collect();
    let body = match list.as_slice() {
        [one] => one.to_string(),
        many => format!("[{}]", many.join(", ")),
    };
    format!("{qualified} {name:?} is invalid: {body}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_is_field_then_detail() {
        let e = FieldError::new(
            "metadata.name",
            FieldErrorKind::Required,
            "Required value: name or generateName is required",
        );
        assert_eq!(
            e.message,
            "metadata.name: Required value: name or generateName is required"
        );
        assert_eq!(
            e.detail(),
            "Required value: name or generateName is required"
        );
        assert_eq!(e.to_string(), e.message);
        assert_eq!(e.field, "metadata.name");
    }

    #[test]
    fn root_field_is_labelled() {
        let e = FieldError::new("", FieldErrorKind::Invalid, "Invalid value: \"x\": bad");
        assert_eq!(e.message, "<root>: Invalid value: \"x\": bad");
        assert_eq!(e.field, "");
        assert_eq!(e.detail(), "Invalid value: \"x\": bad");
    }

    #[test]
    fn reasons_are_the_status_cause_reasons() {
        let all = [
            (FieldErrorKind::Required, "FieldValueRequired"),
            (FieldErrorKind::Invalid, "FieldValueInvalid"),
            (FieldErrorKind::TypeInvalid, "FieldValueTypeInvalid"),
            (FieldErrorKind::NotSupported, "FieldValueNotSupported"),
            (FieldErrorKind::TooLong, "FieldValueTooLong"),
            (FieldErrorKind::TooMany, "FieldValueTooMany"),
            (FieldErrorKind::Forbidden, "FieldValueForbidden"),
            (FieldErrorKind::Duplicate, "FieldValueDuplicate"),
        ];
        for (kind, reason) in all {
            assert_eq!(kind.reason(), reason);
        }
    }

    #[test]
    fn invalid_message_one_error_is_bare() {
        let errs = [FieldError::new(
            "spec.x",
            FieldErrorKind::Required,
            "Required value",
        )];
        assert_eq!(
            invalid_message("DiscoveredService", "kubediscovery.io", "web", &errs),
            r#"DiscoveredService.kubediscovery.io "web" is invalid: spec.x: Required value"#
        );
    }

    #[test]
    fn invalid_message_core_group_and_several_errors() {
        let errs = [
            FieldError::new("spec.a", FieldErrorKind::Required, "Required value"),
            FieldError::new(
                "spec.b",
                FieldErrorKind::NotSupported,
                r#"Unsupported value: "c": supported values: "a", "b""#,
            ),
        ];
        assert_eq!(
            invalid_message("ConfigMap", "", "cfg", &errs),
            r#"ConfigMap "cfg" is invalid: [spec.a: Required value, spec.b: Unsupported value: "c": supported values: "a", "b"]"#
        );
    }
}
