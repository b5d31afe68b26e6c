//! The incremental builder: keeps every service's entries and every shard's
//! text and hash across rounds and rebuilds only what changed.

use super::*;

use super::layout::*;

/// What a [`Builder`] keeps of one service between rounds.
#[derive(Debug)]
pub(super) struct CachedService {
    /// The state's value it was built from. A `Weak` keeps the allocation
    /// (not the nodes) alive, so its address cannot be reused by another
    /// value while cached, and a live `Arc<ServiceNodes>` is never changed
    /// in place while a `Weak` to it exists (`Arc::get_mut` refuses,
    /// `Arc::make_mut` moves it): the same address is the same content.
    pub(super) of: Weak<ServiceNodes>,
    pub(super) nodes: usize,
    pub(super) placed: Cached,
}

/// A service's entries as compact JSON texts, each with an id that is new
/// whenever its text is (a shard's members are a list of ids).
#[derive(Debug)]
pub(super) enum Cached {
    Small {
        id: u64,
        text: String,
        cost: usize,
        hash: u64,
    },
    /// Per entry: its id, text and [`escaped_len`].
    Own(Vec<(u64, String, usize)>, Option<Split>),
}

/// A built shard and the ids of the entries it holds, in order.
#[derive(Debug)]
pub(super) struct CachedShard {
    pub(super) members: Vec<u64>,
    pub(super) data: Arc<ShardData>,
}

/// One entry on its way into a shard: its cluster, id, text and the
/// text's [`escaped_len`].
pub(super) type Member<'a> = (&'a str, u64, &'a str, usize);

/// The incremental [`build`] (issue 19 item 2), what the snapshot sink
/// runs: it keeps, across rounds, every service's entry texts and sizes
/// (keyed by the identity of the state's `Arc<ServiceNodes>`, which the
/// index replaces on every change of a service and keeps otherwise) and
/// every shard's text and sha256 (keyed by its index and the ids of the
/// entries it holds). A round after one change serializes only the changed
/// services and re-concatenates and hashes only the shards whose members
/// changed; what stays proportional to the state is walking the list of
/// services (a pointer compare each) and the bucket count's arithmetic over
/// the small ones. The layout is byte-identical to [`build`] of the same
/// state (tested over random sequences of changes). A failed round drops
/// the cache (the next one builds everything).
#[derive(Debug)]
pub struct Builder {
    base: String,
    max_bytes: usize,
    part_bytes: usize,
    /// In key order, like the state.
    services: Vec<(ServiceKey, CachedService)>,
    /// By shard index.
    shards: Vec<CachedShard>,
    next_id: u64,
    /// How many changed split services [`Builder::resplit`] re-cut (tests
    /// check that the incremental path ran).
    #[cfg(test)]
    pub(super) resplits: usize,
    /// How many of those found the changed parts by their digests alone.
    #[cfg(test)]
    pub(super) by_digest: usize,
}

impl Builder {
    /// A builder of snapshot `base` with shards of at most `max_bytes` and
    /// parts of at most [`DEFAULT_MAX_PART_BYTES`].
    pub fn new(base: &str, max_bytes: usize) -> Result<Self, BuildError> {
        Self::with_part_bytes(base, max_bytes, DEFAULT_MAX_PART_BYTES)
    }

    /// [`Builder::new`] with parts of at most `part_bytes` ([`build_with`]).
    pub fn with_part_bytes(
        base: &str,
        max_bytes: usize,
        part_bytes: usize,
    ) -> Result<Self, BuildError> {
        check_budgets(max_bytes, part_bytes)?;
        Ok(Self {
            base: base.to_string(),
            max_bytes,
            part_bytes,
            services: Vec::new(),
            shards: Vec::new(),
            next_id: 0,
            #[cfg(test)]
            resplits: 0,
            #[cfg(test)]
            by_digest: 0,
        })
    }

