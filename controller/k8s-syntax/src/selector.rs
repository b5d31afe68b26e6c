//! The label selector grammar of the API server (`labelSelector=`, `kubectl -l`):
//! a port of `labels.Parse` and `Requirement.Matches` from apimachinery v0.34
//! (`k8s.io/apimachinery/pkg/labels/selector.go`), with its error texts.
//!
//! A selector is a comma-separated list of requirements, all of which must hold:
//!
//! | form               | meaning                                                 |
//! |--------------------|---------------------------------------------------------|
//! | `k=v`, `k==v`      | label `k` exists and equals `v`                         |
//! | `k!=v`             | label `k` is absent or differs from `v`                 |
//! | `k in (a,b)`       | label `k` exists and is one of the values               |
//! | `k notin (a,b)`    | label `k` is absent or is none of the values            |
//! | `k`                | label `k` exists                                        |
//! | `!k`               | label `k` does not exist                                |
//! | `k>n`, `k<n`       | label `k` exists and is an integer greater / less than `n` |
//!
//! The empty selector matches everything. The lexer and the recursive-descent
//! parser follow the Go code step by step, so quirks come along: `in`/`notin`
//! are plain words outside the operator position, `k=` and `k in ()` mean the
//! empty value, a bad key is reported with a `<nil>` field path, whitespace is
//! only space, tab, CR and LF, and a NUL byte at the start of a token ends the
//! input. Keys are validated with [`validate_qualified_name`], values with
//! [`validate_label_value`]. Requirements are sorted by key.

use std::collections::BTreeMap;
use std::fmt;

use crate::names::{validate_label_value, validate_qualified_name};
use crate::quote::go_quote;

/// A label selector parse error; `Display` gives the API server's message,
/// e.g. `unable to parse requirement: found '', expected: ',' or ')'`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelectorError(pub String);

impl fmt::Display for SelectorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SelectorError {}

/// The operator of one requirement (`selection.Operator`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operator {
    /// `k=v`
    Equals,
    /// `k==v` (matches like [`Operator::Equals`]; kept apart for `Display`, as in Go)
    DoubleEquals,
    /// `k!=v`
    NotEquals,
    /// `k in (..)`
    In,
    /// `k notin (..)`
    NotIn,
    /// bare `k`
    Exists,
    /// `!k`
    DoesNotExist,
    /// `k>n` (integer comparison; the label must parse as an `i64`)
    GreaterThan,
    /// `k<n`
    LessThan,
}

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requirement {
    /// The label key.
    pub key: String,
    /// The operator.
    pub op: Operator,
    /// The values: one for `=`, `==`, `!=`, `>`, `<`; at least one (sorted,
    /// distinct) for `in`/`notin`; none for `k` and `!k`.
    pub values: Vec<String>,
}

impl Requirement {
    /// `Requirement.Matches`.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let got = labels.get(&self.key);
        let has = |v: &String| self.values.contains(v);
        match self.op {
            Operator::Equals | Operator::DoubleEquals | Operator::In => got.is_some_and(has),
            Operator::NotEquals | Operator::NotIn => !got.is_some_and(has),
            Operator::Exists => got.is_some(),
            Operator::DoesNotExist => got.is_none(),
            Operator::GreaterThan | Operator::LessThan => {
                let (Some(have), [want]) =
                    (got.and_then(|v| v.parse::<i64>().ok()), &self.values[..])
                else {
                    return false;
                };
                let Ok(want) = want.parse::<i64>() else {
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

/// `Requirement.String`.
impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let values = self.values.join(",");
        let key = &self.key;
        match self.op {
            Operator::Equals => write!(f, "{key}={values}"),
            Operator::DoubleEquals => write!(f, "{key}=={values}"),
            Operator::NotEquals => write!(f, "{key}!={values}"),
            Operator::In => write!(f, "{key} in ({values})"),
            Operator::NotIn => write!(f, "{key} notin ({values})"),
            Operator::Exists => write!(f, "{key}"),
            Operator::DoesNotExist => write!(f, "!{key}"),
            Operator::GreaterThan => write!(f, "{key}>{values}"),
            Operator::LessThan => write!(f, "{key}<{values}"),
        }
    }
}

/// A parsed label selector. The empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// `labels.Parse`: parses a selector string; the empty (or all-blank)
    /// string selects everything. Errors carry the API server's text.
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut p = Parser {
            items: Lexer::scan(s),
            pos: 0,
        };
        Ok(Self::from_requirements(p.parse()?))
    }

