//! Scripted event sequences in, actions out, as readable golden files
//! (`testdata/snapshot_plan/<scenario>.txt`; `UPDATE_GOLDEN=1` rewrites
//! them). Each line: the time, what happened (`<-`) or a poll (`poll`), the
//! actions (`->`) and the next wake-up. The layouts are hand-made (short
//! texts), so these tests do not depend on the dump format.

use std::cell::Cell;
use std::fmt::Write as _;

use super::*;

const NAME: &str = "snap";

thread_local! {
    /// Set while [`trailing_only_replays_the_plans_of_before`] runs the
    /// older scripts: [`opts`] turns the leading edge off and the golden
    /// files are the ones of before it (`testdata/snapshot_plan/trailing_only/`).
    static TRAILING_ONLY: Cell<bool> = const { Cell::new(false) };
}

fn opts() -> Options {
    Options {
        name: NAME.to_string(),
        coalesce_window: Duration::from_millis(100),
        coalesce_leading_edge: !TRAILING_ONLY.get(),
        retry_min: Duration::from_millis(200),
        retry_max: Duration::from_millis(800),
    }
}

/// A layout of `version` with one shard per text, named like the real ones.
fn layout(version: &str, shards: &[&str]) -> Arc<Layout> {
    let shards: Vec<Arc<ShardData>> = shards
        .iter()
        .enumerate()
        .map(|(i, t)| {
            Arc::new(ShardData {
                name: format!("{NAME}-{i}"),
                key: format!("{NAME}-{i}.json"),
                text: (*t).to_string(),
                sha256: crate::snapshot::shard_sha256(t),
            })
        })
        .collect();
    let names: Vec<&str> = shards.iter().map(|s| s.name.as_str()).collect();
    Arc::new(Layout {
        version: version.to_string(),
        index: index_text(version, &names),
        services: shards.len() * 2,
        nodes: shards.len() * 3,
        shards,
    })
}

fn index_text(version: &str, shards: &[&str]) -> String {
    format!("{version}:{}", shards.join(","))
}

fn key_of(name: &str) -> String {
    if name == NAME {
        INDEX_KEY.to_string()
    } else {
        format!("{name}.json")
    }
}

fn obj(name: &str, rv: u64, text: &str) -> Observed {
    Observed::new(name, Some(rv), [(key_of(name).as_str(), text)], true)
}

fn show(a: &Action) -> String {
    match a {
        Action::Build => "Build".to_string(),
        Action::Apply {
            name,
            key,
            text,
            epoch,
        } => format!("Apply {name} {{{key}: {text:?}}} (epoch {epoch})"),
        Action::Delete { name, epoch } => format!("Delete {name} (epoch {epoch})"),
        Action::Done(s) => format!(
            "Done({} written, {})",
            s.written,
            if s.published {
                format!("published {} in {} shards", s.version, s.shards)
            } else {
                format!("{} unchanged", s.version)
            }
        ),
        Action::Retry {
            reason,
            attempt,
            delay,
        } => format!(
            "Retry({reason}, attempt {attempt}, in {}ms)",
            delay.as_millis()
        ),
        Action::Dropped => "Dropped".to_string(),
    }
}

struct Script {
    planner: Planner,
    now: At,
    /// What the API server holds (name -> text), to answer applies.
    server: BTreeMap<String, String>,
    rv: u64,
    /// The layout `Build` is answered with, and its generation.
    next: (u64, Arc<Layout>),
    /// Answer `Build` with a failure instead.
    build_fails: bool,
    out: String,
}

impl Script {
    fn new(first: Arc<Layout>) -> Self {
        Script {
            planner: Planner::new(opts()),
            now: At::ZERO,
            server: BTreeMap::new(),
            rv: 0,
            next: (0, first),
            build_fails: false,
            out: String::new(),
        }
    }

    fn at(&mut self, ms: u64) -> &mut Self {
        self.now = At::from_millis(ms);
        self
    }

    fn line(&mut self, what: &str, plan: &Plan) {
        let acts: Vec<String> = plan.actions.iter().map(show).collect();
        let acts = if acts.is_empty() {
            "-".to_string()
        } else {
            acts.join(", ")
        };
        let wake = match plan.wake {
            Some(t) => format!("  (wake {}ms)", t.as_millis()),
            None => String::new(),
        };
        let _ = writeln!(
            self.out,
            "{:>6}ms  {what:<40} -> {acts}{wake}",
            self.now.as_millis()
        );
    }

