//! Per service: the `spec.version` its objects hold and its shard slots,
//! from the start-up list ([`Found`], computed from the listed objects) and
//! the answers to our writes. The planner reads it to skip no-ops and to
//! hand a write its [`super::super::Prior`].
//!
//! A list takes a while; an answer to a write that lands while it runs is
//! newer than what the list read. Each list gets a ticket when it starts
//! ([`super::Record::list_begins`]); services written since keep what the
//! answers said, and a list that started before the last one landed is
//! dropped whole (an older list never overwrites a newer one).

use std::collections::HashMap;

use crate::ServiceKey;
use crate::crd::{DiscoveredService, ShardHead, consistent_shards, key_of, shard_of};
use crate::write_plan::compact::{PackedKey, Version, trim_map};

/// What the API server holds of one service's objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Service {
    /// Their `spec.version` (`""`: rewrite).
    pub(crate) version: Version,
    /// Shard slots in use (at least 1).
    pub(crate) shards: u32,
}

impl Service {
    pub(crate) fn new(version: &str, shards: u32) -> Self {
        Service {
            version: Version::new(version),
            shards: shards.max(1),
        }
    }
}

/// The services part of the record (see the module docs).
#[derive(Default)]
pub(crate) struct Services {
    pub(crate) held: HashMap<PackedKey, Service>,
    /// The last ticket handed out, and the one of the last list that landed.
    tickets: u64,
    landed: u64,
    /// Services written while a list ran, with the ticket count then.
    touched: HashMap<PackedKey, u64>,
}

impl Services {
    pub(crate) fn begin(&mut self) -> u64 {
        self.tickets += 1;
        self.tickets
    }

    /// Whether a list with `ticket` may land (none started after it landed).
    pub(crate) fn may_land(&self, ticket: u64) -> bool {
        ticket > self.landed
    }

    /// The list with `ticket` found `found`; services written since it
    /// started keep what the answers said.
    pub(crate) fn listed(&mut self, ticket: u64, found: HashMap<PackedKey, Service>) {
        let mut held = found;
        for (k, at) in &self.touched {
            if *at >= ticket {
                match self.held.remove(k) {
                    Some(s) => held.insert(k.clone(), s),
                    None => held.remove(k),
                };
            }
        }
        self.held = held;
        self.landed = ticket;
        self.touched.retain(|_, at| *at > ticket);
        trim_map(&mut self.touched);
    }

    fn touch(&mut self, key: &PackedKey) {
        if self.tickets > self.landed {
            self.touched.insert(key.clone(), self.tickets);
        }
    }

    pub(crate) fn written(&mut self, key: PackedKey, version: &str, shards: u32) {
        self.touch(&key);
        self.held.insert(key, Service::new(version, shards));
    }

    pub(crate) fn removed(&mut self, key: &PackedKey) {
        self.touch(key);
        self.held.remove(key);
        trim_map(&mut self.held);
    }
}

/// What the start-up list keeps of our objects: per service, the shard
/// position and versions of each of its objects (never its nodes).
#[derive(Debug, Default)]
pub struct Found(HashMap<ServiceKey, Vec<FoundShard>>);

/// One listed object of a service: `(index, count)`, `spec.version` and, on
/// shard 0 of a sharded service, the manifest `spec.shard.versions`.
#[derive(Debug)]
pub struct FoundShard {
    index: u32,
    count: u32,
    version: String,
    manifest: Vec<String>,
}

impl Found {
    /// Notes one object.
    pub fn add(&mut self, ds: &DiscoveredService) {
        let (index, count) = shard_of(ds);
        self.0.entry(key_of(ds)).or_default().push(FoundShard {
            index,
            count,
            version: ds.spec.version.clone(),
            manifest: ds
                .spec
                .shard
                .as_ref()
                .map(|s| s.versions.clone())
                .unwrap_or_default(),
        });
    }

    /// Per service: shard 0's version when its objects form one version
    /// under the readers' rule ([`consistent_shards`]), else `""`, which
    /// forces a rewrite (a crash between shards; also a sharded service
    /// written by the old scheme without a manifest, so a restart of this
    /// version converts it once); and the number of shard slots to clean up
    /// on the next write (highest index seen + 1).
    pub fn versions(self) -> impl Iterator<Item = (ServiceKey, (String, u32))> {
        self.0.into_iter().map(|(key, mut objs)| {
            let slots = objs
                .iter()
                .map(|o| o.index.saturating_add(1))
                .max()
                .unwrap_or(1);
            let heads: Vec<ShardHead<'_>> = objs
                .iter()
                .map(|o| ShardHead {
                    index: o.index,
                    count: o.count,
                    version: &o.version,
                    manifest: &o.manifest,
                })
                .collect();
            let zero = match consistent_shards(&heads) {
                // Surplus slots beyond the count also force a write (it
                // deletes them).
                Ok((take, false)) if take.len() as u32 == slots => Some(take[0]),
                _ => None,
            };
            let version = zero
                .map(|i| std::mem::take(&mut objs[i].version))
                .unwrap_or_default();
            (key, (version, slots))
        })
    }
}

/// [`Found::versions`] of `items`.
pub fn versions_of(items: &[DiscoveredService]) -> HashMap<ServiceKey, (String, u32)> {
    let mut found = Found::default();
    for ds in items {
        found.add(ds);
    }
    found.versions().collect()
}
