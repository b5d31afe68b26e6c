use std::collections::HashMap;

use super::*;
use kube_discovery_core::crd::{Shard, desired_object};
use kube_discovery_core::{Node, PortMap, SourceKind};

fn obj(name: &str, version: &str, shard: Option<(u32, u32)>) -> DiscoveredService {
    let mut ports = PortMap::new();
    ports.insert("http".into(), vec![Node::new("10.0.0.1", 80, 50)]);
    let svc = ServiceNodes::new(
        ServiceKey::new("", "ns", "web"),
        SourceKind::EndpointSlice,
        ports,
        None,
    );
    let mut o = desired_object(&svc, &ObjectNaming::source());
    o.metadata.name = Some(name.into());
    o.spec.version = version.into();
    o.spec.shard = shard.map(|(index, count)| Shard {
        index,
        count,
        versions: Vec::new(),
    });
    o
}

/// Shard 0 of `count` with version `version` and the manifest `manifest`.
fn zero(version: &str, count: u32, manifest: &[&str]) -> DiscoveredService {
    let mut o = obj("web", version, Some((0, count)));
    if let Some(s) = o.spec.shard.as_mut() {
        s.versions = manifest.iter().map(|v| v.to_string()).collect();
    }
    o
}

fn key() -> ServiceKey {
    ServiceKey::new("", "ns", "web")
}

#[test]
fn complete_shards_report_their_version() {
    let v = versions_of(&[
        obj("web.1", "s1", Some((1, 3))),
        zero("v1", 3, &["s0", "s1", "s2"]),
        obj("web.2", "s2", Some((2, 3))),
    ]);
    assert_eq!(v[&key()], ("v1".to_string(), 3));
    let single = versions_of(&[obj("web", "v1", None)]);
    assert_eq!(single[&key()], ("v1".to_string(), 1));
}

#[test]
fn half_written_mixed_or_old_scheme_shards_force_a_rewrite() {
    // A shard missing.
    let v = versions_of(&[
        zero("v2", 3, &["s0", "s1", "s2"]),
        obj("web.1", "s1", Some((1, 3))),
    ]);
    assert_eq!(v[&key()].0, "");
    // Shard 1 not the version shard 0 lists (crash between shards of a rewrite).
    let v = versions_of(&[
        zero("v2", 2, &["s0", "s1"]),
        obj("web.1", "old", Some((1, 2))),
    ]);
    assert_eq!(v[&key()].0, "");
    // Shard 0 missing.
    let v = versions_of(&[obj("web.1", "v1", Some((1, 2)))]);
    assert_eq!(v[&key()], (String::new(), 2));
    // Leftovers of a shrink beyond the count: rewrite, and remember the slots.
    let v = versions_of(&[
        obj("web", "v3", None),
        obj("web.1", "v1", Some((1, 4))),
        obj("web.3", "v1", Some((3, 4))),
    ]);
    assert_eq!(v[&key()], (String::new(), 4));
    // Complete, but written by the old scheme (no manifest, one version
    // on every shard): rewritten once into the new one.
    let v = versions_of(&[
        obj("web", "v1", Some((0, 2))),
        obj("web.1", "v1", Some((1, 2))),
    ]);
    assert_eq!(v[&key()], (String::new(), 2));
}

/// `n` endpoints on 3 ports: over one object's size bound from ~4,000.
fn big(n: usize) -> ServiceNodes {
    let mut ports = PortMap::new();
    for (name, port) in [("http", 8080), ("grpc", 9090), ("metrics", 9100)] {
        let mut nodes: Vec<Node> = (0..n)
            .map(|i| {
                Node::new(
                    format!("10.{}.{}.{}", i / 65536, (i / 256) % 256, i % 256),
                    port,
                    50,
                )
            })
            .collect();
        kube_discovery_core::model::sort_nodes(&mut nodes);
        ports.insert(name.to_string(), nodes);
    }
    ServiceNodes::new(
        ServiceKey::new("", "shop", "big"),
        SourceKind::EndpointSlice,
        ports,
        None,
    )
}

