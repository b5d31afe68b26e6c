//! [`Stream`]: the per-kind subscription and what the client holds, and the rules of
//! the doc that turn requests and catalog changes into responses.

use std::collections::{BTreeMap, BTreeSet};

use super::{ByteString, Catalog, Event, Interest, Kind, Request, Response, Step};
use crate::model::version::element_hash;

/// The wildcard name (the doc: "a wildcard subscription, which is triggered when
/// subscribing to the special name \"*\"", for Listener and Cluster only).
const WILDCARD: &str = "*";

/// The most resources one response carries (delta, and SotW ClusterLoadAssignment and
/// RouteConfiguration): a first response of 10,000 assignments goes out as ten, each
/// after the client answered the one before (the one-unanswered-response pacing of
/// `KindState::awaiting`), so a stream has one chunk in flight, not its whole state
/// (BENCHMARKS.md, xDS at 1,000 streams). SotW Cluster and Listener responses carry the
/// complete set, as the doc requires, and are never split.
pub const MAX_RESOURCES_PER_RESPONSE: usize = 1_000;

/// The state of one ADS stream (all kinds). Deterministic: nonces are "1", "2", ... per stream.
#[derive(Debug, Default)]
pub struct Stream {
    /// Fixed by the first request: `Some(true)` for delta.
    delta: Option<bool>,
    /// The last nonce handed out (nonces count up per stream, over all kinds).
    last_nonce: u64,
    /// Kinds the client has requested at least once.
    kinds: BTreeMap<Kind, KindState>,
    /// Clusters the last Cluster response added or changed at the client: their
    /// ClusterLoadAssignments are sent again right after it (see [`Stream::on_changes`]).
    rewarm: BTreeSet<String>,
    /// Counts the requests that changed a subscription (see
    /// [`Stream::subscription_epoch`]).
    subscription_epoch: u64,
    /// [`MAX_RESOURCES_PER_RESPONSE`] unless set (tests).
    max_resources: Option<usize>,
}

/// One kind of one stream.
#[derive(Debug, Default)]
struct KindState {
    /// Names subscribed explicitly (never "*" on a full-state kind).
    explicit: BTreeSet<String>,
    /// A wildcard subscription ("*", or the legacy empty first request).
    wildcard: bool,
    /// SotW: a request of this kind has named resources (ends the legacy wildcard rule).
    named_ever: bool,
    /// What the client holds: name -> version, as sent (ACKed or not: a NACKed version
    /// is not sent again, the next change is).
    held: Held,
    /// The nonce of the latest response of this kind.
    last_nonce: Option<String>,
    /// The latest response of this kind is not answered yet (no ACK or NACK of its
    /// nonce): catalog changes wait in `deferred` meanwhile and go out together, in their
    /// latest state, once it is. One response in flight per kind is the client's own
    /// pace: a SotW EDS ACK repeats every subscribed name, so answering each change
    /// separately costs O(names) per change per stream (BENCHMARKS.md, xDS).
    awaiting: bool,
    /// Names changed in the catalog while `awaiting`.
    deferred: BTreeSet<String>,
    /// Names to send again even if unchanged (re-warming clusters) while `awaiting`.
    deferred_forced: BTreeSet<String>,
    /// SotW: the names of the latest request, as sent. A client repeats them in the same
    /// order on every ACK, so comparing the lists (no hashing, no sets) tells an
    /// unchanged subscription in O(bytes).
    last_names: Vec<ByteString>,
}

/// What a request's nonce and error mean.
enum Reply {
    /// No nonce, or one from before any response of this kind (a reconnect).
    Fresh,
    /// The latest nonce, no error.
    Ack,
    /// The latest nonce, with this error.
    Nack(String),
    /// Not the latest nonce of its kind.
    Stale,
}

impl KindState {
    /// Whether `name` of `kind` is subscribed (explicitly, or as a member of the wildcard
    /// set).
    fn covers(&self, name: &str, catalog: &impl Catalog, kind: Kind) -> bool {
        self.explicit.contains(name) || (self.wildcard && catalog.in_wildcard(kind, name))
    }

    /// What a request's nonce and error mean; a request that answers the latest response
    /// (or starts afresh) ends `awaiting`.
    fn reply(&mut self, nonce: &str, error: Option<String>) -> Reply {
        let reply = self.classify(nonce, error);
        if !matches!(reply, Reply::Stale) {
            self.awaiting = false;
        }
        reply
    }

