//! Shared helpers of the install/upgrade/operate tests (`chart/deploy_manifest.rs`,
//! `chart/upgrade.rs`, `chart/monitoring.rs`): an API server of either kind
//! with an admin kubeconfig, kubectl/helm runners, and [`run_pod`], which
//! starts the controller binary exactly as an installed Deployment's pod
//! template says, since no kubelet runs pods here:
//!
//! * the container's `args` and `env` from the Deployment read back from the
//!   API server (`fieldRef`s resolved as the kubelet does: pod name, namespace);
//! * the in-cluster connection the kubelet provides: `KUBERNETES_SERVICE_HOST`
//!   / `_PORT` and the ServiceAccount's token, CA and namespace at
//!   `/var/run/secrets/kubernetes.io/serviceaccount/` — in a private mount
//!   namespace of the process (`unshare --mount`, a tmpfs over `/run`), so the
//!   rendered config's in-cluster defaults are used unchanged (needs root or
//!   CAP_SYS_ADMIN, like the gateway tests' addresses need CAP_NET_ADMIN);
//! * the ConfigMap and the API-token Secret the pod mounts, read back from the
//!   API server and written to files; `--config` and `auth_token_file` point
//!   there (their pod paths are under `/etc`, which a test cannot mount over);
//! * `--http-addr 127.0.0.1:<free port>` instead of the container's
//!   `0.0.0.0:8080`, so several replicas can run side by side.

#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use testenv::{Backend, Cluster, Options};

use crate::chart_support::{helm, repo_root, run, text, tool};

/// An API server (kube-sim with TLS, or the real one) with an admin
/// kubeconfig in a temporary directory.
pub struct Env {
    pub api: Cluster,
    pub dir: tempfile::TempDir,
    pub kubeconfig: PathBuf,
}

