//! Several installations on one API server (issue 16, item 1), on both
//! backends: each has its own `kube_discovery.instance`, stamped on its
//! objects (label `kubediscovery.io/instance`, field manager
//! `kube-discovery/<instance>`), and never writes, repairs or deletes an
//! object that is not its own.
//!
//! * two instances watching overlapping namespaces, objects next to their
//!   Services, under 30 s of churn: the write log shows no write of either
//!   to the other's objects (no orphan deletion, no overwrite of a name the
//!   other holds), each set equals the truth, and the names the first one
//!   holds are reported taken by the second;
//! * a hand-made DiscoveredService holding the name a service needs: left
//!   alone (not one write to it), reported (metric, a log line naming the
//!   service, the object and its owner, one `NameTaken` Event on the
//!   Service), the controller still ready; once its
//!   owner deletes it, the controller's object takes its place;
//! * an installation renamed (a Helm reinstall under another release name)
//!   is unready, naming the objects its old name holds, until it lists the
//!   old name in `adopt_instances`; then it takes them over (issue 29 item 5).

use crate::controller_support;
use crate::fault_support;

use std::collections::BTreeMap;
use std::time::Duration;

use controller_support::{Backend, Controller, Env, LIMIT, bin, dsvc_resource, eventually};
use fault_support::{
    Churn, Kind, Specs, actual, config, diff, masters, metric_sum, truth, user_token, wait_log,
    writes_since,
};
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use serde_json::json;
use testenv::both_backends;

/// `(user, verb ns/name)` of every DiscoveredService write after `mark`.
async fn dsvc_writes(env: &Env, mark: u64) -> Vec<(String, String)> {
    writes_since(env, mark)
        .await
        .iter()
        .filter(|w| {
            w["resource"]
                .as_str()
                .is_some_and(|r| r.starts_with("discoveredservices"))
        })
        .map(|w| {
            (
                w["user"].as_str().unwrap_or("").to_string(),
                format!(
                    "{} {}/{}",
                    w["verb"].as_str().unwrap_or(""),
                    w["namespace"].as_str().unwrap_or(""),
                    w["name"].as_str().unwrap_or("")
                ),
            )
        })
        .collect()
}

