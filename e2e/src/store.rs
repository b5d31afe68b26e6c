//! In-memory storage: objects, the global revision and the event history.
//!
//! Like etcd, one global counter (`rv`) is bumped by every write and stamped into the
//! written object's `metadata.resourceVersion`. Every write also appends one [`Event`]
//! to a bounded history; watches replay from it and then follow it. When an event
//! falls out of the history (or the history is compacted by a fault hook), a watch
//! from an older revision gets `410 Gone` ("too old resource version"), exactly the
//! condition a real API server reports after etcd compaction.
//!
//! ```text
//!  write ──► objects (BTreeMap key -> Arc<Value>)
//!        └─► history (VecDeque<Arc<Event>>, bounded) ──► notify(rv) ──► watch streams
//! ```

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;

use crate::registry::Registry;

/// `(group/resource, namespace, name)`; namespace is `""` for cluster-scoped objects.
pub type Key = (String, String, String);

/// The type of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    /// The object was created.
    Added,
    /// The object was changed.
    Modified,
    /// The object was removed.
    Deleted,
}

impl EventType {
    /// The event type as a watch stream writes it (`ADDED`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One committed write.
#[derive(Debug)]
pub struct Event {
    /// The revision the write committed.
    pub rv: u64,
    /// What the write did.
    pub etype: EventType,
    /// `group/resource`
    pub res: String,
    /// Namespace of the object (`""` if cluster-scoped).
    pub namespace: String,
    /// The object before the write (None for ADDED).
    pub old: Option<Arc<Value>>,
    /// The object after the write (the last state for DELETED).
    pub object: Arc<Value>,
    /// `object` serialized once, shared by all watchers.
    pub object_json: Bytes,
}

/// One entry of the write log (`/_sim/writes`).
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WriteRecord {
    /// When the write happened (Unix time, nanoseconds).
    pub time_nanos: u128,
    /// `create`, `update`, `patch` or `delete`.
    pub verb: String,
    /// API group of the object (`""` for the core group).
    pub group: String,
    /// Plural resource name (`resource/subresource` for subresources).
    pub resource: String,
    /// Namespace of the object (`""` if cluster-scoped).
    pub namespace: String,
    /// Name of the object.
    pub name: String,
    /// resourceVersion the write answered.
    pub resource_version: String,
    /// The user that made the request.
    pub user: String,
}

/// All objects, the revision counter, the event history and the write log.
pub struct Store {
    /// Every stored object by key.
    pub objects: BTreeMap<Key, Arc<Value>>,
    /// The current (last committed) revision.
    pub rv: u64,
    /// Recent events, oldest first, for watches to resume from.
    pub history: VecDeque<Arc<Event>>,
    /// How many events `history` keeps.
    pub history_size: usize,
    /// Highest revision whose event is no longer available to watches.
    pub compacted: u64,
    /// The served resources (built-ins and stored CRDs).
    pub registry: Registry,
    /// The write log (`/_sim/writes`), oldest first.
    pub writes: VecDeque<WriteRecord>,
    /// How many records `writes` keeps.
    pub writes_cap: usize,
    /// The next Service clusterIP to allocate (as a `u32`).
    pub next_cluster_ip: u32,
}

impl Store {
    /// An empty store serving the built-in resources, keeping `history_size` events.
    pub fn new(history_size: usize) -> Self {
        Store {
            objects: BTreeMap::new(),
            rv: 1,
            history: VecDeque::new(),
            history_size: history_size.max(1),
            compacted: 1,
            registry: Registry::with_builtins(),
            writes: VecDeque::new(),
            writes_cap: 200_000,
            next_cluster_ip: 10,
        }
    }

    /// Allocate the next revision (the caller stamps it and then calls [`Store::commit`]).
    pub fn next_rv(&mut self) -> u64 {
        self.rv += 1;
        self.rv
    }