    /// The layout of `services` (the state's values in key order, as
    /// `ControllerState::with_desired` lists them) over `clusters` (every
    /// registered cluster; a service's own cluster is added if missing, as
    /// [`Dump::insert`] does).
    pub fn build<'a>(
        &mut self,
        clusters: impl IntoIterator<Item = &'a str>,
        services: impl IntoIterator<Item = &'a Arc<ServiceNodes>>,
    ) -> Result<Layout, BuildError> {
        let result = self.update(services).and_then(|()| self.assemble(clusters));
        if result.is_err() {
            self.services.clear();
            self.shards.clear();
        }
        result
    }

    /// Replaces the cached services by those of `services`, placing only
    /// the ones whose value is not the cached one (a merge of two lists in
    /// key order).
    pub(super) fn update<'a>(
        &mut self,
        services: impl IntoIterator<Item = &'a Arc<ServiceNodes>>,
    ) -> Result<(), BuildError> {
        let mut old = std::mem::take(&mut self.services).into_iter().peekable();
        let mut new: Vec<(ServiceKey, CachedService)> = Vec::with_capacity(old.len());
        for s in services {
            if new.last().is_some_and(|(prev, _)| *prev >= s.key) {
                return Err(BuildError::Unordered {
                    service: s.key.to_string(),
                });
            }
            // The same value as cached (an unchanged service, the common
            // case): its key is the cached one, no key compared.
            let unchanged =
                |(_, c): &(ServiceKey, CachedService)| std::ptr::eq(c.of.as_ptr(), Arc::as_ptr(s));
            if let Some(kept) = old.next_if(unchanged) {
                new.push(kept);
                continue;
            }
            while old.next_if(|(k, _)| *k < s.key).is_some() {}
            // Behind removed services, or a changed value (`prev`: what
            // was built of the old one, reused where the text is the same).
            let mut prev = match old.next_if(|(k, _)| *k == s.key) {
                Some(kept) if std::ptr::eq(kept.1.of.as_ptr(), Arc::as_ptr(s)) => {
                    new.push(kept);
                    continue;
                }
                other => other.map(|(_, c)| c.placed),
            };
            let k = &s.key;
            if let Some(placed) = self.resplit(s, &mut prev)? {
                new.push((
                    k.clone(),
                    CachedService {
                        of: Arc::downgrade(s),
                        nodes: s.node_count(),
                        placed,
                    },
                ));
                continue;
            }
            let placed = match place(
                &k.cluster,
                &k.namespace,
                &k.name,
                &s.ports,
                self.max_bytes,
                self.part_bytes,
            )? {
                Placement::Small { entry, cost, hash } => {
                    let text = json(&entry);
                    let id = match &prev {
                        Some(Cached::Small { id, text: t, .. }) if *t == text => *id,
                        _ => self.fresh_id(),
                    };
                    Cached::Small {
                        id,
                        text,
                        cost,
                        hash,
                    }
                }
                Placement::Own(entries, mut split) => {
                    if let Some(split) = split.as_mut() {
                        split.digests = part_digests(s, split.parts.len());
                    }
                    let before = match &prev {
                        Some(Cached::Own(v, _)) => v.as_slice(),
                        _ => &[],
                    };
                    let mut texts = Vec::with_capacity(entries.len());
                    for (i, e) in entries.iter().enumerate() {
                        let text = json(e);
                        // A part whose text is unchanged keeps its id, so
                        // its shard is not rebuilt (one endpoint changed in
                        // a split service: one part differs).
                        let id = match before.get(i) {
                            Some((id, t, _)) if *t == text => *id,
                            _ => self.fresh_id(),
                        };
                        let len = escaped_len(&text);
                        texts.push((id, text, len));
                    }
                    Cached::Own(texts, split)
                }
            };
            new.push((
                s.key.clone(),
                CachedService {
                    of: Arc::downgrade(s),
                    nodes: s.node_count(),
                    placed,
                },
            ));
        }
        self.services = new;
        Ok(())
    }

    /// A service split into parts whose value changed, re-cut at its
    /// cached part count; only the parts that differ are copied, measured
    /// and serialized (one endpoint changed among 100,000: one part).
    ///
    /// Which parts differ: with the value's kept [`crate::model::version::Buckets`] (the index
    /// keeps them for a big service) and the parts' digests cached, the
    /// parts whose digest changed, found without touching a node, and their
    /// nodes copied in one pass ([`crate::crd::shards::partition_some`]). Else
    /// the nodes are partitioned by reference and compared with the cached
    /// parts. The digest path trusts the state's lists to be sorted (the
    /// index sorts them; checking it is a pass over every node, what this
    /// path avoids) and checks the changed parts' lists only: should an
    /// unchanged part's list be out of order, the cached sorted text stays,
    /// which is what a reader assembles anyway, where [`build`] would refuse.
    ///
    /// `Ok(None)` (and `prev`'s entries untouched) when that may not be what
    /// [`split_service`] would do, which [`place`] then does from scratch:
    /// the port keys changed, a list is out of order, a part no longer fits
    /// (the count doubles), half the count would fit (it halves), or the
    /// service may have become small enough not to split.
    pub(super) fn resplit(
        &mut self,
        s: &ServiceNodes,
        prev: &mut Option<Cached>,
    ) -> Result<Option<Cached>, BuildError> {
        let (key, ports) = (&s.key, &s.ports);
        let Some(Cached::Own(entries, Some(split))) = prev.as_mut() else {
            return Ok(None);
        };
        let count = split.parts.len();
        if count < 2 || entries.len() != count {
            return Ok(None);
        }
        let name = format!("{}/{}", key.namespace, key.name);
        let fixed = part_fixed(&name, ports)?;
        let keys_same = split.parts[0].0.keys().eq(ports.keys());
        if fixed != split.fixed || !keys_same {
            return Ok(None);
        }
        let digests = part_digests(s, count);
        // Per part: `Some(its new nodes)` where it changed.
        let changed: Vec<Option<PortMap>> = match (&split.digests, &digests) {
            (Some(old), Some(new)) if old.len() == count => {
                let wanted: Vec<u32> = (0..count)
                    .filter(|k| old[*k] != new[*k])
                    .map(|k| u32::try_from(k).map_err(BuildError::TooMany))
                    .collect::<Result<_, _>>()?;
                let total = u32::try_from(count).map_err(BuildError::TooMany)?;
                // No part changed (the owner or extras did): no pass at all.
                let fresh = if wanted.is_empty() {
                    Vec::new()
                } else {
                    crate::crd::shards::partition_some(ports, total, &wanted)
                };
                let mut fresh = fresh.into_iter();
                #[cfg(test)]
                {
                    self.by_digest += 1;
                }
                let mut out: Vec<Option<PortMap>> = (0..count).map(|_| None).collect();
                for k in &wanted {
                    out[*k as usize] = fresh.next();
                }
                if out
                    .iter()
                    .flatten()
                    .flat_map(PortMap::values)
                    .any(|l| !l.is_sorted())
                {
                    return Ok(None);
                }
                out
            }
            _ => {
                if !ports.values().all(|l| l.is_sorted()) {
                    return Ok(None);
                }
                Self::changed_by_compare(ports, split)
            }
        };
        let nodes = s.node_count();
        // The changed parts, serialized once: their size is measured on
        // that text.
        let mut fresh: Vec<Option<(PortMap, String, usize)>> = Vec::with_capacity(count);
        let mut sizes = Vec::with_capacity(count);
        for (k, part) in changed.into_iter().enumerate() {
            if let Some(pm) = part {
                let value = port_json(&pm);
                let twice = escaped_twice_len(&value);
                sizes.push(fixed + nodes_cost(&pm, twice));
                fresh.push(Some((pm, value, twice)));
            } else {
                sizes.push(split.parts[k].1);
                fresh.push(None);
            }
        }
        let avail = self
            .max_bytes
            .saturating_sub(SHARD_OVERHEAD + group_overhead(&key.cluster) + 1);
        let room = part_room(&key.cluster, self.max_bytes, self.part_bytes);
        let half = count / 2;
        let halves_fit = half >= 2 && (0..half).all(|k| sizes[k] + sizes[k + half] - fixed <= room);
        // A lower bound of the whole entry's measured size (every node's
        // cost but one comma per port): above the room of a whole entry
        // and of a small one, it is split.
        let content: usize = sizes.iter().map(|x| x - fixed).sum();
        let still_split = content.saturating_sub(ports.len()) > room.max(avail / OWN_SHARD_DIVISOR);
        if sizes.iter().any(|x| *x > room) || halves_fit || count > split_cap(nodes) || !still_split
        {
            return Ok(None);
        }
        let total = u32::try_from(count).map_err(BuildError::TooMany)?;
        let mut texts = Vec::with_capacity(count);
        let mut parts = Vec::with_capacity(count);
        for (k, (size, fresh)) in sizes.into_iter().zip(fresh).enumerate() {
            if let Some((pm, value, twice)) = fresh {
                // The entry's escaped length: its text around an empty
                // value, plus the value as it appears in it (escaped once,
                // measured escaped again).
                let around = entry_size(&part_entry_of(&name, String::new(), k, total)?)?;
                let text = json(&part_entry_of(&name, value, k, total)?);
                // Changed back to the cached text (a node removed and
                // added again): the same id, the shard is not rebuilt.
                let id = if text == entries[k].1 {
                    entries[k].0
                } else {
                    self.fresh_id()
                };
                texts.push((id, text, around + twice));
                parts.push((pm, size));
            } else {
                texts.push(std::mem::take(&mut entries[k]));
                parts.push((std::mem::take(&mut split.parts[k].0), size));
            }
        }
        #[cfg(test)]
        {
            self.resplits += 1;
        }
        Ok(Some(Cached::Own(
            texts,
            Some(Split {
                fixed,
                parts,
                digests,
            }),
        )))
    }

    /// The parts of `split`'s count whose nodes in `ports` differ from the
    /// cached ones, with their new nodes: every node partitioned by
    /// reference ([`crate::crd::shards::partition`]'s rule) and compared.
    pub(super) fn changed_by_compare(ports: &PortMap, split: &Split) -> Vec<Option<PortMap>> {
        let count = split.parts.len();
        let mut cut: Vec<Vec<(&String, Vec<&Node>)>> = vec![Vec::new(); count];
        for (port, list) in ports {
            cut[0].push((port, Vec::new()));
            for n in list {
                let part = &mut cut[bucket(crate::crd::shards::node_hash(&n.host), count)];
                if part.last().is_none_or(|(p, _)| *p != port) {
                    part.push((port, Vec::new()));
                }
                if let Some((_, l)) = part.last_mut() {
                    l.push(n);
                }
            }
        }
        cut.into_iter()
            .zip(&split.parts)
            .map(|(new, (old, _))| {
                let same = old.len() == new.len()
                    && old.iter().zip(&new).all(|((p, l), (q, m))| {
                        p == *q && l.len() == m.len() && l.iter().zip(m).all(|(a, b)| a == *b)
                    });
                (!same).then(|| {
                    new.into_iter()
                        .map(|(p, l)| (p.clone(), l.into_iter().cloned().collect()))
                        .collect()
                })
            })
            .collect()
    }

    pub(super) fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// The shards of the cached services: the cached text of every shard
    /// whose members are unchanged, a new one for the others.
    pub(super) fn assemble<'a>(
        &mut self,
        clusters: impl IntoIterator<Item = &'a str>,
    ) -> Result<Layout, BuildError> {
        let mut ids: BTreeSet<&str> = clusters.into_iter().collect();
        let mut fits: Vec<Fit<'_>> = Vec::new();
        let mut small: Vec<Member<'_>> = Vec::new();
        let mut own: Vec<Member<'_>> = Vec::new();
        let mut nodes = 0;
        for (k, s) in &self.services {
            ids.insert(&k.cluster);
            nodes += s.nodes;
            match &s.placed {
                Cached::Small {
                    id,
                    text,
                    cost,
                    hash,
                } => {
                    fits.push(Fit {
                        cluster: &k.cluster,
                        cost: *cost,
                        hash: *hash,
                    });
                    // A small entry's cost is its escaped length and a comma.
                    small.push((&k.cluster, *id, text, cost - 1));
                }
                Cached::Own(entries, _) => {
                    own.extend(
                        entries
                            .iter()
                            .map(|(id, t, len)| (k.cluster.as_str(), *id, t.as_str(), *len)),
                    );
                }
            }
        }
        let buckets = bucket_count(&fits, self.max_bytes)?;
        let mut members: Vec<Vec<Member<'_>>> = vec![Vec::new(); buckets];
        for (f, m) in fits.iter().zip(small) {
            members[bucket(f.hash, buckets)].push(m);
        }
        members.extend(own.into_iter().map(|m| vec![m]));
        let mut cache = Vec::with_capacity(members.len());
        let mut out = Vec::with_capacity(members.len());
        for (i, m) in members.iter().enumerate() {
            let ids: Vec<u64> = m.iter().map(|(_, id, _, _)| *id).collect();
            let data = match self.shards.get(i) {
                Some(c) if c.members == ids => c.data.clone(),
                _ => {
                    let (text, len) = shard_text(i, m);
                    Arc::new(finish_shard(&self.base, i, text, len, self.max_bytes)?)
                }
            };
            out.push(data.clone());
            cache.push(CachedShard { members: ids, data });
        }
        let clusters = ids.into_iter().map(str::to_string).collect();
        let services = self.services.len();
        self.shards = cache;
        layout_of(clusters, out, services, nodes)
    }
}

