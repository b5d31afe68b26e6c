//! The catalog every stream reads and the routing of changes to streams.
//!
//! ```text
//!  ControllerState ──(generation)──▶ follow(): diff desired, Catalog::apply ──▶ dispatch(changed)
//!                                                                           │
//!        stream (SotW or delta) ◀── notify + pending names ◀── only the streams subscribed
//! ```
//!
//! A change is taken from the desired state as soon as the index has it (the
//! writers' coalescing window does not apply) and marks the changed names on
//! the streams whose subscriptions name them (or are wildcards of the kind).
//! A stream keeps a SET of pending names, not a queue of updates: a slow
//! client holds at most one name per resource, and gets the latest content
//! when it is ready for the next response.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard};
use std::time::Instant;

use kube_discovery_core::xds::{Interest, Kind, Stream};
use kube_discovery_core::{ServiceKey, ServiceNodes};
use serde::Serialize;
use tokio::sync::{Notify, watch};

use super::resources::Catalog;
use crate::state::{ControllerState, DesiredSince};

/// What a stream has waiting: changed names per kind, and since when.
#[derive(Debug, Default)]
pub struct Pending {
    /// Changed names, per kind.
    pub names: BTreeMap<Kind, BTreeSet<String>>,
    /// When the oldest of them changed (push latency).
    pub since: Option<Instant>,
}

/// One connected stream, as the hub sees it.
#[derive(Debug)]
pub struct StreamHandle {
    /// Hub-local id.
    pub id: u64,
    /// Changes not yet handed to the stream's machine.
    pub pending: Mutex<Pending>,
    /// Wakes the stream when `pending` grows.
    pub notify: Notify,
    /// What `/xds/clients` shows.
    pub info: Mutex<ClientInfo>,
}

