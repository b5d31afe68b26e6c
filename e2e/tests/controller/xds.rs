//! The xDS server end to end on both API servers, driven by a scriptable ADS
//! client (`testenv::ads`): what a client is sent, and what it is NOT sent.
//! * SotW: wildcard CDS, then EDS by name; an ACK gets no answer; an
//!   endpoint change is one EDS push (no CDS push: the cluster is the same);
//!   a removed service leaves the next CDS set.
//! * delta: a client that reconnects with `initial_resource_versions` is
//!   sent only what changed while it was away.
//! * two replicas answer the same versions; a missing or wrong token gets
//!   UNAUTHENTICATED.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::Duration;

use crate::controller_support;

use controller_support::{Backend, Controller, Env};
use serde_json::json;
use testenv::ads::{self, CDS, EDS, Ep};
use testenv::both_backends;

const TOKEN: &str = "xds-e2e-token";
const WAIT: Duration = Duration::from_secs(10);
/// How long a test waits to be sure nothing more is sent.
const QUIET: Duration = Duration::from_millis(700);

fn config(env: &Env) -> String {
    let token = env.path("xds-token");
    std::fs::write(&token, format!("{TOKEN}\n")).unwrap();
    format!(
        "discovery:\n  kubernetes:\n{}kube_discovery:\n  coalesce_window: 20ms\n  xds:\n    addr: 127.0.0.1:0\n    auth_token_file: {}\n",
        env.service_block(&env.admin_token()),
        token.display()
    )
}

fn eps(addrs: &[&str]) -> Vec<Ep> {
    let mut v: Vec<Ep> = addrs
        .iter()
        .map(|a| Ep {
            addr: a.to_string(),
            weight: 50,
            draining: false,
            zone: String::new(),
        })
        .collect();
    v.sort();
    v
}

#[both_backends]
#[tokio::test]
async fn sotw_sends_clusters_then_assignments_and_only_what_changed(backend: Backend) {
    let env = Env::start(backend).await;
    env.namespace("ns").await;
    env.endpoints(
        "ns",
        "web",
        &["10.3.0.1", "10.3.0.2"],
        &[("http", 80)],
        json!({}),
    )
    .await;
    env.endpoints("ns", "api", &["10.3.0.9"], &[("grpc", 9000)], json!({}))
        .await;
    let ctl = Controller::start(&env, "xds", &config(&env), &[]).await;
    let ch = ads::channel(ctl.xds_addr().await).await.unwrap();
    let mut c = ads::Sotw::open(ch, Some(TOKEN), "envoy-1").await.unwrap();

    // Wildcard CDS: both services' ports, answered once the first list is in.
    c.send(CDS, &[], "", "", None).await;
    let cds = c.recv(WAIT).await.unwrap().expect("a CDS response");
    let mut names: Vec<String> = cds
        .resources
        .iter()
        .map(|r| ads::cluster_name(&r.value))
        .collect();
    names.sort();
    assert_eq!(names, ["ns/api:grpc", "ns/web:http"]);
    c.ack(&cds, &[]).await;

    // EDS by name: the ready endpoints, weight 50 (default_weight).
    c.send(EDS, &["ns/web:http"], "", "", None).await;
    let eds = c.recv(WAIT).await.unwrap().expect("an EDS response");
    assert_eq!(eds.resources.len(), 1);
    assert_eq!(
        ads::assignment(&eds.resources[0].value),
        (
            "ns/web:http".to_string(),
            eps(&["10.3.0.1:80", "10.3.0.2:80"])
        )
    );
    c.ack(&eds, &["ns/web:http"]).await;
    // An ACK is not answered, and nothing flows while nothing changes.
    assert_eq!(
        c.recv(QUIET).await.unwrap(),
        None,
        "a response to an ACK or while idle"
    );

    // One endpoint more: one EDS push, no CDS push (the cluster is unchanged).
    env.endpoints(
        "ns",
        "web",
        &["10.3.0.1", "10.3.0.2", "10.3.0.3"],
        &[("http", 80)],
        json!({}),
    )
    .await;
    let eds2 = c.recv(WAIT).await.unwrap().expect("an EDS push");
    assert_eq!(eds2.type_url, EDS);
    assert_eq!(
        ads::assignment(&eds2.resources[0].value).1,
        eps(&["10.3.0.1:80", "10.3.0.2:80", "10.3.0.3:80"])
    );
    assert_ne!(eds2.version_info, eds.version_info);
    c.ack(&eds2, &["ns/web:http"]).await;
    assert_eq!(
        c.recv(QUIET).await.unwrap(),
        None,
        "a push of an unchanged cluster"
    );

    // A service that is not subscribed by name changes: no EDS push; the
    // cluster set is the same: no CDS push.
    env.endpoints("ns", "api", &["10.3.0.8"], &[("grpc", 9000)], json!({}))
        .await;
    assert_eq!(
        c.recv(QUIET).await.unwrap(),
        None,
        "a push of an unsubscribed assignment"
    );

    // The service goes: the next CDS set leaves it out.
    env.delete_endpoints("ns", "api").await;
    let cds2 = c.recv(WAIT).await.unwrap().expect("a CDS push");
    assert_eq!(cds2.type_url, CDS);
    let names: Vec<String> = cds2
        .resources
        .iter()
        .map(|r| ads::cluster_name(&r.value))
        .collect();
    assert_eq!(names, ["ns/web:http"]);
    ctl.stop().await;
}

