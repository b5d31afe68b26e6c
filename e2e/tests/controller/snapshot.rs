//! The ConfigMap snapshot sink end to end on both API servers
//! (`kube-discovery run` with `kube_discovery.sinks.configmap.enabled: true`):
//!
//! * `snapshot_follows_the_state_in_shards_without_needless_writes`: the
//!   assembled snapshot equals what was created and `GET /dump`'s endpoints;
//!   it grows to several shards (small test budget) and shrinks (stale shards
//!   deleted); an irrelevant source change writes nothing; a burst of changes
//!   is one round (one index write, no shard written twice); a restart with
//!   an unchanged state writes nothing; a reader assembling during all of this
//!   only ever gets a consistent state or a "read again" error.
//! * `snapshot_drift_is_restored_and_echoes_write_nothing`: an edited shard,
//!   a deleted index and a foreign ConfigMap carrying the snapshot label are
//!   repaired within a couple of seconds, with exactly one write each, and the
//!   events of those writes cause none.
//! * `snapshot_of_a_big_state_respects_the_real_1_mib_bound`: the default
//!   budget with services too big for one shard (split by node host hash
//!   into parts of at most 128 KiB); it starts over a snapshot in the
//!   layout of earlier releases (parts filling whole shards, same format),
//!   which the reader reads and the controller replaces, a racing reader
//!   never assembling a mix.
//! * `snapshot_one_change_is_two_writes_and_a_racing_reader_never_mixes`
//!   (issue 19 item 2): one endpoint changed in a service split over many
//!   shards, or one small service changed, is 2 ConfigMap writes (the shard,
//!   then the index), wherever the endpoint sorts; a reader looping over the
//!   snapshot meanwhile only assembles states the test created; a snapshot
//!   left in the old layout (format 1) is refused by readers (an error saying
//!   to re-sync) and the controller converges from it.
//!
//! Writes are counted in the write log: kube-sim's (`/_sim/writes`) lists the
//! writes that changed an object, the real server's (its audit log) every
//! successful write request, no-op ones included. That every request changed
//! something is checked on both by the revisions the writes answered with: a
//! write that changes nothing answers with the revision the object had.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::controller_support;

use std::collections::{BTreeMap, BTreeSet};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use controller_support::{Backend, Controller, Env, LIMIT, Options, eventually};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube_discovery_core::snapshot::{self, AssembleError, Dump, INDEX_KEY};
use serde_json::{Value, json};
use testenv::both_backends;

const NS: &str = "shop";
const SNAP_NS: &str = "kd";
const SNAP: &str = "snap";
const LABEL: &str = "kubediscovery.io/snapshot";

/// User the controller runs as (a cluster admin, but not the test's admin,
/// so the write log tells their writes apart).
const CONTROLLER_USER: &str = "kd-controller";

/// The default users plus [`CONTROLLER_USER`] in `system:masters`.
fn options() -> Options {
    let mut opts = Options::default();
    opts.users
        .push((CONTROLLER_USER.into(), vec!["system:masters".into()]));
    opts
}

/// [`options`], and the real server's write log with the revisions of
/// ConfigMap writes (kube-sim's always has them).
fn options_with_revisions() -> Options {
    let mut opts = options();
    opts.audit_write_bodies
        .push((String::new(), "configmaps".into()));
    opts
}

fn config(env: &Env, window_ms: u64) -> String {
    let token = env
        .api
        .user_token(CONTROLLER_USER)
        .expect("controller token");
    format!(
        "discovery:\n  kubernetes:\n{}    namespace_selector: {{equal: {NS}}}\nkube_discovery:\n  coalesce_window: {window_ms}ms\n  sinks:\n    configmap: {{enabled: true, namespace: {SNAP_NS}, name: {SNAP}}}\n",
        env.service_block(&token)
    )
}

/// `Controller::start` with extra environment variables.
async fn start(env: &Env, name: &str, cfg: &str, vars: &[(&str, &str)]) -> Controller {
    Controller::start_with_env(env, name, cfg, &[], vars).await
}

fn cms(env: &Env) -> Api<ConfigMap> {
    Api::namespaced(env.admin.clone(), SNAP_NS)
}

/// Reads the snapshot like a gateway would: the index, then every shard it
/// lists, then `assemble`. `Ok(None)`: no index yet.
async fn read(api: &Api<ConfigMap>) -> Result<Option<Dump>, AssembleError> {
    let Some(index) = api.get_opt(SNAP).await.expect("get index") else {
        return Ok(None);
    };
    let text = index
        .data
        .and_then(|mut d| d.remove(INDEX_KEY))
        .expect("index.json");
    let idx = snapshot::parse_index(&text)?;
    let mut texts = BTreeMap::new();
    for r in &idx.shards {
        if let Some(t) = api
            .get_opt(&r.name)
            .await
            .expect("get shard")
            .and_then(|c| c.data)
            .and_then(|mut d| d.remove(&r.key))
        {
            texts.insert(r.name.clone(), t);
        }
    }
    snapshot::assemble(&text, |r| texts.get(&r.name).cloned()).map(Some)
}

/// `(ns, name)` -> port -> hosts, what the test created.
type Expected = BTreeMap<String, BTreeMap<String, Vec<String>>>;

fn hosts_of(d: &Dump) -> Expected {
    d.clusters
        .get("")
        .into_iter()
        .flatten()
        .map(|((ns, name), ports)| {
            let p = ports
                .iter()
                .map(|(k, nodes)| {
                    (
                        k.clone(),
                        nodes.iter().map(|n| n.host.to_string()).collect(),
                    )
                })
                .collect();
            (format!("{ns}/{name}"), p)
        })
        .collect()
}

