//! Request handling: authentication, routing, authorization, faults, and the verbs.
//!
//! Every request goes through the same steps:
//! ```text
//! token -> user (401) -> route (404) -> verb -> RBAC (403) -> stats + faults
//!       -> verb handler (get/list/watch/create/update/patch/delete/...) -> JSON or Status
//! ```
//! Writes run entirely under the store lock: read the live object, compute the new
//! one (patch / server-side apply / defaults / schema), check preconditions, stamp
//! the next revision, commit. That keeps `resourceVersion` preconditions exact.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::body::Body;
use base64::Engine;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{HeaderMap, Method, Request, Response};
use serde_json::{Map, Value, json};

use crate::machinery::{self, Attributes, FieldSel, LabelSel, RbacObjects, User};
use crate::registry::{self, ResourceInfo};
use crate::server::{Shared, json_response};
use crate::status::{ApiError, ApiResult, Cause, success_status};
use crate::store::{EventType, Key, Store, WriteRecord};
use crate::{convert, discovery, table, watch};

/// Largest accepted request body (the real server's `--max-request-bytes`
/// default, 3 MiB).
pub const MAX_BODY: usize = 3 * 1024 * 1024;

/// Largest object stored (etcd's default `--max-request-bytes`, 1.5 MiB): a
/// bigger one is refused with etcd's error, as the real server passes it on.
pub const MAX_OBJECT: usize = 3 * 1024 * 1024 / 2;

/// Parsed `Accept` header.
#[derive(Debug, Clone, Copy, Default)]
pub struct Accept {
    pub table: bool,
    pub partial: bool,
}

fn parse_accept(headers: &HeaderMap) -> ApiResult<Accept> {
    let Some(raw) = headers.get("accept").and_then(|v| v.to_str().ok()) else {
        return Ok(Accept::default());
    };
    let mut json_ok = false;
    for part in raw.split(',') {
        let p = part.trim().to_ascii_lowercase();
        let media = p.split(';').next().unwrap_or("").trim();
        if media == "application/json"
            || media == "*/*"
            || media == "application/*"
            || media.is_empty()
        {
            if p.contains("as=table") {
                return Ok(Accept {
                    table: true,
                    partial: false,
                });
            }
            if p.contains("as=partialobjectmetadata") {
                return Ok(Accept {
                    table: false,
                    partial: true,
                });
            }
            if !p.contains("as=") {
                json_ok = true;
            }
        }
        if media == "application/yaml" {
            json_ok = true;
        }
    }
    if json_ok {
        Ok(Accept::default())
    } else {
        Err(ApiError::not_acceptable())
    }
}

/// Decode an `application/x-www-form-urlencoded` query string.
pub fn parse_query(q: &str) -> HashMap<String, String> {
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
enum Route {
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
pub struct ResPath {
    pub group: String,
    pub version: String,
    pub resource: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub sub: Option<String>,
}

fn route(path: &str) -> Route {
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

fn error_response(e: &ApiError) -> Response<Body> {
    if e.plain_text {
        return Response::builder()
            .status(e.code)
            .header("content-type", "text/plain; charset=utf-8")
            .header("x-content-type-options", "nosniff")
            .body(Body::from(format!("{}\n", e.message)))
            .unwrap_or_else(|_| Response::new(Body::empty()));
    }
    let mut resp = json_response(e.code, &e.to_status());
    if let Some(s) = e.retry_after
        && let Ok(v) = http::HeaderValue::from_str(&s.to_string())
    {
        resp.headers_mut().insert("retry-after", v);
    }
    resp
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
fn not_served(group: &str) -> ApiError {
    if group.is_empty() || BUILTIN_GROUPS.contains(&group) {
        ApiError::no_route()
    } else {
        ApiError::page_not_found()
    }
}

/// The 404 for a path that matched no route: a `Status` under `/api`, a
/// built-in group of `/apis` and `/version`, plain text elsewhere.
fn unknown_path(path: &str) -> ApiError {
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    match segs.as_slice() {
        ["api", ..] | ["version", ..] => ApiError::no_route(),
        ["apis", g, ..] => not_served(g),
        _ => ApiError::page_not_found(),
    }
}

/// Entry point for every HTTP request.
pub async fn handle(sh: Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    match handle_inner(&sh, req).await {
        Ok(r) => r,
        Err(e) => {
            if e.code == 404 && matches!(route(&path), Route::NotFound) {
                tracing::debug!(%method, %path, "kube-sim: unknown path");
            }
            error_response(&e)
        }
    }
}

fn bearer(headers: &HeaderMap) -> Option<String> {
    let v = headers.get("authorization")?.to_str().ok()?;
    let (scheme, token) = v.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim().to_string())
}

async fn read_body(body: Incoming) -> ApiResult<bytes::Bytes> {
    match http_body_util::Limited::new(body, MAX_BODY).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) => {
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some()
            {
                Err(ApiError::too_large(MAX_BODY))
            } else {
                Err(ApiError::bad_request(format!("reading request body: {e}")))
            }
        }
    }
}

fn verb_for(
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

fn rbac_snapshot(st: &Store) -> RbacObjects {
    let take = |res: &str| {
        st.range(res, None)
            .map(|(_, v)| (**v).clone())
            .collect::<Vec<_>>()
    };
    RbacObjects {
        roles: take("rbac.authorization.k8s.io/roles"),
        cluster_roles: take("rbac.authorization.k8s.io/clusterroles"),
        role_bindings: take("rbac.authorization.k8s.io/rolebindings"),
        cluster_role_bindings: take("rbac.authorization.k8s.io/clusterrolebindings"),
    }
}

fn authorize(sh: &Shared, user: &User, attrs: &Attributes) -> ApiResult<()> {
    if user.admin {
        return Ok(());
    }
    let objs = rbac_snapshot(&sh.lock());
    if machinery::authorize(user, attrs, &objs) {
        Ok(())
    } else {
        let mut e = ApiError::new(403, "Forbidden", machinery::forbidden_message(user, attrs));
        if attrs.resource_request {
            let mut d = json!({"kind": attrs.resource});
            if !attrs.name.is_empty() {
                d["name"] = json!(attrs.name);
            }
            if !attrs.api_group.is_empty() {
                d["group"] = json!(attrs.api_group);
            }
            e = e.with_details(d);
        }
        Err(e)
    }
}

async fn apply_faults(sh: &Shared, verb: &str, resource: &str) -> ApiResult<()> {
    let latency = sh.faults().take_latency(verb, resource);
    if let Some(d) = latency {
        tokio::time::sleep(d).await;
    }
    let failure = sh.faults().take_failure(verb, resource);
    if let Some((code, retry_after)) = failure {
        return Err(injected_failure(code, retry_after, verb, resource));
    }
    Ok(())
}

/// The `Status` error a `fail` fault answers with (`Retry-After` 1 s by
/// default for 429).
fn injected_failure(code: u16, retry_after: Option<u64>, verb: &str, resource: &str) -> ApiError {
    let reason = match code {
        429 => "TooManyRequests",
        500 => "InternalError",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        409 => "Conflict",
        404 => "NotFound",
        403 => "Forbidden",
        _ => "Unknown",
    };
    let mut e = ApiError::new(
        code,
        reason,
        format!("kube-sim injected fault: {code} for {verb} {resource}"),
    );
    e.retry_after = retry_after.or(if code == 429 { Some(1) } else { None });
    e
}

/// The HTTP answer of a `fail` fault, for a fault-injecting proxy in front of
/// another API server (the same body and headers kube-sim itself sends).
pub fn injected_failure_response(
    code: u16,
    retry_after: Option<u64>,
    verb: &str,
    resource: &str,
) -> Response<Body> {
    error_response(&injected_failure(code, retry_after, verb, resource))
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

async fn handle_inner(sh: &Arc<Shared>, req: Request<Incoming>) -> ApiResult<Response<Body>> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    let query = parse_query(parts.uri.query().unwrap_or(""));
    // A bearer token must be known (401 otherwise); a request without one
    // is the anonymous user, as with the real server's default
    // `--anonymous-auth=true` (RBAC then lets it read health and /version).
    let user = match bearer(&parts.headers).filter(|t| !t.is_empty()) {
        Some(t) => sh.user_for_token(&t).ok_or_else(ApiError::unauthorized)?,
        None => User::anonymous(),
    };
    let r = route(&path);
    let nonresource = |verb: &str| Attributes {
        verb: verb.to_string(),
        resource_request: false,
        path: path.clone(),
        ..Default::default()
    };
    let method_verb = match parts.method {
        Method::GET | Method::HEAD => "get",
        Method::POST => "post",
        Method::PUT => "put",
        Method::DELETE => "delete",
        Method::PATCH => "patch",
        _ => "unknown",
    };
    match r {
        Route::Sim(hook) => {
            if !user.admin {
                return Err(ApiError::new(
                    403,
                    "Forbidden",
                    format!(
                        "User {:?} cannot use /_sim/ hooks (admin token only)",
                        user.name
                    ),
                ));
            }
            let body = read_body(body).await?;
            return sim_hook(sh, &parts.method, &hook, &query, &body);
        }
        Route::Resource(p) => {
            let verb = verb_for(&parts.method, &p, &query)?;
            let body = if matches!(
                verb,
                "create" | "update" | "patch" | "delete" | "deletecollection"
            ) {
                read_body(body).await?
            } else {
                bytes::Bytes::new()
            };
            return resource_request(sh, user, parts.headers, p, verb, query, body).await;
        }
        Route::NotFound => {
            authorize(sh, &user, &nonresource(method_verb))?;
            return Err(unknown_path(&path));
        }
        _ => {}
    }
    authorize(sh, &user, &nonresource(method_verb))?;
    if parts.method != Method::GET && parts.method != Method::HEAD {
        return Err(ApiError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        ));
    }
    sh.count_request("get", "nonresource");
    let reg = sh.lock().registry.clone();
    let body = match r {
        Route::Version => discovery::version(),
        Route::Health => {
            return Ok(Response::builder()
                .status(200)
                .header("content-type", "text/plain")
                .body(Body::from("ok"))
                .unwrap_or_else(|_| Response::new(Body::empty())));
        }
        Route::CoreVersions => discovery::core_versions(&sh.url),
        Route::Groups => discovery::groups(&reg),
        Route::Group(g) => discovery::group(&reg, &g).ok_or_else(|| not_served(&g))?,
        Route::GroupVersion(g, v) => {
            discovery::resource_list(&reg, &g, &v).ok_or_else(|| not_served(&g))?
        }
        Route::OpenApiV2 => {
            let accept = parts
                .headers
                .get("accept")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            if accept.contains("protobuf") && !accept.contains("json") {
                // client-go asks for the protobuf encoding only; an empty message is a
                // valid, empty openapi_v2.Document.
                return Ok(Response::builder()
                    .status(200)
                    .header(
                        "content-type",
                        "application/com.github.proto-openapi.spec.v2.v1.0+protobuf",
                    )
                    .body(Body::empty())
                    .unwrap_or_else(|_| Response::new(Body::empty())));
            }
            discovery::openapi_v2(&reg)
        }
        Route::OpenApiV3Root => discovery::openapi_v3_root(&reg),
        Route::OpenApiV3(gv) => discovery::openapi_v3(&reg, &gv).ok_or_else(ApiError::no_route)?,
        _ => return Err(ApiError::no_route()),
    };
    Ok(json_response(200, &body))
}

fn sim_hook(
    sh: &Arc<Shared>,
    method: &Method,
    hook: &str,
    query: &HashMap<String, String>,
    body: &[u8],
) -> ApiResult<Response<Body>> {
    match (method, hook) {
        (&Method::GET, "stats") => Ok(json_response(200, &sh.stats_json())),
        (&Method::GET, "writes") => {
            let since: u64 = match query.get("since") {
                Some(s) => s.parse().map_err(|_| {
                    ApiError::bad_request(format!("since: not a resourceVersion: {s:?}"))
                })?,
                None => 0,
            };
            let resource = query.get("resource");
            let st = sh.lock();
            let items: Vec<&WriteRecord> = st
                .writes
                .iter()
                .filter(|w| w.resource_version.parse::<u64>().unwrap_or(0) > since)
                .filter(|w| resource.is_none_or(|r| *r == w.resource))
                .collect();
            Ok(json_response(
                200,
                &json!({"resourceVersion": st.rv.to_string(), "items": items}),
            ))
        }
        (&Method::POST, "faults") => {
            let req: crate::server::FaultRequest = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("invalid fault request: {e}")))?;
            crate::server::validate_faults(&req).map_err(ApiError::bad_request)?;
            sh.apply_faults(req);
            Ok(json_response(200, &json!({"ok": true})))
        }
        (&Method::POST, "unvalidated") => {
            let obj: Value = serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("invalid object: {e}")))?;
            let (code, stored) = store_unvalidated(sh, obj)?;
            Ok(json_response(code, &stored))
        }
        (_, "stats" | "writes" | "faults" | "unvalidated") => Err(ApiError::method_not_allowed(
            format!("/_sim/{hook} does not allow {method}"),
        )),
        _ => Err(ApiError::no_route()),
    }
}

