//! Minimal decoding of Kubernetes protobuf request bodies
//! (`application/vnd.kubernetes.protobuf`).
//!
//! kubectl's generators (`kubectl create namespace|configmap|secret|serviceaccount`)
//! and helm's release storage use client-go typed clients, which send protobuf
//! bodies and accept JSON answers. kube-sim decodes the `k8s\0` + `runtime.Unknown`
//! envelope and the few types those clients write this way: Namespace, ConfigMap,
//! Secret, ServiceAccount, SelfSubjectAccessReview (`kubectl auth can-i`) and
//! DeleteOptions. Any other protobuf body gets a 415
//! `UnsupportedMediaType` Status naming the kind. Responses are always JSON.

use base64::Engine;
use serde_json::{Map, Value, json};

const MAGIC: &[u8] = b"k8s\0";

/// One protobuf field: number and value.
enum Field<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

fn varint(buf: &[u8], pos: &mut usize) -> Result<u64, String> {
    let mut out = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*pos).ok_or("truncated varint")?;
        *pos += 1;
        out |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(out);
        }
    }
    Err("varint too long".into())
}

fn fields(buf: &[u8]) -> Result<Vec<(u64, Field<'_>)>, String> {
    let mut pos = 0;
    let mut out = Vec::new();
    while pos < buf.len() {
        let tag = varint(buf, &mut pos)?;
        let (num, wt) = (tag >> 3, tag & 7);
        let f = match wt {
            0 => Field::Varint(varint(buf, &mut pos)?),
            2 => {
                let len = usize::try_from(varint(buf, &mut pos)?).map_err(|_| "length overflow")?;
                let end = pos
                    .checked_add(len)
                    .filter(|e| *e <= buf.len())
                    .ok_or("truncated field")?;
                let b = &buf[pos..end];
                pos = end;
                Field::Bytes(b)
            }
            1 => {
                pos += 8;
                Field::Fixed
            }
            5 => {
                pos += 4;
                Field::Fixed
            }
            other => return Err(format!("unsupported wire type {other}")),
        };
        out.push((num, f));
    }
    if pos > buf.len() {
        return Err("truncated message".into());
    }
    Ok(out)
}

fn string(b: &[u8]) -> Result<String, String> {
    String::from_utf8(b.to_vec()).map_err(|_| "invalid UTF-8 string".to_string())
}

/// A `map<string, string|bytes>` entry; bytes values become base64 (like JSON).
fn map_entry(b: &[u8], bytes_value: bool) -> Result<(String, Value), String> {
    let mut k = String::new();
    let mut v = json!("");
    for (n, f) in fields(b)? {
        if let Field::Bytes(x) = f {
            match n {
                1 => k = string(x)?,
                2 if bytes_value => v = json!(base64::engine::general_purpose::STANDARD.encode(x)),
                2 => v = json!(string(x)?),
                _ => {}
            }
        }
    }
    Ok((k, v))
}

fn insert_map(
    obj: &mut Map<String, Value>,
    key: &str,
    b: &[u8],
    bytes_value: bool,
) -> Result<(), String> {
    let (k, v) = map_entry(b, bytes_value)?;
    let m = obj.entry(key.to_string()).or_insert_with(|| json!({}));
    if let Some(m) = m.as_object_mut() {
        m.insert(k, v);
    }
    Ok(())
}

fn push(obj: &mut Map<String, Value>, key: &str, v: Value) {
    let a = obj.entry(key.to_string()).or_insert_with(|| json!([]));
    if let Some(a) = a.as_array_mut() {
        a.push(v);
    }
}

fn owner_reference(b: &[u8]) -> Result<Value, String> {
    let mut o = Map::new();
    for (n, f) in fields(b)? {
        match (n, f) {
            (1, Field::Bytes(x)) => drop(o.insert("kind".into(), json!(string(x)?))),
            (3, Field::Bytes(x)) => drop(o.insert("name".into(), json!(string(x)?))),
            (4, Field::Bytes(x)) => drop(o.insert("uid".into(), json!(string(x)?))),
            (5, Field::Bytes(x)) => drop(o.insert("apiVersion".into(), json!(string(x)?))),
            (6, Field::Varint(v)) => drop(o.insert("controller".into(), json!(v != 0))),
            (7, Field::Varint(v)) => drop(o.insert("blockOwnerDeletion".into(), json!(v != 0))),
            _ => {}
        }
    }
    Ok(Value::Object(o))
}

