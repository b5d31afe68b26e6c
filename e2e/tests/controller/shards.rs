//! Services too big for one object (issue 4): the `kube-discovery` binary on
//! both API servers (EndpointSlice mode, slices of 100 endpoints) with ONE
//! Service of up to 20,000 endpoints and 3 ports.
//! * every object it writes stays under the 1.5 MiB limit of a stored object
//!   (etcd's request limit, which the real server's writes hit first; kube-sim
//!   refuses bigger bodies with 413), the serialized objects are measured, and
//!   the merged nodes of all shards equal the truth;
//! * growth (5,000 -> 20,000) adds shards, a shrink (-> 50) removes the
//!   surplus objects;
//! * `kube-discovery nodes` returns the WHOLE list of a sharded service;
//! * one endpoint added or removed is two writes: its shard, then shard 0
//!   (issue 19 item 2: stable hash partition, per-shard versions);
//! * a reader racing the writer (listing in a loop while every shard is
//!   rewritten, three times) takes only states the service went through,
//!   never a mix of two versions (the client's `lookup`, shard 0's manifest);
//! * objects of the old scheme (one version on every shard, no manifest) are
//!   read meanwhile and rewritten once by a restart, then left alone;
//! * an irrelevant change writes nothing, and a restart writes nothing (the
//!   write log: kube-sim's, or the real server's audit log, where even a
//!   no-op request would show);
//! * a reader resolving after EVERY watch event while a sharded service
//!   shrinks to one object and grows back, also with the write's second
//!   request failing, only ever answers the whole old or the whole new set
//!   (issue 29 item 2; its own test, one Endpoints object as the source).
//!
//! Slices are applied concurrently (200 requests, not 20,000). Growth and
//! shrink reach the controller in ONE relist (watches stalled while the
//! slices change, then 410 Gone: on the real server an etcd compaction and an
//! API server restart), so each is one write of all shards: on debug builds
//! kube-sim needs about a second per 500 KiB object write.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::controller_support;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use controller_support::{Backend, Controller, Env, bin};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube_discovery_client::lookup::lookup;
use kube_discovery_core::crd::{DiscoveredService, ReaderRule};
use kube_discovery_core::parse_service_name;
use serde_json::{Value, json};
use testenv::both_backends;

const NS: &str = "shards";
/// Upper bound of the waits for the shards (debug builds of kube-sim and the
/// controller move megabytes per write).
const WAIT: std::time::Duration = std::time::Duration::from_secs(120);
const PORTS: [(&str, i32); 3] = [("http", 8080), ("grpc", 9090), ("metrics", 9100)];
/// kube-sim's and etcd's object size limit (etcd's `--max-request-bytes`
/// default, 1.5 MiB; the real API server's own request body limit is 3 MiB).
const LIMIT_BYTES: usize = 3 * 1024 * 1024 / 2;

fn config(env: &Env) -> String {
    format!(
        "discovery:\n  kubernetes:\n{}    watch_endpoint_slices: true\nkube_discovery:\n  coalesce_window: 200ms\n",
        env.service_block(&env.admin_token())
    )
}

fn ip(slice: usize, i: usize) -> String {
    format!("10.{}.{}.{}", 64 + slice / 256, slice % 256, i + 1)
}

/// The hosts of `n` endpoints (slices of 100), sorted.
fn hosts(n: usize) -> Vec<String> {
    let mut v: Vec<String> = (0..n).map(|k| ip(k / 100, k % 100)).collect();
    v.sort();
    v
}

