//! The reader: puts the shards back together and refuses anything
//! inconsistent (a mix of two versions, a missing or edited shard).

use super::*;

/// Why shards could not be assembled. Every message names the version and,
/// where one is at fault, the shard.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssembleError {
    /// The index is not a valid index document.
    #[error("snapshot index: {0}")]
    Index(String),
    /// A listed shard does not exist (deleted after a newer version): read again.
    #[error(
        "snapshot version {version}: shard {shard} is missing (a newer version replaced it; read again)"
    )]
    ShardMissing {
        /// Version the index describes.
        version: String,
        /// Shard name.
        shard: String,
    },
    /// A shard's content is not the one the index lists (being rewritten for a
    /// newer version, or edited): read again.
    #[error(
        "snapshot version {version}: shard {shard} does not match the index (being rewritten; read again)"
    )]
    ShardMismatch {
        /// Version the index describes.
        version: String,
        /// Shard name.
        shard: String,
    },
    /// A shard matches its hash but its content is invalid.
    #[error("snapshot version {version}: shard {shard}: {reason}")]
    BadShard {
        /// Version the index describes.
        version: String,
        /// Shard name.
        shard: String,
        /// What is wrong.
        reason: String,
    },
    /// The assembled state is not the state the index describes.
    #[error("snapshot version {version}: {reason}")]
    Inconsistent {
        /// Version the index describes.
        version: String,
        /// What is wrong.
        reason: String,
    },
}

impl AssembleError {
    /// A newer version is being written: reading again will succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            AssembleError::ShardMissing { .. } | AssembleError::ShardMismatch { .. }
        )
    }
}

/// Parses an index document. Only [`FORMAT`] is read: an index of an
/// earlier format (written by a controller before it) is refused with an
/// error saying so, a later one with an error naming both formats.
pub fn parse_index(text: &str) -> Result<IndexDoc, AssembleError> {
    let idx: IndexDoc = serde_json::from_str(text)
        .map_err(|e| AssembleError::Index(format!("{INDEX_KEY}: {e}")))?;
    if idx.format < FORMAT {
        return Err(AssembleError::Index(format!(
            "{INDEX_KEY}: format {} was written by an older kube-discovery and is no longer \
             read (this reader knows format {FORMAT}); re-sync the snapshot with the current \
             controller, which rewrites it in format {FORMAT}",
            idx.format
        )));
    }
    if idx.format > FORMAT {
        return Err(AssembleError::Index(format!(
            "{INDEX_KEY}: format {} is not supported (this reader knows format {FORMAT}); \
             upgrade the reader",
            idx.format
        )));
    }
    Ok(idx)
}

/// Reassembles the dump from the index text and a lookup of shard texts
/// (`None`: the shard does not exist). Refuses mixed versions: every shard
/// must hash to what the index lists and the result must hash to the index's
/// version.
pub fn assemble(
    index_text: &str,
    mut shard: impl FnMut(&ShardRef) -> Option<String>,
) -> Result<Dump, AssembleError> {
    let idx = parse_index(index_text)?;
    let version = idx.version.clone();
    let mut dump = Dump::with_clusters(idx.clusters.iter().map(String::as_str));
    // Services split into parts: (cluster, ns, name) -> (count, parts seen).
    let mut split: HashMap<(String, String, String), (u32, BTreeSet<u32>)> = HashMap::new();
    for (i, r) in idx.shards.iter().enumerate() {
        let text = shard(r).ok_or_else(|| AssembleError::ShardMissing {
            version: version.clone(),
            shard: r.name.clone(),
        })?;
        if sha256_hex(&text) != r.sha256 {
            return Err(AssembleError::ShardMismatch {
                version: version.clone(),
                shard: r.name.clone(),
            });
        }
        let bad = |reason: String| AssembleError::BadShard {
            version: version.clone(),
            shard: r.name.clone(),
            reason,
        };
        let doc: ShardDoc = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if doc.format != idx.format || doc.index != i {
            return Err(bad(format!(
                "format {} index {} (want format {} index {i})",
                doc.format, doc.index, idx.format
            )));
        }
        for g in doc.endpoints {
            let Some(services) = dump.clusters.get_mut(&g.id) else {
                return Err(bad(format!("cluster {:?} is not in the index", g.id)));
            };
            for e in g.endpoints {
                let Some((ns, name)) = e.name.split_once('/') else {
                    return Err(bad(format!("entry name {:?} is not ns/name", e.name)));
                };
                let ports: PortMap = serde_json::from_str(&e.value)
                    .map_err(|x| bad(format!("value of {}: {x}", e.name)))?;
                let skey = (ns.to_string(), name.to_string());
                let okey = (g.id.clone(), ns.to_string(), name.to_string());
                let Some(p) = e.part else {
                    if services.contains_key(&skey) {
                        return Err(bad(format!("{} appears twice", e.name)));
                    }
                    services.insert(skey, ports);
                    continue;
                };
                if p.count < 2 || p.index >= p.count {
                    return Err(bad(format!("{}: part {}/{}", e.name, p.index, p.count)));
                }
                if services.contains_key(&skey) && !split.contains_key(&okey) {
                    return Err(bad(format!("{} appears twice", e.name)));
                }
                let (count, seen) = split.entry(okey).or_insert((p.count, BTreeSet::new()));
                if *count != p.count || !seen.insert(p.index) {
                    return Err(bad(format!(
                        "{}: part {}/{} again or of another count ({count})",
                        e.name, p.index, p.count
                    )));
                }
                let target = services.entry(skey).or_default();
                for (port, nodes) in ports {
                    target.entry(port).or_default().extend(nodes);
                }
            }
        }
    }
    for ((id, ns, name), (count, seen)) in split {
        if seen.len() != count as usize {
            return Err(AssembleError::Inconsistent {
                version,
                reason: format!(
                    "service {id:?} {ns}/{name} has {} of {count} parts",
                    seen.len()
                ),
            });
        }
        // Parts hold each port's nodes by host hash: the merged lists are
        // sorted like the state's (`model::sort_nodes`).
        if let Some(ports) = dump
            .clusters
            .get_mut(&id)
            .and_then(|s| s.get_mut(&(ns, name)))
        {
            for nodes in ports.values_mut() {
                crate::model::sort_nodes(nodes);
            }
        }
    }
    if dump.services() != idx.services || dump.nodes() != idx.nodes {
        return Err(AssembleError::Inconsistent {
            version,
            reason: format!(
                "{} services / {} nodes assembled, the index lists {} / {}",
                dump.services(),
                dump.nodes(),
                idx.services,
                idx.nodes
            ),
        });
    }
    // The version names the listed shard hashes and clusters (each shard
    // was checked against its hash above).
    let got = layout_version(&idx.clusters, idx.shards.iter().map(|s| s.sha256.as_str()));
    if got != version {
        return Err(AssembleError::Inconsistent {
            reason: format!("the assembled state has version {got}"),
            version,
        });
    }
    Ok(dump)
}