/// Waits until the assembled snapshot holds exactly `want`; returns it.
async fn wait_snapshot(env: &Env, want: &Expected) -> Dump {
    let api = cms(env);
    let start = tokio::time::Instant::now();
    loop {
        let last = match read(&api).await {
            Ok(Some(d)) if &hosts_of(&d) == want => return d,
            Ok(Some(d)) => format!("{} services", d.services()),
            Ok(None) => "no index".to_string(),
            Err(e) if e.is_retryable() => e.to_string(),
            Err(e) => panic!("snapshot is inconsistent: {e}"),
        };
        assert!(
            start.elapsed() < LIMIT,
            "snapshot never became {} services (last: {last})",
            want.len()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn writes_since(env: &Env, since: u64) -> Vec<Value> {
    env.api.writes_since(since).await.expect("write log")
}

/// The start of a checked period: the revision of the ConfigMaps of
/// [`SNAP_NS`], then a write-log mark (a write received after the mark
/// commits after that revision).
#[derive(Debug, Clone, Copy)]
struct Since {
    rv: u64,
    mark: u64,
}

async fn since(env: &Env) -> Since {
    let rv = cms(env)
        .list(&ListParams::default().limit(1))
        .await
        .expect("list ConfigMaps")
        .metadata
        .resource_version
        .and_then(|v| v.parse().ok())
        .expect("list resourceVersion");
    Since {
        rv,
        mark: env.mark().await,
    }
}

/// The controller's ConfigMap writes after `mark`: `verb name` and the
/// revision the write answered with (the real server's write log has it for
/// the resources of `Options::audit_write_bodies`; 0 if unknown).
async fn cm_writes_rv(env: &Env, mark: u64) -> Vec<(String, u64)> {
    writes_since(env, mark)
        .await
        .into_iter()
        .filter(|w| w["resource"] == "configmaps" && w["namespace"] == SNAP_NS)
        .filter(|w| w["user"] == CONTROLLER_USER)
        .map(|w| {
            let what = format!(
                "{} {}",
                w["verb"].as_str().unwrap_or(""),
                w["name"].as_str().unwrap_or("")
            );
            let rv = w["resourceVersion"]
                .as_str()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            (what, rv)
        })
        .collect()
}

/// The controller's ConfigMap writes after `mark` as `verb name`.
async fn cm_writes(env: &Env, mark: u64) -> Vec<String> {
    cm_writes_rv(env, mark)
        .await
        .into_iter()
        .map(|(w, _)| w)
        .collect()
}

fn count(writes: &[String], what: &str) -> usize {
    writes.iter().filter(|w| *w == what).count()
}

/// Applies of ConfigMap `name` (the write log names an apply that creates `create`).
fn applies(writes: &[String], name: &str) -> usize {
    count(writes, &format!("patch {name}")) + count(writes, &format!("create {name}"))
}

/// The controller's `kube_discovery_snapshot_writes_total{result}`: every
/// apply/delete REQUEST it made, also those that changed nothing (kube-sim's
/// write log, like a watch, only shows requests that changed an object).
async fn requests(ctl: &Controller, result: &str) -> usize {
    let (_, text) = ctl.get("/metrics").await;
    let needle = format!("kube_discovery_snapshot_writes_total{{result=\"{result}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&needle))
        .map_or(0, |v| v.trim().parse::<f64>().expect("counter") as usize)
}

/// Requests made since `(applied, deleted)`, checked against the
/// controller's writes in the write log since `since` (kube-sim: changes;
/// real: requests, so the metric counts every request): every request
/// changed something, so every apply answered with a new revision (a no-op
/// one answers with the revision the object already had: older than the
/// period, or that of an earlier write in it).
async fn assert_no_noop_requests(
    ctl: &Controller,
    reqs: (usize, usize),
    env: &Env,
    since: Since,
) -> (usize, usize) {
    let now = (
        requests(ctl, "applied").await,
        requests(ctl, "deleted").await,
    );
    let w = cm_writes_rv(env, since.mark).await;
    let is_apply = |x: &str| x.starts_with("patch ") || x.starts_with("create ");
    let logged_applies = w.iter().filter(|(x, _)| is_apply(x)).count();
    let logged_deletes = w.iter().filter(|(x, _)| x.starts_with("delete ")).count();
    assert_eq!(
        (now.0 - reqs.0, now.1 - reqs.1),
        (logged_applies, logged_deletes),
        "(apply, delete) requests vs the write log {w:?}"
    );
    let mut revisions = BTreeSet::new();
    for (x, rv) in w.iter().filter(|(x, _)| is_apply(x)) {
        assert!(
            *rv > since.rv && revisions.insert(*rv),
            "{x} answered with revision {rv}, not a new one (the period began at {}): a request that changed nothing; {w:?}",
            since.rv
        );
    }
    now
}

/// The shard holding service `name` of [`NS`] in the current snapshot.
async fn holder(env: &Env, name: &str) -> String {
    let api = cms(env);
    let idx =
        snapshot::parse_index(&api.get(SNAP).await.unwrap().data.unwrap()[INDEX_KEY]).unwrap();
    let needle = format!("\"{NS}/{name}\"");
    for r in &idx.shards {
        let cm = api.get(&r.name).await.unwrap();
        if cm.data.unwrap()[&r.key].contains(&needle) {
            return r.name.clone();
        }
    }
    panic!("no shard holds {needle}");
}

/// Names of the snapshot ConfigMaps (label-selected).
async fn labelled(env: &Env) -> BTreeSet<String> {
    cms(env)
        .list(&ListParams::default().labels(&format!("{LABEL}={SNAP}")))
        .await
        .expect("list")
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .collect()
}

fn ips(base: u32, n: u32) -> Vec<String> {
    (0..n)
        .map(|i| {
            let x = base + i;
            format!("10.{}.{}.{}", (x >> 16) & 0xff, (x >> 8) & 0xff, x & 0xff)
        })
        .collect()
}

async fn put(env: &Env, want: &mut Expected, name: &str, hosts: Vec<String>) {
    let refs: Vec<&str> = hosts.iter().map(String::as_str).collect();
    env.endpoints(NS, name, &refs, &[("http", 80)], json!({}))
        .await;
    let mut sorted = hosts;
    sorted.sort();
    want.insert(
        format!("{NS}/{name}"),
        BTreeMap::from([("http".to_string(), sorted)]),
    );
}

/// Services `small-00` .. of `nodes` hosts each (service `i` from
/// `10.64.0.16*i` on).
async fn put_small(env: &Env, want: &mut Expected, count: u32, nodes: u32) {
    for i in 0..count {
        let hosts = ips(0x40_0000 + 16 * i, nodes);
        put(env, want, &format!("small-{i:02}"), hosts).await;
    }
}

/// The endpoints part of the controller's `/dump`.
async fn http_dump(ctl: &Controller) -> Value {
    let (code, body) = ctl.get("/v1/discovery/kubernetes/dump").await;
    assert_eq!(code, 200, "{body}");
    serde_json::from_str::<Value>(&body).expect("dump JSON")["endpoints"].clone()
}

async fn setup(env: &Env) {
    env.namespace(NS).await;
    env.namespace(SNAP_NS).await;
}

/// A reader assembling in a loop: counts consistent reads and "read again"
/// errors; any other error is a failure.
struct Reader {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    retry: Arc<AtomicU64>,
    /// [`digest`] of every state it assembled.
    states: Arc<Mutex<BTreeSet<u64>>>,
    task: tokio::task::JoinHandle<Vec<String>>,
}

/// A digest of a state as the test describes it (`hosts_of` of a read, or
/// what the test created).
fn digest(e: &Expected) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    e.hash(&mut h);
    h.finish()
}

impl Reader {
    fn start(env: &Env) -> Reader {
        let api = cms(env);
        let stop = Arc::new(AtomicBool::new(false));
        let ok = Arc::new(AtomicU64::new(0));
        let retry = Arc::new(AtomicU64::new(0));
        let states = Arc::new(Mutex::new(BTreeSet::new()));
        let (s, o, r, st) = (stop.clone(), ok.clone(), retry.clone(), states.clone());
        let task = tokio::spawn(async move {
            let mut bad = Vec::new();
            while !s.load(Ordering::Relaxed) {
                match read(&api).await {
                    Ok(Some(d)) => {
                        o.fetch_add(1, Ordering::Relaxed);
                        st.lock().unwrap().insert(digest(&hosts_of(&d)));
                    }
                    Ok(None) => {}
                    Err(e) if e.is_retryable() => {
                        r.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => bad.push(e.to_string()),
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            bad
        });
        Reader {
            stop,
            ok,
            retry,
            states,
            task,
        }
    }

    /// Stops the reader (see [`Reader::finish`]) and checks that every state
    /// it assembled is one of `legit` (states the test created, each
    /// published whole): never a mix of two.
    async fn finish_only(self, legit: &[Expected]) -> (u64, u64) {
        let states = self.states.clone();
        let counts = self.finish().await;
        let legit: BTreeSet<u64> = legit.iter().map(digest).collect();
        let seen = states.lock().unwrap().clone();
        let mixed: Vec<&u64> = seen.difference(&legit).collect();
        eprintln!(
            "reader: {} consistent reads, {} read-again, {} distinct states (of {} created)",
            counts.0,
            counts.1,
            seen.len(),
            legit.len()
        );
        assert!(
            mixed.is_empty(),
            "the reader assembled {} state(s) the test never created (of {} distinct seen)",
            mixed.len(),
            seen.len()
        );
        counts
    }

    async fn finish(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let bad = self.task.await.expect("reader");
        assert!(
            bad.is_empty(),
            "the reader saw inconsistent snapshots: {bad:?}"
        );
        (
            self.ok.load(Ordering::Relaxed),
            self.retry.load(Ordering::Relaxed),
        )
    }
}

#[both_backends]
#[tokio::test]
async fn snapshot_follows_the_state_in_shards_without_needless_writes(backend: Backend) {
    let env = Env::start_with(backend, options_with_revisions()).await;
    setup(&env).await;
    let mut want = Expected::new();
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        put(&env, &mut want, name, ips(1000 * (i as u32 + 1), 2)).await;
    }
    // 2 KiB shards so a few dozen services make several shards; 1.5 s window
    // so a burst of concurrent changes falls into one window.
    let budget = 2048usize;
    let cfg = config(&env, 1500);
    let vars = [("KUBE_DISCOVERY_SNAPSHOT_MAX_SHARD_BYTES", "2048")];
    let ctl = start(&env, "snap1", &cfg, &vars).await;
    let reader = Reader::start(&env);
    let d = wait_snapshot(&env, &want).await;
    assert_eq!(
        d.to_apisix_endpoints(),
        http_dump(&ctl).await,
        "snapshot != /dump"
    );
    assert_eq!(
        labelled(&env).await,
        BTreeSet::from([SNAP.into(), "snap-0".into()])
    );

    // Grow to several shards, in a burst of concurrent changes.
    ctl.wait_ready().await;
    let from = since(&env).await;
    let mut reqs = (
        requests(&ctl, "applied").await,
        requests(&ctl, "deleted").await,
    );
    let names: Vec<String> = (0..40).map(|i| format!("svc-{i:02}")).collect();
    let mut burst = Vec::new();
    for (i, n) in names.iter().enumerate() {
        let hosts = ips(100_000 + 16 * i as u32, 3);
        let mut sorted = hosts.clone();
        sorted.sort();
        want.insert(
            format!("{NS}/{n}"),
            BTreeMap::from([("http".to_string(), sorted)]),
        );
        let env = &env;
        burst.push(async move {
            let refs: Vec<&str> = hosts.iter().map(String::as_str).collect();
            env.endpoints(NS, n, &refs, &[("http", 80)], json!({}))
                .await;
        });
    }
    let t = std::time::Instant::now();
    futures::future::join_all(burst).await;
    let burst_took = t.elapsed();
    let d = wait_snapshot(&env, &want).await;
    assert_eq!(
        d.to_apisix_endpoints(),
        http_dump(&ctl).await,
        "snapshot != /dump"
    );
    let idx_cm = cms(&env).get(SNAP).await.unwrap();
    let idx = snapshot::parse_index(&idx_cm.data.unwrap()[INDEX_KEY]).unwrap();
    assert!(idx.shards.len() >= 3, "{} shards", idx.shards.len());
    for r in &idx.shards {
        let cm = cms(&env).get(&r.name).await.unwrap();
        let text = &cm.data.as_ref().unwrap()[&r.key];
        assert!(
            snapshot::escaped_len(text) <= budget,
            "{} is {} bytes",
            r.name,
            text.len()
        );
        assert_eq!(cm.metadata.labels.unwrap()[LABEL], SNAP);
    }
    let w = cm_writes(&env, from.mark).await;
    assert!(
        burst_took < Duration::from_millis(1500),
        "the burst took {burst_took:?}, longer than the window: the test proves nothing"
    );
    assert_eq!(applies(&w, SNAP), 1, "one round for the burst: {w:?}");
    for r in &idx.shards {
        assert!(applies(&w, &r.name) <= 1, "{w:?}");
    }
    let mut expect_names: BTreeSet<String> = idx.shards.iter().map(|r| r.name.clone()).collect();
    expect_names.insert(SNAP.into());
    assert_eq!(labelled(&env).await, expect_names);
    reqs = assert_no_noop_requests(&ctl, reqs, &env, from).await;

    // An irrelevant change (a label on a source) writes nothing; a relevant
    // change after it is the marker that both were processed.
    let from = since(&env).await;
    env.endpoints(
        NS,
        "a",
        &["10.0.3.232", "10.0.3.233"],
        &[("http", 80)],
        json!({"team": "x"}),
    )
    .await;
    let hosts = want[&format!("{NS}/a")]["http"].clone();
    assert_eq!(
        hosts,
        vec!["10.0.3.232", "10.0.3.233"],
        "ips() of service a"
    );
    // The marker replaces service b's hosts by others of the same length:
    // its bucket keeps its size, so the bucket count cannot double (which
    // would rightly rewrite every bucket; a new service could do that).
    assert_eq!(want[&format!("{NS}/b")]["http"], ips(2000, 2), "ips() of b");
    put(&env, &mut want, "b", ips(2002, 2)).await;
    wait_snapshot(&env, &want).await;
    let w = cm_writes(&env, from.mark).await;
    assert_eq!(applies(&w, SNAP), 1, "{w:?}");
    let marker = holder(&env, "b").await;
    assert_eq!(
        w,
        [format!("patch {marker}"), format!("patch {SNAP}")],
        "the marker round writes b's shard and the index only"
    );
    reqs = assert_no_noop_requests(&ctl, reqs, &env, from).await;

    // Shrink: delete most services; the stale shards are deleted after the index.
    let from = since(&env).await;
    for n in &names {
        env.delete_endpoints(NS, n).await;
        want.remove(&format!("{NS}/{n}"));
    }
    let d = wait_snapshot(&env, &want).await;
    assert_eq!(d.to_apisix_endpoints(), http_dump(&ctl).await);
    let left = eventually("stale shards deleted", LIMIT, || async {
        let l = labelled(&env).await;
        (l.len() <= 2).then_some(l)
    })
    .await;
    assert_eq!(left, BTreeSet::from([SNAP.into(), "snap-0".into()]));
    let w = cm_writes(&env, from.mark).await;
    assert!(
        w.iter().any(|x| x.starts_with("delete snap-")),
        "stale shards deleted by the controller: {w:?}"
    );
    assert_no_noop_requests(&ctl, reqs, &env, from).await;
    let (ok, retry) = reader.finish().await;
    assert!(ok > 0, "the reader never read a snapshot ({retry} retries)");
    ctl.stop().await;

    // A restart with an unchanged state writes nothing: the only round after
    // it is the marker's. Its first lists fail for a while (longer than the
    // window): it must not publish the empty state it has meanwhile.
    let from = since(&env).await;
    env.api
        .fault(&json!({"fail": {"verb": "list", "resource": "endpoints", "count": 4, "code": 500}}))
        .await
        .expect("fault hook");
    let ctl = start(&env, "snap2", &cfg, &vars).await;
    ctl.wait_ready().await;
    assert!(
        ctl.logs().contains("watch failed"),
        "the injected list failures did not happen:\n{}",
        ctl.logs()
    );
    put(&env, &mut want, "zz-marker2", vec!["10.9.9.10".into()]).await;
    wait_snapshot(&env, &want).await;
    let w = cm_writes(&env, from.mark).await;
    assert_eq!(applies(&w, SNAP), 1, "a restart rewrote: {w:?}");
    assert_no_noop_requests(&ctl, (0, 0), &env, from).await;
    let (_, metrics) = ctl.get("/metrics").await;
    assert!(
        metrics.contains("kube_discovery_snapshot_writes_total{result=\"applied\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("kube_discovery_snapshot_shards 1"),
        "{metrics}"
    );
    ctl.stop().await;
}

#[both_backends]
#[tokio::test]
async fn snapshot_drift_is_restored_and_echoes_write_nothing(backend: Backend) {
    let env = Env::start_with(backend, options_with_revisions()).await;
    setup(&env).await;
    let mut want = Expected::new();
    for i in 0..16u32 {
        put(&env, &mut want, &format!("s{i:02}"), ips(5000 + 8 * i, 4)).await;
    }
    let cfg = config(&env, 100);
    let ctl = start(
        &env,
        "drift",
        &cfg,
        &[("KUBE_DISCOVERY_SNAPSHOT_MAX_SHARD_BYTES", "2048")],
    )
    .await;
    wait_snapshot(&env, &want).await;
    let api = cms(&env);
    let shard0 = api.get("snap-0").await.unwrap();
    let good = shard0.data.clone().unwrap()["snap-0.json"].clone();
    let before = labelled(&env).await;
    assert!(before.len() >= 3, "{before:?}");

    // 1. Someone edits a shard: restored, with one write.
    let from = since(&env).await;
    let reqs = (
        requests(&ctl, "applied").await,
        requests(&ctl, "deleted").await,
    );
    let t = tokio::time::Instant::now();
    api.patch(
        "snap-0",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"snap-0.json": "{\"hacked\":true}"}})),
    )
    .await
    .unwrap();
    eventually("edited shard restored", Duration::from_secs(5), || async {
        let d = api.get("snap-0").await.ok()?.data?;
        (d["snap-0.json"] == good).then_some(())
    })
    .await;
    let took = t.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "edit restored after {took:?}"
    );

    // 2. Someone deletes the index: restored.
    let t = tokio::time::Instant::now();
    api.delete(SNAP, &DeleteParams::default()).await.unwrap();
    eventually("deleted index restored", Duration::from_secs(5), || async {
        api.get_opt(SNAP).await.ok()?.map(|_| ())
    })
    .await;
    let took = t.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "delete restored after {took:?}"
    );

    // 3. A ConfigMap carrying the snapshot label that the index does not list: deleted.
    let foreign: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "snap-99", "namespace": SNAP_NS, "labels": {LABEL: SNAP}},
        "data": {"x": "y"}
    }))
    .unwrap();
    api.create(&PostParams::default(), &foreign).await.unwrap();
    eventually(
        "foreign labelled ConfigMap deleted",
        Duration::from_secs(5),
        || async { api.get_opt("snap-99").await.ok()?.is_none().then_some(()) },
    )
    .await;

    // A marker round proves the echoes of those writes were processed.
    put(&env, &mut want, "zz-marker", vec!["10.9.9.9".into()]).await;
    wait_snapshot(&env, &want).await;
    let w = cm_writes(&env, from.mark).await;
    // The edit's repair, and the marker round's write of the shard holding
    // the marker (its hash bucket), which may be snap-0 too.
    let marker = holder(&env, "zz-marker").await;
    assert_eq!(
        applies(&w, "snap-0"),
        1 + usize::from(marker == "snap-0"),
        "{w:?}"
    );
    assert_eq!(
        applies(&w, &marker),
        1 + usize::from(marker == "snap-0"),
        "{w:?}"
    );
    assert_eq!(count(&w, "delete snap-99"), 1, "{w:?}");
    // Index: restored once, rewritten once by the marker round.
    assert_eq!(applies(&w, SNAP), 2, "{w:?}");
    assert_eq!(labelled(&env).await, before, "the same objects as before");
    assert_no_noop_requests(&ctl, reqs, &env, from).await;
    ctl.stop().await;
}

