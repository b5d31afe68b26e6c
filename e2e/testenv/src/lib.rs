//! Test environments for kube-discovery's end-to-end tests.
//!
//! A test asks for a [`Cluster`] on a [`Backend`]:
//!
//! * [`Backend::Sim`]: kube-sim in-process (fast, with fault hooks);
//! * [`Backend::Real`]: etcd + kube-apiserver + kube-controller-manager at
//!   pinned versions ([`real`]), with a fault-injecting proxy ([`proxy`]) and
//!   the audit log ([`audit`]) standing in for kube-sim's hooks.
//!
//! Both answer the same calls: URLs and kubeconfigs, tokens (admin, plain
//! users, ServiceAccounts), a write log and request statistics in kube-sim's
//! shapes, and kube-sim's fault requests. [`both_backends`] writes a test once
//! and runs it on each backend (`<test>::kube_sim` and `<test>::real`); the
//! `KD_E2E_APISERVER` switch (`kube-sim`, `real`, `both`) of `./test.sh`
//! selects them by name.
//!
//! ```text
//!  test ──► Cluster ─┬─ Sim ─────────────────────── kube-sim (in-process)
//!                    └─ Real ── FaultProxy ──► kube-apiserver ──► etcd
//!                                  ▲               ▲   audit.log
//!                 controller ──────┘   test admin ─┘   kube-controller-manager
//! ```

#![warn(missing_docs)]

pub mod ads;
pub mod audit;
pub mod envoy;
mod error;
pub mod gateways;
pub mod kwok;
pub mod net;
pub mod pki;
pub mod process;
pub mod proxy;
pub mod real;
pub mod xds_go;

use std::path::Path;
use std::time::Duration;

use kube_sim::{Sim, SimConfig};
use serde_json::Value;

pub use error::{Error, Result};
pub use kd_testenv_macros::both_backends;
pub use real::ControlPlane;

/// Which API server a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// kube-sim, in process.
    Sim,
    /// kube-apiserver + etcd + kube-controller-manager, behind the fault proxy.
    Real,
}

impl Backend {
    /// The suffix of the test names (`kube-sim` or `real`).
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sim => "kube-sim",
            Backend::Real => "real",
        }
    }
}

/// Options of a [`Cluster`].
#[derive(Debug, Clone)]
pub struct Options {
    /// kube-sim only: serve HTTPS (the real API server always does).
    pub tls: bool,
    /// kube-sim only: watch event history (older revisions get 410).
    pub history_size: usize,
    /// kube-sim only: BOOKMARK interval.
    pub bookmark_interval: Duration,
    /// Plain users (name, groups) whose tokens [`Cluster::user_token`] gives.
    pub users: Vec<(String, Vec<String>)>,
    /// Real only: run kube-controller-manager.
    pub controller_manager: bool,
    /// Real only: `(group, plural)` resources whose write answers the audit
    /// log keeps, so their resourceVersions are in the write log (kube-sim's
    /// always has them).
    pub audit_write_bodies: Vec<(String, String)>,
    /// CRDs (YAML) installed at start (real: before kube-controller-manager,
    /// so its garbage collector knows them from the start).
    pub crds: Vec<String>,
    /// Real only: extra kube-apiserver flags (e.g. `--feature-gates=...`).
    pub apiserver_args: Vec<String>,
    /// Real only: fake Nodes and Pods run by kwok, kube-scheduler, the
    /// Deployment and ReplicaSet controllers ([`kwok`]).
    pub kwok: Option<kwok::Options>,
}

impl Default for Options {
    fn default() -> Self {
        let real = real::Options::default();
        let sim = SimConfig::default();
        Options {
            tls: false,
            history_size: sim.history_size,
            bookmark_interval: sim.bookmark_interval,
            users: real.users,
            controller_manager: real.controller_manager,
            audit_write_bodies: Vec::new(),
            crds: Vec::new(),
            apiserver_args: Vec::new(),
            kwok: None,
        }
    }
}

enum Inner {
    Sim(Sim),
    Real(Box<ControlPlane>),
}

/// A running API server of either backend.
pub struct Cluster {
    inner: Inner,
    admin: kube::Client,
    users: Vec<(String, Vec<String>)>,
}

/// How long the real server's audit log is given to catch up with requests
/// that already changed what a test observed (their audit event is written
/// when the answer completes, a moment after the change is visible).
const AUDIT_SETTLE: Duration = Duration::from_millis(300);

