//! Per-type admission: the defaults and validation the real API server applies to
//! the types kube-sim serves (Services get a cluster IP, Secrets fold `stringData`
//! into `data`, CRDs are checked and marked Established, custom resources are
//! pruned/defaulted/validated against their CRD schema, ...).

use base64::Engine;
use serde_json::{Value, json};

use kube_sim_apimachinery::endpoints;
use kube_sim_apimachinery::field::FieldError;

use crate::registry::{self, ResourceInfo};
use crate::status::{ApiError, ApiResult, Cause};
use crate::store::Store;

fn name_of(obj: &Value) -> String {
    obj.pointer("/metadata/name")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}

/// Defaults and validates `obj`, a write of `info` in `version` (a create
/// when `old` is None), as the real server does: custom resources against
/// their schema (pruned, `fieldValidation=Strict` refusing unknown fields,
/// the default `Warn` adding `unknown field "<path>"` to `warnings`, one per
/// field, even when the write then fails), built-in types by their own
/// rules. `st` is for what a type allocates (a Service's cluster IP) or
/// reads (CRDs).
pub fn admit(
    info: &ResourceInfo,
    version: &str,
    old: Option<&Value>,
    obj: &mut Value,
    st: &mut Store,
    field_validation: Option<&str>,
    warnings: &mut Vec<String>,
) -> ApiResult<()> {
    if let Some(crd) = &info.crd {
        if let Some(v) = crd.versions.get(version)
            && let Some(schema) = &v.schema
        {
            let (pruned, causes) = schema.admit(obj);
            if !matches!(field_validation, Some("Strict" | "Ignore")) {
                warnings.extend(pruned.iter().map(|p| format!("unknown field {p:?}")));
            }
            if !causes.is_empty() {
                return Err(ApiError::invalid(
                    &info.kind,
                    &info.group,
                    &name_of(obj),
                    causes,
                ));
            }
            if field_validation == Some("Strict") && !pruned.is_empty() {
                let list: Vec<String> = pruned
                    .iter()
                    .map(|p| format!("unknown field {p:?}"))
                    .collect();
                return Err(ApiError::bad_request(format!(
                    "{} in version \"{version}\" cannot be handled as a {}: strict decoding error: {}",
                    info.kind,
                    info.kind,
                    list.join(", ")
                )));
            }
        }
        return Ok(());
    }
    let _ = st;
    match (info.group.as_str(), info.resource.as_str()) {
        ("", "namespaces") => {
            if obj.pointer("/metadata/deletionTimestamp").is_none() {
                obj["status"] = json!({"phase": "Active"});
            }
            let ns_name = name_of(obj);
            let labels = obj["metadata"]
                .as_object_mut()
                .map(|m| m.entry("labels").or_insert_with(|| json!({})));
            if let Some(l) = labels.and_then(Value::as_object_mut) {
                l.insert("kubernetes.io/metadata.name".into(), json!(ns_name));
            }
        }
        ("", "secrets") => {
            if let Some(sd) = obj.as_object_mut().and_then(|m| m.remove("stringData"))
                && let Some(sd) = sd.as_object()
            {
                if !obj.get("data").is_some_and(Value::is_object) {
                    obj["data"] = json!({});
                }
                for (k, v) in sd {
                    let s = v.as_str().unwrap_or_default();
                    obj["data"][k] = json!(base64::engine::general_purpose::STANDARD.encode(s));
                }
            }
            if obj.get("type").is_none() {
                obj["type"] = json!("Opaque");
            }
        }
        ("", "configmaps") => configmap_validate(info, old, obj)?,
        ("", "events") | ("events.k8s.io", "events") => {
            let errs = crate::events::validate(old, obj, info.group == "events.k8s.io");
            if !errs.is_empty() {
                // Both APIs validate the one internal (core) Event type.
                return Err(ApiError::invalid("Event", "", &name_of(obj), errs));
            }
        }
        ("", "services") => service_defaults(old, obj, st)?,
        ("", "endpoints") => {
            endpoints::default_endpoints(obj);
            let mut errs = endpoints::validate_endpoints(obj, None);
            if !errs.is_empty()
                && let Some(old) = old
            {
                // Unchanged subsets are not refused; the stored object is
                // compared with its defaults, as the real server decodes it.
                let mut old = old.clone();
                endpoints::default_endpoints(&mut old);
                errs = endpoints::validate_endpoints(obj, Some(&old));
            }
            field_errors(info, obj, errs)?;
        }
        ("discovery.k8s.io", "endpointslices") => {
            endpoints::default_endpoint_slice(obj);
            field_errors(info, obj, endpoints::validate_endpoint_slice(obj, old))?;
        }
        ("apiextensions.k8s.io", "customresourcedefinitions") => crd_admit(info, obj, st)?,
        _ => {}
    }
    Ok(())
}

/// The 422 for `errs` (nothing when empty).
fn field_errors(info: &ResourceInfo, obj: &Value, errs: Vec<FieldError>) -> ApiResult<()> {
    if errs.is_empty() {
        return Ok(());
    }
    let causes = errs
        .iter()
        .map(|e| Cause::new(e.kind.reason(), &e.field, e.detail()))
        .collect();
    Err(ApiError::invalid(
        &info.kind,
        &info.group,
        &name_of(obj),
        causes,
    ))
}

