//! The ConfigMap snapshot's planner: when a round runs, which snapshot
//! ConfigMaps it applies (and in which order), which it deletes, and when to
//! try again. Pure: it takes what happened ([`Input`]) and the time, and
//! answers with what to do ([`Action`]) and when to ask again; the
//! controller's snapshot sink only runs the ConfigMap watch, builds the
//! [`Layout`] when asked ([`crate::snapshot::Builder`], incremental), sends the
//! requests (fenced, with timeouts) and feeds the results back.
//!
//! ```text
//!  StateChanged(gen) ─▶ due = now, or the last round's start + coalesce_window when
//!                      that is later (unless a round is due already;
//!                      coalesce_leading_edge false: now + coalesce_window)
//!  WatchListed(all) / Observed / Gone ─▶ seen (an echo older than our write: ignored),
//!                      due = now + coalesce_window (unless a round is due already)
//!  Leadership{epoch, leading}: gained ─▶ due = now      lost ─▶ the round is dropped
//!  poll(now): due, leading, watch listed, every cluster listed ─▶ a round:
//!     layout older than the state ─▶ Build; Built(gen, layout)
//!     1. Apply every shard whose text differs from `seen` (or lacks our label), in order
//!     2. Apply the index LAST (it switches readers to the new version)
//!     3. Delete labelled ConfigMaps the index does not list (old shards)
//!     one request at a time: Written / Deleted ─▶ the next;  Failed ─▶ Retry after backoff
//!     Fenced (or the lease lost) ─▶ the round is dropped, nothing more is sent
//!     the end ─▶ Done (published if the index was written, repaired, or nothing)
//! ```
//!
//! Coalescing of new states has a leading and a trailing edge: after a
//! quiet window a new state starts a round at once; what changes within the
//! window of a writing round's start waits for the window's end and becomes
//! one round. What the watch shows of our ConfigMaps (repairs, and the
//! echoes of our writes, which change nothing) waits one window. With
//! `coalesce_leading_edge: false` a new state waits one window too (the
//! trailing-only rule of before).
//!
//! One request at a time, as before the planner: the shards of a version
//! must all be written before its index, and the stale ones deleted after,
//! so nothing would be gained by overlapping them; and a leadership change
//! between two requests is seen before the next one is sent.
//!
//! Time is an [`At`] (the time since an origin the caller picks), so tests
//! script it exactly.

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::backoff::RetryDelays;
use crate::snapshot::{INDEX_KEY, Layout, ShardData};
pub use crate::write_plan::At;

/// sha256 of a data value: `seen` keeps hashes, not the (up to 1 MiB) texts.
pub type Hash = [u8; 32];

/// The sha256 of `text`.
pub fn hash(text: &str) -> Hash {
    Sha256::digest(text.as_bytes()).into()
}

/// The sha256 of a shard's text as its layout lists it (hex), or hashed
/// again if that is not 32 bytes of hex (layouts come from `dump`, whose
/// hashes always are).
fn listed_hash(s: &ShardData) -> Hash {
    let mut h = [0u8; 32];
    match hex::decode_to_slice(&s.sha256, &mut h) {
        Ok(()) => h,
        Err(_) => hash(&s.text),
    }
}

/// Tuning of the planner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// Name of the index ConfigMap (shards are named by the layout).
    pub name: String,
    /// Rounds start at least this far apart: a change after a quiet window
    /// starts one at once, later ones wait for the window's end.
    pub coalesce_window: Duration,
    /// Whether a new state after a quiet window starts a round at once (the
    /// leading edge). `false`: every round waits `coalesce_window`.
    pub coalesce_leading_edge: bool,
    /// First retry delay after a failed round.
    pub retry_min: Duration,
    /// Largest retry delay.
    pub retry_max: Duration,
}

/// What the API server holds of one snapshot ConfigMap (from the
/// label-selected watch or the answer to our apply).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observed {
    /// ConfigMap name.
    pub name: String,
    /// Its `metadata.resourceVersion` (`None`: absent or not a number).
    pub rv: Option<u64>,
    /// Data key -> sha256 of its value.
    pub data: BTreeMap<String, Hash>,
    /// Whether it carries our snapshot label with this snapshot's value.
    pub labelled: bool,
}