    fn classify(&self, nonce: &str, error: Option<String>) -> Reply {
        match &self.last_nonce {
            _ if nonce.is_empty() => Reply::Fresh,
            // A nonce on the first request of a kind comes from an earlier stream: the
            // client's first request here, answered like one (ignoring it would leave a
            // reconnecting client waiting forever).
            None => Reply::Fresh,
            Some(last) if last == nonce => match error {
                Some(detail) => Reply::Nack(detail),
                None => Reply::Ack,
            },
            Some(_) => Reply::Stale,
        }
    }
}

/// The wildcard set of `kind` when `wildcard` is on.
fn wildcard_set(catalog: &impl Catalog, kind: Kind, wildcard: bool) -> Vec<&str> {
    if wildcard {
        catalog.wildcard_names(kind)
    } else {
        Vec::new()
    }
}

/// What the client holds (name -> version), with an order-independent digest of it (the
/// wrapping sum of a 128-bit SHA-256 of each pair) kept per change, so `version_info`
/// costs O(changed), not O(held), per response: an EDS change on a stream holding
/// thousands of assignments hashes one.
#[derive(Debug, Default)]
struct Held {
    map: BTreeMap<String, String>,
    sum: u128,
}

impl std::ops::Deref for Held {
    type Target = BTreeMap<String, String>;
    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl Held {
    fn insert(&mut self, name: String, version: String) -> Option<String> {
        if let Some(old) = self.map.get(&name) {
            self.sum = self.sum.wrapping_sub(element_hash(&name, old.as_bytes()));
        }
        self.sum = self
            .sum
            .wrapping_add(element_hash(&name, version.as_bytes()));
        self.map.insert(name, version)
    }

    fn remove(&mut self, name: &str) -> Option<String> {
        let old = self.map.remove(name)?;
        self.sum = self.sum.wrapping_sub(element_hash(name, old.as_bytes()));
        Some(old)
    }

    /// Becomes `map`, hashing only what differs.
    fn replace(&mut self, map: BTreeMap<String, String>) {
        let gone: Vec<String> = self
            .map
            .keys()
            .filter(|n| !map.contains_key(*n))
            .cloned()
            .collect();
        for name in gone {
            self.remove(&name);
        }
        for (name, version) in map {
            if self.map.get(&name) != Some(&version) {
                self.insert(name, version);
            }
        }
    }

    fn retain(&mut self, keep: impl Fn(&str) -> bool) {
        let gone: Vec<String> = self.map.keys().filter(|n| !keep(n)).cloned().collect();
        for name in gone {
            self.remove(&name);
        }
    }

    /// The content hash of what the client holds: 16 hex characters of the digest. Equal
    /// content on every replica gives an equal version.
    fn version(&self) -> String {
        let mut out = format!("{:032x}", self.sum);
        out.truncate(16);
        out
    }
}

impl Stream {
    /// A new stream (no subscriptions).
    pub fn new() -> Self {
        Self::default()
    }

    /// A stream whose responses carry at most `max` resources (at least 1).
    pub fn with_max_resources(max: usize) -> Self {
        Self {
            max_resources: Some(max.max(1)),
            ..Self::default()
        }
    }

    /// The most resources one of this stream's responses carries.
    pub fn max_resources(&self) -> usize {
        self.max_resources.unwrap_or(MAX_RESOURCES_PER_RESPONSE)
    }

    /// Keeps the first [`MAX_RESOURCES_PER_RESPONSE`] of `list`; the rest is sent after
    /// the client answers this response (as names that must be sent even if unchanged).
    fn cap(&mut self, kind: Kind, list: &mut Vec<(String, String)>) {
        let max = self.max_resources();
        if list.len() <= max {
            return;
        }
        let rest = list.split_off(max);
        let ks = self.kinds.entry(kind).or_default();
        ks.deferred_forced
            .extend(rest.into_iter().map(|(name, _)| name));
    }

    /// Whether this stream speaks delta (fixed by its first request; mixing is a protocol
    /// error the server answers with an error status).
    pub fn is_delta(&self) -> Option<bool> {
        self.delta
    }

    /// Changes whenever [`Stream::interest`] may have changed (a request subscribed or
    /// unsubscribed something, or a kind's first request); an ACK or NACK that repeats
    /// the subscription leaves it alone. The server re-indexes the stream's names only
    /// when it moves: a SotW EDS ACK repeats every subscribed name.
    pub fn subscription_epoch(&self) -> u64 {
        self.subscription_epoch
    }

