//! Envoy 1.40 (a real process, `.tools/bin/envoy`) over xDS from the
//! controller, on both API servers, with the bootstrap README.md shows, run
//! as written (only the addresses, ports and the token replaced):
//! * SotW, clusters over CDS: the gateway scenario of nginx, HAProxy and the
//!   Rust proxy (scale up and down, the only endpoint draining, a rolling
//!   replacement, a move), with the same targets; no update rejected; no
//!   update while idle.
//! * delta, a static EDS cluster (README's second block), two replicas with
//!   leader election: the draining endpoint is `DRAINING` in Envoy's
//!   `/clusters`; the replica Envoy streams from is restarted and the leader
//!   is killed while traffic flows and endpoints change: no request fails.

use crate::controller_support;
use crate::gateway_support;

use std::net::SocketAddr;
use std::time::Duration;

use controller_support::{Backend as ApiBackend, Controller, Env, LIMIT, eventually};
use gateway_support::*;
use serde_json::Value;
use testenv::both_backends;
use testenv::envoy::Envoy;

const TOKEN: &str = "envoy-e2e-token";

/// The fenced YAML block after `marker` in README.md.
fn readme_block(marker: &str) -> String {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let at = readme
        .find(marker)
        .unwrap_or_else(|| panic!("README.md has no {marker}"));
    let rest = &readme[at..];
    let start = rest
        .find("```yaml\n")
        .expect("a yaml block after the marker")
        + 8;
    let end = rest[start..].find("```").expect("the block's end") + start;
    rest[start..end].to_string()
}

/// README's bootstrap with the xDS addresses, a free listener and the token
/// filled in; `delta`: `DELTA_GRPC`; `static_eds`: the second block's static
/// cluster instead of CDS (and the route to it).
fn bootstrap(xds: &[SocketAddr], delta: bool, static_eds: bool) -> String {
    let mut b = readme_block("<!-- envoy-bootstrap:");
    let replace = |b: &mut String, from: &str, to: &str| {
        assert!(
            b.contains(from),
            "README's bootstrap no longer has {from:?}"
        );
        *b = b.replace(from, to);
    };
    replace(&mut b, "XDS_TOKEN", TOKEN);
    let endpoints: String = xds
        .iter()
        .map(|a| {
            format!(
                "        - endpoint:\n            address:\n              socket_address: {{address: {}, port_value: {}}}\n",
                a.ip(),
                a.port()
            )
        })
        .collect();
    replace(
        &mut b,
        "        - endpoint:\n            address:\n              socket_address: {address: kube-discovery-xds.kube-discovery.svc, port_value: 18000}\n",
        &endpoints,
    );
    replace(
        &mut b,
        "{address: 0.0.0.0, port_value: 8080}",
        "{address: 127.0.0.1, port_value: 0}",
    );
    if delta {
        replace(&mut b, "api_type: GRPC ", "api_type: DELTA_GRPC ");
    }
    if static_eds {
        replace(
            &mut b,
            "  cds_config: {ads: {}, resource_api_version: V3}\n",
            "",
        );
        let web = readme_block("<!-- envoy-static-eds:");
        replace(&mut b, "  listeners:\n", &format!("{web}  listeners:\n"));
        replace(
            &mut b,
            "route: {cluster: shop/web:http}",
            "route: {cluster: web}",
        );
    }
    b
}

/// A token file (kept while the returned handle lives) and the
/// `kube_discovery.xds` lines that use it.
fn xds_config() -> (tempfile::NamedTempFile, String) {
    let token = tempfile::NamedTempFile::new().expect("token file");
    std::fs::write(token.path(), TOKEN).expect("write the token");
    let cfg = format!(
        "  xds:\n    addr: 127.0.0.1:0\n    auth_token_file: {}\n",
        token.path().display()
    );
    (token, cfg)
}

/// Envoy's `update_rejected` over every cluster and the ADS stats: 0 means
/// it accepted everything it was sent.
async fn rejected(envoy: &Envoy) -> u64 {
    let stats = envoy.stats("cluster").await;
    stats
        .iter()
        .filter(|(k, _)| k.ends_with("update_rejected"))
        .map(|(_, v)| v)
        .sum()
}

