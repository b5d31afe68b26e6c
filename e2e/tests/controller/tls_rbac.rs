//! Controller end to end on both API servers, over HTTPS with RBAC enforced
//! (kube-sim started with TLS; the real kube-apiserver, behind the fault
//! proxy, always serves TLS and authorizes with RBAC): the controller runs as
//! the ServiceAccount `kube-discovery/kube-discovery`, bound ONLY to the
//! ClusterRole in `rbac/clusterrole.yaml`, reads its token from a file and
//! verifies the API server certificate with `ca_file`. Its Events (a drift
//! repair, twice: created, then patched as a series) need no more than the
//! role's `create` and `patch` on `events.k8s.io` events.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::controller_support;

use controller_support::{
    Backend, Controller, Env, LIMIT, Options, dsvc_resource, eventually, repo_root,
};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use testenv::both_backends;

/// An HTTPS API server (kube-sim only needs to be told).
async fn start_https(backend: Backend) -> Env {
    let env = Env::start_with(
        backend,
        Options {
            tls: true,
            ..Options::default()
        },
    )
    .await;
    assert!(env.api.url().starts_with("https://"));
    env
}

async fn install_rbac(env: &Env) {
    let text = std::fs::read_to_string(repo_root().join("rbac/clusterrole.yaml"))
        .expect("read rbac/clusterrole.yaml");
    for doc in kube_discovery_core::yaml::documents(&text) {
        let v = doc.expect("yaml");
        match v["kind"].as_str() {
            Some("ClusterRole") => {
                let o: ClusterRole = serde_json::from_value(v).expect("ClusterRole");
                Api::<ClusterRole>::all(env.admin.clone())
                    .create(&PostParams::default(), &o)
                    .await
                    .expect("create ClusterRole");
            }
            Some("ClusterRoleBinding") => {
                let o: ClusterRoleBinding = serde_json::from_value(v).expect("ClusterRoleBinding");
                Api::<ClusterRoleBinding>::all(env.admin.clone())
                    .create(&PostParams::default(), &o)
                    .await
                    .expect("create binding");
            }
            other => panic!("unexpected kind {other:?} in rbac/clusterrole.yaml"),
        }
    }
}

fn https_config(
    env: &Env,
    token_file: &std::path::Path,
    ca_file: Option<&std::path::Path>,
) -> String {
    let url = env.api.url();
    let port = url.rsplit(':').next().expect("port");
    let ca = ca_file
        .map(|p| format!("      ca_file: {}\n", p.display()))
        .unwrap_or_default();
    format!(
        "discovery:\n  kubernetes:\n    service:\n      schema: https\n      host: 127.0.0.1\n      port: {port}\n{ca}    client:\n      token_file: {}\n    watch_endpoint_slices: true\nkube_discovery:\n  coalesce_window: 20ms\n",
        token_file.display()
    )
}

#[both_backends]
#[tokio::test]
async fn runs_as_least_privilege_service_account_over_verified_tls(backend: Backend) {
    let env = start_https(backend).await;
    install_rbac(&env).await;
    env.namespace("shop").await;
    env.slice(
        "shop",
        "web",
        "web-1",
        &[("10.7.0.1", true), ("10.7.0.2", true)],
        &[("http", 8080)],
    )
    .await;

    let ca = env.path("ca.crt");
    std::fs::write(&ca, env.api.ca_pem().expect("CA")).unwrap();
    let token = env
        .api
        .issue_token("kube-discovery", "kube-discovery")
        .await
        .expect("ServiceAccount token");
    let token_file = env.path("sa-token");
    std::fs::write(&token_file, &token).unwrap();

    let ctl = Controller::start(
        &env,
        "rbac",
        &https_config(&env, &token_file, Some(&ca)),
        &[],
    )
    .await;
    ctl.wait_ready().await;
    env.wait_nodes("shop", "web", "http", &["10.7.0.1", "10.7.0.2"])
        .await;
    // Spec and status come in ONE server-side apply (the CRD has no status
    // subresource, the role no discoveredservices/status rule): the object
    // that shows the nodes already counts them.
    let ds = env.dsvc("shop", "web").await.expect("shop/web");
    assert_eq!(ds["status"]["nodeCount"], json!(2), "{ds}");
    assert_eq!(ds["status"]["ports"], json!("http"), "{ds}");
    // Events need exactly `create` and `patch`: a hand edit repaired twice
    // gives one DriftRepaired Event (create), then the Recorder's repeat of
    // it (a `series` patch), both as the ServiceAccount.
    let dsvc: Api<DynamicObject> =
        Api::namespaced_with(env.admin.clone(), "shop", &dsvc_resource());
    for round in 1..=2 {
        dsvc.patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"ports": {"http": [{"host": "6.6.6.6", "port": 1, "weight": 1}]}}}),
            ),
        )
        .await
        .expect("hand edit");
        eventually(&format!("repair {round} published"), LIMIT, || async {
            let count = env
                .event_count("shop", "DriftRepaired", "DiscoveredService", "web")
                .await;
            (count == round).then_some(())
        })
        .await;
    }
    // Follows changes and deletes, still as the ServiceAccount.
    env.slice(
        "shop",
        "web",
        "web-1",
        &[("10.7.0.2", true)],
        &[("http", 8080)],
    )
    .await;
    env.wait_nodes("shop", "web", "http", &["10.7.0.2"]).await;
    env.delete_slice("shop", "web-1").await;
    env.wait_gone("shop", "web").await;
    let logs = ctl.logs();
    assert!(!logs.contains(&token), "the token must never be logged");
    assert!(
        !logs.to_lowercase().contains("forbidden"),
        "a request was forbidden:\n{logs}"
    );
    ctl.stop().await;
}

#[both_backends]
#[tokio::test]
async fn refuses_an_unverified_server_and_an_unbound_service_account(backend: Backend) {
    let env = start_https(backend).await;
    install_rbac(&env).await;
    env.namespace("shop").await;
    env.slice(
        "shop",
        "web",
        "web-1",
        &[("10.7.1.1", true)],
        &[("http", 8080)],
    )
    .await;

    // ssl_verify defaults to true: without the CA the self-signed server is refused.
    let good = env.path("good-token");
    let token = env
        .api
        .issue_token("kube-discovery", "kube-discovery")
        .await
        .expect("ServiceAccount token");
    std::fs::write(&good, token).unwrap();
    let no_ca = Controller::start(&env, "noca", &https_config(&env, &good, None), &[]).await;
    eventually("a TLS failure is logged", LIMIT, || async {
        no_ca.logs().contains("watch failed").then_some(())
    })
    .await;
    assert_eq!(no_ca.get("/readyz").await.0, 503);
    no_ca.stop().await;

    // A ServiceAccount without the binding is forbidden.
    let ca = env.path("ca.crt");
    std::fs::write(&ca, env.api.ca_pem().expect("CA")).unwrap();
    let other = env.path("other-token");
    let token = env
        .api
        .issue_token("kube-discovery", "someone-else")
        .await
        .expect("ServiceAccount token");
    std::fs::write(&other, token).unwrap();
    let unbound =
        Controller::start(&env, "unbound", &https_config(&env, &other, Some(&ca)), &[]).await;
    eventually("a forbidden error is logged", LIMIT, || async {
        unbound.logs().contains("forbidden").then_some(())
    })
    .await;
    assert_eq!(unbound.get("/readyz").await.0, 503);
    unbound.stop().await;
    assert!(env.dsvc("shop", "web").await.is_none());
}
