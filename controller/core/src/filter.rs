//! Which objects a cluster watches: the APISIX `namespace_selector` (exactly
//! one of `equal`, `not_equal`, `match`, `not_match`) and `label_selector`.
//!
//! `equal`/`not_equal` and the label selector are also sent to the API server
//! ([`NamespaceFilter::field_selector`], [`LabelSelector::as_str`]); the index
//! applies all of them again client-side, which is harmless for server-side
//! filtered watches and makes `render` behave exactly like the controller.
//! `match`/`not_match` regexes are anchored, so they must match the WHOLE
//! namespace name (`dev` does not match `dev-2`; write `dev.*` for that).

use std::collections::{BTreeMap, BTreeSet};
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
#[derive(Debug, Clone)]
pub struct AnchoredRegex {
    pattern: String,
    regex: Regex,
}

impl AnchoredRegex {
    /// Compiles `pattern` anchored to the whole input.
    pub fn new(pattern: &str) -> Result<Self, regex::Error> {
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

    /// The server-side field selector (`metadata.namespace=ns` / `!=`), if any.
    pub fn field_selector(&self) -> Option<String> {
        match self {
            NamespaceFilter::Equal(n) => Some(format!("metadata.namespace={n}")),
            NamespaceFilter::NotEqual(n) => Some(format!("metadata.namespace!={n}")),
            _ => None,
        }
    }

    /// For `equal`, the single namespace to watch (a namespaced watch needs less RBAC).
    pub fn single_namespace(&self) -> Option<&str> {
        match self {
            NamespaceFilter::Equal(n) => Some(n),
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

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// `key`
    Exists(String),
    /// `!key`
    NotExists(String),
    /// `key=value` / `key==value`
    Equals(String, String),
    /// `key!=value` (also true when the label is absent)
    NotEquals(String, String),
    /// `key in (a,b)`
    In(String, BTreeSet<String>),
    /// `key notin (a,b)` (also true when the label is absent)
    NotIn(String, BTreeSet<String>),
}

/// A parsed Kubernetes label selector (the `kubectl -l` / `labelSelector` syntax).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector {
    raw: String,
    requirements: Vec<Requirement>,
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

fn valid_label_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}

fn check_key(key: &str) -> Result<String, String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && (p.is_empty() || !crate::crd::is_dns_subdomain(p))
    {
        return Err(format!(
            "label key {key:?} has an invalid prefix (must be a DNS subdomain)"
        ));
    }
    if !valid_label_name(name) {
        return Err(format!(
            "label key {key:?} is invalid (name part: 1-63 characters [A-Za-z0-9_.-], alphanumeric at both ends)"
        ));
    }
    Ok(key.to_string())
}

fn check_value(key: &str, v: &str) -> Result<String, String> {
    if crate::crd::is_label_value(v) {
        Ok(v.to_string())
    } else {
        Err(format!(
            "label value {v:?} of {key:?} is invalid (at most 63 characters [A-Za-z0-9_.-], alphanumeric at both ends)"
        ))
    }
}

/// Splits on commas that are not inside parentheses.
fn split_top_level(s: &str) -> Result<Vec<&str>, String> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth < 0 {
                    return Err("unbalanced ')'".to_string());
                }
            }
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("unbalanced '('".to_string());
    }
    out.push(&s[start..]);
    Ok(out)
}

fn parse_set(key: &str, inner: &str) -> Result<BTreeSet<String>, String> {
    if inner.trim().is_empty() {
        return Err(format!("the value set of {key:?} is empty"));
    }
    let mut set = BTreeSet::new();
    for v in inner.split(',') {
        set.insert(check_value(key, v.trim())?);
    }
    Ok(set)
}

