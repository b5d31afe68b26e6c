//! The synthetic workload: services `svc-<i>` in namespace `default`, each with
//! IPv4 endpoints on one named port `http:8080`, published as one `v1/Endpoints`
//! object per service or as EndpointSlices of at most 100 endpoints
//! (`svc-<i>-<k>`, label `kubernetes.io/service-name`), as the EndpointSlice
//! controller does by default. No Service objects and no ownerReferences are
//! created: the controller does not watch Services, and DiscoveredServices are
//! then written without an ownerReference.
//!
//! Changes are JSON merge patches of the whole endpoint list (lists are
//! replaced by merge patches), or of one annotation for annotation-only edits.

use std::net::Ipv4Addr;

use anyhow::{Context, Result};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// Endpoints per EndpointSlice.
pub const SLICE_SIZE: usize = 100;
/// Namespace of every object.
pub const NAMESPACE: &str = "default";

/// Which source objects are published (and watched).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `discovery.k8s.io/v1` EndpointSlices.
    Slices,
    /// `v1` Endpoints.
    Endpoints,
}

impl Mode {
    /// `slices` / `endpoints`.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Slices => "slices",
            Mode::Endpoints => "endpoints",
        }
    }

    /// The API resource of the source objects.
    pub fn resource(self) -> ApiResource {
        match self {
            Mode::Slices => ApiResource::erase::<EndpointSlice>(&()),
            Mode::Endpoints => ApiResource::erase::<Endpoints>(&()),
        }
    }

    /// Plural resource name in kube-sim's write log.
    pub fn plural(self) -> &'static str {
        match self {
            Mode::Slices => "endpointslices",
            Mode::Endpoints => "endpoints",
        }
    }
}

/// One endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ep {
    /// Address.
    pub ip: Ipv4Addr,
    /// `ready` condition (Endpoints: `addresses` vs `notReadyAddresses`).
    pub ready: bool,
}

/// One service and its endpoints.
#[derive(Debug, Clone)]
pub struct Svc {
    /// Index (name `svc-<i>`).
    pub index: usize,
    /// Endpoints.
    pub eps: Vec<Ep>,
}

/// Service name of index `i`.
pub fn svc_name(i: usize) -> String {
    format!("svc-{i}")
}

/// Name of the source object holding the first endpoints of service `i`.
pub fn first_object_name(mode: Mode, i: usize) -> String {
    match mode {
        Mode::Slices => format!("svc-{i}-0"),
        Mode::Endpoints => svc_name(i),
    }
}

/// `count` services with `per` ready endpoints each; addresses are unique
/// across the whole set.
pub fn services(count: usize, per: usize) -> Vec<Svc> {
    (0..count)
        .map(|i| Svc {
            index: i,
            eps: (0..per)
                .map(|j| Ep {
                    ip: ip_for(i, per, j),
                    ready: true,
                })
                .collect(),
        })
        .collect()
}

fn ip_for(i: usize, per: usize, j: usize) -> Ipv4Addr {
    // 10.0.0.0 + i * per + j: unique while count * per < 2^24 (16.7 M).
    Ipv4Addr::from(0x0A00_0000u32.wrapping_add((i * per + j) as u32))
}

/// A fresh address for endpoint additions during churn (100.64.0.0/10 + n).
pub fn extra_ip(n: u32) -> Ipv4Addr {
    Ipv4Addr::from(0x6440_0000u32.wrapping_add(n))
}

fn ports() -> Value {
    json!([{"name": "http", "port": 8080, "protocol": "TCP"}])
}

