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
mod tests;
