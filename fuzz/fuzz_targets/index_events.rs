//! The bytes drive a sequence of apply/delete events of small EndpointSlices
//! (a few services, slices, addresses and ports, some invalid) into an
//! `Index`; after every sequence the incremental state must equal a fresh
//! relist (`reset_slices`) of the objects that are still live.
#![no_main]

use std::collections::BTreeMap;

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube_discovery_core::{ConvertOptions, Index, NamespaceFilter, SourceKind};
use libfuzzer_sys::fuzz_target;
use serde_json::json;

const IPS: [&str; 6] = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "fd00::1", "999.0.0.1", ""];
const PORTS: [i64; 5] = [80, 81, 0, 65536, 443];
const NAMES: [&str; 4] = ["http", "https", "", "http"];

fn slice(b: &[u8]) -> EndpointSlice {
    let get = |i: usize| b.get(i).copied().unwrap_or(0) as usize;
    let svc = ["a", "b"][get(1) % 2];
    let name = format!("{svc}-{}", get(2) % 3);
    let eps: Vec<_> = (0..get(3) % 4)
        .map(|k| json!({"addresses": [IPS[get(4 + k) % IPS.len()]], "conditions": {"ready": get(8 + k) % 3 != 0, "serving": true, "terminating": get(8 + k) % 3 == 2}}))
        .collect();
    let ports: Vec<_> = (0..get(12) % 3)
        .map(|k| {
            let n = NAMES[get(13 + k) % NAMES.len()];
            let p = PORTS[get(16 + k) % PORTS.len()];
            if n.is_empty() { json!({"port": p}) } else { json!({"name": n, "port": p}) }
        })
        .collect();
    let kind = ["IPv4", "IPv6", "FQDN"][get(19) % 3];
    let v = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": kind,
        "metadata": {"name": name, "namespace": "ns", "labels": {"kubernetes.io/service-name": svc}},
        "endpoints": eps, "ports": ports});
    serde_json::from_value(v).unwrap_or_default()
}

fn index() -> Index {
    Index::new(String::new(), SourceKind::EndpointSlice, ConvertOptions { drain_terminating: kube_discovery_core::Drain::Fallback, ..ConvertOptions::default() }, NamespaceFilter::default())
}

fuzz_target!(|data: &[u8]| {
    let mut idx = index();
    let mut live: BTreeMap<String, EndpointSlice> = BTreeMap::new();
    for chunk in data.chunks(20) {
        let s = slice(chunk);
        let key = s.metadata.name.clone().unwrap_or_default();
        if chunk[0] % 4 == 0 {
            idx.delete_slice(&s);
            live.remove(&key);
        } else {
            idx.apply_slice(&s);
            live.insert(key, s);
        }
    }
    let mut fresh = index();
    fresh.reset_slices(&live.values().cloned().collect::<Vec<_>>());
    assert_eq!(idx.iter().collect::<Vec<_>>(), fresh.iter().collect::<Vec<_>>(), "incremental != relist");
});
