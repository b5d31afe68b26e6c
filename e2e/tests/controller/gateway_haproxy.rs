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

use controller_support::{Backend as ApiBackend, Env};
use gateway_support::*;
use testenv::both_backends;

const NET: u8 = 2;

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

mod haproxy_rollout_variants_scale_and_flap_under_traffic {
    use super::*;

    /// Issue 31's rollouts under continuous traffic through haproxy, in one
    /// kwok world ([`rollout_variants_scale_and_flap`]): restarts with
    /// maxSurge 1 / maxUnavailable 0,
    /// maxSurge 0 / maxUnavailable 1 and 25% / 25% (8 replicas) and a
    /// readiness flap fail no request (grace 5 s, `drain_terminating`);
    /// scale 8 -> 0 -> 3 -> 0 answers 503 only while no Pod serves; a
    /// restart with grace 0 s fails only right after a Pod's removal. Real API
    /// server only (kube-sim runs no Pods): test name `::real`.
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
        rollout_variants_scale_and_flap(&env, gw.addr, "haproxy").await;
        gw.sync.assert_running();
        gw.proc.assert_running();
        ctl.stop().await;
    }
}