/// `POST /_sim/unvalidated`: stores `obj` (created, or replacing the stored
/// object of its kind, namespace and name) as it is: no defaults, no
/// validation, no admission, no managedFields; only `uid`,
/// `creationTimestamp` (kept when replacing) and the next `resourceVersion`
/// are set. Watches see it like any write. For tests of clients that must
/// cope with what an older or corrupted server could hold (a real API server
/// would refuse it). Returns the HTTP code (201 created, 200 replaced) and
/// the stored object.
pub fn store_unvalidated(sh: &Shared, mut obj: Value) -> ApiResult<(u16, Value)> {
    let s = |p: &str| obj.pointer(p).and_then(Value::as_str).map(str::to_string);
    let (Some(api_version), Some(kind), Some(name)) =
        (s("/apiVersion"), s("/kind"), s("/metadata/name"))
    else {
        return Err(ApiError::bad_request(
            "the object needs apiVersion, kind and metadata.name",
        ));
    };
    let (group, version) = api_version
        .rsplit_once('/')
        .map_or(("", api_version.as_str()), |(g, v)| (g, v));
    let mut st = sh.lock();
    let info = st
        .registry
        .resources
        .values()
        .find(|r| {
            r.group == group && r.kind == kind && r.serves(version) && !convert::is_converted(r)
        })
        .cloned()
        .ok_or_else(|| {
            ApiError::bad_request(format!("kube-sim does not store {api_version} {kind}"))
        })?;
    let namespace = s("/metadata/namespace").unwrap_or_default();
    if info.namespaced == namespace.is_empty() {
        return Err(ApiError::bad_request(if info.namespaced {
            format!("{kind} is namespaced: metadata.namespace is required")
        } else {
            format!("{kind} is cluster-scoped: metadata.namespace must be unset")
        }));
    }
    let key: Key = (convert::store_key(&info), namespace.clone(), name.clone());
    let old = st.objects.get(&key).cloned();
    let (uid, created) = match &old {
        Some(o) => (
            meta_str(o, "uid").unwrap_or("").to_string(),
            meta_str(o, "creationTimestamp").unwrap_or("").to_string(),
        ),
        None => (uuid::Uuid::new_v4().to_string(), now()),
    };
    let rv = st.next_rv();
    obj["metadata"]["uid"] = json!(uid);
    obj["metadata"]["creationTimestamp"] = json!(created);
    obj["metadata"]["resourceVersion"] = json!(rv.to_string());
    let (etype, verb, code) = match old {
        Some(_) => (EventType::Modified, "update", 200),
        None => (EventType::Added, "create", 201),
    };
    let stored = Arc::new(obj);
    st.commit(rv, etype, key, old, stored.clone());
    record_raw(
        &mut st,
        sh,
        "kube-sim-admin",
        verb,
        &info,
        &namespace,
        &name,
        rv,
    );
    Ok((code, (*stored).clone()))
}

/// Everything a resource verb handler needs.
pub struct Ctx {
    pub sh: Arc<Shared>,
    pub user: User,
    pub info: Arc<ResourceInfo>,
    pub version: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub sub: Option<String>,
    pub query: HashMap<String, String>,
    pub headers: HeaderMap,
    pub accept: Accept,
}

impl Ctx {
    fn q(&self, k: &str) -> Option<&str> {
        self.query.get(k).map(String::as_str)
    }

    fn dry_run(&self) -> bool {
        self.q("dryRun") == Some("All")
    }

    fn manager(&self, default_suffix: &str) -> String {
        if let Some(m) = self.q("fieldManager") {
            return m.to_string();
        }
        let ua = self
            .headers
            .get("user-agent")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("unknown");
        let base = ua.split('/').next().unwrap_or("unknown").to_string();
        if default_suffix.is_empty() {
            base
        } else {
            format!("{base}{default_suffix}")
        }
    }

    fn key(&self, name: &str) -> Key {
        (
            convert::store_key(&self.info),
            self.namespace.clone().unwrap_or_default(),
            name.to_string(),
        )
    }

    fn api_version(&self) -> String {
        self.info.api_version(&self.version)
    }

    /// The `apiVersion` recorded in `managedFields`: field sets are computed on the
    /// stored object, so for a converted resource (events.k8s.io/v1 Events) they are
    /// stored-version (core/v1) field paths and say so.
    fn fields_api_version(&self) -> String {
        if convert::is_converted(&self.info) {
            convert::stored_api_version(&self.info)
        } else {
            self.api_version()
        }
    }

    /// Whether objects are served exactly as stored (no conversion, no apiVersion change).
    fn served_as_stored(&self) -> bool {
        convert::served_as_stored(&self.info, &self.version)
    }
}