fn object_meta(b: &[u8]) -> Result<Value, String> {
    let mut m = Map::new();
    for (n, f) in fields(b)? {
        match (n, f) {
            (1, Field::Bytes(x)) => drop(m.insert("name".into(), json!(string(x)?))),
            (2, Field::Bytes(x)) => drop(m.insert("generateName".into(), json!(string(x)?))),
            (3, Field::Bytes(x)) => drop(m.insert("namespace".into(), json!(string(x)?))),
            (5, Field::Bytes(x)) => drop(m.insert("uid".into(), json!(string(x)?))),
            (6, Field::Bytes(x)) => drop(m.insert("resourceVersion".into(), json!(string(x)?))),
            (11, Field::Bytes(x)) => insert_map(&mut m, "labels", x, false)?,
            (12, Field::Bytes(x)) => insert_map(&mut m, "annotations", x, false)?,
            (13, Field::Bytes(x)) => push(&mut m, "ownerReferences", owner_reference(x)?),
            (14, Field::Bytes(x)) => push(&mut m, "finalizers", json!(string(x)?)),
            _ => {}
        }
    }
    // Empty strings are "unset" in proto3; drop them like omitempty JSON.
    m.retain(|_, v| v.as_str() != Some(""));
    Ok(Value::Object(m))
}

fn decode_kind(kind: &str, raw: &[u8]) -> Result<Value, String> {
    let mut o = Map::new();
    for (n, f) in fields(raw)? {
        match (kind, n, f) {
            (_, 1, Field::Bytes(x)) if kind != "DeleteOptions" => {
                drop(o.insert("metadata".into(), object_meta(x)?))
            }
            ("Secret", 2, Field::Bytes(x)) => insert_map(&mut o, "data", x, true)?,
            ("Secret", 3, Field::Bytes(x)) => drop(o.insert("type".into(), json!(string(x)?))),
            ("Secret", 4, Field::Bytes(x)) => insert_map(&mut o, "stringData", x, false)?,
            ("Secret", 5, Field::Varint(v)) | ("ConfigMap", 4, Field::Varint(v)) => {
                drop(o.insert("immutable".into(), json!(v != 0)))
            }
            ("ConfigMap", 2, Field::Bytes(x)) => insert_map(&mut o, "data", x, false)?,
            ("ConfigMap", 3, Field::Bytes(x)) => insert_map(&mut o, "binaryData", x, true)?,
            ("Namespace", 2, Field::Bytes(x)) => {
                let mut spec = Map::new();
                for (n, f) in fields(x)? {
                    if let (1, Field::Bytes(s)) = (n, f) {
                        push(&mut spec, "finalizers", json!(string(s)?));
                    }
                }
                o.insert("spec".into(), Value::Object(spec));
            }
            ("ServiceAccount", 3, Field::Bytes(x)) => {
                let mut r = Map::new();
                for (n, f) in fields(x)? {
                    if let (1, Field::Bytes(s)) = (n, f) {
                        r.insert("name".into(), json!(string(s)?));
                    }
                }
                push(&mut o, "imagePullSecrets", Value::Object(r));
            }
            ("ServiceAccount", 4, Field::Varint(v)) => {
                drop(o.insert("automountServiceAccountToken".into(), json!(v != 0)))
            }
            ("SelfSubjectAccessReview", 2, Field::Bytes(x)) => {
                let mut spec = Map::new();
                for (n, f) in fields(x)? {
                    let (key, names): (&str, &[&str]) = match n {
                        1 => (
                            "resourceAttributes",
                            &[
                                "namespace",
                                "verb",
                                "group",
                                "version",
                                "resource",
                                "subresource",
                                "name",
                            ],
                        ),
                        2 => ("nonResourceAttributes", &["path", "verb"]),
                        _ => continue,
                    };
                    let Field::Bytes(a) = f else { continue };
                    let mut attrs = Map::new();
                    for (n, f) in fields(a)? {
                        let idx = usize::try_from(n).unwrap_or(0);
                        if let (Some(name), Field::Bytes(v)) =
                            (idx.checked_sub(1).and_then(|i| names.get(i)), f)
                        {
                            attrs.insert((*name).to_string(), json!(string(v)?));
                        }
                    }
                    spec.insert(key.into(), Value::Object(attrs));
                }
                o.insert("spec".into(), Value::Object(spec));
            }
            ("DeleteOptions", 1, Field::Varint(v)) => {
                drop(o.insert("gracePeriodSeconds".into(), json!(v as i64)))
            }
            ("DeleteOptions", 2, Field::Bytes(x)) => {
                let mut p = Map::new();
                for (n, f) in fields(x)? {
                    match (n, f) {
                        (1, Field::Bytes(s)) => drop(p.insert("uid".into(), json!(string(s)?))),
                        (2, Field::Bytes(s)) => {
                            drop(p.insert("resourceVersion".into(), json!(string(s)?)))
                        }
                        _ => {}
                    }
                }
                o.insert("preconditions".into(), Value::Object(p));
            }
            ("DeleteOptions", 3, Field::Varint(v)) => {
                drop(o.insert("orphanDependents".into(), json!(v != 0)))
            }
            ("DeleteOptions", 4, Field::Bytes(x)) => {
                drop(o.insert("propagationPolicy".into(), json!(string(x)?)))
            }
            ("DeleteOptions", 5, Field::Bytes(x)) => push(&mut o, "dryRun", json!(string(x)?)),
            _ => {}
        }
    }
    Ok(Value::Object(o))
}

