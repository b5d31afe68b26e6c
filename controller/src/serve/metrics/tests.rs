use super::*;

#[test]
fn encodes_families_with_cluster_labels() {
    let m = Metrics::default();
    m.event("c1", "apply");
    m.write("", "applied");
    m.writes_skipped.get_or_create(&Metrics::cluster("")).inc();
    m.throttled(2, 1);
    m.write_rate_limit.set(62.5);
    m.services.get_or_create(&Metrics::cluster("")).set(3);
    m.skipped("", "Endpoints", "invalid_port", 2);
    m.event_to_write
        .get_or_create(&Metrics::cluster(""))
        .observe(0.2);
    let text = encode(&m.registry());
    assert!(
        text.contains(r#"kube_discovery_watch_events_total{cluster="c1",type="apply"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"kube_discovery_writes_total{cluster="",result="applied"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"kube_discovery_writes_skipped_total{cluster=""} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"kube_discovery_writes_throttled_total{by="apf"} 2"#)
            && text.contains(r#"kube_discovery_writes_throttled_total{by="other"} 1"#)
            && text.contains("kube_discovery_write_rate_limit 62.5"),
        "{text}"
    );
    assert!(
        text.contains(r#"kube_discovery_services{cluster=""} 3"#),
        "{text}"
    );
    assert!(
            text.contains(
                r#"kube_discovery_source_skipped_total{cluster="",kind="Endpoints",reason="invalid_port"} 2"#
            ),
            "{text}"
        );
    assert!(
        text.contains("kube_discovery_event_to_write_seconds_count{cluster=\"\"} 1"),
        "{text}"
    );
}

/// The value of the sample line starting with `name` (labels included).
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[test]
fn build_info_process_metrics_and_last_write() {
    let m = Metrics::default();
    let text = encode(&m.registry());
    let build = format!(
        r#"kube_discovery_build_info{{version="{}",os="{}",arch="{}"}}"#,
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS,
        std::env::consts::ARCH
    );
    assert_eq!(sample(&text, &build), Some(1.0), "{text}");
    assert!(
        text.contains("# TYPE kube_discovery_build_info gauge"),
        "{text}"
    );
    // The existing families keep their names (the prefix is on a sub-registry now).
    assert!(
        text.contains("# TYPE kube_discovery_snapshot_shards gauge"),
        "{text}"
    );
    assert!(text.ends_with("# EOF\n"), "one EOF at the end: {text}");
    assert_eq!(text.matches("# EOF").count(), 1);
    // Process metrics, unprefixed, with real values from /proc/self.
    assert!(
        text.contains("# TYPE process_cpu_seconds counter"),
        "{text}"
    );
    let cpu = sample(&text, "process_cpu_seconds_total").expect("cpu seconds");
    assert!(cpu >= 0.0, "{text}");
    let rss = sample(&text, "process_resident_memory_bytes").expect("rss");
    assert!(
        rss > 1024.0 * 1024.0,
        "a test process uses more than 1 MiB: {rss}"
    );
    let fds = sample(&text, "process_open_fds").expect("open fds");
    assert!(fds >= 3.0, "stdin/stdout/stderr at least: {fds}");
    assert!(sample(&text, "process_max_fds").expect("max fds") >= fds);
    assert!(sample(&text, "process_threads").expect("threads") >= 1.0);
    let start = sample(&text, "process_start_time_seconds").expect("start time");
    #[allow(clippy::cast_precision_loss)]
    let now = jiff::Timestamp::now().as_second() as f64;
    assert!(
        start > now - 86_400.0 * 365.0 && start <= now + 1.0,
        "start time {start} vs now {now}"
    );
    // A successful write stamps the cluster's last write; an error does not.
    m.write("east", "error_forbidden");
    assert!(!encode(&m.registry()).contains("kube_discovery_last_write_timestamp_seconds{"));
    m.write("east", "applied");
    let text = encode(&m.registry());
    let t = sample(
        &text,
        r#"kube_discovery_last_write_timestamp_seconds{cluster="east"}"#,
    )
    .expect("last write");
    assert!((t - now).abs() < 60.0, "{t} vs {now}");
}

#[test]
fn process_cpu_seconds_grow_with_work() {
    let c = ProcessCollector::default();
    let before = c.read().expect("/proc/self").cpu_seconds;
    // Work until the counter shows 0.1 s more (a busy machine gives this
    // thread less than its wall time); a broken reading never gets there.
    let t = std::time::Instant::now();
    let mut x = 0u64;
    let mut after = before;
    while after - before < 0.1 && t.elapsed() < std::time::Duration::from_secs(20) {
        for _ in 0..1_000_000 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        }
        after = c.read().expect("/proc/self").cpu_seconds;
    }
    std::hint::black_box(x);
    assert!(
        after - before >= 0.1,
        "{before} -> {after} in {:?}",
        t.elapsed()
    );
}

#[test]
fn proc_files_parse() {
    // The command name may hold spaces and parentheses.
    let stat = "4242 (kube (disc) ery) S 1 4242 4242 0 -1 4194560 2000 0 0 0 \
                    250 75 0 0 20 0 9 0 123456 104857600 5000 18446744073709551615";
    assert_eq!(parse_proc_stat(stat), Some((3.25, 9, 123_456, 104_857_600)));
    assert_eq!(parse_proc_stat("garbage"), None);
    assert_eq!(parse_proc_stat("1 (x) S 1 2"), None);
    assert_eq!(
        parse_status_rss("Name:\tkd\nVmRSS:\t   2048 kB\nThreads: 9\n"),
        Some(2 * 1024 * 1024)
    );
    assert_eq!(parse_status_rss("Name: kd\n"), None);
    assert_eq!(
        parse_btime("cpu 1 2 3\nbtime 1700000000\n"),
        Some(1_700_000_000)
    );
    let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1048576              1048576              files\n";
    assert_eq!(parse_max_fds(limits), Some(1_048_576));
    assert_eq!(
        parse_max_fds(
            "Max open files            unlimited            unlimited            files\n"
        ),
        None
    );
    // Without /proc the collector reports nothing (and does not fail the scrape).
    let none = ProcessCollector {
        proc_dir: "/nonexistent-proc".into(),
    };
    assert!(none.read().is_none());
    let mut r = Registry::default();
    r.register_collector(Box::new(none));
    assert!(!encode(&r).contains("process_"), "{}", encode(&r));
}

#[test]
fn in_flight_requests_are_read_at_scrape_time() {
    use tower::{Layer, Service, ServiceExt};
    let m = Metrics::default();
    let counter = InFlightRequestsCounter::new();
    m.track_client("source", "east", counter.clone());
    let r = m.registry();
    let name = r#"kube_discovery_api_requests_in_flight{client="source",cluster="east"}"#;
    assert_eq!(sample(&encode(&r), name), Some(0.0));
    // A request in flight through the layer the clients use.
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let rx = std::sync::Mutex::new(Some(rx));
    let svc = tower_http::metrics::InFlightRequestsLayer::new(counter).layer(tower::service_fn(
        move |_req: http::Request<String>| {
            let rx = rx.lock().unwrap().take();
            async move {
                if let Some(rx) = rx {
                    let _ = rx.await;
                }
                Ok::<_, std::convert::Infallible>(http::Response::new(String::new()))
            }
        },
    ));
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut svc = svc;
        let pending = svc
            .ready()
            .await
            .unwrap()
            .call(http::Request::new(String::new()));
        tokio::pin!(pending);
        assert!(futures::poll!(pending.as_mut()).is_pending());
        assert_eq!(sample(&encode(&r), name), Some(1.0));
        tx.send(()).unwrap();
        drop(pending.await.unwrap());
    });
    assert_eq!(sample(&encode(&r), name), Some(0.0));
}