async fn resource_request(
    sh: &Arc<Shared>,
    user: User,
    headers: HeaderMap,
    p: ResPath,
    verb: &'static str,
    query: HashMap<String, String>,
    body: bytes::Bytes,
) -> ApiResult<Response<Body>> {
    let attrs = Attributes {
        verb: verb.to_string(),
        api_group: p.group.clone(),
        resource: p.resource.clone(),
        subresource: p.sub.clone().unwrap_or_default(),
        namespace: p.namespace.clone().unwrap_or_default(),
        name: p.name.clone().unwrap_or_default(),
        resource_request: true,
        path: String::new(),
    };
    authorize(sh, &user, &attrs)?;
    let info = sh
        .lock()
        .registry
        .lookup(&p.group, &p.version, &p.resource)
        .ok_or_else(|| not_served(&p.group))?;
    // Scope checks: a namespaced path for a cluster-scoped resource (or vice versa
    // for a single object) does not exist.
    let wrong_scope = || {
        if info.crd.is_some() {
            ApiError::page_not_found()
        } else {
            ApiError::no_route()
        }
    };
    if p.namespace.is_some() && !info.namespaced {
        return Err(wrong_scope());
    }
    if info.namespaced && p.namespace.is_none() && !matches!(verb, "list" | "watch") {
        return Err(wrong_scope());
    }
    if !info.verbs.contains(&verb) {
        return Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({verb} {})",
            p.resource
        )));
    }
    // Subresource requests count as `resource/subresource` (as RBAC names
    // them), so least-privilege measurements can tell `x/status` from `x`.
    match &p.sub {
        Some(sub) => sh.count_user_request(&user.name, verb, &format!("{}/{sub}", p.resource)),
        None => sh.count_user_request(&user.name, verb, &p.resource),
    }
    apply_faults(sh, verb, &p.resource).await?;
    let accept = parse_accept(&headers)?;
    let ctx = Ctx {
        sh: sh.clone(),
        user,
        info,
        version: p.version.clone(),
        namespace: p.namespace.clone(),
        name: p.name.clone(),
        sub: p.sub.clone(),
        query,
        headers,
        accept,
    };
    if let Some(sub) = ctx.sub.as_deref() {
        let ok = match sub {
            "status" => {
                ctx.info.status_subresource(&ctx.version)
                    && matches!(verb, "get" | "update" | "patch")
            }
            "token" => ctx.info.resource == "serviceaccounts" && verb == "create",
            "finalize" => false,
            _ => false,
        };
        if !ok {
            // The real server's custom resource handler answers a
            // subresource it does not serve with the object's NotFound.
            return Err(if ctx.info.crd.is_some() {
                ApiError::not_found(
                    &ctx.info.group,
                    &ctx.info.resource,
                    ctx.name.as_deref().unwrap_or(""),
                )
            } else {
                ApiError::no_route()
            });
        }
    }
    let name = ctx.name.clone().unwrap_or_default();
    let result = match verb {
        "get" => get(&ctx, &name),
        "list" => list(&ctx),
        "watch" => watch::start(&ctx),
        "create" if ctx.sub.as_deref() == Some("token") => token_request(&ctx, &name, &body),
        "create" if ctx.info.resource == "selfsubjectaccessreviews" => {
            self_subject_access_review(&ctx, &body)
        }
        "create" => create(&ctx, &body),
        "update" => update(&ctx, &name, &body),
        "patch" => patch(&ctx, &name, &body),
        "delete" => delete(&ctx, &name, &body),
        "deletecollection" => delete_collection(&ctx, &body),
        _ => Err(ApiError::method_not_allowed(verb)),
    };
    match deprecation_warning(&ctx.info, &ctx.version) {
        None => result,
        Some(warning) => {
            // The real server adds it to every answer of the resource's
            // handler, errors included.
            let mut resp = result.unwrap_or_else(|e| error_response(&e));
            resp.headers_mut()
                .insert("warning", http::HeaderValue::from_static(warning));
            Ok(resp)
        }
    }
}

/// The `Warning` header the real server (v1.34) sends for a deprecated
/// resource version kube-sim serves: v1 Endpoints (deprecated in v1.33).
fn deprecation_warning(info: &ResourceInfo, version: &str) -> Option<&'static str> {
    (info.group.is_empty() && info.resource == "endpoints" && version == "v1").then_some(
        "299 - \"v1 Endpoints is deprecated in v1.33+; use discovery.k8s.io/v1 EndpointSlice\"",
    )
}

/// The object as served in `version` (objects are stored in the storage version;
/// events.k8s.io/v1 Events are stored as core/v1 Events, see [`crate::convert`]).
pub fn present(info: &ResourceInfo, version: &str, obj: &Value) -> Value {
    convert::from_storage(info, version, obj)
}

/// Answer with an object in the requested version (no copy when it is served
/// as stored).
fn respond(ctx: &Ctx, code: u16, obj: &Value) -> ApiResult<Response<Body>> {
    if ctx.served_as_stored() {
        ok_json(code, obj)
    } else {
        ok_json(code, &present(&ctx.info, &ctx.version, obj))
    }
}

fn ok_json(code: u16, v: &Value) -> ApiResult<Response<Body>> {
    Ok(json_response(code, v))
}

fn get(ctx: &Ctx, name: &str) -> ApiResult<Response<Body>> {
    let obj = ctx.sh.lock().objects.get(&ctx.key(name)).cloned();
    let obj = obj.ok_or_else(|| ApiError::not_found(&ctx.info.group, &ctx.info.resource, name))?;
    let obj = present(&ctx.info, &ctx.version, &obj);
    if ctx.accept.table {
        return ok_json(
            200,
            &table::table(
                &ctx.info,
                &ctx.version,
                &[obj],
                None,
                ctx.q("includeObject"),
            ),
        );
    }
    if ctx.accept.partial {
        return ok_json(200, &table::partial(&obj));
    }
    ok_json(200, &obj)
}

pub fn selectors(ctx: &Ctx) -> ApiResult<(LabelSel, FieldSel)> {
    let label = LabelSel::parse(ctx.q("labelSelector").unwrap_or(""))?;
    let crd_fields = ctx.info.crd.as_ref().map(|c| {
        c.versions
            .get(&ctx.version)
            .map(|v| v.selectable_fields.clone())
            .unwrap_or_default()
    });
    let selectable =
        machinery::selectable_fields(&ctx.info.group, &ctx.info.resource, crd_fields.as_deref());
    let field = FieldSel::parse(
        ctx.q("fieldSelector").unwrap_or(""),
        &ctx.info.group,
        &selectable,
    )?;
    Ok((label, field))
}

#[derive(serde::Serialize, serde::Deserialize)]
struct Continue {
    rv: u64,
    ns: String,
    name: String,
}

/// What revision a LIST reads, from `resourceVersion`, `resourceVersionMatch`,
/// `limit` and `continue` (the real server's `ValidateListOptions` and
/// `ListReadConsistency`).
enum ListRead {
    /// The current state (unset: "most recent"; `"0"`: "any"; `NotOlderThan` an
    /// RV at or below the current one).
    Current,
    /// The state exactly at this revision (`Exact`, legacy paged lists, and
    /// `continue` tokens), rebuilt from the event history.
    At(u64),
    /// `NotOlderThan` a revision: current state once it is not newer than that.
    NotOlderThan(u64),
}

fn list_read(ctx: &Ctx, limit: usize, cont: Option<&Continue>) -> ApiResult<ListRead> {
    let rv = ctx.q("resourceVersion").unwrap_or("");
    let matching = ctx.q("resourceVersionMatch").unwrap_or("");
    let has_continue = ctx.q("continue").is_some_and(|c| !c.is_empty());
    let mut causes = Vec::new();
    if !matching.is_empty() {
        if rv.is_empty() {
            causes.push(Cause::new(
                "FieldValueForbidden",
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden unless resourceVersion is provided",
            ));
        }
        if has_continue {
            causes.push(Cause::new(
                "FieldValueForbidden",
                "resourceVersionMatch",
                "resourceVersionMatch is forbidden when continue is provided",
            ));
        }
        if matching != "Exact" && matching != "NotOlderThan" {
            causes.push(Cause::new(
                "FieldValueNotSupported",
                "resourceVersionMatch",
                format!(
                    "Unsupported value: {matching:?}: supported values: \"Exact\", \"NotOlderThan\", \"\""
                ),
            ));
        }
        if matching == "Exact" && rv == "0" {
            causes.push(Cause::new(
                "FieldValueForbidden",
                "resourceVersionMatch",
                "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
            ));
        }
    }
    if ctx.q("sendInitialEvents").is_some() {
        causes.push(Cause::new(
            "FieldValueForbidden",
            "sendInitialEvents",
            "sendInitialEvents is forbidden for list",
        ));
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid("ListOptions", "meta.k8s.io", "", causes));
    }
    if let Some(c) = cont {
        if !rv.is_empty() && rv != "0" {
            return Err(ApiError::bad_request(
                "specifying resource version is not allowed when using continue",
            ));
        }
        return Ok(ListRead::At(c.rv));
    }
    if rv.is_empty() || rv == "0" {
        return Ok(ListRead::Current);
    }
    let n: u64 = rv.parse().map_err(|_| {
        ApiError::bad_request(format!(
            "invalid resource version: resourceVersion: Invalid value: {rv:?}: strconv.ParseUint: parsing {rv:?}: invalid syntax"
        ))
    })?;
    // Without a match, a paged list (limit) reads exactly at the revision and an
    // unpaged one "not older than" it (the documented legacy semantics).
    match matching {
        "Exact" => Ok(ListRead::At(n)),
        "" if limit > 0 => Ok(ListRead::At(n)),
        _ => Ok(ListRead::NotOlderThan(n)),
    }
}

/// Interleave two key-ordered iterators with disjoint keys.
fn merge_by_key<'a>(
    a: impl Iterator<Item = (&'a Key, &'a Arc<Value>)>,
    b: impl Iterator<Item = (&'a Key, &'a Arc<Value>)>,
) -> impl Iterator<Item = (&'a Key, &'a Arc<Value>)> {
    let mut a = a.peekable();
    let mut b = b.peekable();
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (Some(x), Some(y)) => {
            if x.0 <= y.0 {
                a.next()
            } else {
                b.next()
            }
        }
        (Some(_), None) => a.next(),
        (None, _) => b.next(),
    })
}