impl Observed {
    /// An observation with the data values hashed.
    pub fn new<'a>(
        name: impl Into<String>,
        rv: Option<u64>,
        data: impl IntoIterator<Item = (&'a str, &'a str)>,
        labelled: bool,
    ) -> Self {
        Observed {
            name: name.into(),
            rv,
            data: data
                .into_iter()
                .map(|(k, v)| (k.to_string(), hash(v)))
                .collect(),
            labelled,
        }
    }

    /// An event of this object is older than our last write of it.
    fn older_than(&self, written_rv: Option<u64>) -> bool {
        matches!((self.rv, written_rv), (Some(ev), Some(w)) if ev < w)
    }
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// The discovered state changed; `generation` grows with every change
    /// (a layout built at or after it already holds it).
    StateChanged {
        /// The state's generation.
        generation: u64,
    },
    /// Whether every cluster completed its first list (nothing is written
    /// before: the snapshot would be partial).
    AllClustersListed(bool),
    /// Leadership changed (without leader election: one leading epoch 0).
    Leadership {
        /// Changes on every gain and loss.
        epoch: u64,
        /// Whether this replica leads in it.
        leading: bool,
    },
    /// The watch (re)listed: every labelled ConfigMap it holds.
    WatchListed(Vec<Observed>),
    /// The watch saw a ConfigMap created or changed.
    Observed(Observed),
    /// The watch saw a ConfigMap deleted (its last state).
    Gone(Observed),
    /// The answer to [`Action::Build`]: the layout of the state at `generation`.
    Built {
        /// The state's generation the layout was built from.
        generation: u64,
        /// The layout.
        layout: Arc<Layout>,
    },
    /// [`Action::Build`] failed (the message is logged); the round is retried.
    BuildFailed(String),
    /// An [`Action::Apply`] succeeded; the object as the API server answered.
    Written(Observed),
    /// An [`Action::Delete`] succeeded (or the object was already gone).
    Deleted {
        /// ConfigMap name.
        name: String,
    },
    /// The request failed (the message is logged); the round is retried.
    Failed(String),
    /// The leadership fence refused the request: nothing was sent.
    Fenced,
}

/// What a finished round did (for the gauges and the log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The layout's version.
    pub version: String,
    /// Shards of the layout.
    pub shards: usize,
    /// Bytes of all shard texts.
    pub bytes: usize,
    /// Services in the layout.
    pub services: usize,
    /// Nodes in the layout.
    pub nodes: usize,
    /// Requests sent (applies and deletes).
    pub written: usize,
    /// Whether the index was written (a new version published).
    pub published: bool,
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Build the layout of the current state; answer with [`Input::Built`]
    /// or [`Input::BuildFailed`].
    Build,
    /// Server-side apply one ConfigMap holding `key: text` and our labels;
    /// answer with [`Input::Written`], [`Input::Failed`] or [`Input::Fenced`].
    Apply {
        /// ConfigMap name.
        name: String,
        /// Its one data key.
        key: String,
        /// The value.
        text: String,
        /// The leading epoch the request is fenced with.
        epoch: u64,
    },
    /// Delete a labelled ConfigMap the index does not list; answer with
    /// [`Input::Deleted`], [`Input::Failed`] or [`Input::Fenced`].
    Delete {
        /// ConfigMap name.
        name: String,
        /// The leading epoch the request is fenced with.
        epoch: u64,
    },
    /// The round is over.
    Done(Summary),
    /// The round failed; the next one comes after `delay`.
    Retry {
        /// The failure (for the log).
        reason: String,
        /// Failed rounds in a row.
        attempt: u32,
        /// Until the next round.
        delay: Duration,
    },
    /// The round was dropped: the leadership epoch it ran in is over.
    Dropped,
}

/// The answer of [`Planner::handle`] and [`Planner::poll`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// What to do now, in order.
    pub actions: Vec<Action>,
    /// When to poll again (`None`: only after the next input).
    pub wake: Option<At>,
}

/// A round in progress.
#[derive(Debug)]
struct Round {
    /// When it started.
    started: At,
    epoch: u64,
    /// `None` while the layout is being built.
    layout: Option<Arc<Layout>>,
    /// The next wanted object to compare (shards, then the index).
    next: usize,
    /// Stale objects already deleted (or tried) in this round.
    deleted: BTreeSet<String>,
    written: usize,
    published: bool,
}

