use super::*;
use kube_discovery_core::snapshot::INDEX_KEY;
use kube_discovery_core::{Node, PortMap, ServiceKey, ServiceNodes, SourceKind};

#[test]
fn options_validate_name_and_hidden_budget() {
    let o = SnapshotOptions::new("kd".into(), "n".into(), Duration::from_millis(100));
    assert_eq!(o.clone().validated(&|_| None).unwrap(), o);
    let small = o
        .clone()
        .validated(&|k| (k == MAX_SHARD_BYTES_ENV).then(|| "4096".to_string()))
        .unwrap();
    assert_eq!(small.max_shard_bytes, 4096);
    let e = o
        .clone()
        .validated(&|_| Some("12".into()))
        .unwrap_err()
        .to_string();
    assert!(e.contains(MAX_SHARD_BYTES_ENV), "{e}");
    let long = SnapshotOptions::new("kd".into(), "a".repeat(241), Duration::ZERO);
    let e = long.validated(&|_| None).unwrap_err().to_string();
    assert!(e.contains("kube_discovery.sinks.configmap.name"), "{e}");
}

#[test]
fn dump_of_shared_lists_every_cluster() {
    let shared = ControllerState::new(["", "west"]);
    let k = ServiceKey::new("", "default", "web");
    let ports = PortMap::from([("http".to_string(), vec![Node::new("10.0.0.1", 80, 100)])]);
    shared.set_desired(
        &k,
        Some(ServiceNodes::new(
            k.clone(),
            SourceKind::Endpoints,
            ports,
            None,
        )),
    );
    let d = dump_of(&shared);
    assert_eq!(d.services(), 1);
    assert_eq!(d.clusters.len(), 2);
    // That it equals the HTTP dump is a test of `http` (which uses this).
}

async fn sim_client() -> (kube_sim::Sim, Client, tempfile::TempDir) {
    let sim = kube_sim::Sim::start(kube_sim::SimConfig::default())
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kc, &sim.admin_token()).unwrap();
    let client = crate::k8s::client::client(
        &crate::k8s::client::Connection::Kubeconfig {
            path: Some(kc),
            context: None,
        },
        &crate::k8s::client::ClientLimits::default(),
    )
    .await
    .unwrap();
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": "kd"}})).unwrap();
    Api::all(client.clone())
        .create(&Default::default(), &ns)
        .await
        .unwrap();
    (sim, client, dir)
}

fn state(n: u32) -> Arc<ControllerState> {
    let shared = Arc::new(ControllerState::new([""]));
    for i in 0..n {
        let k = ServiceKey::new("", "ns", format!("s{i:02}"));
        let ports = PortMap::from([(
            "http".to_string(),
            vec![Node::new(format!("10.0.0.{i}"), 80, 100)],
        )]);
        shared.set_desired(
            &k,
            Some(ServiceNodes::new(
                k.clone(),
                SourceKind::Endpoints,
                ports,
                None,
            )),
        );
    }
    shared
}

