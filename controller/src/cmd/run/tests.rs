use super::*;
use kube_discovery_core::SourceKind;
use kube_discovery_core::crd::NamespaceMode;
use std::time::Duration;

fn env(k: &str) -> Option<String> {
    match k {
        "KUBERNETES_SERVICE_HOST" => Some("10.96.0.1".into()),
        "KUBERNETES_SERVICE_PORT" => Some("443".into()),
        "EAST_API_HOST" => Some("east.example.com".into()),
        _ => None,
    }
}

fn parse(text: &str) -> Config {
    parse_config(text, &env).unwrap_or_else(|e| panic!("{e}"))
}

/// `GET path` over plain HTTP/1.1: (status code, body).
async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).await.unwrap();
    let code = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    (code, body)
}

/// Issue 16 item 4: a long-running task that dies (here the source task,
/// killed) is logged, `/healthz` turns 503 naming it, and `run` stops
/// and returns `Error::TaskDied`, which `main` turns into exit code 1
/// (not a usage error). A normal stop is `Ok`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_task_fails_healthz_and_ends_run_with_an_error() {
    let sim = kube_sim::Sim::start(kube_sim::SimConfig::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kc, &sim.admin_token()).unwrap();
    let opts = || {
        let cfg = parse(
            "discovery:\n  kubernetes:\n    service: {schema: http, host: 127.0.0.1, port: 8001}\n    client: {token: abc}\n",
        );
        run_options(&cfg, Some("127.0.0.1:0".parse().unwrap()), Some(kc.clone())).unwrap()
    };
    // Healthy while everything runs; a normal stop is Ok.
    let running = start(opts()).await.unwrap();
    assert_eq!(
        http_get(running.http_addr, "/healthz").await,
        (200, "ok".to_string())
    );
    let shared = running.shared.clone();
    running.stop().await;
    assert_eq!(shared.task_died(), None);

    let mut running = start(opts()).await.unwrap();
    assert!(running.abort_task("source"));
    let death = tokio::time::timeout(Duration::from_secs(30), running.died())
        .await
        .expect("the dead task was not reported");
    assert_eq!(death.task, "source");
    let (code, body) = http_get(running.http_addr, "/healthz").await;
    assert_eq!(code, 503, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["task"], "source", "{body}");
    assert_eq!(v["healthy"], false, "{body}");
    let err = stop_after(running, std::future::pending())
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::TaskDied { task, .. } if task == "source"),
        "{err}"
    );
    assert!(!err.is_usage(), "exit code 1, not 2");
    assert!(err.to_string().starts_with("the source task died"), "{err}");
}

#[test]
fn single_cluster_example_parses_into_run_options() {
    let cfg = parse(include_str!("../../../../examples/config.yaml"));
    let p = run_options(&cfg, None, None).unwrap();
    assert_eq!(p.clusters.len(), 1);
    let c = &p.clusters[0];
    assert_eq!(c.params.cluster, "");
    assert_eq!(c.params.kind, SourceKind::EndpointSlice);
    assert_eq!(c.params.field_selector, None, "not_match is client-side");
    // watch_timeout 290 s, renewed within the 10 s request timeout.
    assert_eq!(p.request_timeout, Duration::from_secs(10));
    assert_eq!(c.params.watch_timeout, Duration::from_secs(8));
    assert_eq!(p.watch_timeout, Duration::from_secs(8));
    assert_eq!(p.home, c.conn, "single cluster writes where it reads");
    assert_eq!(p.http_addr, "0.0.0.0:8080".parse().unwrap());
    assert_eq!(p.writer.coalesce_window, Duration::from_millis(100));
    assert!(p.writer.coalesce_leading_edge);
    assert!(!c.params.watch_services, "slices carry their owner");
    let dump = p.redacted_config.to_string();
    assert!(dump.contains("10.96.0.1"), "{dump}");
}

#[test]
fn leader_timings_from_the_config_reach_the_lease() {
    let base = "discovery:\n  kubernetes:\n    service: {schema: http, host: 127.0.0.1, port: 8001}\n    client: {token: abc}\nkube_discovery:\n  leader_election: {enabled: true, lease_namespace: kd, lease_duration: 30s";
    let p = run_options(&parse(&format!("{base}}}\n")), None, None).unwrap();
    let l = p.leader.unwrap();
    assert_eq!(
        (l.duration, l.renew_deadline, l.retry_period),
        (
            Duration::from_secs(30),
            Duration::from_secs(20),
            Duration::from_secs(4)
        )
    );
    let p = run_options(
        &parse(&format!(
            "{base}, renew_deadline: 25s, retry_period: 1s}}\n"
        )),
        None,
        None,
    )
    .unwrap();
    let l = p.leader.unwrap();
    assert_eq!(
        (l.renew_deadline, l.retry_period),
        (Duration::from_secs(25), Duration::from_secs(1))
    );
}

#[test]
fn multi_cluster_example_parses_into_run_options() {
    let cfg = parse(include_str!("../../../../examples/multi-cluster.yaml"));
    let p = run_options(&cfg, Some("127.0.0.1:9999".parse().unwrap()), None).unwrap();
    let ids: Vec<_> = p
        .clusters
        .iter()
        .map(|c| c.params.cluster.as_str())
        .collect();
    assert_eq!(ids, vec!["east", "west"]);
    assert_eq!(
        p.clusters[1].params.label_selector.as_deref(),
        Some("discovery.example.com/export=true")
    );
    assert_eq!(
        p.home,
        Connection::Kubeconfig {
            path: None,
            context: None
        }
    );
    assert_eq!(
        p.naming.namespace_mode,
        NamespaceMode::Fixed("kube-discovery".into())
    );
    assert_eq!(p.http_addr, "127.0.0.1:9999".parse().unwrap());
    assert!(
        p.clusters.iter().all(|c| !c.params.watch_services),
        "no owner references across clusters"
    );
    assert!(
        run_options(&cfg, None, Some("/k".into())).is_err(),
        "--kubeconfig is single-cluster only"
    );
}

