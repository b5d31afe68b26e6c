//! What the relists of every kind share: the pending next state, replacing
//! the whole state, and maps with full B-tree leaves.

use super::*;

/// Makes `next` the map of what is known of each Service (UIDs, ports)
/// after a Service relist; returns the ids whose value changed, was added
/// or removed (what the relist touched). The one swap both Service relists
/// use.
pub(super) fn replace_ids<V: PartialEq>(
    map: &mut BTreeMap<(String, String), V>,
    next: BTreeMap<(String, String), V>,
) -> BTreeSet<(String, String)> {
    let differs = |a: &BTreeMap<(String, String), V>, b: &BTreeMap<(String, String), V>| {
        a.iter()
            .filter(|(id, v)| b.get(*id) != Some(*v))
            .map(|(id, _)| id.clone())
            .collect::<Vec<_>>()
    };
    let touched = differs(map, &next)
        .into_iter()
        .chain(differs(&next, map))
        .collect();
    *map = next;
    touched
}

/// `map` with full B-tree leaves, for the maps a relist builds or fills.
///
/// Why (issue 19, item 1): a `BTreeMap` filled one insert at a time in key
/// order, as a list arrives, splits every full leaf in the middle and so
/// ends with leaves about half full: heaptrack counted ~6 entries per
/// 11-entry leaf in the index's per-slice and per-service maps, ~440 bytes
/// per service over three maps. Collecting a sorted iterator bulk-builds
/// full leaves instead (the standard library sorts the already sorted
/// entries in one pass). O(n) moves of the map's entries, no conversion, on
/// a relist that is O(n) already; later single inserts split as before.
pub(super) fn compacted<K: Ord, V>(map: BTreeMap<K, V>) -> BTreeMap<K, V> {
    map.into_iter().collect()
}

impl Index {
    /// Starts a relist (kube-runtime's `Event::Init`); drops a relist that
    /// was being fed and never finished.
    pub fn begin_reset(&mut self) {
        self.reset = Some(PendingReset::default());
    }

    /// Makes `desired` the state; returns the keys that changed or vanished.
    /// An unchanged service keeps the current allocation (the one the
    /// runtime's `ControllerState` holds).
    pub(super) fn replace_all(
        &mut self,
        mut desired: BTreeMap<ServiceKey, Arc<ServiceNodes>>,
    ) -> Vec<ServiceKey> {
        // ExternalName services do not come from the listed objects.
        for k in &self.external {
            if let Some(current) = self.current(k) {
                desired.insert(k.clone(), Arc::clone(current));
            }
        }
        let (mut desired, withheld): (BTreeMap<_, _>, BTreeMap<_, _>) =
            desired.into_iter().partition(|(k, _)| self.exported(k));
        self.withheld = withheld;
        let mut changed: BTreeSet<ServiceKey> = self
            .services
            .keys()
            .filter(|k| !desired.contains_key(*k))
            .cloned()
            .collect();
        for (k, v) in &mut desired {
            match self.services.get(k) {
                Some(current) if current == v => *v = Arc::clone(current),
                _ => {
                    changed.insert(k.clone());
                }
            }
        }
        self.services = compacted(desired);
        self.node_total = self.services.values().map(|s| s.node_count()).sum();
        changed.into_iter().collect()
    }
}
