//! Gateways that follow DiscoveredServices without anyone touching their
//! config: what `kube-discovery sync nginx|haproxy` runs (feature `sync`).
//!
//! ```text
//!  DiscoveredServices ──NodesResolver (label selector)──▶ nodes ──changed──┐
//!                                                                        ▼
//!   policy.rs  per service: nodes -> usable nodes (invalid ones dropped, empty/missing per EmptyPolicy)
//!        │                                             │
//!        ▼                                             ▼
//!   nginx.rs   render upstream blocks (pure)     haproxy.rs  desired slots -> Runtime API commands (pure)
//!              if changed: candidate, `nginx -t`,            `set server b/s addr|weight|state` over the
//!              rename over the live file, reload             stats socket; reload only to grow the slots
//! ```
//!
//! Everything that decides *what* to write or send is a pure function with
//! unit tests ([`nginx::render`], [`haproxy::plan`], [`haproxy::render`],
//! [`crate::policy::usable_nodes`]); [`nginx::run_nginx`] and
//! [`haproxy::run_haproxy`] only do I/O around them. The end-to-end proof
//! (both API servers, the controller, real nginx/HAProxy processes and real
//! backends) lives in `e2e/tests/gateway_*.rs`.

use std::path::PathBuf;

use kube::Client;
use kube_discovery_core::crd::MANAGED_BY_SELECTOR;

pub mod haproxy;
pub mod nginx;

pub use haproxy::{HaproxyArgs, run_haproxy};
pub use nginx::{NginxArgs, run_nginx};

/// Every error of the syncs. Display strings carry their cause's text.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The `--service` flags are refused.
    #[error(transparent)]
    Services(#[from] crate::policy::ServicesError),
    /// `--output` cannot be named in the nginx configuration.
    #[error("--output {}: path must consist of [A-Za-z0-9/_.-]", .0.display())]
    OutputPath(PathBuf),
    /// Reading DiscoveredServices failed.
    #[error(transparent)]
    Client(#[from] crate::Error),
    /// A file cannot be read, written or removed.
    #[error("cannot {action} {}: {source}", .path.display())]
    File {
        /// `read`, `write` or `remove`.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A file cannot be renamed over another.
    #[error("cannot rename {} to {}: {source}", .from.display(), .to.display())]
    Rename {
        /// The file renamed.
        from: PathBuf,
        /// Its new name.
        to: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A program (nginx, haproxy) cannot be started.
    #[error("cannot run {program}: {source}")]
    Spawn {
        /// The command as shown (`nginx -t`, the haproxy binary).
        program: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A program exited with a failure.
    #[error("{program} failed ({status}): {output}")]
    Failed {
        /// The command as shown.
        program: String,
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it printed (stderr).
        output: String,
    },
    /// `haproxy -c` refused the candidate file.
    #[error("haproxy -c rejected the backends ({status}): {output}")]
    HaproxyRejected {
        /// Its exit status.
        status: std::process::ExitStatus,
        /// What it printed (stdout and stderr).
        output: String,
    },
    /// nginx refused the new upstream file; the live one is unchanged.
    #[error("new {} rejected; previous content kept: {source}", .output.display())]
    Rejected {
        /// The upstream file.
        output: PathBuf,
        /// Why (`nginx -t` failed, ...).
        #[source]
        source: Box<Error>,
    },
    /// A HAProxy CLI socket cannot be connected to.
    #[error("connect {}: {source}", .socket.display())]
    Connect {
        /// The socket.
        socket: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Talking over a connected HAProxy CLI socket failed.
    #[error("{}: {source}", .socket.display())]
    Socket {
        /// The socket.
        socket: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// HAProxy did not answer in time.
    #[error("{}: no answer to {command:?} within 5s", .socket.display())]
    NoAnswer {
        /// The socket.
        socket: PathBuf,
        /// The command sent.
        command: String,
    },
    /// `show servers state` has no such column in a server line.
    #[error("show servers state {backend}: no {field} in {line:?}")]
    MissingField {
        /// The backend.
        backend: String,
        /// The column.
        field: &'static str,
        /// The server line.
        line: String,
    },
    /// A numeric column of `show servers state` is not a number.
    #[error("{field} in {line:?}: {source}")]
    BadField {
        /// The column.
        field: &'static str,
        /// The server line.
        line: String,
        /// The cause.
        #[source]
        source: std::num::ParseIntError,
    },
    /// `show servers state` answered without a header (an unknown backend, ...).
    #[error("show servers state {backend}: {answer}")]
    NoServersState {
        /// The backend.
        backend: String,
        /// HAProxy's answer.
        answer: String,
    },
    /// More slots are needed and HAProxy cannot be reloaded.
    #[error("the backends need more slots but no --master-socket is given to reload HAProxy")]
    NoMasterSocket,
    /// The reload over the master CLI failed.
    #[error("master CLI reload: {0}")]
    MasterReload(#[source] Box<Error>),
    /// The reloaded HAProxy did not show the new slots in time.
    #[error("HAProxy did not show the new slots within 10s after reload")]
    ReloadTimeout,
    /// HAProxy refused a Runtime API command.
    #[error("HAProxy refused {command:?}: {answer}")]
    Refused {
        /// The command.
        command: String,
        /// HAProxy's answer.
        answer: String,
    },
}

/// Result with [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Where the syncs read DiscoveredServices from.
#[derive(Debug, Clone, clap::Args)]
pub struct KubeArgs {
    /// Kubeconfig file (default: `KUBECONFIG`, `~/.kube/config`, or in-cluster).
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// Kubeconfig context.
    #[arg(long)]
    pub context: Option<String>,
    /// Only DiscoveredServices in this namespace (default: all namespaces).
    #[arg(long)]
    pub namespace: Option<String>,
    /// Label selector of the DiscoveredServices to watch.
    #[arg(long, default_value = MANAGED_BY_SELECTOR)]
    pub selector: String,
    /// The controller runs with `namespace_mode: fixed` and writes every
    /// DiscoveredService into this namespace: only objects there count
    /// (default: `namespace_mode: source`, each object in its Service's
    /// namespace). Objects whose namespace, name or labels disagree with
    /// their spec are ignored with a warning.
    #[arg(long, value_name = "NAMESPACE")]
    pub fixed_namespace: Option<String>,
    /// Count only the objects of this installation (`kube_discovery.instance`,
    /// label `kubediscovery.io/instance`); default: of any installation.
    #[arg(long, value_name = "NAME")]
    pub instance: Option<String>,
}

impl KubeArgs {
    /// A client for these flags ([`crate::connect::client`]).
    pub async fn client(&self) -> crate::Result<Client> {
        crate::connect::client(self.kubeconfig.as_deref(), self.context.as_deref()).await
    }

    /// A [`crate::NodesResolver`] over the DiscoveredServices these flags select.
    pub async fn resolver(&self) -> crate::Result<crate::NodesResolver> {
        Ok(crate::NodesResolver::start_with_rule(
            self.client().await?,
            self.namespace.as_deref(),
            &self.selector,
            crate::lookup::reader_rule(self.fixed_namespace.as_deref(), self.instance.as_deref()),
        ))
    }
}
