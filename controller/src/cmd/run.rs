//! `kube-discovery run`: wires sources, writer and HTTP server together and
//! shuts them down gracefully.
//!
//! ```text
//!  config file ──core::config::parse_config──▶ Config ──Config::resolve──▶ Plan
//!  Plan ──RunOptions::from_plan (the I/O: auth token file, own namespace)──▶ RunOptions
//!  RunOptions ──start──▶ per cluster: Source task ─┐
//!                        the drift watch ──────────┼─▶ ControllerState ◀── HTTP server
//!                        one writer task (KubeSink on the home cluster)
//!  SIGTERM/SIGINT ─▶ cancel: sources stop, the writer starts no new write,
//!                    in-flight writes finish (at most DRAIN_LIMIT), THEN the
//!                    lease is released (bounded), the HTTP server drains.
//!  a long-running task dies (panics, or returns while not shutting down)
//!                 ─▶ logged as an error naming it, /healthz 503 naming it,
//!                    the same graceful stop, exit code 1 (Kubernetes restarts the pod)
//! ```

use std::future::Future;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kube_discovery_core::Index;
use kube_discovery_core::crd::ObjectNaming;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::k8s::client::Connection;
use crate::k8s::leader::Fence;
use crate::k8s::source::{Source, SourceParams};
use crate::serve::http::AppState;
use crate::serve::metrics::Metrics;
use crate::state::{ControllerState, TaskDeath};
use crate::write::sink::KubeSink;
use crate::write::writer::WriterOptions;
use crate::{Error, Result, SettingError, panic_message};
use kube_discovery_core::config::{Config, Overrides, Plan, parse_config};

/// One watched cluster.
pub struct ClusterSource {
    /// What to watch.
    pub params: SourceParams,
    /// How to connect.
    pub conn: Connection,
    /// The (empty) index, configured with filters and conversion options.
    pub index: Index,
}

/// Everything `run` needs, derived from the configuration.
pub struct RunOptions {
    /// Watched clusters.
    pub clusters: Vec<ClusterSource>,
    /// Where DiscoveredServices are written.
    pub home: Connection,
    /// The one namespace holding all of them, if there is one
    /// (`Plan::home_namespace`): their list and watch are then namespaced.
    pub home_namespace: Option<String>,
    /// Object naming.
    pub naming: ObjectNaming,
    /// Writer tuning.
    pub writer: WriterOptions,
    /// HTTP listen address.
    pub http_addr: SocketAddr,
    /// Bearer token for dump/nodes (re-read from its file while running).
    pub auth_token: Option<Arc<crate::serve::http::ApiToken>>,
    /// Redacted effective configuration (dump API).
    pub redacted_config: Value,
    /// Leader election, when enabled.
    pub leader: Option<crate::k8s::leader::LeaseConfig>,
    /// The ConfigMap snapshot sink, when enabled.
    pub snapshot: Option<crate::write::snapshot_sink::SnapshotOptions>,
    /// The read timeout of every API request
    /// (`kube_discovery.request_timeout`).
    pub request_timeout: Duration,
    /// The server-side timeout of every watch: `watch_timeout`, capped so
    /// that watches are renewed within `request_timeout`
    /// ([`crate::k8s::client::watch_renewal`]).
    pub watch_timeout: Duration,
    /// How long a cluster's watch may fail before `/readyz` does.
    pub unready_after: Duration,
    /// The most a graceful shutdown may take.
    pub shutdown_timeout: Duration,
    /// The xDS server (`kube_discovery.xds`), when enabled.
    pub xds: Option<crate::xds::XdsOptions>,
}

/// Builds the [`RunOptions`] for a validated configuration. `http_addr`
/// overrides `kube_discovery.http.addr`; `kubeconfig` (single cluster only)
/// replaces the `service`/`client` settings.
pub fn run_options(
    cfg: &Config,
    http_addr: Option<SocketAddr>,
    kubeconfig: Option<PathBuf>,
) -> Result<RunOptions> {
    let plan = cfg.resolve(&Overrides {
        http_addr,
        kubeconfig,
    })?;
    RunOptions::from_plan(plan)
}

