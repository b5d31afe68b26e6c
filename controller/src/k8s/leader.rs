//! Leader election on a `coordination.k8s.io/v1` Lease, so several replicas
//! can run and exactly one writes (`kube_discovery.leader_election`).
//!
//! ```text
//!  every retry_period:  GET lease ─▶ observe it ─▶ decide(spec, me, observed at, now)   (the round is bounded by a timeout)
//!      Create    (absent)                         ─▶ POST   holder=me
//!      Renew     (holder == me)                   ─▶ PUT    renewTime=now  (resourceVersion-guarded)
//!      TakeOver  (holder empty, or the record unchanged for lease_duration on OUR clock) ─▶ PUT holder=me, transitions+1
//!      Follow    (someone else holds a lease we saw change less than lease_duration ago)
//!  leader = the last successful Create/Renew/TakeOver STARTED less than renew_deadline ago
//!  every gain and every loss starts a new epoch (Leadership); sinks check it before each request (Fence)
//!  shutdown: a leader releases the lease (holder="") so a standby takes over at once (bounded by a timeout)
//! ```
//!
//! client-go semantics: `lease_duration` 15 s, `renew_deadline` 10 s,
//! `retry_period` 2 s ([`LeaseConfig::new`] scales these proportions to the
//! configured `lease_duration`). A leader that cannot renew (API errors, a
//! hung request, a partition) stops leading when `renew_deadline` has passed
//! since the start of its last successful renewal, by a timer that does not
//! wait for the pending request.
//!
//! Clocks: like client-go's `observedTime`, a standby never compares the
//! remote `renewTime` with its own wall clock. It notes the local monotonic
//! time at which the lease record last CHANGED ([`Observed`]) and takes over
//! only once `lease_duration` has passed on its own clock since then, so
//! replicas whose wall clocks disagree (by any amount) never take over from a
//! leader that keeps renewing. The leader stops writing at `renew_deadline`
//! after the start of its last renewal, which is before any standby saw that
//! renewal plus `lease_duration`: `lease_duration - renew_deadline` (5 s by
//! default) is the margin for clock RATE differences and the latency of the
//! standby's read, not for wall-clock offsets. A replica that stepped down
//! campaigns again like any other.
//!
//! Health: a round that fails (the Lease cannot be read or written: an API
//! error, a timeout; not another replica holding it) is reported to the
//! [`ControllerState`] ([`spawn_reporting`]): a replica whose rounds have
//! failed for longer than `unready_after` is unready, whatever it could do
//! before (with `leases` not granted, every replica would otherwise be a
//! ready standby and nothing would be written). The change to failing is
//! logged once as a warning (each retry at debug), the recovery once;
//! `kube_discovery_leader_election_failing` shows it.
//!
//! All replicas watch and index (standbys are warm and serve the HTTP API);
//! only the leader's writer writes (see [`crate::write::writer::Spawn::leader`]), and
//! every write request is fenced by the epoch it started in ([`Fence`]): a
//! write started before a loss of the lease sends nothing after it.
//!
//! Fencing in flight ([`Fence::send`]): a request is also abandoned (its
//! future dropped, its connection closed) the moment its epoch ends, at the
//! latest at [`Leadership::until`] = start of the last successful renewal
//! `t` + `renew_deadline`, whatever `request_timeout` allows. A standby saw
//! that renewal land after `t` and takes over no earlier than `t +
//! lease_duration` on its clock, so a write of the old leader lands after
//! the new leader's only when the API server has begun to execute it and
//! spends more than `lease_duration - renew_deadline` (5 s by default) on
//! it; a request held in transit or queued before its handler is dropped
//! with its connection. Kubernetes has no precondition tying a write to a
//! Lease (no transaction across objects), so that margin is the bound.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Client;
use kube::api::{Api, PostParams};
use kube_discovery_core::config::LeaseTimings;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::state::ControllerState;

/// What to do with the lease as seen now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No lease yet: create it.
    Create,
    /// We hold it: renew.
    Renew,
    /// Free or expired: take it over.
    TakeOver,
    /// Someone else holds a fresh lease.
    Follow(String),
}

