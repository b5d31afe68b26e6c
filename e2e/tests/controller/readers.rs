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

/// `namespace_mode: fixed`: the controller writes `kd/default.web`; a reader
/// told so (`--fixed-namespace kd`, `reader_rule(Some("kd"))`) returns its
/// nodes and refuses a labelled object in the Service's own namespace
/// (`default/web`, the source-mode name); a reader not told so refuses the
/// object in `kd` and reads `default/web` instead.
#[both_backends]
#[tokio::test]
async fn fixed_namespace_readers_accept_only_the_fixed_namespace(backend: Backend) {
    let env = Env::start(backend).await;
    env.namespace("default").await;
    env.namespace("kd").await;
    env.endpoints("default", "web", &["10.5.0.1"], &[("http", 80)], json!({}))
        .await;
    let cfg = format!(
        "discovery:\n  kubernetes:\n{}kube_discovery:\n  coalesce_window: 20ms\n  sinks:\n    discoveredservices: {{namespace_mode: fixed, namespace: kd}}\n",
        env.service_block(&env.admin_token())
    );
    let ctl = Controller::start(&env, "readers-fixed", &cfg, &[]).await;
    ctl.wait_ready().await;
    env.wait_nodes("kd", "default.web", "http", &["10.5.0.1"])
        .await;
    ctl.stop().await;
    let default: Api<DynamicObject> =
        Api::namespaced_with(env.admin.clone(), "default", &dsvc_resource());
    default
        .create(&PostParams::default(), &spoof("default", "web"))
        .await
        .expect("create default/web");

    let kc = env.kubeconfig(&env.admin_token());
    let nodes = |extra: &'static [&'static str]| {
        let kc = kc.clone();
        async move {
            let out = tokio::process::Command::new(bin())
                .args(["nodes", "default/web:http", "--kubeconfig"])
                .arg(&kc)
                .args(extra)
                .env_remove("KUBECONFIG")
                .stdin(Stdio::null())
                .output()
                .await
                .expect("run kube-discovery nodes");
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).to_string(),
                String::from_utf8_lossy(&out.stderr).to_string(),
            )
        }
    };
    let (ok, out, err) = nodes(&["--fixed-namespace", "kd"]).await;
    assert!(ok, "{err}");
    let got: Value = serde_json::from_str(&out).expect("nodes JSON");
    assert_eq!(hosts(&got), ["10.5.0.1"], "{err}");
    assert!(
        err.contains("ignoring DiscoveredService default/web"),
        "the spoof in the Service's namespace is named:\n{err}"
    );
    // Without the flag the reader expects source naming: the controller's
    // object in `kd` is refused, and `default/web` is what source naming
    // gives (the Service's own namespace, whose writers the source mode
    // trusts): readers must be told the mode the controller runs with.
    let (ok, out, err) = nodes(&[]).await;
    assert!(ok, "{err}");
    let got: Value = serde_json::from_str(&out).expect("nodes JSON");
    assert_eq!(hosts(&got), ["6.6.6.6"], "{err}");
    assert!(
        err.contains("ignoring DiscoveredService kd/default.web"),
        "{err}"
    );

    // The resolver with the fixed rule.
    let resolver = NodesResolver::start_with_rule(
        env.admin.clone(),
        None,
        MANAGED_BY_SELECTOR,
        kube_discovery_client::lookup::reader_rule(Some("kd"), None),
    );
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
}
