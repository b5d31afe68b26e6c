//! The xDS peers of the harness ([`testenv::envoy`], [`testenv::xds_go`])
//! proven against go-control-plane (`gcp-server`), before kube-discovery
//! serves xDS itself: a real Envoy 1.40 on ADS (state of the world and delta)
//! routes HTTP to the endpoints gcp-server gives it and follows a removal
//! and a DRAINING mark (no more requests to either) and the cluster's
//! deletion, with no update rejected; a proxyless grpc-go client
//! on an `xds:///` target reaches exactly the three backends it is given,
//! then exactly the two left after a scale-down (the third still runs); the
//! bearer token of both reaches gcp-server, a wrong one is refused.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use testenv::envoy::{AdsApi, Bootstrap, Envoy};
use testenv::gateways::eventually;
use testenv::xds_go::{
    Endpoint, GcpServer, GrpcBackend, GrpcClient, grpc_bootstrap, grpc_bootstrap_with_token,
};

const LIMIT: Duration = Duration::from_secs(20);
const CLUSTER: &str = "shop/web:http";

/// An HTTP backend on 127.0.0.1 answering every request with its name.
async fn http_backend(name: &'static str) -> (SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = axum::Router::new().fallback(move || async move { name });
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, task)
}

/// The backend names of `n` requests through `addr` (errors as `error: ...`).
async fn names(addr: SocketAddr, n: usize) -> Vec<String> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(match testenv::net::http_get(addr).await {
            Ok((200, body)) => body,
            Ok((code, body)) => format!("status {code}: {body}"),
            Err(e) => format!("error: {e}"),
        });
    }
    out
}

/// `cds`: the cluster comes over CDS (else it is a static EDS cluster);
/// `token`: gcp-server requires a bearer token, which Envoy sends.
async fn envoy_follows(api: AdsApi, cds: bool, token: bool) {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "s3cret-token\n").unwrap();
    let mut backends = Vec::new();
    for name in ["b0", "b1", "b2"] {
        backends.push(http_backend(name).await.0);
    }
    let mut gcp =
        GcpServer::start_with(dir.path(), "gcp-server", token.then_some(&*token_file)).await;
    let eps = |n: usize| {
        backends[..n]
            .iter()
            .map(|a| Endpoint::new(*a))
            .collect::<Vec<_>>()
    };
    gcp.set(CLUSTER, &eps(3)).await;
    let node = format!("envoy-{}", api.api_type());
    let mut bootstrap = Bootstrap::new(&node, gcp.addr, api, CLUSTER);
    bootstrap.cds = cds;
    bootstrap.token = token.then(|| "s3cret-token".to_string());
    let envoy = Envoy::start(dir.path(), "envoy", &bootstrap.yaml()).await;
    let http = envoy.listener_addr("http").await;

    // The cluster came over CDS, its endpoints over EDS: all three answer.
    let hosts = envoy.clusters().await.remove(CLUSTER).unwrap_or_default();
    let got: BTreeSet<String> = hosts.iter().map(|h| h.addr()).collect();
    let want: BTreeSet<String> = backends.iter().map(ToString::to_string).collect();
    assert_eq!(got, want, "{hosts:?}");
    // An endpoint without health_status shows as HEALTHY.
    assert!(
        hosts
            .iter()
            .all(|h| h.weight == 1 && h.eds_health_status == "HEALTHY"),
        "{hosts:?}"
    );
    let seen: BTreeSet<String> = names(http, 12).await.into_iter().collect();
    assert_eq!(
        seen,
        BTreeSet::from(["b0".into(), "b1".into(), "b2".into()])
    );

    // b2 removed, b1 DRAINING: Envoy shows it and stops sending to b2.
    let mut two = eps(2);
    two[1].health = Some("DRAINING");
    gcp.set(CLUSTER, &two).await;
    let hosts = eventually("envoy drops b2 and marks b1 DRAINING", LIMIT, || async {
        let hosts = envoy.clusters().await.remove(CLUSTER)?;
        (hosts.len() == 2 && hosts.iter().any(|h| h.draining())).then_some(hosts)
    })
    .await;
    let draining: Vec<String> = hosts
        .iter()
        .filter(|h| h.draining())
        .map(|h| h.addr())
        .collect();
    assert_eq!(draining, vec![backends[1].to_string()], "{hosts:?}");
    // Envoy 1.40 sends nothing to a DRAINING host either: only b0 answers
    // (once its worker has the update too).
    eventually("only b0 answers through envoy", LIMIT, || async {
        names(http, 6).await.iter().all(|n| n == "b0").then_some(())
    })
    .await;
    let after = names(http, 12).await;
    assert!(after.iter().all(|n| n == "b0"), "{after:?}");

    // Every update applied, none rejected; gcp-server saw no NACK.
    let stats = envoy.stats("cluster").await;
    let count = |name: &str| {
        *stats
            .get(name)
            .unwrap_or_else(|| panic!("no stat {name}: {stats:?}"))
    };
    if cds {
        assert_eq!(count("cluster_manager.cds.update_rejected"), 0);
        assert!(
            count("cluster_manager.cds.update_success") >= 1,
            "{stats:?}"
        );
    } else {
        assert!(
            !stats.contains_key("cluster_manager.cds.update_success"),
            "{stats:?}"
        );
    }
    let eds = envoy.cluster_stats(CLUSTER).await;
    assert_eq!(eds.get("update_rejected"), Some(&0), "{eds:?}");
    // The first assignment and the change (delta: both; SotW: both too, the
    // set touches only this assignment).
    assert!(eds.get("update_success") >= Some(&2), "{eds:?}");
    assert_eq!(gcp.nacks(), Vec::<String>::new());
    let (sotw, delta) = gcp.streams();
    match api {
        AdsApi::Sotw => assert!(sotw >= 1 && delta == 0, "{}", gcp.proc.logs()),
        AdsApi::Delta => assert!(sotw == 0 && delta >= 1, "{}", gcp.proc.logs()),
    }

    assert_eq!(gcp.refused(), 0, "{}", gcp.proc.logs());
    if !cds {
        envoy.stop().await;
        return;
    }

    // The cluster deleted: Envoy removes it (CDS), still nothing rejected.
    gcp.delete(CLUSTER).await;
    eventually("envoy removes the cluster", LIMIT, || async {
        (!envoy.clusters().await.contains_key(CLUSTER)).then_some(())
    })
    .await;
    let cds = envoy.stats("cluster_manager.cds.").await;
    assert_eq!(
        cds.get("cluster_manager.cds.update_rejected"),
        Some(&0),
        "{cds:?}"
    );
    assert_eq!(gcp.nacks(), Vec::<String>::new());
    envoy.stop().await;
}