    /// What this stream is subscribed to, per kind.
    pub fn interest(&self, kind: Kind) -> Interest<'_> {
        match self.kinds.get(&kind) {
            Some(ks) if ks.wildcard => Interest::Wildcard,
            Some(ks) if !ks.explicit.is_empty() => {
                Interest::Names(ks.explicit.iter().map(String::as_str).collect())
            }
            _ => Interest::None,
        }
    }

    /// A request from the client.
    pub fn on_request(&mut self, req: Request, catalog: &impl Catalog) -> Step {
        let kind = req.kind();
        let delta = matches!(req, Request::Delta { .. });
        match self.delta {
            None => self.delta = Some(delta),
            Some(d) if d != delta => {
                let (got, stream) = if delta {
                    ("an incremental (delta)", "state-of-the-world")
                } else {
                    ("a state-of-the-world", "incremental (delta)")
                };
                return Step {
                    responses: Vec::new(),
                    events: vec![Event::ProtocolError {
                        kind,
                        detail: format!(
                            "{got} request for {} on a {stream} stream",
                            kind.type_url()
                        ),
                    }],
                };
            }
            Some(_) => {}
        }
        let mut step = match req {
            Request::Sotw {
                kind,
                names,
                nonce,
                error,
                ..
            } => self.sotw_request(kind, names, nonce, error, catalog),
            Request::Delta {
                kind,
                subscribe,
                unsubscribe,
                initial_versions,
                nonce,
                error,
            } => self.delta_request(
                kind,
                subscribe,
                unsubscribe,
                initial_versions,
                nonce,
                error,
                catalog,
            ),
        };
        // What changed while the previous response was unanswered goes out now (unless
        // this request's own answer is in flight again).
        if let Some(ks) = self.kinds.get_mut(&kind).filter(|ks| !ks.awaiting) {
            let names = std::mem::take(&mut ks.deferred);
            let forced = std::mem::take(&mut ks.deferred_forced);
            if !names.is_empty() || !forced.is_empty() {
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                if let Some(r) = self.change(kind, &names, &forced, catalog) {
                    step.responses.push(r);
                }
            }
        }
        // A Cluster response may call for ClusterLoadAssignments (see `on_changes`).
        if kind == Kind::Cluster {
            self.change_into(Kind::ClusterLoadAssignment, &[], catalog, &mut step);
            self.rewarm.clear();
        }
        step
    }

    /// Resources of `kind` named `names` changed in the catalog (added, updated or deleted;
    /// the catalog already holds the new state). May list names this stream does not care
    /// about (ignored). Produces at most one response per kind, holding the LATEST state
    /// (a caller that was busy passes the union of what changed meanwhile); a Cluster
    /// response may be followed by a ClusterLoadAssignment one (see [`Stream::on_changes`]).
    pub fn on_change(&mut self, kind: Kind, names: &[&str], catalog: &impl Catalog) -> Step {
        self.on_changes(&[(kind, names)], catalog)
    }

    /// Changes of several kinds at once (say a new Cluster and its ClusterLoadAssignment):
    /// like [`Stream::on_change`] per kind, the responses in [`Kind::ALL`] order whatever
    /// the order of `changes` (CDS before EDS, LDS before RDS: the doc's "make before
    /// break" sequencing).
    ///
    /// A Cluster response that adds or changes a cluster at the client is followed by that
    /// cluster's ClusterLoadAssignment (same name) when the stream subscribes to it, even
    /// unchanged: the doc, "Resource warming": "Warming of `Cluster` is completed only
    /// when a new `ClusterLoadAssignment` response is supplied by management server even
    /// though there is no change in endpoints". Without it an updated cluster stays
    /// warming until Envoy's `initial_fetch_timeout`.
    pub fn on_changes(&mut self, changes: &[(Kind, &[&str])], catalog: &impl Catalog) -> Step {
        let mut step = Step::default();
        for kind in Kind::ALL {
            let names: Vec<&str> = changes
                .iter()
                .filter(|(k, _)| *k == kind)
                .flat_map(|(_, n)| n.iter().copied())
                .collect();
            self.change_into(kind, &names, catalog, &mut step);
        }
        self.rewarm.clear();
        step
    }

