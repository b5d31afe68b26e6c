//! The index's desired state must not depend on the ORDER in which it
//! learned the objects: a randomized property test.
//!
//! For both source kinds, a random history mixes endpoint-object
//! events (Endpoints, or several EndpointSlices per service, with bad data:
//! invalid IPs, ports without a number or out of range, not-ready
//! endpoints), Service events (`set_service_uid` with changing UIDs or
//! `None`; `set_service` with random ports, targetPort names and numbers,
//! appProtocols, valid and invalid `kubediscovery.io/weight` and
//! `kubediscovery.io/export` annotations, or `None`), relists fed object by
//! object with Service events arriving in between (the runtime's Service
//! watch shares the endpoint watch's task, see `controller/src/k8s/source.rs`),
//! relists abandoned half-way (a watch error restarts the list), Service
//! relists, and events the index never sees (a watch that was down; a relist
//! later brings them). After the history, every service's desired state
//! (`ServiceNodes`, version included), the set of keys, the warnings, the
//! node count and the unresolved Service ports must equal those of FRESH
//! indexes fed only the final objects: Services first, endpoints first, or
//! both through their relist functions. And the index's value of every key
//! it reported changed (what the runtime holds, and so writes) must be its
//! current state: a change it did not report would never be written.
//!
//! Not compared, by design history-dependent: `take_skipped` and
//! `take_service_news` (a bad object is logged and counted once, when it
//! first appears or changes, not again on every event or relist).
//! Allowed ExternalName Services only in slices mode: in Endpoints mode a
//! Service that stops being an allowed ExternalName leaves its endpoints
//! unpublished until their next event or relist (the index keeps no
//! Endpoints object), which the index documents.
//!
//! proptest draws each history's choices (the setup's, one tape per step)
//! and [`Gen`] makes the history from them, so a failure shrinks: steps
//! removed, choices made plain, while it still fails. It prints the setup
//! and that minimal history, one step a line, and its seed goes to
//! `order_independence.proptest-regressions` beside this file (committed:
//! its cases run first on every run). Each run draws new histories, except
//! with `CI` set (fixed seed) or `PROPTEST_RNG_SEED=<n>`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use kube_discovery_core::index::{INCREMENTAL_MIN_SLICES, SERVICE_NAME_LABEL};
use kube_discovery_core::source::filter::AnchoredRegex;
use kube_discovery_core::source::lean::{LeanEndpointSlice, LeanEndpoints, LeanService};
use kube_discovery_core::source::service::ServiceInfo;
use kube_discovery_core::{
    ConvertOptions, Drain, Index, LabelSelector, NamespaceFilter, ServiceKey, ServiceNodes,
    SourceKind,
};
use proptest::prelude::{ProptestConfig, Rng as _, TestCaseError, proptest};
use proptest::strategy::{NewTree, Strategy, ValueTree};
use proptest::test_runner::{FileFailurePersistence, RngSeed, TestRunner, basic_result_cache};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

/// `(namespace, name)` of a Service or of an endpoint object.
type Id = (String, String);

const NAMESPACES: [&str; 2] = ["n1", "n2"];
const SERVICES: [&str; 3] = ["a", "b", "c"];

/// Histories per source kind.
const HISTORIES: u32 = 150;
/// Steps per history (before shrinking).
const STEPS: usize = 40;
/// Choices drawn for a step, and for the setup (with a big service, its
/// first listing); a history reads fewer and drops the rest (see
/// [`normalize`]).
const STEP_CHOICES: usize = 256;
const SETUP_CHOICES: usize = 1024;

/// One thing that happens to the index, kept as data so that a failing
/// history can be printed and replayed.
#[derive(Clone)]
enum Step {
    /// An endpoint object (Endpoints or EndpointSlice) added or modified.
    Apply(Value),
    /// An endpoint object deleted.
    Delete(Value),
    /// `set_service_uid`.
    Uid(Id, Option<String>),
    /// `set_service` with the info of this Service object (`None`: deleted).
    Service(Id, Option<Value>),
    /// A relist of the endpoint objects: `begin_reset`, `reset_add_*` of
    /// each listed object, with `during` steps (Service events) fed after the
    /// given number of listed objects; then `finish_reset_*`, unless
    /// `finished` is false (a watch error: the next relist starts over).
    Relist {
        listed: Vec<Value>,
        during: Vec<(usize, Step)>,
        finished: bool,
    },
    /// A relist of the Services: `reset_services` then `reset_service_uids`
    /// (the runtime's order).
    RelistServices {
        infos: Vec<(Id, Value)>,
        uids: Vec<(Id, String)>,
    },
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Step::Apply(v) => write!(f, "apply {v}"),
            Step::Delete(v) => write!(f, "delete {}", v["metadata"]),
            Step::Uid((ns, name), uid) => write!(f, "set_service_uid {ns}/{name} {uid:?}"),
            Step::Service((ns, name), None) => write!(f, "set_service {ns}/{name} None"),
            Step::Service(_, Some(v)) => write!(f, "set_service {v}"),
            Step::Relist {
                listed,
                during,
                finished,
            } => {
                write!(f, "relist (finished: {finished})")?;
                for i in 0..=listed.len() {
                    for (_, s) in during.iter().filter(|(at, _)| *at == i) {
                        // Nested lines (a Service relist) indented under it.
                        let s = s.to_string().replace('\n', "\n        ");
                        write!(f, "\n      meanwhile: {s}")?;
                    }
                    if let Some(o) = listed.get(i) {
                        write!(f, "\n    listed {o}")?;
                    }
                }
                Ok(())
            }
            Step::RelistServices { infos, uids } => {
                write!(f, "relist Services")?;
                for (_, v) in infos {
                    write!(f, "\n    listed {v}")?;
                }
                write!(f, "\n    uids {uids:?}")
            }
        }
    }
}

