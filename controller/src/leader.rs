//! Leader election on a `coordination.k8s.io/v1` Lease, so several replicas
//! can run and exactly one writes (`kube_discovery.leader_election`).
//!
//! ```text
//!  every retry_period:  GET lease ─▶ decide(spec, me, now)      (the round is bounded by a timeout)
//!      Create    (absent)                         ─▶ POST   holder=me
//!      Renew     (holder == me)                   ─▶ PUT    renewTime=now  (resourceVersion-guarded)
//!      TakeOver  (holder empty or renewTime+duration < now) ─▶ PUT holder=me, transitions+1
//!      Follow    (someone else holds a fresh lease)
//!  leader = the last successful Create/Renew/TakeOver STARTED less than renew_deadline ago
//!  every gain and every loss starts a new epoch (Leadership); sinks check it before each request (Fence)
//!  shutdown: a leader releases the lease (holder="") so a standby takes over at once
//! ```
//!
//! client-go semantics: `lease_duration` 15 s, `renew_deadline` 10 s,
//! `retry_period` 2 s ([`LeaseConfig::new`] scales these proportions to the
//! configured `lease_duration`). A leader that cannot renew (API errors, a
//! hung request, a partition) stops leading when `renew_deadline` has passed
//! since the start of its last successful renewal, by a timer that does not
//! wait for the pending request. A standby only takes over once
//! `renewTime + lease_duration` has passed, and `renewTime` is stamped at the
//! start of the round, so the old leader has stopped writing
//! `lease_duration - renew_deadline` (5 s by default) before anyone else may
//! start: two replicas never both write (for clocks that agree to better than
//! that margin). A replica that stepped down campaigns again like any other.
//!
//! All replicas watch and index (standbys are warm and serve the HTTP API);
//! only the leader's writer writes (see [`crate::writer::spawn_gated`]), and
//! every write request is fenced by the epoch it started in ([`Fence`]): a
//! write started before a loss of the lease sends nothing after it.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Client;
use kube::api::{Api, PostParams};
use kube_discovery_core::config::LeaseTimings;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

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

