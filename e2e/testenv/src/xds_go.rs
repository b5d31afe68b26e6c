//! The Go peers of the xDS tests, built from the pinned module
//! `e2e/tools/xds-go` into `.tools/bin` by `e2e/tools/install-xds-go.sh`:
//!
//! * [`GcpServer`]: go-control-plane's ADS server (SotW and delta), fed
//!   Clusters, ClusterLoadAssignments and grpc-go targets by JSON commands on
//!   its stdin: the reference server the harness is proven against, and the
//!   benchmark's comparison;
//! * [`GrpcBackend`]: a gRPC health server that names itself in a response header;
//! * [`GrpcClient`]: a proxyless grpc-go client dialing an `xds:///` target
//!   at a fixed rate, one [`Rpc`] per call, saying which backend answered.
//!
//! Test-harness style, like [`crate::gateways`]: what does not start panics
//! with the log.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{ChildStdin, ChildStdout};

use crate::envoy::tools_bin;
use crate::gateways::{Proc, eventually};

/// Upper bound of the waits here.
const LIMIT: Duration = Duration::from_secs(30);

/// A program of `e2e/tools/xds-go`: `.tools/bin/<name>`, or
/// `$KD_XDS_GO_BIN/<name>` when that folder is set.
pub fn xds_go_bin(name: &str) -> PathBuf {
    match std::env::var_os("KD_XDS_GO_BIN") {
        Some(dir) => PathBuf::from(dir).join(name),
        None => tools_bin(name, "install-xds-go.sh"),
    }
}

/// The grpc-go bootstrap (JSON, for `GRPC_XDS_BOOTSTRAP_CONFIG`) of a client
/// that talks to the plaintext xDS server `xds` as node `node_id`.
pub fn grpc_bootstrap(xds: SocketAddr, node_id: &str) -> String {
    json!({
        "xds_servers": [{
            "server_uri": xds.to_string(),
            "channel_creds": [{"type": "insecure"}],
        }],
        "node": {"id": node_id},
    })
    .to_string()
}

/// [`grpc_bootstrap`] whose client sends `authorization: Bearer <token>`
/// (the content of `token_file`, read per call) on its xDS calls, over
/// plaintext: the channel credential `insecure_bearer_token_file` that
/// `xds-grpc-client` registers (grpc-go's own `jwt_token_file` call
/// credential needs TLS and a JWT).
pub fn grpc_bootstrap_with_token(xds: SocketAddr, node_id: &str, token_file: &Path) -> String {
    json!({
        "xds_servers": [{
            "server_uri": xds.to_string(),
            "channel_creds": [{
                "type": "insecure_bearer_token_file",
                "config": {"token_file": token_file},
            }],
        }],
        "node": {"id": node_id},
    })
    .to_string()
}

/// One endpoint of a [`GcpServer::set`]: address, weight, health status
/// (`None`: unset, `UNKNOWN`; e.g. `Some("DRAINING")`).
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its load-balancing weight (>= 1).
    pub weight: u32,
    /// Its `health_status`.
    pub health: Option<&'static str>,
}

impl Endpoint {
    /// Weight 1, no health status.
    pub fn new(addr: SocketAddr) -> Endpoint {
        Endpoint {
            addr,
            weight: 1,
            health: None,
        }
    }

    fn to_json(&self) -> Value {
        let mut v = json!([self.addr.ip().to_string(), self.addr.port(), self.weight]);
        if let (Some(h), Some(a)) = (self.health, v.as_array_mut()) {
            a.push(json!(h));
        }
        v
    }
}

/// go-control-plane's xDS server (`gcp-server`), driven through its stdin.
pub struct GcpServer {
    /// Where it serves ADS (plaintext gRPC).
    pub addr: SocketAddr,
    /// The process (stderr, with stream opens and NACKs, in its log).
    pub proc: Proc,
    stdin: ChildStdin,
    stdout: Lines<BufReader<ChildStdout>>,
}

impl GcpServer {
    /// Starts `gcp-server` on 127.0.0.1 (a port of its choice), log `<name>.log` in `dir`.
    pub async fn start(dir: &Path, name: &str) -> GcpServer {
        Self::start_with(dir, name, None).await
    }

