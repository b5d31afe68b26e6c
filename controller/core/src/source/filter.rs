//! Which objects a cluster watches: the APISIX `namespace_selector` (exactly
//! one of `equal`, `not_equal`, `match`, `not_match`) and `label_selector`.
//!
//! `equal`/`not_equal` and the label selector are also sent to the API server
//! ([`NamespaceFilter::field_selector`], [`LabelSelector::as_str`]); the index
//! applies all of them again client-side, which is harmless for server-side
//! filtered watches and makes `render` behave exactly like the controller.
//! `match`/`not_match` regexes are anchored, so they must match the WHOLE
//! namespace name (`dev` does not match `dev-2`; write `dev.*` for that).
//! The label selector grammar is the API server's ([`k8s_syntax::LabelSelector`]):
//! what it accepts loads (`a>1` included), with its error texts.

use std::collections::BTreeMap;
use std::fmt;

use regex::Regex;

/// Compiled `namespace_selector`.
#[derive(Debug, Clone, Default)]
pub enum NamespaceFilter {
    /// No selector: every namespace.
    #[default]
    All,
    /// `equal: ns`.
    Equal(String),
    /// `not_equal: ns`.
    NotEqual(String),
    /// `match: [regex...]`: a namespace is kept when ANY regex matches it whole.
    Match(Vec<AnchoredRegex>),
    /// `not_match: [regex...]`: a namespace is dropped when ANY regex matches it whole.
    NotMatch(Vec<AnchoredRegex>),
}

/// A regex compiled as `^(?:pattern)$`, remembering the user's pattern.
///
/// The pattern must be a valid regex on its own: one that closes the
/// wrapping group early (`a)|(.*`) would otherwise compile to a regex that
/// matches every input, and defeat `external_name.allow` or a namespace
/// selector.
#[derive(Debug, Clone)]
pub struct AnchoredRegex {
    pattern: String,
    regex: Regex,
}

impl AnchoredRegex {
    /// Compiles `pattern` anchored to the whole input; an error when the
    /// pattern alone is not a valid regex.
    pub fn new(pattern: &str) -> Result<Self, regex::Error> {
        Regex::new(pattern)?;
        Ok(Self {
            pattern: pattern.to_string(),
            regex: Regex::new(&format!("^(?:{pattern})$"))?,
        })
    }

    /// The pattern as written by the user.
    pub fn pattern(&self) -> &str {
        &self.pattern
    }

    /// Whole-string match.
    pub fn is_match(&self, s: &str) -> bool {
        self.regex.is_match(s)
    }
}

/// Equal when the patterns are (the compiled regexes then are too).
impl PartialEq for AnchoredRegex {
    fn eq(&self, other: &Self) -> bool {
        self.pattern == other.pattern
    }
}

impl Eq for AnchoredRegex {}

impl NamespaceFilter {
    /// Whether objects of namespace `ns` are watched.
    pub fn matches(&self, ns: &str) -> bool {
        match self {
            NamespaceFilter::All => true,
            NamespaceFilter::Equal(n) => ns == n,
            NamespaceFilter::NotEqual(n) => ns != n,
            NamespaceFilter::Match(rs) => rs.iter().any(|r| r.is_match(ns)),
            NamespaceFilter::NotMatch(rs) => !rs.iter().any(|r| r.is_match(ns)),
        }
    }

    /// The one namespace this selector admits (`equal`): its watches can then
    /// be namespaced requests, which a Role in that namespace authorizes.
    pub fn single_namespace(&self) -> Option<&str> {
        match self {
            NamespaceFilter::Equal(n) => Some(n),
            _ => None,
        }
    }

    /// The server-side field selector (`metadata.namespace=ns` / `!=`), if any.
    pub fn field_selector(&self) -> Option<String> {
        match self {
            NamespaceFilter::Equal(n) => Some(format!("metadata.namespace={n}")),
            NamespaceFilter::NotEqual(n) => Some(format!("metadata.namespace!={n}")),
            _ => None,
        }
    }

    /// JSON form for the dump API (the APISIX config shape).
    pub fn to_json(&self) -> serde_json::Value {
        use serde_json::json;
        let pats =
            |rs: &Vec<AnchoredRegex>| rs.iter().map(|r| r.pattern.clone()).collect::<Vec<_>>();
        match self {
            NamespaceFilter::All => serde_json::Value::Null,
            NamespaceFilter::Equal(n) => json!({"equal": n}),
            NamespaceFilter::NotEqual(n) => json!({"not_equal": n}),
            NamespaceFilter::Match(rs) => json!({"match": pats(rs)}),
            NamespaceFilter::NotMatch(rs) => json!({"not_match": pats(rs)}),
        }
    }
}