fn parse_requirement(r: &str) -> Result<Requirement, String> {
    let r = r.trim();
    if r.is_empty() {
        return Err("empty requirement (stray ',')".to_string());
    }
    if let Some(k) = r.strip_prefix('!') {
        return Ok(Requirement::NotExists(check_key(k.trim())?));
    }
    if let Some(open) = r.find('(') {
        let Some(inner) = r[open + 1..].strip_suffix(')') else {
            return Err(format!("{r:?}: expected ')' at the end of the value set"));
        };
        let head: Vec<&str> = r[..open].split_whitespace().collect();
        return match head.as_slice() {
            [k, "in"] => Ok(Requirement::In(check_key(k)?, parse_set(k, inner)?)),
            [k, "notin"] => Ok(Requirement::NotIn(check_key(k)?, parse_set(k, inner)?)),
            _ => Err(format!(
                "{r:?}: expected `key in (v1,v2)` or `key notin (v1,v2)`"
            )),
        };
    }
    if let Some((k, v)) = r.split_once("!=") {
        let k = check_key(k.trim())?;
        let v = check_value(&k, v.trim())?;
        return Ok(Requirement::NotEquals(k, v));
    }
    if let Some((k, v)) = r.split_once("==").or_else(|| r.split_once('=')) {
        let k = check_key(k.trim())?;
        let v = check_value(&k, v.trim())?;
        return Ok(Requirement::Equals(k, v));
    }
    if r.contains(char::is_whitespace) {
        return Err(format!(
            "{r:?}: unexpected whitespace (expected key, !key, key=value, key!=value, key in (..), key notin (..))"
        ));
    }
    Ok(Requirement::Exists(check_key(r)?))
}

impl LabelSelector {
    /// Parses `app=web,tier in (a,b),!canary`. The empty string selects everything.
    pub fn parse(s: &str) -> Result<Self, String> {
        let raw = s.trim().to_string();
        if raw.is_empty() {
            return Ok(Self::default());
        }
        let requirements = split_top_level(&raw)?
            .into_iter()
            .map(parse_requirement)
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Self { raw, requirements })
    }

    /// The selector text as given (sent to the API server as `labelSelector`).
    pub fn as_str(&self) -> &str {
        &self.raw
    }

    /// Whether the selector is empty (selects everything).
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The parsed requirements.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| match r {
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, set) => labels.get(k).is_some_and(|v| set.contains(v)),
            Requirement::NotIn(k, set) => labels.get(k).is_none_or(|v| !set.contains(v)),
        })
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

    #[test]
    fn label_selector_parse_and_match() {
        let s = LabelSelector::parse(
            "app=web, tier in (a, b),!canary,env!=dev,example.com/team,x notin (1)",
        )
        .unwrap();
        assert_eq!(s.requirements().len(), 6);
        let ok = labels(&[
            ("app", "web"),
            ("tier", "a"),
            ("env", "prod"),
            ("example.com/team", "t"),
        ]);
        assert!(s.matches(&ok));
        let mut l = ok.clone();
        l.insert("canary".into(), "1".into());
        assert!(!s.matches(&l));
        let mut l = ok.clone();
        l.insert("tier".into(), "c".into());
        assert!(!s.matches(&l));
        let mut l = ok.clone();
        l.insert("x".into(), "1".into());
        assert!(!s.matches(&l));
        let mut l = ok;
        l.remove("example.com/team");
        assert!(!s.matches(&l));
        assert!(
            LabelSelector::parse("app==web")
                .unwrap()
                .matches(&labels(&[("app", "web")]))
        );
        assert!(LabelSelector::parse("").unwrap().matches(&labels(&[])));
        assert!(LabelSelector::parse("  ").unwrap().is_empty());
    }

    #[test]
    fn label_selector_errors() {
        for bad in [
            "app=web,",
            "app in (a",
            "app in a)",
            "-bad=x",
            "app=-x-",
            "a b",
            "app notinn (a)",
            "app in ()",
            "/x=y",
            &format!("{}=1", "k".repeat(64)),
        ] {
            assert!(
                LabelSelector::parse(bad).is_err(),
                "{bad:?} should not parse"
            );
        }
    }
}
