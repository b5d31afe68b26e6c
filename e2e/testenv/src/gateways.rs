//! The gateways we ship a reader for, as real processes in front of a test
//! cluster: nginx and HAProxy (Debian packages, `e2e/tools/install-gateways.sh`)
//! each followed by `kube-discovery sync <gateway>`, and the Rust proxy (the
//! `reverse_proxy` example of the client crate). Shared by the gateway
//! end-to-end tests and kd-bench's `gateways` scenario.
//!
//! Test-harness style: a gateway that does not start panics with its log.
//! What a caller provides (scratch directory, kubeconfig, binaries) comes
//! through [`GatewayEnv`].

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// Upper bound of the waits here.
const LIMIT: Duration = Duration::from_secs(30);

/// What the gateways need from their environment.
pub trait GatewayEnv {
    /// A path in the scratch directory.
    fn path(&self, name: &str) -> PathBuf;
    /// A kubeconfig file with admin rights on the API server.
    fn admin_kubeconfig(&self) -> PathBuf;
    /// The `kube-discovery` binary (for `sync <gateway>`).
    fn kube_discovery_bin(&self) -> PathBuf;
    /// An example binary of the client crate (`reverse_proxy`).
    fn example_bin(&self, name: &str) -> PathBuf;
}

/// Whether the system has `name` (see [`system_bin`]).
pub fn find_system_bin(name: &str) -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        .unwrap_or_default();
    dirs.extend(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from));
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

/// A gateway binary from the system (Debian package): FAILS when missing.
pub fn system_bin(name: &str) -> PathBuf {
    find_system_bin(name).unwrap_or_else(|| {
        panic!("{name} is not installed: run `bash e2e/tools/install-gateways.sh` (Debian packages nginx-light/nginx and haproxy)")
    })
}

