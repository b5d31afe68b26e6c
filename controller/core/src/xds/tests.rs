//! Scripted streams in, responses and events out, as readable golden files
//! (`testdata/xds/<scenario>.txt`; `UPDATE_GOLDEN=1` rewrites them). Each input is a
//! `>` line; under it the responses (`<`, JSON) in send order and the events (`!`), or
//! `-` when the input produced nothing. A proptest checks the property that matters: a
//! client applying every response ends up holding exactly the catalog's versions of
//! what it subscribed to.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use super::*;

const C: Kind = Kind::Cluster;
const E: Kind = Kind::ClusterLoadAssignment;
const L: Kind = Kind::Listener;
const R: Kind = Kind::RouteConfiguration;

/// A catalog by hand: (kind, name) -> (version, canonical); aliases are not canonical,
/// so they are not in the wildcard set.
#[derive(Default, Clone)]
struct TestCatalog {
    res: BTreeMap<(Kind, String), (String, bool)>,
}

impl Catalog for TestCatalog {
    fn version(&self, kind: Kind, name: &str) -> Option<&str> {
        self.res
            .get(&(kind, name.to_string()))
            .map(|(v, _)| v.as_str())
    }
    fn wildcard_names(&self, kind: Kind) -> Vec<&str> {
        self.res
            .iter()
            .filter(|((k, _), (_, canonical))| *k == kind && *canonical)
            .map(|((_, n), _)| n.as_str())
            .collect()
    }
}