    /// Feeds `input`; answers a `Build` at once (as the sink does).
    fn input(&mut self, what: &str, input: Input) -> Vec<Action> {
        let plan = self.planner.handle(self.now, input);
        self.line(&format!("<- {what}"), &plan);
        let mut actions = plan.actions;
        if actions.contains(&Action::Build) {
            actions.extend(self.build());
        }
        actions
    }

    fn poll(&mut self) -> Vec<Action> {
        let plan = self.planner.poll(self.now);
        self.line("poll", &plan);
        let mut actions = plan.actions;
        if actions.contains(&Action::Build) {
            actions.extend(self.build());
        }
        actions
    }

    /// Answers a `Build` (as the sink does, at once).
    fn build(&mut self) -> Vec<Action> {
        if self.build_fails {
            return self.input(
                "BuildFailed(service too large)",
                Input::BuildFailed("service too large".into()),
            );
        }
        let (generation, layout) = self.next.clone();
        self.input(
            &format!("Built(gen {generation}, {})", layout.version),
            Input::Built { generation, layout },
        )
    }

    fn leadership(&mut self, epoch: u64, leading: bool) -> Vec<Action> {
        let what = if leading { "leading" } else { "standby" };
        self.input(
            &format!("Leadership(epoch {epoch}, {what})"),
            Input::Leadership { epoch, leading },
        )
    }

    fn listed(&mut self) {
        self.input("AllClustersListed(true)", Input::AllClustersListed(true));
    }

    fn watch_listed(&mut self) -> Vec<Action> {
        let objs: Vec<Observed> = self
            .server
            .iter()
            .map(|(n, t)| obj(n, self.rv, t))
            .collect();
        let names: Vec<&String> = self.server.keys().collect();
        let what = format!("WatchListed {names:?}");
        self.input(&what, Input::WatchListed(objs))
    }

    /// A new state: the next `Build` is answered with `layout`.
    fn state(&mut self, generation: u64, layout: Arc<Layout>) -> Vec<Action> {
        self.next = (generation, layout);
        self.input(
            &format!("StateChanged(gen {generation})"),
            Input::StateChanged { generation },
        )
    }

    /// Someone else changes (`Some`) or deletes (`None`) an object; the
    /// watch reports it.
    fn edit(&mut self, name: &str, text: Option<&str>) -> Vec<Action> {
        self.rv += 1;
        match text {
            Some(t) => {
                self.server.insert(name.to_string(), t.to_string());
                self.input(
                    &format!("Observed {name} rv {} {t:?}", self.rv),
                    Input::Observed(obj(name, self.rv, t)),
                )
            }
            None => {
                let t = self.server.remove(name).unwrap_or_default();
                self.input(
                    &format!("Gone {name} rv {}", self.rv),
                    Input::Gone(obj(name, self.rv, &t)),
                )
            }
        }
    }

    /// Answers `actions` as a healthy API server would, one request at a
    /// time, until the round ends; returns the objects written (for echoes).
    fn serve(&mut self, mut actions: Vec<Action>) -> Vec<Observed> {
        let mut written = Vec::new();
        loop {
            let mut next = Vec::new();
            for a in actions {
                match a {
                    Action::Apply { name, text, .. } => {
                        self.rv += 1;
                        self.server.insert(name.clone(), text.clone());
                        let o = obj(&name, self.rv, &text);
                        written.push(o.clone());
                        next.extend(
                            self.input(
                                &format!("Written {name} rv {}", self.rv),
                                Input::Written(o),
                            ),
                        );
                    }
                    Action::Delete { name, .. } => {
                        self.server.remove(&name);
                        next.extend(self.input(
                            &format!("Deleted {name}"),
                            Input::Deleted { name: name.clone() },
                        ));
                    }
                    _ => {}
                }
            }
            if next.is_empty() {
                return written;
            }
            actions = next;
        }
    }

    /// The watch delivers the events of our own writes.
    fn echoes(&mut self, written: Vec<Observed>) {
        for o in written {
            let what = format!("Observed {} rv {} (our write)", o.name, o.rv.unwrap_or(0));
            self.input(&what, Input::Observed(o));
        }
    }

    fn golden(&self, scenario: &str) {
        if TRAILING_ONLY.get() {
            crate::golden::check_fixed("snapshot_plan/trailing_only", scenario, &self.out);
        } else {
            crate::golden::check("snapshot_plan", scenario, &self.out);
        }
    }