#[test]
fn services_are_watched_only_where_owner_references_are_allowed() {
    let base = "discovery:\n  kubernetes:\n    service: {schema: http, host: 127.0.0.1, port: 8001}\n    client: {token: abc}\n";
    let watch = |extra: &str| {
        let p = run_options(&parse(&format!("{base}{extra}")), None, None).unwrap();
        p.clusters[0].params.watch_services
    };
    assert!(watch(""));
    assert!(!watch("    watch_endpoint_slices: true\n"));
    assert!(!watch(
        "kube_discovery:\n  sinks:\n    discoveredservices:\n      namespace_mode: fixed\n      namespace: kd\n"
    ));
}

#[test]
fn selectors_go_to_the_server_and_kubeconfig_overrides() {
    let cfg = parse(
        "discovery:\n  kubernetes:\n    service: {schema: http, host: 127.0.0.1, port: 8001}\n    client: {token: abc}\n    namespace_selector: {equal: shop}\n    label_selector: \"app=web\"\n",
    );
    let p = run_options(&cfg, None, Some("/tmp/kc".into())).unwrap();
    let c = &p.clusters[0];
    assert_eq!(
        c.params.field_selector.as_deref(),
        Some("metadata.namespace=shop")
    );
    assert_eq!(c.params.label_selector.as_deref(), Some("app=web"));
    assert_eq!(c.params.kind, SourceKind::Endpoints);
    assert!(
        c.params.watch_services,
        "Endpoints + source mode: owner UIDs from Services"
    );
    assert_eq!(
        c.conn,
        Connection::Kubeconfig {
            path: Some("/tmp/kc".into()),
            context: None
        }
    );
    assert!(!p.redacted_config.to_string().contains("\"abc\""));
    // One namespace: every watch and list is a namespaced request there.
    assert_eq!(c.params.namespace.as_deref(), Some("shop"));
    assert_eq!(p.home_namespace.as_deref(), Some("shop"));
}

#[test]
fn home_namespace_only_for_one_cluster_watching_one_namespace() {
    let conn =
        "    service: {schema: http, host: 127.0.0.1, port: 8001}\n    client: {token: abc}\n";
    let home = |selector: &str, sinks: &str| {
        let cfg = parse(&format!(
            "discovery:\n  kubernetes:\n{conn}{selector}kube_discovery:\n  coalesce_window: 1s\n{sinks}"
        ));
        let p = run_options(&cfg, None, None).unwrap();
        (p.clusters[0].params.namespace.clone(), p.home_namespace)
    };
    let equal = "    namespace_selector: {equal: shop}\n";
    let fixed = "  sinks:\n    discoveredservices: {namespace_mode: fixed, namespace: kd}\n";
    assert_eq!(home(equal, ""), (Some("shop".into()), Some("shop".into())));
    // Objects in a fixed namespace: listed and watched there.
    assert_eq!(home(equal, fixed), (Some("shop".into()), Some("kd".into())));
    // Any other selector: cluster-wide requests, as before.
    for other in [
        "",
        "    namespace_selector: {not_equal: shop}\n",
        "    namespace_selector: {match: [shop]}\n",
    ] {
        assert_eq!(home(other, ""), (None, None), "{other}");
        assert_eq!(home(other, fixed), (None, None), "{other} (fixed)");
    }
    // Several clusters: the home cluster holds objects of every one.
    let multi = parse(
        "discovery:\n  kubernetes:\n  - id: a\n    service: {schema: http, host: 127.0.0.1, port: 8001}\n    client: {token: abc}\n    namespace_selector: {equal: shop}\n",
    );
    let p = run_options(&multi, None, None).unwrap();
    assert_eq!(p.clusters[0].params.namespace.as_deref(), Some("shop"));
    assert_eq!(p.home_namespace, None);
}

#[test]
fn configmap_sink_options_carry_namespace_name_and_window() {
    let cfg = parse(
        "discovery:\n  kubernetes:\n    service: {schema: http, host: 127.0.0.1, port: 8001}\n    client: {token: abc}\nkube_discovery:\n  coalesce_window: 250ms\n  sinks:\n    configmap: {enabled: true, namespace: kd}\n",
    );
    let s = run_options(&cfg, None, None).unwrap().snapshot.unwrap();
    assert_eq!(s.namespace, "kd");
    assert_eq!(s.name, "kube-discovery-nodes");
    assert_eq!(s.coalesce_window, Duration::from_millis(250));
    assert!(s.coalesce_leading_edge);
    let off = parse(include_str!("../../../../examples/config.yaml"));
    assert!(run_options(&off, None, None).unwrap().snapshot.is_none());
}

#[test]
fn coalesce_leading_edge_off_reaches_the_writer_and_the_snapshot() {
    let cfg = parse(
        "discovery:\n  kubernetes:\n    service: {schema: http, host: 127.0.0.1, port: 8001}\n    client: {token: abc}\nkube_discovery:\n  coalesce_leading_edge: false\n  sinks:\n    configmap: {enabled: true, namespace: kd}\n",
    );
    let p = run_options(&cfg, None, None).unwrap();
    assert!(!p.writer.coalesce_leading_edge);
    assert!(!p.snapshot.unwrap().coalesce_leading_edge);
}
