//! `meta.k8s.io/v1 Table` responses (what `kubectl get` prints) and
//! `PartialObjectMetadata`.
//!
//! Columns: NAME, the type's own columns (CRD `additionalPrinterColumns`
//! evaluated by their JSONPath; a few built-in ones), and AGE unless a CRD
//! declares its own columns (like the real server). Date columns are rendered as
//! ages (`5s`, `3m`, `2h`, `4d`).

use serde_json::{Value, json};

use crate::registry::{PrinterColumn, ResourceInfo};

fn col(name: &str, type_: &str, format: &str, description: &str, priority: i64) -> Value {
    json!({"name": name, "type": type_, "format": format, "description": description, "priority": priority})
}

/// Human age of an RFC 3339 timestamp, as kubectl prints it.
pub fn age(ts: &str) -> String {
    let Ok(t) = ts.parse::<jiff::Timestamp>() else {
        return "<unknown>".into();
    };
    let secs = jiff::Timestamp::now().as_second() - t.as_second();
    let secs = secs.max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 600 => format!("{}m{}s", s / 60, s % 60),
        s if s < 3 * 3600 => format!("{}m", s / 60),
        s if s < 8 * 3600 => format!("{}h{}m", s / 3600, (s % 3600) / 60),
        s if s < 48 * 3600 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

/// Splits a JSONPath at the dots outside brackets (a filter such as
/// `[?(@.type=="Ready")]` holds dots of its own).
fn segments(p: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in p.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            '.' if depth == 0 => {
                out.push(&p[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&p[start..]);
    out.into_iter().filter(|s| !s.is_empty()).collect()
}

/// A filter `?(@.field=="value")` (or `'value'`): `(field, value)`.
fn filter(idx: &str) -> Option<(&str, &str)> {
    let inner = idx.strip_prefix("?(")?.strip_suffix(')')?;
    let (field, value) = inner.split_once("==")?;
    let field = field.trim().strip_prefix("@.")?;
    let value = value.trim();
    let value = value
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .or_else(|| value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))?;
    Some((field, value))
}

/// Evaluate a simple JSONPath (`.spec.x`, `.status.conditions[0].type`,
/// `.items[*].name`, `{.spec.x}`, `.status.conditions[?(@.type=="Ready")].status`)
/// against an object.
pub fn json_path<'a>(obj: &'a Value, path: &str) -> Vec<&'a Value> {
    let p = path
        .trim()
        .trim_start_matches('{')
        .trim_end_matches('}')
        .trim();
    let p = p.strip_prefix('$').unwrap_or(p);
    let mut cur: Vec<&Value> = vec![obj];
    for raw in segments(p) {
        let (field, idx) = match raw.split_once('[') {
            Some((f, rest)) => (f, Some(rest.strip_suffix(']').unwrap_or(rest))),
            None => (raw, None),
        };
        let mut next = Vec::new();
        for v in cur {
            let v = if field.is_empty() {
                Some(v)
            } else {
                v.get(field)
            };
            let Some(v) = v else { continue };
            match idx {
                None => next.push(v),
                Some("*") => {
                    if let Some(a) = v.as_array() {
                        next.extend(a.iter());
                    }
                }
                Some(f) if f.starts_with('?') => {
                    if let (Some(a), Some((key, want))) = (v.as_array(), filter(f)) {
                        next.extend(
                            a.iter()
                                .filter(|x| x.get(key).and_then(Value::as_str) == Some(want)),
                        );
                    }
                }
                Some(i) => {
                    if let (Some(a), Ok(i)) = (v.as_array(), i.parse::<i64>()) {
                        let i = if i < 0 { a.len() as i64 + i } else { i };
                        if let Some(x) = usize::try_from(i).ok().and_then(|i| a.get(i)) {
                            next.push(x);
                        }
                    }
                }
            }
        }
        cur = next;
    }
    cur
}

