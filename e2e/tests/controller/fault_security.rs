//! Security checks of issue 7, on both backends (kube-sim, and the real
//! kube-apiserver with RBAC behind the fault proxy):
//!
//! * `tokens_never_leak`: the API token and the HTTP bearer token are absent
//!   from the logs (at debug level, with failing writes and watches), from
//!   error output, from `/metrics`, `/readyz` and the dump API.
//! * `least_privilege_*`: the controller (leader election on) runs as the
//!   ServiceAccount `kube-discovery/kube-discovery` bound ONLY to the shipped
//!   `rbac/` roles, in EndpointSlice and in Endpoints mode (with a hand edit
//!   repaired twice: an Event created, then patched); the requests the
//!   server saw from that ServiceAccount are compared with the rules, both
//!   ways.
//!
//! The measurement: the request statistics' `requestsByUser` (kube-sim's
//! counters, or the real server's audit log) give the ServiceAccount's
//! requests by verb and resource (`x/sub` for subresources, as RBAC names
//! them; no API group), and the write log adds the writes by their effect: a
//! server-side apply that creates an object is a `create` (the real server
//! audits it as a `patch` answered 201, and authorizes it as a `create` too).

use crate::controller_support;
use crate::fault_support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use controller_support::{Backend, Controller, Env, LIMIT, eventually, http_get, repo_root};
use fault_support::{
    Kind, failures_served, fault, masters, stats, token_file_block, user_token, writes_since,
};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};
use testenv::both_backends;

#[both_backends]
#[tokio::test]
async fn tokens_never_leak(backend: Backend) {
    let env = Env::start_with(backend, masters(&["leak-check"])).await;
    let api_token = user_token(&env, "leak-check");
    let http_token = format!("leakcheck-http-{}", std::process::id());
    let http_file = env.path("http-token");
    std::fs::write(&http_file, &http_token).expect("write");
    let cfg = fault_support::config(
        &env,
        &api_token,
        Kind::Slices,
        &format!("  http:\n    auth_token_file: {}\n", http_file.display()),
    );
    env.namespace("leak").await;
    env.slice(
        "leak",
        "web",
        "web-a",
        &[("10.40.0.1", true)],
        &[("http", 80)],
    )
    .await;
    let ctl = Controller::start(&env, "leak", &cfg, &[]).await;
    ctl.wait_ready().await;
    // Failures on every path: failing writes (500, 403, 401), a dropped and a
    // 410'd watch. Every DiscoveredService patch fails until the injected
    // failures are used up, so the change shows only after all three.
    for code in [500, 403, 401] {
        fault(&env, json!({"fail": {"verb": "patch", "resource": "discoveredservices", "count": 1, "code": code}})).await;
    }
    env.slice(
        "leak",
        "web",
        "web-a",
        &[("10.40.0.2", true)],
        &[("http", 80)],
    )
    .await;
    env.wait_nodes("leak", "web", "http", &["10.40.0.2"]).await;
    let failed = ctl.logs().matches("write failed").count();
    assert!(
        failed >= 3,
        "{failed} failed writes logged, want the 3 injected"
    );
    for code in [500, 403, 401] {
        // Real backend: the fault proxy answered each (kube-sim keeps no count).
        if let Some(n) = failures_served(&env, "patch", "discoveredservices", code) {
            assert_eq!(n, 1, "injected {code}s served by the fault proxy");
        }
    }
    env.force_410().await;
    env.slice(
        "leak",
        "web",
        "web-a",
        &[("10.40.0.3", true)],
        &[("http", 80)],
    )
    .await;
    env.wait_nodes("leak", "web", "http", &["10.40.0.3"]).await;

    let mut outputs = vec![("log", ctl.logs())];
    for path in ["/metrics", "/readyz", "/healthz"] {
        outputs.push((path, ctl.get(path).await.1));
    }
    let (code, dump) = http_get(ctl.http, "/v1/discovery/kubernetes/dump", Some(&http_token)).await;
    assert_eq!(code, 200, "{dump}");
    assert!(dump.contains("leak/web"), "{dump}");
    outputs.push(("dump", dump));
    let (code, nodes) = http_get(
        ctl.http,
        "/v1/discovery/kubernetes/nodes?service=leak/web:http",
        Some(&http_token),
    )
    .await;
    assert_eq!(code, 200, "{nodes}");
    outputs.push(("nodes", nodes));
    let (code, denied) = ctl.get("/v1/discovery/kubernetes/dump").await;
    assert_eq!(code, 401, "the dump requires the bearer token");
    outputs.push(("401 body", denied));
    ctl.stop().await;

    // Errors: a config the controller refuses (exit 2) and one it cannot connect with.
    let bad = cfg.replace("coalesce_window: 20ms", "coalesce_window: forever");
    let bad_file = env.path("bad.yaml");
    std::fs::write(&bad_file, &bad).expect("write");
    let out = std::process::Command::new(controller_support::bin())
        .args(["run", "--config"])
        .arg(&bad_file)
        .args(["--http-addr", "127.0.0.1:0"])
        .env_remove("KUBECONFIG")
        .output()
        .expect("run");
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(
        stderr.contains("coalesce_window"),
        "the error names the field: {stderr}"
    );
    outputs.push((
        "config error",
        stderr + &String::from_utf8_lossy(&out.stdout),
    ));

    for (what, text) in &outputs {
        assert!(
            !text.contains(&api_token),
            "the API token appears in {what}:\n{text}"
        );
        assert!(
            !text.contains(&http_token),
            "the HTTP bearer token appears in {what}:\n{text}"
        );
    }
}

