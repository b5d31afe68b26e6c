//! The harness's error type. Every failure names what the harness was doing;
//! a control-plane process that died carries its log's tail, so the test that
//! hits it fails with the reason.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::ExitStatus;
use std::time::Duration;

/// An error of the test harness.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// kube-sim failed (start, certificates, an object it refused).
    #[error("kube-sim: {0}")]
    Sim(#[from] kube_sim::Error),
    /// A kube client request failed.
    #[error("{what}: {source}")]
    Kube {
        /// The request (`creating CRD widgets.example.com`, ...).
        what: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// A generated kubeconfig was not accepted by kube's client.
    #[error("kubeconfig: {0}")]
    Kubeconfig(#[from] kube::config::KubeconfigError),
    /// A file could not be created, opened or written.
    #[error("{what} {}: {source}", path.display())]
    File {
        /// What was done (`writing`, `opening the log`, ...).
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// An I/O operation without a file failed (sockets, child processes).
    #[error("{what}: {source}")]
    Io {
        /// What was done (`starting etcd (/path/etcd)`, `binding a free port`, ...).
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A JSON value could not be built or read.
    #[error("{what}: {source}")]
    Json {
        /// The value (`Pod shop/web-0`, `etcd answer`, ...).
        what: String,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// A YAML document could not be parsed.
    #[error("{what}: {source}")]
    Yaml {
        /// The document (`CRD YAML`).
        what: &'static str,
        /// The cause (boxed: it is large).
        #[source]
        source: Box<serde_saphyr::Error>,
    },
    /// An HTTP request could not be built.
    #[error("building a request: {0}")]
    Request(#[from] http::Error),
    /// An HTTP connection (to etcd, or the proxy's to the API server) failed.
    #[error("{what}: {source}")]
    Http {
        /// The step (`HTTP/2 handshake`, `etcd request`, ...).
        what: &'static str,
        /// The cause.
        #[source]
        source: hyper::Error,
    },
    /// etcd answered with an error status.
    #[error("etcd answered {status}: {body}")]
    Etcd {
        /// The HTTP status.
        status: http::StatusCode,
        /// Its body.
        body: String,
    },
    /// An answer lacked a field the harness reads.
    #[error("{0}")]
    MalformedAnswer(&'static str),
    /// rustls refused a TLS configuration.
    #[error("{what}: {source}")]
    Tls {
        /// The step (`TLS versions`, `CA into the root store`).
        what: &'static str,
        /// The cause.
        #[source]
        source: rustls::Error,
    },
    /// A key could not be generated.
    #[error("{what}: {source}")]
    Cert {
        /// The key (`ServiceAccount signing key`).
        what: &'static str,
        /// The cause.
        #[source]
        source: rcgen::Error,
    },
    /// A control-plane binary is not built.
    #[error(
        "{name} not found at {}: run `bash e2e/controlplane/build.sh` (./test.sh does)",
        path.display()
    )]
    MissingBinary {
        /// The process (`etcd`, `kube-apiserver`, ...).
        name: String,
        /// Where it was looked for.
        path: PathBuf,
    },
    /// A control-plane process exited.
    #[error("{name} exited ({status}); last lines of {}:\n{tail}", log.display())]
    Exited {
        /// The process.
        name: String,
        /// How it ended.
        status: ExitStatus,
        /// Its log file.
        log: PathBuf,
        /// The last few KiB of the log.
        tail: String,
    },
    /// A control-plane process was stopped and not started again.
    #[error("{name} is not running")]
    NotRunning {
        /// The process.
        name: String,
    },
    /// Something did not become ready in time.
    #[error("{}", timeout_message(what, *limit, last.as_deref(), log_tail.as_deref()))]
    Timeout {
        /// What was waited for (`etcd not healthy`, `CRD widgets.example.com not established`).
        what: String,
        /// How long.
        limit: Duration,
        /// The last failure seen while waiting.
        last: Option<String>,
        /// The tail of the log of the process waited for.
        log_tail: Option<String>,
    },
    /// An etcd request took longer than its timeout.
    #[error("etcd request timed out")]
    EtcdTimeout,
    /// A fault request kube-sim would refuse.
    #[error("invalid fault request: {0}")]
    InvalidFault(String),
    /// A user that is not in [`Options::users`](crate::Options::users).
    #[error("user {0} is not in Options::users")]
    UnknownUser(String),
    /// A user of [`Options::users`](crate::Options::users) without a token.
    #[error("user {0} has no token")]
    NoUserToken(String),
    /// An address outside the test block was asked for.
    #[error("{ip} is not in the test block {}/{}", crate::net::BLOCK.0, crate::net::BLOCK.1)]
    NotInTestBlock {
        /// The address.
        ip: Ipv4Addr,
    },
    /// `ip addr add` failed.
    #[error(
        "cannot add {ip}/32 to the loopback interface (`ip addr add {ip}/32 dev lo`: {stderr}): \
         test backends listed in EndpointSlices need a local non-loopback address (the real \
         API server rejects 127.0.0.0/8 there), and adding one needs root or CAP_NET_ADMIN. \
         Run the tests as root, or add the addresses beforehand (`ip addr add <ip>/32 dev lo`, \
         198.18.0.0/15)"
    )]
    AddAddress {
        /// The address.
        ip: Ipv4Addr,
        /// What `ip` printed.
        stderr: String,
    },
    /// `ip addr add` succeeded but the address is not listed.
    #[error("`ip addr add {ip}/32 dev lo` succeeded, but lo does not list {ip}")]
    AddressNotListed {
        /// The address.
        ip: Ipv4Addr,
    },
    /// `ip addr show` failed.
    #[error("`ip -o -4 addr show dev lo` failed: {0}")]
    ListAddresses(String),
    /// `ip addr del` failed.
    #[error(
        "cannot remove {ip}/32 from the loopback interface (`ip addr del {ip}/32 dev lo`: {stderr})"
    )]
    RemoveAddress {
        /// The address.
        ip: Ipv4Addr,
        /// What `ip` printed.
        stderr: String,
    },
    /// Every Pod address range of [`crate::kwok`] is held by another running control plane.
    #[error(
        "all {0} Pod address ranges of the kwok clusters are in use by other running tests \
         (lock files {1}/kd-testenv-podnet-<n>.lock)"
    )]
    NoPodRange(usize, String),
    /// The harness's Pod network (addresses on `lo`, the Pods' server) failed.
    #[error("the kwok Pod network: {0}")]
    PodNet(String),
}

