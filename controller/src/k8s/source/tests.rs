use super::*;
use crate::test_support::sim_client as sim;
use crate::write::inbox::{Inbox, WriterMsg};
use kube_discovery_core::source::convert::ConvertOptions;
use kube_discovery_core::source::filter::{AnchoredRegex, NamespaceFilter};
use serde_json::{Value, json};

fn endpoints(name: &str) -> LeanEndpoints {
    serde_json::from_value(json!({
        "metadata": {"namespace": "shop", "name": name, "resourceVersion": "1"},
        "subsets": [{"addresses": [{"ip": "10.0.0.1"}],
                     "ports": [{"name": "http", "port": 8080}]}]
    }))
    .unwrap()
}

/// A Service with `kubediscovery.io/export: export` (`None`: unannotated).
fn service(name: &str, export: Option<&str>) -> LeanService {
    let annotations = export.map_or(json!({}), |e| json!({"kubediscovery.io/export": e}));
    serde_json::from_value(json!({
        "metadata": {"namespace": "shop", "name": name, "uid": format!("uid-{name}"),
                     "annotations": annotations},
        "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}
    }))
    .unwrap()
}

fn external(name: &str) -> LeanService {
    serde_json::from_value(json!({
        "metadata": {"namespace": "shop", "name": name, "uid": format!("uid-{name}"),
                     "annotations": {"kubediscovery.io/export": "true"}},
        "spec": {"type": "ExternalName", "externalName": "db.example.com",
                 "ports": [{"name": "https", "port": 443}]}
    }))
    .unwrap()
}

/// The source index of cluster `""` in Endpoints mode (`opt_in`:
/// `export: opt-in`; ExternalNames of `*.example.com` allowed), without
/// a Service watch of its own: the tests feed both watches' events.
fn source_index(opt_in: bool) -> (SourceIndex, Arc<ControllerState>, Inbox) {
    let opts = ConvertOptions {
        export_opt_in: opt_in,
        external_name: Some(vec![AnchoredRegex::new("[a-z]+\\.example\\.com").unwrap()]),
        ..ConvertOptions::default()
    };
    let index = Index::new(
        String::new(),
        SourceKind::Endpoints,
        opts,
        NamespaceFilter::All,
    );
    let shared = Arc::new(ControllerState::new([""]));
    let (writer, inbox) = crate::write::inbox::channel();
    let index = SourceIndex {
        params: SourceParams {
            cluster: String::new(),
            kind: SourceKind::Endpoints,
            label_selector: None,
            field_selector: None,
            namespace: None,
            watch_timeout: Duration::from_secs(60),
            watch_services: true,
        },
        index,
        shared: shared.clone(),
        writer,
        metrics: Metrics::default(),
        events: Events::disabled(),
        leader: None,
        naming: ObjectNaming::source(),
        listed_objects: 0,
        list_started: None,
        first_list_done: false,
        services_listed: false,
        published: false,
        services: None,
        service_list: Vec::new(),
    };
    (index, shared, inbox)
}

fn list_endpoints(ix: &mut SourceIndex, names: &[&str]) {
    WatchIndex::<LeanEndpoints>::init(ix);
    for n in names {
        ix.init_apply(endpoints(n));
    }
    WatchIndex::<LeanEndpoints>::init_done(ix);
}

fn list_services(ix: &mut SourceIndex, services: Vec<LeanService>) {
    WatchIndex::<LeanService>::init(ix);
    for s in services {
        ix.init_apply(s);
    }
    WatchIndex::<LeanService>::init_done(ix);
}

fn list_failed() -> watcher::Error {
    watcher::Error::InitialListFailed(kube::Error::Api(Box::new(
        kube::core::Status::failure("the server is down", "InternalError").with_code(500),
    )))
}

/// The names of the desired services of cluster `""`.
fn desired(shared: &ControllerState) -> Vec<String> {
    shared
        .desired_of("")
        .iter()
        .map(|s| s.key.name.to_string())
        .collect()
}

/// Everything the inbox holds, in delivery order: `changed a b` (names
/// sorted), `synced <cluster>`.
async fn received(inbox: &mut Inbox) -> Vec<String> {
    let mut out = Vec::new();
    // `recv` answers at once while anything is waiting (the timeout
    // polls it first).
    while let Ok(m) = tokio::time::timeout(Duration::ZERO, inbox.recv()).await {
        match m.unwrap() {
            WriterMsg::Changed { keys } => {
                let mut names: Vec<String> = keys.iter().map(|(k, _)| k.name.to_string()).collect();
                names.sort();
                out.push(format!("changed {}", names.join(" ")));
            }
            WriterMsg::Synced { cluster } => out.push(format!("synced {cluster}")),
            WriterMsg::Drifted { .. } => out.push("drifted".into()),
        }
    }
    out
}

