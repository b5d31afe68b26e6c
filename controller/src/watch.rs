//! The one watch loop of the controller: the sources (Endpoints or
//! EndpointSlices, Service metadata) and the drift watch (our own
//! DiscoveredServices) all run through it. Each only implements
//! [`WatchIndex`] (what to do with an object); the reconnect policy is here.
//!
//! ```text
//!  kube-runtime watcher(config())          paged lists, bookmarks, server-side timeout
//!    │                                     (also kube-runtime's client-side idle timeout)
//!    ▼
//!  Watch::next ── Err ─▶ pause: 410 Gone after a healthy stretch: none (relist at once),
//!    │                   else WatchBackoff (250 ms doubling to 1 s, jittered);
//!    │                   the watcher is not polled while paused
//!    │ Ok ─▶ backoff reset
//!    ▼
//!  dispatch ─▶ WatchIndex    Init ─▶ init()           ┐ a relist: whatever is not
//!                            InitApply(o) ─▶ init_apply ├ listed again by InitDone
//!                            InitDone ─▶ init_done()  ┘ is gone
//!                            Apply(o) ─▶ apply   Delete(o) ─▶ delete   Err(e) ─▶ failed
//!  run: the above until shutdown, polling WatchIndex::background alongside
//!       (a second watch into the same index, a timer)
//! ```
//!
//! The loop applies the backoff itself instead of `WatchStreamExt::backoff`
//! because it tells errors apart: a watch that ended with `410 Gone` (its
//! resourceVersion was compacted away) is followed by the relist without
//! delay, once per healthy stretch (see `WatchBackoff::next_after_gone`);
//! every other error waits the ordinary delay. Every successful event resets
//! the backoff, as kube-runtime's `StreamBackoff` does.

use std::future::Future;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use kube::runtime::utils::Backoff as _;
use kube::runtime::watcher::{self, Event};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The reconnect policy of every watcher (sources, drift, gateways).
pub use kube_discovery_core::backoff::WatchBackoff;

/// The watcher configuration of every watch: lists paged by
/// [`crate::client::LIST_PAGE_SIZE`], bookmarks on, and the server-side
/// watch `timeout` (`None`: the API's default, 290 s). kube-runtime also uses
/// the timeout as the client-side idle timeout: a watch that sends nothing,
/// not even a bookmark, for the timeout plus 5 s is taken for dead and
/// re-established.
pub fn config(timeout: Option<Duration>) -> watcher::Config {
    let mut cfg = watcher::Config::default().page_size(crate::client::LIST_PAGE_SIZE);
    if let Some(t) = timeout {
        let secs = u32::try_from(t.as_secs())
            .unwrap_or(u32::MAX)
            .clamp(1, 3600);
        cfg = cfg.timeout(secs);
    }
    // Bookmarks are on by default in kube-runtime; keep them explicit.
    cfg.bookmarks = true;
    cfg
}

/// What a watch feeds: one call per watch event. No I/O: an index decides,
/// and hands what changed on (to [`crate::state::ControllerState`], to the writer).
pub trait WatchIndex<K> {
    /// A (re)list starts (`Event::Init`).
    fn init(&mut self);
    /// One object of the (re)list (`Event::InitApply`).
    fn init_apply(&mut self, obj: K);
    /// The (re)list is complete (`Event::InitDone`): whatever it did not
    /// show is gone.
    fn init_done(&mut self);
    /// An object was added or modified.
    fn apply(&mut self, obj: K);
    /// An object was deleted.
    fn delete(&mut self, obj: K);
    /// The watch failed; [`Watch`] retries after the backoff.
    fn failed(&mut self, err: &watcher::Error);
    /// Other work of the index, polled by [`run`] together with the watch: a
    /// second watch into the same index, a timer. It resolves after one step
    /// and is polled again after every event; it may be dropped at an
    /// `.await` (when an event comes first). Never resolves by default.
    fn background(&mut self) -> impl Future<Output = ()> + Send {
        std::future::pending()
    }
}

/// Feeds one watch event to `index`.
pub fn dispatch<K, I: WatchIndex<K> + ?Sized>(index: &mut I, ev: watcher::Result<Event<K>>) {
    match ev {
        Ok(Event::Init) => index.init(),
        Ok(Event::InitApply(o)) => index.init_apply(o),
        Ok(Event::InitDone) => index.init_done(),
        Ok(Event::Apply(o)) => index.apply(o),
        Ok(Event::Delete(o)) => index.delete(o),
        Err(e) => index.failed(&e),
    }
}

/// Whether a watcher error is a `410 Gone` (the watch's resourceVersion was
/// compacted away; kube-runtime relists next).
pub fn is_gone(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::WatchError(status) if status.code == 410)
}

/// Whether a watcher error is a `410 Expired` answer to a list page: the
/// revision of its `continue` token was compacted away (a first page has
/// no token and cannot expire). kube-runtime's watcher then starts the
/// list over from page 1, which on a large, throttled cluster may expire
/// again, forever.
pub fn is_expired_continue(e: &watcher::Error) -> bool {
    matches!(e, watcher::Error::InitialListFailed(kube::Error::Api(status)) if status.code == 410)
}