/// The objects as the API server has them now (what a relist returns).
#[derive(Clone, Default)]
struct World {
    /// Endpoint objects by `(namespace, object name)`.
    objects: BTreeMap<Id, Value>,
    /// Service UIDs (what `set_service_uid` is told).
    uids: BTreeMap<Id, String>,
    /// Services (what `set_service` is told).
    services: BTreeMap<Id, Value>,
}

impl World {
    fn listed_objects(&self) -> Vec<Value> {
        self.objects.values().cloned().collect()
    }
    fn listed_services(&self) -> Step {
        Step::RelistServices {
            infos: self
                .services
                .iter()
                .map(|(id, v)| (id.clone(), v.clone()))
                .collect(),
            uids: self
                .uids
                .iter()
                .map(|(id, u)| (id.clone(), u.clone()))
                .collect(),
        }
    }
}

/// An object as the runtime's watch decodes it (the lean types: an
/// Endpoints port without a number decodes, as from the API server).
fn lean<T: DeserializeOwned>(v: &Value) -> T {
    serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{e}: {v}"))
}

fn info(v: &Value) -> ServiceInfo {
    ServiceInfo::from_service(&lean::<LeanService>(v))
}

fn id_of(v: &Value) -> Id {
    let m = &v["metadata"];
    (
        m["namespace"].as_str().unwrap_or_default().to_string(),
        m["name"].as_str().unwrap_or_default().to_string(),
    )
}

/// Feeds one step to `idx`; returns the keys it reported changed.
fn feed(idx: &mut Index, kind: SourceKind, step: &Step) -> Vec<ServiceKey> {
    match (step, kind) {
        (Step::Apply(v), SourceKind::Endpoints) => idx.apply_endpoints(&lean::<LeanEndpoints>(v)),
        (Step::Apply(v), SourceKind::EndpointSlice) => {
            idx.apply_slice(&lean::<LeanEndpointSlice>(v))
        }
        (Step::Delete(v), SourceKind::Endpoints) => idx.delete_endpoints(&lean::<LeanEndpoints>(v)),
        (Step::Delete(v), SourceKind::EndpointSlice) => {
            idx.delete_slice(&lean::<LeanEndpointSlice>(v))
        }
        (Step::Uid((ns, name), uid), _) => idx.set_service_uid(ns, name, uid.clone()),
        (Step::Service((ns, name), v), _) => idx.set_service(ns, name, v.as_ref().map(info)),
        (
            Step::Relist {
                listed,
                during,
                finished,
            },
            _,
        ) => {
            let mut changed = Vec::new();
            idx.begin_reset();
            for i in 0..=listed.len() {
                for (_, s) in during.iter().filter(|(at, _)| *at == i) {
                    changed.extend(feed(idx, kind, s));
                }
                match (listed.get(i), kind) {
                    (Some(v), SourceKind::Endpoints) => {
                        idx.reset_add_endpoints(&lean::<LeanEndpoints>(v))
                    }
                    (Some(v), SourceKind::EndpointSlice) => {
                        idx.reset_add_slice(&lean::<LeanEndpointSlice>(v))
                    }
                    (None, _) => {}
                }
            }
            match (finished, kind) {
                (false, _) => {}
                (true, SourceKind::Endpoints) => changed.extend(idx.finish_reset_endpoints()),
                (true, SourceKind::EndpointSlice) => changed.extend(idx.finish_reset_slices()),
            }
            changed
        }
        (Step::RelistServices { infos, uids }, _) => {
            let mut changed = idx.reset_services(
                infos
                    .iter()
                    .map(|((ns, name), v)| (ns.clone(), name.clone(), info(v))),
            );
            changed.extend(
                idx.reset_service_uids(
                    uids.iter()
                        .map(|((ns, name), u)| (ns.clone(), name.clone(), u.clone())),
                ),
            );
            changed
        }
    }
}

