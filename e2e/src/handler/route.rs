//! Where a request goes: the path parsed into a [`Route`] (a resource path,
//! discovery, OpenAPI, health, `/_sim/` hooks), the verb a resource request
//! means (`GET` with `watch=true` is `watch`, `DELETE` without a name is
//! `deletecollection`, ...), and the 404 the real server answers for a path
//! nothing serves (a `Status` inside the API groups it knows, plain text
//! elsewhere).
//!
//! Pure functions of the method, path and query: no state.

use std::collections::HashMap;

use hyper::Method;

use crate::status::{ApiError, ApiResult};

/// Decode an `application/x-www-form-urlencoded` query string.
pub(super) fn parse_query(q: &str) -> HashMap<String, String> {
    fn decode(s: &str) -> String {
        let bytes = s.as_bytes();
        let mut out = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'+' => out.push(b' '),
                b'%' if i + 2 < bytes.len() => {
                    match u8::from_str_radix(
                        std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"),
                        16,
                    ) {
                        Ok(b) => {
                            out.push(b);
                            i += 2;
                        }
                        Err(_) => out.push(b'%'),
                    }
                }
                b => out.push(b),
            }
            i += 1;
        }
        String::from_utf8_lossy(&out).into_owned()
    }
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(p), String::new()),
        })
        .collect()
}

/// Where a request goes.
#[derive(Debug)]
pub(super) enum Route {
    Version,
    Health,
    CoreVersions,
    Groups,
    Group(String),
    GroupVersion(String, String),
    OpenApiV2,
    OpenApiV3Root,
    OpenApiV3(String),
    Sim(String),
    Resource(ResPath),
    NotFound,
}

#[derive(Debug, Clone)]
pub(super) struct ResPath {
    pub group: String,
    pub version: String,
    pub resource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub sub: Option<String>,
}

pub(super) fn route(path: &str) -> Route {
    let trimmed = path.trim_end_matches('/');
    let segs: Vec<&str> = trimmed.split('/').filter(|s| !s.is_empty()).collect();
    match segs.as_slice() {
        ["version"] => Route::Version,
        ["healthz"] | ["livez"] | ["readyz"] => Route::Health,
        ["healthz", ..] | ["livez", ..] | ["readyz", ..] => Route::Health,
        ["api"] => Route::CoreVersions,
        ["apis"] => Route::Groups,
        ["api", "v1"] => Route::GroupVersion(String::new(), "v1".into()),
        ["apis", g] => Route::Group(g.to_string()),
        ["apis", g, v] => Route::GroupVersion(g.to_string(), v.to_string()),
        ["openapi", "v2"] => Route::OpenApiV2,
        ["openapi", "v3"] => Route::OpenApiV3Root,
        ["openapi", "v3", rest @ ..] => Route::OpenApiV3(rest.join("/")),
        ["_sim", rest @ ..] => Route::Sim(rest.join("/")),
        ["api", "v1", rest @ ..] => res_path("", "v1", rest),
        ["apis", g, v, rest @ ..] => res_path(g, v, rest),
        _ => Route::NotFound,
    }
}

fn res_path(group: &str, version: &str, rest: &[&str]) -> Route {
    let mk = |resource: &str, namespace: Option<&str>, name: Option<&str>, sub: Option<&str>| {
        Route::Resource(ResPath {
            group: group.into(),
            version: version.into(),
            resource: resource.into(),
            namespace: namespace.map(str::to_string),
            name: name.map(str::to_string),
            sub: sub.map(str::to_string),
        })
    };
    match rest {
        ["namespaces"] => mk("namespaces", None, None, None),
        ["namespaces", ns] => mk("namespaces", None, Some(ns), None),
        ["namespaces", ns, s @ ("status" | "finalize")] => {
            mk("namespaces", None, Some(ns), Some(s))
        }
        ["namespaces", ns, r] => mk(r, Some(ns), None, None),
        ["namespaces", ns, r, n] => mk(r, Some(ns), Some(n), None),
        ["namespaces", ns, r, n, s] => mk(r, Some(ns), Some(n), Some(s)),
        [r] => mk(r, None, None, None),
        [r, n] => mk(r, None, Some(n), None),
        [r, n, s] => mk(r, None, Some(n), Some(s)),
        _ => Route::NotFound,
    }
}

/// The API groups of the real kube-apiserver v1.34 (its `/apis` besides
/// custom resources). A resource or version that is not served in one of
/// these (or in the core group) is a 404 `Status`; any other group (unknown,
/// or a custom resource group with an unknown version or resource) gets the
/// plain-text 404 of a path no API serves, as the real server's
/// apiextensions handler delegates those.
const BUILTIN_GROUPS: &[&str] = &[
    "admissionregistration.k8s.io",
    "apiextensions.k8s.io",
    "apiregistration.k8s.io",
    "apps",
    "authentication.k8s.io",
    "authorization.k8s.io",
    "autoscaling",
    "batch",
    "certificates.k8s.io",
    "coordination.k8s.io",
    "discovery.k8s.io",
    "events.k8s.io",
    "flowcontrol.apiserver.k8s.io",
    "networking.k8s.io",
    "node.k8s.io",
    "policy",
    "rbac.authorization.k8s.io",
    "resource.k8s.io",
    "scheduling.k8s.io",
    "storage.k8s.io",
];

/// The 404 for something not served in API group `group` (`""`: core).
pub(super) fn not_served(group: &str) -> ApiError {
    if group.is_empty() || BUILTIN_GROUPS.contains(&group) {
        ApiError::no_route()
    } else {
        ApiError::page_not_found()
    }
}

/// The 404 for a path that matched no route: a `Status` under `/api`, a
/// built-in group of `/apis` and `/version`, plain text elsewhere.
pub(super) fn unknown_path(path: &str) -> ApiError {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segs.as_slice() {
        ["api", ..] | ["version", ..] => ApiError::no_route(),
        ["apis", g, ..] => not_served(g),
        _ => ApiError::page_not_found(),
    }
}

pub(super) fn verb_for(
    method: &Method,
    p: &ResPath,
    query: &HashMap<String, String>,
) -> ApiResult<&'static str> {
    let is_watch = matches!(query.get("watch").map(String::as_str), Some("true" | "1"));
    Ok(match (method, p.name.is_some()) {
        (&Method::GET, true) if is_watch => "watch",
        (&Method::GET, true) => "get",
        (&Method::GET, false) if is_watch => "watch",
        (&Method::GET, false) => "list",
        (&Method::POST, false) => "create",
        (&Method::POST, true) if p.sub.is_some() => "create",
        (&Method::PUT, true) => "update",
        (&Method::PATCH, true) => "patch",
        (&Method::DELETE, true) => "delete",
        (&Method::DELETE, false) => "deletecollection",
        _ => {
            return Err(ApiError::method_not_allowed(format!(
                "the server does not allow this method on the requested resource ({method})"
            )));
        }
    })
}

/// The `(verb, plural resource)` a fault rule matches for a resource request
/// (`None` for discovery, health and other non-resource paths), by the same
/// routing kube-sim serves with: e.g. `GET /api/v1/namespaces/a/pods?watch=1`
/// is `("watch", "pods")`.
pub fn fault_target(method: &Method, path: &str, query: &str) -> Option<(&'static str, String)> {
    let Route::Resource(p) = route(path) else {
        return None;
    };
    let verb = verb_for(method, &p, &parse_query(query)).ok()?;
    Some((verb, p.resource))
}