async fn sim_client() -> (kube_sim::Sim, Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let (sim, client) = crate::test_support::sim_client().await;
    Api::<CustomResourceDefinition>::all(client.clone())
        .create(&Default::default(), &kube_discovery_core::crd::definition())
        .await
        .unwrap();
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "shop"}})).unwrap();
    Api::all(client.clone())
        .create(&Default::default(), &ns)
        .await
        .unwrap();
    for _ in 0..100 {
        if Api::<DiscoveredService>::all(client.clone())
            .list(&kube::api::ListParams::default())
            .await
            .is_ok()
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    (sim, client)
}

/// A client for `sim` WITHOUT kube's retry layer: every 429 reaches the
/// caller at once, as it does in production once kube's own retries (15
/// per request, exponential from 5 ms: minutes of consecutive 429s) are
/// used up.
async fn client_without_kube_retries(sim: &kube_sim::Sim) -> Client {
    let kc = kube::config::Kubeconfig::from_yaml(&sim.kubeconfig_yaml(&sim.admin_token())).unwrap();
    let mut cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    cfg.default_retry = false;
    Client::try_from(cfg).unwrap()
}

/// kube-sim's request count of `verb` on DiscoveredServices.
async fn dsvc_requests(client: &Client, verb: &str) -> u64 {
    let req = http::Request::get("/_sim/stats").body(Vec::new()).unwrap();
    let v: serde_json::Value = client.request(req).await.unwrap();
    v["requests"][verb]["discoveredservices"]
        .as_u64()
        .unwrap_or(0)
}

