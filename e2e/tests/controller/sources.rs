//! Controller end to end on both API servers (the `kube-discovery` binary as a separate
//! process): Endpoints mode and EndpointSlice mode, scale up / down / to zero /
//! delete, the four namespace_selector forms and label_selector.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::controller_support;

use controller_support::{Backend, Controller, Env, LIMIT, eventually};
use serde_json::json;
use testenv::both_backends;

pub(crate) fn config(env: &Env, extra: &str) -> String {
    format!(
        "discovery:\n  kubernetes:\n{}{extra}kube_discovery:\n  coalesce_window: 20ms\n",
        env.service_block(&env.admin_token())
    )
}

fn hosts(ds: &serde_json::Value, port: &str) -> Vec<String> {
    ds["spec"]["ports"][port]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|n| n["host"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

#[both_backends]
#[tokio::test]
async fn endpoints_mode_follows_scale_up_down_zero_and_delete(backend: Backend) {
    let env = Env::start(backend).await;
    env.namespace("shop").await;
    env.endpoints(
        "shop",
        "web",
        &["10.0.0.2", "10.0.0.1"],
        &[("http", 8080)],
        json!({}),
    )
    .await;
    let ctl = Controller::start(&env, "ep", &config(&env, ""), &[]).await;
    ctl.wait_ready().await;

    let ds = env
        .wait_nodes("shop", "web", "http", &["10.0.0.1", "10.0.0.2"])
        .await;
    assert_eq!(ds["spec"]["source"], "Endpoints");
    assert_eq!(ds["spec"]["service"], "shop/web");
    assert_eq!(
        ds["spec"]["ports"]["http"][0],
        json!({"host": "10.0.0.1", "port": 8080, "weight": 50})
    );
    assert_eq!(
        ds["metadata"]["labels"]["app.kubernetes.io/managed-by"],
        "kube-discovery"
    );
    assert!(
        ctl.logs().contains("deprecated"),
        "the Endpoints-mode notice is logged"
    );

    // Scale up, down, to zero, delete.
    env.endpoints(
        "shop",
        "web",
        &["10.0.0.1", "10.0.0.2", "10.0.0.3"],
        &[("http", 8080)],
        json!({}),
    )
    .await;
    env.wait_nodes("shop", "web", "http", &["10.0.0.1", "10.0.0.2", "10.0.0.3"])
        .await;
    env.endpoints("shop", "web", &["10.0.0.3"], &[("http", 8080)], json!({}))
        .await;
    env.wait_nodes("shop", "web", "http", &["10.0.0.3"]).await;
    env.endpoints("shop", "web", &[], &[("http", 8080)], json!({}))
        .await;
    eventually("shop/web has no nodes", LIMIT, || async {
        let ds = env.dsvc("shop", "web").await?;
        let total: usize = ds["spec"]["ports"]
            .as_object()
            .map(|m| m.values().filter_map(|v| v.as_array()).map(Vec::len).sum())
            .unwrap_or(0);
        (total == 0).then_some(())
    })
    .await;
    env.delete_endpoints("shop", "web").await;
    env.wait_gone("shop", "web").await;
    ctl.stop().await;
}

#[both_backends]
#[tokio::test]
async fn slice_mode_merges_slices_uses_ready_endpoints_and_deletes(backend: Backend) {
    let env = Env::start(backend).await;
    env.namespace("shop").await;
    env.slice(
        "shop",
        "web",
        "web-a",
        &[("10.0.1.1", true), ("10.0.1.9", false)],
        &[("http", 8080)],
    )
    .await;
    env.slice(
        "shop",
        "web",
        "web-b",
        &[("10.0.1.2", true)],
        &[("http", 8080)],
    )
    .await;
    let ctl = Controller::start(
        &env,
        "slices",
        &config(&env, "    watch_endpoint_slices: true\n"),
        &[],
    )
    .await;
    ctl.wait_ready().await;
    let ds = env
        .wait_nodes("shop", "web", "http", &["10.0.1.1", "10.0.1.2"])
        .await;
    assert_eq!(ds["spec"]["source"], "EndpointSlice");
    assert!(
        !ctl.logs().contains("deprecated"),
        "no Endpoints notice in slice mode"
    );

    // Scale up in one slice, the not-ready endpoint becomes ready, then a slice goes away.
    env.slice(
        "shop",
        "web",
        "web-a",
        &[("10.0.1.1", true), ("10.0.1.9", true), ("10.0.1.3", true)],
        &[("http", 8080)],
    )
    .await;
    env.wait_nodes(
        "shop",
        "web",
        "http",
        &["10.0.1.1", "10.0.1.2", "10.0.1.3", "10.0.1.9"],
    )
    .await;
    env.delete_slice("shop", "web-a").await;
    env.wait_nodes("shop", "web", "http", &["10.0.1.2"]).await;
    env.slice(
        "shop",
        "web",
        "web-b",
        &[("10.0.1.2", false)],
        &[("http", 8080)],
    )
    .await;
    eventually("no ready nodes", LIMIT, || async {
        let ds = env.dsvc("shop", "web").await?;
        hosts(&ds, "http").is_empty().then_some(())
    })
    .await;
    env.delete_slice("shop", "web-b").await;
    env.wait_gone("shop", "web").await;
    ctl.stop().await;
}

/// A hand-made slice labelled `kubernetes.io/service-name: web.1` (a valid
/// label value, but no Service can be named so) would yield the object name of
/// shard 1 of `web`: it is skipped, counted as `invalid_service_name`, and no
/// DiscoveredService other than `web`'s appears.
#[both_backends]
#[tokio::test]
async fn a_slice_labelled_with_no_valid_service_name_is_skipped(backend: Backend) {
    let env = Env::start(backend).await;
    env.namespace("shop").await;
    env.slice(
        "shop",
        "web",
        "web-a",
        &[("10.0.3.1", true)],
        &[("http", 8080)],
    )
    .await;
    env.slice(
        "shop",
        "web.1",
        "stray",
        &[("10.0.3.9", true)],
        &[("http", 8080)],
    )
    .await;
    let ctl = Controller::start(
        &env,
        "invalid-service-name",
        &config(&env, "    watch_endpoint_slices: true\n"),
        &[],
    )
    .await;
    ctl.wait_ready().await;
    env.wait_nodes("shop", "web", "http", &["10.0.3.1"]).await;
    let series = "kube_discovery_source_skipped_total{cluster=\"\",kind=\"EndpointSlice\",reason=\"invalid_service_name\"}";
    eventually("the stray slice counted", LIMIT, || async {
        let text = ctl.get("/metrics").await.1;
        (sample(&text, series) == Some(1.0)).then_some(())
    })
    .await;
    assert!(
        ctl.logs().lines().any(|l| l.contains("shop/stray")
            && l.contains("web.1")
            && l.contains("is not a valid Service name")),
        "a warning names the label value:\n{}",
        ctl.logs()
    );
    assert_eq!(env.dsvc_names().await, vec!["shop/web"]);
    ctl.stop().await;
}

/// Creates the same service in namespaces `a`, `b`, `team-x`, with label
/// `tier=<ns>` on each, and returns which DiscoveredServices exist once the
/// controller is ready and has written `expect_one`.
async fn selected(backend: Backend, selector: &str, expect_one: &str) -> Vec<String> {
    let env = Env::start(backend).await;
    for ns in ["a", "b", "team-x"] {
        env.namespace(ns).await;
        env.endpoints(
            ns,
            "svc",
            &["10.1.0.1"],
            &[("http", 80)],
            json!({"tier": ns}),
        )
        .await;
    }
    let ctl = Controller::start(&env, "sel", &config(&env, selector), &[]).await;
    ctl.wait_ready().await;
    let (ns, name) = expect_one.split_once('/').expect("ns/name");
    env.wait_nodes(ns, name, "http", &["10.1.0.1"]).await;
    // Ready means the first list is completely written: what exists now is all.
    let names = env.dsvc_names().await;
    ctl.stop().await;
    names
}

#[both_backends]
#[tokio::test]
async fn namespace_selector_equal(backend: Backend) {
    assert_eq!(
        selected(
            backend,
            "    namespace_selector:\n      equal: b\n",
            "b/svc"
        )
        .await,
        vec!["b/svc"]
    );
}

#[both_backends]
#[tokio::test]
async fn namespace_selector_not_equal(backend: Backend) {
    assert_eq!(
        selected(
            backend,
            "    namespace_selector:\n      not_equal: b\n",
            "a/svc"
        )
        .await,
        vec!["a/svc", "team-x/svc"]
    );
}

#[both_backends]
#[tokio::test]
async fn namespace_selector_match_is_anchored(backend: Backend) {
    // A regex must match the WHOLE name: `team` does not select `team-x`.
    assert_eq!(
        selected(
            backend,
            "    namespace_selector:\n      match: [\"a\", \"team\"]\n",
            "a/svc"
        )
        .await,
        vec!["a/svc"]
    );
    assert_eq!(
        selected(
            backend,
            "    namespace_selector:\n      match: [\"a\", \"team-.*\"]\n",
            "a/svc"
        )
        .await,
        vec!["a/svc", "team-x/svc"]
    );
}

#[both_backends]
#[tokio::test]
async fn namespace_selector_not_match(backend: Backend) {
    assert_eq!(
        selected(
            backend,
            "    namespace_selector:\n      not_match: [\"team-.*\", \"b\"]\n",
            "a/svc"
        )
        .await,
        vec!["a/svc"]
    );
    // Anchored: `team` does not exclude `team-x`.
    assert_eq!(
        selected(
            backend,
            "    namespace_selector:\n      not_match: [\"team\", \"b\"]\n",
            "a/svc"
        )
        .await,
        vec!["a/svc", "team-x/svc"]
    );
}

#[both_backends]
#[tokio::test]
async fn label_selector_filters_on_the_server(backend: Backend) {
    assert_eq!(
        selected(
            backend,
            "    label_selector: \"tier in (a,team-x)\"\n",
            "team-x/svc"
        )
        .await,
        vec!["a/svc", "team-x/svc"]
    );
}

// ---------------------------------------------------------------- owner references (Endpoints mode)

/// Creates the Service `ns/name` (ClusterIP, one port); returns its UID.
async fn service(env: &Env, ns: &str, name: &str) -> String {
    use k8s_openapi::api::core::v1::Service;
    use kube::api::{Api, PostParams};
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}
    }))
    .unwrap();
    let api: Api<Service> = Api::namespaced(env.admin.clone(), ns);
    api.create(&PostParams::default(), &svc)
        .await
        .expect("create Service")
        .metadata
        .uid
        .expect("Service uid")
}