/// The content of the source objects of `svc` (name, body without metadata
/// other than name/namespace/labels).
pub fn objects(mode: Mode, svc: &Svc) -> Vec<(String, Value)> {
    let name = svc_name(svc.index);
    match mode {
        Mode::Endpoints => {
            let ready: Vec<Value> = svc
                .eps
                .iter()
                .filter(|e| e.ready)
                .map(|e| json!({"ip": e.ip.to_string()}))
                .collect();
            let not_ready: Vec<Value> = svc
                .eps
                .iter()
                .filter(|e| !e.ready)
                .map(|e| json!({"ip": e.ip.to_string()}))
                .collect();
            let mut subset = json!({"ports": ports()});
            if !ready.is_empty() {
                subset["addresses"] = json!(ready);
            }
            if !not_ready.is_empty() {
                subset["notReadyAddresses"] = json!(not_ready);
            }
            let subsets = if svc.eps.is_empty() {
                json!([])
            } else {
                json!([subset])
            };
            vec![(
                name.clone(),
                json!({"apiVersion": "v1", "kind": "Endpoints",
                       "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": "bench"}},
                       "subsets": subsets}),
            )]
        }
        Mode::Slices => {
            let chunks: Vec<&[Ep]> = if svc.eps.is_empty() {
                vec![&[]]
            } else {
                svc.eps.chunks(SLICE_SIZE).collect()
            };
            chunks
                .into_iter()
                .enumerate()
                .map(|(k, chunk)| {
                    let slice = format!("{name}-{k}");
                    let eps: Vec<Value> = chunk
                        .iter()
                        .map(|e| json!({"addresses": [e.ip.to_string()], "conditions": {"ready": e.ready, "serving": e.ready, "terminating": false}}))
                        .collect();
                    (
                        slice.clone(),
                        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                               "metadata": {"name": slice, "namespace": NAMESPACE,
                                            "labels": {"kubernetes.io/service-name": name, "endpointslice.kubernetes.io/managed-by": "kd-bench"}},
                               "addressType": "IPv4", "endpoints": eps, "ports": ports()}),
                    )
                })
                .collect()
        }
    }
}

/// Creates every source object of `svcs` (POST, `concurrency` at a time).
/// Returns the number of objects created.
pub async fn create_all(
    client: &Client,
    mode: Mode,
    svcs: &[Svc],
    concurrency: usize,
) -> Result<usize> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NAMESPACE, &mode.resource());
    let objs: Vec<(String, Value)> = svcs.iter().flat_map(|s| objects(mode, s)).collect();
    let n = objs.len();
    futures::stream::iter(objs)
        .map(|(name, body)| {
            let api = api.clone();
            async move {
                let obj: DynamicObject =
                    serde_json::from_value(body).with_context(|| format!("object {name}"))?;
                api.create(&PostParams::default(), &obj)
                    .await
                    .with_context(|| format!("creating {} {name}", mode.as_str()))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<()>()
        .await?;
    Ok(n)
}

/// Replaces the endpoint list of the (single) source object of `svc` with a
/// merge patch; returns the resourceVersion of the write.
pub async fn update(client: &Client, mode: Mode, svc: &Svc) -> Result<u64> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NAMESPACE, &mode.resource());
    let (name, mut body) = objects(mode, svc)
        .into_iter()
        .next()
        .context("service without objects")?;
    if let Some(m) = body.as_object_mut() {
        m.remove("metadata");
        m.remove("apiVersion");
        m.remove("kind");
    }
    let obj = api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .with_context(|| format!("patching {name}"))?;
    rv_of(&obj)
}

/// Sets annotation `kd-bench/tick` of the first source object of service `i`.
pub async fn annotate(client: &Client, mode: Mode, i: usize, tick: u64) -> Result<u64> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NAMESPACE, &mode.resource());
    let name = first_object_name(mode, i);
    let body = json!({"metadata": {"annotations": {"kd-bench/tick": tick.to_string()}}});
    let obj = api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&body))
        .await
        .with_context(|| format!("annotating {name}"))?;
    rv_of(&obj)
}

fn rv_of(obj: &DynamicObject) -> Result<u64> {
    obj.metadata
        .resource_version
        .as_deref()
        .and_then(|r| r.parse().ok())
        .context("write answered without a resourceVersion")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_hold_at_most_100_endpoints_and_addresses_are_unique() {
        let svcs = services(3, 250);
        let objs = objects(Mode::Slices, &svcs[1]);
        assert_eq!(objs.len(), 3);
        assert_eq!(objs[2].1["endpoints"].as_array().map(Vec::len), Some(50));
        assert_eq!(
            objs[0].1["metadata"]["labels"]["kubernetes.io/service-name"],
            "svc-1"
        );
        let mut all: Vec<Ipv4Addr> = svcs
            .iter()
            .flat_map(|s| s.eps.iter().map(|e| e.ip))
            .collect();
        all.sort();
        all.dedup();
        assert_eq!(all.len(), 750);
    }

    #[test]
    fn endpoints_split_ready_and_not_ready() {
        let mut s = services(1, 3).remove(0);
        s.eps[1].ready = false;
        let objs = objects(Mode::Endpoints, &s);
        assert_eq!(objs.len(), 1);
        assert_eq!(
            objs[0].1["subsets"][0]["addresses"]
                .as_array()
                .map(Vec::len),
            Some(2)
        );
        assert_eq!(
            objs[0].1["subsets"][0]["notReadyAddresses"][0]["ip"],
            "10.0.0.1"
        );
    }
}
