//! Readiness and error reporting end to end (issue 29), on both API servers,
//! the controller running as the plain user `kd` with exactly the rules of
//! `rbac/clusterrole.yaml` (the real server authorizes with RBAC, kube-sim
//! too), one permission taken away:
//!
//! | what | test |
//! |---|---|
//! | `endpointslices` revoked at runtime, Services still granted: `/readyz` 503 naming the EndpointSlice watch, the Service watch healthy | `a_broken_endpoint_watch_is_unready_while_services_watch` |
//! | `leases` never granted (leader election on): `/readyz` 503, the metric, one log line | `a_replica_that_cannot_get_the_lease_is_unready` |
//! | an exec credential plugin that prints a marker and fails: the marker in no log line, HTTP answer or Event | `an_exec_plugins_output_leaks_nowhere` |

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::controller_support;
use crate::fault_support;

use std::time::Duration;

use controller_support::{Backend, Controller, Env, LIMIT, Options, bin, eventually, repo_root};
use fault_support::metric_sum;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use testenv::both_backends;

/// `unready_after` of these tests.
const UNREADY_AFTER: &str = "2s";

/// An API server with the plain user `kd` (no groups: only what is bound).
async fn start(backend: Backend) -> Env {
    Env::start_with(
        backend,
        Options {
            users: vec![("kd".to_string(), Vec::new())],
            ..Options::default()
        },
    )
    .await
}

/// The rules of `rbac/clusterrole.yaml`, without those on `drop` (a
/// resource name).
fn rules_without(drop: &str) -> Value {
    let text = std::fs::read_to_string(repo_root().join("rbac/clusterrole.yaml"))
        .expect("read rbac/clusterrole.yaml");
    let role = kube_discovery_core::yaml::documents(&text)
        .into_iter()
        .map(|d| d.expect("yaml"))
        .find(|d| d["kind"] == "ClusterRole")
        .expect("the ClusterRole");
    let rules: Vec<Value> = role["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .filter(|r| !r["resources"].as_array().unwrap().iter().any(|x| x == drop))
        .cloned()
        .collect();
    json!(rules)
}

/// Binds the ClusterRole `kd` with `rules` to the user `kd`.
async fn grant(env: &Env, rules: Value) {
    let role: ClusterRole = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "kd"}, "rules": rules,
    }))
    .unwrap();
    Api::<ClusterRole>::all(env.admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .expect("create ClusterRole");
    let crb: ClusterRoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "kd"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "kd"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "kd"}]
    }))
    .unwrap();
    Api::<ClusterRoleBinding>::all(env.admin.clone())
        .create(&PostParams::default(), &crb)
        .await
        .expect("create binding");
}

/// Replaces the rules of the ClusterRole `kd` with [`rules_without`]`(drop)`
/// (revoke a resource, or `""`: grant everything again).
async fn set_rules(env: &Env, drop: &str) {
    Api::<ClusterRole>::all(env.admin.clone())
        .patch(
            "kd",
            &PatchParams::default(),
            &Patch::Merge(json!({"rules": rules_without(drop)})),
        )
        .await
        .unwrap_or_else(|e| panic!("set the rules of ClusterRole kd (without {drop:?}): {e}"));
}

/// A Service `ns/name` with one port `http`.
async fn service(env: &Env, ns: &str, name: &str) {
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}
    }))
    .unwrap();
    Api::<Service>::namespaced(env.admin.clone(), ns)
        .create(&PostParams::default(), &svc)
        .await
        .expect("create Service");
}

fn config(env: &Env, token: &str, extra: &str) -> String {
    format!(
        "discovery:\n  kubernetes:\n{}    watch_endpoint_slices: true\nkube_discovery:\n  coalesce_window: 20ms\n  request_timeout: 3s\n  unready_after: {UNREADY_AFTER}\n{extra}",
        env.service_block(token)
    )
}

/// `/readyz` once it answers 503: the body as JSON.
async fn wait_unready(ctl: &Controller, what: &str) -> Value {
    let body = eventually(what, LIMIT, || async {
        let (code, body) = ctl.get("/readyz").await;
        (code == 503).then_some(body)
    })
    .await;
    serde_json::from_str(&body).expect("/readyz JSON")
}

