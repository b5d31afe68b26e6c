//! API semantics through the kube-rs client, on kube-sim AND the real API
//! server (`#[both_backends]`: `<test>::kube_sim`, `<test>::real`; the real
//! server is the truth, README "kube-sim and the real API server" lists what
//! stays different and why): pagination, selectors, server-side apply (field
//! removal, conflicts, force), status subresource and generation,
//! ownerReference garbage collection, preconditions, dryRun, errors as
//! `Status`, authentication and RBAC, CRDs, list resourceVersion semantics,
//! Events in two API groups.

use crate::sim_support;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch,
    PatchParams, PostParams,
};
use serde_json::{Value, json};
use sim_support::{Backend, Cluster, api_client, assert_alive, cluster, eventually, options, raw};
use testenv::both_backends;

fn cm(name: &str, labels: &[(&str, &str)]) -> ConfigMap {
    let labels: BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    serde_json::from_value(
        json!({"metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}),
    )
    .expect("cm")
}

fn api_err(e: kube::Error) -> kube::core::Status {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API Status error, got {other:?}"),
    }
}

async fn ns(c: &kube::Client, name: &str) {
    let api: Api<Namespace> = Api::all(c.clone());
    api.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": name}})).expect("ns"),
    )
    .await
    .expect("namespace");
}

/// The API server of a test (nothing but the test writes, see
/// [`sim_support::options`]) and its admin client (no client retries).
async fn start(backend: Backend) -> (Cluster, kube::Client) {
    start_with(backend, options(false)).await
}

async fn start_with(backend: Backend, opts: testenv::Options) -> (Cluster, kube::Client) {
    let c = cluster(backend, opts).await;
    let admin = api_client(&c, &c.admin_token()).await;
    (c, admin)
}

/// On kube-sim nothing else writes, so a list's revision is exactly the last
/// write's; the real server also writes on its own (its leases), so there it
/// is at least that.
fn assert_rv_at_least(c: &Cluster, got: u64, want: u64, what: &str) {
    if c.is_real() {
        assert!(got >= want, "{what}: {got} < {want}");
    } else {
        assert_eq!(got, want, "{what}");
    }
}

#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pagination_and_selectors(backend: Backend) {
    let (cl, c) = start(backend).await;
    ns(&c, "p").await;
    ns(&c, "q").await;
    Api::<ConfigMap>::namespaced(c.clone(), "q")
        .create(&PostParams::default(), &cm("other", &[]))
        .await
        .expect("create");
    let api: Api<ConfigMap> = Api::namespaced(c.clone(), "p");
    for i in 0..25 {
        let tier = if i % 3 == 0 { "gold" } else { "silver" };
        let mut labels = vec![("tier", tier)];
        if i % 5 == 0 {
            labels.push(("canary", "true"));
        }
        api.create(&PostParams::default(), &cm(&format!("cm-{i:02}"), &labels))
            .await
            .expect("create");
    }
    // limit/continue: 10 + 10 + 5, in name order, remainingItemCount on the way.
    let mut names = Vec::new();
    let mut lp = ListParams::default().limit(10);
    let mut pages = 0;
    loop {
        let page = api.list(&lp).await.expect("list");
        pages += 1;
        if pages == 1 {
            assert_eq!(page.metadata.remaining_item_count, Some(15));
        }
        names.extend(page.items.iter().filter_map(|o| o.metadata.name.clone()));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(t) => lp = lp.continue_token(&t),
            None => break,
        }
    }
    assert_eq!(pages, 3);
    let expected: Vec<String> = (0..25).map(|i| format!("cm-{i:02}")).collect();
    assert_eq!(names, expected);
    let bad = api
        .list(&ListParams::default().continue_token("garbage!"))
        .await
        .expect_err("bad continue");
    assert_eq!(api_err(bad).code, 400);

    // With a selector, pages still continue where they stopped (silver is
    // 16 of the 25, i % 3 != 0), but `remainingItemCount` is left out, as
    // the real API server does.
    let mut silver = Vec::new();
    let mut lp = ListParams::default().labels("tier=silver").limit(5);
    loop {
        let page = api.list(&lp).await.expect("list silver");
        assert_eq!(page.metadata.remaining_item_count, None);
        assert!(page.items.len() <= 5);
        silver.extend(page.items.iter().filter_map(|o| o.metadata.name.clone()));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(t) => lp = lp.continue_token(&t),
            None => break,
        }
    }
    let expected: Vec<String> = (0..25)
        .filter(|i| i % 3 != 0)
        .map(|i| format!("cm-{i:02}"))
        .collect();
    assert_eq!(silver, expected);

    let count = |sel: &'static str| {
        let api = api.clone();
        async move {
            api.list(&ListParams::default().labels(sel))
                .await
                .expect("list")
                .items
                .len()
        }
    };
    assert_eq!(count("tier=gold").await, 9);
    assert_eq!(count("tier==gold,canary").await, 2);
    assert_eq!(count("tier in (gold,silver),!canary").await, 20);
    assert_eq!(count("tier notin (gold)").await, 16);
    assert_eq!(count("tier!=gold,canary=true").await, 3);
    let err = api
        .list(&ListParams::default().labels("tier in gold"))
        .await
        .expect_err("bad selector");
    assert_eq!(api_err(err).code, 400);

    let all: Api<ConfigMap> = Api::all(c.clone());
    let by_name = all
        .list(&ListParams::default().fields("metadata.name=cm-07"))
        .await
        .expect("list");
    assert_eq!(by_name.items.len(), 1);
    // Every ConfigMap outside `p`: `q/other` (and on the real server the
    // ones it keeps itself, e.g. kube-system/extension-apiserver-authentication).
    let other_ns: Vec<(String, String)> = all
        .list(&ListParams::default().fields("metadata.namespace!=p"))
        .await
        .expect("list")
        .items
        .into_iter()
        .map(|o| {
            (
                o.metadata.namespace.unwrap_or_default(),
                o.metadata.name.unwrap_or_default(),
            )
        })
        .collect();
    assert!(
        other_ns.contains(&("q".into(), "other".into())),
        "{other_ns:?}"
    );
    assert!(other_ns.iter().all(|(n, _)| n != "p"), "{other_ns:?}");
    // ConfigMaps have only the metadata fields (the generic message); types
    // with fields of their own name the field (kubectl test: Services).
    let err = all
        .list(&ListParams::default().fields("data.k=v"))
        .await
        .expect_err("unsupported field");
    let s = api_err(err);
    assert_eq!((s.code, s.reason.as_str()), (400, "BadRequest"));
    assert_eq!(
        s.message,
        r#""data.k" is not a known field selector: only "metadata.name", "metadata.namespace""#
    );
    // Secrets can be selected by `type`.
    let secrets: Api<Secret> = Api::namespaced(c.clone(), "p");
    for (name, type_) in [("tls", "kubernetes.io/tls"), ("plain", "Opaque")] {
        let mut s: Secret =
            serde_json::from_value(json!({"metadata": {"name": name}, "type": type_,
            "data": {"tls.crt": "", "tls.key": ""}}))
            .expect("secret");
        if type_ == "Opaque" {
            s.data = None;
        }
        secrets
            .create(&PostParams::default(), &s)
            .await
            .expect("secret");
    }
    let opaque: Vec<String> = secrets
        .list(&ListParams::default().fields("type=Opaque"))
        .await
        .expect("list secrets by type")
        .items
        .into_iter()
        .filter_map(|s| s.metadata.name)
        .collect();
    assert_eq!(opaque, ["plain"]);
    let s = api_err(
        secrets
            .list(&ListParams::default().fields("data.x=y"))
            .await
            .expect_err("unsupported secret field"),
    );
    assert_eq!(
        (s.code, s.message.as_str()),
        (400, "field label not supported: data.x")
    );
    assert_alive(&cl);
}

#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_apply_removes_fields_and_detects_conflicts(backend: Backend) {
    let (cl, c) = start(backend).await;
    let api: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    let apply = |mgr: &str, force: bool, data: Value| {
        let api = api.clone();
        let mut pp = PatchParams::apply(mgr);
        pp.force = force;
        async move {
            api.patch("ssa", &pp, &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": data}))).await
        }
    };
    let o = apply("alpha", false, json!({"a": "1", "b": "2"}))
        .await
        .expect("create by apply");
    assert_eq!(o.data.as_ref().map(|d| d.len()), Some(2));
    // alpha stops applying b: it is removed.
    let o = apply("alpha", false, json!({"a": "1"}))
        .await
        .expect("apply");
    let data = o.data.expect("data");
    assert_eq!(data.get("a").map(String::as_str), Some("1"));
    assert!(!data.contains_key("b"), "b must be removed: {data:?}");
    // beta changing alpha's field conflicts (409) ...
    let err = apply("beta", false, json!({"a": "2"}))
        .await
        .expect_err("conflict");
    let s = api_err(err);
    assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
    assert!(
        s.message.contains("conflict with \"alpha\"") && s.message.contains(".data.a"),
        "{}",
        s.message
    );
    // ... unless forced; then beta owns it and alpha's later removal keeps it.
    apply("beta", true, json!({"a": "2"}))
        .await
        .expect("forced");
    let o = apply("alpha", false, json!({"c": "3"}))
        .await
        .expect("apply");
    let data = o.data.expect("data");
    assert_eq!(
        data.get("a").map(String::as_str),
        Some("2"),
        "field owned by beta stays"
    );
    let managers: Vec<String> = o
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter_map(|m| m.manager)
        .collect();
    assert!(
        managers.contains(&"alpha".into()) && managers.contains(&"beta".into()),
        "{managers:?}"
    );
    // Applying the same value as another manager is not a conflict (shared ownership).
    apply("gamma", false, json!({"a": "2"}))
        .await
        .expect("same value is no conflict");
    // Apply without fieldManager is rejected: the PatchOptions are invalid.
    let (status, body) = raw(
        &c,
        "PATCH",
        "/api/v1/namespaces/default/configmaps/ssa",
        Some(json!({"data": {}})),
        "application/apply-patch+yaml",
    )
    .await;
    assert_eq!(
        (status, &body["reason"]),
        (422, &json!("Invalid")),
        "{body}"
    );
    assert_eq!(
        body["message"],
        r#"PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch"#
    );
    assert_alive(&cl);
}