#[both_backends]
#[tokio::test]
async fn snapshot_of_a_big_state_respects_the_real_1_mib_bound(backend: Backend) {
    let env = Env::start_with(backend, options()).await;
    setup(&env).await;
    let mut want = Expected::new();
    // Two services of 14,000 nodes (each bigger than one 900 KiB shard) and a few small ones.
    put(&env, &mut want, "big-a", ips(0x01_0000, 14_000)).await;
    put(&env, &mut want, "big-b", ips(0x20_0000, 14_000)).await;
    put_small(&env, &mut want, 5, 3).await;
    // A snapshot left by a release whose parts filled whole 900 KiB shards
    // (same format 2), of another state: read by this reader, replaced by
    // the controller, and a reader racing it never assembles a mix.
    let (old, old_shards) = write_old_part_layout(&env).await;
    assert_eq!(hosts_of(&read(&cms(&env)).await.unwrap().unwrap()), old);
    let reader = Reader::start(&env);
    let ctl = start(&env, "big", &config(&env, 100), &[]).await;
    let d = wait_snapshot(&env, &want).await;
    assert_eq!(d.nodes(), 28_015);
    assert_eq!(
        d.to_apisix_endpoints(),
        http_dump(&ctl).await,
        "snapshot != /dump"
    );
    let idx = snapshot::parse_index(&cms(&env).get(SNAP).await.unwrap().data.unwrap()[INDEX_KEY])
        .unwrap();
    assert!(idx.shards.len() >= 3, "{} shards", idx.shards.len());
    let mut parts = 0;
    for r in &idx.shards {
        let cm = cms(&env).get(&r.name).await.unwrap();
        let data = cm.data.unwrap();
        // The ConfigMap limit: keys + values of data under 1 MiB.
        let size: usize = data.iter().map(|(k, v)| k.len() + v.len()).sum();
        assert!(size < 1024 * 1024, "{} holds {size} bytes", r.name);
        parts += usize::from(data[&r.key].contains("\"part\""));
    }
    assert!(parts >= 2, "the big services were split into parts");
    // Parts of at most 128 KiB: more shards than the old layout had.
    assert!(
        idx.shards.len() > 2 * old_shards,
        "{} shards, the old layout {old_shards}",
        idx.shards.len()
    );
    let mut names: BTreeSet<String> = idx.shards.iter().map(|r| r.name.clone()).collect();
    names.insert(SNAP.into());
    assert_eq!(labelled(&env).await, names, "nothing unlisted left");
    let (ok, _) = reader.finish_only(&[old, want.clone()]).await;
    assert!(ok > 0, "the reader read {ok} snapshots");
    ctl.stop().await;
}

