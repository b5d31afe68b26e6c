//! `kd-bench`: the benchmark harness of kube-discovery (issue 6).
//!
//! ```text
//!  kd-bench ──in-process──▶ kube-sim (fresh per scenario; write log = the clock)
//!     │                        ▲            ▲
//!     ├─spawn─▶ kube-discovery run (release binary, separate process)
//!     │          /readyz, /metrics; /proc/<pid>/{status,stat}
//!     └─spawn─▶ kd-bench echo  (the "floor": watcher + one apply per event)
//! ```
//!
//! `kd-bench --size full --out bench/results/full.json` runs every scenario
//! (see [`scenarios`]) and writes the JSON plus a Markdown table next to it
//! (`.md`); the JSON is rewritten after every run, so a partial run keeps what
//! it measured. `--size tiny` is the CI smoke size (seconds, no timing asserted).
//! `kd-bench echo` is the echo client itself (spawned by the harness).
//! `kd-bench --apiserver real --only gateways` (not a default: it needs kwok,
//! nginx and HAProxy) measures how fast nginx, HAProxy and the Rust proxy
//! follow Pods of real Deployments (see [`gateways`]).
//! `kd-bench --only xds` (not a default) measures the controller's xDS server
//! against go-control-plane under churn (see [`xds`]); `kd-bench xds-client`
//! is its ADS load (spawned by the harness).

mod child;
mod coalesce;
mod echo;
mod env;
mod gateways;
mod kwok_scale;
mod load;
mod multi;
mod procfs;
mod report;
mod scenarios;
mod stats;
mod sweep;
mod xds;
mod xds_client;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand, ValueEnum};
use serde_json::{Value, json};

use crate::coalesce::CoalesceParams;
use crate::load::Mode;
use crate::scenarios::{ChurnParams, Opts};
use crate::xds_client::Proto;