/// The sum of Envoy's xDS update attempts (CDS and EDS).
async fn update_attempts(envoy: &Envoy) -> u64 {
    let stats = envoy.stats("cluster").await;
    stats
        .iter()
        .filter(|(k, _)| k.ends_with("update_attempt"))
        .map(|(_, v)| v)
        .sum()
}

#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn envoy_sotw_cds_follows_scale_rolling_replacement_and_moves(backend: ApiBackend) {
    const NET: u8 = 4;
    let (_token, xds_cfg) = xds_config();
    let (env, ctl, backends, port) = start_world_with(backend, NET, &xds_cfg).await;
    let xds = ctl.xds_addr().await;
    let envoy = Envoy::start(&env.path(""), "envoy", &bootstrap(&[xds], false, false)).await;
    let gw = envoy.listener_addr("ingress").await;
    let report = scenario(&env, gw, NET, backends, port).await;
    report.assert_issue_targets("envoy");
    // Over the whole run, not only the drain and the rolling replacement:
    // Envoy removes a backend before it stops listening, so nothing fails.
    assert_eq!(
        (report.non_2xx, report.conn_errors),
        (0, 0),
        "envoy: failed requests over the whole scenario"
    );
    assert_eq!(rejected(&envoy).await, 0, "Envoy rejected an update");
    // Idle: nothing changes, nothing is sent.
    let before = update_attempts(&envoy).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        update_attempts(&envoy).await,
        before,
        "updates flowed while idle"
    );
    envoy.stop().await;
    ctl.stop().await;
}

/// The controller (of `ctls`) whose xDS clients include Envoy's node.
async fn serving_envoy(ctls: &[Controller]) -> usize {
    eventually("a replica serves Envoy", LIMIT, || async {
        for (i, c) in ctls.iter().enumerate() {
            let (code, body) = c.get("/v1/discovery/kubernetes/xds/clients").await;
            let v: Value = serde_json::from_str(&body).ok()?;
            if code == 200
                && v["clients"]
                    .as_array()
                    .is_some_and(|a| a.iter().any(|c| c["nodeId"] == "gateway-1"))
            {
                return Some(i);
            }
        }
        None
    })
    .await
}

/// Waits until Envoy's cluster `web` holds exactly `want` (`addr`, draining).
async fn wait_envoy(envoy: &Envoy, want: &[(String, bool)]) {
    let mut want = want.to_vec();
    want.sort();
    eventually(
        &format!("Envoy's cluster web = {want:?}"),
        LIMIT,
        || async {
            let clusters = envoy.clusters().await;
            let mut got: Vec<(String, bool)> = clusters
                .get("web")?
                .iter()
                .map(|h| (h.addr(), h.draining()))
                .collect();
            got.sort();
            (got == want).then_some(())
        },
    )
    .await;
}