// ---------------------------------------------------------------- generators

/// A history's generator: the world it changes, and a resourceVersion
/// counter (the API server bumps it on every write, which the index relies
/// on to reuse an unchanged object on a relist).
struct Gen {
    rng: Tape,
    kind: SourceKind,
    /// Slices mode: whether service `n1/a` is big, with
    /// [`INCREMENTAL_MIN_SLICES`] slices or more (merged incrementally)
    /// and half of the object and Service events.
    big: bool,
    /// How many objects of 4 carry an ownerReference ([`Gen::owner`]).
    owner_refs: u64,
    world: World,
    version: u64,
}

impl Gen {
    fn resource_version(&mut self) -> Value {
        self.version += 1;
        // Sometimes none: such an object is always converted again.
        if self.rng.one_in(10) {
            Value::Null
        } else {
            json!(self.version.to_string())
        }
    }

    fn ip(&mut self) -> String {
        if self.rng.one_in(8) {
            self.rng
                .pick(&["", "999.0.0.1", "1.2.3", "localhost", "10.0.0.01"])
                .to_string()
        } else {
            format!("10.0.{}.{}", self.rng.below(2), self.rng.below(4))
        }
    }

    fn ips(&mut self) -> Vec<String> {
        (0..self.rng.below(4)).map(|_| self.ip()).collect()
    }

    /// Endpoint ports: named or not, some without a number or out of range.
    fn ports(&mut self) -> Value {
        let n = 1 + self.rng.below(3);
        Value::Array(
            (0..n)
                .map(|_| {
                    let mut p = json!({});
                    let name = self.rng.pick(&["http", "http", "grpc", "", "metrics"]);
                    if !name.is_empty() {
                        p["name"] = json!(name);
                    }
                    match self.rng.below(10) {
                        7 => {} // no number
                        8 => p["port"] = json!(0),
                        9 => p["port"] = json!(65536),
                        _ => p["port"] = json!(8080 + self.rng.below(3)),
                    }
                    p
                })
                .collect(),
        )
    }

    /// ownerReferences naming a Service, in 0, 1 or 3 objects of 4 (per
    /// history: with one on every object the Service UID never shows).
    fn owner(&mut self, meta: &mut Value) {
        if self.rng.below(4) >= 4 - self.owner_refs {
            let uid = self.rng.pick(&["o1", "o2"]);
            meta["ownerReferences"] = json!([{"apiVersion": "v1", "kind": "Service",
                "name": "x", "uid": uid}]);
        }
    }

    /// A random endpoint object of service `svc` (for slices: one of its
    /// slices, once in a while labelled for another service or not at all).
    /// `slice`: which of the service's slices (`<svc>-<n>`), else random.
    fn object(&mut self, ns: &str, svc: &str, slice: Option<usize>) -> Value {
        let mut meta = json!({"namespace": ns, "resourceVersion": self.resource_version()});
        self.owner(&mut meta);
        let mut labels = json!({});
        if self.rng.one_in(6) {
            labels["env"] = json!("test");
        }
        match self.kind {
            SourceKind::Endpoints => {
                meta["name"] = json!(svc);
                meta["labels"] = labels;
                let subsets: Vec<Value> = (0..self.rng.below(3))
                    .map(|_| {
                        let ready: Vec<Value> =
                            self.ips().into_iter().map(|ip| json!({"ip": ip})).collect();
                        let not_ready: Vec<Value> =
                            self.ips().into_iter().map(|ip| json!({"ip": ip})).collect();
                        json!({"addresses": ready, "notReadyAddresses": not_ready,
                               "ports": self.ports()})
                    })
                    .collect();
                json!({"metadata": meta, "subsets": subsets})
            }
            SourceKind::EndpointSlice => {
                let n = slice.unwrap_or_else(|| {
                    let names = if self.big {
                        INCREMENTAL_MIN_SLICES + 4
                    } else {
                        3
                    };
                    usize::try_from(self.rng.below(names as u64)).unwrap_or(0)
                });
                meta["name"] = json!(format!("{svc}-{n}"));
                match self.rng.below(20) {
                    18 => {}
                    19 => labels[SERVICE_NAME_LABEL] = json!(self.rng.pick(&SERVICES)),
                    _ => labels[SERVICE_NAME_LABEL] = json!(svc),
                }
                meta["labels"] = labels;
                let endpoints: Vec<Value> = self
                    .ips()
                    .into_iter()
                    .map(|ip| {
                        let mut conditions = json!({});
                        for c in ["ready", "serving", "terminating"] {
                            match self.rng.below(4) {
                                2 => conditions[c] = json!(false),
                                3 => conditions[c] = json!(true),
                                _ => {}
                            }
                        }
                        json!({"addresses": [ip], "conditions": conditions})
                    })
                    .collect();
                json!({"metadata": meta, "addressType": "IPv4", "endpoints": endpoints,
                       "ports": self.ports()})
            }
        }
    }

