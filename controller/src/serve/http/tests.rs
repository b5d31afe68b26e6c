use super::*;
use axum::body::Body;
use http::Request;
use kube_discovery_core::{Node, PortMap, ServiceKey, ServiceNodes, SourceKind};
use tower::ServiceExt;

fn state(token: Option<&str>) -> AppState {
    let shared = Arc::new(ControllerState::new([""]));
    let k = ServiceKey::new("", "default", "plat-dev");
    let mut ports = PortMap::new();
    ports.insert(
        "port".into(),
        vec![
            Node::new("10.5.10.109", 3306, 50),
            Node::new("10.5.10.110", 3306, 50),
        ],
    );
    shared.set_desired(
        &k,
        Some(ServiceNodes::new(
            k.clone(),
            SourceKind::Endpoints,
            ports,
            None,
        )),
    );
    AppState::new(
        shared,
        Arc::new(crate::serve::metrics::Metrics::default().registry()),
        json!({"client": {"token": "<redacted>"}}),
        token.map(|t| Arc::new(ApiToken::fixed(t))),
    )
}

/// [`dump_json`], parsed.
fn dump_value(shared: &ControllerState, config: &Value) -> Value {
    serde_json::from_slice(&dump_json(shared, config).unwrap()).unwrap()
}

/// The dump API serves what the snapshot sink publishes (moved from
/// `snapshot_sink`'s tests: `http` uses `snapshot_sink::dump_of`, not the
/// reverse), written from the shared `Arc`s: every registered cluster
/// (also an empty one, and in id order), the services of each, the
/// extension fields as `with_port_extras` adds them, the config as a list.
#[test]
fn dump_of_shared_equals_the_http_dump() {
    use kube_discovery_core::source::service::PortExtras;
    use std::collections::BTreeMap;
    let shared = ControllerState::new(["west", "", "empty"]);
    for (cluster, ns, name) in [
        ("west", "b", "y"),
        ("", "default", "web"),
        ("west", "a", "z"),
        ("", "a", "x"),
    ] {
        let k = ServiceKey::new(cluster, ns, name);
        let ports = PortMap::from([(
            "http".to_string(),
            vec![Node::new("10.0.0.1", 80, 100), Node::new("10.0.0.2", 80, 1)],
        )]);
        let mut svc = ServiceNodes::new(k.clone(), SourceKind::Endpoints, ports, None);
        if name == "z" {
            svc = svc.with_extras(PortExtras {
                aliases: BTreeMap::from([("80".into(), "http".into())]),
                app_protocols: BTreeMap::new(),
                unresolved: Vec::new(),
            });
        }
        shared.set_desired(&k, Some(svc));
    }
    let d = crate::write::snapshot_sink::dump_of(&shared);
    assert_eq!(d.services(), 4);
    assert_eq!(d.clusters.len(), 3);
    let want = kube_discovery_core::snapshot::with_port_extras(d.to_apisix_endpoints(), |key| {
        shared
            .desired(key)
            .map(|s| s.extras.clone())
            .filter(|x| !x.is_empty())
    });
    let http = dump_value(&shared, &Value::Null);
    assert_eq!(http["endpoints"], want);
    assert_eq!(
        http["endpoints"][2]["endpoints"][0]["aliases"],
        json!({"80": "http"})
    );
    assert_eq!(http["config"], json!([]));
    assert_eq!(
        dump_value(&shared, &json!({"a": 1}))["config"],
        json!([{"a": 1}])
    );
    assert_eq!(dump_value(&shared, &json!([1, 2]))["config"], json!([1, 2]));
}

async fn get(st: AppState, uri: &str, token: Option<&str>) -> (StatusCode, String) {
    let mut req = Request::get(uri);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let resp = router(st)
        .oneshot(req.body(Body::empty()).unwrap())
        .await
        .unwrap();
    let code = resp.status();
    let body = axum::body::to_bytes(resp.into_body(), 1 << 20)
        .await
        .unwrap();
    (code, String::from_utf8(body.to_vec()).unwrap())
}

