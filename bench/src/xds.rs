//! Scenario `xds` (issue 32): the controller's xDS server under endpoint churn,
//! side by side with go-control-plane (`gcp-server`, its `LinearCache`) fed
//! the same changes, in the same run.
//!
//! One API server holds `services` services of `per` endpoints; the release
//! controller serves them over xDS, and `gcp-server` is loaded with the same
//! clusters. Then, per round (a number of streams) and protocol, for each
//! server in turn: `kd-bench xds-client` opens the streams (CDS wildcard +
//! EDS for every cluster, ACKing as Envoy does) and waits until each holds
//! everything; the harness makes `changes` changes at `rate` per second (one
//! service's endpoint set, one address replaced by a new one; consecutive
//! changes go to different services) and the client times, per change, the
//! first and the last stream holding the new set. The other server then gets
//! the same changes from the same state.
//!
//! A change's commit: for the controller, the API server's answer to the
//! write, received; for gcp-server, the moment its command is written to its
//! stdin. gcp-server skips the API server and the watch, so its floor is lower.
//! CPU seconds and RSS of the server, of the client process and of this
//! process (the API server when it is kube-sim, and the driver) are taken
//! from `/proc` over the change phase: from the first change until every
//! change reached every stream (or the timeout).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{ChildStdin, ChildStdout};
use tokio::time::Instant;

use crate::child::{Child, metric_sum};
use crate::env::Env;
use crate::load::{self, Mode, Svc};
use crate::procfs;
use crate::scenarios::{Opts, kib_to_mib, now_nanos, wait_ready};
use crate::stats::percentiles;
use crate::xds_client::{Plan, Proto};

/// The bearer token the controller's xDS server asks for.
const TOKEN: &str = "kd-bench-xds";
/// Port of every endpoint (the load's named port `http`).
const PORT: u16 = 8080;
/// Weight gcp-server is given per endpoint (the controller's default weight).
const WEIGHT: u32 = 50;
/// How long the streams may take to hold every cluster before the changes.
const SETUP_LIMIT: Duration = Duration::from_secs(300);
/// How far behind its plan the driver may fall before it stops making changes.
const DRIVE_SLACK: Duration = Duration::from_secs(30);

/// One round: a number of streams, the changes each protocol run makes.
#[derive(Debug, Clone)]
pub struct Round {
    /// ADS streams per server.
    pub streams: usize,
    /// Changes per (server, protocol) run.
    pub changes: usize,
    /// Protocols run, in order.
    pub protocols: Vec<Proto>,
}

/// Sizes of the scenario.
#[derive(Debug, Clone)]
pub struct XdsParams {
    /// Services (one cluster each: port `http`).
    pub services: usize,
    /// Endpoints per service.
    pub per: usize,
    /// Changes per second.
    pub rate: f64,
    /// The rounds, in order.
    pub rounds: Vec<Round>,
    /// How long after the last change every stream may take to hold it.
    pub grace: Duration,
}

/// `.tools/bin/gcp-server` at the repository root (`KD_BENCH_GCP_SERVER` overrides).
pub fn gcp_server_bin() -> Result<PathBuf> {
    let p = match std::env::var_os("KD_BENCH_GCP_SERVER") {
        Some(p) => PathBuf::from(p),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tools/bin/gcp-server"),
    };
    if !p.is_file() {
        bail!(
            "gcp-server not found at {}: build it with e2e/tools/install-xds-go.sh (or set KD_BENCH_GCP_SERVER)",
            p.display()
        );
    }
    Ok(p)
}

/// go-control-plane's ADS server, fed JSON commands on stdin.
struct Gcp {
    child: tokio::process::Child,
    pid: u32,
    addr: SocketAddr,
    /// Lines to write to its stdin (a writer task: a server that reads its
    /// commands slowly never blocks the driver).
    stdin: tokio::sync::mpsc::UnboundedSender<Vec<u8>>,
    /// Commands queued so far.
    seq: u64,
    /// Highest answered command, and whether one failed.
    answered: Arc<AtomicU64>,
    failed: Arc<std::sync::Mutex<Option<String>>>,
    log: PathBuf,
}