/// Issue 29, item 3: the controller's `endpointslices` permission alone is
/// revoked. Its EndpointSlice watch fails for good; its Service watch (the
/// same client) keeps being renewed. Before, every renewal's 2xx cleared the
/// cluster's failure clock, so `/readyz` stayed 200 with stale data; now
/// each watch has its own health and the EndpointSlice watch, failing for
/// longer than `unready_after`, makes it 503.
#[both_backends]
#[tokio::test]
async fn a_broken_endpoint_watch_is_unready_while_services_watch(backend: Backend) {
    let env = start(backend).await;
    grant(&env, rules_without("")).await;
    env.namespace("shop").await;
    service(&env, "shop", "web").await;
    env.slice(
        "shop",
        "web",
        "web-1",
        &[("10.29.0.1", true)],
        &[("http", 8080)],
    )
    .await;
    let token = env.api.user_token("kd").expect("token of kd");
    let ctl = Controller::start(&env, "revoked", &config(&env, &token, ""), &[]).await;
    ctl.wait_ready().await;
    env.wait_nodes("shop", "web", "http", &["10.29.0.1"]).await;

    set_rules(&env, "endpointslices").await;
    let readyz = wait_unready(
        &ctl,
        "/readyz 503 once the EndpointSlice watch failed for unready_after",
    )
    .await;
    let unready: Vec<&str> = readyz["unready"]
        .as_array()
        .expect("unready")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        unready.len() == 1
            && unready[0].starts_with(r#"cluster "": watch failing for"#)
            && unready[0].contains("EndpointSlice watch: ")
            && unready[0].contains("403 Forbidden"),
        "/readyz must name the cluster, the watch and the cause: {readyz:#}"
    );
    let failing = &readyz["clusters"][""]["status"]["failing_watches"];
    assert!(
        failing["EndpointSlice"]["last_error"].is_string(),
        "{readyz:#}"
    );
    // The Service watch, renewed every second meanwhile, is healthy.
    assert!(failing["Service"].is_null(), "{readyz:#}");
    assert!(
        !ctl.logs().contains("Service watch failed"),
        "the Service watch must keep working"
    );
    // And stays 503 (nothing of the client clears it).
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(ctl.get("/readyz").await.0, 503);
    assert_eq!(metric_sum(&ctl, "kube_discovery_ready", &[]).await, 0.0);

    // Granted again: ready again.
    set_rules(&env, "").await;
    ctl.wait_ready().await;
    ctl.stop().await;
}

/// Issue 32: a replica whose EndpointSlice watch fails for longer than
/// `unready_after` stops following; its xDS clients must not stay on its last
/// state: open streams end with UNAVAILABLE (Envoy keeps what it has and
/// reconnects, through the Service, to a replica that follows) and new ones
/// are refused until the watch works again.
#[both_backends]
#[tokio::test]
async fn a_broken_endpoint_watch_ends_the_xds_streams_until_it_works_again(backend: Backend) {
    use testenv::ads;
    let env = start(backend).await;
    grant(&env, rules_without("")).await;
    env.namespace("shop").await;
    service(&env, "shop", "web").await;
    env.slice(
        "shop",
        "web",
        "web-1",
        &[("10.29.0.1", true)],
        &[("http", 8080)],
    )
    .await;
    let token = env.api.user_token("kd").expect("token of kd");
    let ctl = Controller::start(
        &env,
        "xds-stale",
        &config(&env, &token, "  xds:\n    addr: 127.0.0.1:0\n"),
        &[],
    )
    .await;
    ctl.wait_ready().await;
    let addr = ctl.xds_addr().await;
    let mut c = ads::Sotw::open(ads::channel(addr).await.expect("channel"), None, "envoy")
        .await
        .expect("a stream");
    c.send(ads::EDS, &["shop/web:http"], "", "", None).await;
    let r = c.recv(LIMIT).await.expect("EDS").expect("an answer");
    c.ack(&r, &["shop/web:http"]).await;

    set_rules(&env, "endpointslices").await;
    wait_unready(&ctl, "/readyz 503 once the EndpointSlice watch failed").await;
    let ended = c.recv(Duration::from_secs(5)).await;
    match ended {
        Err(status) => {
            assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
            assert!(status.message().contains("EndpointSlice"), "{status:?}");
        }
        Ok(r) => panic!("the stream stayed open on a replica that stopped following: {r:?}"),
    }
    let refused =
        match ads::Sotw::open(ads::channel(addr).await.expect("channel"), None, "late").await {
            Err(s) => s,
            Ok(mut c) => {
                c.send(ads::EDS, &["shop/web:http"], "", "", None).await;
                c.recv(Duration::from_secs(5))
                    .await
                    .expect_err("a new stream served while stale")
            }
        };
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");

    // Granted again: served again.
    set_rules(&env, "").await;
    ctl.wait_ready().await;
    eventually("xDS served again", LIMIT, || async {
        let mut c = ads::Sotw::open(ads::channel(addr).await.ok()?, None, "back")
            .await
            .ok()?;
        c.send(ads::EDS, &["shop/web:http"], "", "", None).await;
        c.recv(Duration::from_secs(3)).await.ok()?
    })
    .await;
    ctl.stop().await;
}