impl RunOptions {
    /// Turns the resolved configuration into what the tasks take, doing the
    /// I/O the pure core leaves out: the hidden shard-size override, the
    /// pod's own namespace and identity, the HTTP auth token file.
    pub fn from_plan(plan: Plan) -> Result<RunOptions> {
        let watch_timeout =
            crate::k8s::client::watch_renewal(plan.watch_timeout, plan.request_timeout);
        let home_namespace = plan.home_namespace().map(str::to_string);
        let snapshot = match plan.configmap {
            Some(cm) => {
                let env = |k: &str| std::env::var(k).ok();
                Some(
                    crate::write::snapshot_sink::SnapshotOptions {
                        watch_timeout: Some(watch_timeout),
                        coalesce_leading_edge: plan.writes.coalesce_leading_edge,
                        ..crate::write::snapshot_sink::SnapshotOptions::new(
                            cm.namespace,
                            cm.name,
                            plan.writes.coalesce_window,
                        )
                    }
                    .validated(&env)?,
                )
            }
            None => None,
        };
        let leader = match plan.leader_election {
            Some(le) => {
                let namespace = le
                    .namespace
                    .or_else(crate::k8s::leader::own_namespace)
                    .ok_or(SettingError::LeaseNamespaceUnknown)?;
                Some(crate::k8s::leader::LeaseConfig::with_timings(
                    namespace,
                    le.name,
                    crate::k8s::leader::default_identity(),
                    le.timings,
                ))
            }
            None => None,
        };
        let clusters = plan
            .clusters
            .iter()
            .map(|c| ClusterSource {
                params: SourceParams {
                    cluster: c.id.clone(),
                    kind: c.source,
                    label_selector: c.server_label_selector(),
                    field_selector: c.server_field_selector(),
                    namespace: c.watch_namespace().map(str::to_string),
                    watch_timeout,
                    watch_services: c.watch_services,
                },
                conn: c.connection.clone(),
                index: c.new_index(),
            })
            .collect();
        let xds = match &plan.xds {
            Some(x) => Some(crate::xds::XdsOptions {
                addr: x.addr,
                token: match &x.auth_token_file {
                    Some(p) => Some(Arc::new(crate::serve::http::ApiToken::from_setting(
                        p,
                        crate::xds::TOKEN_SETTING,
                    )?)),
                    None => None,
                },
                tls: x.tls.as_ref().map(|t| crate::xds::TlsFiles {
                    cert_file: t.cert_file.clone(),
                    key_file: t.key_file.clone(),
                    client_ca_file: t.client_ca_file.clone(),
                }),
            }),
            None => None,
        };
        let auth_token = match &plan.http.auth_token_file {
            Some(p) => Some(Arc::new(crate::serve::http::ApiToken::from_file(p)?)),
            None => None,
        };
        Ok(RunOptions {
            clusters,
            home: plan.clusters.home().clone(),
            home_namespace,
            naming: plan.discoveredservices,
            writer: WriterOptions {
                coalesce_window: plan.writes.coalesce_window,
                coalesce_leading_edge: plan.writes.coalesce_leading_edge,
                concurrency: plan.writes.concurrency,
                qps: plan.writes.qps,
                start_qps: plan.writes.start_qps,
                ..WriterOptions::default()
            },
            http_addr: plan.http.addr,
            auth_token,
            redacted_config: plan.redacted_config,
            leader,
            snapshot,
            request_timeout: plan.request_timeout,
            watch_timeout,
            unready_after: plan.unready_after,
            shutdown_timeout: plan.shutdown_timeout,
            xds,
        })
    }
}

/// Parses configuration text (environment from the process) and builds the
/// [`RunOptions`].
pub fn run_options_from_text(
    text: &str,
    http_addr: Option<SocketAddr>,
    kubeconfig: Option<PathBuf>,
) -> Result<RunOptions> {
    let env = |k: &str| std::env::var(k).ok();
    let cfg = parse_config(text, &env)?;
    run_options(&cfg, http_addr, kubeconfig)
}

/// `kube-discovery run`.
pub async fn run_from_file(
    path: &Path,
    http_addr: Option<SocketAddr>,
    kubeconfig: Option<PathBuf>,
) -> Result<()> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::Io {
        path: path.display().to_string(),
        source: e,
    })?;
    let opts = run_options_from_text(&text, http_addr, kubeconfig)?;
    run_until_signal(opts).await
}

