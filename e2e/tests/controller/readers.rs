//! Readers cannot be spoofed (issue 16, item 8): a hand-made DiscoveredService
//! in namespace `evil`, with every label the controller sets and a spec
//! claiming `default/web`, adds no node to what the readers return:
//! `kube-discovery nodes` (one list) and the client crate's `NodesResolver`
//! (a reflector, what the syncs and the Rust gateways use). On both API
//! servers. The controller publishes `default/web` first and is stopped
//! before the spoofs are created (its drift watch would delete them as
//! strays), so the readers see them next to the real object.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::controller_support;

use std::process::Stdio;

use controller_support::{Backend, Controller, Env, LIMIT, bin, dsvc_resource, eventually};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube_discovery_client::NodesResolver;
use kube_discovery_core::crd::MANAGED_BY_SELECTOR;
use serde_json::{Value, json};
use testenv::both_backends;

/// A DiscoveredService `ns/name` carrying the controller's labels for
/// `default/web` and a spec claiming it, with the node 6.6.6.6:80.
fn spoof(ns: &str, name: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "kubediscovery.io/v1alpha1",
        "kind": "DiscoveredService",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": {
                "app.kubernetes.io/managed-by": "kube-discovery",
                "kubediscovery.io/cluster": "",
                "kubediscovery.io/service-namespace": "default",
                "kubediscovery.io/service-name": "web",
            },
        },
        "spec": {
            "cluster": "",
            "service": "default/web",
            "sourceNamespace": "default",
            "sourceName": "web",
            "source": "Endpoints",
            "ports": {"http": [{"host": "6.6.6.6", "port": 80, "weight": 100}]},
            "version": "0000000000000000",
        },
    }))
    .expect("DiscoveredService")
}

fn hosts(nodes: &Value) -> Vec<String> {
    nodes
        .as_array()
        .expect("node array")
        .iter()
        .map(|n| n["host"].as_str().expect("host").to_string())
        .collect()
}

#[both_backends]
#[tokio::test]
async fn a_spoofed_discovered_service_in_another_namespace_adds_no_node(backend: Backend) {
    let env = Env::start(backend).await;
    env.namespace("default").await;
    env.endpoints("default", "web", &["10.5.0.1"], &[("http", 80)], json!({}))
        .await;
    let cfg = format!(
        "discovery:\n  kubernetes:\n{}kube_discovery:\n  coalesce_window: 20ms\n",
        env.service_block(&env.admin_token())
    );
    let ctl = Controller::start(&env, "readers", &cfg, &[]).await;
    ctl.wait_ready().await;
    env.wait_nodes("default", "web", "http", &["10.5.0.1"])
        .await;
    ctl.stop().await;

    // `evil/web`: the real object's name in another namespace; `evil/default.web`:
    // the name `namespace_mode: fixed` would give it.
    env.namespace("evil").await;
    let evil: Api<DynamicObject> =
        Api::namespaced_with(env.admin.clone(), "evil", &dsvc_resource());
    for name in ["web", "default.web"] {
        evil.create(&PostParams::default(), &spoof("evil", name))
            .await
            .unwrap_or_else(|e| panic!("create evil/{name}: {e}"));
    }
    // Both spoofs are what a reader lists (label-selected, all namespaces).
    let listed: Vec<String> = env
        .dsvc_api_all()
        .list(&ListParams::default().labels(MANAGED_BY_SELECTOR))
        .await
        .expect("list")
        .items
        .iter()
        .map(|o| {
            format!(
                "{}/{}",
                o.metadata.namespace.as_deref().unwrap_or(""),
                o.metadata.name.as_deref().unwrap_or("")
            )
        })
        .collect();
    assert_eq!(listed.len(), 3, "{listed:?}");

    // One list: `kube-discovery nodes`.
    let kc = env.kubeconfig(&env.admin_token());
    let out = tokio::process::Command::new(bin())
        .args(["nodes", "default/web:http", "--kubeconfig"])
        .arg(&kc)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run kube-discovery nodes");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let nodes: Value = serde_json::from_str(&stdout).expect("nodes JSON");
    assert_eq!(hosts(&nodes), ["10.5.0.1"], "{stderr}");
    for name in ["evil/web", "evil/default.web"] {
        assert!(
            stderr.contains("ignoring DiscoveredService") && stderr.contains(name),
            "the refused {name} is named in a warning:\n{stderr}"
        );
    }

    // A reflector: the client crate's resolver.
    let resolver = NodesResolver::start(env.admin.clone(), None);
    tokio::time::timeout(LIMIT, resolver.wait_ready())
        .await
        .expect("the resolver listed");
    let got: Vec<String> = resolver
        .nodes("default/web:http")
        .expect("service name")
        .expect("default/web:http known")
        .into_iter()
        .map(|n| n.host.to_string())
        .collect();
    assert_eq!(got, ["10.5.0.1"]);
    // An object that stops agreeing leaves the cache: the real one, edited
    // to carry the labels of another service.
    let default: Api<DynamicObject> =
        Api::namespaced_with(env.admin.clone(), "default", &dsvc_resource());
    default
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {"kubediscovery.io/service-name": "api"}}}),
            ),
        )
        .await
        .expect("patch default/web");
    eventually(
        "the edited default/web leaves the resolver",
        LIMIT,
        || async {
            resolver
                .nodes("default/web:http")
                .expect("service name")
                .is_none()
                .then_some(())
        },
    )
    .await;
}
