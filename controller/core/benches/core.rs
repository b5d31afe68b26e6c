//! Criterion micro-benchmarks of the pure core (issue 6): conversion of a
//! 1,000-endpoint service from `v1/Endpoints` and from 10 merged
//! EndpointSlices of 100, the content hash, the dump JSON (per service, as the
//! dump API encodes it, and a whole 1,000-service document), and the index's
//! incremental path (one slice of a 1,000-endpoint service changes), and
//! one slice change in a 100,000-endpoint service (issue 19 item 2:
//! `big_service/...`), and the ConfigMap snapshot's build after a change
//! (`snapshot/...`).
//!
//! Run: `cargo bench -p kube-discovery-core --bench core` (results in
//! `target/criterion/`). Inputs are built once, outside the timed loops.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube_discovery_core::crd::DesiredObjects;
use kube_discovery_core::source::convert::{from_endpoints, from_slices};
use kube_discovery_core::source::filter::NamespaceFilter;
use kube_discovery_core::write_plan::{ObjName, Prior, ServerFacts, ServerView, object_ops};
use kube_discovery_core::{
    ConvertOptions, Index, PortMap, ServiceNodes, SourceKind, content_version,
};
use serde_json::{Value, json};

const N: usize = 1000;

fn ip(i: usize) -> String {
    format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255)
}

fn ports() -> Value {
    json!([{"name": "http", "port": 8080, "protocol": "TCP"}])
}

fn endpoints(n: usize) -> Endpoints {
    let addrs: Vec<Value> = (0..n)
        .map(|i| json!({"ip": ip(i), "nodeName": format!("node-{}", i % 50)}))
        .collect();
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": "svc", "namespace": "ns"},
        "subsets": [{"addresses": addrs, "ports": ports()}]}))
    .unwrap()
}

fn slice(k: usize, from: usize, to: usize, tweak: bool) -> EndpointSlice {
    let eps: Vec<Value> = (from..to)
        .map(|i| json!({"addresses": [ip(i)], "conditions": {"ready": !(tweak && i == from), "serving": true, "terminating": false}, "nodeName": format!("node-{}", i % 50), "zone": "z1"}))
        .collect();
    serde_json::from_value(json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("svc-{k}"), "namespace": "ns", "labels": {"kubernetes.io/service-name": "svc"}},
        "addressType": "IPv4", "endpoints": eps, "ports": ports()}))
    .unwrap()
}

fn slices(n: usize) -> Vec<EndpointSlice> {
    (0..n.div_ceil(100))
        .map(|k| slice(k, k * 100, ((k + 1) * 100).min(n), false))
        .collect()
}

/// An index (slices mode, default options) holding `sl`.
fn index_of(sl: &[EndpointSlice]) -> Index {
    let mut idx = Index::new(
        String::new(),
        SourceKind::EndpointSlice,
        ConvertOptions::default(),
        NamespaceFilter::default(),
    );
    idx.reset_slices(sl);
    idx
}

fn portmap(n: usize) -> PortMap {
    from_endpoints(&endpoints(n), &ConvertOptions::default()).ports
}

fn bench(c: &mut Criterion) {
    let opts = ConvertOptions::default();
    let ep = endpoints(N);
    let sl = slices(N);
    assert_eq!(from_endpoints(&ep, &opts).ports["http"].len(), N);
    assert_eq!(from_slices(sl.iter(), &opts).ports["http"].len(), N);

    c.bench_function("convert/endpoints_1000", |b| {
        b.iter(|| from_endpoints(black_box(&ep), &opts))
    });
    c.bench_function("convert/slices_10x100_merged", |b| {
        b.iter(|| from_slices(black_box(&sl).iter(), &opts))
    });

    let pm = portmap(N);
    c.bench_function("hash/content_version_1000", |b| {
        b.iter(|| content_version(SourceKind::Endpoints, black_box(&pm)))
    });

    // The dump API encodes each service's port map as a JSON string.
    c.bench_function("dump/service_1000_endpoints", |b| {
        b.iter(|| serde_json::to_string(black_box(&pm)).unwrap())
    });
    let small = portmap(10);
    c.bench_function("dump/document_1000_services_x_10", |b| {
        b.iter(|| {
            let eps: Vec<Value> = (0..1000)
                .map(|i| json!({"name": format!("ns/svc-{i}"), "value": serde_json::to_string(black_box(&small)).unwrap()}))
                .collect();
            serde_json::to_vec(&json!({"endpoints": [{"id": "", "endpoints": eps}], "config": []})).unwrap()
        })
    });

    // Incremental path: one slice of a 1,000-endpoint service changes (one
    // endpoint's ready flag flips back and forth), the service is recomputed
    // and re-hashed.
    let mut idx = index_of(&sl);
    let (a, b2) = (slice(3, 300, 400, true), slice(3, 300, 400, false));
    let mut flip = false;
    c.bench_function("index/apply_slice_of_1000_endpoint_service", |b| {
        b.iter(|| {
            flip = !flip;
            idx.apply_slice(black_box(if flip { &a } else { &b2 }))
        })
    });
}