    /// A selector of already validated requirements (sorted by key, like a
    /// parsed one). Nothing is checked.
    pub fn from_requirements(requirements: impl IntoIterator<Item = Requirement>) -> Self {
        let mut requirements: Vec<Requirement> = requirements.into_iter().collect();
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Self { requirements }
    }

    /// The requirements, sorted by key.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// Whether this is the selector that selects everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// Whether `labels` satisfies every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }
}

/// `Selector.String` (the canonical form, requirements sorted by key).
impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{r}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for LabelSelector {
    type Err = SelectorError;

    fn from_str(s: &str) -> Result<Self, SelectorError> {
        Self::parse(s)
    }
}

// --- lexer (Lexer.Lex and friends) ----------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    End,
    ClosedPar,
    Comma,
    DoesNotExist,
    DoubleEquals,
    Equals,
    GreaterThan,
    Identifier,
    In,
    LessThan,
    NotEquals,
    NotIn,
    OpenPar,
}

/// `string2token`.
fn string_to_token(s: &[u8]) -> Option<Token> {
    Some(match s {
        b")" => Token::ClosedPar,
        b"," => Token::Comma,
        b"!" => Token::DoesNotExist,
        b"==" => Token::DoubleEquals,
        b"=" => Token::Equals,
        b">" => Token::GreaterThan,
        b"in" => Token::In,
        b"<" => Token::LessThan,
        b"!=" => Token::NotEquals,
        b"notin" => Token::NotIn,
        b"(" => Token::OpenPar,
        _ => return None,
    })
}

/// `ScannedItem`.
#[derive(Debug, Clone)]
struct Item {
    tok: Token,
    literal: String,
}

fn is_whitespace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\r' | b'\n')
}

fn is_special_symbol(b: u8) -> bool {
    matches!(b, b'=' | b'!' | b'(' | b')' | b',' | b'>' | b'<')
}

struct Lexer<'a> {
    s: &'a [u8],
    pos: usize,
}

impl Lexer<'_> {
    /// Go reads byte 0 at the end of the input, so a NUL byte reads as "end"
    /// too (but is consumed).
    fn read(&mut self) -> u8 {
        match self.s.get(self.pos) {
            Some(&b) => {
                self.pos += 1;
                b
            }
            None => 0,
        }
    }

    fn unread(&mut self) {
        self.pos -= 1;
    }

    fn literal(&self, start: usize, end: usize) -> String {
        String::from_utf8_lossy(&self.s[start..end]).into_owned()
    }

    fn scan_id_or_keyword(&mut self) -> Item {
        let start = self.pos;
        let mut end = start;
        loop {
            let ch = self.read();
            if ch == 0 {
                break;
            }
            if is_special_symbol(ch) || is_whitespace(ch) {
                self.unread();
                break;
            }
            end = self.pos;
        }
        let bytes = &self.s[start..end];
        Item {
            tok: string_to_token(bytes).unwrap_or(Token::Identifier),
            literal: self.literal(start, end),
        }
    }

    fn scan_special_symbol(&mut self) -> Item {
        let start = self.pos;
        let mut last: Option<(Token, usize)> = None;
        loop {
            let ch = self.read();
            if ch == 0 {
                break;
            }
            if !is_special_symbol(ch) {
                self.unread();
                break;
            }
            if let Some(t) = string_to_token(&self.s[start..self.pos]) {
                last = Some((t, self.pos));
            } else if last.is_some() {
                self.unread();
                break;
            }
        }
        // Every single special symbol is a token, so `last` is always set.
        let (tok, end) = last.unwrap_or((Token::End, start));
        Item {
            tok,
            literal: self.literal(start, end),
        }
    }

    fn lex(&mut self) -> Item {
        let mut ch = self.read();
        while is_whitespace(ch) {
            ch = self.read();
        }
        if ch == 0 {
            return Item {
                tok: Token::End,
                literal: String::new(),
            };
        }
        self.unread();
        if is_special_symbol(ch) {
            self.scan_special_symbol()
        } else {
            self.scan_id_or_keyword()
        }
    }

    /// `Parser.scan`: every token up to and including the end.
    fn scan(s: &str) -> Vec<Item> {
        let mut l = Lexer {
            s: s.as_bytes(),
            pos: 0,
        };
        let mut items = Vec::new();
        loop {
            let item = l.lex();
            let end = item.tok == Token::End;
            items.push(item);
            if end {
                return items;
            }
        }
    }
}

