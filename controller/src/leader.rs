//! Leader election on a `coordination.k8s.io/v1` Lease, so that several
//! replicas can run while exactly one writes DiscoveredServices.
//!
//! ```text
//!  every retry_period:  GET lease ──decide()──▶ Create   ─ POST  (409: someone was faster)
//!                                  │            Renew    ─ PUT with resourceVersion (409: lost a race)
//!                                  │            Acquire  ─ PUT with resourceVersion, transitions+1
//!                                  │            Follow   ─ nothing (another holder's lease is live)
//!                                  ▼
//!                       is_leader  (tokio watch channel the writer gates on)
//!  leader, no successful renew for renew_deadline ─▶ is_leader = false (step down BEFORE
//!                       anyone else may take over: renew_deadline < lease_duration)
//!  stop() after the writer finished ─▶ release: holder cleared, leaseDurationSeconds 1
//! ```
//!
//! Design points, as in client-go's `leaderelection`:
//! * Expiry is judged on OUR clock: a follower notes when it first saw the
//!   current record (holder, renewTime, transitions) and considers the lease
//!   expired `leaseDurationSeconds` after that, so clock skew between nodes
//!   does not matter. A follower that starts while a live leader holds the
//!   lease therefore waits one full lease duration before it can take over.
//! * Every write is a full `replace` carrying the `resourceVersion` that was
//!   read: two candidates racing for an expired lease cannot both win.
//! * A released lease (empty `holderIdentity`) is taken at once, so a clean
//!   shutdown (SIGTERM) hands over within one `retry_period`.
//! * The decision ([`decide`]) and the record changes ([`acquired`],
//!   [`renewed`], [`released`]) are pure and unit-tested; [`LeaderElection`]
//!   is the loop that does the I/O.
//!
//! Wiring (`run.rs`): spawn with [`LeaderElection::spawn`] when
//! `kube_discovery.leader_election.enabled`, hand [`LeaderElection::is_leader`]
//! to the writer (no write starts while it is `false`), and call
//! [`LeaderElection::stop`] after the writer has finished its in-flight writes.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::{Error, Result};

/// Where the runtime's own namespace is written in a Pod.
const SA_NAMESPACE_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// Settings of one election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// This replica's identity (`holderIdentity`); unique per process.
    pub identity: String,
    /// How long a lease lives without renewal (`leaseDurationSeconds`).
    pub lease_duration: Duration,
    /// The leader steps down when it could not renew for this long
    /// (must be shorter than `lease_duration`).
    pub renew_deadline: Duration,
    /// Time between attempts (acquire or renew).
    pub retry_period: Duration,
}

impl LeaderConfig {
    /// Settings with client-go's proportions (15 s / 10 s / 2 s scaled to
    /// `lease_duration`): renew deadline 2/3, retry period 2/15 of it.
    pub fn new(
        namespace: impl Into<String>,
        name: impl Into<String>,
        identity: impl Into<String>,
        lease_duration: Duration,
    ) -> Self {
        let lease_duration = lease_duration.max(Duration::from_secs(1));
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration,
            renew_deadline: lease_duration.mul_f64(2.0 / 3.0),
            retry_period: lease_duration
                .mul_f64(2.0 / 15.0)
                .max(Duration::from_millis(100)),
        }
    }

    /// Settings from `kube_discovery.leader_election`. The namespace is the
    /// configured one, else [`runtime_namespace`] (`fallback_namespace` is the
    /// client's default namespace).
    pub fn from_settings(
        s: &kube_discovery_core::config::LeaderElection,
        fallback_namespace: &str,
        identity: impl Into<String>,
    ) -> Self {
        let ns = s
            .lease_namespace
            .clone()
            .unwrap_or_else(|| runtime_namespace(fallback_namespace));
        Self::new(ns, s.lease_name.clone(), identity, s.lease_duration)
    }

    /// Checks the relations between the durations and the names.
    pub fn validate(&self) -> Result<()> {
        let field = "kube_discovery.leader_election";
        if self.name.is_empty() || self.namespace.is_empty() {
            return Err(Error::Config(format!(
                "{field}: lease name and namespace must not be empty"
            )));
        }
        if self.identity.is_empty() {
            return Err(Error::Config(format!(
                "{field}: the replica identity must not be empty"
            )));
        }
        if self.renew_deadline >= self.lease_duration {
            return Err(Error::Config(format!(
                "{field}: renew deadline {:?} must be shorter than lease_duration {:?}",
                self.renew_deadline, self.lease_duration
            )));
        }
        if self.retry_period >= self.renew_deadline {
            return Err(Error::Config(format!(
                "{field}: retry period {:?} must be shorter than the renew deadline {:?}",
                self.retry_period, self.renew_deadline
            )));
        }
        Ok(())
    }

    fn duration_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs().max(1)).unwrap_or(i32::MAX)
    }
}