async fn delete_service(env: &Env, ns: &str, name: &str) {
    use k8s_openapi::api::core::v1::Service;
    use kube::api::{Api, DeleteParams};
    let api: Api<Service> = Api::namespaced(env.admin.clone(), ns);
    api.delete(name, &DeleteParams::background())
        .await
        .expect("delete Service");
}

/// `(kind, name, uid)` of the object's ownerReferences.
fn owners(ds: &serde_json::Value) -> Vec<(String, String, String)> {
    ds["metadata"]["ownerReferences"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|o| {
                    let s = |k: &str| o[k].as_str().unwrap_or_default().to_string();
                    (s("kind"), s("name"), s("uid"))
                })
                .collect()
        })
        .unwrap_or_default()
}

async fn wait_owner(env: &Env, ns: &str, name: &str, want: Option<&str>) -> serde_json::Value {
    let want: Vec<(String, String, String)> = want
        .map(|uid| vec![("Service".to_string(), name.to_string(), uid.to_string())])
        .unwrap_or_default();
    eventually(
        &format!("{ns}/{name} ownerReferences = {want:?}"),
        LIMIT,
        || async {
            let ds = env.dsvc(ns, name).await?;
            (owners(&ds) == want).then_some(ds)
        },
    )
    .await
}

/// Endpoints carry no ownerReference: the controller looks the Service up
/// (metadata-only watch) so the object is owned by the Service, follows a
/// re-created Service's new UID, publishes without an owner when there is no
/// Service, and the garbage collector deletes it with its Service.
#[both_backends]
#[tokio::test]
async fn endpoints_mode_owner_reference_from_the_service(backend: Backend) {
    let env = Env::start(backend).await;
    env.namespace("shop").await;
    let uid1 = service(&env, "shop", "web").await;
    env.endpoints("shop", "web", &["10.0.0.1"], &[("http", 8080)], json!({}))
        .await;
    env.endpoints(
        "shop",
        "lonely",
        &["10.0.0.9"],
        &[("http", 8080)],
        json!({}),
    )
    .await;
    let ctl = Controller::start(&env, "owner", &config(&env, ""), &[]).await;
    ctl.wait_ready().await;

    // The object is owned by its Service.
    let ds = wait_owner(&env, "shop", "web", Some(&uid1)).await;
    assert_eq!(ds["spec"]["source"], "Endpoints");
    assert_eq!(ds["metadata"]["ownerReferences"][0]["apiVersion"], "v1");
    // No Service: published anyway, without an ownerReference.
    let lonely = env
        .wait_nodes("shop", "lonely", "http", &["10.0.0.9"])
        .await;
    assert!(owners(&lonely).is_empty(), "{lonely}");

    // A Service appearing later gives its object an owner.
    let uid_lonely = service(&env, "shop", "lonely").await;
    wait_owner(&env, "shop", "lonely", Some(&uid_lonely)).await;

    // Deleting the Service: the garbage collector deletes the owned object
    // (the write log shows its delete). The controller is stopped meanwhile:
    // on a real cluster the collector runs asynchronously and would race the
    // controller (the API server deletes the Service's Endpoints with it, so
    // the controller deletes the object too, and either may come first).
    ctl.stop().await;
    let mark = env.mark().await;
    delete_service(&env, "shop", "web").await;
    let gc = "system:serviceaccount:kube-system:generic-garbage-collector";
    eventually("the garbage collector deletes shop/web", LIMIT, || async {
        let writes = env.dsvc_writes_since(mark).await;
        writes
            .iter()
            .any(|w| {
                w["verb"] == "delete"
                    && w["user"] == gc
                    && w["namespace"] == "shop"
                    && w["name"] == "web"
            })
            .then_some(())
    })
    .await;
    env.wait_gone("shop", "web").await;
    // Endpoints without a Service (written again: the Service took them
    // along) are published without an owner: a missing Service never blocks
    // publishing.
    env.endpoints("shop", "web", &["10.0.0.1"], &[("http", 8080)], json!({}))
        .await;
    let ctl = Controller::start(&env, "owner-2", &config(&env, ""), &[]).await;
    ctl.wait_ready().await;
    let ds = wait_owner(&env, "shop", "web", None).await;
    assert_eq!(hosts(&ds, "http"), vec!["10.0.0.1"]);

    // Re-created with a new UID: the ownerReference follows.
    let uid2 = service(&env, "shop", "web").await;
    assert_ne!(uid1, uid2);
    wait_owner(&env, "shop", "web", Some(&uid2)).await;

    let logs = ctl.logs();
    assert!(!logs.contains("Service watch failed"), "{logs}");
    // A relist (410 Gone on every watch) keeps the owners.
    env.force_410().await;
    env.endpoints(
        "shop",
        "web",
        &["10.0.0.1", "10.0.0.2"],
        &[("http", 8080)],
        json!({}),
    )
    .await;
    let ds = env
        .wait_nodes("shop", "web", "http", &["10.0.0.1", "10.0.0.2"])
        .await;
    assert_eq!(
        owners(&ds),
        vec![("Service".into(), "web".into(), uid2.clone())]
    );

    // Deleting the Service deletes its Endpoints (the API server does): the
    // object is gone.
    delete_service(&env, "shop", "web").await;
    env.wait_gone("shop", "web").await;
    ctl.stop().await;
}

