//! Where every service and node goes, and what it costs: the from-scratch
//! [`build`] (the reference the incremental [`Builder`] is tested against).

use super::*;

pub(super) fn entry_size(e: &Entry) -> Result<usize, BuildError> {
    let t = serde_json::to_string(e).map_err(|x| BuildError::Json(x.into()))?;
    Ok(escaped_len(&t))
}

/// Upper bound of the escaped size of everything in a shard but its entries.
pub(super) const SHARD_OVERHEAD: usize = 96;

pub(super) fn group_overhead(id: &str) -> usize {
    // {"id":"<id>","endpoints":[]},  escaped, with margin
    2 * (30 + escaped_len(id))
}

/// Compact JSON of `v` (plain data always serializes).
pub(super) fn json<T: Serialize + ?Sized>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

/// `s` as it appears inside a JSON string (escaped, without quotes): what
/// [`escaped_twice_len`] measures without building it.
#[cfg(test)]
pub(super) fn inner(s: &str) -> String {
    let q = serde_json::to_string(s).unwrap_or_default();
    q.get(1..q.len().saturating_sub(1))
        .unwrap_or_default()
        .to_string()
}

/// A service whose whole entry is bigger than this share (a quarter) of a
/// shard's room gets shard(s) of its own; smaller ones share the hash
/// buckets. Buckets are filled by hash, not packed, so an entry close to a
/// shard's size would force many more (mostly empty) buckets before it
/// lands alone; a quarter keeps the buckets reasonably full.
pub(super) const OWN_SHARD_DIVISOR: usize = 4;

/// The most buckets (and the most parts of one service) the doublings go
/// to: far beyond any state a watch can carry.
pub(super) const MAX_COUNT: usize = 1 << 16;

/// What one node adds to a measured shard text: its JSON inside the value
/// string (escaped once), measured escaped (twice), plus its comma.
pub(super) fn node_cost(n: &Node) -> usize {
    escaped_twice_len(&json(n)) + 1
}

/// What one port key adds to a measured shard text (`"key":[],` inside
/// the value string, measured escaped twice, like [`node_cost`]); an
/// object's estimate is [`crate::crd::shards::key_cost`].
pub(super) fn escaped_key_cost(port: &str) -> usize {
    escaped_twice_len(&format!("{}:[],", json(port)))
}

/// `escaped_len(inner(s))` without building the escaped text: a value's
/// JSON is escaped once into the shard text, and measured escaped again.
pub(super) fn escaped_twice_len(s: &str) -> usize {
    s.bytes()
        .map(|b| match b {
            // `\"` / `\\` -> 4 characters once escaped again
            b'"' | b'\\' => 4,
            // `\n` -> `\\n`
            b'\n' | b'\r' | b'\t' | 0x08 | 0x0c => 3,
            // `\u00XX` -> `\\u00XX`
            0..=0x1f => 7,
            _ => 1,
        })
        .sum()
}

/// The stable bucket hash of a small service: FNV-1a 64 of
/// `<id>/<ns>/<name>` ([`crate::crd::shards::node_hash`], the hash the
/// DiscoveredService shards use, pinned forever), so a service's bucket
/// depends on its name and the bucket count only, never on the services
/// sorting before it.
pub(super) fn service_hash(id: &str, ns: &str, name: &str) -> u64 {
    crate::crd::shards::node_hash(&format!("{id}/{ns}/{name}"))
}