const CRD: &str = r#"{
  "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
  "metadata": {"name": "gizmos.test.io"},
  "spec": {"group": "test.io", "scope": "Namespaced",
    "names": {"plural": "gizmos", "singular": "gizmo", "kind": "Gizmo"},
    "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
      "schema": {"openAPIV3Schema": {"type": "object", "properties": {
        "spec": {"type": "object", "required": ["size"], "properties": {
          "size": {"type": "integer", "minimum": 1, "maximum": 10},
          "mode": {"type": "string", "enum": ["a", "b"]},
          "name": {"type": "string", "pattern": "^[a-z]+$"},
          "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
          "labels": {"type": "object", "additionalProperties": {"type": "string"}}}},
        "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}}}}}}]}}"#;

fn gizmo_api(c: &kube::Client) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("test.io", "v1", "Gizmo"),
        "gizmos",
    );
    Api::namespaced_with(c.clone(), "default", &ar)
}

const CRDS: &str = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions";

async fn create_crd(c: &kube::Client) {
    create_crd_from(c, serde_json::from_str(CRD).expect("crd json")).await;
}

/// Creates a CRD, then waits until it is `Established` and its resource is
/// served: at once on kube-sim (established in the create answer), a moment
/// later on the real server (its establishing controller runs asynchronously).
async fn create_crd_from(c: &kube::Client, crd: Value) {
    let (status, body) = raw(c, "POST", CRDS, Some(crd.clone()), "application/json").await;
    assert_eq!(status, 201, "{body}");
    let name = crd["metadata"]["name"]
        .as_str()
        .expect("CRD name")
        .to_string();
    eventually(30, &format!("CRD {name} established"), || async {
        let (code, v) = raw(c, "GET", &format!("{CRDS}/{name}"), None, "").await;
        (code == 200
            && v["status"]["conditions"].as_array().is_some_and(|cs| {
                cs.iter()
                    .any(|c| c["type"] == "Established" && c["status"] == "True")
            }))
        .then_some(())
    })
    .await;
    let list = format!(
        "/apis/{}/{}/{}",
        crd["spec"]["group"].as_str().expect("group"),
        crd["spec"]["versions"][0]["name"]
            .as_str()
            .expect("version"),
        crd["spec"]["names"]["plural"].as_str().expect("plural")
    );
    eventually(30, &format!("{list} served"), || async {
        (raw(c, "GET", &list, None, "").await.0 == 200).then_some(())
    })
    .await;
}

fn gizmo(name: &str, spec: Value) -> DynamicObject {
    serde_json::from_value(json!({"apiVersion": "test.io/v1", "kind": "Gizmo", "metadata": {"name": name}, "spec": spec})).expect("gizmo")
}

#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_subresource_and_generation(backend: Backend) {
    let (cl, c) = start(backend).await;
    create_crd(&c).await;
    let api = gizmo_api(&c);
    let mut g = gizmo("g1", json!({"size": 1}));
    g.data["status"] = json!({"ready": true});
    let created = api
        .create(&PostParams::default(), &g)
        .await
        .expect("create");
    assert_eq!(created.metadata.generation, Some(1));
    assert!(
        created.data.get("status").is_none(),
        "status is dropped on create with a status subresource"
    );
    // Status writes change status only, and not the generation.
    let st = api
        .patch_status(
            "g1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"ready": true}, "spec": {"size": 9}})),
        )
        .await
        .expect("status");
    assert_eq!(st.data["status"]["ready"], true);
    assert_eq!(st.data["spec"]["size"], 1, "spec ignored on /status");
    assert_eq!(st.metadata.generation, Some(1));
    // Main-resource writes ignore status; spec changes bump generation, metadata changes do not.
    let o = api
        .patch(
            "g1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 2}, "status": {"ready": false}})),
        )
        .await
        .expect("patch");
    assert_eq!(o.metadata.generation, Some(2));
    assert_eq!(o.data["status"]["ready"], true);
    let o = api
        .patch(
            "g1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .expect("patch");
    assert_eq!(o.metadata.generation, Some(2));
    // Status via server-side apply, body without a name (like kube-rs controllers).
    let pp = PatchParams::apply("ctl").force();
    let o = api
        .patch_status(
            "g1",
            &pp,
            &Patch::Apply(
                json!({"apiVersion": "test.io/v1", "kind": "Gizmo", "status": {"ready": false}}),
            ),
        )
        .await
        .expect("apply status");
    assert_eq!(o.data["status"]["ready"], false);
    // A type without a status subresource has none.
    let (status, _) = raw(
        &c,
        "GET",
        "/api/v1/namespaces/default/configmaps/x/status",
        None,
        "",
    )
    .await;
    assert_eq!(status, 404);
    assert_alive(&cl);
}

/// [`CRD`] without `subresources` (like `crds/discoveredservices.yaml`).
fn crd_without_status_subresource() -> Value {
    let mut crd: Value = serde_json::from_str(CRD).expect("crd json");
    crd["metadata"]["name"] = json!("plaingizmos.test.io");
    crd["spec"]["names"] =
        json!({"plural": "plaingizmos", "singular": "plaingizmo", "kind": "PlainGizmo"});
    crd["spec"]["versions"][0]
        .as_object_mut()
        .expect("version")
        .remove("subresources");
    crd
}

/// A CRD WITHOUT a status subresource, as on a real API server: `status` is
/// an ordinary field written by create/update/patch/apply of the main
/// resource (and removed by server-side apply's field removal, with the
/// ownership rules of structured-merge-diff), `/status` is 404, and
/// `metadata.generation` moves on any change outside metadata (spec or
/// status). Subresource requests are counted as `resource/subresource` in
/// the stats.
#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_without_a_subresource_is_an_ordinary_field(backend: Backend) {
    let (cl, c) = start(backend).await;
    create_crd_from(&c, crd_without_status_subresource()).await;
    let api = Api::<DynamicObject>::namespaced_with(
        c.clone(),
        "default",
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("test.io", "v1", "PlainGizmo"),
            "plaingizmos",
        ),
    );
    let plain = |name: &str, size: i64, ready: bool| -> DynamicObject {
        serde_json::from_value(json!({"apiVersion": "test.io/v1", "kind": "PlainGizmo",
            "metadata": {"name": name}, "spec": {"size": size}, "status": {"ready": ready}}))
        .expect("plaingizmo")
    };
    // Create keeps the status.
    let created = api
        .create(&PostParams::default(), &plain("p1", 1, true))
        .await
        .expect("create");
    assert_eq!(created.data["status"]["ready"], true, "{:?}", created.data);
    assert_eq!(created.metadata.generation, Some(1));
    // A merge patch of the status alone changes it and the generation.
    let o = api
        .patch(
            "p1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"ready": false}})),
        )
        .await
        .expect("patch status field");
    assert_eq!(o.data["status"]["ready"], false);
    assert_eq!(o.metadata.generation, Some(2));
    // Metadata-only changes keep the generation.
    let o = api
        .patch(
            "p1",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .expect("label");
    assert_eq!(o.metadata.generation, Some(2));
    // ONE server-side apply writes spec and status (what kube-discovery does).
    let pp = PatchParams::apply("ctl").force();
    let before = cl.stats().await.expect("stats");
    let o = api
        .patch(
            "p1",
            &pp,
            &Patch::Apply(json!({"apiVersion": "test.io/v1", "kind": "PlainGizmo",
                "metadata": {"name": "p1"}, "spec": {"size": 3}, "status": {"ready": true}})),
        )
        .await
        .expect("apply spec and status");
    assert_eq!(o.data["spec"]["size"], 3);
    assert_eq!(o.data["status"]["ready"], true);
    assert_eq!(o.metadata.generation, Some(3));
    let after = cl.stats().await.expect("stats");
    assert_eq!(
        sim_support::count(&after, "patch", "plaingizmos")
            - sim_support::count(&before, "patch", "plaingizmos"),
        1
    );
    // The applier owns the status fields it sent.
    let mf = o.metadata.managed_fields.clone().unwrap_or_default();
    let ctl = mf
        .iter()
        .find(|m| m.manager.as_deref() == Some("ctl"))
        .expect("ctl entry");
    assert!(ctl.subresource.is_none(), "{ctl:?}");
    let fields = serde_json::to_value(&ctl.fields_v1).expect("fields");
    assert!(
        fields.pointer("/f:status/f:ready").is_some(),
        "status owned by the applier: {fields}"
    );
    // An apply without the status removes what the applier owned of it:
    // `status.ready` (taken over, by force, from the creator). The `status`
    // map itself belongs to the update that created it, so, as in
    // structured-merge-diff, it stays, emptied: `null`, which this schema
    // refuses.
    let without_status = json!({"apiVersion": "test.io/v1", "kind": "PlainGizmo",
        "metadata": {"name": "p1"}, "spec": {"size": 3}});
    let s = api_err(
        api.patch("p1", &pp, &Patch::Apply(&without_status))
            .await
            .expect_err("apply without status"),
    );
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"), "{s:?}");
    assert_eq!(
        s.message,
        r#"PlainGizmo.test.io "p1" is invalid: status: Invalid value: "null": status in body must be of type object: "null""#
    );
    let cause = &s.details.expect("details").causes[0];
    assert_eq!(
        (cause.reason.as_str(), cause.field.as_str()),
        ("FieldValueTypeInvalid", "status")
    );
    // An object only the applier ever wrote loses the whole status.
    let mut p2 = without_status.clone();
    p2["metadata"]["name"] = json!("p2");
    let mut p2_with_status = p2.clone();
    p2_with_status["status"] = json!({"ready": true});
    api.patch("p2", &pp, &Patch::Apply(&p2_with_status))
        .await
        .expect("create p2 by apply");
    let o = api
        .patch("p2", &pp, &Patch::Apply(&p2))
        .await
        .expect("apply without status");
    assert!(
        o.data.get("status").is_none(),
        "status not removed: {:?}",
        o.data
    );
    assert_eq!(o.metadata.generation, Some(2));
    // Update (PUT) writes the status too.
    let mut cur = api.get("p1").await.expect("get");
    assert_eq!(
        cur.data["status"]["ready"], true,
        "the refused apply changed nothing"
    );
    assert_eq!(cur.metadata.generation, Some(3));
    cur.data["status"] = json!({"ready": false});
    let o = api
        .replace("p1", &PostParams::default(), &cur)
        .await
        .expect("update");
    assert_eq!(o.data["status"]["ready"], false);
    assert_eq!(o.metadata.generation, Some(4));
    // No `/status` route: every verb is 404 (and counted as the subresource).
    let before = cl.stats().await.expect("stats");
    for (method, body, ct) in [
        ("GET", None, ""),
        (
            "PATCH",
            Some(json!({"status": {"ready": false}})),
            "application/merge-patch+json",
        ),
        (
            "PUT",
            Some(serde_json::to_value(&o).expect("json")),
            "application/json",
        ),
    ] {
        let (code, body) = raw(
            &c,
            method,
            "/apis/test.io/v1/namespaces/default/plaingizmos/p1/status",
            body,
            ct,
        )
        .await;
        assert_eq!(code, 404, "{method} /status: {body}");
        assert_eq!(body["reason"], "NotFound", "{method} /status: {body}");
        assert_eq!(
            body["message"], r#"plaingizmos.test.io "p1" not found"#,
            "{method} /status: {body}"
        );
    }
    let after = cl.stats().await.expect("stats");
    assert_eq!(
        sim_support::count(&after, "patch", "plaingizmos/status")
            - sim_support::count(&before, "patch", "plaingizmos/status"),
        1
    );
    assert_eq!(
        sim_support::count(&after, "patch", "plaingizmos"),
        sim_support::count(&before, "patch", "plaingizmos"),
        "a /status request is not counted as a write of the resource"
    );
    let o = api.get("p1").await.expect("get");
    assert_eq!(o.data["status"]["ready"], false, "404s changed nothing");
    assert_eq!(o.metadata.generation, Some(4));
    assert_alive(&cl);
}

/// Polls until `ns/name` is gone (the real server's garbage collector and
/// namespace controller run asynchronously in kube-controller-manager;
/// kube-sim's are synchronous, so there the first look already sees it).
async fn wait_gone(cms: &Api<ConfigMap>, name: &str, what: &str) {
    eventually(30, what, || async {
        cms.get_opt(name)
            .await
            .expect("get")
            .is_none()
            .then_some(())
    })
    .await;
}

/// Garbage collection (background, transitive, shared owners, orphaning),
/// finalizers and namespace deletion: kube-controller-manager's garbage
/// collector and namespace controller on the real server.
#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_reference_garbage_collection(backend: Backend) {
    let (cl, c) = start_with(
        backend,
        testenv::Options {
            controller_manager: true,
            ..options(false)
        },
    )
    .await;
    let cms: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    let owner = cms
        .create(&PostParams::default(), &cm("owner", &[]))
        .await
        .expect("owner");
    let uid = owner.metadata.uid.clone().expect("uid");
    // Owner references name their owner (kind, name, uid).
    let dependent = |name: &str, owners: &[(&str, &str)]| -> ConfigMap {
        let refs: Vec<Value> = owners
            .iter()
            .map(|(n, u)| json!({"apiVersion": "v1", "kind": "ConfigMap", "name": n, "uid": u}))
            .collect();
        serde_json::from_value(json!({"metadata": {"name": name, "ownerReferences": refs}}))
            .expect("dep")
    };
    cms.create(
        &PostParams::default(),
        &dependent("dep", &[("owner", &uid)]),
    )
    .await
    .expect("dep");
    let other = cms
        .create(&PostParams::default(), &cm("other-owner", &[]))
        .await
        .expect("other");
    let other_uid = other.metadata.uid.clone().expect("uid");
    cms.create(
        &PostParams::default(),
        &dependent("shared", &[("owner", &uid), ("other-owner", &other_uid)]),
    )
    .await
    .expect("shared");
    // A reference with a live owner's uid but another name is dangling: it
    // does not keep its object.
    cms.create(
        &PostParams::default(),
        &dependent("misnamed", &[("owner", &uid), ("owner", &other_uid)]),
    )
    .await
    .expect("misnamed");
    // A dependent of a dependent is collected too.
    let dep = cms.get("dep").await.expect("dep");
    let dep_uid = dep.metadata.uid.clone().expect("uid");
    cms.create(
        &PostParams::default(),
        &dependent("grandchild", &[("dep", &dep_uid)]),
    )
    .await
    .expect("grandchild");

    cms.delete("owner", &DeleteParams::default())
        .await
        .expect("delete");
    wait_gone(&cms, "dep", "dependent collected").await;
    wait_gone(&cms, "grandchild", "transitive dependent collected").await;
    wait_gone(
        &cms,
        "misnamed",
        "dependent with only dangling references collected",
    )
    .await;
    // The collector has handled the owner's dependents by now (the
    // grandchild went after `dep`): one with a live owner stays.
    assert!(
        cms.get_opt("shared").await.expect("get").is_some(),
        "an object with a live owner stays"
    );

    // Orphan propagation keeps dependents and drops the reference.
    cms.create(
        &PostParams::default(),
        &dependent("orphan", &[("other-owner", &other_uid)]),
    )
    .await
    .expect("orphan");
    cms.delete("other-owner", &DeleteParams::orphan())
        .await
        .expect("delete orphan");
    wait_gone(&cms, "other-owner", "orphaning owner deleted").await;
    let o = cms.get("orphan").await.expect("orphan survives");
    assert!(
        o.metadata.owner_references.unwrap_or_default().is_empty(),
        "the reference to the deleted owner was removed first"
    );

    // Finalizers hold deletion until removed.
    let mut f = cm("final", &[]);
    f.metadata.finalizers = Some(vec!["test/hold".into()]);
    cms.create(&PostParams::default(), &f)
        .await
        .expect("create");
    cms.delete("final", &DeleteParams::default())
        .await
        .expect("delete");
    let held = cms.get("final").await.expect("still there");
    assert!(held.metadata.deletion_timestamp.is_some());
    cms.patch(
        "final",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .expect("unfinalize");
    assert!(
        cms.get_opt("final").await.expect("get").is_none(),
        "the write that removes the last finalizer deletes the object"
    );
    // Releasing a finalizer also collects the object's dependents.
    let mut held = cm("held-owner", &[]);
    held.metadata.finalizers = Some(vec!["test/hold".into()]);
    let held = cms
        .create(&PostParams::default(), &held)
        .await
        .expect("create");
    let held_uid = held.metadata.uid.clone().expect("uid");
    cms.create(
        &PostParams::default(),
        &dependent("held-dep", &[("held-owner", &held_uid)]),
    )
    .await
    .expect("dep");
    cms.delete("held-owner", &DeleteParams::default())
        .await
        .expect("delete");
    assert!(
        cms.get_opt("held-dep").await.expect("get").is_some(),
        "owner still exists (finalizing)"
    );
    cms.patch(
        "held-owner",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": []}})),
    )
    .await
    .expect("unfinalize");
    assert!(cms.get_opt("held-owner").await.expect("get").is_none());
    wait_gone(
        &cms,
        "held-dep",
        "dependent collected after the finalizer was released",
    )
    .await;

    // Deleting a namespace deletes its contents (and then the namespace).
    ns(&c, "doomed").await;
    let in_ns: Api<ConfigMap> = Api::namespaced(c.clone(), "doomed");
    in_ns
        .create(&PostParams::default(), &cm("x", &[]))
        .await
        .expect("create");
    let namespaces: Api<Namespace> = Api::all(c.clone());
    namespaces
        .delete("doomed", &DeleteParams::default())
        .await
        .expect("delete ns");
    wait_gone(&in_ns, "x", "namespace contents deleted").await;
    eventually(30, "namespace deleted", || async {
        namespaces
            .get_opt("doomed")
            .await
            .expect("get ns")
            .is_none()
            .then_some(())
    })
    .await;
    assert!(
        Api::<ConfigMap>::all(c.clone())
            .list(&ListParams::default().fields("metadata.namespace=doomed"))
            .await
            .expect("list")
            .items
            .is_empty()
    );
    assert_alive(&cl);
}

#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_preconditions_dry_run_and_status_errors(backend: Backend) {
    let (cl, c) = start(backend).await;
    let api: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    let a = api
        .create(&PostParams::default(), &cm("a", &[]))
        .await
        .expect("create");
    let rv1: u64 = a
        .metadata
        .resource_version
        .clone()
        .expect("rv")
        .parse()
        .expect("numeric rv");
    let b = api
        .create(&PostParams::default(), &cm("b", &[]))
        .await
        .expect("create");
    let rv2: u64 = b
        .metadata
        .resource_version
        .clone()
        .expect("rv")
        .parse()
        .expect("numeric rv");
    assert!(rv2 > rv1, "one global, increasing resourceVersion");
    let list = api.list(&ListParams::default()).await.expect("list");
    let list_rv: u64 = list
        .metadata
        .resource_version
        .expect("list rv")
        .parse()
        .expect("numeric");
    assert_rv_at_least(&cl, list_rv, rv2, "a list's revision");

    // AlreadyExists
    let s = api_err(
        api.create(&PostParams::default(), &cm("a", &[]))
            .await
            .expect_err("dup"),
    );
    assert_eq!((s.code, s.reason.as_str()), (409, "AlreadyExists"));
    // Update with a stale resourceVersion -> 409 Conflict.
    let mut stale = a.clone();
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "new"}})),
    )
    .await
    .expect("patch");
    stale.data = Some(BTreeMap::from([("k".to_string(), "stale".to_string())]));
    let s = api_err(
        api.replace("a", &PostParams::default(), &stale)
            .await
            .expect_err("stale"),
    );
    assert_eq!((s.code, s.reason.as_str()), (409, "Conflict"));
    assert!(
        s.message.contains("the object has been modified"),
        "{}",
        s.message
    );
    // dryRun=All validates but stores nothing.
    let pp = PostParams {
        dry_run: true,
        ..Default::default()
    };
    api.create(&pp, &cm("dry", &[]))
        .await
        .expect("dry run create");
    assert!(api.get_opt("dry").await.expect("get").is_none());
    let dp = DeleteParams {
        dry_run: true,
        ..Default::default()
    };
    api.delete("a", &dp).await.expect("dry run delete");
    assert!(api.get_opt("a").await.expect("get").is_some());
    // generateName
    let g: ConfigMap =
        serde_json::from_value(json!({"metadata": {"generateName": "gen-"}})).expect("cm");
    let g = api
        .create(&PostParams::default(), &g)
        .await
        .expect("generateName");
    assert!(
        g.metadata
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with("gen-") && n.len() == 9)
    );
    // Invalid names and labels -> 422 Invalid naming the field.
    let s = api_err(
        api.create(&PostParams::default(), &cm("Bad_Name", &[]))
            .await
            .expect_err("bad name"),
    );
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    assert!(s.message.contains("metadata.name"), "{}", s.message);
    let s = api_err(
        api.create(&PostParams::default(), &cm("ok", &[("bad key!", "v")]))
            .await
            .expect_err("bad label"),
    );
    assert_eq!(s.code, 422);
    assert!(s.message.contains("metadata.labels"), "{}", s.message);
    // A namespaced object needs its namespace.
    let missing: Api<ConfigMap> = Api::namespaced(c.clone(), "nope");
    let s = api_err(
        missing
            .create(&PostParams::default(), &cm("x", &[]))
            .await
            .expect_err("no ns"),
    );
    assert_eq!((s.code, s.reason.as_str()), (404, "NotFound"));
    assert!(
        s.message.contains("namespaces \"nope\" not found"),
        "{}",
        s.message
    );
    // Secrets: stringData folds into data.
    let secrets: Api<Secret> = Api::namespaced(c.clone(), "default");
    let sec: Secret =
        serde_json::from_value(json!({"metadata": {"name": "s"}, "stringData": {"user": "admin"}}))
            .expect("secret");
    let sec = secrets
        .create(&PostParams::default(), &sec)
        .await
        .expect("secret");
    assert_eq!(sec.data.expect("data")["user"].0, b"admin");
    assert_eq!(sec.type_.as_deref(), Some("Opaque"));

    // Unknown resources and methods of the API groups answer with a Status.
    for (method, path, code) in [
        ("GET", "/api/v1/namespaces/default/widgets", 404),
        ("GET", "/apis/apps/v1/widgets", 404),
        ("GET", "/apis/apps/v2/deployments", 404),
        ("GET", "/api/v1/namespaces/default/configmaps/a/nosuch", 404),
        ("PUT", "/api/v1/namespaces/default/configmaps", 405),
        ("POST", "/api/v1/namespaces/default/configmaps/a", 405),
    ] {
        let (status, body) = raw(
            &c,
            method,
            path,
            if method == "GET" {
                None
            } else {
                Some(json!({}))
            },
            "application/json",
        )
        .await;
        assert_eq!(status, code, "{method} {path}: {body}");
        assert_eq!(body["kind"], "Status", "{method} {path}: {body}");
        assert_eq!(body["code"], code);
    }
    // Pods are served by the real server only (README, known limitations).
    let (status, body) = raw(&c, "GET", "/api/v1/namespaces/default/pods", None, "").await;
    if cl.is_real() {
        assert_eq!((status, &body["kind"]), (200, &json!("PodList")), "{body}");
    } else {
        assert_eq!(
            (status, &body["reason"]),
            (404, &json!("NotFound")),
            "{body}"
        );
    }
    // Paths outside the API groups (an unknown group, no API at all) get
    // the server's plain-text 404.
    for path in [
        "/apis/example.com/v1/things",
        "/apis/example.com",
        "/nonsense",
    ] {
        let (status, body) = raw(&c, "GET", path, None, "").await;
        assert_eq!(status, 404, "{path}: {body}");
        assert_eq!(body, json!("404 page not found\n"), "{path}");
    }
    // Bodies over 3 MiB -> 413.
    let big = json!({"metadata": {"name": "big"}, "data": {"k": "x".repeat(3 * 1024 * 1024)}});
    let (status, body) = raw(
        &c,
        "POST",
        "/api/v1/namespaces/default/configmaps",
        Some(big),
        "application/json",
    )
    .await;
    assert_eq!(status, 413, "{body}");
    assert_eq!(body["reason"], "RequestEntityTooLarge");
    assert_eq!(
        body["message"],
        "Request entity too large: limit is 3145728"
    );
    // Patches that do not make an object are rejected, nothing is stored.
    let rv_a = api.get("a").await.expect("get").metadata.resource_version;
    let (status, body) = raw(
        &c,
        "PATCH",
        "/api/v1/namespaces/default/configmaps/a",
        Some(json!([{"op": "replace", "path": "", "value": [1]}])),
        "application/json-patch+json",
    )
    .await;
    assert_eq!(
        (status, &body["reason"]),
        (422, &json!("Invalid")),
        "{body}"
    );
    // (The API server's JSON patch library ignores a root `replace` with a
    // value that is neither an object nor an array: the patch is a no-op.)
    let (status, body) = raw(
        &c,
        "PATCH",
        "/api/v1/namespaces/default/configmaps/a",
        Some(json!([{"op": "replace", "path": "", "value": "x"}])),
        "application/json-patch+json",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["metadata"]["resourceVersion"], json!(rv_a), "{body}");
    let (status, body) = raw(
        &c,
        "PATCH",
        "/api/v1/namespaces/default/configmaps/a",
        Some(json!("x")),
        "application/merge-patch+json",
    )
    .await;
    assert_eq!(
        (status, &body["reason"]),
        (400, &json!("BadRequest")),
        "{body}"
    );
    assert_eq!(
        body["message"],
        "error decoding patch: json: cannot unmarshal string into Go value of type map[string]interface {}"
    );
    let (status, body) = raw(
        &c,
        "PATCH",
        "/api/v1/namespaces/default/configmaps/a?fieldManager=m",
        Some(json!(["x"])),
        "application/apply-patch+yaml",
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(api.get("a").await.expect("still there").data.is_some());
    // Unknown patch type -> 415.
    let (status, _) = raw(
        &c,
        "PATCH",
        "/api/v1/namespaces/default/configmaps/a",
        Some(json!({})),
        "text/plain",
    )
    .await;
    assert_eq!(status, 415);
    assert_eq!(
        api.get("a").await.expect("get").metadata.resource_version,
        rv_a,
        "no patch changed the object"
    );
    assert_alive(&cl);
}