// ---------------------------------------------------------------- least privilege

const SA_USER: &str = "system:serviceaccount:kube-discovery:kube-discovery";

/// Creates every object of the shipped `rbac/*.yaml` (not `rbac/optional`, `rbac/remote`)
/// and returns the rules of the roles bound to the controller's ServiceAccount (the
/// reader and view roles are for other subjects and not counted).
async fn install_rbac(env: &Env) -> Vec<Value> {
    // (kind, namespace, name) -> rules; bound roles as the same key.
    let mut roles: BTreeMap<(String, String, String), Vec<Value>> = BTreeMap::new();
    let mut bound: BTreeSet<(String, String, String)> = BTreeSet::new();
    let mut files: Vec<_> = std::fs::read_dir(repo_root().join("rbac"))
        .expect("rbac/")
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    // Namespaces first.
    files.sort_by_key(|p| !p.ends_with("namespace.yaml"));
    let pp = PostParams::default();
    for f in files {
        let text = std::fs::read_to_string(&f).expect("read rbac file");
        for doc in kube_discovery_core::yaml::documents(&text) {
            let v = doc.expect("yaml");
            if v.is_null() {
                continue;
            }
            let ns = v["metadata"]["namespace"]
                .as_str()
                .unwrap_or("default")
                .to_string();
            let c = env.admin.clone();
            let res = match v["kind"].as_str() {
                Some("Namespace") => Api::<Namespace>::all(c)
                    .create(&pp, &serde_json::from_value(v.clone()).expect("ns"))
                    .await
                    .map(|_| ()),
                Some("ServiceAccount") => Api::<ServiceAccount>::namespaced(c, &ns)
                    .create(&pp, &serde_json::from_value(v.clone()).expect("sa"))
                    .await
                    .map(|_| ()),
                Some("ClusterRole") => {
                    roles.insert(role_key(&v, ""), rules_of(&v));
                    Api::<ClusterRole>::all(c)
                        .create(&pp, &serde_json::from_value(v.clone()).expect("cr"))
                        .await
                        .map(|_| ())
                }
                Some("ClusterRoleBinding") => {
                    bound.extend(bound_role(&v, ""));
                    Api::<ClusterRoleBinding>::all(c)
                        .create(&pp, &serde_json::from_value(v.clone()).expect("crb"))
                        .await
                        .map(|_| ())
                }
                Some("Role") => {
                    roles.insert(role_key(&v, &ns), rules_of(&v));
                    Api::<Role>::namespaced(c, &ns)
                        .create(&pp, &serde_json::from_value(v.clone()).expect("role"))
                        .await
                        .map(|_| ())
                }
                Some("RoleBinding") => {
                    bound.extend(bound_role(&v, &ns));
                    Api::<RoleBinding>::namespaced(c, &ns)
                        .create(&pp, &serde_json::from_value(v.clone()).expect("rb"))
                        .await
                        .map(|_| ())
                }
                other => panic!("unexpected kind {other:?} in {}", f.display()),
            };
            match res {
                Ok(()) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => panic!("create {} from {}: {e}", v["kind"], f.display()),
            }
        }
    }
    assert!(!bound.is_empty(), "no binding in rbac/ names {SA_USER}");
    bound
        .iter()
        .flat_map(|k| {
            roles
                .get(k)
                .unwrap_or_else(|| panic!("{k:?} is bound to {SA_USER} but not in rbac/"))
                .clone()
        })
        .collect()
}