// ---------------------------------------------------------------- skipped bad data

/// The value of the sample `series` (name and labels, exactly) in a metrics text.
pub(crate) fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
}

/// Stores (creates or replaces) Endpoints `ns/name` without validation,
/// through kube-sim's `/_sim/unvalidated` hook, in the shape of
/// [`Env::endpoints`].
fn unvalidated_endpoints(env: &Env, ns: &str, name: &str, ips: &[&str], ports: &[(&str, i32)]) {
    let addresses: Vec<_> = ips.iter().map(|ip| json!({"ip": ip})).collect();
    let ports: Vec<_> = ports
        .iter()
        .map(|(n, p)| json!({"name": n, "port": p, "protocol": "TCP"}))
        .collect();
    let subsets = json!([{"addresses": addresses, "ports": ports}]);
    env.api
        .sim()
        .expect("kube-sim")
        .store_unvalidated(json!({"apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": name, "namespace": ns}, "subsets": subsets}))
        .expect("store the bad Endpoints");
}

/// Bad objects on the API server: skipped parts are counted by reason in
/// `kube_discovery_source_skipped_total`, once per object and change (a
/// relist does not count them again), and good services stay intact.
///
/// kube-sim only: the real API server refuses such objects (its
/// `ValidateEndpointIP` and port rules), and so does kube-sim's API; they
/// are stored through its `/_sim/unvalidated` hook (what an older or
/// corrupted server could hold).
#[tokio::test]
async fn skipped_bad_data_is_counted_by_reason() {
    let env = Env::start(Backend::Sim).await;
    env.namespace("shop").await;
    env.endpoints("shop", "web", &["10.0.0.1"], &[("http", 8080)], json!({}))
        .await;
    unvalidated_endpoints(
        &env,
        "shop",
        "badip",
        &["10.0.0.5", "999.0.0.1", "not-an-ip"],
        &[("http", 8080)],
    );
    unvalidated_endpoints(
        &env,
        "shop",
        "badports",
        &["10.0.0.6"],
        &[("zero", 0), ("big", 65536), ("http", 80), ("http", 81)],
    );
    let ctl = Controller::start(&env, "skipped", &config(&env, ""), &[]).await;
    ctl.wait_ready().await;
    let series = |reason: &str| {
        format!(
            "kube_discovery_source_skipped_total{{cluster=\"\",kind=\"Endpoints\",reason=\"{reason}\"}}"
        )
    };
    let counts = || async {
        let (code, text) = ctl.get("/metrics").await;
        assert_eq!(code, 200);
        [
            "invalid_address",
            "invalid_port",
            "duplicate_port_name",
            "missing_port",
        ]
        .map(|r| sample(&text, &series(r)).unwrap_or(0.0))
    };
    eventually("skips counted", LIMIT, || async {
        (counts().await == [2.0, 2.0, 1.0, 0.0]).then_some(())
    })
    .await;
    // Good data intact, the valid rest of bad objects published.
    env.wait_nodes("shop", "web", "http", &["10.0.0.1"]).await;
    env.wait_nodes("shop", "badip", "http", &["10.0.0.5"]).await;
    let ds = env
        .wait_nodes("shop", "badports", "http", &["10.0.0.6"])
        .await;
    assert_eq!(ds["spec"]["ports"]["http"][0]["port"], 80);
    assert!(ds["spec"]["ports"].get("zero").is_none(), "{ds}");

    // A relist finds the same bad objects: nothing counted again.
    env.force_410().await;
    env.endpoints(
        "shop",
        "web",
        &["10.0.0.1", "10.0.0.2"],
        &[("http", 8080)],
        json!({}),
    )
    .await;
    env.wait_nodes("shop", "web", "http", &["10.0.0.1", "10.0.0.2"])
        .await;
    eventually("the controller relisted", LIMIT, || async {
        let text = ctl.get("/metrics").await.1;
        sample(
            &text,
            "kube_discovery_watch_events_total{cluster=\"\",type=\"relist\"}",
        )
        .filter(|n| *n >= 1.0)
    })
    .await;
    assert_eq!(counts().await, [2.0, 2.0, 1.0, 0.0]);

    // A changed bad object logs (and counts) its current warnings again.
    unvalidated_endpoints(
        &env,
        "shop",
        "badip",
        &["10.0.0.5", "999.0.0.1", "not-an-ip", "10.0.0.300"],
        &[("http", 8080)],
    );
    eventually("changed object counted", LIMIT, || async {
        (counts().await == [5.0, 2.0, 1.0, 0.0]).then_some(())
    })
    .await;
    env.wait_nodes("shop", "web", "http", &["10.0.0.1", "10.0.0.2"])
        .await;
    ctl.stop().await;
}

