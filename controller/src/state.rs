//! The process-wide shared state: the desired nodes of every service (written
//! by the sources from the pure core `Index`, read by the writer at write time
//! and by the HTTP API) and the status of every cluster (listed? written?).
//!
//! The writer only queues *keys* and reads the desired value from here when it
//! is about to write, so a newer desired state always replaces an older pending
//! one and nothing is ever written stale.
//!
//! Values are `Arc<ServiceNodes>`: the sources hand in the index's own
//! allocation ([`Shared::set_desired_shared`]), so the nodes of a service are
//! held once, not once in the index and again here.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use kube_discovery_core::{ServiceKey, ServiceNodes};
use serde::Serialize;

/// Status of one cluster as shown by `/readyz`.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct ClusterStatus {
    /// The first complete list has been received and indexed.
    pub listed: bool,
    /// Everything from the first complete list has been written (or found
    /// already up to date on the API server).
    pub synced: bool,
    /// Number of complete lists so far (1 + relists).
    pub lists: u64,
    /// The last watch error, if the watch is currently failing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// Shared state; cheap to share behind an `Arc`.
#[derive(Debug, Default)]
pub struct Shared {
    desired: RwLock<BTreeMap<ServiceKey, Arc<ServiceNodes>>>,
    clusters: RwLock<BTreeMap<String, ClusterStatus>>,
    standby: AtomicBool,
    /// Bumped on every change of `desired` and when a cluster appears or its
    /// `listed` flag flips: a cheap "something changed" signal for consumers
    /// of the whole state (the snapshot sink).
    generation: tokio::sync::watch::Sender<u64>,
}

fn read<T>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn write<T>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Shared {
    /// Creates the state with the given clusters registered (not listed yet).
    pub fn new<'a>(clusters: impl IntoIterator<Item = &'a str>) -> Self {
        let s = Self::default();
        {
            let mut c = write(&s.clusters);
            for id in clusters {
                c.insert(id.to_string(), ClusterStatus::default());
            }
        }
        s
    }

    /// Sets (`Some`) or removes (`None`) the desired nodes of `key`.
    pub fn set_desired(&self, key: &ServiceKey, value: Option<ServiceNodes>) {
        self.set_desired_shared(key, value.map(Arc::new));
    }

    /// [`Shared::set_desired`] with a value shared with its producer (the
    /// index), without copying the nodes.
    pub fn set_desired_shared(&self, key: &ServiceKey, value: Option<Arc<ServiceNodes>>) {
        {
            let mut d = write(&self.desired);
            match value {
                Some(v) => {
                    d.insert(key.clone(), v);
                }
                None => {
                    d.remove(key);
                }
            }
        }
        self.bump();
    }

    fn bump(&self) {
        self.generation.send_modify(|g| *g = g.wrapping_add(1));
    }

    /// A receiver that is marked changed whenever the desired state or a
    /// cluster status changes (the value is a generation counter).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.generation.subscribe()
    }

    /// Runs `f` on all desired services under one read lock (a consistent
    /// view across clusters, without cloning).
    pub fn with_desired<R>(
        &self,
        f: impl FnOnce(&BTreeMap<ServiceKey, Arc<ServiceNodes>>) -> R,
    ) -> R {
        f(&read(&self.desired))
    }

    /// The desired nodes of `key` (`None`: the source is gone). Shared, not
    /// copied: a write or a drift check of a big service copies no nodes.
    pub fn desired(&self, key: &ServiceKey) -> Option<Arc<ServiceNodes>> {
        read(&self.desired).get(key).cloned()
    }

    /// All desired services of `cluster`.
    pub fn desired_of(&self, cluster: &str) -> Vec<Arc<ServiceNodes>> {
        read(&self.desired)
            .values()
            .filter(|s| s.key.cluster == cluster)
            .cloned()
            .collect()
    }

    /// Whether `key` currently has desired nodes.
    pub fn has_desired(&self, key: &ServiceKey) -> bool {
        read(&self.desired).contains_key(key)
    }

    /// `(services, nodes)` of `cluster`.
    pub fn counts(&self, cluster: &str) -> (usize, usize) {
        let d = read(&self.desired);
        d.values()
            .filter(|s| s.key.cluster == cluster)
            .fold((0, 0), |(s, n), v| (s + 1, n + v.node_count()))
    }

    /// Updates the status of `cluster` in place.
    pub fn update_cluster(&self, cluster: &str, f: impl FnOnce(&mut ClusterStatus)) {
        let listed_changed = {
            let mut c = write(&self.clusters);
            let known = c.contains_key(cluster);
            let s = c.entry(cluster.to_string()).or_default();
            let before = s.listed;
            f(s);
            !known || before != s.listed
        };
        // Only what the whole-state consumers depend on (which clusters exist
        // and are listed) signals a change; sync flags and errors do not.
        if listed_changed {
            self.bump();
        }
    }

    /// Snapshot of all cluster statuses.
    pub fn clusters(&self) -> BTreeMap<String, ClusterStatus> {
        read(&self.clusters).clone()
    }

    /// Marks this replica as a leader-election standby (it does not write).
    pub fn set_standby(&self, standby: bool) {
        self.standby.store(standby, Ordering::Relaxed);
    }

    /// Whether this replica is a standby.
    pub fn standby(&self) -> bool {
        self.standby.load(Ordering::Relaxed)
    }

    /// Ready when every registered cluster is synced (and there is at least
    /// one). A standby, which does not write, is ready once every cluster is
    /// listed: it serves the HTTP API and is warm for a takeover.
    pub fn ready(&self) -> bool {
        let standby = self.standby();
        let c = read(&self.clusters);
        !c.is_empty() && c.values().all(|s| s.synced || (standby && s.listed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_discovery_core::{PortMap, SourceKind};

    #[test]
    fn desired_roundtrip_and_readiness() {
        let s = Shared::new(["", "c2"]);
        let k = ServiceKey::new("", "ns", "a");
        assert!(!s.ready());
        s.set_desired(
            &k,
            Some(ServiceNodes::new(
                k.clone(),
                SourceKind::Endpoints,
                PortMap::new(),
                None,
            )),
        );
        assert!(s.has_desired(&k));
        assert_eq!(s.counts(""), (1, 0));
        assert_eq!(s.counts("c2"), (0, 0));
        s.update_cluster("", |c| c.synced = true);
        assert!(!s.ready(), "c2 is not synced yet");
        s.update_cluster("c2", |c| c.synced = true);
        assert!(s.ready());
        s.set_desired(&k, None);
        assert!(s.desired(&k).is_none());
        // A shared value is held, not copied.
        let v = Arc::new(ServiceNodes::new(
            k.clone(),
            SourceKind::Endpoints,
            PortMap::new(),
            None,
        ));
        s.set_desired_shared(&k, Some(Arc::clone(&v)));
        assert_eq!(Arc::strong_count(&v), 2);
        assert_eq!(s.desired(&k).as_deref(), Some(&*v));
        assert_eq!(s.desired_of(""), vec![v.clone()]);
        s.set_desired_shared(&k, None);
        assert_eq!(Arc::strong_count(&v), 1);
    }
}