    /// A random Service: ports with targetPort names and numbers and
    /// appProtocols; weight and export annotations, valid or not.
    fn service(&mut self, ns: &str, name: &str) -> Value {
        let mut annotations = json!({});
        match self.rng.below(5) {
            2 => annotations["kubediscovery.io/weight"] = json!("7"),
            3 => annotations["kubediscovery.io/weight"] = json!("0"),
            4 => annotations["kubediscovery.io/weight"] = json!(self.rng.pick(&["-1", "heavy"])),
            _ => {}
        }
        match self.rng.below(8) {
            5 => annotations["kubediscovery.io/export"] = json!("false"),
            6 => annotations["kubediscovery.io/export"] = json!("true"),
            7 => annotations["kubediscovery.io/export"] = json!("maybe"),
            _ => {}
        }
        let ports: Vec<Value> = (0..self.rng.below(3))
            .map(|i| {
                let mut p = json!({"name": self.rng.pick(&["web", "http", "grpc", ""]),
                                   "port": 80 + i});
                match self.rng.below(4) {
                    2 => p["targetPort"] = json!(self.rng.pick(&["http", "grpc", "nope"])),
                    3 => p["targetPort"] = json!(8080 + self.rng.below(3)),
                    _ => {}
                }
                if self.rng.one_in(3) {
                    p["appProtocol"] = json!(self.rng.pick(&["http", "kubernetes.io/h2c"]));
                }
                p
            })
            .collect();
        let mut spec = json!({"ports": ports});
        if self.rng.one_in(6) {
            spec["type"] = json!("ExternalName");
            spec["externalName"] =
                json!(
                    self.rng
                        .pick(&["db.example.com", "db.other.org", "not a host!"])
                );
        }
        json!({"metadata": {"namespace": ns, "name": name, "annotations": annotations},
               "spec": spec})
    }

    /// A random service; with a big service, that one half of the time.
    fn some_id(&mut self) -> Id {
        if self.big && self.rng.below(2) == 0 {
            return ("n1".to_string(), "a".to_string());
        }
        (
            self.rng.pick(&NAMESPACES).to_string(),
            self.rng.pick(&SERVICES).to_string(),
        )
    }

    /// A change of an endpoint object: applied to the world, returned as
    /// the event that tells the index.
    fn object_event(&mut self) -> Step {
        let (ns, svc) = self.some_id();
        let v = self.object(&ns, &svc, None);
        let id = id_of(&v);
        if self.rng.one_in(5)
            && let Some(old) = self.world.objects.remove(&id)
        {
            return Step::Delete(old);
        }
        self.world.objects.insert(id, v.clone());
        Step::Apply(v)
    }

    /// A change of a Service (its UID or the object): applied to the world.
    fn service_event(&mut self) -> Step {
        let id = self.some_id();
        if self.rng.below(2) == 0 {
            let uid = match self.rng.one_in(4) {
                true => None,
                false => Some(self.rng.pick(&["u1", "u2", "u3"]).to_string()),
            };
            match &uid {
                Some(u) => self.world.uids.insert(id.clone(), u.clone()),
                None => self.world.uids.remove(&id),
            };
            Step::Uid(id, uid)
        } else {
            let v = (!self.rng.one_in(4)).then(|| self.service(&id.0, &id.1));
            match &v {
                Some(v) => self.world.services.insert(id.clone(), v.clone()),
                None => self.world.services.remove(&id),
            };
            Step::Service(id, v)
        }
    }

    /// A relist of the endpoint objects, Service events arriving meanwhile.
    /// The objects are listed in a random order: the API server lists by
    /// key, but nothing in the index may depend on that.
    fn relist(&mut self, finished: bool) -> Step {
        let mut listed = self.world.listed_objects();
        for i in (1..listed.len()).rev() {
            let j = usize::try_from(self.rng.below(i as u64 + 1)).unwrap_or(0);
            listed.swap(i, j);
        }
        // Where the Service events come, in the order they are fed (and
        // so applied to the world).
        let mut at: Vec<usize> = (0..self.rng.below(3))
            .map(|_| usize::try_from(self.rng.below(listed.len() as u64 + 1)).unwrap_or(0))
            .collect();
        at.sort_unstable();
        let mut during = Vec::new();
        for at in at {
            let s = if self.rng.one_in(4) {
                self.world.listed_services()
            } else {
                self.service_event()
            };
            during.push((at, s));
        }
        Step::Relist {
            listed,
            during,
            finished,
        }
    }