fn list(ctx: &Ctx) -> ApiResult<Response<Body>> {
    let (label, field) = selectors(ctx)?;
    let limit: usize = match ctx.q("limit") {
        Some(l) if !l.is_empty() => l
            .parse::<usize>()
            .map_err(|_| ApiError::bad_request(format!("limit: invalid value {l:?}")))?,
        _ => 0,
    };
    let cont: Option<Continue> = match ctx.q("continue") {
        Some(c) if !c.is_empty() => {
            let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(c)
                .map_err(|_| ApiError::bad_request("continue key is not valid"))?;
            Some(
                serde_json::from_slice(&raw)
                    .map_err(|_| ApiError::bad_request("continue key is not valid"))?,
            )
        }
        _ => None,
    };
    let read = list_read(ctx, limit, cont.as_ref())?;
    let res = convert::store_key(&ctx.info);
    let st = ctx.sh.lock();
    // The revision this list is a consistent snapshot at. A continued list
    // (and an `Exact` one) is served as of its revision: the current objects,
    // with those changed since replaced by their state then (from the history).
    let at = match read {
        ListRead::NotOlderThan(n) | ListRead::At(n) if n > st.rv => {
            return Err(ApiError::too_large_rv(n, st.rv));
        }
        ListRead::Current | ListRead::NotOlderThan(_) => None,
        ListRead::At(n) if !st.can_watch_from(n) => {
            return Err(ApiError::new(
                410,
                "Expired",
                if cont.is_some() {
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter."
                } else {
                    "The resourceVersion for the provided list is too old."
                },
            ));
        }
        ListRead::At(n) => Some(n),
    };
    let changed = match at {
        Some(n) if n < st.rv => st.changed_since(&res, ctx.namespace.as_deref(), n),
        _ => Default::default(),
    };
    let mut items = Vec::new();
    let mut next: Option<Continue> = None;
    // Like the real API server, `remainingItemCount` is sent only without
    // selectors (with one, it would need a scan of the rest).
    let after = cont.as_ref().map(|c| (c.ns.as_str(), c.name.as_str()));
    let then = {
        use std::ops::Bound;
        let from = match after {
            Some((ns, name)) => Bound::Excluded((res.clone(), ns.to_string(), name.to_string())),
            None => Bound::Unbounded,
        };
        changed
            .range((from, Bound::Unbounded))
            .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
    };
    let now = st
        .range_after(&res, ctx.namespace.as_deref(), after)
        .filter(|(k, _)| !changed.contains_key(*k));
    let mut rest = merge_by_key(now, then);
    for (_, obj) in rest.by_ref() {
        if !label.matches(obj) || !field.matches(obj) {
            continue;
        }
        if limit > 0 && items.len() >= limit {
            if let Some(last) = items.last() {
                let last: &Arc<Value> = last;
                next = Some(Continue {
                    rv: at.unwrap_or(st.rv),
                    ns: last
                        .pointer("/metadata/namespace")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                    name: last
                        .pointer("/metadata/name")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_string(),
                });
            }
            break;
        }
        items.push(obj.clone());
    }
    let remaining = if next.is_some() && label.is_empty() && field.is_empty() {
        // This object plus everything after it.
        Some(1 + rest.count() as u64)
    } else {
        drop(rest);
        None
    };
    let rv = at.unwrap_or(st.rv);
    drop(st);
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if let Some(n) = next {
        let token = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(serde_json::to_vec(&n).unwrap_or_default());
        metadata["continue"] = json!(token);
        if let Some(remaining) = remaining {
            metadata["remainingItemCount"] = json!(remaining);
        }
    }
    if !ctx.accept.table && !ctx.accept.partial && ctx.served_as_stored() {
        // Large lists: serialize the stored objects directly, without copies.
        let head = json!({"kind": ctx.info.list_kind, "apiVersion": ctx.api_version(), "metadata": metadata});
        let mut out = serde_json::to_vec(&head).map_err(|e| ApiError::internal(e.to_string()))?;
        out.pop();
        out.extend_from_slice(b",\"items\":[");
        let typed = ctx.info.crd.is_none();
        for (i, o) in items.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            let written = if typed {
                serde_json::to_writer(&mut out, &WithoutTypeMeta(o))
            } else {
                serde_json::to_writer(&mut out, &**o)
            };
            written.map_err(|e| ApiError::internal(e.to_string()))?;
        }
        out.extend_from_slice(b"]}");
        return Response::builder()
            .status(200)
            .header("content-type", "application/json")
            .body(Body::from(out))
            .map_err(|e| ApiError::internal(e.to_string()));
    }
    let items: Vec<Value> = items
        .iter()
        .map(|o| present(&ctx.info, &ctx.version, o))
        .collect();
    if ctx.accept.table {
        return ok_json(
            200,
            &table::table(
                &ctx.info,
                &ctx.version,
                &items,
                Some(metadata),
                ctx.q("includeObject"),
            ),
        );
    }
    if ctx.accept.partial {
        let items: Vec<Value> = items.iter().map(table::partial).collect();
        return ok_json(
            200,
            &json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": metadata, "items": items}),
        );
    }
    let items: Vec<Value> = items.into_iter().map(|o| list_item(&ctx.info, o)).collect();
    ok_json(
        200,
        &json!({"kind": ctx.info.list_kind, "apiVersion": ctx.api_version(), "metadata": metadata, "items": items}),
    )
}

/// An object as an item of a list: built-in types carry no `apiVersion` and
/// `kind` there (the real server encodes list items of its Go types with an
/// empty TypeMeta); custom resources keep theirs.
fn list_item(info: &ResourceInfo, mut obj: Value) -> Value {
    if info.crd.is_none()
        && let Some(m) = obj.as_object_mut()
    {
        m.remove("apiVersion");
        m.remove("kind");
    }
    obj
}

/// Serializes an object without its `apiVersion` and `kind` ([`list_item`]
/// without a copy).
struct WithoutTypeMeta<'a>(&'a Value);

impl serde::Serialize for WithoutTypeMeta<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let Some(m) = self.0.as_object() else {
            return self.0.serialize(s);
        };
        let fields = m.iter().filter(|(k, _)| *k != "apiVersion" && *k != "kind");
        let mut map = s.serialize_map(None)?;
        for (k, v) in fields {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

fn parse_body(ctx: &Ctx, body: &[u8]) -> ApiResult<Value> {
    let ct = ctx
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/json");
    let media = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let v: Value = match media.as_str() {
        "application/json" | "" => serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!(
                "the body of the request could not be decoded as JSON: {e}"
            ))
        })?,
        "application/yaml" | "application/apply-patch+yaml" => yaml_body(body).map_err(|e| {
            ApiError::bad_request(format!(
                "the body of the request could not be decoded as YAML: {e}"
            ))
        })?,
        "application/vnd.kubernetes.protobuf" => {
            crate::protobuf::decode(body).map_err(|(code, msg)| {
                if code == 415 {
                    ApiError::new(415, "UnsupportedMediaType", msg)
                } else {
                    ApiError::bad_request(msg)
                }
            })?
        }
        _ => serde_json::from_slice(body).map_err(|e| {
            ApiError::bad_request(format!("the body of the request could not be decoded: {e}"))
        })?,
    };
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON object",
        ));
    }
    Ok(v)
}

fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
}

fn check_type_meta(ctx: &Ctx, obj: &mut Value) -> ApiResult<()> {
    let expected_av = ctx.api_version();
    let av = obj.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind = obj.get("kind").and_then(Value::as_str).unwrap_or("");
    if !av.is_empty() && av != expected_av {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({av}) does not match the expected API version ({expected_av})"
        )));
    }
    if !kind.is_empty() && kind != ctx.info.kind {
        return Err(ApiError::bad_request(format!(
            "the kind in the data ({kind}) does not match the expected kind ({})",
            ctx.info.kind
        )));
    }
    obj["apiVersion"] = json!(ctx.info.api_version(ctx.info.storage_version()));
    obj["kind"] = json!(ctx.info.kind);
    // The request's shape -> the stored shape (events.k8s.io/v1 -> core/v1 Events).
    convert::to_storage(&ctx.info, obj);
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    if let Some(ns) = meta_str(obj, "namespace") {
        match &ctx.namespace {
            Some(path_ns) if ns != path_ns => {
                return Err(ApiError::bad_request("the namespace of the provided object does not match the namespace sent on the request".to_string()));
            }
            None if !ns.is_empty() && !ctx.info.namespaced => {
                if let Some(m) = obj["metadata"].as_object_mut() {
                    m.remove("namespace");
                }
            }
            _ => {}
        }
    }
    if let Some(ns) = &ctx.namespace {
        obj["metadata"]["namespace"] = json!(ns);
    }
    Ok(())
}

fn random_suffix(n: usize) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let bytes = uuid::Uuid::new_v4();
    bytes
        .as_bytes()
        .iter()
        .take(n)
        .map(|b| ALPHABET[(*b as usize) % ALPHABET.len()] as char)
        .collect()
}

