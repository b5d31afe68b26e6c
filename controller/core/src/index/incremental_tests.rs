//! The incremental merge of big Services ([`MergeState`], issue 19 item 2)
//! against the full merge: random slice histories (adds, updates, deletes,
//! the same endpoint in several slices, ready/serving/terminating, port
//! renames, bad data, owners, slices moving between Services) applied to
//! one index event by event, and after every event compared with a fresh
//! index that merged the surviving slices from scratch. A seeded generator
//! keeps failures reproducible (the seed and step are in the message).

use std::collections::BTreeMap;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::{Value, json};

use super::*;
use crate::model::version::BIG_SERVICE_NODES;
use crate::source::convert::Drain;

/// xorshift64*: enough randomness for test data, no dependency.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    pub(super) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub(super) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    pub(super) fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }

    fn cond(&mut self) -> Value {
        match self.below(3) {
            0 => json!(true),
            1 => json!(false),
            _ => Value::Null,
        }
    }
}

/// A random slice `name` of Service `svc`: `endpoints` endpoints over a
/// pool of `hosts` addresses (so slices share endpoints).
pub(super) fn random_slice(
    rng: &mut Rng,
    name: &str,
    svc: &str,
    endpoints: u64,
    hosts: u64,
) -> EndpointSlice {
    let ports = match rng.below(8) {
        0 => json!([{"name": "http", "port": 81}]),
        1 => json!([{"name": "web", "port": 80}]),
        2 => json!([{"port": 80}]),
        3 => json!([{"name": "http", "port": 80}, {"name": "grpc", "port": 9090}]),
        4 => json!([{"name": "http", "port": 80}, {"name": "http", "port": 82}]),
        5 => json!([{"name": "http", "port": 0}, {"name": "alt", "port": 80}]),
        _ => json!([{"name": "http", "port": 80}]),
    };
    let eps: Vec<Value> = (0..rng.below(endpoints + 1))
        .map(|_| {
            let host = rng.below(hosts);
            let addresses = match rng.below(25) {
                0 => json!([]),
                1 => json!(["not-an-ip", format!("10.0.{}.{}", host / 250, host % 250)]),
                _ => json!([format!("10.0.{}.{}", host / 250, host % 250)]),
            };
            let mut conditions = serde_json::Map::new();
            for c in ["ready", "serving", "terminating"] {
                let v = rng.cond();
                if !v.is_null() {
                    conditions.insert(c.to_string(), v);
                }
            }
            json!({"addresses": addresses, "conditions": conditions,
                   "zone": format!("z{}", rng.below(2)), "nodeName": "n1"})
        })
        .collect();
    let mut meta = json!({"name": name, "namespace": "ns",
        "labels": {SERVICE_NAME_LABEL: svc}, "resourceVersion": rng.next().to_string()});
    if rng.one_in(3) {
        meta["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "Service", "name": svc,
            "uid": format!("uid-{}", rng.below(2))}]);
    }
    let address_type = if rng.one_in(40) { "Bogus" } else { "IPv4" };
    serde_json::from_value(json!({"metadata": meta, "addressType": address_type,
        "ports": ports, "endpoints": eps}))
    .unwrap()
}

pub(super) fn index(opts: &ConvertOptions) -> Index {
    Index::new(
        String::new(),
        SourceKind::EndpointSlice,
        opts.clone(),
        NamespaceFilter::All,
    )
}

pub(super) fn weighted(weight: Option<u32>) -> ServiceInfo {
    ServiceInfo {
        ports: Vec::new(),
        export: None,
        weight,
        invalid: Vec::new(),
        external_name: None,
    }
}

/// Everything a reader of the index sees of `keys`.
pub(super) fn seen(i: &Index, keys: &[ServiceKey]) -> String {
    let mut out = String::new();
    for k in keys {
        out.push_str(&format!("{k:?}: {:?}\n", i.get(k)));
    }
    let warnings: Vec<_> = i.warnings().collect();
    out.push_str(&format!(
        "warnings: {warnings:?}\nnodes: {}\n",
        i.node_count()
    ));
    out
}

/// A fresh index ("web" with `weight`) that merged the slices of `live`
/// from scratch.
pub(super) fn fresh_merge(
    opts: &ConvertOptions,
    weight: Option<u32>,
    live: &BTreeMap<String, EndpointSlice>,
) -> Index {
    let mut fresh = index(opts);
    fresh.set_service("ns", "web", Some(weighted(weight)));
    let all: Vec<EndpointSlice> = live.values().cloned().collect();
    fresh.reset_slices(&all);
    fresh
}