/// The same in EndpointSlice mode: an IPv6 address in an IPv4 slice and a
/// slice without its `kubernetes.io/service-name` label are counted under
/// `kind="EndpointSlice"`; the good endpoints of the Service are published.
///
/// kube-sim only: the real API server refuses an IPv6 address in an IPv4
/// slice, and so does kube-sim's API; the bad slice is stored through its
/// `/_sim/unvalidated` hook.
#[tokio::test]
async fn skipped_slice_data_is_counted_by_reason() {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::api::{Api, Patch, PatchParams};
    let env = Env::start(Backend::Sim).await;
    env.namespace("shop").await;
    let api: Api<EndpointSlice> = Api::namespaced(env.admin.clone(), "shop");
    let apply = |obj: serde_json::Value| {
        let api = api.clone();
        async move {
            let name = obj["metadata"]["name"].as_str().unwrap().to_string();
            api.patch(
                &name,
                &PatchParams::apply("e2e").force(),
                &Patch::Apply(&obj),
            )
            .await
            .expect("apply EndpointSlice");
        }
    };
    env.api
        .sim()
        .expect("kube-sim")
        .store_unvalidated(json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
            "metadata": {"name": "web-a", "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
            "endpoints": [{"addresses": ["fd00::1"]}, {"addresses": ["10.0.2.1"]}],
            "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}))
        .expect("store the bad EndpointSlice");
    apply(
        json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
        "metadata": {"name": "stray", "namespace": "shop"},
        "endpoints": [{"addresses": ["10.0.2.9"]}],
        "ports": [{"name": "http", "port": 8080}]}),
    )
    .await;
    let ctl = Controller::start(
        &env,
        "skipped-slices",
        &config(&env, "    watch_endpoint_slices: true\n"),
        &[],
    )
    .await;
    ctl.wait_ready().await;
    env.wait_nodes("shop", "web", "http", &["10.0.2.1"]).await;
    let series = |reason: &str| {
        format!(
            "kube_discovery_source_skipped_total{{cluster=\"\",kind=\"EndpointSlice\",reason=\"{reason}\"}}"
        )
    };
    eventually("slice skips counted", LIMIT, || async {
        let text = ctl.get("/metrics").await.1;
        let got = ["invalid_address", "missing_service_label"]
            .map(|r| sample(&text, &series(r)).unwrap_or(0.0));
        (got == [1.0, 1.0]).then_some(())
    })
    .await;
    assert_eq!(env.dsvc_names().await, vec!["shop/web"]);
    ctl.stop().await;
}

