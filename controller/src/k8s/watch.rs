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
/// [`crate::k8s::client::LIST_PAGE_SIZE`], bookmarks on, and the server-side
/// watch `timeout` (`None`: the API's default, 290 s). kube-runtime also uses
/// the timeout as the client-side idle timeout: a watch that sends nothing,
/// not even a bookmark, for the timeout plus 5 s is taken for dead and
/// re-established.
pub fn config(timeout: Option<Duration>) -> watcher::Config {
    let mut cfg = watcher::Config::default().page_size(crate::k8s::client::LIST_PAGE_SIZE);
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
                error = %crate::k8s::redact::watch_detail(e),
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
mod tests;