/// Service-port aliases and appProtocols: the nodes API resolves an
/// alias, the dump carries both next to the untouched APISIX `value`.
#[tokio::test]
async fn aliases_resolve_in_nodes_and_extend_the_dump() {
    use kube_discovery_core::source::service::PortExtras;
    use std::collections::BTreeMap;
    let st = state(None);
    let k = ServiceKey::new("", "default", "plat-dev");
    let plain = st.shared.desired(&k).unwrap();
    let plain_dump = dump_value(&st.shared, &Value::Null);
    let with = (*plain).clone().with_extras(PortExtras {
        aliases: BTreeMap::from([("3306".into(), "port".into())]),
        app_protocols: BTreeMap::from([("port".into(), "mysql".into())]),
        unresolved: Vec::new(),
    });
    st.shared.set_desired(&k, Some(with));
    let by_key = get(
        st.clone(),
        "/v1/discovery/kubernetes/nodes?service=default/plat-dev:port",
        None,
    )
    .await;
    let by_alias = get(
        st.clone(),
        "/v1/discovery/kubernetes/nodes?service=default/plat-dev:3306",
        None,
    )
    .await;
    assert_eq!(by_key.0, StatusCode::OK);
    assert_eq!(by_alias, by_key);
    let (c, _) = get(
        st.clone(),
        "/v1/discovery/kubernetes/nodes?service=default/plat-dev:3307",
        None,
    )
    .await;
    assert_eq!(c, StatusCode::NOT_FOUND);
    let dump = dump_value(&st.shared, &Value::Null);
    let entry = &dump["endpoints"][0]["endpoints"][0];
    assert_eq!(entry["aliases"], json!({"3306": "port"}));
    assert_eq!(entry["appProtocols"], json!({"port": "mysql"}));
    // What APISIX reads is what it was.
    let plain_entry = &plain_dump["endpoints"][0]["endpoints"][0];
    assert_eq!(entry["value"], plain_entry["value"]);
    assert_eq!(entry["name"], plain_entry["name"]);
    assert!(plain_entry.get("aliases").is_none());
}

#[tokio::test]
async fn nodes_api_answers_found_unknown_and_malformed() {
    let (c, b) = get(
        state(None),
        "/v1/discovery/kubernetes/nodes?service=default/plat-dev:port",
        None,
    )
    .await;
    assert_eq!(c, StatusCode::OK);
    assert_eq!(
        b,
        r#"[{"host":"10.5.10.109","port":3306,"weight":50},{"host":"10.5.10.110","port":3306,"weight":50}]"#
    );
    let (c, _) = get(
        state(None),
        "/v1/discovery/kubernetes/nodes?service=default/nope:port",
        None,
    )
    .await;
    assert_eq!(c, StatusCode::NOT_FOUND);
    let (c, b) = get(
        state(None),
        "/v1/discovery/kubernetes/nodes?service=default/plat-dev:other",
        None,
    )
    .await;
    assert_eq!(c, StatusCode::NOT_FOUND);
    assert!(b.contains("no port"), "{b}");
    let (c, b) = get(
        state(None),
        "/v1/discovery/kubernetes/nodes?service=default/plat-dev",
        None,
    )
    .await;
    assert_eq!(c, StatusCode::BAD_REQUEST);
    assert!(b.contains("missing ':<port>'"), "{b}");
}

#[tokio::test]
async fn dump_has_apisix_shape_and_auth_is_enforced() {
    let (c, b) = get(state(Some("s3cret")), "/v1/discovery/kubernetes/dump", None).await;
    assert_eq!(c, StatusCode::UNAUTHORIZED);
    assert!(!b.contains("s3cret"));
    let (c, _) = get(
        state(Some("s3cret")),
        "/v1/discovery/kubernetes/dump",
        Some("wrong"),
    )
    .await;
    assert_eq!(c, StatusCode::UNAUTHORIZED);
    let (c, b) = get(
        state(Some("s3cret")),
        "/v1/discovery/kubernetes/dump",
        Some("s3cret"),
    )
    .await;
    assert_eq!(c, StatusCode::OK);
    let v: Value = serde_json::from_str(&b).unwrap();
    assert_eq!(v["endpoints"][0]["id"], "");
    assert_eq!(
        v["endpoints"][0]["endpoints"][0]["name"],
        "default/plat-dev"
    );
    let inner: Value =
        serde_json::from_str(v["endpoints"][0]["endpoints"][0]["value"].as_str().unwrap()).unwrap();
    assert_eq!(inner["port"][1]["host"], "10.5.10.110");
    assert_eq!(v["config"][0]["client"]["token"], "<redacted>");
    // Probes never need the token.
    let (c, _) = get(state(Some("s3cret")), "/healthz", None).await;
    assert_eq!(c, StatusCode::OK);
}

#[tokio::test]
async fn readyz_gates_on_every_cluster() {
    let st = state(None);
    let (c, b) = get(st.clone(), "/readyz", None).await;
    assert_eq!(c, StatusCode::SERVICE_UNAVAILABLE);
    assert!(b.contains("waiting for first list"), "{b}");
    st.shared.update_cluster("", |c| {
        c.listed = true;
        c.synced = true;
    });
    let (c, _) = get(st, "/readyz", None).await;
    assert_eq!(c, StatusCode::OK);
}