#[both_backends]
#[tokio::test]
async fn delta_reconnect_with_initial_versions_is_sent_only_what_changed(backend: Backend) {
    let env = Env::start(backend).await;
    env.namespace("ns").await;
    for (name, ip) in [("a", "10.3.1.1"), ("b", "10.3.1.2"), ("c", "10.3.1.3")] {
        env.endpoints("ns", name, &[ip], &[("http", 80)], json!({}))
            .await;
    }
    let ctl = Controller::start(&env, "xds-delta", &config(&env), &[]).await;
    let addr = ctl.xds_addr().await;
    let names = ["ns/a:http", "ns/b:http", "ns/c:http"];

    let mut c = ads::Delta::open(ads::channel(addr).await.unwrap(), Some(TOKEN), "envoy-d")
        .await
        .unwrap();
    c.send(EDS, &names, &[], &BTreeMap::new(), "", None).await;
    let r = c.recv(WAIT).await.unwrap().expect("a delta EDS response");
    let held: BTreeMap<String, String> = r
        .resources
        .iter()
        .map(|x| (x.name.clone(), x.version.clone()))
        .collect();
    assert_eq!(
        held.keys().collect::<Vec<_>>(),
        names.iter().collect::<Vec<_>>()
    );
    c.ack(&r).await;
    assert!(
        c.recv(QUIET).await.unwrap().is_none(),
        "an answer to an ACK"
    );
    drop(c);

    // While the client is away: b changes, c goes.
    env.endpoints("ns", "b", &["10.3.1.20"], &[("http", 80)], json!({}))
        .await;
    env.delete_endpoints("ns", "c").await;
    let ch = ads::channel(addr).await.unwrap();
    let names_c = names;
    // Wait until the controller has both changes (its nodes API), then reconnect.
    controller_support::eventually(
        "b changed and c gone in the controller",
        controller_support::LIMIT,
        || async {
            let (_, b) = ctl
                .get("/v1/discovery/kubernetes/nodes?service=ns/b:http")
                .await;
            let (code_c, _) = ctl
                .get("/v1/discovery/kubernetes/nodes?service=ns/c:http")
                .await;
            (b.contains("10.3.1.20") && code_c == 404).then_some(())
        },
    )
    .await;
    let mut c = ads::Delta::open(ch, Some(TOKEN), "envoy-d").await.unwrap();
    c.send(EDS, &names_c, &[], &held, "", None).await;
    let r = c
        .recv(WAIT)
        .await
        .unwrap()
        .expect("a delta response after the reconnect");
    let sent: Vec<&str> = r.resources.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(sent, ["ns/b:http"], "only the changed assignment is sent");
    assert_eq!(
        ads::assignment(&r.resources[0].resource.as_ref().unwrap().value).1,
        eps(&["10.3.1.20:80"])
    );
    assert_eq!(r.removed_resources, ["ns/c:http"]);
    c.ack(&r).await;
    assert!(c.recv(QUIET).await.unwrap().is_none());

    // c comes back: the subscription was kept, so it is pushed again.
    env.endpoints("ns", "c", &["10.3.1.30"], &[("http", 80)], json!({}))
        .await;
    let r = c.recv(WAIT).await.unwrap().expect("c pushed again");
    let sent: Vec<&str> = r.resources.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(sent, ["ns/c:http"]);
    ctl.stop().await;
}

