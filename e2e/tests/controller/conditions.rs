//! Objects that explain themselves (issue 17), on both API servers:
//!
//! * `Ready` follows the endpoints: all not ready -> `False NoEndpoints`;
//!   ready -> `True` with a new `lastTransitionTime`; a rewrite that keeps
//!   it ready (more nodes), and a restart of the controller followed by a
//!   rewrite, keep that time. `observedGeneration` (status and every
//!   condition) equals `metadata.generation` after every write, also after
//!   a status-only hand edit (the generation moves: no status subresource;
//!   the controller repairs it), a restart, and an object without the stamp
//!   (written by an older version), which a restart stamps.
//! * A slice with a port without a number (the API server accepts it; the
//!   controller cannot use it) -> `Degraded=True SourceDataSkipped` naming
//!   the slice and the field, and ONE `SourceDataSkipped` Event on the
//!   DiscoveredService; a relist (410) and a restart emit no second one.
//!   `kubectl describe dsvc` shows the conditions and the Event.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::controller_support;

use std::process::Command;
use std::time::Duration;

use controller_support::{Backend, Controller, Env, LIMIT, condition, eventually, repo_root};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use testenv::both_backends;

const NS: &str = "cond";

fn config(env: &Env) -> String {
    format!(
        "discovery:\n  kubernetes:\n{}    watch_endpoint_slices: true\nkube_discovery:\n  coalesce_window: 20ms\n",
        env.service_block(&env.admin_token())
    )
}

/// Whether `ds`'s status and every condition carry `observedGeneration` =
/// `metadata.generation`.
fn stamped(ds: &Value) -> bool {
    let generation = &ds["metadata"]["generation"];
    generation.is_i64()
        && ds["status"]["observedGeneration"] == *generation
        && ds["status"]["conditions"].as_array().is_some_and(|cs| {
            !cs.is_empty() && cs.iter().all(|c| c["observedGeneration"] == *generation)
        })
}

/// Waits until `NS/name` is stamped (see [`stamped`]).
async fn wait_stamped(env: &Env, name: &str) -> Value {
    eventually(
        &format!("{NS}/{name} observedGeneration = generation"),
        LIMIT,
        || async {
            env.assert_alive();
            let ds = env.dsvc(NS, name).await?;
            stamped(&ds).then_some(ds)
        },
    )
    .await
}

/// [`Env::wait_condition`] in [`NS`].
async fn wait_condition(env: &Env, name: &str, type_: &str, status: &str, reason: &str) -> Value {
    env.wait_condition(NS, name, type_, status, reason).await
}

/// The slice `NS/web-a` of `web` with these `(ip, ready)` endpoints on `http`.
async fn web_endpoints(env: &Env, eps: &[(&str, bool)]) {
    env.slice(NS, "web", "web-a", eps, &[("http", 8080)]).await;
}

/// The SourceDataSkipped Events on the DiscoveredService `NS/web`.
async fn skipped_events(env: &Env) -> Vec<Event> {
    env.events(NS, "SourceDataSkipped", "DiscoveredService", "web")
        .await
}

/// Applies the slice `NS/web-a` of `web` with one ready endpoint on `ports`.
async fn apply_slice(env: &Env, ports: Value) {
    let slice = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-a", "namespace": NS, "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.0.1.1"], "conditions": {"ready": true}}],
        "ports": ports});
    Api::<EndpointSlice>::namespaced(env.admin.clone(), NS)
        .patch(
            "web-a",
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&slice),
        )
        .await
        .expect("apply the slice");
}

