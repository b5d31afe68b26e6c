//! One benchmark environment: an API server (fresh for every scenario, so
//! runs never see each other's objects) of either backend — kube-sim started
//! in this process, or the real kube-apiserver + etcd of `kd-testenv` — with
//! the DiscoveredService CRD installed from `kube_discovery_core::crd::crd_yaml()`,
//! an admin kube client, a scratch directory, and typed access to the write
//! log and request counts (kube-sim's `/_sim/stats` and `/_sim/writes`, which
//! it does not count as API requests; on the real server its audit log, with
//! write answers of the source resources and ConfigMaps logged for their
//! revisions).
//!
//! The controller and the echo client talk to the API server directly (on the
//! real backend: not through the test harness's fault proxy).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use serde::Deserialize;
use serde_json::{Value, json};
pub use testenv::Backend;
use testenv::{Cluster, Options};

/// One entry of the write log.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Write {
    /// Wall clock of the commit (real server: its answer), nanoseconds since the epoch.
    pub time_nanos: u64,
    /// Plural resource (`endpointslices`, `discoveredservices`, `configmaps`...).
    pub resource: String,
    /// Object name.
    pub name: String,
    /// Revision of the write (0 where the real server's audit log has no
    /// answer body: every resource but the sources and ConfigMaps).
    #[serde(deserialize_with = "rv_number")]
    pub resource_version: u64,
}

fn rv_number<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<u64, D::Error> {
    let s = String::deserialize(d)?;
    if s.is_empty() {
        return Ok(0);
    }
    s.parse().map_err(serde::de::Error::custom)
}

/// The DiscoveredService API resource.
pub fn dsvc_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubediscovery.io", "v1alpha1", "DiscoveredService"),
        "discoveredservices",
    )
}

/// An API server, its admin client and a scratch directory.
pub struct Env {
    /// The server.
    pub api: Cluster,
    /// Admin client (kube-sim: bypasses RBAC, allowed on `/_sim` hooks;
    /// real: `system:masters`, straight to the API server).
    pub client: Client,
    dir: tempfile::TempDir,
    /// The plain user the controller authenticates as (`None`: the admin).
    user: Option<String>,
}

impl Env {
    /// Starts the API server (kube-sim: a watch history of `history` events)
    /// with the CRD installed. With `user`, the controller authenticates as
    /// that plain user, bound to `cluster-admin`: on the real API server it
    /// is then subject to API Priority and Fairness (flow schema
    /// `global-default`), where the admin (`system:masters`) is exempt.
    pub async fn start(backend: Backend, user: Option<&str>, history: usize) -> Result<Env> {
        Self::start_with(backend, user, history, None).await
    }

    /// The real control plane with kwok's Nodes and Pods
    /// ([`testenv::kwok`]: Deployments roll out; Pods answer on their
    /// addresses unless the options turn the Pod network off) and the CRD.
    pub async fn start_kwok(user: Option<&str>, kwok: testenv::kwok::Options) -> Result<Env> {
        Self::start_with(
            Backend::Real,
            user,
            Options::default().history_size,
            Some(kwok),
        )
        .await
    }