/// What this replica last saw of the lease record and WHEN, on its own
/// monotonic clock (client-go's `observedRecord`/`observedTime`): the time
/// moves only when the record changes, so the remote timestamps in it are
/// never compared with the local clock.
#[derive(Debug, Clone, Default)]
pub struct Observed {
    record: Option<LeaseSpec>,
    at: Option<Instant>,
}

impl Observed {
    /// Notes the record read at `now` (`None`: no lease object).
    pub fn see(&mut self, record: Option<&LeaseSpec>, now: Instant) {
        if self.at.is_none() || self.record.as_ref() != record {
            self.record = record.cloned();
            self.at = Some(now);
        }
    }

    /// When the record last changed (`None` before the first read).
    pub fn changed_at(&self) -> Option<Instant> {
        self.at
    }
}

/// Pure decision from the lease spec (`None`: no lease object), the local
/// time the record was last seen to change, and the local time now.
pub fn decide(
    spec: Option<&LeaseSpec>,
    me: &str,
    observed_at: Instant,
    now: Instant,
    default_duration: Duration,
) -> Decision {
    let Some(spec) = spec else {
        return Decision::Create;
    };
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder == me {
        return Decision::Renew;
    }
    if holder.is_empty() {
        return Decision::TakeOver;
    }
    let duration = spec
        .lease_duration_seconds
        .and_then(|s| u64::try_from(s.max(1)).ok())
        .map_or(default_duration, Duration::from_secs);
    if now.saturating_duration_since(observed_at) < duration {
        Decision::Follow(holder)
    } else {
        Decision::TakeOver
    }
}

/// The wall clock the elector stamps `acquireTime` and `renewTime` with.
/// Only informational for other replicas (they act on [`Observed`] changes);
/// tests skew it to show that.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WallClock {
    offset: jiff::SignedDuration,
}

impl WallClock {
    /// The system clock.
    pub fn system() -> Self {
        Self::default()
    }

    /// The system clock moved by `offset` (a replica whose clock is wrong).
    pub fn skewed(offset: jiff::SignedDuration) -> Self {
        Self { offset }
    }

    /// The time now on this clock.
    pub fn now(&self) -> jiff::Timestamp {
        let now = jiff::Timestamp::now();
        now.checked_add(self.offset).unwrap_or(now)
    }
}

/// The election as the rest of the process sees it: whether this replica
/// leads, and the epoch, which grows by one on every gain and every loss.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Leadership {
    /// Grows by one on every change of `leading`.
    pub epoch: u64,
    /// Whether this replica holds the lease.
    pub leading: bool,
    /// When this replica stops leading unless it renews first: the start of
    /// its last successful renewal plus `renew_deadline` (`None`: not
    /// leading, or no end, as without leader election). Moved by every
    /// renewal without waking the receivers; a write request in flight is
    /// abandoned at this instant ([`Fence::send`]).
    pub until: Option<Instant>,
}

impl Leadership {
    /// The state after a change to `leading` (the same state when unchanged).
    #[must_use]
    pub fn with_leading(self, leading: bool) -> Self {
        if leading == self.leading {
            self
        } else {
            Self {
                epoch: self.epoch + 1,
                leading,
                until: None,
            }
        }
    }
}

/// A write was dropped: the leadership epoch it started in is over (or it
/// started while this replica did not lead).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "not the leader: write started in leadership epoch {started:?}, now epoch {} (leading: {})",
    now.epoch,
    now.leading
)]
pub struct Fenced {
    /// The epoch the write started in (`None`: it started while not leading).
    pub started: Option<u64>,
    /// The election's state when the write was dropped.
    pub now: Leadership,
}

/// The epoch a write started in ([`Fence::begin`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FenceToken {
    epoch: u64,
}

/// What a sink consults right before every request it sends: the write's
/// epoch must still be the current LEADING epoch. Cheap to clone; all clones
/// follow the same election.
#[derive(Debug, Clone)]
pub struct Fence {
    rx: watch::Receiver<Leadership>,
}

impl Fence {
    /// A fence following the election `rx` (from [`spawn`]).
    pub fn new(rx: watch::Receiver<Leadership>) -> Self {
        Self { rx }
    }

