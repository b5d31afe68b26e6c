//! Requests that create nothing in the store: a ServiceAccount TokenRequest
//! (`.../serviceaccounts/<name>/token`) and a SelfSubjectAccessReview
//! (`kubectl auth can-i`), evaluated with the same RBAC as every request.

use axum::body::Body;
use hyper::Response;
use serde_json::{Value, json};

use super::auth::rbac_snapshot;
use super::ctx::{Ctx, now, ok_json, parse_body};
use crate::machinery::{self, Attributes};
use crate::status::{ApiError, ApiResult, Cause};

/// `POST .../serviceaccounts/<name>/token`: a TokenRequest, answered with a bearer
/// token that authenticates as the ServiceAccount.
pub(super) fn token_request(ctx: &Ctx, name: &str, body: &[u8]) -> ApiResult<Response<Body>> {
    let ns = ctx.namespace.clone().unwrap_or_default();
    if !ctx.sh.lock().objects.contains_key(&ctx.key(name)) {
        return Err(ApiError::not_found("", "serviceaccounts", name));
    }
    let mut req: Value = if body.is_empty() {
        json!({})
    } else {
        parse_body(ctx, body)?
    };
    let token = ctx.sh.issue_token(&ns, name);
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
pub(super) fn self_subject_access_review(ctx: &Ctx, body: &[u8]) -> ApiResult<Response<Body>> {
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
