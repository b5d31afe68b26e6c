use super::*;
use kube_discovery_core::config::{Schema, Secret};

#[tokio::test]
async fn service_connection_verifies_tls_by_default_and_uses_token_file() {
    let dir = tempfile::tempdir().unwrap();
    let tf = dir.path().join("token");
    std::fs::write(&tf, "abc").unwrap();
    let conn = Connection::Service {
        schema: Schema::Https,
        host: "::1".into(),
        port: 6443,
        ssl_verify: true,
        ca_file: None,
        credentials: Credentials::TokenFile(tf.clone()),
    };
    let cfg = kube_config(&conn).await.unwrap();
    assert_eq!(cfg.cluster_url.to_string(), "https://[::1]:6443/");
    assert!(!cfg.accept_invalid_certs);
    assert_eq!(
        cfg.auth_info.token_file.as_deref(),
        Some(tf.display().to_string().as_str())
    );
}

fn answer(code: u16, retry_after: &str) -> std::result::Result<Response<()>, BoxError> {
    Ok(Response::builder()
        .status(code)
        .header("Retry-After", retry_after)
        .body(())
        .unwrap())
}

fn request() -> Request<Body> {
    Request::get("/api/v1/pods").body(Body::empty()).unwrap()
}

/// A `Retry-After: 3600` is obeyed for at most [`MAX_RETRY_AFTER`]
/// (kube's own policy would sleep the hour), and only [`MAX_RETRIES`]
/// times. Deadlines under paused time: no timing.
#[tokio::test(start_paused = true)]
async fn retry_after_is_capped_and_retries_are_bounded() {
    let now = tokio::time::Instant::now();
    let mut kube_own = RetryPolicy::server_retry();
    let sleep = kube_own
        .retry(&mut request(), &mut answer(429, "3600"))
        .unwrap();
    assert_eq!(sleep.deadline(), now + Duration::from_secs(3600));

    let mut capped = CappedRetry::new(MAX_RETRY_AFTER);
    for _ in 0..MAX_RETRIES {
        let sleep = capped.retry(&mut request(), &mut answer(429, "3600"));
        let deadline = sleep.expect("retried").deadline();
        assert!(deadline <= now + MAX_RETRY_AFTER, "{:?}", deadline - now);
    }
    assert!(
        capped
            .retry(&mut request(), &mut answer(503, "1"))
            .is_none(),
        "at most MAX_RETRIES retries"
    );
    // Not retried at all: other errors and successes.
    let mut fresh = CappedRetry::new(MAX_RETRY_AFTER);
    assert!(fresh.retry(&mut request(), &mut answer(500, "1")).is_none());
    assert!(fresh.retry(&mut request(), &mut answer(200, "1")).is_none());
}

/// The writer's client leaves 429s to the writer's limiter (a retry here
/// would be a request the limiter did not admit) but still retries 503s.
#[tokio::test(start_paused = true)]
async fn the_writers_client_does_not_retry_429s() {
    let mut writer = CappedRetry::new(MAX_RETRY_AFTER).without_throttled();
    assert!(
        writer
            .retry(&mut request(), &mut answer(429, "1"))
            .is_none()
    );
    assert!(
        writer
            .retry(&mut request(), &mut answer(503, "1"))
            .is_some()
    );
}

/// Every 429 is counted, by who sent it, with the longest `Retry-After`
/// (whole seconds; an HTTP date is not understood and ignored); a take
/// empties the signal.
#[test]
fn the_throttle_signal_counts_429s_and_keeps_the_longest_retry_after() {
    let signal = ThrottleSignal::default();
    assert_eq!(signal.take(), None);
    let observe = observe_throttles(signal.clone());
    let apf = Response::builder()
        .status(429)
        .header("Retry-After", "3")
        .header("X-Kubernetes-PF-PriorityLevel-UID", "b1d5")
        .body(())
        .unwrap();
    let _ = observe(apf);
    let _ = observe(answer(429, "1").unwrap());
    let _ = observe(answer(429, "Wed, 21 Oct 2015 07:28:00 GMT").unwrap());
    let _ = observe(answer(503, "30").unwrap());
    let _ = observe(answer(200, "30").unwrap());
    assert_eq!(
        signal.take(),
        Some(Throttles {
            apf: 1,
            other: 2,
            retry_after: Some(Duration::from_secs(3)),
        })
    );
    assert_eq!(signal.take(), None);
}

