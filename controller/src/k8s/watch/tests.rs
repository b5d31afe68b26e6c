use super::*;

/// Records what the loop calls.
#[derive(Default)]
struct Log(Vec<String>);

impl WatchIndex<u32> for Log {
    fn init(&mut self) {
        self.0.push("init".into());
    }
    fn init_apply(&mut self, obj: u32) {
        self.0.push(format!("init_apply {obj}"));
    }
    fn init_done(&mut self) {
        self.0.push("init_done".into());
    }
    fn apply(&mut self, obj: u32) {
        self.0.push(format!("apply {obj}"));
    }
    fn delete(&mut self, obj: u32) {
        self.0.push(format!("delete {obj}"));
    }
    fn failed(&mut self, err: &watcher::Error) {
        self.0.push(format!("failed {}", is_gone(err)));
    }
}

fn gone() -> watcher::Error {
    watcher::Error::WatchError(Box::new(
        kube::core::Status::failure("too old resource version", "Expired").with_code(410),
    ))
}

#[test]
fn only_a_410_watch_error_counts_as_gone() {
    let status = |code| Box::new(kube::core::Status::failure("x", "Expired").with_code(code));
    assert!(is_gone(&watcher::Error::WatchError(status(410))));
    assert!(!is_gone(&watcher::Error::WatchError(status(500))));
    assert!(!is_gone(&watcher::Error::WatchError(status(403))));
    assert!(!is_gone(&watcher::Error::NoResourceVersion));
}

#[test]
fn config_pages_bookmarks_and_bounds_the_timeout() {
    let c = config(Some(Duration::from_secs(120)));
    assert_eq!(c.timeout, Some(120));
    assert_eq!(c.page_size, Some(crate::k8s::client::LIST_PAGE_SIZE));
    assert!(c.bookmarks);
    assert_eq!(config(None).timeout, None);
    assert_eq!(config(Some(Duration::ZERO)).timeout, Some(1));
    assert_eq!(
        config(Some(Duration::from_secs(86_400))).timeout,
        Some(3600)
    );
}

/// Drains `watch` into a [`Log`], noting when each event came.
async fn drain(mut watch: Watch<u32>) -> (Vec<String>, Vec<Duration>) {
    let mut log = Log::default();
    let mut at = Vec::new();
    let t0 = Instant::now();
    while let Some(ev) = watch.next().await {
        at.push(t0.elapsed());
        dispatch(&mut log, ev);
    }
    (log.0, at)
}