/// Makes Service `huge` have exactly `n` ready endpoints: slices
/// `huge-<s>` of 100 (the last one partial) applied concurrently, slices
/// beyond deleted.
async fn set_endpoints(env: &Env, n: usize, previous: usize) {
    let slices = n.div_ceil(100);
    let mut futs = Vec::new();
    for s in 0..slices {
        let count = (n - s * 100).min(100);
        let ips: Vec<String> = (0..count).map(|i| ip(s, i)).collect();
        futs.push(async move {
            let eps: Vec<(&str, bool)> = ips.iter().map(|ip| (ip.as_str(), true)).collect();
            env.slice(NS, "huge", &format!("huge-{s}"), &eps, &PORTS)
                .await;
        });
    }
    futures::future::join_all(futs).await;
    let api: Api<EndpointSlice> = Api::namespaced(env.admin.clone(), NS);
    let dels = (slices..previous.div_ceil(100)).map(|s| {
        let api = api.clone();
        async move {
            api.delete(&format!("huge-{s}"), &DeleteParams::default())
                .await
                .expect("delete slice");
        }
    });
    futures::future::join_all(dels).await;
}

fn slices_api(env: &Env) -> Api<EndpointSlice> {
    Api::namespaced(env.admin.clone(), NS)
}

/// Every DiscoveredService of Service `huge`, as JSON, by name.
async fn objects(env: &Env) -> Vec<Value> {
    let mut v: Vec<Value> = env
        .dsvc_api_all()
        .list(&ListParams::default().labels("kubediscovery.io/service-name=huge"))
        .await
        .expect("list")
        .items
        .into_iter()
        .map(|o| serde_json::to_value(o).expect("json"))
        .collect();
    v.sort_by_key(|o| o["metadata"]["name"].as_str().unwrap_or("").to_string());
    v
}

/// The objects as typed DiscoveredServices.
fn typed(objs: &[Value]) -> Vec<DiscoveredService> {
    objs.iter()
        .map(|o| serde_json::from_value(o.clone()).expect("DiscoveredService"))
        .collect()
}

/// The hosts of every port as a reader takes them (the client's `lookup`:
/// shard 0 and the shards its manifest lists), when they form one version
/// and no surplus object is left (else `None`: mid-update).
fn merged(objs: &[Value]) -> Option<Vec<(String, Vec<String>)>> {
    let typed = typed(objs);
    let count = typed
        .iter()
        .find(|o| o.spec.shard.as_ref().is_none_or(|s| s.index == 0))
        .map(|o| o.spec.shard.as_ref().map_or(1, |s| s.count as usize))?;
    if count != typed.len() {
        return None;
    }
    read_as_reader(&typed).ok()
}

/// What a reader assembles of `typed` (every port's hosts, sorted), or why
/// it cannot (the shards do not form one version yet).
fn read_as_reader(typed: &[DiscoveredService]) -> Result<Vec<(String, Vec<String>)>, String> {
    let mut out = Vec::new();
    for (port, number) in PORTS {
        let q = parse_service_name(&format!("{NS}/huge:{port}")).expect("name");
        let nodes = lookup(typed, &q, &ReaderRule::default())
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("no port {port}"))?;
        assert!(
            nodes.iter().all(|n| n.port == number),
            "{port}: a node of another port"
        );
        let mut h: Vec<String> = nodes.into_iter().map(|n| n.host.to_string()).collect();
        h.sort();
        out.push((port.to_string(), h));
    }
    Ok(out)
}

/// Waits until the merged objects equal `n` endpoints on every port; returns
/// the objects. On timeout: what is there, and the controller's log tail.
async fn wait_truth(env: &Env, ctl: &Controller, n: usize) -> Vec<Value> {
    wait_hosts(env, ctl, &hosts(n)).await
}