/// Like the API server's `ValidateConfigMap` / `ValidateConfigMapUpdate`:
/// at most 1 MiB of data (values of `data` and `binaryData` together), and
/// an `immutable: true` ConfigMap keeps its data and stays immutable.
fn configmap_validate(info: &ResourceInfo, old: Option<&Value>, obj: &Value) -> ApiResult<()> {
    const MAX: usize = 1024 * 1024;
    let size: usize = ["data", "binaryData"]
        .iter()
        .filter_map(|k| obj.get(*k).and_then(Value::as_object))
        .flat_map(|m| m.values())
        .map(|v| v.as_str().map_or(0, str::len))
        .sum();
    let invalid = |kind: &str, field: &str, msg: String| {
        Err(ApiError::invalid(
            &info.kind,
            &info.group,
            &name_of(obj),
            vec![Cause::new(kind, field, msg)],
        ))
    };
    if size > MAX {
        // The real server names no field: its error path is printed `[]`.
        return invalid(
            "FieldValueTooLong",
            "[]",
            format!("Too long: may not be more than {MAX} bytes"),
        );
    }
    if let Some(old) = old
        && old.get("immutable").and_then(Value::as_bool) == Some(true)
    {
        if obj.get("immutable").and_then(Value::as_bool) != Some(true) {
            return invalid(
                "FieldValueForbidden",
                "immutable",
                "Forbidden: field is immutable when `immutable` is set".into(),
            );
        }
        for k in ["data", "binaryData"] {
            let none = Value::Null;
            let norm = |v: Option<&Value>| match v {
                Some(Value::Object(m)) if m.is_empty() => none.clone(),
                Some(v) => v.clone(),
                None => none.clone(),
            };
            if norm(old.get(k)) != norm(obj.get(k)) {
                return invalid(
                    "FieldValueForbidden",
                    k,
                    "Forbidden: field is immutable when `immutable` is set".into(),
                );
            }
        }
    }
    Ok(())
}

fn service_defaults(old: Option<&Value>, obj: &mut Value, st: &mut Store) -> ApiResult<()> {
    if !obj.get("spec").is_some_and(Value::is_object) {
        obj["spec"] = json!({});
    }
    let spec = &mut obj["spec"];
    if spec.get("type").is_none() {
        spec["type"] = json!("ClusterIP");
    }
    let is_external = spec["type"] == "ExternalName";
    if !is_external {
        let old_ip = old.and_then(|o| o.pointer("/spec/clusterIP")).cloned();
        match (spec.get("clusterIP").cloned(), old_ip) {
            (None, Some(ip)) => spec["clusterIP"] = ip,
            (Some(ip), Some(old)) if ip != old && ip != "" => {
                return Err(ApiError::invalid(
                    "Service",
                    "",
                    &name_of(obj),
                    vec![Cause::new(
                        "FieldValueInvalid",
                        "spec.clusterIPs[0]",
                        "Invalid value: field is immutable",
                    )],
                ));
            }
            (None, None) => {
                let n = st.next_cluster_ip;
                st.next_cluster_ip += 1;
                spec["clusterIP"] = json!(format!("10.96.{}.{}", (n >> 8) & 0xff, n & 0xff));
            }
            _ => {}
        }
        if let Some(ip) = spec.get("clusterIP").cloned() {
            spec["clusterIPs"] = json!([ip]);
        }
        if spec.get("sessionAffinity").is_none() {
            spec["sessionAffinity"] = json!("None");
        }
    }
    if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
        for p in ports {
            if !p.is_object() {
                continue;
            }
            if p.get("protocol").is_none() {
                p["protocol"] = json!("TCP");
            }
            if p.get("targetPort").is_none()
                && let Some(port) = p.get("port").cloned()
            {
                p["targetPort"] = port;
            }
        }
    }
    Ok(())
}

fn crd_admit(info: &ResourceInfo, obj: &mut Value, st: &mut Store) -> ApiResult<()> {
    let name = name_of(obj);
    let ri = registry::from_crd(obj).map_err(|e| {
        let (field, msg) = e.split_once(": ").unwrap_or(("spec", e.as_str()));
        ApiError::invalid(
            &info.kind,
            &info.group,
            &name,
            vec![Cause::new("FieldValueInvalid", field, msg.to_string())],
        )
    })?;
    let expected = format!("{}.{}", ri.resource, ri.group);
    if name != expected {
        return Err(ApiError::invalid(
            &info.kind,
            &info.group,
            &name,
            vec![Cause::new(
                "FieldValueInvalid",
                "metadata.name",
                format!("Invalid value: {name:?}: must be spec.names.plural+\".\"+spec.group"),
            )],
        ));
    }
    if let Some(existing) = st.registry.get(&ri.group, &ri.resource)
        && existing.crd.is_none()
    {
        return Err(ApiError::invalid(
            &info.kind,
            &info.group,
            &name,
            vec![Cause::new(
                "FieldValueInvalid",
                "spec.names.plural",
                "Invalid value: conflicts with a built-in resource",
            )],
        ));
    }
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let names = obj.pointer("/spec/names").cloned().unwrap_or(json!({}));
    let mut accepted = names.clone();
    if accepted.get("singular").is_none() {
        accepted["singular"] = json!(ri.singular);
    }
    if accepted.get("listKind").is_none() {
        accepted["listKind"] = json!(ri.list_kind);
    }
    let stored: Vec<&str> = vec![ri.storage_version()];
    obj["status"] = json!({
        "acceptedNames": accepted,
        "conditions": [
            {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
            {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
        ],
        "storedVersions": stored,
    });
    Ok(())
}