    /// [`Stream::change`] of `kind` (plus, for ClusterLoadAssignment, the clusters to
    /// re-warm), its response appended to `step`.
    fn change_into(&mut self, kind: Kind, names: &[&str], catalog: &impl Catalog, step: &mut Step) {
        let forced = if kind == Kind::ClusterLoadAssignment {
            std::mem::take(&mut self.rewarm)
        } else {
            BTreeSet::new()
        };
        if names.is_empty() && forced.is_empty() {
            return;
        }
        if let Some(r) = self.change(kind, names, &forced, catalog) {
            step.responses.push(r);
        }
    }

    fn next_nonce(&mut self) -> String {
        self.last_nonce += 1;
        self.last_nonce.to_string()
    }

    /// The response to a catalog change of `kind`, if the client lacks anything (or
    /// `forced` names it must get again).
    fn change(
        &mut self,
        kind: Kind,
        names: &[&str],
        forced: &BTreeSet<String>,
        catalog: &impl Catalog,
    ) -> Option<Response> {
        let delta = self.delta?;
        let ks = self.kinds.get_mut(&kind)?;
        if ks.awaiting {
            ks.deferred.extend(names.iter().map(|n| n.to_string()));
            ks.deferred_forced.extend(forced.iter().cloned());
            return None;
        }
        let ks = &*ks;
        let mut names: BTreeSet<&str> = names.iter().copied().collect();
        names.extend(forced.iter().map(String::as_str));
        // Names the stream does not care about are ignored (no response at all).
        let relevant: Vec<&str> = names
            .into_iter()
            .filter(|n| ks.held.contains_key(*n) || ks.covers(n, catalog, kind))
            .collect();
        if relevant.is_empty() {
            return None;
        }
        if delta {
            let mut resources = Vec::new();
            let mut removed = Vec::new();
            for name in relevant {
                let have = ks.held.get(name).map(String::as_str);
                match catalog
                    .version(kind, name)
                    .filter(|_| ks.covers(name, catalog, kind))
                {
                    Some(v) if have == Some(v) && !forced.contains(name) => {}
                    Some(v) => resources.push((name.to_string(), v.to_string())),
                    // Deleted (or out of the wildcard set): the doc, "Deleting Resources":
                    // "the server signals the client that a resource should be deleted via
                    // the removed_resources field". The subscription stays.
                    None if have.is_some() => removed.push(name.to_string()),
                    None => {}
                }
            }
            self.delta_response(kind, resources, removed, false)
        } else if kind.is_full_state() {
            let wc = wildcard_set(catalog, kind, ks.wildcard);
            let world = full_state(ks, &wc, catalog, kind);
            if world == *ks.held {
                return None;
            }
            Some(self.sotw_full_response(kind, world))
        } else {
            let send: Vec<(String, String)> = relevant
                .into_iter()
                .filter_map(|n| {
                    // A deleted EDS/RDS resource sends nothing: the doc, "Deleting
                    // Resources": "for other resource types, the API provides no mechanism
                    // for the server to tell the client that resources have been deleted".
                    let v = catalog.version(kind, n)?;
                    (ks.explicit.contains(n)
                        && (forced.contains(n) || ks.held.get(n).map(String::as_str) != Some(v)))
                    .then(|| (n.to_string(), v.to_string()))
                })
                .collect();
            if send.is_empty() {
                return None;
            }
            Some(self.sotw_partial_response(kind, send))
        }
    }

