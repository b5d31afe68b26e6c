//! `Status` errors, shaped exactly like the real API server's.
//!
//! Every failure kube-sim returns is a `meta/v1 Status` object with a `reason` and a
//! `code` that clients (kubectl, helm, kube-rs) interpret, e.g. `NotFound`/404,
//! `AlreadyExists`/409, `Conflict`/409, `Invalid`/422, `Forbidden`/403, `Expired`/410.

use serde_json::{Value, json};

/// An API error: rendered as a `Status` body with the given HTTP code.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message} ({code} {reason})")]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// `Status.reason` (`NotFound`, `Conflict`, ...; empty for none).
    pub reason: &'static str,
    /// `Status.message`.
    pub message: String,
    /// `Status.details` (name, group, kind, causes).
    pub details: Option<Value>,
    /// `Retry-After` header value in seconds (429/503 faults).
    pub retry_after: Option<u64>,
    /// Answer with the plain-text `404 page not found` of a path no API
    /// serves instead of a `Status` ([`ApiError::page_not_found`]).
    pub plain_text: bool,
}

/// `Status.details` naming an object: `group` is left out when empty (the
/// core group), as the real server's `omitempty` does.
fn details(name: &str, group: &str, kind: &str) -> Value {
    let mut d = json!({"name": name, "kind": kind});
    if !group.is_empty() {
        d["group"] = json!(group);
    }
    d
}

impl ApiError {
    /// An error with `code`, `reason` and `message` and no details.
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
            retry_after: None,
            plain_text: false,
        }
    }

    /// Set `Status.details`.
    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// `<resource>[.<group>] "<name>" not found`
    pub fn not_found(group: &str, resource: &str, name: &str) -> Self {
        let qualified = qualified(group, resource);
        Self::new(404, "NotFound", format!("{qualified} \"{name}\" not found"))
            .with_details(details(name, group, resource))
    }

    /// The generic 404 `Status` for resources and paths of the API groups
    /// (`/api/...`, `/apis/<built-in group>/...`) that are not served.
    pub fn no_route() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
        .with_details(json!({}))
    }

    /// The plain-text `404 page not found` of the real server for paths
    /// outside its API groups: an unknown group (or a custom resource
    /// group's unknown version or resource), a path of no API at all.
    pub fn page_not_found() -> Self {
        let mut e = Self::new(404, "NotFound", "404 page not found");
        e.plain_text = true;
        e
    }

    /// 409 `AlreadyExists` for the object `name`.
    pub fn already_exists(group: &str, resource: &str, name: &str) -> Self {
        let qualified = qualified(group, resource);
        Self::new(
            409,
            "AlreadyExists",
            format!("{qualified} \"{name}\" already exists"),
        )
        .with_details(details(name, group, resource))
    }

    /// 409 `Conflict` on the object `name` (`why`: e.g. a stale resourceVersion).
    pub fn conflict(group: &str, resource: &str, name: &str, why: &str) -> Self {
        let qualified = qualified(group, resource);
        Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {qualified} \"{name}\": {why}"),
        )
        .with_details(details(name, group, resource))
    }

    /// 400 `BadRequest`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 405 `MethodNotAllowed`.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    /// 415 `UnsupportedMediaType` for a body of `content_type`.
    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml (got {content_type:?})"
            ),
        )
    }

    /// 406 `NotAcceptable`: the `Accept` header allows no JSON.
    pub fn not_acceptable() -> Self {
        Self::new(
            406,
            "NotAcceptable",
            "only the following media types are accepted: application/json, application/yaml",
        )
    }

    /// 413 `RequestEntityTooLarge` for a body over `limit` bytes.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            format!("Request entity too large: limit is {limit}"),
        )
    }

    /// 410 `Expired`: `requested` is older than the `oldest` revision kept.
    pub fn gone(requested: u64, oldest: u64) -> Self {
        Self::new(
            410,
            "Expired",
            format!("too old resource version: {requested} ({oldest})"),
        )
    }

    /// 504 `Timeout` for a `resourceVersion` newer than the store's, as the real
    /// server's `storage.NewTooLargeResourceVersionError` (which answers after
    /// waiting ~3 s for the store to catch up; kube-sim answers at once).
    pub fn too_large_rv(requested: u64, current: u64) -> Self {
        let mut e = Self::new(
            504,
            "Timeout",
            format!("Timeout: Too large resource version: {requested}, current: {current}"),
        )
        .with_details(json!({"causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}]}));
        e.retry_after = Some(1);
        e
    }

    /// 401 `Unauthorized`: an unknown bearer token.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// 500 `InternalError`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            500,
            "InternalError",
            format!("Internal error occurred: {}", message.into()),
        )
    }

    /// 422 Invalid: `<Kind>.<group> "<name>" is invalid: [field: kind: message, ...]`.
    pub fn invalid(kind: &str, group: &str, name: &str, causes: Vec<Cause>) -> Self {
        let qualified = if group.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}.{group}")
        };
        let list: Vec<String> = causes.iter().map(|c| c.text()).collect();
        let joined = if list.len() == 1 {
            list[0].clone()
        } else {
            format!("[{}]", list.join(", "))
        };
        let causes_json: Vec<Value> = causes
            .iter()
            .map(|c| json!({"reason": c.reason, "message": c.body(), "field": c.field}))
            .collect();
        let mut d = details(name, group, kind);
        d["causes"] = json!(causes_json);
        Self::new(
            422,
            "Invalid",
            format!("{qualified} \"{name}\" is invalid: {joined}"),
        )
        .with_details(d)
    }

    /// The `Status` object the client receives.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "code": self.code,
        });
        // (A storage error passed on has no reason.)
        if !self.reason.is_empty() {
            status["reason"] = json!(self.reason);
        }
        if let Some(d) = &self.details {
            status["details"] = d.clone();
        }
        if let Some(seconds) = self.retry_after {
            let details = status["details"].as_object().cloned().unwrap_or_default();
            let mut details = Value::Object(details);
            details["retryAfterSeconds"] = json!(seconds);
            status["details"] = details;
        }
        status
    }
}

