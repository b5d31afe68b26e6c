//! The controller with Kubernetes' own EndpointSlice (and Endpoints)
//! controller in the loop, on the real API server only: kube-sim runs no
//! Pods and no endpoint controllers.
//!
//! kwok plays kubelet for three fake Nodes in three zones ([`testenv::kwok`]):
//! Pods of a Deployment-like set are created, kube-scheduler binds them, kwok
//! makes them Running with an address of their Node's Pod CIDR and Ready once
//! that address answers, so kube-controller-manager builds the Service's
//! EndpointSlices and Endpoints from real Pods. The set is scaled 3 -> 5 -> 0
//! -> 2, with a readiness flip (a failing probe) and Pods deleted with their
//! grace period (terminating until kwok removes them at its end), and after
//! every step the DiscoveredService must equal the ready Pod IPs, which must
//! equal what the real EndpointSlices (or Endpoints) carry: the check
//! `e2e/kind/run.sh` makes on kind.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::controller_support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use controller_support::{Backend, Controller, Env, LIMIT, Options, eventually};
use k8s_openapi::api::core::v1::{Endpoints, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

const NS: &str = "shop";
const SVC: &str = "web";
/// The Pods' `terminationGracePeriodSeconds`: kwok removes a deleted Pod then.
const GRACE_SECONDS: u64 = 3;

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

/// The name of Pod `i` of the set.
fn pod(i: u8) -> String {
    format!("web-{i}")
}

fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Waits until Pod `name` is Ready (`true`) or not; returns its IP.
async fn wait_ready(env: &Env, name: &str, ready: bool) -> String {
    let pods: Api<Pod> = Api::namespaced(env.admin.clone(), NS);
    eventually(&format!("Pod {name} Ready={ready}"), LIMIT, || async {
        env.assert_alive();
        let p = pods.get(name).await.ok()?;
        let ip = p.status.as_ref()?.pod_ip.clone()?;
        (is_ready(&p) == ready).then_some(ip)
    })
    .await
}

/// Deletes Pod `name` with its grace period: it stays, terminating, until kwok removes it.
async fn terminate(env: &Env, name: &str) -> Instant {
    let pods: Api<Pod> = Api::namespaced(env.admin.clone(), NS);
    pods.delete(name, &DeleteParams::default())
        .await
        .expect("delete Pod");
    Instant::now()
}

/// Waits until kwok removed Pod `name`, which must not be before its grace
/// period (`deletionTimestamp` has whole seconds: up to 1 s early).
async fn wait_gone(env: &Env, name: &str, deleted: Instant) {
    let pods: Api<Pod> = Api::namespaced(env.admin.clone(), NS);
    eventually(&format!("kwok removes Pod {name}"), LIMIT, || async {
        env.assert_alive();
        pods.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await;
    let after = deleted.elapsed();
    assert!(
        after >= Duration::from_secs(GRACE_SECONDS - 1),
        "Pod {name} removed {after:?} after its deletion, before its grace period of {GRACE_SECONDS} s"
    );
}

async fn scale_with_the_real_endpoint_controllers(mode: Mode) {
    let env = Env::start_with(
        Backend::Real,
        Options {
            kwok: Some(testenv::kwok::Options::default()),
            ..Options::default()
        },
    )
    .await;
    env.namespace(NS).await;
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

    let pods: Api<Pod> = Api::namespaced(env.admin.clone(), NS);
    let mut ready = BTreeSet::new();
    let start = |i: u8| {
        let (env, pods) = (&env, pods.clone());
        async move {
            let p: Pod = serde_json::from_value(json!({
                "metadata": {"name": pod(i), "namespace": NS, "labels": {"app": SVC}},
                "spec": {
                    "terminationGracePeriodSeconds": GRACE_SECONDS,
                    "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                                    "ports": [{"name": "http", "containerPort": 8080}]}],
                },
            }))
            .unwrap();
            pods.create(&PostParams::default(), &p)
                .await
                .expect("create Pod");
            wait_ready(env, &pod(i), true).await
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

    // A readiness flip: web-2's probe fails (kwok sets Ready=False), then passes.
    let name = pod(2);
    let probe = |v: Option<&str>| {
        Patch::Merge(json!({"metadata": {"annotations": {testenv::kwok::READY: v}}}))
    };
    pods.patch(&name, &PatchParams::default(), &probe(Some("false")))
        .await
        .unwrap();
    let ip = wait_ready(&env, &name, false).await;
    ready.remove(&ip);
    converge(&env, mode, "web-2 not ready", &ready).await;
    pods.patch(&name, &PatchParams::default(), &probe(None))
        .await
        .unwrap();
    let ip = wait_ready(&env, &name, true).await;
    ready.insert(ip);
    converge(&env, mode, "web-2 ready again", &ready).await;

    // A terminating Pod (deleted with its grace period, still running): the
    // EndpointSlice controller marks it ready=false/terminating, so it leaves.
    let name = pod(1);
    let ip = wait_ready(&env, &name, true).await;
    let deleted = terminate(&env, &name).await;
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
    wait_gone(&env, &name, deleted).await;
    converge(&env, mode, "web-1 gone", &ready).await;

    // 5 -> 0: every Pod terminates, then goes.
    let mut deleted = Vec::new();
    for i in 2..=5 {
        deleted.push((pod(i), terminate(&env, &pod(i)).await));
    }
    ready.clear();
    converge(&env, mode, "0 ready Pods (terminating)", &ready).await;
    for (name, at) in &deleted {
        wait_gone(&env, name, *at).await;
    }
    converge(&env, mode, "0 Pods", &ready).await;

    // 0 -> 2.
    for i in 6..=7 {
        ready.insert(start(i).await);
    }
    converge(&env, mode, "2 new Pods", &ready).await;
    ctl.stop().await;
}

// Real API server only (kube-sim runs no Pods): test names `::real`.
mod slices_follow_the_real_endpointslice_controller {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn real() {
        super::scale_with_the_real_endpoint_controllers(super::Mode::Slices).await;
    }
}

mod endpoints_follow_the_real_endpoints_controller {
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn real() {
        super::scale_with_the_real_endpoint_controllers(super::Mode::Endpoints).await;
    }
}