impl Env {
    pub async fn start(backend: Backend) -> Env {
        let api = Cluster::start(
            backend,
            Options {
                tls: true,
                ..Options::default()
            },
        )
        .await
        .unwrap_or_else(|e| panic!("start the {} API server: {e:#}", backend.name()));
        let dir = tempfile::tempdir().expect("temp dir");
        let kubeconfig = dir.path().join("kubeconfig");
        api.write_kubeconfig(&kubeconfig, &api.admin_token())
            .expect("kubeconfig");
        Env {
            api,
            dir,
            kubeconfig,
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Runs a command without blocking the runtime's other workers (kube-sim
    /// serves on them).
    pub fn exec(&self, mut cmd: Command) -> Output {
        cmd.env("KUBECONFIG", &self.kubeconfig);
        tokio::task::block_in_place(|| run(cmd))
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        let mut c = Command::new(tool("kubectl-1.34"));
        c.args(args);
        self.exec(c)
    }

    /// kubectl that must succeed; returns stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed:\n{}",
            text(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl get ... -o json` that must succeed.
    pub fn get_json(&self, args: &[&str]) -> Value {
        let mut a = vec!["get"];
        a.extend(args);
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.kubectl_ok(&a)).expect("kubectl JSON")
    }

    /// The object as JSON, or `None` when it does not exist.
    pub fn get_opt(&self, args: &[&str]) -> Option<Value> {
        let mut a = vec!["get"];
        a.extend(args);
        a.extend(["-o", "json"]);
        let out = self.kubectl(&a);
        if out.status.success() {
            return Some(serde_json::from_slice(&out.stdout).expect("kubectl JSON"));
        }
        let t = text(&out);
        assert!(
            t.contains("NotFound") || t.contains("not found"),
            "kubectl {a:?}: unexpected error:\n{t}"
        );
        None
    }

    pub fn helm(&self, args: &[&str]) -> Output {
        let mut c = helm();
        c.args(args);
        self.exec(c)
    }

    pub fn helm_ok(&self, args: &[&str]) -> String {
        let out = self.helm(args);
        assert!(
            out.status.success(),
            "helm {args:?} failed:\n{}",
            text(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Writes `yaml` to a file and `kubectl apply`s it.
    pub fn apply_yaml(&self, name: &str, yaml: &str) -> String {
        let p = self.path(name);
        std::fs::write(&p, yaml).expect("write manifest");
        self.kubectl_ok(&["apply", "-f", &p.display().to_string()])
    }

    /// The API server's CA (PEM) in a file.
    pub fn ca_file(&self) -> PathBuf {
        let p = self.path("api-ca.crt");
        std::fs::write(&p, self.api.ca_pem().expect("TLS CA")).expect("write CA");
        p
    }
}

/// The controller binary built by `./test.sh` (`cargo build --workspace --bins`).
pub fn controller_bin() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("target"));
    let p = target.join("debug/kube-discovery");
    assert!(
        p.exists(),
        "{} is missing: build it with `cargo build -p kube-discovery` (./test.sh does)",
        p.display()
    );
    p
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port()
}

/// Minimal HTTP/1.1 GET with optional bearer token: (status, body).
pub fn http_get(port: u16, path: &str, token: Option<&str>) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}Connection: close\r\n\r\n"
    )
    .ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let status = buf.split_whitespace().nth(1)?.parse().ok()?;
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

/// Polls `f` every 300 ms until it returns `Some`, or panics after `secs`
/// with `what` and the last state `f` reported through `last`.
pub async fn wait_for<T>(secs: u64, what: &str, mut f: impl FnMut(&mut String) -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut last = String::new();
    loop {
        if let Some(v) = f(&mut last) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not reached after {secs}s; last: {last}"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// A controller process started by [`run_pod`]; SIGTERM (then SIGKILL) on drop.
pub struct Pod {
    child: Child,
    pub name: String,
    pub http_port: u16,
    /// The bearer token of the dump and nodes APIs, when the pod mounts one.
    pub api_token: Option<String>,
    /// The ServiceAccount token it runs with.
    pub sa_token: String,
    pub config: String,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Pod {
    pub fn logs(&self) -> String {
        format!(
            "{} stderr:\n{}\nstdout:\n{}",
            self.name,
            read(&self.stderr),
            read(&self.stdout)
        )
    }

    /// Panics with the logs when the process has exited.
    pub fn assert_alive(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!(
                "controller {} exited early ({status})\nconfig:\n{}\n{}",
                self.name,
                self.config,
                self.logs()
            );
        }
    }

    /// GET on the pod's HTTP port (with its API token).
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.http_port, path, self.api_token.as_deref())
    }

    /// What a probe of the pod template would see: its `httpGet.path` answers 200.
    pub fn probe_ok(&self, probe: &Value) -> bool {
        let path = probe["httpGet"]["path"].as_str().expect("probe path");
        http_get(self.http_port, path, None).is_some_and(|(c, _)| c == 200)
    }

    /// Asserts the logs show no permission error.
    pub fn assert_no_forbidden(&self) {
        let logs = self.logs();
        assert!(
            !logs.contains("Forbidden") && !logs.contains("forbidden") && !logs.contains(" 403"),
            "{} hit a permission error:\n{logs}",
            self.name
        );
        assert!(
            !logs.contains(&self.sa_token),
            "{}: the ServiceAccount token was logged",
            self.name
        );
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            #[expect(
                clippy::disallowed_methods,
                reason = "Drop cannot await: waits at most 5 s for the child to exit"
            )]
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where the in-cluster ServiceAccount files are (the kubelet's mount).
const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// Starts replica `pod` of the installed Deployment `namespace/deployment`
/// (see the module doc for what is taken from the API server and what is
/// emulated). The ServiceAccount token is issued for the pod template's
/// `serviceAccountName`.
pub async fn run_pod(env: &Env, namespace: &str, deployment: &str, pod: &str) -> Pod {
    assert!(
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "true"])
            .status()
            .is_ok_and(|s| s.success()),
        "`unshare --mount` failed: these tests emulate the kubelet's ServiceAccount mount \
         in a private mount namespace and need root (or CAP_SYS_ADMIN) and util-linux"
    );
    let dep = env.get_json(&["deployment", deployment, "-n", namespace]);
    let spec = &dep["spec"]["template"]["spec"];
    let container = &spec["containers"][0];
    let sa = spec["serviceAccountName"]
        .as_str()
        .expect("serviceAccountName");
    let volumes = spec["volumes"].as_array().expect("volumes");
    let mounts = container["volumeMounts"].as_array().expect("volumeMounts");
    let mount_of = |vol: &str| {
        mounts
            .iter()
            .find(|m| m["name"] == vol)
            .unwrap_or_else(|| panic!("no mount of volume {vol}: {mounts:?}"))
    };

    // The ConfigMap volume, mounted where --config points.
    let cm_vol = volumes
        .iter()
        .find(|v| v["configMap"].is_object())
        .expect("a ConfigMap volume");
    let cm_mount = mount_of(cm_vol["name"].as_str().expect("volume name"));
    let cm_path = cm_mount["mountPath"].as_str().expect("mountPath");
    let key = cm_mount["subPath"].as_str().expect("config subPath");
    let cm = env.get_json(&[
        "configmap",
        cm_vol["configMap"]["name"]
            .as_str()
            .expect("configMap name"),
        "-n",
        namespace,
    ]);
    let mut config = cm["data"][key].as_str().expect("config data").to_string();
    let dir = env.path(pod);
    std::fs::create_dir_all(&dir).expect("pod dir");

    // The API-token Secret volume, if any: the file the config names.
    let mut api_token = None;
    if let Some(v) = volumes.iter().find(|v| v["name"] == "http-auth") {
        let secret = env.get_json(&[
            "secret",
            v["secret"]["secretName"].as_str().expect("secretName"),
            "-n",
            namespace,
        ]);
        let item = &v["secret"]["items"][0];
        let b64 = secret["data"][item["key"].as_str().expect("item key")]
            .as_str()
            .expect("token data");
        use base64::Engine;
        let token = String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(b64)
                .expect("base64 token"),
        )
        .expect("utf-8 token");
        let pod_path = format!(
            "{}/{}",
            mount_of("http-auth")["mountPath"]
                .as_str()
                .expect("mountPath"),
            item["path"].as_str().expect("item path")
        );
        assert!(
            config.contains(&pod_path),
            "the config names the mounted token {pod_path}:\n{config}"
        );
        let local = dir.join("api-token");
        std::fs::write(&local, &token).expect("write token");
        config = config.replace(&pod_path, &local.display().to_string());
        api_token = Some(token);
    }
    let config_file = dir.join("config.yaml");
    std::fs::write(&config_file, &config).expect("write config");

    let args: Vec<String> = container["args"]
        .as_array()
        .expect("container args")
        .iter()
        .map(|a| {
            let a = a.as_str().expect("string arg");
            if a == cm_path {
                config_file.display().to_string()
            } else {
                a.to_string()
            }
        })
        .collect();
    assert!(
        args.contains(&config_file.display().to_string()),
        "--config points at the mounted ConfigMap {cm_path}: {args:?}"
    );

    // The kubelet's ServiceAccount mount and service environment.
    let sa_token = env
        .api
        .issue_token(namespace, sa)
        .await
        .expect("ServiceAccount token");
    let sa_src = dir.join("serviceaccount");
    std::fs::create_dir_all(&sa_src).expect("sa dir");
    std::fs::write(sa_src.join("token"), &sa_token).expect("token");
    std::fs::write(sa_src.join("ca.crt"), env.api.ca_pem().expect("CA")).expect("ca");
    std::fs::write(sa_src.join("namespace"), namespace).expect("namespace");

    let http_port = free_port();
    let (stdout, stderr) = (dir.join("stdout"), dir.join("stderr"));
    let mut cmd = Command::new("unshare");
    cmd.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
        .arg(format!(
            "mount -t tmpfs tmpfs /run && mkdir -p {SA_DIR} && cp \"$0\"/* {SA_DIR}/ && exec \"$@\""
        ))
        .arg(&sa_src)
        .arg(controller_bin())
        .args(&args)
        .args(["--http-addr", &format!("127.0.0.1:{http_port}")])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("KUBERNETES_SERVICE_HOST", "127.0.0.1")
        .env("KUBERNETES_SERVICE_PORT", env.api.addr().port().to_string())
        .stdout(Stdio::from(
            std::fs::File::create(&stdout).expect("stdout file"),
        ))
        .stderr(Stdio::from(
            std::fs::File::create(&stderr).expect("stderr file"),
        ));
    for e in container["env"].as_array().into_iter().flatten() {
        let name = e["name"].as_str().expect("env name");
        let value = match (
            e["value"].as_str(),
            e["valueFrom"]["fieldRef"]["fieldPath"].as_str(),
        ) {
            (Some(v), _) => v.to_string(),
            (None, Some("metadata.name")) => pod.to_string(),
            (None, Some("metadata.namespace")) => namespace.to_string(),
            other => panic!("env {name}: unexpected source {other:?}"),
        };
        cmd.env(name, value);
    }
    let child = cmd.spawn().expect("start the controller");
    Pod {
        child,
        name: pod.to_string(),
        http_port,
        api_token,
        sa_token,
        config,
        stdout,
        stderr,
    }
}

/// The Service `shop/web` with one EndpointSlice of `ready` endpoints
/// (`10.0.0.1..=n`, port 8080 named http).
pub fn backend_yaml(ready: usize) -> String {
    let endpoints: String = (1..=ready)
        .map(|i| format!("  - addresses: [\"10.0.0.{i}\"]\n    conditions: {{ready: true}}\n"))
        .collect();
    format!(
        r#"apiVersion: v1
kind: Namespace
metadata: {{name: shop}}
---
apiVersion: v1
kind: Service
metadata: {{name: web, namespace: shop}}
spec:
  selector: {{app: web}}
  ports: [{{name: http, port: 80, targetPort: 8080}}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-abcde
  namespace: shop
  labels: {{kubernetes.io/service-name: web}}
addressType: IPv4
ports: [{{name: http, port: 8080, protocol: TCP}}]
endpoints:
{endpoints}"#
    )
}

/// The expected nodes of [`backend_yaml`].
pub fn nodes(ready: usize) -> Value {
    Value::Array(
        (1..=ready)
            .map(|i| serde_json::json!({"host": format!("10.0.0.{i}"), "port": 8080, "weight": 50}))
            .collect(),
    )
}

/// Waits until DiscoveredService `ns/name` has `want` nodes under port `http`.
pub async fn wait_nodes(
    env: &Env,
    pods: &mut [&mut Pod],
    ns: &str,
    name: &str,
    want: &Value,
) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        for p in pods.iter_mut() {
            p.assert_alive();
        }
        let got = env.get_opt(&["dsvc", name, "-n", ns]);
        if let Some(v) = &got
            && v["spec"]["ports"]["http"] == *want
        {
            return v.clone();
        }
        assert!(
            Instant::now() < deadline,
            "DiscoveredService {ns}/{name} without {want} after 60s; last: {got:?}\n{}",
            pods.iter().map(|p| p.logs()).collect::<Vec<_>>().join("\n")
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