    /// No leader election: always leading, epoch 0, no end.
    pub fn always() -> Self {
        let (_tx, rx) = watch::channel(Leadership {
            epoch: 0,
            leading: true,
            until: None,
        });
        Self { rx }
    }

    /// The election's state now.
    pub fn current(&self) -> Leadership {
        *self.rx.borrow()
    }

    /// Starts a write: the current epoch, if this replica leads.
    pub fn begin(&self) -> Result<FenceToken, Fenced> {
        let now = self.current();
        if now.leading {
            Ok(FenceToken { epoch: now.epoch })
        } else {
            Err(Fenced { started: None, now })
        }
    }

    /// Starts a write the planner decided in leadership `epoch` (its
    /// actions carry it): `Ok` only while that epoch is still the current,
    /// leading one, and every request of the write is fenced by it.
    pub fn begin_in(&self, epoch: u64) -> Result<FenceToken, Fenced> {
        let token = FenceToken { epoch };
        self.check(token)?;
        Ok(token)
    }

    /// Right before a request a planner decided in leadership `epoch` (its
    /// actions carry the epoch, not a token): `Ok` only while that epoch is
    /// still the current, leading one.
    pub fn check_epoch(&self, epoch: u64) -> Result<(), Fenced> {
        self.check(FenceToken { epoch })
    }

    /// Right before a request of the write that `token` started: `Ok` only
    /// while that epoch is still the current, leading one, and its end
    /// ([`Leadership::until`]) has not come.
    pub fn check(&self, token: FenceToken) -> Result<(), Fenced> {
        self.live(token.epoch).map(|_| ())
    }

    /// The end of the leading `epoch` when it is the current one and has
    /// not ended (`Ok(None)`: no end).
    fn live(&self, epoch: u64) -> Result<Option<Instant>, Fenced> {
        let now = self.current();
        let ended = now.until.is_some_and(|t| t <= Instant::now());
        if now.leading && now.epoch == epoch && !ended {
            Ok(now.until)
        } else {
            Err(Fenced {
                started: Some(epoch),
                now,
            })
        }
    }

    /// Sends `request` for a write of leadership `epoch`: not at all when
    /// the epoch is over ([`Fence::check_epoch`]), and abandoned (the
    /// future dropped, its connection closed) the moment the epoch ends
    /// while it is in flight: at [`Leadership::until`], moved on by each
    /// renewal, or at a loss. The module docs say what that guarantees.
    pub async fn send<T>(
        &self,
        token: FenceToken,
        request: impl Future<Output = T>,
    ) -> Result<T, Fenced> {
        self.send_epoch(token.epoch, request).await
    }

    /// [`Fence::send`] for a write a planner decided in leadership `epoch`.
    pub async fn send_epoch<T>(
        &self,
        epoch: u64,
        request: impl Future<Output = T>,
    ) -> Result<T, Fenced> {
        let mut request = std::pin::pin!(request);
        let mut changes = self.rx.clone();
        loop {
            let until = self.live(epoch)?;
            let end = async {
                match until {
                    Some(t) => tokio::time::sleep_until(t).await,
                    None => std::future::pending().await,
                }
            };
            let change = async {
                if changes.changed().await.is_err() {
                    // No elector (any more): only the end can come.
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                biased;
                out = &mut request => return Ok(out),
                () = end => {}
                () = change => {}
            }
        }
    }
}

/// Longest wait for the release of the lease at shutdown.
pub const MAX_RELEASE_TIMEOUT: Duration = Duration::from_secs(10);

/// Lease settings.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// Lease namespace.
    pub namespace: String,
    /// Lease name.
    pub name: String,
    /// This replica's identity (pod name or hostname + pid).
    pub identity: String,
    /// Lease duration (`leaseDurationSeconds`).
    pub duration: Duration,
    /// The leader stops leading when it could not renew for this long;
    /// shorter than `duration`.
    pub renew_deadline: Duration,
    /// Time between rounds (acquire or renew); shorter than `renew_deadline`.
    pub retry_period: Duration,
    /// The clock `acquireTime` and `renewTime` are stamped with.
    pub clock: WallClock,
}

