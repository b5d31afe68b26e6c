//! Name validators with the rules and messages of apimachinery v0.34
//! (`k8s.io/apimachinery/pkg/util/validation/validation.go` and
//! `pkg/api/validation/path/name.go`).
//!
//! Each rule comes twice: `is_*` answers yes/no without allocating, and
//! `validate_*` returns the API server's message. When a value breaks several
//! rules (too long *and* bad characters), the messages are joined with `"; "` in
//! the order Kubernetes reports them (length first), which is how
//! `labels.Parse` and `ValidateLabels` print them.
//!
//! | rule | used by Kubernetes for | limit |
//! |------|------------------------|-------|
//! | [DNS-1123 label](validate_dns1123_label) | Namespace names, port names, hostnames | 63 |
//! | [DNS-1123 subdomain](validate_dns1123_subdomain) | most object names (ConfigMap, Lease, EndpointSlice, custom resources) | 253 |
//! | [DNS-1035 label](validate_dns1035_label) | Service names | 63 |
//! | [qualified name](validate_qualified_name) | label and annotation keys: `[prefix/]name` | name 63, prefix 253 |
//! | [label value](validate_label_value) | label values (may be empty) | 63 |
//! | [path segment](validate_path_segment_name) | RBAC object names | none |
//! | [DNS name](is_dns_name) | host names a resolver accepts (not an object-name rule) | 63 per label, 253 |
//!
//! The matchers are hand-written over bytes; the tests check them against the
//! regexes below (the ones apimachinery uses and prints).

/// `validation.DNS1123LabelMaxLength`.
pub const DNS1123_LABEL_MAX_LENGTH: usize = 63;
/// `validation.DNS1123SubdomainMaxLength`.
pub const DNS1123_SUBDOMAIN_MAX_LENGTH: usize = 253;
/// `validation.DNS1035LabelMaxLength`.
pub const DNS1035_LABEL_MAX_LENGTH: usize = 63;
/// `validation.qualifiedNameMaxLength`: the name part of a qualified name.
pub const QUALIFIED_NAME_MAX_LENGTH: usize = 63;
/// `validation.LabelValueMaxLength`.
pub const LABEL_VALUE_MAX_LENGTH: usize = 63;

/// `validation.dns1123LabelFmt`.
pub const DNS1123_LABEL_FMT: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
/// `validation.dns1123SubdomainFmt`.
pub const DNS1123_SUBDOMAIN_FMT: &str =
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
/// `validation.dns1035LabelFmt`.
pub const DNS1035_LABEL_FMT: &str = "[a-z]([-a-z0-9]*[a-z0-9])?";
/// `validation.qualifiedNameFmt`: the name part of a qualified name.
pub const QUALIFIED_NAME_FMT: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";
/// `validation.labelValueFmt`.
pub const LABEL_VALUE_FMT: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";

const DNS1123_LABEL_ERR_MSG: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character";
const DNS1123_SUBDOMAIN_ERR_MSG: &str = "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character";
const DNS1035_LABEL_ERR_MSG: &str = "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character";
const QUALIFIED_NAME_ERR_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";
const LABEL_VALUE_ERR_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character";

// --- matchers -------------------------------------------------------------

fn lower_alnum(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit()
}

fn lower_alnum_dash(b: u8) -> bool {
    lower_alnum(b) || b == b'-'
}

fn lower(b: u8) -> bool {
    b.is_ascii_lowercase()
}

fn alnum(b: u8) -> bool {
    b.is_ascii_alphanumeric()
}

fn qname_char(b: u8) -> bool {
    alnum(b) || matches!(b, b'-' | b'_' | b'.')
}

/// `^F(M*L)?$`: one `first` byte, or `first`, any `middle` bytes, one `last`.
/// Non-ASCII never matches (like the ASCII classes of the Go regexes).
fn shape(s: &str, first: fn(u8) -> bool, middle: fn(u8) -> bool, last: fn(u8) -> bool) -> bool {
    match s.as_bytes() {
        [] => false,
        [only] => first(*only),
        [f, mid @ .., l] => first(*f) && last(*l) && mid.iter().all(|&b| middle(b)),
    }
}

fn label_shape(s: &str) -> bool {
    shape(s, lower_alnum, lower_alnum_dash, lower_alnum)
}

fn subdomain_shape(s: &str) -> bool {
    s.split('.').all(label_shape)
}

fn dns1035_shape(s: &str) -> bool {
    shape(s, lower, lower_alnum_dash, lower_alnum)
}

