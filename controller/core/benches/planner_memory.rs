//! The heap the write planner and the services part of the record it reads
//! keep per service: the key store (the record's versions and shard slots,
//! the pending queue, the drift checks) at the peak of a first sync (every
//! service loaded, queued and reported by the drift sweep) and once that
//! sync is done (every service known, nothing pending). It says what the
//! planner's packed keys (`write_plan::compact::PackedKey`) buy over
//! holding `ServiceKey`s (BENCHMARKS.md, "Issue 30: what each piece buys").
//!
//! Counted by `stats_alloc` (requested bytes, not allocator overhead), so
//! the numbers are the same on a loaded machine and in any profile.
//!
//! Run: `cargo bench -p kube-discovery-core --bench planner_memory --profile dev`
//! (prints a Markdown table).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use std::alloc::System;
use std::collections::HashMap;
use std::time::Duration;

use kube_discovery_core::ServiceKey;
use kube_discovery_core::write_plan::record::{Listing, Record};
use kube_discovery_core::write_plan::{
    Action, DesiredView, DriftFacts, Held, Input, Options, Planner,
};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// `(namespace, name)` of service `i`.
type Naming = fn(usize) -> (String, String);

/// Every service desired, at the version the API server holds.
struct World {
    versions: HashMap<ServiceKey, String>,
    keys: Vec<ServiceKey>,
}

impl DesiredView for World {
    fn version(&self, key: &ServiceKey) -> Option<String> {
        self.versions.get(key).cloned()
    }
    fn listed(&self, _cluster: &str) -> bool {
        true
    }
    fn clusters(&self) -> Vec<(String, bool)> {
        vec![(String::new(), true)]
    }
    fn keys_of(&self, _cluster: &str) -> Vec<ServiceKey> {
        self.keys.clone()
    }
    fn nodes(
        &self,
        _key: &ServiceKey,
    ) -> Option<std::sync::Arc<kube_discovery_core::ServiceNodes>> {
        // The planner itself never reads the nodes.
        None
    }
}

/// Live heap bytes since `region` started (`stats_alloc` counts a growing
/// realloc's difference in `bytes_allocated`, a shrinking one's in
/// `bytes_deallocated`).
fn live(region: &Region<'_, System>) -> i64 {
    let s = region.change();
    s.bytes_allocated as i64 - s.bytes_deallocated as i64
}

/// (bytes per service at the first sync's peak, bytes per service after it)
/// for `n` services named by `name`.
fn measure(n: usize, name: Naming) -> (f64, f64) {
    let keys: Vec<ServiceKey> = (0..n)
        .map(|i| {
            let (ns, svc) = name(i);
            ServiceKey::new("", ns, svc)
        })
        .collect();
    let version = |i: usize| format!("{:016x}", (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let world = World {
        versions: keys
            .iter()
            .enumerate()
            .map(|(i, k)| (k.clone(), version(i)))
            .collect(),
        keys: keys.clone(),
    };
    let opts = Options {
        qps: 0.0,
        concurrency: 1_000_000,
        ..Options::default()
    };
    let region = Region::new(GLOBAL);
    let mut planner = Planner::new(opts);
    let mut record = Record::default();
    let mut now = Duration::ZERO;
    let (actions, _) = planner.poll(now, &world, &record);
    assert!(matches!(actions[..], [Action::Load { epoch: 0 }]));
    let ticket = record.list_begins();
    let mut listing = Listing::default();
    for (i, k) in keys.iter().enumerate() {
        let held = Held {
            version: version(i),
            shards: 1,
        };
        listing.service(k, &held);
    }
    record.listed(ticket, listing);
    planner.handle(now, Input::Loaded { epoch: 0 }, &world, &record);
    planner.handle(now, Input::Drifted(keys.clone()), &world, &record);
    let peak = live(&region);
    // Every write is a no-op (skipped), every drift check finds the objects
    // intact: the first sync drains.
    for _ in 0..100 {
        now += Duration::from_secs(1);
        let (actions, _) = planner.poll(now, &world, &record);
        for a in actions {
            match a {
                Action::CheckDrift { key } => {
                    planner.handle(
                        now,
                        Input::DriftSeen {
                            key,
                            facts: DriftFacts::unwatched(),
                        },
                        &world,
                        &record,
                    );
                }
                Action::Skipped { .. } | Action::ClusterSynced(_) => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        if planner.idle() && planner.poll(now, &world, &record).1.is_none() {
            break;
        }
    }
    assert!(planner.idle());
    let after = live(&region);
    drop(planner);
    drop(record);
    (peak as f64 / n as f64, after as f64 / n as f64)
}

fn main() {
    let n = 100_000;
    println!("| {n} services | first sync, peak (B/service) | after it (B/service) |");
    println!("|---|---:|---:|");
    let cases: [(&str, Naming); 2] = [
        ("short names (`team-042/service-012345`)", |i| {
            (format!("team-{:03}", i % 1000), format!("service-{i:06}"))
        }),
        (
            "long names (`payments-platform-042/checkout-frontend-canary-012345`)",
            |i| {
                (
                    format!("payments-platform-{:03}", i % 1000),
                    format!("checkout-frontend-canary-{i:06}"),
                )
            },
        ),
    ];
    for (what, name) in cases {
        let (peak, after) = measure(n, name);
        println!("| {what} | {peak:.0} | {after:.0} |");
    }
}
