//! HAProxy (Debian package) follows DiscoveredServices through
//! `kube-discovery sync haproxy`: server slots driven over the Runtime API,
//! a reload (master CLI) only when the slots must grow. Both API servers
//! (kube-sim and the real kube-apiserver), the controller, real backends on
//! harness-assigned local addresses (198.18.2.x on kube-sim, 198.19.2.x on
//! real) and a bounded client loop (issue 8).
//!
//! HAProxy runs as a plain process in master-worker mode with its config in
//! a temp dir; the test FAILS when haproxy is not installed (`e2e/tools/install-gateways.sh`).

use crate::controller_support;
use crate::gateway_support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use controller_support::{Backend as ApiBackend, Env, LIMIT, eventually};
use gateway_support::*;
use testenv::both_backends;

const NET: u8 = 2;

fn haproxy_conf(dir: &Path, port: u16, backend: &str) -> String {
    let d = dir.display();
    format!(
        "global\n    stats socket {d}/admin.sock mode 600 level admin expose-fd listeners\n\
defaults\n    mode http\n    timeout connect 1s\n    timeout client 10s\n    timeout server 10s\n\
frontend fe\n    bind 127.0.0.1:{port}\n    default_backend {backend}\n"
    )
}

struct Haproxy {
    addr: SocketAddr,
    dir: PathBuf,
    proc: Proc,
    sync: Proc,
}

