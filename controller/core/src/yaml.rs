//! YAML in and out, on `serde-saphyr` (the YAML crate kube 5 already brings).
//!
//! Reading follows YAML 1.2 as the project has always read it: only
//! `true`/`false` are booleans (`yes`, `on` stay strings), `0755` and `1_000`
//! are strings when the target is untyped, `<<` is an ordinary key, and a key
//! written twice in one mapping is an error naming the key. Errors are one
//! line (`... at line L, column C`) and never quote the source text.
//!
//! Writing keeps the layout of `kube-discovery crd` and `render -o yaml`
//! stable: block sequences at their key's indentation, multi-line strings as
//! `|-` blocks, no folding of long lines, and single quotes where a string
//! would otherwise read as another type or as YAML syntax.

use std::collections::BTreeMap;

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// A YAML text that does not parse or does not fit the target type.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct ParseError {
    /// The one-line description (position included).
    message: String,
    /// serde-saphyr's error.
    #[source]
    source: Box<serde_saphyr::Error>,
}

impl ParseError {
    fn new(e: serde_saphyr::Error) -> Self {
        let message = match e.without_snippet() {
            serde_saphyr::Error::DuplicateMappingKey { key, location } => {
                let key = key
                    .as_deref()
                    .map(|k| format!(" `{k}`"))
                    .unwrap_or_default();
                format!(
                    "duplicate key{key} in a mapping at line {}, column {}",
                    location.line(),
                    location.column()
                )
            }
            other => other.render_with_formatter(&serde_saphyr::UserMessageFormatter),
        };
        Self {
            message: message.replace('\n', " "),
            source: Box::new(e),
        }
    }
}

/// A value that cannot be written as YAML.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    /// The value is not representable as JSON data (e.g. a map with non-string keys).
    #[error("not representable as YAML data: {0}")]
    Data(#[source] serde_json::Error),
    /// The emitter refused the value.
    #[error("cannot write YAML: {0}")]
    Emit(#[source] serde_saphyr::SerializeError),
}

/// The reading options described in the module docs.
pub fn options() -> serde_saphyr::Options {
    // `Options` is non-exhaustive: start from the defaults.
    let mut o = serde_saphyr::Options::default();
    o.strict_booleans = true;
    o.leading_zero_numbers_as_strings = true;
    o.underscored_numbers_as_strings = true;
    o.duplicate_keys = serde_saphyr::DuplicateKeyPolicy::Error;
    o.merge_keys = serde_saphyr::MergeKeyPolicy::AsOrdinary;
    o.with_snippet = false;
    o
}

/// Parses one YAML document into `T`.
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, ParseError> {
    serde_saphyr::from_str_with_options(text, options()).map_err(ParseError::new)
}

/// Parses a YAML document given as bytes into `T`.
pub fn from_slice<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ParseError> {
    serde_saphyr::from_slice_with_options(bytes, options()).map_err(ParseError::new)
}

/// Every non-empty document of a multi-document text (`---` separated) in
/// order, as JSON values; a syntax error is the last item.
pub fn documents(text: &str) -> Vec<Result<Value, ParseError>> {
    read_documents(text, options())
}

/// Like [`documents`], for Kubernetes manifests given by users (`render`):
/// a key written twice keeps its last value, as serde_yaml read them into
/// JSON values and as kubectl accepts them (with a warning).
pub fn manifests(text: &str) -> Vec<Result<Value, ParseError>> {
    let mut o = options();
    o.duplicate_keys = serde_saphyr::DuplicateKeyPolicy::LastWins;
    read_documents(text, o)
}

fn read_documents(text: &str, options: serde_saphyr::Options) -> Vec<Result<Value, ParseError>> {
    let mut bytes = text.as_bytes();
    serde_saphyr::read_with_options::<_, Value>(&mut bytes, options)
        .map(|r| r.map_err(ParseError::new))
        .collect()
}

/// Writes `value` as one YAML document in the layout of the module docs
/// (fields in their serialization order).
pub fn to_string<T: Serialize + ?Sized>(value: &T) -> Result<String, WriteError> {
    // Through JSON text into `Data`, which keeps the order of fields.
    let json = serde_json::to_vec(value).map_err(WriteError::Data)?;
    let mut data: Data = serde_json::from_slice(&json).map_err(WriteError::Data)?;
    // The emitter double-quotes keys and has no single-quoted key style: such
    // keys are written as markers and replaced afterwards (not when the data
    // itself contains the marker text; the key stays double-quoted then).
    let mut keys = Vec::new();
    if !json
        .windows(KEY_MARK.len())
        .any(|w| w == KEY_MARK.as_bytes())
    {
        data.mark_keys(&mut keys);
    }
    let mut out =
        serde_saphyr::to_string_with_options(&data, write_options()).map_err(WriteError::Emit)?;
    for (i, key) in keys.iter().enumerate() {
        out = out.replacen(&format!("{KEY_MARK}{i}__:"), &format!("'{key}':"), 1);
    }
    Ok(out)
}

/// The writing options described in the module docs.
fn write_options() -> serde_saphyr::SerializerOptions {
    // Non-exhaustive: start from the defaults.
    let mut o = serde_saphyr::SerializerOptions::default();
    // Quote by YAML 1.2's rules (`yes`, `10.1.0.1` stay plain), without
    // writing a `%YAML 1.2` directive.
    o.yaml_12 = true;
    o.no_lang_directive = true;
    o.compact_list_indent = true;
    o.prefer_block_scalars = true;
    o.min_fold_chars = usize::MAX;
    o.folded_wrap_chars = usize::MAX;
    o
}

/// Stands for a key to single-quote: `__kd_quoted_key_<i>__`.
const KEY_MARK: &str = "__kd_quoted_key_";

/// JSON data with mappings in their written order (`serde_json::Value`
/// sorts keys without its `preserve_order` feature).
enum Data {
    Null,
    Bool(bool),
    Int(i64),
    UInt(u64),
    Float(f64),
    Str(String),
    Seq(Vec<Data>),
    Map(Vec<(String, Data)>),
}

impl Data {
    /// Replaces each key to single-quote with a marker, its text pushed to `keys`.
    fn mark_keys(&mut self, keys: &mut Vec<String>) {
        match self {
            Data::Seq(items) => items.iter_mut().for_each(|i| i.mark_keys(keys)),
            Data::Map(entries) => {
                for (k, v) in entries {
                    if single_quote(k, Position::Key) {
                        let marker = format!("{KEY_MARK}{}__", keys.len());
                        keys.push(std::mem::replace(k, marker));
                    }
                    v.mark_keys(keys);
                }
            }
            _ => {}
        }
    }
}

impl<'de> serde::Deserialize<'de> for Data {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(DataVisitor)
    }
}

