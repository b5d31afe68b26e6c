//! One benchmark environment: a kube-sim started in this process (fresh for
//! every scenario, so runs never see each other's objects), the
//! DiscoveredService CRD installed from `kube_discovery_core::crd::crd_yaml()`,
//! an admin kube client, a scratch directory, and typed access to kube-sim's
//! test hooks (`/_sim/stats`, `/_sim/writes`, `/_sim/faults`), which are not
//! counted as API requests by kube-sim.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams, PostParams};
use kube::{Client, Config};
use kube_sim::{Sim, SimConfig};
use serde::Deserialize;
use serde_json::{Value, json};

/// One entry of kube-sim's write log.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Write {
    /// Wall clock of the commit, nanoseconds since the epoch.
    pub time_nanos: u64,
    /// Plural resource (`endpointslices`, `discoveredservices`, `configmaps`...).
    pub resource: String,
    /// Object name.
    pub name: String,
    /// Revision of the write.
    #[serde(deserialize_with = "rv_number")]
    pub resource_version: u64,
}

fn rv_number<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<u64, D::Error> {
    let s = String::deserialize(d)?;
    s.parse().map_err(serde::de::Error::custom)
}

/// The DiscoveredService API resource.
pub fn dsvc_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("kubediscovery.io", "v1alpha1", "DiscoveredService"),
        "discoveredservices",
    )
}

/// A kube-sim, its admin client and a scratch directory.
pub struct Env {
    /// The server.
    pub sim: Sim,
    /// Admin client (bypasses RBAC; also allowed on `/_sim` hooks).
    pub client: Client,
    dir: tempfile::TempDir,
}

/// A kube client for `token` on `sim`.
pub async fn client_for(sim: &Sim, token: &str) -> Result<Client> {
    let kc =
        kube::config::Kubeconfig::from_yaml(&sim.kubeconfig_yaml(token)).context("kubeconfig")?;
    let cfg = Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .context("kube config")?;
    Client::try_from(cfg).context("kube client")
}

impl Env {
    /// Starts kube-sim (watch history of `history` events) and installs the CRD.
    pub async fn start(history: usize) -> Result<Env> {
        let sim = Sim::start(SimConfig {
            history_size: history,
            ..SimConfig::default()
        })
        .await?;
        let client = client_for(&sim, &sim.admin_token()).await?;
        let dir = tempfile::tempdir().context("temporary directory")?;
        let env = Env { sim, client, dir };
        env.install_crd().await?;
        Ok(env)
    }

    async fn install_crd(&self) -> Result<()> {
        let crd: CustomResourceDefinition =
            serde_yaml::from_str(&kube_discovery_core::crd::crd_yaml())
                .context("parsing the DiscoveredService CRD")?;
        Api::<CustomResourceDefinition>::all(self.client.clone())
            .create(&PostParams::default(), &crd)
            .await
            .context("creating the CRD")?;
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

    /// Writes an admin kubeconfig and returns its path.
    pub fn kubeconfig(&self) -> Result<PathBuf> {
        let p = self.path("kubeconfig");
        self.sim.write_kubeconfig(&p, &self.sim.admin_token())?;
        Ok(p)
    }

    /// The controller configuration: APISIX `discovery.kubernetes` pointing at
    /// this kube-sim, plus the `kube_discovery` lines given.
    pub fn controller_config(&self, slices: bool, kube_discovery: &str) -> Result<String> {
        let url = self.sim.url();
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| anyhow!("kube-sim is expected on plain http, got {url}"))?;
        let (host, port) = rest
            .rsplit_once(':')
            .ok_or_else(|| anyhow!("no port in {url}"))?;
        Ok(format!(
            "discovery:\n  kubernetes:\n    service:\n      schema: http\n      host: \"{host}\"\n      port: {port}\n    client:\n      token: {}\n    watch_endpoint_slices: {slices}\nkube_discovery:\n{kube_discovery}",
            self.sim.admin_token()
        ))
    }

    async fn hook_get(&self, path: &str) -> Result<Value> {
        let req = http::Request::get(path)
            .body(Vec::new())
            .context("request")?;
        self.client
            .request::<Value>(req)
            .await
            .with_context(|| format!("GET {path}"))
    }

    /// `/_sim/stats`.
    pub async fn stats(&self) -> Result<Value> {
        self.hook_get("/_sim/stats").await
    }

    /// Current resourceVersion.
    pub async fn rv(&self) -> Result<u64> {
        let v = self.stats().await?;
        v["resourceVersion"]
            .as_str()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| anyhow!("no resourceVersion in /_sim/stats"))
    }

    /// Write log entries after revision `since`.
    pub async fn writes_since(&self, since: u64) -> Result<Vec<Write>> {
        let v = self
            .hook_get(&format!("/_sim/writes?since={since}"))
            .await?;
        serde_json::from_value(v["items"].clone()).context("parsing /_sim/writes")
    }

    /// `POST /_sim/faults`.
    pub async fn fault(&self, body: Value) -> Result<()> {
        let req = http::Request::post("/_sim/faults")
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body)?)
            .context("request")?;
        self.client
            .request::<Value>(req)
            .await
            .context("POST /_sim/faults")?;
        Ok(())
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
