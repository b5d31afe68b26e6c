//! nginx (Debian package) follows DiscoveredServices through
//! `kube-discovery sync nginx`: both API servers (kube-sim and the real
//! kube-apiserver), the controller, real backends on harness-assigned local
//! addresses (198.18.1.x on kube-sim, 198.19.1.x on real) and a bounded
//! client loop through nginx (issue 8).
//!
//! nginx runs as a plain process (`daemon off`) with its config in a temp
//! dir; the test FAILS when nginx is not installed (`e2e/tools/install-gateways.sh`).

use crate::controller_support;
use crate::gateway_support;

use controller_support::{Backend as ApiBackend, Env, LIMIT, eventually};
use gateway_support::*;
use testenv::both_backends;

const NET: u8 = 1;

#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nginx_follows_scale_rolling_replacement_and_moves(backend: ApiBackend) {
    let (env, ctl, backends, port) = start_world(backend, NET).await;
    let mut gw = start_nginx(
        &env,
        "ngx",
        &["web=shop/web:http"],
        "web",
        &["--empty-policy", "503"],
    )
    .await;
    let report = scenario(&env, gw.addr, NET, backends, port).await;
    gw.sync.assert_running();
    gw.proc.assert_running();
    let logs = gw.sync.logs();
    report.assert_issue_targets("nginx");
    // One reload per change of the node list, no more: the sync reloads only
    // when the rendered upstreams change, never for a write that leaves them
    // as they were (the controller's status writes, b1 turning `draining`).
    let reloads = logs.matches("applied=Reloaded").count();
    eprintln!(
        "BENCH gateway=nginx reloads={reloads} content_changes={}",
        report.content_changes
    );
    assert_eq!(
        reloads, report.content_changes,
        "nginx reloads vs. node-list changes made by the test:\n{logs}"
    );
    assert!(!logs.contains("not applied"), "{logs}");
    // A write that does not touch the nodes (an annotation): processed, no reload.
    let rv = annotate_dsvc(&env, SVC, "1").await;
    let logs = wait_processed(&gw.sync, SVC, &rv, "upstreams unchanged").await;
    assert_eq!(
        logs.matches("applied=Reloaded").count(),
        reloads,
        "an annotation reloaded nginx:\n{logs}"
    );
    gw.sync.stop().await;
    gw.proc.stop().await;
    ctl.stop().await;
}

/// A hand-written DiscoveredService (no controller) with weights 10 and 30,
/// then its nodes removed: `--empty-policy 503` answers 503, `keep` keeps
/// serving the last set (after it has observably processed the empty set).
/// Also: a node that would break the config is skipped, one nginx rejects
/// never reaches the live file, an annotation-only change does not reload.
#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nginx_spreads_by_weight_and_applies_the_empty_policy(backend: ApiBackend) {
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
        &[
            (&light_host, port, 10),
            (&heavy_host, port, 30),
            ("bad;host", port, 10),
        ],
    )
    .await;
    put_dsvc(&env, "keepme", &[(&light_host, port, 10)]).await;
    let mut gw = start_nginx(
        &env,
        "ngx-w",
        &["wtd=shop/wtd:http", "keepme=shop/keepme:http"],
        "wtd",
        &["--empty-policy", "503"],
    )
    .await;
    let keep = start_nginx(
        &env,
        "ngx-k",
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
    eprintln!("BENCH gateway=nginx weighted 10:30 heavy_share={share:.3} counts={counts:?}");
    // No controller here: the annotation is the only write, and it must not reload nginx.
    let reloads = gw.sync.logs().matches("applied=Reloaded").count();
    let rv = annotate_dsvc(&env, "wtd", "1").await;
    let logs = wait_processed(&gw.sync, "wtd", &rv, "upstreams unchanged").await;
    assert_eq!(
        logs.matches("applied=Reloaded").count(),
        reloads,
        "an annotation reloaded nginx:\n{logs}"
    );
    assert!(
        (0.70..=0.80).contains(&share),
        "weight 30 of 40 should get ~75%: {counts:?}"
    );
    assert!(
        gw.sync.logs().contains("bad;host"),
        "the unusable node is reported: {}",
        gw.sync.logs()
    );

    // A node nginx cannot load (a DNS name that does not resolve; `.invalid` never does):
    // `nginx -t` rejects the new file, the previous one stays, nginx keeps serving.
    let before = std::fs::read_to_string(&gw.upstreams).expect("upstreams");
    put_dsvc(
        &env,
        "keepme",
        &[(&light_host, port, 10), ("kd-e2e.invalid", port, 10)],
    )
    .await;
    eventually("sync reports the rejected config", LIMIT, || async {
        gw.sync
            .logs()
            .contains("upstreams not applied")
            .then_some(())
    })
    .await;
    let logs = gw.sync.logs();
    assert!(
        logs.contains("host not found") && logs.contains("previous content kept"),
        "{logs}"
    );
    assert_eq!(
        std::fs::read_to_string(&gw.upstreams).expect("upstreams"),
        before,
        "the rejected file was not left in place"
    );
    // It was checked as a candidate through a copy of nginx.conf, never placed
    // (the fallback would have warned); nothing is left behind.
    assert!(!logs.contains("validating in place"), "{logs}");
    let dir = gw.upstreams.parent().expect("dir");
    let left: Vec<String> = std::fs::read_dir(dir)
        .expect("nginx dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".kd-candidate") || n.contains(".kd-check."))
        .collect();
    assert!(left.is_empty(), "temp files left behind: {left:?}");
    for _ in 0..20 {
        let r = get(gw.addr).await;
        assert!(
            matches!(&r, Ok((200, _))),
            "nginx keeps serving after a rejected change: {r:?}"
        );
    }
    put_dsvc(&env, "keepme", &[(&light_host, port, 10)]).await;

    // Nodes gone: 503 policy answers 503 within a second or so; keep policy keeps serving.
    assert_empty_policies(&env, "wtd", gw.addr, keep.addr, &keep.sync).await;
    gw.sync.assert_running();
    drop((light, heavy));
}

/// The sync watches only DiscoveredServices with the selected label
/// (default `app.kubernetes.io/managed-by=kube-discovery`): one without it is
/// ignored (503 under `--empty-policy 503`) until it gets the label.
#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nginx_ignores_discovered_services_without_the_selected_label(backend: ApiBackend) {
    let env = Env::start(backend).await;
    env.namespace(NS).await;
    let hidden_ip = ip(&env, NET, 30);
    let hidden_host = hidden_ip.to_string();
    let port = free_port(hidden_ip.into());
    let b = Backend::start("unlabeled", (hidden_ip, port).into()).await;
    put_dsvc_labeled(&env, "hidden", &[(&hidden_host, port, 10)], false).await;
    let gw = start_nginx(
        &env,
        "ngx-s",
        &["hid=shop/hidden:http"],
        "hid",
        &["--empty-policy", "503"],
    )
    .await;
    let text = std::fs::read_to_string(&gw.upstreams).expect("upstreams");
    assert!(
        !text.contains(&hidden_host),
        "an unlabeled DiscoveredService was rendered: {text}"
    );
    // Another, unrelated labeled write reaches the sync, so it is watching.
    put_dsvc(&env, "other", &[(&host(&env, NET, 31), port, 10)]).await;
    let rv = annotate_dsvc(&env, "other", "1").await;
    wait_processed(&gw.sync, "other", &rv, "upstreams unchanged").await;
    for _ in 0..10 {
        let r = get(gw.addr).await;
        assert!(
            matches!(&r, Ok((503, _))),
            "unlabeled service must not be routed: {r:?}"
        );
    }
    assert!(
        !gw.sync.logs().contains("dsvc=shop/hidden"),
        "{}",
        gw.sync.logs()
    );
    assert_eq!(b.hits(), 0);
    // With the label it is picked up.
    put_dsvc(&env, "hidden", &[(&hidden_host, port, 10)]).await;
    wait_served(gw.addr, "unlabeled").await;
}