/// Runs `.tools/bin/kubectl args` with `kubeconfig`; returns stdout.
fn kubectl(kubeconfig: &std::path::Path, args: &[&str]) -> String {
    let home = tempfile::tempdir().expect("home");
    let out = tokio::task::block_in_place(|| {
        Command::new(repo_root().join(".tools/bin/kubectl"))
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .env("HOME", home.path())
            .output()
            .expect("run kubectl")
    });
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "kubectl {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_follows_the_endpoints_and_moves_its_time_only_on_a_transition(backend: Backend) {
    let env = Env::start(backend).await;
    env.namespace(NS).await;
    web_endpoints(&env, &[("10.0.0.1", false)]).await;
    let cfg = config(&env);
    let ctl = Controller::start(&env, "cond", &cfg, &[]).await;
    ctl.wait_ready().await;
    // Nothing ready: the object exists and says why it has no node.
    let ds = wait_condition(&env, "web", "Ready", "False", "NoEndpoints").await;
    assert_eq!(ds["status"]["nodeCount"], 0);
    let not_ready = condition(&ds, "Ready");
    assert!(
        not_ready["message"]
            .as_str()
            .is_some_and(|m| m.contains("no ready endpoint")),
        "{not_ready}"
    );
    assert!(stamped(&ds), "{ds}");
    assert_eq!(condition(&ds, "Degraded")["status"], "False");
    // Times have a resolution of one second.
    tokio::time::sleep(Duration::from_millis(1100)).await;

    // Ready: a transition, with a new time.
    web_endpoints(&env, &[("10.0.0.1", true)]).await;
    let ds = wait_condition(&env, "web", "Ready", "True", "AllPortsHaveNodes").await;
    let ready = condition(&ds, "Ready");
    let t_ready = ready["lastTransitionTime"].clone();
    assert_ne!(t_ready, not_ready["lastTransitionTime"], "{ready}");
    let generation = ds["metadata"]["generation"].as_i64().unwrap();
    let sync = ds["status"]["lastSyncTime"].clone();
    tokio::time::sleep(Duration::from_millis(1100)).await;

    // A rewrite that stays ready (one more node): the time stays, the
    // sync time and the generation move (one apply, one generation).
    web_endpoints(&env, &[("10.0.0.1", true), ("10.0.0.2", true)]).await;
    let ds = env
        .wait_nodes(NS, "web", "http", &["10.0.0.1", "10.0.0.2"])
        .await;
    assert_eq!(
        condition(&ds, "Ready")["lastTransitionTime"],
        t_ready,
        "{ds}"
    );
    assert_ne!(ds["status"]["lastSyncTime"], sync);
    assert_eq!(ds["metadata"]["generation"].as_i64(), Some(generation + 1));
    assert!(
        stamped(&ds),
        "one apply, stamped right the first time: {ds}"
    );

    // Without a status subresource, a change of the status alone bumps the
    // generation too: `observedGeneration` falls behind, which the
    // controller takes as drift and repairs.
    let api: Api<kube::api::DynamicObject> =
        Api::namespaced_with(env.admin.clone(), NS, &controller_support::dsvc_resource());
    let patched = api
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"lastSyncTime": "2020-01-01T00:00:00Z"}})),
        )
        .await
        .expect("patch the status");
    assert_eq!(patched.metadata.generation, Some(generation + 2));
    let ds = wait_stamped(&env, "web").await;
    assert!(
        ds["metadata"]["generation"].as_i64().unwrap() > generation + 2,
        "{ds}"
    );

    // A restart: the new process reads the conditions back; a rewrite then
    // keeps the time of the transition the first process saw.
    ctl.stop().await;
    web_endpoints(
        &env,
        &[("10.0.0.1", true), ("10.0.0.2", true), ("10.0.0.3", true)],
    )
    .await;
    let ctl = Controller::start(&env, "cond-2", &cfg, &[]).await;
    ctl.wait_ready().await;
    let ds = env
        .wait_nodes(NS, "web", "http", &["10.0.0.1", "10.0.0.2", "10.0.0.3"])
        .await;
    assert_eq!(
        condition(&ds, "Ready")["lastTransitionTime"],
        t_ready,
        "{ds}"
    );
    let ds = wait_stamped(&env, "web").await;
    // An object as an older version wrote it (no stamp anywhere): a
    // restart stamps it, though nothing else changed.
    ctl.stop().await;
    let mut conditions = ds["status"]["conditions"].clone();
    for c in conditions.as_array_mut().unwrap() {
        c.as_object_mut().unwrap().remove("observedGeneration");
    }
    let old = api
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"status": {"observedGeneration": null, "conditions": conditions}}),
            ),
        )
        .await
        .expect("remove the stamp");
    assert!(old.data["status"].get("observedGeneration").is_none());
    let ctl = Controller::start(&env, "cond-3", &cfg, &[]).await;
    ctl.wait_ready().await;
    let ds = wait_stamped(&env, "web").await;
    assert!(
        ds["metadata"]["generation"].as_i64() > old.metadata.generation,
        "{ds}"
    );
    // Not ready again: a new transition.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    web_endpoints(&env, &[("10.0.0.1", false)]).await;
    let ds = wait_condition(&env, "web", "Ready", "False", "NoEndpoints").await;
    assert_ne!(condition(&ds, "Ready")["lastTransitionTime"], t_ready);
    assert!(stamped(&ds), "{ds}");
    ctl.stop().await;
}