    /// The history of `choices`, each step made from its own choices (the
    /// setup's tape is read already: a big service's first listing reads
    /// on); the world then holds its final objects. Also returns how many
    /// choices of each tape were read.
    fn history(&mut self, choices: &Choices) -> (Vec<Step>, Used) {
        let mut steps = Vec::new();
        if self.big {
            // n1/a starts big: listed with more slices than the threshold.
            for n in 0..INCREMENTAL_MIN_SLICES + 2 {
                let v = self.object("n1", "a", Some(n));
                self.world.objects.insert(id_of(&v), v);
            }
            steps.push(self.relist(true));
        }
        // Changes the index missed (a watch that was down): a relist of
        // that kind must come before the end.
        let (mut missed_objects, mut missed_services) = (false, false);
        let mut used = Used {
            setup: self.rng.used,
            steps: Vec::new(),
            end: 0,
        };
        for tape in &choices.steps {
            self.rng = Tape::new(tape);
            match self.rng.below(20) {
                n @ 0..=14 => {
                    let objects = n <= 7;
                    let s = if objects {
                        self.object_event()
                    } else {
                        self.service_event()
                    };
                    match (self.rng.one_in(8), objects) {
                        (true, true) => missed_objects = true,
                        (true, false) => missed_services = true,
                        (false, _) => steps.push(s),
                    }
                }
                15 | 16 => {
                    if self.rng.one_in(4) {
                        // A relist cut short by a watch error, and the next.
                        let cut = self.relist(false);
                        steps.push(cut);
                    }
                    let s = self.relist(true);
                    // Service relists inside it may also bring the missed.
                    missed_services &= !matches!(&s, Step::Relist { during, .. }
                        if during.iter().any(|(_, d)| matches!(d, Step::RelistServices { .. })));
                    steps.push(s);
                    missed_objects = false;
                }
                _ => {
                    steps.push(self.world.listed_services());
                    missed_services = false;
                }
            }
            used.steps.push(self.rng.used);
        }
        self.rng = Tape::new(&choices.end);
        if missed_objects {
            steps.push(self.relist(true));
        }
        if missed_services {
            steps.push(self.world.listed_services());
        }
        used.end = self.rng.used;
        (steps, used)
    }
}

// ---------------------------------------------------------------- the choices

/// The choices of one history, drawn by proptest and read by [`Gen`]: the
/// setup's, one tape per step (so a step stays meaningful when another is
/// removed: it acts on whatever world the steps before it made), and the
/// closing relists'.
#[derive(Clone)]
struct Choices {
    setup: Vec<u32>,
    steps: Vec<Vec<u32>>,
    end: Vec<u32>,
}

/// One line, also in the regressions file.
impl fmt::Debug for Choices {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Choices { setup, steps, end } = self;
        write!(
            f,
            "Choices {{ setup: {setup:?}, steps: {steps:?}, end: {end:?} }}"
        )
    }
}

impl Choices {
    /// The setup's tape, the steps', the closing relists'.
    fn tapes(&self) -> impl Iterator<Item = &Vec<u32>> {
        std::iter::once(&self.setup)
            .chain(&self.steps)
            .chain(std::iter::once(&self.end))
    }
    fn tapes_mut(&mut self) -> impl Iterator<Item = &mut Vec<u32>> {
        std::iter::once(&mut self.setup)
            .chain(&mut self.steps)
            .chain(std::iter::once(&mut self.end))
    }
}

/// How many choices of each tape of [`Choices`] a history read.
struct Used {
    setup: usize,
    steps: Vec<usize>,
    end: usize,
}

/// Choices read one at a time: choice `v` among `n` options is `v % n`, and
/// past the end every choice is 0. The generator makes option 0 the plain
/// one (no bad data, no extra object, nothing missed), so shrinking a choice
/// to 0 simplifies the history.
struct Tape {
    choices: Vec<u32>,
    used: usize,
}

impl Tape {
    fn new(choices: &[u32]) -> Self {
        Tape {
            choices: choices.to_vec(),
            used: 0,
        }
    }
    /// In `0..n` (0 when `n` is 0).
    fn below(&mut self, n: u64) -> u64 {
        let v = self.choices.get(self.used).copied().unwrap_or(0);
        self.used += 1;
        if n == 0 { 0 } else { u64::from(v) % n }
    }
    fn pick<'a>(&mut self, v: &[&'a str]) -> &'a str {
        v[usize::try_from(self.below(v.len() as u64)).unwrap_or(0)]
    }
    /// True one time in `k` (false for choice 0).
    fn one_in(&mut self, k: u64) -> bool {
        self.below(k) + 1 == k
    }
}

/// A history made from its choices.
struct History {
    setup: Setup,
    steps: Vec<Step>,
    /// The final objects.
    world: World,
    used: Used,
}

