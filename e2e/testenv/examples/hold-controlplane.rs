//! Starts a real control plane with kwok, prints
//! `pids <etcd> <apiserver> <kcm> <kwok> <kube-scheduler>` and holds it until killed. The harness's own tests kill this process with
//! SIGKILL (no destructor runs) to show that no control-plane process
//! outlives it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let cp = testenv::real::ControlPlane::start(testenv::real::Options {
        kwok: Some(testenv::kwok::Options::default()),
        ..Default::default()
    })
    .await
    .expect("control plane");
    let pids: Vec<String> = cp.pids().iter().map(u32::to_string).collect();
    println!("pids {}", pids.join(" "));
    std::future::pending::<()>().await;
}