/// The controller's own 429 handling, which kube's retries hide from
/// every e2e test: 429s past kube's retry budget reach the writer, which
/// counts each as `writes_total{result="error_throttled"}`, retries it
/// (once per failure: no tight loop, no give-up) and converges to the
/// desired object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn throttled_writes_past_kubes_retries_are_counted_retried_and_converge() {
    let (sim, admin) = sim_client().await;
    let fail = serde_json::json!({"fail": {"verb": "patch", "resource": "discoveredservices",
            "count": 4, "code": 429, "retryAfterSeconds": 1}});
    let req = http::Request::post("/_sim/faults")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&fail).unwrap())
        .unwrap();
    admin.request_text(req).await.unwrap();
    let patches_before = dsvc_requests(&admin, "patch").await;
    let client = client_without_kube_retries(&sim).await;
    let sink = KubeSink::new(client, ObjectNaming::source());
    let shared = Arc::new(crate::state::ControllerState::new([""]));
    let metrics = crate::serve::metrics::Metrics::default();
    let opts = crate::write::writer::WriterOptions {
        coalesce_window: std::time::Duration::from_millis(10),
        concurrency: 2,
        qps: 0.0,
        retry_min: std::time::Duration::from_millis(20),
        retry_max: std::time::Duration::from_millis(200),
        drift_delay: std::time::Duration::from_secs(60),
        drift_settle: std::time::Duration::from_secs(60),
        ..crate::write::writer::WriterOptions::default()
    };
    let shutdown = tokio_util::sync::CancellationToken::new();
    let (h, task) = crate::write::writer::spawn(
        sink,
        shared.clone(),
        crate::write::writer::Spawn {
            opts,
            metrics: metrics.clone(),
            shutdown: shutdown.clone(),
            ..crate::write::writer::Spawn::default()
        },
    );
    let k = ServiceKey::new("", "shop", "web");
    let mut ports = PortMap::new();
    ports.insert("http".into(), vec![Node::new("10.0.0.1", 80, 50)]);
    let want = ServiceNodes::new(k.clone(), SourceKind::EndpointSlice, ports, None);
    shared.set_desired(&k, Some(want.clone()));
    h.changed(vec![k.clone()], tokio::time::Instant::now());
    h.synced("");
    let mut written = None;
    for _ in 0..200 {
        let objs = list_managed(&admin).await.unwrap();
        if let Some(o) = objs.into_iter().find(|o| o.spec.version == want.version) {
            written = Some(o);
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let written = written.expect("the throttled write converged");
    assert_eq!(written.spec.ports, want.ports);
    // The object is visible as soon as the API server answered; the
    // writer counts the write a moment later, when its task has ended.
    let applied = r#"kube_discovery_writes_total{cluster="",result="applied"} 1"#;
    for _ in 0..40 {
        if crate::serve::metrics::encode(&metrics.registry()).contains(applied) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    let text = crate::serve::metrics::encode(&metrics.registry());
    assert!(
        text.contains(r#"kube_discovery_writes_total{cluster="",result="throttled"} 4"#),
        "{text}"
    );
    assert!(text.contains(applied), "{text}");
    // The four 429s and the one write that got through.
    assert_eq!(dsvc_requests(&admin, "patch").await - patches_before, 5);
    shutdown.cancel();
    task.await.unwrap();
}

/// kube-sim's write log: `verb name` of every DiscoveredService write.
async fn dsvc_writes(client: &Client) -> Vec<String> {
    let req = http::Request::get("/_sim/writes?since=0")
        .body(Vec::new())
        .unwrap();
    let v: serde_json::Value = client.request(req).await.unwrap();
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["resource"] == "discoveredservices")
        .map(|w| {
            format!(
                "{} {}",
                w["verb"].as_str().unwrap(),
                w["name"].as_str().unwrap()
            )
        })
        .collect()
}

/// KubeSink against an in-process kube-sim: a big service becomes shards,
/// `NodesResolver` and `nodes_command`'s lookup read the WHOLE list back,
/// `list_versions` reports it, a shrink deletes the surplus, `delete`
/// removes every shard. The shard count travels as the planner carries
/// it: from the apply's answer or the start-up list into the next
/// write's [`Prior`].
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_service_round_trips_through_the_api_server() {
    let (_sim, client) = sim_client().await;
    let sink = KubeSink::new(client.clone(), ObjectNaming::source());
    let svc = big(6_000);
    let count = sink
        .apply(Arc::new(svc.clone()), Prior::default(), 0)
        .await
        .unwrap();
    let objs = list_managed(&client).await.unwrap();
    assert!(objs.len() >= 2, "{} objects", objs.len());
    assert_eq!(count, u32::try_from(objs.len()).unwrap());
    let manifest = objs
        .iter()
        .find(|o| shard_of(o).0 == 0)
        .and_then(|o| o.spec.shard.as_ref())
        .map(|s| s.versions.clone())
        .unwrap_or_default();
    assert_eq!(manifest.len(), objs.len());
    for o in &objs {
        assert!(serde_json::to_vec(o).unwrap().len() < 3 * 1024 * 1024 / 2);
        // Shard 0: the service's version; the others their own, as listed.
        let (index, _) = shard_of(o);
        if index == 0 {
            assert_eq!(o.spec.version, svc.version);
        } else {
            assert_eq!(o.spec.version, manifest[index as usize]);
        }
        // The status came with the spec: it counts this shard's nodes.
        let st = o.status.as_ref().expect("status written with the spec");
        let nodes: usize = o.spec.ports.values().map(Vec::len).sum();
        assert_eq!(st.node_count, i64::try_from(nodes).unwrap());
        assert_eq!(st.conditions[0].type_, "Ready");
        assert_eq!(st.conditions[0].status, "True");
    }
    // One request per object (spec + status), shard 0 last.
    let w = dsvc_writes(&client).await;
    assert_eq!(w.len(), objs.len(), "{w:?}");
    assert_eq!(w.last().map(String::as_str), Some("create big"), "{w:?}");
    let resolver = kube_discovery_client::NodesResolver::start(client.clone(), None);
    resolver.wait_ready().await;
    for (port, nodes) in &svc.ports {
        let got = resolver.nodes(&format!("shop/big:{port}")).unwrap();
        assert_eq!(got.as_ref(), Some(nodes), "{port}");
    }
    // A fresh sink (a restart) reads the version and the shard count.
    let fresh = KubeSink::new(client.clone(), ObjectNaming::source());
    let versions = fresh.list_versions().await.unwrap();
    let held = Held {
        version: svc.version.clone(),
        shards: count,
    };
    assert_eq!(versions, vec![(svc.key.clone(), held)]);
    let prior = |shards| Prior {
        shards,
        repair: false,
    };
    // Shrink through the fresh sink: one unsharded object remains.
    let small = big(10);
    let before = dsvc_writes(&client).await.len();
    let now = fresh
        .apply(Arc::new(small.clone()), prior(count), 0)
        .await
        .unwrap();
    assert_eq!(now, 1);
    let objs = list_managed(&client).await.unwrap();
    assert_eq!(objs.len(), 1);
    assert_eq!(objs[0].metadata.name.as_deref(), Some("big"));
    assert!(objs[0].spec.shard.is_none());
    assert_eq!(objs[0].spec.ports, small.ports);
    // One apply (it drops `spec.shard`), then one delete per surplus
    // shard (issue 29 item 2: no separate request that unshards first).
    let w = dsvc_writes(&client).await;
    assert_eq!(w.len() - before, 1 + (count as usize - 1), "{w:?}");
    // Grow again, then delete: every shard goes.
    let now = fresh
        .apply(Arc::new(svc.clone()), prior(1), 0)
        .await
        .unwrap();
    assert_eq!(now, count);
    assert_eq!(list_managed(&client).await.unwrap().len(), count as usize);
    fresh
        .delete(svc.key.clone(), prior(count), 0)
        .await
        .unwrap();
    assert!(list_managed(&client).await.unwrap().is_empty());
}

/// Issue 29 item 2, the sink's side: the apply that unshards a service
/// removes `spec.shard` only where our field manager alone owns it. On
/// an object adopted from a version before instances, the legacy
/// manager (`kube-discovery`) co-owns part of it: what it owns stays
/// after the apply and is removed by a merge patch (every node is
/// written by then); when only `index` stays (invalid without `count`:
/// 422), every node is first written as the one shard of one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_field_someone_else_co_owns_goes_after_the_apply_that_unshards() {
    let (_sim, client) = sim_client().await;
    let sink = KubeSink::new(client.clone(), ObjectNaming::source());
    let api: Api<DiscoveredService> = Api::namespaced(client.clone(), "shop");
    let legacy = PatchParams::apply(kube_discovery_core::crd::LEGACY_FIELD_MANAGER);
    let svc = big(6_000);
    let small = big(10);
    for index_only in [false, true] {
        let count = sink
            .apply(Arc::new(svc.clone()), Prior::default(), 0)
            .await
            .unwrap();
        assert!(count > 1);
        let apply = |shard: serde_json::Value| {
            serde_json::json!({
                    "apiVersion": "kubediscovery.io/v1alpha1", "kind": "DiscoveredService",
                    "metadata": {"name": "big", "namespace": "shop"},
                    "spec": {"shard": shard}})
        };
        api.patch(
            "big",
            &legacy,
            &Patch::Apply(apply(serde_json::json!({"index": 0, "count": count}))),
        )
        .await
        .unwrap();
        if index_only {
            api.patch(
                "big",
                &legacy,
                &Patch::Apply(apply(serde_json::json!({"index": 0}))),
            )
            .await
            .unwrap();
        }
        let shrunk = sink
            .apply(
                Arc::new(small.clone()),
                Prior {
                    shards: count,
                    repair: false,
                },
                0,
            )
            .await
            .unwrap();
        assert_eq!(shrunk, 1);
        let objs = list_managed(&client).await.unwrap();
        assert_eq!(objs.len(), 1, "index only: {index_only}");
        let o = &objs[0];
        assert!(o.spec.shard.is_none(), "index only: {index_only}");
        assert_eq!(o.spec.ports, small.ports);
        assert_eq!(
            stamped_generation(o),
            o.metadata.generation,
            "index only: {index_only}"
        );
    }
}

/// Issue 16 item 3, the sink's side: with a fence, an apply or delete
/// while this replica does not lead sends nothing (the API server's
/// write log stays empty) and fails as `Fenced`; leading, it writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_sink_sends_nothing_while_not_leading() {
    use crate::k8s::leader::{Fence, Leadership, publish};
    let (_sim, client) = sim_client().await;
    let (tx, rx) = tokio::sync::watch::channel(Leadership::default());
    let sink = KubeSink::new(client.clone(), ObjectNaming::source()).with_fence(Fence::new(rx));
    let svc = big(10);
    let e = sink
        .apply(Arc::new(svc.clone()), Prior::default(), 0)
        .await
        .unwrap_err();
    assert!(e.is_fenced(), "{e}");
    assert_eq!(e.metric_label(), "fenced");
    let e = sink
        .delete(svc.key.clone(), Prior::default(), 0)
        .await
        .unwrap_err();
    assert!(e.is_fenced(), "{e}");
    assert_eq!(dsvc_writes(&client).await, Vec::<String>::new());
    publish(&tx, true);
    let epoch = tx.borrow().epoch;
    sink.apply(Arc::new(svc.clone()), Prior::default(), epoch)
        .await
        .unwrap();
    assert_eq!(dsvc_writes(&client).await, vec!["create big".to_string()]);
    publish(&tx, false);
    assert!(
        sink.delete(svc.key.clone(), Prior::default(), epoch)
            .await
            .unwrap_err()
            .is_fenced()
    );
    assert_eq!(list_managed(&client).await.unwrap().len(), 1);
}