/// Splits one service too big for a shard into parts by the hash of each
/// node's host ([`crate::crd::shards::partition`], the partition of the
/// DiscoveredService shards): the smallest power-of-two count `>= 2` at
/// which every part fits `avail`. A node's part depends on its host and the
/// count only, so one endpoint added or removed changes one part, wherever
/// it sorts; all ports of an endpoint are in the same part; part 0 carries
/// every port key.
pub(super) fn split_service(
    key: &ServiceKey,
    name: &str,
    ports: &PortMap,
    avail: usize,
    max: usize,
) -> Result<(Vec<Entry>, Split), BuildError> {
    let too_large = || BuildError::ServiceTooLarge {
        service: key.to_string(),
        max,
    };
    let fixed = part_fixed(name, ports)?;
    let items: Vec<(u64, usize)> = ports
        .values()
        .flatten()
        .map(|n| (crate::crd::shards::node_hash(&n.host), node_cost(n)))
        .collect();
    let cap = split_cap(items.len());
    let mut count = 2usize;
    let sizes = loop {
        let mut sizes = vec![fixed; count];
        for (h, c) in &items {
            sizes[bucket(*h, count)] += c;
        }
        if sizes.iter().all(|s| *s <= avail) {
            break sizes;
        }
        if count >= cap {
            return Err(too_large());
        }
        count *= 2;
    };
    let total = u32::try_from(count).map_err(BuildError::TooMany)?;
    let parts = crate::crd::shards::partition(ports, total);
    let mut out = Vec::with_capacity(count);
    for (i, pm) in parts.iter().enumerate() {
        out.push(part_entry(name, pm, i, total)?);
    }
    let split = Split {
        fixed,
        parts: parts.into_iter().zip(sizes).collect(),
        digests: None,
    };
    Ok((out, split))
}

/// The largest part count [`split_service`] tries for `nodes` nodes.
pub(super) fn split_cap(nodes: usize) -> usize {
    nodes.next_power_of_two().clamp(2, MAX_COUNT)
}

/// Upper bound of a part's size but its nodes: the entry around an empty
/// value with the longest part numbers, and every port key.
pub(super) fn part_fixed(name: &str, ports: &PortMap) -> Result<usize, BuildError> {
    Ok(entry_size(&Entry {
        name: name.to_string(),
        value: "{}".to_string(),
        part: Some(Part {
            index: u32::MAX,
            count: u32::MAX,
        }),
    })? + ports.keys().map(|p| escaped_key_cost(p)).sum::<usize>())
}

/// What `pm`'s nodes cost ([`node_cost`] summed), from `value_twice`, the
/// [`escaped_twice_len`] of its text ([`port_json`]), instead of
/// serializing every node again: `escaped_twice_len` adds up byte by byte,
/// and `value` is `{`, per port `"key":[` + the nodes joined by `,` + `]`,
/// joined by `,`, then `}`; the punctuation costs 1 each.
pub(super) fn nodes_cost(pm: &PortMap, value_twice: usize) -> usize {
    let keys = pm.len();
    let punctuation = 2
        + pm.keys()
            .map(|k| escaped_twice_len(&json(k)) + 3)
            .sum::<usize>()
        + keys.saturating_sub(1)
        + pm.values()
            .map(|l| l.len().saturating_sub(1))
            .sum::<usize>();
    let nodes: usize = pm.values().map(Vec::len).sum();
    // Every node's text plus one comma each.
    value_twice.saturating_sub(punctuation) + nodes
}

/// Part `i` of `count` of service entry `name`.
pub(super) fn part_entry(
    name: &str,
    pm: &PortMap,
    i: usize,
    count: u32,
) -> Result<Entry, BuildError> {
    part_entry_of(name, port_json(pm), i, count)
}

/// Part `i` of `count` of service entry `name`, its value serialized.
pub(super) fn part_entry_of(
    name: &str,
    value: String,
    i: usize,
    count: u32,
) -> Result<Entry, BuildError> {
    Ok(Entry {
        name: name.to_string(),
        value,
        part: Some(Part {
            index: u32::try_from(i).map_err(BuildError::TooMany)?,
            count,
        }),
    })
}

/// How [`split_service`] cut a service: per part its nodes and measured
/// size (`fixed` plus its nodes' costs). A [`Builder`] keeps it, so that
/// one endpoint changed in a split service re-serializes and re-measures
/// only the part(s) whose nodes changed ([`Builder::resplit`]).
#[derive(Debug)]
pub(super) struct Split {
    pub(super) fixed: usize,
    pub(super) parts: Vec<(PortMap, usize)>,
    /// Per part, the digest of its nodes from the value's kept
    /// [`crate::model::version::Buckets`] (`None`: the value had none, or the count does not
    /// divide [`MAX_SHARDS`]): a part whose digest did not change holds the
    /// same nodes, so [`Builder::resplit`] looks at the changed parts only.
    pub(super) digests: Option<Vec<PortsDigest>>,
}