    fn sotw_request(
        &mut self,
        kind: Kind,
        names: Vec<ByteString>,
        nonce: String,
        error: Option<String>,
        catalog: &impl Catalog,
    ) -> Step {
        let mut step = Step::default();
        let first = !self.kinds.contains_key(&kind);
        let ks = self.kinds.entry(kind).or_default();
        match ks.reply(&nonce, error) {
            // The doc, "Resource updates": "The management server should not send a
            // DiscoveryResponse for any DiscoveryRequest that has a stale nonce." A SotW
            // request repeats the whole subscription, so dropping it loses nothing: the
            // client answers the newer response with its current names.
            Reply::Stale => {
                step.events.push(Event::StaleNonce { kind, nonce });
                return step;
            }
            Reply::Ack => step.events.push(Event::Ack { kind, nonce }),
            Reply::Nack(detail) => step.events.push(Event::Nack {
                kind,
                nonce,
                detail,
            }),
            Reply::Fresh => {}
        }
        let full = kind.is_full_state();
        // The doc, "How the client specifies what resources to return": on Listener and
        // Cluster, "*" is the wildcard, and a kind whose requests have never named a
        // resource is treated "identically to how it would treat the client having
        // explicitly subscribed to \"*\"". Once a name was sent, an empty list means
        // "no longer interested in any resources". Elsewhere "*" is an ordinary name.
        ks.named_ever |= !names.is_empty();
        let wildcard = full && (!ks.named_ever || names.iter().any(|n| n == WILDCARD));
        // The common case, checked without building sets: an ACK or NACK repeating the
        // subscription (a SotW EDS ACK names every resource, on every response): the
        // same list as last time, or else the same set.
        if !first
            && wildcard == ks.wildcard
            && (names == ks.last_names || same_names(&names, &ks.explicit, full))
        {
            ks.last_names = names;
            return step;
        }
        let explicit: BTreeSet<String> = names
            .iter()
            .filter(|n| !(full && *n == WILDCARD))
            .map(|n| String::from(&**n))
            .collect();
        ks.last_names = names;
        let added: BTreeSet<String> = explicit.difference(&ks.explicit).cloned().collect();
        let dropped: Vec<String> = ks.explicit.difference(&explicit).cloned().collect();
        let resubscribed =
            first || !added.is_empty() || !dropped.is_empty() || ks.wildcard != wildcard;
        let was_wildcard = ks.wildcard;
        // The client forgets what it unsubscribed from. With a wildcard (before or now)
        // it cannot tell whether the wildcard covers a dropped name (nor what only a
        // dropped wildcard covered), so it keeps what it has and the next complete set
        // (full-state kinds) tells it: the SotW side of the doc's delta rule "the server
        // must send a response that includes the specific resource".
        if !was_wildcard && !wildcard {
            for name in &dropped {
                ks.held.remove(name);
            }
        }
        ks.explicit = explicit;
        ks.wildcard = wildcard;
        self.subscription_epoch += u64::from(resubscribed);
        // The doc: "When the client sends a new request that changes the set of resources
        // being requested, the server must resend any newly requested resources, even if
        // it previously sent those resources".
        // A request answers what it changed (catalog changes reach the stream through
        // on_change): an ACK or NACK of the same subscription gets no response.
        let changed = first || !added.is_empty() || !dropped.is_empty() || was_wildcard != wildcard;
        let ks = &self.kinds[&kind];
        if full {
            let wc = wildcard_set(catalog, kind, wildcard);
            let world = full_state(ks, &wc, catalog, kind);
            let due = first
                || (changed && world != *ks.held)
                || added.iter().any(|n| world.contains_key(n));
            if due {
                step.responses.push(self.sotw_full_response(kind, world));
            }
        } else {
            let send: Vec<(String, String)> = ks
                .explicit
                .iter()
                .filter(|n| first || added.contains(*n))
                .filter_map(|n| Some((n.clone(), catalog.version(kind, n)?.to_string())))
                .collect();
            // The first request of a kind is always answered, even with nothing (a client
            // initializing waits for it).
            if first || !send.is_empty() {
                step.responses.push(self.sotw_partial_response(kind, send));
            }
        }
        step
    }

    /// A full-state SotW response: `world` becomes what the client holds.
    fn sotw_full_response(&mut self, kind: Kind, world: BTreeMap<String, String>) -> Response {
        let nonce = self.next_nonce();
        let ks = self.kinds.entry(kind).or_default();
        if kind == Kind::Cluster {
            // Clusters new or changed at the client (re)warm.
            let old = &ks.held;
            self.rewarm.extend(
                world
                    .iter()
                    .filter(|(n, v)| old.get(*n) != Some(*v))
                    .map(|(n, _)| n.clone()),
            );
        }
        ks.held.replace(world);
        ks.last_nonce = Some(nonce.clone());
        ks.awaiting = true;
        Response::Sotw {
            kind,
            version_info: ks.held.version(),
            nonce,
            names: ks.held.keys().cloned().collect(),
        }
    }