/// Issue 29, item 1: with `export: opt-in`, the endpoints listed before
/// the Services publish nothing (no empty desired state, no barrier that
/// would delete every object of the cluster); the Service list then
/// publishes the exported ones, marks the cluster listed and sends the
/// barrier after them.
#[tokio::test]
async fn nothing_is_published_before_the_first_service_list() {
    let (mut ix, shared, mut inbox) = source_index(true);
    list_endpoints(&mut ix, &["in", "out"]);
    assert!(!shared.listed(""));
    assert_eq!(desired(&shared), Vec::<String>::new());
    assert_eq!(received(&mut inbox).await, Vec::<String>::new());
    // A change meanwhile is held back too.
    ix.apply(endpoints("late"));
    assert_eq!(received(&mut inbox).await, Vec::<String>::new());
    list_services(
        &mut ix,
        vec![
            service("in", Some("true")),
            service("out", None),
            service("late", Some("true")),
            external("db"),
        ],
    );
    assert!(shared.listed(""));
    assert_eq!(desired(&shared), ["db", "in", "late"]);
    assert_eq!(
        received(&mut inbox).await,
        ["changed db in late", "synced "]
    );
    // From now on, changes flow at once.
    ix.apply(service("out", Some("true")));
    assert_eq!(received(&mut inbox).await, ["changed out"]);
}

/// `export: all`: a Service annotated `"false"` is never published, not
/// even while its Service is unknown; an allowed ExternalName (which has
/// no endpoints) is published with the rest. Services first, endpoints
/// second: the barrier waits for the endpoints just the same.
#[tokio::test]
async fn an_opted_out_service_is_never_published_whichever_list_comes_first() {
    for services_first in [false, true] {
        let (mut ix, shared, mut inbox) = source_index(false);
        let svcs = || {
            vec![
                service("in", None),
                service("off", Some("false")),
                external("db"),
            ]
        };
        if services_first {
            list_services(&mut ix, svcs());
            assert_eq!(received(&mut inbox).await, Vec::<String>::new());
            list_endpoints(&mut ix, &["in", "off"]);
        } else {
            list_endpoints(&mut ix, &["in", "off"]);
            assert_eq!(received(&mut inbox).await, Vec::<String>::new());
            list_services(&mut ix, svcs());
        }
        assert_eq!(
            desired(&shared),
            ["db", "in"],
            "services first: {services_first}"
        );
        assert_eq!(
            received(&mut inbox).await,
            ["changed db in", "synced "],
            "services first: {services_first}"
        );
    }
}

/// A failing Service list is not a complete one: nothing is published,
/// the cluster is not listed and shows the error, until a list succeeds.
#[tokio::test]
async fn a_failed_service_list_keeps_the_cluster_unpublished() {
    let (mut ix, shared, mut inbox) = source_index(true);
    WatchIndex::<LeanService>::init(&mut ix);
    ix.init_apply(service("in", Some("true")));
    WatchIndex::<LeanService>::failed(&mut ix, &list_failed());
    list_endpoints(&mut ix, &["in"]);
    WatchIndex::<LeanService>::failed(&mut ix, &list_failed());
    assert!(!shared.listed(""));
    let status = &shared.clusters()[""];
    assert!(
        status.failing_watches.contains_key(SERVICE_WATCH),
        "{status:?}"
    );
    assert_eq!(received(&mut inbox).await, Vec::<String>::new());
    list_services(&mut ix, vec![service("in", Some("true"))]);
    assert!(shared.listed(""));
    assert_eq!(received(&mut inbox).await, ["changed in", "synced "]);
}

/// A Service relist after the first one (410 Gone, a list error)
/// changes the index only at its end: one that fails half-way removes
/// nothing (not the opted-in services, not the ExternalName); the next
/// complete one publishes only what changed, and no second barrier.
#[tokio::test]
async fn a_service_relist_that_fails_half_way_changes_nothing() {
    let (mut ix, shared, mut inbox) = source_index(true);
    list_endpoints(&mut ix, &["in", "other"]);
    list_services(
        &mut ix,
        vec![
            service("in", Some("true")),
            service("other", Some("true")),
            external("db"),
        ],
    );
    assert_eq!(
        received(&mut inbox).await,
        ["changed db in other", "synced "]
    );
    WatchIndex::<LeanService>::init(&mut ix);
    ix.init_apply(service("in", Some("true")));
    WatchIndex::<LeanService>::failed(&mut ix, &list_failed());
    assert_eq!(received(&mut inbox).await, Vec::<String>::new());
    assert_eq!(desired(&shared), ["db", "in", "other"]);
    // The complete relist: `other` opted out meanwhile.
    list_services(
        &mut ix,
        vec![
            service("in", Some("true")),
            service("other", None),
            external("db"),
        ],
    );
    assert_eq!(received(&mut inbox).await, ["changed other"]);
    assert_eq!(desired(&shared), ["db", "in"]);
    // An endpoint relist neither: no second barrier.
    list_endpoints(&mut ix, &["in", "other"]);
    assert_eq!(received(&mut inbox).await, Vec::<String>::new());
}

