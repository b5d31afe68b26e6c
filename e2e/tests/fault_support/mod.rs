//! Helpers of the fault suite (`fault_*.rs`), on top of `controller_support`,
//! for both backends (kube-sim, or the real API server behind the fault proxy):
//!
//! * [`truth`]: the DiscoveredServices that SHOULD exist, computed
//!   independently of the controller: the source objects are listed from
//!   the API server and rendered with the pure core's `render` (the same
//!   config text, so the same options); [`wait_converged`] compares every
//!   DiscoveredService on the API server with it (missing, extra, stale spec);
//! * [`Sources`]: the test's own record of the source objects it wrote
//!   (addresses, readiness, ports) and the DiscoveredService specs they must
//!   give, derived by hand from the documented rules, NOT by the core's
//!   conversion code, so a conversion bug shared by the controller and
//!   `render` still fails ([`Churn::wait_converged`] checks both);
//! * [`Churn`]: a bounded, seeded stream of EndpointSlice/Endpoints changes
//!   over a few services (add/remove endpoints, flip readiness, change a port,
//!   delete and re-create a source), recorded in its [`Sources`];
//! * faults (kube-sim's `/_sim/faults` requests, on the real backend applied
//!   by the fault proxy), request statistics, metrics scraping, signals.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Endpoints;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams};
use kube_discovery_core::config::parse_config;
use kube_discovery_core::render::{RenderOptions, render};
use serde_json::{Value, json};

use crate::controller_support::{Controller, Env, Options, eventually};

/// `ns/name` -> `spec` of every DiscoveredService.
pub type Specs = BTreeMap<String, Value>;

/// Which source kind a test watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Slices,
    Endpoints,
}

/// Single-cluster config for `env`, authenticating with `token`.
pub fn config(env: &Env, token: &str, kind: Kind, extra_settings: &str) -> String {
    let slices = if kind == Kind::Slices {
        "    watch_endpoint_slices: true\n"
    } else {
        ""
    };
    format!(
        "discovery:\n  kubernetes:\n{}{slices}kube_discovery:\n  coalesce_window: 20ms\n{extra_settings}",
        env.service_block(token)
    )
}

/// Options with plain users `names`, each in `system:masters` (full rights),
/// whose tokens [`user_token`] gives (real: the static token file).
pub fn masters(names: &[&str]) -> Options {
    Options {
        users: names
            .iter()
            .map(|n| (n.to_string(), vec!["system:masters".to_string()]))
            .collect(),
        ..Options::default()
    }
}

/// The token of a user of the [`Options`] `env` started with.
pub fn user_token(env: &Env, name: &str) -> String {
    env.api
        .user_token(name)
        .unwrap_or_else(|e| panic!("token of {name}: {e:#}"))
}

/// A single-cluster `discovery.kubernetes` block for `env` that reads its
/// token from `token_file` (with `ca_file` when the server has TLS).
pub fn token_file_block(env: &Env, token_file: &std::path::Path) -> String {
    let block = env.service_block("TOKEN");
    let line = "      token: TOKEN\n";
    assert!(block.contains(line), "unexpected service block:\n{block}");
    block.replace(
        line,
        &format!("      token_file: {}\n", token_file.display()),
    )
}

/// Whether the URL the controller uses answers (kube-sim itself; on the real
/// backend the fault proxy, whose refusals the admin client, going direct,
/// never sees).
pub async fn reachable(env: &Env) -> bool {
    let Ok(c) = env.api.client(&env.admin_token()).await else {
        return false;
    };
    let req = http::Request::get("/version")
        .body(Vec::new())
        .expect("request");
    tokio::time::timeout(Duration::from_secs(5), c.request_text(req))
        .await
        .is_ok_and(|r| r.is_ok())
}

/// Real backend: how many requests the fault proxy answered with an injected
/// `code` for `verb` `resource` (`None` on kube-sim, which keeps no such count).
pub fn failures_served(env: &Env, verb: &str, resource: &str, code: u16) -> Option<u64> {
    let real = env.api.real()?;
    Some(
        real.proxy()
            .failures_served()
            .get(&(verb.to_string(), resource.to_string(), code))
            .copied()
            .unwrap_or(0),
    )
}