/// Shard `i`'s text from its entries' compact JSON: the bytes `serde_json`
/// writes for the [`ShardDoc`] of those entries (entries of one cluster
/// in a row form one group), without serializing them again; and its
/// [`escaped_len`], added up from the pieces (the entries' are known).
pub(super) fn shard_text(i: usize, members: &[Member<'_>]) -> (String, usize) {
    let len: usize = members.iter().map(|(_, _, t, _)| t.len() + 1).sum();
    let mut t = String::with_capacity(len + 64);
    let mut esc = 0;
    let mut put = |t: &mut String, piece: &str| {
        esc += escaped_len(piece);
        t.push_str(piece);
    };
    put(
        &mut t,
        &format!("{{\"format\":{FORMAT},\"index\":{i},\"endpoints\":["),
    );
    let mut last: Option<&str> = None;
    let mut entries = 0;
    for (cluster, _, text, len) in members {
        if last == Some(*cluster) {
            put(&mut t, ",");
        } else {
            if last.is_some() {
                put(&mut t, "]},");
            }
            put(&mut t, "{\"id\":");
            put(&mut t, &json(*cluster));
            put(&mut t, ",\"endpoints\":[");
            last = Some(cluster);
        }
        t.push_str(text);
        entries += len;
    }
    if last.is_some() {
        put(&mut t, "]}");
    }
    put(&mut t, "]}");
    (t, esc + entries)
}