/// Runs `steps` random events on one index and checks it against a full
/// merge after each. Returns how many full merges the index did, and the
/// fewest nodes "web" had.
fn history(
    seed: u64,
    opts: &ConvertOptions,
    steps: usize,
    endpoints: u64,
    hosts: u64,
) -> (usize, usize) {
    let mut rng = Rng(seed);
    let mut live: BTreeMap<String, EndpointSlice> = BTreeMap::new();
    let mut i = index(opts);
    let weight = rng.one_in(2).then_some(7);
    i.set_service("ns", "web", Some(weighted(weight)));
    let keys = [
        ServiceKey::new("", "ns", "web"),
        ServiceKey::new("", "ns", "api"),
    ];
    let names: Vec<String> = (0..24).map(|n| format!("s{n:02}")).collect();
    // Start big: every name in "web".
    for n in &names[..20] {
        let s = random_slice(&mut rng, n, "web", endpoints, hosts);
        i.apply_slice(&s);
        live.insert(n.clone(), s);
    }
    assert!(
        i.big.contains_key(&keys[0]),
        "seed {seed}: no incremental state"
    );
    i.take_work();
    let mut fewest = usize::MAX;
    // What the runtime's `ControllerState` holds (`Index::get_arc`), taken
    // after most events and sometimes kept over two: the index then patches
    // its spare value, or copies (`BigService::spare`).
    let mut held: Vec<Option<std::sync::Arc<ServiceNodes>>> = Vec::new();
    for step in 0..steps {
        if !rng.one_in(4) {
            held = keys.iter().map(|k| i.get_arc(k)).collect();
        }
        if rng.one_in(5) {
            held.clear();
        }
        let name = &names[rng.below(names.len() as u64) as usize];
        if rng.one_in(6) {
            if let Some(s) = live.remove(name) {
                i.delete_slice(&s);
            }
        } else {
            let svc = if rng.one_in(8) { "api" } else { "web" };
            let s = random_slice(&mut rng, name, svc, endpoints, hosts);
            i.apply_slice(&s);
            live.insert(name.clone(), s);
        }
        assert_eq!(
            seen(&i, &keys),
            seen(&fresh_merge(opts, weight, &live), &keys),
            "seed {seed}, step {step}, opts {opts:?}"
        );
        fewest = fewest.min(i.get(&keys[0]).map_or(0, ServiceNodes::node_count));
        // The buckets kept per node are those of the nodes.
        for k in &keys {
            if let Some(svc) = i.get(k)
                && let Some(b) = &svc.buckets.0
            {
                assert_eq!(**b, Buckets::of(&svc.ports), "seed {seed}, step {step}");
            }
        }
    }
    drop(held);
    (i.take_work().merged, fewest)
}

pub(super) fn all_options() -> Vec<ConvertOptions> {
    let mut out = Vec::new();
    for drain in [Drain::Off, Drain::Fallback, Drain::Always] {
        for (topology, index_port_numbers) in [(false, false), (true, true), (false, true)] {
            out.push(ConvertOptions {
                drain_terminating: drain,
                topology,
                index_port_numbers,
                ..ConvertOptions::default()
            });
        }
    }
    out
}

#[test]
fn incremental_merge_equals_full_merge_over_random_histories() {
    let mut merged = 0;
    let mut steps = 0;
    for (n, opts) in all_options().iter().enumerate() {
        for seed in 1..=4u64 {
            // Few hosts: the same endpoint in several slices is the rule.
            merged += history(seed * 1000 + n as u64, opts, 120, 6, 12).0;
            steps += 120;
        }
    }
    // The path under test ran: most events were incremental (a full merge
    // happens for the small "api" Service and when "web" shrinks).
    assert!(merged * 2 < steps, "{merged} full merges in {steps} events");
}

#[test]
fn incremental_versions_of_big_services_equal_the_full_merge() {
    // Over BIG_SERVICE_NODES nodes: the version comes from the kept digest.
    let opts = ConvertOptions::default();
    let (merged, fewest) = history(77, &opts, 25, 1200, 50_000);
    assert!(merged < 10, "{merged}");
    assert!(fewest >= BIG_SERVICE_NODES, "{fewest}");
}