/// Issue 19 item 2: one slice change in a 100,000-endpoint service (1,000
/// slices of 100), the controller's CPU per change: the index's merge and
/// hash of the service (`index/...`), and what one write of it builds
/// (`write/objects_sent_...`: the lazy `crd::DesiredObjects`, `object_ops`
/// and the two objects it sends, the changed shard and shard 0;
/// `write/desired_objects_...`: every shard object, the eager build that
/// `render` and the drift check still use).
fn big_service(c: &mut Criterion) {
    const BIG: usize = 100_000;
    let mut idx = index_of(&slices(BIG));
    let key = kube_discovery_core::ServiceKey::new("", "ns", "svc");
    assert_eq!(idx.get(&key).unwrap().ports["http"].len(), BIG);
    let (a, b2) = (
        slice(503, 50_300, 50_400, true),
        slice(503, 50_300, 50_400, false),
    );
    let mut flip = false;
    let mut group = c.benchmark_group("big_service");
    group.sample_size(20);
    // The runtime's `ControllerState` holds the service's `Arc` (the same
    // allocation as the index, `Index::get_arc`) while the index applies
    // the next change, so the index copies the value once per change
    // (`Arc::make_mut`); held here the same way.
    group.bench_function("index/apply_slice_of_100000_endpoint_service", |b| {
        b.iter(|| {
            flip = !flip;
            let held = idx.get_arc(&key);
            let changed = idx.apply_slice(black_box(if flip { &a } else { &b2 }));
            (held, changed)
        })
    });
    // The same change when nothing else holds the value (patched in place):
    // what the copy above costs.
    group.bench_function(
        "index/apply_slice_of_100000_endpoint_service_unshared",
        |b| {
            b.iter(|| {
                flip = !flip;
                idx.apply_slice(black_box(if flip { &a } else { &b2 }))
            })
        },
    );
    let svc = idx.get(&key).unwrap().clone();
    let naming = kube_discovery_core::crd::ObjectNaming::source();
    let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::UNIX_EPOCH);
    let objs = kube_discovery_core::crd::desired_objects_at(&svc, &naming, &[], &now);
    assert!(objs.len() >= 8, "{} shards", objs.len());
    group.bench_function("write/desired_objects_of_100000_endpoint_service", |b| {
        b.iter(|| kube_discovery_core::crd::desired_objects_at(black_box(&svc), &naming, &[], &now))
    });
    // What the sink does per write since the objects are lazy: the shard
    // count and versions (`DesiredObjects`), which objects to send
    // (`object_ops` against a server holding the previous state's objects,
    // intact by name and version as the drift view answers for a shard it
    // remembers) and the objects sent, built (its shard and shard 0).
    let states = [&a, &b2].map(|s| {
        idx.apply_slice(s);
        idx.get(&key).unwrap().clone()
    });
    let held = states.each_ref().map(|s| {
        let d = DesiredObjects::new(s, &naming);
        Held(
            (0..d.len())
                .map(|i| (d.name(i).1, d.version(i).to_string()))
                .collect(),
        )
    });
    let prior = Prior {
        shards: DesiredObjects::new(&states[0], &naming).len(),
        repair: false,
    };
    let write = |svc: &ServiceNodes, server: &Held| {
        let desired = DesiredObjects::new(svc, &naming).at(&[], &now);
        let facts = ServerFacts::gather(&key, &naming, Some(&desired), prior, server);
        let plan = object_ops(&key, &naming, Some(&desired), prior, &facts).unwrap();
        desired.build(&plan.applied())
    };
    let sent = write(&states[0], &held[1]);
    assert_eq!(sent.len(), 2, "one change sends its shard and shard 0");
    assert_eq!(kube_discovery_core::crd::shard_of(&sent[1]).0, 0);
    group.bench_function(
        "write/objects_sent_for_one_change_of_100000_endpoint_service",
        |b| {
            b.iter(|| {
                flip = !flip;
                let (now, before) = if flip { (0, 1) } else { (1, 0) };
                write(black_box(&states[now]), &held[before])
            })
        },
    );
    group.finish();
}

/// The API server after a write: `name -> spec.version` of every object.
struct Held(std::collections::HashMap<String, String>);