fn qualified_name_part_shape(s: &str) -> bool {
    shape(s, alnum, qname_char, alnum)
}

fn label_value_shape(s: &str) -> bool {
    s.is_empty() || qualified_name_part_shape(s)
}

// --- messages ---------------------------------------------------------------

/// `validation.MaxLenError`.
fn max_len_error(n: usize) -> String {
    format!("must be no more than {n} characters")
}

/// `validation.RegexError`.
fn regex_error(msg: &str, fmt: &str, examples: &[&str]) -> String {
    let mut s = msg.to_string();
    if examples.is_empty() {
        s.push_str(&format!(" (regex used for validation is '{fmt}')"));
        return s;
    }
    s.push_str(" (e.g. ");
    for (i, e) in examples.iter().enumerate() {
        if i > 0 {
            s.push_str(" or ");
        }
        s.push_str(&format!("'{e}', "));
    }
    s.push_str(&format!("regex used for validation is '{fmt}')"));
    s
}

fn join(errs: Vec<String>) -> Result<(), String> {
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs.join("; "))
    }
}

// --- the rules --------------------------------------------------------------

/// Whether `s` passes [`validate_dns1123_label`].
pub fn is_dns1123_label(s: &str) -> bool {
    s.len() <= DNS1123_LABEL_MAX_LENGTH && label_shape(s)
}

/// `validation.IsDNS1123Label`: at most 63 characters of `[-a-z0-9]`,
/// alphanumeric at both ends. A valid subdomain that is no label is told
/// `must not contain dots`.
pub fn validate_dns1123_label(s: &str) -> Result<(), String> {
    let mut errs = Vec::new();
    if s.len() > DNS1123_LABEL_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_LABEL_MAX_LENGTH));
    }
    if !label_shape(s) {
        if subdomain_shape(s) {
            errs.push("must not contain dots".to_string());
        } else {
            errs.push(regex_error(
                DNS1123_LABEL_ERR_MSG,
                DNS1123_LABEL_FMT,
                &["my-name", "123-abc"],
            ));
        }
    }
    join(errs)
}

/// Whether `s` passes [`validate_dns1123_subdomain`].
pub fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= DNS1123_SUBDOMAIN_MAX_LENGTH && subdomain_shape(s)
}

/// `validation.IsDNS1123Subdomain`: at most 253 characters, dot-separated
/// DNS-1123 label shapes. The labels have no length limit of their own here
/// (see [`is_dns_name`] for that).
pub fn validate_dns1123_subdomain(s: &str) -> Result<(), String> {
    let mut errs = Vec::new();
    if s.len() > DNS1123_SUBDOMAIN_MAX_LENGTH {
        errs.push(max_len_error(DNS1123_SUBDOMAIN_MAX_LENGTH));
    }
    if !subdomain_shape(s) {
        errs.push(regex_error(
            DNS1123_SUBDOMAIN_ERR_MSG,
            DNS1123_SUBDOMAIN_FMT,
            &["example.com"],
        ));
    }
    join(errs)
}

/// Whether `s` passes [`validate_dns1035_label`].
pub fn is_dns1035_label(s: &str) -> bool {
    s.len() <= DNS1035_LABEL_MAX_LENGTH && dns1035_shape(s)
}

/// `validation.IsDNS1035Label` (Service names): a DNS-1123 label that starts
/// with a letter.
pub fn validate_dns1035_label(s: &str) -> Result<(), String> {
    let mut errs = Vec::new();
    if s.len() > DNS1035_LABEL_MAX_LENGTH {
        errs.push(max_len_error(DNS1035_LABEL_MAX_LENGTH));
    }
    if !dns1035_shape(s) {
        errs.push(regex_error(
            DNS1035_LABEL_ERR_MSG,
            DNS1035_LABEL_FMT,
            &["my-name", "abc-123"],
        ));
    }
    join(errs)
}

/// Whether `s` passes [`validate_qualified_name`] (a valid label key).
pub fn is_qualified_name(s: &str) -> bool {
    let name_ok = |n: &str| n.len() <= QUALIFIED_NAME_MAX_LENGTH && qualified_name_part_shape(n);
    match s.split_once('/') {
        None => name_ok(s),
        Some((prefix, name)) => {
            !prefix.is_empty()
                && !name.contains('/')
                && is_dns1123_subdomain(prefix)
                && name_ok(name)
        }
    }
}