async fn start_haproxy(
    env: &Env,
    name: &str,
    services: &[&str],
    backend: &str,
    extra: &[&str],
) -> Haproxy {
    let haproxy = system_bin("haproxy");
    let dir = env.path(name);
    std::fs::create_dir_all(&dir).expect("haproxy dir");
    let port = free_port([127, 0, 0, 1].into());
    let main = dir.join("haproxy.cfg");
    let backends = dir.join("backends.cfg");
    std::fs::write(&main, haproxy_conf(&dir, port, backend)).expect("write haproxy.cfg");
    let kubeconfig = env.kubeconfig(&env.admin_token());
    let sync_args = |once: bool| {
        let mut c = sync_command("haproxy");
        c.arg("--kubeconfig")
            .arg(&kubeconfig)
            .arg("--output")
            .arg(&backends);
        c.arg("--haproxy-bin")
            .arg(&haproxy)
            .arg("--haproxy-conf")
            .arg(&main);
        c.arg("--socket").arg(dir.join("admin.sock"));
        for s in services {
            c.args(["--service", s]);
        }
        c.args(extra);
        if once {
            c.arg("--once");
        } else {
            c.arg("--master-socket").arg(dir.join("master.sock"));
        }
        c
    };
    run_ok("kube-discovery sync haproxy --once", &mut sync_args(true)).await;
    let text = std::fs::read_to_string(&backends).expect("backends written by --once");
    assert!(text.contains(&format!("backend {backend}\n")), "{text}");
    let mut cmd = tokio::process::Command::new(&haproxy);
    cmd.arg("-W")
        .arg("-S")
        .arg(dir.join("master.sock"))
        .arg("-f")
        .arg(&main)
        .arg("-f")
        .arg(&backends);
    let mut proc = Proc::spawn(env, &format!("{name}-haproxy"), &mut cmd);
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let log = proc.log.clone();
    eventually("haproxy listening", LIMIT, || {
        let exited = proc.child.try_wait().ok().flatten();
        let log = log.clone();
        async move {
            if let Some(s) = exited {
                panic!(
                    "haproxy exited with {s}: {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            tokio::net::TcpStream::connect(addr).await.ok().map(|_| ())
        }
    })
    .await;
    proc.assert_running();
    let sync = Proc::spawn(env, &format!("{name}-sync"), &mut sync_args(false));
    Haproxy {
        addr,
        dir,
        proc,
        sync,
    }
}

#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn haproxy_follows_scale_rolling_replacement_and_moves_over_the_runtime_api(
    backend: ApiBackend,
) {
    let (env, ctl, backends, port) = start_world(backend, NET).await;
    // 2 slots to start with: 1 -> 3 must grow (one reload), everything else fits.
    let mut gw = start_haproxy(
        &env,
        "hap",
        &["web=shop/web:http"],
        "web",
        &["--min-slots", "2", "--empty-policy", "503"],
    )
    .await;
    let report = scenario(&env, gw.addr, NET, backends, port).await;
    gw.sync.assert_running();
    gw.proc.assert_running();
    let logs = gw.sync.logs();
    report.assert_issue_targets("haproxy");
    let reloads = logs.matches("applied=\"reloaded\"").count();
    let runtime = logs.matches("applied=\"runtime\"").count();
    eprintln!("BENCH gateway=haproxy reloads={reloads} runtime_applies={runtime}");
    assert_eq!(reloads, 1, "exactly one reload (slots 2 -> 4):\n{logs}");
    assert_eq!(
        runtime,
        report.content_changes - 1,
        "every other node-list change (scale down, drain, rolling, move) goes through the Runtime API, once:\n{logs}"
    );
    assert!(!logs.contains("not applied"), "{logs}");
    // The file on disk follows the runtime state (a restart starts from it) and has 4 slots.
    let file = std::fs::read_to_string(gw.dir.join("backends.cfg")).expect("backends.cfg");
    assert_eq!(file.matches("    server s").count(), 4, "{file}");
    assert!(
        file.contains(&format!("{}:", host(&env, NET, 6)))
            && file.contains(&format!("{}:", host(&env, NET, 7))),
        "moved addresses in the file: {file}"
    );
    gw.sync.stop().await;
    gw.proc.stop().await;
    ctl.stop().await;
}

/// A hand-written DiscoveredService (no controller) with weights 10 and 30;
/// then its nodes removed: `--empty-policy 503` answers 503, `keep` keeps serving.
#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn haproxy_spreads_by_weight_and_applies_the_empty_policy(backend: ApiBackend) {
    let env = Env::start(backend).await;
    env.namespace(NS).await;
    let (light_ip, heavy_ip) = (ip(&env, NET, 20), ip(&env, NET, 21));
    let port = free_port(heavy_ip.into());
    let light = Backend::start("light", (light_ip, port).into()).await;
    let heavy = Backend::start("heavy", (heavy_ip, port).into()).await;
    put_dsvc(
        &env,
        "wtd",
        &[
            (&light_ip.to_string(), port, 10),
            (&heavy_ip.to_string(), port, 30),
            ("web.example.com", port, 10),
        ],
    )
    .await;
    let mut gw = start_haproxy(
        &env,
        "hap-w",
        &["wtd=shop/wtd:http"],
        "wtd",
        &["--empty-policy", "503"],
    )
    .await;
    let keep = start_haproxy(
        &env,
        "hap-k",
        &["wtd=shop/wtd:http"],
        "wtd",
        &["--empty-policy", "keep"],
    )
    .await;
    wait_served(gw.addr, "heavy").await;
    let mut counts = (0usize, 0usize);
    for _ in 0..400 {
        match get(gw.addr).await {
            Ok((200, b)) if b == "heavy" => counts.1 += 1,
            Ok((200, b)) if b == "light" => counts.0 += 1,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    let share = counts.1 as f64 / (counts.0 + counts.1) as f64;
    eprintln!("BENCH gateway=haproxy weighted 10:30 heavy_share={share:.3} counts={counts:?}");
    assert!(
        (0.70..=0.80).contains(&share),
        "weight 30 of 40 should get ~75%: {counts:?}"
    );
    assert!(
        gw.sync.logs().contains("web.example.com"),
        "the non-IP node is reported: {}",
        gw.sync.logs()
    );

    assert_empty_policies(&env, "wtd", gw.addr, keep.addr, &keep.sync).await;
    gw.sync.assert_running();
    drop((light, heavy));
}

mod haproxy_rollout_restart_under_traffic_fails_no_request {
    use super::*;

    /// `kubectl rollout restart` of a Deployment of kwok Pods (maxSurge 1,
    /// maxUnavailable 0, a grace period longer than the follow time, the
    /// controller with `drain_terminating: true`) under continuous traffic
    /// through the gateway: no request fails (issue 31). Real API server only
    /// (kube-sim runs no Pods): test name `::real`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn real() {
        let (env, ctl) = start_rollout_world().await;
        let mut gw = start_haproxy(
            &env,
            "hap",
            &["web=shop/web:http"],
            "web",
            &["--empty-policy", "503"],
        )
        .await;
        let report = rollout_restart_with_traffic(&env, gw.addr).await;
        gw.sync.assert_running();
        gw.proc.assert_running();
        report.assert_no_failures("haproxy");
        ctl.stop().await;
    }
}

mod haproxy_rollout_variants_scale_and_flap_under_traffic {
    use super::*;

    /// Issue 31's other rollouts under continuous traffic through haproxy, in one
    /// kwok world ([`rollout_variants_scale_and_flap`]): restarts with
    /// maxSurge 0 / maxUnavailable 1 and 25% / 25% (8 replicas) and a
    /// readiness flap fail no request (grace 5 s, `drain_terminating`);
    /// scale 8 -> 0 -> 3 -> 0 answers 503 only while no Pod serves; a
    /// restart with grace 0 s fails only right after a Pod's removal. Real API
    /// server only (kube-sim runs no Pods): test name `::real`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn real() {
        let (env, ctl) = start_rollout_world_with(&RolloutDeployment {
            max_surge: serde_json::json!(0),
            max_unavailable: serde_json::json!(1),
            ..Default::default()
        })
        .await;
        let mut gw = start_haproxy(
            &env,
            "hap",
            &["web=shop/web:http"],
            "web",
            &["--empty-policy", "503"],
        )
        .await;
        rollout_variants_scale_and_flap(&env, gw.addr, "haproxy").await;
        gw.sync.assert_running();
        gw.proc.assert_running();
        ctl.stop().await;
    }
}