fn create(ctx: &Ctx, body: &[u8]) -> ApiResult<Response<Body>> {
    let mut obj = parse_body(ctx, body)?;
    check_type_meta(ctx, &mut obj)?;
    decoded(ctx, &mut obj);
    if meta_str(&obj, "resourceVersion").is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::internal(
            "resourceVersion should not be set on objects to be created",
        ));
    }
    if meta_str(&obj, "name").unwrap_or("").is_empty() {
        match meta_str(&obj, "generateName") {
            Some(g) if !g.is_empty() => {
                let name = format!("{g}{}", random_suffix(5));
                obj["metadata"]["name"] = json!(name);
            }
            _ => {
                return Err(ApiError::invalid(
                    &ctx.info.kind,
                    &ctx.info.group,
                    "",
                    vec![Cause::new(
                        "FieldValueRequired",
                        "metadata.name",
                        "name or generateName is required",
                    )],
                ));
            }
        }
    }
    let name = meta_str(&obj, "name").unwrap_or("").to_string();
    let manager = ctx.manager("");
    let mut st = ctx.sh.lock();
    let key = ctx.key(&name);
    if st.objects.contains_key(&key) {
        return Err(ApiError::already_exists(
            &ctx.info.group,
            &ctx.info.resource,
            &name,
        ));
    }
    let out = write(ctx, &mut st, "create", None, obj, &manager, false)?;
    drop(st);
    respond(ctx, 201, &out)
}

/// A patch (apply) or update that would create the object needs `create`
/// too, as the real server authorizes a create-on-patch and create-on-update
/// (`withAuthorization` in k8s.io/apiserver's patch.go and update.go).
fn authorize_create_on_write(ctx: &Ctx, key: &Key, name: &str) -> ApiResult<()> {
    if ctx.sh.lock().objects.contains_key(key) {
        return Ok(());
    }
    let attrs = Attributes {
        verb: "create".into(),
        api_group: ctx.info.group.clone(),
        resource: ctx.info.resource.clone(),
        subresource: ctx.sub.clone().unwrap_or_default(),
        namespace: ctx.namespace.clone().unwrap_or_default(),
        name: name.to_string(),
        resource_request: true,
        path: String::new(),
    };
    authorize(&ctx.sh, &ctx.user, &attrs)
}

fn update(ctx: &Ctx, name: &str, body: &[u8]) -> ApiResult<Response<Body>> {
    let mut obj = parse_body(ctx, body)?;
    check_type_meta(ctx, &mut obj)?;
    decoded(ctx, &mut obj);
    let body_name = meta_str(&obj, "name").unwrap_or("");
    if body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    let manager = ctx.manager("");
    let status_only = ctx.sub.as_deref() == Some("status");
    let key = ctx.key(name);
    if ctx.info.create_on_update && !status_only {
        authorize_create_on_write(ctx, &key, name)?;
    }
    let mut st = ctx.sh.lock();
    let old = st.objects.get(&key).cloned();
    let Some(old) = old else {
        if ctx.info.create_on_update && !status_only {
            if let Some(m) = obj["metadata"].as_object_mut() {
                m.remove("resourceVersion");
            }
            let out = write(ctx, &mut st, "create", None, obj, &manager, false)?;
            return respond(ctx, 201, &out);
        }
        return Err(ApiError::not_found(
            &ctx.info.group,
            &ctx.info.resource,
            name,
        ));
    };
    if let Some(rv) = meta_str(&obj, "resourceVersion").filter(|s| !s.is_empty())
        && Some(rv) != meta_str(&old, "resourceVersion")
    {
        return Err(ApiError::conflict(
            &ctx.info.group,
            &ctx.info.resource,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        ));
    }
    let out = write(
        ctx,
        &mut st,
        "update",
        Some(old),
        obj,
        &manager,
        status_only,
    )?;
    drop(st);
    respond(ctx, 200, &out)
}

fn patch(ctx: &Ctx, name: &str, body: &[u8]) -> ApiResult<Response<Body>> {
    let ct = ctx
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string();
    let media = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let status_only = ctx.sub.as_deref() == Some("status");
    let patch_doc: Value = match media.as_str() {
        "application/apply-patch+yaml" => yaml_body(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?,
        "application/merge-patch+json"
        | "application/strategic-merge-patch+json"
        | "application/json-patch+json" => serde_json::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding patch: {e}")))?,
        _ => return Err(ApiError::unsupported_media_type(&ct)),
    };
    check_patch_shape(&media, &patch_doc)?;
    let force = ctx.q("force") == Some("true");
    let key = ctx.key(name);
    if media == "application/apply-patch+yaml" {
        authorize_create_on_write(ctx, &key, name)?;
    }
    let mut st = ctx.sh.lock();
    let old = st.objects.get(&key).cloned();
    if media == "application/apply-patch+yaml" {
        let Some(manager) = ctx.q("fieldManager").map(str::to_string) else {
            return Err(ApiError::invalid(
                "PatchOptions",
                "meta.k8s.io",
                "",
                vec![Cause::new(
                    "FieldValueRequired",
                    "fieldManager",
                    "is required for apply patch",
                )],
            ));
        };
        let mut applied = patch_doc;
        check_type_meta(ctx, &mut applied)?;
        let applied_name = meta_str(&applied, "name").unwrap_or("").to_string();
        if applied_name.is_empty() {
            // Like the real server: the object's name comes from the URL.
            applied["metadata"]["name"] = json!(name);
        } else if applied_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({applied_name}) does not match the name on the URL ({name})"
            )));
        }
        if let Some(rv) = meta_str(&applied, "resourceVersion").filter(|s| !s.is_empty())
            && old.as_deref().and_then(|o| meta_str(o, "resourceVersion")) != Some(rv)
        {
            return Err(ApiError::conflict(
                &ctx.info.group,
                &ctx.info.resource,
                name,
                "the object has been modified; please apply your changes to the latest version and try again",
            ));
        }
        let av = ctx.fields_api_version();
        let schema = ctx
            .info
            .crd
            .as_ref()
            .and_then(|c| c.versions.get(&ctx.version))
            .and_then(|v| v.schema.clone());
        let mut merged = match machinery::ssa_apply(
            old.as_deref(),
            &applied,
            &manager,
            force,
            &now(),
            &av,
            schema.as_deref(),
        ) {
            Ok(v) => v,
            Err(c) => {
                return Err(ApiError::new(409, "Conflict", c.message())
                    .with_details(json!({"causes": c.causes()})));
            }
        };
        merged["apiVersion"] = json!(convert::stored_api_version(&ctx.info));
        let out = match old {
            None => {
                if let Some(m) = merged["metadata"].as_object_mut() {
                    m.remove("resourceVersion");
                }
                write(ctx, &mut st, "create", None, merged, "", status_only).map(|o| (201, o))
            }
            Some(old) => {
                write(ctx, &mut st, "patch", Some(old), merged, "", status_only).map(|o| (200, o))
            }
        }?;
        drop(st);
        return respond(ctx, out.0, &out.1);
    }
    let Some(old) = old else {
        return Err(ApiError::not_found(
            &ctx.info.group,
            &ctx.info.resource,
            name,
        ));
    };
    let mut target = present(&ctx.info, &ctx.version, &old);
    match media.as_str() {
        "application/merge-patch+json" => machinery::merge_patch(&mut target, &patch_doc),
        "application/json-patch+json" => {
            machinery::json_patch(&mut target, &patch_doc).map_err(|e| {
                ApiError::new(
                    422,
                    "Invalid",
                    format!("the server rejected our request due to an error in our request: {e}"),
                )
            })?
        }
        _ => machinery::strategic_merge_patch(&mut target, &patch_doc, &ctx.info.kind).map_err(
            |e| {
                ApiError::new(
                    422,
                    "Invalid",
                    format!("the server rejected our request due to an error in our request: {e}"),
                )
            },
        )?,
    }
    if let Some(rv) = meta_str(&target, "resourceVersion").filter(|s| !s.is_empty())
        && Some(rv) != meta_str(&old, "resourceVersion")
    {
        return Err(ApiError::conflict(
            &ctx.info.group,
            &ctx.info.resource,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        ));
    }
    if !target.is_object() {
        return Err(ApiError::new(
            422,
            "Invalid",
            "the patched object must be a JSON object",
        ));
    }
    check_type_meta(ctx, &mut target)?;
    decoded(ctx, &mut target);
    if meta_str(&target, "name") != Some(name) {
        return Err(ApiError::bad_request(
            "metadata.name: the name of a patched object cannot change",
        ));
    }
    let manager = ctx.manager("");
    let out = write(
        ctx,
        &mut st,
        "patch",
        Some(old),
        target,
        &manager,
        status_only,
    )?;
    drop(st);
    respond(ctx, 200, &out)
}