/// Creates `obj` in its namespace.
async fn create<K>(client: &Client, obj: Value)
where
    K: Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + serde::Serialize
        + Debug,
{
    let ns = obj["metadata"]["namespace"].as_str().unwrap().to_string();
    let o: K = serde_json::from_value(obj).unwrap();
    Api::<K>::namespaced(client.clone(), &ns)
        .create(&Default::default(), &o)
        .await
        .unwrap();
}

/// The sources of one cluster against a real API server (kube-sim): the
/// endpoint watch carries the label and namespace selectors to the
/// server (the index here filters by neither), the Service watch no
/// label selector (the Services carry none of the endpoints' labels, yet
/// their annotations apply); and the first Services LIST fails once
/// (500): what reaches the writer before its barrier is exactly the
/// exported, selected services, never `off` (annotated `export:
/// "false"`), which the former head start of at most 5 s (a failed
/// list counted as done) published with the default export of an
/// unknown Service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_source_publishes_selected_exported_services_once_both_lists_are_complete() {
    use k8s_openapi::api::core::v1::{Namespace, Service};
    let (_sim, client) = sim().await;
    for ns in ["shop", "other"] {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        Api::all(client.clone())
            .create(&Default::default(), &ns)
            .await
            .unwrap();
    }
    let ep = |ns: &str, name: &str, labels: Value| {
        json!({"metadata": {"namespace": ns, "name": name, "labels": labels},
                   "subsets": [{"addresses": [{"ip": "10.0.0.1"}],
                                "ports": [{"name": "http", "port": 8080}]}]})
    };
    let web = json!({"app": "web"});
    create::<Endpoints>(&client, ep("shop", "in", web.clone())).await;
    create::<Endpoints>(&client, ep("shop", "off", web.clone())).await;
    create::<Endpoints>(&client, ep("shop", "unlabelled", json!({}))).await;
    create::<Endpoints>(&client, ep("other", "in", web.clone())).await;
    let svc = |name: &str, annotations: Value| {
        json!({"metadata": {"namespace": "shop", "name": name, "annotations": annotations},
                   "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
    };
    create::<Service>(&client, svc("in", json!({}))).await;
    create::<Service>(
        &client,
        svc("off", json!({"kubediscovery.io/export": "false"})),
    )
    .await;
    let fail = json!({"fail": {"verb": "list", "resource": "services", "count": 1, "code": 500}});
    let req = http::Request::post("/_sim/faults")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&fail).unwrap())
        .unwrap();
    client.request_text(req).await.unwrap();

    let params = SourceParams {
        cluster: String::new(),
        kind: SourceKind::Endpoints,
        label_selector: Some("app=web".into()),
        field_selector: Some("metadata.namespace!=other".into()),
        namespace: None,
        watch_timeout: Duration::from_secs(60),
        watch_services: true,
    };
    let index = Index::new(
        String::new(),
        SourceKind::Endpoints,
        ConvertOptions::default(),
        NamespaceFilter::All,
    );
    let shared = Arc::new(ControllerState::new([""]));
    let (writer, mut inbox) = crate::write::inbox::channel();
    let source = Source {
        params,
        client: client.clone(),
        index,
        shared: shared.clone(),
        writer,
        metrics: Metrics::default(),
        events: Events::disabled(),
        leader: None,
        naming: ObjectNaming::source(),
    };
    let shutdown = CancellationToken::new();
    let task = tokio::spawn(source.run(shutdown.clone()));
    let mut before_barrier = Vec::new();
    let barrier = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match inbox.recv().await.unwrap() {
                WriterMsg::Changed { keys } => {
                    before_barrier.extend(keys.into_iter().map(|(k, _)| k.to_string()));
                }
                WriterMsg::Synced { cluster } => return cluster,
                WriterMsg::Drifted { .. } => {}
            }
        }
    })
    .await;
    before_barrier.sort();
    assert_eq!(
        barrier.as_deref(),
        Ok(""),
        "no barrier; before it: {before_barrier:?}"
    );
    assert_eq!(before_barrier, ["shop/in"]);
    assert!(shared.listed(""));
    assert_eq!(desired(&shared), ["in"]);
    // The fault was served: the Services were listed twice.
    let req = http::Request::get("/_sim/stats").body(Vec::new()).unwrap();
    let stats: Value = client.request(req).await.unwrap();
    assert!(
        stats["requests"]["list"]["services"].as_u64() >= Some(2),
        "{stats}"
    );
    shutdown.cancel();
    task.await.unwrap();
}