/// APISIX accepts cluster ids of up to 64 characters (apisix#12536): such a
/// config loads, the object name and the cluster label (at most 63
/// characters) are shortened with a hash, `spec.cluster` keeps the whole id,
/// and the dump (APISIX's shape) lists the service under it.
#[both_backends]
#[tokio::test]
async fn a_64_character_cluster_id_is_served(backend: Backend) {
    let env = Env::start(backend).await;
    env.namespace("long").await;
    env.slice(
        "long",
        "web",
        "web-1",
        &[("10.66.0.1", true)],
        &[("http", 80)],
    )
    .await;
    let id = "a123456789b123456789c123456789d123456789e123456789f123456789abcd";
    let kubeconfig = env.kubeconfig(&env.admin_token());
    let cfg = format!(
        "discovery:\n  kubernetes:\n    - id: {id}\n      kubeconfig: {k}\n      watch_endpoint_slices: true\n      namespace_selector: {{equal: long}}\nkube_discovery:\n  coalesce_window: 20ms\n  home:\n    kubeconfig: {k}\n",
        k = kubeconfig.display()
    );
    let ctl = Controller::start(&env, "long-id", &cfg, &[]).await;
    ctl.wait_ready().await;
    let objs = eventually("the object of long/web", LIMIT, || async {
        let names = env.dsvc_names().await;
        let ours: Vec<String> = names
            .into_iter()
            .filter(|n| n.starts_with("long/"))
            .collect();
        (!ours.is_empty()).then_some(ours)
    })
    .await;
    assert_eq!(objs.len(), 1, "{objs:?}");
    let name = objs[0].trim_start_matches("long/");
    assert!(name.len() <= 63, "{name}");
    let ds = env.dsvc("long", name).await.expect("object");
    assert_eq!(ds["spec"]["cluster"], id);
    assert_eq!(ds["spec"]["service"], format!("{id}/long/web"));
    assert_eq!(hosts(&ds, "http"), ["10.66.0.1"]);
    let label = ds["metadata"]["labels"]["kubediscovery.io/cluster"]
        .as_str()
        .expect("cluster label");
    assert!(label.len() <= 63 && label != id, "{label}");
    let (code, dump) = ctl.get("/v1/discovery/kubernetes/dump").await;
    assert_eq!(code, 200);
    let dump: serde_json::Value = serde_json::from_str(&dump).expect("dump JSON");
    assert_eq!(dump["endpoints"][0]["id"], id, "{dump}");
    assert_eq!(
        dump["endpoints"][0]["endpoints"][0]["name"], "long/web",
        "{dump}"
    );
    ctl.stop().await;
}

