//! The writer's inbox: what the sources and the drift watch tell the writer.
//! Only keys travel; the writer reads the desired state of a key from
//! [`crate::state::ControllerState`] when it is about to write.
//!
//! ```text
//!  source ── changed(keys, at) ─┐
//!  source ── synced(cluster) ───┼─▶ WriterHandle ═ coalescing inbox ═▶ writer
//!  drift  ── drifted(keys) ─────┘
//! ```
//!
//! The inbox coalesces by key: a key changed a thousand times before the
//! writer looks is one entry (with its first change time), so its memory is
//! bounded by the number of services, never by the number of events, also
//! while the writer is busy (reading what the API server holds, retrying).
//! A batch hands out every changed key first, then the drift reports, then
//! the first-list barriers: a barrier never overtakes a change sent before
//! it (a change sent after it may ride along, which only makes the barrier
//! wait for one more write).
//!
//! A module of its own so that the senders depend on the inbox, not on the
//! writer (which depends on the sink, which depends on the drift cache).

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use kube_discovery_core::ServiceKey;
use tokio::sync::Notify;
use tokio::time::Instant;

/// A message to the writer.
#[derive(Debug)]
pub enum WriterMsg {
    /// These keys' desired state (in [`crate::state::ControllerState`])
    /// changed, each first at the given time (for the latency histogram).
    Changed {
        /// The keys and the time of their first change not yet received.
        keys: Vec<(ServiceKey, Instant)>,
    },
    /// `cluster` finished its first complete list; every change sent before
    /// this message belongs to it.
    Synced {
        /// The cluster id.
        cluster: String,
    },
    /// The objects of these keys may differ from the desired state (drift
    /// watch); checked after `drift_delay`.
    Drifted {
        /// The keys.
        keys: Vec<ServiceKey>,
    },
}

/// What was sent and not received yet, coalesced.
#[derive(Default)]
struct Mailbox {
    changed: HashMap<ServiceKey, Instant>,
    drifted: HashSet<ServiceKey>,
    synced: Vec<String>,
}

impl Mailbox {
    fn is_empty(&self) -> bool {
        self.changed.is_empty() && self.drifted.is_empty() && self.synced.is_empty()
    }

    /// Everything, in delivery order; the mailbox is empty (and gives its
    /// memory back) afterwards.
    fn take(&mut self) -> VecDeque<WriterMsg> {
        let mut out = VecDeque::new();
        let changed = std::mem::take(&mut self.changed);
        if !changed.is_empty() {
            out.push_back(WriterMsg::Changed {
                keys: changed.into_iter().collect(),
            });
        }
        let drifted = std::mem::take(&mut self.drifted);
        if !drifted.is_empty() {
            out.push_back(WriterMsg::Drifted {
                keys: drifted.into_iter().collect(),
            });
        }
        out.extend(
            std::mem::take(&mut self.synced)
                .into_iter()
                .map(|cluster| WriterMsg::Synced { cluster }),
        );
        out
    }
}

struct Shared {
    mailbox: Mutex<Mailbox>,
    notify: Notify,
    senders: AtomicUsize,
}

impl Shared {
    fn post(&self, f: impl FnOnce(&mut Mailbox)) {
        f(&mut self.mailbox.lock().unwrap_or_else(PoisonError::into_inner));
        self.notify.notify_one();
    }
}

/// Sending side of the writer's inbox (clone it for every sender; the inbox
/// closes when the last one is dropped).
pub struct WriterHandle {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for WriterHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriterHandle").finish_non_exhaustive()
    }
}

impl Clone for WriterHandle {
    fn clone(&self) -> Self {
        self.shared.senders.fetch_add(1, Ordering::AcqRel);
        WriterHandle {
            shared: self.shared.clone(),
        }
    }
}

impl Drop for WriterHandle {
    fn drop(&mut self) {
        if self.shared.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.shared.notify.notify_one();
        }
    }
}

/// Receiving side of the writer's inbox.
pub struct Inbox {
    shared: Arc<Shared>,
    batch: VecDeque<WriterMsg>,
}

/// A new inbox and its sending side.
pub fn channel() -> (WriterHandle, Inbox) {
    let shared = Arc::new(Shared {
        mailbox: Mutex::new(Mailbox::default()),
        notify: Notify::new(),
        senders: AtomicUsize::new(1),
    });
    (
        WriterHandle {
            shared: shared.clone(),
        },
        Inbox {
            shared,
            batch: VecDeque::new(),
        },
    )
}

impl WriterHandle {
    /// Queues changed keys (a key already waiting keeps its first time).
    pub fn changed(&self, keys: Vec<ServiceKey>, at: Instant) {
        if keys.is_empty() {
            return;
        }
        self.shared.post(|m| {
            for key in keys {
                match m.changed.entry(key) {
                    Entry::Occupied(mut e) => {
                        if at < *e.get() {
                            e.insert(at);
                        }
                    }
                    Entry::Vacant(e) => {
                        e.insert(at);
                    }
                }
            }
        });
    }

    /// Reports keys whose objects may have drifted.
    pub fn drifted(&self, keys: Vec<ServiceKey>) {
        if !keys.is_empty() {
            self.shared.post(|m| m.drifted.extend(keys));
        }
    }

    /// Sends the first-list barrier of `cluster`.
    pub fn synced(&self, cluster: &str) {
        self.shared.post(|m| m.synced.push(cluster.to_string()));
    }
}

impl Inbox {
    /// The next message; `None` once every sender is gone and everything
    /// sent was received.
    pub async fn recv(&mut self) -> Option<WriterMsg> {
        loop {
            if let Some(m) = self.batch.pop_front() {
                return Some(m);
            }
            // Register before looking, so a post between the look and the
            // wait is not missed.
            let notified = self.shared.notify.notified();
            {
                let mut mailbox = self
                    .shared
                    .mailbox
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner);
                if !mailbox.is_empty() {
                    self.batch = mailbox.take();
                    continue;
                }
            }
            if self.shared.senders.load(Ordering::Acquire) == 0 {
                return None;
            }
            notified.await;
        }
    }

    /// Keys waiting in the mailbox (not yet received): at most one entry per
    /// service, however many changes were sent.
    pub fn waiting(&self) -> usize {
        let m = self
            .shared
            .mailbox
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        m.changed.len() + m.drifted.len() + m.synced.len()
    }
}

#[cfg(test)]
mod tests;