/// A format-2 snapshot in the layout of releases before
/// `dump::DEFAULT_MAX_PART_BYTES` (parts filling whole 900 KiB shards) of a
/// state other than the test's: service `big-a` with 13,000 of its 14,000
/// endpoints. Returns that state and its shard count.
async fn write_old_part_layout(env: &Env) -> (Expected, usize) {
    use kube_discovery_core::model::{Node, PortMap, ServiceKey, sort_nodes};
    let mut nodes: Vec<Node> = ips(0x01_0000, 13_000)
        .into_iter()
        .map(|h| Node::new(h, 80, 100))
        .collect();
    sort_nodes(&mut nodes);
    let mut d = Dump::with_clusters([""]);
    d.insert(
        &ServiceKey::new("", NS, "big-a"),
        PortMap::from([("http".to_string(), nodes)]),
    );
    let max = snapshot::DEFAULT_MAX_SHARD_BYTES;
    let l = snapshot::build_with(&d, SNAP, max, max).unwrap();
    let api = cms(env);
    let objects = l
        .shards
        .iter()
        .map(|s| (s.name.clone(), s.key.clone(), s.text.clone()))
        .chain([(SNAP.to_string(), INDEX_KEY.to_string(), l.index.clone())]);
    for (name, key, text) in objects {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": SNAP_NS, "labels": {LABEL: SNAP}},
            "data": {key: text}
        }))
        .unwrap();
        api.create(&PostParams::default(), &cm).await.unwrap();
    }
    (hosts_of(&d), l.shards.len())
}

