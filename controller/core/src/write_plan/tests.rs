//! Scripted event sequences in, actions out, as readable golden files
//! (`testdata/write_plan/<scenario>.txt`; `UPDATE_GOLDEN=1` rewrites them).
//! Each line: the time, what happened (`<-`) or a poll (`poll`), and the
//! actions (`->`) with the next wake-up.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::objects::tests::{View, lazy, ops_over, service_of, show as show_ops};
use super::*;

/// The desired state the planner reads.
#[derive(Default)]
struct World {
    versions: BTreeMap<ServiceKey, String>,
    clusters: BTreeMap<String, bool>,
    /// Node counts of the services whose writes the script shows request by
    /// request ([`object_ops`], at most 4 nodes per object).
    sizes: BTreeMap<ServiceKey, usize>,
}

impl DesiredView for World {
    fn version(&self, key: &ServiceKey) -> Option<String> {
        self.versions.get(key).cloned()
    }
    fn listed(&self, cluster: &str) -> bool {
        self.clusters.get(cluster).copied().unwrap_or(false)
    }
    fn clusters(&self) -> Vec<(String, bool)> {
        self.clusters.iter().map(|(c, l)| (c.clone(), *l)).collect()
    }
    fn keys_of(&self, cluster: &str) -> Vec<ServiceKey> {
        self.versions
            .keys()
            .filter(|k| k.cluster == cluster)
            .cloned()
            .collect()
    }
    fn nodes(&self, _key: &ServiceKey) -> Option<std::sync::Arc<crate::ServiceNodes>> {
        // The planner itself never reads the nodes.
        None
    }
}

struct Script {
    planner: Planner,
    /// What the API server holds, fed as the runtime does: a list lands
    /// with the ticket it took when its `Load` was asked for, a write's
    /// answer before the planner hears of it.
    record: Record,
    /// The ticket of each epoch's last `Load`.
    tickets: BTreeMap<u64, u64>,
    world: World,
    /// The API server as the sink's caches show it, for [`object_ops`].
    server: View,
    now: At,
    out: String,
}

fn key(name: &str) -> ServiceKey {
    ServiceKey::new("", "ns", name)
}

fn show_key(k: &ServiceKey) -> String {
    k.to_string()
}

/// `epoch 0`, then what the write starts from when it is not the default
/// (`3 shards`, `repair`).
fn show_prior(epoch: u64, prior: Prior) -> String {
    let mut s = format!("epoch {epoch}");
    if prior.shards != 1 {
        let _ = write!(s, ", {} shards", prior.shards);
    }
    if prior.repair {
        s.push_str(", repair");
    }
    s
}

/// `Applied("v1")` (one object) or `Applied("v1", 3 shards)`.
fn show_outcome(o: &Outcome) -> String {
    match o {
        Outcome::Applied { version, shards: 1 } => format!("Applied({version:?})"),
        Outcome::Applied { version, shards } => format!("Applied({version:?}, {shards} shards)"),
        other => format!("{other:?}"),
    }
}

fn show(a: &Action) -> String {
    match a {
        Action::Load { epoch } => format!("Load(epoch {epoch})"),
        Action::Apply {
            key, epoch, prior, ..
        } => format!("Apply {} ({})", show_key(key), show_prior(*epoch, *prior)),
        Action::Delete {
            key, epoch, prior, ..
        } => format!("Delete {} ({})", show_key(key), show_prior(*epoch, *prior)),
        Action::CheckDrift { key } => format!("CheckDrift {}", show_key(key)),
        Action::Skipped { key } => format!("Skipped {}", show_key(key)),
        Action::Repair { key, kind } => format!("Repair {} ({kind})", show_key(key)),
        Action::Retry {
            key,
            reason,
            attempt,
            delay,
        } => format!(
            "Retry {} ({reason}, attempt {attempt}, in {}ms)",
            show_key(key),
            delay.as_millis()
        ),
        Action::Failing { key, from, to } => format!(
            "Failing {} {} -> {}",
            show_key(key),
            from.as_deref().unwrap_or("-"),
            to.as_deref().unwrap_or("-")
        ),
        Action::ClusterSynced(c) => format!("ClusterSynced {c:?}"),
        Action::Standby(s) => format!("Standby {s}"),
    }
}

impl Script {
    fn new(opts: Options) -> Self {
        let mut world = World::default();
        world.clusters.insert(String::new(), false);
        Script {
            planner: Planner::new(opts),
            record: Record::default(),
            tickets: BTreeMap::new(),
            world,
            server: View::default(),
            now: At::ZERO,
            out: String::new(),
        }
    }

    fn at(&mut self, ms: u64) -> &mut Self {
        self.now = At::from_millis(ms);
        self
    }

