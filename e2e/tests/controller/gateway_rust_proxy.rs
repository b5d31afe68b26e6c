//! The Rust library API in a real proxy: `reverse_proxy` (the runnable
//! example of `kube-discovery-client`, built on its `NodesResolver`)
//! follows the same scenario as nginx and HAProxy without restart, spreads
//! by weight, and applies `--empty-policy keep|503` (issue 8). On both API
//! servers (kube-sim and the real kube-apiserver), with backends on
//! harness-assigned local addresses (198.18.3.x on kube-sim, 198.19.3.x on real).

use crate::controller_support;
use crate::gateway_support;

use std::time::Duration;

use controller_support::{Backend as ApiBackend, Env, LIMIT, eventually};
use gateway_support::*;
use testenv::both_backends;

const NET: u8 = 3;

#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rust_proxy_follows_scale_rolling_replacement_and_moves(backend: ApiBackend) {
    let (env, ctl, backends, port) = start_world(backend, NET).await;
    let (mut proxy, addr) = start_proxy(&env, "proxy", SERVICE, &["--empty-policy", "503"]).await;
    let report = scenario(&env, addr, NET, backends, port).await;
    proxy.assert_running();
    report.assert_issue_targets("rust-proxy");
    assert!(
        !proxy.logs().contains("no usable node"),
        "the node list was never empty (draining kept b1): {}",
        proxy.logs()
    );
    proxy.stop().await;
    ctl.stop().await;
}

/// A hand-written DiscoveredService (no controller) with weights 10 and 30
/// (weighted random: 1200 requests, so 0.70..0.80 is about +-4 sigma), then
/// its nodes removed: `--empty-policy 503` answers 503, `keep` (after it has
/// observably seen the empty set) keeps serving the last set; nodes back:
/// both serve again.
#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn rust_proxy_spreads_by_weight_and_applies_the_empty_policy(backend: ApiBackend) {
    let env = Env::start(backend).await;
    env.namespace(NS).await;
    let (light_ip, heavy_ip) = (ip(&env, NET, 20), ip(&env, NET, 21));
    let (light_host, heavy_host) = (light_ip.to_string(), heavy_ip.to_string());
    let port = free_port(heavy_ip.into());
    let light = Backend::start("light", (light_ip, port).into()).await;
    let heavy = Backend::start("heavy", (heavy_ip, port).into()).await;
    put_dsvc(
        &env,
        "wtd",
        &[(&light_host, port, 10), (&heavy_host, port, 30)],
    )
    .await;
    let (mut p503, a503) = start_proxy(
        &env,
        "proxy-503",
        "shop/wtd:http",
        &["--empty-policy", "503"],
    )
    .await;
    let (mut keep, akeep) = start_proxy(
        &env,
        "proxy-keep",
        "shop/wtd:http",
        &["--empty-policy", "keep"],
    )
    .await;
    wait_served(a503, "heavy").await;
    wait_served(akeep, "heavy").await;
    let mut counts = (0usize, 0usize);
    for _ in 0..1200 {
        match get(a503).await {
            Ok((200, b)) if b == "heavy" => counts.1 += 1,
            Ok((200, b)) if b == "light" => counts.0 += 1,
            other => panic!("unexpected answer {other:?}"),
        }
    }
    let share = counts.1 as f64 / (counts.0 + counts.1) as f64;
    eprintln!("BENCH gateway=rust-proxy weighted 10:30 heavy_share={share:.3} counts={counts:?}");
    assert!(
        (0.70..=0.80).contains(&share),
        "weight 30 of 40 should get ~75%: {counts:?}"
    );

    put_dsvc(&env, "wtd", &[]).await;
    eventually(
        "the 503 proxy answers 503 for an empty service",
        Duration::from_secs(10),
        || async { matches!(get(a503).await, Ok((503, _))).then_some(()) },
    )
    .await;
    // The keep proxy asks the resolver on every request: it logs the switch
    // once the empty set reached it, and every answer meanwhile is the last set.
    eventually("the keep proxy processed the empty set", LIMIT, || async {
        let r = get(akeep).await;
        assert!(
            matches!(&r, Ok((200, _))),
            "keep policy must keep serving: {r:?}"
        );
        keep.logs()
            .contains("keeping the last good set")
            .then_some(())
    })
    .await;
    for _ in 0..20 {
        let r = get(akeep).await;
        assert!(
            matches!(&r, Ok((200, _))),
            "keep policy must keep serving: {r:?}"
        );
        let r = get(a503).await;
        assert!(matches!(&r, Ok((503, _))), "503 policy: {r:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Nodes back (only `light` now): both follow.
    put_dsvc(&env, "wtd", &[(&light_host, port, 10)]).await;
    wait_served(a503, "light").await;
    eventually("the keep proxy follows the new set", LIMIT, || async {
        matches!(get(akeep).await, Ok((200, b)) if b == "light").then_some(())
    })
    .await;
    p503.assert_running();
    keep.assert_running();
    drop((light, heavy));
}

mod rust_proxy_rollout_variants_scale_and_flap_under_traffic {
    use super::*;

    /// Issue 31's rollouts under continuous traffic through the Rust
    /// proxy, in one kwok world ([`rollout_variants_scale_and_flap`]):
    /// restarts with maxSurge 1 / maxUnavailable 0, maxSurge 0 / maxUnavailable 1
    /// and 25% / 25% (8 replicas)
    /// and a readiness flap fail no request (grace 5 s, `drain_terminating`);
    /// scale 8 -> 0 -> 3 -> 0 answers 503 only while no Pod serves; a restart
    /// with grace 0 s fails only right after a Pod's removal. Real API server
    /// only (kube-sim runs no Pods): test name `::real`.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn real() {
        let (env, ctl) = start_rollout_world().await;
        let (mut proxy, addr) =
            start_proxy(&env, "proxy", SERVICE, &["--empty-policy", "503"]).await;
        rollout_variants_scale_and_flap(&env, addr, "rust-proxy").await;
        proxy.assert_running();
        ctl.stop().await;
    }
}