/// Decode a protobuf request body into JSON. `Err` carries a message for a 400/415.
pub fn decode(body: &[u8]) -> Result<Value, (u16, String)> {
    let rest = body.strip_prefix(MAGIC).ok_or((
        400,
        "protobuf body does not start with the k8s\\0 envelope".to_string(),
    ))?;
    let mut api_version = String::new();
    let mut kind = String::new();
    let mut raw: &[u8] = &[];
    for (n, f) in fields(rest).map_err(|e| (400, format!("invalid protobuf envelope: {e}")))? {
        match (n, f) {
            (1, Field::Bytes(tm)) => {
                for (n, f) in
                    fields(tm).map_err(|e| (400, format!("invalid protobuf TypeMeta: {e}")))?
                {
                    match (n, f) {
                        (1, Field::Bytes(s)) => {
                            api_version = String::from_utf8_lossy(s).into_owned()
                        }
                        (2, Field::Bytes(s)) => kind = String::from_utf8_lossy(s).into_owned(),
                        _ => {}
                    }
                }
            }
            (2, Field::Bytes(r)) => raw = r,
            _ => {}
        }
    }
    if !matches!(
        kind.as_str(),
        "Namespace"
            | "ConfigMap"
            | "Secret"
            | "ServiceAccount"
            | "DeleteOptions"
            | "SelfSubjectAccessReview"
    ) {
        return Err((
            415,
            format!(
                "kube-sim decodes protobuf only for Namespace, ConfigMap, Secret, ServiceAccount, SelfSubjectAccessReview and DeleteOptions (got kind {kind:?}); send JSON"
            ),
        ));
    }
    let mut obj =
        decode_kind(&kind, raw).map_err(|e| (400, format!("invalid protobuf {kind}: {e}")))?;
    obj["apiVersion"] = json!(api_version);
    obj["kind"] = json!(kind);
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_bytes(n: u8, b: &[u8]) -> Vec<u8> {
        let mut v = vec![(n << 3) | 2, b.len() as u8];
        v.extend_from_slice(b);
        v
    }

    #[test]
    fn decodes_a_configmap_envelope() {
        let tm = [field_bytes(1, b"v1"), field_bytes(2, b"ConfigMap")].concat();
        let labels = [field_bytes(1, b"owner"), field_bytes(2, b"helm")].concat();
        let meta = [field_bytes(1, b"cm1"), field_bytes(11, &labels)].concat();
        let entry = [field_bytes(1, b"k"), field_bytes(2, b"v")].concat();
        let raw = [field_bytes(1, &meta), field_bytes(2, &entry)].concat();
        let body = [b"k8s\0".to_vec(), field_bytes(1, &tm), field_bytes(2, &raw)].concat();
        let v = decode(&body).expect("decodes");
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm1", "labels": {"owner": "helm"}}, "data": {"k": "v"}})
        );
    }

    #[test]
    fn rejects_other_kinds_and_garbage() {
        let tm = [field_bytes(1, b"v1"), field_bytes(2, b"Pod")].concat();
        let body = [b"k8s\0".to_vec(), field_bytes(1, &tm)].concat();
        assert_eq!(decode(&body).expect_err("pod").0, 415);
        assert_eq!(decode(b"nope").expect_err("magic").0, 400);
        assert_eq!(decode(b"k8s\0\x0a\xff").expect_err("truncated").0, 400);
    }
}
