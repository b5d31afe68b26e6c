//! The merge of small Services (fewer than [`INCREMENTAL_MIN_SLICES`]
//! slices: the index keeps each slice's packed contribution and merges them
//! again on every change) over random histories: adds, updates, deletes,
//! the same endpoint in several slices, ready/serving/terminating, port
//! renames and duplicate names, bad data, owners, slices moving between
//! three Services. After every event the index must equal
//! * a fresh index that merged the surviving slices from scratch (every
//!   field a reader sees, the version included), and
//! * an independent oracle written from the rules in `convert::slices`'
//!   docs straight over the EndpointSlice objects, so a rule broken inside
//!   the merge itself (or in how a contribution is packed) fails here even
//!   though both indexes would agree.
//!
//! Seeded, so a failure names its seed and step.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;

use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::incremental_tests::{
    Rng, all_options, fresh_merge, index, random_slice, seen, weighted,
};
use super::*;
use crate::source::convert::Drain;

/// kube-proxy's preference for one `host:port` seen twice: the
/// non-terminating one, then the ready one, then the first seen.
fn beats(new: (bool, bool, bool), old: (bool, bool, bool)) -> bool {
    let ((ready, _, term), (old_ready, _, old_term)) = (new, old);
    (old_term && !term) || (old_term == term && !old_ready && ready)
}

/// What the rules say `svc`'s nodes are, from the objects in `live` (name
/// order): port key -> `host:port weight draining zone` lines sorted by host
/// then port. `None` when no slice belongs to `svc`.
fn oracle(
    live: &BTreeMap<String, EndpointSlice>,
    svc: &str,
    opts: &ConvertOptions,
    weight: u32,
) -> Option<BTreeMap<String, Vec<String>>> {
    type Cond = (bool, bool, bool);
    /// Per `(host, port)`: the winner's conditions and zone.
    type PerPort = BTreeMap<(String, i32), (Cond, Option<String>)>;
    let mut cands: BTreeMap<String, PerPort> = BTreeMap::new();
    let mut present = false;
    for s in live.values() {
        let label = s
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(SERVICE_NAME_LABEL));
        if label.map(String::as_str) != Some(svc) {
            continue;
        }
        present = true;
        if s.address_type != "IPv4" {
            continue;
        }
        // Port key: the name, else the number; a repeated name is skipped,
        // as is a number outside 1..=65535; the number as an alias.
        let mut specs: Vec<(String, i32)> = Vec::new();
        let mut names: Vec<String> = Vec::new();
        for p in s.ports.iter().flatten() {
            let Some(n) = p.port.filter(|n| (1..=65535).contains(n)) else {
                continue;
            };
            let name = p.name.clone().filter(|n| !n.is_empty());
            match name {
                Some(name) if names.contains(&name) => continue,
                Some(name) => {
                    names.push(name.clone());
                    specs.push((name, n));
                    if opts.index_port_numbers {
                        specs.push((n.to_string(), n));
                    }
                }
                None => specs.push((n.to_string(), n)),
            }
        }
        for (key, _) in &specs {
            cands.entry(key.clone()).or_default();
        }
        for ep in &s.endpoints {
            // The first valid address.
            let Some(host) = ep.addresses.iter().find(|a| a.parse::<Ipv4Addr>().is_ok()) else {
                continue;
            };
            let c = ep.conditions.clone().unwrap_or_default();
            let cond = (
                c.ready.unwrap_or(true),
                c.serving.unwrap_or(true),
                c.terminating.unwrap_or(false),
            );
            let zone = opts.topology.then(|| ep.zone.clone()).flatten();
            for (key, n) in &specs {
                let per_port = cands.entry(key.clone()).or_default();
                let hp = (host.clone(), *n);
                match per_port.get(&hp) {
                    Some((old, _)) if !beats(cond, *old) => {}
                    _ => {
                        per_port.insert(hp, (cond, zone.clone()));
                    }
                }
            }
        }
    }
    present.then(|| {
        cands
            .into_iter()
            .map(|(key, per_port)| {
                let line = |(host, port): &(String, i32), w: u32, d: bool, z: &Option<String>| {
                    format!("{host}:{port} w={w} draining={d} zone={z:?}")
                };
                let ready: Vec<String> = per_port
                    .iter()
                    .filter(|(_, ((r, _, _), _))| *r)
                    .map(|(hp, (_, z))| line(hp, weight, false, z))
                    .collect();
                let draining = |w: u32| -> Vec<String> {
                    per_port
                        .iter()
                        .filter(|(_, ((r, s, t), _))| !r && *s && *t)
                        .map(|(hp, (_, z))| line(hp, w, true, z))
                        .collect()
                };
                let mut nodes = match opts.drain_terminating {
                    Drain::Off => ready,
                    Drain::Fallback if ready.is_empty() => draining(weight),
                    Drain::Fallback => ready,
                    Drain::Always => ready.into_iter().chain(draining(0)).collect(),
                };
                // (host, port) order: the keys of `per_port`, one line each.
                nodes.sort_by_key(|l| {
                    let (hp, _) = l.split_once(' ').unwrap_or_default();
                    let (h, p) = hp.rsplit_once(':').unwrap_or_default();
                    (h.to_string(), p.parse::<i32>().unwrap_or_default())
                });
                (key, nodes)
            })
            .collect()
    })
}

