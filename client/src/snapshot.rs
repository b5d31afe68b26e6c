//! Readers of the ConfigMap snapshot (`kube_discovery.sinks.configmap`): the
//! whole discovered state in APISIX's dump shape, as an index ConfigMap
//! `<name>` (`index.json`) plus shards `<name>-<i>`. The format and its
//! consistency rules are the core's [`kube_discovery_core::snapshot`]; the
//! controller writes it. Both readers assemble with
//! [`kube_discovery_core::snapshot::assemble`], which refuses mixed versions, and
//! retry while a newer version is being written (a shard being rewritten or
//! just deleted means "read again").

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::Api;
use kube_discovery_core::snapshot::{self as dump, AssembleError, Dump, INDEX_KEY};

use crate::{Error, Result};

/// How often [`read`] and [`read_dir`] retry a snapshot that is being rewritten.
pub const READ_ATTEMPTS: u32 = 20;

/// Reads snapshot `namespace/name` through the API (needs `get` on those
/// ConfigMaps), retrying while a newer version is being written.
pub async fn read(client: &Client, namespace: &str, name: &str) -> Result<Dump> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let mut last = None;
    for _ in 0..READ_ATTEMPTS {
        match read_once(&api, namespace, name).await {
            Ok(d) => return Ok(d),
            Err(Retry::Again(e)) => last = Some(e),
            Err(Retry::Fatal(e)) => return Err(e),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(last.map_or_else(
        || Error::SnapshotUnsettled {
            namespace: namespace.to_string(),
            name: name.to_string(),
        },
        Error::Snapshot,
    ))
}

enum Retry {
    Again(AssembleError),
    Fatal(Error),
}

/// One attempt of [`read`].
async fn read_once(
    api: &Api<ConfigMap>,
    namespace: &str,
    name: &str,
) -> std::result::Result<Dump, Retry> {
    let index = api
        .get_opt(name)
        .await
        .map_err(|e| Retry::Fatal(e.into()))?
        .ok_or_else(|| {
            Retry::Fatal(Error::SnapshotNotFound {
                namespace: namespace.to_string(),
                name: name.to_string(),
            })
        })?;
    let text = index
        .data
        .as_ref()
        .and_then(|d| d.get(INDEX_KEY))
        .cloned()
        .ok_or_else(|| {
            Retry::Fatal(Error::NoSnapshotIndex {
                namespace: namespace.to_string(),
                name: name.to_string(),
                key: INDEX_KEY,
            })
        })?;
    let idx = dump::parse_index(&text).map_err(|e| Retry::Fatal(e.into()))?;
    let mut texts: BTreeMap<String, String> = BTreeMap::new();
    for r in &idx.shards {
        let cm = api
            .get_opt(&r.name)
            .await
            .map_err(|e| Retry::Fatal(e.into()))?;
        if let Some(t) = cm.and_then(|c| c.data).and_then(|mut d| d.remove(&r.key)) {
            texts.insert(r.name.clone(), t);
        }
    }
    dump::assemble(&text, |r| texts.get(&r.name).cloned()).map_err(|e| {
        if e.is_retryable() {
            Retry::Again(e)
        } else {
            Retry::Fatal(e.into())
        }
    })
}

/// Reads a snapshot mounted as files: `dir` holds `index.json` and the
/// shard keys `<name>-<i>.json` (one projected volume of the index and shard
/// ConfigMaps). Retries while a newer version is being swapped in; the
/// kubelet updates mounted ConfigMaps one by one, so a caller should keep its
/// previous state when this fails and try again later. Blocks between
/// attempts: from async code, call it inside `spawn_blocking`.
pub fn read_dir(dir: &Path) -> Result<Dump> {
    let mut last = None;
    for _ in 0..READ_ATTEMPTS {
        let path = dir.join(INDEX_KEY);
        let text = std::fs::read_to_string(&path).map_err(|e| Error::Io {
            path: path.display().to_string(),
            source: e,
        })?;
        match dump::assemble(&text, |r| {
            // Keys are plain file names; refuse anything that is not.
            if r.key.contains('/') || r.key.starts_with('.') {
                return None;
            }
            std::fs::read_to_string(dir.join(&r.key)).ok()
        }) {
            Ok(d) => return Ok(d),
            Err(e) if e.is_retryable() => last = Some(e),
            Err(e) => return Err(e.into()),
        }
        #[expect(
            clippy::disallowed_methods,
            reason = "read_dir is synchronous; async callers run it with spawn_blocking"
        )]
        std::thread::sleep(Duration::from_millis(100));
    }
    Err(last.map_or_else(
        || Error::SnapshotDirUnsettled(dir.to_path_buf()),
        Error::Snapshot,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::{DeleteParams, Patch, PatchParams};
    use kube_discovery_core::{Node, PortMap, ServiceKey};
    use serde_json::json;

    fn dump_of(n: u32) -> Dump {
        let mut d = Dump::with_clusters([""]);
        for i in 0..n {
            d.insert(
                &ServiceKey::new("", "ns", format!("s{i:02}")),
                PortMap::from([(
                    "http".to_string(),
                    vec![Node::new(format!("10.0.0.{i}"), 80, 100)],
                )]),
            );
        }
        d
    }

    #[test]
    fn read_dir_assembles_files_and_names_a_missing_index() {
        let mut d = Dump::with_clusters([""]);
        for i in 0..40 {
            d.insert(
                &ServiceKey::new("", "ns", format!("s{i}")),
                PortMap::from([(
                    "p".to_string(),
                    vec![Node::new(format!("10.1.0.{i}"), 80, 1)],
                )]),
            );
        }
        let l = dump::build(&d, "snap", 2048).unwrap();
        assert!(l.shards.len() > 1);
        let dir = tempfile::tempdir().unwrap();
        let e = read_dir(dir.path()).unwrap_err().to_string();
        assert!(e.contains("index.json"), "{e}");
        std::fs::write(dir.path().join(INDEX_KEY), &l.index).unwrap();
        for s in &l.shards {
            std::fs::write(dir.path().join(&s.key), &s.text).unwrap();
        }
        assert_eq!(read_dir(dir.path()).unwrap(), d);
    }

    async fn sim_client() -> (kube_sim::Sim, Client, tempfile::TempDir) {
        let sim = kube_sim::Sim::start(kube_sim::SimConfig::default())
            .await
            .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kc = dir.path().join("kubeconfig");
        sim.write_kubeconfig(&kc, &sim.admin_token()).unwrap();
        let client = crate::connect::client(Some(&kc), None).await.unwrap();
        let ns: k8s_openapi::api::core::v1::Namespace =
            serde_json::from_value(json!({"metadata": {"name": "kd"}})).unwrap();
        Api::all(client.clone())
            .create(&Default::default(), &ns)
            .await
            .unwrap();
        (sim, client, dir)
    }

    #[tokio::test]
    async fn read_names_the_missing_shard_and_refuses_garbage() {
        let (_sim, client, _dir) = sim_client().await;
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), "kd");
        let e = read(&client, "kd", "snap").await.unwrap_err().to_string();
        assert!(e.contains("kd/snap not found"), "{e}");
        let l = dump::build(&dump_of(30), "snap", 2048).unwrap();
        let pp = PatchParams::apply("test");
        for (name, key, text) in l.shards.iter().map(|s| (&s.name, &s.key, &s.text)).chain([(
            &"snap".to_string(),
            &INDEX_KEY.to_string(),
            &l.index,
        )]) {
            let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": name}, "data": {(key): text}});
            api.patch(name, &pp, &Patch::Apply(&cm)).await.unwrap();
        }
        assert_eq!(read(&client, "kd", "snap").await.unwrap().services(), 30);
        let gone = l.shards[1].name.clone();
        api.delete(&gone, &DeleteParams::default()).await.unwrap();
        let e = read(&client, "kd", "snap").await.unwrap_err().to_string();
        assert!(e.contains(&gone) && e.contains(&l.version), "{e}");
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "snap"}, "data": {"index.json": "{\"format\": 9}"}});
        api.patch("snap", &pp, &Patch::Apply(&cm)).await.unwrap();
        let e = read(&client, "kd", "snap").await.unwrap_err().to_string();
        assert!(e.contains("index.json"), "{e}");
    }
}
