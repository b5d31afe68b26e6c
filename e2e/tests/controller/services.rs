//! The Service read with its spec (issue 17), on both API servers: its ports
//! give Service-port aliases (`ns/name:<service port>` resolves like the
//! port key) and each port's `appProtocol`, in Endpoints and EndpointSlice
//! mode, following Service changes. The Services here have no selector (as
//! in `sources.rs`), so on the real API server no endpoint controller
//! rewrites the endpoints the test writes.
//!
//! Also a restart whose first Services list fails once or is slow (issue 29,
//! item 1): nothing is written until the list is complete, and `/readyz`
//! stays 503 until then.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::controller_support;
use crate::sources::{config, sample};

use controller_support::{Backend, Controller, Env, LIMIT, condition, eventually};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};
use testenv::both_backends;

/// Creates or replaces (SSA) the selectorless Service `ns/name` with `ports`.
async fn service(env: &Env, ns: &str, name: &str, ports: Value) {
    apply_service(env, ns, name, json!({}), json!({"ports": ports})).await;
}

/// Creates or replaces (SSA) the Service `ns/name` (no selector in `spec`
/// here).
async fn apply_service(env: &Env, ns: &str, name: &str, annotations: Value, spec: Value) {
    let obj = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns, "annotations": annotations},
        "spec": spec});
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