/// [`wait_truth`] for the endpoints `want` (sorted hosts) on every port.
async fn wait_hosts(env: &Env, ctl: &Controller, want: &[String]) -> Vec<Value> {
    let n = want.len();
    let want: Vec<(String, Vec<String>)> = PORTS
        .iter()
        .map(|(p, _)| (p.to_string(), want.to_vec()))
        .collect();
    let start = tokio::time::Instant::now();
    loop {
        let objs = objects(env).await;
        // Each object's status (written in the same apply as its spec)
        // counts its nodes.
        let status_done = objs
            .iter()
            .all(|o| o["status"]["nodeCount"].as_u64() == Some(node_count(o)));
        if status_done && merged(&objs).as_ref() == Some(&want) {
            eprintln!("{n} endpoints merged after {:?}", start.elapsed());
            return objs;
        }
        if start.elapsed() > WAIT {
            let seen: Vec<String> = objs
                .iter()
                .map(|o| {
                    format!(
                        "{} {} {}",
                        o["metadata"]["name"], o["spec"]["version"], o["spec"]["shard"]
                    )
                })
                .collect();
            let logs = ctl.logs();
            let tail: Vec<&str> = logs
                .lines()
                .rev()
                .filter(|l| !l.contains("differs from the desired"))
                .take(40)
                .collect();
            let w = env.dsvc_writes_since(0).await;
            let mut t0 = 0u128;
            for x in w.iter().rev().take(30) {
                let t = x["timeNanos"].as_u64().unwrap_or(0) as u128;
                eprintln!(
                    "{} {} {} {}ms",
                    x["verb"],
                    x["name"],
                    x["resourceVersion"],
                    if t0 == 0 { 0 } else { (t0 - t) / 1_000_000 }
                );
                t0 = t;
            }
            panic!(
                "the shards of {NS}/huge do not merge to {n} endpoints after {WAIT:?}: {seen:?}\nlog tail (newest first):\n{}",
                tail.join("\n")
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// Nodes in `o`'s `spec.ports`.
fn node_count(o: &Value) -> u64 {
    o["spec"]["ports"]
        .as_object()
        .map(|p| {
            p.values()
                .map(|n| n.as_array().map_or(0, Vec::len) as u64)
                .sum()
        })
        .unwrap_or(0)
}

/// Every object is under the size limit and correctly labelled as a shard.
fn check_shards(objs: &[Value]) {
    let count = objs.len();
    for o in objs {
        let name = o["metadata"]["name"].as_str().unwrap_or("");
        let size = serde_json::to_vec(o).expect("json").len();
        assert!(size < LIMIT_BYTES, "{name}: {size} bytes");
        if count > 1 {
            let index = o["spec"]["shard"]["index"].as_u64().expect("shard index");
            assert_eq!(o["spec"]["shard"]["count"], json!(count), "{name}");
            let want = if index == 0 {
                "huge".to_string()
            } else {
                format!("huge.{index}")
            };
            assert_eq!(name, want);
            assert_eq!(
                o["metadata"]["labels"]["kubediscovery.io/shard"],
                json!(index.to_string())
            );
            assert_eq!(
                o["status"]["nodeCount"].as_u64(),
                Some(node_count(o)),
                "{name}: status counts this object's nodes"
            );
        } else {
            assert!(o["spec"].get("shard").is_none(), "{name}: {}", o["spec"]);
        }
    }
}

/// The controller's watches stay open but silent until [`Env::force_410`]
/// (real: the fault proxy holds their answers back).
async fn stall(env: &Env) {
    env.api
        .fault(&json!({"stallWatchesSeconds": 60}))
        .await
        .expect("stall watches");
}

fn names(writes: &[Value]) -> Vec<String> {
    writes
        .iter()
        .map(|w| {
            format!(
                "{} {}",
                w["verb"].as_str().unwrap_or(""),
                w["name"].as_str().unwrap_or("")
            )
        })
        .collect()
}

// kube-sim runs in this process: its own threads, so the test's polling
// (listing megabytes of objects) never stalls the API server.
#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_20000_endpoint_service_is_sharded_grows_shrinks_and_reads_back_whole(backend: Backend) {
    let env = Env::start(backend).await;
    env.namespace(NS).await;
    set_endpoints(&env, 5_000, 0).await;
    let cfg = config(&env);
    let ctl = Controller::start(&env, "shards1", &cfg, &[]).await;
    ctl.wait_ready().await;
    let small = wait_truth(&env, &ctl, 5_000).await;
    check_shards(&small);
    assert!(small.len() >= 2, "5,000 x 3 ports fit one object?");

    // Growth: more shards, each under the limit. The 150 new slices reach
    // the controller in one relist (watch stalled, then 410 Gone), so it is
    // one write, not one per slice (keeps this test fast on debug builds).
    let mark = env.mark().await;
    stall(&env).await;
    set_endpoints(&env, 20_000, 5_000).await;
    env.force_410().await;
    let big = wait_truth(&env, &ctl, 20_000).await;
    check_shards(&big);
    assert!(
        big.len() > small.len(),
        "{} shards at 20,000, {} at 5,000",
        big.len(),
        small.len()
    );
    let w = env.dsvc_writes_since(mark).await;
    assert!(
        w.iter().all(|x| x["name"]
            .as_str()
            .is_some_and(|n| n == "huge" || n.starts_with("huge."))),
        "{:?}",
        names(&w)
    );

    // Readers get the whole list: the CLI.
    let kc = env.kubeconfig(&env.admin_token());
    let out = tokio::process::Command::new(bin())
        .args(["nodes", &format!("{NS}/huge:grpc"), "--kubeconfig"])
        .arg(&kc)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .await
        .expect("run nodes");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let nodes: Vec<Value> = serde_json::from_slice(&out.stdout).expect("nodes JSON");
    let mut got: Vec<String> = nodes
        .iter()
        .map(|n| n["host"].as_str().unwrap_or("").to_string())
        .collect();
    got.sort();
    assert_eq!(got, hosts(20_000));
    assert!(nodes.iter().all(|n| n["port"] == 9090));

    // One endpoint more, then one less: each is ONE shard and shard 0 (its
    // manifest), wherever the endpoint sorts (issue 19 item 2).
    let mut plus_one = hosts(20_000);
    plus_one.push("10.250.0.1".to_string());
    plus_one.sort();
    for (step, want) in [("added", &plus_one), ("removed", &hosts(20_000))] {
        let mark = env.mark().await;
        if step == "added" {
            env.slice(NS, "huge", "huge-extra", &[("10.250.0.1", true)], &PORTS)
                .await;
        } else {
            slices_api(&env)
                .delete("huge-extra", &DeleteParams::default())
                .await
                .expect("delete slice");
        }
        wait_hosts(&env, &ctl, want).await;
        // Past the coalescing window: nothing else follows.
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let w = names(&env.dsvc_writes_since(mark).await);
        assert_eq!(w.len(), 2, "one endpoint {step}: {w:?}");
        assert!(w[0].contains(" huge."), "one endpoint {step}: {w:?}");
        assert!(w[1].ends_with(" huge"), "shard 0 last: {w:?}");
    }

    // A reader racing the writer: it lists the objects in a loop while the
    // controller rewrites shards (100 endpoints of one slice replaced, three
    // times: every shard changes), and every read it takes must be one of
    // the states the service went through, never a mix of two.
    let mut states = vec![hosts(20_000)];
    for step in 1..=3u8 {
        let mut h: Vec<String> = hosts(20_000)
            .into_iter()
            .filter(|h| !h.starts_with("10.64.7."))
            .collect();
        h.extend((1..=100).map(|i| format!("10.251.{step}.{i}")));
        h.sort();
        states.push(h);
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = tokio::spawn({
        let env_objects: Api<DiscoveredService> = Api::namespaced(env.admin.clone(), NS);
        let stop = stop.clone();
        async move {
            let (mut taken, mut incomplete) = (Vec::new(), 0usize);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let objs: Vec<DiscoveredService> = env_objects
                    .list(&ListParams::default().labels("kubediscovery.io/service-name=huge"))
                    .await
                    .expect("list")
                    .items;
                match read_as_reader(&objs) {
                    Ok(read) => taken.push(read),
                    Err(_) => incomplete += 1,
                }
            }
            (taken, incomplete)
        }
    });
    for (step, want) in states.iter().enumerate().skip(1) {
        let eps: Vec<String> = (1..=100).map(|i| format!("10.251.{step}.{i}")).collect();
        let eps: Vec<(&str, bool)> = eps.iter().map(|ip| (ip.as_str(), true)).collect();
        env.slice(NS, "huge", "huge-7", &eps, &PORTS).await;
        wait_hosts(&env, &ctl, want).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (taken, incomplete) = reader.await.expect("reader");
    eprintln!(
        "racing reader: {} consistent reads, {incomplete} reads between shard writes",
        taken.len()
    );
    assert!(!taken.is_empty());
    for (i, read) in taken.iter().enumerate() {
        let state = read
            .iter()
            .map(|(_, h)| states.iter().position(|s| s == h))
            .collect::<Vec<_>>();
        assert!(
            state.iter().all(|s| s.is_some() && *s == state[0]),
            "read {i} is a mix: per port the state it equals: {state:?}"
        );
    }
    // Back to the state of 20,000 for what follows.
    let eps: Vec<String> = (0..100).map(|i| ip(7, i)).collect();
    let eps: Vec<(&str, bool)> = eps.iter().map(|ip| (ip.as_str(), true)).collect();
    env.slice(NS, "huge", "huge-7", &eps, &PORTS).await;
    wait_truth(&env, &ctl, 20_000).await;

    // An irrelevant change (an annotation on a slice) writes nothing; a
    // later relevant change of another service marks the end.
    let mark = env.mark().await;
    slices_api(&env)
        .patch(
            "huge-7",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"note": "irrelevant"}}})),
        )
        .await
        .expect("annotate");
    env.slice(
        NS,
        "marker",
        "marker-a",
        &[("10.9.9.9", true)],
        &[("http", 80)],
    )
    .await;
    env.wait_nodes(NS, "marker", "http", &["10.9.9.9"]).await;
    let w = env.dsvc_writes_since(mark).await;
    assert!(w.iter().all(|x| x["name"] == "marker"), "{:?}", names(&w));

    // Restart with nothing changed: zero writes.
    ctl.stop().await;
    let mark = env.mark().await;
    let t = tokio::time::Instant::now();
    let ctl = Controller::start(&env, "shards2", &cfg, &[]).await;
    ctl.wait_ready().await;
    eprintln!("restarted and ready after {:?}", t.elapsed());
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let w = env.dsvc_writes_since(mark).await;
    assert!(w.is_empty(), "a restart wrote: {:?}", names(&w));

    // Objects of the old scheme (every shard with the service's version, no
    // manifest), as a version before per-shard versions wrote them: readers
    // take them meanwhile, and a restart rewrites every shard ONCE into the
    // new scheme; the restart after that writes nothing.
    ctl.stop().await;
    let before = objects(&env).await;
    let service_version = before
        .iter()
        .find(|o| o["metadata"]["name"] == "huge")
        .map(|o| o["spec"]["version"].clone())
        .expect("shard 0");
    let typed_api: Api<DiscoveredService> = Api::namespaced(env.admin.clone(), NS);
    for o in &before {
        let name = o["metadata"]["name"].as_str().expect("name");
        typed_api
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"spec": {"version": service_version, "shard": {"versions": null}}}),
                ),
            )
            .await
            .expect("write the old scheme");
    }
    let old = objects(&env).await;
    assert!(
        old.iter()
            .all(|o| o["spec"]["shard"].get("versions").is_none()),
        "the old scheme has no manifest"
    );
    assert_eq!(
        merged(&old),
        merged(&before),
        "readers take the old scheme's objects"
    );
    let mark = env.mark().await;
    let ctl = Controller::start(&env, "shards3", &cfg, &[]).await;
    ctl.wait_ready().await;
    let start = tokio::time::Instant::now();
    loop {
        let now = objects(&env).await;
        let converted = now
            .iter()
            .all(|o| o["spec"]["version"] != service_version || o["metadata"]["name"] == "huge")
            && now
                .iter()
                .any(|o| o["spec"]["shard"]["versions"].as_array().is_some());
        if converted && merged(&now) == merged(&before) {
            break;
        }
        assert!(start.elapsed() < WAIT, "not converted after {WAIT:?}");
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let w = names(&env.dsvc_writes_since(mark).await);
    assert_eq!(w.len(), before.len(), "every shard once: {w:?}");
    ctl.stop().await;
    let mark = env.mark().await;
    let ctl = Controller::start(&env, "shards4", &cfg, &[]).await;
    ctl.wait_ready().await;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let w = env.dsvc_writes_since(mark).await;
    assert!(
        w.is_empty(),
        "a restart after the conversion wrote: {:?}",
        names(&w)
    );

    // Shrink: the surplus shards are deleted, one unsharded object remains.
    let mark = env.mark().await;
    stall(&env).await;
    set_endpoints(&env, 50, 20_000).await;
    env.force_410().await;
    let one = wait_truth(&env, &ctl, 50).await;
    assert_eq!(
        one.len(),
        1,
        "{:?}",
        one.iter()
            .map(|o| &o["metadata"]["name"])
            .collect::<Vec<_>>()
    );
    check_shards(&one);
    let w = names(&env.dsvc_writes_since(mark).await);
    for i in 1..big.len() {
        assert!(w.contains(&format!("delete huge.{i}")), "{w:?}");
    }
    ctl.stop().await;
}