async fn wait_read(client: &Client, want: &Dump) {
    for _ in 0..200 {
        if let Ok(d) = kube_discovery_client::snapshot::read(client, "kd", "snap").await
            && &d == want
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("the snapshot never equalled the state");
}

#[tokio::test]
async fn the_task_publishes_only_when_leader_and_listed_and_read_assembles_it() {
    let (_sim, client, _dir) = sim_client().await;
    let shared = state(30);
    let mut opts = SnapshotOptions::new("kd".into(), "snap".into(), Duration::from_millis(10));
    opts.max_shard_bytes = 2048;
    let (leader_tx, leader_rx) = watch::channel(crate::k8s::leader::Leadership::default());
    let shutdown = CancellationToken::new();
    let task = spawn(
        client.clone(),
        shared.clone(),
        Metrics::default(),
        opts,
        shutdown.clone(),
        Some(leader_rx),
    );
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "kd");
    // A leader whose clusters are not listed yet does not write, nor does a
    // standby with listed clusters (checked after many coalescing
    // windows; no timing target).
    crate::k8s::leader::publish(&leader_tx, true);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        api.get_opt("snap").await.unwrap().is_none(),
        "written before the first list"
    );
    crate::k8s::leader::publish(&leader_tx, false);
    shared.update_cluster("", |c| c.listed = true);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        api.get_opt("snap").await.unwrap().is_none(),
        "a standby wrote"
    );
    crate::k8s::leader::publish(&leader_tx, true);
    let want = dump_of(&shared);
    wait_read(&client, &want).await;
    let idx = dump::parse_index(&api.get("snap").await.unwrap().data.unwrap()[INDEX_KEY]).unwrap();
    assert!(idx.shards.len() > 1, "{} shards", idx.shards.len());
    // A change is followed.
    shared.set_desired(&ServiceKey::new("", "ns", "s00"), None);
    let want = dump_of(&shared);
    wait_read(&client, &want).await;
    shutdown.cancel();
    task.await.unwrap();
}

impl Task {
    /// Feeds `input` and runs the requests it starts to the end (no watch).
    async fn drive(&mut self, input: Input) {
        self.feed(Some(input));
        while let Some(request) = self.request.take() {
            let answer = request.await;
            self.feed(Some(answer));
        }
    }
}

/// Issue 16 item 3, the snapshot's side: a request decided in an epoch
/// the fence does not know as the current leading one sends nothing, and
/// its round is dropped (not retried) until the replica leads again.
#[tokio::test]
async fn a_round_without_the_lease_sends_nothing() {
    let (_sim, client, _dir) = sim_client().await;
    let shared = state(3);
    let (tx, rx) = watch::channel(Leadership::default());
    let opts = SnapshotOptions::new("kd".into(), "snap".into(), Duration::from_millis(10));
    let metrics = Metrics::default();
    let mut task = Task::new(
        Api::namespaced(client.clone(), "kd"),
        shared.clone(),
        metrics.clone(),
        opts,
        Fence::new(rx),
    );
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), "kd");
    task.drive(Input::AllClustersListed(true)).await;
    task.drive(Input::WatchListed(Vec::new())).await;
    // The planner believes it leads in epoch 5; the election says otherwise.
    task.drive(Input::Leadership {
        epoch: 5,
        leading: true,
    })
    .await;
    assert!(!task.planner.in_round(), "the fenced round is dropped");
    assert!(api.get_opt("snap").await.unwrap().is_none());
    let fenced = metrics
        .snapshot_writes
        .get_or_create(&crate::serve::metrics::ResultLabel {
            result: "fenced".into(),
        })
        .get();
    assert_eq!(fenced, 1);
    crate::k8s::leader::publish(&tx, true);
    let now = task.fence.current();
    task.drive(Input::Leadership {
        epoch: now.epoch,
        leading: now.leading,
    })
    .await;
    assert!(api.get_opt("snap").await.unwrap().is_some());
}

#[tokio::test]
async fn generation_signal_fires_on_state_changes() {
    let shared = ControllerState::new([""]);
    let mut rx = shared.subscribe();
    assert!(!rx.has_changed().unwrap());
    shared.update_cluster("", |c| c.listed = true);
    assert!(rx.has_changed().unwrap());
    rx.borrow_and_update();
    // Status details the dump does not contain signal nothing.
    shared.update_cluster("", |c| {
        c.synced = true;
        c.lists += 1;
        c.failing_watches.insert(
            "Service".into(),
            crate::state::WatchStatus {
                last_error: "x".into(),
                failing_since: std::time::Instant::now(),
            },
        );
    });
    assert!(!rx.has_changed().unwrap());
    shared.set_desired(&ServiceKey::new("", "a", "b"), None);
    assert!(rx.has_changed().unwrap());
    rx.borrow_and_update();
    shared.update_cluster("new", |_| {});
    assert!(rx.has_changed().unwrap(), "a new cluster is in the dump");
}