/// A snapshot in the layout of a controller before format 2 (one service
/// cut by node ranges into 3 consecutive parts, one per shard), as
/// ConfigMaps carrying the snapshot label; returns the state it holds.
async fn write_format_1_layout(env: &Env) -> Expected {
    use kube_discovery_core::model::{Node, PortMap, ServiceKey};
    let hosts = ["10.200.0.1", "10.200.0.2", "10.200.0.3"];
    let nodes: Vec<Node> = hosts.iter().map(|h| Node::new(*h, 80, 100)).collect();
    let mut d = Dump::with_clusters([""]);
    d.insert(
        &ServiceKey::new("", NS, "old"),
        PortMap::from([("http".to_string(), nodes.clone())]),
    );
    let mut refs = Vec::new();
    let api = cms(env);
    for (i, n) in nodes.iter().enumerate() {
        let value =
            serde_json::to_string(&PortMap::from([("http".to_string(), vec![n.clone()])])).unwrap();
        let text = json!({"format": 1, "index": i, "endpoints": [{"id": "", "endpoints": [
            {"name": format!("{NS}/old"), "value": value, "part": {"index": i, "count": 3}}]}]})
        .to_string();
        let name = format!("{SNAP}-{i}");
        let key = format!("{name}.json");
        refs.push(json!({"name": name, "key": key, "sha256": snapshot::shard_sha256(&text), "bytes": text.len()}));
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": SNAP_NS, "labels": {LABEL: SNAP}},
            "data": {key: text}
        }))
        .unwrap();
        api.create(&PostParams::default(), &cm).await.unwrap();
    }
    let index = json!({"format": 1, "version": "0123456789abcdef", "clusters": [""], "services": 1,
        "nodes": 3, "shards": refs})
    .to_string();
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": SNAP, "namespace": SNAP_NS, "labels": {LABEL: SNAP}},
        "data": {INDEX_KEY: index}
    }))
    .unwrap();
    api.create(&PostParams::default(), &cm).await.unwrap();
    hosts_of(&d)
}