    fn line(&mut self, what: &str, actions: &[Action], wake: Option<Option<At>>) {
        let acts: Vec<String> = actions.iter().map(show).collect();
        let acts = if acts.is_empty() {
            "-".to_string()
        } else {
            acts.join(", ")
        };
        let wake = match wake {
            Some(Some(t)) => format!("  (wake {}ms)", t.as_millis()),
            _ => String::new(),
        };
        let _ = writeln!(
            self.out,
            "{:>6}ms  {what:<44} -> {acts}{wake}",
            self.now.as_millis()
        );
        for a in actions {
            if let Action::Load { epoch } = a {
                self.tickets.insert(*epoch, self.record.list_begins());
            }
            self.ops(a);
        }
    }

    /// The requests of a write of a service with a size ([`World::sizes`]):
    /// what the sink would send for it.
    fn ops(&mut self, action: &Action) {
        let (key, prior, apply) = match action {
            Action::Apply { key, prior, .. } => (key, *prior, true),
            Action::Delete { key, prior, .. } => (key, *prior, false),
            _ => return,
        };
        let Some(&nodes) = self.world.sizes.get(key) else {
            return;
        };
        let svc = apply.then(|| service_of(key, nodes));
        let desired = svc.as_ref().map(lazy);
        let naming = crate::crd::ObjectNaming::source();
        let text = match ops_over(key, &naming, desired.as_ref(), prior, &self.server) {
            Ok(plan) => {
                let mut ops = show_ops(&plan);
                for ((_, name), owner) in &plan.left_alone {
                    ops.push(format!("left alone {name} ({owner})"));
                }
                if ops.is_empty() {
                    "nothing to send".to_string()
                } else {
                    ops.join(", ")
                }
            }
            Err(taken) => format!("name taken: {} ({})", taken.object.1, taken.owner),
        };
        let _ = writeln!(self.out, "{:>10}requests: {text}", "");
    }

    fn leadership(&mut self, epoch: u64, leading: bool) {
        let what = if leading { "leading" } else { "standby" };
        self.input(
            &format!("Leadership(epoch {epoch}, {what})"),
            Input::Leadership { epoch, leading },
        );
    }

    /// What the drift watch shows of `name` such that the planner judges it
    /// `result`; the line shows the planner's verdict.
    fn drift_checked(&mut self, name: &str, result: DriftResult) {
        let facts = drift_facts(name, result);
        let shown = match judge_drift(&facts) {
            DriftResult::Drift(kind) => format!("Drift({kind})"),
            other => format!("{other:?}"),
        };
        self.input(
            &format!("DriftChecked {name} {shown}"),
            Input::DriftSeen {
                key: key(name),
                facts,
            },
        );
    }

    /// Sets the node count of `name` (see [`World::sizes`]).
    fn size(&mut self, name: &str, nodes: usize) -> &mut Self {
        self.world.sizes.insert(key(name), nodes);
        self
    }

    fn input(&mut self, what: &str, input: Input) -> Vec<Action> {
        let actions = self
            .planner
            .handle(self.now, input, &self.world, &self.record);
        self.line(&format!("<- {what}"), &actions, None);
        actions
    }

    fn poll(&mut self) -> Vec<Action> {
        let (actions, wake) = self.planner.poll(self.now, &self.world, &self.record);
        self.line("poll", &actions, Some(wake));
        actions
    }

    fn desire(&mut self, name: &str, version: Option<&str>) -> &mut Self {
        match version {
            Some(v) => self.world.versions.insert(key(name), v.to_string()),
            None => self.world.versions.remove(&key(name)),
        };
        self
    }

    fn changed(&mut self, names: &[&str]) {
        let now = self.now;
        let keys = names.iter().map(|n| (key(n), now)).collect();
        self.input(&format!("Changed {names:?}"), Input::Changed(keys));
    }

    fn synced(&mut self) {
        self.world.clusters.insert(String::new(), true);
        self.input("Synced \"\"", Input::Synced(String::new()));
    }

    fn loaded(&mut self, epoch: u64, known: &[(&str, &str)]) {
        let known: Vec<(&str, &str, u32)> = known.iter().map(|(n, v)| (*n, *v, 1)).collect();
        self.loaded_shards(epoch, &known);
    }

    /// [`Script::loaded`] with the shard slots of each service.
    fn loaded_shards(&mut self, epoch: u64, known: &[(&str, &str, u32)]) {
        let mut what = format!("Loaded(epoch {epoch})");
        if known.iter().any(|(_, _, shards)| *shards != 1) {
            for (n, v, shards) in known {
                let _ = write!(what, " {n}={v}/{shards} shards");
            }
        }
        let mut listing = record::Listing::default();
        for (n, v, shards) in known {
            let held = Held {
                version: v.to_string(),
                shards: *shards,
            };
            listing.service(&key(n), &held);
        }
        let ticket = match self.tickets.get(&epoch) {
            Some(t) => *t,
            None => self.record.list_begins(),
        };
        self.record.listed(ticket, listing);
        self.input(&what, Input::Loaded { epoch });
    }

    fn finished(&mut self, name: &str, outcome: Outcome) {
        match &outcome {
            Outcome::Applied { version, shards } => {
                self.record.service_written(&key(name), version, *shards);
            }
            Outcome::Deleted => self.record.service_removed(&key(name)),
            _ => {}
        }
        self.input(
            &format!("Finished {name} {}", show_outcome(&outcome)),
            Input::Finished {
                key: key(name),
                outcome,
            },
        );
    }