impl LeaseConfig {
    /// Settings with client-go's proportions (15 s / 10 s / 2 s) scaled to
    /// `duration` (at least 1 s): renew deadline 2/3, retry period 2/15 of it.
    pub fn new(namespace: String, name: String, identity: String, duration: Duration) -> Self {
        Self::with_timings(namespace, name, identity, LeaseTimings::client_go(duration))
    }

    /// Settings with the given (resolved) timings.
    pub fn with_timings(
        namespace: String,
        name: String,
        identity: String,
        timings: LeaseTimings,
    ) -> Self {
        Self {
            namespace,
            name,
            identity,
            duration: timings.duration,
            renew_deadline: timings.renew_deadline,
            retry_period: timings.retry_period,
            clock: WallClock::system(),
        }
    }

    /// Checks `retry_period < renew_deadline < duration`; the error names the
    /// values ([`LeaseTimings::check`], which `Config::resolve` runs first).
    pub fn validate(&self) -> Result<(), String> {
        LeaseTimings {
            duration: self.duration,
            renew_deadline: self.renew_deadline,
            retry_period: self.retry_period,
        }
        .check()
        .map_err(|m| format!("kube_discovery.leader_election: {m}"))
    }

    /// Upper bound of one round (GET + write): what is left of the renew
    /// deadline after one retry period, at least one retry period.
    fn round_timeout(&self) -> Duration {
        self.renew_deadline
            .saturating_sub(self.retry_period)
            .max(self.retry_period)
    }

    /// Upper bound of the release at shutdown (GET + write): one round's
    /// timeout, at most [`MAX_RELEASE_TIMEOUT`], so that a stop (in-flight
    /// writes, then the release) stays below a pod's default termination
    /// grace period of 30 s whatever the lease duration.
    pub fn release_timeout(&self) -> Duration {
        self.round_timeout().min(MAX_RELEASE_TIMEOUT)
    }
}

/// Whether a leader whose last successful round started at `last_ok` still
/// leads at `now`.
pub fn still_leading(last_ok: Option<Instant>, now: Instant, renew_deadline: Duration) -> bool {
    last_ok.is_some_and(|t| now.saturating_duration_since(t) < renew_deadline)
}

/// This replica's identity: `POD_NAME`, else `HOSTNAME`, plus the pid.
pub fn default_identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "kube-discovery".to_string());
    format!("{host}-{}", std::process::id())
}

/// The namespace the process runs in (ServiceAccount namespace file or `POD_NAMESPACE`).
pub fn own_namespace() -> Option<String> {
    std::env::var("POD_NAMESPACE")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
        })
}

fn spec_for(
    me: &str,
    now: jiff::Timestamp,
    duration: Duration,
    transitions: i32,
    acquire: Option<MicroTime>,
) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: Some(i32::try_from(duration.as_secs().max(1)).unwrap_or(i32::MAX)),
        acquire_time: Some(acquire.unwrap_or(MicroTime(now))),
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(transitions),
        ..LeaseSpec::default()
    }
}

