//! Safe summaries of API errors for `/readyz` (unauthenticated), log lines
//! and Events: the kind of failure, the HTTP status and reason, never the raw
//! error text. kube-client's errors may carry what must not leak: an exec
//! credential plugin's stdout and stderr (`AuthExecRun`, the plugin's
//! output may hold a token), a plugin's unparsable output, a kubeconfig's
//! auth provider details.
//!
//! Two guards: every client of the controller reduces an authentication
//! error to [`CredentialsUnavailable`] where it arises ([`credentials`], a
//! layer of [`crate::k8s::client::client`], and at the client's construction,
//! which runs an exec plugin once), so no code path can print one; and the
//! watch paths report [`watch`] / [`watch_detail`] (a fixed phrase per error
//! kind) instead of the error's `Display`.

use std::error::Error as StdError;

use kube::client::AuthError;
use kube::runtime::watcher;

/// The longest API server message a log line carries.
const MESSAGE_LIMIT: usize = 300;

/// What every authentication error of a client is reduced to: the client's
/// credentials could not be obtained (a token file, an exec credential
/// plugin, an auth provider). The cause is not shown: it may contain the
/// plugin's output or a credential.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "authentication failed: the client credentials could not be obtained (token file, exec credential plugin or auth provider of the kubeconfig); the cause is not shown as it may contain secrets"
)]
pub struct CredentialsUnavailable;

/// Whether `e` or one of its sources is an authentication error.
fn is_auth(e: &(dyn StdError + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(e) = cur {
        if e.is::<AuthError>() || e.is::<CredentialsUnavailable>() {
            return true;
        }
        if let Some(k) = e.downcast_ref::<kube::Error>()
            && matches!(k, kube::Error::Auth(_))
        {
            return true;
        }
        cur = e.source();
    }
    false
}

/// The error a client's service stack hands back, with an authentication
/// error (anywhere in its sources) replaced by [`CredentialsUnavailable`].
pub fn credentials(e: tower::BoxError) -> tower::BoxError {
    if is_auth(&*e) {
        Box::new(CredentialsUnavailable)
    } else {
        e
    }
}

/// A kube error with an authentication error replaced (for errors that
/// did not pass the client's layer: building the client runs an exec
/// plugin once).
pub fn kube_credentials(e: kube::Error) -> kube::Error {
    if is_auth(&e) {
        kube::Error::Service(Box::new(CredentialsUnavailable))
    } else {
        e
    }
}

/// A fixed phrase for a transport error: what failed, from the error's
/// types, never its text.
fn transport(e: &(dyn StdError + 'static)) -> String {
    if is_auth(e) {
        return "authentication failed (credentials could not be obtained)".to_string();
    }
    let mut cur = Some(e);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return format!("connection error ({})", io.kind());
        }
        cur = e.source();
    }
    "request failed (no answer)".to_string()
}

/// A kube error as `<status> <reason>` (an answer of the API server) or a
/// fixed phrase naming the kind of failure.
pub fn kube(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => status(s),
        kube::Error::Auth(_) => "authentication failed (credentials could not be obtained)".into(),
        kube::Error::SerdeError(_) | kube::Error::FromUtf8(_) => {
            "the answer could not be decoded".into()
        }
        kube::Error::ReadEvents(io) => format!("reading the answer failed ({})", io.kind()),
        kube::Error::HttpError(_) | kube::Error::BuildRequest(_) => {
            "the request could not be built".into()
        }
        kube::Error::HyperError(h) => transport(h),
        kube::Error::Service(s) => transport(&**s),
        kube::Error::RustlsTls(_) => "TLS error".into(),
        _ => "request failed".into(),
    }
}

/// `403 Forbidden` (code and reason of a Status).
fn status(s: &kube::core::Status) -> String {
    if s.reason.is_empty() {
        s.code.to_string()
    } else {
        format!("{} {}", s.code, s.reason)
    }
}

/// [`kube`] plus, for an answer of the API server, its message (cut to a
/// few hundred bytes): what a log line shows. An API server's message
/// names the user and the resource (`... is forbidden: User "x" cannot list
/// resource "endpointslices" ...`), never a credential.
pub fn kube_detail(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => with_message(s),
        other => kube(other),
    }
}

fn with_message(s: &kube::core::Status) -> String {
    let mut m = s.message.clone();
    if m.len() > MESSAGE_LIMIT {
        let mut at = MESSAGE_LIMIT;
        while !m.is_char_boundary(at) {
            at -= 1;
        }
        m.truncate(at);
        m.push_str("...");
    }
    if m.is_empty() {
        status(s)
    } else {
        format!("{}: {m}", status(s))
    }
}

/// A watcher error for `/readyz`: the step that failed and [`kube`].
pub fn watch(e: &watcher::Error) -> String {
    match e {
        watcher::Error::InitialListFailed(k) => format!("list failed: {}", kube(k)),
        watcher::Error::WatchStartFailed(k) => format!("watch start failed: {}", kube(k)),
        watcher::Error::WatchError(s) => format!("watch error: {}", status(s)),
        watcher::Error::WatchFailed(k) => format!("watch stream failed: {}", kube(k)),
        watcher::Error::NoResourceVersion => {
            "the list had no resourceVersion (the resource does not support watch?)".into()
        }
    }
}

/// [`watch`] with the API server's message ([`kube_detail`]): for logs.
pub fn watch_detail(e: &watcher::Error) -> String {
    match e {
        watcher::Error::InitialListFailed(k) => format!("list failed: {}", kube_detail(k)),
        watcher::Error::WatchStartFailed(k) => format!("watch start failed: {}", kube_detail(k)),
        watcher::Error::WatchError(s) => format!("watch error: {}", with_message(s)),
        watcher::Error::WatchFailed(k) => format!("watch stream failed: {}", kube_detail(k)),
        watcher::Error::NoResourceVersion => watch(e),
    }
}

#[cfg(test)]
mod tests;