/// A free TCP port on `ip` (bound and released; fine for tests on local addresses).
pub fn free_port(ip: IpAddr) -> u16 {
    std::net::TcpListener::bind((ip, 0))
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// Polls `f` every 50 ms until it returns `Some`, panicking with `what` after `limit`.
pub async fn eventually<T, F, Fut>(what: &str, limit: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = tokio::time::Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if start.elapsed() > limit {
            panic!("timed out after {limit:?} waiting for: {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A child process (gateway or sync) with its log file. It runs in its own
/// process group, and dropping it kills the whole group: nginx's workers
/// outlive a killed master otherwise.
pub struct Proc {
    /// Its name (log file `<name>.log` in the scratch directory).
    pub name: String,
    /// The process.
    pub child: tokio::process::Child,
    /// Its log file (stdout and stderr).
    pub log: PathBuf,
}

impl Proc {
    /// Spawns `cmd` with its output in `<name>.log` in `env`'s scratch directory.
    pub fn spawn(env: &impl GatewayEnv, name: &str, cmd: &mut tokio::process::Command) -> Proc {
        Self::spawn_at(env.path(&format!("{name}.log")), name, cmd, false)
    }

    /// [`Proc::spawn`] with the log `<name>.log` in `dir`.
    pub fn spawn_in(dir: &Path, name: &str, cmd: &mut tokio::process::Command) -> Proc {
        Self::spawn_at(dir.join(format!("{name}.log")), name, cmd, false)
    }

    /// [`Proc::spawn_in`] with stdin and stdout piped (taken from
    /// [`Proc::child`]), only stderr in the log: a peer driven by lines.
    pub fn spawn_piped(dir: &Path, name: &str, cmd: &mut tokio::process::Command) -> Proc {
        Self::spawn_at(dir.join(format!("{name}.log")), name, cmd, true)
    }

    fn spawn_at(log: PathBuf, name: &str, cmd: &mut tokio::process::Command, piped: bool) -> Proc {
        let f = std::fs::File::create(&log).expect("log file");
        let f2 = f.try_clone().expect("log file");
        if piped {
            cmd.stdin(Stdio::piped()).stdout(Stdio::piped());
        } else {
            cmd.stdout(Stdio::from(f2));
        }
        let child = cmd
            .env(
                "RUST_LOG",
                "info,kube_discovery_client=debug,kube_discovery=debug",
            )
            .env_remove("KUBECONFIG")
            .stderr(Stdio::from(f))
            .kill_on_drop(true)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        Proc {
            name: name.to_string(),
            child,
            log,
        }
    }

    /// Its log so far.
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Panics with the log when the process has exited.
    pub fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("{} exited with {status}:\n{}", self.name, self.logs());
        }
    }

    /// SIGTERM and wait (bounded).
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        // Still running (not stopped): kill its process group (it leads it).
        if let Some(pid) = self.child.id() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", "--", &format!("-{pid}")])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// Runs a one-shot command (e.g. `sync --once`), panicking with its output on failure.
pub async fn run_ok(what: &str, cmd: &mut tokio::process::Command) -> String {
    let out = tokio::time::timeout(
        LIMIT,
        cmd.env_remove("KUBECONFIG").kill_on_drop(true).output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{what}: no exit within {LIMIT:?}"))
    .unwrap_or_else(|e| panic!("{what}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{text}",
        out.status
    );
    text
}

/// `kube-discovery sync <gateway>` of `env`.
fn sync_of(env: &impl GatewayEnv, gateway: &str) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(env.kube_discovery_bin());
    c.arg("sync").arg(gateway);
    c
}

/// nginx's main config: listens on 127.0.0.1:`port`, proxies to `upstream`
/// from the file `upstreams` the sync renders.
pub fn nginx_conf(dir: &Path, port: u16, upstreams: &Path, upstream: &str) -> String {
    let d = dir.display();
    format!(
        "daemon off;\nmaster_process on;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {d}/nginx-error.log notice;\n\
events {{ worker_connections 512; }}\n\
http {{\n  access_log off;\n  client_body_temp_path {d}/t-body;\n  proxy_temp_path {d}/t-proxy;\n  fastcgi_temp_path {d}/t-fcgi;\n  uwsgi_temp_path {d}/t-uwsgi;\n  scgi_temp_path {d}/t-scgi;\n\
  include {};\n\
  server {{\n    listen 127.0.0.1:{port};\n    location / {{\n      proxy_pass http://{upstream};\n      proxy_connect_timeout 1s;\n      proxy_next_upstream error timeout;\n    }}\n  }}\n}}\n",
        upstreams.display()
    )
}

/// nginx and its follow-mode sync.
pub struct Nginx {
    /// Where nginx listens.
    pub addr: SocketAddr,
    /// The upstreams file the sync renders.
    pub upstreams: PathBuf,
    /// nginx.
    pub proc: Proc,
    /// `kube-discovery sync nginx`.
    pub sync: Proc,
}

/// Writes the nginx config, renders the upstreams once (`--once`), starts nginx, then the follow-mode sync.
pub async fn start_nginx(
    env: &impl GatewayEnv,
    name: &str,
    services: &[&str],
    upstream: &str,
    extra: &[&str],
) -> Nginx {
    let nginx = system_bin("nginx");
    let dir = env.path(name);
    std::fs::create_dir_all(&dir).expect("nginx dir");
    let port = free_port([127, 0, 0, 1].into());
    let upstreams = dir.join("upstreams.conf");
    let conf = dir.join("nginx.conf");
    std::fs::write(&conf, nginx_conf(&dir, port, &upstreams, upstream)).expect("write nginx.conf");
    let kubeconfig = env.admin_kubeconfig();
    let sync_args = |once: bool| {
        let mut c = sync_of(env, "nginx");
        c.arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--output")
            .arg(&upstreams);
        c.arg("--nginx-bin")
            .arg(&nginx)
            .arg("--nginx-conf")
            .arg(&conf)
            .arg("--nginx-prefix")
            .arg(&dir);
        for s in services {
            c.args(["--service", s]);
        }
        c.args(extra);
        if once {
            c.arg("--once");
        }
        c
    };
    run_ok("kube-discovery sync nginx --once", &mut sync_args(true)).await;
    let text = std::fs::read_to_string(&upstreams).expect("upstreams written by --once");
    assert!(text.contains(&format!("upstream {upstream} {{")), "{text}");
    let mut cmd = tokio::process::Command::new(&nginx);
    cmd.arg("-p")
        .arg(&dir)
        .arg("-c")
        .arg(&conf)
        .arg("-e")
        .arg(dir.join("nginx-error.log"));
    let mut proc = Proc::spawn(env, &format!("{name}-nginx"), &mut cmd);
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    eventually("nginx listening", LIMIT, || {
        let exited = proc.child.try_wait().ok().flatten();
        let err = std::fs::read_to_string(dir.join("nginx-error.log")).unwrap_or_default();
        async move {
            if let Some(s) = exited {
                panic!("nginx exited with {s}: {err}");
            }
            tokio::net::TcpStream::connect(addr).await.ok().map(|_| ())
        }
    })
    .await;
    proc.assert_running();
    let sync = Proc::spawn(env, &format!("{name}-sync"), &mut sync_args(false));
    // Its first cycle (after the initial list) is done: later writes arrive as watch events.
    eventually(
        &format!("{name}-sync listed and rendered once"),
        LIMIT,
        || async {
            let logs = sync.logs();
            (logs.contains("upstreams unchanged") || logs.contains("upstreams applied"))
                .then_some(())
        },
    )
    .await;
    Nginx {
        addr,
        upstreams,
        proc,
        sync,
    }
}

/// HAProxy's main config: the admin socket, a frontend on 127.0.0.1:`port`
/// whose default backend is `backend` (rendered by the sync into its own file).
pub fn haproxy_conf(dir: &Path, port: u16, backend: &str) -> String {
    let d = dir.display();
    format!(
        "global\n    stats socket {d}/admin.sock mode 600 level admin expose-fd listeners\n\
defaults\n    mode http\n    timeout connect 1s\n    timeout client 10s\n    timeout server 10s\n\
frontend fe\n    bind 127.0.0.1:{port}\n    default_backend {backend}\n"
    )
}

/// HAProxy (master-worker) and its follow-mode sync.
pub struct Haproxy {
    /// Where HAProxy listens.
    pub addr: SocketAddr,
    /// Its directory (configs, sockets).
    pub dir: PathBuf,
    /// HAProxy.
    pub proc: Proc,
    /// `kube-discovery sync haproxy`.
    pub sync: Proc,
}

/// Writes the HAProxy config, renders the backends once (`--once`), starts
/// HAProxy in master-worker mode, then the follow-mode sync.
pub async fn start_haproxy(
    env: &impl GatewayEnv,
    name: &str,
    services: &[&str],
    backend: &str,
    extra: &[&str],
) -> Haproxy {
    let haproxy = system_bin("haproxy");
    let dir = env.path(name);
    std::fs::create_dir_all(&dir).expect("haproxy dir");
    let port = free_port([127, 0, 0, 1].into());
    let main = dir.join("haproxy.cfg");
    let backends = dir.join("backends.cfg");
    std::fs::write(&main, haproxy_conf(&dir, port, backend)).expect("write haproxy.cfg");
    let kubeconfig = env.admin_kubeconfig();
    let sync_args = |once: bool| {
        let mut c = sync_of(env, "haproxy");
        c.arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--output")
            .arg(&backends);
        c.arg("--haproxy-bin")
            .arg(&haproxy)
            .arg("--haproxy-conf")
            .arg(&main);
        c.arg("--socket").arg(dir.join("admin.sock"));
        for s in services {
            c.args(["--service", s]);
        }
        c.args(extra);
        if once {
            c.arg("--once");
        } else {
            c.arg("--master-socket").arg(dir.join("master.sock"));
        }
        c
    };
    run_ok("kube-discovery sync haproxy --once", &mut sync_args(true)).await;
    let text = std::fs::read_to_string(&backends).expect("backends written by --once");
    assert!(text.contains(&format!("backend {backend}\n")), "{text}");
    let mut cmd = tokio::process::Command::new(&haproxy);
    cmd.arg("-W")
        .arg("-S")
        .arg(dir.join("master.sock"))
        .arg("-f")
        .arg(&main)
        .arg("-f")
        .arg(&backends);
    let mut proc = Proc::spawn(env, &format!("{name}-haproxy"), &mut cmd);
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let log = proc.log.clone();
    eventually("haproxy listening", LIMIT, || {
        let exited = proc.child.try_wait().ok().flatten();
        let log = log.clone();
        async move {
            if let Some(s) = exited {
                panic!(
                    "haproxy exited with {s}: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            tokio::net::TcpStream::connect(addr).await.ok().map(|_| ())
        }
    })
    .await;
    proc.assert_running();
    let sync = Proc::spawn(env, &format!("{name}-sync"), &mut sync_args(false));
    Haproxy {
        addr,
        dir,
        proc,
        sync,
    }
}

/// Starts the example proxy for `service` with extra flags; waits until it listens.
pub async fn start_proxy(
    env: &impl GatewayEnv,
    name: &str,
    service: &str,
    extra: &[&str],
) -> (Proc, SocketAddr) {
    let kubeconfig = env.admin_kubeconfig();
    let listen = free_port([127, 0, 0, 1].into());
    let mut cmd = tokio::process::Command::new(env.example_bin("reverse_proxy"));
    cmd.arg("--listen")
        .arg(format!("127.0.0.1:{listen}"))
        .arg("--service")
        .arg(service)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(extra);
    let proxy = Proc::spawn(env, name, &mut cmd);
    let addr: SocketAddr = ([127, 0, 0, 1], listen).into();
    eventually("reverse_proxy example listening", LIMIT, || async {
        tokio::net::TcpStream::connect(addr).await.ok().map(|_| ())
    })
    .await;
    (proxy, addr)
}