/// How long a stop waits for in-flight writes before it releases the lease
/// anyway (fenced, they send nothing after that); with the bounded release
/// ([`crate::k8s::leader::LeaseConfig::release_timeout`], 8 s by default) well
/// below a pod's default termination grace period of 30 s.
pub const DRAIN_LIMIT: Duration = Duration::from_secs(10);

/// Spawns the long-running tasks of `run` by name and reports the first
/// that dies: panics, or returns while the controller is not shutting down.
struct Supervisor {
    shared: Arc<ControllerState>,
    shutdown: CancellationToken,
    deaths: mpsc::UnboundedSender<TaskDeath>,
    /// The tasks by name, so a test can kill one.
    #[cfg(test)]
    aborts: Vec<(String, tokio::task::AbortHandle)>,
}

impl Supervisor {
    /// Spawns `task` as `name`; the handle resolves when it ended (and its
    /// death, if any, was reported).
    fn spawn(
        &mut self,
        name: impl Into<String>,
        task: impl Future<Output = ()> + Send + 'static,
    ) -> JoinHandle<()> {
        self.watch(name, tokio::spawn(task))
    }

    /// Supervises the already spawned `task` as `name`.
    fn watch(&mut self, name: impl Into<String>, task: JoinHandle<()>) -> JoinHandle<()> {
        let name = name.into();
        #[cfg(test)]
        self.aborts.push((name.clone(), task.abort_handle()));
        let shared = self.shared.clone();
        let shutdown = self.shutdown.clone();
        let deaths = self.deaths.clone();
        tokio::spawn(async move {
            let cause = match task.await {
                Ok(()) if shutdown.is_cancelled() => return,
                Ok(()) => "it returned while the controller was running".to_string(),
                Err(e) if e.is_panic() => {
                    format!("it panicked: {}", panic_message(&*e.into_panic()))
                }
                Err(e) => e.to_string(),
            };
            tracing::error!(task = %name, cause = %cause, "a long-running task died: /healthz fails, the controller stops and exits with code 1 so that it is restarted");
            let death = TaskDeath { task: name, cause };
            shared.set_task_died(death.clone());
            let _ = deaths.send(death);
        })
    }
}

/// A running controller (for `demo` and tests).
pub struct Running {
    /// The HTTP server's bound address.
    pub http_addr: SocketAddr,
    /// The xDS server's bound address, when it runs.
    pub xds_addr: Option<SocketAddr>,
    /// The process-wide state.
    pub shared: Arc<ControllerState>,
    shutdown: CancellationToken,
    /// Stops the elector, after the writers stopped (so that in-flight
    /// writes finish while still leading).
    elector_stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    writer: JoinHandle<()>,
    elector: Option<JoinHandle<()>>,
    snapshot: Option<JoinHandle<()>>,
    http: JoinHandle<()>,
    deaths: mpsc::UnboundedReceiver<TaskDeath>,
    /// The deadline of [`Running::stop_within_deadline`].
    shutdown_timeout: Duration,
    #[cfg(test)]
    aborts: Vec<(String, tokio::task::AbortHandle)>,
}

impl Running {
    /// Resolves with the first long-running task that died (never while
    /// all run); at once when one already did.
    pub async fn died(&mut self) -> TaskDeath {
        if let Some(d) = self.shared.task_died() {
            return d;
        }
        match self.deaths.recv().await {
            Some(d) => d,
            None => std::future::pending().await,
        }
    }

    /// Kills the task `name` (a test's stand-in for a bug that ends it).
    #[cfg(test)]
    fn abort_task(&self, name: &str) -> bool {
        self.aborts
            .iter()
            .filter(|(n, _)| n == name)
            .map(|(_, a)| a.abort())
            .count()
            > 0
    }

    /// [`Running::stop`], given up after `kube_discovery.shutdown_timeout`
    /// (whatever is still in flight then, a write or a watch, is dropped
    /// with the runtime: the next leader redoes an unfinished write).
    /// `false` when the deadline passed.
    pub async fn stop_within_deadline(self) -> bool {
        let deadline = self.shutdown_timeout;
        if tokio::time::timeout(deadline, self.stop()).await.is_ok() {
            return true;
        }
        tracing::warn!(
            deadline_secs = deadline.as_secs_f64(),
            "shutdown deadline passed with work in flight; exiting anyway"
        );
        false
    }