/// The planner's state (see the module docs).
#[derive(Debug)]
pub struct Planner {
    opts: Options,
    epoch: u64,
    leading: bool,
    watch_listed: bool,
    clusters_listed: bool,
    /// Our ConfigMaps as the API server holds them.
    seen: HashMap<String, Observed>,
    /// resourceVersion of our last write per object (echo suppression).
    written_rv: HashMap<String, u64>,
    /// The newest state generation reported.
    state_gen: u64,
    layout: Option<(u64, Arc<Layout>)>,
    due: Option<At>,
    /// When the last round that sent a request started (the window of
    /// coalescing runs from it; a round that finds everything in sync
    /// delays nothing).
    last_start: Option<At>,
    attempts: u32,
    round: Option<Round>,
    /// A request was sent and not answered.
    in_flight: bool,
    actions: Vec<Action>,
}

impl Planner {
    /// A planner that leads in epoch 0 (no leader election), with neither
    /// its watch nor the clusters listed yet.
    pub fn new(opts: Options) -> Self {
        Planner {
            opts,
            epoch: 0,
            leading: true,
            watch_listed: false,
            clusters_listed: false,
            seen: HashMap::new(),
            written_rv: HashMap::new(),
            state_gen: 0,
            layout: None,
            due: None,
            last_start: None,
            attempts: 0,
            round: None,
            in_flight: false,
            actions: Vec::new(),
        }
    }

    /// `retry_min` doubling per failed round, at most `retry_max`.
    fn backoff(&self) -> Duration {
        RetryDelays::new(self.opts.retry_min, self.opts.retry_max).delay(self.attempts)
    }

    /// A round for a new state: now, or when the window of the last
    /// writing round's start ends (a burst is one round per window); an
    /// earlier due round stays, a backoff is not shortened. Without the
    /// leading edge: as [`Planner::later`].
    fn soon(&mut self, now: At) {
        if !self.opts.coalesce_leading_edge {
            self.later(now);
            return;
        }
        let at = self
            .last_start
            .map_or(now, |t| now.max(t + self.opts.coalesce_window));
        self.due = Some(match self.due {
            Some(due) if self.attempts > 0 => due,
            Some(due) => due.min(at),
            None => at,
        });
    }

    /// A round for what the watch shows of our ConfigMaps (a repair, or
    /// the echo of our own writes: every echo of a round is one round that
    /// finds everything in sync): one window from now, unless one is due
    /// already.
    fn later(&mut self, now: At) {
        self.due.get_or_insert(now + self.opts.coalesce_window);
    }

    /// Takes in what happened at `now`; returns what to do and when to poll.
    pub fn handle(&mut self, now: At, input: Input) -> Plan {
        match input {
            Input::StateChanged { generation } => {
                let built = self.layout.as_ref().is_some_and(|(g, _)| *g >= generation);
                if generation > self.state_gen && !built {
                    self.state_gen = generation;
                    self.soon(now);
                }
            }
            Input::AllClustersListed(listed) => self.clusters_listed = listed,
            Input::Leadership { epoch, leading } => {
                if (epoch, leading) != (self.epoch, self.leading) {
                    self.drop_round();
                    self.epoch = epoch;
                    self.leading = leading;
                    if leading {
                        self.due = Some(now);
                    }
                }
            }
            Input::WatchListed(objects) => {
                let mut fresh: HashMap<String, Observed> =
                    objects.into_iter().map(|o| (o.name.clone(), o)).collect();
                // Keep what we wrote when the list is older than our write.
                for (name, ours) in &self.seen {
                    if fresh
                        .get(name)
                        .is_some_and(|l| l.older_than(self.written_rv.get(name).copied()))
                    {
                        fresh.insert(name.clone(), ours.clone());
                    }
                }
                self.seen = fresh;
                self.watch_listed = true;
                self.later(now);
            }
            Input::Observed(o) => {
                if !o.older_than(self.written_rv.get(&o.name).copied()) {
                    self.seen.insert(o.name.clone(), o);
                    self.later(now);
                }
            }
            Input::Gone(o) => {
                if !o.older_than(self.written_rv.get(&o.name).copied()) {
                    self.seen.remove(&o.name);
                    self.later(now);
                }
            }
            Input::Built { generation, layout } => {
                self.state_gen = self.state_gen.max(generation);
                self.layout = Some((generation, layout.clone()));
                if let Some(r) = self.round.as_mut().filter(|r| r.layout.is_none()) {
                    r.layout = Some(layout);
                }
            }
            Input::BuildFailed(reason) => {
                if self.round.as_ref().is_some_and(|r| r.layout.is_none()) {
                    self.fail(now, reason);
                }
            }
            Input::Written(o) => {
                self.in_flight = false;
                if let Some(rv) = o.rv {
                    self.written_rv.insert(o.name.clone(), rv);
                }
                if let Some(r) = self.round.as_mut() {
                    r.written += 1;
                    r.published |= o.name == self.opts.name;
                }
                self.seen.insert(o.name.clone(), o);
            }
            Input::Deleted { name } => {
                self.in_flight = false;
                if let Some(r) = self.round.as_mut() {
                    r.written += 1;
                }
                self.seen.remove(&name);
            }
            Input::Failed(reason) => {
                self.in_flight = false;
                if self.round.is_some() {
                    self.fail(now, reason);
                }
            }
            Input::Fenced => {
                self.in_flight = false;
                self.drop_round();
            }
        }
        self.poll(now)
    }