/// Whether after `e` the watcher starts over with a new list (rather than
/// resuming its watch from a resourceVersion).
fn relists_after(e: &watcher::Error) -> bool {
    is_gone(e)
        || matches!(
            e,
            watcher::Error::InitialListFailed(_) | watcher::Error::NoResourceVersion
        )
}

/// Builds a watcher stream for a configuration ([`Watch::from_config`]).
type MakeEvents<K> =
    Box<dyn FnMut(watcher::Config) -> BoxStream<'static, watcher::Result<Event<K>>> + Send>;

/// A kube-runtime watcher stream with the reconnect policy applied.
pub struct Watch<K> {
    events: BoxStream<'static, watcher::Result<Event<K>>>,
    backoff: WatchBackoff,
    /// After an error: the watcher is polled again only from this instant.
    paused_until: Option<Instant>,
    /// The paged configuration and how to build a watcher from a
    /// configuration ([`Watch::from_config`]); `None`: a fixed stream.
    remake: Option<(watcher::Config, MakeEvents<K>)>,
    /// The current stream lists in one request (after an expired
    /// `continue` token), until its next relist.
    unpaged: bool,
}

impl<K: Send + 'static> Watch<K> {
    /// `events` of a `watcher()` (with any `.modify`), without a backoff of
    /// its own, under the watchers' policy ([`WatchBackoff::new`]).
    pub fn new(events: impl Stream<Item = watcher::Result<Event<K>>> + Send + 'static) -> Self {
        Self::with_backoff(events, WatchBackoff::new())
    }

    /// [`Watch::new`] with other delay bounds.
    pub fn with_backoff(
        events: impl Stream<Item = watcher::Result<Event<K>>> + Send + 'static,
        backoff: WatchBackoff,
    ) -> Self {
        Watch {
            events: events.boxed(),
            backoff,
            paused_until: None,
            remake: None,
            unpaged: false,
        }
    }

    /// A watch of the watcher `make` builds from `config` (paged lists)
    /// that falls back to one unpaged list when a page's `continue` token
    /// expired, as client-go's pager does (`FullListIfExpired`): kube-runtime's
    /// watcher would start the paged list over instead. The stream is
    /// rebuilt only where the watcher starts a new list anyway (after a
    /// list error or a `410 Gone`), and the next relist is paged again.
    pub fn from_config<S>(
        config: watcher::Config,
        mut make: impl FnMut(watcher::Config) -> S + Send + 'static,
    ) -> Self
    where
        S: Stream<Item = watcher::Result<Event<K>>> + Send + 'static,
    {
        let mut make: MakeEvents<K> = Box::new(move |c| make(c).boxed());
        let events = make(config.clone());
        Watch {
            events,
            backoff: WatchBackoff::new(),
            paused_until: None,
            remake: Some((config, make)),
            unpaged: false,
        }
    }

    /// The same watch with other delay bounds.
    #[must_use]
    pub fn backoff(mut self, backoff: WatchBackoff) -> Self {
        self.backoff = backoff;
        self
    }

    /// After error `e`: rebuilds the stream unpaged (an expired `continue`
    /// token; `true`: relist at once) or paged again (the unpaged stream
    /// relists).
    fn adapt_paging(&mut self, e: &watcher::Error) -> bool {
        let Some((config, make)) = self.remake.as_mut() else {
            return false;
        };
        if is_expired_continue(e) && !self.unpaged && config.page_size.is_some() {
            tracing::warn!(
                error = %crate::redact::watch_detail(e),
                "the continue token of a paged list expired; listing again in one request"
            );
            let mut full = config.clone();
            full.page_size = None;
            self.events = make(full);
            self.unpaged = true;
            return true;
        }
        if self.unpaged && relists_after(e) {
            self.events = make(config.clone());
            self.unpaged = false;
        }
        false
    }

    /// The next event, not before the pause after an error has passed.
    /// `None`: the stream ended (a watcher never does). Cancel-safe.
    pub async fn next(&mut self) -> Option<watcher::Result<Event<K>>> {
        if let Some(t) = self.paused_until {
            tokio::time::sleep_until(t).await;
        }
        let ev = self.events.next().await?;
        self.paused_until = None;
        match &ev {
            Ok(_) => self.backoff.reset(),
            Err(e) => {
                let delay = if self.adapt_paging(e) {
                    Duration::ZERO
                } else if is_gone(e) {
                    self.backoff.next_after_gone()
                } else {
                    self.backoff.next().unwrap_or(Duration::from_secs(1))
                };
                self.paused_until = Some(Instant::now() + delay);
            }
        }
        Some(ev)
    }
}

/// Feeds `watch` to `index` until `shutdown` (or the stream's end), polling
/// [`WatchIndex::background`] alongside.
pub async fn run<K, I>(index: &mut I, watch: &mut Watch<K>, shutdown: &CancellationToken)
where
    K: Send + 'static,
    I: WatchIndex<K>,
{
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = index.background() => {}
            ev = watch.next() => match ev {
                Some(ev) => dispatch(index, ev),
                None => return,
            },
        }
    }
}

#[cfg(test)]
mod tests {
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
        assert_eq!(c.page_size, Some(crate::client::LIST_PAGE_SIZE));
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
        let page = Some(crate::client::LIST_PAGE_SIZE);
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
}
