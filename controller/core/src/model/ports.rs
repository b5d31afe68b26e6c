//! A service's nodes per port key, and their canonical order.

use super::*;

/// Port key -> nodes, nodes sorted by host then port.
///
/// A map sorted by key, like the `BTreeMap` it replaces, so the JSON (and
/// therefore the version hash) stays deterministic, but stored as ONE sorted
/// vector ([`LiteMap`]): a service has one to a few port keys, too few to
/// pay for a B-tree's leaf node per map (BENCHMARKS.md has the measured
/// effect).
/// The API is the subset of `BTreeMap`'s that the code uses, with the same
/// names and semantics (later duplicates win in `collect`/`insert`). The JSON
/// is an object in key order (also when empty), read from any key order; the
/// JSON schema is the `BTreeMap<String, Vec<Node>>` one, so the CRD is
/// unchanged.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct PortMap(LiteMap<String, Vec<Node>>);

impl PortMap {
    /// An empty map (no allocation).
    pub fn new() -> Self {
        Self(LiteMap::new_vec())
    }

    /// Number of port keys.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there is no port key.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The nodes of `port`.
    pub fn get<Q>(&self, port: &Q) -> Option<&Vec<Node>>
    where
        String: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.0.get(port)
    }

    /// The nodes of `port`, mutable.
    pub fn get_mut<Q>(&mut self, port: &Q) -> Option<&mut Vec<Node>>
    where
        String: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.0.get_mut(port)
    }

    /// Whether `port` is a key.
    pub fn contains_key<Q>(&self, port: &Q) -> bool
    where
        String: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.0.contains_key(port)
    }

    /// Sets the nodes of `port`, returning the previous ones.
    pub fn insert(&mut self, port: String, nodes: Vec<Node>) -> Option<Vec<Node>> {
        self.0.insert(port, nodes)
    }

    /// Removes `port`, returning its nodes.
    pub fn remove<Q>(&mut self, port: &Q) -> Option<Vec<Node>>
    where
        String: Borrow<Q>,
        Q: Ord + ?Sized,
    {
        self.0.remove(port)
    }

    /// The entry of `port` (e.g. `.entry(k).or_default().push(node)`).
    pub fn entry(&mut self, port: String) -> PortMapEntry<'_> {
        self.0.entry(port)
    }

    /// Removes every port key.
    pub fn clear(&mut self) {
        self.0.clear();
    }

    /// Keeps the port keys for which `keep` returns `true`.
    pub fn retain(&mut self, mut keep: impl FnMut(&String, &Vec<Node>) -> bool) {
        self.0.retain(|k, v| keep(k, v));
    }

    /// `(port, nodes)` in key order.
    pub fn iter(&self) -> PortMapIter<'_> {
        self.0.as_slice().iter().map(pair)
    }

    /// `(port, nodes)` in key order, nodes mutable.
    pub fn iter_mut(
        &mut self,
    ) -> impl DoubleEndedIterator<Item = (&String, &mut Vec<Node>)> + ExactSizeIterator {
        self.0.iter_mut()
    }

    /// Port keys in order.
    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &String> + ExactSizeIterator {
        self.0.keys()
    }

    /// Node lists in key order.
    pub fn values(&self) -> impl DoubleEndedIterator<Item = &Vec<Node>> + ExactSizeIterator {
        self.0.values()
    }

    /// Node lists in key order, mutable.
    pub fn values_mut(
        &mut self,
    ) -> impl DoubleEndedIterator<Item = &mut Vec<Node>> + ExactSizeIterator {
        self.0.iter_mut().map(|(_, v)| v)
    }

    /// Drops spare capacity of the map and of every node list (for values
    /// that are kept for long, e.g. in the index).
    pub fn shrink_to_fit(&mut self) {
        let mut entries = std::mem::take(&mut self.0).into_tuple_vec();
        entries.shrink_to_fit();
        for (_, nodes) in &mut entries {
            nodes.shrink_to_fit();
        }
        // Taken from a LiteMap: still sorted and without duplicates.
        self.0 = LiteMap::from_sorted_store_unchecked(entries);
    }
}

