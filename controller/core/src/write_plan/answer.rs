//! One object's apply as a short exchange with the API server: which request
//! follows which answer ([`next`], [`after_owner`]) and which fields someone
//! else left that a merge patch removes afterwards ([`leftovers`]). The sink
//! classifies each answer ([`classify`]) and follows; every rule is here.
//!
//! ```text
//!  apply (no force, stamped) ─ 500 stamp not in the CRD ─▶ again without the stamp
//!                            ─ 422 spec.shard, we send none ─▶ again as the one shard of one
//!                            ─ 409 ─▶ whose is it? ours ─▶ again with force; not ours ─▶ NameTaken
//!                            ─ applied ─▶ merge-patch away foreign port keys / a co-owned shard
//! ```
//!
//! Each fallback turns one flag of [`Sending`] for good, so one object costs
//! at most four applies, and an answer no rule covers fails the write (the
//! planner retries it).

use crate::crd::Owner;

/// An answer to an apply, reduced to what the next request depends on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// Applied.
    Applied,
    /// 500 `observedGeneration: field not declared in schema`: the installed
    /// CRD is older than this controller.
    StampUndeclared,
    /// 422 naming `spec.shard`: someone else co-owns part of the shard
    /// field (an apply by a version before instances), so an object without
    /// our part of it is invalid.
    ShardFieldCoOwned,
    /// 409: someone else's manager set fields we apply to other values.
    Conflict,
    /// Any other error.
    Failed,
}

/// Classifies an API server error by status code and message.
pub fn classify(code: u16, message: &str) -> Answer {
    match code {
        500 if message.contains("observedGeneration: field not declared in schema") => {
            Answer::StampUndeclared
        }
        422 if message.contains("spec.shard") => Answer::ShardFieldCoOwned,
        409 => Answer::Conflict,
        _ => Answer::Failed,
    }
}

/// What the apply of one object sends now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sending {
    /// It carries `status.observedGeneration`.
    pub stamped: bool,
    /// The desired object has no `spec.shard` (the service fits one object).
    pub unsharded: bool,
    /// It is sent as the one shard of one (after [`Answer::ShardFieldCoOwned`]).
    pub one_of_one: bool,
    /// It is sent with force (after a 409 on our own object).
    pub forced: bool,
}

impl Sending {
    /// The first apply of a desired object.
    pub fn first(stamped: bool, unsharded: bool) -> Self {
        Sending {
            stamped,
            unsharded,
            one_of_one: false,
            forced: false,
        }
    }
}

/// What follows an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// The object is applied.
    Done,
    /// The write fails with this answer's error.
    Fail,
    /// Apply again without the stamp (and pause stamping).
    Unstamped,
    /// Apply again as the one shard of one (every node, shard 0 of 1).
    OneOfOne,
    /// Ask the API server whose the object is ([`after_owner`]).
    AskOwner,
}

/// What follows `answer` to an apply that sent `sending`.
pub fn next(sending: Sending, answer: Answer) -> Next {
    match answer {
        Answer::Applied => Next::Done,
        Answer::StampUndeclared if sending.stamped => Next::Unstamped,
        Answer::ShardFieldCoOwned if sending.unsharded && !sending.one_of_one => Next::OneOfOne,
        Answer::Conflict if !sending.forced => Next::AskOwner,
        _ => Next::Fail,
    }
}

/// After a 409, the object on the API server is `owner`'s: ours is applied
/// again with force (a hand edit of our object is taken back), anyone
/// else's is never overwritten (`None`: the write fails, the name is taken).
pub fn after_owner(sending: Sending, owner: &Owner) -> Option<Sending> {
    (*owner == Owner::Us && !sending.forced).then_some(Sending {
        forced: true,
        ..sending
    })
}

/// What an applied object still holds that is not ours to keep and a
/// server-side apply cannot remove (another manager owns it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// Port keys someone else added (only after a hand edit).
    pub ports: Vec<String>,
    /// The `spec.shard` of a service that fits one object again, co-owned by
    /// someone else (or left by the one-shard-of-one fallback).
    pub shard: bool,
}

impl Leftovers {
    /// Nothing to remove.
    pub fn is_empty(&self) -> bool {
        self.ports.is_empty() && !self.shard
    }
}

/// What the answer `got_ports` / `got_shard` holds beyond the desired
/// object (`want_ports`, `unsharded`).
pub fn leftovers<'a>(
    want_ports: impl Fn(&str) -> bool,
    got_ports: impl IntoIterator<Item = &'a String>,
    unsharded: bool,
    got_shard: bool,
) -> Leftovers {
    Leftovers {
        ports: got_ports
            .into_iter()
            .filter(|k| !want_ports(k))
            .cloned()
            .collect(),
        shard: unsharded && got_shard,
    }
}

#[cfg(test)]
mod tests;