#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn skipped_source_data_is_degraded_with_one_event(backend: Backend) {
    // TLS: kubectl 1.32 sends no bearer token over plain HTTP.
    let env = Env::start_tls(backend).await;
    env.namespace(NS).await;
    // `admin` has no port number: valid for the API server (a port of "all
    // ports"), unusable for a node list.
    apply_slice(
        &env,
        json!([{"name": "http", "port": 8080, "protocol": "TCP"}, {"name": "admin", "protocol": "TCP"}]),
    )
    .await;
    let cfg = config(&env);
    let ctl = Controller::start(&env, "degraded", &cfg, &[]).await;
    ctl.wait_ready().await;
    let ds = wait_condition(&env, "web", "Degraded", "True", "SourceDataSkipped").await;
    let message = condition(&ds, "Degraded")["message"]
        .as_str()
        .unwrap()
        .to_string();
    for part in ["EndpointSlice cond/web-a", "ports[1]", "has no port number"] {
        assert!(message.contains(part), "{part:?} not in {message}");
    }
    // What could be used is used.
    assert_eq!(condition(&ds, "Ready")["status"], "True");
    assert_eq!(ds["spec"]["ports"]["http"][0]["host"], "10.0.1.1");
    let uid = ds["metadata"]["uid"].as_str().unwrap().to_string();
    let one = eventually("one SourceDataSkipped Event", LIMIT, || async {
        let evs = skipped_events(&env).await;
        (!evs.is_empty()).then_some(evs)
    })
    .await;
    assert_eq!(one.len(), 1, "{one:?}");
    let ev = &one[0];
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    assert_eq!(
        ev.regarding.as_ref().and_then(|r| r.uid.as_deref()),
        Some(uid.as_str())
    );
    assert!(
        ev.note.as_deref().is_some_and(|n| n.contains("ports[1]")),
        "{ev:?}"
    );

    // A relist finds the same bad slice: nothing new.
    env.force_410().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    // A restart reads the condition back: nothing new either.
    ctl.stop().await;
    let ctl = Controller::start(&env, "degraded-2", &cfg, &[]).await;
    ctl.wait_ready().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let again = skipped_events(&env).await;
    assert_eq!(again.len(), 1, "{again:?}");
    assert!(again[0].series.is_none(), "{again:?}");

    // What a user sees.
    let kc = env.kubeconfig(&env.admin_token());
    let table = kubectl(&kc, &["get", "dsvc", "-n", NS]);
    println!("$ kubectl get dsvc -n {NS}\n{table}");
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header[..3], ["NAME", "READY", "PORTS"], "{table}");
    let describe = kubectl(&kc, &["describe", "dsvc", "-n", NS, "web"]);
    println!("$ kubectl describe dsvc -n {NS} web\n{describe}");
    for part in [
        "Type:",
        "Degraded",
        "SourceDataSkipped",
        "Events:",
        "Warning",
    ] {
        assert!(describe.contains(part), "{part:?} not in:\n{describe}");
    }
    // Fixed: Degraded turns False, no new Warning.
    apply_slice(
        &env,
        json!([{"name": "http", "port": 8080, "protocol": "TCP"}]),
    )
    .await;
    wait_condition(&env, "web", "Degraded", "False", "NothingSkipped").await;
    assert_eq!(skipped_events(&env).await.len(), 1);
    ctl.stop().await;
}

