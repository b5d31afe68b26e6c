//! What readers accept: the reader rule and consistent shards.
//!
//! [`ReaderRule::check`]: an object counts only when its namespace, name and
//! the labels of [`labels_for`] are what [`ObjectNaming`] gives its spec's service, so a
//! labelled object elsewhere cannot add nodes to another namespace's service.
//! [`consistent_shards`]: of a sharded service a reader takes shard 0 and the
//! shards whose `spec.version` is the one shard 0's manifest lists; a missing
//! or different one means "not complete yet" (read again, or keep the previous
//! state), never a mix of two versions. The controller writes the changed
//! shards `1..count` first and shard 0 last, then deletes shards beyond
//! `count`.

use super::*;

/// Why the objects of a sharded service do not form one version yet
/// ([`consistent_shards`]): a reader reads again (or keeps what it had).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Incomplete {
    /// No shard 0 (it is written last and carries the manifest).
    #[error("shard 0 is missing")]
    NoShardZero,
    /// Shard `index` of shard 0's count is not there.
    #[error("shard {index} of {count} is missing")]
    Missing {
        /// The missing shard.
        index: u32,
        /// Shard 0's count.
        count: u32,
    },
    /// Shard `index` holds another version than shard 0's manifest names
    /// (it is being rewritten, or shard 0 is not written yet).
    #[error("shard {index} has version {actual:?}, shard 0 lists {expected:?}")]
    Mismatch {
        /// The shard.
        index: u32,
        /// What shard 0's manifest (or, for objects of the old scheme,
        /// shard 0's `spec.version`) says.
        expected: String,
        /// Its `spec.version`.
        actual: String,
    },
}

/// The shard position and version facts [`consistent_shards`] needs of one
/// object (the start-up list keeps only these, not the objects).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardHead<'a> {
    /// `spec.shard.index` (0 when unsharded).
    pub index: u32,
    /// `spec.shard.count` (1 when unsharded).
    pub count: u32,
    /// `spec.version`.
    pub version: &'a str,
    /// `spec.shard.versions` (shard 0's manifest; empty elsewhere and on
    /// objects of the old scheme).
    pub manifest: &'a [String],
}

impl<'a> ShardHead<'a> {
    /// The facts of `ds`.
    pub fn of(ds: &'a DiscoveredService) -> Self {
        let (index, count) = shard_of(ds);
        ShardHead {
            index,
            count,
            version: &ds.spec.version,
            manifest: ds
                .spec
                .shard
                .as_ref()
                .map_or(&[], |s| s.versions.as_slice()),
        }
    }
}

/// Which objects of ONE service (already accepted by [`ReaderRule::check`])
/// a reader takes so it never mixes two versions: THE reader rule of big
/// services, used by every reader (client lookup, resolver, `nodes`) and by
/// the controller's start-up list. Returns the positions in `heads` of
/// shards `0..count` (shard 0 first), and whether shard 0 is of the old
/// scheme (no manifest: then every shard must carry shard 0's
/// `spec.version`, the rule before per-shard versions; the controller
/// rewrites such a service once).
///
/// Shard 0 decides: its `count`, and per shard `i > 0` the version its
/// manifest lists; an object whose version differs (being rewritten) or a
/// missing one makes the set [`Incomplete`], never silently mixed. Objects
/// beyond shard 0's count (surplus of a shrink, deleted after shard 0 is
/// written) are ignored.
pub fn consistent_shards(heads: &[ShardHead<'_>]) -> Result<(Vec<usize>, bool), Incomplete> {
    let zero = heads
        .iter()
        .position(|h| h.index == 0)
        .ok_or(Incomplete::NoShardZero)?;
    let head = &heads[zero];
    let count = head.count.max(1);
    let legacy = count > 1 && head.manifest.is_empty();
    let mut out = vec![zero];
    for index in 1..count {
        let expected = if legacy {
            head.version
        } else {
            head.manifest.get(index as usize).map_or("", String::as_str)
        };
        let mut candidates = heads
            .iter()
            .enumerate()
            .filter(|(_, h)| h.index == index && h.count == count);
        let Some((pos, h)) = candidates.next() else {
            return Err(Incomplete::Missing { index, count });
        };
        if h.version != expected {
            return Err(Incomplete::Mismatch {
                index,
                expected: expected.to_string(),
                actual: h.version.to_string(),
            });
        }
        out.push(pos);
    }
    Ok((out, legacy))
}

/// What a reader accepts: the ONE place where the rule "an object counts only
/// when its namespace, name, labels and spec agree" lives
/// ([`ReaderRule::check`]). Every reader goes through it:
/// `kube_discovery_client::lookup` (so `kube-discovery nodes`,
/// `render --nodes`), the client's `NodesResolver` (the syncs, the Rust
/// gateways). Without it, anyone allowed to create a labelled
/// DiscoveredService in ANY namespace could add nodes to another namespace's
/// service (the spec alone names the service).
///
/// With an instance ([`ReaderRule::for_instance`]), only that
/// installation's objects count (label [`LABEL_INSTANCE`]); without one, any
/// kube-discovery installation's.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReaderRule {
    /// How the writer names its objects (`namespace_mode` of
    /// `sinks.discoveredservices`): where an object of a service must live
    /// and what it must be called. Its `instance` is not used: see
    /// [`ReaderRule::instance`].
    pub naming: ObjectNaming,
    /// Only objects of this installation (`kube_discovery.instance`) count;
    /// `None`: any installation's.
    pub instance: Option<String>,
}