fn interpret(kind: SourceKind, choices: &Choices) -> History {
    let mut rng = Tape::new(&choices.setup);
    let setup = Setup::random(kind, &mut rng);
    let big = kind == SourceKind::EndpointSlice && rng.one_in(2);
    let owner_refs = [0, 1, 3][usize::try_from(rng.below(3)).unwrap_or(0)];
    let mut g = Gen {
        rng,
        kind,
        big,
        owner_refs,
        world: World::default(),
        version: 0,
    };
    let (steps, used) = g.history(choices);
    History {
        setup,
        steps,
        world: g.world,
        used,
    }
}

/// The same history with the choices it does not read dropped (and the
/// trailing zeros: past its end a tape reads 0), so that the choices
/// proptest prints and shrinks are only those that matter.
fn normalize(kind: SourceKind, choices: &Choices) -> Choices {
    let used = interpret(kind, choices).used;
    let cut = |tape: &[u32], n: usize| {
        let mut t = tape[..n.min(tape.len())].to_vec();
        while t.last() == Some(&0) {
            t.pop();
        }
        t
    };
    Choices {
        setup: cut(&choices.setup, used.setup),
        steps: choices
            .steps
            .iter()
            .zip(used.steps)
            .map(|(t, n)| cut(t, n))
            .collect(),
        end: cut(&choices.end, used.end),
    }
}

/// Draws the [`Choices`] of a history of [`STEPS`] steps for a source kind.
#[derive(Debug)]
struct Histories(SourceKind);

impl Strategy for Histories {
    type Tree = Shrinker;
    type Value = Choices;

    fn new_tree(&self, runner: &mut TestRunner) -> NewTree<Self> {
        // One draw of proptest's generator a tape (its ChaCha is slow in a
        // test build), fastrand's for the choices.
        let rng = runner.rng();
        let mut tape = |n: usize| -> Vec<u32> {
            let mut r = fastrand::Rng::with_seed(rng.next_u64());
            (0..n).map(|_| r.u32(..)).collect()
        };
        let choices = Choices {
            setup: tape(SETUP_CHOICES),
            steps: (0..STEPS).map(|_| tape(STEP_CHOICES)).collect(),
            end: tape(STEP_CHOICES),
        };
        Ok(Shrinker {
            current: normalize(self.0, &choices),
            kind: self.0,
            last_failing: None,
            next: Cut::Remove(0),
            tried: Cut::Remove(0),
            progress: false,
        })
    }
}

/// A simplification of [`Choices`].
#[derive(Clone, Copy)]
enum Cut {
    /// Remove the step of this index.
    Remove(usize),
    /// Set choice `.1` of tape `.0` ([`Choices::tapes`]) to 0.
    Zero(usize, usize),
}

/// Shrinks a failing history: rounds of removing each step, then setting
/// each choice read to 0, while a round keeps a simplification (one that
/// still fails). Each candidate is tested once: proptest tests the value
/// restored by `complicate` again, which its result cache answers.
struct Shrinker {
    kind: SourceKind,
    current: Choices,
    /// The last failing choices while `current` is a candidate.
    last_failing: Option<Choices>,
    /// The next simplification to try, and the last one tried.
    next: Cut,
    tried: Cut,
    /// Whether this round kept a simplification.
    progress: bool,
}

impl Shrinker {
    /// The next candidate of this round, from `next` on.
    fn candidate(&mut self) -> Option<Choices> {
        loop {
            match self.next {
                Cut::Remove(i) if i < self.current.steps.len() => {
                    self.tried = self.next;
                    self.next = Cut::Remove(i + 1);
                    let mut c = self.current.clone();
                    c.steps.remove(i);
                    return Some(c);
                }
                Cut::Remove(_) => self.next = Cut::Zero(0, 0),
                Cut::Zero(t, j) => {
                    let tape = self.current.tapes().nth(t)?;
                    match tape.get(j) {
                        None => self.next = Cut::Zero(t + 1, 0),
                        Some(0) => self.next = Cut::Zero(t, j + 1),
                        Some(_) => {
                            self.tried = self.next;
                            self.next = Cut::Zero(t, j + 1);
                            let mut c = self.current.clone();
                            if let Some(v) = c.tapes_mut().nth(t).and_then(|t| t.get_mut(j)) {
                                *v = 0;
                            }
                            return Some(c);
                        }
                    }
                }
            }
        }
    }
}

impl ValueTree for Shrinker {
    type Value = Choices;

    fn current(&self) -> Choices {
        self.current.clone()
    }

    /// Called while `current` fails.
    fn simplify(&mut self) -> bool {
        if self.last_failing.take().is_some() {
            // The candidate fails too: keep it. The step after a removed
            // one now has its index.
            self.progress = true;
            if let Cut::Remove(i) = self.tried {
                self.next = Cut::Remove(i);
            }
            self.current = normalize(self.kind, &self.current);
        }
        loop {
            if let Some(c) = self.candidate() {
                self.last_failing = Some(std::mem::replace(&mut self.current, c));
                return true;
            }
            if !self.progress {
                return false;
            }
            self.progress = false;
            self.next = Cut::Remove(0);
        }
    }