// --- parser -----------------------------------------------------------------

/// `ParserContext`: in `Values`, the keywords `in`/`notin` are identifiers.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Context {
    KeyAndOperator,
    Values,
}

struct Parser {
    items: Vec<Item>,
    pos: usize,
}

fn err(msg: String) -> SelectorError {
    SelectorError(msg)
}

impl Parser {
    fn item(&self, i: usize, ctx: Context) -> (Token, String) {
        let it = self.items.get(i).or(self.items.last());
        let (mut tok, lit) = it.map_or((Token::End, String::new()), |it| {
            (it.tok, it.literal.clone())
        });
        if ctx == Context::Values && matches!(tok, Token::In | Token::NotIn) {
            tok = Token::Identifier;
        }
        (tok, lit)
    }

    fn lookahead(&self, ctx: Context) -> (Token, String) {
        self.item(self.pos, ctx)
    }

    fn consume(&mut self, ctx: Context) -> (Token, String) {
        self.pos += 1;
        self.item(self.pos - 1, ctx)
    }

    /// `Parser.parse`.
    fn parse(&mut self) -> Result<Vec<Requirement>, SelectorError> {
        let mut requirements = Vec::new();
        loop {
            let (tok, lit) = self.lookahead(Context::Values);
            match tok {
                Token::Identifier | Token::DoesNotExist => {
                    let r = self
                        .parse_requirement()
                        .map_err(|e| err(format!("unable to parse requirement: {e}")))?;
                    requirements.push(r);
                    let (t, l) = self.consume(Context::Values);
                    match t {
                        Token::End => return Ok(requirements),
                        Token::Comma => {
                            let (t2, l2) = self.lookahead(Context::Values);
                            if t2 != Token::Identifier && t2 != Token::DoesNotExist {
                                return Err(err(format!(
                                    "found '{l2}', expected: identifier after ','"
                                )));
                            }
                        }
                        _ => {
                            return Err(err(format!(
                                "found '{l}', expected: ',' or 'end of string'"
                            )));
                        }
                    }
                }
                Token::End => return Ok(requirements),
                _ => {
                    return Err(err(format!(
                        "found '{lit}', expected: !, identifier, or 'end of string'"
                    )));
                }
            }
        }
    }

    /// `Parser.parseRequirement`.
    fn parse_requirement(&mut self) -> Result<Requirement, SelectorError> {
        let (key, op) = self.parse_key_and_infer_operator()?;
        if let Some(op @ (Operator::Exists | Operator::DoesNotExist)) = op {
            return new_requirement(key, op, Vec::new());
        }
        let op = self.parse_operator()?;
        let values = match op {
            Operator::In | Operator::NotIn => self.parse_values()?,
            _ => self.parse_exact_value()?,
        };
        new_requirement(key, op, values)
    }