/// `kube-discovery nodes <query> --instance <instance>`: (success, stdout, stderr).
async fn nodes(env: &Env, query: &str, instance: &str) -> (bool, String, String) {
    let out = tokio::process::Command::new(bin())
        .args(["nodes", query, "--instance", instance, "--kubeconfig"])
        .arg(env.kubeconfig(&env.admin_token()))
        .env_remove("KUBECONFIG")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("run kube-discovery nodes");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The objects of `specs` in `namespaces`.
fn in_namespaces(specs: &Specs, namespaces: &[&str]) -> Specs {
    specs
        .iter()
        .filter(|(k, _)| namespaces.iter().any(|ns| k.starts_with(&format!("{ns}/"))))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Waits until the objects in `namespaces` equal the truth of `cfg` there.
async fn wait_set(env: &Env, cfg: &str, namespaces: &[&str]) {
    let start = tokio::time::Instant::now();
    loop {
        let want = in_namespaces(&truth(env, cfg).await, namespaces);
        let d = diff(&want, &in_namespaces(&actual(env).await, namespaces));
        if d.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < LIMIT,
            "{namespaces:?} not converged after {LIMIT:?}:\n  {}",
            d.join("\n  ")
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[both_backends]
#[tokio::test]
async fn two_instances_never_touch_each_others_objects(backend: Backend) {
    let env = Env::start_with(backend, masters(&["inst-a", "inst-b"])).await;
    // Objects go next to their Services. `shared` is watched by both: its
    // names are A's (A starts first) and B reports them taken; `only-a` and
    // `only-b` by one each, so each sees objects of services it does not
    // know (orphans, were they its own).
    let mut churns = [
        Churn::new("shared", 4, Kind::Slices, 16, 23),
        Churn::new("only-a", 3, Kind::Slices, 17, 24),
        Churn::new("only-b", 3, Kind::Slices, 18, 25),
    ];
    for c in &mut churns {
        c.seed(&env).await;
    }
    let cfg = |user: &str, instance: &str, only: &str| {
        config(
            &env,
            &user_token(&env, user),
            Kind::Slices,
            &format!("  instance: {instance}\n"),
        )
        .replace(
            "kube_discovery:\n",
            &format!("    namespace_selector: {{match: [\"(shared|{only})\"]}}\nkube_discovery:\n"),
        )
    };
    let cfg_a = cfg("inst-a", "a", "only-a");
    let cfg_b = cfg("inst-b", "b", "only-b");
    let mark = env.mark().await;
    let a = Controller::start(&env, "inst-a", &cfg_a, &[]).await;
    a.wait_ready().await;
    let b = Controller::start(&env, "inst-b", &cfg_b, &[]).await;
    // The `shared` names B needs are A's: B says so and is not ready
    // (readers would trust A's objects for them).
    eventually("B unready, naming A's objects", LIMIT, || async {
        let (code, body) = b.get("/readyz").await;
        (code == 503 && body.contains("shared/svc-")).then_some(())
    })
    .await;
    // 30 s of churn, round robin over the three namespaces.
    for i in 0..100 {
        churns[i % 3].step(&env).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Both sets correct: A's everything it watches, B's its own namespace.
    wait_set(&env, &cfg_a, &["shared", "only-a"]).await;
    wait_set(&env, &cfg_b, &["only-b"]).await;
    // The write log, in order: a create takes a free name; after that only
    // the one who created it patches or deletes it (`shared` names are
    // contested: when a Service comes back, whoever is first creates it).
    let writes = dsvc_writes(&env, mark).await;
    let mut holder: BTreeMap<&str, &str> = BTreeMap::new();
    let mut trespass = Vec::new();
    for (user, w) in &writes {
        let (verb, obj) = w.split_once(' ').unwrap_or_default();
        match verb {
            "create" => {
                if let Some(h) = holder.insert(obj, user) {
                    trespass.push(format!("{user} created {obj} held by {h}"));
                }
            }
            _ => {
                let h = holder.get(obj).copied().unwrap_or("nobody");
                if h != user {
                    trespass.push(format!("{user}: {w} held by {h}"));
                }
                if verb == "delete" {
                    holder.remove(obj);
                }
            }
        }
        if (user == "inst-a" && obj.starts_with("only-b/"))
            || (user == "inst-b" && obj.starts_with("only-a/"))
        {
            trespass.push(format!("{user}: {w} outside what it watches"));
        }
    }
    assert!(
        trespass.is_empty(),
        "writes to the other instance's objects: {trespass:?}\nall writes: {writes:?}"
    );
    for user in ["inst-a", "inst-b"] {
        assert!(
            writes.iter().any(|(u, _)| u == user),
            "{user} wrote nothing: {writes:?}"
        );
    }
    // Each labels its own objects, and reports each `shared` name the other holds.
    let mut held = BTreeMap::from([("a", 0.0), ("b", 0.0)]);
    let mut holders = BTreeMap::new();
    for name in (0..4).map(Churn::service) {
        if let Some(ds) = env.dsvc("shared", &name).await {
            let i = ds["metadata"]["labels"]["kubediscovery.io/instance"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            *held.get_mut(i.as_str()).expect("labelled a or b") += 1.0;
            holders.insert(name, i);
        }
    }
    let (ta, tb) = eventually("each reports the names the other holds", LIMIT, || async {
        let ta = metric_sum(
            &a,
            "kube_discovery_objects_failing",
            &["reason=\"name_taken\""],
        )
        .await;
        let tb = metric_sum(
            &b,
            "kube_discovery_objects_failing",
            &["reason=\"name_taken\""],
        )
        .await;
        (ta == held["b"] && tb == held["a"]).then_some((ta, tb))
    })
    .await;
    assert!(ta + tb > 0.0, "no name was contested");
    let ds = env.dsvc("only-b", "svc-0").await.expect("only-b/svc-0");
    assert_eq!(ds["metadata"]["labels"]["kubediscovery.io/instance"], "b");
    // A reader told the instance counts only that installation's objects.
    let (name, holder) = holders.iter().next().expect("a shared object");
    let other = if holder == "a" { "b" } else { "a" };
    let query = format!("shared/{name}:http");
    let (ok, stdout, _) = nodes(&env, &query, holder).await;
    assert!(
        ok && stdout.contains("10.23."),
        "{query} --instance {holder}: {stdout}"
    );
    let (ok, _, stderr) = nodes(&env, &query, other).await;
    assert!(
        !ok && stderr.contains("label kubediscovery.io/instance"),
        "{query} --instance {other} must find nothing:\n{stderr}"
    );
    a.stop().await;
    b.stop().await;
}

const NS: &str = "taken";

#[both_backends]
#[tokio::test]
async fn a_name_held_by_a_hand_made_object_is_left_alone_and_reported(backend: Backend) {
    let env = Env::start(backend).await;
    env.namespace(NS).await;
    env.slice(NS, "web", "web-1", &[("10.77.0.1", true)], &[("http", 80)])
        .await;
    env.slice(NS, "api", "api-1", &[("10.77.0.2", true)], &[("http", 80)])
        .await;
    // Someone's own object, no labels, under the name `web` needs.
    let theirs: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "kubediscovery.io/v1alpha1", "kind": "DiscoveredService",
        "metadata": {"name": "web", "namespace": NS, "labels": {"owner": "someone"}},
        "spec": {"cluster": "", "service": "taken/web", "sourceNamespace": NS,
                 "sourceName": "web", "source": "EndpointSlice",
                 "ports": {"http": [{"host": "6.6.6.6", "port": 80, "weight": 1}]},
                 "version": "0000000000000000"}
    }))
    .expect("object");
    let api: Api<DynamicObject> = Api::namespaced_with(env.admin.clone(), NS, &dsvc_resource());
    api.create(&PostParams::default(), &theirs)
        .await
        .expect("create the hand-made object");
    let before = env.dsvc(NS, "web").await.expect("theirs");
    let mark = env.mark().await;
    let cfg = config(&env, &env.admin_token(), Kind::Slices, "  instance: edge\n");
    let ctl = Controller::start(&env, "kd", &cfg, &[]).await;
    env.wait_nodes(NS, "api", "http", &["10.77.0.2"]).await;
    // Reported: a counted failure and a log line naming both sides ...
    eventually("objects_failing{reason=name_taken} = 1", LIMIT, || async {
        let n = metric_sum(
            &ctl,
            "kube_discovery_objects_failing",
            &["reason=\"name_taken\""],
        )
        .await;
        (n == 1.0).then_some(())
    })
    .await;
    let log = wait_log(&ctl, "name taken", LIMIT).await;
    let line = log
        .lines()
        .find(|l| l.contains("name taken"))
        .unwrap_or_default();
    for part in ["taken/web", "not kube-discovery"] {
        assert!(line.contains(part), "{part:?} not in {line}");
    }
    // ... an Event on the Service, once (not one per retry) ...
    let name_taken = || env.events(NS, "NameTaken", "Service", "web");
    let evs = eventually("a NameTaken Event", LIMIT, || async {
        let evs = name_taken().await;
        (!evs.is_empty()).then_some(evs)
    })
    .await;
    let note = evs[0].note.clone().unwrap_or_default();
    for part in ["taken/web", "not kube-discovery", "\"edge\""] {
        assert!(note.contains(part), "{part:?} not in {note}");
    }
    // ... and no reason to be unready: everything else is written.
    ctl.wait_ready().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Left alone: not one write to it, content and labels as they were.
    let writes = dsvc_writes(&env, mark).await;
    assert!(
        !writes.iter().any(|(_, w)| w.ends_with(" taken/web")),
        "the hand-made object was written: {writes:?}"
    );
    let now = env.dsvc(NS, "web").await.expect("theirs");
    assert_eq!(now["spec"], before["spec"]);
    assert_eq!(now["metadata"]["labels"], before["metadata"]["labels"]);

    let evs = name_taken().await;
    assert_eq!(evs.len(), 1, "retries emit no new Event: {evs:?}");
    assert!(evs[0].series.is_none(), "{evs:?}");

    // Its owner deletes it: ours takes its place, and nothing fails any more.
    api.delete("web", &DeleteParams::default())
        .await
        .expect("delete the hand-made object");
    env.wait_nodes(NS, "web", "http", &["10.77.0.1"]).await;
    let ours = env.dsvc(NS, "web").await.expect("ours");
    assert_eq!(
        ours["metadata"]["labels"]["kubediscovery.io/instance"],
        "edge"
    );
    let n = metric_sum(
        &ctl,
        "kube_discovery_objects_failing",
        &["reason=\"name_taken\""],
    )
    .await;
    assert_eq!(n, 0.0);
    ctl.stop().await;
}

/// `kube-discovery nodes <query>` without `--instance` (a reader that trusts
/// any installation's objects): (success, stdout, stderr).
async fn nodes_any(env: &Env, query: &str) -> (bool, String, String) {
    let out = tokio::process::Command::new(bin())
        .args(["nodes", query, "--kubeconfig"])
        .arg(env.kubeconfig(&env.admin_token()))
        .env_remove("KUBECONFIG")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("run kube-discovery nodes");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const RENAMED: &str = "renamed";

/// Issue 29 item 5: an installation renamed (a Helm reinstall under another
/// release name) must not leave its old objects frozen while it reports
/// ready. Converged as instance `a`, stopped, started as `b`: after an
/// endpoint changes, readers without `--instance` see the change or `b` is
/// unready naming the objects `a` holds (here: unready, `a`'s objects left
/// alone). Started again as `b` with `adopt_instances: [a]`: it takes them
/// over (relabelled, the stale one of a Service gone deleted), readers see
/// the change, and it is ready.
#[both_backends]
#[tokio::test]
async fn a_renamed_instance_is_unready_until_it_adopts_the_old_objects(backend: Backend) {
    let env = Env::start(backend).await;
    env.namespace(RENAMED).await;
    env.slice(
        RENAMED,
        "web",
        "web-1",
        &[("10.66.0.1", true)],
        &[("http", 80)],
    )
    .await;
    env.slice(
        RENAMED,
        "gone",
        "gone-1",
        &[("10.66.0.7", true)],
        &[("http", 80)],
    )
    .await;
    let cfg_a = config(&env, &env.admin_token(), Kind::Slices, "  instance: a\n");
    let a = Controller::start(&env, "kd-a", &cfg_a, &[]).await;
    env.wait_nodes(RENAMED, "web", "http", &["10.66.0.1"]).await;
    env.wait_nodes(RENAMED, "gone", "http", &["10.66.0.7"])
        .await;
    a.stop().await;

    // Renamed: `b` starts, an endpoint changes, a Service goes away.
    let cfg_b = config(&env, &env.admin_token(), Kind::Slices, "  instance: b\n");
    let b = Controller::start(&env, "kd-b", &cfg_b, &[]).await;
    env.slice(
        RENAMED,
        "web",
        "web-1",
        &[("10.66.0.2", true)],
        &[("http", 80)],
    )
    .await;
    env.delete_slice(RENAMED, "gone-1").await;
    let query = format!("{RENAMED}/web:http");
    let unready = eventually(
        "readers see the change, or b is unready naming a's objects",
        LIMIT,
        || async {
            let (ok, stdout, _) = nodes_any(&env, &query).await;
            assert!(
                !(ok && stdout.contains("10.66.0.2")),
                "converged without adoption: b wrote a's object"
            );
            let (code, body) = b.get("/readyz").await;
            (code == 503 && body.contains(&format!("{RENAMED}/web")) && body.contains("\"a\\\""))
                .then_some(body)
        },
    )
    .await;
    assert!(
        unready.contains("adopt_instances"),
        "the message does not say what to do: {unready}"
    );
    // Left alone meanwhile: still `a`'s, with `a`'s content.
    let ds = env.dsvc(RENAMED, "web").await.expect("web");
    assert_eq!(ds["metadata"]["labels"]["kubediscovery.io/instance"], "a");
    assert!(
        env.dsvc(RENAMED, "gone").await.is_some(),
        "a's object was deleted"
    );
    b.stop().await;

    // The handover: `b` adopts `a`'s objects.
    let cfg_b = config(
        &env,
        &env.admin_token(),
        Kind::Slices,
        "  instance: b\n  adopt_instances: [a]\n",
    );
    let b = Controller::start(&env, "kd-b", &cfg_b, &[]).await;
    b.wait_ready().await;
    env.wait_gone(RENAMED, "gone").await;
    eventually("readers see the change", LIMIT, || async {
        let (ok, stdout, _) = nodes_any(&env, &query).await;
        (ok && stdout.contains("10.66.0.2")).then_some(())
    })
    .await;
    let ds = env.dsvc(RENAMED, "web").await.expect("web");
    assert_eq!(ds["metadata"]["labels"]["kubediscovery.io/instance"], "b");
    let (ok, stdout, stderr) = nodes(&env, &query, "b").await;
    assert!(
        ok && stdout.contains("10.66.0.2"),
        "--instance b: {stdout}{stderr}"
    );
    b.stop().await;
}