    /// Called when `current` passes: back to the last failing choices.
    fn complicate(&mut self) -> bool {
        match self.last_failing.take() {
            Some(c) => {
                self.current = c;
                true
            }
            None => false,
        }
    }
}

// ---------------------------------------------------------------- the property

/// Everything of the index that must not depend on the order of events.
#[derive(Debug, PartialEq)]
struct Observed {
    services: BTreeMap<ServiceKey, ServiceNodes>,
    warnings: BTreeMap<String, Vec<String>>,
    node_count: usize,
    /// Unresolved Service ports of every possible key (withheld services
    /// included: this is how their kept state shows).
    unresolved: BTreeMap<ServiceKey, Vec<String>>,
}

fn observe(idx: &Index) -> Observed {
    let unresolved = NAMESPACES
        .iter()
        .flat_map(|ns| SERVICES.iter().map(move |s| ServiceKey::new("", *ns, *s)))
        .map(|k| {
            let u = idx.unresolved_ports(&k).to_vec();
            (k, u)
        })
        .filter(|(_, u)| !u.is_empty())
        .collect();
    Observed {
        services: idx.iter().map(|s| (s.key.clone(), s.clone())).collect(),
        warnings: idx
            .warnings()
            .map(|(k, w)| (k.clone(), w.clone()))
            .collect(),
        node_count: idx.node_count(),
        unresolved,
    }
}

/// The fresh indexes fed only the final objects of `world`, by name.
fn fresh(world: &World, setup: &Setup) -> Vec<(&'static str, Index)> {
    let kind = setup.kind;
    let new = || setup.index();
    let services: Vec<Step> = world
        .services
        .iter()
        .map(|(id, v)| Step::Service(id.clone(), Some(v.clone())))
        .chain(
            world
                .uids
                .iter()
                .map(|(id, u)| Step::Uid(id.clone(), Some(u.clone()))),
        )
        .collect();
    let objects: Vec<Step> = world.objects.values().cloned().map(Step::Apply).collect();
    let relist = Step::Relist {
        listed: world.listed_objects(),
        during: Vec::new(),
        finished: true,
    };
    let services_relist = world.listed_services();
    let orders: [(&str, Vec<&Step>); 4] = [
        (
            "Services then endpoints",
            services.iter().chain(&objects).collect(),
        ),
        (
            "endpoints then Services",
            objects.iter().chain(&services).collect(),
        ),
        (
            "Service relist then endpoint relist",
            vec![&services_relist, &relist],
        ),
        (
            "endpoint relist then Service relist",
            vec![&relist, &services_relist],
        ),
    ];
    orders
        .into_iter()
        .map(|(name, steps)| {
            let mut idx = new();
            for s in steps {
                feed(&mut idx, kind, s);
            }
            (name, idx)
        })
        .collect()
}

/// How a history's indexes are made.
#[derive(Debug)]
struct Setup {
    kind: SourceKind,
    opts: ConvertOptions,
    filter: NamespaceFilter,
    labels: LabelSelector,
}

impl Setup {
    /// Random options (the ones that change what a Service event rebuilds),
    /// sometimes a namespace filter and a label selector (an object or
    /// Service they leave out is treated as deleted).
    ///
    /// ExternalName Services are allowed (`*.example.com`) in slices mode
    /// only: in Endpoints mode a Service that stops being an allowed
    /// ExternalName leaves its endpoints unpublished until their next event
    /// or relist (the index keeps no Endpoints object; documented in
    /// `Index::refresh_owner`), a difference by design.
    fn random(kind: SourceKind, rng: &mut Tape) -> Self {
        let filter = match rng.one_in(6) {
            true => NamespaceFilter::NotEqual("n2".into()),
            false => NamespaceFilter::All,
        };
        let labels = match rng.one_in(6) {
            true => LabelSelector::parse("env!=test").expect("selector"),
            false => LabelSelector::default(),
        };
        let mut opts = options(rng);
        if kind == SourceKind::EndpointSlice && rng.one_in(3) {
            let allow = AnchoredRegex::new(r".*\.example\.com\.?").expect("regex");
            opts.external_name = Some(vec![allow]);
        }
        Setup {
            kind,
            opts,
            filter,
            labels,
        }
    }

    fn index(&self) -> Index {
        Index::new(
            String::new(),
            self.kind,
            self.opts.clone(),
            self.filter.clone(),
        )
        .with_label_selector(self.labels.clone())
    }
}