    /// `Parser.parseKeyAndInferOperator`.
    fn parse_key_and_infer_operator(
        &mut self,
    ) -> Result<(String, Option<Operator>), SelectorError> {
        let mut op = None;
        let (mut tok, mut literal) = self.consume(Context::Values);
        if tok == Token::DoesNotExist {
            op = Some(Operator::DoesNotExist);
            (tok, literal) = self.consume(Context::Values);
        }
        if tok != Token::Identifier {
            return Err(err(format!("found '{literal}', expected: identifier")));
        }
        // `validateLabelKey(literal, p.path)` with the parser's nil path.
        if let Err(e) = validate_qualified_name(&literal) {
            return Err(err(format!(
                "<nil>: Invalid value: {}: {e}",
                go_quote(&literal)
            )));
        }
        let (t, _) = self.lookahead(Context::Values);
        if matches!(t, Token::End | Token::Comma) && op.is_none() {
            op = Some(Operator::Exists);
        }
        Ok((literal, op))
    }

    /// `Parser.parseOperator`.
    fn parse_operator(&mut self) -> Result<Operator, SelectorError> {
        let (tok, lit) = self.consume(Context::KeyAndOperator);
        Ok(match tok {
            Token::In => Operator::In,
            Token::Equals => Operator::Equals,
            Token::DoubleEquals => Operator::DoubleEquals,
            Token::GreaterThan => Operator::GreaterThan,
            Token::LessThan => Operator::LessThan,
            Token::NotIn => Operator::NotIn,
            Token::NotEquals => Operator::NotEquals,
            _ => {
                return Err(err(format!(
                    "found '{lit}', expected: in, notin, =, ==, !=, gt, lt"
                )));
            }
        })
    }

    /// `Parser.parseValues`: `(a,b)`, sorted and distinct.
    fn parse_values(&mut self) -> Result<Vec<String>, SelectorError> {
        let (tok, lit) = self.consume(Context::Values);
        if tok != Token::OpenPar {
            return Err(err(format!("found '{lit}' expected: '('")));
        }
        let (tok, lit) = self.lookahead(Context::Values);
        match tok {
            Token::Identifier | Token::Comma => {
                let set = self.parse_identifiers_list()?;
                let (tok, _) = self.consume(Context::Values);
                if tok != Token::ClosedPar {
                    // Go reports the literal of the list's first token (unreachable: the
                    // list only ends at a ')')
                    return Err(err(format!("found '{lit}', expected: ')'")));
                }
                Ok(set)
            }
            Token::ClosedPar => {
                self.consume(Context::Values);
                Ok(vec![String::new()])
            }
            _ => Err(err(format!(
                "found '{lit}', expected: ',', ')' or identifier"
            ))),
        }
    }

    /// `Parser.parseIdentifiersList`.
    fn parse_identifiers_list(&mut self) -> Result<Vec<String>, SelectorError> {
        let mut set = std::collections::BTreeSet::new();
        loop {
            let (tok, lit) = self.consume(Context::Values);
            match tok {
                Token::Identifier => {
                    set.insert(lit);
                    let (tok2, lit2) = self.lookahead(Context::Values);
                    match tok2 {
                        Token::Comma => continue,
                        Token::ClosedPar => return Ok(set.into_iter().collect()),
                        _ => return Err(err(format!("found '{lit2}', expected: ',' or ')'"))),
                    }
                }
                Token::Comma => {
                    if set.is_empty() {
                        set.insert(String::new()); // "(,"
                    }
                    let (tok2, _) = self.lookahead(Context::Values);
                    if tok2 == Token::ClosedPar {
                        set.insert(String::new()); // ",)"
                        return Ok(set.into_iter().collect());
                    }
                    if tok2 == Token::Comma {
                        self.consume(Context::Values);
                        set.insert(String::new()); // ",,"
                    }
                }
                _ => return Err(err(format!("found '{lit}', expected: ',', or identifier"))),
            }
        }
    }

    /// `Parser.parseExactValue`: one value, empty when none follows.
    fn parse_exact_value(&mut self) -> Result<Vec<String>, SelectorError> {
        let (tok, _) = self.lookahead(Context::Values);
        if matches!(tok, Token::End | Token::Comma) {
            return Ok(vec![String::new()]);
        }
        let (tok, lit) = self.consume(Context::Values);
        if tok == Token::Identifier {
            Ok(vec![lit])
        } else {
            Err(err(format!("found '{lit}', expected: identifier")))
        }
    }
}