/// A count that grows when a `verb` `resource` request reaches the server and,
/// under a `latency` fault, is being delayed: kube-sim counts a request before
/// its fault delay; on the real backend the proxy delays it before the API
/// server sees it (and audits it only when answered), so its count of delays
/// begun is used.
pub async fn arrivals(env: &Env, verb: &str, resource: &str) -> u64 {
    match env.api.real() {
        Some(real) => real
            .proxy()
            .delays_started()
            .get(&(verb.to_string(), resource.to_string()))
            .copied()
            .unwrap_or(0),
        None => requests(&stats(env).await, verb, resource),
    }
}

/// The source objects of `client`'s cluster as JSON values (what `render` reads).
pub async fn sources(client: &kube::Client) -> Vec<Value> {
    let mut out = Vec::new();
    let eps: Api<Endpoints> = Api::all(client.clone());
    for o in eps
        .list(&ListParams::default())
        .await
        .expect("list Endpoints")
        .items
    {
        out.push(serde_json::to_value(o).expect("json"));
    }
    let sl: Api<EndpointSlice> = Api::all(client.clone());
    for o in sl
        .list(&ListParams::default())
        .await
        .expect("list EndpointSlices")
        .items
    {
        out.push(serde_json::to_value(o).expect("json"));
    }
    out
}

/// The expected DiscoveredServices (`ns/name` -> spec) of cluster `id` of
/// `config_yaml`, from the source objects of `client`'s cluster.
pub async fn truth_of(client: &kube::Client, config_yaml: &str, id: &str) -> Specs {
    let env = |k: &str| std::env::var(k).ok();
    let cfg = parse_config(config_yaml, &env).expect("test config parses");
    let opts = RenderOptions::from_config(&cfg, id).expect("cluster in config");
    let objs = sources(client).await;
    let rendered = render(&objs, &opts).expect("render the source objects");
    rendered
        .into_iter()
        .map(|ds| {
            let v = serde_json::to_value(&ds).expect("json");
            let key = format!(
                "{}/{}",
                v["metadata"]["namespace"].as_str().unwrap_or(""),
                v["metadata"]["name"].as_str().unwrap_or("")
            );
            (key, v["spec"].clone())
        })
        .collect()
}

/// Single-cluster truth of `env`.
pub async fn truth(env: &Env, config_yaml: &str) -> Specs {
    truth_of(&env.admin, config_yaml, "").await
}

/// Every DiscoveredService on `env` (`ns/name` -> spec).
pub async fn actual(env: &Env) -> Specs {
    env.dsvc_api_all()
        .list(&ListParams::default())
        .await
        .expect("list DiscoveredServices")
        .items
        .into_iter()
        .map(|o| {
            let key = format!(
                "{}/{}",
                o.metadata.namespace.clone().unwrap_or_default(),
                o.metadata.name.clone().unwrap_or_default()
            );
            (key, o.data["spec"].clone())
        })
        .collect()
}

/// Human-readable difference (empty = equal).
pub fn diff(want: &Specs, got: &Specs) -> Vec<String> {
    let mut out = Vec::new();
    for (k, w) in want {
        match got.get(k) {
            None => out.push(format!("missing {k}: want {w}")),
            Some(g) if g != w => out.push(format!("stale {k}: want {w}\n      got {g}")),
            Some(_) => {}
        }
    }
    for (k, g) in got {
        if !want.contains_key(k) {
            out.push(format!("extra {k}: {g}"));
        }
    }
    // No two objects for the same service (a "dupe" under another name).
    let mut services: BTreeMap<String, Vec<&String>> = BTreeMap::new();
    for (k, g) in got {
        let svc = format!("{}#{}", g["service"].as_str().unwrap_or(""), g["shard"]);
        services.entry(svc).or_default().push(k);
    }
    for (svc, objs) in services {
        if objs.len() > 1 {
            out.push(format!("duplicate objects for {svc}: {objs:?}"));
        }
    }
    out
}