fn strings(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

fn byte_strings(names: &[&str]) -> Vec<ByteString> {
    names.iter().map(|s| ByteString::from(*s)).collect()
}

struct Script {
    stream: Stream,
    catalog: TestCatalog,
    out: String,
    /// The latest nonce sent per kind (what a well-behaved client answers).
    last: BTreeMap<Kind, String>,
    /// Kinds whose latest response the script has not answered (ACK or NACK).
    unanswered: BTreeSet<Kind>,
    /// The names of the latest SotW request per kind (what its ACK repeats).
    sotw_names: BTreeMap<Kind, Vec<ByteString>>,
    /// [`Script::change`] first answers what is unanswered, as a client keeping up
    /// does (logged); off to script a busy client.
    auto_ack: bool,
}

impl Script {
    fn new() -> Self {
        Script {
            stream: Stream::new(),
            catalog: TestCatalog::default(),
            out: String::new(),
            last: BTreeMap::new(),
            unanswered: BTreeSet::new(),
            sotw_names: BTreeMap::new(),
            auto_ack: true,
        }
    }

    fn log(&mut self, what: &str, step: Step) -> Step {
        writeln!(self.out, "> {what}").unwrap();
        for r in &step.responses {
            self.last.insert(r.kind(), r.nonce().to_string());
            self.unanswered.insert(r.kind());
            writeln!(self.out, "  < {}", serde_json::to_string(r).unwrap()).unwrap();
        }
        for e in &step.events {
            writeln!(self.out, "  ! {}", serde_json::to_string(e).unwrap()).unwrap();
        }
        if step.responses.is_empty() && step.events.is_empty() {
            writeln!(self.out, "  -").unwrap();
        }
        step
    }

    fn note(&mut self, what: &str) {
        writeln!(self.out, "# {what}").unwrap();
    }

    fn last(&self, kind: Kind) -> String {
        self.last.get(&kind).cloned().unwrap_or_default()
    }

    /// Sets a resource in the catalog (no notification: see [`Script::change`]).
    fn set(&mut self, kind: Kind, name: &str, version: &str) {
        self.catalog
            .res
            .insert((kind, name.to_string()), (version.to_string(), true));
        writeln!(self.out, "= set {kind:?} {name} {version}").unwrap();
    }

    fn alias(&mut self, kind: Kind, name: &str, version: &str) {
        self.catalog
            .res
            .insert((kind, name.to_string()), (version.to_string(), false));
        writeln!(self.out, "= set {kind:?} {name} {version} (alias)").unwrap();
    }

    fn del(&mut self, kind: Kind, name: &str) {
        self.catalog.res.remove(&(kind, name.to_string()));
        writeln!(self.out, "= delete {kind:?} {name}").unwrap();
    }

    /// Answers (ACKs) every kind whose latest response is unanswered.
    fn catch_up(&mut self) {
        for kind in std::mem::take(&mut self.unanswered) {
            if self.stream.is_delta() == Some(true) {
                self.delta_ack(kind);
            } else {
                let names = self.sotw_names.get(&kind).cloned().unwrap_or_default();
                let names: Vec<&str> = names.iter().map(|n| &**n).collect();
                self.sotw(kind, &names);
            }
        }
    }

    fn change(&mut self, kind: Kind, names: &[&str]) -> Step {
        if self.auto_ack {
            self.catch_up();
        }
        let step = self.stream.on_change(kind, names, &self.catalog);
        self.log(&format!("on_change {kind:?} {names:?}"), step)
    }

    fn changes(&mut self, changes: &[(Kind, &[&str])]) -> Step {
        if self.auto_ack {
            self.catch_up();
        }
        let step = self.stream.on_changes(changes, &self.catalog);
        self.log(&format!("on_changes {changes:?}"), step)
    }

    fn request(&mut self, req: Request) -> Step {
        let (kind, nonce) = match &req {
            Request::Sotw {
                kind, names, nonce, ..
            } => {
                self.sotw_names.insert(*kind, names.clone());
                (*kind, nonce)
            }
            Request::Delta { kind, nonce, .. } => (*kind, nonce),
        };
        if nonce.is_empty() || *nonce == self.last(kind) {
            self.unanswered.remove(&kind);
        }
        let what = serde_json::to_string(&req).unwrap();
        let step = self.stream.on_request(req, &self.catalog);
        self.log(&what, step)
    }

    fn sotw_with(&mut self, kind: Kind, names: &[&str], nonce: &str, error: Option<&str>) -> Step {
        self.request(Request::Sotw {
            kind,
            version_info: String::new(),
            names: byte_strings(names),
            nonce: nonce.to_string(),
            error: error.map(str::to_string),
        })
    }

    /// A SotW request answering the latest response of `kind` (ACK).
    fn sotw(&mut self, kind: Kind, names: &[&str]) -> Step {
        let n = self.last(kind);
        self.sotw_with(kind, names, &n, None)
    }

    fn sotw_nack(&mut self, kind: Kind, names: &[&str], detail: &str) -> Step {
        let n = self.last(kind);
        self.sotw_with(kind, names, &n, Some(detail))
    }

    fn delta_with(
        &mut self,
        kind: Kind,
        subscribe: &[&str],
        unsubscribe: &[&str],
        initial: &[(&str, &str)],
        nonce: &str,
        error: Option<&str>,
    ) -> Step {
        self.request(Request::Delta {
            kind,
            subscribe: strings(subscribe),
            unsubscribe: strings(unsubscribe),
            initial_versions: initial
                .iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            nonce: nonce.to_string(),
            error: error.map(str::to_string),
        })
    }

    /// A spontaneous delta request (no nonce).
    fn delta(&mut self, kind: Kind, subscribe: &[&str], unsubscribe: &[&str]) -> Step {
        self.delta_with(kind, subscribe, unsubscribe, &[], "", None)
    }

    fn delta_ack(&mut self, kind: Kind) -> Step {
        let n = self.last(kind);
        self.delta_with(kind, &[], &[], &[], &n, None)
    }

    fn delta_nack(&mut self, kind: Kind, detail: &str) -> Step {
        let n = self.last(kind);
        self.delta_with(kind, &[], &[], &[], &n, Some(detail))
    }

    fn golden(&self, scenario: &str) {
        crate::golden::check("xds", scenario, &self.out);
    }
}

fn names_of(step: &Step) -> Vec<Vec<String>> {
    step.responses
        .iter()
        .map(|r| match r {
            Response::Sotw { names, .. } => names.clone(),
            Response::Delta { resources, .. } => resources.iter().map(|(n, _)| n.clone()).collect(),
        })
        .collect()
}

/// The server re-indexes a stream's names only when the epoch moves: it must move on
/// every change of the interest, and not on an ACK or NACK that repeats it (a SotW EDS
/// ACK repeats every name: re-indexing 10,000 names per ACK was the cost).
#[test]
fn subscription_epoch_moves_with_the_interest_only() {
    let mut s = Script::new();
    s.set(C, "a", "c1");
    s.set(E, "a", "e1");
    s.set(E, "b", "e2");
    let mut epoch = s.stream.subscription_epoch();
    let mut moved = |s: &Script, what: &str, expect: bool| {
        let now = s.stream.subscription_epoch();
        assert_eq!(now != epoch, expect, "{what}: epoch {epoch} -> {now}");
        epoch = now;
    };
    s.sotw(C, &[]);
    moved(&s, "first CDS request (wildcard)", true);
    s.sotw(C, &[]);
    moved(&s, "CDS ACK", false);
    s.sotw(E, &["a"]);
    moved(&s, "first EDS request", true);
    s.sotw(E, &["a"]);
    moved(&s, "EDS ACK with the same name", false);
    s.sotw_nack(E, &["a"], "bad");
    moved(&s, "EDS NACK with the same name", false);
    s.sotw(E, &["a", "b"]);
    moved(&s, "EDS ACK adding a name", true);
    s.sotw(E, &["b"]);
    moved(&s, "EDS ACK dropping a name", true);
    s.sotw(C, &["a"]);
    moved(&s, "CDS from wildcard to a name", true);
    s.sotw(C, &["a", "*"]);
    moved(&s, "CDS wildcard again", true);

    let mut d = Script::new();
    d.set(E, "a", "e1");
    let mut epoch = d.stream.subscription_epoch();
    let mut moved = |d: &Script, what: &str, expect: bool| {
        let now = d.stream.subscription_epoch();
        assert_eq!(now != epoch, expect, "{what}: epoch {epoch} -> {now}");
        epoch = now;
    };
    d.delta(E, &["a"], &[]);
    moved(&d, "first delta EDS request", true);
    d.delta_ack(E);
    moved(&d, "delta ACK", false);
    d.delta_nack(E, "bad");
    moved(&d, "delta NACK", false);
    d.delta(E, &["b"], &[]);
    moved(&d, "delta subscribe", true);
    d.delta(E, &[], &["a"]);
    moved(&d, "delta unsubscribe", true);
    d.delta(C, &[], &[]);
    moved(&d, "first delta CDS request (wildcard)", true);
    // Whatever moved it, the interest is what the requests said.
    assert!(matches!(d.stream.interest(E), Interest::Names(n) if n == ["b"]));
    assert!(matches!(d.stream.interest(C), Interest::Wildcard));
}

#[test]
fn nonces_are_fresh_per_response_and_acks_get_no_response_sotw() {
    let mut s = Script::new();
    s.set(C, "a", "c1");
    s.set(E, "a", "e1");
    let r = s.sotw(C, &[]);
    assert_eq!(r.responses[0].nonce(), "1");
    let r = s.sotw(E, &["a"]);
    assert_eq!(r.responses[0].nonce(), "2");
    let r = s.sotw(C, &[]);
    assert!(r.responses.is_empty(), "an ACK gets no response: {r:?}");
    assert_eq!(
        r.events,
        [Event::Ack {
            kind: C,
            nonce: "1".into()
        }]
    );
    s.set(C, "a", "c2");
    s.note("an ACK while a change is on its way to on_change: still no response");
    let r = s.sotw(C, &[]);
    assert!(r.responses.is_empty(), "{r:?}");
    let r = s.change(C, &["a"]);
    assert_eq!(r.responses[0].nonce(), "3");
    s.sotw(C, &[]);
    s.sotw(E, &["a"]);
    s.note("an ACK that also names a new resource: it is sent");
    s.set(E, "b", "e1");
    let r = s.sotw(E, &["a", "b"]);
    assert!(matches!(&r.events[..], [Event::Ack { .. }]));
    assert_eq!(names_of(&r), [["b"]]);
    s.golden("nonces_sotw");
}

#[test]
fn nonces_are_fresh_per_response_and_acks_get_no_response_delta() {
    let mut s = Script::new();
    s.set(C, "a", "c1");
    s.set(E, "a", "e1");
    let r = s.delta(C, &[], &[]);
    assert_eq!(r.responses[0].nonce(), "1");
    let r = s.delta(E, &["a"], &[]);
    assert_eq!(r.responses[0].nonce(), "2");
    let r = s.delta_ack(C);
    assert!(r.responses.is_empty(), "an ACK gets no response: {r:?}");
    assert_eq!(
        r.events,
        [Event::Ack {
            kind: C,
            nonce: "1".into()
        }]
    );
    s.set(C, "a", "c2");
    let r = s.change(C, &["a"]);
    assert_eq!(r.responses[0].nonce(), "3");
    s.delta_ack(C);
    s.delta_ack(E);
    s.note("an ACK that also subscribes: the new name is sent");
    s.set(E, "b", "e1");
    let n = s.last(E);
    let r = s.delta_with(E, &["b"], &[], &[], &n, None);
    assert_eq!(r.events, [Event::Ack { kind: E, nonce: n }]);
    assert_eq!(names_of(&r), [["b"]]);
    s.golden("nonces_delta");
}

#[test]
fn stale_nonce_sotw_drops_the_request() {
    let mut s = Script::new();
    s.set(E, "a", "e1");
    s.set(E, "b", "e1");
    s.sotw(E, &["a"]);
    s.set(E, "a", "e2");
    s.change(E, &["a"]);
    s.note("the client had not seen nonce 2 when it asked for b: stale, no response");
    let r = s.sotw_with(E, &["a", "b"], "1", None);
    assert!(r.responses.is_empty(), "{r:?}");
    assert_eq!(
        r.events,
        [Event::StaleNonce {
            kind: E,
            nonce: "1".into()
        }]
    );
    s.note("it answers nonce 2 with its current names: b is sent now");
    let r = s.sotw(E, &["a", "b"]);
    assert_eq!(names_of(&r), [["b"]]);
    s.golden("stale_nonce_sotw");
}

#[test]
fn stale_nonce_delta_still_changes_the_subscription() {
    let mut s = Script::new();
    s.set(E, "a", "e1");
    s.set(E, "b", "e1");
    s.delta(E, &["a"], &[]);
    s.set(E, "a", "e2");
    s.change(E, &["a"]);
    s.note("a stale nonce: not an ACK, but the subscription to b is honored");
    let r = s.delta_with(E, &["b"], &[], &[], "1", None);
    assert_eq!(
        r.events,
        [Event::StaleNonce {
            kind: E,
            nonce: "1".into()
        }]
    );
    assert_eq!(names_of(&r), [["b"]]);
    s.golden("stale_nonce_delta");
}

#[test]
fn ack_with_new_names_sends_only_them_sotw() {
    let mut s = Script::new();
    s.set(E, "a", "e1");
    s.set(E, "b", "e1");
    s.sotw(E, &["a"]);
    let r = s.sotw(E, &["a", "b"]);
    assert_eq!(r.events.len(), 1);
    assert_eq!(names_of(&r), [["b"]]);
    s.note("unsubscribing b: nothing to send");
    let r = s.sotw(E, &["a"]);
    assert!(r.responses.is_empty());
    s.note("subscribing b again: it must be resent (the doc: newly requested resources)");
    let r = s.sotw(E, &["a", "b"]);
    assert_eq!(names_of(&r), [["b"]]);
    s.golden("ack_new_names_sotw");
}

#[test]
fn nack_then_good_update_sotw() {
    let mut s = Script::new();
    s.set(C, "a", "c1");
    s.sotw(C, &[]);
    s.set(C, "a", "bad");
    s.change(C, &["a"]);
    let r = s.sotw_nack(C, &[], "cluster a: invalid");
    assert!(
        r.responses.is_empty(),
        "the same content is not sent again: {r:?}"
    );
    assert!(
        matches!(&r.events[..], [Event::Nack { detail, .. }] if detail == "cluster a: invalid")
    );
    s.note("a no-op change: still nothing");
    let r = s.change(C, &["a"]);
    assert!(r.responses.is_empty());
    s.set(C, "a", "c3");
    let r = s.change(C, &["a"]);
    assert_eq!(names_of(&r), [["a"]]);
    s.sotw(C, &[]);
    s.golden("nack_then_update_sotw");
}

#[test]
fn nack_then_good_update_delta() {
    let mut s = Script::new();
    s.set(E, "a", "e1");
    s.delta(E, &["a"], &[]);
    s.set(E, "a", "bad");
    s.change(E, &["a"]);
    let r = s.delta_nack(E, "endpoint a: invalid");
    assert!(
        r.responses.is_empty(),
        "the same content is not sent again: {r:?}"
    );
    assert!(matches!(&r.events[..], [Event::Nack { .. }]));
    s.set(E, "a", "e3");
    let r = s.change(E, &["a"]);
    assert_eq!(names_of(&r), [["a"]]);
    s.delta_ack(E);
    s.golden("nack_then_update_delta");
}

#[test]
fn empty_wildcard_is_answered_sotw() {
    let mut s = Script::new();
    let r = s.sotw(C, &[]);
    assert_eq!(
        names_of(&r),
        [Vec::<String>::new()],
        "zero clusters, but answered"
    );
    let r = s.sotw(L, &[]);
    assert_eq!(r.responses.len(), 1);
    s.note("EDS: a first request for names that do not exist is answered too");
    let r = s.sotw(E, &["x"]);
    assert_eq!(names_of(&r), [Vec::<String>::new()]);
    s.golden("empty_wildcard_sotw");
}

#[test]
fn empty_wildcard_is_answered_delta() {
    let mut s = Script::new();
    let r = s.delta(C, &[], &[]);
    assert_eq!(r.responses.len(), 1, "zero clusters, but answered");
    let r = s.delta(L, &["*"], &[]);
    assert_eq!(r.responses.len(), 1);
    s.golden("empty_wildcard_delta");
}

#[test]
fn wildcard_and_names_sotw() {
    let mut s = Script::new();
    s.set(C, "a", "c1");
    s.alias(C, "alias-a", "c1");
    s.sotw(C, &[]);
    assert_eq!(s.stream.interest(C), Interest::Wildcard);
    s.set(C, "b", "c1");
    let r = s.change(C, &["b"]);
    assert_eq!(names_of(&r), [["a", "b"]], "the complete set");
    s.note("\"*\" and an alias: wildcard kept, the alias added");
    let r = s.sotw(C, &["*", "alias-a"]);
    assert_eq!(names_of(&r), [["a", "alias-a", "b"]]);
    assert_eq!(s.stream.interest(C), Interest::Wildcard);
    s.note("naming a resource the wildcard already sent: resent (the doc: newly requested)");
    let r = s.sotw(C, &["*", "alias-a", "a"]);
    assert_eq!(names_of(&r), [["a", "alias-a", "b"]]);
    s.note("dropping the alias, wildcard kept: the client cannot tell if \"*\" covers it: told");
    let r = s.sotw(C, &["*", "a"]);
    assert_eq!(names_of(&r), [["a", "b"]]);
    s.note("only the alias: the wildcard is dropped, the complete set shrinks");
    let r = s.sotw(C, &["alias-a"]);
    assert_eq!(names_of(&r), [["alias-a"]]);
    assert_eq!(s.stream.interest(C), Interest::Names(vec!["alias-a"]));
    s.note("a change outside the subscription: nothing");
    s.set(C, "b", "c2");
    let r = s.change(C, &["b"]);
    assert!(r.responses.is_empty());
    s.note("empty after names: unsubscribed from everything, not wildcard (the doc)");
    let r = s.sotw(C, &[]);
    assert!(r.responses.is_empty());
    assert_eq!(s.stream.interest(C), Interest::None);
    let r = s.change(C, &["a", "b"]);
    assert!(r.responses.is_empty());
    s.golden("wildcard_sotw");
}

#[test]
fn wildcard_and_names_delta() {
    let mut s = Script::new();
    s.set(C, "a", "c1");
    s.alias(C, "alias-a", "c1");
    s.delta(C, &[], &[]);
    assert_eq!(s.stream.interest(C), Interest::Wildcard);
    s.note("an ACK with an empty subscribe does not change anything");
    s.delta_ack(C);
    s.set(C, "b", "c1");
    let r = s.change(C, &["b"]);
    assert_eq!(names_of(&r), [["b"]], "only what changed");
    s.note("an alias on top of the wildcard");
    let r = s.delta(C, &["alias-a"], &[]);
    assert_eq!(names_of(&r), [["alias-a"]]);
    s.note("unsubscribing a name the wildcard does not cover: told removed (the doc)");
    let r = s.delta(C, &[], &["alias-a"]);
    assert!(
        matches!(&r.responses[..], [Response::Delta { removed, .. }] if removed == &["alias-a"])
    );
    s.note("subscribing a name the wildcard covers, then unsubscribing it: told it stays");
    s.delta(C, &["a"], &[]);
    let r = s.delta(C, &[], &["a"]);
    assert_eq!(names_of(&r), [["a"]]);
    s.note("unsubscribing \"*\": no response, no more pushes");
    let r = s.delta(C, &[], &["*"]);
    assert!(r.responses.is_empty());
    assert_eq!(s.stream.interest(C), Interest::None);
    s.set(C, "b", "c2");
    let r = s.change(C, &["a", "b"]);
    assert!(r.responses.is_empty());
    s.golden("wildcard_delta");
}

#[test]
fn name_subscribed_before_it_exists_sotw() {
    let mut s = Script::new();
    s.sotw(E, &["a"]);
    s.sotw(C, &["a"]);
    s.set(C, "a", "c1");
    s.set(E, "a", "e1");
    let r = s.changes(&[(E, &["a"]), (C, &["a"])]);
    assert_eq!(names_of(&r), [["a"], ["a"]]);
    assert_eq!(r.responses[0].kind(), C, "CDS first");
    s.golden("before_it_exists_sotw");
}

#[test]
fn name_subscribed_before_it_exists_delta() {
    let mut s = Script::new();
    let r = s.delta(E, &["a"], &[]);
    assert!(
        matches!(&r.responses[..], [Response::Delta { removed, resources, .. }] if removed == &["a"] && resources.is_empty()),
        "does not exist: {r:?}"
    );
    s.set(E, "a", "e1");
    let r = s.change(E, &["a"]);
    assert_eq!(names_of(&r), [["a"]]);
    s.golden("before_it_exists_delta");
}

#[test]
fn full_state_and_partial_kinds_sotw() {
    let mut s = Script::new();
    for n in ["a", "b"] {
        s.set(C, n, "c1");
        s.set(E, n, "e1");
        s.set(L, n, "l1");
        s.set(R, n, "r1");
    }
    s.sotw(C, &["a", "b"]);
    s.sotw(E, &["a", "b"]);
    s.sotw(L, &[]);
    s.sotw(R, &["a", "b"]);
    s.set(C, "a", "c2");
    s.set(E, "a", "e2");
    let r = s.change(C, &["a"]);
    assert_eq!(
        names_of(&r),
        [vec!["a", "b"], vec!["a"]],
        "CDS: the complete set, then EDS a (cluster a re-warms)"
    );
    let r = s.change(E, &["a"]);
    assert!(
        r.responses.is_empty(),
        "EDS a went out at its latest version"
    );
    s.set(E, "b", "e2");
    let r = s.change(E, &["b"]);
    assert_eq!(names_of(&r), [["b"]], "EDS: what changed");
    s.note("deleted: CDS/LDS omit it; EDS/RDS send nothing (the doc: no mechanism)");
    s.del(C, "b");
    s.del(E, "b");
    s.del(L, "b");
    s.del(R, "b");
    let r = s.changes(&[(R, &["b"]), (L, &["b"]), (E, &["b"]), (C, &["b"])]);
    assert_eq!(names_of(&r), [vec!["a"], vec!["a"]]);
    assert_eq!(r.responses[0].kind(), C);
    assert_eq!(r.responses[1].kind(), L);
    s.note("b comes back: pushed again");
    s.set(C, "b", "c1");
    s.set(E, "b", "e9");
    let r = s.changes(&[(E, &["b"]), (C, &["b"])]);
    assert_eq!(names_of(&r), [vec!["a", "b"], vec!["b"]]);
    s.golden("full_state_sotw");
}

#[test]
fn deleted_keeps_subscription_and_unsubscribe_stops_delta() {
    let mut s = Script::new();
    s.set(E, "a", "e1");
    s.set(E, "b", "e1");
    s.delta(E, &["a", "b"], &[]);
    s.del(E, "a");
    let r = s.change(E, &["a"]);
    assert!(matches!(&r.responses[..], [Response::Delta { removed, .. }] if removed == &["a"]));
    assert_eq!(s.stream.interest(E), Interest::Names(vec!["a", "b"]));
    s.set(E, "a", "e1");
    let r = s.change(E, &["a"]);
    assert_eq!(
        names_of(&r),
        [["a"]],
        "pushed again, even at the old version"
    );
    s.note("unsubscribe: no response, and no more pushes of b");
    let r = s.delta(E, &[], &["b"]);
    assert!(r.responses.is_empty());
    s.set(E, "b", "e2");
    let r = s.change(E, &["b"]);
    assert!(r.responses.is_empty());
    s.note("a phantom unsubscription is ignored");
    let r = s.delta(E, &[], &["zzz"]);
    assert!(r.responses.is_empty());
    s.note("resubscribing a name the client holds: sent anyway (the doc)");
    let r = s.delta(E, &["a"], &[]);
    assert_eq!(names_of(&r), [["a"]]);
    s.golden("removed_and_unsubscribe_delta");
}

#[test]
fn reconnect_with_initial_versions_delta() {
    let mut s = Script::new();
    s.set(C, "a", "c1");
    s.set(C, "b", "c2");
    s.set(C, "c", "c1");
    s.set(E, "a", "e1");
    s.set(E, "b", "e2");
    s.note("wildcard: a is current, b is old, gone is gone, c is new");
    let r = s.delta_with(
        C,
        &["*"],
        &[],
        &[("a", "c1"), ("b", "c1"), ("gone", "c1")],
        "",
        None,
    );
    assert!(
        matches!(&r.responses[..], [Response::Delta { resources, removed, .. }]
        if resources == &[("b".to_string(), "c2".to_string()), ("c".to_string(), "c1".to_string())]
            && removed == &["gone"])
    );
    s.note("explicit: same rules");
    let r = s.delta_with(
        E,
        &["a", "b", "gone"],
        &[],
        &[("a", "e1"), ("b", "e1"), ("gone", "e1")],
        "",
        None,
    );
    assert!(
        matches!(&r.responses[..], [Response::Delta { resources, removed, .. }]
        if resources == &[("b".to_string(), "e2".to_string())] && removed == &["gone"])
    );
    s.note("legacy wildcard (empty subscribe) with everything current: an empty answer");
    let mut t = Script::new();
    t.set(C, "a", "c1");
    let r = t.delta_with(C, &[], &[], &[("a", "c1")], "", None);
    assert_eq!(names_of(&r), [Vec::<String>::new()]);
    s.out.push_str(&t.out);
    s.golden("initial_versions_delta");
}

#[test]
fn coalesced_changes_send_the_latest_once() {
    for delta in [false, true] {
        let mut s = Script::new();
        s.set(E, "a", "e1");
        s.set(E, "b", "e1");
        if delta {
            s.delta(E, &["a", "b"], &[]);
        } else {
            s.sotw(E, &["a", "b"]);
        }
        s.note("a changed twice, c (not subscribed) once, while the client was busy");
        s.set(E, "a", "e2");
        s.set(E, "a", "e3");
        s.set(E, "c", "e1");
        let r = s.change(E, &["a", "c", "a"]);
        assert_eq!(names_of(&r), [["a"]]);
        s.note("only names the stream does not care about: nothing");
        let r = s.change(E, &["c", "d"]);
        assert!(r.responses.is_empty());
        s.note("a no-op change: nothing");
        let r = s.change(E, &["a", "b"]);
        assert!(r.responses.is_empty());
        s.note("a change back to what the client holds, coalesced: nothing");
        s.set(E, "b", "e2");
        s.set(E, "b", "e1");
        let r = s.change(E, &["b"]);
        assert!(r.responses.is_empty());
        s.golden(if delta {
            "coalesced_delta"
        } else {
            "coalesced_sotw"
        });
    }
}

#[test]
fn ordering_cds_before_eds_lds_before_rds() {
    for delta in [false, true] {
        let mut s = Script::new();
        for k in [C, L] {
            if delta {
                s.delta(k, &[], &[]);
            } else {
                s.sotw(k, &[]);
            }
        }
        for k in [E, R] {
            if delta {
                s.delta(k, &["x"], &[]);
            } else {
                s.sotw(k, &["x"]);
            }
        }
        for k in Kind::ALL {
            s.set(k, "x", "v1");
        }
        let r = s.changes(&[(R, &["x"]), (E, &["x"]), (L, &["x"]), (C, &["x"])]);
        let kinds: Vec<Kind> = r.responses.iter().map(Response::kind).collect();
        assert_eq!(kinds, Kind::ALL);
        s.golden(if delta {
            "ordering_delta"
        } else {
            "ordering_sotw"
        });
    }
}

#[test]
fn cluster_update_rewarms_its_assignment() {
    for delta in [false, true] {
        let mut s = Script::new();
        s.set(C, "c", "c1");
        s.set(C, "d", "c1");
        s.set(E, "c", "e1");
        s.set(E, "d", "e1");
        if delta {
            s.delta(C, &[], &[]);
            s.delta(E, &["c", "d"], &[]);
        } else {
            s.sotw(C, &[]);
            s.sotw(E, &["c", "d"]);
        }
        s.note("cluster c changes, its endpoints do not: EDS c is sent again after CDS");
        s.set(C, "c", "c2");
        let r = s.change(C, &["c"]);
        let kinds: Vec<Kind> = r.responses.iter().map(Response::kind).collect();
        assert_eq!(kinds, [C, E]);
        assert_eq!(names_of(&r)[1], ["c"]);
        s.note("cluster d is not touched: its endpoints are not sent");
        s.note("both change at once: one CDS, one EDS");
        s.set(C, "c", "c3");
        s.set(E, "c", "e2");
        let r = s.changes(&[(E, &["c"]), (C, &["c"])]);
        let cds = if delta { vec!["c"] } else { vec!["c", "d"] };
        assert_eq!(names_of(&r), [cds, vec!["c"]]);
        s.note("a no-op cluster change: nothing at all");
        let r = s.change(C, &["c"]);
        assert!(r.responses.is_empty());
        s.golden(if delta { "rewarm_delta" } else { "rewarm_sotw" });
    }
}

#[test]
fn mixing_variants_is_a_protocol_error() {
    let mut s = Script::new();
    s.set(C, "a", "c1");
    s.sotw(C, &[]);
    assert_eq!(s.stream.is_delta(), Some(false));
    let r = s.delta(E, &["a"], &[]);
    assert!(matches!(
        &r.events[..],
        [Event::ProtocolError { kind: E, .. }]
    ));
    assert!(r.responses.is_empty());
    assert_eq!(s.stream.interest(E), Interest::None, "nothing changed");
    let mut t = Script::new();
    t.delta(C, &[], &[]);
    assert_eq!(t.stream.is_delta(), Some(true));
    let r = t.sotw(C, &["a"]);
    assert!(matches!(
        &r.events[..],
        [Event::ProtocolError { kind: C, .. }]
    ));
    assert_eq!(t.stream.interest(C), Interest::Wildcard, "nothing changed");
    s.out.push_str(&t.out);
    s.golden("protocol_error");
}

#[test]
fn interest_follows_the_subscriptions() {
    let cat = TestCatalog::default();
    let mut st = Stream::new();
    assert_eq!(st.is_delta(), None);
    for k in Kind::ALL {
        assert_eq!(st.interest(k), Interest::None);
    }
    let req = |kind, names: &[&str]| Request::Sotw {
        kind,
        version_info: String::new(),
        names: byte_strings(names),
        nonce: String::new(),
        error: None,
    };
    st.on_request(req(C, &[]), &cat);
    st.on_request(req(E, &["b", "a"]), &cat);
    st.on_request(req(L, &["l"]), &cat);
    st.on_request(req(R, &[]), &cat);
    assert_eq!(st.interest(C), Interest::Wildcard);
    assert_eq!(st.interest(E), Interest::Names(vec!["a", "b"]));
    assert_eq!(st.interest(L), Interest::Names(vec!["l"]));
    assert_eq!(
        st.interest(R),
        Interest::None,
        "an empty RDS list is no interest"
    );
}

#[test]
fn type_urls_round_trip() {
    for k in Kind::ALL {
        assert_eq!(Kind::from_type_url(k.type_url()), Some(k));
    }
    assert_eq!(
        Kind::from_type_url("type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.Secret"),
        None
    );
    assert!(C.is_full_state() && L.is_full_state());
    assert!(!E.is_full_state() && !R.is_full_state());
}

#[test]
fn version_info_is_a_content_hash() {
    let run = |order: &[&str]| {
        let mut s = Script::new();
        for n in order {
            s.set(C, n, "c1");
        }
        match &s.sotw(C, &[]).responses[0] {
            Response::Sotw { version_info, .. } => version_info.clone(),
            r => panic!("{r:?}"),
        }
    };
    let v = run(&["a", "b"]);
    assert_eq!(v, run(&["b", "a"]), "the same content, the same version");
    assert_ne!(v, run(&["a"]));
    assert_eq!(v.len(), 16);
}

/// One step of a generated script, on the kind `.0` selects (Cluster or
/// ClusterLoadAssignment).
#[derive(Debug, Clone)]
enum Op {
    Set(usize, u8),
    Del(usize),
    /// Tell the stream about these names of both kinds (a busy server's union).
    Notify(Vec<usize>),
    Sub(usize),
    Unsub(usize),
    SubStar,
    UnsubStar,
    /// A new stream: the client resubscribes every kind (delta: with its versions as
    /// initial_resource_versions; SotW: with the nonce of the old stream).
    Reconnect,
}

/// A resource pool: "alias-a" is an alias (not in the wildcard set).
const POOL: [&str; 5] = ["a", "b", "c", "d", "alias-a"];
const KINDS: [Kind; 2] = [C, E];

fn op() -> impl proptest::strategy::Strategy<Value = (usize, Op)> {
    use proptest::prelude::*;
    let op = prop_oneof![
        (0..POOL.len(), 0u8..3).prop_map(|(n, v)| Op::Set(n, v)),
        (0..POOL.len()).prop_map(Op::Del),
        proptest::collection::vec(0..POOL.len(), 1..4).prop_map(Op::Notify),
        (0..POOL.len()).prop_map(Op::Sub),
        (0..POOL.len()).prop_map(Op::Unsub),
        Just(Op::SubStar),
        Just(Op::UnsubStar),
        Just(Op::Reconnect),
    ];
    (0..KINDS.len(), op)
}

/// Applies a catalog step of the script; the changed name becomes pending.
fn edit(cat: &mut TestCatalog, kind: Kind, op: &Op, pending: &mut BTreeSet<(Kind, &str)>) {
    match *op {
        Op::Set(n, v) => {
            let canonical = !POOL[n].starts_with("alias");
            cat.res
                .insert((kind, POOL[n].to_string()), (format!("v{v}"), canonical));
            pending.insert((kind, POOL[n]));
        }
        Op::Del(n) => {
            cat.res.remove(&(kind, POOL[n].to_string()));
            pending.insert((kind, POOL[n]));
        }
        _ => {}
    }
}

/// Tells the stream about the pending changes among `ns` (all when `None`), both kinds
/// in one call.
fn notify(
    st: &mut Stream,
    cat: &TestCatalog,
    pending: &mut BTreeSet<(Kind, &str)>,
    ns: Option<&[usize]>,
) -> Step {
    let mut by_kind: Vec<(Kind, Vec<&str>)> = Vec::new();
    for kind in KINDS {
        let names: Vec<&str> = POOL
            .iter()
            .enumerate()
            .filter(|(i, _)| ns.is_none_or(|ns| ns.contains(i)))
            .map(|(_, n)| *n)
            .filter(|n| pending.remove(&(kind, *n)))
            .collect();
        by_kind.push((kind, names));
    }
    let changes: Vec<(Kind, &[&str])> = by_kind.iter().map(|(k, n)| (*k, &n[..])).collect();
    st.on_changes(&changes, cat)
}

/// What a client subscribed to should hold: the catalog's versions.
fn want(
    cat: &TestCatalog,
    kind: Kind,
    explicit: &BTreeSet<String>,
    wildcard: bool,
) -> BTreeMap<String, String> {
    POOL.iter()
        .filter(|n| explicit.contains(**n) || (wildcard && !n.starts_with("alias")))
        .filter_map(|n| Some((n.to_string(), cat.version(kind, n)?.to_string())))
        .collect()
}

/// A delta client of one kind: applies responses, answers each with an ACK.
#[derive(Default)]
struct Client {
    held: BTreeMap<String, String>,
    explicit: BTreeSet<String>,
    wildcard: bool,
}

type Checked<T> = Result<T, proptest::test_runner::TestCaseError>;

/// Hands each response of `step` to `answer` (the client applies it and answers; the
/// step of its answer is returned), then each response those answers draw, until
/// quiet. An answer draws no response, unless the stream splits answers smaller than
/// the pool (then the next chunk). No response carries more than the cap, except SotW
/// full-state ones.
fn settle(
    st: &mut Stream,
    step: Step,
    mut answer: impl FnMut(&mut Stream, &Response) -> Checked<Step>,
) -> Checked<()> {
    let max = st.max_resources();
    let mut queue: std::collections::VecDeque<Response> = step.responses.into();
    let mut answered = 0;
    while let Some(r) = queue.pop_front() {
        answered += 1;
        proptest::prop_assert!(answered < 100, "no end of responses: {:?}", r);
        let carried = match &r {
            Response::Delta { resources, .. } => resources.len(),
            Response::Sotw { kind, .. } if kind.is_full_state() => 0,
            Response::Sotw { names, .. } => names.len(),
        };
        proptest::prop_assert!(carried <= max, "over the cap: {:?}", r);
        let step = answer(st, &r)?;
        proptest::prop_assert!(
            max < POOL.len() || step.responses.is_empty(),
            "an ACK: {:?}",
            step
        );
        queue.extend(step.responses);
    }
    Ok(())
}

/// Applies `step` to the delta clients and ACKs every response, until quiet (see
/// [`settle`]).
fn delta_settle(
    st: &mut Stream,
    cat: &TestCatalog,
    clients: &mut BTreeMap<Kind, Client>,
    step: Step,
) -> Checked<()> {
    settle(st, step, |st, r| {
        let Response::Delta {
            kind,
            resources,
            removed,
            nonce,
            ..
        } = r
        else {
            panic!("{r:?}");
        };
        // The doc, "Duplicate Resource Names": never the same name twice in a response.
        let mut seen = BTreeSet::new();
        for name in resources.iter().map(|(n, _)| n).chain(removed) {
            proptest::prop_assert!(seen.insert(name), "{} twice in {:?}", name, r);
        }
        let client = clients.get_mut(kind).unwrap();
        for (name, v) in resources {
            client.held.insert(name.clone(), v.clone());
        }
        for name in removed {
            client.held.remove(name);
        }
        let ack = Request::Delta {
            kind: *kind,
            subscribe: vec![],
            unsubscribe: vec![],
            initial_versions: BTreeMap::new(),
            nonce: nonce.clone(),
            error: None,
        };
        Ok(st.on_request(ack, cat))
    })
}

/// Opens a delta stream: every kind's first request (subscriptions and versions of
/// `clients`; an empty first request of a full-state kind is the legacy wildcard).
fn delta_open(
    cat: &TestCatalog,
    clients: &mut BTreeMap<Kind, Client>,
    max: usize,
) -> Result<Stream, proptest::test_runner::TestCaseError> {
    let mut st = Stream::with_max_resources(max);
    for kind in KINDS {
        let client = clients.get_mut(&kind).unwrap();
        let mut subscribe: Vec<String> = client.explicit.iter().cloned().collect();
        if client.wildcard {
            subscribe.push("*".to_string());
        }
        client.wildcard |= subscribe.is_empty() && kind.is_full_state();
        let req = Request::Delta {
            kind,
            subscribe,
            unsubscribe: vec![],
            initial_versions: client.held.clone(),
            nonce: String::new(),
            error: None,
        };
        let step = st.on_request(req, cat);
        proptest::prop_assert_eq!(step.responses.len(), 1, "a first request is answered");
        delta_settle(&mut st, cat, clients, step)?;
    }
    Ok(st)
}

proptest::proptest! {
    // Rare cases (an alias subscribed on top of a wildcard, then dropped) need more runs
    // than the default 256 to show up reliably.
    #![proptest_config(proptest::test_runner::Config::with_cases(1024))]

    /// For any script over Clusters and ClusterLoadAssignments, a delta client that
    /// applies each response (and ACKs it) ends up holding exactly the catalog's versions
    /// of what it subscribed to, once the server has told the stream about every change;
    /// and then nothing is left to send.
    #[test]
    fn delta_client_converges(
        first_names in proptest::collection::btree_set(0..POOL.len(), 0..2),
        ops in proptest::collection::vec(op(), 0..50),
        // Also with answers split into chunks of one or two resources.
        max in proptest::prop_oneof![proptest::strategy::Just(MAX_RESOURCES_PER_RESPONSE), 1usize..=2],
    ) {
        let mut cat = TestCatalog::default();
        let mut clients: BTreeMap<Kind, Client> = BTreeMap::new();
        for kind in KINDS {
            let explicit = first_names.iter().map(|&n| POOL[n].to_string()).collect();
            clients.insert(kind, Client { explicit, ..Client::default() });
        }
        let mut pending: BTreeSet<(Kind, &str)> = BTreeSet::new();
        let mut st = delta_open(&cat, &mut clients, max)?;
        for (k, op) in ops {
            let kind = KINDS[k];
            edit(&mut cat, kind, &op, &mut pending);
            let client = clients.get_mut(&kind).unwrap();
            let (mut sub, mut unsub) = (vec![], vec![]);
            match op {
                Op::Set(..) | Op::Del(_) => {}
                Op::Notify(ns) => {
                    let step = notify(&mut st, &cat, &mut pending, Some(&ns));
                    delta_settle(&mut st, &cat, &mut clients, step)?;
                }
                Op::Sub(n) => {
                    client.explicit.insert(POOL[n].to_string());
                    sub.push(POOL[n].to_string());
                }
                Op::Unsub(n) => {
                    // The client forgets an unsubscribed name unless a wildcard may cover
                    // it (then the server tells it).
                    if client.explicit.remove(POOL[n]) && !client.wildcard {
                        client.held.remove(POOL[n]);
                    }
                    unsub.push(POOL[n].to_string());
                }
                Op::SubStar => {
                    // On EDS "*" is an ordinary name (never a resource).
                    if kind.is_full_state() {
                        client.wildcard = true;
                    } else {
                        client.explicit.insert("*".to_string());
                    }
                    sub.push("*".to_string());
                }
                Op::UnsubStar => {
                    if kind.is_full_state() {
                        if std::mem::take(&mut client.wildcard) {
                            let explicit = client.explicit.clone();
                            client.held.retain(|n, _| explicit.contains(n));
                        }
                    } else {
                        client.explicit.remove("*");
                    }
                    unsub.push("*".to_string());
                }
                Op::Reconnect => st = delta_open(&cat, &mut clients, max)?,
            }
            if !sub.is_empty() || !unsub.is_empty() {
                let req = Request::Delta {
                    kind,
                    subscribe: sub,
                    unsubscribe: unsub,
                    initial_versions: BTreeMap::new(),
                    nonce: String::new(),
                    error: None,
                };
                let step = st.on_request(req, &cat);
                delta_settle(&mut st, &cat, &mut clients, step)?;
            }
        }
        let step = notify(&mut st, &cat, &mut pending, None);
        delta_settle(&mut st, &cat, &mut clients, step)?;
        for kind in KINDS {
            let c = &clients[&kind];
            proptest::prop_assert_eq!(&c.held, &want(&cat, kind, &c.explicit, c.wildcard), "{:?}", kind);
        }
        let all: Vec<(Kind, &[&str])> = KINDS.iter().map(|k| (*k, &POOL[..])).collect();
        proptest::prop_assert!(st.on_changes(&all, &cat).responses.is_empty());
    }
}

/// A SotW client of one kind: the names it requests (with "*"), what it holds, the
/// nonce it answers.
#[derive(Default)]
struct SotwClient {
    names: BTreeSet<String>,
    named_ever: bool,
    held: BTreeMap<String, String>,
    last: String,
}

impl SotwClient {
    fn wildcard(&self, kind: Kind) -> bool {
        kind.is_full_state() && (!self.named_ever || self.names.contains("*"))
    }

    fn request(&self, kind: Kind) -> Request {
        Request::Sotw {
            kind,
            version_info: String::new(),
            names: self
                .names
                .iter()
                .map(|n| ByteString::from(n.as_str()))
                .collect(),
            nonce: self.last.clone(),
            error: None,
        }
    }
}

/// Applies `step` to the SotW clients (bodies at the catalog's version of now, as the
/// encoder fetches them) and ACKs every response, until quiet (see [`settle`]).
fn sotw_settle(
    st: &mut Stream,
    cat: &TestCatalog,
    clients: &mut BTreeMap<Kind, SotwClient>,
    step: Step,
) -> Checked<()> {
    settle(st, step, |st, r| {
        let Response::Sotw {
            kind, names, nonce, ..
        } = r
        else {
            panic!("{r:?}");
        };
        let unique: BTreeSet<&String> = names.iter().collect();
        proptest::prop_assert_eq!(unique.len(), names.len(), "a name twice in {:?}", r);
        let client = clients.get_mut(kind).unwrap();
        let got = names
            .iter()
            .map(|name| (name.clone(), cat.version(*kind, name).unwrap().to_string()));
        if kind.is_full_state() {
            client.held = got.collect();
        } else {
            client.held.extend(got);
        }
        client.last = nonce.clone();
        Ok(st.on_request(client.request(*kind), cat))
    })
}

/// Opens a SotW stream: every kind's first request (with the nonce of the old stream,
/// if any), answered.
fn sotw_open(
    cat: &TestCatalog,
    clients: &mut BTreeMap<Kind, SotwClient>,
    max: usize,
) -> Result<Stream, proptest::test_runner::TestCaseError> {
    let mut st = Stream::with_max_resources(max);
    for kind in KINDS {
        let client = clients.get_mut(&kind).unwrap();
        // The legacy wildcard rule starts again on a new stream.
        client.named_ever = !client.names.is_empty();
        let step = st.on_request(client.request(kind), cat);
        proptest::prop_assert_eq!(step.responses.len(), 1, "a first request is answered");
        sotw_settle(&mut st, cat, clients, step)?;
    }
    Ok(st)
}

proptest::proptest! {
    // Rare cases (an alias subscribed on top of a wildcard, then dropped) need more runs
    // than the default 256 to show up reliably.
    #![proptest_config(proptest::test_runner::Config::with_cases(1024))]

    /// For any script over Clusters and ClusterLoadAssignments, a SotW client that
    /// applies each response (and ACKs it) ends up holding exactly the catalog's versions
    /// of what it requests (EDS: of what exists; the doc gives SotW no way to delete
    /// those); and then nothing is left to send.
    #[test]
    fn sotw_client_converges(
        first_names in proptest::collection::btree_set(0..POOL.len(), 0..2),
        ops in proptest::collection::vec(op(), 0..50),
        // Also with answers split into chunks of one or two resources.
        max in proptest::prop_oneof![proptest::strategy::Just(MAX_RESOURCES_PER_RESPONSE), 1usize..=2],
    ) {
        let mut cat = TestCatalog::default();
        let mut clients: BTreeMap<Kind, SotwClient> = BTreeMap::new();
        for kind in KINDS {
            let names = first_names.iter().map(|&n| POOL[n].to_string()).collect();
            clients.insert(kind, SotwClient { names, ..SotwClient::default() });
        }
        let mut pending: BTreeSet<(Kind, &str)> = BTreeSet::new();
        let mut st = sotw_open(&cat, &mut clients, max)?;
        for (k, op) in ops {
            let kind = KINDS[k];
            edit(&mut cat, kind, &op, &mut pending);
            let client = clients.get_mut(&kind).unwrap();
            let before = client.names.clone();
            let was_wildcard = client.wildcard(kind);
            match op {
                Op::Set(..) | Op::Del(_) => {}
                Op::Notify(ns) => {
                    let step = notify(&mut st, &cat, &mut pending, Some(&ns));
                    sotw_settle(&mut st, &cat, &mut clients, step)?;
                }
                Op::Sub(n) => {
                    client.names.insert(POOL[n].to_string());
                }
                Op::Unsub(n) => {
                    client.names.remove(POOL[n]);
                }
                Op::SubStar => {
                    client.names.insert("*".to_string());
                }
                Op::UnsubStar => {
                    client.names.remove("*");
                }
                Op::Reconnect => st = sotw_open(&cat, &mut clients, max)?,
            }
            let client = clients.get_mut(&kind).unwrap();
            if client.names != before {
                client.named_ever |= !client.names.is_empty();
                // The client forgets names it no longer requests, unless a wildcard
                // (before or now) may cover them: then the next complete set tells.
                let names = client.names.clone();
                if !(was_wildcard || client.wildcard(kind)) {
                    client.held.retain(|n, _| names.contains(n));
                }
                let step = st.on_request(client.request(kind), &cat);
                sotw_settle(&mut st, &cat, &mut clients, step)?;
            }
        }
        let step = notify(&mut st, &cat, &mut pending, None);
        sotw_settle(&mut st, &cat, &mut clients, step)?;
        for kind in KINDS {
            let c = &clients[&kind];
            let explicit: BTreeSet<String> = c.names.iter().filter(|n| !(kind.is_full_state() && *n == "*")).cloned().collect();
            let held: BTreeMap<String, String> = c
                .held
                .iter()
                .filter(|(n, _)| kind.is_full_state() || cat.version(kind, n).is_some())
                .map(|(n, v)| (n.clone(), v.clone()))
                .collect();
            proptest::prop_assert_eq!(&held, &want(&cat, kind, &explicit, c.wildcard(kind)), "{:?}", kind);
        }
        let all: Vec<(Kind, &[&str])> = KINDS.iter().map(|k| (*k, &POOL[..])).collect();
        proptest::prop_assert!(st.on_changes(&all, &cat).responses.is_empty());
    }
}

/// One response in flight per kind: changes while the client has not answered the
/// latest response wait, and go out together at their latest state when it answers
/// (ACK or NACK; a stale nonce answers nothing). A re-warm (CDS change while EDS is in
/// flight) waits for the EDS answer the same way.
#[test]
fn changes_wait_for_the_answer_to_the_response_in_flight() {
    for delta in [false, true] {
        let mut s = Script::new();
        s.auto_ack = false;
        s.set(C, "c", "c1");
        for n in ["a", "b", "c"] {
            s.set(E, n, "e1");
        }
        let sub = ["a", "b", "c"];
        if delta {
            s.delta(C, &[], &[]);
            s.delta_ack(C);
            s.delta(E, &sub, &[]);
        } else {
            s.sotw(C, &[]);
            s.sotw(C, &[]);
            s.sotw(E, &sub);
        }
        s.note("a and b change while EDS nonce 2 is unanswered: held");
        s.set(E, "a", "e2");
        assert!(s.change(E, &["a"]).responses.is_empty());
        s.set(E, "a", "e3");
        s.set(E, "b", "e2");
        assert!(s.change(E, &["a", "b"]).responses.is_empty());
        s.note("a stale nonce answers nothing: still held");
        let r = if delta {
            s.delta_with(E, &[], &[], &[], "1", None)
        } else {
            s.sotw_with(E, &sub, "1", None)
        };
        assert!(r.responses.is_empty(), "{r:?}");
        s.note("the ACK of nonce 2: both go out, at their latest versions, once");
        let r = if delta {
            s.delta_ack(E)
        } else {
            s.sotw(E, &sub)
        };
        assert_eq!(names_of(&r), [["a", "b"]]);
        let held: Vec<(String, String)> = match &r.responses[0] {
            Response::Delta { resources, .. } => resources.clone(),
            Response::Sotw { names, .. } => names
                .iter()
                .map(|n| (n.clone(), s.catalog.version(E, n).unwrap().to_string()))
                .collect(),
        };
        assert_eq!(held, [("a".into(), "e3".into()), ("b".into(), "e2".into())]);
        s.note("a NACK answers too: what changed meanwhile goes out");
        s.set(E, "b", "e3");
        assert!(s.change(E, &["b"]).responses.is_empty());
        let r = if delta {
            s.delta_nack(E, "bad")
        } else {
            s.sotw_nack(E, &sub, "bad")
        };
        assert_eq!(names_of(&r), [["b"]]);
        s.note("cluster c changes while EDS is in flight: CDS now, EDS c at the EDS answer");
        s.set(C, "c", "c2");
        let r = s.change(C, &["c"]);
        let kinds: Vec<Kind> = r.responses.iter().map(Response::kind).collect();
        assert_eq!(kinds, [C]);
        let r = if delta {
            s.delta_ack(E)
        } else {
            s.sotw(E, &sub)
        };
        assert_eq!(names_of(&r), [["c"]], "the re-warm, sent at the EDS answer");
        s.golden(if delta {
            "in_flight_delta"
        } else {
            "in_flight_sotw"
        });
    }
}

/// An ACK repeating the subscription in another order changes nothing; one that repeats
/// a name in place of another drops the other (the fast paths must not take it for
/// the same set).
#[test]
fn sotw_ack_in_another_order_or_with_a_repeated_name() {
    let mut s = Script::new();
    s.set(E, "a", "e1");
    s.set(E, "b", "e1");
    s.sotw(E, &["a", "b"]);
    let epoch = s.stream.subscription_epoch();
    let r = s.sotw(E, &["b", "a"]);
    assert!(r.responses.is_empty(), "{r:?}");
    assert_eq!(s.stream.subscription_epoch(), epoch);
    let r = s.sotw(E, &["a", "a"]);
    assert!(r.responses.is_empty(), "{r:?}");
    assert_eq!(s.stream.interest(E), Interest::Names(vec!["a"]));
    let r = s.sotw(E, &["a", "b"]);
    assert_eq!(names_of(&r), [["b"]], "b is newly requested again");
}

/// A response never carries more than the cap: a big first answer goes out in chunks,
/// each once the client answered the one before (ACK or NACK); a resource that changes
/// meanwhile goes out once, at its latest version; nothing is sent twice or left out.
#[test]
fn big_answers_go_out_in_chunks() {
    for delta in [false, true] {
        let mut s = Script::new();
        s.stream = Stream::with_max_resources(2);
        s.auto_ack = false;
        s.set(C, "c", "c1");
        let sub = ["a", "b", "c", "d", "e"];
        for n in sub {
            s.set(E, n, "e1");
        }
        if delta {
            s.delta(C, &[], &[]);
            s.delta_ack(C);
            s.note("five names subscribed, two per response");
            let r = s.delta(E, &sub, &[]);
            assert_eq!(names_of(&r), [["a", "b"]]);
        } else {
            s.sotw(C, &[]);
            s.sotw(C, &[]);
            s.note("five names subscribed, two per response");
            let r = s.sotw(E, &sub);
            assert_eq!(names_of(&r), [["a", "b"]]);
        }
        s.note("a (sent) and d (not yet) change before the answer: held with the rest");
        s.set(E, "a", "e2");
        s.set(E, "d", "e2");
        assert!(s.change(E, &["a", "d"]).responses.is_empty());
        let ack = |s: &mut Script| {
            if delta {
                s.delta_ack(E)
            } else {
                s.sotw(E, &sub)
            }
        };
        let mut sent = Vec::new();
        for _ in 0..4 {
            let r = ack(&mut s);
            if r.responses.is_empty() {
                break;
            }
            let names = names_of(&r);
            assert_eq!(names.len(), 1);
            assert!(names[0].len() <= 2, "{names:?}");
            sent.extend(
                names[0]
                    .iter()
                    .map(|n| (n.clone(), s.catalog.version(E, n).unwrap().to_string())),
            );
        }
        sent.sort();
        assert_eq!(
            sent,
            [("a", "e2"), ("c", "e1"), ("d", "e2"), ("e", "e1")]
                .map(|(n, v)| (n.to_string(), v.to_string())),
            "the rest, each once, a and d at their latest version"
        );
        s.note("everything held: an ACK gets nothing more");
        assert!(ack(&mut s).responses.is_empty());
        s.golden(if delta { "chunks_delta" } else { "chunks_sotw" });
    }
}