/// The digest of every part of `count` of `s`'s nodes, from its kept
/// buckets (O(buckets), no node touched): `None` without buckets, or when
/// `count` does not divide [`MAX_SHARDS`] (a node's part then does not
/// follow from its bucket).
pub(super) fn part_digests(s: &ServiceNodes, count: usize) -> Option<Vec<PortsDigest>> {
    let b = s.buckets.0.as_ref()?;
    let count = u32::try_from(count).ok()?;
    if count == 0 || !count.is_power_of_two() || count > MAX_SHARDS {
        return None;
    }
    Some((0..count).map(|k| b.shard_digest(k, count)).collect())
}

/// `h mod count` as an index (`count` >= 1).
pub(super) fn bucket(h: u64, count: usize) -> usize {
    let count = u64::try_from(count.max(1)).unwrap_or(u64::MAX);
    // The remainder is below `count`, itself a usize.
    usize::try_from(h % count).unwrap_or(0)
}

/// A small service on its way into a bucket: what [`bucket_count`] needs.
#[derive(Debug, Clone, Copy)]
pub(super) struct Fit<'a> {
    pub(super) cluster: &'a str,
    /// Its measured size with its comma.
    pub(super) cost: usize,
    pub(super) hash: u64,
}

/// The smallest power of two at which every bucket of `small` (by
/// [`service_hash`], in state order) fits `max_bytes` (with the shard's
/// and each cluster group's overhead). A pure function of the content, like
/// the DiscoveredService shard count: the planner needs no memory of
/// earlier layouts, at the price that a bucket crossing the limit doubles
/// the count (every bucket is rewritten once).
pub(super) fn bucket_count(small: &[Fit<'_>], max_bytes: usize) -> Result<usize, BuildError> {
    let room = max_bytes.saturating_sub(SHARD_OVERHEAD);
    let mut count = 1usize;
    loop {
        let mut sizes = vec![0usize; count];
        let mut last: Vec<Option<&str>> = vec![None; count];
        for s in small {
            let i = bucket(s.hash, count);
            if last[i] != Some(s.cluster) {
                last[i] = Some(s.cluster);
                sizes[i] += group_overhead(s.cluster);
            }
            sizes[i] += s.cost;
        }
        if sizes.iter().all(|s| *s <= room) {
            return Ok(count);
        }
        if count >= MAX_COUNT {
            return Err(BuildError::Crowded { max: max_bytes });
        }
        count *= 2;
    }
}

/// Where one service goes, with its entries: the one decision [`build`]
/// and [`Builder`] share.
pub(super) enum Placement {
    /// Into the bucket of `hash`, costing `cost` (with its comma).
    Small {
        entry: Entry,
        cost: usize,
        hash: u64,
    },
    /// Shard(s) of its own: the whole entry, or one entry per part and
    /// how it was split.
    Own(Vec<Entry>, Option<Split>),
}

/// Places service `id/ns/name` (see [`build`]).
pub(super) fn place(
    id: &str,
    ns: &str,
    name: &str,
    ports: &PortMap,
    max_bytes: usize,
    part_bytes: usize,
) -> Result<Placement, BuildError> {
    let avail = max_bytes.saturating_sub(SHARD_OVERHEAD + group_overhead(id) + 1);
    let room = part_room(id, max_bytes, part_bytes);
    let ename = format!("{ns}/{name}");
    let whole = Entry {
        name: ename.clone(),
        value: port_json(ports),
        part: None,
    };
    // Escaping only grows a text: a value longer than the room
    // needs parts, without measuring (escaping) it all first.
    let size = if whole.value.len() > avail {
        usize::MAX
    } else {
        entry_size(&whole)?
    };
    if size <= avail / OWN_SHARD_DIVISOR {
        return Ok(Placement::Small {
            entry: whole,
            cost: size + 1,
            hash: service_hash(id, ns, name),
        });
    }
    if size <= room {
        return Ok(Placement::Own(vec![whole], None));
    }
    let key = ServiceKey::new(id, ns, name);
    // `sort_nodes` is `Node`'s own order (host, port, then the rest).
    if !ports.values().all(|n| n.is_sorted()) {
        return Err(BuildError::Unsorted {
            service: key.to_string(),
        });
    }
    split_service(&key, &ename, ports, room, max_bytes).map(|(e, s)| Placement::Own(e, Some(s)))
}

/// The room for the entry of a service with shard(s) of its own, in a
/// shard of cluster `id`: the shard budget and the part budget
/// ([`DEFAULT_MAX_PART_BYTES`]), whichever is smaller, less the shard's and
/// the cluster group's overhead.
pub(super) fn part_room(id: &str, max_bytes: usize, part_bytes: usize) -> usize {
    max_bytes
        .min(part_bytes)
        .saturating_sub(SHARD_OVERHEAD + group_overhead(id) + 1)
}

/// Checks a shard text, whose [`escaped_len`] is `len`, against the budget
/// and names it: the last step of every shard, built from scratch or by a
/// [`Builder`] (which adds up the lengths of its pieces instead of reading
/// the whole text once more).
pub(super) fn finish_shard(
    base: &str,
    i: usize,
    text: String,
    len: usize,
    max_bytes: usize,
) -> Result<ShardData, BuildError> {
    debug_assert_eq!(len, escaped_len(&text), "shard {i}");
    if len > max_bytes {
        // The accounting is an upper bound; reaching this is a bug.
        return Err(BuildError::ShardOverBudget {
            shard: i,
            len,
            max: max_bytes,
        });
    }
    let name = shard_configmap_name(base, i);
    Ok(ShardData {
        key: format!("{name}.json"),
        name,
        sha256: sha256_hex(&text),
        text,
    })
}

/// Format 2's `version` of a layout: the first 16 hex digits of the sha256
/// of `{"clusters":[ids],"shards":[sha256 of each shard, in order]}`
/// (compact JSON). The shard hashes pin every byte of the content and the
/// cluster list the clusters without services, so it names the state as
/// well as a hash of the whole document would, but costs a few hundred
/// bytes of hashing per round instead of the whole state (an incremental
/// [`Builder`] must not re-read everything for it), and a reader that has
/// checked each shard against the index checks it from the index alone.
pub fn layout_version<'a>(
    clusters: &[String],
    shard_sha256s: impl IntoIterator<Item = &'a str>,
) -> String {
    #[derive(Serialize)]
    struct Of<'a> {
        clusters: &'a [String],
        shards: Vec<&'a str>,
    }
    let text = json(&Of {
        clusters,
        shards: shard_sha256s.into_iter().collect(),
    });
    let mut h = sha256_hex(&text);
    h.truncate(16);
    h
}