    /// What is due at `now`, and when to poll again.
    pub fn poll(&mut self, now: At) -> Plan {
        if !self.in_flight {
            if self.round.is_none() && self.due.is_some_and(|d| d <= now) {
                self.due = None;
                self.start(now);
            }
            self.step();
        }
        let wake = if self.in_flight || self.round.is_some() {
            // An answer comes first (the round's next step needs it).
            None
        } else {
            self.due
        };
        Plan {
            actions: std::mem::take(&mut self.actions),
            wake,
        }
    }

    /// Whether a round is running.
    pub fn in_round(&self) -> bool {
        self.round.is_some()
    }

    fn start(&mut self, now: At) {
        if !self.leading || !self.watch_listed || !self.clusters_listed {
            // Not now; whatever changes that (a gained lease, a listed
            // cluster or watch) asks for a round itself.
            return;
        }
        let layout = match &self.layout {
            Some((g, l)) if *g >= self.state_gen => Some(l.clone()),
            _ => {
                self.actions.push(Action::Build);
                None
            }
        };
        self.round = Some(Round {
            started: now,
            epoch: self.epoch,
            layout,
            next: 0,
            deleted: BTreeSet::new(),
            written: 0,
            published: false,
        });
    }

    /// Sends the round's next request, or ends it.
    fn step(&mut self) {
        let Some(round) = self.round.as_mut() else {
            return;
        };
        let Some(layout) = round.layout.clone() else {
            return;
        };
        let epoch = round.epoch;
        let wanted = layout.shards.len() + 1;
        while round.next < wanted {
            let i = round.next;
            round.next += 1;
            // A shard's hash is the one the layout lists (hashing every
            // shard's text again per round would cost what the builder
            // saves); the index is small.
            let (name, key, text, want) = match layout.shards.get(i) {
                Some(s) => (&s.name, s.key.as_str(), &s.text, listed_hash(s)),
                None => (
                    &self.opts.name,
                    INDEX_KEY,
                    &layout.index,
                    hash(&layout.index),
                ),
            };
            let in_sync = self
                .seen
                .get(name.as_str())
                .is_some_and(|s| s.labelled && s.data.get(key).is_some_and(|h| *h == want));
            if !in_sync {
                self.in_flight = true;
                self.last_start = Some(round.started);
                self.actions.push(Action::Apply {
                    name: name.clone(),
                    key: key.to_string(),
                    text: text.clone(),
                    epoch,
                });
                return;
            }
        }
        // The index lists the shards; everything else labelled is stale.
        let stale = self
            .seen
            .keys()
            .filter(|n| {
                **n != self.opts.name
                    && !layout.shards.iter().any(|s| s.name == **n)
                    && !round.deleted.contains(*n)
            })
            .min()
            .cloned();
        if let Some(name) = stale {
            round.deleted.insert(name.clone());
            self.in_flight = true;
            self.last_start = Some(round.started);
            self.actions.push(Action::Delete { name, epoch });
            return;
        }
        let summary = Summary {
            version: layout.version.clone(),
            shards: layout.shards.len(),
            bytes: layout.shard_bytes(),
            services: layout.services,
            nodes: layout.nodes,
            written: round.written,
            published: round.published,
        };
        self.round = None;
        self.attempts = 0;
        self.actions.push(Action::Done(summary));
    }

    fn fail(&mut self, now: At, reason: String) {
        self.round = None;
        self.attempts += 1;
        let delay = self.backoff();
        self.due = Some(now + delay);
        self.actions.push(Action::Retry {
            reason,
            attempt: self.attempts,
            delay,
        });
    }

    /// The round's epoch is over: it sends nothing more, and is not retried
    /// until this replica leads again.
    fn drop_round(&mut self) {
        if self.round.take().is_some() {
            self.actions.push(Action::Dropped);
        }
    }
}