/// Result with the harness's [`Error`] as the default error.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A kube client request `what` failed with `source`.
    pub fn kube(what: impl Into<String>, source: kube::Error) -> Error {
        Error::Kube {
            what: what.into(),
            source,
        }
    }

    /// An I/O operation `what` failed with `source`.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Error {
        Error::Io {
            what: what.into(),
            source,
        }
    }

    /// Building or reading the JSON value `what` failed with `source`.
    pub fn json(what: impl Into<String>, source: serde_json::Error) -> Error {
        Error::Json {
            what: what.into(),
            source,
        }
    }

    /// Whether this error or one of its sources mentions `text`.
    pub fn mentions(&self, text: &str) -> bool {
        let mut e: Option<&dyn std::error::Error> = Some(self);
        while let Some(cur) = e {
            if cur.to_string().contains(text) {
                return true;
            }
            e = cur.source();
        }
        false
    }
}

fn timeout_message(
    what: &str,
    limit: Duration,
    last: Option<&str>,
    log_tail: Option<&str>,
) -> String {
    let mut m = format!("{what} within {limit:?}");
    if let Some(last) = last {
        m.push_str(&format!(" (last: {last})"));
    }
    if let Some(tail) = log_tail {
        m.push_str(&format!("; log tail:\n{tail}"));
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timeout_says_what_how_long_the_last_failure_and_the_log_tail() {
        let e = Error::Timeout {
            what: "kube-apiserver not ready".into(),
            limit: Duration::from_secs(30),
            last: Some("connection refused".into()),
            log_tail: Some("E0101 bind: address already in use".into()),
        };
        assert_eq!(
            e.to_string(),
            "kube-apiserver not ready within 30s (last: connection refused); \
             log tail:\nE0101 bind: address already in use"
        );
        assert!(e.mentions("address already in use"));
        let bare = Error::Timeout {
            what: "CRD a.b not established".into(),
            limit: Duration::from_millis(500),
            last: None,
            log_tail: None,
        };
        assert_eq!(bare.to_string(), "CRD a.b not established within 500ms");
    }

    #[test]
    fn mentions_finds_text_in_the_message_or_its_sources() {
        let e = Error::io(
            "starting etcd",
            std::io::Error::new(std::io::ErrorKind::AddrInUse, "address already in use"),
        );
        assert_eq!(e.to_string(), "starting etcd: address already in use");
        let wrapped = Error::Sim(kube_sim::Error::Bind {
            addr: ([127, 0, 0, 1], 1).into(),
            source: std::io::Error::new(std::io::ErrorKind::AddrInUse, "address already in use"),
        });
        assert!(wrapped.mentions("address already in use"));
        assert!(!wrapped.mentions("connection refused"));
    }
}