    fn golden(&self, scenario: &str) {
        if TRAILING_ONLY.get() {
            crate::golden::check_fixed("write_plan/trailing_only", scenario, &self.out);
        } else {
            crate::golden::check("write_plan", scenario, &self.out);
        }
    }
}

/// Drift facts of one wanted object `name` that judge as `result`.
fn drift_facts(name: &str, result: DriftResult) -> DriftFacts {
    let obj = ("ns".to_string(), name.to_string());
    let seen = |spec, rv| SeenObject {
        resource_version: Some(rv),
        written: Some(5),
        spec,
        owners: Vec::new(),
        labels_ok: true,
        stamp_ok: true,
    };
    let (seen, present) = match result {
        DriftResult::Intact => (Some(seen(1, 5)), vec![obj.clone()]),
        DriftResult::Stale => (Some(seen(1, 4)), vec![obj.clone()]),
        DriftResult::Drift("deleted") => (None, Vec::new()),
        DriftResult::Drift("edited") => (Some(seen(2, 6)), vec![obj.clone()]),
        DriftResult::Drift(other) => panic!("no facts for {other}"),
    };
    DriftFacts {
        listed: true,
        wanted: vec![WantedObjectFacts {
            name: obj,
            spec: 1,
            owners: Vec::new(),
            seen,
        }],
        present,
    }
}

fn applied(version: &str, shards: u32) -> Outcome {
    Outcome::Applied {
        version: version.to_string(),
        shards,
    }
}

thread_local! {
    /// Set while [`trailing_only_replays_the_plans_of_before`] runs the
    /// older scripts: [`opts`] turns the leading edge off and the golden
    /// files are the ones of before it (`testdata/write_plan/trailing_only/`).
    static TRAILING_ONLY: Cell<bool> = const { Cell::new(false) };
}

fn opts() -> Options {
    Options {
        coalesce_window: Duration::from_millis(100),
        coalesce_leading_edge: !TRAILING_ONLY.get(),
        concurrency: 2,
        qps: 0.0,
        start_qps: 0.0,
        max_pause: Duration::from_secs(10),
        retry_min: Duration::from_millis(500),
        retry_max: Duration::from_secs(4),
        drift_delay: Duration::from_millis(200),
        drift_settle: Duration::from_millis(750),
    }
}

#[test]
fn first_sync_writes_each_service_once_and_is_synced_when_all_were_attempted() {
    let mut s = Script::new(opts());
    s.poll();
    s.at(5).loaded(0, &[("gone", "v0"), ("same", "v1")]);
    s.desire("web", Some("v1"))
        .desire("api", Some("v1"))
        .desire("same", Some("v1"));
    s.at(10).changed(&["web", "api", "same"]);
    // A burst inside the window rides along: one write of the latest.
    s.desire("web", Some("v2"));
    s.at(50).changed(&["web"]);
    s.at(60).synced();
    s.poll();
    s.at(110).poll();
    s.at(120).finished("api", applied("v1", 1));
    s.poll();
    s.at(140).finished("web", applied("v2", 1));
    s.poll();
    // The object whose Service vanished while nobody watched.
    s.at(160).poll();
    s.at(170).finished("gone", Outcome::Deleted);
    s.poll();
    s.golden("first_sync");
}

#[test]
fn a_refused_object_is_reported_and_retried_but_never_holds_readiness() {
    let mut s = Script::new(opts());
    s.poll();
    s.at(1).loaded(0, &[]);
    s.desire("web", Some("v1")).desire("bad", Some("v1"));
    s.at(10).changed(&["web", "bad"]);
    s.synced();
    s.at(110).poll();
    s.at(120)
        .finished("bad", Outcome::Failed("name_taken".into()));
    s.finished("web", applied("v1", 1));
    s.poll();
    s.at(620).poll();
    s.at(630)
        .finished("bad", Outcome::Failed("name_taken".into()));
    s.poll();
    s.at(1630).poll();
    s.at(1640).finished("bad", applied("v1", 1));
    s.poll();
    s.golden("refused_object");
}

#[test]
fn a_lost_lease_stops_dispatch_and_a_new_epoch_reloads_before_writing() {
    let mut s = Script::new(opts());
    s.poll();
    s.at(1).loaded(0, &[]);
    s.desire("a", Some("v1"))
        .desire("b", Some("v1"))
        .desire("c", Some("v1"));
    s.at(10).changed(&["a", "b", "c"]);
    s.synced();
    s.at(110).poll();
    // The lease is lost with a and b in flight; c must not start.
    s.at(115).leadership(1, false);
    s.finished("a", Outcome::Fenced);
    s.at(200).poll();
    s.at(210).finished("b", applied("v1", 1));
    s.poll();
    // Leading again in a new epoch: what the server holds is read first.
    s.at(500).leadership(2, true);
    s.poll();
    s.at(510)
        .input("LoadFailed(epoch 2)", Input::LoadFailed { epoch: 2 });
    s.poll();
    s.at(1010).poll();
    s.at(1020).loaded(2, &[("b", "v1")]);
    s.at(1120).poll();
    s.golden("lost_lease");
}

