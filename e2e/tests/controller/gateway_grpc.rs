//! A proxyless grpc-go client (grpc-go 1.85, `.tools/bin/xds-grpc-client`)
//! dials `xds:///shop/echo:grpc`, the target README.md documents for a
//! Service port, against the controller's xDS server, on both API servers:
//! its RPCs reach exactly the ready backends (real grpc-go servers) and
//! follow a scale-down with no failed RPC.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::controller_support;
use crate::gateway_support;

use std::collections::BTreeSet;
use std::time::Duration;

use controller_support::{Backend as ApiBackend, Controller, Env, LIMIT, eventually};
use gateway_support::{free_port, ip};
use serde_json::json;
use testenv::both_backends;
use testenv::xds_go::{GrpcBackend, GrpcClient, grpc_bootstrap};

const NET: u8 = 6;

#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn grpc_go_xds_client_reaches_exactly_the_ready_backends_and_follows_a_scale_down(
    backend: ApiBackend,
) {
    let env = Env::start(backend).await;
    env.namespace("shop").await;
    let ips: Vec<std::net::Ipv4Addr> = (1..=3).map(|i| ip(&env, NET, i)).collect();
    let port = free_port(ips[0].into());
    let mut backends = Vec::new();
    for (i, a) in ips.iter().enumerate() {
        backends.push(GrpcBackend::start(&env.path(""), &format!("g{i}"), (*a, port).into()).await);
    }
    let hosts: Vec<String> = ips.iter().map(ToString::to_string).collect();
    let host_refs: Vec<&str> = hosts.iter().map(String::as_str).collect();
    env.endpoints(
        "shop",
        "echo",
        &host_refs,
        &[("grpc", i32::from(port))],
        json!({}),
    )
    .await;
    let cfg = format!(
        "discovery:\n  kubernetes:\n{}kube_discovery:\n  coalesce_window: 20ms\n  xds:\n    addr: 127.0.0.1:0\n",
        env.service_block(&env.admin_token())
    );
    let ctl = Controller::start(&env, "ctl", &cfg, &[]).await;
    let xds = ctl.xds_addr().await;
    let client = GrpcClient::start(
        &env.path(""),
        "grpc-client",
        "xds:///shop/echo:grpc",
        &grpc_bootstrap(xds, "grpc-client-1"),
        100,
    );
    let all: BTreeSet<String> = hosts.iter().map(|h| format!("{h}:{port}")).collect();
    eventually("RPCs reach all three backends", LIMIT, || async {
        let seen: BTreeSet<String> = client
            .rpcs()
            .iter()
            .filter(|r| r.ok)
            .map(|r| r.backend.clone())
            .collect();
        (seen == all).then_some(())
    })
    .await;
    // Over the next second: exactly the ready backends answer.
    let from = client.count();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let window = client.since(from);
    let seen: BTreeSet<String> = window.iter().map(|r| r.backend.clone()).collect();
    assert_eq!(seen, all, "{window:?}");

    // Scale down to two: after the change has had a second to travel, only
    // they answer; no RPC fails (the removed one keeps serving meanwhile).
    env.endpoints(
        "shop",
        "echo",
        &host_refs[..2],
        &[("grpc", i32::from(port))],
        json!({}),
    )
    .await;
    let changed = client.count();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let late = client.count();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = client.since(late);
    let two: BTreeSet<String> = all.iter().take(2).cloned().collect();
    let seen: BTreeSet<String> = after.iter().map(|r| r.backend.clone()).collect();
    assert_eq!(seen, two, "{after:?}");
    let failed: Vec<_> = client.rpcs().into_iter().filter(|r| !r.ok).collect();
    assert!(failed.is_empty(), "failed RPCs: {failed:?}");
    assert!(
        client.count() - changed >= 100,
        "too few RPCs after the change"
    );
    client.stop().await;
    for b in backends {
        b.stop().await;
    }
    ctl.stop().await;
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, PEM:
/// (ca, server cert, server key, client cert, client key).
fn mtls_material() -> (String, String, String, String, String) {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
        IsCa, KeyPair, SanType,
    };
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "xds-test-ca");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf = |cn: &str, eku: ExtendedKeyUsagePurpose| {
        let mut p = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.subject_alt_names
            .push(SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
        p.extended_key_usages = vec![eku];
        let key = KeyPair::generate().unwrap();
        let cert = p.signed_by(&key, &ca).unwrap();
        (cert.pem(), key.serialize_pem())
    };
    let (sc, sk) = leaf("kube-discovery-xds", ExtendedKeyUsagePurpose::ServerAuth);
    let (cc, ck) = leaf("grpc-client", ExtendedKeyUsagePurpose::ClientAuth);
    (ca.pem(), sc, sk, cc, ck)
}