/// The config with `service_port_aliases: true` (off by default).
fn with_aliases(env: &Env, extra: &str) -> String {
    config(env, extra).replace(
        "kube_discovery:\n",
        "kube_discovery:\n  service_port_aliases: true\n",
    )
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
    let ctl = Controller::start(&env, "svc-ep", &with_aliases(&env, ""), &[]).await;
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
        &with_aliases(&env, "    watch_endpoint_slices: true\n"),
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
    // A Service port whose targetPort no endpoint has: no nodes for it, and
    // the object says why (Ready=False, TargetPortNotFound, naming it).
    service(
        &env,
        "shop",
        "api",
        json!([{"name": "grpc", "port": 50051, "targetPort": "grpc", "appProtocol": "grpc"},
               {"name": "metrics", "port": 9100, "targetPort": "prom"}]),
    )
    .await;
    let ds = env
        .wait_condition("shop", "api", "Ready", "False", "TargetPortNotFound")
        .await;
    let c = condition(&ds, "Ready");
    let message = c["message"].as_str().unwrap();
    assert!(
        message.contains("9100 (metrics)") && message.contains("targetPort prom"),
        "{message}"
    );
    assert_eq!(nodes(&ctl, "shop/api:9100").await.0, 404);
    // The endpoints gain the port (the EndpointSlice controller names a
    // slice port after the Service port): resolved, Ready again.
    env.slice(
        "shop",
        "api",
        "api-a",
        &[("10.0.2.1", true)],
        &[("grpc", 9000), ("metrics", 9100)],
    )
    .await;
    let ds = env
        .wait_condition("shop", "api", "Ready", "True", "AllPortsHaveNodes")
        .await;
    let c = condition(&ds, "Ready");
    assert_eq!(c["status"], "True");
    service(
        &env,
        "shop",
        "api",
        json!([{"name": "grpc", "port": 50051, "targetPort": "grpc", "appProtocol": "grpc"}]),
    )
    .await;
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

/// Creates or replaces (SSA) the selectorless one-port Service `ns/name`
/// with `annotations`.
async fn annotated_service(env: &Env, ns: &str, name: &str, annotations: Value) {
    let spec = json!({"ports": [{"name": "http", "port": 80, "targetPort": 8080}]});
    apply_service(env, ns, name, annotations, spec).await;
}

/// The weights of the nodes of port `http` of `ns/name`, once it exists.
async fn wait_weights(env: &Env, ns: &str, name: &str, want: &[u64]) {
    eventually(
        &format!("{ns}/{name} http weights = {want:?}"),
        LIMIT,
        || async {
            let ds = env.dsvc(ns, name).await?;
            let got: Vec<u64> = ds["spec"]["ports"]["http"]
                .as_array()?
                .iter()
                .filter_map(|n| n["weight"].as_u64())
                .collect();
            (got == want).then_some(())
        },
    )
    .await;
}

/// `kubediscovery.io/export` (opt-out by default, opt-in with
/// `kube_discovery.export: opt-in`) and `kubediscovery.io/weight`, valid and
/// invalid, changed on a running controller: the object follows promptly;
/// an invalid value is a warning naming the Service and the annotation and
/// a counted skip, and the Service is handled as without it.
#[both_backends]
#[tokio::test]
async fn export_and_weight_annotations(backend: Backend) {
    let env = Env::start(backend).await;
    env.namespace("shop").await;
    for name in ["web", "api"] {
        env.endpoints("shop", name, &["10.0.0.1"], &[("http", 8080)], json!({}))
            .await;
    }
    annotated_service(&env, "shop", "web", json!({"kubediscovery.io/weight": "7"})).await;
    annotated_service(
        &env,
        "shop",
        "api",
        json!({"kubediscovery.io/export": "false"}),
    )
    .await;

    // ---- export: all (default)
    let ctl = Controller::start(&env, "annot", &config(&env, ""), &[]).await;
    ctl.wait_ready().await;
    wait_weights(&env, "shop", "web", &[7]).await;
    let web = env.dsvc("shop", "web").await.unwrap();
    assert!(
        web["spec"].get("aliases").is_none(),
        "aliases are off by default: {web}"
    );
    assert!(env.dsvc("shop", "api").await.is_none(), "opted out");
    // Opt back in: published; out again: deleted.
    annotated_service(&env, "shop", "api", json!({})).await;
    wait_weights(&env, "shop", "api", &[50]).await;
    annotated_service(
        &env,
        "shop",
        "api",
        json!({"kubediscovery.io/export": "false"}),
    )
    .await;
    env.wait_gone("shop", "api").await;
    // Weight changed, then invalid: default_weight, a warning, a count.
    annotated_service(&env, "shop", "web", json!({"kubediscovery.io/weight": "0"})).await;
    wait_weights(&env, "shop", "web", &[0]).await;
    annotated_service(
        &env,
        "shop",
        "web",
        json!({"kubediscovery.io/weight": "heavy", "kubediscovery.io/export": "maybe"}),
    )
    .await;
    wait_weights(&env, "shop", "web", &[50]).await;
    let series = "kube_discovery_source_skipped_total{cluster=\"\",kind=\"Service\",reason=\"invalid_annotation\"}";
    let metrics = eventually("invalid annotations counted", LIMIT, || async {
        let (_, text) = ctl.get("/metrics").await;
        (sample(&text, series) == Some(2.0)).then_some(text)
    })
    .await;
    assert!(metrics.contains(series));
    let logs = ctl.logs();
    assert!(
        logs.contains("Service shop/web: annotation kubediscovery.io/weight=")
            && logs.contains("heavy")
            && logs.contains("kubediscovery.io/export="),
        "{logs}"
    );
    // ... and an Event on the Service (`kubectl describe service web`),
    // with its uid, naming both annotations: kube-runtime's recorder folds
    // the two into one Event with a count.
    let svc_uid = Api::<Service>::namespaced(env.admin.clone(), "shop")
        .get("web")
        .await
        .expect("get Service")
        .metadata
        .uid;
    // Both annotations reported (count 2) before the relist below counts
    // from here: the second one is a patch of the series that can land a
    // moment after the Event is first listed.
    let evs = eventually("an InvalidAnnotation Event of both", LIMIT, || async {
        let evs = env
            .events("shop", "InvalidAnnotation", "Service", "web")
            .await;
        let count = env
            .event_count("shop", "InvalidAnnotation", "Service", "web")
            .await;
        (count >= 2).then_some(evs)
    })
    .await;
    assert_eq!(evs.len(), 1, "{evs:?}");
    assert_eq!(evs[0].regarding.as_ref().unwrap().uid, svc_uid);
    assert_eq!(evs[0].type_.as_deref(), Some("Warning"));
    let note = evs[0].note.clone().unwrap_or_default();
    assert!(note.contains("Service shop/web"), "{note}");
    // A relist that finds the same bad Service emits nothing new.
    let before = env
        .event_count("shop", "InvalidAnnotation", "Service", "web")
        .await;
    let lists = || ctl.logs().matches("Services listed").count();
    let listed = lists();
    env.force_410().await;
    eventually("the Services relisted", LIMIT, || async {
        (lists() > listed).then_some(())
    })
    .await;
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    let after = env
        .events("shop", "InvalidAnnotation", "Service", "web")
        .await;
    let count = env
        .event_count("shop", "InvalidAnnotation", "Service", "web")
        .await;
    assert_eq!((after.len(), count), (1, before), "{after:?}");
    ctl.stop().await;

    // ---- export: opt-in
    let ctl = Controller::start(
        &env,
        "annot-optin",
        &config(&env, "").replace("kube_discovery:\n", "kube_discovery:\n  export: opt-in\n"),
        &[],
    )
    .await;
    ctl.wait_ready().await;
    // web (invalid export value = unannotated) is not exported: its object goes.
    env.wait_gone("shop", "web").await;
    assert!(env.dsvc("shop", "api").await.is_none());
    annotated_service(
        &env,
        "shop",
        "api",
        json!({"kubediscovery.io/export": "true", "kubediscovery.io/weight": "3"}),
    )
    .await;
    wait_weights(&env, "shop", "api", &[3]).await;
    assert!(env.dsvc("shop", "web").await.is_none());
    ctl.stop().await;
}

/// Creates the ExternalName Service `ns/name` pointing at `host`.
async fn external_service(env: &Env, ns: &str, name: &str, host: &str) {
    let spec = json!({"type": "ExternalName", "externalName": host,
                      "ports": [{"name": "https", "port": 443}]});
    apply_service(env, ns, name, json!({}), spec).await;
}

/// ExternalName Services: not published by default; with
/// `external_name: {enabled: true, allow: [...]}` an allowed host becomes a
/// node per port, one outside the allowlist is skipped with a warning and
/// counted.
#[both_backends]
#[tokio::test]
async fn external_name_allowed_and_refused(backend: Backend) {
    let env = Env::start(backend).await;
    env.namespace("shop").await;
    external_service(&env, "shop", "db", "db.example.com").await;
    external_service(&env, "shop", "evil", "db.example.com.attacker.io").await;
    env.endpoints("shop", "web", &["10.0.0.1"], &[("http", 8080)], json!({}))
        .await;

    // Default: off.
    let ctl = Controller::start(&env, "ext-off", &config(&env, ""), &[]).await;
    ctl.wait_ready().await;
    env.wait_nodes("shop", "web", "http", &["10.0.0.1"]).await;
    assert!(env.dsvc("shop", "db").await.is_none());
    ctl.stop().await;

    let cfg = config(&env, "").replace(
        "kube_discovery:\n",
        "kube_discovery:\n  external_name: {enabled: true, allow: ['[a-z0-9-]+\\.example\\.com']}\n",
    );
    let ctl = Controller::start(&env, "ext-on", &cfg, &[]).await;
    ctl.wait_ready().await;
    let ds = env
        .wait_nodes("shop", "db", "https", &["db.example.com"])
        .await;
    assert_eq!(
        ds["spec"]["ports"]["https"],
        json!([{"host": "db.example.com", "port": 443, "weight": 50}])
    );
    let series = "kube_discovery_source_skipped_total{cluster=\"\",kind=\"Service\",reason=\"external_name_refused\"}";
    eventually("the refused ExternalName is counted", LIMIT, || async {
        let (_, text) = ctl.get("/metrics").await;
        (sample(&text, series) == Some(1.0)).then_some(())
    })
    .await;
    assert!(env.dsvc("shop", "evil").await.is_none());
    let logs = ctl.logs();
    assert!(
        logs.contains("Service shop/evil: spec.externalName")
            && logs.contains("matches no kube_discovery.external_name.allow regex"),
        "{logs}"
    );
    // ... and a Warning Event on the Service, naming the host.
    let evs = eventually("an ExternalNameRefused Event", LIMIT, || async {
        let evs = env
            .events("shop", "ExternalNameRefused", "Service", "evil")
            .await;
        (!evs.is_empty()).then_some(evs)
    })
    .await;
    let note = evs[0].note.clone().unwrap_or_default();
    assert!(note.contains("spec.externalName"), "{note}");
    // Re-pointed outside the allowlist: the object goes.
    external_service(&env, "shop", "db", "db.example.org").await;
    env.wait_gone("shop", "db").await;
    ctl.stop().await;
}

/// Issue 29, item 1: a restart whose first Services list fails once (500)
/// or is slow (6 s, past the 5 s the list once had before the endpoints
/// were published without it). Until the list is complete, an unknown
/// Service must not count as exported (`export: all` would publish `off`)
/// nor as not exported (`export: opt-in` would delete `in`), and a missing
/// ExternalName Service must not delete `db`: the write log of each restart
/// shows no write at all (nothing changed), and `/readyz` is 200 only once
/// the Services were listed.
#[both_backends]
#[tokio::test]
async fn a_restart_without_the_service_list_deletes_and_creates_nothing(backend: Backend) {
    let env = Env::start(backend).await;
    env.namespace("shop").await;
    for name in ["in", "off"] {
        env.endpoints("shop", name, &["10.0.0.1"], &[("http", 8080)], json!({}))
            .await;
    }
    annotated_service(
        &env,
        "shop",
        "in",
        json!({"kubediscovery.io/export": "true"}),
    )
    .await;
    annotated_service(
        &env,
        "shop",
        "off",
        json!({"kubediscovery.io/export": "false"}),
    )
    .await;
    let spec = json!({"type": "ExternalName", "externalName": "db.example.com",
                      "ports": [{"name": "https", "port": 443}]});
    apply_service(
        &env,
        "shop",
        "db",
        json!({"kubediscovery.io/export": "true"}),
        spec,
    )
    .await;
    // `in` and `db` are published under both export modes, `off` under none.
    let cfg = |export: &str| {
        config(&env, "").replace(
            "kube_discovery:\n",
            &format!(
                "kube_discovery:\n  export: {export}\n  external_name: {{enabled: true, allow: ['[a-z0-9-]+\\.example\\.com']}}\n"
            ),
        )
    };
    let ctl = Controller::start(&env, "svc-list-first", &cfg("opt-in"), &[]).await;
    ctl.wait_ready().await;
    env.wait_nodes("shop", "in", "http", &["10.0.0.1"]).await;
    env.wait_nodes("shop", "db", "https", &["db.example.com"])
        .await;
    assert!(env.dsvc("shop", "off").await.is_none());
    ctl.stop().await;

    let fail = json!({"fail": {"verb": "list", "resource": "services", "count": 1, "code": 500}});
    let slow =
        json!({"latency": {"verb": "list", "resource": "services", "millis": 6000, "count": 1}});
    let mut wrong = Vec::new();
    for (name, export, fault) in [
        ("svc-list-fails-opt-in", "opt-in", &fail),
        ("svc-list-fails-all", "all", &fail),
        ("svc-list-slow-opt-in", "opt-in", &slow),
    ] {
        env.api.fault(fault).await.expect("fault");
        let before = env.mark().await;
        let started = std::time::Instant::now();
        let ctl = Controller::start(&env, name, &cfg(export), &[]).await;
        let listed = || ctl.logs().contains("Services listed");
        let body = eventually(&format!("{name}: /readyz = 200"), LIMIT, || async {
            let (code, body) = ctl.get("/readyz").await;
            (code == 200).then_some(body)
        })
        .await;
        if !listed() {
            wrong.push(format!(
                "{name}: /readyz 200 before the Services were listed: {body}"
            ));
        }
        if fault == &fail && !ctl.logs().contains("Service watch failed") {
            wrong.push(format!("{name}: the fault did not fail the list"));
        }
        if fault == &slow && started.elapsed() < std::time::Duration::from_secs(6) {
            wrong.push(format!("{name}: ready before the slow list could answer"));
        }
        // The published state once the Services are in (also what the next
        // restart starts from).
        env.wait_nodes("shop", "in", "http", &["10.0.0.1"]).await;
        env.wait_nodes("shop", "db", "https", &["db.example.com"])
            .await;
        env.wait_gone("shop", "off").await;
        let writes = env.dsvc_writes_since(before).await;
        let mut names: Vec<String> = writes
            .iter()
            .map(|w| {
                let field = |f: &str| w[f].as_str().unwrap_or("").to_string();
                format!("{} {}", field("verb"), field("name"))
            })
            .collect();
        names.sort();
        if !names.is_empty() {
            wrong.push(format!("{name}: the restart wrote {names:?}"));
        }
        ctl.stop().await;
        env.api.fault(&json!({"clear": true})).await.expect("clear");
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    assert!(env.dsvc("shop", "in").await.is_some());
    assert!(env.dsvc("shop", "db").await.is_some());
    assert!(env.dsvc("shop", "off").await.is_none());
}