/// What the `observedGeneration` stamp costs and what a simpler scheme
/// would (issue 30; the figures this prints are in BENCHMARKS.md): each
/// change of a service is ONE write request, and the version it writes is
/// already current by kstatus's rule (`status.observedGeneration` =
/// `metadata.generation`), so the object is current as soon as it is
/// written. The simpler scheme, stamping in a second write the generation
/// the first write's answer reported, never gets there on this CRD (no
/// status subresource): each such write moves the generation again.
#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_change_is_one_write_that_is_current_when_written(backend: Backend) {
    let env = Env::start(backend).await;
    env.namespace(NS).await;
    web_endpoints(&env, &[("10.0.0.1", true)]).await;
    let ctl = Controller::start(&env, "gen", &config(&env), &[]).await;
    ctl.wait_ready().await;
    let mut ds = wait_stamped(&env, "web").await;
    let hosts = [
        "10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6",
    ];
    let mut latencies_ms = Vec::new();
    for n in 2..=hosts.len() {
        let mark = env.mark().await;
        let eps: Vec<(&str, bool)> = hosts[..n].iter().map(|h| (*h, true)).collect();
        web_endpoints(&env, &eps).await;
        ds = env.wait_nodes(NS, "web", "http", &hosts[..n]).await;
        // Room for a corrective write, had the first one been stamped wrong.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let writes = env.api.writes_since(mark).await.expect("write log");
        let of = |resource: &str, name: &str| -> Vec<&Value> {
            writes
                .iter()
                .filter(|w| {
                    w["resource"]
                        .as_str()
                        .is_some_and(|r| r.starts_with(resource))
                        && w["namespace"] == NS
                        && w["name"] == name
                })
                .collect()
        };
        let (source, ours) = (
            of("endpointslices", "web-a"),
            of("discoveredservices", "web"),
        );
        assert_eq!(ours.len(), 1, "one write per change: {writes:?}");
        assert_eq!(source.len(), 1, "{writes:?}");
        let now = env.dsvc(NS, "web").await.expect("web");
        assert!(stamped(&now), "current when written: {now}");
        assert_eq!(
            now["metadata"]["resourceVersion"],
            ds["metadata"]["resourceVersion"]
        );
        let at = |w: &Value| w["timeNanos"].as_u64().expect("timeNanos");
        latencies_ms.push(at(ours[0]).saturating_sub(at(source[0])) as f64 / 1e6);
    }
    ctl.stop().await;
    println!(
        "{}: {} changes, 1 write each, current when written; slice write -> current object: {latencies_ms:.1?} ms",
        backend.name(),
        latencies_ms.len()
    );

    // The second-write scheme, on a copy of `web` that no controller owns:
    // written without the stamp, then stamped with the generation each
    // answer reported.
    let api: Api<kube::api::DynamicObject> =
        Api::namespaced_with(env.admin.clone(), NS, &controller_support::dsvc_resource());
    let mut status = ds["status"].clone();
    status.as_object_mut().unwrap().remove("observedGeneration");
    for c in status["conditions"].as_array_mut().unwrap() {
        c.as_object_mut().unwrap().remove("observedGeneration");
    }
    let alt = |status: &Value| {
        json!({"apiVersion": "kubediscovery.io/v1alpha1", "kind": "DiscoveredService",
            "metadata": {"name": "alt", "namespace": NS}, "spec": ds["spec"], "status": status})
    };
    let pp = PatchParams::apply("issue-30-alt").force();
    let mut got = api
        .patch("alt", &pp, &Patch::Apply(alt(&status)))
        .await
        .expect("apply alt");
    let mut rounds = Vec::new();
    for _ in 0..3 {
        let stamp = got.metadata.generation.expect("generation");
        status["observedGeneration"] = json!(stamp);
        got = api
            .patch("alt", &pp, &Patch::Apply(alt(&status)))
            .await
            .expect("stamp alt");
        rounds.push((stamp, got.metadata.generation.expect("generation")));
    }
    println!(
        "{}: second-write scheme, (observedGeneration written, generation after): {rounds:?}",
        backend.name()
    );
    assert!(
        rounds
            .iter()
            .all(|(stamp, generation)| *generation == stamp + 1),
        "each stamping write moves the generation past its stamp: {rounds:?}"
    );
}