/// What [`event_reader`] answered after one watch event: the nodes of every
/// port, or why it could not (and the objects it held, for the message).
type Answer = (Result<Vec<(String, Vec<String>)>, String>, String);

/// A reader that resolves Service `huge` after EVERY watch event of its
/// DiscoveredServices (the initial list once, then each added, modified and
/// deleted object), as a resolver answering between events does; every
/// answer lands in `answers`.
async fn event_reader(api: Api<DiscoveredService>, answers: Arc<Mutex<Vec<Answer>>>) {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let cfg = watcher::Config::default().labels("kubediscovery.io/service-name=huge");
    let mut events = std::pin::pin!(watcher::watcher(api, cfg).default_backoff());
    let mut held: BTreeMap<String, DiscoveredService> = BTreeMap::new();
    let mut listing: BTreeMap<String, DiscoveredService> = BTreeMap::new();
    while let Some(ev) = events.next().await {
        let name = |o: &DiscoveredService| o.metadata.name.clone().unwrap_or_default();
        match ev {
            Ok(watcher::Event::Init) => {
                listing.clear();
                continue;
            }
            Ok(watcher::Event::InitApply(o)) => {
                listing.insert(name(&o), o);
                continue;
            }
            Ok(watcher::Event::InitDone) => held = std::mem::take(&mut listing),
            Ok(watcher::Event::Apply(o)) => {
                held.insert(name(&o), o);
            }
            Ok(watcher::Event::Delete(o)) => {
                held.remove(&name(&o));
            }
            Err(_) => continue,
        }
        let objs: Vec<DiscoveredService> = held.values().cloned().collect();
        let shown: Vec<String> = objs
            .iter()
            .map(|o| {
                format!(
                    "{} shard={:?} nodes={}",
                    name(o),
                    o.spec.shard.as_ref().map(|s| (s.index, s.count)),
                    o.spec.ports.values().map(Vec::len).sum::<usize>()
                )
            })
            .collect();
        let answer = read_as_reader(&objs);
        answers.lock().unwrap().push((answer, format!("{shown:?}")));
    }
}