/// Issue 19 item 2: one endpoint changed in a big service (split over many
/// shards) or one small service changed is 2 ConfigMap writes, the shard
/// holding it and the index last, wherever the endpoint sorts; a reader
/// racing the writer only ever assembles states the test created. It
/// starts over a snapshot in the old layout (format 1), which readers refuse
/// (saying to re-sync) and the controller converges from.
#[both_backends]
#[tokio::test]
async fn snapshot_one_change_is_two_writes_and_a_racing_reader_never_mixes(backend: Backend) {
    let env = Env::start_with(backend, options_with_revisions()).await;
    setup(&env).await;
    let _old = write_format_1_layout(&env).await;
    let e = read(&cms(&env)).await.unwrap_err();
    assert!(
        e.to_string().contains("format 1")
            && e.to_string().contains("re-sync")
            && !e.is_retryable(),
        "{e}"
    );
    let mut legit = Vec::new();

    // A service of 3,000 endpoints over 16 KiB shards (many parts) and 30
    // small services.
    let mut want = Expected::new();
    let mut big = ips(0x01_0000, 3_000);
    put(&env, &mut want, "big", big.clone()).await;
    put_small(&env, &mut want, 30, 2).await;
    legit.push(want.clone());
    let vars = [("KUBE_DISCOVERY_SNAPSHOT_MAX_SHARD_BYTES", "16384")];
    let ctl = start(&env, "snapcm", &config(&env, 100), &vars).await;
    // Readers refuse the format-1 index until the controller rewrites it.
    eventually("the index rewritten in format 2", LIMIT, || async {
        match read(&cms(&env)).await {
            Err(e) if !e.is_retryable() => None,
            _ => Some(()),
        }
    })
    .await;
    let reader = Reader::start(&env);
    wait_snapshot(&env, &want).await;
    ctl.wait_ready().await;
    // Converged from the old layout: format 2, nothing unlisted left.
    let api = cms(&env);
    let idx =
        snapshot::parse_index(&api.get(SNAP).await.unwrap().data.unwrap()[INDEX_KEY]).unwrap();
    assert_eq!(idx.format, snapshot::FORMAT);
    assert!(idx.shards.len() >= 8, "{} shards", idx.shards.len());
    let mut names: BTreeSet<String> = idx.shards.iter().map(|r| r.name.clone()).collect();
    names.insert(SNAP.into());
    let left = eventually("old shards deleted", LIMIT, || async {
        let l = labelled(&env).await;
        (l == names).then_some(l)
    })
    .await;
    assert_eq!(left, names);
    assert_eq!(
        wait_snapshot(&env, &want).await.to_apisix_endpoints(),
        http_dump(&ctl).await,
        "snapshot != /dump"
    );

    let mut reqs = (
        requests(&ctl, "applied").await,
        requests(&ctl, "deleted").await,
    );
    let steps: Vec<(&str, &str)> = vec![
        ("big", "one endpoint added, sorting last"),
        ("big", "one endpoint added, sorting first"),
        ("big", "one endpoint removed from the middle"),
        ("small-07", "one endpoint added to a small service"),
        ("small-21", "one endpoint removed from a small service"),
    ];
    let mut per_change = Vec::new();
    for (service, what) in steps {
        let hosts = match what {
            "one endpoint added, sorting last" => {
                big.push("10.9.255.254".into());
                big.clone()
            }
            "one endpoint added, sorting first" => {
                big.push("10.0.0.1".into());
                big.clone()
            }
            "one endpoint removed from the middle" => {
                big.remove(1_500);
                big.clone()
            }
            "one endpoint added to a small service" => ips(0x40_0000 + 16 * 7, 3),
            _ => ips(0x40_0000 + 16 * 21, 1),
        };
        let from = since(&env).await;
        put(&env, &mut want, service, hosts).await;
        legit.push(want.clone());
        wait_snapshot(&env, &want).await;
        let w = cm_writes(&env, from.mark).await;
        per_change.push(format!("{what}: {w:?}"));
        assert_eq!(w.len(), 2, "{what}: the changed shard and the index: {w:?}");
        assert_eq!(applies(&w, SNAP), 1, "{what}: {w:?}");
        assert!(
            w[1].ends_with(&format!(" {SNAP}")),
            "{what}: the index last: {w:?}"
        );
        reqs = assert_no_noop_requests(&ctl, reqs, &env, from).await;
    }
    eprintln!(
        "{} shards; ConfigMap writes per change:\n{}",
        idx.shards.len(),
        per_change.join("\n")
    );
    let (ok, retry) = reader.finish_only(&legit).await;
    assert!(ok > 5, "the reader read {ok} snapshots ({retry} retries)");
    ctl.stop().await;
}

