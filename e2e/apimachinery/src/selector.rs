//! Label and field selectors, with the syntax and error messages of the
//! Kubernetes API server (`k8s.io/apimachinery/pkg/labels` and `pkg/fields`).
//!
//! # Label selectors
//!
//! A selector is a comma-separated list of requirements, all of which must hold
//! (logical AND). Supported requirement forms:
//!
//! | form               | meaning                                               |
//! |--------------------|-------------------------------------------------------|
//! | `k=v`, `k==v`      | label `k` exists and equals `v`                       |
//! | `k!=v`             | label `k` is absent or differs from `v`               |
//! | `k in (a,b)`       | label `k` exists and is one of the values             |
//! | `k notin (a,b)`    | label `k` is absent or is none of the values          |
//! | `k`                | label `k` exists                                      |
//! | `!k`               | label `k` does not exist                              |
//! | `k>n`, `k<n`       | label `k` is an integer greater / less than `n`       |
//!
//! The empty selector matches everything. The parser is a small hand-written
//! lexer + recursive-descent parser with the structure (and so the error
//! texts) of `labels.Parse`, including its quirks: `in`/`notin` are plain
//! identifiers outside the operator position, `k=` and `k in ()` mean the empty
//! value, and a bad key is reported with a `<nil>` field path. Requirements are
//! sorted by key. Keys are validated
//! as qualified names (`[prefix/]name`, name at most 63 characters, prefix a DNS
//! subdomain), values as label values (at most 63 characters, alphanumeric at both
//! ends, `-_.` inside). Errors carry the real server's wording, e.g.
//! `unable to parse requirement: values[0][app]: Invalid value: "-x": a valid label must be ...`.
//!
//! # Field selectors
//!
//! Field selectors only support `=`, `==` and `!=` (as in `fields.ParseSelector`),
//! and every field must be in the resource's supported list, otherwise
//! `field label not supported: <field>` is returned (the message the API server
//! sends with a 400). Backslash escapes (`\,`, `\=`, `\\`) in values are honoured.

use std::collections::BTreeMap;
use std::fmt;

use serde_json::Value;

use crate::names;

/// A selector parse error; `Display` gives the API server's message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct SelectorError(pub String);

/// The operator of one label requirement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    /// `=` or `==`
    Equals,
    /// `!=`
    NotEquals,
    /// `in (..)`
    In,
    /// `notin (..)`
    NotIn,
    /// bare key
    Exists,
    /// `!key`
    DoesNotExist,
    /// `key > n` (integer comparison; the label must parse as an integer)
    GreaterThan,
    /// `key < n`
    LessThan,
}

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// The label key.
    pub key: String,
    /// The operator.
    pub op: Operator,
    /// The values (one for `=`/`!=`, any number for `in`/`notin`, none otherwise).
    pub values: Vec<String>,
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let got = labels.get(&self.key);
        match self.op {
            Operator::Equals | Operator::In => got.is_some_and(|v| self.values.contains(v)),
            Operator::NotEquals | Operator::NotIn => !got.is_some_and(|v| self.values.contains(v)),
            Operator::Exists => got.is_some(),
            Operator::DoesNotExist => got.is_none(),
            Operator::GreaterThan | Operator::LessThan => {
                let (Some(have), Some(want)) = (
                    got.and_then(|v| v.parse::<i64>().ok()),
                    self.values.first().and_then(|v| v.parse::<i64>().ok()),
                ) else {
                    return false;
                };
                if self.op == Operator::GreaterThan {
                    have > want
                } else {
                    have < want
                }
            }
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.op {
            Operator::Equals => write!(f, "{}={}", self.key, self.values.join(",")),
            Operator::NotEquals => write!(f, "{}!={}", self.key, self.values.join(",")),
            Operator::In => write!(f, "{} in ({})", self.key, self.values.join(",")),
            Operator::NotIn => write!(f, "{} notin ({})", self.key, self.values.join(",")),
            Operator::Exists => write!(f, "{}", self.key),
            Operator::DoesNotExist => write!(f, "!{}", self.key),
            Operator::GreaterThan => write!(f, "{}>{}", self.key, self.values.join(",")),
            Operator::LessThan => write!(f, "{}<{}", self.key, self.values.join(",")),
        }
    }
}

/// A parsed label selector. The empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    Identifier(String),
    Comma,
    Equals,
    DoubleEquals,
    NotEquals,
    Bang,
    In,
    NotIn,
    OpenPar,
    ClosePar,
    Gt,
    Lt,
    End,
}