/// The namespace the controller runs in: `POD_NAMESPACE`, else the
/// ServiceAccount namespace file, else `fallback`.
pub fn runtime_namespace(fallback: &str) -> String {
    if let Ok(ns) = std::env::var("POD_NAMESPACE") {
        let ns = ns.trim().to_string();
        if !ns.is_empty() {
            return ns;
        }
    }
    if let Ok(ns) = std::fs::read_to_string(SA_NAMESPACE_FILE) {
        let ns = ns.trim().to_string();
        if !ns.is_empty() {
            return ns;
        }
    }
    fallback.to_string()
}

/// A unique identity for this process: `POD_NAME` (else `HOSTNAME`, else
/// `kube-discovery`) plus the process id, so two processes on one host differ.
pub fn default_identity() -> String {
    let host = ["POD_NAME", "HOSTNAME"]
        .iter()
        .filter_map(|k| std::env::var(k).ok())
        .map(|v| v.trim().to_string())
        .find(|v| !v.is_empty())
        .unwrap_or_else(|| "kube-discovery".to_string());
    format!("{host}_{}", std::process::id())
}

/// What the elector does after reading the Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// No Lease exists: create it with us as holder.
    Create,
    /// We hold it: renew.
    Renew,
    /// It is free (released) or expired: take it over.
    Acquire,
    /// Someone else holds a live lease.
    Follow {
        /// The holder.
        holder: String,
    },
}

/// The part of a Lease record that changes on every renewal.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Record {
    holder: Option<String>,
    renew_time: Option<MicroTime>,
    transitions: Option<i32>,
    duration: Option<i32>,
}

impl Record {
    fn of(spec: &LeaseSpec) -> Self {
        Self {
            holder: spec.holder_identity.clone(),
            renew_time: spec.renew_time.clone(),
            transitions: spec.lease_transitions,
            duration: spec.lease_duration_seconds,
        }
    }
}

/// Remembers when (on the local monotonic clock) the current Lease record was
/// first seen; the lease expires `leaseDurationSeconds` after that.
#[derive(Debug, Clone, Default)]
pub struct Observer {
    seen: Option<(Record, Instant)>,
}

impl Observer {
    fn observe(&mut self, spec: &LeaseSpec, now: Instant) -> Instant {
        let rec = Record::of(spec);
        match &self.seen {
            Some((r, at)) if *r == rec => *at,
            _ => {
                self.seen = Some((rec, now));
                now
            }
        }
    }

    /// Forget the observation (after our own write changed the record).
    pub fn reset(&mut self) {
        self.seen = None;
    }
}

fn holder_of(spec: &LeaseSpec) -> Option<&str> {
    spec.holder_identity.as_deref().filter(|h| !h.is_empty())
}

/// Decides what to do with the Lease as read (`None`: it does not exist).
/// `default_duration` applies when the Lease has no (valid) duration.
pub fn decide(
    observer: &mut Observer,
    lease: Option<&LeaseSpec>,
    me: &str,
    now: Instant,
    default_duration: Duration,
) -> Action {
    let Some(spec) = lease else {
        observer.reset();
        return Action::Create;
    };
    let seen_at = observer.observe(spec, now);
    let Some(holder) = holder_of(spec) else {
        return Action::Acquire;
    };
    if holder == me {
        return Action::Renew;
    }
    let duration = spec
        .lease_duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .filter(|s| *s > 0)
        .map_or(default_duration, Duration::from_secs);
    if now >= seen_at + duration {
        Action::Acquire
    } else {
        Action::Follow {
            holder: holder.to_string(),
        }
    }
}