impl Cluster {
    /// Starts an API server of `backend` with `opts` and waits until it serves.
    pub async fn start(backend: Backend, opts: Options) -> Result<Cluster> {
        match backend {
            Backend::Sim => {
                let sim = Sim::start(SimConfig {
                    tls: opts.tls,
                    history_size: opts.history_size,
                    bookmark_interval: opts.bookmark_interval,
                    ..SimConfig::default()
                })
                .await?;
                let admin = sim_client(&sim, &sim.admin_token()).await?;
                let c = Cluster {
                    inner: Inner::Sim(sim),
                    admin,
                    users: opts.users,
                };
                for crd in &opts.crds {
                    c.install_sim_crd(crd).await?;
                }
                Ok(c)
            }
            Backend::Real => {
                let cp = ControlPlane::start(real::Options {
                    users: opts.users.clone(),
                    controller_manager: opts.controller_manager,
                    crds: opts.crds.clone(),
                    audit_write_bodies: opts.audit_write_bodies.clone(),
                    apiserver_args: opts.apiserver_args.clone(),
                    kwok: opts.kwok.clone(),
                })
                .await?;
                let admin = cp.admin_client().await?;
                Ok(Cluster {
                    inner: Inner::Real(Box::new(cp)),
                    admin,
                    users: opts.users,
                })
            }
        }
    }

    /// Creates a CRD on kube-sim (it serves it at once).
    async fn install_sim_crd(&self, yaml: &str) -> Result<()> {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        let crd: CustomResourceDefinition =
            serde_saphyr::from_str(yaml).map_err(|source| Error::Yaml {
                what: "CRD YAML",
                source: Box::new(source),
            })?;
        kube::Api::<CustomResourceDefinition>::all(self.admin.clone())
            .create(&kube::api::PostParams::default(), &crd)
            .await
            .map_err(|e| Error::kube("creating a CRD", e))?;
        Ok(())
    }

    /// Which API server this is.
    pub fn backend(&self) -> Backend {
        match self.inner {
            Inner::Sim(_) => Backend::Sim,
            Inner::Real(_) => Backend::Real,
        }
    }

    /// Whether this is the real API server.
    pub fn is_real(&self) -> bool {
        self.backend() == Backend::Real
    }

    /// kube-sim, when that is the backend.
    pub fn sim(&self) -> Option<&Sim> {
        match &self.inner {
            Inner::Sim(s) => Some(s),
            Inner::Real(_) => None,
        }
    }

    /// The real control plane, when that is the backend.
    pub fn real(&self) -> Option<&ControlPlane> {
        match &self.inner {
            Inner::Sim(_) => None,
            Inner::Real(r) => Some(r),
        }
    }

    /// The URL clients under test use (the fault proxy on the real backend).
    pub fn url(&self) -> String {
        match &self.inner {
            Inner::Sim(s) => s.url(),
            Inner::Real(r) => r.url(),
        }
    }

    /// The URL of the API server itself, without the real backend's fault
    /// proxy (kube-sim: the same as [`Cluster::url`]); what a benchmark's
    /// clients use.
    pub fn direct_url(&self) -> String {
        match &self.inner {
            Inner::Sim(s) => s.url(),
            Inner::Real(r) => r.direct_url(),
        }
    }

    /// The address of [`Cluster::url`].
    pub fn addr(&self) -> std::net::SocketAddr {
        match &self.inner {
            Inner::Sim(s) => s.addr(),
            Inner::Real(r) => r.addr(),
        }
    }

    /// The CA of [`Cluster::url`] (kube-sim without TLS has none).
    pub fn ca_pem(&self) -> Option<String> {
        match &self.inner {
            Inner::Sim(s) => s.ca_pem(),
            Inner::Real(r) => Some(r.ca_pem()),
        }
    }

    /// A bearer token with cluster-admin rights.
    pub fn admin_token(&self) -> String {
        match &self.inner {
            Inner::Sim(s) => s.admin_token(),
            Inner::Real(r) => r.admin_token(),
        }
    }

    /// The admin client (straight to the real API server: no faults).
    pub fn admin(&self) -> &kube::Client {
        &self.admin
    }

    /// A kubeconfig for [`Cluster::url`] authenticating with `token`.
    pub fn kubeconfig_yaml(&self, token: &str) -> String {
        match &self.inner {
            Inner::Sim(s) => s.kubeconfig_yaml(token),
            Inner::Real(r) => r.kubeconfig_yaml(token),
        }
    }

    /// Writes [`Cluster::kubeconfig_yaml`] for `token` to `path`.
    pub fn write_kubeconfig(&self, path: &Path, token: &str) -> Result<()> {
        std::fs::write(path, self.kubeconfig_yaml(token)).map_err(|source| Error::File {
            what: "writing kubeconfig",
            path: path.to_path_buf(),
            source,
        })
    }

    /// A kube client for [`Cluster::url`] authenticating with `token`.
    pub async fn client(&self, token: &str) -> Result<kube::Client> {
        kube_client(&self.kubeconfig_yaml(token)).await
    }

    /// A token for the ServiceAccount `namespace/name`. On the real backend
    /// the namespace and ServiceAccount are created when missing and the
    /// token comes from the TokenRequest API; kube-sim needs neither.
    pub async fn issue_token(&self, namespace: &str, name: &str) -> Result<String> {
        match &self.inner {
            Inner::Sim(s) => Ok(s.issue_token(namespace, name)),
            Inner::Real(r) => r.issue_token(namespace, name).await,
        }
    }