/// The index text and the [`Layout`] around finished shards.
pub(super) fn layout_of(
    clusters: Vec<String>,
    shards: Vec<Arc<ShardData>>,
    services: usize,
    nodes: usize,
) -> Result<Layout, BuildError> {
    let version = layout_version(&clusters, shards.iter().map(|s| s.sha256.as_str()));
    let index = IndexDoc {
        format: FORMAT,
        version: version.clone(),
        clusters,
        services,
        nodes,
        shards: shards
            .iter()
            .map(|s| ShardRef {
                name: s.name.clone(),
                key: s.key.clone(),
                sha256: s.sha256.clone(),
                bytes: s.text.len(),
            })
            .collect(),
    };
    let index = serde_json::to_string(&index).map_err(|e| BuildError::Json(e.into()))?;
    Ok(Layout {
        version,
        index,
        shards,
        services,
        nodes,
    })
}

/// Cuts `dump` into shards of at most `max_bytes` (escaped) each, named
/// `<base>-<i>`, and writes the index. Always at least one shard.
///
/// Shards `0..B` are the buckets of the small services (by
/// [`service_hash`], `B` the smallest fitting power of two); after them
/// come the services with shards of their own, in (cluster, namespace,
/// name) order: one shard holding the whole service, or one shard per part
/// ([`split_service`]). So one change in one service changes one shard's
/// text (its bucket or its part), and the planner writes that shard and the
/// index only.
///
/// This builds everything from scratch, through `serde` documents: it is
/// the reference the incremental [`Builder`] (what the snapshot sink runs)
/// is tested against, byte for byte.
pub fn build(dump: &Dump, base: &str, max_bytes: usize) -> Result<Layout, BuildError> {
    build_with(dump, base, max_bytes, DEFAULT_MAX_PART_BYTES)
}

