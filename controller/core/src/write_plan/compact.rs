//! The compact forms the writer's long-lived tables hold: one entry per
//! service in `known`, several per service while a first sync is pending.
//!
//! * [`PackedKey`]: a `ServiceKey` in one heap block.
//! * [`Version`]: a `spec.version`, as a `u64` when it is one of ours.
//! * [`trim_map`] / [`trim_set`]: a drained table gives its buckets back.
//!
//! BENCHMARKS.md has what they save, measured (`benches/planner_memory.rs`
//! for the keys).

use std::collections::{HashMap, HashSet};

use crate::ServiceKey;

/// A [`ServiceKey`] packed into ONE heap block: `cluster 0xFF namespace 0xFF
/// name`. 0xFF never occurs in UTF-8, so the packing is injective and
/// equality and hashing are those of the three strings. A copy is one
/// pointer-and-length plus one small block; the writer holds one per
/// service it ever wrote (`known`) and, during a first sync, several per
/// pending service.
#[derive(Clone, PartialEq, Eq, Hash)]
pub(crate) struct PackedKey(Box<[u8]>);

const KEY_SEP: u8 = 0xFF;

impl PackedKey {
    pub(crate) fn new(k: &ServiceKey) -> Self {
        let mut b = Vec::with_capacity(k.cluster.len() + k.namespace.len() + k.name.len() + 2);
        b.extend_from_slice(k.cluster.as_bytes());
        b.push(KEY_SEP);
        b.extend_from_slice(k.namespace.as_bytes());
        b.push(KEY_SEP);
        b.extend_from_slice(k.name.as_bytes());
        Self(b.into_boxed_slice())
    }

    /// `[cluster, namespace, name]` (each part is UTF-8 by construction).
    fn parts(&self) -> [&str; 3] {
        let mut it = self
            .0
            .splitn(3, |b| *b == KEY_SEP)
            .map(|p| std::str::from_utf8(p).unwrap_or_default());
        [
            it.next().unwrap_or_default(),
            it.next().unwrap_or_default(),
            it.next().unwrap_or_default(),
        ]
    }

    pub(crate) fn cluster(&self) -> &str {
        self.parts()[0]
    }

    pub(crate) fn service_key(&self) -> ServiceKey {
        let [cluster, namespace, name] = self.parts();
        ServiceKey::new(cluster, namespace, name)
    }
}

impl std::fmt::Display for PackedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.service_key().fmt(f)
    }
}

impl std::fmt::Debug for PackedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PackedKey({self})")
    }
}

/// A `spec.version` as held in `known`, without a `String` per service: our
/// versions are 16 lowercase hex digits, i.e. one `u64`; anything else (a
/// foreign object's version, `""` for "rewrite this") is kept as text.
/// Canonical hex and `u64` map one-to-one, so [`Version::is`] is exactly the
/// string comparison it replaces.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Version {
    Hex(u64),
    Text(Box<str>),
}

impl Version {
    pub(crate) fn new(v: &str) -> Self {
        match hex16(v) {
            Some(h) => Self::Hex(h),
            None => Self::Text(v.into()),
        }
    }

    /// Whether this is the version `v`.
    pub(crate) fn is(&self, v: &str) -> bool {
        match self {
            Self::Hex(h) => hex16(v) == Some(*h),
            Self::Text(t) => **t == *v,
        }
    }
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Hex(h) => write!(f, "{h:016x}"),
            Self::Text(t) => f.write_str(t),
        }
    }
}

/// `v` as a number when it is exactly 16 lowercase hex digits.
fn hex16(v: &str) -> Option<u64> {
    if v.len() == 16 && v.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        u64::from_str_radix(v, 16).ok()
    } else {
        None
    }
}

/// Gives a table's memory back once it is mostly empty: a map that held
/// every service during a first sync keeps its buckets after draining
/// otherwise. Amortised O(1): a shrink to twice the
/// length happens only after three quarters of the capacity were removed.
pub(crate) fn trim_map<K: Eq + std::hash::Hash, V>(m: &mut HashMap<K, V>) {
    if m.capacity() > 64 && m.len() * 4 < m.capacity() {
        m.shrink_to(m.len() * 2);
    }
}

/// [`trim_map`] for a set.
pub(crate) fn trim_set<K: Eq + std::hash::Hash>(s: &mut HashSet<K>) {
    if s.capacity() > 64 && s.len() * 4 < s.capacity() {
        s.shrink_to(s.len() * 2);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Node, PortMap, ServiceNodes, SourceKind};

    #[test]
    fn packed_keys_round_trip_and_are_equal_exactly_when_the_keys_are() {
        let keys = [
            ServiceKey::new("", "ns", "web"),
            ServiceKey::new("c1", "ns", "web"),
            ServiceKey::new("", "nsweb", ""),
            ServiceKey::new("", "ns", "web2"),
            // Separators inside parts cannot move a part boundary.
            ServiceKey::new("a/b", "c", "d"),
            ServiceKey::new("a", "b/c", "d"),
            ServiceKey::new("", "", ""),
            ServiceKey::new("zürich", "ñs", "wéb-ø"),
        ];
        for k in &keys {
            let p = PackedKey::new(k);
            assert_eq!(&p.service_key(), k);
            assert_eq!(p.cluster(), k.cluster);
            assert_eq!(p.to_string(), k.to_string());
            for other in &keys {
                assert_eq!(p == PackedKey::new(other), k == other, "{k} vs {other}");
            }
        }
        let set: HashSet<PackedKey> = keys.iter().map(PackedKey::new).collect();
        assert_eq!(set.len(), keys.len());
    }

    #[test]
    fn versions_compare_exactly_like_the_strings_they_replace() {
        let ours = ServiceNodes::new(
            ServiceKey::new("", "ns", "web"),
            SourceKind::EndpointSlice,
            PortMap::from([("http".to_string(), vec![Node::new("10.0.0.1", 80, 50)])]),
            None,
        )
        .version;
        let texts = [
            ours.as_str(),
            "00000000000000ff",
            "ffffffffffffffff",
            "00000000000000FF",  // same number, other spelling: a foreign version
            "0000000000000ff",   // 15 digits
            "000000000000000ff", // 17 digits
            "+0000000000000ff",
            "",
            "v",
            "zzzzzzzzzzzzzzzz",
        ];
        assert!(matches!(Version::new(&ours), Version::Hex(_)));
        assert_eq!(Version::new("00000000000000ff"), Version::Hex(255));
        assert_eq!(
            Version::new("00000000000000FF"),
            Version::Text("00000000000000FF".into())
        );
        for a in texts {
            for b in texts {
                assert_eq!(Version::new(a).is(b), a == b, "{a:?} vs {b:?}");
            }
        }
    }

    #[test]
    fn drained_tables_give_their_memory_back_and_full_ones_keep_it() {
        let mut m: HashMap<u64, u64> = (0..10_000).map(|i| (i, i)).collect();
        let full = m.capacity();
        trim_map(&mut m);
        assert_eq!(m.capacity(), full, "a full table is left alone");
        m.retain(|k, _| *k < 10);
        trim_map(&mut m);
        assert!(
            m.capacity() < 100,
            "capacity {} after draining",
            m.capacity()
        );
        assert_eq!(m.len(), 10);
        let mut s: HashSet<u64> = (0..10_000).collect();
        s.clear();
        trim_set(&mut s);
        assert!(s.capacity() < 100, "capacity {}", s.capacity());
    }
}
