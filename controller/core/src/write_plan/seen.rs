//! The drift check, judged by the planner: what the drift watch shows of one
//! service's objects next to what its desired state wants ([`DriftFacts`],
//! plain data the runtime gathers for an [`super::Action::CheckDrift`]), and
//! the verdict ([`judge_drift`]).
//!
//! ```text
//!  watch not listed ─▶ Stale
//!  a wanted object not shown ─▶ Drift(deleted)     shown but differs ─▶ Drift(edited)
//!  shown older than our last write of it ─▶ Stale  (the watch has not caught up)
//!  an object of the service that is not wanted (stray shard, no source) ─▶ Drift(orphan)
//!  else Intact
//! ```
//!
//! "Differs": the spec digest differs, our labels or the generation stamp
//! are off, or one of our owner references is missing (others' added
//! owners, labels and annotations are tolerated: server-side apply never
//! removes them).

use super::{DriftResult, ObjName};

/// What the drift watch shows of one service's objects and what its desired
/// state wants, reduced to names, resourceVersions and digests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriftFacts {
    /// Whether the drift watch has listed (else it shows nothing yet).
    pub listed: bool,
    /// The objects the desired state wants (none: no source), each with
    /// what the watch shows under its name.
    pub wanted: Vec<WantedObjectFacts>,
    /// Every object the watch shows that describes this service.
    pub present: Vec<ObjName>,
}

impl DriftFacts {
    /// Nothing to compare (a sink without a drift watch): judged intact.
    pub fn unwatched() -> Self {
        DriftFacts {
            listed: true,
            wanted: Vec::new(),
            present: Vec::new(),
        }
    }
}

/// One object the desired state wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WantedObjectFacts {
    /// Its namespace and name.
    pub name: ObjName,
    /// The digest of its spec.
    pub spec: u64,
    /// The digests of its owner references.
    pub owners: Vec<u64>,
    /// What the watch shows under that name (`None`: no object).
    pub seen: Option<SeenObject>,
}

/// One object as the drift watch shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenObject {
    /// The resourceVersion of the copy the watch shows.
    pub resource_version: Option<u64>,
    /// The resourceVersion the API server answered our last write of it with.
    pub written: Option<u64>,
    /// The digest of its spec.
    pub spec: u64,
    /// The digests of its owner references.
    pub owners: Vec<u64>,
    /// Our labels are present with our values.
    pub labels_ok: bool,
    /// `status.observedGeneration` is absent or equals `metadata.generation`.
    pub stamp_ok: bool,
}

impl SeenObject {
    /// The watch has not shown our last write of it yet.
    fn older_than_our_write(&self) -> bool {
        matches!((self.resource_version, self.written), (Some(have), Some(ours)) if have < ours)
    }

    fn satisfies(&self, w: &WantedObjectFacts) -> bool {
        self.spec == w.spec
            && self.labels_ok
            && self.stamp_ok
            && w.owners.iter().all(|o| self.owners.contains(o))
    }
}

/// Whether what the watch shows of a service is what its desired state
/// wants (see the module docs).
pub fn judge_drift(facts: &DriftFacts) -> DriftResult {
    if !facts.listed {
        return DriftResult::Stale;
    }
    let mut verdict = DriftResult::Intact;
    for w in &facts.wanted {
        match &w.seen {
            None => return DriftResult::Drift("deleted"),
            Some(have) if have.older_than_our_write() => verdict = DriftResult::Stale,
            Some(have) if !have.satisfies(w) => return DriftResult::Drift("edited"),
            Some(_) => {}
        }
    }
    if verdict == DriftResult::Stale {
        return verdict;
    }
    if facts
        .present
        .iter()
        .any(|name| !facts.wanted.iter().any(|w| w.name == *name))
    {
        return DriftResult::Drift("orphan");
    }
    DriftResult::Intact
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(n: &str) -> ObjName {
        ("ns".to_string(), n.to_string())
    }

    fn seen(spec: u64, rv: u64, written: Option<u64>) -> SeenObject {
        SeenObject {
            resource_version: Some(rv),
            written,
            spec,
            owners: vec![7, 8],
            labels_ok: true,
            stamp_ok: true,
        }
    }

    fn want(n: &str, spec: u64, seen: Option<SeenObject>) -> WantedObjectFacts {
        WantedObjectFacts {
            name: name(n),
            spec,
            owners: vec![7],
            seen,
        }
    }

    fn facts(wanted: Vec<WantedObjectFacts>, present: &[&str]) -> DriftFacts {
        DriftFacts {
            listed: true,
            wanted,
            present: present.iter().map(|n| name(n)).collect(),
        }
    }

    #[test]
    fn the_objects_we_want_as_last_written_are_intact() {
        let f = facts(vec![want("a", 1, Some(seen(1, 5, Some(5))))], &["a"]);
        assert_eq!(judge_drift(&f), DriftResult::Intact);
        assert_eq!(judge_drift(&DriftFacts::unwatched()), DriftResult::Intact);
        // An owner someone else added is tolerated.
        let f = facts(vec![want("a", 1, Some(seen(1, 6, Some(5))))], &["a"]);
        assert_eq!(judge_drift(&f), DriftResult::Intact);
    }

    #[test]
    fn an_unlisted_watch_or_one_behind_our_write_is_stale() {
        let mut f = facts(vec![want("a", 1, None)], &[]);
        f.listed = false;
        assert_eq!(judge_drift(&f), DriftResult::Stale);
        // Older than our write: stale even when its content differs.
        let f = facts(vec![want("a", 1, Some(seen(2, 4, Some(5))))], &["a"]);
        assert_eq!(judge_drift(&f), DriftResult::Stale);
    }

    #[test]
    fn missing_differing_and_unwanted_objects_are_drift() {
        let f = facts(vec![want("a", 1, None)], &[]);
        assert_eq!(judge_drift(&f), DriftResult::Drift("deleted"));
        let f = facts(vec![want("a", 1, Some(seen(2, 6, Some(5))))], &["a"]);
        assert_eq!(judge_drift(&f), DriftResult::Drift("edited"));
        for off in 0..3 {
            let mut s = seen(1, 6, Some(5));
            match off {
                0 => s.labels_ok = false,
                1 => s.stamp_ok = false,
                _ => s.owners = vec![8],
            }
            let f = facts(vec![want("a", 1, Some(s))], &["a"]);
            assert_eq!(judge_drift(&f), DriftResult::Drift("edited"), "{off}");
        }
        // A stray shard, and an object without a source.
        let f = facts(vec![want("a", 1, Some(seen(1, 5, None)))], &["a", "a-1"]);
        assert_eq!(judge_drift(&f), DriftResult::Drift("orphan"));
        assert_eq!(
            judge_drift(&facts(vec![], &["a"])),
            DriftResult::Drift("orphan")
        );
        // A missing object is reported before a stale one.
        let f = facts(
            vec![
                want("a", 1, Some(seen(1, 4, Some(5)))),
                want("a-1", 1, None),
            ],
            &["a"],
        );
        assert_eq!(judge_drift(&f), DriftResult::Drift("deleted"));
    }
}