    /// An EDS/RDS SotW response carrying only `send` (the client keeps the rest).
    fn sotw_partial_response(&mut self, kind: Kind, mut send: Vec<(String, String)>) -> Response {
        self.cap(kind, &mut send);
        let nonce = self.next_nonce();
        let ks = self.kinds.entry(kind).or_default();
        let mut names = Vec::with_capacity(send.len());
        for (name, version) in send {
            names.push(name.clone());
            ks.held.insert(name, version);
        }
        ks.last_nonce = Some(nonce.clone());
        ks.awaiting = true;
        Response::Sotw {
            kind,
            version_info: ks.held.version(),
            nonce,
            names,
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn delta_request(
        &mut self,
        kind: Kind,
        subscribe: Vec<String>,
        unsubscribe: Vec<String>,
        initial_versions: BTreeMap<String, String>,
        nonce: String,
        error: Option<String>,
        catalog: &impl Catalog,
    ) -> Step {
        let mut step = Step::default();
        let first = !self.kinds.contains_key(&kind);
        // Any name (un)subscribed may change the interest; an ACK names none.
        self.subscription_epoch +=
            u64::from(first || !subscribe.is_empty() || !unsubscribe.is_empty());
        let ks = self.kinds.entry(kind).or_default();
        match ks.reply(&nonce, error) {
            // The doc, "Incremental xDS": "the server must honor changes to the
            // subscription state even if the nonce is stale. The nonce may be used to
            // correlate an ack/nack with a server response, but should *not* be used to
            // reject stale requests." So only the ACK/NACK meaning is dropped.
            Reply::Stale => step.events.push(Event::StaleNonce {
                kind,
                nonce: nonce.clone(),
            }),
            Reply::Ack => step.events.push(Event::Ack {
                kind,
                nonce: nonce.clone(),
            }),
            Reply::Nack(detail) => step.events.push(Event::Nack {
                kind,
                nonce: nonce.clone(),
                detail,
            }),
            Reply::Fresh => {}
        }
        let full = kind.is_full_state();
        // Names whose state must be told even if the client seems to hold it.
        let mut forced: BTreeSet<String> = BTreeSet::new();
        let mut star = false;
        let initial = if first {
            // The doc, "How the client specifies what resources to return" (incremental
            // example): a first request with resource_names_subscribe unset is a
            // subscription to "*"; on reconnect "the request must either specify \"*\" ...
            // or (legacy behavior) the request must have no resources in both
            // resource_names_subscribe and resource_names_unsubscribe".
            ks.wildcard = full && subscribe.is_empty() && unsubscribe.is_empty();
            // "On reconnect the Incremental xDS client may tell the server of its known
            // resources to avoid resending them over the network".
            ks.held.replace(initial_versions.clone());
            initial_versions
        } else {
            // Only the first request of a kind carries initial_resource_versions.
            BTreeMap::new()
        };
        for name in subscribe {
            if full && name == WILDCARD {
                ks.wildcard = true;
                star = true;
            } else {
                // The doc, "Subscribing to Resources": names "the server believes the client
                // is already subscribed to, and furthermore has the most recent versions
                // of. However, the server *must* still provide those resources".
                ks.explicit.insert(name.clone());
                forced.insert(name);
            }
        }
        let mut dropped_star = false;
        for name in unsubscribe {
            if full && name == WILDCARD {
                dropped_star |= std::mem::take(&mut ks.wildcard);
            } else if ks.explicit.remove(&name) {
                if ks.wildcard {
                    // The doc, "Unsubscribing from Resources": with "*" and a specific
                    // name, "the server must send a response that includes the specific
                    // resource in either the removed_resources field (if it is not
                    // included in the wildcard) or in the resources field (if it *is*)".
                    forced.insert(name);
                } else {
                    // "a server does not need to send any response if a request does
                    // nothing except unsubscribe from a resource": the client forgets it.
                    forced.remove(&name);
                    ks.held.remove(&name);
                }
            }
            // Else a phantom unsubscription: "it can simply ignore" it.
        }
        if dropped_star {
            // Ambiguous in the doc: it does not say what happens to what only the wildcard
            // brought. The client knows its explicit names, so it drops the rest itself.
            let explicit = &ks.explicit;
            ks.held.retain(|n| explicit.contains(n));
        }
        let mut candidates: BTreeSet<&str> = forced.iter().map(String::as_str).collect();
        if first || star {
            candidates.extend(ks.held.keys().map(String::as_str));
            candidates.extend(ks.explicit.iter().map(String::as_str));
            candidates.extend(wildcard_set(catalog, kind, ks.wildcard));
        }
        let mut resources = Vec::new();
        let mut removed = Vec::new();
        for name in candidates {
            let have = ks.held.get(name).map(String::as_str);
            match catalog.version(kind, name) {
                Some(v) if ks.covers(name, catalog, kind) => {
                    let must = forced.contains(name) || (star && catalog.in_wildcard(kind, name));
                    // What initial_resource_versions says the client has is not sent again.
                    let known = initial.get(name).map(String::as_str) == Some(v);
                    if (must && !known) || have != Some(v) {
                        resources.push((name.to_string(), v.to_string()));
                    }
                }
                // The doc, "Knowing When a Requested Resource Does Not Exist": "When a
                // resource subscribed to by a client does not exist, the server will send a
                // DeltaDiscoveryResponse message that contains that resource's name in the
                // removed_resources field." Also what the client holds (initial versions
                // included) that is gone or no longer subscribed.
                _ if have.is_some() || forced.contains(name) => removed.push(name.to_string()),
                _ => {}
            }
        }
        if let Some(r) = self.delta_response(kind, resources, removed, first) {
            step.responses.push(r);
        }
        step
    }

    /// A delta response (`None` when there is nothing to say and `always` is off): the
    /// client holds `resources` and forgets `removed` after it.
    fn delta_response(
        &mut self,
        kind: Kind,
        mut resources: Vec<(String, String)>,
        removed: Vec<String>,
        always: bool,
    ) -> Option<Response> {
        if resources.is_empty() && removed.is_empty() && !always {
            return None;
        }
        self.cap(kind, &mut resources);
        let nonce = self.next_nonce();
        let ks = self.kinds.entry(kind).or_default();
        for (name, version) in &resources {
            let old = ks.held.insert(name.clone(), version.clone());
            // A cluster new or changed at the client (re)warms.
            if kind == Kind::Cluster && old.as_ref() != Some(version) {
                self.rewarm.insert(name.clone());
            }
        }
        for name in &removed {
            ks.held.remove(name);
        }
        ks.last_nonce = Some(nonce.clone());
        ks.awaiting = true;
        Some(Response::Delta {
            kind,
            nonce,
            system_version_info: ks.held.version(),
            resources,
            removed,
        })
    }
}

/// Whether `names` (minus "*" on a full-state kind) are exactly `explicit`.
fn same_names(names: &[ByteString], explicit: &BTreeSet<String>, full: bool) -> bool {
    let named: std::collections::HashSet<&str> = names
        .iter()
        .map(|n| &**n)
        .filter(|n| !(full && *n == WILDCARD))
        .collect();
    named.len() == explicit.len() && named.iter().all(|n| explicit.contains(*n))
}

/// The complete subscribed set of a full-state kind that exists: name -> version.
fn full_state(
    ks: &KindState,
    wc: &[&str],
    catalog: &impl Catalog,
    kind: Kind,
) -> BTreeMap<String, String> {
    wc.iter()
        .copied()
        .chain(ks.explicit.iter().map(String::as_str))
        .filter_map(|n| Some((n.to_string(), catalog.version(kind, n)?.to_string())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_scratch(map: &BTreeMap<String, String>) -> u128 {
        map.iter().fold(0u128, |s, (n, v)| {
            s.wrapping_add(element_hash(n, v.as_bytes()))
        })
    }

    proptest::proptest! {
        /// The digest kept per change equals the one of the whole map, whatever the
        /// order of inserts, removals, replacements and retains.
        #[test]
        fn held_digest_is_kept_exactly(
            ops in proptest::collection::vec((0u8..4, 0u8..6, 0u8..3), 0..60),
        ) {
            let mut held = Held::default();
            for (op, n, v) in ops {
                let name = format!("n{n}");
                match op {
                    0 => {
                        held.insert(name, format!("v{v}"));
                    }
                    1 => {
                        held.remove(&name);
                    }
                    2 => {
                        let map = (0..n).map(|i| (format!("n{i}"), format!("v{v}"))).collect();
                        held.replace(map);
                    }
                    _ => held.retain(|k| k != name),
                }
                proptest::prop_assert_eq!(held.sum, from_scratch(&held));
            }
        }
    }

    #[test]
    fn held_version_is_the_content() {
        let mut a = Held::default();
        a.insert("x".into(), "1".into());
        a.insert("y".into(), "2".into());
        let mut b = Held::default();
        b.replace(
            [("y", "2"), ("x", "1")]
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .into(),
        );
        assert_eq!(a.version(), b.version());
        b.insert("x".into(), "3".into());
        assert_ne!(a.version(), b.version());
        assert_eq!(Held::default().version(), "0000000000000000");
    }
}