impl Gcp {
    async fn start(log: &Path) -> Result<Gcp> {
        let bin = gcp_server_bin()?;
        let logf = std::fs::File::create(log)?;
        let mut child = tokio::process::Command::new(&bin)
            .args(["--listen", "127.0.0.1:0"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(logf)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let pid = child.id().ok_or_else(|| anyhow!("gcp-server has no pid"))?;
        let mut pipe = child
            .stdin
            .take()
            .ok_or_else(|| anyhow!("gcp-server stdin"))?;
        let (stdin, mut lines) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
        tokio::spawn(async move {
            while let Some(l) = lines.recv().await {
                if pipe.write_all(&l).await.is_err() {
                    return;
                }
            }
        });
        let mut out = BufReader::new(child.stdout.take().ok_or_else(|| anyhow!("stdout"))?).lines();
        let first = tokio::time::timeout(Duration::from_secs(30), out.next_line())
            .await
            .context("gcp-server did not print its address within 30 s")??
            .ok_or_else(|| anyhow!("gcp-server exited before listening"))?;
        let v: Value = serde_json::from_str(&first)
            .with_context(|| format!("gcp-server's first line {first:?}"))?;
        let addr = v["listen"]
            .as_str()
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| anyhow!("gcp-server's first line {first:?} has no address"))?;
        let answered = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(std::sync::Mutex::new(None));
        tokio::spawn(read_answers(out, answered.clone(), failed.clone()));
        Ok(Gcp {
            child,
            pid,
            addr,
            stdin,
            seq: 0,
            answered,
            failed,
            log: log.to_path_buf(),
        })
    }

    /// Queues one command (one line) for its stdin.
    fn send(&mut self, cmd: &Value) -> Result<()> {
        let mut line = serde_json::to_vec(cmd)?;
        line.push(b'\n');
        self.stdin
            .send(line)
            .map_err(|_| anyhow!("gcp-server's stdin is closed: see {}", self.log.display()))?;
        self.seq += 1;
        Ok(())
    }

    /// Waits until every command written is answered.
    async fn settle(&mut self, limit: Duration) -> Result<()> {
        let t = Instant::now();
        loop {
            if let Some(e) = self
                .failed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone()
            {
                bail!("gcp-server refused a command: {e}");
            }
            if self.answered.load(Ordering::Acquire) >= self.seq {
                return Ok(());
            }
            if let Some(s) = self.child.try_wait()? {
                bail!("gcp-server exited with {s}: see {}", self.log.display());
            }
            if t.elapsed() > limit {
                bail!("gcp-server did not answer its commands within {limit:?}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

async fn read_answers(
    mut out: Lines<BufReader<ChildStdout>>,
    answered: Arc<AtomicU64>,
    failed: Arc<std::sync::Mutex<Option<String>>>,
) {
    while let Ok(Some(l)) = out.next_line().await {
        let Ok(v) = serde_json::from_str::<Value>(&l) else {
            continue;
        };
        if let Some(e) = v["error"].as_str() {
            failed
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .get_or_insert_with(|| e.to_string());
        }
        if let Some(s) = v["seq"].as_u64() {
            answered.fetch_max(s, Ordering::AcqRel);
        }
    }
}

fn cluster(i: usize) -> String {
    format!("{}/{}:http", load::NAMESPACE, load::svc_name(i))
}

fn addrs(svc: &Svc) -> Vec<String> {
    let mut v: Vec<String> = svc.eps.iter().map(|e| format!("{}:{PORT}", e.ip)).collect();
    v.sort();
    v
}

fn gcp_set(i: usize, svc: &Svc) -> Value {
    let eps: Vec<Value> = svc
        .eps
        .iter()
        .map(|e| json!([e.ip.to_string(), PORT, WEIGHT]))
        .collect();
    json!({"cluster": cluster(i), "endpoints": eps})
}

/// The changes of one (round, protocol): which service, which endpoint is
/// replaced by which new address. Consecutive changes go to services
/// `stride` apart, so a service changes again only after every other one did.
fn make_changes(
    svcs: &[Svc],
    n: usize,
    offset: usize,
    extra: &mut u32,
) -> Vec<(usize, usize, Ipv4Addr)> {
    let count = svcs.len();
    (0..n)
        .map(|k| {
            let svc = (offset + k) % count;
            let slot = (offset + k / count) % svcs[svc].eps.len().max(1);
            *extra += 1;
            (svc, slot, load::extra_ip(*extra))
        })
        .collect()
}

/// The server under test in one run.
enum Server<'a> {
    Controller(&'a mut Child, &'a Env, Mode, SocketAddr),
    Gcp(&'a mut Gcp),
}

impl Server<'_> {
    fn name(&self) -> &'static str {
        match self {
            Server::Controller(..) => "kube-discovery",
            Server::Gcp(_) => "go-control-plane",
        }
    }
    fn pid(&self) -> u32 {
        match self {
            Server::Controller(c, ..) => c.pid,
            Server::Gcp(g) => g.pid,
        }
    }
    fn addr(&self) -> SocketAddr {
        match self {
            Server::Controller(.., a) => *a,
            Server::Gcp(g) => g.addr,
        }
    }
}

/// Max RSS of some pids, sampled every 100 ms until stopped.
struct Sampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<u64>>,
}

impl Sampler {
    fn start(pids: Vec<u32>) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let task = tokio::spawn(async move {
            let mut max = vec![0u64; pids.len()];
            while !s.load(Ordering::Acquire) {
                for (m, pid) in max.iter_mut().zip(&pids) {
                    if let Ok(x) = procfs::sample(*pid) {
                        *m = (*m).max(x.rss_kib);
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            max
        });
        Sampler { stop, task }
    }
    async fn finish(self) -> Vec<u64> {
        self.stop.store(true, Ordering::Release);
        self.task.await.unwrap_or_default()
    }
}

/// The client process and its stdout.
struct Client {
    child: tokio::process::Child,
    pid: u32,
    stdin: ChildStdin,
    out: Lines<BufReader<ChildStdout>>,
    log: PathBuf,
}

impl Client {
    async fn start(
        env: &Env,
        addr: SocketAddr,
        proto: Proto,
        streams: usize,
        plan: &Path,
        token: Option<&str>,
        tag: &str,
    ) -> Result<Client> {
        let log = env.path(&format!("{tag}.log"));
        let mut cmd = tokio::process::Command::new(std::env::current_exe()?);
        cmd.args(["xds-client", "--addr", &addr.to_string(), "--protocol"])
            .arg(proto.as_str())
            .args(["--streams", &streams.to_string(), "--plan"])
            .arg(plan);
        if let Some(t) = token {
            cmd.args(["--token", t]);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log)?)
            .kill_on_drop(true)
            .spawn()
            .context("starting kd-bench xds-client")?;
        let pid = child.id().ok_or_else(|| anyhow!("xds-client has no pid"))?;
        let stdin = child.stdin.take().ok_or_else(|| anyhow!("stdin"))?;
        let out = BufReader::new(child.stdout.take().ok_or_else(|| anyhow!("stdout"))?).lines();
        Ok(Client {
            child,
            pid,
            stdin,
            out,
            log,
        })
    }

    /// The next stdout line with `key`, within `limit` (a `failed` line or
    /// the end of the output is an error).
    async fn wait_for(&mut self, key: &str, limit: Duration) -> Result<Option<Value>> {
        let deadline = Instant::now() + limit;
        loop {
            let line = match tokio::time::timeout_at(deadline, self.out.next_line()).await {
                Err(_) => return Ok(None),
                Ok(l) => l?,
            };
            let Some(line) = line else {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                bail!("xds-client exited while waiting for {key:?}: {log}");
            };
            let v: Value = serde_json::from_str(&line)
                .with_context(|| format!("xds-client printed {line:?}"))?;
            if v.get("failed").is_some() {
                bail!("xds-client: {v}");
            }
            if v.get(key).is_some() {
                return Ok(Some(v));
            }
        }
    }

    async fn finish(mut self) -> Result<Value> {
        self.stdin.write_all(b"stop\n").await?;
        let v = self
            .wait_for("last", Duration::from_secs(60))
            .await?
            .ok_or_else(|| anyhow!("xds-client printed no result"))?;
        let _ = tokio::time::timeout(Duration::from_secs(10), self.child.wait()).await;
        Ok(v)
    }
}

/// One (server, protocol, streams) run.
#[allow(clippy::too_many_arguments)]
async fn run_one(
    server: &mut Server<'_>,
    env: &Env,
    svcs: &mut [Svc],
    changes: &[(usize, usize, Ipv4Addr)],
    proto: Proto,
    streams: usize,
    p: &XdsParams,
    limit: Duration,
) -> Result<Value> {
    let name = server.name();
    let tag = format!("xds-client-{name}-{}-{streams}", proto.as_str());
    // The plan: the starting sets and the set after each change.
    let mut after = svcs.to_vec();
    let plan = Plan {
        names: (0..svcs.len()).map(cluster).collect(),
        start: svcs.iter().map(addrs).collect(),
        changes: changes
            .iter()
            .map(|&(s, slot, ip)| {
                after[s].eps[slot].ip = ip;
                (s, addrs(&after[s]))
            })
            .collect(),
    };
    let plan_path = env.path(&format!("{tag}.plan.json"));
    std::fs::write(&plan_path, serde_json::to_vec(&plan)?)?;
    let token = matches!(server, Server::Controller(..)).then_some(TOKEN);
    let t_setup = Instant::now();
    let mut client =
        Client::start(env, server.addr(), proto, streams, &plan_path, token, &tag).await?;
    let ready = client
        .wait_for("ready", limit.min(SETUP_LIMIT))
        .await?
        .ok_or_else(|| {
            anyhow!(
                "{streams} {} streams did not hold every cluster within {:?}",
                proto.as_str(),
                limit.min(SETUP_LIMIT)
            )
        })?;
    let setup_s = t_setup.elapsed().as_secs_f64();
    let spid = server.pid();
    let me = std::process::id();
    let metrics0 = match server {
        Server::Controller(c, ..) => c.get("/metrics").await.map(|(_, b)| b).unwrap_or_default(),
        Server::Gcp(_) => String::new(),
    };
    let (s0, c0, h0) = (
        procfs::sample(spid)?,
        procfs::sample(client.pid)?,
        procfs::sample(me)?,
    );
    let sampler = Sampler::start(vec![spid, client.pid]);

    // Changes at `rate`, each at its own time (open loop).
    let n = changes.len();
    let commit: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
    let t0 = Instant::now();
    // A server that cannot take the changes at the rate gets no more after
    // the planned time plus [`DRIVE_SLACK`]: the rest are "not made".
    let stop_at = t0 + Duration::from_secs_f64(n as f64 / p.rate) + DRIVE_SLACK;
    let mut made = n;
    let start_nanos = now_nanos();
    let mut behind_max = Duration::ZERO;
    let rvs: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
    let mark = match server {
        Server::Controller(_, env, ..) => env.rv().await?,
        Server::Gcp(_) => 0,
    };
    match server {
        Server::Controller(_, env, mode, _) => {
            let sem = Arc::new(tokio::sync::Semaphore::new(64));
            let mut tasks = tokio::task::JoinSet::new();
            for (k, &(s, slot, ip)) in changes.iter().enumerate() {
                let at = t0 + Duration::from_secs_f64(k as f64 / p.rate);
                tokio::time::sleep_until(at).await;
                let Ok(permit) =
                    tokio::time::timeout_at(stop_at, sem.clone().acquire_owned()).await
                else {
                    made = k;
                    break;
                };
                let permit = permit?;
                behind_max = behind_max.max(at.elapsed());
                svcs[s].eps[slot].ip = ip;
                let (svc, client, mode, commit, rvs) = (
                    svcs[s].clone(),
                    env.client.clone(),
                    *mode,
                    commit.clone(),
                    rvs.clone(),
                );
                tasks.spawn(async move {
                    let rv = load::update(&client, mode, &svc).await?;
                    // The answer's arrival; replaced below by the commit
                    // time of the write log.
                    commit[k].store(now_nanos(), Ordering::Release);
                    rvs[k].store(rv, Ordering::Release);
                    drop(permit);
                    anyhow::Ok(())
                });
                while let Some(r) = tasks.try_join_next() {
                    r??;
                }
            }
            while let Some(r) = tasks.join_next().await {
                r??;
            }
        }
        Server::Gcp(g) => {
            for (k, &(s, slot, ip)) in changes.iter().enumerate() {
                let at = t0 + Duration::from_secs_f64(k as f64 / p.rate);
                tokio::time::sleep_until(at).await;
                behind_max = behind_max.max(at.elapsed());
                svcs[s].eps[slot].ip = ip;
                commit[k].store(now_nanos(), Ordering::Release);
                g.send(&json!({"set": gcp_set(s, &svcs[s])}))?;
            }
        }
    }
    let drive_s = t0.elapsed().as_secs_f64();
    let n = made;
    let all = client.wait_for("all_held", p.grace).await?.is_some();
    let window_s = t0.elapsed().as_secs_f64();
    let (s1, c1, h1) = (
        procfs::sample(spid)?,
        procfs::sample(client.pid)?,
        procfs::sample(me)?,
    );
    let max_rss = sampler.finish().await;
    // gcp-server may still be working through the commands (a backlog is
    // part of the result, not a failure of the run).
    let backlog = match server {
        Server::Gcp(g) => g
            .settle(Duration::from_secs(5))
            .await
            .is_err()
            .then(|| g.seq - g.answered.load(Ordering::Acquire)),
        Server::Controller(..) => None,
    };
    let metrics1 = match server {
        Server::Controller(c, ..) => c.get("/metrics").await.map(|(_, b)| b).unwrap_or_default(),
        Server::Gcp(_) => String::new(),
    };
    let r = client.finish().await?;
    // The controller's commits: the write log's time of each change's write.
    let mut from_log = 0usize;
    if let Server::Controller(_, env, mode, _) = server {
        let times: std::collections::HashMap<u64, u64> = env
            .writes_since(mark)
            .await?
            .into_iter()
            .filter(|w| w.resource == mode.plural())
            .map(|w| (w.resource_version, w.time_nanos))
            .collect();
        for k in 0..n {
            if let Some(&t) = times.get(&rvs[k].load(Ordering::Acquire)) {
                commit[k].store(t, Ordering::Release);
                from_log += 1;
            }
        }
    }
    let nums = |k: &str| -> Vec<u64> {
        r[k].as_array()
            .map(|a| a.iter().map(|v| v.as_u64().unwrap_or(0)).collect())
            .unwrap_or_default()
    };
    let (first, last) = (nums("first"), nums("last"));
    let mut lat = Vec::new();
    let mut lat_first = Vec::new();
    for k in 0..n {
        let c = commit[k].load(Ordering::Acquire);
        if last.get(k).is_some_and(|&l| l > 0) {
            lat.push((last[k] as f64 - c as f64) / 1e6);
        }
        if first.get(k).is_some_and(|&f| f > 0) {
            lat_first.push((first[k] as f64 - c as f64) / 1e6);
        }
    }
    let reached = lat.len();
    let bytes = r["bytes"].as_u64().unwrap_or(0);
    let server_cpu = s1.cpu_s - s0.cpu_s;
    let mut out = json!({
        "server": name, "protocol": proto.as_str(), "streams": streams, "changes": n,
        "changes_not_made": changes.len() - n,
        "commands_unanswered_at_end": backlog,
        "rate_target": p.rate, "rate_achieved": n as f64 / drive_s.max(1e-9),
        "driver_behind_max_ms": behind_max.as_secs_f64() * 1e3,
        "setup_s": setup_s, "client_setup_s": ready["setup_s"],
        "assignment_bytes": ready["start_bytes_per_assignment"],
        "commit": if name == "kube-discovery" { "the write's commit in the API server's write log" } else { "command queued for gcp-server's stdin" },
        "commits_from_write_log": from_log,
        "reached_every_stream": reached, "missed": n - reached, "all_held": all,
        "latency_last_stream_ms": percentiles(&mut lat),
        "latency_first_stream_ms": percentiles(&mut lat_first),
        "window_s": window_s,
        "server_cpu_s": server_cpu, "server_cpu_share": server_cpu / window_s.max(1e-9),
        "server_rss_mib_before": kib_to_mib(s0.rss_kib), "server_rss_mib_max": kib_to_mib(max_rss.first().copied().unwrap_or(0).max(s1.rss_kib)),
        "server_rss_mib_end": kib_to_mib(s1.rss_kib), "server_peak_rss_mib": kib_to_mib(s1.hwm_kib),
        "client_cpu_s": c1.cpu_s - c0.cpu_s, "client_rss_mib_max": kib_to_mib(max_rss.get(1).copied().unwrap_or(0).max(c1.rss_kib)),
        "harness_cpu_s": h1.cpu_s - h0.cpu_s,
        "bytes_received": bytes,
        "bytes_per_change_per_stream": bytes as f64 / (n.max(1) * streams.max(1)) as f64,
        "responses_per_stream": r["responses"].as_u64().unwrap_or(0) as f64 / streams.max(1) as f64,
        "resources_received": r["resources"], "removed_received": r["removed"],
        "unknown_assignments": r["unknown"], "distinct_assignments": r["distinct_assignments"],
        "start_unix_nanos": start_nanos,
    });
    if !metrics0.is_empty() {
        let d = |m: &str, f: &str| metric_sum(&metrics1, m, f) - metric_sum(&metrics0, m, f);
        let pushes = d("kube_discovery_xds_pushes_total", "type=\"eds\"");
        let lat_sum = d("kube_discovery_xds_push_latency_seconds_sum", "");
        let lat_n = d("kube_discovery_xds_push_latency_seconds_count", "");
        let mean_ms = (lat_n > 0.0).then(|| lat_sum / lat_n * 1e3);
        let bucket = |q: f64| {
            bucket_bound(
                &metrics0,
                &metrics1,
                "kube_discovery_xds_push_latency_seconds_bucket",
                q,
            )
            .map(|s| s * 1e3)
        };
        out["controller_metrics"] = json!({
            "eds_pushes": pushes,
            "sent_bytes": d("kube_discovery_xds_sent_bytes_total", ""),
            "push_latency_mean_ms": mean_ms,
            // The histogram's bucket holding the quantile: "at most" this.
            "push_latency_p50_at_most_ms": bucket(0.5),
            "push_latency_p99_at_most_ms": bucket(0.99),
            "nacks": d("kube_discovery_xds_nacks_total", ""),
        });
    }
    Ok(out)
}

/// The upper bound of the bucket of histogram `bucket_name` (its `_bucket`
/// series) that holds quantile `q` of the observations between two
/// scrapes (`None`: none, or beyond the last finite bucket).
fn bucket_bound(before: &str, after: &str, bucket_name: &str, q: f64) -> Option<f64> {
    let buckets = |text: &str| -> Vec<(f64, f64)> {
        let mut v: Vec<(f64, f64)> = text
            .lines()
            .filter(|l| l.starts_with(bucket_name))
            .filter_map(|l| {
                let le = l.split("le=\"").nth(1)?.split('"').next()?;
                let le: f64 = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                let n: f64 = l.rsplit_once(' ')?.1.parse().ok()?;
                Some((le, n))
            })
            .collect();
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
        v
    };
    let (b0, b1) = (buckets(before), buckets(after));
    let total = b1.last()?.1 - b0.last().map_or(0.0, |x| x.1);
    if total <= 0.0 {
        return None;
    }
    b1.iter()
        .map(|(le, n)| {
            let was = b0.iter().find(|(l, _)| l == le).map_or(0.0, |x| x.1);
            (*le, n - was)
        })
        .find(|(_, n)| *n >= q * total)
        .map(|(le, _)| le)
        .filter(|le| le.is_finite())
}

/// Runs the scenario.
pub async fn xds(opts: &Opts, mode: Mode, p: &XdsParams) -> Result<Value> {
    let env = Env::start(opts.apiserver, opts.controller_user.as_deref(), 100_000).await?;
    let mut svcs = load::services(p.services, p.per);
    let t = Instant::now();
    load::create_all(&env.client, mode, &svcs, 32).await?;
    let create_s = t.elapsed().as_secs_f64();
    let token_file = env.path("xds-token");
    std::fs::write(&token_file, format!("{TOKEN}\n"))?;
    let cfg = env.path("xds.yaml");
    let block = format!(
        "{}  xds:\n    addr: 127.0.0.1:0\n    auth_token_file: {}\n",
        opts.kube_discovery_block(),
        token_file.display()
    );
    std::fs::write(&cfg, env.controller_config(mode == Mode::Slices, &block)?)?;
    let log = env.path("xds-controller.log");
    let mut c = Child::controller(&opts.bin, &cfg, &log).await?;
    let ready_s = wait_ready(&mut c, opts.timeout).await?.as_secs_f64();
    let xds_addr: SocketAddr = {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["message"] == "xDS server listening")
            .and_then(|v| v["addr"].as_str().and_then(|a| a.parse().ok()))
            .ok_or_else(|| anyhow!("the controller did not log \"xDS server listening\""))?
    };
    let mut gcp = Gcp::start(&env.path("gcp-server.log")).await?;
    let t = Instant::now();
    let all: Vec<Value> = svcs
        .iter()
        .enumerate()
        .map(|(i, s)| gcp_set(i, s))
        .collect();
    gcp.send(&json!({"set": all}))?;
    gcp.settle(opts.timeout).await?;
    let gcp_load_s = t.elapsed().as_secs_f64();
    let (c_idle, g_idle) = (procfs::sample(c.pid)?, procfs::sample(gcp.pid)?);

    let mut runs = Vec::new();
    let mut failures = Vec::new();
    let mut extra = 0u32;
    let mut offset = 0usize;
    for round in &p.rounds {
        for &proto in &round.protocols {
            let changes = make_changes(&svcs, round.changes, offset, &mut extra);
            offset += round.changes;
            let start = svcs.clone();
            // The API server's state after the controller's run (the changes
            // it made) is where the next round starts.
            let mut next = None;
            for which in ["kube-discovery", "go-control-plane"] {
                // Both servers start from the same state.
                let mut state = start.clone();
                eprintln!(
                    "kd-bench: xds {which} {} x {} streams, {} changes ...",
                    proto.as_str(),
                    round.streams,
                    round.changes
                );
                let mut server = if which == "kube-discovery" {
                    Server::Controller(&mut c, &env, mode, xds_addr)
                } else {
                    // The start state again (a no-op unless an earlier run
                    // failed half way), before any stream connects.
                    let all: Vec<Value> = start
                        .iter()
                        .enumerate()
                        .map(|(i, s)| gcp_set(i, s))
                        .collect();
                    gcp.send(&json!({"set": all}))?;
                    // Also the end of the previous run's backlog, if it had one.
                    gcp.settle(SETUP_LIMIT).await?;
                    Server::Gcp(&mut gcp)
                };
                let r = run_one(
                    &mut server,
                    &env,
                    &mut state,
                    &changes,
                    proto,
                    round.streams,
                    p,
                    opts.timeout,
                )
                .await;
                match r {
                    Ok(v) => runs.push(v),
                    Err(e) => {
                        eprintln!("kd-bench: xds {which} {}: FAILED: {e:#}", proto.as_str());
                        failures.push(json!({"server": which, "protocol": proto.as_str(), "streams": round.streams, "error": format!("{e:#}")}));
                    }
                }
                if which == "kube-discovery" {
                    next = Some(state);
                }
                // Let the server go quiet before the next run.
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            svcs = next.unwrap_or(start);
        }
    }
    // A server gone by now (say, out of memory) must not lose the runs measured.
    let (c_end, g_end) = (
        procfs::sample(c.pid).unwrap_or_default(),
        procfs::sample(gcp.pid).unwrap_or_default(),
    );
    if let Err(e) = c.stop().await {
        failures.push(json!({"server": "kube-discovery", "protocol": "-", "streams": 0, "error": format!("stopping: {e:#}")}));
    }
    drop(gcp);
    let targets = targets(&runs);
    Ok(json!({
        "scenario": "xds", "mode": mode.as_str(), "services": p.services, "endpoints_per_service": p.per,
        "rate": p.rate, "create_s": create_s, "controller_ready_s": ready_s, "gcp_load_s": gcp_load_s,
        "idle_rss_mib": {"kube-discovery": kib_to_mib(c_idle.rss_kib), "go-control-plane": kib_to_mib(g_idle.rss_kib)},
        "peak_rss_mib": {"kube-discovery": kib_to_mib(c_end.hwm_kib), "go-control-plane": kib_to_mib(g_end.hwm_kib)},
        "runs": runs, "failures": failures, "targets": targets,
    }))
}

/// The targets per (streams, protocol), the controller against
/// gcp-server of the same round.
fn targets(runs: &[Value]) -> Value {
    let mut out = Vec::new();
    for r in runs.iter().filter(|r| r["server"] == "kube-discovery") {
        let peer = runs.iter().find(|g| {
            g["server"] == "go-control-plane"
                && g["protocol"] == r["protocol"]
                && g["streams"] == r["streams"]
        });
        let p99 = r["latency_last_stream_ms"]["p99"].as_f64();
        let mut t = json!({
            "protocol": r["protocol"], "streams": r["streams"],
            "p99_le_50ms": p99.map(|x| x <= 50.0),
            "every_change_reached_every_stream": r["missed"] == 0,
            "cpu_le_go_control_plane": peer.and_then(|g| Some(r["server_cpu_s"].as_f64()? <= g["server_cpu_s"].as_f64()?)),
        });
        if r["protocol"] == "delta" {
            t["delta_bytes_per_change_le_2x_assignment"] = json!(
                r["bytes_per_change_per_stream"]
                    .as_f64()
                    .zip(r["assignment_bytes"].as_f64())
                    .map(|(b, a)| b <= 2.0 * a)
            );
        }
        out.push(t);
    }
    Value::Array(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_visit_every_service_before_repeating_one() {
        let svcs = load::services(4, 3);
        let mut extra = 0;
        let ch = make_changes(&svcs, 10, 2, &mut extra);
        let order: Vec<usize> = ch.iter().map(|c| c.0).collect();
        assert_eq!(order, [2, 3, 0, 1, 2, 3, 0, 1, 2, 3]);
        // Fresh addresses every time, slots within the service.
        let mut ips: Vec<Ipv4Addr> = ch.iter().map(|c| c.2).collect();
        ips.dedup();
        assert_eq!(ips.len(), 10);
        assert!(ch.iter().all(|c| c.1 < 3));
        assert_eq!(extra, 10);
    }

    #[test]
    fn histogram_bucket_of_a_quantile_between_two_scrapes() {
        let name = "x_seconds_bucket";
        let before = "x_seconds_bucket{le=\"0.001\"} 5\nx_seconds_bucket{le=\"0.002\"} 5\nx_seconds_bucket{le=\"+Inf\"} 5\n";
        let after = "x_seconds_bucket{le=\"0.001\"} 55\nx_seconds_bucket{le=\"0.002\"} 104\nx_seconds_bucket{le=\"+Inf\"} 105\n";
        assert_eq!(bucket_bound(before, after, name, 0.5), Some(0.001));
        assert_eq!(bucket_bound(before, after, name, 0.99), Some(0.002));
        assert_eq!(bucket_bound(before, after, name, 1.0), None);
        assert_eq!(bucket_bound(after, after, name, 0.5), None);
    }

    #[test]
    fn targets_compare_with_the_peer_of_the_same_round() {
        let run = |server: &str, proto: &str, cpu: f64, p99: f64, bytes: f64| {
            json!({"server": server, "protocol": proto, "streams": 100, "server_cpu_s": cpu,
                   "latency_last_stream_ms": {"p99": p99}, "missed": 0,
                   "bytes_per_change_per_stream": bytes, "assignment_bytes": 100.0})
        };
        let t = targets(&[
            run("kube-discovery", "delta", 2.0, 40.0, 150.0),
            run("go-control-plane", "delta", 3.0, 20.0, 120.0),
            run("kube-discovery", "sotw", 4.0, 60.0, 900.0),
            run("go-control-plane", "sotw", 3.0, 20.0, 120.0),
        ]);
        assert_eq!(t[0]["p99_le_50ms"], true);
        assert_eq!(t[0]["cpu_le_go_control_plane"], true);
        assert_eq!(t[0]["delta_bytes_per_change_le_2x_assignment"], true);
        assert_eq!(t[1]["p99_le_50ms"], false);
        assert_eq!(t[1]["cpu_le_go_control_plane"], false);
        assert!(
            t[1].get("delta_bytes_per_change_le_2x_assignment")
                .is_none()
        );
    }
}
