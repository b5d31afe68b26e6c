//! What the API server holds of our objects, as the planner knows it: ONE
//! record per service (the `spec.version` of its objects, its shard slots,
//! whether its next write repairs drift), fed by the start-up list
//! ([`super::Input::Loaded`]), the answers to our writes
//! ([`super::Input::Finished`]) and the drift checks that found a
//! difference ([`super::Input::DriftSeen`]). The planner reads it to
//! skip no-ops and hands the part a write needs along ([`Prior`]).

use std::collections::HashMap;

use super::compact::{PackedKey, Version, trim_map};
use super::{Held, Prior};
use crate::ServiceKey;

/// What the API server holds of one service's objects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Objects {
    /// Their `spec.version` (`""`: rewrite, a repair is owed).
    pub(crate) version: Version,
    /// Shard slots in use (at least 1).
    pub(crate) shards: u32,
    /// A drift check found them different: the next write repairs
    /// ([`Prior::repair`]) until one succeeds.
    pub(crate) repair: bool,
}

impl Objects {
    fn new(version: &str, shards: u32) -> Self {
        Objects {
            version: Version::new(version),
            shards: shards.max(1),
            repair: false,
        }
    }
}

/// The record, by service (see the module docs).
#[derive(Default)]
pub(crate) struct Record {
    pub(crate) services: HashMap<PackedKey, Objects>,
}

impl Record {
    /// Replaces the record with what the start-up list found. A repair
    /// found before is still owed (the list compares versions only, not
    /// content): its version becomes one nothing has, which forces the write.
    pub(crate) fn loaded(&mut self, list: &[(ServiceKey, Held)]) {
        let mut services = HashMap::with_capacity(list.len());
        for (k, held) in list {
            services.insert(PackedKey::new(k), Objects::new(&held.version, held.shards));
        }
        for (k, o) in self.services.drain() {
            if o.repair {
                let e = services.entry(k).or_insert_with(|| Objects::new("", 1));
                e.version = Version::new("");
                e.repair = true;
            }
        }
        self.services = services;
    }

    /// The version the API server holds of `key` (`None`: nothing).
    pub(crate) fn version(&self, key: &PackedKey) -> Option<&Version> {
        self.services.get(key).map(|o| &o.version)
    }

    /// What a write of `key` starts from.
    pub(crate) fn prior(&self, key: &PackedKey) -> Prior {
        self.services
            .get(key)
            .map_or_else(Prior::default, |o| Prior {
                shards: o.shards,
                repair: o.repair,
            })
    }

    /// A write of `key` applied `version` in `shards` objects.
    pub(crate) fn applied(&mut self, key: PackedKey, version: &str, shards: u32) {
        self.services.insert(key, Objects::new(version, shards));
    }

    /// A write deleted every object of `key`.
    pub(crate) fn deleted(&mut self, key: &PackedKey) {
        self.services.remove(key);
    }

    /// A drift check found `key`'s objects different: a version nothing
    /// has (the key is rewritten or deleted), and a repair is owed.
    pub(crate) fn drifted(&mut self, key: PackedKey) {
        let o = self
            .services
            .entry(key)
            .or_insert_with(|| Objects::new("", 1));
        o.version = Version::new("");
        o.repair = true;
    }

    /// Every service the API server holds objects of.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &PackedKey> {
        self.services.keys()
    }

    /// Gives the table's memory back once it is mostly empty.
    pub(crate) fn trim(&mut self) {
        trim_map(&mut self.services);
    }
}