impl Token {
    fn literal(&self) -> String {
        match self {
            Token::Identifier(s) => s.clone(),
            Token::Comma => ",".into(),
            Token::Equals => "=".into(),
            Token::DoubleEquals => "==".into(),
            Token::NotEquals => "!=".into(),
            Token::Bang => "!".into(),
            Token::In => "in".into(),
            Token::NotIn => "notin".into(),
            Token::OpenPar => "(".into(),
            Token::ClosePar => ")".into(),
            Token::Gt => ">".into(),
            Token::Lt => "<".into(),
            Token::End => String::new(),
        }
    }
}

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

fn lex(s: &str) -> Vec<Token> {
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        if is_special(c) {
            let mut j = i;
            while j < chars.len() && is_special(chars[j]) {
                j += 1;
            }
            // Longest known operator prefix, like the Go lexer.
            let run: String = chars[i..j].iter().collect();
            let (tok, len) = if run.starts_with("==") {
                (Token::DoubleEquals, 2)
            } else if run.starts_with("!=") {
                (Token::NotEquals, 2)
            } else {
                let t = match c {
                    '=' => Token::Equals,
                    '!' => Token::Bang,
                    '(' => Token::OpenPar,
                    ')' => Token::ClosePar,
                    ',' => Token::Comma,
                    '>' => Token::Gt,
                    _ => Token::Lt,
                };
                (t, 1)
            };
            out.push(tok);
            i += len;
            continue;
        }
        let mut j = i;
        while j < chars.len() && !chars[j].is_whitespace() && !is_special(chars[j]) {
            j += 1;
        }
        let word: String = chars[i..j].iter().collect();
        out.push(match word.as_str() {
            "in" => Token::In,
            "notin" => Token::NotIn,
            _ => Token::Identifier(word),
        });
        i = j;
    }
    out.push(Token::End);
    out
}

struct Parser {
    toks: Vec<Token>,
    pos: usize,
}

/// In the "values" context (everywhere except the operator position) the
/// keywords `in`/`notin` are plain identifiers, as in the Go parser.
fn as_value(t: Token) -> Token {
    match t {
        Token::In => Token::Identifier("in".into()),
        Token::NotIn => Token::Identifier("notin".into()),
        t => t,
    }
}

fn err(msg: String) -> SelectorError {
    SelectorError(msg)
}

