//! The real control plane of the harness: it starts, serves what the tests
//! rely on (version, RBAC users, ServiceAccount tokens, GC, the audit log, the
//! fault proxy, 410 after compaction) and leaves no process behind.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::json;
use testenv::real::{ControlPlane, Options};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starts_serves_and_stops() {
    let t = std::time::Instant::now();
    let cp = ControlPlane::start(Options::default())
        .await
        .expect("control plane");
    eprintln!("control plane ready in {:?}", t.elapsed());
    let admin = cp.admin_client().await.unwrap();
    let v = admin.apiserver_version().await.unwrap();
    assert_eq!(v.git_version, "v1.34.4");

    // Through the proxy with a plain user: authenticated, RBAC-denied.
    let alice = cp
        .client_via_proxy(&cp.user_token("alice").unwrap())
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(alice, "default");
    let err = cms.list(&ListParams::default()).await.unwrap_err();
    assert!(
        matches!(&err, kube::Error::Api(s) if s.code == 403),
        "{err}"
    );

    // A write shows in the audit log.
    let mark = testenv::audit::now_micros();
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "x"}, "data": {"a": "b"}})).unwrap();
    Api::<ConfigMap>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let w = cp.audit().writes_since(mark);
    assert!(
        w.iter()
            .any(|w| w["resource"] == "configmaps" && w["name"] == "x" && w["verb"] == "create"),
        "{w:?}"
    );

    let pids = cp.pids();
    assert_eq!(pids.len(), 3);
    drop(cp);
    for pid in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "process {pid} survived"
        );
    }
}

/// Reads a watch answer's first line (or the HTTP error status).
async fn first_watch_line(client: &kube::Client, path: &str) -> (u16, serde_json::Value) {
    use http_body_util::BodyExt;
    let req = http::Request::get(path).body(Vec::new()).unwrap();
    let resp = client
        .send(req.map(kube::client::Body::from))
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let mut body = resp.into_body();
    let mut buf = Vec::new();
    while let Ok(Some(Ok(f))) = tokio::time::timeout(Duration::from_secs(10), body.frame()).await {
        if let Ok(d) = f.into_data() {
            buf.extend_from_slice(&d);
            if let Some(pos) = buf.iter().position(|b| *b == b'\n') {
                return (status, serde_json::from_slice(&buf[..pos]).unwrap());
            }
        }
    }
    (status, serde_json::from_slice(&buf).unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_and_restart_answer_old_watches_with_410() {
    let cp = ControlPlane::start(Options {
        controller_manager: false,
        ..Options::default()
    })
    .await
    .unwrap();
    let admin = cp.admin_client().await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
    let rv = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    for i in 0..3 {
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": format!("c{i}")}})).unwrap();
        cms.create(&PostParams::default(), &cm).await.unwrap();
    }
    // Before: the watch cache still has the history.
    let (code, ev) = first_watch_line(
        &admin,
        &format!("/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={rv}"),
    )
    .await;
    assert_eq!((code, ev["type"].as_str()), (200, Some("ADDED")), "{ev}");
    let t = std::time::Instant::now();
    cp.fault(&serde_json::from_value(json!({"compact": true})).unwrap())
        .await
        .unwrap();
    eprintln!("compact + restart took {:?}", t.elapsed());
    let admin = cp.admin_client().await.unwrap();
    let (code, ev) = first_watch_line(
        &admin,
        &format!("/api/v1/namespaces/default/configmaps?watch=1&resourceVersion={rv}"),
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(ev["type"], "ERROR", "{ev}");
    assert_eq!(ev["object"]["code"], 410, "{ev}");
}

fn alive(pid: u32) -> bool {
    // A zombie (exited, not yet reaped) counts as gone.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.split(") ").nth(1).unwrap_or("").starts_with('Z'))
        .unwrap_or(false)
}

/// A control-plane process that dies is reported with its log tail, and the
/// rest is stopped when the control plane is dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_process_is_reported_with_its_log_tail() {
    let cp = ControlPlane::start(Options {
        controller_manager: false,
        ..Options::default()
    })
    .await
    .unwrap();
    let pids = cp.pids();
    cp.check_alive().expect("all running");
    // Kill etcd: kube-apiserver keeps running, the harness reports etcd.
    std::process::Command::new("kill")
        .args(["-KILL", &pids[0].to_string()])
        .status()
        .unwrap();
    let t = std::time::Instant::now();
    let err = loop {
        if let Err(e) = cp.check_alive() {
            break e;
        }
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "etcd's death not noticed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let msg = format!("{err:#}");
    assert!(
        msg.contains("etcd exited") && msg.contains("etcd.log"),
        "{msg}"
    );
    drop(cp);
    for pid in pids {
        assert!(!alive(pid), "process {pid} survived the drop");
    }
}

/// The test process itself killed (SIGKILL: no destructor runs): every
/// control-plane process dies with it (`setpriv --pdeathsig KILL`).
#[test]
fn no_process_outlives_a_killed_test() {
    let exe = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/debug/examples/hold-controlplane");
    assert!(
        exe.is_file(),
        "{} missing: cargo build -p kd-testenv --examples",
        exe.display()
    );
    let mut child = std::process::Command::new(&exe)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(child.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    let pids: Vec<u32> = line
        .strip_prefix("pids ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .split_whitespace()
        .map(|p| p.parse().unwrap())
        .collect();
    // etcd, kube-apiserver, kube-controller-manager, kwok, kube-scheduler.
    assert_eq!(pids.len(), 5, "{line}");
    assert!(pids.iter().all(|p| alive(*p)));
    child.kill().unwrap();
    child.wait().unwrap();
    let t = std::time::Instant::now();
    while pids.iter().any(|p| alive(*p)) {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "control-plane processes outlived the killed test: {pids:?}"
        );
        #[expect(
            clippy::disallowed_methods,
            reason = "a synchronous test polling process liveness"
        )]
        std::thread::sleep(Duration::from_millis(50));
    }
}
