//! Discovery (`/api`, `/apis`, `/api/v1`, `/apis/<g>/<v>`), `/version` and OpenAPI.
//!
//! Discovery is served in the plain (non-aggregated) format; clients that ask for
//! aggregated discovery (`as=APIGroupDiscoveryList`) fall back to it, as they do
//! against any server that does not offer it.
//!
//! OpenAPI v3 (`/openapi/v3`, `/openapi/v3/<gv>`) lists every resource's paths with
//! its PATCH operation, its `x-kubernetes-group-version-kind` and the
//! `fieldValidation` query parameter, which is how kubectl and helm detect
//! server-side field validation (so they do not need `--validate=false`). Component
//! schemas are provided for custom resources (from their CRD); built-in types have
//! none, so clients fall back to their compiled-in types. `/openapi/v2` is a valid
//! but empty Swagger document.

use std::hash::{Hash, Hasher};

use serde_json::{Map, Value, json};

use crate::registry::{Registry, ResourceInfo};

/// The `gitVersion` `/version` answers.
pub const GIT_VERSION: &str = "v1.33.0-kube-sim";

/// The `/version` answer.
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "33",
        "gitVersion": GIT_VERSION,
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.24.0",
        "compiler": "gc",
        "platform": "linux/amd64",
        "emulationMajor": "1",
        "emulationMinor": "33",
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "32",
    })
}

/// The `/api` answer (`APIVersions`) for a server at `url`.
pub fn core_versions(url: &str) -> Value {
    let addr = url.split("://").nth(1).unwrap_or(url);
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": addr}],
    })
}

fn group_json(name: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> = versions
        .iter()
        .map(|v| json!({"groupVersion": format!("{name}/{v}"), "version": v}))
        .collect();
    json!({
        "name": name,
        "versions": vs,
        "preferredVersion": vs.first().cloned().unwrap_or(json!({})),
    })
}

/// The `/apis` answer (`APIGroupList`).
pub fn groups(reg: &Registry) -> Value {
    let groups: Vec<Value> = reg
        .groups()
        .into_iter()
        .filter(|(g, _)| !g.is_empty())
        .map(|(g, vs)| group_json(&g, &vs))
        .collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// The `/apis/<name>` answer (`APIGroup`), if the group is served.
pub fn group(reg: &Registry, name: &str) -> Option<Value> {
    let (g, vs) = reg
        .groups()
        .into_iter()
        .find(|(g, _)| g == name && !g.is_empty())?;
    let mut v = group_json(&g, &vs);
    v["kind"] = json!("APIGroup");
    v["apiVersion"] = json!("v1");
    Some(v)
}

fn storage_hash(r: &ResourceInfo) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (r.group.as_str(), r.resource.as_str(), r.kind.as_str()).hash(&mut h);
    format!("{:016x}", h.finish()).chars().take(11).collect()
}

/// The `APIResourceList` of `group/version`, if served.
pub fn resource_list(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    let resources = reg.in_group_version(group, version);
    if resources.is_empty() {
        return None;
    }
    let mut list = Vec::new();
    for r in &resources {
        let mut e = json!({
            "name": r.resource,
            "singularName": r.singular,
            "namespaced": r.namespaced,
            "kind": r.kind,
            "verbs": r.verbs,
            "storageVersionHash": storage_hash(r),
        });
        if !r.short_names.is_empty() {
            e["shortNames"] = json!(r.short_names);
        }
        if !r.categories.is_empty() {
            e["categories"] = json!(r.categories);
        }
        list.push(e);
        if r.status_subresource(version) {
            list.push(json!({"name": format!("{}/status", r.resource), "singularName": "", "namespaced": r.namespaced, "kind": r.kind, "verbs": ["get", "patch", "update"]}));
        }
        if r.resource == "serviceaccounts" && r.group.is_empty() {
            list.push(json!({"name": "serviceaccounts/token", "singularName": "", "namespaced": true, "group": "authentication.k8s.io", "version": "v1", "kind": "TokenRequest", "verbs": ["create"]}));
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": list}),
    )
}

/// The `/openapi/v2` answer: a document without definitions.
pub fn openapi_v2(_reg: &Registry) -> Value {
    json!({
        "swagger": "2.0",
        "info": {"title": "Kubernetes (kube-sim)", "version": GIT_VERSION},
        "paths": {},
        "definitions": {},
    })
}

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() {
        format!("api/{version}")
    } else {
        format!("apis/{group}/{version}")
    }
}