fn rules_of(role: &Value) -> Vec<Value> {
    role["rules"].as_array().cloned().unwrap_or_default()
}

/// (kind, namespace, name) of a Role (`ns`) or ClusterRole (`""`).
fn role_key(role: &Value, ns: &str) -> (String, String, String) {
    let kind = role["kind"].as_str().unwrap_or_default().to_string();
    let name = role["metadata"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    (kind, ns.to_string(), name)
}

/// The role a binding grants to the controller's ServiceAccount, if it names it.
fn bound_role(binding: &Value, ns: &str) -> Option<(String, String, String)> {
    let (sa_ns, sa_name) = ("kube-discovery", "kube-discovery");
    let names_sa = binding["subjects"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|s| s["kind"] == "ServiceAccount" && s["name"] == sa_name && s["namespace"] == sa_ns);
    if !names_sa {
        return None;
    }
    let kind = binding["roleRef"]["kind"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let name = binding["roleRef"]["name"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // A RoleBinding may grant a ClusterRole (in its namespace); the rules are the ClusterRole's.
    let role_ns = if kind == "ClusterRole" { "" } else { ns };
    Some((kind, role_ns.to_string(), name))
}

/// `(verb, resource)` pairs granted by `rules` (resource with `/subresource`).
fn granted(rules: &[Value]) -> BTreeSet<(String, String)> {
    let mut out = BTreeSet::new();
    for r in rules {
        for res in r["resources"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
        {
            for verb in r["verbs"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
            {
                assert_ne!(verb, "*", "wildcard verb in the shipped roles");
                assert_ne!(res, "*", "wildcard resource in the shipped roles");
                out.insert((verb.to_string(), res.to_string()));
            }
        }
    }
    out
}

/// The ServiceAccount's `(verb, resource, count)` of a stats document.
fn counts(stats: &Value) -> BTreeSet<(String, String, u64)> {
    let mut out = BTreeSet::new();
    let mine = &stats["requestsByUser"][SA_USER];
    for (verb, by_res) in mine.as_object().into_iter().flatten() {
        for (res, n) in by_res.as_object().into_iter().flatten() {
            out.insert((verb.clone(), res.clone(), n.as_u64().unwrap_or(0)));
        }
    }
    out
}

/// `(verb, resource)` requests the ServiceAccount made between two stats
/// snapshots.
fn used_between(before: &Value, after: &Value) -> BTreeSet<(String, String)> {
    let b = counts(before);
    let mut out = BTreeSet::new();
    for (verb, res, n) in counts(after) {
        let prev = b
            .iter()
            .find(|(v, r, _)| *v == verb && *r == res)
            .map_or(0, |x| x.2);
        if n > prev {
            out.insert((verb, res));
        }
    }
    out
}

/// Waits until the ServiceAccount (`token`) may do what the shipped roles
/// grant, cluster-wide and in its namespace: the real server's RBAC
/// authorizer learns new bindings from its informers a moment after they are
/// created (kube-sim at once). Asked before any measurement starts.
async fn wait_rbac_effective(env: &Env, token: &str) {
    use k8s_openapi::api::authorization::v1::SelfSubjectAccessReview;
    let client = env.api.client(token).await.expect("client");
    let api: Api<SelfSubjectAccessReview> = Api::all(client);
    for attrs in [
        json!({"verb": "list", "group": "discovery.k8s.io", "resource": "endpointslices"}),
        json!({"verb": "update", "group": "coordination.k8s.io", "resource": "leases",
               "namespace": "kube-discovery", "name": "kube-discovery"}),
    ] {
        let review: SelfSubjectAccessReview = serde_json::from_value(json!({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": attrs}
        }))
        .expect("review");
        eventually(&format!("RBAC allows {attrs}"), LIMIT, || async {
            let r = api.create(&PostParams::default(), &review).await.ok()?;
            r.status?.allowed.then_some(())
        })
        .await;
    }
}

/// Runs the controller as the ServiceAccount (`token`) in `kind` mode under a
/// few changes; returns what it requested (from its requests in the stats,
/// plus its writes from the write log).
async fn exercise(env: &Env, token: &str, kind: Kind, net: u8) -> BTreeSet<(String, String)> {
    let token_file = env.path(&format!("sa-token-{net}"));
    std::fs::write(&token_file, token).expect("write");
    let slices = if kind == Kind::Slices {
        "    watch_endpoint_slices: true\n"
    } else {
        ""
    };
    let cfg = format!(
        "discovery:\n  kubernetes:\n{}{slices}kube_discovery:\n  coalesce_window: 20ms\n  leader_election: {{enabled: true, lease_namespace: kube-discovery, lease_duration: 3s}}\n",
        token_file_block(env, &token_file)
    );
    let ns = format!("lp{net}");
    env.namespace(&ns).await;
    let ip = |i: u8| format!("10.{net}.0.{i}");
    match kind {
        Kind::Slices => {
            env.slice(&ns, "gone", "gone-a", &[(&ip(1), true)], &[("http", 80)])
                .await;
            env.slice(&ns, "web", "web-a", &[(&ip(2), true)], &[("http", 80)])
                .await;
        }
        Kind::Endpoints => {
            env.endpoints(&ns, "gone", &[&ip(1)], &[("http", 80)], json!({}))
                .await;
            env.endpoints(&ns, "web", &[&ip(2)], &[("http", 80)], json!({}))
                .await;
        }
    }
    let before = stats(env).await;
    let rv = env.mark().await;
    let ctl = Controller::start(env, &format!("lp{net}"), &cfg, &[]).await;
    // Ready as the leader: a standby is ready once it has listed, before it
    // holds the Lease and writes; a change made then would be folded into
    // the leader's first writes (a source deleted before its object was
    // ever created is never deleted).
    eventually("ready as the leader", LIMIT, || async {
        let (code, body) = ctl.get("/readyz").await;
        (code == 200 && body.contains("\"standby\":false")).then_some(())
    })
    .await;
    // One update and one delete of a source.
    match kind {
        Kind::Slices => {
            env.slice(&ns, "web", "web-a", &[(&ip(3), true)], &[("http", 80)])
                .await;
            env.delete_slice(&ns, "gone-a").await;
        }
        Kind::Endpoints => {
            env.endpoints(&ns, "web", &[&ip(3)], &[("http", 80)], json!({}))
                .await;
            env.delete_endpoints(&ns, "gone").await;
        }
    }
    eventually(
        "the controller wrote the update and the delete",
        LIMIT,
        || async {
            let w = writes_since(env, rv).await;
            let mine = |verb: &str, name: &str| {
                w.iter().any(|x| {
                    x["user"] == SA_USER
                        && x["verb"] == verb
                        && x["name"] == name
                        && x["namespace"] == ns.as_str()
                })
            };
            (mine("delete", "gone")
                && w.iter()
                    .filter(|x| x["user"] == SA_USER && x["name"] == "web")
                    .count()
                    >= 2)
                .then_some(())
        },
    )
    .await;
    // A hand edit of `web`'s object, repaired twice: a DriftRepaired Event
    // is created, then patched (the Recorder's series), as the ServiceAccount.
    if kind == Kind::Slices {
        let dsvc: Api<kube::api::DynamicObject> =
            Api::namespaced_with(env.admin.clone(), &ns, &controller_support::dsvc_resource());
        for round in 1..=2 {
            dsvc.patch(
                "web",
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"spec": {"ports": {"http": [
                    {"host": "6.6.6.6", "port": 1, "weight": 1}]}}})),
            )
            .await
            .expect("hand edit");
            eventually(&format!("repair {round} published"), LIMIT, || async {
                let count = env
                    .event_count(&ns, "DriftRepaired", "DiscoveredService", "web")
                    .await;
                (count == round).then_some(())
            })
            .await;
        }
    }
    // Let late writes settle and the leader renew its lease (every 1 s with a
    // 3 s lease) before the snapshot.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let after = stats(env).await;
    let logs = ctl.logs();
    ctl.stop().await;
    assert!(
        !logs.to_lowercase().contains("forbidden"),
        "a request was forbidden with the shipped roles:\n{logs}"
    );
    let mut used = used_between(&before, &after);
    for w in writes_since(env, rv)
        .await
        .iter()
        .filter(|w| w["user"] == SA_USER)
    {
        used.insert((
            w["verb"].as_str().unwrap_or("").to_string(),
            w["resource"].as_str().unwrap_or("").to_string(),
        ));
    }
    used
}

/// Granted pairs that match a used one. Subresource requests count as
/// `x/sub` (as RBAC names them), so a `x/status` rule is only covered by a
/// real status request, never by a write of `x` itself.
fn covers(g: &(String, String), u: &(String, String)) -> bool {
    g == u
}

async fn least_privilege_run(
    backend: Backend,
) -> (BTreeSet<(String, String)>, BTreeSet<(String, String)>) {
    let env = Env::start(backend).await;
    let rules = install_rbac(&env).await;
    let granted = granted(&rules);
    let token = env
        .api
        .issue_token("kube-discovery", "kube-discovery")
        .await
        .expect("ServiceAccount token");
    wait_rbac_effective(&env, &token).await;
    let mut used = exercise(&env, &token, Kind::Slices, 41).await;
    used.extend(exercise(&env, &token, Kind::Endpoints, 42).await);
    (granted, used)
}

#[both_backends]
#[tokio::test]
async fn least_privilege_shipped_roles_suffice(backend: Backend) {
    let (granted, used) = least_privilege_run(backend).await;
    eprintln!("granted: {granted:?}\nused: {used:?}");
    // Works (asserted in `exercise`: writes happened, nothing forbidden), and
    // everything it did is covered by a rule.
    for u in &used {
        assert!(
            granted.iter().any(|g| covers(g, u)),
            "{u:?} was used but is not granted by rbac/: {granted:?}"
        );
    }
    for must in [
        ("list", "endpointslices"),
        ("watch", "endpointslices"),
        ("list", "endpoints"),
        ("watch", "endpoints"),
        // Services: ports (aliases, appProtocol) in both modes, owner UIDs
        // in Endpoints mode.
        ("list", "services"),
        ("watch", "services"),
        ("patch", "discoveredservices"),
        ("delete", "discoveredservices"),
        // Events: created, then patched as a series.
        ("create", "events"),
        ("patch", "events"),
    ] {
        assert!(
            used.contains(&(must.0.to_string(), must.1.to_string())),
            "{must:?} not seen: the measurement is broken ({used:?})"
        );
    }
}

#[both_backends]
#[tokio::test]
async fn least_privilege_roles_grant_nothing_unused(backend: Backend) {
    let (granted, used) = least_privilege_run(backend).await;
    let unused: Vec<&(String, String)> = granted
        .iter()
        .filter(|g| !used.iter().any(|u| covers(g, u)))
        .collect();
    assert!(
        unused.is_empty(),
        "granted by rbac/ but never used: {unused:?}\nused: {used:?}"
    );
}
