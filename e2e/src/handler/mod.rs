//! Request handling: authentication, routing, authorization, faults, and the verbs.
//!
//! Every request goes through the same steps:
//! ```text
//! token -> user (401) -> route (404) -> verb -> RBAC (403) -> stats + faults
//!       -> verb handler (get/list/watch/create/update/patch/delete/...) -> JSON or Status
//! ```
//! This module is the entry point ([`handle`]) and the dispatch; each step
//! and each verb lives in a submodule, and the submodules depend only on
//! each other in one direction (never on this one):
//!
//! ```text
//!  mod.rs ─► route, auth, sim_hooks, review, read, watch, create_update, patch, delete
//!  create_update, patch ─► commit ─► gc ─► record      delete ─► gc, read
//!  everything ─► ctx (the request context, body decoding, answers)
//! ```
//!
//! Writes run entirely under the store lock: read the live object, compute the new
//! one (patch / server-side apply / defaults / schema), check preconditions, stamp
//! the next revision, commit. That keeps `resourceVersion` preconditions exact.

mod auth;
mod commit;
mod create_update;
mod ctx;
mod delete;
mod gc;
mod patch;
mod read;
mod record;
mod review;
mod route;
mod sim_hooks;
mod watch;

use std::collections::HashMap;
use std::sync::Arc;

use axum::body::Body;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{HeaderMap, Method, Request, Response};

use self::auth::{authorize, bearer};
use self::ctx::{Ctx, parse_accept};
pub use self::route::fault_target;
use self::route::{ResPath, Route, not_served, parse_query, route, unknown_path, verb_for};
pub use self::sim_hooks::store_unvalidated;
use crate::discovery;
use crate::faults::injected_failure;
use crate::machinery::{Attributes, User};
use crate::registry::ResourceInfo;
use crate::response::{error_response, json_response};
use crate::state::SimState;
use crate::status::{ApiError, ApiResult};

/// Largest accepted request body (the real server's `--max-request-bytes`
/// default, 3 MiB).
const MAX_BODY: usize = 3 * 1024 * 1024;

/// Entry point for every HTTP request.
pub async fn handle(sh: Arc<SimState>, req: Request<Incoming>) -> Response<Body> {
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

async fn apply_faults(sh: &SimState, verb: &str, resource: &str) -> ApiResult<()> {
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

async fn handle_inner(sh: &Arc<SimState>, req: Request<Incoming>) -> ApiResult<Response<Body>> {
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
            return sim_hooks::sim_hook(sh, &parts.method, &hook, &query, &body);
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

async fn resource_request(
    sh: &Arc<SimState>,
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
        warnings: Default::default(),
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
        "get" => read::get(&ctx, &name),
        "list" => read::list(&ctx),
        "watch" => watch::start(&ctx),
        "create" if ctx.sub.as_deref() == Some("token") => {
            review::token_request(&ctx, &name, &body)
        }
        "create" if ctx.info.resource == "selfsubjectaccessreviews" => {
            review::self_subject_access_review(&ctx, &body)
        }
        "create" => create_update::create(&ctx, &body),
        "update" => create_update::update(&ctx, &name, &body),
        "patch" => patch::patch(&ctx, &name, &body),
        "delete" => delete::delete(&ctx, &name, &body),
        "deletecollection" => delete::delete_collection(&ctx, &body),
        _ => Err(ApiError::method_not_allowed(verb)),
    };
    let warnings = std::mem::take(
        &mut *ctx
            .warnings
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    let deprecation = deprecation_warning(&ctx.info, &ctx.version);
    if deprecation.is_none() && warnings.is_empty() {
        return result;
    }
    // The real server adds warnings to every answer of the resource's
    // handler, errors included: the deprecation first, then what the
    // request itself was warned about (unknown fields).
    let mut resp = result.unwrap_or_else(|e| error_response(&e));
    let h = resp.headers_mut();
    if let Some(warning) = deprecation {
        h.append("warning", http::HeaderValue::from_static(warning));
    }
    for w in warnings {
        if let Ok(v) = http::HeaderValue::from_str(&w) {
            h.append("warning", v);
        }
    }
    Ok(resp)
}

/// The `Warning` header the real server (v1.34) sends for a deprecated
/// resource version kube-sim serves: v1 Endpoints (deprecated in v1.33).
fn deprecation_warning(info: &ResourceInfo, version: &str) -> Option<&'static str> {
    (info.group.is_empty() && info.resource == "endpoints" && version == "v1").then_some(
        "299 - \"v1 Endpoints is deprecated in v1.33+; use discovery.k8s.io/v1 EndpointSlice\"",
    )
}