// ------------------------------------------------------------ least privilege

/// Creates every object of `rbac/*.yaml` and `rbac/optional/configmap-snapshot.yaml`;
/// returns the rules of the snapshot Role.
async fn install_rbac(env: &Env) -> Vec<Value> {
    use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
    let root = controller_support::repo_root();
    let mut files: Vec<_> = std::fs::read_dir(root.join("rbac"))
        .expect("rbac/")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort_by_key(|p| (!p.ends_with("namespace.yaml"), p.clone()));
    files.push(root.join("rbac/optional/configmap-snapshot.yaml"));
    let pp = PostParams::default();
    let mut snapshot_rules = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).expect("read rbac file");
        for doc in kube_discovery_core::yaml::documents(&text) {
            let v = doc.expect("yaml");
            if v.is_null() {
                continue;
            }
            let ns = v["metadata"]["namespace"].as_str().unwrap_or("default");
            let c = env.admin.clone();
            let res = match v["kind"].as_str() {
                Some("Namespace") => Api::<Namespace>::all(c)
                    .create(&pp, &serde_json::from_value(v.clone()).unwrap())
                    .await
                    .map(|_| ()),
                Some("ServiceAccount") => Api::<ServiceAccount>::namespaced(c, ns)
                    .create(&pp, &serde_json::from_value(v.clone()).unwrap())
                    .await
                    .map(|_| ()),
                Some("ClusterRole") => Api::<ClusterRole>::all(c)
                    .create(&pp, &serde_json::from_value(v.clone()).unwrap())
                    .await
                    .map(|_| ()),
                Some("ClusterRoleBinding") => Api::<ClusterRoleBinding>::all(c)
                    .create(&pp, &serde_json::from_value(v.clone()).unwrap())
                    .await
                    .map(|_| ()),
                Some("Role") => {
                    if f.ends_with("configmap-snapshot.yaml") {
                        snapshot_rules.extend(v["rules"].as_array().cloned().unwrap_or_default());
                    }
                    Api::<Role>::namespaced(c, ns)
                        .create(&pp, &serde_json::from_value(v.clone()).unwrap())
                        .await
                        .map(|_| ())
                }
                Some("RoleBinding") => Api::<RoleBinding>::namespaced(c, ns)
                    .create(&pp, &serde_json::from_value(v.clone()).unwrap())
                    .await
                    .map(|_| ()),
                other => panic!("unexpected kind {other:?} in {}", f.display()),
            };
            match res {
                Ok(()) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => panic!("create {} from {}: {e}", v["kind"], f.display()),
            }
        }
    }
    snapshot_rules
}

async fn stats(env: &Env) -> Value {
    env.api.stats().await.expect("stats")
}

async fn wait_metric(ctl: &Controller, what: &str, needle: &str, at_least: f64) {
    eventually(what, LIMIT, || async {
        let (_, text) = ctl.get("/metrics").await;
        text.lines()
            .find_map(|l| l.strip_prefix(needle))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|v| *v >= at_least)
            .map(|_| ())
    })
    .await;
}