#[test]
fn ready_and_leader_follow_the_shared_state() {
    let shared = Arc::new(ControllerState::new(["", "east"]));
    let m = Metrics::default();
    let r = m.registry_with_state(shared.clone());
    let text = encode(&r);
    assert_eq!(sample(&text, "kube_discovery_ready"), Some(0.0), "{text}");
    assert_eq!(sample(&text, "kube_discovery_leader"), Some(1.0), "{text}");
    // Counters of every cluster exist at 0, so the first increase counts.
    for c in ["", "east"] {
        for result in ["applied", "deleted"] {
            assert_eq!(
                sample(
                    &text,
                    &format!(r#"kube_discovery_writes_total{{cluster="{c}",result="{result}"}}"#)
                ),
                Some(0.0),
                "{text}"
            );
        }
        assert_eq!(
            sample(
                &text,
                &format!(r#"kube_discovery_watch_restarts_total{{cluster="{c}"}}"#)
            ),
            Some(0.0),
            "{text}"
        );
    }
    for c in ["", "east"] {
        shared.update_cluster(c, |s| {
            s.listed = true;
            s.synced = true;
        });
    }
    let text = encode(&r);
    assert_eq!(sample(&text, "kube_discovery_ready"), Some(1.0), "{text}");
    shared.set_standby(true);
    let text = encode(&r);
    assert_eq!(sample(&text, "kube_discovery_leader"), Some(0.0), "{text}");
    assert_eq!(
        sample(&text, "kube_discovery_ready"),
        Some(1.0),
        "a listed standby is ready"
    );
    assert_eq!(text.matches("# TYPE kube_discovery_ready gauge").count(), 1);
    assert_eq!(
        sample(&text, "kube_discovery_leader_election_failing"),
        Some(0.0),
        "{text}"
    );
    shared.lease_failed("403 Forbidden".into());
    let text = encode(&r);
    assert_eq!(
        sample(&text, "kube_discovery_leader_election_failing"),
        Some(1.0),
        "{text}"
    );
}