/// Authentication (anonymous requests, unknown tokens, TokenRequest tokens,
/// plain users) and RBAC (Roles, ClusterRoles, bindings, `resourceNames`).
/// RBAC changes are in effect at once on kube-sim, a moment later on the real
/// server (its authorizer reads the RBAC objects through an informer).
#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authentication_rbac_and_token_requests(backend: Backend) {
    let (cl, admin) = start_with(backend, options(true)).await;
    let client = |token: String| {
        let cl = &cl;
        async move { api_client(cl, &token).await }
    };
    // No token: the anonymous user, whom RBAC lets read only the public
    // information (`system:public-info-viewer`: health and /version).
    let mut cfg = kube::Config::new(cl.direct_url().parse().expect("url"));
    cfg.root_cert = Some(vec![rustls_pemfile_der(&cl.ca_pem().expect("ca"))]);
    cfg.default_retry = false;
    let anon = kube::Client::try_from(cfg).expect("client");
    let (status, body) = raw(&anon, "GET", "/api/v1/namespaces", None, "").await;
    assert_eq!(
        (status, &body["reason"]),
        (403, &json!("Forbidden")),
        "{body}"
    );
    assert_eq!(
        body["message"],
        r#"namespaces is forbidden: User "system:anonymous" cannot list resource "namespaces" in API group "" at the cluster scope"#
    );
    let (status, v) = raw(&anon, "GET", "/version", None, "").await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["major"], "1");
    let (status, body) = raw(&anon, "GET", "/apis", None, "").await;
    assert_eq!(status, 403, "discovery is for authenticated users: {body}");
    assert_eq!(
        body["message"],
        r#"forbidden: User "system:anonymous" cannot get path "/apis""#
    );
    // An unknown token is refused before anything else.
    let bogus = client("no-such-token".into()).await;
    for path in ["/version", "/api/v1/namespaces"] {
        let (status, body) = raw(&bogus, "GET", path, None, "").await;
        assert_eq!(
            (status, &body["reason"]),
            (401, &json!("Unauthorized")),
            "{path}: {body}"
        );
    }

    // A token requested through the API authenticates as the ServiceAccount.
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), "default");
    sas.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "bot"}})).expect("sa"),
    )
    .await
    .expect("sa");
    let (status, tr) = raw(
        &admin,
        "POST",
        "/api/v1/namespaces/default/serviceaccounts/bot/token",
        Some(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {}})),
        "application/json",
    )
    .await;
    assert_eq!(status, 201, "{tr}");
    let token = tr["status"]["token"].as_str().expect("token").to_string();
    let bot = client(token).await;
    let (status, body) = raw(
        &bot,
        "GET",
        "/api/v1/namespaces/default/configmaps",
        None,
        "",
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["reason"], "Forbidden");
    assert_eq!(
        body["message"],
        r#"configmaps is forbidden: User "system:serviceaccount:default:bot" cannot list resource "configmaps" in API group "" in the namespace "default""#
    );
    // Discovery is open to authenticated users (system:discovery).
    let (status, _) = raw(&bot, "GET", "/apis", None, "").await;
    assert_eq!(status, 200);
    if !cl.is_real() {
        // kube-sim's /_sim hooks are admin-only.
        let (status, _) = raw(&bot, "GET", "/_sim/stats", None, "").await;
        assert_eq!(status, 403);
    }
    // A ClusterRole with resourceNames and a RoleBinding grant exactly one object.
    let rbac = [
        (
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            json!({"metadata": {"name": "one-cm"}, "rules": [{"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["allowed"], "verbs": ["get"]}]}),
        ),
        (
            "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings",
            json!({"metadata": {"name": "bot-one-cm"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "one-cm"}, "subjects": [{"kind": "ServiceAccount", "name": "bot", "namespace": "default"}]}),
        ),
    ];
    for (path, mut body) in rbac {
        body["apiVersion"] = json!("rbac.authorization.k8s.io/v1");
        body["kind"] = json!(if path.contains("clusterroles") {
            "ClusterRole"
        } else {
            "RoleBinding"
        });
        let (status, resp) = raw(&admin, "POST", path, Some(body), "application/json").await;
        assert_eq!(status, 201, "{resp}");
    }
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), "default");
    for n in ["allowed", "denied"] {
        cms.create(&PostParams::default(), &cm(n, &[]))
            .await
            .expect("cm");
    }
    let bot_cms: Api<ConfigMap> = Api::namespaced(bot.clone(), "default");
    eventually(10, "get granted by resourceNames", || async {
        bot_cms.get("allowed").await.ok()
    })
    .await;
    let s = api_err(bot_cms.get("denied").await.expect_err("other name"));
    assert_eq!(s.code, 403);
    assert!(
        s.message.starts_with(r#"configmaps "denied" is forbidden"#),
        "{}",
        s.message
    );
    // A plain user (of group `devs`).
    let alice = client(cl.user_token("alice").expect("alice")).await;
    let (status, body) = raw(&alice, "GET", "/api/v1/namespaces", None, "").await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["message"].as_str().is_some_and(|m| m.contains(
            r#"User "alice" cannot list resource "namespaces" in API group "" at the cluster scope"#
        )),
        "{body}"
    );
    assert_alive(&cl);
}

fn rustls_pemfile_der(pem: &str) -> Vec<u8> {
    let b64: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(b64)
        .expect("pem base64")
}

/// Discovery and a CRD's life: served once established, removed with its
/// objects when deleted (on the real server asynchronously: the CRD's
/// cleanup finalizer deletes the objects first).
#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_and_crd_lifecycle(backend: Backend) {
    let (cl, c) = start(backend).await;
    create_crd(&c).await;
    let d = kube::Discovery::new(c.clone())
        .run()
        .await
        .expect("discovery");
    let (ar, caps) = d
        .resolve_gvk(&GroupVersionKind::gvk("test.io", "v1", "Gizmo"))
        .expect("gizmo discovered");
    assert_eq!(ar.plural, "gizmos");
    assert_eq!(caps.scope, kube::discovery::Scope::Namespaced);
    let (ar, _) = d
        .resolve_gvk(&GroupVersionKind::gvk(
            "discovery.k8s.io",
            "v1",
            "EndpointSlice",
        ))
        .expect("slices");
    assert_eq!(ar.plural, "endpointslices");
    assert_eq!(
        d.resolve_gvk(&GroupVersionKind::gvk("", "v1", "Pod"))
            .is_some(),
        cl.is_real(),
        "pods are served by the real server only (README, known limitations)"
    );
    let (status, v) = raw(&c, "GET", "/version", None, "").await;
    assert_eq!(status, 200);
    assert_eq!(v["major"], "1");
    // Deleting the CRD stops serving the resource and removes its objects.
    let api = gizmo_api(&c);
    api.create(&PostParams::default(), &gizmo("g", json!({"size": 3})))
        .await
        .expect("create");
    let (status, _) = raw(
        &c,
        "DELETE",
        "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/gizmos.test.io",
        None,
        "",
    )
    .await;
    assert_eq!(status, 200);
    eventually(30, "gizmos no longer served", || async {
        let (status, _) = raw(
            &c,
            "GET",
            "/apis/test.io/v1/namespaces/default/gizmos",
            None,
            "",
        )
        .await;
        (status == 404).then_some(())
    })
    .await;
    eventually(30, "the CRD is gone", || async {
        let (status, _) = raw(&c, "GET", &format!("{CRDS}/gizmos.test.io"), None, "").await;
        (status == 404).then_some(())
    })
    .await;
    create_crd(&c).await;
    assert!(
        api.list(&ListParams::default())
            .await
            .expect("list")
            .items
            .is_empty(),
        "objects went with the CRD"
    );
    assert_alive(&cl);
}