#[test]
fn one_endpoint_change_touches_no_other_node() {
    // 20 slices of 10: a change of one endpoint's readiness is a patch of
    // one node (not a merge), and back again gives the same value.
    let mut i = index(&ConvertOptions::default());
    let web = ServiceKey::new("", "ns", "web");
    let s = |n: usize, ready_first: bool| {
        let eps: Vec<Value> = (0..10)
            .map(|e| {
                json!({"addresses": [format!("10.1.{n}.{e}")],
                            "conditions": {"ready": e != 0 || ready_first}})
            })
            .collect();
        serde_json::from_value::<EndpointSlice>(json!({
            "metadata": {"name": format!("s{n:02}"), "namespace": "ns",
                         "labels": {SERVICE_NAME_LABEL: "web"}},
            "addressType": "IPv4", "ports": [{"name": "http", "port": 80}], "endpoints": eps}))
        .unwrap()
    };
    for n in 0..20 {
        i.apply_slice(&s(n, true));
    }
    let before = i.get_arc(&web).unwrap();
    i.take_work();
    assert_eq!(i.apply_slice(&s(7, false)), vec![web.clone()]);
    assert_eq!(i.get(&web).unwrap().node_count(), 199);
    assert!(
        !i.get(&web).unwrap().ports["http"]
            .iter()
            .any(|n| n.host == "10.1.7.0")
    );
    assert_eq!(i.apply_slice(&s(7, true)), vec![web.clone()]);
    assert_eq!(i.apply_slice(&s(7, true)), Vec::<ServiceKey>::new());
    assert_eq!(i.take_work().merged, 0);
    assert_eq!(*i.get_arc(&web).unwrap(), *before);
    assert_eq!(i.node_count(), 200);

    // Held the way the runtime holds it: the first change meets a shared
    // value and copies it; once the runtime took the new value, the next
    // change patches the previous allocation (no copy) and publishes the
    // same content a fresh merge gives.
    let ptr = |i: &Index| std::sync::Arc::as_ptr(&i.get_arc(&web).unwrap());
    let mut held = i.get_arc(&web);
    let first = ptr(&i);
    i.apply_slice(&s(3, false));
    let second = ptr(&i);
    assert_ne!(first, second, "a held value is never changed");
    assert_eq!(
        *held.as_ref().unwrap(),
        before,
        "the held value kept its content"
    );
    held = i.get_arc(&web);
    i.apply_slice(&s(4, false));
    assert_eq!(ptr(&i), first, "the previous value took the change");
    assert_eq!(held.as_ref().map(std::sync::Arc::as_ptr), Some(second));
    held = i.get_arc(&web);
    i.apply_slice(&s(3, true));
    assert_eq!(ptr(&i), second);
    let mut fresh = index(&ConvertOptions::default());
    let all: Vec<EndpointSlice> = (0..20).map(|n| s(n, n != 4)).collect();
    fresh.reset_slices(&all);
    assert_eq!(i.get(&web), fresh.get(&web));
    assert_eq!(i.get(&web).unwrap().node_count(), 199);
    // Held over two changes: a copy again, never a held value changed.
    let older = held.take();
    let kept = i.get_arc(&web);
    i.apply_slice(&s(4, true));
    assert_ne!(ptr(&i), std::sync::Arc::as_ptr(kept.as_ref().unwrap()));
    assert_ne!(ptr(&i), std::sync::Arc::as_ptr(older.as_ref().unwrap()));
    assert_eq!(kept.unwrap().node_count(), 199);
    assert_eq!(i.get(&web).unwrap().node_count(), 200);
    // A `Weak` of the previous value (the snapshot builder's cache, which
    // takes an unchanged pointer for unchanged content) keeps it from
    // taking a change: a copy, at another address.
    let weak = std::sync::Arc::downgrade(&i.get_arc(&web).unwrap());
    let held = i.get_arc(&web);
    i.apply_slice(&s(5, false));
    drop(held);
    let held = i.get_arc(&web);
    i.apply_slice(&s(5, true));
    assert_ne!(ptr(&i), weak.as_ptr());
    assert_eq!(weak.upgrade(), None);
    assert_eq!(held.unwrap().node_count(), 199);
    assert_eq!(i.get(&web).unwrap().node_count(), 200);
    assert_eq!(i.take_work().merged, 0);
}