impl StreamHandle {
    /// Takes everything pending.
    pub fn take(&self) -> Pending {
        std::mem::take(&mut *self.pending.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// A connected client, as `/xds/clients` shows it.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientInfo {
    /// The client's `node.id` (from its first request).
    pub node_id: String,
    /// The peer address.
    pub peer: String,
    /// `sotw` or `delta` (empty until the first request).
    pub protocol: &'static str,
    /// Unix time of the connection, in seconds.
    pub connected_at: i64,
    /// Responses sent.
    pub pushes: u64,
    /// Responses the client rejected.
    pub nacks: u64,
    /// The last rejection's error detail.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_nack: Option<String>,
    /// Subscribed names per type (`*` for a wildcard).
    pub subscriptions: BTreeMap<&'static str, usize>,
    /// Whether the subscription of a type is a wildcard.
    pub wildcard: BTreeSet<&'static str>,
}

#[derive(Debug, Default)]
struct Routing {
    streams: HashMap<u64, Arc<StreamHandle>>,
    wildcard: [HashSet<u64>; 4],
    /// The streams subscribed to each name. The name is allocated once, by
    /// the first stream subscribing to it, and shared with `indexed`: a
    /// thousand streams subscribed to 10,000 names keep 10,000 strings.
    by_name: [HashMap<Arc<str>, HashSet<u64>>; 4],
    /// What each stream is indexed under (to take it out again).
    indexed: HashMap<u64, Vec<Indexed>>,
}

/// One entry of a stream's routing: a kind's wildcard (`None`) or a name.
type Indexed = (Kind, Option<Arc<str>>);

fn slot(kind: Kind) -> usize {
    match kind {
        Kind::Cluster => 0,
        Kind::ClusterLoadAssignment => 1,
        Kind::Listener => 2,
        Kind::RouteConfiguration => 3,
    }
}

/// The catalog, the streams and whether serving may start.
#[derive(Debug)]
pub struct Hub {
    catalog: RwLock<Catalog>,
    routing: Mutex<Routing>,
    next_id: AtomicU64,
    ready: watch::Sender<bool>,
    /// Why this replica stopped following (a watch failing for longer than
    /// `unready_after`): its streams end and new ones are refused meanwhile.
    stale: Mutex<Option<String>>,
}

impl Default for Hub {
    fn default() -> Self {
        Self {
            catalog: RwLock::default(),
            routing: Mutex::default(),
            next_id: AtomicU64::new(1),
            ready: watch::Sender::new(false),
            stale: Mutex::new(None),
        }
    }
}

/// How often the hub checks whether the watches still work.
const HEALTH_CHECK: std::time::Duration = std::time::Duration::from_secs(1);

impl Hub {
    /// The catalog, read-locked (hold it briefly: the follower waits).
    pub fn catalog(&self) -> RwLockReadGuard<'_, Catalog> {
        self.catalog.read().unwrap_or_else(PoisonError::into_inner)
    }

    /// Resolves once every cluster's first complete list is in the catalog.
    pub async fn wait_ready(&self) {
        let mut rx = self.ready.subscribe();
        // The sender lives as long as the hub, which outlives this borrow.
        let _ = rx.wait_for(|r| *r).await;
    }

    /// Whether serving has started.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// Why this replica does not serve now (`None`: it follows).
    pub fn stale(&self) -> Option<String> {
        self.stale
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Records whether the watches follow (`reason`: why not) and, when that
    /// changes to not following, wakes every stream so it ends.
    fn set_stale(&self, reason: Option<String>) {
        let mut s = self.stale.lock().unwrap_or_else(PoisonError::into_inner);
        if *s == reason {
            return;
        }
        match &reason {
            Some(r) => {
                tracing::warn!(reason = %r, "xDS: this replica stopped following the API server; ending its streams, refusing new ones")
            }
            None => tracing::info!("xDS: following the API server again; serving"),
        }
        let wake = reason.is_some();
        *s = reason;
        drop(s);
        if wake {
            for h in self.lock().streams.values() {
                h.notify.notify_one();
            }
        }
    }

    /// Registers a new stream.
    pub fn connect(&self, peer: String) -> Arc<StreamHandle> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let h = Arc::new(StreamHandle {
            id,
            pending: Mutex::default(),
            notify: Notify::new(),
            info: Mutex::new(ClientInfo {
                peer,
                connected_at: jiff::Timestamp::now().as_second(),
                ..ClientInfo::default()
            }),
        });
        self.lock().streams.insert(id, h.clone());
        h
    }

    /// How many streams are connected.
    pub fn streams(&self) -> usize {
        self.lock().streams.len()
    }

    /// Unregisters a stream.
    pub fn disconnect(&self, id: u64) {
        let mut r = self.lock();
        r.streams.remove(&id);
        unindex(&mut r, id);
    }

    /// The connected clients.
    pub fn clients(&self) -> Vec<ClientInfo> {
        let r = self.lock();
        let mut v: Vec<ClientInfo> = r
            .streams
            .values()
            .map(|h| {
                h.info
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone()
            })
            .collect();
        v.sort_by(|a, b| (&a.node_id, &a.peer).cmp(&(&b.node_id, &b.peer)));
        v
    }

    /// Re-indexes stream `id` under what `machine` is subscribed to now.
    pub fn route(&self, id: u64, machine: &Stream) {
        let mut entries = Vec::new();
        let mut subs = BTreeMap::new();
        let mut wild = BTreeSet::new();
        for kind in Kind::ALL {
            match machine.interest(kind) {
                Interest::None => {}
                Interest::Wildcard => {
                    entries.push((kind, None));
                    wild.insert(short(kind));
                }
                Interest::Names(names) => {
                    subs.insert(short(kind), names.len());
                    entries.push((kind, Some(names)));
                }
            }
        }
        let mut r = self.lock();
        if let Some(h) = r.streams.get(&id) {
            let mut info = h.info.lock().unwrap_or_else(PoisonError::into_inner);
            info.subscriptions = subs;
            info.wildcard = wild;
        }
        unindex(&mut r, id);
        let mut indexed = Vec::new();
        for (kind, names) in entries {
            let Some(names) = names else {
                r.wildcard[slot(kind)].insert(id);
                indexed.push((kind, None));
                continue;
            };
            let map = &mut r.by_name[slot(kind)];
            for n in names {
                let shared = match map.get_key_value(n) {
                    Some((shared, _)) => shared.clone(),
                    None => Arc::from(n),
                };
                map.entry(shared.clone()).or_default().insert(id);
                indexed.push((kind, Some(shared)));
            }
        }
        r.indexed.insert(id, indexed);
    }

    /// Marks `changed` on the streams subscribed to them and wakes those.
    pub fn dispatch(&self, changed: &[(Kind, String)]) {
        if changed.is_empty() {
            return;
        }
        let now = Instant::now();
        let r = self.lock();
        let mut woken: HashMap<u64, Vec<&(Kind, String)>> = HashMap::new();
        for c in changed {
            let (kind, name) = c;
            for id in &r.wildcard[slot(*kind)] {
                woken.entry(*id).or_default().push(c);
            }
            if let Some(ids) = r.by_name[slot(*kind)].get(name.as_str()) {
                for id in ids {
                    woken.entry(*id).or_default().push(c);
                }
            }
        }
        for (id, names) in woken {
            let Some(h) = r.streams.get(&id) else {
                continue;
            };
            {
                let mut p = h.pending.lock().unwrap_or_else(PoisonError::into_inner);
                for (kind, name) in names {
                    p.names.entry(*kind).or_default().insert(name.clone());
                }
                p.since.get_or_insert(now);
            }
            h.notify.notify_one();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Routing> {
        self.routing.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Applies the changes of the given services to the catalog and
    /// dispatches what changed.
    pub fn apply(&self, services: &[(ServiceKey, Option<Arc<ServiceNodes>>)]) -> usize {
        let mut changed = Vec::new();
        {
            let mut c = self.catalog.write().unwrap_or_else(PoisonError::into_inner);
            for (key, nodes) in services {
                changed.extend(c.apply(key, nodes.as_deref()));
            }
        }
        self.dispatch(&changed);
        changed.len()
    }

    /// Follows `state` until `stop`: every change of the desired nodes goes
    /// into the catalog at once; serving starts when every cluster has been
    /// listed completely.
    pub async fn follow(
        self: Arc<Self>,
        state: Arc<ControllerState>,
        stop: tokio_util::sync::CancellationToken,
    ) {
        let mut rx = state.subscribe();
        let mut last = BTreeMap::new();
        let mut cursor = None;
        let mut health = tokio::time::interval(HEALTH_CHECK);
        health.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            rx.mark_unchanged();
            // Listed first, then the desired state: a `true` read here means
            // the state read next holds the whole first list.
            let listed = state.clusters().values().all(|c| c.listed);
            let (next, since) = state.desired_since(cursor);
            cursor = Some(next);
            self.apply(&advance(&mut last, since));
            if listed && !self.is_ready() {
                tracing::info!(
                    clusters = self.catalog().len(Kind::Cluster),
                    "xDS serving: every cluster's first list is in"
                );
                self.ready.send_replace(true);
            }
            // The watches' health: what `/readyz` says of them (not of the
            // Lease: a replica that cannot lead still follows).
            loop {
                let failing: Vec<String> = state
                    .failing_too_long(Instant::now())
                    .into_iter()
                    .filter(|u| u.cluster.is_some())
                    .map(|u| u.to_string())
                    .collect();
                self.set_stale((!failing.is_empty()).then(|| failing.join("; ")));
                tokio::select! {
                    _ = stop.cancelled() => return,
                    r = rx.changed() => if r.is_err() { return } else { break },
                    _ = health.tick() => {}
                }
            }
        }
    }
}

fn unindex(r: &mut Routing, id: u64) {
    for (kind, name) in r.indexed.remove(&id).unwrap_or_default() {
        match name {
            None => {
                r.wildcard[slot(kind)].remove(&id);
            }
            Some(n) => {
                let map = &mut r.by_name[slot(kind)];
                if let Some(set) = map.get_mut(&*n) {
                    set.remove(&id);
                    if set.is_empty() {
                        map.remove(&*n);
                    }
                }
            }
        }
    }
}

/// The short name of a kind (`/xds/clients`, metrics).
pub fn short(kind: Kind) -> &'static str {
    match kind {
        Kind::Cluster => "cds",
        Kind::ClusterLoadAssignment => "eds",
        Kind::Listener => "lds",
        Kind::RouteConfiguration => "rds",
    }
}

/// Brings `last` (what the catalog holds, by service) to what `since` says and
/// returns the services that differ, in key order (see [`diff`]). A change
/// back to the same content (same version) is none.
pub fn advance(
    last: &mut BTreeMap<ServiceKey, Arc<ServiceNodes>>,
    since: DesiredSince,
) -> Vec<(ServiceKey, Option<Arc<ServiceNodes>>)> {
    match since {
        DesiredSince::All(now) => {
            let old: Vec<Arc<ServiceNodes>> = last.values().cloned().collect();
            let out = diff(&old, &now);
            *last = now.into_iter().map(|n| (n.key.clone(), n)).collect();
            out
        }
        DesiredSince::Changed(changed) => changed
            .into_iter()
            .filter(|(key, now)| {
                let same = match (last.get(key), now) {
                    (Some(o), Some(n)) => same_content(o, n),
                    (None, None) => true,
                    _ => false,
                };
                match now {
                    Some(n) => last.insert(key.clone(), n.clone()),
                    None => last.remove(key),
                };
                !same
            })
            .collect(),
    }
}

/// Whether two desired values of a service publish the same thing (`version`
/// covers the nodes, the extras and the owner).
fn same_content(o: &Arc<ServiceNodes>, n: &Arc<ServiceNodes>) -> bool {
    Arc::ptr_eq(o, n) || o.version == n.version
}

/// The services that differ between two key-sorted snapshots of the desired
/// state (the same `Arc` = unchanged), with their new value (`None`: gone).
pub fn diff(
    old: &[Arc<ServiceNodes>],
    new: &[Arc<ServiceNodes>],
) -> Vec<(ServiceKey, Option<Arc<ServiceNodes>>)> {
    use std::cmp::Ordering::*;
    let mut out = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < old.len() || j < new.len() {
        match (old.get(i), new.get(j)) {
            (Some(o), Some(n)) => match o.key.cmp(&n.key) {
                Equal => {
                    if !same_content(o, n) {
                        out.push((n.key.clone(), Some(n.clone())));
                    }
                    i += 1;
                    j += 1;
                }
                Less => {
                    out.push((o.key.clone(), None));
                    i += 1;
                }
                Greater => {
                    out.push((n.key.clone(), Some(n.clone())));
                    j += 1;
                }
            },
            (Some(o), None) => {
                out.push((o.key.clone(), None));
                i += 1;
            }
            (None, Some(n)) => {
                out.push((n.key.clone(), Some(n.clone())));
                j += 1;
            }
            (None, None) => break,
        }
    }
    out
}

#[cfg(test)]
mod tests;