/// Waits until the DiscoveredServices equal the truth (recomputed on every
/// poll, so it follows late source changes); panics with the difference.
pub async fn wait_converged(env: &Env, config_yaml: &str, limit: Duration) -> Specs {
    let start = tokio::time::Instant::now();
    loop {
        let want = truth(env, config_yaml).await;
        let got = actual(env).await;
        let d = diff(&want, &got);
        if d.is_empty() {
            return got;
        }
        if start.elapsed() > limit {
            panic!("not converged after {limit:?}:\n  {}", d.join("\n  "));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Applies a kube-sim fault request (`/_sim/faults` body) on `env`: kube-sim's
/// hook, or the real backend's fault proxy and etcd compaction.
pub async fn fault(env: &Env, body: Value) {
    env.api
        .fault(&body)
        .await
        .unwrap_or_else(|e| panic!("fault {body}: {e:#}"));
}

/// Request statistics in `/_sim/stats`' shape (from the audit log on the real backend).
pub async fn stats(env: &Env) -> Value {
    env.api.stats().await.expect("stats")
}

/// `requests[verb][resource]` of a stats document.
pub fn requests(stats: &Value, verb: &str, resource: &str) -> u64 {
    stats["requests"][verb][resource].as_u64().unwrap_or(0)
}

/// Every write after `mark` (all resources).
pub async fn writes_since(env: &Env, mark: u64) -> Vec<Value> {
    env.api.writes_since(mark).await.expect("writes")
}

/// Sum of every sample of metric `name` whose labels contain all `labels`.
pub async fn metric_sum(ctl: &Controller, name: &str, labels: &[&str]) -> f64 {
    let (_, text) = ctl.get("/metrics").await;
    metric_sum_in(&text, name, labels)
}

pub fn metric_sum_in(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter(|l| labels.iter().all(|x| l.contains(x)))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
        .sum()
}

/// Sends `sig` (`"TERM"`, `"KILL"`) to the controller process.
pub fn signal(ctl: &Controller, sig: &str) {
    let pid = ctl.child.id().expect("controller still running");
    let st = std::process::Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()
        .expect("kill");
    assert!(st.success(), "kill -{sig} {pid} failed");
}

/// Outage length of scenario 3: the 30 s (`FAULT_OUTAGE_SECS` overrides it, e.g. 5 for a quick local run).
pub fn outage_secs() -> f64 {
    std::env::var("FAULT_OUTAGE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30.0)
}

/// Small deterministic PRNG (xorshift64*), so a failing churn can be replayed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.max(1))
    }
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// A bounded stream of source changes over `services` services in `ns`.
pub struct Churn {
    pub ns: String,
    pub services: usize,
    pub kind: Kind,
    pub rng: Rng,
    /// `10.{net}.x.y` addresses, so tests on one kube-sim do not collide.
    pub net: u8,
    /// Changes applied so far.
    pub applied: u64,
    /// What the churn (and the test through it) wrote.
    pub sources: Sources,
}

impl Churn {
    pub fn new(ns: &str, services: usize, kind: Kind, seed: u64, net: u8) -> Self {
        Churn {
            ns: ns.to_string(),
            services,
            kind,
            rng: Rng::new(seed),
            net,
            applied: 0,
            sources: Sources::default(),
        }
    }

    /// Waits until the DiscoveredServices equal both the `render` truth
    /// ([`wait_converged`]) and this churn's own model of what it wrote
    /// ([`Sources::expected`]): nothing missing, extra or different.
    pub async fn wait_converged(&self, env: &Env, config_yaml: &str, limit: Duration) -> Specs {
        let start = tokio::time::Instant::now();
        loop {
            let want = truth(env, config_yaml).await;
            let got = actual(env).await;
            let mut d = diff(&want, &got);
            d.extend(
                model_diff(&self.sources.expected(), &got)
                    .into_iter()
                    .map(|l| format!("model: {l}")),
            );
            if d.is_empty() {
                return got;
            }
            if start.elapsed() > limit {
                panic!("not converged after {limit:?}:\n  {}", d.join("\n  "));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn service(i: usize) -> String {
        format!("svc-{i}")
    }

    /// 1-4 endpoints; the first is always ready.
    fn ips(&mut self, i: usize) -> Vec<(String, bool)> {
        let n = self.rng.below(4) + 1;
        (0..n)
            .map(|k| {
                (
                    format!("10.{}.{}.{}", self.net, i, self.rng.below(20) + 1),
                    k == 0 || !self.rng.chance(20),
                )
            })
            .collect()
    }

    /// Port keys and numbers of service `i`: `http` always, `metrics` on
    /// odd services always and on even ones now and then (so keys appear and
    /// disappear), numbers shifting.
    fn ports(&mut self, i: usize) -> Vec<(&'static str, i32)> {
        let shift = i32::try_from(self.rng.below(3)).unwrap_or(0);
        if i % 2 == 1 || self.rng.chance(30) {
            vec![("http", 8080 + shift), ("metrics", 9090 + shift)]
        } else {
            vec![("http", 80 + shift)]
        }
    }

    /// Creates every service with a first set of endpoints.
    pub async fn seed(&mut self, env: &Env) {
        env.namespace(&self.ns).await;
        for i in 0..self.services {
            self.set(env, i).await;
        }
    }

    async fn set(&mut self, env: &Env, i: usize) {
        let eps = self.ips(i);
        let ports = self.ports(i);
        let svc = Self::service(i);
        match self.kind {
            Kind::Slices => {
                let refs: Vec<(&str, bool)> = eps.iter().map(|(ip, r)| (ip.as_str(), *r)).collect();
                self.sources
                    .slice(env, &self.ns, &svc, &format!("{svc}-a"), &refs, &ports)
                    .await;
            }
            Kind::Endpoints => {
                let ready: Vec<&str> = eps
                    .iter()
                    .filter(|(_, r)| *r)
                    .map(|(ip, _)| ip.as_str())
                    .collect();
                self.sources
                    .endpoints(env, &self.ns, &svc, &ready, &ports)
                    .await;
            }
        }
        self.applied += 1;
    }

    /// One random change.
    pub async fn step(&mut self, env: &Env) {
        let i = usize::try_from(self.rng.below(self.services as u64)).unwrap_or(0);
        let svc = Self::service(i);
        match self.rng.below(10) {
            0 => {
                // Delete the source (ignore "already gone").
                match self.kind {
                    Kind::Slices => {
                        for part in ["a", "b"] {
                            self.sources
                                .delete_slice(env, &self.ns, &format!("{svc}-{part}"))
                                .await;
                        }
                    }
                    Kind::Endpoints => {
                        self.sources.delete_endpoints(env, &self.ns, &svc).await;
                    }
                }
                self.applied += 1;
            }
            1 if self.kind == Kind::Slices => {
                // A second slice of the same service.
                let eps = self.ips(i);
                let ports = self.ports(i);
                let refs: Vec<(&str, bool)> = eps.iter().map(|(ip, r)| (ip.as_str(), *r)).collect();
                self.sources
                    .slice(env, &self.ns, &svc, &format!("{svc}-b"), &refs, &ports)
                    .await;
                self.applied += 1;
            }
            _ => self.set(env, i).await,
        }
    }

    /// `n` changes, `pause` apart.
    pub async fn run(&mut self, env: &Env, n: usize, pause: Duration) {
        for _ in 0..n {
            self.step(env).await;
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
        }
    }
}

/// Waits until the controller's log contains `needle`; returns the log.
pub async fn wait_log(ctl: &Controller, needle: &str, limit: Duration) -> String {
    eventually(&format!("log contains {needle:?}"), limit, || async {
        let l = ctl.logs();
        l.contains(needle).then_some(l)
    })
    .await
}

/// One source object as the test wrote it.
#[derive(Debug, Clone)]
struct Written {
    /// The Service it belongs to.
    service: String,
    /// `(address, ready)`.
    endpoints: Vec<(String, bool)>,
    /// `(port name, number)`.
    ports: Vec<(String, i32)>,
}

/// The source objects a test wrote (and deleted) through it, and the
/// DiscoveredService specs they must give ([`Sources::expected`]), written
/// here from the documented rules instead of the core's conversion code:
///
/// * `namespace_mode: source`: object `ns/<service>`, `spec.service`
///   `ns/<service>` (cluster `id`: `ns/<id>.<service>`, `id/ns/<service>`);
/// * a port key is the port's name; its nodes are the READY endpoints of
///   every source object of the service declaring that port, as
///   `{host, port, weight: 50}` (the default weight), one per
///   `host:port`, sorted by host (as a string) then port;
/// * a service with no source object left has no DiscoveredService.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// `(namespace, object name, kind)` -> what was written.
    objects: BTreeMap<(String, String, Kind), Written>,
}

impl Sources {
    /// Writes the EndpointSlice `ns/slice` of `service` ([`Env::slice`]) and records it.
    pub async fn slice(
        &mut self,
        env: &Env,
        ns: &str,
        service: &str,
        slice: &str,
        eps: &[(&str, bool)],
        ports: &[(&str, i32)],
    ) {
        env.slice(ns, service, slice, eps, ports).await;
        self.objects.insert(
            (ns.to_string(), slice.to_string(), Kind::Slices),
            Written {
                service: service.to_string(),
                endpoints: eps.iter().map(|(ip, r)| (ip.to_string(), *r)).collect(),
                ports: ports.iter().map(|(n, p)| (n.to_string(), *p)).collect(),
            },
        );
    }

    /// Writes the Endpoints `ns/service` with `ready` addresses
    /// ([`Env::endpoints`]) and records it.
    pub async fn endpoints(
        &mut self,
        env: &Env,
        ns: &str,
        service: &str,
        ready: &[&str],
        ports: &[(&str, i32)],
    ) {
        env.endpoints(ns, service, ready, ports, json!({})).await;
        self.objects.insert(
            (ns.to_string(), service.to_string(), Kind::Endpoints),
            Written {
                service: service.to_string(),
                endpoints: ready.iter().map(|ip| (ip.to_string(), true)).collect(),
                // No subset without addresses: no ports either.
                ports: if ready.is_empty() {
                    Vec::new()
                } else {
                    ports.iter().map(|(n, p)| (n.to_string(), *p)).collect()
                },
            },
        );
    }

    /// Deletes the EndpointSlice `ns/slice` (gone already is fine) and forgets it.
    pub async fn delete_slice(&mut self, env: &Env, ns: &str, slice: &str) {
        let api: Api<EndpointSlice> = Api::namespaced(env.admin.clone(), ns);
        let _ = api.delete(slice, &Default::default()).await;
        self.objects
            .remove(&(ns.to_string(), slice.to_string(), Kind::Slices));
    }

    /// Deletes the Endpoints `ns/name` (gone already is fine) and forgets it.
    pub async fn delete_endpoints(&mut self, env: &Env, ns: &str, name: &str) {
        let api: Api<Endpoints> = Api::namespaced(env.admin.clone(), ns);
        let _ = api.delete(name, &Default::default()).await;
        self.objects
            .remove(&(ns.to_string(), name.to_string(), Kind::Endpoints));
    }

    /// The specs (`ns/name` -> spec without `version`) the recorded
    /// sources must give; see the type's docs for the rules.
    pub fn expected(&self) -> Specs {
        self.expected_in("")
    }

    /// [`Self::expected`] for the sources of cluster `id` of a multi-cluster
    /// controller (`""`: single cluster): object `ns/<id>.<service>`,
    /// `spec.cluster` `id`, `spec.service` `id/ns/<service>`.
    pub fn expected_in(&self, id: &str) -> Specs {
        // (ns, service) -> (kind, port key -> {(host, port)}).
        type Ports = BTreeMap<String, BTreeMap<(String, i32), ()>>;
        let mut services: BTreeMap<(String, String), (Kind, Ports)> = BTreeMap::new();
        for ((ns, _, kind), w) in &self.objects {
            let (_, ports) = services
                .entry((ns.clone(), w.service.clone()))
                .or_insert_with(|| (*kind, Ports::new()));
            for (name, number) in &w.ports {
                let nodes = ports.entry(name.clone()).or_default();
                for (ip, ready) in &w.endpoints {
                    if *ready {
                        nodes.insert((ip.clone(), *number), ());
                    }
                }
            }
        }
        services
            .into_iter()
            .map(|((ns, svc), (kind, ports))| {
                let ports: serde_json::Map<String, Value> = ports
                    .into_iter()
                    .map(|(key, nodes)| {
                        // BTreeMap order: host as a string, then port.
                        let nodes: Vec<Value> = nodes
                            .into_keys()
                            .map(|(host, port)| json!({"host": host, "port": port, "weight": 50}))
                            .collect();
                        (key, Value::Array(nodes))
                    })
                    .collect();
                let source = match kind {
                    Kind::Slices => "EndpointSlice",
                    Kind::Endpoints => "Endpoints",
                };
                let (name, service) = if id.is_empty() {
                    (svc.clone(), format!("{ns}/{svc}"))
                } else {
                    (format!("{id}.{svc}"), format!("{id}/{ns}/{svc}"))
                };
                (
                    format!("{ns}/{name}"),
                    json!({"cluster": id, "service": service,
                           "sourceNamespace": ns, "sourceName": svc,
                           "source": source, "ports": ports}),
                )
            })
            .collect()
    }
}

/// [`diff`] of the model (specs without `version`) against `got`, whose
/// `version` is not compared.
pub fn model_diff(want: &Specs, got: &Specs) -> Vec<String> {
    let got: Specs = got
        .iter()
        .map(|(k, v)| {
            let mut v = v.clone();
            if let Some(o) = v.as_object_mut() {
                o.remove("version");
            }
            (k.clone(), v)
        })
        .collect();
    diff(want, &got)
}
