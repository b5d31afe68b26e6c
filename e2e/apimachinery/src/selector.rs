//! Label and field selectors, with the syntax and error messages of the
//! Kubernetes API server.
//!
//! # Label selectors
//!
//! The grammar (`labels.Parse`: parse, match, the API server's error texts) is
//! `k8s_syntax::selector`, re-exported here. This module adds what only kube-sim
//! needs, in [`LabelSelectorExt`]: matching `metadata.labels` as stored JSON, and
//! building a selector from a `metav1.LabelSelector` JSON object
//! (`matchLabels` + `matchExpressions`, as in RBAC aggregation rules).
//!
//! # Field selectors
//!
//! Field selectors only support `=`, `==` and `!=` (as in `fields.ParseSelector`),
//! and every field must be in the resource's supported list, otherwise
//! `field label not supported: <field>` is returned (the message the API server
//! sends with a 400). Backslash escapes (`\,`, `\=`, `\\`) in values are honoured.

use std::collections::BTreeMap;

use serde_json::Value;

pub use k8s_syntax::selector::{LabelSelector, Operator, Requirement, SelectorError};

/// Validates a label key (`[prefix/]name`) like `validation.IsQualifiedName`,
/// returning the Kubernetes error text prefixed with the key.
fn validate_label_key(key: &str) -> Result<(), String> {
    k8s_syntax::validate_qualified_name(key)
        .map_err(|e| format!("key: Invalid value: \"{key}\": {e}"))
}

/// kube-sim's additions to [`LabelSelector`]: selectors from stored JSON, and
/// matching stored JSON labels.
pub trait LabelSelectorExt: Sized {
    /// Builds a selector from a `metav1.LabelSelector` JSON object
    /// (`matchLabels` + `matchExpressions` with `In|NotIn|Exists|DoesNotExist`).
    fn from_label_selector_value(v: &Value) -> Result<Self, SelectorError>;

    /// Like [`LabelSelector::matches`] for `metadata.labels` as stored JSON.
    /// `None`, `null` and non-object values count as "no labels"; non-string
    /// label values are ignored.
    fn matches_value(&self, labels: Option<&Value>) -> bool;
}

impl LabelSelectorExt for LabelSelector {
    fn from_label_selector_value(v: &Value) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        if let Some(ml) = v.get("matchLabels").and_then(Value::as_object) {
            for (k, val) in ml {
                let val = val.as_str().ok_or_else(|| {
                    SelectorError(format!("matchLabels.{k}: value must be a string"))
                })?;
                validate_label_key(k).map_err(SelectorError)?;
                k8s_syntax::validate_label_value(val).map_err(|e| {
                    SelectorError(format!("matchLabels.{k}: Invalid value: \"{val}\": {e}"))
                })?;
                requirements.push(Requirement {
                    key: k.clone(),
                    op: Operator::Equals,
                    values: vec![val.to_string()],
                });
            }
        }
        if let Some(exprs) = v.get("matchExpressions").and_then(Value::as_array) {
            for (i, e) in exprs.iter().enumerate() {
                let key = e.get("key").and_then(Value::as_str).ok_or_else(|| {
                    SelectorError(format!("matchExpressions[{i}].key: Required value"))
                })?;
                validate_label_key(key).map_err(SelectorError)?;
                let values: Vec<String> = e
                    .get("values")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|x| x.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                let op = match e.get("operator").and_then(Value::as_str) {
                    Some("In") => Operator::In,
                    Some("NotIn") => Operator::NotIn,
                    Some("Exists") => Operator::Exists,
                    Some("DoesNotExist") => Operator::DoesNotExist,
                    other => {
                        return Err(SelectorError(format!(
                            "matchExpressions[{i}].operator: Invalid value: \"{}\": not a valid selector operator",
                            other.unwrap_or("")
                        )));
                    }
                };
                let needs_values = matches!(op, Operator::In | Operator::NotIn);
                if needs_values && values.is_empty() {
                    return Err(SelectorError(format!(
                        "matchExpressions[{i}].values: Invalid value: []: for 'in', 'notin' operators, values set can't be empty"
                    )));
                }
                if !needs_values && !values.is_empty() {
                    return Err(SelectorError(format!(
                        "matchExpressions[{i}].values: Invalid value: {values:?}: values set must be empty for exists and does not exist"
                    )));
                }
                requirements.push(Requirement {
                    key: key.to_string(),
                    op,
                    values,
                });
            }
        }
        Ok(LabelSelector::from_requirements(requirements))
    }

    fn matches_value(&self, labels: Option<&Value>) -> bool {
        let map: BTreeMap<String, String> = labels
            .and_then(Value::as_object)
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        self.matches(&map)
    }
}

/// One `field=value` / `field!=value` term of a field selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldRequirement {
    /// The field path, e.g. `metadata.name`.
    pub field: String,
    /// `true` for `!=`.
    pub negated: bool,
    /// The value compared against.
    pub value: String,
}

/// A parsed field selector. The empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector {
    requirements: Vec<FieldRequirement>,
}

/// Splits on unescaped `sep`, keeping escapes in the pieces.
fn split_unescaped(s: &str, sep: char) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut escaped = false;
    for c in s.chars() {
        if escaped {
            cur.push('\\');
            cur.push(c);
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == sep {
            out.push(std::mem::take(&mut cur));
        } else {
            cur.push(c);
        }
    }
    if escaped {
        cur.push('\\');
    }
    out.push(cur);
    out
}