/// Issue 29, item 3: leader election on, but `leases` not granted: no
/// replica can get (or read) the Lease. Before, every replica was a ready
/// standby and nothing was written, silently. Now `/readyz` is 503 after
/// `unready_after` naming leader election, the metric is 1 and one warning
/// says why (once, not per retry).
#[both_backends]
#[tokio::test]
async fn a_replica_that_cannot_get_the_lease_is_unready(backend: Backend) {
    let env = start(backend).await;
    grant(&env, rules_without("")).await;
    env.namespace("shop").await;
    env.slice(
        "shop",
        "web",
        "web-1",
        &[("10.29.1.1", true)],
        &[("http", 8080)],
    )
    .await;
    let token = env.api.user_token("kd").expect("token of kd");
    let cfg = config(
        &env,
        &token,
        "  leader_election:\n    enabled: true\n    lease_namespace: default\n    lease_name: kd-health\n    lease_duration: 2s\n",
    );
    let ctl = Controller::start(&env, "no-lease", &cfg, &[]).await;
    // 503 also before the first list: wait for the reason.
    let readyz = eventually("/readyz 503 naming leader election", LIMIT, || async {
        let (code, body) = ctl.get("/readyz").await;
        let v: Value = serde_json::from_str(&body).ok()?;
        (code == 503 && !v["unready"].as_array()?.is_empty()).then_some(v)
    })
    .await;
    let unready = readyz["unready"].to_string();
    assert!(
        unready.contains("leader election") && unready.contains("403 Forbidden"),
        "{readyz:#}"
    );
    assert_eq!(readyz["standby"], true, "{readyz:#}");
    assert_eq!(readyz["lease_failing"], true, "{readyz:#}");
    assert!(
        readyz["clusters"][""]["status"]["listed"] == true,
        "the watches work: {readyz:#}"
    );
    assert_eq!(
        metric_sum(&ctl, "kube_discovery_leader_election_failing", &[]).await,
        1.0
    );
    assert_eq!(metric_sum(&ctl, "kube_discovery_ready", &[]).await, 0.0);
    // Many rounds have failed (one every ~270 ms), one warning was logged.
    let logs = ctl.logs();
    let warnings = logs
        .lines()
        .filter(|l| l.contains("leader election failing"))
        .count();
    assert_eq!(
        warnings, 1,
        "one warning per change, not per retry:\n{logs}"
    );
    assert!(
        env.dsvc("shop", "web").await.is_none(),
        "nothing may be written"
    );
    ctl.stop().await;
}

/// The marker the credential plugin prints.
const MARKER: &str = "PLUGIN-OUTPUT-MARKER-7f3a";

/// A kubeconfig for `env` whose user is the exec credential plugin
/// `plugin` (instead of a token).
fn exec_kubeconfig(env: &Env, plugin: &std::path::Path) -> std::path::PathBuf {
    let mut kc: Value = kube_discovery_core::yaml::documents(&env.api.kubeconfig_yaml("unused"))
        .into_iter()
        .next()
        .expect("one document")
        .expect("kubeconfig");
    kc["users"][0]["user"] = json!({"exec": {
        "apiVersion": "client.authentication.k8s.io/v1",
        "command": plugin,
        "interactiveMode": "Never",
    }});
    let p = env.path("exec-kubeconfig");
    std::fs::write(&p, kc.to_string()).expect("write kubeconfig");
    p
}