/// The spec after we acquire the lease (create or takeover).
pub fn acquired(
    prev: Option<&LeaseSpec>,
    me: &str,
    duration_seconds: i32,
    now: jiff::Timestamp,
) -> LeaseSpec {
    let transitions = match prev {
        None => 0,
        Some(p) => {
            let t = p.lease_transitions.unwrap_or(0);
            // Only a change of holder is a transition.
            if holder_of(p) == Some(me) {
                t
            } else {
                t.saturating_add(1)
            }
        }
    };
    LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: Some(duration_seconds),
        acquire_time: Some(MicroTime(now)),
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(transitions),
        ..LeaseSpec::default()
    }
}

/// The spec after we renew it.
pub fn renewed(prev: &LeaseSpec, duration_seconds: i32, now: jiff::Timestamp) -> LeaseSpec {
    LeaseSpec {
        renew_time: Some(MicroTime(now)),
        lease_duration_seconds: Some(duration_seconds),
        ..prev.clone()
    }
}

/// The spec after we release it: no holder, a 1 s duration, so any candidate
/// takes it at once.
pub fn released(prev: &LeaseSpec, now: jiff::Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        renew_time: Some(MicroTime(now)),
        ..prev.clone()
    }
}

/// A running election; see the module docs.
pub struct LeaderElection {
    rx: watch::Receiver<bool>,
    task: tokio::task::JoinHandle<()>,
    api: Api<Lease>,
    cfg: LeaderConfig,
}

impl LeaderElection {
    /// Starts campaigning until `shutdown` is cancelled.
    pub fn spawn(client: Client, cfg: LeaderConfig, shutdown: CancellationToken) -> Self {
        let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
        let (tx, rx) = watch::channel(false);
        let task = tokio::spawn(campaign(api.clone(), cfg.clone(), tx, shutdown));
        Self { rx, task, api, cfg }
    }

    /// `true` while this replica holds the lease; `changed()` wakes on every
    /// transition.
    pub fn is_leader(&self) -> watch::Receiver<bool> {
        self.rx.clone()
    }

    /// This replica's identity.
    pub fn identity(&self) -> &str {
        &self.cfg.identity
    }

    /// Waits for the campaign to end (cancel the `shutdown` token first), then
    /// releases the lease if we still hold it. Call after the writer finished.
    pub async fn stop(self) {
        let _ = self.task.await;
        match tokio::time::timeout(
            self.cfg.renew_deadline.max(Duration::from_secs(1)),
            release(&self.api, &self.cfg),
        )
        .await
        {
            Ok(Ok(true)) => {
                tracing::info!(lease = %self.cfg.name, namespace = %self.cfg.namespace, "leader lease released")
            }
            Ok(Ok(false)) => {}
            Ok(Err(e)) => {
                tracing::warn!(lease = %self.cfg.name, error = %e, "could not release the leader lease; it expires on its own")
            }
            Err(_) => {
                tracing::warn!(lease = %self.cfg.name, "releasing the leader lease timed out; it expires on its own")
            }
        }
    }
}

async fn release(api: &Api<Lease>, cfg: &LeaderConfig) -> Result<bool> {
    let Some(mut lease) = api.get_opt(&cfg.name).await? else {
        return Ok(false);
    };
    let Some(spec) = lease.spec.as_ref() else {
        return Ok(false);
    };
    if holder_of(spec) != Some(cfg.identity.as_str()) {
        return Ok(false);
    }
    lease.spec = Some(released(spec, jiff::Timestamp::now()));
    api.replace(&cfg.name, &PostParams::default(), &lease)
        .await?;
    Ok(true)
}