/// The JSON type name Go's `encoding/json` reports for `v`.
fn go_json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The patch document has the shape its type needs, else the real server's
/// 400: merge patches, strategic merge patches and apply configurations are
/// objects, a JSON patch is a list of operation objects.
fn check_patch_shape(media: &str, doc: &Value) -> ApiResult<()> {
    const MAP: &str = "Go value of type map[string]interface {}";
    let t = go_json_type(doc);
    let msg = match (media, doc) {
        (_, Value::Object(_)) if media != "application/json-patch+json" => return Ok(()),
        ("application/merge-patch+json", Value::Null) => "Invalid JSON Patch".to_string(),
        ("application/merge-patch+json", _) => {
            format!("error decoding patch: json: cannot unmarshal {t} into {MAP}")
        }
        ("application/strategic-merge-patch+json", Value::Null) => return Ok(()),
        ("application/strategic-merge-patch+json", _) => {
            format!("json: cannot unmarshal {t} into {MAP}")
        }
        ("application/apply-patch+yaml", _) => format!(
            "error decoding YAML: error unmarshaling JSON: while decoding JSON: json: cannot unmarshal {t} into {MAP}"
        ),
        ("application/json-patch+json", Value::Array(ops)) => {
            match ops.iter().find(|op| !op.is_object()) {
                None => return Ok(()),
                Some(op) => format!(
                    "error decoding patch: json: cannot unmarshal {} into Go value of type handlers.jsonPatchOp",
                    go_json_type(op)
                ),
            }
        }
        ("application/json-patch+json", Value::Null) => return Ok(()),
        (_, _) => format!(
            "error decoding patch: json: cannot unmarshal {t} into Go value of type []handlers.jsonPatchOp"
        ),
    };
    Err(ApiError::bad_request(msg))
}

/// Compare two objects ignoring `metadata` (and `status` when `ignore_status`).
fn content_equal(a: &Value, b: &Value, ignore_status: bool) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a == b;
    };
    let skip = |k: &String| k == "metadata" || (ignore_status && k == "status");
    let ak: Vec<_> = a.iter().filter(|(k, _)| !skip(k)).collect();
    let bk: Vec<_> = b.iter().filter(|(k, _)| !skip(k)).collect();
    ak == bk
}