    /// Stops everything: sources stop, in-flight writes finish (at most
    /// [`DRAIN_LIMIT`]), then the lease is released (bounded), the HTTP
    /// server drains.
    pub async fn stop(self) {
        self.shutdown.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
        let writers = async {
            let _ = self.writer.await;
            if let Some(s) = self.snapshot {
                let _ = s.await;
            }
        };
        if tokio::time::timeout(DRAIN_LIMIT, writers).await.is_err() {
            tracing::warn!(limit = ?DRAIN_LIMIT, "in-flight writes did not finish in time; releasing the lease anyway (they send nothing more)");
        }
        self.elector_stop.cancel();
        if let Some(e) = self.elector {
            let _ = e.await;
        }
        let _ = self.http.await;
    }
}

/// Starts the controller described by `opts`.
pub async fn start(opts: RunOptions) -> Result<Running> {
    let shutdown = CancellationToken::new();
    let elector_stop = CancellationToken::new();
    let shutdown_timeout = opts.shutdown_timeout;
    let metrics = Metrics::default();
    let shared = Arc::new(ControllerState::new(
        opts.clusters.iter().map(|c| c.params.cluster.as_str()),
    ));
    let (deaths_tx, deaths) = mpsc::unbounded_channel();
    let mut sup = Supervisor {
        shared: shared.clone(),
        shutdown: shutdown.clone(),
        deaths: deaths_tx,
        #[cfg(test)]
        aborts: Vec::new(),
    };
    shared.set_unready_after(opts.unready_after);

    let home_limits = crate::k8s::client::ClientLimits::new(opts.request_timeout);
    metrics.track_client("home", "", home_limits.in_flight.clone());
    let home = crate::k8s::client::client(&opts.home, &home_limits).await?;
    let snapshot_client = home.clone();
    let (leader, elector) = match opts.leader {
        Some(cfg) => {
            tracing::info!(namespace = %cfg.namespace, lease = %cfg.name, identity = %cfg.identity, "leader election enabled");
            let (rx, task) = crate::k8s::leader::spawn_reporting(
                home.clone(),
                cfg,
                elector_stop.clone(),
                Some(shared.clone()),
            );
            (Some(rx), Some(sup.watch("leader election", task)))
        }
        None => (None, None),
    };
    // The sources' Events (skipped Service annotations) are the leader's only.
    let leader_rx = leader.clone();
    // Every write request is fenced by the leadership epoch it started in.
    let fence = leader.clone().map_or_else(Fence::always, Fence::new);
    // Drift correction: a cache of our own objects, shared with the sink.
    let (drift_view, drift_feed) = crate::write::drift::DriftView::new(opts.naming.clone());
    let snapshot = opts.snapshot.map(|snapshot_opts| {
        let task = crate::write::snapshot_sink::spawn(
            snapshot_client,
            shared.clone(),
            metrics.clone(),
            snapshot_opts,
            shutdown.clone(),
            leader.clone(),
        );
        sup.watch("snapshot sink", task)
    });
    // Events: best-effort, bounded, from the (fenced) writes only.
    let (events, events_task) = crate::k8s::events::Events::start(
        home.clone(),
        crate::k8s::leader::default_identity(),
        opts.request_timeout,
        shutdown.clone(),
    );
    sup.watch("events", events_task);
    // The writer's own client to the home cluster: it reports every 429 to
    // the writer's limiter and does not retry 429s itself (a retry would be a
    // request the limiter did not admit); the Lease, Events and snapshot keep
    // the shared one.
    let throttle = crate::k8s::client::ThrottleSignal::default();
    let mut writer_limits = crate::k8s::client::ClientLimits::new(opts.request_timeout);
    writer_limits.throttle = Some(throttle.clone());
    metrics.track_client("writer", "", writer_limits.in_flight.clone());
    let writer_client = crate::k8s::client::client(&opts.home, &writer_limits).await?;
    let (writer, writer_task) = crate::write::writer::spawn(
        KubeSink::new(writer_client, opts.naming.clone())
            .with_events(events.clone())
            .with_drift(drift_view)
            .with_fence(fence)
            .in_namespace(opts.home_namespace.clone()),
        shared.clone(),
        crate::write::writer::Spawn {
            opts: opts.writer.clone(),
            metrics: metrics.clone(),
            shutdown: shutdown.clone(),
            leader,
            throttle,
        },
    );
    let writer_task = sup.watch("writer", writer_task);

    let mut tasks = Vec::new();
    tasks.push(
        sup.spawn(
            "drift watch",
            drift_feed
                .in_namespace(opts.home_namespace)
                .with_watch_timeout(opts.watch_timeout)
                .run(home, shared.clone(), writer.clone(), shutdown.clone()),
        ),
    );
    for c in opts.clusters {
        let mut limits = crate::k8s::client::ClientLimits::new(opts.request_timeout);
        metrics.track_client("source", &c.params.cluster, limits.in_flight.clone());
        // A watch request answered 2xx: THAT watch is served again (a
        // renewed watch that sees no change produces no event to tell);
        // another watch or a list page of the same client is not.
        let (served, id) = (shared.clone(), c.params.cluster.clone());
        limits.on_watch_served = Some(Arc::new(move |resource: &str| {
            if let Some(kind) = crate::k8s::source::watch_kind(resource) {
                served.watch_ok(&id, kind);
            }
        }));
        let client = crate::k8s::client::client(&c.conn, &limits).await?;
        let name = if c.params.cluster.is_empty() {
            "source".to_string()
        } else {
            format!("source {}", c.params.cluster)
        };
        let source = Source {
            params: c.params,
            client,
            index: c.index,
            shared: shared.clone(),
            writer: writer.clone(),
            metrics: metrics.clone(),
            events: events.clone(),
            leader: leader_rx.clone(),
            naming: opts.naming.clone(),
        };
        tasks.push(sup.spawn(name, source.run(shutdown.clone())));
    }

    // xDS: every replica serves from its own watches (not only the leader).
    let xds = match opts.xds {
        Some(x) => {
            let s = crate::xds::serve(x, shared.clone(), metrics.clone(), shutdown.clone()).await?;
            tasks.push(sup.watch("xDS catalog", s.follower));
            tasks.push(sup.watch("xDS server", s.server));
            Some((s.addr, s.hub))
        }
        None => None,
    };
    let mut state = AppState::new(
        shared.clone(),
        Arc::new(metrics.registry_with_state(shared.clone())),
        opts.redacted_config,
        opts.auth_token,
    );
    if let Some((_, hub)) = &xds {
        state = state.with_xds(hub.clone());
    }
    // The HTTP server outlives the sources slightly: it is cancelled by the
    // same token and drains open requests.
    let (http_addr, http) =
        crate::serve::http::serve(opts.http_addr, state, shutdown.clone()).await?;
    let http = sup.watch("http server", http);
    tracing::info!(addr = %http_addr, "HTTP server listening");
    Ok(Running {
        http_addr,
        xds_addr: xds.as_ref().map(|(a, _)| *a),
        shared,
        shutdown,
        elector_stop,
        tasks,
        writer: writer_task,
        elector,
        snapshot,
        http,
        deaths,
        #[cfg(test)]
        aborts: sup.aborts,
        shutdown_timeout,
    })
}

