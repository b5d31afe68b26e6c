//! Criterion benchmark of the whole per-event path of a source watch (issue
//! 19, item 5): one watch-event line as the API server sends it (`{"type":
//! "MODIFIED","object":{...}}`, with managedFields and the fields the
//! endpoints controllers fill) is decoded the way kube-runtime's watcher
//! decodes it (`serde_json::from_slice::<WatchEvent<K>>`), stripped as
//! `source.rs` strips it (managedFields, annotations), and applied to the
//! index, which converts, merges the service's slices and hashes the result.
//!
//! Two objects: a `v1/Endpoints` of 1,000 addresses and a 100-endpoint
//! `EndpointSlice` (one of 10 slices of a 1,000-endpoint service, so the
//! merge covers all 10). Each is measured as `decode` alone and as `event`
//! (decode + strip + apply), so `decode / event` is the decode's share.
//! Consecutive iterations alternate between two versions of the object (one
//! endpoint's readiness flips), so every apply really changes the service.
//!
//! Run: `cargo bench -p kube-discovery --bench event` (results in
//! `target/criterion/`; BENCHMARKS.md has the numbers and the command).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use kube::core::WatchEvent;
use kube_discovery_core::filter::NamespaceFilter;
use kube_discovery_core::{ConvertOptions, Index, SourceKind};
use serde_json::{Value, json};

fn ip(i: usize) -> String {
    format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255)
}

fn target_ref(i: usize) -> Value {
    json!({"kind": "Pod", "namespace": "shop", "name": format!("web-7d4b9c8f6d-{i:05}"),
           "uid": format!("5f0c7a1e-0000-4000-8000-{i:012}")})
}

fn managed_fields(manager: &str, list: &str) -> Value {
    json!([{"manager": manager, "operation": "Update", "apiVersion": "v1",
            "time": "2026-12-05T10:00:00Z", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {},
                         "f:kubernetes.io/service-name": {}}}, (list): {}}}])
}

/// A `MODIFIED` line of a 1,000-address Endpoints; `flip` makes address 7
/// not ready.
fn endpoints_line(flip: bool) -> Vec<u8> {
    let addr = |i: usize| json!({"ip": ip(i), "nodeName": format!("node-{}", i % 50), "targetRef": target_ref(i)});
    let ready: Vec<Value> = (0..1000).filter(|i| !flip || *i != 7).map(addr).collect();
    let not_ready: Vec<Value> = if flip { vec![addr(7)] } else { vec![] };
    let obj = json!({"apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": "web", "namespace": "shop", "uid": "0a1b2c3d-0000-4000-8000-000000000001",
                     "resourceVersion": if flip { "1001" } else { "1002" },
                     "creationTimestamp": "2026-12-05T10:00:00Z",
                     "labels": {"app": "web"},
                     "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-12-05T10:00:00Z"},
                     "managedFields": managed_fields("kube-controller-manager", "f:subsets")},
        "subsets": [{"addresses": ready, "notReadyAddresses": not_ready,
                     "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}]});
    serde_json::to_vec(&json!({"type": "MODIFIED", "object": obj})).unwrap()
}

fn slice(k: usize, flip: bool) -> Value {
    let eps: Vec<Value> = (k * 100..(k + 1) * 100)
        .map(|i| {
            let ready = !(flip && i == k * 100 + 7);
            json!({"addresses": [ip(i)], "conditions": {"ready": ready, "serving": ready, "terminating": false},
                   "nodeName": format!("node-{}", i % 50), "zone": format!("zone-{}", i % 3),
                   "targetRef": target_ref(i)})
        })
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": format!("web-{k:05}"), "namespace": "shop",
                     "uid": format!("0a1b2c3d-0000-4000-8000-{k:012}"),
                     "resourceVersion": if flip { "2001" } else { "2002" },
                     "generation": 3, "creationTimestamp": "2026-12-05T10:00:00Z",
                     "generateName": "web-",
                     "labels": {"kubernetes.io/service-name": "web", "app": "web",
                                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"},
                     "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-12-05T10:00:00Z"},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "web",
                                          "uid": "0a1b2c3d-0000-4000-8000-000000000001",
                                          "controller": true, "blockOwnerDeletion": true}],
                     "managedFields": managed_fields("kube-controller-manager", "f:endpoints")},
        "addressType": "IPv4",
        "endpoints": eps,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]})
}

fn slice_line(k: usize, flip: bool) -> Vec<u8> {
    serde_json::to_vec(&json!({"type": "MODIFIED", "object": slice(k, flip)})).unwrap()
}

/// What kube-runtime's watcher does with one line, then `source.rs`'s
/// `.modify` (the strip).
fn decode<K: serde::de::DeserializeOwned + kube::Resource + Clone>(line: &[u8]) -> K {
    match serde_json::from_slice::<WatchEvent<K>>(line).unwrap() {
        WatchEvent::Added(o) | WatchEvent::Modified(o) => o,
        other => panic!("unexpected event {other:?}"),
    }
}

fn strip<K: kube::Resource>(o: &mut K) {
    o.managed_fields_mut().clear();
    o.annotations_mut().clear();
}

fn index(kind: SourceKind) -> Index {
    Index::new(
        String::new(),
        kind,
        ConvertOptions::default(),
        NamespaceFilter::default(),
    )
}

fn bench(c: &mut Criterion) {
    let ep = [endpoints_line(false), endpoints_line(true)];
    let mut g = c.benchmark_group("event/endpoints_1000");
    g.throughput(Throughput::Elements(1));
    g.bench_function("decode", |b| {
        let mut flip = false;
        b.iter(|| {
            flip = !flip;
            black_box(decode::<Endpoints>(black_box(&ep[usize::from(flip)])))
        });
    });
    let mut idx = index(SourceKind::Endpoints);
    idx.apply_endpoints(&decode(&ep[0]));
    // Outside the closure: criterion calls it more than once (warm-up, then
    // samples), and the index keeps the last version applied.
    let mut flip = false;
    g.bench_function("event", |b| {
        b.iter(|| {
            flip = !flip;
            let mut o: Endpoints = decode(black_box(&ep[usize::from(flip)]));
            strip(&mut o);
            let changed = idx.apply_endpoints(&o);
            assert_eq!(changed.len(), 1);
            changed
        });
    });
    g.finish();

    let sl = [slice_line(3, false), slice_line(3, true)];
    let mut g = c.benchmark_group("event/slice_100_of_1000_endpoint_service");
    g.throughput(Throughput::Elements(1));
    g.bench_function("decode", |b| {
        let mut flip = false;
        b.iter(|| {
            flip = !flip;
            black_box(decode::<EndpointSlice>(black_box(&sl[usize::from(flip)])))
        });
    });
    let mut idx = index(SourceKind::EndpointSlice);
    for k in 0..10 {
        idx.apply_slice(&decode(&slice_line(k, false)));
    }
    // Outside the closure: criterion calls it more than once (warm-up, then
    // samples), and the index keeps the last version applied.
    let mut flip = false;
    g.bench_function("event", |b| {
        b.iter(|| {
            flip = !flip;
            let mut o: EndpointSlice = decode(black_box(&sl[usize::from(flip)]));
            strip(&mut o);
            let changed = idx.apply_slice(&o);
            assert_eq!(changed.len(), 1);
            changed
        });
    });
    g.finish();
    // The lines' sizes, for the report.
    eprintln!(
        "line bytes: endpoints_1000 {}, slice_100 {}; managedFields and annotations present: {}",
        ep[0].len(),
        sl[0].len(),
        decode::<EndpointSlice>(&sl[0]).managed_fields().len()
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