/// `kube-discovery sync nginx --once` with nginx not running: `--once` against a hand-written
/// DiscoveredService renders the upstream, validates it with the real
/// `nginx -t` through a tiny main config, and exits 0 (nginx is not running:
/// the reload is skipped with a warning).
#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn controller_binary_runs_sync_nginx_once(backend: ApiBackend) {
    let env = Env::start(backend).await;
    env.namespace(NS).await;
    let cli_host = host(&env, NET, 40);
    put_dsvc(&env, "cli", &[(&cli_host, 8080, 7)]).await;
    let dir = env.path("ngx-cli");
    std::fs::create_dir_all(&dir).expect("dir");
    let upstreams = dir.join("upstreams.conf");
    let conf = dir.join("nginx.conf");
    std::fs::write(
        &conf,
        nginx_conf(&dir, free_port([127, 0, 0, 1].into()), &upstreams, "cli"),
    )
    .expect("nginx.conf");
    let out = run_ok(
        "kube-discovery sync nginx --once",
        tokio::process::Command::new(controller_support::bin())
            .args(["sync", "nginx", "--once", "--service", "cli=shop/cli:http"])
            .arg("--kubeconfig")
            .arg(env.kubeconfig(&env.admin_token()))
            .arg("--output")
            .arg(&upstreams)
            .arg("--nginx-bin")
            .arg(system_bin("nginx"))
            .arg("--nginx-conf")
            .arg(&conf)
            .arg("--nginx-prefix")
            .arg(&dir),
    )
    .await;
    let text = std::fs::read_to_string(&upstreams).expect("upstreams written");
    assert!(
        text.contains(&format!(
            "upstream cli {{\n    server {cli_host}:8080 weight=7;\n}}"
        )),
        "{text}\n{out}"
    );
    assert!(out.contains("WrittenNotReloaded"), "{out}");
}

mod nginx_rollout_variants_scale_and_flap_under_traffic {
    use super::*;

    /// Issue 31's rollouts under continuous traffic through nginx, in one
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
        let mut gw = start_nginx(
            &env,
            "ngx",
            &["web=shop/web:http"],
            "web",
            &["--empty-policy", "503"],
        )
        .await;
        rollout_variants_scale_and_flap(&env, gw.addr, "nginx").await;
        gw.sync.assert_running();
        gw.proc.assert_running();
        ctl.stop().await;
    }
}