/// Resolves when SIGTERM or SIGINT arrives.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("SIGINT received, shutting down"),
        () = term => tracing::info!("SIGTERM received, shutting down"),
    }
}

/// Runs `opts` until SIGTERM/SIGINT; an error when a long-running task died
/// ([`Error::TaskDied`]: the process exits non-zero and is restarted).
pub async fn run_until_signal(opts: RunOptions) -> Result<()> {
    run_until(opts, shutdown_signal()).await
}

/// Runs `opts` until `stop` resolves or a long-running task dies, then stops
/// gracefully; `Err(Error::TaskDied)` in the second case (and when a task
/// panicked while stopping).
pub async fn run_until(opts: RunOptions, stop: impl Future<Output = ()>) -> Result<()> {
    stop_after(start(opts).await?, stop).await
}

/// Waits for `stop` or the death of a task of `running`, then stops it; see [`run_until`].
async fn stop_after(mut running: Running, stop: impl Future<Output = ()>) -> Result<()> {
    let shared = running.shared.clone();
    tokio::select! {
        () = stop => {}
        _ = running.died() => {}
    }
    let in_time = running.stop_within_deadline().await;
    match shared.task_died() {
        Some(TaskDeath { task, cause }) => Err(Error::TaskDied { task, cause }),
        None => {
            if in_time {
                tracing::info!("stopped");
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests;