/// Pure decision from the lease spec (`None`: no lease object).
pub fn decide(
    spec: Option<&LeaseSpec>,
    me: &str,
    now: jiff::Timestamp,
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
    let secs = spec
        .lease_duration_seconds
        .map(|s| i64::from(s.max(1)))
        .unwrap_or_else(|| i64::try_from(default_duration.as_secs()).unwrap_or(15));
    match &spec.renew_time {
        Some(MicroTime(t)) if t.as_second() + secs >= now.as_second() => Decision::Follow(holder),
        _ => Decision::TakeOver,
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

    /// No leader election: always leading, epoch 0.
    pub fn always() -> Self {
        let (_tx, rx) = watch::channel(Leadership {
            epoch: 0,
            leading: true,
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

    /// Right before a request of the write that `token` started: `Ok` only
    /// while that epoch is still the current, leading one.
    pub fn check(&self, token: FenceToken) -> Result<(), Fenced> {
        let now = self.current();
        if now.leading && now.epoch == token.epoch {
            Ok(())
        } else {
            Err(Fenced {
                started: Some(token.epoch),
                now,
            })
        }
    }
}

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

/// One round: returns whether we hold the lease afterwards.
async fn round(api: &Api<Lease>, cfg: &LeaseConfig) -> kube::Result<bool> {
    let now = jiff::Timestamp::now();
    let current = api.get_opt(&cfg.name).await?;
    match decide(
        current.as_ref().and_then(|l| l.spec.as_ref()),
        &cfg.identity,
        now,
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
                Ok(_) => Ok(true),
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
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
    }
}

async fn release(api: &Api<Lease>, cfg: &LeaseConfig) {
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
            tracing::warn!(error = %e, "cannot release the leader lease");
        } else {
            tracing::info!(lease = %cfg.name, "released the leader lease");
        }
    }
}

/// Runs the election until `shutdown`; the receiver says whether we lead,
/// and in which epoch ([`Leadership`], also what a [`Fence`] follows).
/// The returned task resolves after the lease is released.
pub fn spawn(
    client: Client,
    cfg: LeaseConfig,
    shutdown: CancellationToken,
) -> (watch::Receiver<Leadership>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(Leadership::default());
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let task = tokio::spawn(async move {
        campaign(&api, &cfg, &tx, &shutdown).await;
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
    tx.send_if_modified(|l| {
        let next = l.with_leading(leading);
        let changed = next != *l;
        *l = next;
        changed
    })
}

fn set_leading(tx: &watch::Sender<Leadership>, cfg: &LeaseConfig, leading: bool) {
    if publish(tx, leading) {
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

async fn campaign(
    api: &Api<Lease>,
    cfg: &LeaseConfig,
    tx: &watch::Sender<Leadership>,
    shutdown: &CancellationToken,
) {
    let mut last_ok: Option<Instant> = None;
    let step_down = |tx: &watch::Sender<Leadership>| {
        tracing::warn!(lease = %cfg.name, deadline = ?cfg.renew_deadline, "could not renew the leader lease within the renew deadline; stepping down");
        set_leading(tx, cfg, false);
    };
    loop {
        let started = Instant::now();
        let attempt = tokio::time::timeout(cfg.round_timeout(), round(api, cfg));
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
                last_ok = Some(started);
                set_leading(
                    tx,
                    cfg,
                    still_leading(last_ok, Instant::now(), cfg.renew_deadline),
                );
            }
            Ok(Ok(false)) => {
                last_ok = None;
                set_leading(tx, cfg, false);
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "leader election round failed");
            }
            Err(_) => {
                tracing::warn!(timeout = ?cfg.round_timeout(), "leader election round timed out");
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
mod tests {
    use super::*;

    fn spec(holder: &str, renew_secs_ago: i64, duration: i32) -> LeaseSpec {
        let now = jiff::Timestamp::now();
        LeaseSpec {
            holder_identity: Some(holder.into()),
            renew_time: Some(MicroTime(
                now - jiff::SignedDuration::from_secs(renew_secs_ago),
            )),
            lease_duration_seconds: Some(duration),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn client_go_proportions_and_validation() {
        let c = LeaseConfig::new(
            "ns".into(),
            "l".into(),
            "me".into(),
            Duration::from_secs(15),
        );
        assert_eq!(c.renew_deadline, Duration::from_secs(10));
        assert_eq!(c.retry_period, Duration::from_secs(2));
        assert_eq!(c.round_timeout(), Duration::from_secs(8));
        assert!(c.validate().is_ok());
        let small = LeaseConfig::new("ns".into(), "l".into(), "me".into(), Duration::ZERO);
        assert_eq!(small.duration, Duration::from_secs(1));
        assert!(small.validate().is_ok(), "{small:?}");
        let bad = LeaseConfig {
            renew_deadline: Duration::from_secs(15),
            ..c.clone()
        };
        assert!(bad.validate().unwrap_err().contains("renew deadline"));
        let bad = LeaseConfig {
            retry_period: Duration::from_secs(10),
            ..c
        };
        assert!(bad.validate().unwrap_err().contains("retry period"));
    }

    #[test]
    fn leading_ends_at_the_renew_deadline() {
        let t0 = Instant::now();
        let d = Duration::from_secs(10);
        assert!(!still_leading(None, t0, d));
        assert!(still_leading(Some(t0), t0, d));
        assert!(still_leading(Some(t0), t0 + Duration::from_millis(9999), d));
        assert!(!still_leading(Some(t0), t0 + d, d));
        // A clock reading before the renewal (never happens) still leads.
        assert!(still_leading(Some(t0 + d), t0, d));
    }

    #[test]
    fn decisions() {
        let now = jiff::Timestamp::now();
        let d = Duration::from_secs(15);
        assert_eq!(decide(None, "me", now, d), Decision::Create);
        assert_eq!(
            decide(Some(&spec("me", 100, 15)), "me", now, d),
            Decision::Renew
        );
        assert_eq!(
            decide(Some(&spec("other", 1, 15)), "me", now, d),
            Decision::Follow("other".into())
        );
        assert_eq!(
            decide(Some(&spec("other", 30, 15)), "me", now, d),
            Decision::TakeOver
        );
        assert_eq!(
            decide(Some(&spec("", 0, 15)), "me", now, d),
            Decision::TakeOver
        );
        let mut no_renew = spec("other", 0, 15);
        no_renew.renew_time = None;
        assert_eq!(decide(Some(&no_renew), "me", now, d), Decision::TakeOver);
    }

    #[test]
    fn epochs_change_on_every_gain_and_loss_and_fence_old_ones() {
        let (tx, rx) = watch::channel(Leadership::default());
        let fence = Fence::new(rx);
        assert!(fence.begin().is_err(), "not leading");
        assert!(publish(&tx, true));
        assert!(!publish(&tx, true), "no change, no new epoch");
        let t1 = fence.begin().unwrap();
        assert_eq!(fence.check(t1), Ok(()));
        assert!(publish(&tx, false));
        let e = fence.check(t1).unwrap_err();
        assert_eq!(e.started, Some(1));
        assert_eq!(e.now.epoch, 2);
        assert!(publish(&tx, true));
        assert!(fence.check(t1).is_err(), "a write of an earlier epoch");
        let t3 = fence.begin().unwrap();
        assert_eq!(fence.check(t3), Ok(()));
        assert!(Fence::always().begin().is_ok());
    }
}
