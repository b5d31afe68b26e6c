//! The harness's cluster side ([`testenv::kwok`]): fake Nodes with zones and
//! Pod CIDRs made Ready by kwok; a Deployment rolled out by the real
//! Deployment and ReplicaSet controllers and kube-scheduler; its Pods Ready
//! only once their address answers, and answering with their names; a
//! failing readiness probe; a deleted Pod answering through its grace period
//! and gone (address off `lo`) when kwok removes it at its end.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testenv::real::{ControlPlane, Options};

const NS: &str = "shop";
const LIMIT: Duration = Duration::from_secs(60);
const GRACE_SECONDS: u64 = 4;

use testenv::net::http_get as get;

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn ip_of(a: SocketAddr) -> Ipv4Addr {
    match a.ip() {
        std::net::IpAddr::V4(v4) => v4,
        std::net::IpAddr::V6(_) => unreachable!("Pod addresses are IPv4"),
    }
}

fn ip(p: &Pod) -> Option<Ipv4Addr> {
    p.status.as_ref()?.pod_ip.as_ref()?.parse().ok()
}

/// Polls `f` every 50 ms until it returns `Some`.
async fn eventually<T, F, Fut>(cp: &ControlPlane, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        cp.check_alive().expect("control plane alive");
        if let Some(v) = f().await {
            return v;
        }
        if start.elapsed() > LIMIT {
            let admin = cp.admin_client().await.unwrap();
            let pods = Api::<Pod>::all(admin)
                .list(&ListParams::default())
                .await
                .unwrap();
            let tail = |f: &str| testenv::process::log_tail(&cp.dir().join(f));
            panic!(
                "timed out after {LIMIT:?} waiting for: {what}\nPods: {}\nkwok.log: {}\nkube-scheduler.log: {}",
                serde_json::to_string_pretty(&pods.items).unwrap(),
                tail("kwok.log"),
                tail("kube-scheduler.log")
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The ready Pods of `app=web`, by name.
async fn ready_pods(pods: &Api<Pod>) -> BTreeMap<String, Pod> {
    pods.list(&ListParams::default().labels("app=web"))
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| ready(p) && p.metadata.deletion_timestamp.is_none())
        .map(|p| (p.metadata.name.clone().unwrap(), p))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deployment_runs_on_kwok_nodes_and_its_pods_answer() {
    let t = Instant::now();
    let cp = ControlPlane::start(Options {
        kwok: Some(testenv::kwok::Options {
            ready_delay: Duration::from_millis(300),
            ..Default::default()
        }),
        ..Options::default()
    })
    .await
    .expect("control plane with kwok");
    eprintln!("control plane with kwok ready in {:?}", t.elapsed());
    let kwok = cp.kwok().expect("kwok");
    let admin = cp.admin_client().await.unwrap();

    // Nodes: Ready, zoned, each with its own Pod CIDR inside the cluster's range.
    let nodes = Api::<Node>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items;
    assert_eq!(nodes.len(), 3);
    for (n, want) in nodes.iter().zip(kwok.nodes()) {
        let labels = n.metadata.labels.clone().unwrap_or_default();
        assert_eq!(labels.get("topology.kubernetes.io/zone"), Some(&want.zone));
        assert_eq!(
            n.spec.as_ref().and_then(|s| s.pod_cidr.clone()),
            Some(want.pod_cidr.clone())
        );
        let c = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default();
        assert!(
            c.iter().any(|c| c.type_ == "Ready" && c.status == "True"),
            "{n:?}"
        );
    }
    let zones: std::collections::BTreeSet<_> =
        kwok.nodes().iter().map(|n| n.zone.clone()).collect();
    assert_eq!(zones.len(), 3, "{:?}", kwok.nodes());

    Api::<Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap(),
        )
        .await
        .unwrap();
    let deploy: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": NS},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "terminationGracePeriodSeconds": GRACE_SECONDS,
                    "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10",
                                    "ports": [{"name": "http", "containerPort": 8080}]}],
                },
            },
        },
    }))
    .unwrap();
    let t = Instant::now();
    Api::<Deployment>::namespaced(admin.clone(), NS)
        .create(&PostParams::default(), &deploy)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let running = eventually(&cp, "3 ready Pods of the Deployment", || async {
        let r = ready_pods(&pods).await;
        (r.len() == 3).then_some(r)
    })
    .await;
    eprintln!(
        "Deployment of 3: all Ready {:?} after its create",
        t.elapsed()
    );

    // Every Pod: scheduled on a kwok Node, an address of the cluster's range,
    // Ready only after the harness made it answer, and answering its name.
    let mut addrs = BTreeMap::new();
    for (name, p) in &running {
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap();
        assert!(
            kwok.nodes().iter().any(|n| n.name == node),
            "{name} on {node}"
        );
        let ip = ip(p).unwrap();
        let base: Ipv4Addr = kwok.pod_range().split('/').next().unwrap().parse().unwrap();
        assert_eq!(
            u32::from(ip) & 0xffff_f000,
            u32::from(base),
            "{name}: {ip} outside {}",
            kwok.pod_range()
        );
        let annotations = p.metadata.annotations.clone().unwrap_or_default();
        assert_eq!(
            annotations
                .get(testenv::kwok::LISTENING)
                .map(String::as_str),
            Some("true")
        );
        let addr = SocketAddr::from((ip, 8080));
        assert_eq!(get(addr).await, Ok((200, name.clone())), "{name} at {addr}");
        addrs.insert(name.clone(), addr);
    }
    assert_eq!(
        addrs
            .values()
            .collect::<std::collections::BTreeSet<_>>()
            .len(),
        3
    );

    // A failing readiness probe: not Ready, still answering; then Ready again.
    let (flip, flip_addr) = addrs.iter().next().map(|(n, a)| (n.clone(), *a)).unwrap();
    let annotate =
        |v: Option<&str>| json!({"metadata": {"annotations": {testenv::kwok::READY: v}}});
    pods.patch(
        &flip,
        &PatchParams::default(),
        &Patch::Merge(annotate(Some("false"))),
    )
    .await
    .unwrap();
    eventually(&cp, "the probed Pod not Ready", || async {
        (!ready(&pods.get(&flip).await.unwrap())).then_some(())
    })
    .await;
    assert_eq!(get(flip_addr).await, Ok((200, flip.clone())));
    pods.patch(
        &flip,
        &PatchParams::default(),
        &Patch::Merge(annotate(None)),
    )
    .await
    .unwrap();
    eventually(&cp, "the probed Pod Ready again", || async {
        ready(&pods.get(&flip).await.unwrap()).then_some(())
    })
    .await;

    // Delete one Pod: it answers through its grace period, kwok removes it
    // at the end, and its address stops answering; the ReplicaSet replaces it.
    let (victim, victim_addr) = addrs.iter().last().map(|(n, a)| (n.clone(), *a)).unwrap();
    let t = Instant::now();
    pods.delete(&victim, &DeleteParams::default())
        .await
        .unwrap();
    let p = pods.get(&victim).await.expect("terminating, not gone");
    assert!(p.metadata.deletion_timestamp.is_some());
    assert_eq!(
        get(victim_addr).await,
        Ok((200, victim.clone())),
        "a terminating Pod still answers"
    );
    eventually(&cp, "the deleted Pod gone", || async {
        pods.get_opt(&victim).await.unwrap().is_none().then_some(())
    })
    .await;
    let gone_after = t.elapsed();
    let hits = kwok.hits(&format!("{NS}/{victim}"));
    assert!(
        hits.iter().any(|h| h.elapsed() < gone_after),
        "the Pod server recorded no request to {victim} after its deletion: {hits:?}"
    );
    eprintln!("deleted Pod (grace {GRACE_SECONDS} s) removed by kwok after {gone_after:?}");
    // deletionTimestamp has whole seconds: kwok may act up to 1 s early.
    assert!(
        gone_after >= Duration::from_secs(GRACE_SECONDS - 1),
        "kwok removed the Pod {gone_after:?} after its deletion, before its grace period of {GRACE_SECONDS} s"
    );
    eventually(&cp, "the deleted Pod's address off lo", || async {
        let listed = testenv::net::listed_in_block().unwrap();
        (!listed.contains(&ip_of(victim_addr))).then_some(())
    })
    .await;
    // Refused on this machine (the block is routed unreachable), not sent out.
    let err = get(victim_addr)
        .await
        .expect_err("a removed Pod's address answered");
    assert!(err.contains("No route to host"), "{err}");
    let now = ready_pods(&pods).await;
    assert!(!now.contains_key(&victim));
    let replaced = eventually(
        &cp,
        "3 ready Pods again (the ReplicaSet's replacement)",
        || async {
            let r = ready_pods(&pods).await;
            (r.len() == 3).then_some(r)
        },
    )
    .await;
    for (name, p) in &replaced {
        let addr = SocketAddr::from((ip(p).unwrap(), 8080));
        assert_eq!(get(addr).await, Ok((200, name.clone())), "{name} at {addr}");
    }
    assert_eq!(kwok.answering().len(), 3, "{:?}", kwok.answering());
    drop(cp);
    // The harness took the Pods' addresses off `lo` with the cluster.
    let left: Vec<_> = testenv::net::listed_in_block()
        .unwrap()
        .into_iter()
        .filter(|a| replaced.values().any(|p| ip(p) == Some(*a)))
        .collect();
    assert!(left.is_empty(), "Pod addresses left on lo: {left:?}");
}