/// Both budgets must be at least [`MIN_SHARD_BYTES`].
pub(super) fn check_budgets(max_bytes: usize, part_bytes: usize) -> Result<(), BuildError> {
    match [max_bytes, part_bytes]
        .into_iter()
        .find(|b| *b < MIN_SHARD_BYTES)
    {
        Some(b) => Err(BuildError::BudgetTooSmall(b)),
        None => Ok(()),
    }
}

/// [`build`] with parts of at most `part_bytes` (the part budget is capped
/// by `max_bytes`; with `part_bytes >= max_bytes` parts fill whole shards,
/// the layout of releases before [`DEFAULT_MAX_PART_BYTES`], which readers
/// read the same way).
pub fn build_with(
    dump: &Dump,
    base: &str,
    max_bytes: usize,
    part_bytes: usize,
) -> Result<Layout, BuildError> {
    check_budgets(max_bytes, part_bytes)?;
    let mut small: Vec<(Fit<'_>, Entry)> = Vec::new();
    let mut own: Vec<Vec<Group>> = Vec::new();
    for (id, services) in &dump.clusters {
        for ((ns, name), ports) in services {
            match place(id, ns, name, ports, max_bytes, part_bytes)? {
                Placement::Small { entry, cost, hash } => small.push((
                    Fit {
                        cluster: id,
                        cost,
                        hash,
                    },
                    entry,
                )),
                Placement::Own(entries, _) => own.extend(entries.into_iter().map(|e| {
                    vec![Group {
                        id: id.clone(),
                        endpoints: vec![e],
                    }]
                })),
            }
        }
    }
    let fits: Vec<Fit<'_>> = small.iter().map(|(f, _)| *f).collect();
    let buckets = bucket_count(&fits, max_bytes)?;
    let mut shards: Vec<Vec<Group>> = (0..buckets).map(|_| Vec::new()).collect();
    for (s, entry) in small {
        let b = &mut shards[bucket(s.hash, buckets)];
        if b.last().is_none_or(|g| g.id != s.cluster) {
            b.push(Group {
                id: s.cluster.to_string(),
                endpoints: Vec::new(),
            });
        }
        if let Some(g) = b.last_mut() {
            g.endpoints.push(entry);
        }
    }
    shards.extend(own);
    let mut out = Vec::with_capacity(shards.len());
    for (i, groups) in shards.into_iter().enumerate() {
        let doc = ShardDoc {
            format: FORMAT,
            index: i,
            endpoints: groups,
        };
        let text = serde_json::to_string(&doc).map_err(|e| BuildError::Json(e.into()))?;
        let len = escaped_len(&text);
        out.push(Arc::new(finish_shard(base, i, text, len, max_bytes)?));
    }
    layout_of(
        dump.clusters.keys().cloned().collect(),
        out,
        dump.services(),
        dump.nodes(),
    )
}

/// Name of shard `i` of snapshot `base`: `<base>-<i>`, also shard 0 (the
/// index is `<base>`). Not [`crate::crd::shard_name`] (`<base>.<i>`, shard 0
/// keeping `<base>`): both name objects already on API servers, read by
/// name (gateways mount these ConfigMaps; readers check DiscoveredService
/// names), so neither can change without a migration.
pub(super) fn shard_configmap_name(base: &str, i: usize) -> String {
    format!("{base}-{i}")
}
