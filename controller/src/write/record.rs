//! The one record of what the API server holds of our objects
//! ([`kube_discovery_core::write_plan::record::Record`]), behind one lock:
//! the drift watch feeds it from its task (`drift/feed.rs`), the sink feeds
//! it the start-up list and the answers to its writes and reads it before
//! each write (`sink.rs`), the drift checks read it (`drift/view.rs`).
//! The lock is only ever held for plain reads and updates, never across a
//! request.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use kube_discovery_core::write_plan::record::Record;

/// A handle of the shared record (clones share it).
#[derive(Clone, Default)]
pub struct SharedRecord(Arc<Mutex<Record>>);

impl SharedRecord {
    /// The record, locked.
    pub fn lock(&self) -> MutexGuard<'_, Record> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lock itself, for the core functions that lock it only around
    /// their reads (the drift checks, what a write reads before it is
    /// planned).
    pub fn mutex(&self) -> &Mutex<Record> {
        &self.0
    }
}