/// The desired state of a key goes away after the planner decided to apply
/// it: the write sends nothing (`Superseded`) and the planner itself plans
/// the delete of what the API server holds, at once.
#[test]
fn an_apply_superseded_by_a_removal_is_planned_again_as_a_delete() {
    let mut s = Script::new(opts());
    s.poll();
    s.at(1).loaded(0, &[("a", "v0"), ("b", "v0")]);
    s.desire("a", Some("v1")).desire("b", Some("v1"));
    s.at(10).changed(&["a", "b"]);
    s.at(110).poll();
    s.desire("a", None).desire("b", None);
    s.at(120).finished("a", Outcome::Superseded);
    s.at(121).poll();
    s.at(130).changed(&["b"]);
    s.at(140).finished("b", Outcome::Superseded);
    s.at(141).poll();
    s.at(150).finished("a", Outcome::Deleted);
    s.at(230).poll();
    s.at(240).finished("b", Outcome::Deleted);
    s.poll();
    s.golden("superseded_apply");
}

#[test]
fn drift_is_checked_after_the_write_settled_and_repaired_once() {
    let mut s = Script::new(opts());
    s.poll();
    s.at(1).loaded(0, &[]);
    s.desire("web", Some("v1"));
    s.at(10).changed(&["web"]);
    s.synced();
    s.at(110).poll();
    // The late watch event of our own write reports it while in flight.
    s.at(115)
        .input("Drifted [web]", Input::Drifted(vec![key("web")]));
    s.at(120).finished("web", applied("v1", 1));
    s.at(315).poll();
    s.at(870).poll();
    s.drift_checked("web", DriftResult::Intact);
    // Someone edits it.
    s.at(5000)
        .input("Drifted [web]", Input::Drifted(vec![key("web")]));
    s.at(5200).poll();
    s.drift_checked("web", DriftResult::Drift("edited"));
    s.at(5300).poll();
    s.golden("drift");
}

#[test]
fn an_idle_restart_writes_nothing() {
    let mut s = Script::new(opts());
    s.desire("web", Some("v1")).desire("api", Some("v2"));
    s.world.clusters.insert(String::new(), true);
    s.poll();
    s.at(5).loaded(0, &[("web", "v1"), ("api", "v2")]);
    s.at(105).poll();
    s.golden("idle_restart");
}

/// While every write slot is taken, a due write is no reason to wake up: a
/// finishing write is an input then. (Waking for it made the loop spin on a
/// due time in the past: a core busy for a whole first sync against a slow
/// API server, BENCHMARKS.md issue 14.)
#[test]
fn a_due_write_wakes_the_loop_only_when_a_slot_is_free() {
    let mut s = Script::new(Options {
        concurrency: 1,
        ..opts()
    });
    s.poll();
    s.at(1).loaded(0, &[]);
    s.desire("a", Some("v1")).desire("b", Some("v1"));
    s.at(10).changed(&["a", "b"]);
    let (actions, wake) = s.planner.poll(At::from_secs(1), &s.world, &s.record);
    assert_eq!(actions.len(), 1, "{actions:?}");
    assert_eq!(wake, None, "b is due, but the only slot is taken");
    // A drift check still wakes it when its time comes.
    s.planner.handle(
        At::from_secs(1),
        Input::Drifted(vec![key("b")]),
        &s.world,
        &s.record,
    );
    let (_, wake) = s.planner.poll(At::from_secs(1), &s.world, &s.record);
    assert_eq!(wake, Some(At::from_secs(1) + Duration::from_millis(200)));
}