/// A parsed Kubernetes label selector (the `kubectl -l` / `labelSelector`
/// syntax), accepted exactly as the API server accepts it
/// ([`k8s_syntax::LabelSelector`], `>` and `<` included). Keeps the text as
/// written: that is what goes to the API server ([`Self::as_str`]) and into
/// dumps; the parsed form matches locally ([`Self::matches`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector {
    raw: String,
    parsed: k8s_syntax::LabelSelector,
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

impl LabelSelector {
    /// Parses `app=web,tier in (a,b),!canary`. The empty string selects
    /// everything. Errors are the API server's texts.
    pub fn parse(s: &str) -> Result<Self, k8s_syntax::SelectorError> {
        Ok(Self {
            parsed: k8s_syntax::LabelSelector::parse(s)?,
            raw: s.trim().to_string(),
        })
    }

    /// The selector text as given, trimmed (sent to the API server as `labelSelector`).
    pub fn as_str(&self) -> &str {
        &self.raw
    }

    /// Whether the selector is empty (selects everything).
    pub fn is_empty(&self) -> bool {
        self.parsed.is_empty()
    }

    /// The parsed selector.
    pub fn parsed(&self) -> &k8s_syntax::LabelSelector {
        &self.parsed
    }

    /// The parsed requirements, sorted by key.
    pub fn requirements(&self) -> &[k8s_syntax::Requirement] {
        self.parsed.requirements()
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.parsed.matches(labels)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn namespace_filter_forms() {
        assert!(NamespaceFilter::All.matches("x"));
        assert!(NamespaceFilter::Equal("a".into()).matches("a"));
        assert!(!NamespaceFilter::Equal("a".into()).matches("b"));
        assert!(NamespaceFilter::NotEqual("a".into()).matches("b"));
        assert!(!NamespaceFilter::NotEqual("a".into()).matches("a"));
        let m = NamespaceFilter::Match(vec![
            AnchoredRegex::new("dev").unwrap(),
            AnchoredRegex::new("prod-.*").unwrap(),
        ]);
        assert!(m.matches("dev"));
        assert!(!m.matches("dev-2"), "regex must match the whole name");
        assert!(!m.matches("my-dev"));
        assert!(m.matches("prod-eu"));
        let n = NamespaceFilter::NotMatch(vec![AnchoredRegex::new("kube-.*").unwrap()]);
        assert!(!n.matches("kube-system"));
        assert!(n.matches("default"));
        assert!(n.matches("my-kube-x"));
    }

    #[test]
    fn a_pattern_that_escapes_the_anchors_is_refused() {
        // Wrapped as `^(?:…)$`, these would compile and match anything.
        for p in [r"a\.example\.com)|(.*", "x)|(?:.*", ")|("] {
            assert!(AnchoredRegex::new(p).is_err(), "{p:?} must be refused");
        }
        assert!(AnchoredRegex::new("(a)|(b)").is_ok());
    }

    #[test]
    fn alternation_is_anchored_as_a_whole() {
        let m = AnchoredRegex::new("a|b").unwrap();
        assert!(m.is_match("a") && m.is_match("b"));
        assert!(!m.is_match("ab") && !m.is_match("xa"));
    }

    #[test]
    fn field_selectors() {
        assert_eq!(
            NamespaceFilter::Equal("a".into())
                .field_selector()
                .as_deref(),
            Some("metadata.namespace=a")
        );
        assert_eq!(
            NamespaceFilter::NotEqual("a".into())
                .field_selector()
                .as_deref(),
            Some("metadata.namespace!=a")
        );
        assert_eq!(NamespaceFilter::All.field_selector(), None);
    }

    /// The grammar is `k8s_syntax`'s (tested there against apimachinery);
    /// here: the text is kept as written, and matching goes through.
    #[test]
    fn label_selector_keeps_the_text_and_matches() {
        let s = LabelSelector::parse("  tier in (a, b),app=web ").unwrap();
        assert_eq!(s.as_str(), "tier in (a, b),app=web");
        assert_eq!(s.to_string(), "tier in (a, b),app=web");
        assert_eq!(s.parsed().to_string(), "app=web,tier in (a,b)");
        assert_eq!(s.requirements().len(), 2);
        assert!(s.matches(&labels(&[("app", "web"), ("tier", "a")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "c")])));
        assert!(LabelSelector::parse("").unwrap().matches(&labels(&[])));
        let empty = LabelSelector::parse("  ").unwrap();
        assert!(empty.is_empty() && empty.as_str().is_empty());
        assert_eq!(empty, LabelSelector::default());
        // What the API server accepts, e.g. integer comparisons.
        let gt = LabelSelector::parse("a>1").unwrap();
        assert!(gt.matches(&labels(&[("a", "2")])) && !gt.matches(&labels(&[("a", "1")])));
        assert_eq!(
            LabelSelector::parse("app in (a").unwrap_err().to_string(),
            "unable to parse requirement: found '', expected: ',' or ')'"
        );
    }
}