/// Waits until `token` may use each of `verbs` on ConfigMaps in
/// `kube-discovery` (SelfSubjectAccessReview): the real server's authorizer
/// reads RBAC objects from an informer cache, so a new binding takes effect a
/// moment after it was created (on kube-sim at once).
async fn wait_allowed(env: &Env, token: &str, verbs: &BTreeSet<String>) {
    let client = env.api.client(token).await.expect("client");
    for verb in verbs {
        eventually(
            &format!("the ServiceAccount may {verb} configmaps"),
            LIMIT,
            || {
                let client = client.clone();
                async move {
                    let body = json!({"apiVersion": "authorization.k8s.io/v1",
                        "kind": "SelfSubjectAccessReview",
                        "spec": {"resourceAttributes": {"namespace": "kube-discovery",
                            "verb": verb, "resource": "configmaps"}}});
                    let req = http::Request::post(
                        "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                    )
                    .header("content-type", "application/json")
                    .body(serde_json::to_vec(&body).unwrap())
                    .unwrap();
                    let v: Value = client.request(req).await.ok()?;
                    (v["status"]["allowed"] == true).then_some(())
                }
            },
        )
        .await;
    }
}

/// The controller runs as the ServiceAccount bound only to the shipped roles
/// (`rbac/` plus `rbac/optional/configmap-snapshot.yaml`), creates, updates
/// and deletes shards, and the ConfigMap verbs it used (the request
/// statistics and the write log) are exactly the verbs the snapshot Role
/// grants.
#[both_backends]
#[tokio::test]
async fn snapshot_needs_exactly_the_shipped_snapshot_role(backend: Backend) {
    let env = Env::start(backend).await;
    let rules = install_rbac(&env).await;
    let granted: BTreeSet<String> = rules
        .iter()
        .filter(|r| {
            r["resources"]
                .as_array()
                .is_some_and(|a| a.iter().any(|x| x == "configmaps"))
        })
        .flat_map(|r| r["verbs"].as_array().cloned().unwrap_or_default())
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    assert!(
        !granted.is_empty(),
        "the snapshot Role grants nothing on configmaps"
    );
    env.namespace(NS).await;
    let mut want = Expected::new();
    for i in 0..30u32 {
        put(&env, &mut want, &format!("s{i:02}"), ips(7000 + 8 * i, 3)).await;
    }
    let token_file = env.path("sa-token");
    let token = env
        .api
        .issue_token("kube-discovery", "kube-discovery")
        .await
        .expect("ServiceAccount token");
    std::fs::write(&token_file, &token).unwrap();
    wait_allowed(&env, &token, &granted).await;
    let url = env.api.url();
    let (schema, rest) = url.split_once("://").unwrap();
    let (host, port) = rest.rsplit_once(':').unwrap();
    let ca = env
        .ca_file()
        .map(|p| format!(", ca_file: {}", p.display()))
        .unwrap_or_default();
    let cfg = format!(
        "discovery:\n  kubernetes:\n    service: {{schema: {schema}, host: \"{host}\", port: {port}{ca}}}\n    client: {{token_file: {}}}\n    namespace_selector: {{equal: {NS}}}\nkube_discovery:\n  coalesce_window: 50ms\n  sinks:\n    configmap: {{enabled: true, namespace: kube-discovery, name: {SNAP}}}\n",
        token_file.display()
    );
    let before = stats(&env).await;
    let mark = env.mark().await;
    let ctl = start(
        &env,
        "lp",
        &cfg,
        &[("KUBE_DISCOVERY_SNAPSHOT_MAX_SHARD_BYTES", "2048")],
    )
    .await;
    let applied = "kube_discovery_snapshot_writes_total{result=\"applied\"} ";
    wait_metric(
        &ctl,
        "several shards",
        "kube_discovery_snapshot_shards ",
        3.0,
    )
    .await;
    wait_metric(&ctl, "first version written", applied, 4.0).await;
    // Shrink (stale shards deleted) and change one service (a shard patched).
    for i in 5..30u32 {
        env.delete_endpoints(NS, &format!("s{i:02}")).await;
    }
    wait_metric(
        &ctl,
        "stale shards deleted",
        "kube_discovery_snapshot_writes_total{result=\"deleted\"} ",
        2.0,
    )
    .await;
    env.endpoints(NS, "s00", &["10.0.0.1"], &[("http", 80)], json!({}))
        .await;
    // Wait for the content, not for a count of writes: the shrink may still
    // take another round, which would satisfy a count before s00 is written.
    want.retain(|k, _| (0..5).any(|i| *k == format!("{NS}/s{i:02}")));
    want.insert(
        format!("{NS}/s00"),
        BTreeMap::from([("http".to_string(), vec!["10.0.0.1".to_string()])]),
    );
    let api: Api<ConfigMap> = Api::namespaced(env.admin.clone(), "kube-discovery");
    eventually("the shrunk and changed snapshot", LIMIT, || {
        let api = api.clone();
        let want = want.clone();
        async move {
            match read(&api).await {
                Ok(Some(d)) if hosts_of(&d) == want => Some(()),
                _ => None,
            }
        }
    })
    .await;
    let after = stats(&env).await;
    let logs = ctl.logs();
    ctl.stop().await;
    assert!(
        !logs.to_lowercase().contains("forbidden"),
        "a request was forbidden with the shipped roles:\n{logs}"
    );
    // Verbs on configmaps between the two counters, the controller's own
    // (the test reads the snapshot as the admin) ...
    let sa = "system:serviceaccount:kube-discovery:kube-discovery";
    let mut used = BTreeSet::new();
    for (verb, by_res) in after["requestsByUser"][sa]
        .as_object()
        .into_iter()
        .flatten()
    {
        let n = by_res["configmaps"].as_u64().unwrap_or(0);
        let m = before["requestsByUser"][sa][verb]["configmaps"]
            .as_u64()
            .unwrap_or(0);
        if n > m {
            used.insert(verb.clone());
        }
    }
    // ... and the controller's writes as the write log names them (an apply
    // that creates is a create, which the API server authorizes too).
    for w in writes_since(&env, mark).await {
        if w["resource"] == "configmaps"
            && w["user"] == "system:serviceaccount:kube-discovery:kube-discovery"
        {
            used.insert(w["verb"].as_str().unwrap_or("").to_string());
        }
    }
    assert_eq!(
        used, granted,
        "ConfigMap verbs used vs granted by the snapshot Role"
    );
    // And the snapshot is still right.
    let d = read(&api).await.expect("consistent").expect("index");
    assert_eq!(hosts_of(&d), want);
}