    /// The server holds `layout` exactly (as our earlier run left it).
    fn holds(&mut self, layout: &Layout) {
        for s in &layout.shards {
            self.server.insert(s.name.clone(), s.text.clone());
        }
        self.server.insert(NAME.to_string(), layout.index.clone());
        self.rv = 10;
    }

    /// A leading replica whose watch and clusters are listed and whose
    /// first round published `first` (the returned echoes not yet seen).
    fn published(first: Arc<Layout>) -> (Self, Vec<Observed>) {
        let mut s = Script::new(first);
        s.listed();
        let mut actions = s.watch_listed();
        actions.extend(s.at(100).poll());
        let written = s.serve(actions);
        (s, written)
    }

    fn count(&self, what: &str) -> usize {
        self.out.matches(what).count()
    }
}

#[test]
fn first_publish_waits_for_the_lease_the_clusters_and_the_watch() {
    let mut s = Script::new(layout("v1", &["a", "b"]));
    s.leadership(1, false);
    s.at(5).watch_listed();
    s.at(105).poll();
    s.at(200).listed();
    s.state(1, layout("v1", &["a", "b"]));
    s.at(300).poll();
    // Leading: a round at once, shards first and the index last.
    let actions = s.at(400).leadership(2, true);
    let written = s.serve(actions);
    // The echoes of our writes change nothing: one round that writes nothing.
    s.at(410).echoes(written);
    s.at(510).poll();
    s.golden("first_publish");
    assert_eq!(s.count("Apply"), 3);
    assert_eq!(
        s.server.get(NAME).map(String::as_str),
        Some("v1:snap-0,snap-1")
    );
}

#[test]
fn an_idle_restart_writes_nothing() {
    let l = layout("v1", &["a", "b"]);
    let mut s = Script::new(l.clone());
    s.holds(&l);
    s.listed();
    s.watch_listed();
    s.at(100).poll();
    s.golden("idle_restart");
    assert_eq!(s.count("Apply") + s.count("Delete"), 0);
}

#[test]
fn an_edited_shard_is_rewritten_alone() {
    let (mut s, written) = Script::published(layout("v1", &["a", "b", "c"]));
    s.at(110).echoes(written);
    s.at(210).poll();
    s.at(1000).edit("snap-1", Some("edited"));
    let actions = s.at(1100).poll();
    s.serve(actions);
    s.golden("edited_shard");
    assert_eq!(s.server.get("snap-1").map(String::as_str), Some("b"));
    assert_eq!(s.count("Apply snap-1"), 2, "{}", s.out);
    assert_eq!(s.count("Apply"), 5, "{}", s.out);
}

#[test]
fn a_deleted_index_is_rewritten() {
    let (mut s, written) = Script::published(layout("v1", &["a"]));
    s.at(110).echoes(written);
    s.at(210).poll();
    s.at(1000).edit(NAME, None);
    let actions = s.at(1100).poll();
    s.serve(actions);
    s.golden("deleted_index");
    assert_eq!(s.server.get(NAME).map(String::as_str), Some("v1:snap-0"));
}

#[test]
fn a_shrink_deletes_stale_shards_after_the_index() {
    let (mut s, written) = Script::published(layout("v1", &["a", "b", "c"]));
    s.at(110).echoes(written);
    s.at(210).poll();
    let mut actions = s.at(1000).state(2, layout("v2", &["abc"]));
    actions.extend(s.at(1100).poll());
    s.serve(actions);
    // A foreign ConfigMap with our label is deleted too.
    s.at(2000).edit("snap-x", Some("foreign"));
    let actions = s.at(2100).poll();
    s.serve(actions);
    s.golden("shrink");
    let names: Vec<&String> = s.server.keys().collect();
    assert_eq!(names, ["snap", "snap-0"]);
    let index = s.out.find("Apply snap {").expect("index written");
    let delete = s.out.find("Delete snap-1").expect("stale shard deleted");
    assert!(index < delete, "{}", s.out);
}