/// Why [`ReaderRule::check`] refuses an object. Display strings name the
/// object's field and both values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Disagreement {
    /// `spec.service` is not `[cluster/]sourceNamespace/sourceName`.
    #[error(
        "spec.service {actual:?} is not {expected:?} (from spec.cluster, sourceNamespace, sourceName)"
    )]
    Service {
        /// What the spec's parts give.
        expected: String,
        /// What `spec.service` says.
        actual: String,
    },
    /// `spec.shard` is impossible (`index >= count`).
    #[error("spec.shard {index} of {count} is impossible")]
    Shard {
        /// `spec.shard.index`.
        index: u32,
        /// `spec.shard.count`.
        count: u32,
    },
    /// The object is not in the namespace the writer puts `service` in.
    #[error("{service} belongs in namespace {expected:?}, not {actual:?}")]
    Namespace {
        /// The service the spec claims.
        service: String,
        /// Where its objects live.
        expected: String,
        /// Where this one is.
        actual: String,
    },
    /// The object's name is not the one the writer gives this spec.
    #[error("{service} is named {expected:?}, not {actual:?}")]
    Name {
        /// The service the spec claims.
        service: String,
        /// The name the naming scheme gives (shard suffix included).
        expected: String,
        /// The object's name.
        actual: String,
    },
    /// A label the writer sets disagrees with the spec (or is missing).
    #[error(
        "label {label} is {}, the spec of {service} wants {}",
        shown(actual.as_deref()),
        shown(expected.as_deref())
    )]
    Label {
        /// The service the spec claims.
        service: String,
        /// The label key.
        label: &'static str,
        /// The value the writer sets for this spec (`None`: must be absent).
        expected: Option<String>,
        /// The object's value (`None`: absent).
        actual: Option<String>,
    },
}

/// A label value for messages: quoted, or `absent`.
fn shown(v: Option<&str>) -> String {
    v.map_or_else(|| "absent".to_string(), |v| format!("{v:?}"))
}

impl ReaderRule {
    /// The rule for objects named by `naming`, of any installation.
    pub fn new(naming: ObjectNaming) -> Self {
        Self {
            naming,
            instance: None,
        }
    }

    /// The same rule, counting only objects of the installation `instance`
    /// (`None`: of any).
    #[must_use]
    pub fn for_instance(mut self, instance: Option<String>) -> Self {
        self.instance = instance;
        self
    }

    /// The service `ds` describes, if the object agrees with itself the way
    /// the writer makes it: `spec.service` matches the spec's parts,
    /// `metadata.namespace` and `metadata.name` are what the naming scheme
    /// gives that service (shard `i > 0`: [`shard_name`]), and the labels the
    /// writer sets ([`labels_for`], [`LABEL_SHARD`]) match the spec (an
    /// unsharded object may keep `kubediscovery.io/shard: "0"`: someone else
    /// co-owns the label, or a writer before issue 29 item 2 is between its
    /// two requests). Other labels are ignored. Pure; the caller reports a refusal (naming the
    /// object) and skips it.
    pub fn check(&self, ds: &DiscoveredService) -> Result<ServiceKey, Disagreement> {
        let key = key_of(ds);
        let service = key.to_string();
        if ds.spec.service != service {
            return Err(Disagreement::Service {
                expected: service,
                actual: ds.spec.service.clone(),
            });
        }
        let shard = match &ds.spec.shard {
            Some(s) if s.index >= s.count => {
                return Err(Disagreement::Shard {
                    index: s.index,
                    count: s.count,
                });
            }
            Some(s) => Some(s.index),
            None => None,
        };
        let namespace = self.naming.namespace(&key);
        let actual_ns = ds.metadata.namespace.as_deref().unwrap_or_default();
        if actual_ns != namespace {
            return Err(Disagreement::Namespace {
                service,
                expected: namespace,
                actual: actual_ns.to_string(),
            });
        }
        let name = shard_name(&self.naming.name(&key), shard.unwrap_or(0));
        let actual_name = ds.metadata.name.as_deref().unwrap_or_default();
        if actual_name != name {
            return Err(Disagreement::Name {
                service,
                expected: name,
                actual: actual_name.to_string(),
            });
        }
        let labels = ds.metadata.labels.as_ref();
        let label = |k: &str| labels.and_then(|l| l.get(k)).cloned();
        // The values of `labels_for(&key)`.
        for (k, v) in [
            (LABEL_MANAGED_BY, MANAGED_BY.to_string()),
            (LABEL_CLUSTER, label_value(&key.cluster)),
            (LABEL_SERVICE_NAMESPACE, label_value(&key.namespace)),
            (LABEL_SERVICE_NAME, label_value(&key.name)),
        ] {
            let actual = label(k);
            if actual.as_deref() != Some(v.as_str()) {
                return Err(Disagreement::Label {
                    service,
                    label: k,
                    expected: Some(v),
                    actual,
                });
            }
        }
        if let Some(want) = &self.instance {
            let actual = label(LABEL_INSTANCE);
            if actual.as_deref() != Some(want.as_str()) {
                return Err(Disagreement::Label {
                    service,
                    label: LABEL_INSTANCE,
                    expected: Some(want.clone()),
                    actual,
                });
            }
        }
        // Sharded: the index. Unsharded: none, or "0": the apply that unshards
        // drops the label unless someone else co-owns it (and writers before
        // issue 29 item 2 removed `spec.shard` one request earlier); refusing
        // that would hide the service.
        let shard_label = label(LABEL_SHARD);
        let agrees = match shard {
            Some(i) => shard_label == Some(i.to_string()),
            None => shard_label.as_deref().is_none_or(|l| l == "0"),
        };
        if !agrees {
            return Err(Disagreement::Label {
                service,
                label: LABEL_SHARD,
                expected: shard.map(|i| i.to_string()),
                actual: shard_label,
            });
        }
        Ok(key)
    }
}