/// After a first sync of 5,000 services (each also reported by the first
/// drift sweep while pending), the tables are empty AND small again, and
/// the record holds one compact entry per service.
#[test]
fn tables_shrink_after_a_large_first_sync() {
    let n = 5_000;
    let mut world = World::default();
    world.clusters.insert(String::new(), true);
    let keys: Vec<ServiceKey> = (0..n).map(|i| key(&format!("s{i}"))).collect();
    for k in &keys {
        world.versions.insert(k.clone(), format!("{:016x}", 7));
    }
    let mut p = Planner::new(Options {
        concurrency: 64,
        ..opts()
    });
    let mut record = Record::default();
    let mut now = At::ZERO;
    let actions = p.poll(now, &world, &record).0;
    assert_eq!(actions, vec![Action::Load { epoch: 0 }]);
    let ticket = record.list_begins();
    record.listed(ticket, record::Listing::default());
    p.handle(now, Input::Loaded { epoch: 0 }, &world, &record);
    p.handle(
        now,
        Input::Changed(keys.iter().map(|k| (k.clone(), now)).collect()),
        &world,
        &record,
    );
    p.handle(now, Input::Drifted(keys.clone()), &world, &record);
    let peak = p.pending.entries.capacity();
    assert!(peak >= n);
    let (mut writes, mut checks, mut synced) = (0, 0, 0);
    for _ in 0..100_000 {
        let (actions, wake) = p.poll(now, &world, &record);
        for a in actions {
            match a {
                Action::Apply { key, .. } => {
                    writes += 1;
                    let v = world.versions[&key].clone();
                    record.service_written(&key, &v, 1);
                    p.handle(
                        now,
                        Input::Finished {
                            key,
                            outcome: Outcome::Applied {
                                version: v,
                                shards: 1,
                            },
                        },
                        &world,
                        &record,
                    );
                }
                Action::CheckDrift { key } => {
                    checks += 1;
                    p.handle(
                        now,
                        Input::DriftSeen {
                            key,
                            facts: DriftFacts::unwatched(),
                        },
                        &world,
                        &record,
                    );
                }
                Action::ClusterSynced(_) => synced += 1,
                other => panic!("unexpected {other:?}"),
            }
        }
        match wake {
            Some(w) => now = now.max(w),
            None if p.idle() => break,
            None => now += Duration::from_millis(10),
        }
    }
    assert_eq!(writes, n, "one write per service");
    assert_eq!(checks, n, "every parked check ran once");
    assert_eq!(synced, 1);
    assert_eq!(record.services_len(), n);
    assert!(keys.iter().all(|k| {
        record
            .service(&PackedKey::new(k))
            .is_some_and(|o| matches!(o.version, compact::Version::Hex(_)) && o.shards == 1)
    }));
    assert!(p.repair.is_empty());
    for (name, cap) in [
        ("pending", p.pending.entries.capacity()),
        ("inflight", p.pending.inflight.capacity()),
        ("drift keys", p.drift.keys.capacity()),
        ("parked", p.drift.parked.capacity()),
        ("last_done", p.drift.last_done.capacity()),
        ("recent write starts", p.pending.recent.capacity()),
    ] {
        assert!(
            cap <= 64,
            "{name}: capacity {cap} after the sync (peak {peak})"
        );
    }
    assert!(p.pending.due.is_empty() && p.drift.due.is_empty());
}

#[test]
fn a_first_list_barrier_before_the_start_up_list_waits_for_it() {
    let mut s = Script::new(opts());
    s.poll();
    // The source lists (and reports its barrier) before our objects are read.
    s.desire("web", Some("v1"));
    s.at(10).changed(&["web"]);
    s.at(20).input("Synced \"\"", Input::Synced(String::new()));
    s.poll();
    s.at(50).loaded(0, &[("gone", "v0"), ("web", "v1")]);
    s.at(150).poll();
    s.at(160).finished("gone", Outcome::Deleted);
    s.poll();
    s.golden("synced_before_loaded");
}

/// A sharded service shrinks to one object: the write starts from the 4
/// shard slots the start-up list found, so it drops `spec.shard` and deletes
/// the three surplus shards; the next write starts from one object.
#[test]
fn a_shrink_deletes_the_surplus_shards_the_planner_remembers() {
    let mut s = Script::new(opts());
    s.poll();
    s.at(5).loaded_shards(0, &[("web", "v1", 4)]);
    s.desire("web", Some("v2")).size("web", 1);
    s.at(10).changed(&["web"]);
    s.synced();
    s.at(110).poll();
    s.at(120).finished("web", applied("v2", 1));
    s.poll();
    s.desire("web", Some("v3"));
    s.at(200).changed(&["web"]);
    s.at(300).poll();
    s.at(310).finished("web", applied("v3", 1));
    s.golden("shard_shrink");
}

/// One object grows to four shards (1 to 3 first, shard 0 last); the
/// planner learns the count from the write, so deleting the service later
/// deletes every shard.
#[test]
fn a_grow_is_remembered_and_a_later_delete_removes_every_shard() {
    let mut s = Script::new(opts());
    s.poll();
    s.at(5).loaded(0, &[("web", "v1")]);
    s.desire("web", Some("v2")).size("web", 12);
    s.at(10).changed(&["web"]);
    s.synced();
    s.at(110).poll();
    s.at(120).finished("web", applied("v2", 4));
    s.poll();
    s.desire("web", None);
    s.at(200).changed(&["web"]);
    s.at(300).poll();
    s.at(310).finished("web", Outcome::Deleted);
    s.poll();
    s.golden("shard_grow");
}

