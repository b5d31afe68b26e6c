//! Name validation with the rules and messages of
//! `k8s.io/apimachinery/pkg/util/validation`.
//!
//! Each validator returns `Err(message)` with the exact Kubernetes text; when a
//! value breaks several rules (too long *and* bad characters) the messages are
//! joined with `"; "` in the order Kubernetes reports them (length first).
//! [`validate_object_name`] picks the rule a given kind uses for
//! `metadata.name` (Namespace: DNS-1123 label, Service: DNS-1035 label, RBAC
//! kinds: path segment, everything else: DNS-1123 subdomain).

use std::sync::LazyLock;

use regex::Regex;

const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1123_SUBDOMAIN_FMT: &str = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
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
    if errs.is_empty() { Ok(()) } else { Err(errs.join("; ")) }
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
            errs.push(format!("name part {}", max_len_error(QUALIFIED_NAME_MAX_LENGTH)));
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
        let max = format!("{}.{}.{}.{}", "a".repeat(63), "b".repeat(63), "c".repeat(63), "d".repeat(61));
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
        assert!(e.starts_with("must be no more than 63 characters; a lowercase RFC 1123 label"), "{e}");
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
        assert_eq!(validate_qualified_name("/x").expect_err("empty prefix"), "prefix part must be non-empty");
        assert_eq!(validate_qualified_name("x/").expect_err("empty name"), "name part must be non-empty");
        assert!(validate_qualified_name("a/b/c").expect_err("slashes").contains("with an optional DNS subdomain prefix"));
        assert!(validate_qualified_name("UP/x").expect_err("prefix").starts_with("prefix part a lowercase RFC 1123 subdomain"));
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
        assert_eq!(validate_object_name("ClusterRole", "a/b").expect_err("slash"), "may not contain '/'");
        assert!(validate_object_name("ConfigMap", "").is_err());
    }
}