#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_resources_are_validated_and_pruned_by_their_schema(backend: Backend) {
    let (cl, c) = start(backend).await;
    create_crd(&c).await;
    let api = gizmo_api(&c);
    let invalid = |spec: Value| {
        let api = api.clone();
        async move {
            api_err(
                api.create(&PostParams::default(), &gizmo("bad", spec))
                    .await
                    .expect_err("invalid"),
            )
        }
    };
    let s = invalid(json!({"size": 20})).await;
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"));
    assert!(
        s.message
            .starts_with(r#"Gizmo.test.io "bad" is invalid: spec.size"#),
        "{}",
        s.message
    );
    assert!(
        s.message.contains("less than or equal to 10"),
        "{}",
        s.message
    );
    let s = invalid(json!({})).await;
    assert!(
        s.message.contains("spec.size: Required value"),
        "{}",
        s.message
    );
    let s = invalid(json!({"size": 1, "mode": "c"})).await;
    assert!(
        s.message.contains("spec.mode: Unsupported value"),
        "{}",
        s.message
    );
    let s = invalid(json!({"size": 1, "name": "UPPER"})).await;
    assert!(s.message.contains("spec.name"), "{}", s.message);
    let s = invalid(json!({"size": "one"})).await;
    assert!(s.message.contains("spec.size"), "{}", s.message);
    let s = invalid(json!({"size": 1, "labels": {"a": 1}})).await;
    assert!(s.message.contains("spec.labels.a"), "{}", s.message);
    let causes = s.details.expect("details").causes;
    assert!(
        causes.iter().any(|c| c.field == "spec.labels.a"),
        "{causes:?}"
    );

    // Unknown fields are pruned; x-kubernetes-preserve-unknown-fields keeps them.
    let o = api
        .create(
            &PostParams::default(),
            &gizmo(
                "ok",
                json!({"size": 2, "bogus": true, "extra": {"anything": {"goes": 1}}}),
            ),
        )
        .await
        .expect("valid");
    assert!(o.data["spec"].get("bogus").is_none(), "{:?}", o.data);
    assert_eq!(o.data["spec"]["extra"]["anything"]["goes"], 1);
    // A `null` the schema neither allows nor defaults is dropped when the
    // request is decoded (not refused).
    let o = api
        .create(
            &PostParams::default(),
            &gizmo("nulls", json!({"size": 2, "extra": null, "mode": null})),
        )
        .await
        .expect("nulls dropped");
    assert_eq!(o.data["spec"], json!({"size": 2}), "{:?}", o.data);
    // With fieldValidation=Strict the unknown field is an error instead.
    let (status, body) = raw(
        &c,
        "POST",
        "/apis/test.io/v1/namespaces/default/gizmos?fieldValidation=Strict",
        Some(json!({"apiVersion": "test.io/v1", "kind": "Gizmo", "metadata": {"name": "strict"}, "spec": {"size": 2, "bogus": true}})),
        "application/json",
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["message"]
            .as_str()
            .is_some_and(|m| m.contains(r#"unknown field "spec.bogus""#)),
        "{body}"
    );
    // Updates are validated too.
    let s = api_err(
        api.patch(
            "ok",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"size": 0}})),
        )
        .await
        .expect_err("invalid patch"),
    );
    assert_eq!(s.code, 422);
    // An invalid CRD schema is rejected.
    let mut crd: Value = serde_json::from_str(CRD).expect("crd");
    crd["metadata"]["name"] = json!("bads.test.io");
    crd["spec"]["names"] = json!({"plural": "bads", "singular": "bad", "kind": "Bad"});
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"] = json!({"type": "string"});
    let (status, body) = raw(&c, "POST", CRDS, Some(crd), "application/json").await;
    assert_eq!(status, 422, "{body}");
    assert_alive(&cl);
}

#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn configmaps_are_limited_to_1_mib_and_immutable_ones_keep_their_data(backend: Backend) {
    let (cl, c) = start(backend).await;
    let api: Api<ConfigMap> = Api::namespaced(c.clone(), "default");
    // Two values of 600,000 bytes: under the request body limit, over 1 MiB of data.
    let big: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "big"},
        "data": {"a": "x".repeat(600_000), "b": "y".repeat(600_000)}}))
    .expect("ok");
    let s = api_err(
        api.create(&PostParams::default(), &big)
            .await
            .expect_err("refused"),
    );
    assert_eq!((s.code, s.reason.as_str()), (422, "Invalid"), "{s:?}");
    assert_eq!(
        s.message,
        r#"ConfigMap "big" is invalid: []: Too long: may not be more than 1048576 bytes"#
    );
    assert!(api.get_opt("big").await.expect("ok").is_none());
    // Exactly 1 MiB is fine.
    let ok: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "ok"},
        "data": {"a": "x".repeat(1024 * 1024)}}))
    .expect("ok");
    api.create(&PostParams::default(), &ok)
        .await
        .expect("1 MiB fits");

    let frozen: ConfigMap = serde_json::from_value(
        json!({"metadata": {"name": "frozen"}, "immutable": true, "data": {"k": "v"}}),
    )
    .expect("ok");
    api.create(&PostParams::default(), &frozen)
        .await
        .expect("ok");
    let pp = PatchParams::apply("test").force();
    let edit = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "frozen"},
        "immutable": true, "data": {"k": "changed"}});
    let s = api_err(
        api.patch("frozen", &pp, &Patch::Apply(&edit))
            .await
            .expect_err("refused"),
    );
    assert_eq!(s.code, 422, "{s:?}");
    assert!(s.message.contains("immutable"), "{}", s.message);
    let thaw = json!({"immutable": false});
    let s = api_err(
        api.patch("frozen", &PatchParams::default(), &Patch::Merge(&thaw))
            .await
            .expect_err("refused"),
    );
    assert_eq!(s.code, 422, "{s:?}");
    // Labels may still change; deleting works.
    let label = json!({"metadata": {"labels": {"x": "y"}}});
    api.patch("frozen", &PatchParams::default(), &Patch::Merge(&label))
        .await
        .expect("metadata of an immutable ConfigMap may change");
    assert_eq!(
        api.get("frozen").await.expect("ok").data.expect("ok")["k"],
        "v"
    );
    api.delete("frozen", &DeleteParams::default())
        .await
        .expect("ok");
    assert_alive(&cl);
}

/// GET `path` with `c` (an [`api_client`]: no client retries): (status, body).
async fn get_plain(c: &kube::Client, path: &str) -> (u16, Value) {
    raw(c, "GET", path, None, "").await
}

fn item_names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|o| o["metadata"]["name"].as_str().expect("name").to_string())
        .collect()
}

fn list_rv(list: &Value) -> u64 {
    list["metadata"]["resourceVersion"]
        .as_str()
        .expect("list resourceVersion")
        .parse()
        .expect("numeric")
}

/// A paginated list is one snapshot at the first page's revision, like the real
/// server serving every page from etcd at that revision: later pages carry the
/// first page's `resourceVersion`, show objects as they were then (changed ones
/// in their old state, deleted ones still there, new ones absent), and a watch
/// from that revision replays every change made meanwhile.
#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paginated_list_is_a_snapshot_at_the_first_pages_revision(backend: Backend) {
    let (cl, c) = start(backend).await;
    ns(&c, "snap").await;
    let api: Api<ConfigMap> = Api::namespaced(c.clone(), "snap");
    for i in 0..6 {
        api.create(&PostParams::default(), &cm(&format!("cm-{i:02}"), &[]))
            .await
            .expect("create");
    }
    let base = "/api/v1/namespaces/snap/configmaps?limit=2";
    let (code, page1) = get_plain(&c, base).await;
    assert_eq!(code, 200, "{page1}");
    assert_eq!(item_names(&page1), ["cm-00", "cm-01"]);
    let rv1 = list_rv(&page1);
    let token = page1["metadata"]["continue"]
        .as_str()
        .expect("continue")
        .to_string();

    // Changes between the pages: to objects already returned and to ones not yet.
    let changed = Patch::Merge(json!({"data": {"k": "changed"}}));
    api.patch("cm-00", &PatchParams::default(), &changed)
        .await
        .expect("patch");
    api.delete("cm-01", &DeleteParams::default())
        .await
        .expect("delete");
    api.patch("cm-03", &PatchParams::default(), &changed)
        .await
        .expect("patch");
    api.delete("cm-04", &DeleteParams::default())
        .await
        .expect("delete");
    api.create(&PostParams::default(), &cm("cm-06", &[]))
        .await
        .expect("create");

    let (code, page2) = get_plain(&c, &format!("{base}&continue={token}")).await;
    assert_eq!(code, 200, "{page2}");
    assert_eq!(
        list_rv(&page2),
        rv1,
        "page 2 carries the first page's revision"
    );
    assert_eq!(item_names(&page2), ["cm-02", "cm-03"]);
    assert_eq!(
        page2["items"][1]["data"]["k"], "v",
        "cm-03 as it was at {rv1}"
    );
    assert_eq!(page2["metadata"]["remainingItemCount"], 2);
    let token = page2["metadata"]["continue"]
        .as_str()
        .expect("continue")
        .to_string();
    let (code, page3) = get_plain(&c, &format!("{base}&continue={token}")).await;
    assert_eq!(code, 200, "{page3}");
    assert_eq!(list_rv(&page3), rv1);
    assert_eq!(
        item_names(&page3),
        ["cm-04", "cm-05"],
        "deleted cm-04 is in the snapshot, new cm-06 is not"
    );
    assert!(page3["metadata"].get("continue").is_none(), "{page3}");

    // A watch from the list's revision sees every change made during the paging.
    let (code, events) = sim_support::watch_lines(
        &c,
        &format!("/api/v1/namespaces/snap/configmaps?watch=true&resourceVersion={rv1}"),
        5,
        10,
    )
    .await;
    assert_eq!(code, 200);
    let seen: Vec<(String, String)> = events
        .iter()
        .map(|e| {
            (
                e["type"].as_str().unwrap_or("").to_string(),
                e["object"]["metadata"]["name"]
                    .as_str()
                    .unwrap_or("")
                    .to_string(),
            )
        })
        .collect();
    let want: Vec<(String, String)> = [
        ("MODIFIED", "cm-00"),
        ("DELETED", "cm-01"),
        ("MODIFIED", "cm-03"),
        ("DELETED", "cm-04"),
        ("ADDED", "cm-06"),
    ]
    .iter()
    .map(|(t, n)| (t.to_string(), n.to_string()))
    .collect();
    assert_eq!(seen, want);

    // A continue token whose revision has been compacted: HTTP 410 Expired.
    let (_, page1) = get_plain(&c, base).await;
    let token = page1["metadata"]["continue"]
        .as_str()
        .expect("continue")
        .to_string();
    api.create(&PostParams::default(), &cm("cm-07", &[]))
        .await
        .expect("create");
    // (kube-sim drops its history; the real backend compacts etcd and
    // restarts kube-apiserver.)
    cl.fault(&json!({"compact": true})).await.expect("compact");
    let (code, v) = get_plain(&c, &format!("{base}&continue={token}")).await;
    assert_eq!(code, 410, "{v}");
    assert_eq!(v["reason"], "Expired");
    assert_eq!(v["code"], 410);
    assert!(
        v["message"]
            .as_str()
            .unwrap_or("")
            .starts_with("The provided continue parameter is too old"),
        "{v}"
    );
    assert_alive(&cl);
}