fn cell(column: &PrinterColumn, obj: &Value) -> Value {
    let vals = json_path(obj, &column.json_path);
    if vals.is_empty() {
        return Value::Null;
    }
    if column.type_ == "date" {
        return vals[0]
            .as_str()
            .map(|s| json!(age(s)))
            .unwrap_or(Value::Null);
    }
    if vals.len() == 1 {
        return match vals[0] {
            Value::String(_) | Value::Number(_) | Value::Bool(_) => vals[0].clone(),
            other => json!(other.to_string()),
        };
    }
    let parts: Vec<String> = vals
        .iter()
        .map(|v| {
            v.as_str()
                .map(str::to_string)
                .unwrap_or_else(|| v.to_string())
        })
        .collect();
    json!(parts.join(","))
}

fn s<'a>(obj: &'a Value, ptr: &str) -> &'a str {
    obj.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

/// Columns and cell extractor for one resource type.
/// Renders the cells of one row.
type CellFn = Box<dyn Fn(&Value) -> Vec<Value>>;

fn columns(info: &ResourceInfo, version: &str) -> (Vec<Value>, CellFn) {
    let name_col = col(
        "Name",
        "string",
        "name",
        "Name must be unique within a namespace.",
        0,
    );
    let age_col = col(
        "Age",
        "string",
        "",
        "CreationTimestamp is a timestamp representing the server time when this object was created.",
        0,
    );
    let created = |o: &Value| json!(age(s(o, "/metadata/creationTimestamp")));
    let name = |o: &Value| json!(s(o, "/metadata/name"));
    if let Some(crd) = &info.crd {
        let cols: Vec<PrinterColumn> = crd
            .versions
            .get(version)
            .map(|v| v.columns.clone())
            .unwrap_or_default();
        if cols.is_empty() {
            return (
                vec![name_col, age_col],
                Box::new(move |o| vec![name(o), created(o)]),
            );
        }
        let mut defs = vec![name_col];
        for c in &cols {
            defs.push(col(
                &c.name,
                &c.type_,
                &c.format,
                &c.description,
                c.priority,
            ));
        }
        return (
            defs,
            Box::new(move |o| {
                let mut cells = vec![name(o)];
                cells.extend(cols.iter().map(|c| cell(c, o)));
                cells
            }),
        );
    }
    match info.resource.as_str() {
        "namespaces" => (
            vec![
                name_col,
                col("Status", "string", "", "The status of the namespace", 0),
                age_col,
            ],
            Box::new(move |o| vec![name(o), json!(s(o, "/status/phase")), created(o)]),
        ),
        "customresourcedefinitions" => (
            vec![
                name_col,
                col("Created At", "date", "", "CreationTimestamp of the CRD", 0),
            ],
            Box::new(move |o| vec![name(o), json!(s(o, "/metadata/creationTimestamp"))]),
        ),
        "configmaps" => (
            vec![
                name_col,
                col("Data", "string", "", "Number of data entries", 0),
                age_col,
            ],
            Box::new(move |o| {
                let n = o
                    .get("data")
                    .and_then(Value::as_object)
                    .map(|m| m.len())
                    .unwrap_or(0)
                    + o.get("binaryData")
                        .and_then(Value::as_object)
                        .map(|m| m.len())
                        .unwrap_or(0);
                vec![name(o), json!(n), created(o)]
            }),
        ),
        "secrets" => (
            vec![
                name_col,
                col("Type", "string", "", "The type of the secret", 0),
                col("Data", "string", "", "Number of data entries", 0),
                age_col,
            ],
            Box::new(move |o| {
                let n = o
                    .get("data")
                    .and_then(Value::as_object)
                    .map(|m| m.len())
                    .unwrap_or(0);
                vec![name(o), json!(s(o, "/type")), json!(n), created(o)]
            }),
        ),
        "services" => (
            vec![
                name_col,
                col("Type", "string", "", "The type of the service", 0),
                col(
                    "Cluster-IP",
                    "string",
                    "",
                    "The cluster IP of the service",
                    0,
                ),
                col("Ports", "string", "", "The ports of the service", 0),
                age_col,
            ],
            Box::new(move |o| {
                let ports: Vec<String> = o
                    .pointer("/spec/ports")
                    .and_then(Value::as_array)
                    .map(|a| {
                        a.iter()
                            .map(|p| {
                                format!(
                                    "{}/{}",
                                    p.get("port").map(|v| v.to_string()).unwrap_or_default(),
                                    p.get("protocol").and_then(Value::as_str).unwrap_or("TCP")
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let ports = if ports.is_empty() {
                    "<none>".to_string()
                } else {
                    ports.join(",")
                };
                vec![
                    name(o),
                    json!(s(o, "/spec/type")),
                    json!(s(o, "/spec/clusterIP")),
                    json!(ports),
                    created(o),
                ]
            }),
        ),
        "endpointslices" => (
            vec![
                name_col,
                col(
                    "AddressType",
                    "string",
                    "",
                    "The IP protocol for this slice",
                    0,
                ),
                col("Endpoints", "string", "", "Number of endpoints", 0),
                age_col,
            ],
            Box::new(move |o| {
                let n = o
                    .get("endpoints")
                    .and_then(Value::as_array)
                    .map(|a| a.len())
                    .unwrap_or(0);
                vec![name(o), json!(s(o, "/addressType")), json!(n), created(o)]
            }),
        ),
        _ => (
            vec![name_col, age_col],
            Box::new(move |o| vec![name(o), created(o)]),
        ),
    }
}

/// `PartialObjectMetadata` for one object.
pub fn partial(obj: &Value) -> Value {
    json!({
        "kind": "PartialObjectMetadata",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": obj.get("metadata").cloned().unwrap_or(json!({})),
    })
}

/// A Table of `objs`. `include_object`: `None`/`Metadata` (default), `Object`, `None`.
pub fn table(
    info: &ResourceInfo,
    version: &str,
    objs: &[Value],
    list_meta: Option<Value>,
    include_object: Option<&str>,
) -> Value {
    let (defs, cells) = columns(info, version);
    let rows: Vec<Value> = objs
        .iter()
        .map(|o| {
            let object = match include_object {
                Some("Object") => o.clone(),
                Some("None") => Value::Null,
                _ => partial(o),
            };
            json!({"cells": cells(o), "object": object})
        })
        .collect();
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": list_meta.unwrap_or_else(|| json!({"resourceVersion": objs.first().and_then(|o| o.pointer("/metadata/resourceVersion")).cloned().unwrap_or(json!(""))})),
        "columnDefinitions": defs,
        "rows": rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_path_fields_indexes_and_wildcards() {
        let o = json!({"spec": {"a": 1, "list": [{"n": "x"}, {"n": "y"}]}});
        assert_eq!(json_path(&o, ".spec.a"), vec![&json!(1)]);
        assert_eq!(json_path(&o, ".spec.list[1].n"), vec![&json!("y")]);
        assert_eq!(
            json_path(&o, "{.spec.list[*].n}"),
            vec![&json!("x"), &json!("y")]
        );
        assert!(json_path(&o, ".spec.missing").is_empty());
        // Filters, as kubectl and the API server's printer columns have them.
        let c = json!({"status": {"conditions": [
            {"type": "Degraded", "status": "False"}, {"type": "Ready", "status": "True"}]}});
        assert_eq!(
            json_path(&c, r#".status.conditions[?(@.type=="Ready")].status"#),
            vec![&json!("True")]
        );
        assert_eq!(
            json_path(&c, ".status.conditions[?(@.type=='Degraded')].status"),
            vec![&json!("False")]
        );
        assert!(json_path(&c, r#".status.conditions[?(@.type=="Gone")].status"#).is_empty());
    }
}