/// Shard 1 of 4 is deleted by hand: the repair writes only that shard. The
/// repair flag survives a write dropped by a lost lease, the reload of a new
/// epoch and a failed attempt, and is cleared by the write that succeeds;
/// the next ordinary write sends the shard whose content it changes (the
/// one the cache no longer shows intact) and shard 0.
#[test]
fn a_drift_repair_of_one_shard_writes_only_that_shard_until_it_succeeds() {
    let mut s = Script::new(opts());
    s.poll();
    s.at(5).loaded_shards(0, &[("web", "v1", 4)]);
    s.desire("web", Some("v1")).size("web", 12);
    s.at(10).changed(&["web"]);
    s.synced();
    s.at(110).poll();
    // Someone deletes web.1; the cache shows the others as wanted.
    s.server.intact = ["web", "web.2", "web.3"].map(String::from).into();
    s.server.cached = vec!["web".into(), "web.2".into(), "web.3".into()];
    s.at(5000)
        .input("Drifted [web]", Input::Drifted(vec![key("web")]));
    s.at(5200).poll();
    s.drift_checked("web", DriftResult::Drift("deleted"));
    s.at(5300).poll();
    // The lease is lost while it is in flight; the new epoch reloads.
    s.at(5305).leadership(1, false);
    s.at(5310).finished("web", Outcome::Fenced);
    s.at(6000).leadership(2, true);
    s.poll();
    s.at(6010).loaded_shards(2, &[("web", "v1", 4)]);
    s.at(6110).poll();
    s.at(6120)
        .finished("web", Outcome::Failed("timeout".into()));
    s.at(6620).poll();
    s.at(6630).finished("web", applied("v1", 4));
    s.server.intact.insert("web.1".to_string());
    s.poll();
    // v2 changes the content of shard 2 only.
    s.desire("web", Some("v2"));
    s.server.intact.remove("web.2");
    s.at(7000).changed(&["web"]);
    s.at(7100).poll();
    s.golden("shard_drift_repair");
}

impl Script {
    fn throttled(&mut self, retry_after_ms: Option<u64>) {
        let retry_after = retry_after_ms.map(Duration::from_millis);
        self.input(
            &format!("Throttled(retry after {retry_after:?})"),
            Input::Throttled { retry_after },
        );
    }

    /// Polls and shows the limiter's rate after it.
    fn poll_rate(&mut self) -> Vec<Action> {
        let actions = self.poll();
        let _ = writeln!(
            self.out,
            "{:>10}rate: {:.2} writes/s",
            "",
            self.planner.write_rate()
        );
        actions
    }
}

/// The adaptive limiter in the planner: writes start at `start_qps`, one
/// success is one more write per second (slow start), a 429 halves the rate
/// and pauses every start for its `Retry-After` (capped at `max_pause`); the
/// throttled write is due again after the pause, not failed.
#[test]
fn throttled_writes_halve_the_rate_and_pause_for_the_capped_retry_after() {
    let mut s = Script::new(Options {
        concurrency: 4,
        qps: 20.0,
        start_qps: 10.0,
        max_pause: Duration::from_secs(2),
        ..opts()
    });
    s.poll();
    s.at(5).loaded(0, &[]);
    for n in ["a", "b", "c", "d", "e"] {
        s.desire(n, Some("v1"));
    }
    s.at(10).changed(&["a", "b", "c", "d", "e"]);
    // Due at 110 ms: one start per 100 ms at 10 writes/s.
    s.at(110).poll_rate();
    s.at(150).finished("a", applied("v1", 1));
    s.at(210).poll_rate();
    s.at(260).finished("b", applied("v1", 1));
    // Two successes: 12 writes/s, a start every 83 ms.
    s.at(293).poll_rate();
    s.at(300).throttled(Some(5000));
    s.at(301).finished("c", Outcome::Throttled);
    // Paused until 2,300 ms (Retry-After 5 s capped at 2 s), at 6 writes/s.
    s.at(400).poll_rate();
    s.at(2300).poll_rate();
    s.at(2310).finished("d", applied("v1", 1));
    s.at(2467).poll_rate();
    s.at(2500).finished("e", applied("v1", 1));
    // The throttled write, again, behind the others: 6 + 10/6 + 10/7.7.
    s.at(2634).poll_rate();
    s.at(2640).finished("c", applied("v1", 1));
    s.poll_rate();
    s.golden("throttled");
}

/// A change of a key no write of which started within the window is
/// written at once (the leading edge); a second lone change after a quiet
/// period longer than the window is again.
#[test]
fn a_lone_change_of_a_quiet_key_is_written_at_once() {
    let mut s = Script::new(opts());
    s.poll();
    s.at(5).loaded(0, &[("web", "v0")]);
    s.synced();
    s.desire("web", Some("v1"));
    s.at(10).changed(&["web"]);
    let first = s.poll();
    s.at(12).finished("web", applied("v1", 1));
    s.poll();
    // Quiet for longer than the window: at once again.
    s.desire("web", Some("v2"));
    s.at(400).changed(&["web"]);
    let second = s.poll();
    s.at(403).finished("web", applied("v2", 1));
    s.poll();
    for (what, actions) in [("first", first), ("second", second)] {
        assert!(
            matches!(actions.as_slice(), [Action::Apply { .. }]),
            "{what} change not written at once: {actions:?}\n{}",
            s.out
        );
    }
    s.golden("lone_change");
}

