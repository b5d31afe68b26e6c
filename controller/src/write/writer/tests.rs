//! The writer's behaviour through its inbox, with a fake sink.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use kube_discovery_core::{Node, PortMap, ServiceKey, ServiceNodes, SourceKind};

use super::*;
use crate::Result;
use crate::k8s::leader::{Fence, publish};
use crate::write::drift::{DriftCheck, DriftKind};
use kube_discovery_core::write_plan::{DriftFacts, SeenObject, WantedObjectFacts, judge_drift};

#[derive(Debug, Clone, PartialEq)]
enum Call {
    Apply(String, String),
    Delete(String),
}

#[derive(Clone, Default)]
struct FakeSink {
    existing: HashMap<ServiceKey, String>,
    calls: Arc<Mutex<Vec<Call>>>,
    /// Number of upcoming apply calls that fail.
    fail_next: Arc<Mutex<u32>>,
    /// What `drift` answers per key (default `Ok`), and how often it was asked.
    drift: Arc<Mutex<HashMap<ServiceKey, DriftCheck>>>,
    drift_asked: Arc<Mutex<u32>>,
    /// Number of upcoming apply calls that panic.
    panic_next: Arc<Mutex<u32>>,
    /// Checked like `KubeSink` does: when the write starts and right before
    /// it is "sent" (recorded in `calls`).
    fence: Option<Fence>,
    /// A fake elector: the next `list_versions` makes it lose the lease.
    lose_on_list: Arc<Mutex<Option<Arc<watch::Sender<Leadership>>>>>,
    /// The [`Prior`] of every apply and delete call, in order.
    priors: Arc<Mutex<Vec<Prior>>>,
    /// The shard count an apply reports (default 1).
    apply_shards: Arc<Mutex<Option<u32>>>,
    /// `key reason` of every `Sink::failing` report (an Event in `KubeSink`).
    failing: Arc<Mutex<Vec<String>>>,
    /// Number of upcoming apply calls the "API server" answers with 429 and
    /// `Retry-After: 2`, recorded in `throttle` as the writer's client does.
    throttle_next: Arc<Mutex<u32>>,
    throttle: ThrottleSignal,
    /// The record the writer's planner reads (`list_versions` feeds it).
    record: SharedRecord,
}

impl FakeSink {
    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().clone()
    }

    fn priors(&self) -> Vec<Prior> {
        self.priors.lock().unwrap().clone()
    }

    /// Starts a write decided in `epoch`: the fence's token (`KubeSink::apply`
    /// and `delete` do the same).
    fn begin(&self, epoch: u64) -> Result<Option<crate::k8s::leader::FenceToken>> {
        Ok(match &self.fence {
            Some(f) => Some(f.begin_in(epoch)?),
            None => None,
        })
    }

    /// Right before sending (`KubeSink` checks before every request).
    fn check(&self, token: Option<crate::k8s::leader::FenceToken>) -> Result<()> {
        if let (Some(f), Some(t)) = (&self.fence, token) {
            f.check(t)?;
        }
        Ok(())
    }
}

