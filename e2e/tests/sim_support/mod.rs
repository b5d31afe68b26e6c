//! Shared helpers for kube-sim's end-to-end tests: start a server (kube-sim
//! alone, or either backend as a [`Cluster`]), find the real client binaries
//! under `.tools/bin`, run them with a timeout, build kube clients.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use kube_sim::{Sim, SimConfig};
use serde_json::Value;
pub use testenv::{Backend, Cluster, Options};

pub const ADMIN: &str = "test-admin-token";

/// Options of the API tests' [`Cluster`]: kube-sim as [`start`] configures
/// it (1000 events of history, 200 ms bookmarks); on the real backend
/// WITHOUT kube-controller-manager, so that, as on kube-sim, nothing but the
/// test writes (no endpoints controller rewriting a Service's Endpoints, no
/// `kube-root-ca.crt` ConfigMap in every namespace). Tests of garbage
/// collection and namespace deletion turn it on.
pub fn options(tls: bool) -> Options {
    Options {
        tls,
        history_size: 1000,
        bookmark_interval: Duration::from_millis(200),
        controller_manager: false,
        ..Options::default()
    }
}

/// Starts `backend` with `opts` (panics with the reason).
pub async fn cluster(backend: Backend, opts: Options) -> Cluster {
    Cluster::start(backend, opts)
        .await
        .unwrap_or_else(|e| panic!("start the {} API server: {e:#}", backend.name()))
}

/// A kubeconfig for the API server itself (the real backend's fault proxy
/// left out: these tests are about the server's answers).
pub fn direct_kubeconfig(c: &Cluster, token: &str) -> String {
    kube_sim::kubeconfig(&c.direct_url(), c.ca_pem().as_deref(), token)
}

/// A kube client straight to the API server authenticating with `token`,
/// WITHOUT kube-rs' own retries of 429/503/504: every answer is seen as the
/// server sent it (a 504 "Too large resource version" included).
pub async fn api_client(c: &Cluster, token: &str) -> kube::Client {
    let kc = kube::config::Kubeconfig::from_yaml(&direct_kubeconfig(c, token))
        .expect("kubeconfig parses");
    let mut cfg =
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .expect("config");
    cfg.default_retry = false;
    kube::Client::try_from(cfg).expect("client")
}

/// Panics (with the log tail) when a control-plane process died during the test.
pub fn assert_alive(c: &Cluster) {
    if let Err(e) = c.check_alive() {
        panic!("the API server died during the test: {e:#}");
    }
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// A client binary installed by `e2e/tools/install-tools.sh`; panics with a clear
/// message when it is missing (tests never skip silently).
pub fn tool(name: &str) -> PathBuf {
    let p = repo_root().join(".tools/bin").join(name);
    assert!(
        p.exists(),
        "{} is missing: run `bash e2e/tools/install-tools.sh` (or ./test.sh) to install helm v4.1 and kubectl v1.34/v1.32 into .tools/bin",
        p.display()
    );
    p
}

pub async fn start(tls: bool) -> Sim {
    let cfg = SimConfig {
        admin_token: ADMIN.into(),
        tls,
        history_size: 1000,
        bookmark_interval: Duration::from_millis(200),
    };
    Sim::start(cfg).await.expect("kube-sim starts")
}

pub struct Cli {
    pub bin: PathBuf,
    pub kubeconfig: PathBuf,
    pub home: tempfile::TempDir,
}

impl Cli {
    pub fn new(sim: &Sim, bin: &str, token: &str) -> Cli {
        Self::with_kubeconfig(&sim.kubeconfig_yaml(token), bin)
    }

    /// A client binary using the kubeconfig `yaml`.
    pub fn with_kubeconfig(yaml: &str, bin: &str) -> Cli {
        let home = tempfile::tempdir().expect("tempdir");
        let kubeconfig = home.path().join("kubeconfig");
        std::fs::write(&kubeconfig, yaml).expect("kubeconfig");
        Cli {
            bin: tool(bin),
            kubeconfig,
            home,
        }
    }

    pub fn write(&self, name: &str, content: &str) -> PathBuf {
        let p = self.home.path().join(name);
        std::fs::write(&p, content).expect("write manifest");
        p
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HOME", self.home.path())
            .env("XDG_CACHE_HOME", self.home.path().join("cache"))
            .env("XDG_CONFIG_HOME", self.home.path().join("config"))
            .env("XDG_DATA_HOME", self.home.path().join("data"))
            .env("HELM_CACHE_HOME", self.home.path().join("helm-cache"))
            .env("HELM_CONFIG_HOME", self.home.path().join("helm-config"))
            .env("HELM_DATA_HOME", self.home.path().join("helm-data"))
            .stdin(Stdio::null());
        c
    }

    /// Run to completion (60 s limit) and return the output.
    pub fn run(&self, args: &[&str]) -> Output {
        let mut child = self
            .command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn client");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if child.try_wait().expect("wait").is_some() {
                break;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("{} {args:?} did not finish within 60s", self.bin.display());
            }
            #[expect(
                clippy::disallowed_methods,
                reason = "a synchronous test helper polling a child process"
            )]
            std::thread::sleep(Duration::from_millis(20));
        }
        child.wait_with_output().expect("output")
    }

    /// Run and require success; returns stdout. Any warning but the
    /// deprecation of v1 Endpoints (every v1.33+ server sends it) fails.
    pub fn ok(&self, args: &[&str]) -> String {
        self.ok_with_stderr(args).0
    }

    /// [`Cli::ok`], returning stdout and stderr.
    pub fn ok_with_stderr(&self, args: &[&str]) -> (String, String) {
        const EXPECTED: &str =
            "Warning: v1 Endpoints is deprecated in v1.33+; use discovery.k8s.io/v1 EndpointSlice";
        let out = self.run(args);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(
            out.status.success(),
            "{} {args:?} failed ({}):\nstdout: {stdout}\nstderr: {stderr}",
            self.bin.display(),
            out.status
        );
        assert!(
            !stderr
                .lines()
                .any(|l| l.contains("Warning: ") && l != EXPECTED),
            "unexpected warning from {args:?}: {stderr}"
        );
        (stdout, stderr)
    }

    /// Run and require failure; returns stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            !out.status.success(),
            "{args:?} unexpectedly succeeded: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    pub fn json(&self, args: &[&str]) -> Value {
        let out = self.ok(args);
        serde_json::from_str(&out)
            .unwrap_or_else(|e| panic!("{args:?} did not print JSON ({e}): {out}"))
    }

    pub fn spawn(&self, args: &[&str]) -> std::process::Child {
        self.command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn client")
    }
}