/// Changes within the window of a write's start wait for the window's end
/// and become one write (the trailing edge); once the key was quiet for a
/// window, the next change is written at once again.
#[test]
fn changes_after_a_leading_write_wait_for_the_window_then_a_quiet_key_is_immediate_again() {
    let mut s = Script::new(opts());
    s.poll();
    s.at(5).loaded(0, &[("web", "v0")]);
    s.synced();
    s.desire("web", Some("v1"));
    s.at(10).changed(&["web"]);
    s.poll();
    s.at(13).finished("web", applied("v1", 1));
    s.poll();
    s.desire("web", Some("v2"));
    s.at(40).changed(&["web"]);
    s.poll();
    s.desire("web", Some("v3"));
    s.at(80).changed(&["web"]);
    s.poll();
    s.at(110).poll();
    s.at(114).finished("web", applied("v3", 1));
    s.poll();
    // 150 ms after the last write started: quiet, written at once.
    s.desire("web", Some("v4"));
    s.at(260).changed(&["web"]);
    let quiet = s.poll();
    s.at(263).finished("web", applied("v4", 1));
    s.poll();
    assert!(
        matches!(quiet.as_slice(), [Action::Apply { .. }]),
        "{}",
        s.out
    );
    s.golden("leading_and_trailing");
}

/// A change while the key's write is in flight is written after the
/// answer: at the window's end when the write was quick, at once when the
/// write took longer than the window.
#[test]
fn a_change_while_the_write_is_in_flight_is_written_after_the_answer() {
    let mut s = Script::new(opts());
    s.poll();
    s.at(5).loaded(0, &[("web", "v0")]);
    s.synced();
    s.desire("web", Some("v1"));
    s.at(10).changed(&["web"]);
    s.poll();
    s.desire("web", Some("v2"));
    s.at(20).changed(&["web"]);
    s.poll();
    s.at(30).finished("web", applied("v1", 1));
    s.poll();
    s.at(110).poll();
    // A slow write: the change waits for the answer, then goes at once.
    s.desire("web", Some("v3"));
    s.at(150).changed(&["web"]);
    s.at(400).finished("web", applied("v2", 1));
    let after = s.poll();
    s.at(410).finished("web", applied("v3", 1));
    s.poll();
    assert!(
        matches!(after.as_slice(), [Action::Apply { .. }]),
        "{}",
        s.out
    );
    assert_eq!(
        s.record
            .service(&PackedKey::new(&key("web")))
            .map(|o| o.version.is("v3")),
        Some(true)
    );
    s.golden("change_in_flight");
}

/// Drives one key through changes at the given times (ms), every write
/// answered `write_ms` after it starts; the start of each write and the
/// time each change was written (the start of the first write after it).
fn run_changes(window_ms: u64, write_ms: u64, changes: &[u64]) -> (Vec<u64>, Vec<u64>) {
    let opts = Options {
        coalesce_window: Duration::from_millis(window_ms),
        ..opts()
    };
    run_changes_with(opts, write_ms, changes)
}

/// [`run_changes`] with the planner's options.
fn run_changes_with(opts: Options, write_ms: u64, changes: &[u64]) -> (Vec<u64>, Vec<u64>) {
    let mut world = World::default();
    world.clusters.insert(String::new(), true);
    let k = key("web");
    let mut p = Planner::new(opts);
    let mut record = Record::default();
    let ms = At::from_millis;
    p.poll(ms(0), &world, &record);
    let ticket = record.list_begins();
    record.listed(ticket, record::Listing::default());
    p.handle(ms(0), Input::Loaded { epoch: 0 }, &world, &record);
    p.handle(ms(0), Input::Synced(String::new()), &world, &record);
    let mut starts = Vec::new();
    // The write in flight: when it is answered, and the version it carries.
    let mut in_flight: Option<(u64, String)> = None;
    let (mut next, mut now) = (0, 0);
    loop {
        // Answers first, then changes, then the poll (as the writer does).
        if let Some((_, v)) = in_flight.take_if(|(t, _)| *t <= now) {
            record.service_written(&k, &v, 1);
            p.handle(
                ms(now),
                Input::Finished {
                    key: k.clone(),
                    outcome: applied(&v, 1),
                },
                &world,
                &record,
            );
        }
        while next < changes.len() && changes[next] <= now {
            world.versions.insert(k.clone(), format!("v{next}"));
            p.handle(
                ms(now),
                Input::Changed(vec![(k.clone(), ms(changes[next]))]),
                &world,
                &record,
            );
            next += 1;
        }
        let (actions, wake) = p.poll(ms(now), &world, &record);
        for a in actions {
            if let Action::Apply { .. } = a {
                starts.push(now);
                in_flight = Some((now + write_ms, world.versions[&k].clone()));
            }
        }
        if next >= changes.len() && in_flight.is_none() && p.idle() {
            break;
        }
        let candidates = [
            changes.get(next).copied(),
            in_flight.as_ref().map(|(t, _)| *t),
            wake.map(|w| w.as_millis() as u64).filter(|w| *w > now),
        ];
        match candidates.into_iter().flatten().min() {
            Some(t) => now = t,
            None => break,
        }
    }
    // Change i is written by the first write starting at or after it.
    let written = changes
        .iter()
        .map(|c| starts.iter().copied().find(|s| s >= c).unwrap_or(u64::MAX))
        .collect();
    (starts, written)
}