/// The common write path: system metadata, subresource rules, type defaults,
/// validation, generation, managedFields, commit (unless dry-run), and post-commit
/// effects (CRD registration, namespace cascade, garbage collection).
fn write(
    ctx: &Ctx,
    st: &mut Store,
    verb: &str,
    old: Option<Arc<Value>>,
    mut obj: Value,
    manager: &str,
    status_only: bool,
) -> ApiResult<Arc<Value>> {
    let info = &ctx.info;
    if info.crd.is_none() {
        // The real server decodes built-in types into Go structs, where a
        // `null` field is simply unset.
        drop_nulls(&mut obj);
    }
    let name = meta_str(&obj, "name").unwrap_or("").to_string();
    let ts = now();
    let status_sub = info.status_subresource(&ctx.version);
    // --- subresource semantics
    if let Some(old) = &old {
        if status_only {
            let mut merged = (**old).clone();
            match obj.get("status") {
                Some(s) => merged["status"] = s.clone(),
                None => {
                    if let Some(m) = merged.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
            // Status writes may not change metadata other than managedFields.
            if let Some(mf) = obj.pointer("/metadata/managedFields") {
                merged["metadata"]["managedFields"] = mf.clone();
            }
            obj = merged;
        } else if status_sub {
            match old.get("status") {
                Some(s) => obj["status"] = s.clone(),
                None => {
                    if let Some(m) = obj.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
        }
    } else if status_sub
        && info.crd.is_some()
        && let Some(m) = obj.as_object_mut()
    {
        m.remove("status");
    }
    // --- system metadata
    {
        let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) else {
            return Err(ApiError::bad_request("metadata must be an object"));
        };
        meta.remove("resourceVersion");
        match &old {
            Some(old) => {
                for f in [
                    "uid",
                    "creationTimestamp",
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                    "generation",
                ] {
                    match old.pointer(&format!("/metadata/{f}")) {
                        Some(v) => {
                            meta.insert(f.to_string(), v.clone());
                        }
                        None => {
                            meta.remove(f);
                        }
                    }
                }
                if !meta.contains_key("managedFields")
                    && let Some(mf) = old.pointer("/metadata/managedFields")
                {
                    meta.insert("managedFields".into(), mf.clone());
                }
            }
            None => {
                meta.insert("uid".into(), json!(uuid::Uuid::new_v4().to_string()));
                meta.insert("creationTimestamp".into(), json!(ts));
                meta.remove("deletionTimestamp");
                meta.remove("generation");
            }
        }
    }
    // --- names and namespace
    if old.is_none() {
        if let Err(msg) = machinery::validate_name(&info.kind, &name) {
            return Err(ApiError::invalid(
                &info.kind,
                &info.group,
                &name,
                vec![Cause::new(
                    "FieldValueInvalid",
                    "metadata.name",
                    format!("Invalid value: {name:?}: {msg}"),
                )],
            ));
        }
        if let Some(ns) = &ctx.namespace {
            if !st
                .objects
                .contains_key(&("/namespaces".to_string(), String::new(), ns.clone()))
            {
                return Err(ApiError::not_found("", "namespaces", ns));
            }
            if let Some(nsobj) =
                st.objects
                    .get(&("/namespaces".to_string(), String::new(), ns.clone()))
                && nsobj.pointer("/metadata/deletionTimestamp").is_some()
            {
                return Err(ApiError::new(
                    403,
                    "Forbidden",
                    format!(
                        "{} {name:?} is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                        info.resource
                    ),
                ));
            }
        }
    }
    // --- labels, type-specific defaults and validation
    let causes = machinery::validate_labels(&obj);
    if !causes.is_empty() {
        return Err(ApiError::invalid(&info.kind, &info.group, &name, causes));
    }
    crate::types::admit(
        info,
        &ctx.version,
        old.as_deref(),
        &mut obj,
        st,
        ctx.q("fieldValidation"),
    )?;
    // --- generation
    if info.has_generation {
        let generation = match &old {
            None => 1,
            Some(old) => {
                let g = old
                    .pointer("/metadata/generation")
                    .and_then(Value::as_i64)
                    .unwrap_or(1);
                if content_equal(old, &obj, status_sub) {
                    g
                } else {
                    g + 1
                }
            }
        };
        obj["metadata"]["generation"] = json!(generation);
    }
    // --- managed fields
    if !manager.is_empty() {
        machinery::record_update(
            old.as_deref(),
            &mut obj,
            manager,
            &ts,
            &ctx.fields_api_version(),
        );
    }
    // A no-op update does not bump the revision (like the real server).
    if let Some(old) = &old
        && same_content(&obj, old)
    {
        return Ok(old.clone());
    }
    if ctx.dry_run() {
        return Ok(Arc::new(obj));
    }
    if encoded_len(&obj) > MAX_OBJECT {
        return Err(ApiError::new(500, "", "etcdserver: request is too large"));
    }
    // --- finalizers: an object being deleted goes once its finalizers are gone
    let finalize = old.is_some()
        && obj.pointer("/metadata/deletionTimestamp").is_some()
        && obj
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_none_or(|a| a.is_empty());
    let rv = st.next_rv();
    obj["metadata"]["resourceVersion"] = json!(rv.to_string());
    let key = ctx.key(&name);
    let etype = if old.is_some() {
        EventType::Modified
    } else {
        EventType::Added
    };
    let obj = Arc::new(obj);
    st.commit(rv, etype, key.clone(), old.clone(), obj.clone());
    record(ctx, st, verb, &name, rv);
    after_write(st, info, &obj, false)?;
    if finalize {
        // The last finalizer is gone: the object goes now (the write above is the
        // final state watchers see before DELETED).
        let last = finish_delete(&ctx.sh, st, &ctx.user.name, info, key, obj, false);
        return Ok(Arc::new(last));
    }
    Ok(obj)
}

/// A custom resource as the real server decodes a request body (and a
/// patched object): `null`s of fields that are not nullable and have no
/// default are dropped. (The result of a server-side apply is not decoded
/// again: it keeps them, and its schema may refuse them.)
fn decoded(ctx: &Ctx, obj: &mut Value) {
    if let Some(schema) = ctx
        .info
        .crd
        .as_ref()
        .and_then(|c| c.versions.get(&ctx.version))
        .and_then(|v| v.schema.as_ref())
    {
        schema.prune_non_nullable_nulls(obj);
    }
}

/// Removes the `null` members of every object in `v` (not list items).
fn drop_nulls(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.retain(|_, c| !c.is_null());
            m.values_mut().for_each(drop_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(drop_nulls),
        _ => {}
    }
}

/// The length of `v` as JSON, without building the text.
fn encoded_len(v: &Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Count(0);
    let _ = serde_json::to_writer(&mut c, v);
    c.0
}

/// Whether a write changes nothing: equal except `metadata.resourceVersion` and
/// the `time` of managedFields entries (compared without cloning).
fn same_content(new: &Value, old: &Value) -> bool {
    let (Some(n), Some(o)) = (new.as_object(), old.as_object()) else {
        return new == old;
    };
    if n.len() != o.len() {
        return false;
    }
    for (k, nv) in n {
        let Some(ov) = o.get(k) else { return false };
        if k != "metadata" {
            if nv != ov {
                return false;
            }
            continue;
        }
        let (Some(nm), Some(om)) = (nv.as_object(), ov.as_object()) else {
            return nv == ov;
        };
        let skip = |k: &String| k == "resourceVersion";
        if nm.keys().filter(|k| !skip(k)).count() != om.keys().filter(|k| !skip(k)).count() {
            return false;
        }
        for (mk, mv) in nm.iter().filter(|(k, _)| !skip(k)) {
            let Some(omv) = om.get(mk) else { return false };
            let equal = if mk == "managedFields" {
                managed_fields_equal(mv, omv)
            } else {
                mv == omv
            };
            if !equal {
                return false;
            }
        }
    }
    true
}

fn managed_fields_equal(a: &Value, b: &Value) -> bool {
    match (a.as_array(), b.as_array()) {
        (Some(a), Some(b)) => {
            a.len() == b.len()
                && a.iter()
                    .zip(b)
                    .all(|(x, y)| match (x.as_object(), y.as_object()) {
                        (Some(x), Some(y)) => {
                            x.iter().filter(|(k, _)| *k != "time").count()
                                == y.iter().filter(|(k, _)| *k != "time").count()
                                && x.iter()
                                    .filter(|(k, _)| *k != "time")
                                    .all(|(k, v)| y.get(k) == Some(v))
                        }
                        _ => x == y,
                    })
        }
        _ => a == b,
    }
}

fn record(ctx: &Ctx, st: &mut Store, verb: &str, name: &str, rv: u64) {
    record_raw(
        st,
        &ctx.sh,
        &ctx.user.name,
        verb,
        &ctx.info,
        ctx.namespace.as_deref().unwrap_or(""),
        name,
        rv,
    );
}

#[allow(clippy::too_many_arguments)]
fn record_raw(
    st: &mut Store,
    sh: &Shared,
    user: &str,
    verb: &str,
    info: &ResourceInfo,
    ns: &str,
    name: &str,
    rv: u64,
) {
    let time_nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    st.record_write(WriteRecord {
        time_nanos,
        verb: verb.to_string(),
        group: info.group.clone(),
        resource: info.resource.clone(),
        namespace: ns.to_string(),
        name: name.to_string(),
        resource_version: rv.to_string(),
        user: user.to_string(),
    });
    sh.count_write(&info.resource);
    sh.rv_tx.send_replace(rv);
}

/// Effects of a committed write on the registry.
fn after_write(st: &mut Store, info: &ResourceInfo, obj: &Value, deleted: bool) -> ApiResult<()> {
    if info.resource == "customresourcedefinitions" && info.group == "apiextensions.k8s.io" {
        if deleted {
            if let (Some(g), Some(p)) = (
                obj.pointer("/spec/group").and_then(Value::as_str),
                obj.pointer("/spec/names/plural").and_then(Value::as_str),
            ) {
                st.registry.remove(g, p);
            }
        } else if obj.pointer("/metadata/deletionTimestamp").is_none() {
            let ri = registry::from_crd(obj).map_err(ApiError::bad_request)?;
            st.registry.add_crd(ri);
        }
    }
    Ok(())
}

/// Remove an object now (no finalizers left): DELETED event, then cascade to
/// namespace contents and garbage-collect dependents.
fn remove_now(st: &mut Store, info: &ResourceInfo, key: Key, obj: Arc<Value>) -> Value {
    let rv = st.next_rv();
    let mut last = (*obj).clone();
    last["metadata"]["resourceVersion"] = json!(rv.to_string());
    let last = Arc::new(last);
    st.commit(rv, EventType::Deleted, key, Some(obj), last.clone());
    let _ = after_write(st, info, &last, true);
    (*last).clone()
}

/// Remove an object, record the delete, then orphan or collect its dependents
/// (and a namespace's contents, a CRD's objects).
fn finish_delete(
    sh: &Shared,
    st: &mut Store,
    user: &str,
    info: &ResourceInfo,
    key: Key,
    obj: Arc<Value>,
    orphan: bool,
) -> Value {
    let last = remove_now(st, info, key.clone(), obj);
    let rv = st.rv;
    record_raw(st, sh, user, "delete", info, &key.1, &key.2, rv);
    // As the real Service storage's afterDelete hook: deleting a Service
    // deletes the Endpoints of the same name (an internal write, no request).
    if info.group.is_empty() && info.resource == "services" {
        let ep_key: Key = ("/endpoints".to_string(), key.1.clone(), key.2.clone());
        if st.objects.contains_key(&ep_key)
            && let Some(ri) = st.registry.get("", "endpoints")
        {
            delete_key(sh, st, "system:apiserver", &ri, ep_key, false, false);
        }
    }
    if orphan {
        orphan_dependents(sh, st, &last);
    } else {
        for (ri, k) in collect_cascade(st, &last, info) {
            delete_key(
                sh,
                st,
                "system:serviceaccount:kube-system:generic-garbage-collector",
                &ri,
                k,
                false,
                false,
            );
        }
    }
    last
}

/// Objects to delete after `deleted` is gone: namespace contents and
/// dependents whose owners are all gone. Returns keys with their resource info.
fn collect_cascade(
    st: &Store,
    deleted: &Value,
    info: &ResourceInfo,
) -> Vec<(Arc<ResourceInfo>, Key)> {
    let mut out = Vec::new();
    if info.resource == "namespaces" && info.group.is_empty() {
        let ns = meta_str(deleted, "name").unwrap_or("");
        for (k, _) in st
            .objects
            .iter()
            .filter(|(k, _)| k.1 == ns && !ns.is_empty())
        {
            if let Some((g, r)) = k.0.split_once('/')
                && let Some(ri) = st.registry.get(g, r)
            {
                out.push((ri, k.clone()));
            }
        }
        return out;
    }
    if info.resource == "customresourcedefinitions" && info.group == "apiextensions.k8s.io" {
        // The registry entry is already gone; rebuild it from the deleted CRD.
        if let Ok(ri) = registry::from_crd(deleted) {
            let ri = Arc::new(ri);
            for (k, _) in st.range(&ri.key(), None) {
                out.push((ri.clone(), k.clone()));
            }
        }
    }
    let Some(uid) = meta_str(deleted, "uid") else {
        return out;
    };
    // As the real garbage collector, an owner reference is live only when
    // an object of its kind and name has its uid (a reference naming
    // another object is dangling).
    let live: HashMap<&str, (&str, &str)> = st
        .objects
        .values()
        .filter_map(|o| {
            Some((
                meta_str(o, "uid")?,
                (
                    meta_str(o, "name").unwrap_or(""),
                    o.get("kind").and_then(Value::as_str).unwrap_or(""),
                ),
            ))
        })
        .collect();
    let is_live = |r: &Value| {
        let s = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or("");
        live.get(s("uid"))
            .is_some_and(|(name, kind)| *name == s("name") && *kind == s("kind"))
    };
    for (k, o) in &st.objects {
        let Some(refs) = o
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
        else {
            continue;
        };
        if !refs
            .iter()
            .any(|r| r.get("uid").and_then(Value::as_str) == Some(uid))
        {
            continue;
        }
        let all_gone = refs.iter().all(|r| !is_live(r));
        if all_gone
            && let Some((g, r)) = k.0.split_once('/')
            && let Some(ri) = st.registry.get(g, r)
        {
            out.push((ri, k.clone()));
        }
    }
    out
}

/// Delete one object (honouring finalizers) and cascade. Returns the final state.
fn delete_key(
    sh: &Shared,
    st: &mut Store,
    user: &str,
    info: &ResourceInfo,
    key: Key,
    dry_run: bool,
    orphan: bool,
) -> Option<(Value, bool)> {
    let obj = st.objects.get(&key).cloned()?;
    if dry_run {
        return Some(((*obj).clone(), true));
    }
    let has_finalizers = obj
        .pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|a| !a.is_empty());
    if has_finalizers {
        if obj.pointer("/metadata/deletionTimestamp").is_some() {
            return Some(((*obj).clone(), false));
        }
        let mut o = (*obj).clone();
        o["metadata"]["deletionTimestamp"] = json!(now());
        o["metadata"]["deletionGracePeriodSeconds"] = json!(0);
        let rv = st.next_rv();
        o["metadata"]["resourceVersion"] = json!(rv.to_string());
        let o = Arc::new(o);
        st.commit(rv, EventType::Modified, key.clone(), Some(obj), o.clone());
        record_raw(st, sh, user, "delete", info, &key.1, &key.2, rv);
        return Some(((*o).clone(), false));
    }
    let last = finish_delete(sh, st, user, info, key, obj, orphan);
    Some((last, true))
}

fn orphan_dependents(sh: &Shared, st: &mut Store, deleted: &Value) {
    let Some(uid) = meta_str(deleted, "uid").map(str::to_string) else {
        return;
    };
    let keys: Vec<Key> = st
        .objects
        .iter()
        .filter(|(_, o)| {
            o.pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .is_some_and(|a| {
                    a.iter()
                        .any(|r| r.get("uid").and_then(Value::as_str) == Some(uid.as_str()))
                })
        })
        .map(|(k, _)| k.clone())
        .collect();
    for k in keys {
        let Some(old) = st.objects.get(&k).cloned() else {
            continue;
        };
        let mut o = (*old).clone();
        if let Some(a) = o
            .pointer_mut("/metadata/ownerReferences")
            .and_then(Value::as_array_mut)
        {
            a.retain(|r| r.get("uid").and_then(Value::as_str) != Some(uid.as_str()));
        }
        let rv = st.next_rv();
        o["metadata"]["resourceVersion"] = json!(rv.to_string());
        st.commit(rv, EventType::Modified, k.clone(), Some(old), Arc::new(o));
        if let Some((g, r)) = k.0.split_once('/')
            && let Some(ri) = st.registry.get(g, r)
        {
            record_raw(
                st,
                sh,
                "system:serviceaccount:kube-system:generic-garbage-collector",
                "update",
                &ri,
                &k.1,
                &k.2,
                rv,
            );
        }
    }
}

/// (orphan dependents, preconditions, dry run) from query and DeleteOptions body.
fn delete_options(ctx: &Ctx, body: &[u8]) -> ApiResult<(bool, Option<Value>, bool)> {
    let mut policy = ctx.q("propagationPolicy").map(str::to_string);
    let mut preconditions = None;
    let mut dry_run = ctx.dry_run();
    if !body.iter().all(u8::is_ascii_whitespace) {
        let opts: Value = if body.starts_with(b"k8s\0") {
            crate::protobuf::decode(body)
                .map_err(|(_, m)| ApiError::bad_request(format!("invalid DeleteOptions: {m}")))?
        } else {
            serde_json::from_slice(body)
                .map_err(|e| ApiError::bad_request(format!("invalid DeleteOptions: {e}")))?
        };
        if let Some(p) = opts.get("propagationPolicy").and_then(Value::as_str) {
            policy = Some(p.to_string());
        }
        if opts.get("orphanDependents").and_then(Value::as_bool) == Some(true) {
            policy = Some("Orphan".into());
        }
        preconditions = opts.get("preconditions").cloned();
        if let Some(dr) = opts.get("dryRun").and_then(Value::as_array) {
            for d in dr {
                match d.as_str() {
                    Some("All") => dry_run = true,
                    other => {
                        return Err(ApiError::bad_request(format!(
                            "dryRun: Unsupported value: {other:?}: supported values: \"All\""
                        )));
                    }
                }
            }
        }
    }
    match policy.as_deref() {
        None | Some("Background" | "Foreground" | "Orphan") => {}
        Some(p) => {
            return Err(ApiError::bad_request(format!(
                "propagationPolicy: Unsupported value: {p:?}"
            )));
        }
    }
    Ok((policy.as_deref() == Some("Orphan"), preconditions, dry_run))
}

fn delete(ctx: &Ctx, name: &str, body: &[u8]) -> ApiResult<Response<Body>> {
    let (orphan, pre, dry_run) = delete_options(ctx, body)?;
    let mut st = ctx.sh.lock();
    let key = ctx.key(name);
    let Some(obj) = st.objects.get(&key).cloned() else {
        return Err(ApiError::not_found(
            &ctx.info.group,
            &ctx.info.resource,
            name,
        ));
    };
    if let Some(pre) = pre {
        if let Some(uid) = pre.get("uid").and_then(Value::as_str)
            && meta_str(&obj, "uid") != Some(uid)
        {
            return Err(ApiError::conflict(
                &ctx.info.group,
                &ctx.info.resource,
                name,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
                    meta_str(&obj, "uid").unwrap_or("")
                ),
            ));
        }
        if let Some(rv) = pre.get("resourceVersion").and_then(Value::as_str)
            && meta_str(&obj, "resourceVersion") != Some(rv)
        {
            return Err(ApiError::conflict(
                &ctx.info.group,
                &ctx.info.resource,
                name,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {}",
                    meta_str(&obj, "resourceVersion").unwrap_or("")
                ),
            ));
        }
    }
    let user = ctx.user.name.clone();
    let Some((last, gone)) = delete_key(&ctx.sh, &mut st, &user, &ctx.info, key, dry_run, orphan)
    else {
        return Err(ApiError::not_found(
            &ctx.info.group,
            &ctx.info.resource,
            name,
        ));
    };
    drop(st);
    if !gone || ctx.info.crd.is_some() {
        return ok_json(200, &present(&ctx.info, &ctx.version, &last));
    }
    ok_json(
        200,
        &success_status(
            &ctx.info.group,
            &ctx.info.resource,
            name,
            meta_str(&last, "uid").unwrap_or(""),
        ),
    )
}