/// A kube client for the sim authenticating with `token`.
pub async fn client(sim: &Sim, token: &str) -> kube::Client {
    let kc = kube::config::Kubeconfig::from_yaml(&sim.kubeconfig_yaml(token))
        .expect("kubeconfig parses");
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .expect("config");
    kube::Client::try_from(cfg).expect("client")
}

/// Raw JSON request with the admin client: returns (status, body).
pub async fn raw(
    client: &kube::Client,
    method: &str,
    path: &str,
    body: Option<Value>,
    content_type: &str,
) -> (u16, Value) {
    let (status, _, v) = raw_with_warnings(client, method, path, body, content_type).await;
    (status, v)
}

/// [`raw`], also returning the answer's `Warning` header values, in order.
pub async fn raw_with_warnings(
    client: &kube::Client,
    method: &str,
    path: &str,
    body: Option<Value>,
    content_type: &str,
) -> (u16, Vec<String>, Value) {
    let mut b = http::Request::builder().method(method).uri(path);
    if body.is_some() {
        b = b.header("content-type", content_type);
    }
    let req = b
        .body(
            body.map(|v| serde_json::to_vec(&v).expect("json"))
                .unwrap_or_default(),
        )
        .expect("request");
    let resp = client
        .send(req.map(kube::client::Body::from))
        .await
        .expect("send");
    let status = resp.status().as_u16();
    let warnings = resp
        .headers()
        .get_all("warning")
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect();
    use http_body_util::BodyExt;
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let v = serde_json::from_slice(&bytes)
        .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into_owned()));
    (status, warnings, v)
}

/// Poll `f` until it returns Some, or panic after `secs`.
pub async fn eventually<T, F, Fut>(secs: u64, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {secs}s waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Read a watch response as JSON lines until `n` lines, the end of the stream, or
/// `secs` seconds. Returns the HTTP status and the events.
pub async fn watch_lines(
    client: &kube::Client,
    path: &str,
    n: usize,
    secs: u64,
) -> (u16, Vec<Value>) {
    use http_body_util::BodyExt;
    let req = http::Request::builder()
        .uri(path)
        .body(Vec::new())
        .expect("request");
    let resp = client
        .send(req.map(kube::client::Body::from))
        .await
        .expect("send");
    let status = resp.status().as_u16();
    let mut body = resp.into_body();
    let mut buf = Vec::new();
    let mut out = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while out.len() < n {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(f))) => f,
            _ => break,
        };
        if let Ok(data) = frame.into_data() {
            buf.extend_from_slice(&data);
            while let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=pos).collect();
                out.push(serde_json::from_slice(&line).expect("watch line is JSON"));
            }
        }
    }
    (status, out)
}

/// POST a fault request to `/_sim/faults` with the admin client.
pub async fn fault(client: &kube::Client, body: Value) {
    let (status, resp) = raw(
        client,
        "POST",
        "/_sim/faults",
        Some(body.clone()),
        "application/json",
    )
    .await;
    assert_eq!(status, 200, "fault {body} rejected: {resp}");
}

pub async fn stats(client: &kube::Client) -> Value {
    let (status, v) = raw(client, "GET", "/_sim/stats", None, "").await;
    assert_eq!(status, 200, "{v}");
    v
}

/// `stats.requests[verb][resource]`
pub fn count(stats: &Value, verb: &str, resource: &str) -> u64 {
    stats["requests"][verb][resource].as_u64().unwrap_or(0)
}

/// One plain-HTTP request over a fresh TCP connection (no client retries, unlike
/// kube's client, which retries 429/503): returns (status, headers, JSON body).
pub async fn plain_http(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> (u16, String, Value) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {token}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await.expect("write");
    let mut out = Vec::new();
    s.read_to_end(&mut out).await.expect("read");
    let text = String::from_utf8_lossy(&out).into_owned();
    let (head, rest) = text.split_once("\r\n\r\n").expect("http response");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    let v = serde_json::from_str(rest).unwrap_or(Value::String(rest.to_string()));
    (status, head.to_ascii_lowercase(), v)
}
