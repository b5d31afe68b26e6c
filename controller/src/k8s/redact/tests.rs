use super::*;

const MARKER: &str = "SECRET-MARKER-0451";

/// What kube-client returns when an exec plugin fails: its stdout and
/// stderr in the error's text.
fn exec_failed() -> AuthError {
    use std::os::unix::process::ExitStatusExt;
    AuthError::AuthExecRun {
        cmd: "plugin".into(),
        out: Box::new(std::process::Output {
            status: std::process::ExitStatus::from_raw(256),
            stdout: MARKER.as_bytes().to_vec(),
            stderr: MARKER.as_bytes().to_vec(),
        }),
    }
}

#[test]
fn an_exec_plugins_output_is_never_in_a_summary() {
    assert!(
        kube::Error::Auth(exec_failed())
            .to_string()
            .contains(MARKER)
    );
    // As the client's layer sees it (inside a buffer's error, say) ...
    let boxed: tower::BoxError = Box::new(kube::Error::Service(Box::new(exec_failed())));
    let safe = credentials(boxed);
    assert!(safe.is::<CredentialsUnavailable>());
    assert!(!safe.to_string().contains(MARKER));
    // ... as building the client returns it ...
    let built = kube_credentials(kube::Error::Auth(exec_failed()));
    assert!(!built.to_string().contains(MARKER), "{built}");
    // ... and in every summary of a watch error.
    for e in [
        watcher::Error::InitialListFailed(kube::Error::Auth(exec_failed())),
        watcher::Error::WatchStartFailed(kube::Error::Service(Box::new(exec_failed()))),
        watcher::Error::WatchFailed(kube::Error::Auth(exec_failed())),
    ] {
        for s in [watch(&e), watch_detail(&e)] {
            assert!(!s.contains(MARKER), "{s}");
            assert!(s.contains("authentication failed"), "{s}");
        }
    }
    // Other errors pass the layer unchanged.
    let io: tower::BoxError = Box::new(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
    assert!(credentials(io).is::<std::io::Error>());
}

#[test]
fn api_errors_show_status_and_reason_and_logs_the_message() {
    let forbidden = kube::core::Status::failure(
        "endpointslices.discovery.k8s.io is forbidden: User \"kd\" cannot list resource",
        "Forbidden",
    )
    .with_code(403);
    let e = watcher::Error::InitialListFailed(kube::Error::Api(Box::new(forbidden.clone())));
    assert_eq!(watch(&e), "list failed: 403 Forbidden");
    assert_eq!(
        watch_detail(&e),
        "list failed: 403 Forbidden: endpointslices.discovery.k8s.io is forbidden: User \"kd\" cannot list resource"
    );
    let long = kube::core::Status::failure(&"é".repeat(400), "Invalid").with_code(422);
    let d = kube_detail(&kube::Error::Api(Box::new(long)));
    assert!(d.len() <= MESSAGE_LIMIT + 20 && d.ends_with("..."), "{d}");
    let gone = watcher::Error::WatchError(Box::new(
        kube::core::Status::failure("too old", "Expired").with_code(410),
    ));
    assert_eq!(watch(&gone), "watch error: 410 Expired");
    let refused = kube::Error::Service(Box::new(std::io::Error::from(
        std::io::ErrorKind::ConnectionRefused,
    )));
    assert_eq!(kube(&refused), "connection error (connection refused)");
}