#[test]
fn an_echo_of_our_own_older_write_is_ignored() {
    let (mut s, written) = Script::published(layout("v1", &["a"]));
    // A newer state is written before the watch delivers the older echoes.
    let mut actions = s.at(110).state(2, layout("v2", &["b"]));
    actions.extend(s.at(210).poll());
    let newer = s.serve(actions);
    s.at(220).echoes(written);
    s.at(320).poll();
    // A relist that is older than our writes keeps what we wrote.
    let stale: Vec<Observed> = vec![obj("snap-0", 1, "a"), obj(NAME, 2, "v1:snap-0")];
    s.at(330).input(
        "WatchListed (older than our writes)",
        Input::WatchListed(stale),
    );
    s.at(430).poll();
    s.at(440).echoes(newer);
    s.at(540).poll();
    s.golden("older_echo");
    assert_eq!(s.count("Apply"), 4, "{}", s.out);
}

#[test]
fn a_failure_backs_off_and_the_round_is_retried() {
    let mut s = Script::new(layout("v1", &["a", "b"]));
    s.listed();
    s.watch_listed();
    s.at(100).poll();
    s.input(
        "Failed(api error 500)",
        Input::Failed("api error 500".into()),
    );
    s.at(300).poll();
    s.at(310).input(
        "Failed(api error 500)",
        Input::Failed("api error 500".into()),
    );
    // A change during the backoff does not shorten it.
    s.build_fails = true;
    s.at(400).state(1, layout("v2", &["c", "d"]));
    s.at(710).poll();
    s.build_fails = false;
    let actions = s.at(1510).poll();
    s.serve(actions);
    // Attempts start again from the first delay after a good round.
    s.at(2000).edit("snap-0", Some("edited"));
    s.at(2100).poll();
    s.input(
        "Failed(api error 500)",
        Input::Failed("api error 500".into()),
    );
    s.golden("failure_backoff");
    assert_eq!(
        s.server.get(NAME).map(String::as_str),
        Some("v2:snap-0,snap-1")
    );
    assert_eq!(s.count("Retry"), 4, "{}", s.out);
}

#[test]
fn a_lost_lease_mid_round_sends_nothing_more() {
    let mut s = Script::new(layout("v1", &["a", "b"]));
    s.leadership(1, true);
    s.listed();
    s.watch_listed();
    s.at(100).poll();
    // The lease is lost with the first shard in flight: its answer is
    // taken in, and nothing more is sent.
    s.at(105).leadership(2, false);
    s.at(110)
        .input("Written snap-0 rv 1", Input::Written(obj("snap-0", 1, "a")));
    s.at(1000).poll();
    // Leading again: the round starts over with what is still missing.
    s.at(2000).leadership(3, true);
    // The fence refuses the request (the loss is not processed yet).
    s.at(2005).input("Fenced", Input::Fenced);
    s.at(5000).poll();
    s.golden("lost_lease");
    assert_eq!(s.count("Apply"), 2, "{}", s.out);
    assert_eq!(s.count("Retry"), 0);
}

/// A change after a quiet period starts a round at once (the leading
/// edge); changes within the window of that round's start wait for its end
/// and become one round (the trailing edge); a change after another quiet
/// period is again at once.
#[test]
fn a_lone_change_starts_a_round_at_once_and_a_burst_waits_for_the_window() {
    let (mut s, written) = Script::published(layout("v1", &["a"]));
    s.at(110).echoes(written);
    s.at(210).poll();
    let lone = s.at(1000).state(2, layout("v2", &["b"]));
    let written = s.serve(lone.clone());
    s.at(1005).echoes(written);
    let burst = s.at(1010).state(3, layout("v3", &["c"]));
    s.at(1050).state(4, layout("v4", &["d"]));
    let actions = s.at(1100).poll();
    let written = s.serve(actions);
    s.at(1110).echoes(written);
    let quiet = s.at(1300).state(5, layout("v5", &["e"]));
    s.serve(quiet.clone());
    assert!(
        lone.iter().any(|a| matches!(a, Action::Apply { .. })),
        "the lone change waited: {lone:?}\n{}",
        s.out
    );
    assert!(burst.is_empty(), "{burst:?}\n{}", s.out);
    assert!(
        quiet.iter().any(|a| matches!(a, Action::Apply { .. })),
        "{}",
        s.out
    );
    // v1, then v2 at once, v3 and v4 together at 1100, v5 at once.
    assert_eq!(s.count("published v"), 4, "{}", s.out);
    assert_eq!(s.count("Built(gen 3"), 0, "{}", s.out);
    assert_eq!(s.server.get(NAME).map(String::as_str), Some("v5:snap-0"));
    s.golden("leading_and_trailing");
}