/// LIST honours `resourceVersion`/`resourceVersionMatch` as the real server:
/// unset/"0" and `NotOlderThan` an old revision serve the current state, `Exact`
/// (and a legacy paged list) the state at that revision, a future revision is a
/// 504 `Timeout` ("Too large resource version"), a compacted one a 410, and
/// invalid combinations the real validation errors.
#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_honours_resource_version_and_match(backend: Backend) {
    let (cl, c) = start(backend).await;
    ns(&c, "rvs").await;
    let api: Api<ConfigMap> = Api::namespaced(c.clone(), "rvs");
    let a = api
        .create(&PostParams::default(), &cm("a", &[]))
        .await
        .expect("create");
    let ra: u64 = a
        .metadata
        .resource_version
        .expect("rv")
        .parse()
        .expect("num");
    api.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"k": "new"}})),
    )
    .await
    .expect("patch");
    api.create(&PostParams::default(), &cm("b", &[]))
        .await
        .expect("create");
    let base = "/api/v1/namespaces/rvs/configmaps";
    let (_, now) = get_plain(&c, base).await;
    let cur = list_rv(&now);
    assert!(cur > ra);

    // Current state.
    for q in [
        "resourceVersion=0".to_string(),
        "resourceVersion=0&resourceVersionMatch=NotOlderThan".to_string(),
        format!("resourceVersion={ra}&resourceVersionMatch=NotOlderThan"),
        format!("resourceVersion={ra}"),
        format!("resourceVersion={cur}&resourceVersionMatch=Exact"),
    ] {
        let (code, v) = get_plain(&c, &format!("{base}?{q}")).await;
        assert_eq!(code, 200, "{q}: {v}");
        if q.ends_with("Exact") {
            assert_eq!(list_rv(&v), cur, "{q}");
        } else {
            assert_rv_at_least(&cl, list_rv(&v), cur, &q);
        }
        assert_eq!(item_names(&v), ["a", "b"], "{q}");
        assert_eq!(v["items"][0]["data"]["k"], "new", "{q}");
    }
    // Exactly at an older revision (and the legacy form: a paged list with a
    // bare resourceVersion reads exactly at it).
    for q in [
        format!("resourceVersion={ra}&resourceVersionMatch=Exact"),
        format!("resourceVersion={ra}&limit=5"),
    ] {
        let (code, v) = get_plain(&c, &format!("{base}?{q}")).await;
        assert_eq!(code, 200, "{q}: {v}");
        assert_eq!(list_rv(&v), ra, "{q}");
        assert_eq!(item_names(&v), ["a"], "{q}");
        assert_eq!(v["items"][0]["data"]["k"], "v", "{q}");
    }
    // Newer than the store: 504 Timeout with the ResourceVersionTooLarge cause.
    let ahead = cur + 100;
    for q in [
        format!("resourceVersion={ahead}&resourceVersionMatch=NotOlderThan"),
        format!("resourceVersion={ahead}&resourceVersionMatch=Exact"),
        format!("resourceVersion={ahead}"),
    ] {
        let (code, v) = get_plain(&c, &format!("{base}?{q}")).await;
        assert_eq!(code, 504, "{q}: {v}");
        assert_eq!(v["reason"], "Timeout", "{q}");
        let msg = v["message"].as_str().unwrap_or_default();
        let current = msg
            .strip_prefix(&format!(
                "Timeout: Too large resource version: {ahead}, current: "
            ))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("{q}: {msg}"));
        assert_rv_at_least(&cl, current, cur, &q);
        assert_eq!(v["details"]["retryAfterSeconds"], 1, "{q}");
        assert_eq!(
            v["details"]["causes"][0]["reason"],
            "ResourceVersionTooLarge"
        );
    }
    // Invalid combinations.
    let invalid = |q: &'static str, msg: &'static str| {
        let c = &c;
        async move {
            let (code, v) = get_plain(c, &format!("{base}?{q}")).await;
            assert_eq!(code, 422, "{q}: {v}");
            assert_eq!(v["reason"], "Invalid", "{q}");
            assert_eq!(
                v["message"],
                format!("ListOptions.meta.k8s.io \"\" is invalid: {msg}"),
                "{q}"
            );
        }
    };
    invalid(
        "resourceVersionMatch=Exact",
        "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
    )
    .await;
    invalid(
        "resourceVersion=1&resourceVersionMatch=Newest",
        "resourceVersionMatch: Unsupported value: \"Newest\": supported values: \"Exact\", \"NotOlderThan\", \"\"",
    )
    .await;
    invalid(
        "resourceVersion=0&resourceVersionMatch=Exact",
        "resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
    )
    .await;
    let (code, v) = get_plain(&c, &format!("{base}?resourceVersion=abc")).await;
    assert_eq!(
        (code, v["reason"].as_str()),
        (400, Some("BadRequest")),
        "{v}"
    );
    assert_eq!(
        v["message"],
        r#"invalid resource version: resourceVersion: Invalid value: "abc": strconv.ParseUint: parsing "abc": invalid syntax"#
    );
    let (_, page) = get_plain(&c, &format!("{base}?limit=1")).await;
    let token = page["metadata"]["continue"]
        .as_str()
        .expect("continue")
        .to_string();
    let (code, v) = get_plain(
        &c,
        &format!("{base}?limit=1&continue={token}&resourceVersion={ra}"),
    )
    .await;
    assert_eq!(code, 400, "{v}");
    assert_eq!(
        v["message"],
        "specifying resource version is not allowed when using continue"
    );

    // A compacted revision: HTTP 410 Expired.
    cl.fault(&json!({"compact": true})).await.expect("compact");
    let (code, v) = get_plain(
        &c,
        &format!("{base}?resourceVersion={ra}&resourceVersionMatch=Exact"),
    )
    .await;
    assert_eq!(code, 410, "{v}");
    assert_eq!(v["reason"], "Expired");
    assert_eq!(
        v["message"],
        "The resourceVersion for the provided list is too old."
    );
    assert_alive(&cl);
}

/// Events: core/v1 and events.k8s.io/v1 are one stored object, as on the real
/// server (core/v1 is the storage shape, events.k8s.io/v1 is converted:
/// `message`/`note`, `involvedObject`/`regarding`, `source`/`deprecatedSource`,
/// `count`/`deprecatedCount`, `firstTimestamp`/`deprecatedFirstTimestamp`,
/// `reportingComponent`/`reportingController`, ...). An Event created through
/// either API is got, listed, watched, patched (in the request's shape) and
/// deleted through the other, with that API's apiVersion and field names.
#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_core_v1_and_events_k8s_io_v1(backend: Backend) {
    const CORE: &str = "/api/v1/namespaces/default/events";
    const NEW: &str = "/apis/events.k8s.io/v1/namespaces/default/events";
    let (cl, c) = start(backend).await;
    let (code, core_list) = raw(&c, "GET", CORE, None, "").await;
    assert_eq!(code, 200, "{core_list}");
    let (code, new_list) = raw(&c, "GET", NEW, None, "").await;
    assert_eq!(code, 200, "{new_list}");
    assert_eq!(core_list["kind"], "EventList");
    assert_eq!(new_list["kind"], "EventList");
    assert_eq!(core_list["apiVersion"], "v1");
    assert_eq!(new_list["apiVersion"], "events.k8s.io/v1");
    // Only this test's Events (`web.*`) are checked: the real API server
    // posts its own into `default` too (e.g. about the `kubernetes` Service),
    // at any time.
    let ours = |list: &Value| -> Vec<String> {
        item_names(list)
            .into_iter()
            .filter(|n| n.starts_with("web."))
            .collect()
    };
    assert!(ours(&core_list).is_empty() && ours(&new_list).is_empty());
    let rv = list_rv(&core_list);
    // One watch per API, from before the writes: each must see every change,
    // whichever API made it, in its own shape.
    let watch = |path: &'static str| {
        let c = c.clone();
        tokio::spawn(async move {
            sim_support::watch_lines(
                &c,
                // Only this test's Events: the real API server may record
                // its own in `default` meanwhile (the ClusterIP repair).
                &format!("{path}?watch=true&resourceVersion={rv}&labelSelector=test%3Devents-api"),
                6,
                10,
            )
            .await
        })
    };
    let (core_watch, new_watch) = (watch(CORE), watch(NEW));

    // Create one Event through each API.
    let (code, core_created) = raw(
        &c,
        "POST",
        CORE,
        Some(json!({"apiVersion": "v1", "kind": "Event",
               "metadata": {"name": "web.core", "namespace": "default", "labels": {"test": "events-api"}},
               "involvedObject": {"apiVersion": "v1", "kind": "Service", "name": "web", "namespace": "default"},
               "reason": "Synced", "message": "synced 3 endpoints", "type": "Normal",
               "source": {"component": "kube-discovery"}, "count": 1,
               "firstTimestamp": "2026-01-01T00:00:00Z", "lastTimestamp": "2026-01-01T00:00:00Z"})),
        "application/json",
    )
    .await;
    assert_eq!(code, 201, "{core_created}");
    assert_eq!(core_created["apiVersion"], "v1");
    assert_eq!(core_created["message"], "synced 3 endpoints");
    let (code, new_created) = raw(
        &c,
        "POST",
        NEW,
        Some(json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
               "metadata": {"name": "web.new", "namespace": "default", "labels": {"test": "events-api"}},
               "eventTime": "2026-01-01T00:00:00.000000Z",
               "reportingController": "kube-discovery", "reportingInstance": "kd-0",
               "action": "Sync", "reason": "Synced", "note": "synced 5 endpoints", "type": "Normal",
               "regarding": {"apiVersion": "v1", "kind": "Service", "name": "web", "namespace": "default"},
               "series": {"count": 2, "lastObservedTime": "2026-01-01T00:01:00.000000Z"}})),
        "application/json",
    )
    .await;
    assert_eq!(code, 201, "{new_created}");
    assert_eq!(new_created["apiVersion"], "events.k8s.io/v1");
    assert_eq!(new_created["note"], "synced 5 endpoints");
    assert!(new_created.get("message").is_none(), "{new_created}");

    // The core/v1 Event through events.k8s.io/v1.
    let (code, got) = raw(&c, "GET", &format!("{NEW}/web.core"), None, "").await;
    assert_eq!(code, 200, "{got}");
    assert_eq!(got["apiVersion"], "events.k8s.io/v1");
    assert_eq!(got["kind"], "Event");
    assert_eq!(got["metadata"], core_created["metadata"], "the same object");
    assert_eq!(got["note"], "synced 3 endpoints");
    assert_eq!(got["regarding"]["name"], "web");
    assert_eq!(got["regarding"]["kind"], "Service");
    assert_eq!(got["deprecatedSource"]["component"], "kube-discovery");
    assert_eq!(got["deprecatedCount"], 1);
    assert_eq!(got["deprecatedFirstTimestamp"], "2026-01-01T00:00:00Z");
    assert_eq!(got["deprecatedLastTimestamp"], "2026-01-01T00:00:00Z");
    assert_eq!(got["reason"], "Synced");
    assert_eq!(got["type"], "Normal");
    for core_only in [
        "message",
        "involvedObject",
        "source",
        "count",
        "firstTimestamp",
        "lastTimestamp",
    ] {
        assert!(got.get(core_only).is_none(), "{core_only} in {got}");
    }
    // The events.k8s.io/v1 Event through core/v1.
    let (code, got) = raw(&c, "GET", &format!("{CORE}/web.new"), None, "").await;
    assert_eq!(code, 200, "{got}");
    assert_eq!(got["apiVersion"], "v1");
    assert_eq!(got["metadata"], new_created["metadata"], "the same object");
    assert_eq!(got["message"], "synced 5 endpoints");
    assert_eq!(got["involvedObject"]["name"], "web");
    assert_eq!(got["reportingComponent"], "kube-discovery");
    assert_eq!(got["reportingInstance"], "kd-0");
    assert_eq!(got["action"], "Sync");
    assert_eq!(got["eventTime"], "2026-01-01T00:00:00.000000Z");
    assert_eq!(got["series"]["count"], 2);
    for new_only in ["note", "regarding", "reportingController"] {
        assert!(got.get(new_only).is_none(), "{new_only} in {got}");
    }
    // events.k8s.io/v1 creates are validated strictly (an eventTime, a
    // type, none of the deprecated core fields); core/v1 ones are not.
    let (code, bad) = raw(
        &c,
        "POST",
        NEW,
        Some(json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
               "metadata": {"name": "bad"}, "deprecatedCount": 1})),
        "application/json",
    )
    .await;
    assert_eq!((code, &bad["reason"]), (422, &json!("Invalid")), "{bad}");
    assert_eq!(
        bad["message"],
        r#"Event "bad" is invalid: [eventTime: Required value, type: Invalid value: "": has invalid value: , count: Invalid value: "": needs to be unset]"#
    );
    // One name space: the other API's create of the same name is a conflict.
    let (code, dup) = raw(
        &c,
        "POST",
        CORE,
        Some(json!({"apiVersion": "v1", "kind": "Event",
               "metadata": {"name": "web.new"}, "message": "again"})),
        "application/json",
    )
    .await;
    assert_eq!(code, 409, "{dup}");
    assert_eq!(dup["reason"], "AlreadyExists");

    // Both lists hold both Events, each in its own API's shape (the list
    // says which; items of built-in types carry no apiVersion/kind).
    for (path, api_version, text, other) in [
        (CORE, "v1", "message", "note"),
        (NEW, "events.k8s.io/v1", "note", "message"),
    ] {
        let (code, list) = raw(&c, "GET", path, None, "").await;
        assert_eq!(code, 200, "{list}");
        assert_eq!(list["apiVersion"], api_version, "{path}");
        assert_eq!(ours(&list), ["web.core", "web.new"], "{path}");
        for item in list["items"].as_array().expect("items") {
            assert!(item.get("apiVersion").is_none(), "{path}: {item}");
            assert!(item.get("kind").is_none(), "{path}: {item}");
            assert!(item[text].is_string(), "{path}: {text} in {item}");
            assert!(item.get(other).is_none(), "{path}: {other} in {item}");
        }
    }

    // Through events.k8s.io/v1 an Event's content is immutable (its
    // strict update validation: only `series` and metadata change) ...
    let (code, refused) = raw(
        &c,
        "PATCH",
        &format!("{NEW}/web.core"),
        Some(json!({"note": "synced 4 endpoints", "deprecatedCount": 2})),
        "application/merge-patch+json",
    )
    .await;
    assert_eq!(
        (code, &refused["reason"]),
        (422, &json!("Invalid")),
        "{refused}"
    );
    assert_eq!(
        refused["message"],
        r#"Event "web.core" is invalid: [message: Invalid value: "synced 4 endpoints": field is immutable, count: Invalid value: 2: field is immutable]"#
    );
    // ... through core/v1 it is not: a merge patch there, seen through
    // events.k8s.io/v1.
    let (code, patched) = raw(
        &c,
        "PATCH",
        &format!("{CORE}/web.core"),
        Some(json!({"message": "synced 4 endpoints", "count": 2})),
        "application/merge-patch+json",
    )
    .await;
    assert_eq!(code, 200, "{patched}");
    assert_eq!(patched["apiVersion"], "v1");
    assert_eq!(patched["message"], "synced 4 endpoints");
    let patched_rv: u64 = patched["metadata"]["resourceVersion"]
        .as_str()
        .expect("rv")
        .parse()
        .expect("numeric");
    let (code, got) = raw(&c, "GET", &format!("{NEW}/web.core"), None, "").await;
    assert_eq!(code, 200, "{got}");
    assert_eq!(got["note"], "synced 4 endpoints");
    assert_eq!(got["deprecatedCount"], 2);
    assert_eq!(
        got["metadata"]["resourceVersion"],
        patched["metadata"]["resourceVersion"]
    );
    assert!(got.get("message").is_none(), "{got}");
    // Server-side apply through events.k8s.io/v1 (of the series), seen
    // through core/v1.
    let (code, applied) = raw(
        &c,
        "PATCH",
        &format!("{NEW}/web.new?fieldManager=events-test&force=true"),
        Some(json!({"apiVersion": "events.k8s.io/v1", "kind": "Event",
               "metadata": {"name": "web.new", "namespace": "default"},
               "series": {"count": 3, "lastObservedTime": "2026-01-01T00:02:00.000000Z"}})),
        "application/apply-patch+yaml",
    )
    .await;
    assert_eq!(code, 200, "{applied}");
    assert_eq!(applied["apiVersion"], "events.k8s.io/v1");
    assert_eq!(applied["series"]["count"], 3);
    assert_eq!(applied["note"], "synced 5 endpoints");
    assert_eq!(applied["reportingController"], "kube-discovery");
    let entry = applied["metadata"]["managedFields"]
        .as_array()
        .expect("managedFields")
        .iter()
        .find(|e| e["manager"] == "events-test")
        .expect("the apply entry")
        .clone();
    assert_eq!(entry["operation"], "Apply");
    assert!(
        entry["fieldsV1"]["f:series"]["f:count"].is_object(),
        "{entry}"
    );
    // The real server records field ownership in the version applied;
    // kube-sim computes it on the stored core/v1 object (README, "kube-sim
    // and the real API server").
    let fields_version = if cl.is_real() {
        "events.k8s.io/v1"
    } else {
        "v1"
    };
    assert_eq!(entry["apiVersion"], fields_version, "{entry}");
    let (code, got) = raw(&c, "GET", &format!("{CORE}/web.new"), None, "").await;
    assert_eq!(code, 200, "{got}");
    assert_eq!(got["series"]["count"], 3);
    assert_eq!(got["message"], "synced 5 endpoints");
    assert_eq!(got["reportingComponent"], "kube-discovery");

    // Delete each through the other API.
    let (code, body) = raw(&c, "DELETE", &format!("{NEW}/web.core"), None, "").await;
    assert_eq!(code, 200, "{body}");
    let (code, body) = raw(&c, "DELETE", &format!("{CORE}/web.new"), None, "").await;
    assert_eq!(code, 200, "{body}");
    for path in [CORE, NEW] {
        for name in ["web.core", "web.new"] {
            let (code, body) = raw(&c, "GET", &format!("{path}/{name}"), None, "").await;
            assert_eq!(code, 404, "{path}/{name}: {body}");
        }
        let (code, list) = raw(&c, "GET", path, None, "").await;
        assert_eq!(code, 200, "{list}");
        assert!(ours(&list).is_empty(), "{path}: {list}");
    }

    // Both watches saw the same six changes (same resourceVersions), each in
    // its own shape.
    let (code, core_events) = core_watch.await.expect("core watch");
    assert_eq!(code, 200);
    let (code, new_events) = new_watch.await.expect("events.k8s.io watch");
    assert_eq!(code, 200);
    let summary = |events: &[Value]| -> Vec<(String, String, String)> {
        events
            .iter()
            .filter(|e| {
                e["object"]["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with("web."))
            })
            .map(|e| {
                (
                    e["type"].as_str().expect("type").to_string(),
                    e["object"]["metadata"]["name"]
                        .as_str()
                        .expect("name")
                        .to_string(),
                    e["object"]["metadata"]["resourceVersion"]
                        .as_str()
                        .expect("rv")
                        .to_string(),
                )
            })
            .collect()
    };
    let expected = [
        "ADDED", "ADDED", "MODIFIED", "MODIFIED", "DELETED", "DELETED",
    ];
    let names = [
        "web.core", "web.new", "web.core", "web.new", "web.core", "web.new",
    ];
    let core_summary = summary(&core_events);
    assert_eq!(core_summary.len(), 6, "{core_events:?}");
    for (i, (t, n, _)) in core_summary.iter().enumerate() {
        assert_eq!(
            (t.as_str(), n.as_str()),
            (expected[i], names[i]),
            "{core_events:?}"
        );
    }
    assert_eq!(
        core_summary,
        summary(&new_events),
        "same changes on both watches"
    );
    for e in &core_events {
        assert_eq!(e["object"]["apiVersion"], "v1", "{e}");
        assert!(e["object"]["message"].is_string(), "{e}");
        assert!(e["object"].get("note").is_none(), "{e}");
    }
    for e in &new_events {
        assert_eq!(e["object"]["apiVersion"], "events.k8s.io/v1", "{e}");
        assert!(e["object"]["note"].is_string(), "{e}");
        assert!(e["object"].get("message").is_none(), "{e}");
    }
    assert_eq!(new_events[2]["object"]["note"], "synced 4 endpoints");
    assert_eq!(core_events[2]["object"]["message"], "synced 4 endpoints");
    assert_eq!(core_summary[2].2, patched_rv.to_string());
    assert_eq!(core_events[3]["object"]["series"]["count"], 3);
    assert_eq!(new_events[3]["object"]["series"]["count"], 3);
    assert_alive(&cl);
}