/// One attempt; `Ok(true)`: we hold the lease now.
async fn attempt(api: &Api<Lease>, cfg: &LeaderConfig, observer: &mut Observer) -> Result<bool> {
    let current = api.get_opt(&cfg.name).await?;
    let spec = current.as_ref().map(|l| l.spec.clone().unwrap_or_default());
    let action = decide(
        observer,
        spec.as_ref(),
        &cfg.identity,
        Instant::now(),
        cfg.lease_duration,
    );
    let now = jiff::Timestamp::now();
    let secs = cfg.duration_seconds();
    let result = match (action, current) {
        (Action::Create, _) => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(cfg.name.clone()),
                    namespace: Some(cfg.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(acquired(None, &cfg.identity, secs, now)),
            };
            api.create(&PostParams::default(), &lease).await.map(|_| ())
        }
        (Action::Follow { holder }, _) => {
            tracing::debug!(lease = %cfg.name, %holder, "following the current leader");
            return Ok(false);
        }
        (Action::Renew, Some(mut lease)) => {
            lease.spec = Some(renewed(&lease.spec.unwrap_or_default(), secs, now));
            api.replace(&cfg.name, &PostParams::default(), &lease)
                .await
                .map(|_| ())
        }
        (Action::Acquire, Some(mut lease)) => {
            let prev = lease.spec.take().unwrap_or_default();
            tracing::info!(lease = %cfg.name, previous = ?holder_of(&prev), "taking over the leader lease");
            lease.spec = Some(acquired(Some(&prev), &cfg.identity, secs, now));
            api.replace(&cfg.name, &PostParams::default(), &lease)
                .await
                .map(|_| ())
        }
        // Renew/Acquire are only decided for an existing Lease.
        (Action::Renew | Action::Acquire, None) => return Ok(false),
    };
    match result {
        Ok(()) => {
            observer.reset();
            Ok(true)
        }
        // Someone else wrote first (resourceVersion precondition or create race).
        Err(kube::Error::Api(s)) if s.code == 409 => {
            observer.reset();
            Ok(false)
        }
        Err(e) => Err(e.into()),
    }
}