impl Parser {
    fn lookahead(&self) -> Token {
        as_value(self.toks.get(self.pos).cloned().unwrap_or(Token::End))
    }
    fn consume_raw(&mut self) -> Token {
        let t = self.toks.get(self.pos).cloned().unwrap_or(Token::End);
        if self.pos < self.toks.len() {
            self.pos += 1;
        }
        t
    }
    fn consume(&mut self) -> Token {
        as_value(self.consume_raw())
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, SelectorError> {
        let mut reqs = Vec::new();
        loop {
            match self.lookahead() {
                Token::Identifier(_) | Token::Bang => {
                    let r = self
                        .requirement()
                        .map_err(|e| err(format!("unable to parse requirement: {e}")))?;
                    reqs.push(r);
                    match self.consume() {
                        Token::End => return Ok(reqs),
                        Token::Comma => match self.lookahead() {
                            Token::Identifier(_) | Token::Bang => {}
                            t => {
                                return Err(err(format!(
                                    "found '{}', expected: identifier after ','",
                                    t.literal()
                                )));
                            }
                        },
                        t => {
                            return Err(err(format!(
                                "found '{}', expected: ',' or 'end of string'",
                                t.literal()
                            )));
                        }
                    }
                }
                Token::End => return Ok(reqs),
                t => {
                    return Err(err(format!(
                        "found '{}', expected: !, identifier, or 'end of string'",
                        t.literal()
                    )));
                }
            }
        }
    }

    fn requirement(&mut self) -> Result<Requirement, SelectorError> {
        let mut tok = self.consume();
        let bang = tok == Token::Bang;
        if bang {
            tok = self.consume();
        }
        let key = match tok {
            Token::Identifier(k) => k,
            t => {
                return Err(err(format!(
                    "found '{}', expected: identifier",
                    t.literal()
                )));
            }
        };
        // The Go parser validates the key with a nil field path here.
        names::validate_qualified_name(&key)
            .map_err(|e| err(format!("<nil>: Invalid value: \"{key}\": {e}")))?;
        if bang {
            return new_requirement(key, Operator::DoesNotExist, vec![]);
        }
        if matches!(self.lookahead(), Token::End | Token::Comma) {
            return new_requirement(key, Operator::Exists, vec![]);
        }
        let op = match self.consume_raw() {
            Token::In => Operator::In,
            Token::Equals | Token::DoubleEquals => Operator::Equals,
            Token::Gt => Operator::GreaterThan,
            Token::Lt => Operator::LessThan,
            Token::NotIn => Operator::NotIn,
            Token::NotEquals => Operator::NotEquals,
            t => {
                return Err(err(format!(
                    "found '{}', expected: in, notin, =, ==, !=, gt, lt",
                    t.literal()
                )));
            }
        };
        let values = match op {
            Operator::In | Operator::NotIn => self.values()?,
            _ => self.exact_value()?,
        };
        new_requirement(key, op, values)
    }

    fn values(&mut self) -> Result<Vec<String>, SelectorError> {
        match self.consume() {
            Token::OpenPar => {}
            t => return Err(err(format!("found '{}' expected: '('", t.literal()))),
        }
        match self.lookahead() {
            Token::Identifier(_) | Token::Comma => {
                let set = self.identifiers_list()?;
                match self.consume() {
                    Token::ClosePar => Ok(set),
                    t => Err(err(format!("found '{}', expected: ')'", t.literal()))),
                }
            }
            Token::ClosePar => {
                self.consume();
                Ok(vec![String::new()])
            }
            t => Err(err(format!(
                "found '{}', expected: ',', ')' or identifier",
                t.literal()
            ))),
        }
    }

    fn identifiers_list(&mut self) -> Result<Vec<String>, SelectorError> {
        let mut set: Vec<String> = Vec::new();
        let insert = |set: &mut Vec<String>, v: String| {
            if !set.contains(&v) {
                set.push(v);
            }
        };
        loop {
            match self.consume() {
                Token::Identifier(v) => {
                    insert(&mut set, v);
                    match self.lookahead() {
                        Token::Comma => continue,
                        Token::ClosePar => break,
                        t => {
                            return Err(err(format!(
                                "found '{}', expected: ',' or ')'",
                                t.literal()
                            )));
                        }
                    }
                }
                Token::Comma => {
                    if set.is_empty() {
                        insert(&mut set, String::new());
                    }
                    match self.lookahead() {
                        Token::ClosePar => {
                            insert(&mut set, String::new());
                            break;
                        }
                        Token::Comma => {
                            self.consume();
                            insert(&mut set, String::new());
                        }
                        _ => {}
                    }
                }
                t => {
                    return Err(err(format!(
                        "found '{}', expected: ',', or identifier",
                        t.literal()
                    )));
                }
            }
        }
        set.sort();
        Ok(set)
    }

    fn exact_value(&mut self) -> Result<Vec<String>, SelectorError> {
        if matches!(self.lookahead(), Token::End | Token::Comma) {
            return Ok(vec![String::new()]);
        }
        match self.consume() {
            Token::Identifier(v) => Ok(vec![v]),
            t => Err(err(format!(
                "found '{}', expected: identifier",
                t.literal()
            ))),
        }
    }
}

/// `labels.NewRequirement` checks (key already validated by the parser).
fn new_requirement(
    key: String,
    op: Operator,
    values: Vec<String>,
) -> Result<Requirement, SelectorError> {
    let mut errs = Vec::new();
    match op {
        Operator::In | Operator::NotIn if values.is_empty() => {
            errs.push(
                "values: Invalid value: []: for 'in', 'notin' operators, values set can't be empty"
                    .to_string(),
            );
        }
        Operator::Equals | Operator::NotEquals if values.len() != 1 => {
            errs.push(format!("values: Invalid value: {values:?}: exact-match compatibility requires one single value"));
        }
        Operator::GreaterThan | Operator::LessThan => {
            if values.len() != 1 {
                errs.push(format!("values: Invalid value: {values:?}: for 'Gt', 'Lt' operators, exactly one value is required"));
            }
            for (i, v) in values.iter().enumerate() {
                if v.parse::<i64>().is_err() {
                    errs.push(format!(
                        "values[{i}]: Invalid value: \"{v}\": for 'Gt', 'Lt' operators, the value must be an integer"
                    ));
                }
            }
        }
        _ => {}
    }
    for (i, v) in values.iter().enumerate() {
        if let Err(e) = names::validate_label_value(v) {
            errs.push(format!("values[{i}][{key}]: Invalid value: \"{v}\": {e}"));
        }
    }
    match errs.as_slice() {
        [] => Ok(Requirement { key, op, values }),
        [one] => Err(err(one.clone())),
        many => Err(err(format!("[{}]", many.join(", ")))),
    }
}

/// Validates a label key (`[prefix/]name`) like `validation.IsQualifiedName`,
/// returning the Kubernetes error text prefixed with the key.
pub fn validate_label_key(key: &str) -> Result<(), String> {
    names::validate_qualified_name(key).map_err(|e| format!("key: Invalid value: \"{key}\": {e}"))
}

/// Validates a label value like `validation.IsValidLabelValue`.
pub fn validate_label_value(v: &str) -> Result<(), String> {
    names::validate_label_value(v)
}

impl LabelSelector {
    /// Parses a selector string. The empty (or all-whitespace) string selects everything.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut p = Parser {
            toks: lex(s),
            pos: 0,
        };
        let mut requirements = p.parse()?;
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(LabelSelector { requirements })
    }

    /// Builds a selector from a `metav1.LabelSelector` JSON object
    /// (`matchLabels` + `matchExpressions` with `In|NotIn|Exists|DoesNotExist`).
    pub fn from_label_selector_value(v: &Value) -> Result<Self, SelectorError> {
        let mut requirements = Vec::new();
        if let Some(ml) = v.get("matchLabels").and_then(Value::as_object) {
            for (k, val) in ml {
                let val = val.as_str().ok_or_else(|| {
                    SelectorError(format!("matchLabels.{k}: value must be a string"))
                })?;
                validate_label_key(k).map_err(SelectorError)?;
                validate_label_value(val).map_err(|e| {
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
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(LabelSelector { requirements })
    }

    /// The parsed requirements, sorted by key.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// True for the selector that selects everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether `labels` satisfies every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// Like [`matches`](Self::matches) for `metadata.labels` as stored JSON.
    /// `None`, `null` and non-object values count as "no labels"; non-string
    /// label values are ignored.
    pub fn matches_value(&self, labels: Option<&Value>) -> bool {
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

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.requirements.iter().map(ToString::to_string).collect();
        f.write_str(&parts.join(","))
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
    fn empty_selector_matches_everything() {
        let s = LabelSelector::parse("").expect("parse");
        assert!(s.is_empty());
        assert!(s.matches(&labels(&[])));
        assert!(s.matches(&labels(&[("a", "b")])));
        assert!(LabelSelector::parse("   ").expect("parse").is_empty());
    }

    #[test]
    fn equality_forms() {
        for src in ["app=web", "app==web", " app = web "] {
            let s = LabelSelector::parse(src).expect(src);
            assert!(s.matches(&labels(&[("app", "web")])), "{src}");
            assert!(!s.matches(&labels(&[("app", "db")])), "{src}");
            assert!(!s.matches(&labels(&[])), "{src}");
        }
    }

    #[test]
    fn not_equals_matches_absent_label() {
        let s = LabelSelector::parse("tier!=db").expect("parse");
        assert!(s.matches(&labels(&[])));
        assert!(s.matches(&labels(&[("tier", "web")])));
        assert!(!s.matches(&labels(&[("tier", "db")])));
    }

    #[test]
    fn set_based_requirements() {
        let s = LabelSelector::parse("env in (prod, staging),zone notin (z1)").expect("parse");
        assert!(s.matches(&labels(&[("env", "prod")])));
        assert!(s.matches(&labels(&[("env", "staging"), ("zone", "z2")])));
        assert!(!s.matches(&labels(&[("env", "dev")])));
        assert!(!s.matches(&labels(&[("env", "prod"), ("zone", "z1")])));
        assert!(!s.matches(&labels(&[])), "in requires the key");
    }

    #[test]
    fn exists_and_not_exists() {
        let s = LabelSelector::parse("g,!h").expect("parse");
        assert!(s.matches(&labels(&[("g", "")])));
        assert!(!s.matches(&labels(&[("g", "1"), ("h", "2")])));
        assert!(!s.matches(&labels(&[])));
    }

    #[test]
    fn full_example_from_the_brief() {
        let s = LabelSelector::parse("a=b,c!=d,e in (x,y),f notin (z),g,!h").expect("parse");
        assert_eq!(s.requirements().len(), 6);
        let ok = labels(&[("a", "b"), ("c", "x"), ("e", "y"), ("g", "")]);
        assert!(s.matches(&ok));
        let mut bad = ok.clone();
        bad.insert("h".into(), "1".into());
        assert!(!s.matches(&bad));
        let mut bad = ok.clone();
        bad.insert("f".into(), "z".into());
        assert!(!s.matches(&bad));
        assert_eq!(s.to_string(), "a=b,c!=d,e in (x,y),f notin (z),g,!h");
    }

    #[test]
    fn prefixed_keys_and_empty_value() {
        let s = LabelSelector::parse("app.kubernetes.io/name=kd,x=").expect("parse");
        assert!(s.matches(&labels(&[("app.kubernetes.io/name", "kd"), ("x", "")])));
        assert!(!s.matches(&labels(&[("app.kubernetes.io/name", "kd"), ("x", "y")])));
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
    fn invalid_label_value_error_text() {
        let e = LabelSelector::parse("app=-bad").expect_err("must fail");
        assert_eq!(
            e.to_string(),
            "unable to parse requirement: values[0][app]: Invalid value: \"-bad\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
        );
    }

    #[test]
    fn too_long_value_and_key() {
        let long = "a".repeat(64);
        let e = LabelSelector::parse(&format!("k={long}")).expect_err("long value");
        assert!(
            e.to_string().contains("must be no more than 63 characters"),
            "{e}"
        );
        let e = LabelSelector::parse(&format!("{long}=v")).expect_err("long key");
        assert!(
            e.to_string().starts_with(&format!("unable to parse requirement: <nil>: Invalid value: \"{long}\": name part must be no more than 63 characters")),
            "{e}"
        );
    }

    #[test]
    fn invalid_key_error_text() {
        let e = LabelSelector::parse("-x=y").expect_err("bad key");
        assert!(
            e.to_string().contains("name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"),
            "{e}"
        );
        let e = LabelSelector::parse("Bad_Prefix/x=y").expect_err("bad prefix");
        assert!(
            e.to_string()
                .contains("prefix part a lowercase RFC 1123 subdomain"),
            "{e}"
        );
    }

    #[test]
    fn syntax_errors() {
        let e = LabelSelector::parse("a=b,").expect_err("trailing comma");
        assert_eq!(e.to_string(), "found '', expected: identifier after ','");
        let e = LabelSelector::parse("a in b").expect_err("no paren");
        assert_eq!(
            e.to_string(),
            "unable to parse requirement: found 'b' expected: '('"
        );
        let e = LabelSelector::parse("a b").expect_err("two idents");
        assert_eq!(
            e.to_string(),
            "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt"
        );
        let e = LabelSelector::parse("a in (x").expect_err("unclosed");
        assert_eq!(
            e.to_string(),
            "unable to parse requirement: found '', expected: ',' or ')'"
        );
        let e = LabelSelector::parse("=x").expect_err("no key");
        assert_eq!(
            e.to_string(),
            "found '=', expected: !, identifier, or 'end of string'"
        );
        let e = LabelSelector::parse("a=b c=d").expect_err("missing comma");
        assert_eq!(e.to_string(), "found 'c', expected: ',' or 'end of string'");
    }

    #[test]
    fn keywords_are_values_in_value_position() {
        let s = LabelSelector::parse("x in (in,notin),in=notin").expect("parse");
        assert!(s.matches(&labels(&[("x", "in"), ("in", "notin")])));
        assert!(!s.matches(&labels(&[("x", "other"), ("in", "notin")])));
    }

    #[test]
    fn empty_values_in_sets() {
        let s = LabelSelector::parse("x in (,a)").expect("parse");
        assert_eq!(
            s.requirements()[0].values,
            vec!["".to_string(), "a".to_string()]
        );
        let s = LabelSelector::parse("x notin ()").expect("parse");
        assert!(!s.matches(&labels(&[("x", "")])));
        assert!(s.matches(&labels(&[("x", "a")])));
    }

    #[test]
    fn numeric_comparisons() {
        let s = LabelSelector::parse("gen>3,gen<10").expect("parse");
        assert!(s.matches(&labels(&[("gen", "5")])));
        assert!(!s.matches(&labels(&[("gen", "3")])));
        assert!(!s.matches(&labels(&[("gen", "x")])));
        assert!(!s.matches(&labels(&[])));
        let e = LabelSelector::parse("gen>x").expect_err("not an int");
        assert_eq!(
            e.to_string(),
            "unable to parse requirement: values[0]: Invalid value: \"x\": for 'Gt', 'Lt' operators, the value must be an integer"
        );
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