#[tokio::test]
async fn envoy_sotw_follows_gcp_server() {
    envoy_follows(AdsApi::Sotw, true, false).await;
}

#[tokio::test]
async fn envoy_delta_follows_gcp_server() {
    envoy_follows(AdsApi::Delta, true, false).await;
}

#[tokio::test]
async fn envoy_delta_static_eds_with_token_follows_gcp_server() {
    envoy_follows(AdsApi::Delta, false, true).await;
}

#[tokio::test]
async fn grpc_client_follows_gcp_server() {
    let dir = tempfile::tempdir().unwrap();
    let mut backends = Vec::new();
    for i in 0..3 {
        let port = testenv::process::free_port().unwrap();
        let addr: SocketAddr = ([127, 0, 0, 1], port).into();
        backends.push(GrpcBackend::start(dir.path(), &format!("grpc-backend-{i}"), addr).await);
    }
    let addrs: Vec<String> = backends.iter().map(|b| b.addr.to_string()).collect();
    let mut gcp = GcpServer::start(dir.path(), "gcp-server").await;
    let cluster = "shop/web:grpc";
    let eps = |n: usize| {
        backends[..n]
            .iter()
            .map(|b| Endpoint::new(b.addr))
            .collect::<Vec<_>>()
    };
    gcp.set(cluster, &eps(3)).await;
    gcp.target("shop-web-grpc", cluster).await;
    let mut client = GrpcClient::start(
        dir.path(),
        "xds-grpc-client",
        "xds:///shop-web-grpc",
        &grpc_bootstrap(gcp.addr, "grpc-client"),
        100,
    );

    // Exactly the three backends answer.
    client
        .wait_for("the client reaches all three backends", LIMIT, |rpcs| {
            rpcs.iter()
                .map(|r| r.backend.as_str())
                .collect::<BTreeSet<_>>()
                .len()
                >= 3
        })
        .await;
    let rpcs = client.rpcs();
    let seen: BTreeSet<&str> = rpcs.iter().map(|r| r.backend.as_str()).collect();
    assert_eq!(seen, addrs.iter().map(String::as_str).collect(), "{rpcs:?}");
    assert!(rpcs.iter().all(|r| r.ok), "{rpcs:?}");

    // Scale-down to two: the third keeps running, the client stops calling it.
    gcp.set(cluster, &eps(2)).await;
    let mark = client
        .wait_for(
            "the client stops calling the third backend",
            LIMIT,
            |rpcs| {
                rpcs.len() >= 30
                    && rpcs[rpcs.len() - 30..]
                        .iter()
                        .all(|r| r.backend != addrs[2])
            },
        )
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rpcs = client.rpcs();
    let after = &rpcs[mark.saturating_sub(30)..];
    let seen: BTreeSet<&str> = after.iter().map(|r| r.backend.as_str()).collect();
    assert_eq!(
        seen,
        addrs[..2].iter().map(String::as_str).collect(),
        "{after:?}"
    );

    // The second one DRAINING: grpc-go 1.85 stops calling it too.
    let mut two = eps(2);
    two[1].health = Some("DRAINING");
    gcp.set(cluster, &two).await;
    let mark = client
        .wait_for("the client calls only the first backend", LIMIT, |rpcs| {
            rpcs.len() >= 30
                && rpcs[rpcs.len() - 30..]
                    .iter()
                    .all(|r| r.backend == addrs[0])
        })
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rpcs = client.stop().await;
    let after = &rpcs[mark.saturating_sub(30)..];
    assert!(after.iter().all(|r| r.backend == addrs[0]), "{after:?}");
    let failed: Vec<_> = rpcs.iter().filter(|r| !r.ok).collect();
    assert!(failed.is_empty(), "failed RPCs: {failed:?}");
    assert_eq!(gcp.nacks(), Vec::<String>::new());
}