/// A cluster-scoped CRD: its objects are created, listed, got and deleted at the
/// cluster path; discovery says `namespaced: false`; a namespaced path is the
/// plain-text 404 of a path nothing serves.
#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_scoped_custom_resources(backend: Backend) {
    let (cl, c) = start(backend).await;
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "knobs.test.io"},
        "spec": {"group": "test.io", "scope": "Cluster",
            "names": {"plural": "knobs", "singular": "knob", "kind": "Knob", "listKind": "KnobList"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                    "spec": {"type": "object", "properties": {"level": {"type": "integer"}}}}}}}]}});
    create_crd_from(&c, crd).await;
    let (code, disc) = raw(&c, "GET", "/apis/test.io/v1", None, "").await;
    assert_eq!(code, 200, "{disc}");
    let knobs = disc["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .find(|r| r["name"] == "knobs")
        .expect("knobs in discovery")
        .clone();
    assert_eq!(knobs["namespaced"], false);

    let knob = json!({"apiVersion": "test.io/v1", "kind": "Knob", "metadata": {"name": "volume"}, "spec": {"level": 11}});
    let (code, created) = raw(
        &c,
        "POST",
        "/apis/test.io/v1/knobs",
        Some(knob.clone()),
        "application/json",
    )
    .await;
    assert_eq!(code, 201, "{created}");
    assert!(created["metadata"].get("namespace").is_none(), "{created}");
    let (code, got) = raw(&c, "GET", "/apis/test.io/v1/knobs/volume", None, "").await;
    assert_eq!(code, 200, "{got}");
    assert_eq!(got["spec"]["level"], 11);
    let (code, list) = raw(&c, "GET", "/apis/test.io/v1/knobs", None, "").await;
    assert_eq!(code, 200, "{list}");
    assert_eq!(list["kind"], "KnobList");
    assert_eq!(item_names(&list), ["volume"]);

    // Namespaced paths do not exist for a cluster-scoped resource.
    let (code, v) = raw(
        &c,
        "POST",
        "/apis/test.io/v1/namespaces/default/knobs",
        Some(knob),
        "application/json",
    )
    .await;
    assert_eq!((code, &v), (404, &json!("404 page not found\n")), "{v}");
    for path in [
        "/apis/test.io/v1/namespaces/default/knobs/volume",
        "/apis/test.io/v1/namespaces/default/knobs",
    ] {
        let (code, v) = raw(&c, "GET", path, None, "").await;
        assert_eq!(
            (code, &v),
            (404, &json!("404 page not found\n")),
            "{path}: {v}"
        );
    }
    // A version the CRD does not serve is not there either.
    let (code, v) = raw(&c, "GET", "/apis/test.io/v2/knobs", None, "").await;
    assert_eq!((code, &v), (404, &json!("404 page not found\n")), "{v}");

    let (code, v) = raw(&c, "DELETE", "/apis/test.io/v1/knobs/volume", None, "").await;
    assert_eq!(code, 200, "{v}");
    let (code, _) = raw(&c, "GET", "/apis/test.io/v1/knobs/volume", None, "").await;
    assert_eq!(code, 404);
    let (_, list) = raw(&c, "GET", "/apis/test.io/v1/knobs", None, "").await;
    assert!(item_names(&list).is_empty(), "{list}");
    assert_alive(&cl);
}

/// nonResourceURLs end to end: a user without a grant for a served
/// non-resource path gets the real 403; a ClusterRole granting it (bound to
/// the user) makes the same request succeed.
#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_resource_urls_are_authorized_by_rbac(backend: Backend) {
    let (cl, admin) = start(backend).await;
    let carol = api_client(&cl, &cl.user_token("carol").expect("carol")).await;
    // `/healthz` is granted to everyone by system:discovery, `/healthz/ping` is not.
    let (code, _) = raw(&carol, "GET", "/healthz", None, "").await;
    assert_eq!(code, 200);
    let (code, v) = raw(&carol, "GET", "/healthz/ping", None, "").await;
    assert_eq!(code, 403, "{v}");
    assert_eq!(v["reason"], "Forbidden");
    assert_eq!(
        v["message"],
        r#"forbidden: User "carol" cannot get path "/healthz/ping""#
    );

    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
        "metadata": {"name": "health-detail"},
        "rules": [{"nonResourceURLs": ["/healthz/*"], "verbs": ["get"]}]});
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
        "metadata": {"name": "carol-health"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "health-detail"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "carol"}]});
    for (path, body) in [
        ("/apis/rbac.authorization.k8s.io/v1/clusterroles", role),
        (
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            binding,
        ),
    ] {
        let (code, v) = raw(&admin, "POST", path, Some(body), "application/json").await;
        assert_eq!(code, 201, "{v}");
    }
    // (In effect a moment later on the real server: its RBAC informer.)
    eventually(10, "the grant of /healthz/*", || async {
        (raw(&carol, "GET", "/healthz/ping", None, "").await.0 == 200).then_some(())
    })
    .await;
    // The grant is for `get` only.
    let (code, v) = raw(
        &carol,
        "POST",
        "/healthz/ping",
        Some(json!({})),
        "application/json",
    )
    .await;
    assert_eq!(code, 403, "{v}");
    assert_eq!(
        v["message"],
        r#"forbidden: User "carol" cannot post path "/healthz/ping""#
    );
    assert_alive(&cl);
}

