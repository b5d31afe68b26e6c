//! The watch-event lines of the per-event benchmarks (`event`,
//! `decode_memory`): objects as the API server sends them, with
//! managedFields, annotations, ownerReferences and targetRefs.

#![allow(dead_code)]

use kube::core::WatchEvent;
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
pub fn endpoints_line(flip: bool) -> String {
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
    modified(&obj)
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

pub fn slice_line(k: usize, flip: bool) -> String {
    modified(&slice(k, flip))
}

/// The watch line of a `MODIFIED` event, keys in the API server's order:
/// `type` before `object` (Go encodes the struct's fields in order). Not
/// through a `json!` map, which sorts its keys: with `object` first, serde
/// must buffer the whole object (its adjacently tagged `WatchEvent` does not
/// know the variant yet), a cost no real watch pays.
fn modified(obj: &Value) -> String {
    format!(r#"{{"type":"MODIFIED","object":{obj}}}"#)
}

/// What kube-runtime's watcher does with one line (kube-client's
/// `request_events`: `serde_json::from_str::<WatchEvent<K>>`).
pub fn decode<K: serde::de::DeserializeOwned + kube::Resource + Clone>(line: &str) -> K {
    match serde_json::from_str::<WatchEvent<K>>(line).unwrap() {
        WatchEvent::Added(o) | WatchEvent::Modified(o) => o,
        other => panic!("unexpected event {other:?}"),
    }
}