impl Sink for FakeSink {
    async fn list_versions(&self) -> Result<Vec<(ServiceKey, Held)>> {
        let lose = self.lose_on_list.lock().unwrap().take();
        if let Some(elector) = lose {
            publish(&elector, false);
        }
        let ticket = self.record.lock().list_begins();
        let known: Vec<(ServiceKey, Held)> = self
            .existing
            .iter()
            .map(|(k, version)| {
                let held = Held {
                    version: version.clone(),
                    shards: 1,
                };
                (k.clone(), held)
            })
            .collect();
        let mut listing = kube_discovery_core::write_plan::record::Listing::default();
        for (k, held) in &known {
            listing.service(k, held);
        }
        self.record.lock().listed(ticket, listing);
        Ok(known)
    }
    fn record(&self) -> SharedRecord {
        self.record.clone()
    }
    async fn apply(&self, svc: Arc<ServiceNodes>, prior: Prior, epoch: u64) -> Result<u32> {
        self.priors.lock().unwrap().push(prior);
        let token = self.begin(epoch)?;
        let panic = {
            let mut p = self.panic_next.lock().unwrap();
            let now = *p > 0;
            *p = p.saturating_sub(1);
            now
        };
        assert!(!panic, "injected panic in a write");
        {
            let mut f = self.fail_next.lock().unwrap();
            if *f > 0 {
                *f -= 1;
                return Err(crate::InputError::Injected.into());
            }
        }
        {
            let mut t = self.throttle_next.lock().unwrap();
            if *t > 0 {
                *t -= 1;
                let answer = http::Response::builder()
                    .status(429)
                    .header("Retry-After", "2")
                    .body(())
                    .unwrap();
                self.throttle.record(&answer);
                return Err(Error::Kube(kube::Error::Api(Box::new(
                    kube::core::Status::failure("Too many requests", "TooManyRequests")
                        .with_code(429),
                ))));
            }
        }
        self.check(token)?;
        self.calls
            .lock()
            .unwrap()
            .push(Call::Apply(svc.key.to_string(), svc.version.clone()));
        Ok(self.apply_shards.lock().unwrap().unwrap_or(1))
    }
    async fn delete(&self, key: ServiceKey, prior: Prior, epoch: u64) -> Result<()> {
        self.priors.lock().unwrap().push(prior);
        let token = self.begin(epoch)?;
        self.check(token)?;
        self.calls
            .lock()
            .unwrap()
            .push(Call::Delete(key.to_string()));
        Ok(())
    }
    fn failing(&self, key: &ServiceKey, _desired: Option<&ServiceNodes>, error: &Error) {
        self.failing
            .lock()
            .unwrap()
            .push(format!("{key} {}", error.metric_label()));
    }
    fn drift_facts(&self, key: &ServiceKey, _desired: Option<&ServiceNodes>) -> DriftFacts {
        *self.drift_asked.lock().unwrap() += 1;
        let check = self
            .drift
            .lock()
            .unwrap()
            .get(key)
            .copied()
            .unwrap_or(DriftCheck::Ok);
        facts_judged(key, check)
    }
}

/// What a drift watch would show of `key` for the planner to judge `check`.
fn facts_judged(key: &ServiceKey, check: DriftCheck) -> DriftFacts {
    let name = (key.namespace.to_string(), key.name.to_string());
    let want = |seen| WantedObjectFacts {
        name: name.clone(),
        spec: 1,
        owners: Vec::new(),
        seen,
    };
    let edited = SeenObject {
        resource_version: Some(2),
        written: Some(1),
        spec: 2,
        owners: Vec::new(),
        labels_ok: true,
        stamp_ok: true,
    };
    let (listed, wanted, present) = match check {
        DriftCheck::Ok => return DriftFacts::unwatched(),
        DriftCheck::Stale => (false, Vec::new(), Vec::new()),
        DriftCheck::Drift(DriftKind::Deleted) => (true, vec![want(None)], Vec::new()),
        DriftCheck::Drift(DriftKind::Edited) => {
            (true, vec![want(Some(edited))], vec![name.clone()])
        }
        DriftCheck::Drift(DriftKind::Orphan) => (true, Vec::new(), vec![name.clone()]),
    };
    let facts = DriftFacts {
        listed,
        wanted,
        present,
    };
    assert_eq!(DriftCheck::from(judge_drift(&facts)), check);
    facts
}

pub(super) fn nodes(key: &ServiceKey, hosts: &[&str]) -> ServiceNodes {
    let mut ports = PortMap::new();
    ports.insert(
        "http".into(),
        hosts.iter().map(|h| Node::new(*h, 80, 50)).collect(),
    );
    ServiceNodes::new(key.clone(), SourceKind::EndpointSlice, ports, None)
}

fn opts() -> WriterOptions {
    WriterOptions {
        coalesce_window: Duration::from_millis(100),
        coalesce_leading_edge: true,
        concurrency: 2,
        qps: 0.0,
        start_qps: 0.0,
        max_pause: Duration::from_secs(10),
        retry_min: Duration::from_millis(200),
        retry_max: Duration::from_secs(2),
        drift_delay: Duration::from_millis(250),
        drift_settle: Duration::from_millis(750),
    }
}

/// A writer over `sink` and `shared` with [`opts`], its metrics unread.
fn start(
    sink: &FakeSink,
    shared: &Arc<ControllerState>,
) -> (WriterHandle, tokio::task::JoinHandle<()>) {
    start_with(sink, shared, opts(), Spawn::default())
}

