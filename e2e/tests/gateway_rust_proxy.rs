//! The Rust library API in a real proxy: `reverse_proxy` (the runnable
//! example of `kube-discovery-gateways`, built on `kube_discovery::nodes`)
//! follows the same scenario as nginx and HAProxy without restart (issue 8).

mod controller_support;
mod gateway_support;

use std::net::SocketAddr;

use controller_support::{LIMIT, eventually};
use gateway_support::*;

const NET: u8 = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rust_proxy_follows_scale_rolling_replacement_and_moves() {
    let (env, ctl, backends, port) = start_world(NET).await;
    let kubeconfig = env.kubeconfig(&env.sim.admin_token());
    let listen = free_port([127, 0, 0, 1].into());
    let mut cmd = tokio::process::Command::new(gw_example("reverse_proxy"));
    cmd.arg("--listen")
        .arg(format!("127.0.0.1:{listen}"))
        .arg("--service")
        .arg(SERVICE)
        .arg("--kubeconfig")
        .arg(&kubeconfig);
    let mut proxy = Proc::spawn(&env, "proxy", &mut cmd);
    let addr: SocketAddr = ([127, 0, 0, 1], listen).into();
    eventually("reverse_proxy example listening", LIMIT, || async {
        tokio::net::TcpStream::connect(addr).await.ok().map(|_| ())
    })
    .await;
    let report = scenario(&env, addr, NET, backends, port).await;
    proxy.assert_running();
    report.assert_issue_targets("rust-proxy");
    proxy.stop().await;
    ctl.stop().await;
}