/// A write is fenced by the epoch the planner decided it in (the
/// action's), not the epoch current when the sink starts it: a write
/// decided in epoch 1 sends nothing once epoch 2 leads (the planner of
/// epoch 2 has not read what the server holds yet).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_decided_in_an_earlier_epoch_sends_nothing() {
    use crate::k8s::leader::{Fence, Leadership};
    let (_sim, client) = sim_client().await;
    let (tx, rx) = tokio::sync::watch::channel(Leadership {
        epoch: 1,
        leading: true,
        until: None,
    });
    let sink = KubeSink::new(client.clone(), ObjectNaming::source()).with_fence(Fence::new(rx));
    let svc = big(10);
    sink.apply(Arc::new(svc.clone()), Prior::default(), 1)
        .await
        .unwrap();
    tx.send_replace(Leadership {
        epoch: 2,
        leading: true,
        until: None,
    });
    let e = sink
        .apply(Arc::new(big(11)), Prior::default(), 1)
        .await
        .unwrap_err();
    assert!(e.is_fenced(), "{e}");
    let e = sink
        .delete(svc.key.clone(), Prior::default(), 1)
        .await
        .unwrap_err();
    assert!(e.is_fenced(), "{e}");
    assert_eq!(dsvc_writes(&client).await, vec!["create big".to_string()]);
    sink.delete(svc.key.clone(), Prior::default(), 2)
        .await
        .unwrap();
    assert!(list_managed(&client).await.unwrap().is_empty());
}