impl ServerView for Held {
    fn intact(&self, desired: &DesiredObjects<'_>, index: u32) -> bool {
        self.0.get(&desired.name(index).1).map(String::as_str) == Some(desired.version(index))
    }
    fn taken(&self, _ns: &str, _name: &str) -> Option<kube_discovery_core::crd::Owner> {
        None
    }
    fn objects_of(&self, _key: &kube_discovery_core::ServiceKey) -> Vec<ObjName> {
        Vec::new()
    }
}

/// Issue 19 item 2, the ConfigMap snapshot: the snapshot sink's `Build`
/// after one change, incremental (`dump::Builder`, what the sink runs),
/// and from scratch, `dump::build` of the whole state at the default
/// 900 KiB budget (every shard's text, the index, the version), for a
/// 100,000-endpoint service and for 10,000 services of 10. The planner then
/// sends the one changed shard and the index.
fn snapshot_build(c: &mut Criterion) {
    use kube_discovery_core::crd::shards::Buckets;
    use kube_discovery_core::model::sort_nodes;
    use kube_discovery_core::snapshot::{Builder, DEFAULT_MAX_SHARD_BYTES, Dump, build};
    use kube_discovery_core::{ServiceKey, ServiceNodes};
    use std::sync::Arc;
    let mut big = portmap(100_000);
    big.values_mut().for_each(|l| sort_nodes(l));
    let mut one = Dump::with_clusters([""]);
    one.insert(&kube_discovery_core::ServiceKey::new("", "ns", "svc"), big);
    let mut many = Dump::with_clusters([""]);
    let small = portmap(10);
    for i in 0..10_000 {
        let key = kube_discovery_core::ServiceKey::new("", "ns", format!("svc-{i:05}"));
        many.insert(&key, small.clone());
    }
    let mut group = c.benchmark_group("snapshot");
    group.sample_size(10);
    for (name, d) in [
        ("build_100000_endpoint_service", &one),
        ("build_10000_services_x_10", &many),
    ] {
        let l = build(d, "snap", DEFAULT_MAX_SHARD_BYTES).unwrap();
        assert!(l.shards.len() >= 2, "{name}: {} shards", l.shards.len());
        group.bench_function(name, |b| {
            b.iter(|| build(black_box(d), "snap", DEFAULT_MAX_SHARD_BYTES).unwrap())
        });
    }
    // What the sink runs: `dump::Builder` after one change. Two values of
    // the changed service (one endpoint's weight apart) alternate, so every
    // build meets a changed service and rebuilds what that costs; the
    // others are the same `Arc`s, as in the controller's state.
    for (name, d, at) in [
        ("one_change_incremental_100000_endpoint_service", &one, 0),
        ("one_change_incremental_10000_services_x_10", &many, 5_000),
    ] {
        // A big service carries the buckets the index keeps for it (a
        // service of 16+ slices), updated per changed node as the index
        // does; small services carry none, as in the index.
        let with = |key: ServiceKey, ports: PortMap, b: Option<Buckets>| {
            Arc::new(ServiceNodes::with_buckets(
                key,
                SourceKind::EndpointSlice,
                ports,
                None,
                Default::default(),
                Vec::new(),
                b,
            ))
        };
        let mut state: Vec<Arc<ServiceNodes>> = Vec::new();
        for (id, services) in &d.clusters {
            for ((ns, n), ports) in services {
                let key = ServiceKey::new(id.as_str(), ns.as_str(), n.as_str());
                let b = (ports.values().map(Vec::len).sum::<usize>() >= 4096)
                    .then(|| Buckets::of(ports));
                state.push(with(key, ports.clone(), b));
            }
        }
        let a = state[at].clone();
        let mut ports = a.ports.clone();
        let mut buckets = a.buckets.0.as_deref().cloned();
        if let Some((port, list)) = ports.iter_mut().find(|(_, l)| !l.is_empty()) {
            let mid = list.len() / 2;
            let old = list[mid].clone();
            list[mid].weight += 1;
            if let Some(b) = buckets.as_mut() {
                b.remove(port, &old);
                b.add(port, &list[mid]);
            }
        }
        let b2 = with(a.key.clone(), ports, buckets);
        let mut builder = Builder::new("snap", DEFAULT_MAX_SHARD_BYTES).unwrap();
        let first = builder.build([""], &state).unwrap();
        assert_eq!(first, build(d, "snap", DEFAULT_MAX_SHARD_BYTES).unwrap());
        let mut flip = false;
        group.bench_function(name, |b| {
            b.iter(|| {
                flip = !flip;
                state[at] = if flip { b2.clone() } else { a.clone() };
                builder.build([""], black_box(&state)).unwrap()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench, big_service, snapshot_build);
criterion_main!(benches);