fn unescape_field_value(s: &str) -> Result<String, SelectorError> {
    let mut out = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            match chars.next() {
                Some(e @ ('\\' | ',' | '=')) => out.push(e),
                Some(e) => {
                    return Err(SelectorError(format!(
                        "invalid field selector: invalid escape sequence: \\{e}"
                    )));
                }
                None => {
                    return Err(SelectorError(
                        "invalid field selector: unterminated escape sequence".into(),
                    ));
                }
            }
        } else if c == '=' || c == ',' {
            return Err(SelectorError(format!(
                "invalid field selector: unescaped {c} in value"
            )));
        } else {
            out.push(c);
        }
    }
    Ok(out)
}

impl FieldSelector {
    /// Parses `metadata.name=x,metadata.namespace!=y` (`==` allowed). Every field
    /// must be listed in `supported`, else `field label not supported: <field>`.
    pub fn parse(s: &str, supported: &[&str]) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        if s.trim().is_empty() {
            return Ok(FieldSelector { requirements });
        }
        for term in split_unescaped(s, ',') {
            if term.is_empty() {
                continue;
            }
            let (field, negated, raw) = if let Some(i) = term.find("!=") {
                (&term[..i], true, &term[i + 2..])
            } else if let Some(i) = term.find("==") {
                (&term[..i], false, &term[i + 2..])
            } else if let Some(i) = term.find('=') {
                (&term[..i], false, &term[i + 1..])
            } else {
                return Err(SelectorError(format!(
                    "invalid selector: '{s}'; can't understand '{term}'"
                )));
            };
            let field = field.trim();
            if !supported.contains(&field) {
                return Err(SelectorError(format!("field label not supported: {field}")));
            }
            let value = unescape_field_value(raw)?;
            requirements.push(FieldRequirement {
                field: field.to_string(),
                negated,
                value,
            });
        }
        Ok(FieldSelector { requirements })
    }

    /// The parsed terms in input order.
    pub fn requirements(&self) -> &[FieldRequirement] {
        &self.requirements
    }

    /// True for the selector that selects everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Evaluates against an object; `get(field)` returns the field's string value
    /// (`None` is treated as the empty string, as Kubernetes field sets do).
    pub fn matches(&self, get: impl Fn(&str) -> Option<String>) -> bool {
        self.requirements.iter().all(|r| {
            let got = get(&r.field).unwrap_or_default();
            (got == r.value) != r.negated
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn matches_value_on_json_labels() {
        let s = LabelSelector::parse("app=web").expect("parse");
        assert!(s.matches_value(Some(&json!({"app": "web", "n": 1}))));
        assert!(!s.matches_value(Some(&json!({"app": "db"}))));
        assert!(!s.matches_value(None));
        assert!(!s.matches_value(Some(&Value::Null)));
        let neg = LabelSelector::parse("!app").expect("parse");
        assert!(neg.matches_value(None));
    }

    #[test]
    fn from_metav1_label_selector() {
        let s = LabelSelector::from_label_selector_value(&json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["db"]}]
        }))
        .expect("valid");
        assert!(s.matches(&labels(&[("app", "web")])));
        assert!(!s.matches(&labels(&[("app", "web"), ("tier", "db")])));
        let e = LabelSelector::from_label_selector_value(&json!({
            "matchExpressions": [{"key": "tier", "operator": "In", "values": []}]
        }))
        .expect_err("empty In");
        assert!(e.to_string().contains("values set can't be empty"), "{e}");
    }

    const SUPPORTED: &[&str] = &["metadata.name", "metadata.namespace"];

    fn getter(name: &'static str, ns: &'static str) -> impl Fn(&str) -> Option<String> {
        move |f| match f {
            "metadata.name" => Some(name.to_string()),
            "metadata.namespace" => Some(ns.to_string()),
            _ => None,
        }
    }

    #[test]
    fn field_selector_equality_and_inequality() {
        let s = FieldSelector::parse("metadata.name=x,metadata.namespace!=y", SUPPORTED)
            .expect("parse");
        assert!(s.matches(getter("x", "z")));
        assert!(!s.matches(getter("x", "y")));
        assert!(!s.matches(getter("w", "z")));
        let s = FieldSelector::parse("metadata.name==x", SUPPORTED).expect("parse");
        assert!(s.matches(getter("x", "")));
        assert!(!s.matches(getter("xx", "")));
    }

    #[test]
    fn field_selector_empty_matches_all() {
        let s = FieldSelector::parse("", SUPPORTED).expect("parse");
        assert!(s.is_empty());
        assert!(s.matches(|_| None));
    }

    #[test]
    fn field_selector_unsupported_field() {
        let e = FieldSelector::parse("spec.foo=1", SUPPORTED).expect_err("unsupported");
        assert_eq!(e.to_string(), "field label not supported: spec.foo");
    }

    #[test]
    fn field_selector_escapes_and_syntax() {
        let s = FieldSelector::parse(r"metadata.name=a\,b", SUPPORTED).expect("parse");
        assert_eq!(s.requirements()[0].value, "a,b");
        assert!(s.matches(getter("a,b", "")));
        let e = FieldSelector::parse("metadata.name", SUPPORTED).expect_err("no op");
        assert!(
            e.to_string().contains("can't understand 'metadata.name'"),
            "{e}"
        );
        assert!(FieldSelector::parse(r"metadata.name=a\q", SUPPORTED).is_err());
    }

    #[test]
    fn field_selector_missing_field_is_empty_string() {
        let s = FieldSelector::parse("metadata.namespace=", SUPPORTED).expect("parse");
        assert!(s.matches(|_| None));
        let s = FieldSelector::parse("metadata.namespace!=", SUPPORTED).expect("parse");
        assert!(!s.matches(|_| None));
    }
}