/// The writes the trailing-only rule of before made of the same changes
/// (every write answered at once): a write one window after the first
/// change not carried by an earlier write.
fn trailing_only_writes(window_ms: u64, changes: &[u64]) -> usize {
    let mut writes = 0;
    let mut due = None;
    for &c in changes {
        match due {
            Some(d) if c <= d => {}
            _ => {
                writes += 1;
                due = Some(c + window_ms);
            }
        }
    }
    writes
}

/// A burst of changes 10 ms apart for a second: at most one write per
/// window plus the leading one, and the last change is written no later
/// than a window after it happened.
#[test]
fn a_burst_costs_one_write_per_window_plus_one() {
    let changes: Vec<u64> = (0..=100).map(|i| 1000 + i * 10).collect();
    let (starts, written) = run_changes(100, 2, &changes);
    assert!(
        starts.len() <= 1 + 1000 / 100,
        "{} writes: {starts:?}",
        starts.len()
    );
    assert_eq!(
        starts.first(),
        Some(&1000),
        "the first change at once: {starts:?}"
    );
    let last = *changes.last().expect("changes");
    assert!(
        written.last().is_some_and(|w| *w <= last + 100),
        "last change at {last} written at {:?}",
        written.last()
    );
}

proptest::proptest! {
    /// For any changes of one key: writes start at least a window apart (at
    /// most one per window, as before), a change is written at once when no
    /// write started within the window before it and otherwise within the
    /// window (or at the answer of a write in flight), the last state is
    /// written, and there are at most twice the trailing-only rule's writes
    /// (each of its windows meets at most two of ours; one more per burst
    /// is the price of the leading edge: two changes 50 ms apart were one
    /// write, they are two now).
    #[test]
    fn leading_and_trailing_coalescing_bounds(
        gaps in proptest::collection::vec(0u64..300, 1..40),
        write_ms in 0u64..150,
    ) {
        let window = 100;
        let mut changes = Vec::new();
        let mut t = 1000;
        for g in gaps {
            t += g;
            changes.push(t);
        }
        let (starts, written) = run_changes(window, write_ms, &changes);
        for pair in starts.windows(2) {
            proptest::prop_assert!(pair[1] >= pair[0] + window, "{starts:?}");
        }
        for (c, w) in changes.iter().zip(&written) {
            let before = starts.iter().copied().filter(|s| s < c).max();
            let quiet = before.is_none_or(|s| s + window.max(write_ms) <= *c);
            if quiet {
                proptest::prop_assert_eq!(*w, *c, "quiet change at {} ({:?})", c, starts);
            }
            proptest::prop_assert!(*w <= c + window.max(write_ms), "change at {c} written at {w}: {starts:?}");
        }
        proptest::prop_assert!(starts.len() <= 2 * trailing_only_writes(window, &changes));
    }
}

/// With `coalesce_leading_edge: false` the planner is the trailing-only one
/// of before: the scripts older than the leading edge print exactly what
/// they printed then (`testdata/write_plan/trailing_only/`, copied from the
/// commit before it and never rewritten).
#[test]
fn trailing_only_replays_the_plans_of_before() {
    TRAILING_ONLY.set(true);
    first_sync_writes_each_service_once_and_is_synced_when_all_were_attempted();
    a_refused_object_is_reported_and_retried_but_never_holds_readiness();
    a_lost_lease_stops_dispatch_and_a_new_epoch_reloads_before_writing();
    an_apply_superseded_by_a_removal_is_planned_again_as_a_delete();
    drift_is_checked_after_the_write_settled_and_repaired_once();
    an_idle_restart_writes_nothing();
    a_first_list_barrier_before_the_start_up_list_waits_for_it();
    a_shrink_deletes_the_surplus_shards_the_planner_remembers();
    a_grow_is_remembered_and_a_later_delete_removes_every_shard();
    a_drift_repair_of_one_shard_writes_only_that_shard_until_it_succeeds();
    throttled_writes_halve_the_rate_and_pause_for_the_capped_retry_after();
}

/// A rolling update step of maxSurge 1: the new Pod turns Ready, the old
/// one starts terminating 20 ms later. With the leading edge the first
/// change is written at once and the second a window after it (two
/// writes); without it both wait the window and are one write.
#[test]
fn two_changes_20ms_apart_are_two_writes_with_the_leading_edge_and_one_without() {
    let changes = [1000, 1020];
    let (starts, _) = run_changes_with(opts(), 2, &changes);
    assert_eq!(starts, [1000, 1100], "leading edge");
    let trailing = Options {
        coalesce_leading_edge: false,
        ..opts()
    };
    let (starts, written) = run_changes_with(trailing, 2, &changes);
    assert_eq!(starts, [1100], "trailing edge only");
    assert_eq!(written, [1100, 1100]);
}
