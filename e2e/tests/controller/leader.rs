//! Controller end to end on both API servers: two replicas with leader election. Both watch and
//! are ready; only the leader writes; when it stops (SIGTERM releases the
//! Lease) the standby takes over and keeps the objects current.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::controller_support;

use controller_support::{Backend, Controller, Env, LIMIT, eventually};
use serde_json::{Value, json};
use testenv::both_backends;

async fn standby(ctl: &Controller) -> Option<bool> {
    let (_, body) = ctl.get("/readyz").await;
    serde_json::from_str::<Value>(&body).ok()?["standby"].as_bool()
}

#[both_backends]
#[tokio::test]
async fn one_leader_writes_and_the_standby_takes_over(backend: Backend) {
    let env = Env::start(backend).await;
    env.namespace("ns").await;
    env.endpoints("ns", "web", &["10.8.0.1"], &[("http", 80)], json!({}))
        .await;
    let cfg = format!(
        "discovery:\n  kubernetes:\n{}kube_discovery:\n  coalesce_window: 20ms\n  leader_election:\n    enabled: true\n    lease_namespace: default\n    lease_name: kd-e2e\n    lease_duration: 2s\n",
        env.service_block(&env.admin_token())
    );
    let a = Controller::start(&env, "a", &cfg, &[]).await;
    let b = Controller::start(&env, "b", &cfg, &[]).await;
    a.wait_ready().await;
    b.wait_ready().await;
    env.wait_nodes("ns", "web", "http", &["10.8.0.1"]).await;
    let a_leads = eventually("exactly one leader", LIMIT, || async {
        match (standby(&a).await?, standby(&b).await?) {
            (false, true) => Some(true),
            (true, false) => Some(false),
            _ => None,
        }
    })
    .await;
    let (leader, follower) = if a_leads { (a, b) } else { (b, a) };
    // Only the leader writes: one change = ONE server-side apply carrying spec
    // and status (the CRD has no status subresource). The standby's log shows
    // no write.
    let before = env.mark().await;
    env.endpoints(
        "ns",
        "web",
        &["10.8.0.3", "10.8.0.4"],
        &[("http", 80)],
        json!({}),
    )
    .await;
    env.wait_nodes("ns", "web", "http", &["10.8.0.3", "10.8.0.4"])
        .await;
    // A later change to another service is a marker: once it is written,
    // every write caused by the first change has happened too.
    env.endpoints("ns", "marker", &["10.8.0.9"], &[("http", 80)], json!({}))
        .await;
    let writes_of = |name: &'static str| {
        let env = &env;
        async move {
            env.dsvc_writes_since(before)
                .await
                .into_iter()
                .filter(|w| w["name"] == name)
                .count()
        }
    };
    eventually("marker written", LIMIT, || async {
        (writes_of("marker").await >= 1).then_some(())
    })
    .await;
    assert_eq!(
        writes_of("web").await,
        1,
        "one change must be one write (spec and status together), by one replica"
    );
    let web = env.dsvc("ns", "web").await.expect("ns/web");
    assert_eq!(web["status"]["nodeCount"], json!(2), "{web}");
    assert!(leader.logs().contains("\"applied\""));
    assert!(
        !follower.logs().contains("\"applied\""),
        "the standby wrote"
    );

    leader.stop().await;
    eventually("the standby becomes leader", LIMIT, || async {
        (standby(&follower).await == Some(false)).then_some(())
    })
    .await;
    env.endpoints(
        "ns",
        "web",
        &["10.8.0.1", "10.8.0.2"],
        &[("http", 80)],
        json!({}),
    )
    .await;
    env.wait_nodes("ns", "web", "http", &["10.8.0.1", "10.8.0.2"])
        .await;
    follower.stop().await;
}