#[tokio::test]
async fn grpc_client_sends_its_token() {
    let dir = tempfile::tempdir().unwrap();
    let port = testenv::process::free_port().unwrap();
    let backend =
        GrpcBackend::start(dir.path(), "grpc-backend", ([127, 0, 0, 1], port).into()).await;
    let (right, wrong) = (dir.path().join("token"), dir.path().join("wrong"));
    std::fs::write(&right, "s3cret-token\n").unwrap();
    std::fs::write(&wrong, "guess\n").unwrap();
    let mut gcp = GcpServer::start_with(dir.path(), "gcp-server", Some(&right)).await;
    gcp.set("shop/web:grpc", &[Endpoint::new(backend.addr)])
        .await;
    gcp.target("shop-web-grpc", "shop/web:grpc").await;

    // A wrong token: refused, no RPC gets through.
    let mut client = GrpcClient::start(
        dir.path(),
        "client-wrong-token",
        "xds:///shop-web-grpc",
        &grpc_bootstrap_with_token(gcp.addr, "client-1", &wrong),
        50,
    );
    client
        .wait_for("5 RPCs with a wrong token", LIMIT, |r| r.len() >= 5)
        .await;
    let rpcs = client.stop().await;
    assert!(rpcs.iter().all(|r| !r.ok), "{rpcs:?}");
    assert!(gcp.refused() >= 1, "{}", gcp.proc.logs());

    // The right one: through.
    let mut client = GrpcClient::start(
        dir.path(),
        "client-right-token",
        "xds:///shop-web-grpc",
        &grpc_bootstrap_with_token(gcp.addr, "client-2", &right),
        50,
    );
    let want = backend.addr.to_string();
    client
        .wait_for("an RPC with the right token", LIMIT, |r| {
            r.iter().any(|r| r.ok && r.backend == want)
        })
        .await;
    let rpcs = client.stop().await;
    assert!(rpcs.iter().all(|r| r.ok), "{rpcs:?}");
}

/// A NACK shows: Envoy rejects an assignment with weight 0 (`update_rejected`
/// 1, gcp-server logs the NACK with Envoy's reason) and takes the next good one.
#[tokio::test]
async fn envoy_nack_then_good_update() {
    let dir = tempfile::tempdir().unwrap();
    let (b0, _t0) = http_backend("b0").await;
    let (b1, _t1) = http_backend("b1").await;
    let mut gcp = GcpServer::start(dir.path(), "gcp-server").await;
    gcp.set(CLUSTER, &[Endpoint::new(b0)]).await;
    let bootstrap = Bootstrap::new("envoy-nack", gcp.addr, AdsApi::Delta, CLUSTER);
    let envoy = Envoy::start(dir.path(), "envoy", &bootstrap.yaml()).await;
    let mut zero = Endpoint::new(b1);
    zero.weight = 0;
    gcp.set(CLUSTER, &[Endpoint::new(b0), zero]).await;
    // Envoy counts the rejection before its NACK reaches gcp-server's log:
    // wait for both, or the log read races the stream.
    eventually("envoy rejects the weight-0 assignment", LIMIT, || async {
        let s = envoy.cluster_stats(CLUSTER).await;
        (s.get("update_rejected") == Some(&1) && !gcp.nacks().is_empty()).then_some(())
    })
    .await;
    let nacks = gcp.nacks();
    assert_eq!(nacks.len(), 1, "{nacks:?}");
    assert!(nacks[0].contains("LoadBalancingWeight"), "{nacks:?}");
    let hosts = envoy.clusters().await.remove(CLUSTER).unwrap_or_default();
    assert_eq!(
        hosts.len(),
        1,
        "the rejected update is not applied: {hosts:?}"
    );

    gcp.set(CLUSTER, &[Endpoint::new(b0), Endpoint::new(b1)])
        .await;
    eventually("envoy takes the next good assignment", LIMIT, || async {
        let hosts = envoy.clusters().await.remove(CLUSTER)?;
        (hosts.len() == 2).then_some(())
    })
    .await;
    let s = envoy.cluster_stats(CLUSTER).await;
    assert_eq!(s.get("update_rejected"), Some(&1), "{s:?}");
    assert_eq!(gcp.nacks().len(), 1);
    envoy.stop().await;
}