/// Endpoints and EndpointSlices are validated as by the real server
/// (`ValidateEndpoints`, `ValidateEndpointSlice`): addresses must be IPs
/// (of the slice's family), not unspecified, loopback, link-local or
/// link-local multicast; port numbers, names and protocols; the errors name
/// the field. Defaults: port protocol `TCP`, a slice port's name `""`. Every
/// v1 Endpoints answer carries the deprecation warning of v1.33+.
#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_and_slices_are_validated(backend: Backend) {
    let (cl, c) = start(backend).await;
    const EPS: &str = "/api/v1/namespaces/default/endpoints";
    const SLICES: &str = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices";
    let (code, v) = raw(
        &c,
        "POST",
        EPS,
        Some(json!({"metadata": {"name": "bad"}, "subsets": [
            {"addresses": [{"ip": "10.0.0.5"}, {"ip": "999.0.0.1"}, {"ip": "not-an-ip"},
                           {"ip": "127.0.0.1"}, {"ip": "0.0.0.0"}, {"ip": "169.254.1.1"},
                           {"ip": "224.0.0.5"}, {"ip": "::1"}, {"ip": "fe80::1"}, {"ip": "ff02::1"},
                           {"ip": "010.0.0.1"}, {"ip": "::ffff:127.0.0.1"}],
             "ports": [{"name": "zero", "port": 0}, {"name": "big", "port": 65536},
                       {"name": "http", "port": 80}, {"name": "http", "port": 81},
                       {"port": 82, "protocol": "XYZ"}]},
            {"ports": [{"port": 1}]}]})),
        "application/json",
    )
    .await;
    assert_eq!((code, &v["reason"]), (422, &json!("Invalid")), "{v}");
    assert_eq!(
        v["message"],
        concat!(
            r#"Endpoints "bad" is invalid: ["#,
            r#"subsets[0].addresses[1].ip: Invalid value: "999.0.0.1": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff), "#,
            r#"subsets[0].addresses[1].ip: Invalid value: "999.0.0.1": must be a valid IP address, "#,
            r#"subsets[0].addresses[2].ip: Invalid value: "not-an-ip": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff), "#,
            r#"subsets[0].addresses[2].ip: Invalid value: "not-an-ip": must be a valid IP address, "#,
            r#"subsets[0].addresses[3].ip: Invalid value: "127.0.0.1": may not be in the loopback range (127.0.0.0/8, ::1/128), "#,
            r#"subsets[0].addresses[4].ip: Invalid value: "0.0.0.0": may not be unspecified (0.0.0.0), "#,
            r#"subsets[0].addresses[5].ip: Invalid value: "169.254.1.1": may not be in the link-local range (169.254.0.0/16, fe80::/10), "#,
            r#"subsets[0].addresses[6].ip: Invalid value: "224.0.0.5": may not be in the link-local multicast range (224.0.0.0/24, ff02::/10), "#,
            r#"subsets[0].addresses[7].ip: Invalid value: "::1": may not be in the loopback range (127.0.0.0/8, ::1/128), "#,
            r#"subsets[0].addresses[8].ip: Invalid value: "fe80::1": may not be in the link-local range (169.254.0.0/16, fe80::/10), "#,
            r#"subsets[0].addresses[9].ip: Invalid value: "ff02::1": may not be in the link-local multicast range (224.0.0.0/24, ff02::/10), "#,
            r#"subsets[0].addresses[11].ip: Invalid value: "::ffff:127.0.0.1": may not be in the loopback range (127.0.0.0/8, ::1/128), "#,
            r#"subsets[0].ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive, "#,
            r#"subsets[0].ports[1].port: Invalid value: 65536: must be between 1 and 65535, inclusive, "#,
            r#"subsets[0].ports[4].name: Required value, "#,
            r#"subsets[0].ports[4].protocol: Unsupported value: "XYZ": supported values: "SCTP", "TCP", "UDP", "#,
            r#"subsets[1]: Required value: must specify `addresses` or `notReadyAddresses`]"#
        )
    );
    let causes = v["details"]["causes"].as_array().expect("causes");
    assert_eq!(causes.len(), 17, "{v}");
    assert_eq!(
        causes[0],
        json!({"reason": "FieldValueInvalid", "field": "subsets[0].addresses[1].ip",
               "message": "Invalid value: \"999.0.0.1\": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)"})
    );
    // Valid: leading zeros are still accepted in v1 Endpoints (the strict
    // IP validation is an alpha gate), duplicate port names too; the port
    // protocol defaults to TCP.
    let (code, v) = raw(
        &c,
        "POST",
        EPS,
        Some(json!({"metadata": {"name": "ok"}, "subsets": [
            {"addresses": [{"ip": "010.0.0.1"}, {"ip": "fd00::1"}],
             "ports": [{"name": "http", "port": 80}, {"name": "http", "port": 81}]}]})),
        "application/json",
    )
    .await;
    assert_eq!(code, 201, "{v}");
    assert_eq!(v["subsets"][0]["ports"][0]["protocol"], "TCP");

    let (code, v) = raw(
        &c,
        "POST",
        SLICES,
        Some(json!({"metadata": {"name": "bad4"}, "addressType": "IPv4",
            "endpoints": [{"addresses": ["fd00::1"]},
                          {"addresses": ["10.0.2.1", "999.1.1.1", "127.0.0.1", "0.0.0.0", "010.0.0.1", "::ffff:10.0.0.1"]},
                          {"addresses": []}],
            "ports": [{"name": "http", "port": 8080}, {"name": "http", "port": 81},
                      {"name": "Bad_Name", "port": 82}, {"port": 0, "protocol": "XYZ"}, {"port": 70000}]})),
        "application/json",
    )
    .await;
    assert_eq!((code, &v["reason"]), (422, &json!("Invalid")), "{v}");
    assert_eq!(
        v["message"],
        concat!(
            r#"EndpointSlice.discovery.k8s.io "bad4" is invalid: ["#,
            r#"ports[1].name: Duplicate value: "http", "#,
            r#"ports[2].name: Invalid value: "Bad_Name": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?'), "#,
            r#"ports[3].protocol: Unsupported value: "XYZ": supported values: "SCTP", "TCP", "UDP", "#,
            r#"ports[4].name: Duplicate value: "", "#,
            r#"endpoints[0].addresses: Invalid value: "fd00::1": must be an IPv4 address, "#,
            r#"endpoints[1].addresses[1]: Invalid value: "999.1.1.1": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff), "#,
            r#"endpoints[1].addresses[2]: Invalid value: "127.0.0.1": may not be in the loopback range (127.0.0.0/8, ::1/128), "#,
            r#"endpoints[1].addresses[3]: Invalid value: "0.0.0.0": may not be unspecified (0.0.0.0), "#,
            r#"endpoints[2].addresses: Required value: must contain at least 1 address]"#
        )
    );
    let (code, v) = raw(
        &c,
        "POST",
        SLICES,
        Some(json!({"metadata": {"name": "bad6"}, "addressType": "IPv6",
            "endpoints": [{"addresses": ["10.0.0.1"]},
                          {"addresses": ["FD00::1", "fd00:0::2", "fd00::3", "::1", "::", "fe80::1", "ff02::1", "::ffff:10.0.0.1", "bad"]}]})),
        "application/json",
    )
    .await;
    assert_eq!((code, &v["reason"]), (422, &json!("Invalid")), "{v}");
    assert_eq!(
        v["message"],
        concat!(
            r#"EndpointSlice.discovery.k8s.io "bad6" is invalid: ["#,
            r#"endpoints[0].addresses: Invalid value: "10.0.0.1": must be an IPv6 address, "#,
            r#"endpoints[1].addresses[0]: Invalid value: "FD00::1": must be in canonical form ("fd00::1"), "#,
            r#"endpoints[1].addresses[1]: Invalid value: "fd00:0::2": must be in canonical form ("fd00::2"), "#,
            r#"endpoints[1].addresses[3]: Invalid value: "::1": may not be in the loopback range (127.0.0.0/8, ::1/128), "#,
            r#"endpoints[1].addresses[4]: Invalid value: "::": may not be unspecified (::), "#,
            r#"endpoints[1].addresses[5]: Invalid value: "fe80::1": may not be in the link-local range (169.254.0.0/16, fe80::/10), "#,
            r#"endpoints[1].addresses[6]: Invalid value: "ff02::1": may not be in the link-local multicast range (224.0.0.0/24, ff02::/10), "#,
            r#"endpoints[1].addresses[7]: Invalid value: "::ffff:10.0.0.1": must not be an IPv4-mapped IPv6 address, "#,
            r#"endpoints[1].addresses[8]: Invalid value: "bad": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)]"#
        )
    );
    // A valid slice gets the port defaults; its addressType is immutable.
    let (code, v) = raw(
        &c,
        "POST",
        SLICES,
        Some(json!({"metadata": {"name": "ok"}, "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.1"]}], "ports": [{"port": 80}]})),
        "application/json",
    )
    .await;
    assert_eq!(code, 201, "{v}");
    assert_eq!(
        v["ports"][0],
        json!({"name": "", "port": 80, "protocol": "TCP"})
    );
    let (code, v) = raw(
        &c,
        "PATCH",
        &format!("{SLICES}/ok"),
        Some(json!({"addressType": "FQDN"})),
        "application/merge-patch+json",
    )
    .await;
    // (The unchanged endpoints are not validated again for the new type.)
    assert_eq!(code, 422, "{v}");
    assert_eq!(
        v["message"],
        r#"EndpointSlice.discovery.k8s.io "ok" is invalid: addressType: Invalid value: "FQDN": field is immutable"#
    );

    // The deprecation warning, on success and on error.
    for (path, want) in [
        (format!("{EPS}/ok"), 200),
        (format!("{EPS}/none"), 404),
        (EPS.to_string(), 200),
    ] {
        let req = http::Request::get(&path)
            .body(kube::client::Body::empty())
            .expect("request");
        let resp = c.send(req).await.expect("send");
        assert_eq!(resp.status().as_u16(), want, "{path}");
        assert_eq!(
            resp.headers().get("warning").and_then(|v| v.to_str().ok()),
            Some(
                r#"299 - "v1 Endpoints is deprecated in v1.33+; use discovery.k8s.io/v1 EndpointSlice""#
            ),
            "{path}"
        );
    }
    let req = http::Request::get(SLICES)
        .body(kube::client::Body::empty())
        .expect("request");
    let resp = c.send(req).await.expect("send");
    assert!(
        resp.headers().get("warning").is_none(),
        "slices are not deprecated"
    );
    assert_alive(&cl);
}

/// kube-sim only (a `/_sim` hook): `POST /_sim/unvalidated` stores what the
/// API refuses, as an older or corrupted server could hold it: created, then
/// replaced (same uid), seen by watches, in the write log; a later write
/// through the API that leaves the bad addresses as they are is accepted
/// (as on the real server), one that changes them is validated. Admin only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unvalidated_hook_stores_what_the_api_refuses() {
    let (cl, c) = start(Backend::Sim).await;
    const EPS: &str = "/api/v1/namespaces/default/endpoints";
    let bad = |ip: &str| {
        json!({"apiVersion": "v1", "kind": "Endpoints",
               "metadata": {"name": "bad", "namespace": "default"},
               "subsets": [{"addresses": [{"ip": ip}], "ports": [{"port": 0}]}]})
    };
    let (code, v) = raw(&c, "POST", EPS, Some(bad("127.0.0.1")), "application/json").await;
    assert_eq!(code, 422, "the API refuses it: {v}");
    let mark = cl.mark().await.expect("mark");
    let (code, created) = raw(
        &c,
        "POST",
        "/_sim/unvalidated",
        Some(bad("127.0.0.1")),
        "application/json",
    )
    .await;
    assert_eq!(code, 201, "{created}");
    assert_eq!(
        created["subsets"][0]["ports"][0],
        json!({"port": 0}),
        "no defaults"
    );
    let uid = created["metadata"]["uid"].clone();
    assert!(uid.is_string(), "{created}");
    let (code, replaced) = raw(
        &c,
        "POST",
        "/_sim/unvalidated",
        Some(bad("0.0.0.0")),
        "application/json",
    )
    .await;
    assert_eq!(code, 200, "{replaced}");
    assert_eq!(replaced["metadata"]["uid"], uid, "the same object");
    let (code, got) = raw(&c, "GET", &format!("{EPS}/bad"), None, "").await;
    assert_eq!(code, 200, "{got}");
    assert_eq!(got["subsets"][0]["addresses"][0]["ip"], "0.0.0.0");
    let writes = cl.writes_since(mark).await.expect("writes");
    let verbs: Vec<&str> = writes
        .iter()
        .filter(|w| w["name"] == "bad")
        .filter_map(|w| w["verb"].as_str())
        .collect();
    assert_eq!(verbs, ["create", "update"]);
    // Watches saw both writes.
    let (code, events) = sim_support::watch_lines(
        &c,
        &format!("{EPS}?watch=true&resourceVersion={mark}"),
        2,
        5,
    )
    .await;
    assert_eq!(code, 200);
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(types, ["ADDED", "MODIFIED"]);
    // A label change keeps the stored subsets: accepted; changing them is validated.
    let label = json!({"metadata": {"labels": {"x": "y"}}});
    let (code, v) = raw(
        &c,
        "PATCH",
        &format!("{EPS}/bad"),
        Some(label),
        "application/merge-patch+json",
    )
    .await;
    assert_eq!(code, 200, "{v}");
    let (code, v) = raw(
        &c,
        "PATCH",
        &format!("{EPS}/bad"),
        Some(json!({"subsets": [{"addresses": [{"ip": "::1"}], "ports": [{"port": 80}]}]})),
        "application/merge-patch+json",
    )
    .await;
    assert_eq!(code, 422, "{v}");
    // Errors: unknown kinds, a missing namespace, other users.
    let (code, v) = raw(&c, "POST", "/_sim/unvalidated",
        Some(json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"}})),
        "application/json").await;
    assert_eq!(code, 400, "{v}");
    let (code, v) = raw(
        &c,
        "POST",
        "/_sim/unvalidated",
        Some(json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "x"}})),
        "application/json",
    )
    .await;
    assert_eq!(code, 400, "{v}");
    let alice = api_client(&cl, &cl.user_token("alice").expect("alice")).await;
    let (code, _) = raw(
        &alice,
        "POST",
        "/_sim/unvalidated",
        Some(bad("127.0.0.1")),
        "application/json",
    )
    .await;
    assert_eq!(code, 403);
}

/// A server-side apply (or an update) that would create the object needs
/// `create` as well as `patch` (`update`): the real patch and update handlers
/// authorize the create-on-write. Once the object exists, `patch` suffices.
#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apply_that_creates_needs_create(backend: Backend) {
    let (cl, admin) = start_with(backend, options(true)).await;
    let role = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "patch-only", "namespace": "default"},
        "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "patch", "update"]}]});
    let binding = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "alice-patch-only", "namespace": "default"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "patch-only"},
        "subjects": [{"kind": "User", "name": "alice", "apiGroup": "rbac.authorization.k8s.io"}]});
    for (path, body) in [
        (
            "/apis/rbac.authorization.k8s.io/v1/namespaces/default/roles",
            role,
        ),
        (
            "/apis/rbac.authorization.k8s.io/v1/namespaces/default/rolebindings",
            binding,
        ),
    ] {
        let (status, resp) = raw(&admin, "POST", path, Some(body), "application/json").await;
        assert_eq!(status, 201, "{resp}");
    }
    let alice = api_client(&cl, &cl.user_token("alice").expect("alice")).await;
    let cms: Api<ConfigMap> = Api::namespaced(alice.clone(), "default");
    let apply = |name: &'static str| {
        let cms = cms.clone();
        async move {
            let obj = json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name}, "data": {"k": "v"}});
            cms.patch(name, &PatchParams::apply("alice"), &Patch::Apply(&obj))
                .await
        }
    };
    // The role takes effect a moment later on the real server (informer).
    Api::<ConfigMap>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &cm("existing", &[]))
        .await
        .expect("cm");
    eventually(10, "the patch-only role is in effect", || async {
        apply("existing").await.ok()
    })
    .await;
    let s = api_err(apply("new").await.expect_err("apply-create without create"));
    assert_eq!((s.code, s.reason.as_str()), (403, "Forbidden"), "{s:?}");
    assert_eq!(
        s.message,
        r#"configmaps "new" is forbidden: User "alice" cannot create resource "configmaps" in API group "" in the namespace "default""#
    );
    // A PUT that would create is refused the same way.
    let (status, body) = raw(
        &alice,
        "PUT",
        "/api/v1/namespaces/default/configmaps/put-new",
        Some(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "put-new"}})),
        "application/json",
    )
    .await;
    assert_eq!(
        status, 404,
        "configmaps do not allow create-on-update: {body}"
    );
    assert_alive(&cl);
}