/// One field-level cause of an `Invalid` error.
#[derive(Debug, Clone)]
pub struct Cause {
    /// `FieldValueRequired`, `FieldValueInvalid`, `FieldValueNotSupported`, ...
    pub reason: String,
    /// The field path (`metadata.name`, `spec.ports[0].port`, ...).
    pub field: String,
    /// What is wrong with the field.
    pub message: String,
}

impl Cause {
    /// A cause of `reason` on `field`.
    pub fn new(reason: &str, field: &str, message: impl Into<String>) -> Self {
        Cause {
            reason: reason.to_string(),
            field: field.to_string(),
            message: message.into(),
        }
    }

    /// The error text after the field (`Required value: ...`), as the real
    /// server puts it in `Status.details.causes[].message`.
    fn body(&self) -> String {
        let kind = match self.reason.as_str() {
            "FieldValueRequired" => "Required value",
            "FieldValueNotSupported" => "Unsupported value",
            "FieldValueForbidden" => "Forbidden",
            "FieldValueDuplicate" => "Duplicate value",
            "FieldValueTooLong" => "Too long",
            "FieldValueTypeInvalid" => "Invalid value",
            _ => "Invalid value",
        };
        const PREFIXES: &[&str] = &[
            "Required value",
            "Unsupported value",
            "Forbidden",
            "Duplicate value",
            "Too long",
            "Too many",
            "Invalid value",
        ];
        if PREFIXES.iter().any(|p| self.message.starts_with(p)) {
            self.message.clone()
        } else if self.message.is_empty() {
            kind.to_string()
        } else {
            format!("{kind}: {}", self.message)
        }
    }

    fn text(&self) -> String {
        let detail = self.body();
        if self.field.is_empty() {
            detail
        } else {
            format!("{}: {detail}", self.field)
        }
    }
}

/// `configmaps` or `endpointslices.discovery.k8s.io`.
pub fn qualified(group: &str, resource: &str) -> String {
    if group.is_empty() {
        resource.to_string()
    } else {
        format!("{resource}.{group}")
    }
}

/// A `Status` of `Success` (DELETE responses).
pub fn success_status(group: &str, resource: &str, name: &str, uid: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success",
        "details": {"name": name, "group": group, "kind": resource, "uid": uid},
    })
}

/// A result whose error is answered as a `Status`.
pub type ApiResult<T> = Result<T, ApiError>;