/// The checks of `labels.NewRequirement` that parsed input can fail (the key
/// was validated by the parser, and the parser always yields the value count
/// each operator needs): integer values for `>`/`<`, label values. Several
/// errors print as `[e1, e2]`, like Go's aggregate (the messages differ in
/// their paths, so its de-duplication never applies).
fn new_requirement(
    key: String,
    op: Operator,
    values: Vec<String>,
) -> Result<Requirement, SelectorError> {
    let mut errs: Vec<String> = Vec::new();
    if matches!(op, Operator::GreaterThan | Operator::LessThan) {
        for (i, v) in values.iter().enumerate() {
            if v.parse::<i64>().is_err() {
                errs.push(format!(
                    "values[{i}]: Invalid value: {}: for 'Gt', 'Lt' operators, the value must be an integer",
                    go_quote(v)
                ));
            }
        }
    }
    for (i, v) in values.iter().enumerate() {
        if let Err(e) = validate_label_value(v) {
            errs.push(format!(
                "values[{i}][{key}]: Invalid value: {}: {e}",
                go_quote(v)
            ));
        }
    }
    match errs.as_slice() {
        [] => Ok(Requirement { key, op, values }),
        [one] => Err(err(one.clone())),
        many => Err(err(format!("[{}]", many.join(", ")))),
    }
}

#[cfg(test)]
mod tests {
    //! The grammar of `labels.Parse` and the semantics of `Requirement.Matches`
    //! (`k8s.io/apimachinery/pkg/labels/selector.go`), feature by feature, with
    //! the API server's texts. `tests/apimachinery.rs` compares both with the
    //! outputs of that Go code on many more selectors.

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn error(s: &str) -> String {
        LabelSelector::parse(s).expect_err(s).to_string()
    }

    #[test]
    fn empty_selector_matches_everything() {
        for s in ["", "   ", " \t\r\n"] {
            let sel = LabelSelector::parse(s).unwrap();
            assert!(sel.is_empty(), "{s:?}");
            assert!(sel.matches(&labels(&[])) && sel.matches(&labels(&[("a", "b")])));
        }
    }

    #[test]
    fn equality_forms() {
        for src in ["app=web", "app==web", " app = web "] {
            let s = LabelSelector::parse(src).expect(src);
            assert!(s.matches(&labels(&[("app", "web")])), "{src}");
            assert!(!s.matches(&labels(&[("app", "db")])), "{src}");
            assert!(!s.matches(&labels(&[])), "{src}");
        }
        // `==` stays `==` in the canonical form, as in Go.
        assert_eq!(
            LabelSelector::parse("app==web").unwrap().to_string(),
            "app==web"
        );
    }

    #[test]
    fn not_equals_and_notin_match_an_absent_label() {
        let s = LabelSelector::parse("tier!=db").unwrap();
        assert!(s.matches(&labels(&[])));
        assert!(s.matches(&labels(&[("tier", "web")])));
        assert!(!s.matches(&labels(&[("tier", "db")])));
        let s = LabelSelector::parse("x notin (1)").unwrap();
        assert!(s.matches(&labels(&[])) && !s.matches(&labels(&[("x", "1")])));
    }

    #[test]
    fn set_based_requirements() {
        let s = LabelSelector::parse("env in (prod, staging),zone notin (z1)").unwrap();
        assert!(s.matches(&labels(&[("env", "prod")])));
        assert!(s.matches(&labels(&[("env", "staging"), ("zone", "z2")])));
        assert!(!s.matches(&labels(&[("env", "dev")])));
        assert!(!s.matches(&labels(&[("env", "prod"), ("zone", "z1")])));
        assert!(!s.matches(&labels(&[])), "in requires the key");
        assert_eq!(s.to_string(), "env in (prod,staging),zone notin (z1)");
        // Values are sorted and distinct.
        let s = LabelSelector::parse("x in (b,a,b)").unwrap();
        assert_eq!(s.requirements()[0].values, ["a", "b"]);
    }

