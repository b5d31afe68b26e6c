//! kube-sim's error type: what can go wrong starting a server or using its
//! in-process API. Requests answered with a `Status` are not errors here; they
//! are [`ApiError`]s rendered to the client.

use std::net::SocketAddr;
use std::path::PathBuf;

use crate::status::ApiError;

/// An error of kube-sim's library API.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// [`SimConfig::admin_token`](crate::SimConfig::admin_token) is empty.
    #[error("admin token must not be empty")]
    EmptyAdminToken,
    /// The listen address cannot be bound.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The bound listener has no local address.
    #[error("local address: {0}")]
    LocalAddr(#[source] std::io::Error),
    /// A key or certificate could not be generated or signed.
    #[error("{what}: {source}")]
    Cert {
        /// The step that failed (`CA key`, `signing server certificate`, ...).
        what: &'static str,
        /// The cause.
        #[source]
        source: rcgen::Error,
    },
    /// rustls refused the TLS configuration.
    #[error("{what}: {source}")]
    Tls {
        /// The step that failed (`TLS versions`, `server certificate`, ...).
        what: &'static str,
        /// The cause.
        #[source]
        source: rustls::Error,
    },
    /// A file could not be written.
    #[error("writing {what} {}: {source}", path.display())]
    Write {
        /// What the file is (`kubeconfig`, ...).
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The server refused an object (the `Status` it would have answered).
    #[error("{0}")]
    Refused(#[source] ApiError),
}

/// Result with kube-sim's [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;
