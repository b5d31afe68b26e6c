//! The controller with Kubernetes' own EndpointSlice (and Endpoints)
//! controller in the loop, on the real API server only: kube-sim runs no
//! Pods and no endpoint controllers.
//!
//! The harness plays kubelet for three fake Nodes ([`testenv::kubelet`]):
//! Pods of a Deployment-like set are created bound to them and their status
//! (podIP, Ready) is written through `pods/status`, so kube-controller-manager
//! builds the Service's EndpointSlices and Endpoints from real Pods. The set
//! is scaled 3 -> 5 -> 0 -> 2, with readiness flips and a terminating Pod, and
//! after every step the DiscoveredService must equal the ready Pod IPs, which
//! must equal what the real EndpointSlices (or Endpoints) carry: the check
//! `e2e/kind/run.sh` makes on kind.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::controller_support;

use std::collections::BTreeSet;

use controller_support::{Backend, Controller, Env, LIMIT, eventually};
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, PostParams};
use serde_json::json;
use testenv::kubelet::FakeKubelet;

const NS: &str = "shop";
const SVC: &str = "web";

/// Which source the controller reads.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Slices,
    Endpoints,
}

/// The ready endpoint IPs the real endpoint controllers published for `shop/web`.
async fn published(env: &Env, mode: Mode) -> BTreeSet<String> {
    match mode {
        Mode::Slices => {
            let api: Api<EndpointSlice> = Api::namespaced(env.admin.clone(), NS);
            let lp = ListParams::default().labels(&format!("kubernetes.io/service-name={SVC}"));
            let mut out = BTreeSet::new();
            for s in api.list(&lp).await.expect("list EndpointSlices").items {
                for ep in s.endpoints {
                    // The API's rule: an absent `ready` means ready.
                    let ready = ep.conditions.and_then(|c| c.ready).unwrap_or(true);
                    if ready {
                        out.extend(ep.addresses);
                    }
                }
            }
            out
        }
        Mode::Endpoints => {
            let api: Api<Endpoints> = Api::namespaced(env.admin.clone(), NS);
            let Some(e) = api.get_opt(SVC).await.expect("get Endpoints") else {
                return BTreeSet::new();
            };
            e.subsets
                .unwrap_or_default()
                .into_iter()
                .flat_map(|s| s.addresses.unwrap_or_default())
                .map(|a| a.ip)
                .collect()
        }
    }
}

/// The DiscoveredService's hosts of port `http` (empty when it has none or does not exist).
async fn discovered(env: &Env) -> BTreeSet<String> {
    env.dsvc(NS, SVC)
        .await
        .and_then(|ds| {
            ds["spec"]["ports"]["http"].as_array().map(|a| {
                a.iter()
                    .filter_map(|n| n["host"].as_str().map(str::to_string))
                    .collect()
            })
        })
        .unwrap_or_default()
}

/// Waits until the ready Pods (the test's own model), the real controllers'
/// output and the DiscoveredService all agree.
async fn converge(env: &Env, mode: Mode, step: &str, ready: &BTreeSet<String>) {
    eventually(
        &format!("{step}: DiscoveredService = published endpoints = ready Pods {ready:?}"),
        LIMIT,
        || async {
            env.assert_alive();
            let (p, d) = (published(env, mode).await, discovered(env).await);
            (p == *ready && d == *ready).then_some(())
        },
    )
    .await;
}

/// One Pod of the set: `web-<i>` on node `n<i % 3>` with IP `10.20.0.<i>`.
fn pod(i: u8) -> (String, String, String) {
    (
        format!("web-{i}"),
        format!("n{}", i % 3),
        format!("10.20.0.{i}"),
    )
}