/// `drain_terminating: always`: a serving+terminating endpoint is published
/// next to the ready one, flagged `draining: true` with weight 0, and leaves
/// the nodes once it stops serving; a not-serving one never appears.
#[both_backends]
#[tokio::test]
async fn draining_always_publishes_terminating_endpoints_with_weight_zero(backend: Backend) {
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::api::{Api, Patch, PatchParams};
    let env = Env::start(backend).await;
    env.namespace("shop").await;
    // (ip, ready, serving, terminating)
    let put = |eps: Vec<(&'static str, bool, bool, bool)>| {
        let api: Api<EndpointSlice> = Api::namespaced(env.admin.clone(), "shop");
        async move {
            let obj = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": "web-a", "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
                "addressType": "IPv4",
                "endpoints": eps.iter().map(|(ip, ready, serving, terminating)| json!({
                    "addresses": [ip],
                    "conditions": {"ready": ready, "serving": serving, "terminating": terminating}})).collect::<Vec<_>>(),
                "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
            });
            api.patch(
                "web-a",
                &PatchParams::apply("e2e").force(),
                &Patch::Apply(&obj),
            )
            .await
            .expect("apply EndpointSlice");
        }
    };
    put(vec![
        ("10.0.7.1", true, true, false),
        ("10.0.7.2", false, true, true),
        ("10.0.7.3", false, false, true),
    ])
    .await;
    let ctl = Controller::start(
        &env,
        "draining-always",
        &format!(
            "discovery:\n  kubernetes:\n{}    watch_endpoint_slices: true\nkube_discovery:\n  coalesce_window: 20ms\n  drain_terminating: always\n",
            env.service_block(&env.admin_token())
        ),
        &[],
    )
    .await;
    ctl.wait_ready().await;
    let ds = env
        .wait_nodes("shop", "web", "http", &["10.0.7.1", "10.0.7.2"])
        .await;
    let nodes: Vec<(String, u64, Option<bool>)> = ds["spec"]["ports"]["http"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["host"].as_str().unwrap().to_string(),
                n["weight"].as_u64().unwrap(),
                n["draining"].as_bool(),
            )
        })
        .collect();
    assert_eq!(
        nodes,
        vec![
            ("10.0.7.1".to_string(), 50, None),
            ("10.0.7.2".to_string(), 0, Some(true)),
        ]
    );
    // The terminating pod stops serving: it leaves the nodes.
    put(vec![
        ("10.0.7.1", true, true, false),
        ("10.0.7.2", false, false, true),
    ])
    .await;
    env.wait_nodes("shop", "web", "http", &["10.0.7.1"]).await;
    ctl.stop().await;
}