#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn envoy_delta_static_eds_drains_and_survives_restart_and_failover(backend: ApiBackend) {
    const NET: u8 = 5;
    let env = Env::start(backend).await;
    env.namespace(NS).await;
    let ipn = |i: u8| ip(&env, NET, i);
    let port = free_port(ipn(1).into());
    let mut backends = Vec::new();
    for i in 1..=3u8 {
        backends.push(Backend::start(&format!("b{i}"), (ipn(i), port).into()).await);
    }
    slice(&env, &[ready(ipn(1)), ready(ipn(2)), ready(ipn(3))], port).await;
    let (_token, xds_cfg) = xds_config();
    let cfg = format!(
        "discovery:\n  kubernetes:\n{}    watch_endpoint_slices: true\nkube_discovery:\n  coalesce_window: 20ms\n  drain_terminating: always\n  leader_election:\n    enabled: true\n    lease_namespace: default\n    lease_name: kd-envoy\n    lease_duration: 2s\n{xds_cfg}",
        env.service_block(&env.admin_token())
    );
    // Two fixed xDS addresses (a Service's endpoints): a restarted replica
    // comes back on its own.
    let xds: Vec<SocketAddr> = (0..2)
        .map(|_| {
            let lo = std::net::Ipv4Addr::LOCALHOST;
            SocketAddr::from((lo, free_port(lo.into())))
        })
        .collect();
    let cfg_of = |i: usize| cfg.replace("addr: 127.0.0.1:0", &format!("addr: {}", xds[i]));
    let mut ctls = vec![
        Controller::start(&env, "a", &cfg_of(0), &[]).await,
        Controller::start(&env, "b", &cfg_of(1), &[]).await,
    ];
    let names = ["a", "b"];
    let envoy = Envoy::start(&env.path(""), "envoy", &bootstrap(&xds, true, true)).await;
    let addr = |i: u8| format!("{}:{port}", ipn(i));
    wait_envoy(
        &envoy,
        &[(addr(1), false), (addr(2), false), (addr(3), false)],
    )
    .await;
    let gw = envoy.listener_addr("ingress").await;
    wait_served(gw, "b1").await;
    let load = Load::start(
        gw,
        Duration::from_millis(4),
        60_000,
        Duration::from_secs(120),
    );

    // b1 terminating but serving (`drain_terminating: always` publishes it
    // next to the ready ones, weight 0): DRAINING in Envoy, and no new
    // requests to it while two ready endpoints serve.
    slice(
        &env,
        &[terminating(ipn(1)), ready(ipn(2)), ready(ipn(3))],
        port,
    )
    .await;
    wait_envoy(
        &envoy,
        &[(addr(1), true), (addr(2), false), (addr(3), false)],
    )
    .await;
    let t = tokio::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        backends[0].hits_after(t),
        0,
        "the DRAINING endpoint got new requests"
    );

    // Restart the replica Envoy streams from, while b1 leaves and b4 comes:
    // Envoy reconnects to the other replica and follows.
    let serving = serving_envoy(&ctls).await;
    ctls.remove(serving).stop().await;
    backends.push(Backend::start("b4", (ipn(4), port).into()).await);
    slice(&env, &[ready(ipn(2)), ready(ipn(3)), ready(ipn(4))], port).await;
    wait_envoy(
        &envoy,
        &[(addr(2), false), (addr(3), false), (addr(4), false)],
    )
    .await;
    wait_reached_any(&load, "b4").await;
    let b1 = backends.remove(0);
    b1.stop().await;
    ctls.insert(
        serving,
        Controller::start(&env, &format!("{}2", names[serving]), &cfg_of(serving), &[]).await,
    );

    // Fail the leader over (SIGTERM: it releases the Lease), then change the
    // endpoints again: Envoy follows from whichever replica it streams from.
    let leader = eventually("a leader", LIMIT, || async {
        for (i, c) in ctls.iter().enumerate() {
            let (_, body) = c.get("/readyz").await;
            if serde_json::from_str::<Value>(&body).ok()?["standby"] == false {
                return Some(i);
            }
        }
        None
    })
    .await;
    ctls.remove(leader).stop().await;
    backends.push(Backend::start("b5", (ipn(5), port).into()).await);
    slice(&env, &[ready(ipn(3)), ready(ipn(4)), ready(ipn(5))], port).await;
    wait_envoy(
        &envoy,
        &[(addr(3), false), (addr(4), false), (addr(5), false)],
    )
    .await;
    wait_reached_any(&load, "b5").await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    let samples = load.stop().await;
    let failed: Vec<_> = samples
        .iter()
        .filter(|s| !matches!(s.outcome, Ok((200, _))))
        .collect();
    eprintln!(
        "envoy delta: {} requests, {} failed, over a drain, a replica restart and a leader failover",
        samples.len(),
        failed.len()
    );
    assert!(samples.len() >= 200, "only {} requests", samples.len());
    assert!(
        failed.is_empty(),
        "failed requests: {:?}",
        &failed[..failed.len().min(5)]
    );
    assert_eq!(rejected(&envoy).await, 0, "Envoy rejected an update");
    envoy.stop().await;
    for c in ctls {
        c.stop().await;
    }
    for b in backends {
        b.stop().await;
    }
}

/// Waits until a request through the load answered from `name`.
async fn wait_reached_any(load: &Load, name: &str) {
    eventually(&format!("traffic reaches {name}"), LIMIT, || async {
        load.samples()
            .iter()
            .any(|s| matches!(&s.outcome, Ok((200, b)) if b == name))
            .then_some(())
    })
    .await;
}