fn delete_collection(ctx: &Ctx, body: &[u8]) -> ApiResult<Response<Body>> {
    let (orphan, _, dry_run) = delete_options(ctx, body)?;
    let (label, field) = selectors(ctx)?;
    let mut st = ctx.sh.lock();
    let res = convert::store_key(&ctx.info);
    let keys: Vec<Key> = st
        .range(&res, ctx.namespace.as_deref())
        .filter(|(_, o)| label.matches(o) && field.matches(o))
        .map(|(k, _)| k.clone())
        .collect();
    let user = ctx.user.name.clone();
    let mut items = Vec::new();
    for k in keys {
        if let Some((last, _)) = delete_key(&ctx.sh, &mut st, &user, &ctx.info, k, dry_run, orphan)
        {
            items.push(list_item(
                &ctx.info,
                present(&ctx.info, &ctx.version, &last),
            ));
        }
    }
    let rv = st.rv;
    drop(st);
    ok_json(
        200,
        &json!({"kind": ctx.info.list_kind, "apiVersion": ctx.api_version(), "metadata": {"resourceVersion": rv.to_string()}, "items": items}),
    )
}

/// `POST .../serviceaccounts/<name>/token`: a TokenRequest, answered with a bearer
/// token that authenticates as the ServiceAccount.
fn token_request(ctx: &Ctx, name: &str, body: &[u8]) -> ApiResult<Response<Body>> {
    let ns = ctx.namespace.clone().unwrap_or_default();
    if !ctx.sh.lock().objects.contains_key(&ctx.key(name)) {
        return Err(ApiError::not_found("", "serviceaccounts", name));
    }
    let mut req: Value = if body.is_empty() {
        json!({})
    } else {
        parse_body(ctx, body)?
    };
    let token = crate::issue_token_on(&ctx.sh, &ns, name);
    let expiration = req
        .pointer("/spec/expirationSeconds")
        .and_then(Value::as_i64)
        .unwrap_or(3600);
    let exp = jiff::Timestamp::now()
        .checked_add(jiff::SignedDuration::from_secs(expiration))
        .unwrap_or_else(|_| jiff::Timestamp::now())
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    req["apiVersion"] = json!("authentication.k8s.io/v1");
    req["kind"] = json!("TokenRequest");
    if !req.get("metadata").is_some_and(Value::is_object) {
        req["metadata"] = json!({});
    }
    req["metadata"]["name"] = json!(name);
    req["metadata"]["namespace"] = json!(ns);
    req["metadata"]["creationTimestamp"] = json!(now());
    if !req.get("spec").is_some_and(Value::is_object) {
        req["spec"] = json!({});
    }
    req["spec"]["expirationSeconds"] = json!(expiration);
    req["status"] = json!({"token": token, "expirationTimestamp": exp});
    ok_json(201, &req)
}

/// `POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews` (`kubectl auth
/// can-i`): evaluates RBAC for the requesting user; nothing is stored.
fn self_subject_access_review(ctx: &Ctx, body: &[u8]) -> ApiResult<Response<Body>> {
    let mut req = parse_body(ctx, body)?;
    let s = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
    let attrs = if let Some(ra) = req.pointer("/spec/resourceAttributes") {
        Attributes {
            verb: s(ra, "verb"),
            api_group: s(ra, "group"),
            resource: s(ra, "resource"),
            subresource: s(ra, "subresource"),
            namespace: s(ra, "namespace"),
            name: s(ra, "name"),
            resource_request: true,
            path: String::new(),
        }
    } else if let Some(na) = req.pointer("/spec/nonResourceAttributes") {
        Attributes {
            verb: s(na, "verb"),
            path: s(na, "path"),
            resource_request: false,
            ..Default::default()
        }
    } else {
        return Err(ApiError::invalid(
            "SelfSubjectAccessReview",
            "authorization.k8s.io",
            "",
            vec![Cause::new(
                "FieldValueRequired",
                "spec.resourceAttributes",
                "exactly one of nonResourceAttributes or resourceAttributes must be specified",
            )],
        ));
    };
    let allowed =
        ctx.user.admin || machinery::authorize(&ctx.user, &attrs, &rbac_snapshot(&ctx.sh.lock()));
    req["status"] = if allowed {
        json!({"allowed": true, "reason": "RBAC: allowed by kube-sim"})
    } else {
        json!({"allowed": false})
    };
    ok_json(201, &req)
}

/// Count a watch as open while the guard lives.
pub struct WatchGuard(pub Arc<Shared>);

impl WatchGuard {
    pub fn new(sh: Arc<Shared>) -> Self {
        sh.open_watches.fetch_add(1, Ordering::SeqCst);
        WatchGuard(sh)
    }
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.0.open_watches.fetch_sub(1, Ordering::SeqCst);
    }
}

#[allow(dead_code)]
fn _object_map(_: Map<String, Value>) {}

/// A YAML request body as JSON, read as YAML 1.2 (`yes` stays a string; a
/// repeated key keeps its last value).
fn yaml_body(body: &[u8]) -> Result<Value, serde_saphyr::Error> {
    // `Options` is non-exhaustive: start from the defaults.
    let mut o = serde_saphyr::Options::default();
    o.strict_booleans = true;
    o.leading_zero_numbers_as_strings = true;
    o.underscored_numbers_as_strings = true;
    o.merge_keys = serde_saphyr::MergeKeyPolicy::AsOrdinary;
    o.duplicate_keys = serde_saphyr::DuplicateKeyPolicy::LastWins;
    o.with_snippet = false;
    serde_saphyr::from_slice_with_options(body, o)
}