#[both_backends]
#[tokio::test]
async fn two_replicas_answer_the_same_versions_and_tokens_are_checked(backend: Backend) {
    let env = Env::start(backend).await;
    env.namespace("ns").await;
    env.endpoints(
        "ns",
        "web",
        &["10.3.2.1", "10.3.2.2"],
        &[("http", 80)],
        json!({}),
    )
    .await;
    let cfg = config(&env).replace(
        "  xds:\n",
        "  leader_election:\n    enabled: true\n    lease_namespace: default\n    lease_name: kd-xds\n    lease_duration: 2s\n  xds:\n",
    );
    let a = Controller::start(&env, "xds-a", &cfg, &[]).await;
    let b = Controller::start(&env, "xds-b", &cfg, &[]).await;
    let mut answers = Vec::new();
    for ctl in [&a, &b] {
        let ch = ads::channel(ctl.xds_addr().await).await.unwrap();
        let mut c = ads::Sotw::open(ch, Some(TOKEN), "envoy").await.unwrap();
        c.send(CDS, &[], "", "", None).await;
        let cds = c.recv(WAIT).await.unwrap().expect("CDS");
        c.send(EDS, &["ns/web:http"], "", "", None).await;
        let eds = c.recv(WAIT).await.unwrap().expect("EDS");
        answers.push((
            cds.version_info,
            eds.version_info,
            cds.resources,
            eds.resources,
        ));
    }
    assert_eq!(answers[0], answers[1], "the replicas answer differently");

    // Tokens: none, or a wrong one, gets UNAUTHENTICATED and nothing else.
    let addr = a.xds_addr().await;
    for token in [None, Some("wrong")] {
        let ch = ads::channel(addr).await.unwrap();
        let err = match ads::Sotw::open(ch, token, "intruder").await {
            Err(e) => e,
            Ok(mut c) => {
                c.send(CDS, &[], "", "", None).await;
                c.recv(WAIT)
                    .await
                    .expect_err("a response without the token")
            }
        };
        assert_eq!(err.code(), tonic::Code::Unauthenticated, "{err:?}");
        assert!(!err.message().contains(TOKEN));
    }
    a.stop().await;
    b.stop().await;
}

#[both_backends]
#[tokio::test]
async fn pushes_are_not_held_by_the_write_coalescing_window(backend: Backend) {
    let env = Env::start(backend).await;
    env.namespace("ns").await;
    env.endpoints("ns", "web", &["10.3.3.1"], &[("http", 80)], json!({}))
        .await;
    let cfg = config(&env).replace("coalesce_window: 20ms", "coalesce_window: 5s");
    let ctl = Controller::start(&env, "xds-window", &cfg, &[]).await;
    env.wait_nodes("ns", "web", "http", &["10.3.3.1"]).await;
    let ch = ads::channel(ctl.xds_addr().await).await.unwrap();
    let mut c = ads::Sotw::open(ch, Some(TOKEN), "envoy-w").await.unwrap();
    c.send(EDS, &["ns/web:http"], "", "", None).await;
    let r = c.recv(WAIT).await.unwrap().expect("EDS");
    c.ack(&r, &["ns/web:http"]).await;
    // Two changes in a row: the object's second write waits for the window
    // (5 s after the first), the xDS push does not.
    env.endpoints("ns", "web", &["10.3.3.2"], &[("http", 80)], json!({}))
        .await;
    env.endpoints("ns", "web", &["10.3.3.3"], &[("http", 80)], json!({}))
        .await;
    let t = std::time::Instant::now();
    loop {
        let r = c.recv(WAIT).await.unwrap().expect("an EDS push");
        c.ack(&r, &["ns/web:http"]).await;
        if ads::assignment(&r.resources[0].value).1 == eps(&["10.3.3.3:80"]) {
            break;
        }
    }
    let pushed = t.elapsed();
    let ds = env.dsvc("ns", "web").await.expect("the object");
    assert_ne!(
        ds["spec"]["ports"]["http"][0]["host"], "10.3.3.3",
        "the object already has the second change: the test shows nothing"
    );
    assert!(pushed < Duration::from_secs(2), "the push took {pushed:?}");
    // The object follows when its window ends.
    env.wait_nodes("ns", "web", "http", &["10.3.3.3"]).await;
    ctl.stop().await;
}

