//! The writer's inbox: what the sources and the drift watch tell the writer,
//! over one unbounded channel. Only keys travel; the writer reads the desired
//! state of a key from [`crate::state::ControllerState`] when it is about to write.
//!
//! ```text
//!  source ── changed(keys, at) ─┐
//!  source ── synced(cluster) ───┼─▶ WriterHandle ═ channel ═▶ writer
//!  drift  ── drifted(keys) ─────┘
//! ```
//!
//! A module of its own so that the senders depend on the channel, not on the
//! writer (which depends on the sink, which depends on the drift cache).

use kube_discovery_core::ServiceKey;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// A message to the writer.
#[derive(Debug)]
pub enum WriterMsg {
    /// These keys' desired state (in [`crate::state::ControllerState`]) changed at `at`.
    Changed {
        /// The keys.
        keys: Vec<ServiceKey>,
        /// When the source event arrived (for the latency histogram).
        at: Instant,
    },
    /// `cluster` finished its first complete list; everything before this
    /// message belongs to it.
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

/// Sending side of the writer's inbox.
#[derive(Clone, Debug)]
pub struct WriterHandle {
    tx: mpsc::UnboundedSender<WriterMsg>,
}

/// Receiving side of the writer's inbox.
pub type Inbox = mpsc::UnboundedReceiver<WriterMsg>;

/// A new inbox and its sending side.
pub fn channel() -> (WriterHandle, Inbox) {
    let (tx, rx) = mpsc::unbounded_channel();
    (WriterHandle { tx }, rx)
}

impl WriterHandle {
    /// Queues changed keys (ignored after shutdown).
    pub fn changed(&self, keys: Vec<ServiceKey>, at: Instant) {
        if !keys.is_empty() {
            let _ = self.tx.send(WriterMsg::Changed { keys, at });
        }
    }

    /// Reports keys whose objects may have drifted (ignored after shutdown).
    pub fn drifted(&self, keys: Vec<ServiceKey>) {
        if !keys.is_empty() {
            let _ = self.tx.send(WriterMsg::Drifted { keys });
        }
    }

    /// Sends the first-list barrier of `cluster`.
    pub fn synced(&self, cluster: &str) {
        let _ = self.tx.send(WriterMsg::Synced {
            cluster: cluster.to_string(),
        });
    }
}