fn doc_hash(doc: &Value) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    doc.to_string().hash(&mut h);
    format!("{:016X}", h.finish())
}

/// The `/openapi/v3` index: one path per served group version.
pub fn openapi_v3_root(reg: &Registry) -> Value {
    let mut paths = Map::new();
    for (g, vs) in reg.groups() {
        for v in vs {
            let p = gv_path(&g, &v);
            if let Some(doc) = openapi_v3(reg, &p) {
                paths.insert(p.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={}", doc_hash(&doc))}));
            }
        }
    }
    json!({"paths": paths})
}

fn query_param(name: &str, description: &str) -> Value {
    json!({"name": name, "in": "query", "description": description, "schema": {"type": "string", "uniqueItems": true}})
}

fn reverse_group(group: &str) -> String {
    let mut parts: Vec<&str> = group.split('.').collect();
    parts.reverse();
    parts.join(".")
}

/// The OpenAPI v3 document of one group-version (`api/v1`, `apis/<g>/<v>`).
pub fn openapi_v3(reg: &Registry, gv: &str) -> Option<Value> {
    let segs: Vec<&str> = gv.split('/').collect();
    let (group, version) = match segs.as_slice() {
        ["api", v] => (String::new(), v.to_string()),
        ["apis", g, v] => (g.to_string(), v.to_string()),
        _ => return None,
    };
    let resources = reg.in_group_version(&group, &version);
    if resources.is_empty() {
        return None;
    }
    let mut paths = Map::new();
    let mut schemas = Map::new();
    for r in &resources {
        let gvk = json!([{"group": r.group, "version": version, "kind": r.kind}]);
        let prefix = format!("/{}", gv_path(&group, &version));
        let item = if r.namespaced {
            format!("{prefix}/namespaces/{{namespace}}/{}/{{name}}", r.resource)
        } else {
            format!("{prefix}/{}/{{name}}", r.resource)
        };
        let op = |action: &str| {
            json!({
                "operationId": format!("{action}{}", r.kind),
                "x-kubernetes-action": action,
                "x-kubernetes-group-version-kind": gvk[0],
                "parameters": [
                    query_param("dryRun", "When present, indicates that modifications should not be persisted."),
                    query_param("fieldManager", "fieldManager is a name associated with the actor or entity that is making these changes."),
                    query_param("fieldValidation", "fieldValidation instructs the server on how to handle objects in the request containing unknown or duplicate fields."),
                ],
                "responses": {"200": {"description": "OK"}},
            })
        };
        paths.insert(item, json!({"get": op("get"), "put": op("put"), "patch": op("patch"), "delete": op("delete")}));
        if let Some(crd) = &r.crd
            && let Some(raw) = crd
                .versions
                .get(&version)
                .and_then(|v| v.raw_schema.clone())
        {
            let mut schema = raw;
            if let Some(m) = schema.as_object_mut() {
                m.insert("x-kubernetes-group-version-kind".into(), gvk.clone());
                let props = m.entry("properties").or_insert_with(|| json!({}));
                if let Some(p) = props.as_object_mut() {
                    p.entry("apiVersion")
                        .or_insert_with(|| json!({"type": "string"}));
                    p.entry("kind").or_insert_with(|| json!({"type": "string"}));
                    p.entry("metadata")
                        .or_insert_with(|| json!({"type": "object"}));
                }
            }
            schemas.insert(
                format!("{}.{}.{}", reverse_group(&r.group), version, r.kind),
                schema,
            );
        }
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes (kube-sim)", "version": GIT_VERSION},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}
