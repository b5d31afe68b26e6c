//! Whether writes stamp `status.observedGeneration` now. The stamp is the
//! generation a write will produce (`generation + 1`, from the record:
//! `crate::write::record`), sent in the same request.
//!
//! An older CRD does not declare `status.observedGeneration`, and the API
//! server refuses a server-side apply of an undeclared field (HTTP 500
//! `.status.observedGeneration: field not declared in schema`, measured on
//! the real one). Writes must not stop over a missing stamp: after such an
//! answer the writer sends objects without the stamp for
//! [`RETRY_STAMP_AFTER`], then tries it again (the CRD may have been
//! upgraded meanwhile), so an old CRD costs one refused request per 10 s.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long objects are written without the stamp after the API server
/// refused it (see the module docs).
pub const RETRY_STAMP_AFTER: Duration = Duration::from_secs(10);

/// See the module docs.
#[derive(Clone, Debug, Default)]
pub struct Stamping {
    refused: Arc<Mutex<Option<Instant>>>,
}

impl Stamping {
    /// Whether writes carry the stamp now (not within [`RETRY_STAMP_AFTER`]
    /// of a refusal).
    pub fn on(&self) -> bool {
        self.refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_none_or(|at| at.elapsed() >= RETRY_STAMP_AFTER)
    }

    /// The API server refused the stamp. Returns whether stamping was on
    /// until now (the first refusal of a round is logged).
    pub fn refused(&self) -> bool {
        let was_on = self.on();
        *self.refused.lock().unwrap_or_else(PoisonError::into_inner) = Some(Instant::now());
        was_on
    }
}

#[cfg(test)]
mod tests;