    #[test]
    fn exists_and_does_not_exist() {
        let s = LabelSelector::parse("g,!h").unwrap();
        assert!(s.matches(&labels(&[("g", "")])));
        assert!(!s.matches(&labels(&[("g", "1"), ("h", "2")])));
        assert!(!s.matches(&labels(&[])));
        assert_eq!(s.requirements()[1].op, Operator::DoesNotExist);
        assert!(LabelSelector::parse("! a").unwrap().matches(&labels(&[])));
    }

    #[test]
    fn all_forms_together_sorted_by_key() {
        let s = LabelSelector::parse("a=b,c!=d,e in (x,y),f notin (z),g,!h").unwrap();
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
        assert_eq!(
            LabelSelector::parse("b=1,a=2").unwrap().to_string(),
            "a=2,b=1"
        );

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
        for (k, v) in [("canary", "1"), ("tier", "c"), ("x", "1")] {
            let mut l = ok.clone();
            l.insert(k.into(), v.into());
            assert!(!s.matches(&l), "{k}={v}");
        }
        let mut l = ok;
        l.remove("example.com/team");
        assert!(!s.matches(&l));
    }

    #[test]
    fn prefixed_keys_and_empty_values() {
        let s = LabelSelector::parse("app.kubernetes.io/name=kd,x=").unwrap();
        assert!(s.matches(&labels(&[("app.kubernetes.io/name", "kd"), ("x", "")])));
        assert!(!s.matches(&labels(&[("app.kubernetes.io/name", "kd"), ("x", "y")])));
        // `(,a)` holds the empty value; `()` is the empty value alone.
        let s = LabelSelector::parse("x in (,a)").unwrap();
        assert_eq!(s.requirements()[0].values, ["", "a"]);
        let s = LabelSelector::parse("x notin ()").unwrap();
        assert!(!s.matches(&labels(&[("x", "")])));
        assert!(s.matches(&labels(&[("x", "a")])));
        let s = LabelSelector::parse("app in ()").unwrap();
        assert!(s.matches(&labels(&[("app", "")])) && !s.matches(&labels(&[("app", "a")])));
    }

    #[test]
    fn keywords_are_values_in_value_position() {
        let s = LabelSelector::parse("x in (in,notin),in=notin").unwrap();
        assert!(s.matches(&labels(&[("x", "in"), ("in", "notin")])));
        assert!(!s.matches(&labels(&[("x", "other"), ("in", "notin")])));
    }

    #[test]
    fn integer_comparisons() {
        // Gt/Lt: the label must exist and parse as an int64 (strconv.ParseInt).
        let s = LabelSelector::parse("gen>3,gen<10").unwrap();
        assert!(s.matches(&labels(&[("gen", "5")])));
        assert!(!s.matches(&labels(&[("gen", "3")])));
        assert!(!s.matches(&labels(&[("gen", "x")])));
        assert!(!s.matches(&labels(&[])));
        assert!(
            LabelSelector::parse("a>1")
                .unwrap()
                .matches(&labels(&[("a", "2")]))
        );
        assert!(
            LabelSelector::parse("a<01")
                .unwrap()
                .matches(&labels(&[("a", "0")]))
        );
        assert_eq!(
            error("gen>x"),
            "unable to parse requirement: values[0]: Invalid value: \"x\": for 'Gt', 'Lt' operators, the value must be an integer"
        );
        // Two errors print as Go's aggregate: `[e1, e2]`.
        assert!(error("a>-x").starts_with("unable to parse requirement: [values[0]: Invalid value: \"-x\": for 'Gt', 'Lt' operators, the value must be an integer, values[0][a]: Invalid value: \"-x\": a valid label must be"));
    }