#[test]
fn watches_are_renewed_within_the_request_timeout() {
    let s = Duration::from_secs;
    assert_eq!(watch_renewal(s(290), s(10)), s(8));
    assert_eq!(watch_renewal(s(5), s(10)), s(5));
    assert_eq!(watch_renewal(s(290), s(3)), s(1));
}

#[tokio::test]
async fn the_config_bounds_every_request_and_drops_kubes_retry() {
    let conn = Connection::Service {
        schema: Schema::Http,
        host: "127.0.0.1".into(),
        port: 8001,
        ssl_verify: true,
        ca_file: None,
        credentials: Credentials::Token(Secret::new("t")),
    };
    let limits = ClientLimits::new(Duration::from_secs(7));
    let cfg = bounded_config(kube_config(&conn).await.unwrap(), &limits);
    let seven = Some(Duration::from_secs(7));
    assert_eq!(
        (cfg.connect_timeout, cfg.read_timeout, cfg.write_timeout),
        (seven, seven, seven)
    );
    assert!(cfg.reset_reader_on_write && !cfg.default_retry);
}

#[tokio::test]
async fn missing_files_are_named_in_the_error() {
    let conn = Connection::Service {
        schema: Schema::Https,
        host: "10.0.0.1".into(),
        port: 443,
        ssl_verify: true,
        ca_file: Some("/nonexistent/ca.crt".into()),
        credentials: Credentials::Token(Secret::new("secret-token")),
    };
    let e = kube_config(&conn).await.unwrap_err().to_string();
    assert!(
        e.contains("service.ca_file") && e.contains("/nonexistent/ca.crt"),
        "{e}"
    );
    assert!(!e.contains("secret-token"));
}

#[test]
fn only_watch_requests_name_their_resource() {
    let uri = |s: &str| s.parse::<http::Uri>().unwrap();
    assert_eq!(
        watched_resource(&uri(
            "/apis/discovery.k8s.io/v1/endpointslices?allowWatchBookmarks=true&watch=true&timeoutSeconds=1"
        )),
        Some("endpointslices")
    );
    assert_eq!(
        watched_resource(&uri("/api/v1/namespaces/shop/services?watch=1")),
        Some("services")
    );
    assert_eq!(watched_resource(&uri("/api/v1/services?limit=100")), None);
    assert_eq!(watched_resource(&uri("/api/v1/services")), None);
}

/// Issue 29, item 3: only a watch request answered 2xx reports its
/// resource; a list page, another answer, an error report nothing.
#[tokio::test]
async fn the_watch_served_layer_reports_2xx_watch_answers_only() {
    use tower::{Layer as _, ServiceExt as _};
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let record = seen.clone();
    let layer = WatchServedLayer(Arc::new(move |r: &str| {
        record.lock().unwrap().push(r.to_string());
    }));
    let svc = layer.layer(tower::service_fn(|req: Request<Body>| async move {
        let code = if req.uri().path().ends_with("endpointslices") {
            403
        } else {
            200
        };
        Ok::<_, BoxError>(Response::builder().status(code).body(()).unwrap())
    }));
    for path in [
        "/api/v1/services?watch=true",
        "/apis/discovery.k8s.io/v1/endpointslices?watch=true",
        "/api/v1/endpoints?limit=100",
    ] {
        let req = Request::get(path).body(Body::empty()).unwrap();
        svc.clone().oneshot(req).await.unwrap();
    }
    assert_eq!(*seen.lock().unwrap(), ["services"]);
}