    async fn start_with(
        backend: Backend,
        user: Option<&str>,
        history: usize,
        kwok: Option<testenv::kwok::Options>,
    ) -> Result<Env> {
        let api = Cluster::start(
            backend,
            Options {
                kwok,
                users: user
                    .map(|u| vec![(u.to_string(), Vec::new())])
                    .unwrap_or_default(),
                history_size: history,
                crds: vec![kube_discovery_core::crd::crd_yaml()],
                // The churn scenario maps each source change to its revision,
                // and the echo client's ConfigMap writes to theirs.
                audit_write_bodies: vec![
                    ("discovery.k8s.io".into(), "endpointslices".into()),
                    (String::new(), "endpoints".into()),
                    (String::new(), "configmaps".into()),
                ],
                ..Options::default()
            },
        )
        .await?;
        let client = api.admin().clone();
        let dir = tempfile::tempdir().context("temporary directory")?;
        let env = Env {
            api,
            client,
            dir,
            user: user.map(str::to_string),
        };
        env.wait_crd().await?;
        if let Some(u) = user {
            let crb: k8s_openapi::api::rbac::v1::ClusterRoleBinding = serde_json::from_value(
                serde_json::json!({
                    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                    "metadata": {"name": format!("kd-bench-{u}")},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                    "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": u}]
                }),
            )?;
            Api::<k8s_openapi::api::rbac::v1::ClusterRoleBinding>::all(env.client.clone())
                .create(&Default::default(), &crb)
                .await
                .context("binding the controller's user to cluster-admin")?;
        }
        Ok(env)
    }

    async fn wait_crd(&self) -> Result<()> {
        let ds: Api<DynamicObject> = Api::all_with(self.client.clone(), &dsvc_resource());
        for _ in 0..200 {
            if ds.list(&ListParams::default().limit(1)).await.is_ok() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        bail!("the DiscoveredService CRD is not served after 5 s")
    }

    /// A path in the scratch directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes an admin kubeconfig (straight to the API server) and returns its path.
    pub fn kubeconfig(&self) -> Result<PathBuf> {
        let p = self.path("kubeconfig");
        let text = kube_sim::kubeconfig(
            &self.api.direct_url(),
            self.api.ca_pem().as_deref(),
            &self.api.admin_token(),
        );
        std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
        Ok(p)
    }

    /// The controller configuration: APISIX `discovery.kubernetes` pointing at
    /// this API server (with its CA when it serves TLS), plus the
    /// `kube_discovery` lines given.
    pub fn controller_config(&self, slices: bool, kube_discovery: &str) -> Result<String> {
        Ok(format!(
            "discovery:\n  kubernetes:\n{}    watch_endpoint_slices: {slices}\nkube_discovery:\n{kube_discovery}",
            self.connection("    ")?
        ))
    }

    /// One entry of a multi-cluster `discovery.kubernetes` list: cluster
    /// `id` at this API server, EndpointSlices.
    pub fn cluster_entry(&self, id: &str) -> Result<String> {
        Ok(format!(
            "  - id: {id}\n{}    watch_endpoint_slices: true\n",
            self.connection("    ")?
        ))
    }

    /// The `service` and `client` keys for this API server, each line
    /// starting with `indent`.
    fn connection(&self, indent: &str) -> Result<String> {
        let url = self.api.direct_url();
        let (schema, rest) = url
            .split_once("://")
            .ok_or_else(|| anyhow!("no scheme in {url}"))?;
        let (host, port) = rest
            .rsplit_once(':')
            .ok_or_else(|| anyhow!("no port in {url}"))?;
        let ca = match self.api.ca_pem() {
            Some(pem) => {
                let p = self.path("apiserver-ca.crt");
                std::fs::write(&p, pem).context("writing the CA file")?;
                format!("{indent}  ca_file: {}\n", p.display())
            }
            None => String::new(),
        };
        Ok(format!(
            "{indent}service:\n{indent}  schema: {schema}\n{indent}  host: \"{host}\"\n{indent}  port: {port}\n{ca}{indent}client:\n{indent}  token: {}\n",
            match &self.user {
                Some(u) => self.api.user_token(u)?,
                None => self.api.admin_token(),
            }
        ))
    }

    /// Request statistics in `/_sim/stats`' shape.
    pub async fn stats(&self) -> Result<Value> {
        Ok(self.api.stats().await?)
    }

    /// A point in the write log (kube-sim: the current resourceVersion).
    pub async fn rv(&self) -> Result<u64> {
        Ok(self.api.mark().await?)
    }

    /// Write log entries after the mark `since`.
    pub async fn writes_since(&self, since: u64) -> Result<Vec<Write>> {
        let v = self.api.writes_since(since).await?;
        serde_json::from_value(Value::Array(v)).context("parsing the write log")
    }

    /// A kube-sim fault request (`/_sim/faults`).
    pub async fn fault(&self, body: Value) -> Result<()> {
        Ok(self.api.fault(&body).await?)
    }

    /// Total API requests kube-sim has counted, by `verb resource`.
    pub async fn request_counts(&self) -> Result<std::collections::BTreeMap<String, u64>> {
        let v = self.stats().await?;
        let mut out = std::collections::BTreeMap::new();
        if let Some(verbs) = v["requests"].as_object() {
            for (verb, per) in verbs {
                if let Some(per) = per.as_object() {
                    for (res, n) in per {
                        out.insert(format!("{verb} {res}"), n.as_u64().unwrap_or(0));
                    }
                }
            }
        }
        Ok(out)
    }
}

impl Drop for Env {
    /// With `KD_BENCH_KEEP_LOGS=<dir>`, the process logs of this environment
    /// (controller, echo) are copied to `<dir>/<n>-<file>` before the scratch
    /// directory is removed, for profiles and post-mortems.
    fn drop(&mut self) {
        let Some(keep) = std::env::var_os("KD_BENCH_KEEP_LOGS") else {
            return;
        };
        let keep = PathBuf::from(keep);
        if std::fs::create_dir_all(&keep).is_err() {
            return;
        }
        let stamp = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis())
            .unwrap_or(0);
        if let Ok(rd) = std::fs::read_dir(self.dir.path()) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                if name.ends_with(".log") {
                    let _ = std::fs::copy(e.path(), keep.join(format!("{stamp}-{name}")));
                }
            }
        }
    }
}

/// `after - before` per key (keys with no change left out) and the total.
pub fn request_diff(
    before: &std::collections::BTreeMap<String, u64>,
    after: &std::collections::BTreeMap<String, u64>,
) -> (u64, Value) {
    let mut total = 0;
    let mut per = serde_json::Map::new();
    for (k, a) in after {
        let d = a.saturating_sub(before.get(k).copied().unwrap_or(0));
        if d > 0 {
            total += d;
            per.insert(k.clone(), json!(d));
        }
    }
    (total, Value::Object(per))
}
