//! HTTP answers that are not a resource's own: a JSON body, and an error as
//! the real API server sends it (a `Status`, or the plain-text 404 outside the
//! API groups, with `Retry-After` when the error carries one).

use axum::body::Body;
use hyper::Response;
use serde_json::Value;

use crate::status::ApiError;

/// A JSON response.
pub fn json_response(code: u16, body: &Value) -> hyper::Response<Body> {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    hyper::Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(bytes))
        .unwrap_or_else(|_| hyper::Response::new(Body::empty()))
}

/// The answer to a failed request.
pub fn error_response(e: &ApiError) -> Response<Body> {
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
