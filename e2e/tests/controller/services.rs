//! The Service read with its spec (issue 17), on both API servers: its ports
//! give Service-port aliases (`ns/name:<service port>` resolves like the
//! port key) and each port's `appProtocol`, in Endpoints and EndpointSlice
//! mode, following Service changes. The Services here have no selector (as
//! in `sources.rs`), so on the real API server no endpoint controller
//! rewrites the endpoints the test writes.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::controller_support;

use controller_support::{Backend, Controller, Env, LIMIT, eventually};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use testenv::both_backends;

fn config(env: &Env, extra: &str) -> String {
    format!(
        "discovery:\n  kubernetes:\n{}{extra}kube_discovery:\n  coalesce_window: 20ms\n",
        env.service_block(&env.admin_token())
    )
}

/// Creates or replaces (SSA) the selectorless Service `ns/name` with `ports`.
async fn service(env: &Env, ns: &str, name: &str, ports: Value) {
    let obj = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"ports": ports}});
    let api: Api<Service> = Api::namespaced(env.admin.clone(), ns);
    api.patch(
        name,
        &PatchParams::apply("e2e").force(),
        &Patch::Apply(&obj),
    )
    .await
    .expect("apply Service");
}

/// Waits until the object `ns/name` has `aliases` and `appProtocols` as given
/// (`{}`: absent).
async fn wait_extras(env: &Env, ns: &str, name: &str, aliases: Value, app: Value) -> Value {
    let norm = |v: &Value| if v.is_null() { json!({}) } else { v.clone() };
    eventually(
        &format!("{ns}/{name}: aliases {aliases}, appProtocols {app}"),
        LIMIT,
        || async {
            let ds = env.dsvc(ns, name).await?;
            (norm(&ds["spec"]["aliases"]) == aliases && norm(&ds["spec"]["appProtocols"]) == app)
                .then_some(ds)
        },
    )
    .await
}

/// `GET /nodes?service=...` of the controller: status and body.
async fn nodes(ctl: &Controller, service: &str) -> (u16, String) {
    ctl.get(&format!("/v1/discovery/kubernetes/nodes?service={service}"))
        .await
}

#[both_backends]
#[tokio::test]
async fn service_port_aliases_and_app_protocols(backend: Backend) {
    let env = Env::start(backend).await;
    env.namespace("shop").await;
    // targetPort by container-port name and by number; one appProtocol.
    service(
        &env,
        "shop",
        "web",
        json!([
            {"name": "http", "port": 80, "targetPort": "web", "appProtocol": "kubernetes.io/h2c"},
            {"name": "metrics", "port": 9090, "targetPort": 9091}
        ]),
    )
    .await;
    env.endpoints(
        "shop",
        "web",
        &["10.0.0.1", "10.0.0.2"],
        &[("http", 8080), ("metrics", 9091)],
        json!({}),
    )
    .await;
    // Endpoints without a Service: published as before, no aliases.
    env.endpoints(
        "shop",
        "lonely",
        &["10.0.0.9"],
        &[("http", 8080)],
        json!({}),
    )
    .await;

    // ---- Endpoints mode
    let ctl = Controller::start(&env, "svc-ep", &config(&env, ""), &[]).await;
    ctl.wait_ready().await;
    let ds = wait_extras(
        &env,
        "shop",
        "web",
        json!({"80": "http", "9090": "metrics"}),
        json!({"http": "kubernetes.io/h2c"}),
    )
    .await;
    // The APISIX keys and nodes are what they always were.
    assert_eq!(
        ds["spec"]["ports"]["http"],
        json!([{"host": "10.0.0.1", "port": 8080, "weight": 50},
               {"host": "10.0.0.2", "port": 8080, "weight": 50}])
    );
    assert_eq!(
        ds["spec"]["ports"]
            .as_object()
            .unwrap()
            .keys()
            .collect::<Vec<_>>(),
        ["http", "metrics"]
    );
    let lonely = env
        .wait_nodes("shop", "lonely", "http", &["10.0.0.9"])
        .await;
    assert!(lonely["spec"].get("aliases").is_none(), "{lonely}");
    // By Service port number and by name, the same nodes.
    let by_name = nodes(&ctl, "shop/web:http").await;
    assert_eq!(by_name.0, 200, "{}", by_name.1);
    assert_eq!(nodes(&ctl, "shop/web:80").await, by_name);
    let metrics = nodes(&ctl, "shop/web:9090").await;
    assert_eq!(metrics.0, 200);
    assert!(metrics.1.contains("9091"), "{}", metrics.1);
    assert_eq!(nodes(&ctl, "shop/web:81").await.0, 404);
    // The dump: APISIX's value untouched, the extension next to it.
    let (code, dump) = ctl.get("/v1/discovery/kubernetes/dump").await;
    assert_eq!(code, 200);
    let dump: Value = serde_json::from_str(&dump).unwrap();
    let entry = dump["endpoints"][0]["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "shop/web")
        .cloned()
        .unwrap();
    assert_eq!(entry["appProtocols"], json!({"http": "kubernetes.io/h2c"}));
    let value: Value = serde_json::from_str(entry["value"].as_str().unwrap()).unwrap();
    assert_eq!(value, ds["spec"]["ports"]);

    // The Service changes: port 80 -> 81, appProtocol dropped. The object follows.
    service(
        &env,
        "shop",
        "web",
        json!([
            {"name": "http", "port": 81, "targetPort": "web"},
            {"name": "metrics", "port": 9090, "targetPort": 9091}
        ]),
    )
    .await;
    wait_extras(
        &env,
        "shop",
        "web",
        json!({"81": "http", "9090": "metrics"}),
        json!({}),
    )
    .await;
    assert_eq!(nodes(&ctl, "shop/web:81").await, by_name);
    assert_eq!(nodes(&ctl, "shop/web:80").await.0, 404);
    ctl.stop().await;

    // ---- EndpointSlice mode (a Service with only hand-written slices)
    service(
        &env,
        "shop",
        "api",
        json!([{"name": "grpc", "port": 50051, "targetPort": "grpc", "appProtocol": "grpc"}]),
    )
    .await;
    env.slice(
        "shop",
        "api",
        "api-a",
        &[("10.0.2.1", true)],
        &[("grpc", 9000)],
    )
    .await;
    let ctl = Controller::start(
        &env,
        "svc-slices",
        &config(&env, "    watch_endpoint_slices: true\n"),
        &[],
    )
    .await;
    ctl.wait_ready().await;
    wait_extras(
        &env,
        "shop",
        "api",
        json!({"50051": "grpc"}),
        json!({"grpc": "grpc"}),
    )
    .await;
    let by_name = nodes(&ctl, "shop/api:grpc").await;
    assert_eq!(by_name.0, 200);
    assert_eq!(nodes(&ctl, "shop/api:50051").await, by_name);
    // The Service deleted: its object keeps its nodes, without the extras
    // (the slices are the source; a Service never holds nodes back).
    let api: Api<Service> = Api::namespaced(env.admin.clone(), "shop");
    api.delete("api", &Default::default())
        .await
        .expect("delete Service");
    wait_extras(&env, "shop", "api", json!({}), json!({})).await;
    let logs = ctl.logs();
    assert!(!logs.contains("Service watch failed"), "{logs}");
    ctl.stop().await;
}