#[tokio::test(start_paused = true)]
async fn events_reach_the_index_in_order_and_errors_pause_the_watch() {
    let events = vec![
        Ok(Event::Init),
        Ok(Event::InitApply(1)),
        Ok(Event::InitDone),
        Ok(Event::Apply(2)),
        Err(watcher::Error::NoResourceVersion),
        Ok(Event::Delete(2)),
    ];
    let (log, at) = drain(Watch::new(futures::stream::iter(events))).await;
    assert_eq!(
        log,
        [
            "init",
            "init_apply 1",
            "init_done",
            "apply 2",
            "failed false",
            "delete 2"
        ]
    );
    // After an ordinary error the watcher is not polled for 250 ms,
    // jittered down to 125..250 ms.
    assert_eq!(at[4], at[0], "{at:?}");
    let pause = at[5] - at[4];
    assert!(
        pause >= Duration::from_millis(125) && pause <= Duration::from_millis(250),
        "{pause:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_410_after_a_healthy_stretch_relists_at_once_but_only_once() {
    let events = vec![
        Ok(Event::Apply(1)),
        Err(gone()),
        Ok(Event::Init),
        Err(gone()),
        Ok(Event::Init),
    ];
    let (log, at) = drain(Watch::new(futures::stream::iter(events))).await;
    assert_eq!(
        log,
        ["apply 1", "failed true", "init", "failed true", "init"]
    );
    assert_eq!(at[2], at[1], "the first 410 relists without delay");
    assert!(
        at[4] - at[3] >= Duration::from_millis(125),
        "a 410 right after a retry waits: {at:?}"
    );
}

fn expired_continue() -> watcher::Error {
    watcher::Error::InitialListFailed(kube::Error::Api(Box::new(
        kube::core::Status::failure("continue too old", "Expired").with_code(410),
    )))
}

#[test]
fn only_a_410_list_error_is_an_expired_continue_token() {
    assert!(is_expired_continue(&expired_continue()));
    assert!(!is_expired_continue(&gone()));
    let other = watcher::Error::InitialListFailed(kube::Error::Api(Box::new(
        kube::core::Status::failure("x", "InternalError").with_code(500),
    )));
    assert!(!is_expired_continue(&other));
}

/// Issue 16, item 10: a paged list whose continue token expired is done
/// again in one request (not from page 1 in pages); its next relist is
/// paged again.
#[tokio::test(start_paused = true)]
async fn an_expired_continue_token_falls_back_to_one_full_list() {
    let pages = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let seen = pages.clone();
    let mut streams = vec![
        // Paged: page 1, then page 2's token expired.
        vec![
            Ok(Event::Init),
            Ok(Event::InitApply(1)),
            Err(expired_continue()),
        ],
        // Unpaged: the whole list, a watch, then 410 Gone (a relist).
        vec![
            Ok(Event::Init),
            Ok(Event::InitApply(1)),
            Ok(Event::InitApply(2)),
            Ok(Event::InitDone),
            Ok(Event::Apply(3)),
            Err(gone()),
        ],
        // Paged again.
        vec![Ok(Event::Init), Ok(Event::InitDone)],
    ]
    .into_iter();
    let watch = Watch::from_config(config(None), move |c: watcher::Config| {
        seen.lock().unwrap().push(c.page_size);
        futures::stream::iter(streams.next().unwrap_or_default())
    });
    let (log, at) = drain(watch).await;
    assert_eq!(
        log,
        [
            "init",
            "init_apply 1",
            "failed false",
            "init",
            "init_apply 1",
            "init_apply 2",
            "init_done",
            "apply 3",
            "failed true",
            "init",
            "init_done"
        ]
    );
    let page = Some(crate::k8s::client::LIST_PAGE_SIZE);
    assert_eq!(*pages.lock().unwrap(), [page, None, page]);
    assert_eq!(at[3], at[2], "the full list follows at once");
}

/// An index with a timer in the background.
struct Ticking {
    log: Log,
    ticks: u32,
}

impl WatchIndex<u32> for Ticking {
    fn init(&mut self) {
        self.log.init();
    }
    fn init_apply(&mut self, obj: u32) {
        self.log.init_apply(obj);
    }
    fn init_done(&mut self) {
        self.log.init_done();
    }
    fn apply(&mut self, obj: u32) {
        self.log.apply(obj);
    }
    fn delete(&mut self, obj: u32) {
        self.log.delete(obj);
    }
    fn failed(&mut self, err: &watcher::Error) {
        self.log.failed(err);
    }
    async fn background(&mut self) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.ticks += 1;
    }
}

#[tokio::test(start_paused = true)]
async fn run_polls_the_background_until_shutdown() {
    let (tx, rx) = futures::channel::mpsc::unbounded();
    let mut watch = Watch::new(rx);
    let mut index = Ticking {
        log: Log::default(),
        ticks: 0,
    };
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tx.unbounded_send(Ok(Event::Apply(7))).unwrap();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(550)).await;
        stop.cancel();
    });
    run(&mut index, &mut watch, &shutdown).await;
    assert_eq!(index.log.0, ["apply 7"]);
    assert_eq!(index.ticks, 5);
    // The end of the stream ends the loop too.
    drop(tx);
    run(&mut index, &mut watch, &CancellationToken::new()).await;
}