    /// [`GcpServer::start`]; with `token_file`, streams without
    /// `authorization: Bearer <its content>` are refused (UNAUTHENTICATED,
    /// logged as `refused a stream`).
    pub async fn start_with(dir: &Path, name: &str, token_file: Option<&Path>) -> GcpServer {
        let mut cmd = tokio::process::Command::new(xds_go_bin("gcp-server"));
        cmd.args(["--listen", "127.0.0.1:0"]);
        if let Some(f) = token_file {
            cmd.arg("--token-file").arg(f);
        }
        let mut proc = Proc::spawn_piped(dir, name, &mut cmd);
        let stdin = proc.child.stdin.take().expect("piped stdin");
        let mut stdout = BufReader::new(proc.child.stdout.take().expect("piped stdout")).lines();
        let first = read_line(&mut stdout, &proc).await;
        let addr = serde_json::from_str::<Value>(&first)
            .ok()
            .and_then(|v| v["listen"].as_str()?.parse().ok())
            .unwrap_or_else(|| panic!("gcp-server's first line is not {{\"listen\":..}}: {first}"));
        GcpServer {
            addr,
            proc,
            stdin,
            stdout,
        }
    }

    /// Sends one command (README of `e2e/tools/xds-go`) and waits until it is
    /// applied to the caches; panics when gcp-server refuses it.
    pub async fn command(&mut self, cmd: Value) {
        let line = format!("{cmd}\n");
        if let Err(e) = self.stdin.write_all(line.as_bytes()).await {
            panic!("gcp-server stdin: {e}\n{}", self.proc.logs());
        }
        let reply = read_line(&mut self.stdout, &self.proc).await;
        let v: Value = serde_json::from_str(&reply)
            .unwrap_or_else(|e| panic!("gcp-server answered {reply:?} ({e})"));
        assert!(
            v["ok"] == true,
            "gcp-server refused {cmd}: {reply}\n{}",
            self.proc.logs()
        );
    }

    /// Sets the Cluster `cluster` (EDS over ADS) and its assignment.
    pub async fn set(&mut self, cluster: &str, endpoints: &[Endpoint]) {
        let eps: Vec<Value> = endpoints.iter().map(Endpoint::to_json).collect();
        self.command(json!({"set": {"cluster": cluster, "endpoints": eps}}))
            .await;
    }

    /// Deletes the Cluster `cluster` and its assignment.
    pub async fn delete(&mut self, cluster: &str) {
        self.command(json!({ "delete": cluster })).await;
    }

    /// Serves the Listener and RouteConfiguration `name` that a grpc-go
    /// `xds:///<name>` target reads, routing to `cluster`.
    pub async fn target(&mut self, name: &str, cluster: &str) {
        self.command(json!({"target": {"name": name, "cluster": cluster}}))
            .await;
    }

    /// How many streams of each kind it opened: `(sotw, delta)` (its log).
    pub fn streams(&self) -> (usize, usize) {
        let logs = self.proc.logs();
        let n = |kind: &str| {
            logs.lines()
                .filter(|l| l.contains(&format!(": {kind} stream ")) && l.contains(" open "))
                .count()
        };
        (n("sotw"), n("delta"))
    }

    /// How many streams it refused for a missing or wrong token.
    pub fn refused(&self) -> usize {
        self.proc
            .logs()
            .lines()
            .filter(|l| l.contains(": refused a stream"))
            .count()
    }

    /// The NACKs it logged (`gcp-server: NACK ...` lines).
    pub fn nacks(&self) -> Vec<String> {
        self.proc
            .logs()
            .lines()
            .filter(|l| l.contains(": NACK "))
            .map(str::to_string)
            .collect()
    }
}

/// The next stdout line of `proc` (bounded by [`LIMIT`]), panicking with its
/// log when it ends or stays silent.
async fn read_line(lines: &mut Lines<BufReader<ChildStdout>>, proc: &Proc) -> String {
    match tokio::time::timeout(LIMIT, lines.next_line()).await {
        Ok(Ok(Some(l))) => l,
        Ok(Ok(None)) => panic!("{} closed its stdout:\n{}", proc.name, proc.logs()),
        Ok(Err(e)) => panic!("{} stdout: {e}\n{}", proc.name, proc.logs()),
        Err(_) => panic!(
            "{} printed nothing within {LIMIT:?}:\n{}",
            proc.name,
            proc.logs()
        ),
    }
}

/// A `grpc-backend`: the gRPC health service on one address, answering with
/// the header `backend: <addr>`.
pub struct GrpcBackend {
    /// Where it listens.
    pub addr: SocketAddr,
    /// The process.
    pub proc: Proc,
}

impl GrpcBackend {
    /// Starts one on `addr`; waits until it accepts connections.
    pub async fn start(dir: &Path, name: &str, addr: SocketAddr) -> GrpcBackend {
        let mut cmd = tokio::process::Command::new(xds_go_bin("grpc-backend"));
        cmd.arg("--listen").arg(addr.to_string());
        let mut proc = Proc::spawn_in(dir, name, &mut cmd);
        eventually(&format!("{name} listening on {addr}"), LIMIT, || {
            let exited = proc.child.try_wait().ok().flatten();
            let log = proc.log.clone();
            async move {
                if let Some(s) = exited {
                    panic!(
                        "grpc-backend exited ({s}):\n{}",
                        std::fs::read_to_string(log).unwrap_or_default()
                    );
                }
                tokio::net::TcpStream::connect(addr).await.ok().map(|_| ())
            }
        })
        .await;
        GrpcBackend { addr, proc }
    }