    /// Store (or remove, for DELETED) the object and append the event.
    pub fn commit(
        &mut self,
        rv: u64,
        etype: EventType,
        key: Key,
        old: Option<Arc<Value>>,
        object: Arc<Value>,
    ) -> Arc<Event> {
        match etype {
            EventType::Deleted => {
                self.objects.remove(&key);
            }
            _ => {
                self.objects.insert(key.clone(), object.clone());
            }
        }
        let object_json = Bytes::from(serde_json::to_vec(&*object).unwrap_or_default());
        let event = Arc::new(Event {
            rv,
            etype,
            res: key.0,
            namespace: key.1,
            old,
            object,
            object_json,
        });
        self.history.push_back(event.clone());
        while self.history.len() > self.history_size {
            if let Some(e) = self.history.pop_front() {
                self.compacted = e.rv;
            }
        }
        event
    }

    /// Whether events after `rv` are all still in the history.
    pub fn can_watch_from(&self, rv: u64) -> bool {
        rv >= self.compacted
    }

    /// Events with a revision greater than `rv` (caller checked [`Store::can_watch_from`]).
    pub fn events_after(&self, rv: u64, max: usize) -> Vec<Arc<Event>> {
        let start = self.history.partition_point(|e| e.rv <= rv);
        self.history.range(start..).take(max).cloned().collect()
    }

    /// The objects of `res` (in `namespace`, if given) that changed after revision
    /// `rv`, each with its state AT `rv` (`None`: it did not exist then), taken from
    /// the first event after `rv` that touched it. With [`Store::range_after`]
    /// minus these keys, this is the exact snapshot at `rv` (paginated and
    /// `resourceVersionMatch=Exact` lists). Caller checked [`Store::can_watch_from`].
    pub fn changed_since(
        &self,
        res: &str,
        namespace: Option<&str>,
        rv: u64,
    ) -> BTreeMap<Key, Option<Arc<Value>>> {
        let mut out = BTreeMap::new();
        let start = self.history.partition_point(|e| e.rv <= rv);
        for e in self.history.range(start..) {
            if e.res != res || namespace.is_some_and(|ns| ns != e.namespace) {
                continue;
            }
            let name = e
                .object
                .pointer("/metadata/name")
                .and_then(Value::as_str)
                .unwrap_or("");
            out.entry((e.res.clone(), e.namespace.clone(), name.to_string()))
                .or_insert_with(|| e.old.clone());
        }
        out
    }

    /// Drop the whole history now (fault hook): the next watch from an older
    /// revision gets 410.
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.rv;
    }

    /// Objects of one resource, optionally in one namespace, in key order.
    pub fn range<'a>(
        &'a self,
        res: &'a str,
        namespace: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a Key, &'a Arc<Value>)> + 'a {
        self.range_after(res, namespace, None)
    }

    /// [`Store::range`] starting AFTER `(namespace, name)` (a list's continue
    /// key): a page costs O(page), not a scan from the first object.
    pub fn range_after<'a>(
        &'a self,
        res: &'a str,
        namespace: Option<&'a str>,
        after: Option<(&str, &str)>,
    ) -> impl Iterator<Item = (&'a Key, &'a Arc<Value>)> + 'a {
        use std::ops::Bound;
        let start = match after {
            Some((ns, name)) => {
                Bound::Excluded((res.to_string(), ns.to_string(), name.to_string()))
            }
            None => Bound::Included((
                res.to_string(),
                namespace.unwrap_or("").to_string(),
                String::new(),
            )),
        };
        self.objects
            .range((start, Bound::Unbounded))
            .take_while(move |(k, _)| k.0 == res && namespace.is_none_or(|ns| k.1 == ns))
    }

    /// Append to the write log, dropping the oldest record past `writes_cap`.
    pub fn record_write(&mut self, rec: WriteRecord) {
        self.writes.push_back(rec);
        while self.writes.len() > self.writes_cap {
            self.writes.pop_front();
        }
    }
}