/// Issue 29 item 2: a sharded service that shrinks to one object, and grows
/// back, while a reader resolves it after every watch event: every answer is
/// the whole old or the whole new node set, also when the write's second
/// request fails (500) and is retried. One Endpoints object is the source,
/// so each change is ONE event and one write: the service has exactly two
/// states per step.
#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_take_the_whole_old_or_new_set_while_a_sharded_service_shrinks_to_one_object(
    backend: Backend,
) {
    const BIG: usize = 6_000;
    const SMALL: usize = 50;
    let env = Env::start(backend).await;
    env.namespace(NS).await;
    let set = |n: usize| {
        let env = &env;
        async move {
            let h = hosts(n);
            let ips: Vec<&str> = h.iter().map(String::as_str).collect();
            env.endpoints(NS, "huge", &ips, &PORTS, json!({})).await;
        }
    };
    set(BIG).await;
    let cfg = format!(
        "discovery:\n  kubernetes:\n{}kube_discovery:\n  coalesce_window: 200ms\n",
        env.service_block(&env.admin_token())
    );
    let ctl = Controller::start(&env, "unshard", &cfg, &[]).await;
    ctl.wait_ready().await;
    let sharded = wait_truth(&env, &ctl, BIG).await.len();
    assert!(sharded >= 2, "{BIG} endpoints x 3 ports fit one object?");

    let answers: Arc<Mutex<Vec<Answer>>> = Arc::default();
    let reader = tokio::spawn(event_reader(
        Api::namespaced(env.admin.clone(), NS),
        answers.clone(),
    ));
    let last_is = |n: usize| {
        let answers = answers.clone();
        let want: Vec<(String, Vec<String>)> = PORTS
            .iter()
            .map(|(p, _)| (p.to_string(), hosts(n)))
            .collect();
        async move {
            controller_support::eventually("the reader's last answer", WAIT, || {
                let got = answers
                    .lock()
                    .unwrap()
                    .last()
                    .is_some_and(|(a, _)| a.as_ref().ok() == Some(&want));
                async move { got.then_some(()) }
            })
            .await;
        }
    };
    last_is(BIG).await;

    // Shrink, grow back, then shrink with the write's second request
    // failing: the first PATCH of a DiscoveredService passes, the second
    // fails, and so does the first DELETE.
    for (step, n) in [("shrink", SMALL), ("grow", BIG), ("shrink, failing", SMALL)] {
        if step == "shrink, failing" {
            for fail in [
                json!({"verb": "patch", "resource": "discoveredservices", "code": 500, "count": 1, "fraction": 0.5}),
                json!({"verb": "delete", "resource": "discoveredservices", "code": 500, "count": 1}),
            ] {
                env.api
                    .fault(&json!({ "fail": fail }))
                    .await
                    .expect("fault");
            }
        }
        set(n).await;
        let objs = wait_truth(&env, &ctl, n).await;
        assert_eq!(
            objs.len() == 1,
            n == SMALL,
            "{step}: {} objects",
            objs.len()
        );
        last_is(n).await;
        eprintln!("{step}: done");
    }
    assert!(
        ctl.logs().contains("write failed"),
        "the injected failure hit no request of the write"
    );
    env.api
        .fault(&json!({"clear": true}))
        .await
        .expect("clear faults");
    reader.abort();

    let answers = std::mem::take(&mut *answers.lock().unwrap());
    let (mut big, mut small) = (0, 0);
    for (i, (answer, objects)) in answers.iter().enumerate() {
        let whole = |n: usize| {
            answer
                .as_ref()
                .is_ok_and(|a| a.iter().all(|(_, h)| *h == hosts(n)))
        };
        if whole(BIG) {
            big += 1;
        } else if whole(SMALL) {
            small += 1;
        } else {
            let what = match answer {
                Ok(a) => format!(
                    "{} hosts per port ({:?})",
                    a[0].1.len(),
                    a.iter().map(|(_, h)| h.len()).collect::<Vec<_>>()
                ),
                Err(e) => format!("no answer: {e}"),
            };
            panic!(
                "answer {i} of {} is not a whole set ({BIG} or {SMALL} hosts): {what}; objects: {objects}",
                answers.len()
            );
        }
    }
    eprintln!(
        "{} answers: {big} of {BIG} hosts, {small} of {SMALL}",
        answers.len()
    );
    ctl.stop().await;
}
