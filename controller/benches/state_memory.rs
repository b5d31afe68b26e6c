//! What the long-lived per-service and per-slice state holds on the heap at
//! the scale of BENCHMARKS.md (100,000 services; 100,000 EndpointSlices of
//! 10 endpoints, i.e. 1,000,000 endpoints): the index, and the record of
//! what the API server holds of our objects (`write::record`: conditions
//! and generations from the start-up list, then the drift watch's list).
//! Issue 30 asks what each compact representation buys; this gives the
//! bytes to compare.
//!
//! Counted by `stats_alloc` (a counting wrapper of the system allocator):
//! requested bytes and blocks still live once the state is built, plus an
//! estimate of glibc's rounding (~16 bytes a block), which the resident size
//! pays too. Deterministic: a loaded machine changes no figure.
//!
//! Run: `cargo test --locked -p kube-discovery --bench state_memory`
//! (a dev build is enough: allocation sizes do not depend on optimisation).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::alloc::System;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::runtime::watcher::Event;
use kube_discovery::write::drift::{DriftView, Watched};
use kube_discovery_core::crd::{ObjectNaming, desired_object};
use kube_discovery_core::source::filter::NamespaceFilter;
use kube_discovery_core::write_plan::Held;
use kube_discovery_core::write_plan::record::{Listing, Record};
use kube_discovery_core::{
    ConvertOptions, Index, Node, PortMap, ServiceKey, ServiceNodes, SourceKind,
};
use serde_json::json;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Heap that `build`'s result keeps, per item of `n`.
fn kept<T>(what: &str, n: usize, build: impl FnOnce() -> T) {
    let region = Region::new(GLOBAL);
    let held = build();
    let s = region.change();
    // `stats_alloc` adds a growing realloc's difference to
    // `bytes_allocated` (a shrinking one's to `bytes_deallocated`): the live
    // bytes are these two alone.
    let bytes = s.bytes_allocated as f64 - s.bytes_deallocated as f64;
    let blocks = s.allocations as f64 - s.deallocations as f64;
    // glibc: a block of `size` takes `size + 8` rounded up to 16, at
    // least 32; about 16 bytes more than asked on average.
    let malloc = bytes + 16.0 * blocks;
    let n = n as f64;
    println!(
        "| {what} | {:.2} MB | {:.1} | {:.2} | {:.2} MB | {:.1} |",
        bytes / 1e6,
        bytes / n,
        blocks / n,
        malloc / 1e6,
        malloc / n,
    );
    drop(held);
}

const SERVICES: usize = 100_000;
const PER: usize = 10;

fn key(i: usize) -> ServiceKey {
    ServiceKey::new("", "default", format!("svc-{i}"))
}

/// One EndpointSlice of `PER` ready endpoints for service `i` (as the
/// benchmarks' load has them), with the owner reference the EndpointSlice
/// controller sets when `owned`.
fn slice(i: usize, owned: bool) -> EndpointSlice {
    let eps: Vec<_> = (0..PER)
        .map(|j| {
            let n = i * PER + j;
            json!({"addresses": [format!("10.{}.{}.{}", n >> 16 & 255, n >> 8 & 255, n & 255)],
                   "conditions": {"ready": true, "serving": true, "terminating": false}})
        })
        .collect();
    let mut meta = json!({"name": format!("svc-{i}-0"), "namespace": "default",
        "resourceVersion": format!("{}", 1_000_000 + i),
        "labels": {"kubernetes.io/service-name": format!("svc-{i}")}});
    if owned {
        meta["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "Service",
            "name": format!("svc-{i}"), "controller": true,
            "uid": format!("{:08x}-3a5c-4f0e-9d3b-2b8f1c3e4a5f", i)}]);
    }
    serde_json::from_value(
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": meta, "addressType": "IPv4", "endpoints": eps,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}),
    )
    .unwrap()
}

fn index(owned: bool) -> Index {
    let mut idx = Index::new(
        String::new(),
        SourceKind::EndpointSlice,
        ConvertOptions::default(),
        NamespaceFilter::default(),
    );
    for i in 0..SERVICES {
        idx.apply_slice(&slice(i, owned));
    }
    idx
}

fn conditions() -> Vec<Condition> {
    let at = Time(jiff::Timestamp::from_second(1_700_000_000).unwrap());
    let c = |type_: &str, status: &str, reason: &str, message: &str| Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: at.clone(),
        observed_generation: Some(1),
    };
    vec![
        c(
            "Ready",
            "True",
            "AllPortsHaveNodes",
            "10 node(s) on port(s) http",
        ),
        c("Degraded", "False", "NothingSkipped", ""),
    ]
}

fn main() {
    println!(
        "| state (100,000 services) | live heap | bytes/service | blocks/service | with malloc's ~16 B/block | per service |"
    );
    println!("|---|---|---|---|---|---|");
    kept(
        "index, slices without ownerReferences (kd-bench's load)",
        SERVICES,
        || index(false),
    );
    kept(
        "index, slices owned by their Service (EndpointSlice controller)",
        SERVICES,
        || index(true),
    );
    let conds = conditions();
    let listing = || {
        let mut l = Listing::default();
        for i in 0..SERVICES {
            l.ours(("default".to_string(), format!("svc-{i}")), 3);
            l.conditions(&key(i), &conds);
            let held = Held {
                version: format!("{i:016x}"),
                shards: 1,
            };
            l.service(&key(i), &held);
        }
        l
    };
    kept(
        "record after the start-up list (generations, conditions, versions)",
        SERVICES,
        || {
            let mut r = Record::default();
            let ticket = r.list_begins();
            r.listed(ticket, listing());
            r
        },
    );
    let watched = watched_objects();
    kept(
        "record after the start-up list and the drift watch's list",
        SERVICES,
        || {
            let (view, mut feed) = DriftView::new(ObjectNaming::source());
            let mut record = view.record().lock();
            let ticket = record.list_begins();
            record.listed(ticket, listing());
            drop(record);
            feed.apply(&Event::Init);
            for w in &watched {
                feed.apply(&Event::InitApply(w.clone()));
            }
            feed.apply(&Event::InitDone);
            (view, feed)
        },
    );
}

/// Our object of each service as the drift watch decodes it.
fn watched_objects() -> Vec<Watched> {
    (0..SERVICES)
        .map(|i| {
            let mut ports = PortMap::new();
            ports.insert("http".into(), vec![Node::new("10.0.0.1", 80, 50)]);
            let svc = ServiceNodes::new(key(i), SourceKind::EndpointSlice, ports, None);
            let mut o = desired_object(&svc, &ObjectNaming::source());
            o.metadata.resource_version = Some(format!("{}", 2_000_000 + i));
            o.metadata.generation = Some(3);
            Watched::of(&o)
        })
        .collect()
}
