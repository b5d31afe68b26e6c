//! Criterion benchmark of the whole per-event path of a source watch (issue
//! 19, item 5): one watch-event line as the API server sends it (`{"type":
//! "MODIFIED","object":{...}}`, with managedFields and the fields the
//! endpoints controllers fill) is decoded the way kube-runtime's watcher
//! decodes it (`serde_json::from_str::<WatchEvent<K>>`) into what the watch
//! now uses (`LeanEndpoints` / `LeanEndpointSlice`, which decode only what
//! the conversion reads), and applied to the index, which converts, merges
//! the service's slices and hashes the result.
//!
//! Two objects: a `v1/Endpoints` of 1,000 addresses and a 100-endpoint
//! `EndpointSlice` (one of 10 slices of a 1,000-endpoint service, so the
//! merge covers all 10). Each is measured as `decode` alone and as `event`
//! (decode + apply), so `decode / event` is the decode's share. Side by side,
//! the k8s-openapi path (what the watch decoded before, and still decodes
//! with topology output on): `decode_k8s_openapi` (full decode + the strip of
//! managedFields and annotations) and `event_k8s_openapi` (that, reduced to
//! the lean form by the index, and applied).
//! Consecutive iterations alternate between two versions of the object (one
//! endpoint's readiness flips), so every apply really changes the service.
//!
//! Run: `cargo bench -p kube-discovery --bench event` (results in
//! `target/criterion/`; BENCHMARKS.md has the numbers and the command). The
//! heap each decoded object keeps (what a reflector store would hold) is
//! measured by the `decode_memory` bench next to this one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::hint::black_box;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::ResourceExt;
use kube_discovery_core::source::filter::NamespaceFilter;
use kube_discovery_core::source::lean::{LeanEndpointSlice, LeanEndpoints};
use kube_discovery_core::{ConvertOptions, Index, ServiceKey, SourceKind};
use serde::de::DeserializeOwned;

#[path = "support/lines.rs"]
mod lines;
use lines::{decode, endpoints_line, slice_line};

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

/// The four measurements of one object (see the module docs); `idx` holds
/// the object's service, `lines` are its two versions.
fn group<Lean, Full>(
    c: &mut Criterion,
    name: &str,
    lines: &[String; 2],
    mut idx: Index,
    apply_lean: fn(&mut Index, &Lean) -> Vec<ServiceKey>,
    apply_full: fn(&mut Index, &Full) -> Vec<ServiceKey>,
) where
    Lean: DeserializeOwned + kube::Resource + Clone,
    Full: DeserializeOwned + kube::Resource + Clone,
{
    let mut g = c.benchmark_group(name);
    g.throughput(Throughput::Elements(1));
    // `flip` lives outside the closures: criterion calls each more than
    // once (warm-up, then samples), and the index keeps the last version
    // applied, so the next one must differ.
    let mut flip = false;
    let mut next = || {
        flip = !flip;
        black_box(lines[usize::from(flip)].as_str())
    };
    g.bench_function("decode", |b| b.iter(|| decode::<Lean>(next())));
    g.bench_function("decode_k8s_openapi", |b| {
        b.iter(|| {
            let mut o = decode::<Full>(next());
            strip(&mut o);
            o
        });
    });
    g.bench_function("event", |b| {
        b.iter(|| {
            let changed = apply_lean(&mut idx, &decode(next()));
            assert_eq!(changed.len(), 1);
            changed
        });
    });
    g.bench_function("event_k8s_openapi", |b| {
        b.iter(|| {
            let mut o = decode(next());
            strip(&mut o);
            let changed = apply_full(&mut idx, &o);
            assert_eq!(changed.len(), 1);
            changed
        });
    });
    g.finish();
}

fn bench(c: &mut Criterion) {
    let ep = [endpoints_line(false), endpoints_line(true)];
    let mut idx = index(SourceKind::Endpoints);
    idx.apply_endpoints(&decode::<LeanEndpoints>(&ep[0]));
    group(
        c,
        "event/endpoints_1000",
        &ep,
        idx,
        |i, o: &LeanEndpoints| i.apply_endpoints(o),
        |i, o: &Endpoints| i.apply_endpoints(o),
    );

    let sl = [slice_line(3, false), slice_line(3, true)];
    let mut idx = index(SourceKind::EndpointSlice);
    for k in 0..10 {
        idx.apply_slice(&decode::<LeanEndpointSlice>(&slice_line(k, false)));
    }
    group(
        c,
        "event/slice_100_of_1000_endpoint_service",
        &sl,
        idx,
        |i, o: &LeanEndpointSlice| i.apply_slice(o),
        |i, o: &EndpointSlice| i.apply_slice(o),
    );
    // The lines' sizes, for the report.
    eprintln!(
        "line bytes: endpoints_1000 {}, slice_100 {}; managedFields entries in the line: {}",
        ep[0].len(),
        sl[0].len(),
        decode::<EndpointSlice>(&sl[0]).managed_fields().len()
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