struct DataVisitor;

impl<'de> serde::de::Visitor<'de> for DataVisitor {
    type Value = Data;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("JSON data")
    }
    fn visit_unit<E>(self) -> Result<Data, E> {
        Ok(Data::Null)
    }
    fn visit_bool<E>(self, v: bool) -> Result<Data, E> {
        Ok(Data::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Data, E> {
        Ok(Data::Int(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Data, E> {
        Ok(Data::UInt(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Data, E> {
        Ok(Data::Float(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Data, E> {
        Ok(Data::Str(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Data, E> {
        Ok(Data::Str(v))
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Data, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element()? {
            items.push(item);
        }
        Ok(Data::Seq(items))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Data, A::Error> {
        let mut entries = Vec::new();
        while let Some(entry) = map.next_entry()? {
            entries.push(entry);
        }
        Ok(Data::Map(entries))
    }
}

impl Serialize for Data {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::{SerializeMap, SerializeSeq};
        match self {
            Data::Null => s.serialize_unit(),
            Data::Bool(b) => s.serialize_bool(*b),
            Data::Int(n) => s.serialize_i64(*n),
            Data::UInt(n) => s.serialize_u64(*n),
            Data::Float(n) => s.serialize_f64(*n),
            Data::Str(text) if single_quote(text, Position::Value) => {
                serde_saphyr::SingleQuoted(text.as_str()).serialize(s)
            }
            Data::Str(text) => s.serialize_str(text),
            Data::Seq(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for item in items {
                    seq.serialize_element(item)?;
                }
                seq.end()
            }
            Data::Map(entries) => {
                let mut m = s.serialize_map(Some(entries.len()))?;
                for (k, v) in entries {
                    m.serialize_entry(k, v)?;
                }
                m.end()
            }
        }
    }
}

/// Where a string is written.
#[derive(Clone, Copy)]
enum Position {
    Key,
    Value,
}

/// A one-line string the emitter would double-quote at `at` although it has
/// nothing to escape: single quotes read better and match the committed CRD.
fn single_quote(text: &str, at: Position) -> bool {
    if text.contains(['\n', '\\', '\'']) || text.chars().any(char::is_control) {
        return false;
    }
    let probe = match at {
        Position::Key => {
            serde_saphyr::to_string_with_options(&BTreeMap::from([(text, 0)]), write_options())
        }
        Position::Value => {
            serde_saphyr::to_string_with_options(&BTreeMap::from([("k", text)]), write_options())
        }
    };
    match (probe, at) {
        (Ok(out), Position::Key) => out.starts_with('"'),
        (Ok(out), Position::Value) => out.starts_with("k: \""),
        (Err(_), _) => false,
    }
}

#[cfg(test)]
mod tests;