/// One round: returns whether we hold the lease afterwards. `observed`
/// follows the record across rounds.
async fn round(api: &Api<Lease>, cfg: &LeaseConfig, observed: &mut Observed) -> kube::Result<bool> {
    let now = cfg.clock.now();
    let current = api.get_opt(&cfg.name).await?;
    let read_at = Instant::now();
    let spec = current.as_ref().and_then(|l| l.spec.as_ref());
    observed.see(spec, read_at);
    match decide(
        spec,
        &cfg.identity,
        observed.changed_at().unwrap_or(read_at),
        read_at,
        cfg.duration,
    ) {
        Decision::Create => {
            let lease = Lease {
                metadata: kube::api::ObjectMeta {
                    name: Some(cfg.name.clone()),
                    ..Default::default()
                },
                spec: Some(spec_for(&cfg.identity, now, cfg.duration, 0, None)),
            };
            match api.create(&PostParams::default(), &lease).await {
                Ok(l) => {
                    observed.see(l.spec.as_ref(), Instant::now());
                    Ok(true)
                }
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
        Decision::Follow(_) => Ok(false),
        d @ (Decision::Renew | Decision::TakeOver) => {
            let Some(mut lease) = current else {
                return Ok(false);
            };
            let old = lease.spec.clone().unwrap_or_default();
            let transitions =
                old.lease_transitions.unwrap_or(0) + i32::from(d == Decision::TakeOver);
            let acquire = if d == Decision::Renew {
                old.acquire_time
            } else {
                None
            };
            lease.spec = Some(spec_for(
                &cfg.identity,
                now,
                cfg.duration,
                transitions,
                acquire,
            ));
            // replace() sends metadata.resourceVersion: a concurrent change is a 409.
            match api.replace(&cfg.name, &PostParams::default(), &lease).await {
                Ok(l) => {
                    observed.see(l.spec.as_ref(), Instant::now());
                    Ok(true)
                }
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
    }
}

/// Gives the lease up (holder `""`) if we hold it, within
/// [`LeaseConfig::release_timeout`]: a hung API server does not hold up the
/// shutdown (a standby then takes over once the lease expires).
async fn release(api: &Api<Lease>, cfg: &LeaseConfig) {
    let limit = cfg.release_timeout();
    if tokio::time::timeout(limit, release_now(api, cfg))
        .await
        .is_err()
    {
        tracing::warn!(lease = %cfg.name, timeout = ?limit, "could not release the leader lease in time; a standby takes over when it expires");
    }
}

async fn release_now(api: &Api<Lease>, cfg: &LeaseConfig) {
    if let Ok(Some(mut lease)) = api.get_opt(&cfg.name).await
        && lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            == Some(cfg.identity.as_str())
    {
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = Some(String::new());
        }
        if let Err(e) = api.replace(&cfg.name, &PostParams::default(), &lease).await {
            tracing::warn!(error = %crate::k8s::redact::kube_detail(&e), "cannot release the leader lease");
        } else {
            tracing::info!(lease = %cfg.name, "released the leader lease");
        }
    }
}

/// Runs the election until `shutdown`; the receiver says whether we lead,
/// and in which epoch ([`Leadership`], also what a [`Fence`] follows).
/// The returned task resolves after the lease is released (bounded by
/// [`LeaseConfig::release_timeout`]).
pub fn spawn(
    client: Client,
    cfg: LeaseConfig,
    shutdown: CancellationToken,
) -> (watch::Receiver<Leadership>, tokio::task::JoinHandle<()>) {
    spawn_reporting(client, cfg, shutdown, None)
}

/// [`spawn`], reporting whether the rounds fail to `health` (see the
/// module docs).
pub fn spawn_reporting(
    client: Client,
    cfg: LeaseConfig,
    shutdown: CancellationToken,
    health: Option<std::sync::Arc<ControllerState>>,
) -> (watch::Receiver<Leadership>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(Leadership::default());
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let task = tokio::spawn(async move {
        let mut health = RoundHealth {
            shared: health,
            failing: false,
        };
        campaign(&api, &cfg, &tx, &shutdown, &mut health).await;
        // Not leading from here on: fenced writes send nothing after the release.
        publish(&tx, false);
        release(&api, &cfg).await;
    });
    (rx, task)
}

/// Publishes `leading` on `tx`, starting a new epoch when it changed;
/// returns whether it changed. (What the elector does; tests drive a
/// writer or a sink with it as a fake elector.)
pub fn publish(tx: &watch::Sender<Leadership>, leading: bool) -> bool {
    publish_until(tx, leading, None)
}

/// [`publish`], with the end of the leading term (`until`, ignored when not
/// leading). A new end alone (a renewal) wakes no receiver: the fences read
/// it when they check.
fn publish_until(tx: &watch::Sender<Leadership>, leading: bool, until: Option<Instant>) -> bool {
    tx.send_if_modified(|l| {
        let next = l.with_leading(leading);
        let changed = next.leading != l.leading;
        *l = Leadership {
            until: if leading { until } else { None },
            ..next
        };
        changed
    })
}

fn set_leading(
    tx: &watch::Sender<Leadership>,
    cfg: &LeaseConfig,
    leading: bool,
    last_ok: Option<Instant>,
) {
    let until = last_ok.map(|t| t + cfg.renew_deadline);
    if publish_until(tx, leading, until) {
        let epoch = tx.borrow().epoch;
        tracing::info!(identity = %cfg.identity, leading, epoch, "leadership changed");
    }
}

/// Steps down once `last_ok + renew_deadline` has passed (never resolves
/// when not leading).
async fn deadline(tx: &watch::Sender<Leadership>, last_ok: Option<Instant>, cfg: &LeaseConfig) {
    match last_ok {
        Some(t) if tx.borrow().leading => tokio::time::sleep_until(t + cfg.renew_deadline).await,
        _ => std::future::pending().await,
    }
}

/// Whether the rounds fail: logged once per change, reported to the state.
struct RoundHealth {
    shared: Option<std::sync::Arc<ControllerState>>,
    failing: bool,
}

impl RoundHealth {
    /// A round read the Lease (and wrote it where it decided to).
    fn ok(&mut self, cfg: &LeaseConfig) {
        if let Some(s) = &self.shared {
            s.lease_ok();
        }
        if std::mem::take(&mut self.failing) {
            tracing::info!(lease = %cfg.name, "leader election works again: the Lease can be read and written");
        }
    }

    /// A round failed with `error` (a safe summary) / `detail` (for the log).
    fn failed(&mut self, cfg: &LeaseConfig, error: String, detail: &str) {
        if let Some(s) = &self.shared {
            s.lease_failed(error);
        }
        if std::mem::replace(&mut self.failing, true) {
            tracing::debug!(lease = %cfg.name, error = %detail, "leader election round failed");
        } else {
            tracing::warn!(
                lease = %cfg.name,
                namespace = %cfg.namespace,
                error = %detail,
                "leader election failing: the Lease cannot be read or written, so this replica cannot lead (retrying every retry period; /readyz turns 503 once this lasts unready_after)"
            );
        }
    }
}

async fn campaign(
    api: &Api<Lease>,
    cfg: &LeaseConfig,
    tx: &watch::Sender<Leadership>,
    shutdown: &CancellationToken,
    health: &mut RoundHealth,
) {
    let mut last_ok: Option<Instant> = None;
    let mut observed = Observed::default();
    let step_down = |tx: &watch::Sender<Leadership>| {
        tracing::warn!(lease = %cfg.name, deadline = ?cfg.renew_deadline, "could not renew the leader lease within the renew deadline; stepping down");
        set_leading(tx, cfg, false, None);
    };
    loop {
        let started = Instant::now();
        let attempt = tokio::time::timeout(cfg.round_timeout(), round(api, cfg, &mut observed));
        tokio::pin!(attempt);
        let outcome = loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                r = &mut attempt => break r,
                () = deadline(tx, last_ok, cfg) => step_down(tx),
            }
        };
        match outcome {
            Ok(Ok(true)) => {
                health.ok(cfg);
                last_ok = Some(started);
                set_leading(
                    tx,
                    cfg,
                    still_leading(last_ok, Instant::now(), cfg.renew_deadline),
                    last_ok,
                );
            }
            Ok(Ok(false)) => {
                health.ok(cfg);
                last_ok = None;
                set_leading(tx, cfg, false, None);
            }
            Ok(Err(e)) => {
                health.failed(
                    cfg,
                    crate::k8s::redact::kube(&e),
                    &crate::k8s::redact::kube_detail(&e),
                );
            }
            Err(_) => {
                let timeout = cfg.round_timeout();
                let error = format!("timed out after {timeout:?}");
                health.failed(cfg, error.clone(), &error);
            }
        }
        if tx.borrow().leading && !still_leading(last_ok, Instant::now(), cfg.renew_deadline) {
            step_down(tx);
        }
        let pause = tokio::time::sleep(cfg.retry_period.max(Duration::from_millis(100)));
        tokio::pin!(pause);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = &mut pause => break,
                () = deadline(tx, last_ok, cfg) => step_down(tx),
            }
        }
    }
}

#[cfg(test)]
mod tests;