    /// SIGTERM (graceful stop) and wait.
    pub async fn stop(self) {
        self.proc.stop().await;
    }
}

/// One RPC of [`GrpcClient`], as `xds-grpc-client` prints it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct Rpc {
    /// When it started, in ms since the client started.
    pub t_ms: u64,
    /// Whether it succeeded.
    pub ok: bool,
    /// The backend that answered (`ip:port`; empty when none did).
    pub backend: String,
    /// The error (empty when `ok`).
    pub err: String,
}

/// `xds-grpc-client` calling an `xds:///` target until [`GrpcClient::stop`].
pub struct GrpcClient {
    /// The process (stderr in its log).
    pub proc: Proc,
    stdin: Option<ChildStdin>,
    rpcs: Arc<Mutex<Vec<Rpc>>>,
    reader: tokio::task::JoinHandle<()>,
}

impl GrpcClient {
    /// Starts the client on `target` (`xds:///NAME`) with the bootstrap JSON
    /// `bootstrap` (`GRPC_XDS_BOOTSTRAP_CONFIG`, see [`grpc_bootstrap`]),
    /// `rate` RPCs per second, each with a 1 s deadline.
    pub fn start(dir: &Path, name: &str, target: &str, bootstrap: &str, rate: u32) -> GrpcClient {
        let mut cmd = tokio::process::Command::new(xds_go_bin("xds-grpc-client"));
        cmd.arg("--target")
            .arg(target)
            .arg("--rate")
            .arg(rate.to_string())
            .env("GRPC_XDS_BOOTSTRAP_CONFIG", bootstrap)
            .env_remove("GRPC_XDS_BOOTSTRAP");
        let mut proc = Proc::spawn_piped(dir, name, &mut cmd);
        let stdin = proc.child.stdin.take();
        let mut stdout = BufReader::new(proc.child.stdout.take().expect("piped stdout")).lines();
        let rpcs: Arc<Mutex<Vec<Rpc>>> = Arc::default();
        let sink = rpcs.clone();
        let reader = tokio::spawn(async move {
            while let Ok(Some(line)) = stdout.next_line().await {
                let rpc = serde_json::from_str(&line).unwrap_or_else(|e| Rpc {
                    t_ms: 0,
                    ok: false,
                    backend: String::new(),
                    err: format!("xds-grpc-client printed {line:?} ({e})"),
                });
                sink.lock().unwrap_or_else(|p| p.into_inner()).push(rpc);
            }
        });
        GrpcClient {
            proc,
            stdin,
            rpcs,
            reader,
        }
    }

    /// The RPCs so far, in the order they finished.
    pub fn rpcs(&self) -> Vec<Rpc> {
        self.rpcs.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// How many RPCs finished so far.
    pub fn count(&self) -> usize {
        self.rpcs.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// The RPCs after the first `n` (see [`GrpcClient::count`]).
    pub fn since(&self, n: usize) -> Vec<Rpc> {
        self.rpcs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(n..)
            .map(<[Rpc]>::to_vec)
            .unwrap_or_default()
    }

    /// Waits until `done` holds for the RPCs so far (checked every 50 ms);
    /// returns their count then. Panics after `limit` with `what`, the last
    /// RPCs and the client's log, or as soon as the client exits.
    pub async fn wait_for(
        &mut self,
        what: &str,
        limit: Duration,
        mut done: impl FnMut(&[Rpc]) -> bool,
    ) -> usize {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            self.proc.assert_running();
            let rpcs = self.rpcs();
            if done(&rpcs) {
                return rpcs.len();
            }
            if tokio::time::Instant::now() > deadline {
                let last = &rpcs[rpcs.len().saturating_sub(10)..];
                panic!(
                    "timed out after {limit:?} waiting for: {what}\n{} RPCs, the last: {last:#?}\nlog:\n{}",
                    rpcs.len(),
                    self.proc.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Panics with the log when the client has exited.
    pub fn assert_running(&mut self) {
        self.proc.assert_running();
    }

    /// Closes its stdin (it finishes the RPCs in flight and exits), waits
    /// (bounded), returns every RPC.
    pub async fn stop(mut self) -> Vec<Rpc> {
        drop(self.stdin.take());
        if tokio::time::timeout(Duration::from_secs(10), self.proc.child.wait())
            .await
            .is_err()
        {
            let _ = self.proc.child.kill().await;
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut self.reader).await;
        self.rpcs()
    }
}