async fn scale_with_the_real_endpoint_controllers(mode: Mode) {
    let env = Env::start(Backend::Real).await;
    env.namespace(NS).await;
    let kubelet = FakeKubelet::register(env.admin.clone(), &["n0", "n1", "n2"])
        .await
        .expect("fake nodes");
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": SVC, "namespace": NS},
        "spec": {"selector": {"app": SVC},
                 "ports": [{"name": "http", "port": 80, "targetPort": "http"}]},
    }))
    .unwrap();
    Api::<Service>::namespaced(env.admin.clone(), NS)
        .create(&PostParams::default(), &svc)
        .await
        .expect("create Service");
    let extra = if mode == Mode::Slices {
        "    watch_endpoint_slices: true\n"
    } else {
        ""
    };
    let cfg = format!(
        "discovery:\n  kubernetes:\n{}{extra}kube_discovery:\n  coalesce_window: 20ms\n",
        env.service_block(&env.admin_token())
    );
    let ctl = Controller::start(&env, "real-slices", &cfg, &[]).await;
    ctl.wait_ready().await;

    let labels = json!({"app": SVC});
    let mut ready = BTreeSet::new();
    let start = |i: u8| {
        let (name, node, ip) = pod(i);
        let (kubelet, labels) = (&kubelet, labels.clone());
        async move {
            kubelet
                .create_pod(NS, &name, &node, &labels, ("http", 8080))
                .await
                .expect("create Pod");
            kubelet
                .set_status(NS, &name, &ip, true)
                .await
                .expect("Pod status");
            ip
        }
    };

    // 3 Pods.
    for i in 1..=3 {
        ready.insert(start(i).await);
    }
    converge(&env, mode, "3 Pods", &ready).await;
    // The nodes carry the Pods' port (the named targetPort resolved by the controllers).
    let ds = env.dsvc(NS, SVC).await.expect("DiscoveredService");
    assert_eq!(ds["spec"]["ports"]["http"][0]["port"], 8080, "{ds}");

    // 3 -> 5.
    for i in 4..=5 {
        ready.insert(start(i).await);
    }
    converge(&env, mode, "5 Pods", &ready).await;

    // A readiness flip: web-2 not ready, then ready again.
    let (name, _, ip) = pod(2);
    kubelet.set_status(NS, &name, &ip, false).await.unwrap();
    ready.remove(&ip);
    converge(&env, mode, "web-2 not ready", &ready).await;
    kubelet.set_status(NS, &name, &ip, true).await.unwrap();
    ready.insert(ip);
    converge(&env, mode, "web-2 ready again", &ready).await;

    // A terminating Pod (deleted with its grace period, still running): the
    // EndpointSlice controller marks it ready=false/terminating, so it leaves.
    let (name, _, ip) = pod(1);
    kubelet.terminate(NS, &name).await.unwrap();
    ready.remove(&ip);
    converge(&env, mode, "web-1 terminating", &ready).await;
    if mode == Mode::Slices {
        let api: Api<EndpointSlice> = Api::namespaced(env.admin.clone(), NS);
        let lp = ListParams::default().labels(&format!("kubernetes.io/service-name={SVC}"));
        let slices = api.list(&lp).await.unwrap().items;
        let ep = slices
            .iter()
            .flat_map(|s| &s.endpoints)
            .find(|e| e.addresses.contains(&ip))
            .expect("the terminating Pod is still in a slice");
        let c = ep.conditions.clone().unwrap_or_default();
        assert_eq!(
            (c.ready, c.serving, c.terminating),
            (Some(false), Some(true), Some(true)),
            "the real EndpointSlice controller's view of a terminating, still-ready Pod"
        );
    }
    kubelet.finish(NS, &name).await.unwrap();
    converge(&env, mode, "web-1 gone", &ready).await;

    // 5 -> 0: every Pod terminates, then goes.
    for i in 2..=5 {
        let (name, _, _) = pod(i);
        kubelet.terminate(NS, &name).await.unwrap();
    }
    ready.clear();
    converge(&env, mode, "0 ready Pods (terminating)", &ready).await;
    for i in 2..=5 {
        kubelet.finish(NS, &pod(i).0).await.unwrap();
    }
    converge(&env, mode, "0 Pods", &ready).await;

    // 0 -> 2.
    for i in 6..=7 {
        ready.insert(start(i).await);
    }
    converge(&env, mode, "2 new Pods", &ready).await;
    ctl.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_follow_the_real_endpointslice_controller() {
    scale_with_the_real_endpoint_controllers(Mode::Slices).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_follow_the_real_endpoints_controller() {
    scale_with_the_real_endpoint_controllers(Mode::Endpoints).await;
}