/// The start-up list folds page by page: with one object per page, a
/// sharded service whose objects span pages is still complete, a
/// half-written one is not, and every service is found once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_up_list_folds_pages_into_versions() {
    let (_sim, client) = sim_client().await;
    let sink = KubeSink::new(client.clone(), ObjectNaming::source());
    let sharded = big(6_000);
    sink.apply(Arc::new(sharded.clone()), Prior::default(), 0)
        .await
        .unwrap();
    let mut small = Vec::new();
    for name in ["a", "b", "c"] {
        let mut ports = PortMap::new();
        ports.insert("http".into(), vec![Node::new("10.0.0.1", 80, 50)]);
        let s = ServiceNodes::new(
            ServiceKey::new("", "shop", name),
            SourceKind::EndpointSlice,
            ports,
            None,
        );
        sink.apply(Arc::new(s.clone()), Prior::default(), 0)
            .await
            .unwrap();
        small.push(s);
    }
    let objects = list_managed(&client).await.unwrap().len();
    let shards = objects - small.len();
    assert!(shards >= 2, "{objects} objects");
    let mut pages = 0;
    let mut found = Found::default();
    kube_discovery_client::list::for_each_managed(&client, 1, |listed: Listed<Lean>| {
        if let Listed::Object(lean) = listed {
            pages += 1;
            found.add(&lean.into_inner());
        }
    })
    .await
    .unwrap();
    assert_eq!(pages, objects);
    let got: HashMap<ServiceKey, (String, u32)> = found.versions().collect();
    let mut want = HashMap::from([(
        sharded.key.clone(),
        (sharded.version.clone(), u32::try_from(shards).unwrap()),
    )]);
    for s in &small {
        want.insert(s.key.clone(), (s.version.clone(), 1));
    }
    assert_eq!(got, want);
    // Shard 1 gone (a crash between shards): the service is rewritten.
    Api::<DiscoveredService>::namespaced(client.clone(), "shop")
        .delete("big.1", &DeleteParams::default())
        .await
        .unwrap();
    let fresh = KubeSink::new(client.clone(), ObjectNaming::source());
    let versions: HashMap<ServiceKey, Held> =
        fresh.list_versions().await.unwrap().into_iter().collect();
    assert_eq!(versions.len(), 4);
    assert_eq!(versions[&sharded.key].version, "");
    assert_eq!(
        versions[&sharded.key].shards,
        u32::try_from(shards - 1).unwrap(),
        "slots in use: the highest shard index found + 1"
    );
    assert_eq!(versions[&small[0].key].version, small[0].version);
}