/// What the real server does with a field the CRD's structural schema does
/// not declare (`spec.bogus`, root `top`), on every write path: create,
/// update and JSON/merge patches prune it, with a `Warning` per field by
/// default (`fieldValidation=Warn`), silently with `Ignore`, refused with
/// `Strict` (400 on create/update, 422 on the field `patch` for patches);
/// a server-side apply refuses it whatever `fieldValidation` says, with a
/// 500 naming the field (kubernetes#139253: an apply of a newer object
/// against an older CRD). Fields under x-kubernetes-preserve-unknown-fields
/// are kept everywhere.
#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_custom_resource_fields_are_pruned_with_warnings_or_refused_by_apply(
    backend: Backend,
) {
    use sim_support::raw_with_warnings;
    const G: &str = "/apis/test.io/v1/namespaces/default/gizmos";
    const JSON: &str = "application/json";
    const MERGE: &str = "application/merge-patch+json";
    const APPLY: &str = "application/apply-patch+yaml";
    let (cl, c) = start(backend).await;
    create_crd(&c).await;
    let doc = |name: &str, spec: Value| json!({"apiVersion": "test.io/v1", "kind": "Gizmo", "metadata": {"name": name}, "spec": spec});
    let unknown = |fields: &[&str]| -> Vec<String> {
        fields
            .iter()
            .map(|f| format!(r#"299 - "unknown field \"{f}\"""#))
            .collect()
    };
    let kept = json!({"size": 2, "extra": {"free": 1}});

    // create: pruned, one warning per field (the default is Warn) ...
    let mut body = doc("p", json!({"size": 2, "bogus": true, "extra": {"free": 1}}));
    body["top"] = json!(1);
    let (s, w, v) = raw_with_warnings(&c, "POST", G, Some(body.clone()), JSON).await;
    assert_eq!((s, &w), (201, &unknown(&["spec.bogus", "top"])), "{v}");
    assert_eq!(v["spec"], kept);
    assert!(v.get("top").is_none(), "{v}");
    // ... silently with Ignore.
    body["metadata"]["name"] = json!("pi");
    let (s, w, v) = raw_with_warnings(
        &c,
        "POST",
        &format!("{G}?fieldValidation=Ignore"),
        Some(body.clone()),
        JSON,
    )
    .await;
    assert_eq!((s, w.len()), (201, 0), "{w:?} {v}");
    assert_eq!(v["spec"], kept);

    // update: the same.
    let (_, current) = raw(&c, "GET", &format!("{G}/p"), None, "").await;
    let mut put = doc("p", json!({"size": 3, "bogus": 1, "extra": {"free": 1}}));
    put["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
    let (s, w, v) = raw_with_warnings(&c, "PUT", &format!("{G}/p"), Some(put), JSON).await;
    assert_eq!((s, &w), (200, &unknown(&["spec.bogus"])), "{v}");
    assert_eq!(v["spec"], json!({"size": 3, "extra": {"free": 1}}));

    // merge and JSON patches: pruned with a warning; Strict is a 422 on `patch`.
    let (s, w, v) = raw_with_warnings(
        &c,
        "PATCH",
        &format!("{G}/p"),
        Some(json!({"spec": {"bogus2": 1}})),
        MERGE,
    )
    .await;
    assert_eq!((s, &w), (200, &unknown(&["spec.bogus2"])), "{v}");
    assert!(v["spec"].get("bogus2").is_none(), "{v}");
    let (s, w, v) = raw_with_warnings(
        &c,
        "PATCH",
        &format!("{G}/p"),
        Some(json!([{"op": "add", "path": "/spec/bogus3", "value": 1}])),
        "application/json-patch+json",
    )
    .await;
    assert_eq!((s, &w), (200, &unknown(&["spec.bogus3"])), "{v}");
    assert!(v["spec"].get("bogus3").is_none(), "{v}");
    for (patch, ct) in [
        (json!({"spec": {"bogus2": 1}}), MERGE),
        (
            json!([{"op": "add", "path": "/spec/bogus2", "value": 1}]),
            "application/json-patch+json",
        ),
    ] {
        let (s, w, v) = raw_with_warnings(
            &c,
            "PATCH",
            &format!("{G}/p?fieldValidation=Strict"),
            Some(patch),
            ct,
        )
        .await;
        assert_eq!(
            (s, w.len(), &v["reason"]),
            (422, 0, &json!("Invalid")),
            "{v}"
        );
        let msg = v["message"].as_str().expect("message");
        assert!(
            msg.starts_with(r#" "" is invalid: patch: Invalid value: "{"#)
                && msg.ends_with(r#"": strict decoding error: unknown field "spec.bogus2""#),
            "{ct}: {msg}"
        );
        assert_eq!(v["details"]["causes"][0]["field"], "patch", "{v}");
    }

    // server-side apply: a 500 naming the field, whatever fieldValidation
    // says, on create, on update and in a dry run; nothing is written.
    let typed = |name: &str, detail: &str| {
        format!("failed to create typed patch object (/{name}; test.io/v1, Kind=Gizmo): {detail}")
    };
    let aliased = doc(
        "a",
        json!({"size": 2, "aliases": ["x"], "extra": {"free": 1}}),
    );
    for query in [
        "",
        "&fieldValidation=Strict",
        "&fieldValidation=Ignore",
        "&dryRun=All",
    ] {
        for name in ["a", "p"] {
            let mut body = aliased.clone();
            body["metadata"]["name"] = json!(name);
            let (s, w, v) = raw_with_warnings(
                &c,
                "PATCH",
                &format!("{G}/{name}?fieldManager=t{query}"),
                Some(body),
                APPLY,
            )
            .await;
            assert_eq!((s, w.len()), (500, 0), "{name}{query}: {v}");
            assert_eq!(
                v["message"],
                typed(name, ".spec.aliases: field not declared in schema"),
                "{name}{query}"
            );
            assert!(v.get("reason").is_none(), "{v}");
        }
    }
    let (s, _) = raw(&c, "GET", &format!("{G}/a"), None, "").await;
    assert_eq!(s, 404, "a refused apply created nothing");
    // Several fields (in different objects: within one object the real
    // server stops at the first, in Go map order): one line each.
    let mut body = doc("p", json!({"size": 2, "aliases": ["x"]}));
    body["status"] = json!({"ready": true, "phase": "x"});
    let (s, v) = raw(
        &c,
        "PATCH",
        &format!("{G}/p?fieldManager=t"),
        Some(body),
        APPLY,
    )
    .await;
    assert_eq!(s, 500, "{v}");
    let msg = v["message"].as_str().expect("message");
    let (head, lines) = msg.split_once(": errors:\n  ").expect(msg);
    assert_eq!(
        head,
        "failed to create typed patch object (/p; test.io/v1, Kind=Gizmo)"
    );
    let mut lines: Vec<&str> = lines.split("\n  ").collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            ".spec.aliases: field not declared in schema",
            ".status.phase: field not declared in schema"
        ]
    );
    // Declared fields and x-kubernetes-preserve-unknown-fields apply fine.
    let body = doc("b", json!({"size": 2, "extra": {"free": {"deep": 1}}}));
    let (s, w, v) = raw_with_warnings(
        &c,
        "PATCH",
        &format!("{G}/b?fieldManager=t"),
        Some(body),
        APPLY,
    )
    .await;
    assert_eq!((s, w.len()), (201, 0), "{v}");
    assert_eq!(v["spec"]["extra"]["free"]["deep"], 1);
    assert_alive(&cl);
}

/// The `Status` of the real generic store's refusal of a PUT without
/// `metadata.resourceVersion` (`AllowUnconditionalUpdate()` false): its
/// `Invalid` names the resource (plural) as the kind.
fn must_specify_rv(group: &str, resource: &str, name: &str) -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": format!(
            "{resource}.{group} \"{name}\" is invalid: metadata.resourceVersion: Invalid value: 0: must be specified for an update"
        ),
        "reason": "Invalid",
        "details": {"name": name, "group": group, "kind": resource, "causes": [{
            "reason": "FieldValueInvalid",
            "message": "Invalid value: 0: must be specified for an update",
            "field": "metadata.resourceVersion"}]},
        "code": 422})
}

/// `doc` without `metadata.resourceVersion`.
fn without_rv(mut doc: Value) -> Value {
    doc["metadata"]
        .as_object_mut()
        .expect("metadata")
        .remove("resourceVersion");
    doc
}

/// PUT (update) without `metadata.resourceVersion`: custom resources (and
/// their status), CRDs and Leases refuse it with 422 `Invalid`, leaving the
/// object as it was; ConfigMaps overwrite the stored object (their strategy's
/// `AllowUnconditionalUpdate()` is true); a stale resourceVersion is a 409
/// `Conflict` everywhere; a Lease PUT to an absent name still creates it.
#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unconditional_put_only_where_the_strategy_allows_it(backend: Backend) {
    let (cl, c) = start(backend).await;
    create_crd(&c).await;
    const G: &str = "/apis/test.io/v1/namespaces/default/gizmos";
    let g1 = json!({"apiVersion": "test.io/v1", "kind": "Gizmo", "metadata": {"name": "g1"}, "spec": {"size": 1}});
    let (s, created) = raw(&c, "POST", G, Some(g1.clone()), "application/json").await;
    assert_eq!(s, 201, "{created}");

    // No resourceVersion: 422, before the object's own validation (size 0
    // breaks the schema's minimum), nothing written.
    let mut put = g1.clone();
    put["spec"]["size"] = json!(0);
    let (s, v) = raw(&c, "PUT", &format!("{G}/g1"), Some(put), "application/json").await;
    assert_eq!(s, 422, "{v}");
    assert_eq!(v, must_specify_rv("test.io", "gizmos", "g1"));
    let (s, v) = raw(
        &c,
        "PUT",
        &format!("{G}/g1"),
        Some(without_rv(created.clone())),
        "application/json",
    )
    .await;
    assert_eq!((s, &v["reason"]), (422, &json!("Invalid")), "{v}");
    // ... and on the status subresource.
    let mut status = without_rv(created.clone());
    status["status"] = json!({"ready": true});
    let (s, v) = raw(
        &c,
        "PUT",
        &format!("{G}/g1/status"),
        Some(status.clone()),
        "application/json",
    )
    .await;
    assert_eq!(s, 422, "{v}");
    assert_eq!(v, must_specify_rv("test.io", "gizmos", "g1"));
    let (s, got) = raw(&c, "GET", &format!("{G}/g1"), None, "").await;
    assert_eq!(s, 200, "{got}");
    assert_eq!(
        got["metadata"]["resourceVersion"], created["metadata"]["resourceVersion"],
        "{got}"
    );
    assert_eq!(got["spec"]["size"], 1);
    assert!(got.get("status").is_none(), "{got}");

    // The current resourceVersion: 200; the one before it is then stale: 409.
    let mut put = created.clone();
    put["spec"]["size"] = json!(2);
    let (s, updated) = raw(
        &c,
        "PUT",
        &format!("{G}/g1"),
        Some(put.clone()),
        "application/json",
    )
    .await;
    assert_eq!(s, 200, "{updated}");
    assert_eq!(updated["spec"]["size"], 2);
    put["spec"]["size"] = json!(3);
    let (s, v) = raw(&c, "PUT", &format!("{G}/g1"), Some(put), "application/json").await;
    assert_eq!(s, 409, "{v}");
    assert_eq!(
        v,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "Operation cannot be fulfilled on gizmos.test.io \"g1\": the object has been modified; please apply your changes to the latest version and try again",
            "reason": "Conflict", "details": {"name": "g1", "group": "test.io", "kind": "gizmos"},
            "code": 409})
    );

    // The CRD itself refuses it too.
    let crd = format!("{CRDS}/gizmos.test.io");
    let (s, got) = raw(&c, "GET", &crd, None, "").await;
    assert_eq!(s, 200, "{got}");
    let (s, v) = raw(&c, "PUT", &crd, Some(without_rv(got)), "application/json").await;
    assert_eq!(s, 422, "{v}");
    assert_eq!(
        v,
        must_specify_rv(
            "apiextensions.k8s.io",
            "customresourcedefinitions",
            "gizmos.test.io"
        )
    );

    // A ConfigMap allows it: the stored object is overwritten.
    const CM: &str = "/api/v1/namespaces/default/configmaps";
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "u"}, "data": {"k": "1"}});
    let (s, created) = raw(&c, "POST", CM, Some(cm.clone()), "application/json").await;
    assert_eq!(s, 201, "{created}");
    let mut put = cm.clone();
    put["data"]["k"] = json!("2");
    let (s, v) = raw(&c, "PUT", &format!("{CM}/u"), Some(put), "application/json").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["data"]["k"], "2");
    assert_ne!(
        v["metadata"]["resourceVersion"],
        created["metadata"]["resourceVersion"]
    );
    // ... but a stale one is still a Conflict.
    let (s, v) = raw(
        &c,
        "PUT",
        &format!("{CM}/u"),
        Some(created),
        "application/json",
    )
    .await;
    assert_eq!((s, &v["reason"]), (409, &json!("Conflict")), "{v}");

    // A Lease does not; a PUT to an absent Lease creates it, without one.
    const L: &str = "/apis/coordination.k8s.io/v1/namespaces/default/leases";
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"}, "spec": {"holderIdentity": "a"}});
    let (s, v) = raw(
        &c,
        "PUT",
        &format!("{L}/l"),
        Some(lease.clone()),
        "application/json",
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let mut put = lease;
    put["spec"]["holderIdentity"] = json!("b");
    let (s, v) = raw(&c, "PUT", &format!("{L}/l"), Some(put), "application/json").await;
    assert_eq!(s, 422, "{v}");
    assert_eq!(v, must_specify_rv("coordination.k8s.io", "leases", "l"));
    assert_alive(&cl);
}
