//! The measured processes: the release `kube-discovery run` and the echo client
//! (`kd-bench echo`), each a separate OS process so `/proc` attributes memory
//! and CPU to it alone. Logs go to files in the scratch directory; the
//! controller's HTTP address comes from its own "HTTP server listening" log line
//! (`--http-addr 127.0.0.1:0`, so runs never fight over a port).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::procfs;

/// A running child process.
pub struct Child {
    child: tokio::process::Child,
    /// Its pid.
    pub pid: u32,
    /// Its log file (stderr).
    pub log: PathBuf,
    /// The controller's HTTP address (controller only).
    pub http: Option<SocketAddr>,
    /// Highest `VmRSS` seen by [`Child::sample`], KiB.
    pub max_rss_kib: u64,
}

/// The `kube-discovery` binary: `--controller-bin`, else `KUBE_DISCOVERY_BIN`,
/// else next to this executable (`target/<profile>/kube-discovery`).
pub fn controller_bin(explicit: Option<&Path>) -> Result<PathBuf> {
    let p = match explicit {
        Some(p) => p.to_path_buf(),
        None => match std::env::var_os("KUBE_DISCOVERY_BIN") {
            Some(p) => PathBuf::from(p),
            None => std::env::current_exe()?
                .parent()
                .ok_or_else(|| anyhow!("executable has no directory"))?
                .join("kube-discovery"),
        },
    };
    if !p.is_file() {
        bail!(
            "kube-discovery binary {} not found: build it (`cargo build --release -p kube-discovery`) or pass --controller-bin",
            p.display()
        );
    }
    Ok(p)
}

impl Child {
    /// Starts `kube-discovery --log-format json run --config <config>` and waits
    /// (up to 60 s) for its HTTP server.
    pub async fn controller(bin: &Path, config: &Path, log: &Path) -> Result<Child> {
        let logf =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let child = tokio::process::Command::new(bin)
            .args(["--log-format", "json", "run", "--config"])
            .arg(config)
            .args(["--http-addr", "127.0.0.1:0"])
            .env_remove("KUBECONFIG")
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(logf)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let pid = child.id().ok_or_else(|| anyhow!("controller has no pid"))?;
        let mut c = Child {
            child,
            pid,
            log: log.to_path_buf(),
            http: None,
            max_rss_kib: 0,
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = c.child.try_wait()? {
                bail!("kube-discovery exited with {status}:\n{}", c.log_tail());
            }
            let text = std::fs::read_to_string(log).unwrap_or_default();
            let addr = text
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find(|v| v["message"] == "HTTP server listening")
                .and_then(|v| v["addr"].as_str().and_then(|a| a.parse().ok()));
            if let Some(a) = addr {
                c.http = Some(a);
                return Ok(c);
            }
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "kube-discovery did not log \"HTTP server listening\" within 60 s:\n{}",
                    c.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Starts `<this exe> echo --kubeconfig <kc> [--slices]`; it prints
    /// `synced` on stdout once its first list is applied, which this waits for.
    pub async fn echo(kubeconfig: &Path, slices: bool, log: &Path) -> Result<Child> {
        let exe = std::env::current_exe()?;
        let logf =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let mut cmd = tokio::process::Command::new(exe);
        cmd.args(["echo", "--kubeconfig"]).arg(kubeconfig);
        if slices {
            cmd.arg("--slices");
        }
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(logf)
            .kill_on_drop(true)
            .spawn()
            .context("starting the echo client")?;
        let pid = child.id().ok_or_else(|| anyhow!("echo has no pid"))?;
        let mut out = child.stdout.take().ok_or_else(|| anyhow!("echo stdout"))?;
        let mut buf = Vec::new();
        let wait = async {
            let mut b = [0u8; 256];
            loop {
                let n = out.read(&mut b).await?;
                if n == 0 {
                    bail!("echo client exited before its first list was applied");
                }
                buf.extend_from_slice(&b[..n]);
                if String::from_utf8_lossy(&buf).contains("synced") {
                    return Ok(());
                }
            }
        };
        let c = Child {
            child,
            pid,
            log: log.to_path_buf(),
            http: None,
            max_rss_kib: 0,
        };
        match tokio::time::timeout(Duration::from_secs(300), wait).await {
            Ok(Ok(())) => Ok(c),
            Ok(Err(e)) => Err(e.context(c.log_tail())),
            Err(_) => bail!("echo client not synced within 300 s:\n{}", c.log_tail()),
        }
    }

    /// The last lines of the log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    /// Samples `/proc` and tracks the maximum RSS.
    pub fn sample(&mut self) -> Result<procfs::Sample> {
        let s = procfs::sample(self.pid)?;
        self.max_rss_kib = self.max_rss_kib.max(s.rss_kib);
        Ok(s)
    }

    /// GET `path` on the controller's HTTP server: (status, body).
    pub async fn get(&self, path: &str) -> Result<(u16, String)> {
        let addr = self.http.ok_or_else(|| anyhow!("not a controller"))?;
        http_get(addr, path).await
    }

    /// SIGTERM, then wait up to 30 s for the exit (killed after that).
    pub async fn stop(mut self) -> Result<()> {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status();
        match tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await {
            Ok(status) => {
                let status = status?;
                if !status.success() {
                    bail!(
                        "process {} exited with {status}:\n{}",
                        self.pid,
                        self.log_tail()
                    );
                }
                Ok(())
            }
            Err(_) => {
                self.child.kill().await?;
                bail!(
                    "process {} did not stop within 30 s after SIGTERM",
                    self.pid
                )
            }
        }
    }
}

/// Minimal HTTP/1.1 GET (`Connection: close`), enough for probes and metrics.
pub async fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String)> {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await?;
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    Ok((code, body))
}

fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((len, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(len.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        s = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// Sum of every sample of a Prometheus metric family whose label text contains
/// `label_filter` (`""` = all), from the text exposition format.
pub fn metric_sum(text: &str, name: &str, label_filter: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, labels) = match series.split_once('{') {
                Some((n, rest)) => (n, rest),
                None => (series, ""),
            };
            (n == name && labels.contains(label_filter))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_metric_samples() {
        let text = "# HELP x y\nkube_discovery_writes_total{cluster=\"\",result=\"applied\"} 3\nkube_discovery_writes_total{cluster=\"\",result=\"deleted\"} 2\nkube_discovery_nodes{cluster=\"\"} 7\n";
        assert_eq!(metric_sum(text, "kube_discovery_writes_total", ""), 5.0);
        assert_eq!(
            metric_sum(text, "kube_discovery_writes_total", "result=\"applied\""),
            3.0
        );
        assert_eq!(metric_sum(text, "kube_discovery_nodes", ""), 7.0);
        assert_eq!(metric_sum(text, "missing", ""), 0.0);
    }
}