/// `validation.IsQualifiedName` (label and annotation keys): `[prefix/]name`,
/// the prefix a DNS-1123 subdomain, the name at most 63 characters of
/// `[-A-Za-z0-9_.]`, alphanumeric at both ends.
pub fn validate_qualified_name(s: &str) -> Result<(), String> {
    let parts: Vec<&str> = s.split('/').collect();
    let mut errs = Vec::new();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_string());
            } else if let Err(e) = validate_dns1123_subdomain(prefix) {
                errs.extend(e.split("; ").map(|m| format!("prefix part {m}")));
            }
            *name
        }
        _ => {
            return Err(format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                regex_error(
                    QUALIFIED_NAME_ERR_MSG,
                    QUALIFIED_NAME_FMT,
                    &["MyName", "my.name", "123-abc"],
                )
            ));
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_string());
    } else if name.len() > QUALIFIED_NAME_MAX_LENGTH {
        errs.push(format!(
            "name part {}",
            max_len_error(QUALIFIED_NAME_MAX_LENGTH)
        ));
    }
    // Not an `else`: an empty name gets both messages, as in Go.
    if !qualified_name_part_shape(name) {
        errs.push(format!(
            "name part {}",
            regex_error(
                QUALIFIED_NAME_ERR_MSG,
                QUALIFIED_NAME_FMT,
                &["MyName", "my.name", "123-abc"],
            )
        ));
    }
    join(errs)
}

/// Whether `s` passes [`validate_label_value`].
pub fn is_label_value(s: &str) -> bool {
    s.len() <= LABEL_VALUE_MAX_LENGTH && label_value_shape(s)
}

/// `validation.IsValidLabelValue`: empty, or at most 63 characters of
/// `[-A-Za-z0-9_.]`, alphanumeric at both ends.
pub fn validate_label_value(s: &str) -> Result<(), String> {
    let mut errs = Vec::new();
    if s.len() > LABEL_VALUE_MAX_LENGTH {
        errs.push(max_len_error(LABEL_VALUE_MAX_LENGTH));
    }
    if !label_value_shape(s) {
        errs.push(regex_error(
            LABEL_VALUE_ERR_MSG,
            LABEL_VALUE_FMT,
            &["MyValue", "my_value", "12345"],
        ));
    }
    join(errs)
}

/// `path.IsValidPathSegmentName` (RBAC object names): not `.` or `..`, and
/// neither `/` nor `%` anywhere.
pub fn validate_path_segment_name(s: &str) -> Result<(), String> {
    if s == "." || s == ".." {
        return Err(format!("may not be '{s}'"));
    }
    join(
        ["/", "%"]
            .iter()
            .filter(|bad| s.contains(**bad))
            .map(|bad| format!("may not contain '{bad}'"))
            .collect(),
    )
}

/// A host name as DNS resolvers take it: a DNS-1123 subdomain whose every
/// dot-separated label is also a DNS-1123 label, so at most 63 characters per
/// label and 253 in all. This is the per-label rule of
/// `validation.IsFullyQualifiedDomainName` without its two-label minimum and
/// trailing-dot handling (strip a trailing `.` first, lowercase first if case
/// does not matter). Kubernetes object names do not need it: for those use
/// [`is_dns1123_subdomain`], which allows longer labels.
pub fn is_dns_name(s: &str) -> bool {
    s.len() <= DNS1123_SUBDOMAIN_MAX_LENGTH && s.split('.').all(is_dns1123_label)
}

#[cfg(test)]
mod tests {
    //! Each limit at its boundary, with the apimachinery function it mirrors
    //! (all in `k8s.io/apimachinery/pkg/util/validation/validation.go` unless
    //! said otherwise). `tests/apimachinery.rs` compares every rule with the
    //! outputs of that Go code on many more inputs.

    use super::*;

    const LABEL_RE: &str = "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')";
    const SUBDOMAIN_RE: &str = r"a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')";
    const NAME_PART_RE: &str = "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
    const LABEL_VALUE_RE: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

    /// `aaa…a.aaa…a.…` of length `n`: labels of 63, so a valid subdomain and DNS name.
    fn subdomain_of_len(n: usize) -> String {
        (0..n)
            .map(|i| if i % 64 == 63 { '.' } else { 'a' })
            .collect()
    }