/// Issue 29, item 7: the unauthenticated `/readyz` printed the raw watch
/// error, and with an exec credential plugin kube-client's error carries
/// the plugin's stdout and stderr (where a token may be). The plugin here
/// hands out the admin token while the file `allow` exists, then prints a
/// marker on both streams and fails: the marker must appear in no log line,
/// no HTTP answer and no Event, while the controller runs and when it
/// cannot even start.
#[both_backends]
#[tokio::test]
async fn an_exec_plugins_output_leaks_nowhere(backend: Backend) {
    use std::os::unix::fs::PermissionsExt;
    let env = start(backend).await;
    env.namespace("shop").await;
    env.slice(
        "shop",
        "web",
        "web-1",
        &[("10.29.2.1", true)],
        &[("http", 8080)],
    )
    .await;
    let allow = env.path("allow");
    let plugin = env.path("plugin.sh");
    std::fs::write(
        &plugin,
        format!(
            "#!/bin/sh\nif [ -e '{allow}' ]; then\n  printf '%s' '{{\"apiVersion\":\"client.authentication.k8s.io/v1\",\"kind\":\"ExecCredential\",\"status\":{{\"token\":\"{token}\",\"expirationTimestamp\":\"2000-01-01T00:00:00Z\"}}}}'\n  exit 0\nfi\necho '{MARKER} on stdout'\necho '{MARKER} on stderr' >&2\nexit 1\n",
            allow = allow.display(),
            token = env.admin_token(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(&allow, "").unwrap();
    let kubeconfig = exec_kubeconfig(&env, &plugin);
    let cfg = format!(
        "discovery:\n  kubernetes:\n    kubeconfig: {}\n    watch_endpoint_slices: true\nkube_discovery:\n  coalesce_window: 20ms\n  request_timeout: 3s\n  unready_after: {UNREADY_AFTER}\n  leader_election:\n    enabled: true\n    lease_namespace: default\n    lease_name: kd-exec\n    lease_duration: 2s\n",
        kubeconfig.display()
    );
    let ctl = Controller::start(&env, "exec", &cfg, &[]).await;
    ctl.wait_ready().await;
    env.wait_nodes("shop", "web", "http", &["10.29.2.1"]).await;

    // From now on every request runs the failing plugin (the token it gave
    // has expired): the watches, the Lease, the writes, the Events.
    std::fs::remove_file(&allow).unwrap();
    env.slice(
        "shop",
        "web",
        "web-1",
        &[("10.29.2.2", true)],
        &[("http", 8080)],
    )
    .await;
    let readyz = wait_unready(&ctl, "/readyz 503: every request fails to authenticate").await;
    eventually("the failures are logged", LIMIT, || async {
        let logs = ctl.logs();
        let lease_warned = logs.lines().any(|l| {
            l.contains(r#""level":"WARN""#)
                && l.contains(r#""target":"kube_discovery::k8s::leader""#)
        });
        (logs.contains("watch failed") && lease_warned).then_some(())
    })
    .await;
    for path in [
        "/readyz",
        "/healthz",
        "/metrics",
        "/v1/discovery/kubernetes/dump",
        "/v1/discovery/kubernetes/nodes?service=shop/web:http",
    ] {
        let (_, body) = ctl.get(path).await;
        assert!(
            !body.contains(MARKER),
            "{path} shows the plugin's output:\n{body}"
        );
    }
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(env.admin.clone());
    for e in events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
    {
        let text = serde_json::to_string(&e).unwrap();
        assert!(
            !text.contains(MARKER),
            "an Event shows the plugin's output: {text}"
        );
    }
    let logs = ctl.logs();
    let leaks: Vec<&str> = logs.lines().filter(|l| l.contains(MARKER)).collect();
    assert!(
        leaks.is_empty(),
        "log lines show the plugin's output:\n{}",
        leaks.join("\n")
    );
    // The cause is named all the same.
    assert!(
        readyz.to_string().contains("authentication failed"),
        "/readyz names the cause: {readyz:#}"
    );
    assert!(
        logs.contains("authentication failed"),
        "the log names the cause:\n{logs}"
    );
    ctl.stop().await;

    // A plugin that fails from the start: the controller cannot build its
    // client and exits, with an error that does not show the output either.
    let cfg_path = env.path("exec-fails.yaml");
    std::fs::write(&cfg_path, &cfg).unwrap();
    let out = tokio::time::timeout(
        LIMIT,
        tokio::process::Command::new(bin())
            .args(["--log-format", "json", "run", "--config"])
            .arg(&cfg_path)
            .args(["--http-addr", "127.0.0.1:0"])
            .env_remove("KUBECONFIG")
            .env("RUST_LOG", "info,kube_discovery=debug")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the controller exits when its client cannot be built")
    .expect("run kube-discovery");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("authentication failed"), "{text}");
    assert!(
        !text.contains(MARKER),
        "the start error shows the plugin's output:\n{text}"
    );
}