    #[test]
    fn invalid_values_and_keys() {
        // NewRequirement -> validateLabelValue (path values[i][key]); the parser's
        // validateLabelKey has a nil path: `<nil>`.
        assert_eq!(
            error("app=-bad"),
            "unable to parse requirement: values[0][app]: Invalid value: \"-bad\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')"
        );
        let long = "a".repeat(64);
        assert_eq!(
            error(&format!("k={long}")),
            format!(
                "unable to parse requirement: values[0][k]: Invalid value: \"{long}\": must be no more than 63 characters"
            )
        );
        assert_eq!(
            error(&format!("{long}=v")),
            format!(
                "unable to parse requirement: <nil>: Invalid value: \"{long}\": name part must be no more than 63 characters"
            )
        );
        assert!(error("-x=y").contains("<nil>: Invalid value: \"-x\": name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character"));
        assert!(error("Bad_Prefix/x=y").contains("prefix part a lowercase RFC 1123 subdomain"));
        assert!(error("/x=y").contains("prefix part must be non-empty"));
        // A prefix is a subdomain: up to 253 characters, labels of any length.
        assert!(LabelSelector::parse(&format!("{}/k=v", "p".repeat(253))).is_ok());
        // Values are quoted like Go's %q.
        assert!(error("a=\"x\"").contains(r#"Invalid value: "\"x\"": "#));
        assert!(error("a=b\u{c}").contains(r#"Invalid value: "b\f": "#));
        assert!(error("a\u{a0}=b").contains(r#"Invalid value: "a\u00a0": "#));
    }

    #[test]
    fn syntax_errors() {
        for (s, want) in [
            ("a=b,", "found '', expected: identifier after ','"),
            ("app=web,", "found '', expected: identifier after ','"),
            (
                "a in b",
                "unable to parse requirement: found 'b' expected: '('",
            ),
            (
                "app in a)",
                "unable to parse requirement: found 'a' expected: '('",
            ),
            (
                "a b",
                "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt",
            ),
            (
                "app notinn (a)",
                "unable to parse requirement: found 'notinn', expected: in, notin, =, ==, !=, gt, lt",
            ),
            (
                "a in (x",
                "unable to parse requirement: found '', expected: ',' or ')'",
            ),
            (
                "app in (a",
                "unable to parse requirement: found '', expected: ',' or ')'",
            ),
            (
                "a in (,,)",
                "unable to parse requirement: found ')', expected: ',', or identifier",
            ),
            (
                "=x",
                "found '=', expected: !, identifier, or 'end of string'",
            ),
            ("a=b c=d", "found 'c', expected: ',' or 'end of string'"),
            (
                "!",
                "unable to parse requirement: found '', expected: identifier",
            ),
            (
                "a===b",
                "unable to parse requirement: found '=', expected: identifier",
            ),
        ] {
            assert_eq!(error(s), want, "{s:?}");
        }
        for bad in ["-bad=x", "app=-x-", &format!("{}=1", "k".repeat(64))] {
            assert!(LabelSelector::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn lexer_quirks_of_go() {
        // Whitespace is ' ', '\t', '\r', '\n' only (isWhitespace).
        assert!(LabelSelector::parse("\ta=b\r\n").is_ok());
        assert!(LabelSelector::parse("a=b\u{b}").is_err());
        // Go reads byte 0 as the end of the input: at the start of a token it
        // ends the selector, inside one it is dropped.
        assert_eq!(
            LabelSelector::parse("a=b \0junk").unwrap().to_string(),
            "a=b"
        );
        assert_eq!(LabelSelector::parse("a=\0b").unwrap().to_string(), "a=b");
        assert!(LabelSelector::parse("\0a").unwrap().is_empty());
    }

    #[test]
    fn from_requirements_sorts_by_key() {
        let r = |k: &str| Requirement {
            key: k.into(),
            op: Operator::Exists,
            values: vec![],
        };
        let s = LabelSelector::from_requirements([r("b"), r("a")]);
        assert_eq!(s.to_string(), "a,b");
        assert_eq!(s, LabelSelector::parse("b,a").unwrap());
        assert_eq!("b,a".parse::<LabelSelector>().unwrap(), s);
    }
}