/// The index's nodes of `key` in the oracle's lines.
fn lines(i: &Index, key: &ServiceKey) -> Option<BTreeMap<String, Vec<String>>> {
    let svc = i.get(key)?;
    Some(
        svc.ports
            .iter()
            .map(|(k, nodes)| {
                let nodes = nodes
                    .iter()
                    .map(|n| {
                        format!(
                            "{}:{} w={} draining={} zone={:?}",
                            n.host,
                            n.port,
                            n.weight,
                            n.draining == Some(true),
                            n.zone()
                        )
                    })
                    .collect();
                (k.clone(), nodes)
            })
            .collect(),
    )
}

/// `steps` random events on one index of small Services, each checked
/// against a fresh merge and the oracle. Returns the events that changed a
/// published Service (so a test can tell the histories did something).
fn small_history(seed: u64, opts: &ConvertOptions, steps: usize) -> usize {
    let mut rng = Rng(seed);
    let mut live: BTreeMap<String, EndpointSlice> = BTreeMap::new();
    let mut i = index(opts);
    let web_weight = rng.one_in(2).then_some(7);
    i.set_service("ns", "web", Some(weighted(web_weight)));
    let svcs = ["web", "api", "db"];
    let keys: Vec<ServiceKey> = svcs.iter().map(|s| ServiceKey::new("", "ns", *s)).collect();
    // Few names: no Service ever reaches the incremental merge.
    let names: Vec<String> = (0..7).map(|n| format!("s{n:02}")).collect();
    let mut changed = 0;
    for step in 0..steps {
        let name = &names[rng.below(names.len() as u64) as usize];
        let reported = if rng.one_in(5) {
            match live.remove(name) {
                Some(s) => i.delete_slice(&s),
                None => Vec::new(),
            }
        } else {
            let svc = svcs[rng.below(svcs.len() as u64) as usize];
            // Few hosts: the same endpoint in several slices is the rule.
            let s = random_slice(&mut rng, name, svc, 5, 6);
            let reported = i.apply_slice(&s);
            live.insert(name.clone(), s);
            reported
        };
        changed += reported.len();
        assert!(i.big.is_empty(), "seed {seed}, step {step}: a big Service");
        assert_eq!(
            seen(&i, &keys),
            seen(&fresh_merge(opts, web_weight, &live), &keys),
            "seed {seed}, step {step}, opts {opts:?}"
        );
        for (svc, key) in svcs.iter().zip(&keys) {
            let weight = match *svc {
                "web" => web_weight.unwrap_or(opts.default_weight),
                _ => opts.default_weight,
            };
            assert_eq!(
                lines(&i, key),
                oracle(&live, svc, opts, weight),
                "seed {seed}, step {step}, service {svc}, opts {opts:?}"
            );
        }
    }
    changed
}

#[test]
fn small_service_merge_equals_a_fresh_merge_and_the_rules_over_random_histories() {
    let mut changed = 0;
    for (n, opts) in all_options().iter().enumerate() {
        for seed in 1..=4u64 {
            changed += small_history(seed * 7919 + n as u64, opts, 150);
        }
    }
    // The histories published changes (a test of nothing would pass too).
    assert!(changed > 1000, "{changed} changes reported");
}