    #[test]
    fn dns1123_label() {
        // IsDNS1123Label: DNS1123LabelMaxLength = 63, dns1123LabelFmt.
        for ok in ["my-name", "123-abc", "a", "0", "a--b", &"a".repeat(63)] {
            assert!(
                validate_dns1123_label(ok).is_ok() && is_dns1123_label(ok),
                "{ok:?}"
            );
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a b", "é"] {
            assert_eq!(validate_dns1123_label(bad), Err(LABEL_RE.into()), "{bad:?}");
            assert!(!is_dns1123_label(bad), "{bad:?}");
        }
        assert_eq!(
            validate_dns1123_label(&"a".repeat(64)).unwrap_err(),
            "must be no more than 63 characters"
        );
        // A valid subdomain that is no label: "must not contain dots" (v0.34).
        assert_eq!(
            validate_dns1123_label("a.b").unwrap_err(),
            "must not contain dots"
        );
        // Length first, then the shape, joined with "; ".
        assert_eq!(
            validate_dns1123_label(&"A".repeat(64)).unwrap_err(),
            format!("must be no more than 63 characters; {LABEL_RE}")
        );
    }

    #[test]
    fn dns1123_subdomain() {
        // IsDNS1123Subdomain: DNS1123SubdomainMaxLength = 253, dns1123SubdomainFmt.
        let max = subdomain_of_len(253);
        assert_eq!(max.len(), 253);
        for ok in ["example.com", "a", "a.b.c", "0.0", &max] {
            assert!(
                validate_dns1123_subdomain(ok).is_ok() && is_dns1123_subdomain(ok),
                "{ok:?}"
            );
        }
        assert_eq!(
            validate_dns1123_subdomain(&format!("{max}b")).unwrap_err(),
            "must be no more than 253 characters"
        );
        // No per-label limit here: a 64-character label is a valid subdomain.
        assert!(is_dns1123_subdomain(&"a".repeat(64)));
        for bad in ["", ".a", "a.", "a..b", "A.com", "a_b", "Bad_Name", "a.-b"] {
            assert_eq!(
                validate_dns1123_subdomain(bad),
                Err(SUBDOMAIN_RE.into()),
                "{bad:?}"
            );
            assert!(!is_dns1123_subdomain(bad), "{bad:?}");
        }
    }

    #[test]
    fn dns1035_label() {
        // IsDNS1035Label: DNS1035LabelMaxLength = 63, dns1035LabelFmt.
        for ok in ["web", "a", "a-1", &"a".repeat(63)] {
            assert!(
                validate_dns1035_label(ok).is_ok() && is_dns1035_label(ok),
                "{ok:?}"
            );
        }
        assert_eq!(
            validate_dns1035_label("1web").unwrap_err(),
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
        );
        assert_eq!(
            validate_dns1035_label(&"a".repeat(64)).unwrap_err(),
            "must be no more than 63 characters"
        );
        for bad in ["", "1", "a.b", "a-", "Web"] {
            assert!(!is_dns1035_label(bad), "{bad:?}");
        }
    }