#[both_backends]
#[tokio::test]
async fn a_name_subscribed_before_it_exists_is_pushed_and_a_nack_is_followed_by_the_next_good_update(
    backend: Backend,
) {
    let env = Env::start(backend).await;
    env.namespace("ns").await;
    let ctl = Controller::start(&env, "xds-nack", &config(&env), &[]).await;
    let ch = ads::channel(ctl.xds_addr().await).await.unwrap();
    let mut c = ads::Sotw::open(ch, Some(TOKEN), "envoy-n").await.unwrap();
    let name = ["ns/later:http"];
    c.send(EDS, &name, "", "", None).await;
    // The first request is answered even with nothing to send.
    let first = c.recv(WAIT).await.unwrap().expect("the first answer");
    assert!(first.resources.is_empty());
    c.ack(&first, &name).await;
    env.endpoints("ns", "later", &["10.3.4.1"], &[("http", 80)], json!({}))
        .await;
    let r = c.recv(WAIT).await.unwrap().expect("pushed once it exists");
    assert_eq!(
        ads::assignment(&r.resources[0].value).1,
        eps(&["10.3.4.1:80"])
    );
    // Reject it, twice (Envoy repeats a NACK on reconnect-free retries):
    // nothing is re-sent, the rejection is logged once and counted.
    for _ in 0..2 {
        c.send(
            EDS,
            &name,
            &first.version_info,
            &r.nonce,
            Some("rejected by the test"),
        )
        .await;
    }
    assert_eq!(c.recv(QUIET).await.unwrap(), None, "a NACK was answered");
    // The next change is sent normally and accepted.
    env.endpoints("ns", "later", &["10.3.4.2"], &[("http", 80)], json!({}))
        .await;
    let good = c
        .recv(WAIT)
        .await
        .unwrap()
        .expect("the next update after a NACK");
    assert_eq!(
        ads::assignment(&good.resources[0].value).1,
        eps(&["10.3.4.2:80"])
    );
    c.ack(&good, &name).await;
    let logged = ctl
        .logs()
        .matches("xDS client rejected an update (NACK)")
        .count();
    assert_eq!(logged, 1, "the NACK is logged once");
    assert!(ctl.logs().contains("rejected by the test"));
    let (_, metrics) = ctl.get("/metrics").await;
    assert!(
        metrics.contains("kube_discovery_xds_nacks_total{type=\"eds\"} 2"),
        "{metrics}"
    );
    assert!(
        metrics.contains("kube_discovery_xds_clients{node_id=\"envoy-n\",protocol=\"sotw\"} 1"),
        "{metrics}"
    );
    // The clients API shows the client, its NACKs and the last one's detail.
    let (code, body) = ctl.get("/v1/discovery/kubernetes/xds/clients").await;
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let client = &v["clients"][0];
    assert_eq!(client["nodeId"], "envoy-n", "{body}");
    assert_eq!(client["protocol"], "sotw");
    assert_eq!(client["nacks"], 2);
    assert_eq!(client["lastNack"], "rejected by the test");
    // The client leaves: its series goes.
    drop(c);
    controller_support::eventually(
        "the client's series removed",
        controller_support::LIMIT,
        || async {
            let (_, m) = ctl.get("/metrics").await;
            (!m.contains("node_id=\"envoy-n\"")).then_some(())
        },
    )
    .await;
    ctl.stop().await;
}

#[both_backends]
#[tokio::test]
async fn delta_unsubscribe_stops_pushes_and_a_big_reconnect_request_is_accepted(backend: Backend) {
    let env = Env::start(backend).await;
    env.namespace("ns").await;
    for (name, ip) in [("a", "10.3.5.1"), ("b", "10.3.5.2")] {
        env.endpoints("ns", name, &[ip], &[("http", 80)], json!({}))
            .await;
    }
    let ctl = Controller::start(&env, "xds-unsub", &config(&env), &[]).await;
    let addr = ctl.xds_addr().await;
    let mut c = ads::Delta::open(ads::channel(addr).await.unwrap(), Some(TOKEN), "envoy-u")
        .await
        .unwrap();
    let none = BTreeMap::new();
    c.send(EDS, &["ns/a:http", "ns/b:http"], &[], &none, "", None)
        .await;
    let r = c.recv(WAIT).await.unwrap().expect("both");
    assert_eq!(r.resources.len(), 2);
    c.ack(&r).await;
    c.send(EDS, &[], &["ns/b:http"], &none, "", None).await;
    env.endpoints("ns", "b", &["10.3.5.20"], &[("http", 80)], json!({}))
        .await;
    assert!(
        c.recv(QUIET).await.unwrap().is_none(),
        "an unsubscribed name was pushed"
    );
    env.endpoints("ns", "a", &["10.3.5.10"], &[("http", 80)], json!({}))
        .await;
    let r = c.recv(WAIT).await.unwrap().expect("a still pushed");
    let sent: Vec<&str> = r.resources.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(sent, ["ns/a:http"]);

    // A reconnect that lists 200,000 resources it holds (about 8 MB, more
    // than gRPC's default 4 MiB limit) is accepted and answered.
    let held: BTreeMap<String, String> = (0..200_000)
        .map(|i| {
            (
                format!("ns/gone-{i:06}:http"),
                "0123456789abcdef".to_string(),
            )
        })
        .collect();
    let mut big = ads::Delta::open(ads::channel(addr).await.unwrap(), Some(TOKEN), "envoy-big")
        .await
        .unwrap();
    big.send(EDS, &["ns/a:http"], &[], &held, "", None).await;
    let r = big
        .recv(WAIT)
        .await
        .expect("no error for a big request")
        .expect("an answer");
    assert_eq!(r.resources.len(), 1);
    ctl.stop().await;
}