impl fmt::Debug for PortMap {
    /// As a map, like the `BTreeMap` it replaces.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl FromIterator<(String, Vec<Node>)> for PortMap {
    /// Sorted by key; of duplicate keys the last wins (as for `BTreeMap`).
    /// At its exact size: `Vec::extend` reserves at least 4 entries, and the
    /// usual service has one port key.
    fn from_iter<I: IntoIterator<Item = (String, Vec<Node>)>>(iter: I) -> Self {
        let mut entries = LiteMap::<String, Vec<Node>>::from_iter(iter).into_tuple_vec();
        entries.shrink_to_fit();
        // Taken from a LiteMap: sorted and without duplicates.
        Self(LiteMap::from_sorted_store_unchecked(entries))
    }
}

impl<const N: usize> From<[(String, Vec<Node>); N]> for PortMap {
    fn from(entries: [(String, Vec<Node>); N]) -> Self {
        entries.into_iter().collect()
    }
}

impl Extend<(String, Vec<Node>)> for PortMap {
    fn extend<I: IntoIterator<Item = (String, Vec<Node>)>>(&mut self, iter: I) {
        self.0.extend(iter);
    }
}

impl IntoIterator for PortMap {
    type Item = (String, Vec<Node>);
    type IntoIter = std::vec::IntoIter<(String, Vec<Node>)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_tuple_vec().into_iter()
    }
}

/// An entry of a [`PortMap`] ([`PortMap::entry`]).
pub type PortMapEntry<'a> = litemap::Entry<'a, String, Vec<Node>, Vec<(String, Vec<Node>)>>;

/// Iterator over `(port, nodes)` of a [`PortMap`], in key order.
pub type PortMapIter<'a> = std::iter::Map<
    std::slice::Iter<'a, (String, Vec<Node>)>,
    fn(&'a (String, Vec<Node>)) -> (&'a String, &'a Vec<Node>),
>;

fn pair(entry: &(String, Vec<Node>)) -> (&String, &Vec<Node>) {
    (&entry.0, &entry.1)
}

impl<'a> IntoIterator for &'a PortMap {
    type Item = (&'a String, &'a Vec<Node>);
    type IntoIter = PortMapIter<'a>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl<Q> std::ops::Index<&Q> for PortMap
where
    String: Borrow<Q>,
    Q: Ord + ?Sized,
{
    type Output = Vec<Node>;

    /// The nodes of `port`; panics when absent, like `BTreeMap` (tests and
    /// lookups of keys known to exist).
    fn index(&self, port: &Q) -> &Vec<Node> {
        match self.0.get(port) {
            Some(nodes) => nodes,
            None => panic!("no such port key in PortMap"),
        }
    }
}

impl Serialize for PortMap {
    /// A JSON object in key order, `{}` when empty (LiteMap's own impl would
    /// write an empty map as `[]`).
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for PortMap {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct MapVisitor;
        impl<'de> serde::de::Visitor<'de> for MapVisitor {
            type Value = PortMap;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a map of port key to a list of nodes")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut access: A,
            ) -> Result<PortMap, A::Error> {
                // Keys usually come sorted (we write them so): then every
                // insert is an append.
                let mut map = LiteMap::with_capacity(access.size_hint().unwrap_or(0).min(1024));
                while let Some((port, nodes)) = access.next_entry::<String, Vec<Node>>()? {
                    map.insert(port, nodes);
                }
                Ok(PortMap(map))
            }
        }
        deserializer.deserialize_map(MapVisitor)
    }
}

impl JsonSchema for PortMap {
    fn inline_schema() -> bool {
        <BTreeMap<String, Vec<Node>>>::inline_schema()
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        <BTreeMap<String, Vec<Node>>>::schema_name()
    }

    fn schema_id() -> std::borrow::Cow<'static, str> {
        <BTreeMap<String, Vec<Node>>>::schema_id()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        <BTreeMap<String, Vec<Node>>>::json_schema(generator)
    }
}

/// Sorts nodes the way APISIX does (host, then port) and breaks remaining ties
/// on the other fields so the order is total.
pub fn sort_nodes(nodes: &mut [Node]) {
    nodes.sort_by(|a, b| {
        (&a.host, a.port)
            .cmp(&(&b.host, b.port))
            .then_with(|| a.cmp(b))
    });
}
