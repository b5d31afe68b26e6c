use super::*;
use crate::source::filter::AnchoredRegex;
use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::{Value, json};

/// A fresh resourceVersion, as the API server assigns one on every write
/// (every object a test builds is a new write unless it sets its own).
fn next_rv() -> String {
    static RV: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1000);
    RV.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        .to_string()
}

fn ep(ns: &str, name: &str, ips: &[&str], extra_meta: Value) -> Endpoints {
    let mut meta = json!({"name": name, "namespace": ns, "resourceVersion": next_rv()});
    if let (Some(m), Some(e)) = (meta.as_object_mut(), extra_meta.as_object()) {
        m.extend(e.clone());
    }
    let addrs: Vec<Value> = ips.iter().map(|ip| json!({"ip": ip})).collect();
    serde_json::from_value(json!({
            "metadata": meta,
            "subsets": [{"addresses": addrs, "notReadyAddresses": [], "ports": [{"name": "http", "port": 80}]}]
        }))
        .unwrap()
}

fn slice(ns: &str, name: &str, svc: Option<&str>, eps: Value) -> EndpointSlice {
    let mut labels =
        json!({"endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io"});
    if let Some(s) = svc {
        labels["kubernetes.io/service-name"] = json!(s);
    }
    serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": ns, "labels": labels, "resourceVersion": next_rv(),
                          "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": svc.unwrap_or(""), "uid": "svc-uid"}]},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 80}],
            "endpoints": eps,
        }))
        .unwrap()
}

/// An index with Service-port aliases on (off by default).
fn idx(source: SourceKind) -> Index {
    Index::new(
        String::new(),
        source,
        ConvertOptions {
            service_port_aliases: true,
            ..ConvertOptions::default()
        },
        NamespaceFilter::All,
    )
}

fn k(ns: &str, name: &str) -> ServiceKey {
    ServiceKey::new("", ns, name)
}

fn hosts(i: &Index, key: &ServiceKey) -> Vec<String> {
    i.get(key).unwrap().ports["http"]
        .iter()
        .map(|n| n.host.to_string())
        .collect()
}

mod endpoints;
mod relist;
mod services;
mod slices;
