//! Controller end to end on both API servers: the HTTP API (dump, nodes,
//! auth) and readiness gating.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::controller_support;

use controller_support::{Backend, Controller, Env, LIMIT, eventually, http_get};
use serde_json::{Value, json};
use testenv::both_backends;

#[both_backends]
#[tokio::test]
async fn dump_and_nodes_api_with_bearer_auth(backend: Backend) {
    let env = Env::start(backend).await;
    env.namespace("default").await;
    env.endpoints(
        "default",
        "plat-dev",
        &["10.5.10.110", "10.5.10.109"],
        &[("port", 3306)],
        json!({}),
    )
    .await;
    let token_file = env.path("http-token");
    std::fs::write(&token_file, "api-s3cret\n").unwrap();
    let admin = env.admin_token();
    let cfg = format!(
        "discovery:\n  kubernetes:\n{}kube_discovery:\n  coalesce_window: 20ms\n  http:\n    auth_token_file: {}\n",
        env.service_block(&admin),
        token_file.display()
    );
    let ctl = Controller::start(&env, "api", &cfg, &[]).await;
    ctl.wait_ready().await;
    env.wait_nodes(
        "default",
        "plat-dev",
        "port",
        &["10.5.10.109", "10.5.10.110"],
    )
    .await;

    let q = "/v1/discovery/kubernetes/nodes?service=default/plat-dev:port";
    assert_eq!(http_get(ctl.http, q, None).await.0, 401);
    assert_eq!(http_get(ctl.http, q, Some("wrong")).await.0, 401);
    let (code, body) = http_get(ctl.http, q, Some("api-s3cret")).await;
    assert_eq!(code, 200, "{body}");
    // The reference page's example, byte for byte in APISIX's node shape.
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!([{"host": "10.5.10.109", "port": 3306, "weight": 50}, {"host": "10.5.10.110", "port": 3306, "weight": 50}])
    );
    let (code, body) = http_get(
        ctl.http,
        "/v1/discovery/kubernetes/nodes?service=default/nope:port",
        Some("api-s3cret"),
    )
    .await;
    assert_eq!(code, 404, "{body}");
    let (code, body) = http_get(
        ctl.http,
        "/v1/discovery/kubernetes/nodes?service=default-plat-dev",
        Some("api-s3cret"),
    )
    .await;
    assert_eq!(code, 400, "{body}");
    assert!(body.contains("port"), "the 400 says what is wrong: {body}");

    let (code, body) = http_get(
        ctl.http,
        "/v1/discovery/kubernetes/dump",
        Some("api-s3cret"),
    )
    .await;
    assert_eq!(code, 200);
    let dump: Value = serde_json::from_str(&body).unwrap();
    let eps = &dump["endpoints"][0];
    assert_eq!(eps["id"], "");
    let entry = eps["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "default/plat-dev")
        .expect("dump entry");
    let value: Value =
        serde_json::from_str(entry["value"].as_str().expect("value is a JSON string")).unwrap();
    assert_eq!(value["port"][0]["host"], "10.5.10.109");
    assert!(dump["config"].is_array(), "{dump}");
    assert!(
        !body.contains(&admin),
        "the dump must not contain the API token"
    );
    assert!(!body.contains("api-s3cret"));
    // Probes and metrics need no token.
    assert_eq!(ctl.get("/healthz").await.0, 200);
    assert_eq!(ctl.get("/metrics").await.0, 200);
    ctl.stop().await;
}

#[both_backends]
#[tokio::test]
async fn readyz_is_503_until_the_first_list_is_written_then_reports_failing_writes(
    backend: Backend,
) {
    let env = Env::start(backend).await;
    env.namespace("ns").await;
    env.endpoints("ns", "web", &["10.6.0.1"], &[("http", 80)], json!({}))
        .await;
    // 1. The first write is slow (4 s): listed, the write in flight, not ready yet.
    let slow = json!({"latency": {"verb": "patch", "resource": "discoveredservices", "millis": 4000, "count": 1}});
    env.api.fault(&slow).await.expect("fault");
    let cfg = format!(
        "discovery:\n  kubernetes:\n{}kube_discovery:\n  coalesce_window: 20ms\n",
        env.service_block(&env.admin_token())
    );
    let ctl = Controller::start(&env, "ready", &cfg, &[]).await;
    let body = eventually(
        "readyz reports the listed-but-unwritten state",
        LIMIT,
        || async {
            let (code, body) = ctl.get("/readyz").await;
            assert_eq!(code, 503, "ready before the first write was done: {body}");
            body.contains("writing first list").then_some(body)
        },
    )
    .await;
    assert!(body.contains("\"ready\":false"), "{body}");
    ctl.wait_ready().await;
    env.wait_nodes("ns", "web", "http", &["10.6.0.1"]).await;

    // 2. After a restart, every write fails: attempted, reported, and ready
    //    all the same (one refused object must not keep the controller
    //    unready forever); what the server held is untouched.
    ctl.stop().await;
    env.endpoints("ns", "web", &["10.6.0.2"], &[("http", 80)], json!({}))
        .await;
    let fail = json!({"fail": {"verb": "patch", "resource": "discoveredservices", "count": 100000, "code": 500}});
    env.api.fault(&fail).await.expect("fault");
    let ctl = Controller::start(&env, "ready2", &cfg, &[]).await;
    ctl.wait_ready().await;
    eventually("the failing write is reported", LIMIT, || async {
        let (_, m) = ctl.get("/metrics").await;
        (m.contains("result=\"error_api_error\"")
            && m.contains("kube_discovery_objects_failing{cluster=\"\",reason=\"api_error\"} 1"))
        .then_some(())
    })
    .await;
    // ... and explained where `kubectl describe service web` shows it: one
    // WriteFailed Event on the Service, not one per retry.
    let evs = eventually("a WriteFailed Event on the Service", LIMIT, || async {
        let evs = env.events("ns", "WriteFailed", "Service", "web").await;
        (!evs.is_empty()).then_some(evs)
    })
    .await;
    let note = evs[0].note.clone().unwrap_or_default();
    assert!(
        note.contains("ns/web") && note.contains("api_error"),
        "{note}"
    );
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    assert_eq!(
        env.events("ns", "WriteFailed", "Service", "web")
            .await
            .len(),
        1,
        "retries add no Event objects"
    );
    env.wait_nodes("ns", "web", "http", &["10.6.0.1"]).await;
    env.api
        .fault(&json!({"clear": true}))
        .await
        .expect("clear faults");
    env.wait_nodes("ns", "web", "http", &["10.6.0.2"]).await;
    eventually("no longer failing once written", LIMIT, || async {
        let (_, m) = ctl.get("/metrics").await;
        m.contains("kube_discovery_objects_failing{cluster=\"\",reason=\"api_error\"} 0")
            .then_some(())
    })
    .await;
    ctl.stop().await;
}
