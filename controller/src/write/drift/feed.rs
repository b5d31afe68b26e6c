//! The drift watch: our own DiscoveredServices through the watch loop
//! ([`crate::k8s::watch`]), decoded lean ([`Watched`]) and handed to the
//! record as plain facts ([`Watched::seen`]), reporting suspicious keys to
//! the writer's inbox.
//!
//! ```text
//!  watch::run ─▶ DriftWatch
//!    init / init_apply / init_done ─▶ Record (a relist swapped in at init_done)
//!                                     init_done: listed; a sweep is due
//!    apply / delete ─▶ Record, then DriftView::suspicious ─▶ WriterHandle::drifted([key])
//!                                      (undecidable: cluster not listed ─▶ a sweep is due)
//!    background: a due sweep, once every cluster is listed ─▶ WriterHandle::drifted(keys)
//! ```

use std::sync::Arc;
use std::time::Duration;

use kube::runtime::watcher::{self, Event, watcher};
use kube::{Api, Client};
use kube_discovery_core::crd::{NamespaceMode, ObjectNaming};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::decode::Watched;
use super::view::DriftView;
use crate::k8s::watch::{self, Watch, WatchIndex};
use crate::state::ControllerState;
use crate::write::inbox::WriterHandle;

/// How often a due sweep looks whether every cluster is listed yet.
const SWEEP_POLL: Duration = Duration::from_millis(200);

/// The feeding half of a [`DriftView`]: the watch task.
pub struct DriftFeed {
    view: DriftView,
    /// The one namespace holding all our objects, if there is one: the
    /// watch is then namespaced (`Plan::home_namespace`).
    namespace: Option<String>,
    /// Server-side watch timeout (`None`: the API's default).
    watch_timeout: Option<Duration>,
}

impl DriftView {
    /// An empty view and its feed (start the feed with [`DriftFeed::run`]).
    pub fn new(naming: ObjectNaming) -> (DriftView, DriftFeed) {
        let view = DriftView::empty(naming);
        (
            view.clone(),
            DriftFeed {
                view,
                namespace: None,
                watch_timeout: None,
            },
        )
    }
}

impl DriftFeed {
    /// Ends (and renews) the watch after `timeout` on the server
    /// ([`crate::k8s::client::watch_renewal`]).
    #[must_use]
    pub fn with_watch_timeout(mut self, timeout: Duration) -> Self {
        self.watch_timeout = Some(timeout);
        self
    }

    /// Watches our objects in `namespace` only (`None`: where the naming
    /// puts them: the fixed namespace, or all namespaces).
    #[must_use]
    pub fn in_namespace(mut self, namespace: Option<String>) -> Self {
        self.namespace = namespace;
        self
    }

    /// Feeds one watch event to the record (and nothing else: no reports).
    pub fn apply(&mut self, ev: &Event<Watched>) {
        let naming = &self.view.naming;
        let mut record = self.view.lock();
        match ev {
            Event::Init => record.init(),
            Event::InitApply(o) => record.init_apply(&o.seen(&o.owner(naming))),
            Event::InitDone => record.init_done(),
            Event::Apply(o) => record.apply(&o.seen(&o.owner(naming))),
            Event::Delete(o) => record.delete(o.ns(), o.name()),
        }
    }

    /// Watches our DiscoveredServices until `shutdown`, reporting suspicious
    /// keys to `writer`.
    pub async fn run(
        self,
        client: Client,
        shared: Arc<ControllerState>,
        writer: WriterHandle,
        shutdown: CancellationToken,
    ) {
        let api: Api<Watched> = match (&self.namespace, &self.view.naming.namespace_mode) {
            (Some(ns), _) | (None, NamespaceMode::Fixed(ns)) => Api::namespaced(client, ns),
            (None, NamespaceMode::Source) => Api::all(client),
        };
        // Every DiscoveredService, not only labelled ones: objects of other
        // instances and hand-made ones are kept apart by the record (never
        // compared or repaired), and their names are not written.
        let mut ours = Watch::from_config(watch::config(self.watch_timeout), move |cfg| {
            watcher(api.clone(), cfg)
        });
        let mut index = DriftWatch {
            view: self.view,
            shared,
            writer,
            sweep_due: false,
            next_sweep: Instant::now(),
        };
        watch::run(&mut index, &mut ours, &shutdown).await;
    }
}

/// `ns/name` of `obj` for logs, noting when our labels were changed.
fn describe(obj: &Watched) -> String {
    format!(
        "{}/{}{}",
        obj.ns(),
        obj.name(),
        match (obj.facts.labels_ok, obj.facts.stamp_ok) {
            (true, true) => "",
            (false, _) => " (labels changed)",
            (true, false) => " (observedGeneration behind: changed since our write)",
        }
    )
}

/// The drift watch as the watch loop feeds it.
struct DriftWatch {
    view: DriftView,
    shared: Arc<ControllerState>,
    writer: WriterHandle,
    /// A sweep waits until every cluster is listed (desired state known).
    sweep_due: bool,
    /// When a due sweep looks next.
    next_sweep: Instant,
}

impl DriftWatch {
    /// Reports `obj` to the writer if it needs a closer look.
    fn report(&mut self, obj: Watched, deleted: bool) {
        match self.view.suspicious(&obj, deleted, &self.shared) {
            Some(true) => {
                if deleted {
                    tracing::debug!(object = %describe(&obj), "wanted DiscoveredService deleted");
                } else {
                    tracing::debug!(object = %describe(&obj), "DiscoveredService differs from the desired state");
                }
                self.writer.drifted(vec![obj.key]);
            }
            Some(false) => {}
            None => self.sweep_due = true,
        }
    }

    /// The due sweep, once every cluster is listed.
    fn try_sweep(&mut self) {
        if self.shared.clusters().values().all(|c| c.listed) {
            self.sweep_due = false;
            let keys = self.view.sweep(&self.shared);
            if !keys.is_empty() {
                tracing::debug!(keys = keys.len(), "drift sweep found differences");
            }
            self.writer.drifted(keys);
        }
    }
}

impl WatchIndex<Watched> for DriftWatch {
    fn init(&mut self) {
        self.view.lock().init();
    }

    fn init_apply(&mut self, obj: Watched) {
        let owner = obj.owner(&self.view.naming);
        self.view.lock().init_apply(&obj.seen(&owner));
    }

    fn init_done(&mut self) {
        self.view.lock().init_done();
        self.sweep_due = true;
    }

    fn apply(&mut self, obj: Watched) {
        let owner = obj.owner(&self.view.naming);
        self.view.lock().apply(&obj.seen(&owner));
        self.report(obj, false);
    }

    fn delete(&mut self, obj: Watched) {
        self.view.lock().delete(obj.ns(), obj.name());
        self.report(obj, true);
    }

    fn failed(&mut self, err: &watcher::Error) {
        tracing::warn!(error = %err, "DiscoveredService watch failed; retrying");
    }

    /// A due sweep, every [`SWEEP_POLL`] until every cluster is listed.
    async fn background(&mut self) {
        if !self.sweep_due {
            return std::future::pending().await;
        }
        tokio::time::sleep_until(self.next_sweep).await;
        self.next_sweep = Instant::now() + SWEEP_POLL;
        self.try_sweep();
    }
}