/// xDS over mTLS: grpc-go with the bootstrap's `tls` channel credentials
/// (its certificate) is served; a client without a certificate, or trusting
/// another CA, is refused.
#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn grpc_go_over_mtls_is_served_and_a_client_without_a_certificate_is_refused(
    backend: ApiBackend,
) {
    let env = Env::start(backend).await;
    env.namespace("shop").await;
    let a = ip(&env, NET, 9);
    let port = free_port(a.into());
    let g = GrpcBackend::start(&env.path(""), "g9", (a, port).into()).await;
    let host = a.to_string();
    env.endpoints(
        "shop",
        "echo",
        &[&host],
        &[("grpc", i32::from(port))],
        json!({}),
    )
    .await;
    let (ca, sc, sk, cc, ck) = mtls_material();
    let file = |name: &str, pem: &str| {
        let p = env.path(name);
        std::fs::write(&p, pem).unwrap();
        p.display().to_string()
    };
    let (ca_f, sc_f, sk_f, cc_f, ck_f) = (
        file("ca.pem", &ca),
        file("server.pem", &sc),
        file("server-key.pem", &sk),
        file("client.pem", &cc),
        file("client-key.pem", &ck),
    );
    let cfg = format!(
        "discovery:\n  kubernetes:\n{}kube_discovery:\n  xds:\n    addr: 127.0.0.1:0\n    cert_file: {sc_f}\n    key_file: {sk_f}\n    client_ca_file: {ca_f}\n",
        env.service_block(&env.admin_token())
    );
    let ctl = Controller::start(&env, "ctl-tls", &cfg, &[]).await;
    let xds = ctl.xds_addr().await;
    let bootstrap = json!({
        "xds_servers": [{
            "server_uri": xds.to_string(),
            "channel_creds": [{"type": "tls", "config": {
                "ca_certificate_file": ca_f,
                "certificate_file": cc_f,
                "private_key_file": ck_f,
            }}],
        }],
        "node": {"id": "grpc-mtls"},
    })
    .to_string();
    let client = GrpcClient::start(
        &env.path(""),
        "grpc-mtls",
        "xds:///shop/echo:grpc",
        &bootstrap,
        50,
    );
    let want = format!("{host}:{port}");
    eventually(
        "RPCs over an mTLS-fed client reach the backend",
        LIMIT,
        || async {
            client
                .rpcs()
                .iter()
                .any(|r| r.ok && r.backend == want)
                .then_some(())
        },
    )
    .await;

    // No client certificate: the handshake or the first call fails.
    let refused = match testenv::ads::tls_channel(xds, &ca, None).await {
        Err(_) => true,
        Ok(ch) => match testenv::ads::Sotw::open(ch, None, "no-cert").await {
            Err(_) => true,
            Ok(mut c) => {
                c.send(testenv::ads::CDS, &[], "", "", None).await;
                c.recv(Duration::from_secs(5)).await.is_err()
            }
        },
    };
    assert!(refused, "a client without a certificate was served");
    // With the certificate: served (the same client code, so the refusal
    // above is the missing certificate).
    let ch = testenv::ads::tls_channel(xds, &ca, Some((&cc, &ck)))
        .await
        .unwrap();
    let mut c = testenv::ads::Sotw::open(ch, None, "with-cert")
        .await
        .unwrap();
    c.send(testenv::ads::CDS, &[], "", "", None).await;
    let r = c
        .recv(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("CDS over mTLS");
    assert_eq!(r.resources.len(), 1);
    client.stop().await;
    g.stop().await;
    ctl.stop().await;
}
