//! Live drift correction: the controller watches its OWN DiscoveredServices
//! and puts back whatever someone else changed.
//!
//! ```text
//!  watch::run(DiscoveredService as Watched, every one; all namespaces or the fixed one)
//!    ▼ DriftWatch (feed.rs), into the record (core write_plan::record): a slim Slot per object + a key index
//!    ├─ apply(obj)   obj == wanted?  ── no ─▶ WriterHandle::drifted([key])
//!    ├─ delete(obj)  still wanted?   ── yes ▶ WriterHandle::drifted([key])
//!    └─ init_done    sweep: every desired key and every cached object (after a relist,
//!                    and once every cluster is listed)
//!
//!  planner (leader only), `drift_delay` later, key not pending / in flight,
//!  no write of it finished within `drift_settle`: Action::CheckDrift
//!    writer: Sink::drift_facts(key, desired) ─ DriftView::facts (view.rs), the record's
//!    latest entries next to the wanted objects ─▶ Input::DriftSeen
//!    planner: write_plan::judge_drift
//!      Ok     ─▶ nothing (it was the late watch event of our own write)
//!      Stale  ─▶ look again later (the record has not seen our last write yet)
//!      Drift  ─▶ a repair (planner): rewrite what the record does not show intact,
//!                delete strays (write_plan::object_ops)
//! ```
//!
//! "Wanted" for an object is the entry of `desired_objects(ControllerState::desired(key))`
//! with the same namespace/name: its `spec` equal, our labels present with our
//! values, our ownerReferences present. Labels, annotations or owner
//! references that others ADD are tolerated (server-side apply would never
//! remove them, so demanding their absence would rewrite forever). An object
//! that loses one of our labels is still ours (its instance label, or our
//! field manager among its appliers, says so) and the rewrite puts the label
//! back.
//!
//! Instances: the watch sees every DiscoveredService, and the record keeps
//! apart those that are not ours (`kube_discovery_core::crd::owner_of`:
//! another instance's, or made by hand). They are never compared, repaired or
//! deleted; their names are taken ([`DriftView::taken`]), and the sink writes
//! no object there.
//!
//! Own writes: every watch event of our own writes arrives after the write, and
//! may show an older state than `ControllerState` already has (a newer change pending).
//! Those events never cause writes: the writer re-checks only after the key has
//! no pending or in-flight write and its last write finished `drift_settle` ago,
//! against the record's latest entry; and the sink records the resourceVersion
//! of every object it wrote (`Record::written`), so a cached entry
//! older than our last write is `Stale`, never `Drift`, and a watch event
//! carrying our own write (or an older state) is dismissed without comparing
//! anything (cheap even for a sharded service of megabytes).
//!
//! Orphans: an object with our label whose service has no desired state, once
//! that service's cluster is listed, is deleted (kind `orphan`; also a stray
//! shard of a service that needs fewer). Objects of clusters that are not
//! configured are left alone.
//!
//! The parts, in reading order:
//!
//! | module | what |
//! |---|---|
//! | core `write_plan::record` | what is compared ([`Facts`], `WantedObject`) and the record it is kept in: one slim slot per object, a key index, relists swapped in at `InitDone` |
//! | `decode` | how the watch (and the sink's start-up list) decode our objects lean ([`Watched`]) |
//! | `view` | [`DriftView`]: the checks the writer and the sink ask, and the sweep |
//! | `feed` | [`DriftFeed`]: the drift watch, a [`crate::k8s::watch::WatchIndex`] |

mod decode;
mod feed;
#[cfg(test)]
mod test_support;
mod view;

pub(crate) use decode::Lean;
pub use decode::Watched;
pub use feed::DriftFeed;
pub use kube_discovery_core::write_plan::record::{Facts, matches, ports_digest};
pub use view::DriftView;

#[cfg(test)]
use kube_discovery_core::write_plan::DriftResult;

/// What was wrong with a service's objects (tests only: production code
/// reads the planner's [`kube_discovery_core::write_plan::DriftResult`]).
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriftKind {
    /// An object exists but differs from what we want.
    Edited,
    /// An object we want is missing (deleted, or lost our label).
    Deleted,
    /// An object we manage that we do not want (no source, or a stray shard).
    Orphan,
}

#[cfg(test)]
impl DriftKind {
    /// Metric label value.
    pub fn as_str(self) -> &'static str {
        match self {
            DriftKind::Edited => "edited",
            DriftKind::Deleted => "deleted",
            DriftKind::Orphan => "orphan",
        }
    }
}

/// The planner's verdict on one service, in the words the tests use.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DriftCheck {
    /// The objects are what we want.
    Ok,
    /// The cache has not seen our last write yet (or is not listed): ask later.
    Stale,
    /// Something must be rewritten or deleted.
    Drift(DriftKind),
}

#[cfg(test)]
impl From<DriftResult> for DriftCheck {
    fn from(r: DriftResult) -> Self {
        match r {
            DriftResult::Intact => DriftCheck::Ok,
            DriftResult::Stale => DriftCheck::Stale,
            DriftResult::Drift("deleted") => DriftCheck::Drift(DriftKind::Deleted),
            DriftResult::Drift("orphan") => DriftCheck::Drift(DriftKind::Orphan),
            DriftResult::Drift(_) => DriftCheck::Drift(DriftKind::Edited),
        }
    }
}

/// `(namespace, name)` of an object.
pub use kube_discovery_core::write_plan::ObjName;