/// A change while a round runs waits for it, and for the window of its
/// start: the next round starts at the later of the two.
#[test]
fn a_change_during_a_round_gets_a_round_after_it() {
    let (mut s, written) = Script::published(layout("v1", &["a"]));
    s.at(110).echoes(written);
    s.at(210).poll();
    let actions = s.at(1000).state(2, layout("v2", &["b"]));
    assert!(!actions.is_empty(), "{}", s.out);
    // The round's first write is not answered yet.
    let during = s.at(1020).state(3, layout("v3", &["c"]));
    assert!(during.is_empty(), "{}", s.out);
    let mut written = s.serve(actions);
    let after = s.at(1100).poll();
    assert!(!after.is_empty(), "{}", s.out);
    written.extend(s.serve(after));
    s.at(1110).echoes(written);
    s.golden("change_during_round");
    assert_eq!(s.server.get(NAME).map(String::as_str), Some("v3:snap-0"));
}

// ------------------------------------------- real layouts: writes per change

/// Drives the planner over REAL layouts ([`crate::snapshot::build`] at the
/// default 900 KiB budget) and records each round's requests by name (the
/// texts are up to 900 KiB): what issue 19 item 2 counts, ConfigMap writes
/// per change.
struct Real {
    planner: Planner,
    now: At,
    rv: u64,
    generation: u64,
    out: String,
}

impl Real {
    fn new() -> Self {
        let mut planner = Planner::new(opts());
        planner.handle(At::ZERO, Input::AllClustersListed(true));
        planner.handle(At::ZERO, Input::WatchListed(Vec::new()));
        Real {
            planner,
            now: At::ZERO,
            rv: 0,
            generation: 0,
            out: String::new(),
        }
    }

    /// The state becomes `dump`; runs the round, answering like a healthy
    /// API server; returns the requests (`Apply NAME` / `Delete NAME`).
    fn change(&mut self, what: &str, dump: &crate::snapshot::Dump) -> Vec<String> {
        let layout = crate::snapshot::build(dump, NAME, crate::snapshot::DEFAULT_MAX_SHARD_BYTES)
            .expect("layout");
        for s in &layout.shards {
            assert!(
                crate::snapshot::escaped_len(&s.text) <= crate::snapshot::DEFAULT_MAX_SHARD_BYTES,
                "{} over the budget",
                s.name
            );
        }
        let shards = layout.shards.len();
        self.generation += 1;
        let generation = self.generation;
        self.now += Duration::from_secs(10);
        // Answers come at once, so a round may start inside any call.
        let mut actions: std::collections::VecDeque<Action> = self
            .planner
            .handle(self.now, Input::StateChanged { generation })
            .actions
            .into();
        actions.extend(
            self.planner
                .handle(
                    self.now,
                    Input::Built {
                        generation,
                        layout: Arc::new(layout),
                    },
                )
                .actions,
        );
        self.now += Duration::from_secs(1);
        actions.extend(self.planner.poll(self.now).actions);
        let mut requests = Vec::new();
        while let Some(a) = actions.pop_front() {
            let answer = match a {
                Action::Apply {
                    name, key, text, ..
                } => {
                    self.rv += 1;
                    requests.push(format!("Apply {name}"));
                    Input::Written(Observed::new(
                        name,
                        Some(self.rv),
                        [(key.as_str(), text.as_str())],
                        true,
                    ))
                }
                Action::Delete { name, .. } => {
                    requests.push(format!("Delete {name}"));
                    Input::Deleted { name }
                }
                Action::Build => continue,
                Action::Done(_) => break,
                other => panic!("unexpected {other:?}"),
            };
            actions.extend(self.planner.handle(self.now, answer).actions);
        }
        let _ = writeln!(
            self.out,
            "{what} ({shards} shards): {} requests: {}",
            requests.len(),
            if requests.is_empty() {
                "-".to_string()
            } else {
                requests.join(", ")
            }
        );
        requests
    }
}

/// `n` hosts from `10.<base>.0.0` on, sorted like the state's lists.
fn hosts(base: u32, n: u32) -> Vec<crate::model::Node> {
    let mut v: Vec<crate::model::Node> = (0..n)
        .map(|i| {
            crate::model::Node::new(
                format!("10.{}.{}.{}", base + (i >> 16), (i >> 8) & 0xff, i & 0xff),
                8080,
                100,
            )
        })
        .collect();
    crate::model::sort_nodes(&mut v);
    v
}