async fn campaign(
    api: Api<Lease>,
    cfg: LeaderConfig,
    tx: watch::Sender<bool>,
    shutdown: CancellationToken,
) {
    let mut observer = Observer::default();
    let mut last_renew: Option<Instant> = None;
    tracing::info!(lease = %cfg.name, namespace = %cfg.namespace, identity = %cfg.identity, "leader election started");
    loop {
        let started = Instant::now();
        let call_timeout = cfg
            .renew_deadline
            .saturating_sub(cfg.retry_period)
            .max(cfg.retry_period);
        let outcome = tokio::select! {
            () = shutdown.cancelled() => break,
            r = tokio::time::timeout(call_timeout, attempt(&api, &cfg, &mut observer)) => r,
        };
        let leader = *tx.borrow();
        match outcome {
            Ok(Ok(true)) => {
                last_renew = Some(started);
                if !leader {
                    tracing::info!(lease = %cfg.name, identity = %cfg.identity, "became the leader");
                    tx.send_replace(true);
                }
            }
            Ok(Ok(false)) => {
                last_renew = None;
                if leader {
                    tracing::warn!(lease = %cfg.name, "lost the leader lease to another replica");
                    tx.send_replace(false);
                }
            }
            Ok(Err(e)) => {
                tracing::warn!(lease = %cfg.name, error = %e, "leader election attempt failed")
            }
            Err(_) => {
                tracing::warn!(lease = %cfg.name, timeout = ?call_timeout, "leader election attempt timed out")
            }
        }
        if *tx.borrow() && last_renew.is_none_or(|t| t.elapsed() >= cfg.renew_deadline) {
            tracing::warn!(lease = %cfg.name, deadline = ?cfg.renew_deadline, "could not renew the leader lease in time; stepping down");
            tx.send_replace(false);
        }
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tokio::time::sleep(cfg.retry_period) => {}
        }
    }
    // Stop writing before the lease is released by `stop()`.
    tx.send_replace(false);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    const D: Duration = Duration::from_secs(15);

    fn spec(holder: Option<&str>, renew_secs: i64, transitions: i32) -> LeaseSpec {
        LeaseSpec {
            holder_identity: holder.map(str::to_string),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(jiff::Timestamp::from_second(renew_secs).unwrap())),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    #[test]
    fn no_lease_is_created_and_our_own_lease_is_renewed() {
        let mut o = Observer::default();
        let t0 = Instant::now();
        assert_eq!(decide(&mut o, None, "a", t0, D), Action::Create);
        assert_eq!(
            decide(&mut o, Some(&spec(Some("a"), 100, 0)), "a", t0, D),
            Action::Renew
        );
    }

    #[test]
    fn a_live_lease_of_another_holder_is_followed_until_it_expires_on_our_clock() {
        let mut o = Observer::default();
        let t0 = Instant::now();
        // renewTime far in the past on THEIR clock: irrelevant, we only trust our observation.
        let s = spec(Some("b"), 1, 3);
        assert_eq!(
            decide(&mut o, Some(&s), "a", t0, D),
            Action::Follow { holder: "b".into() }
        );
        assert_eq!(
            decide(&mut o, Some(&s), "a", t0 + D - Duration::from_millis(1), D),
            Action::Follow { holder: "b".into() }
        );
        assert_eq!(decide(&mut o, Some(&s), "a", t0 + D, D), Action::Acquire);
    }

    #[test]
    fn a_renewal_restarts_the_expiry_clock() {
        let mut o = Observer::default();
        let t0 = Instant::now();
        assert!(matches!(
            decide(&mut o, Some(&spec(Some("b"), 100, 0)), "a", t0, D),
            Action::Follow { .. }
        ));
        let later = t0 + Duration::from_secs(10);
        assert!(matches!(
            decide(&mut o, Some(&spec(Some("b"), 110, 0)), "a", later, D),
            Action::Follow { .. }
        ));
        // 15 s after the FIRST observation, but only 5 s after the renewal was seen.
        assert!(matches!(
            decide(&mut o, Some(&spec(Some("b"), 110, 0)), "a", t0 + D, D),
            Action::Follow { .. }
        ));
        assert_eq!(
            decide(&mut o, Some(&spec(Some("b"), 110, 0)), "a", later + D, D),
            Action::Acquire
        );
    }

    #[test]
    fn the_lease_duration_comes_from_the_lease_when_valid() {
        let t0 = Instant::now();
        let mut short = spec(Some("b"), 100, 0);
        short.lease_duration_seconds = Some(2);
        let mut o = Observer::default();
        decide(&mut o, Some(&short), "a", t0, D);
        assert_eq!(
            decide(&mut o, Some(&short), "a", t0 + Duration::from_secs(2), D),
            Action::Acquire
        );
        for bad in [None, Some(0), Some(-5)] {
            let mut s = spec(Some("b"), 100, 0);
            s.lease_duration_seconds = bad;
            let mut o = Observer::default();
            decide(&mut o, Some(&s), "a", t0, D);
            assert!(
                matches!(
                    decide(&mut o, Some(&s), "a", t0 + Duration::from_secs(2), D),
                    Action::Follow { .. }
                ),
                "{bad:?}"
            );
            assert_eq!(
                decide(&mut o, Some(&s), "a", t0 + D, D),
                Action::Acquire,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_released_lease_is_acquired_at_once() {
        let t0 = Instant::now();
        for holder in [None, Some("")] {
            let mut o = Observer::default();
            assert_eq!(
                decide(&mut o, Some(&spec(holder, 100, 4)), "a", t0, D),
                Action::Acquire,
                "{holder:?}"
            );
        }
    }

    #[test]
    fn record_changes_count_transitions_only_on_a_change_of_holder() {
        let now = jiff::Timestamp::from_second(1_000).unwrap();
        let created = acquired(None, "a", 15, now);
        assert_eq!(created.holder_identity.as_deref(), Some("a"));
        assert_eq!(created.lease_transitions, Some(0));
        assert_eq!(created.acquire_time, Some(MicroTime(now)));
        assert_eq!(created.renew_time, Some(MicroTime(now)));
        assert_eq!(created.lease_duration_seconds, Some(15));

        let taken = acquired(Some(&spec(Some("b"), 900, 3)), "a", 15, now);
        assert_eq!(taken.lease_transitions, Some(4));
        assert_eq!(taken.holder_identity.as_deref(), Some("a"));
        let from_released = acquired(Some(&spec(None, 900, 4)), "a", 15, now);
        assert_eq!(from_released.lease_transitions, Some(5));

        let later = jiff::Timestamp::from_second(1_010).unwrap();
        let r = renewed(&created, 15, later);
        assert_eq!(r.renew_time, Some(MicroTime(later)));
        assert_eq!(
            r.acquire_time,
            Some(MicroTime(now)),
            "renewal keeps acquireTime"
        );
        assert_eq!(r.lease_transitions, Some(0));

        let rel = released(&r, later);
        assert_eq!(rel.holder_identity, None);
        assert_eq!(rel.lease_duration_seconds, Some(1));
        assert_eq!(rel.lease_transitions, Some(0));
        let mut o = Observer::default();
        assert_eq!(
            decide(&mut o, Some(&rel), "b", Instant::now(), D),
            Action::Acquire
        );
    }

    #[test]
    fn config_proportions_and_validation() {
        let c = LeaderConfig::new("ns", "kube-discovery", "me", Duration::from_secs(15));
        assert_eq!(c.renew_deadline, Duration::from_secs(10));
        assert_eq!(c.retry_period, Duration::from_secs(2));
        c.validate().unwrap();
        let mut bad = c.clone();
        bad.renew_deadline = bad.lease_duration;
        let e = bad.validate().unwrap_err().to_string();
        assert!(
            e.contains("kube_discovery.leader_election") && e.contains("renew deadline"),
            "{e}"
        );
        let mut bad = c.clone();
        bad.identity.clear();
        assert!(bad.validate().unwrap_err().to_string().contains("identity"));
        let tiny = LeaderConfig::new("ns", "l", "me", Duration::from_millis(10));
        assert_eq!(
            tiny.lease_duration,
            Duration::from_secs(1),
            "clamped to the API's 1 s unit"
        );
        tiny.validate().unwrap();
        let settings = kube_discovery_core::config::Settings::default().leader_election;
        let from = LeaderConfig::from_settings(
            &kube_discovery_core::config::LeaderElection {
                lease_namespace: Some("kd".into()),
                ..settings
            },
            "default",
            "me",
        );
        assert_eq!(
            (from.namespace.as_str(), from.name.as_str()),
            ("kd", "kube-discovery")
        );
        assert!(default_identity().contains(&std::process::id().to_string()));
    }

    // ---- against an in-process kube-sim (real HTTP, real resourceVersion checks)

    async fn sim_client(sim: &kube_sim::Sim) -> Client {
        let kc =
            kube::config::Kubeconfig::from_yaml(&sim.kubeconfig_yaml(&sim.admin_token())).unwrap();
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        Client::try_from(cfg).unwrap()
    }

    async fn wait_for(rx: &mut watch::Receiver<bool>, want: bool) {
        tokio::time::timeout(Duration::from_secs(30), rx.wait_for(|v| *v == want))
            .await
            .expect("leadership did not change in 30 s")
            .expect("election ended");
    }

    fn cfg(identity: &str) -> LeaderConfig {
        LeaderConfig::new(
            "default",
            "kube-discovery",
            identity,
            Duration::from_secs(3),
        )
    }

    #[tokio::test]
    async fn one_leader_at_a_time_release_hands_over_and_a_stale_write_conflicts() {
        let sim = kube_sim::Sim::start(kube_sim::SimConfig::default())
            .await
            .unwrap();
        let client = sim_client(&sim).await;
        let (stop_a, stop_b) = (CancellationToken::new(), CancellationToken::new());
        let a = LeaderElection::spawn(client.clone(), cfg("a"), stop_a.clone());
        let mut a_rx = a.is_leader();
        wait_for(&mut a_rx, true).await;
        let b = LeaderElection::spawn(client.clone(), cfg("b"), stop_b.clone());
        let b_rx = b.is_leader();
        // b keeps following while a renews (several renew periods).
        for _ in 0..10 {
            tokio::time::sleep(cfg("x").retry_period).await;
            assert!(*a_rx.borrow() && !*b_rx.borrow(), "exactly one leader");
        }
        let api: Api<Lease> = Api::namespaced(client.clone(), "default");
        let held = api.get("kube-discovery").await.unwrap();
        assert_eq!(
            held.spec.as_ref().unwrap().holder_identity.as_deref(),
            Some("a")
        );

        // A write with an outdated resourceVersion is refused (the precondition the elector relies on).
        let mut stale = held.clone();
        stale.metadata.resource_version = Some("1".into());
        stale.spec = Some(acquired(
            stale.spec.as_ref(),
            "intruder",
            3,
            jiff::Timestamp::now(),
        ));
        match api
            .replace("kube-discovery", &PostParams::default(), &stale)
            .await
        {
            Err(kube::Error::Api(s)) => assert_eq!(s.code, 409),
            other => panic!("expected 409 Conflict, got {other:?}"),
        }

        // a shuts down cleanly: released, b takes over, transitions counted.
        stop_a.cancel();
        a.stop().await;
        assert!(!*a_rx.borrow());
        let mut b_rx2 = b.is_leader();
        wait_for(&mut b_rx2, true).await;
        let now = api.get("kube-discovery").await.unwrap();
        let spec = now.spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("b"));
        assert_eq!(spec.lease_transitions, Some(1));
        stop_b.cancel();
        b.stop().await;
        let after = api.get("kube-discovery").await.unwrap().spec.unwrap();
        assert_eq!(after.holder_identity, None, "released on stop");
        sim.shutdown().await;
    }

    #[tokio::test]
    async fn a_vanished_leader_is_replaced_after_the_lease_expires() {
        let sim = kube_sim::Sim::start(kube_sim::SimConfig::default())
            .await
            .unwrap();
        let client = sim_client(&sim).await;
        // A lease held by a process that died (never renewed, never released).
        let api: Api<Lease> = Api::namespaced(client.clone(), "default");
        let dead = Lease {
            metadata: ObjectMeta {
                name: Some("kube-discovery".into()),
                ..ObjectMeta::default()
            },
            spec: Some(acquired(None, "dead", 2, jiff::Timestamp::now())),
        };
        api.create(&PostParams::default(), &dead).await.unwrap();
        let stop = CancellationToken::new();
        let e = LeaderElection::spawn(client.clone(), cfg("c"), stop.clone());
        let mut rx = e.is_leader();
        // Not at once: the dead holder's lease must expire first.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!*rx.borrow(), "took over a lease that had not expired");
        wait_for(&mut rx, true).await;
        let spec = api.get("kube-discovery").await.unwrap().spec.unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("c"));
        assert_eq!(spec.lease_transitions, Some(1));
        stop.cancel();
        e.stop().await;
        sim.shutdown().await;
    }

    #[tokio::test]
    async fn the_leader_steps_down_when_it_cannot_renew() {
        let sim = kube_sim::Sim::start(kube_sim::SimConfig::default())
            .await
            .unwrap();
        let client = sim_client(&sim).await;
        let stop = CancellationToken::new();
        let e = LeaderElection::spawn(client.clone(), cfg("d"), stop.clone());
        let mut rx = e.is_leader();
        wait_for(&mut rx, true).await;
        // The API server goes away for longer than the renew deadline.
        let req = http::Request::post("/_sim/faults")
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&serde_json::json!({"refuseConnectionsSeconds": 6})).unwrap())
            .unwrap();
        client.request::<serde_json::Value>(req).await.unwrap();
        wait_for(&mut rx, false).await;
        // And leads again once it is back (its own lease: renewed).
        wait_for(&mut rx, true).await;
        stop.cancel();
        e.stop().await;
        sim.shutdown().await;
    }
}