/// Benchmarks of kube-discovery against kube-sim.
#[derive(Debug, Parser)]
#[command(name = "kd-bench", about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Cmd>,
    /// Workload size.
    #[arg(long, value_enum, default_value_t = Size::Full)]
    size: Size,
    /// Scenarios to run (comma separated). Also, not run by default: `lone`
    /// and `rollout` (the coalescing scenarios), `xds` (the xDS server
    /// against go-control-plane); with `--apiserver real`,
    /// `kwok-scale` (10,000 kwok Pods through the real controllers) and
    /// `gateways` (nginx, HAProxy and the Rust proxy in front of kwok Pods).
    #[arg(long, value_delimiter = ',', default_values = ["sync", "churn", "recovery", "multi", "sweep"])]
    only: Vec<String>,
    /// Result JSON; the Markdown table goes next to it with `.md`.
    #[arg(long, default_value = "kd-bench-results.json")]
    out: PathBuf,
    /// The kube-discovery binary (default: next to kd-bench).
    #[arg(long)]
    controller_bin: Option<PathBuf>,
    /// `kube_discovery.coalesce_window` in milliseconds.
    #[arg(long, default_value_t = 100)]
    window_ms: u64,
    /// `kube_discovery.coalesce_leading_edge`: `true` writes a change to a
    /// quiet service at once, `false` makes every change wait the window
    /// (default: not set, the controller's default).
    #[arg(long, value_name = "true|false")]
    coalesce_leading_edge: Option<bool>,
    /// `kube_discovery.write_qps`, the ceiling of the controller's adaptive
    /// write limiter (ignored with `--controller-defaults`).
    #[arg(long, default_value_t = 10000.0)]
    write_qps: f64,
    /// Run the controller at its default write settings: no `write_qps`
    /// (nor `write_concurrency`) in its configuration.
    #[arg(long)]
    controller_defaults: bool,
    /// The controller authenticates as this plain user (bound to
    /// `cluster-admin`) instead of the admin: on the real API server it is
    /// then subject to API Priority and Fairness (`system:masters` is exempt).
    #[arg(long)]
    controller_user: Option<String>,
    /// `kube_discovery.write_concurrency` (default: the controller's own, 32).
    #[arg(long)]
    write_concurrency: Option<usize>,
    /// Override the churn rate (changes/s).
    #[arg(long)]
    churn_rate: Option<f64>,
    /// Override the churn duration (s).
    #[arg(long)]
    churn_seconds: Option<f64>,
    /// The `sweep` scenario's rates (changes/s, ascending, comma separated).
    #[arg(long, value_delimiter = ',')]
    sweep_rates: Vec<f64>,
    /// Override the outage duration (s).
    #[arg(long)]
    outage_seconds: Option<f64>,
    /// The `multi` scenario's size as `CLUSTERSxSERVICESxENDPOINTS`
    /// (services and endpoints per cluster), overriding the size's.
    #[arg(long)]
    multi_size: Option<String>,
    /// Sync sizes to run as `SERVICESxENDPOINTS` (comma separated), overriding the size's list.
    #[arg(long, value_delimiter = ',')]
    sync_sizes: Vec<String>,
    /// Source modes to run (comma separated: slices, endpoints).
    #[arg(long, value_delimiter = ',', default_values = ["slices", "endpoints"])]
    modes: Vec<String>,
    /// The API server: kube-sim in-process, or the real kube-apiserver + etcd
    /// (v1.34.4 / v3.6.4, built by `e2e/controlplane/build.sh`). The real one
    /// runs `sync` and `churn` (`recovery` needs kube-sim's fault hooks in the
    /// controller's path).
    #[arg(long, value_enum, default_value_t = ApiServer::KubeSim)]
    apiserver: ApiServer,
    /// The `xds` scenario's services as `SERVICESxENDPOINTS`, overriding the size's.
    #[arg(long)]
    xds_size: Option<String>,
    /// The `xds` scenario's rounds as `STREAMS:CHANGES:PROTOCOLS` (protocols
    /// `sotw`, `delta`, joined by `+`), comma separated, overriding the size's.
    #[arg(long, value_delimiter = ',')]
    xds_rounds: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum ApiServer {
    /// kube-sim, in this process.
    KubeSim,
    /// The real control plane, as separate processes.
    Real,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run the echo client (used by the harness).
    Echo {
        /// Kubeconfig.
        #[arg(long)]
        kubeconfig: PathBuf,
        /// Watch EndpointSlices instead of Endpoints.
        #[arg(long)]
        slices: bool,
    },
    /// Run the ADS load client of the `xds` scenario (used by the harness).
    XdsClient {
        /// The ADS server.
        #[arg(long)]
        addr: std::net::SocketAddr,
        /// `sotw` or `delta`.
        #[arg(long)]
        protocol: String,
        /// Streams (one connection each).
        #[arg(long)]
        streams: usize,
        /// The plan (JSON, written by the harness).
        #[arg(long)]
        plan: PathBuf,
        /// Bearer token.
        #[arg(long)]
        token: Option<String>,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Size {
    /// Seconds: the CI smoke size.
    Tiny,
    /// The sizes of issue 6.
    Full,
}

struct RunSizes {
    sync: Vec<(usize, usize)>,
    churn: ChurnParams,
    recovery: (usize, usize, f64),
    /// clusters, services per cluster, endpoints per service, changed
    /// services, outage seconds.
    multi: (usize, usize, usize, usize, f64),
    /// The churn of each sweep step, and the rates.
    sweep: (ChurnParams, Vec<f64>),
    scale: kwok_scale::ScaleParams,
    /// `lone` and `rollout`.
    coalesce: CoalesceParams,
    gateways: gateways::GatewayParams,
    xds: xds::XdsParams,
    timeout: Duration,
}

fn plan(cli: &Cli) -> Result<RunSizes> {
    let mut p = match cli.size {
        Size::Tiny => RunSizes {
            sync: vec![(20, 5)],
            churn: ChurnParams {
                relevant: 20,
                irrelevant: 5,
                per: 5,
                rate: 40.0,
                irrelevant_share: 0.2,
                seconds: 2.0,
            },
            recovery: (20, 5, 1.0),
            multi: (3, 20, 5, 5, 1.0),
            sweep: (
                ChurnParams {
                    relevant: 16,
                    irrelevant: 4,
                    per: 5,
                    rate: 0.0,
                    irrelevant_share: 0.2,
                    seconds: 1.0,
                },
                vec![20.0, 40.0],
            ),
            scale: kwok_scale::ScaleParams {
                deployments: 20,
                replicas: 3,
                rolling: 5,
                nodes: 3,
                api_qps: 100,
            },
            coalesce: CoalesceParams {
                lone_services: 10,
                lone_changes: 8,
                rollout_services: 3,
                replicas: 3,
                grace_ms: 1000,
            },
            gateways: gateways::GatewayParams {
                replicas: 3,
                rollouts: 1,
                grace_s: 2,
                clients: 4,
                every: Duration::from_millis(5),
            },
            xds: xds::XdsParams {
                services: 50,
                per: 5,
                rate: 100.0,
                rounds: vec![xds::Round {
                    streams: 5,
                    changes: 50,
                    protocols: vec![Proto::Sotw, Proto::Delta],
                }],
                grace: Duration::from_secs(20),
            },
            timeout: Duration::from_secs(60),
        },
        Size::Full => RunSizes {
            sync: vec![(1000, 10), (10_000, 10), (100, 1000), (1, 20_000)],
            churn: ChurnParams {
                relevant: 1000,
                irrelevant: 100,
                per: 10,
                rate: 500.0,
                irrelevant_share: 0.2,
                seconds: 30.0,
            },
            recovery: (10_000, 10, 30.0),
            multi: (10, 10_000, 10, 100, 10.0),
            sweep: (
                ChurnParams {
                    relevant: 9000,
                    irrelevant: 1000,
                    per: 10,
                    rate: 0.0,
                    irrelevant_share: 0.2,
                    seconds: 10.0,
                },
                vec![250.0, 500.0, 1000.0, 2000.0, 4000.0, 8000.0],
            ),
            // Issue 31: 10,000 Pods in 1,000 Deployments over 3 zones (16
            // Nodes each, 250 Pods per Node at most), 100 rolling at once.
            scale: kwok_scale::ScaleParams {
                deployments: 1000,
                replicas: 10,
                rolling: 100,
                nodes: 48,
                api_qps: 500,
            },
            coalesce: CoalesceParams {
                lone_services: 1000,
                lone_changes: 200,
                rollout_services: 100,
                replicas: 10,
                grace_ms: 5000,
            },
            // 200 Pods Ready and 200 deleted per gateway.
            gateways: gateways::GatewayParams {
                replicas: 20,
                rollouts: 10,
                grace_s: 5,
                clients: 4,
                every: Duration::from_millis(5),
            },
            // Issue 32: 10,000 services x 10 endpoints, changes at 500/s for
            // 30 s with 100 streams. The 1,000-stream round
            // (`--xds-rounds 1000:10000:delta`) peaks at ~6 GiB in the
            // controller and ~6 GiB in the load client (BENCHMARKS.md): not a
            // default, so a full run fits a smaller machine.
            xds: xds::XdsParams {
                services: 10_000,
                per: 10,
                rate: 500.0,
                rounds: vec![xds::Round {
                    streams: 100,
                    changes: 15_000,
                    protocols: vec![Proto::Sotw, Proto::Delta],
                }],
                grace: Duration::from_secs(60),
            },
            timeout: Duration::from_secs(900),
        },
    };
    if !cli.sync_sizes.is_empty() {
        p.sync = cli
            .sync_sizes
            .iter()
            .map(|s| {
                let (a, b) = s
                    .split_once('x')
                    .with_context(|| format!("--sync-sizes: {s:?} is not SERVICESxENDPOINTS"))?;
                Ok((
                    a.parse().with_context(|| format!("--sync-sizes: {a:?}"))?,
                    b.parse().with_context(|| format!("--sync-sizes: {b:?}"))?,
                ))
            })
            .collect::<Result<_>>()?;
        if let Some((s, e)) = p.sync.iter().find(|(s, e)| *s == 0 || *e == 0) {
            bail!("--sync-sizes: {s}x{e}: services and endpoints must be at least 1");
        }
    }
    if let Some(r) = cli.churn_rate {
        if !(r > 0.0 && r.is_finite()) {
            bail!("--churn-rate: must be a positive number, got {r}");
        }
        p.churn.rate = r;
    }
    if let Some(s) = cli.churn_seconds {
        if !(s > 0.0 && s.is_finite()) {
            bail!("--churn-seconds: must be a positive number, got {s}");
        }
        p.churn.seconds = s;
    }
    if let Some(s) = cli.outage_seconds {
        if !(0.0..=3600.0).contains(&s) {
            bail!("--outage-seconds: must be between 0 and 3600, got {s}");
        }
        p.recovery.2 = s;
    }
    if let Some(m) = &cli.multi_size {
        let parts: Vec<usize> = m
            .split('x')
            .map(str::parse)
            .collect::<std::result::Result<_, _>>()
            .ok()
            .filter(|v: &Vec<usize>| v.len() == 3 && v[0] >= 2 && v[1] >= 1 && v[2] >= 1)
            .with_context(|| {
                format!("--multi-size: {m:?} is not CLUSTERSxSERVICESxENDPOINTS (at least 2x1x1)")
            })?;
        p.multi.0 = parts[0];
        p.multi.1 = parts[1];
        p.multi.2 = parts[2];
    }
    if let Some(s) = cli.outage_seconds {
        p.multi.4 = s;
    }
    if !cli.sweep_rates.is_empty() {
        if cli.sweep_rates.iter().any(|r| !(*r > 0.0 && r.is_finite()))
            || cli.sweep_rates.windows(2).any(|w| w[0] >= w[1])
        {
            bail!(
                "--sweep-rates: positive numbers in ascending order, got {:?}",
                cli.sweep_rates
            );
        }
        p.sweep.1 = cli.sweep_rates.clone();
    }
    if let Some(x) = &cli.xds_size {
        let (s, e) = x
            .split_once('x')
            .and_then(|(a, b)| Some((a.parse::<usize>().ok()?, b.parse::<usize>().ok()?)))
            .filter(|(s, e)| *s >= 1 && *e >= 1)
            .with_context(|| {
                format!("--xds-size: {x:?} is not SERVICESxENDPOINTS (at least 1x1)")
            })?;
        p.xds.services = s;
        p.xds.per = e;
    }
    if !cli.xds_rounds.is_empty() {
        p.xds.rounds = cli
            .xds_rounds
            .iter()
            .map(|r| {
                let parts: Vec<&str> = r.split(':').collect();
                let bad = || format!("--xds-rounds: {r:?} is not STREAMS:CHANGES:PROTOCOLS (e.g. 100:15000:sotw+delta)");
                let [streams, changes, protos] = parts[..] else {
                    bail!(bad());
                };
                let streams: usize = streams.parse().ok().filter(|n| *n >= 1).with_context(bad)?;
                let changes: usize = changes.parse().ok().filter(|n| *n >= 1).with_context(bad)?;
                let protocols = protos
                    .split('+')
                    .map(Proto::parse)
                    .collect::<Result<Vec<_>>>()
                    .with_context(bad)?;
                Ok(xds::Round { streams, changes, protocols })
            })
            .collect::<Result<_>>()?;
    }
    if cli.write_concurrency == Some(0) {
        bail!("--write-concurrency: must be at least 1");
    }
    Ok(p)
}

fn machine() -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo.lines().find_map(|l| {
        l.strip_prefix("model name")
            .map(|r| r.trim_start_matches([' ', '\t', ':']).to_string())
    });
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib = meminfo.lines().find_map(|l| {
        l.strip_prefix("MemTotal:")
            .and_then(|r| r.split_whitespace().next()?.parse::<u64>().ok())
    });
    json!({
        "nproc": std::thread::available_parallelism().map(|n| n.get()).ok(),
        "cpu_model": model,
        "mem_total_mib": mem_kib.map(|k| k / 1024),
        "kernel": std::fs::read_to_string("/proc/sys/kernel/osrelease").ok().map(|s| s.trim().to_string()),
        // The machine is shared: the load when the run started puts the figures in context.
        "loadavg_at_start": std::fs::read_to_string("/proc/loadavg").ok().map(|s| s.trim().to_string()),
    })
}

fn git_head() -> Option<String> {
    let o = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()?;
    o.status
        .success()
        .then(|| String::from_utf8_lossy(&o.stdout).trim().to_string())
}

fn save(cli: &Cli, doc: &Value) -> Result<()> {
    if let Some(dir) = cli.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(&cli.out, serde_json::to_string_pretty(doc)?)
        .with_context(|| format!("writing {}", cli.out.display()))?;
    let md = cli.out.with_extension("md");
    std::fs::write(&md, report::markdown(doc))
        .with_context(|| format!("writing {}", md.display()))?;
    Ok(())
}

async fn bench(cli: Cli) -> Result<()> {
    let p = plan(&cli)?;
    let modes: Vec<Mode> = cli
        .modes
        .iter()
        .map(|m| match m.as_str() {
            "slices" => Ok(Mode::Slices),
            "endpoints" => Ok(Mode::Endpoints),
            other => bail!("--modes: unknown mode {other:?} (slices, endpoints)"),
        })
        .collect::<Result<_>>()?;
    for s in &cli.only {
        if ![
            "sync",
            "churn",
            "recovery",
            "multi",
            "sweep",
            "lone",
            "rollout",
            "kwok-scale",
            "gateways",
            "xds",
        ]
        .contains(&s.as_str())
        {
            bail!(
                "--only: unknown scenario {s:?} (sync, churn, recovery, multi, sweep, lone, rollout, kwok-scale, gateways, xds)"
            );
        }
        if (s == "kwok-scale" || s == "gateways") && cli.apiserver != ApiServer::Real {
            bail!(
                "--only {s}: needs --apiserver real (kwok, kube-scheduler and the Deployment and EndpointSlice controllers run against the real control plane)"
            );
        }
        if (s == "recovery" || s == "multi") && cli.apiserver == ApiServer::Real {
            bail!(
                "--only {s}: needs --apiserver kube-sim (its faults reach the controller there; on the real server the controller connects directly; multi starts one API server per cluster)"
            );
        }
    }
    let opts = Opts {
        apiserver: match cli.apiserver {
            ApiServer::KubeSim => env::Backend::Sim,
            ApiServer::Real => env::Backend::Real,
        },
        bin: child::controller_bin(cli.controller_bin.as_deref())?,
        window_ms: cli.window_ms,
        leading_edge: cli.coalesce_leading_edge,
        write_qps: (!cli.controller_defaults).then_some(cli.write_qps),
        write_concurrency: cli.write_concurrency.filter(|_| !cli.controller_defaults),
        timeout: p.timeout,
        controller_user: cli.controller_user.clone(),
    };
    let started = unix_now();
    let mut doc = json!({
        "command": std::env::args().collect::<Vec<_>>().join(" "),
        "started_unix": started, "size": format!("{:?}", cli.size).to_lowercase(),
        "machine": machine(), "controller_bin": opts.bin.display().to_string(), "git_head": git_head(),
        "apiserver": opts.apiserver.name(), "controller_user": opts.controller_user.clone().unwrap_or_else(|| "admin".into()),
        "settings": {"coalesce_window_ms": opts.window_ms, "coalesce_leading_edge": opts.leading_edge.map(|l| json!(l)).unwrap_or(json!("default (true)")), "write_qps": opts.write_qps.map(|q| json!(q)).unwrap_or(json!("default")), "write_concurrency": opts.write_concurrency.map(|c| json!(c)).unwrap_or(json!("default (32)"))},
        "runs": [], "errors": [],
    });
    let wants = |s: &str| cli.only.iter().any(|o| o == s);
    let record = |doc: &mut Value, what: String, r: Result<Value>| -> Result<()> {
        match r {
            Ok(v) => {
                eprintln!("kd-bench: {what}: done");
                if let Some(a) = doc["runs"].as_array_mut() {
                    a.push(v);
                }
            }
            Err(e) => {
                eprintln!("kd-bench: {what}: FAILED: {e:#}");
                if let Some(a) = doc["errors"].as_array_mut() {
                    a.push(json!({"run": what, "error": format!("{e:#}")}));
                }
            }
        }
        save(&cli, doc)
    };
    if wants("sync") {
        for &mode in &modes {
            for &(s, e) in &p.sync {
                eprintln!("kd-bench: sync {} {s}x{e} ...", mode.as_str());
                let r = scenarios::sync(&opts, mode, s, e).await;
                record(&mut doc, format!("sync {} {s}x{e}", mode.as_str()), r)?;
            }
        }
    }
    if wants("churn") {
        for &mode in &modes {
            eprintln!("kd-bench: churn {} ...", mode.as_str());
            let r = scenarios::churn(&opts, mode, &p.churn).await;
            record(&mut doc, format!("churn {}", mode.as_str()), r)?;
        }
    }
    if wants("recovery") {
        let mode = modes.first().copied().unwrap_or(Mode::Slices);
        let (s, e, outage) = p.recovery;
        eprintln!("kd-bench: recovery {} {s}x{e} ...", mode.as_str());
        let r = scenarios::recovery(&opts, mode, s, e, outage).await;
        record(&mut doc, format!("recovery {}", mode.as_str()), r)?;
    }
    if wants("multi") {
        let (k, s, e, changed, outage) = p.multi;
        eprintln!("kd-bench: multi {k} clusters x {s}x{e} ...");
        let r = multi::multi(&opts, k, s, e, changed, outage).await;
        record(&mut doc, format!("multi {k}x{s}x{e}"), r)?;
    }
    if wants("sweep") {
        let mode = modes.first().copied().unwrap_or(Mode::Slices);
        let (base, rates) = &p.sweep;
        let r = sweep::sweep(&opts, mode, base, rates).await;
        record(&mut doc, format!("sweep {}", mode.as_str()), r)?;
    }
    if wants("lone") {
        for &mode in &modes {
            eprintln!("kd-bench: lone {} ...", mode.as_str());
            let r = coalesce::lone(&opts, mode, &p.coalesce).await;
            record(&mut doc, format!("lone {}", mode.as_str()), r)?;
        }
    }
    if wants("rollout") {
        let mode = modes.first().copied().unwrap_or(Mode::Slices);
        // Pods ready after 5 windows and the Deployment controller's 20 ms
        // reaction (each step a small burst of its own), and Pods ready at
        // once (the whole rollout one burst).
        let paced = (cli.window_ms * 5).max(500);
        for (variant, startup, react) in [("paced", paced, 20), ("burst", 0, 5)] {
            eprintln!("kd-bench: rollout {variant} {} ...", mode.as_str());
            let r = coalesce::rollout(&opts, mode, &p.coalesce, variant, startup, react).await;
            record(&mut doc, format!("rollout {variant} {}", mode.as_str()), r)?;
        }
    }
    if wants("kwok-scale") {
        let sp = &p.scale;
        eprintln!(
            "kd-bench: kwok-scale {} Deployments x {} Pods ...",
            sp.deployments, sp.replicas
        );
        let r = kwok_scale::kwok_scale(&opts, sp).await;
        record(
            &mut doc,
            format!("kwok-scale {}x{}", sp.deployments, sp.replicas),
            r,
        )?;
    }
    if wants("gateways") {
        eprintln!("kd-bench: gateways ...");
        // The gateway harness panics on a gateway that does not start.
        let r = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(gateways::gateways(
            &opts,
            &p.gateways,
        )))
        .await
        .unwrap_or_else(|panic| {
            let msg = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            Err(anyhow::anyhow!("panicked: {msg}"))
        });
        record(&mut doc, "gateways".to_string(), r)?;
    }
    if wants("xds") {
        let mode = modes.first().copied().unwrap_or(Mode::Slices);
        let x = &p.xds;
        eprintln!(
            "kd-bench: xds {}x{} {} ...",
            x.services,
            x.per,
            mode.as_str()
        );
        let r = xds::xds(&opts, mode, x).await;
        // A run that failed inside the scenario (one server, one protocol)
        // is an error of the whole document too.
        if let Ok(v) = &r {
            for f in v["failures"].as_array().into_iter().flatten() {
                if let Some(a) = doc["errors"].as_array_mut() {
                    a.push(json!({"run": format!("xds {} {} {}", f["server"], f["protocol"], f["streams"]), "error": f["error"]}));
                }
            }
        }
        record(&mut doc, format!("xds {}x{}", x.services, x.per), r)?;
    }
    let errors = doc["errors"].as_array().map(Vec::len).unwrap_or(0);
    eprintln!(
        "kd-bench: results in {} and {}",
        cli.out.display(),
        cli.out.with_extension("md").display()
    );
    if errors > 0 {
        bail!(
            "{errors} run(s) failed (see \"errors\" in {})",
            cli.out.display()
        );
    }
    Ok(())
}