/// Random options: the ones that change what a Service event rebuilds.
fn options(rng: &mut Tape) -> ConvertOptions {
    ConvertOptions {
        service_port_aliases: rng.one_in(2),
        export_opt_in: rng.one_in(4),
        index_port_numbers: rng.one_in(4),
        drain_terminating: match rng.below(3) {
            0 => Drain::Off,
            1 => Drain::Fallback,
            _ => Drain::Always,
        },
        default_weight: 50,
        ..ConvertOptions::default()
    }
}

/// Runs the history of `choices` for `kind`; `Err` describes the first
/// difference, with the setup and the history.
fn check(kind: SourceKind, choices: &Choices) -> Result<(), String> {
    let History {
        setup,
        steps,
        world,
        ..
    } = interpret(kind, choices);
    let mut idx = setup.index();
    // What the runtime holds (`ControllerState`): the index's own value of
    // every key it reported changed. Holding them also makes the index take
    // its copy-on-write paths, as in production.
    let mut held: BTreeMap<ServiceKey, Arc<ServiceNodes>> = BTreeMap::new();
    for s in &steps {
        for key in feed(&mut idx, kind, s) {
            match idx.get_arc(&key) {
                Some(v) => held.insert(key, v),
                None => held.remove(&key),
            };
        }
    }
    let got = observe(&idx);
    let held: BTreeMap<ServiceKey, ServiceNodes> =
        held.into_iter().map(|(k, v)| (k, (*v).clone())).collect();
    // Everything needed to reproduce a failure.
    let failure = |what: String, diff: String| {
        let history: Vec<String> = steps
            .iter()
            .enumerate()
            .map(|(i, s)| format!("  {i:>2}. {s}"))
            .collect();
        format!(
            "{kind:?}: {what}\n{diff}\n{setup:?}\nhistory:\n{}\n",
            history.join("\n")
        )
    };
    if held != got.services {
        let runtime = Observed {
            services: held,
            ..observe(&idx)
        };
        return Err(failure(
            "a change was not reported (what the runtime holds differs from the index)".into(),
            diff(&runtime, &got, ["runtime", "index"]),
        ));
    }
    for (order, f) in fresh(&world, &setup) {
        let want = observe(&f);
        if got != want {
            return Err(failure(
                format!("the history differs from a fresh index fed {order}"),
                diff(&got, &want, ["history", "fresh"]),
            ));
        }
    }
    Ok(())
}

/// What differs between `a` and `b`, named by `names` (e.g. the history's
/// state and a fresh one's).
fn diff(a: &Observed, b: &Observed, names: [&str; 2]) -> String {
    let [x, y] = names;
    let mut out = Vec::new();
    let mut field = |what: String, l: &dyn fmt::Debug, r: &dyn fmt::Debug| {
        out.push(format!("{what}:\n  {x}: {l:?}\n  {y}: {r:?}"));
    };
    let keys: std::collections::BTreeSet<&ServiceKey> =
        a.services.keys().chain(b.services.keys()).collect();
    for k in keys {
        let (l, r) = (a.services.get(k), b.services.get(k));
        if l != r {
            field(format!("service {k:?}"), &l, &r);
        }
    }
    if a.warnings != b.warnings {
        field("warnings".into(), &a.warnings, &b.warnings);
    }
    if a.node_count != b.node_count {
        field("node_count".into(), &a.node_count, &b.node_count);
    }
    if a.unresolved != b.unresolved {
        field("unresolved ports".into(), &a.unresolved, &b.unresolved);
    }
    out.join("\n")
}

/// [`HISTORIES`] cases. Locally each run draws new histories; CI (`CI`
/// set) draws the same ones every run unless `PROPTEST_RNG_SEED` says.
fn config() -> ProptestConfig {
    let mut config = ProptestConfig {
        cases: HISTORIES,
        // A candidate the shrinker rejects is restored and tested again:
        // this answers that second test.
        result_cache: basic_result_cache,
        // Beside this file (the default looks for a `src/` it has not).
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource(
            "proptest-regressions",
        ))),
        ..ProptestConfig::default()
    };
    if std::env::var_os("CI").is_some() && config.rng_seed == RngSeed::Random {
        config.rng_seed = RngSeed::Fixed(0x9E37_79B9_7F4A_7C15);
    }
    config
}

proptest! {
    #![proptest_config(config())]

    /// See the module docs.
    #[test]
    fn desired_state_does_not_depend_on_the_order_of_events_endpoints(
        choices in Histories(SourceKind::Endpoints)
    ) {
        check(SourceKind::Endpoints, &choices).map_err(TestCaseError::fail)?;
    }

    /// See the module docs.
    #[test]
    fn desired_state_does_not_depend_on_the_order_of_events_slices(
        choices in Histories(SourceKind::EndpointSlice)
    ) {
        check(SourceKind::EndpointSlice, &choices).map_err(TestCaseError::fail)?;
    }
}
