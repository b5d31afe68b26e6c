//! The `metadata.generation` of each of our objects as the API server last
//! answered, so a write can stamp `status.observedGeneration` with the
//! generation it will produce (`generation + 1`) in the same request.
//!
//! Filled by the start-up list (`Sink::list_versions`), updated from the
//! answer of every request that changes an object and from the drift
//! watch (so a repair after someone else's edit guesses right), forgotten
//! on delete.
//! A wrong or missing entry costs one corrective apply, never a wrong
//! stamp: the writer checks every answer
//! (`kube_discovery_core::crd::generation_fix`). That is also why the map is
//! keyed by a 64-bit hash of `namespace/name` instead of the name: a
//! collision only makes a guess wrong. 16 bytes of payload per object.
//!
//! An older CRD does not declare `status.observedGeneration`, and the API
//! server refuses a server-side apply of an undeclared field (HTTP 500
//! `.status.observedGeneration: field not declared in schema`, measured on
//! the real one). Writes must not stop over a missing stamp: after such an
//! answer the writer sends objects without the stamp for
//! [`RETRY_STAMP_AFTER`], then tries it again (the CRD may have been
//! upgraded meanwhile), so an old CRD costs one refused request per 10 s.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long objects are written without the stamp after the API server
/// refused it (see the module docs).
pub const RETRY_STAMP_AFTER: Duration = Duration::from_secs(10);

/// See the module docs.
#[derive(Clone, Debug, Default)]
pub struct Generations {
    map: Arc<Mutex<HashMap<u64, i64>>>,
    refused: Arc<Mutex<Option<Instant>>>,
}

/// Whether `message` (an API server's error) refuses the stamp because the
/// installed CRD does not declare it.
pub fn stamp_undeclared(code: u16, message: &str) -> bool {
    code == 500 && message.contains("observedGeneration: field not declared in schema")
}

fn slot(ns: &str, name: &str) -> u64 {
    let mut h = DefaultHasher::new();
    (ns, name).hash(&mut h);
    h.finish()
}

impl Generations {
    /// The stamp a write of `ns/name` sends: the generation the object will
    /// have after it (1: a new object).
    pub fn next(&self, ns: &str, name: &str) -> i64 {
        self.lock()
            .get(&slot(ns, name))
            .map_or(1, |g| g.saturating_add(1))
    }

    /// The API server answered `generation` for `ns/name`.
    pub fn note(&self, ns: &str, name: &str, generation: Option<i64>) {
        let mut map = self.lock();
        match generation {
            Some(g) => map.insert(slot(ns, name), g),
            None => map.remove(&slot(ns, name)),
        };
    }

    /// The drift watch shows `ns/name` at `generation`. Only a higher
    /// value is taken: the event may be older than our last write's answer
    /// (a recreated object was first seen deleted, [`Generations::note`]).
    pub fn seen(&self, ns: &str, name: &str, generation: Option<i64>) {
        if let Some(g) = generation {
            let mut map = self.lock();
            let e = map.entry(slot(ns, name)).or_insert(g);
            *e = (*e).max(g);
        }
    }

    /// Replaces everything with what a list found.
    pub fn listed(&self, found: impl IntoIterator<Item = ((String, String), i64)>) {
        *self.lock() = found
            .into_iter()
            .map(|((ns, name), g)| (slot(&ns, &name), g))
            .collect();
    }

    /// Whether writes carry the stamp now (not within [`RETRY_STAMP_AFTER`]
    /// of a refusal).
    pub fn stamping(&self) -> bool {
        self.refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none_or(|at| at.elapsed() >= RETRY_STAMP_AFTER)
    }

    /// The API server refused the stamp. Returns whether stamping was on
    /// until now (the first refusal of a round is logged).
    pub fn refused(&self) -> bool {
        let was_on = self.stamping();
        *self.refused.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        was_on
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, i64>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests;