/// A writer over `sink` and `shared` with `opts` and the rest of `with`.
fn start_with(
    sink: &FakeSink,
    shared: &Arc<ControllerState>,
    opts: WriterOptions,
    with: Spawn,
) -> (WriterHandle, tokio::task::JoinHandle<()>) {
    spawn(sink.clone(), shared.clone(), Spawn { opts, ..with })
}

/// Runs the paused clock forward so every due write happens.
async fn settle() {
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn burst_inside_window_is_the_first_change_at_once_then_one_write_of_the_latest_state() {
    let sink = FakeSink::default();
    let shared = Arc::new(ControllerState::new([""]));
    let (h, _t) = start(&sink, &shared);
    let k = ServiceKey::new("", "ns", "web");
    for hosts in [
        &["10.0.0.1"][..],
        &["10.0.0.1", "10.0.0.2"],
        &["10.0.0.1", "10.0.0.2", "10.0.0.3"],
    ] {
        shared.set_desired(&k, Some(nodes(&k, hosts)));
        h.changed(vec![k.clone()], Instant::now());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    settle().await;
    // The first change meets a quiet service: written at once; the two
    // within its window are one write at the window's end.
    let first = nodes(&k, &["10.0.0.1"]).version;
    let want = nodes(&k, &["10.0.0.1", "10.0.0.2", "10.0.0.3"]).version;
    assert_eq!(
        sink.calls(),
        vec![
            Call::Apply("ns/web".into(), first),
            Call::Apply("ns/web".into(), want)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn existing_equal_versions_are_not_rewritten_and_changed_ones_are() {
    let k1 = ServiceKey::new("", "ns", "same");
    let k2 = ServiceKey::new("", "ns", "changed");
    let shared = Arc::new(ControllerState::new([""]));
    shared.set_desired(&k1, Some(nodes(&k1, &["10.0.0.1"])));
    shared.set_desired(&k2, Some(nodes(&k2, &["10.0.0.9"])));
    let sink = FakeSink {
        existing: HashMap::from([
            (k1.clone(), nodes(&k1, &["10.0.0.1"]).version),
            (k2.clone(), nodes(&k2, &["10.0.0.2"]).version),
        ]),
        ..FakeSink::default()
    };
    let m = Metrics::default();
    let (h, _t) = start_with(
        &sink,
        &shared,
        opts(),
        Spawn {
            metrics: m.clone(),
            ..Spawn::default()
        },
    );
    h.changed(vec![k1.clone(), k2.clone()], Instant::now());
    h.synced("");
    settle().await;
    assert_eq!(
        sink.calls(),
        vec![Call::Apply(
            "ns/changed".into(),
            nodes(&k2, &["10.0.0.9"]).version
        )]
    );
    assert_eq!(
        m.writes_skipped.get_or_create(&Metrics::cluster("")).get(),
        1
    );
    assert!(shared.ready());
    // The same desired state again: no write.
    h.changed(vec![k1.clone(), k2.clone()], Instant::now());
    settle().await;
    assert_eq!(sink.calls().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn first_list_barrier_deletes_objects_whose_source_vanished() {
    let gone = ServiceKey::new("", "ns", "gone");
    let other = ServiceKey::new("c2", "ns", "gone");
    let shared = Arc::new(ControllerState::new([""]));
    let sink = FakeSink {
        existing: HashMap::from([
            (gone.clone(), "v".to_string()),
            (other.clone(), "v".to_string()),
        ]),
        ..FakeSink::default()
    };
    let (h, _t) = start(&sink, &shared);
    h.synced("");
    tokio::task::yield_now().await;
    settle().await;
    // Only this cluster's object is deleted; another cluster's is left alone.
    assert_eq!(sink.calls(), vec![Call::Delete("ns/gone".into())]);
    assert!(shared.ready());
}

#[tokio::test(start_paused = true)]
async fn failed_writes_are_retried_reported_and_never_lose_the_latest_state() {
    let sink = FakeSink {
        fail_next: Arc::new(Mutex::new(3)),
        ..FakeSink::default()
    };
    let shared = Arc::new(ControllerState::new([""]));
    let m = Metrics::default();
    let (h, _t) = start_with(
        &sink,
        &shared,
        opts(),
        Spawn {
            metrics: m.clone(),
            ..Spawn::default()
        },
    );
    let k = ServiceKey::new("", "ns", "web");
    shared.set_desired(&k, Some(nodes(&k, &["10.0.0.1"])));
    h.changed(vec![k.clone()], Instant::now());
    h.synced("");
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(sink.calls().is_empty());
    // Attempted and failed: reported, and no reason to stay unready (an
    // object the API server refuses must not keep the controller unready).
    assert!(shared.ready(), "ready once the first list was attempted");
    let text = crate::serve::metrics::encode(&m.registry());
    assert!(
        text.contains(r#"kube_discovery_objects_failing{cluster="",reason="input"} 1"#),
        "{text}"
    );
    // A newer state arrives while retrying: the newer one is what gets written.
    shared.set_desired(&k, Some(nodes(&k, &["10.0.0.2"])));
    h.changed(vec![k.clone()], Instant::now());
    settle().await;
    assert_eq!(
        sink.calls(),
        vec![Call::Apply(
            "ns/web".into(),
            nodes(&k, &["10.0.0.2"]).version
        )]
    );
    assert!(shared.ready());
    let text = crate::serve::metrics::encode(&m.registry());
    assert!(
        text.contains(r#"kube_discovery_writes_total{cluster="",result="error_input"} 3"#),
        "{text}"
    );
    assert!(
        text.contains(r#"kube_discovery_objects_failing{cluster="",reason="input"} 0"#),
        "written: no longer failing\n{text}"
    );
    // Three failures, one report (one Event): when it started failing.
    assert_eq!(*sink.failing.lock().unwrap(), vec!["ns/web input"]);
}

#[tokio::test(start_paused = true)]
async fn a_standby_does_not_write_until_it_becomes_leader() {
    let k = ServiceKey::new("", "ns", "web");
    let shared = Arc::new(ControllerState::new([""]));
    shared.set_desired(&k, Some(nodes(&k, &["10.0.0.1"])));
    let sink = FakeSink::default();
    let (tx, rx) = watch::channel(crate::k8s::leader::Leadership::default());
    let (h, _t) = start_with(
        &sink,
        &shared,
        opts(),
        Spawn {
            leader: Some(rx),
            ..Spawn::default()
        },
    );
    h.changed(vec![k.clone()], Instant::now());
    shared.update_cluster("", |c| c.listed = true);
    h.synced("");
    settle().await;
    assert!(sink.calls().is_empty(), "a standby wrote");
    assert!(
        shared.standby() && shared.ready(),
        "a listed standby is ready"
    );
    crate::k8s::leader::publish(&tx, true);
    settle().await;
    assert_eq!(
        sink.calls(),
        vec![Call::Apply(
            "ns/web".into(),
            nodes(&k, &["10.0.0.1"]).version
        )]
    );
    assert!(!shared.standby() && shared.ready());
    // Leadership lost: new changes wait.
    crate::k8s::leader::publish(&tx, false);
    settle().await;
    shared.set_desired(&k, Some(nodes(&k, &["10.0.0.2"])));
    h.changed(vec![k.clone()], Instant::now());
    settle().await;
    assert_eq!(sink.calls().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_later_change_after_a_large_batch_is_written_again() {
    let sink = FakeSink::default();
    let shared = Arc::new(ControllerState::new([""]));
    let (h, _t) = start(&sink, &shared);
    let keys: Vec<ServiceKey> = (0..50)
        .map(|i| ServiceKey::new("", "ns", format!("s{i}")))
        .collect();
    for k in &keys {
        shared.set_desired(k, Some(nodes(k, &["10.0.0.1"])));
    }
    h.changed(keys.clone(), Instant::now());
    h.synced("");
    // After the batch became due, s0 changes again.
    tokio::time::sleep(Duration::from_millis(101)).await;
    shared.set_desired(&keys[0], Some(nodes(&keys[0], &["10.0.0.2"])));
    h.changed(vec![keys[0].clone()], Instant::now());
    settle().await;
    let calls = sink.calls();
    assert_eq!(calls.len(), 51, "{calls:?}");
    assert_eq!(
        calls.last(),
        Some(&Call::Apply(
            "ns/s0".into(),
            nodes(&keys[0], &["10.0.0.2"]).version
        ))
    );
    assert!(shared.ready());
}

#[tokio::test(start_paused = true)]
async fn deletes_only_what_exists_and_rate_limit_spaces_writes() {
    let sink = FakeSink::default();
    let shared = Arc::new(ControllerState::new([""]));
    let o = WriterOptions {
        qps: 2.0,
        start_qps: 2.0,
        concurrency: 8,
        ..opts()
    };
    let (h, _t) = start_with(&sink, &shared, o, Spawn::default());
    let keys: Vec<ServiceKey> = (0..6)
        .map(|i| ServiceKey::new("", "ns", format!("s{i}")))
        .collect();
    for k in &keys {
        shared.set_desired(k, Some(nodes(k, &["10.0.0.1"])));
    }
    let start = Instant::now();
    h.changed(keys.clone(), start);
    // Never-written key removed: nothing to delete.
    h.changed(vec![ServiceKey::new("", "ns", "never")], start);
    settle().await;
    assert_eq!(sink.calls().len(), 6);
    // 6 writes at 2/s, strictly spaced (no burst): 2.5 s.
    assert!(Instant::now() - start >= Duration::from_millis(2500));
    shared.set_desired(&keys[0], None);
    h.changed(vec![keys[0].clone()], Instant::now());
    settle().await;
    assert_eq!(sink.calls().last(), Some(&Call::Delete("ns/s0".into())));
}

#[tokio::test(start_paused = true)]
async fn drift_reports_rewrite_only_real_differences_after_writes_settle() {
    let sink = FakeSink::default();
    let shared = Arc::new(ControllerState::new([""]));
    let m = Metrics::default();
    let (h, _t) = start_with(
        &sink,
        &shared,
        opts(),
        Spawn {
            metrics: m.clone(),
            ..Spawn::default()
        },
    );
    let k = ServiceKey::new("", "ns", "web");
    let v1 = nodes(&k, &["10.0.0.1"]);
    shared.set_desired(&k, Some(v1.clone()));
    shared.update_cluster("", |c| c.listed = true);
    h.changed(vec![k.clone()], Instant::now());
    h.synced("");
    settle().await;
    assert_eq!(sink.calls().len(), 1);
    // The late watch event of our own write: the cache says Ok -> no write.
    h.drifted(vec![k.clone()]);
    settle().await;
    assert_eq!(sink.calls().len(), 1, "an own-write event caused a write");
    assert_eq!(*sink.drift_asked.lock().unwrap(), 1);
    // The cache has not caught up: asked again later, no write meanwhile.
    sink.drift
        .lock()
        .unwrap()
        .insert(k.clone(), DriftCheck::Stale);
    h.drifted(vec![k.clone()]);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        *sink.drift_asked.lock().unwrap() >= 3,
        "a stale check is repeated"
    );
    assert_eq!(sink.calls().len(), 1);
    // A real edit: the same version is written again, once.
    sink.drift
        .lock()
        .unwrap()
        .insert(k.clone(), DriftCheck::Drift(DriftKind::Edited));
    settle().await;
    sink.drift.lock().unwrap().insert(k.clone(), DriftCheck::Ok);
    settle().await;
    assert_eq!(
        sink.calls(),
        vec![
            Call::Apply("ns/web".into(), v1.version.clone()),
            Call::Apply("ns/web".into(), v1.version.clone())
        ]
    );
    let text = crate::serve::metrics::encode(&m.registry());
    assert!(
        text.contains(r#"kube_discovery_drift_corrections_total{cluster="",kind="edited"} 1"#),
        "{text}"
    );
    // An orphan (no desired state, cluster listed) is deleted.
    let orphan = ServiceKey::new("", "ns", "ghost");
    sink.drift
        .lock()
        .unwrap()
        .insert(orphan.clone(), DriftCheck::Drift(DriftKind::Orphan));
    h.drifted(vec![orphan.clone()]);
    tokio::time::sleep(Duration::from_millis(600)).await;
    sink.drift.lock().unwrap().remove(&orphan);
    settle().await;
    assert_eq!(sink.calls().last(), Some(&Call::Delete("ns/ghost".into())));
    assert_eq!(sink.calls().len(), 3);
    // The planner's repair flag reached the sink with each repair write.
    let repair = Prior {
        shards: 1,
        repair: true,
    };
    assert_eq!(sink.priors(), vec![Prior::default(), repair, repair]);
}

#[tokio::test(start_paused = true)]
async fn drift_check_waits_for_pending_writes_and_unlisted_clusters() {
    let sink = FakeSink::default();
    let shared = Arc::new(ControllerState::new([""]));
    let (h, _t) = start(&sink, &shared);
    // Orphan reports before the cluster is listed are ignored.
    let ghost = ServiceKey::new("", "ns", "ghost");
    sink.drift
        .lock()
        .unwrap()
        .insert(ghost.clone(), DriftCheck::Drift(DriftKind::Orphan));
    h.drifted(vec![ghost.clone()]);
    settle().await;
    assert!(sink.calls().is_empty(), "{:?}", sink.calls());
    // A key with a write pending is not checked before the write is done.
    let k = ServiceKey::new("", "ns", "web");
    shared.set_desired(&k, Some(nodes(&k, &["10.0.0.1"])));
    h.changed(vec![k.clone()], Instant::now());
    h.drifted(vec![k.clone()]);
    settle().await;
    let asked = *sink.drift_asked.lock().unwrap();
    assert_eq!(sink.calls().len(), 1);
    assert_eq!(asked, 1, "checked once, after the write settled");
}

#[tokio::test(start_paused = true)]
async fn a_drift_check_parked_behind_retried_writes_runs_once_after_success() {
    let sink = FakeSink {
        fail_next: Arc::new(Mutex::new(3)),
        ..FakeSink::default()
    };
    let shared = Arc::new(ControllerState::new([""]));
    shared.update_cluster("", |c| c.listed = true);
    let (h, _t) = start(&sink, &shared);
    // Many keys reported by a first-start sweep while their writes are
    // pending; one of them fails three times first.
    let keys: Vec<ServiceKey> = (0..20)
        .map(|i| ServiceKey::new("", "ns", format!("s{i}")))
        .collect();
    for k in &keys {
        shared.set_desired(k, Some(nodes(k, &["10.0.0.1"])));
    }
    h.changed(keys.clone(), Instant::now());
    h.drifted(keys.clone());
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        *sink.drift_asked.lock().unwrap(),
        0,
        "checked while writes were pending"
    );
    settle().await;
    settle().await;
    assert_eq!(sink.calls().len(), 20);
    assert_eq!(
        *sink.drift_asked.lock().unwrap(),
        20,
        "each parked check runs exactly once, after its write"
    );
    // A key whose pending write turns out to be a no-op is checked too.
    h.changed(vec![keys[0].clone()], Instant::now());
    h.drifted(vec![keys[0].clone()]);
    settle().await;
    assert_eq!(sink.calls().len(), 20, "no-op written");
    assert_eq!(*sink.drift_asked.lock().unwrap(), 21);
}

/// Issue 16 item 3: leadership lost while the writer re-reads what the API
/// server holds after a gain: ZERO writes after the loss, and the keys are
/// written once it leads again (in a new epoch, after reading again).
#[tokio::test(start_paused = true)]
async fn a_write_started_after_the_lease_was_lost_sends_nothing() {
    let keys: Vec<ServiceKey> = (0..4)
        .map(|i| ServiceKey::new("", "ns", format!("s{i}")))
        .collect();
    let shared = Arc::new(ControllerState::new([""]));
    for k in &keys {
        shared.set_desired(k, Some(nodes(k, &["10.0.0.1"])));
    }
    let (tx, rx) = watch::channel(Leadership::default());
    let elector = Arc::new(tx);
    let sink = FakeSink {
        fence: Some(Fence::new(rx.clone())),
        ..FakeSink::default()
    };
    let m = Metrics::default();
    let (h, _t) = start_with(
        &sink,
        &shared,
        opts(),
        Spawn {
            metrics: m.clone(),
            leader: Some(rx),
            ..Spawn::default()
        },
    );
    // A standby: the changes wait, due.
    h.changed(keys.clone(), Instant::now());
    shared.update_cluster("", |c| c.listed = true);
    h.synced("");
    settle().await;
    assert!(sink.calls().is_empty(), "a standby wrote");
    // Gains the lease, and loses it while reading what the server holds.
    *sink.lose_on_list.lock().unwrap() = Some(elector.clone());
    publish(&elector, true);
    settle().await;
    assert!(!elector.borrow().leading);
    assert_eq!(sink.calls(), vec![], "a replica that lost the lease wrote");
    // The planner sees the loss before the start-up list's answer, so no
    // write even starts (the sink's fence would drop any that did: tested
    // in `sink` and end to end in `fault_ha`).
    let text = crate::serve::metrics::encode(&m.registry());
    assert!(
        !text.contains(r#"result="applied""#),
        "a write after the loss: {text}"
    );
    assert!(shared.standby());
    // Leading again (a new epoch): every key is written once.
    publish(&elector, true);
    settle().await;
    let mut calls = sink.calls();
    calls.sort_by_key(|c| format!("{c:?}"));
    let want: Vec<Call> = keys
        .iter()
        .map(|k| Call::Apply(k.to_string(), nodes(k, &["10.0.0.1"]).version))
        .collect();
    assert_eq!(calls, want);
}

/// Issue 16 item 4: a write task that panics is a failed write of its key:
/// retried with backoff (and counted), not a key in flight forever.
#[tokio::test(start_paused = true)]
async fn a_panicking_write_is_retried() {
    let sink = FakeSink {
        panic_next: Arc::new(Mutex::new(1)),
        ..FakeSink::default()
    };
    let shared = Arc::new(ControllerState::new([""]));
    let m = Metrics::default();
    let (h, _t) = start_with(
        &sink,
        &shared,
        opts(),
        Spawn {
            metrics: m.clone(),
            ..Spawn::default()
        },
    );
    let k = ServiceKey::new("", "ns", "web");
    shared.set_desired(&k, Some(nodes(&k, &["10.0.0.1"])));
    h.changed(vec![k.clone()], Instant::now());
    h.synced("");
    settle().await;
    assert_eq!(
        sink.calls(),
        vec![Call::Apply(
            "ns/web".into(),
            nodes(&k, &["10.0.0.1"]).version
        )]
    );
    assert!(shared.ready());
    let text = crate::serve::metrics::encode(&m.registry());
    assert!(
        text.contains(r#"kube_discovery_writes_total{cluster="",result="error_panic"} 1"#),
        "{text}"
    );
}

/// The shard count a write reports is handed to the next write of the key
/// (a delete removes every shard): the sink remembers nothing itself.
#[tokio::test(start_paused = true)]
async fn the_shard_count_of_a_write_is_handed_to_the_next_write_of_the_key() {
    let sink = FakeSink::default();
    *sink.apply_shards.lock().unwrap() = Some(3);
    let shared = Arc::new(ControllerState::new([""]));
    let (h, _t) = start(&sink, &shared);
    let k = ServiceKey::new("", "ns", "big");
    shared.set_desired(&k, Some(nodes(&k, &["10.0.0.1"])));
    h.changed(vec![k.clone()], Instant::now());
    settle().await;
    shared.set_desired(&k, None);
    h.changed(vec![k.clone()], Instant::now());
    settle().await;
    assert_eq!(
        sink.calls(),
        vec![
            Call::Apply("ns/big".into(), nodes(&k, &["10.0.0.1"]).version),
            Call::Delete("ns/big".into())
        ]
    );
    let three = Prior {
        shards: 3,
        repair: false,
    };
    assert_eq!(sink.priors(), vec![Prior::default(), three]);
}

/// A 429 reaches the limiter through the client's signal: the rate halves,
/// no write starts during the `Retry-After` (2 s), the throttled key is
/// written afterwards and never reported failing; the metrics show the 429
/// and the rate.
#[tokio::test(start_paused = true)]
async fn a_throttled_write_pauses_writes_for_the_retry_after_and_is_written_later() {
    let sink = FakeSink {
        throttle_next: Arc::new(Mutex::new(1)),
        ..FakeSink::default()
    };
    let shared = Arc::new(ControllerState::new([""]));
    let m = Metrics::default();
    let o = WriterOptions {
        qps: 100.0,
        start_qps: 100.0,
        concurrency: 1,
        ..opts()
    };
    let (h, _t) = start_with(
        &sink,
        &shared,
        o,
        Spawn {
            metrics: m.clone(),
            throttle: sink.throttle.clone(),
            ..Spawn::default()
        },
    );
    let keys: Vec<ServiceKey> = (0..3)
        .map(|i| ServiceKey::new("", "ns", format!("s{i}")))
        .collect();
    for k in &keys {
        shared.set_desired(k, Some(nodes(k, &["10.0.0.1"])));
    }
    let start = Instant::now();
    h.changed(keys.clone(), start);
    // The window (100 ms) and the 429 of the first write, then the pause.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(sink.calls(), vec![], "nothing during the Retry-After");
    assert_eq!(m.write_rate_limit.get(), 50.0, "halved");
    settle().await;
    let mut written: Vec<String> = sink
        .calls()
        .into_iter()
        .map(|c| match c {
            Call::Apply(k, _) => k,
            Call::Delete(k) => k,
        })
        .collect();
    written.sort();
    assert_eq!(written, vec!["ns/s0", "ns/s1", "ns/s2"]);
    assert!(Instant::now() - start >= Duration::from_secs(2));
    assert!(sink.failing.lock().unwrap().is_empty(), "not a failure");
    assert_eq!(
        m.writes_throttled
            .get_or_create(&crate::serve::metrics::ThrottleLabel { by: "other".into() })
            .get(),
        1
    );
    let throttled_writes = m
        .writes
        .get_or_create(&crate::serve::metrics::WriteLabels {
            cluster: String::new(),
            result: "throttled".into(),
        })
        .get();
    assert_eq!(throttled_writes, 1);
}

/// The writer carries out what the planner decided, nothing else: an apply
/// whose desired state is gone by the time the write starts sends nothing
/// (no delete of its own); the planner, told so, plans the delete itself.
#[tokio::test(start_paused = true)]
async fn an_apply_whose_desired_state_is_gone_sends_nothing() {
    let sink = FakeSink::default();
    let shared = Arc::new(ControllerState::new([""]));
    let key = ServiceKey::new("", "ns", "gone");
    let mut w = Writer::new(sink.clone(), shared, Metrics::default(), opts());
    let answer = w.execute(Action::Apply {
        key: key.clone(),
        epoch: 0,
        since: At::ZERO,
        prior: Prior::default(),
    });
    assert_eq!(answer, None);
    let done = w.tasks.join_next().await.unwrap().unwrap();
    assert_eq!(sink.calls(), vec![], "the writer decided a delete");
    let Done::Write { result, .. } = done else {
        panic!("not a write");
    };
    assert_eq!(result.unwrap(), Outcome::Superseded);
}

/// A write is fenced by the epoch of its action (the one the planner
/// decided it in), not by the epoch current when it starts.
#[tokio::test(start_paused = true)]
async fn a_write_is_fenced_by_the_epoch_the_planner_decided_it_in() {
    let (_tx, rx) = watch::channel(Leadership {
        epoch: 2,
        leading: true,
        until: None,
    });
    let sink = FakeSink {
        fence: Some(Fence::new(rx)),
        ..FakeSink::default()
    };
    let shared = Arc::new(ControllerState::new([""]));
    let key = ServiceKey::new("", "ns", "s");
    shared.set_desired(&key, Some(nodes(&key, &["10.0.0.1"])));
    let mut w = Writer::new(sink.clone(), shared, Metrics::default(), opts());
    for epoch in [1, 2] {
        w.execute(Action::Apply {
            key: key.clone(),
            epoch,
            since: At::ZERO,
            prior: Prior::default(),
        });
        let Some(Ok(Done::Write { result, .. })) = w.tasks.join_next().await else {
            panic!("not a write");
        };
        match epoch {
            1 => assert!(result.unwrap_err().is_fenced()),
            _ => assert!(matches!(
                result.unwrap(),
                Outcome::Applied { shards: 1, .. }
            )),
        }
    }
    assert_eq!(
        sink.calls(),
        vec![Call::Apply(
            key.to_string(),
            nodes(&key, &["10.0.0.1"]).version
        )]
    );
}