/// The node list of port `http` of `shop/big`.
fn big(d: &mut crate::snapshot::Dump) -> &mut Vec<crate::model::Node> {
    d.clusters
        .get_mut("")
        .and_then(|s| s.get_mut(&("shop".into(), "big".into())))
        .and_then(|p| p.get_mut("http"))
        .expect("big service")
}

#[test]
fn one_endpoint_change_in_a_100000_endpoint_service_is_two_writes() {
    use crate::model::{Node, PortMap, ServiceKey};
    use crate::snapshot::Dump;
    let key = ServiceKey::new("", "shop", "big");
    let mut d = Dump::with_clusters([""]);
    d.insert(
        &key,
        PortMap::from([("http".to_string(), hosts(1, 100_000))]),
    );
    d.insert(
        &ServiceKey::new("", "shop", "small"),
        PortMap::from([("http".to_string(), hosts(100, 3))]),
    );
    let mut r = Real::new();
    let first = r.change("first publish", &d);
    assert!(first.len() > 4, "{first:?}");
    /// An edit of the big service's node list.
    type Edit = fn(&mut Vec<Node>);
    let edits: [(&str, Edit); 4] = [
        ("one endpoint added, sorting first", |l| {
            l.insert(0, Node::new("1.0.0.1", 8080, 100))
        }),
        ("one endpoint added, sorting last", |l| {
            l.push(Node::new("99.0.0.1", 8080, 100))
        }),
        ("one endpoint removed", |l| drop(l.remove(50_000))),
        ("one weight changed", |l| l[777].weight = 7),
    ];
    for (what, edit) in edits {
        edit(big(&mut d));
        let w = r.change(what, &d);
        assert_eq!(w.len(), 2, "{what}: {w:?}");
        assert_eq!(w[1], format!("Apply {NAME}"), "{what}: the index last");
    }
    // Nothing changed: nothing written.
    assert!(r.change("unchanged", &d).is_empty());
    crate::golden::check("snapshot_plan", "big_service_writes", &r.out);
}

#[test]
fn one_change_among_10000_small_services_is_two_writes() {
    use crate::model::{PortMap, ServiceKey};
    use crate::snapshot::Dump;
    let mut d = Dump::with_clusters([""]);
    for i in 0..10_000u32 {
        d.insert(
            &ServiceKey::new("", format!("ns{}", i % 10), format!("svc-{i:05}")),
            PortMap::from([("http".to_string(), hosts(i % 200, 2))]),
        );
    }
    let mut r = Real::new();
    let first = r.change("first publish", &d);
    assert!(first.len() > 2, "{first:?}");
    d.insert(
        &ServiceKey::new("", "ns3", "svc-00003"),
        PortMap::from([("http".to_string(), hosts(7, 3))]),
    );
    let w = r.change("one service gets an endpoint", &d);
    assert_eq!(w.len(), 2, "{w:?}");
    d.insert(
        &ServiceKey::new("", "aaa", "new"),
        PortMap::from([("http".to_string(), hosts(8, 1))]),
    );
    let w = r.change("one service added, sorting first", &d);
    assert_eq!(w.len(), 2, "{w:?}");
    d.clusters
        .get_mut("")
        .map(|s| s.remove(&("ns9".to_string(), "svc-09999".to_string())));
    let w = r.change("one service removed", &d);
    assert_eq!(w.len(), 2, "{w:?}");
    crate::golden::check("snapshot_plan", "small_services_writes", &r.out);
}

/// With `coalesce_leading_edge: false` the planner is the trailing-only one
/// of before: the scripts older than the leading edge print exactly what
/// they printed then (`testdata/snapshot_plan/trailing_only/`, copied from
/// the commit before it and never rewritten).
#[test]
fn trailing_only_replays_the_plans_of_before() {
    TRAILING_ONLY.set(true);
    first_publish_waits_for_the_lease_the_clusters_and_the_watch();
    an_idle_restart_writes_nothing();
    an_edited_shard_is_rewritten_alone();
    a_deleted_index_is_rewritten();
    a_shrink_deletes_stale_shards_after_the_index();
    an_echo_of_our_own_older_write_is_ignored();
    a_failure_backs_off_and_the_round_is_retried();
    a_lost_lease_mid_round_sends_nothing_more();
}