/// `topology: true`: the watch decodes the full k8s-openapi objects (the
/// lean ones it uses otherwise never decode `nodeName`, `zone`, `targetRef`)
/// and every node carries them, in both modes.
#[both_backends]
#[tokio::test]
async fn topology_output_carries_zone_node_name_and_target_ref(backend: Backend) {
    use k8s_openapi::api::core::v1::Endpoints;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use kube::api::{Api, Patch, PatchParams};
    let env = Env::start(backend).await;
    env.namespace("shop").await;
    let target = |pod: &str| {
        json!({"kind": "Pod", "namespace": "shop", "name": pod,
               "uid": "0a1b2c3d-0000-4000-8000-000000000001"})
    };
    let slice = json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-a", "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.0.8.1"], "conditions": {"ready": true},
                       "nodeName": "node-1", "zone": "zone-a", "targetRef": target("web-1")}],
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]});
    let apply = PatchParams::apply("e2e").force();
    Api::<EndpointSlice>::namespaced(env.admin.clone(), "shop")
        .patch("web-a", &apply, &Patch::Apply(&slice))
        .await
        .expect("apply EndpointSlice");
    let endpoints = json!({"apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": "api", "namespace": "shop"},
        "subsets": [{"addresses": [{"ip": "10.0.8.2", "nodeName": "node-2", "targetRef": target("api-1")}],
                     "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}]}]});
    Api::<Endpoints>::namespaced(env.admin.clone(), "shop")
        .patch("api", &apply, &Patch::Apply(&endpoints))
        .await
        .expect("apply Endpoints");
    // One controller at a time (the same instance): the second one's
    // Endpoints mode takes over the DiscoveredServices.
    for (name, mode, service, want) in [
        (
            "topology-slices",
            "    watch_endpoint_slices: true\n",
            "web",
            json!({"host": "10.0.8.1", "port": 8080, "weight": 50, "zone": "zone-a",
                   "nodeName": "node-1", "targetRef": target("web-1")}),
        ),
        (
            "topology-endpoints",
            "",
            "api",
            json!({"host": "10.0.8.2", "port": 8080, "weight": 50,
                   "nodeName": "node-2", "targetRef": target("api-1")}),
        ),
    ] {
        let ctl = Controller::start(
            &env,
            name,
            &format!(
                "discovery:\n  kubernetes:\n{}{mode}kube_discovery:\n  coalesce_window: 20ms\n  topology: true\n",
                env.service_block(&env.admin_token())
            ),
            &[],
        )
        .await;
        ctl.wait_ready().await;
        let host = want["host"].as_str().unwrap().to_string();
        let ds = env.wait_nodes("shop", service, "http", &[&host]).await;
        assert_eq!(ds["spec"]["ports"]["http"][0], want, "{name}");
        ctl.stop().await;
    }
}