    /// The token of a plain user of [`Options::users`] (groups as listed
    /// there, plus `system:authenticated`).
    pub fn user_token(&self, name: &str) -> Result<String> {
        let (_, groups) = self
            .users
            .iter()
            .find(|(n, _)| n == name)
            .ok_or_else(|| Error::UnknownUser(name.to_string()))?;
        match &self.inner {
            Inner::Sim(s) => {
                let token = format!("user-{name}-{}", uuid::Uuid::new_v4().simple());
                let groups: Vec<&str> = groups.iter().map(String::as_str).collect();
                s.add_user_token(&token, name, &groups);
                Ok(token)
            }
            Inner::Real(r) => r
                .user_token(name)
                .ok_or_else(|| Error::NoUserToken(name.to_string())),
        }
    }

    async fn sim_get(&self, path: &str) -> Result<Value> {
        let req = http::Request::get(path).body(Vec::new())?;
        self.admin
            .request::<Value>(req)
            .await
            .map_err(|e| Error::kube(format!("GET {path}"), e))
    }

    /// A point in the write log: [`Cluster::writes_since`] returns what
    /// happened after it (kube-sim: the current resourceVersion; real: now).
    pub async fn mark(&self) -> Result<u64> {
        match &self.inner {
            Inner::Sim(_) => {
                let v = self.sim_get("/_sim/stats").await?;
                v["resourceVersion"]
                    .as_str()
                    .and_then(|s| s.parse().ok())
                    .ok_or(Error::MalformedAnswer(
                        "/_sim/stats without resourceVersion",
                    ))
            }
            Inner::Real(_) => Ok(audit::now_micros()),
        }
    }

    /// Every write after `mark`, in kube-sim's `/_sim/writes` item shape.
    pub async fn writes_since(&self, mark: u64) -> Result<Vec<Value>> {
        match &self.inner {
            Inner::Sim(_) => {
                let v = self.sim_get(&format!("/_sim/writes?since={mark}")).await?;
                Ok(v["items"].as_array().cloned().unwrap_or_default())
            }
            Inner::Real(r) => {
                tokio::time::sleep(AUDIT_SETTLE).await;
                Ok(r.audit().writes_since(mark))
            }
        }
    }

    /// Request statistics in kube-sim's `/_sim/stats` shape (on the real
    /// backend without the control plane's own controllers' requests).
    pub async fn stats(&self) -> Result<Value> {
        match &self.inner {
            Inner::Sim(_) => self.sim_get("/_sim/stats").await,
            Inner::Real(r) => {
                tokio::time::sleep(AUDIT_SETTLE).await;
                let mut s = r.audit().stats(audit::now_micros());
                // kube-sim counts the requests its `fail` faults answer; on
                // the real backend the proxy answers them, unseen by the API
                // server (and without a user: not in requestsByUser).
                for ((verb, resource, _), n) in r.proxy().failures_served() {
                    let v = &mut s["requests"][verb.as_str()][resource.as_str()];
                    *v = Value::from(v.as_u64().unwrap_or(0) + n);
                }
                Ok(s)
            }
        }
    }

    /// Applies a kube-sim fault request (`POST /_sim/faults` body).
    pub async fn fault(&self, body: &Value) -> Result<()> {
        match &self.inner {
            Inner::Sim(_) => {
                let req = http::Request::post("/_sim/faults")
                    .header("content-type", "application/json")
                    .body(body.to_string().into_bytes())?;
                self.admin
                    .request::<Value>(req)
                    .await
                    .map_err(|e| Error::kube(format!("POST /_sim/faults {body}"), e))?;
                Ok(())
            }
            Inner::Real(r) => {
                let req: kube_sim::faults::FaultRequest = serde_json::from_value(body.clone())
                    .map_err(|e| Error::json("fault request", e))?;
                r.fault(&req).await
            }
        }
    }

    /// Errors (with its log tail) if a control-plane process died.
    pub fn check_alive(&self) -> Result<()> {
        match &self.inner {
            Inner::Sim(_) => Ok(()),
            Inner::Real(r) => r.check_alive(),
        }
    }
}

async fn sim_client(sim: &Sim, token: &str) -> Result<kube::Client> {
    kube_client(&sim.kubeconfig_yaml(token)).await
}

/// A kube client for `url` trusting `ca_pem`, authenticating with `token`
/// (the real control plane's clients and kwok's).
pub async fn client_for(url: &str, ca_pem: &str, token: &str) -> Result<kube::Client> {
    kube_client(&kube_sim::kubeconfig(url, Some(ca_pem), token)).await
}

/// A kube client from a kubeconfig's YAML.
pub(crate) async fn kube_client(kubeconfig_yaml: &str) -> Result<kube::Client> {
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig_yaml)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    kube::Client::try_from(cfg).map_err(|e| Error::kube("kube client", e))
}