    #[test]
    fn qualified_name() {
        // IsQualifiedName: qualifiedNameMaxLength = 63 for the name part, the
        // prefix an IsDNS1123Subdomain (so up to 253), at most one '/'.
        for ok in [
            "app",
            "app.kubernetes.io/name",
            "My_Name.x",
            "123-abc",
            &"n".repeat(63),
            &format!("{}/n", subdomain_of_len(253)),
        ] {
            assert!(
                validate_qualified_name(ok).is_ok() && is_qualified_name(ok),
                "{ok:?}"
            );
        }
        assert_eq!(
            validate_qualified_name("/x").unwrap_err(),
            "prefix part must be non-empty"
        );
        // An empty name part gets the regex message too (no `else` in Go).
        assert_eq!(
            validate_qualified_name("x/").unwrap_err(),
            format!("name part must be non-empty; {NAME_PART_RE}")
        );
        assert_eq!(
            validate_qualified_name("a/b/c").unwrap_err(),
            "a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        );
        assert_eq!(
            validate_qualified_name("UP/x").unwrap_err(),
            format!("prefix part {SUBDOMAIN_RE}")
        );
        assert_eq!(
            validate_qualified_name(&format!("{}/x", subdomain_of_len(254))).unwrap_err(),
            "prefix part must be no more than 253 characters"
        );
        assert_eq!(
            validate_qualified_name(&"n".repeat(64)).unwrap_err(),
            "name part must be no more than 63 characters"
        );
        assert_eq!(validate_qualified_name("-k").unwrap_err(), NAME_PART_RE);
        for bad in [
            "",
            "/",
            "x/",
            "/x",
            "a/b/c",
            "UP/x",
            "-k",
            "k-",
            "a b",
            &"n".repeat(64),
        ] {
            assert!(!is_qualified_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn label_value() {
        // IsValidLabelValue: LabelValueMaxLength = 63, labelValueFmt (empty allowed).
        for ok in [
            "",
            "MyValue",
            "my_value",
            "12345",
            "a-b_c.d",
            &"v".repeat(63),
        ] {
            assert!(
                validate_label_value(ok).is_ok() && is_label_value(ok),
                "{ok:?}"
            );
        }
        for bad in ["-a", "a-", "_a", "a b", "é"] {
            assert_eq!(
                validate_label_value(bad),
                Err(LABEL_VALUE_RE.into()),
                "{bad:?}"
            );
            assert!(!is_label_value(bad), "{bad:?}");
        }
        assert_eq!(
            validate_label_value(&"v".repeat(64)).unwrap_err(),
            "must be no more than 63 characters"
        );
        assert!(!is_label_value(&"v".repeat(64)));
    }

    #[test]
    fn path_segment_name() {
        // apimachinery/pkg/api/validation/path/name.go IsValidPathSegmentName:
        // NameMayNotBe = {".", ".."}, NameMayNotContain = {"/", "%"}, no length limit.
        for ok in [
            "system:controller:x",
            "a.b",
            "...",
            "Any Thing",
            &"x".repeat(300),
        ] {
            assert!(validate_path_segment_name(ok).is_ok(), "{ok:?}");
        }
        assert_eq!(
            validate_path_segment_name(".").unwrap_err(),
            "may not be '.'"
        );
        assert_eq!(
            validate_path_segment_name("..").unwrap_err(),
            "may not be '..'"
        );
        assert_eq!(
            validate_path_segment_name("a/b").unwrap_err(),
            "may not contain '/'"
        );
        assert_eq!(
            validate_path_segment_name("a%b").unwrap_err(),
            "may not contain '%'"
        );
        // Both contents are reported.
        assert_eq!(
            validate_path_segment_name("a/%").unwrap_err(),
            "may not contain '/'; may not contain '%'"
        );
    }

    #[test]
    fn dns_name() {
        // IsFullyQualifiedDomainName's per-label rule (each label an
        // IsDNS1123Label, so <= 63), within DNS1123SubdomainMaxLength.
        let max = subdomain_of_len(253);
        for ok in [
            "a",
            "example.com",
            "my-host.example.com",
            &"a".repeat(63),
            &max,
        ] {
            assert!(is_dns_name(ok), "{ok:?}");
        }
        for bad in [
            "",
            "a.",
            ".a",
            "a..b",
            "-a.b",
            "A.com",
            "a_b",
            &"a".repeat(64),
            &format!("{}.b", "a".repeat(64)),
            &format!("{max}b"),
        ] {
            assert!(!is_dns_name(bad), "{bad:?}");
        }
        // Equivalent to: a subdomain whose every label is a DNS-1123 label.
        for s in ["a.b", &format!("{}.b", "a".repeat(64)), "a.B"] {
            assert_eq!(
                is_dns_name(s),
                is_dns1123_subdomain(s) && s.split('.').all(is_dns1123_label),
                "{s:?}"
            );
        }
    }

    /// The hand-written matchers against apimachinery's regexes (compiled with
    /// the `regex` crate, anchored as Go anchors them), on every string of up to
    /// four characters over an alphabet that exercises each class boundary.
    #[test]
    fn matchers_are_the_regexes() {
        let re = |fmt: &str| regex::Regex::new(&format!("^{fmt}$")).unwrap();
        type Matcher = fn(&str) -> bool;
        let checks: [(&str, Matcher); 5] = [
            (DNS1123_LABEL_FMT, label_shape),
            (DNS1123_SUBDOMAIN_FMT, subdomain_shape),
            (DNS1035_LABEL_FMT, dns1035_shape),
            (QUALIFIED_NAME_FMT, qualified_name_part_shape),
            (LABEL_VALUE_FMT, label_value_shape),
        ];
        let alphabet = ['a', 'z', 'A', 'Z', '0', '9', '-', '.', '_', '/', ' ', 'é'];
        let mut strings = vec![String::new()];
        let mut frontier = vec![String::new()];
        for _ in 0..4 {
            frontier = frontier
                .iter()
                .flat_map(|s| alphabet.iter().map(move |c| format!("{s}{c}")))
                .collect();
            strings.extend(frontier.iter().cloned());
        }
        for (fmt, ours) in checks {
            let re = re(fmt);
            for s in &strings {
                assert_eq!(ours(s), re.is_match(s), "{fmt} on {s:?}");
            }
        }
    }
}
