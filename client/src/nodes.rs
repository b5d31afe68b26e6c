//! [`NodesFrom`]: one read of what kube-discovery published, from any of its
//! three places, and one [`crate::lookup()`]: what `kube-discovery nodes` runs.

use std::path::PathBuf;

use kube::Client;
use kube_discovery_core::crd::ReaderRule;
use kube_discovery_core::{Node, NodeQuery};

use crate::{Error, Result};

/// How often a list that falls between the shard writes of a big service
/// is read again before giving up.
const READ_ATTEMPTS: u32 = 10;

/// Where to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodesFrom {
    /// The DiscoveredServices on the API server (every namespace), those
    /// the rule accepts (see [`crate::lookup()`]).
    DiscoveredServices(ReaderRule),
    /// The ConfigMap snapshot `namespace/name` on the API server.
    Snapshot {
        /// Namespace of the index ConfigMap.
        namespace: String,
        /// Name of the index ConfigMap.
        name: String,
    },
    /// A snapshot mounted as files in this directory.
    SnapshotDir(PathBuf),
}

impl NodesFrom {
    /// The snapshot `NAMESPACE/NAME` (as `--snapshot` takes it); the error
    /// names the flag.
    pub fn snapshot(at: &str) -> Result<Self> {
        at.split_once('/')
            .filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains('/'))
            .map(|(ns, name)| Self::Snapshot {
                namespace: ns.to_string(),
                name: name.to_string(),
            })
            .ok_or_else(|| Error::SnapshotFlag(at.to_string()))
    }

    /// Whether reading needs an API server connection.
    pub fn needs_client(&self) -> bool {
        !matches!(self, Self::SnapshotDir(_))
    }

    /// The nodes of `query`: `Ok(None)` when the service or port is unknown.
    /// `client` is used (and required) when [`Self::needs_client`].
    pub async fn nodes(
        &self,
        client: Option<&Client>,
        query: &NodeQuery,
    ) -> Result<Option<Vec<Node>>> {
        let client = || client.ok_or(Error::NoClient);
        Ok(match self {
            Self::DiscoveredServices(rule) => {
                // A list is one consistent snapshot of the API server, but
                // it can fall between the writes of a big service's shards:
                // then it is read again, a few times, ~0.2 s apart.
                let mut attempt = 0;
                loop {
                    let objs = crate::list::list_managed(client()?).await?;
                    match crate::lookup(&objs, query, rule) {
                        Ok(found) => break found,
                        Err(why) if attempt >= READ_ATTEMPTS => {
                            return Err(Error::Incomplete {
                                service: query.key().to_string(),
                                why,
                            });
                        }
                        Err(_) => {
                            attempt += 1;
                            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                        }
                    }
                }
            }
            Self::Snapshot { namespace, name } => crate::snapshot::read(client()?, namespace, name)
                .await?
                .lookup(query)
                .map(<[Node]>::to_vec),
            Self::SnapshotDir(dir) => {
                // `read_dir` waits between attempts: off the runtime's workers.
                let dir = dir.clone();
                tokio::task::spawn_blocking(move || crate::snapshot::read_dir(&dir))
                    .await??
                    .lookup(query)
                    .map(<[Node]>::to_vec)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_flag_is_namespace_slash_name() {
        assert_eq!(
            NodesFrom::snapshot("kd/nodes").unwrap(),
            NodesFrom::Snapshot {
                namespace: "kd".into(),
                name: "nodes".into()
            }
        );
        for bad in ["nodes", "/nodes", "kd/", "kd/a/b", ""] {
            let e = NodesFrom::snapshot(bad).unwrap_err().to_string();
            assert!(
                e.contains("--snapshot") && e.contains("NAMESPACE/NAME"),
                "{bad}: {e}"
            );
        }
    }

    #[tokio::test]
    async fn a_snapshot_dir_needs_no_client_the_api_does() {
        assert!(!NodesFrom::SnapshotDir("/x".into()).needs_client());
        assert!(NodesFrom::DiscoveredServices(ReaderRule::default()).needs_client());
        let q = kube_discovery_core::parse_service_name("default/web:http").unwrap();
        let e = NodesFrom::DiscoveredServices(ReaderRule::default())
            .nodes(None, &q)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("needs a client"), "{e}");
    }
}