fn unix_now() -> String {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs().to_string())
        .unwrap_or_default()
}

#[tokio::main]
async fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Cmd::Echo { kubeconfig, slices }) => echo::run(&kubeconfig, slices).await,
        Some(Cmd::XdsClient {
            addr,
            protocol,
            streams,
            plan,
            token,
        }) => xds_client::run(addr, Proto::parse(&protocol)?, streams, &plan, token).await,
        None => bench(cli).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_of(args: &[&str]) -> Result<RunSizes> {
        let mut v = vec!["kd-bench"];
        v.extend_from_slice(args);
        plan(&Cli::try_parse_from(v)?)
    }

    #[test]
    fn sizes_and_overrides() {
        let p = plan_of(&["--size", "full"]).expect("full");
        assert_eq!(
            p.sync,
            vec![(1000, 10), (10_000, 10), (100, 1000), (1, 20_000)]
        );
        assert_eq!(p.churn.rate, 500.0);
        assert_eq!(p.recovery, (10_000, 10, 30.0));
        let p = plan_of(&[
            "--size",
            "tiny",
            "--sync-sizes",
            "3x4,5x6",
            "--churn-rate",
            "9",
            "--outage-seconds",
            "2",
        ])
        .expect("tiny");
        assert_eq!(p.sync, vec![(3, 4), (5, 6)]);
        assert_eq!((p.churn.rate, p.recovery.2), (9.0, 2.0));
        let p = plan_of(&[
            "--xds-size",
            "30x4",
            "--xds-rounds",
            "7:20:delta+sotw,9:5:sotw",
        ])
        .expect("xds");
        assert_eq!((p.xds.services, p.xds.per), (30, 4));
        let rounds: Vec<(usize, usize, Vec<Proto>)> = p
            .xds
            .rounds
            .iter()
            .map(|r| (r.streams, r.changes, r.protocols.clone()))
            .collect();
        assert_eq!(
            rounds,
            [
                (7, 20, vec![Proto::Delta, Proto::Sotw]),
                (9, 5, vec![Proto::Sotw])
            ]
        );
    }

    #[test]
    fn bad_options_are_named() {
        for (args, field) in [
            (&["--sync-sizes", "10"][..], "--sync-sizes"),
            (&["--sync-sizes", "0x10"][..], "--sync-sizes"),
            (&["--sync-sizes", "ax10"][..], "--sync-sizes"),
            (&["--churn-rate", "0"][..], "--churn-rate"),
            (&["--churn-seconds=-1"][..], "--churn-seconds"),
            (&["--outage-seconds", "5000"][..], "--outage-seconds"),
            (&["--write-concurrency", "0"][..], "--write-concurrency"),
            (&["--xds-size", "10"][..], "--xds-size"),
            (&["--xds-size", "0x10"][..], "--xds-size"),
            (&["--xds-rounds", "100:10"][..], "--xds-rounds"),
            (&["--xds-rounds", "0:10:delta"][..], "--xds-rounds"),
            (&["--xds-rounds", "5:10:grpc"][..], "--xds-rounds"),
        ] {
            let e = plan_of(args)
                .err()
                .map(|e| format!("{e:#}"))
                .unwrap_or_default();
            assert!(e.contains(field), "{args:?}: {e}");
        }
    }

    #[test]
    fn coalesce_leading_edge_reaches_the_controller_config_only_when_given() {
        let block = |args: &[&str]| {
            let mut v = vec!["kd-bench"];
            v.extend_from_slice(args);
            let cli = Cli::try_parse_from(v).expect("parses");
            Opts {
                apiserver: env::Backend::Sim,
                bin: PathBuf::new(),
                window_ms: cli.window_ms,
                leading_edge: cli.coalesce_leading_edge,
                write_qps: None,
                write_concurrency: None,
                timeout: Duration::from_secs(1),
                controller_user: None,
            }
            .kube_discovery_block()
        };
        assert!(!block(&[]).contains("coalesce_leading_edge"));
        assert!(
            block(&["--coalesce-leading-edge", "false"])
                .contains("  coalesce_leading_edge: false\n")
        );
        assert!(
            block(&["--coalesce-leading-edge", "true"]).contains("  coalesce_leading_edge: true\n")
        );
        assert!(Cli::try_parse_from(["kd-bench", "--coalesce-leading-edge", "no"]).is_err());
    }
}
