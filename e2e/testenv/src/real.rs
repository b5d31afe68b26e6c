//! A real Kubernetes control plane for the tests: etcd, kube-apiserver and
//! kube-controller-manager, built from their Go modules by
//! `e2e/controlplane/build.sh` (pinned versions) and started on free loopback
//! ports, with
//!
//! * generated certificates ([`crate::pki`]): clients verify the API server
//!   for real;
//! * a static token file: an admin in `system:masters`, the controller
//!   manager's own user, and plain users for RBAC tests;
//! * RBAC authorization, ServiceAccount tokens signed by a generated key;
//! * an audit log ([`crate::audit`]) that stands in for kube-sim's write log;
//! * a [`FaultProxy`] in front of the API server: controllers under test
//!   connect through it ([`ControlPlane::url`]), the test's own admin client
//!   goes direct ([`ControlPlane::direct_url`]);
//! * kube-controller-manager with the controllers a test relies on: garbage
//!   collection, namespace deletion, ServiceAccounts and their tokens,
//!   EndpointSlices and Endpoints from Services and Pods, ClusterRole
//!   aggregation;
//! * on request ([`Options::kwok`]), Nodes and Pods ([`crate::kwok`]):
//!   kube-scheduler, kwok playing kubelet for fake Nodes, Pods that answer on
//!   their own addresses, and the Deployment and ReplicaSet controllers.
//!
//! Every process is stopped when the [`ControlPlane`] is dropped, and dies
//! with the test thread otherwise ([`crate::process`]).

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;
use kube_sim::faults::FaultRequest;
use serde_json::{Value, json};

use crate::audit::AuditLog;
use crate::pki::Pki;
use crate::process::{Proc, free_port};
use crate::proxy::FaultProxy;
use crate::{Error, Result};

/// Pinned versions; `e2e/controlplane/env.sh` has the same and builds them.
/// The kube-apiserver and kube-controller-manager version.
pub const KUBERNETES_VERSION: &str = "v1.34.4";
/// The etcd version.
pub const ETCD_VERSION: &str = "v3.6.4";

/// How long the API server may take to become ready (a cold start on 2 busy
/// cores takes a few seconds).
const READY_LIMIT: Duration = Duration::from_secs(90);

/// Where `build.sh` puts the binaries: `KD_CONTROLPLANE_BIN`, else
/// `.tools/controlplane/kubernetes-<v>-etcd-<v>` at the repository root.
pub fn bin_dir() -> PathBuf {
    if let Ok(p) = std::env::var("KD_CONTROLPLANE_BIN") {
        return PathBuf::from(p);
    }
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(".tools/controlplane")
        .join(format!(
            "kubernetes-{KUBERNETES_VERSION}-etcd-{ETCD_VERSION}"
        ))
}

/// A user of the static token file.
#[derive(Debug, Clone)]
pub struct User {
    /// The user name.
    pub name: String,
    /// Its groups.
    pub groups: Vec<String>,
    /// Its bearer token.
    pub token: String,
}

/// Options of a control plane.
#[derive(Debug, Clone)]
pub struct Options {
    /// Plain users (name, groups) besides the admin; their tokens are
    /// generated ([`ControlPlane::user_token`]).
    pub users: Vec<(String, Vec<String>)>,
    /// Start kube-controller-manager (on by default).
    pub controller_manager: bool,
    /// Extra kube-apiserver flags.
    pub apiserver_args: Vec<String>,
    /// `(group, plural)` resources whose write answers the audit log keeps
    /// (their resourceVersion is then in the write log); see [`crate::audit::policy`].
    pub audit_write_bodies: Vec<(String, String)>,
    /// CustomResourceDefinitions (YAML) created, and established, before
    /// kube-controller-manager starts: its garbage collector picks up new
    /// resource types only on its periodic (30 s) resync otherwise.
    pub crds: Vec<String>,
    /// Fake Nodes run by kwok, kube-scheduler, and the Deployment and
    /// ReplicaSet controllers in kube-controller-manager ([`crate::kwok`]).
    /// Needs [`Options::controller_manager`].
    pub kwok: Option<crate::kwok::Options>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            users: ["alice", "bob", "carol"]
                .iter()
                .map(|u| (u.to_string(), vec!["devs".to_string()]))
                .collect(),
            controller_manager: true,
            apiserver_args: Vec::new(),
            audit_write_bodies: Vec::new(),
            crds: Vec::new(),
            kwok: None,
        }
    }
}

/// A running control plane.
pub struct ControlPlane {
    dir: tempfile::TempDir,
    pki: Pki,
    admin_token: String,
    users: Vec<User>,
    etcd_addr: SocketAddr,
    apiserver_addr: SocketAddr,
    proxy: FaultProxy,
    audit: AuditLog,
    // Drop order (see Drop): kwok and kube-scheduler, the controller manager, etcd last.
    kwok: Option<crate::kwok::Kwok>,
    kcm: Mutex<Option<Proc>>,
    apiserver: Mutex<Proc>,
    etcd: Mutex<Proc>,
}

fn token() -> String {
    uuid::Uuid::new_v4().simple().to_string()
}

impl ControlPlane {
    /// Starts etcd, kube-apiserver (ready) and kube-controller-manager
    /// (its ServiceAccount controller has run), plus the fault proxy.
    pub async fn start(opts: Options) -> Result<ControlPlane> {
        let mut last = None;
        // A free port can be taken by another test between probing and
        // binding; such a start is retried with new ports.
        for _ in 0..3 {
            match Self::start_once(&opts).await {
                Ok(cp) => return Ok(cp),
                Err(e) if e.mentions("address already in use") => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::NotRunning {
            name: "control plane".into(),
        }))
    }

    async fn start_once(opts: &Options) -> Result<ControlPlane> {
        let bins = bin_dir();
        let dir = tempfile::Builder::new()
            .prefix("kd-controlplane-")
            .tempdir()
            .map_err(|source| Error::File {
                what: "creating the control plane dir in",
                path: std::env::temp_dir(),
                source,
            })?;
        let d = dir.path();
        let pki = Pki::generate()?;
        let write = |name: &str, text: &str| -> Result<PathBuf> {
            let p = d.join(name);
            write_file(&p, text)?;
            Ok(p)
        };
        let ca = write("ca.crt", &pki.ca_pem)?;
        let cert = write("apiserver.crt", &pki.serving_cert_pem)?;
        let key = write("apiserver.key", &pki.serving_key_pem)?;
        let sa_key = write("sa.key", &pki.sa_key_pem)?;
        let sa_pub = write("sa.pub", &pki.sa_pub_pem)?;
        let bodies: Vec<(&str, &str)> = opts
            .audit_write_bodies
            .iter()
            .map(|(g, r)| (g.as_str(), r.as_str()))
            .collect();
        let policy = write("audit-policy.yaml", &crate::audit::policy(&bodies))?;
        let audit_path = d.join("audit.log");

        let admin_token = token();
        let kcm_token = token();
        let (kwok_token, scheduler_token) = (token(), token());
        let users: Vec<User> = opts
            .users
            .iter()
            .map(|(n, g)| User {
                name: n.clone(),
                groups: g.clone(),
                token: token(),
            })
            .collect();
        let mut tokens = String::new();
        let _ = writeln!(tokens, "{admin_token},kd-admin,kd-admin,\"system:masters\"");
        let _ = writeln!(
            tokens,
            "{kcm_token},system:kube-controller-manager,system:kube-controller-manager"
        );
        let _ = writeln!(
            tokens,
            "{scheduler_token},system:kube-scheduler,system:kube-scheduler"
        );
        // kwok writes Node and Pod status and deletes Pods, as kubelets do.
        let _ = writeln!(tokens, "{kwok_token},kwok,kwok,\"system:masters\"");
        for u in &users {
            let _ = writeln!(
                tokens,
                "{},{},{},\"{}\"",
                u.token,
                u.name,
                u.name,
                u.groups.join(",")
            );
        }
        let token_file = write("tokens.csv", &tokens)?;

        // etcd
        let (client_port, peer_port) = (free_port()?, free_port()?);
        let etcd_addr = SocketAddr::from(([127, 0, 0, 1], client_port));
        let client_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let mut etcd = Proc::spawn(
            "etcd",
            &bins.join("etcd"),
            vec![
                "--name=kd-test".into(),
                format!("--data-dir={}", d.join("etcd").display()),
                format!("--listen-client-urls={client_url}"),
                format!("--advertise-client-urls={client_url}"),
                format!("--listen-peer-urls={peer_url}"),
                format!("--initial-advertise-peer-urls={peer_url}"),
                format!("--initial-cluster=kd-test={peer_url}"),
                // Test data: no fsync (etcd's own flag for this), no metrics port.
                "--unsafe-no-fsync".into(),
                "--log-level=warn".into(),
                "--listen-metrics-urls=".into(),
            ],
            &d.join("etcd.log"),
        )?;
        wait_etcd(&mut etcd, etcd_addr).await?;

        // kube-apiserver
        let secure_port = free_port()?;
        let apiserver_addr = SocketAddr::from(([127, 0, 0, 1], secure_port));
        let mut args = vec![
            format!("--etcd-servers={client_url}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={secure_port}"),
            // The harness must not depend on a default route (CI machines
            // may have none); without these a loopback advertise address is
            // refused and the kubernetes Service's endpoints reconciler fails.
            "--advertise-address=127.0.0.1".into(),
            "--endpoint-reconciler-type=none".into(),
            format!("--cert-dir={}", d.join("certs").display()),
            format!("--tls-cert-file={}", cert.display()),
            format!("--tls-private-key-file={}", key.display()),
            format!("--client-ca-file={}", ca.display()),
            format!("--token-auth-file={}", token_file.display()),
            "--authorization-mode=RBAC".into(),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", sa_pub.display()),
            format!("--service-account-signing-key-file={}", sa_key.display()),
            "--service-cluster-ip-range=10.96.0.0/16".into(),
            format!("--audit-policy-file={}", policy.display()),
            format!("--audit-log-path={}", audit_path.display()),
            "--audit-log-format=json".into(),
            "--audit-log-maxsize=0".into(),
            "--profiling=false".into(),
            "--v=1".into(),
        ];
        args.extend(opts.apiserver_args.iter().cloned());
        let mut apiserver = Proc::spawn(
            "kube-apiserver",
            &bins.join("kube-apiserver"),
            args,
            &d.join("kube-apiserver.log"),
        )?;
        let direct_url = format!("https://{apiserver_addr}");
        wait_ready(&mut apiserver, &mut etcd, &pki, &direct_url, &admin_token).await?;

        let proxy = FaultProxy::start(
            apiserver_addr,
            pki.server_config()?,
            pki.client_config(&[b"h2"])?,
            pki.client_config(&[b"http/1.1"])?,
        )
        .await?;

        let mut cp = ControlPlane {
            audit: AuditLog::new(&audit_path),
            dir,
            pki,
            admin_token,
            users,
            etcd_addr,
            apiserver_addr,
            proxy,
            kwok: None,
            kcm: Mutex::new(None),
            apiserver: Mutex::new(apiserver),
            etcd: Mutex::new(etcd),
        };
        for crd in &opts.crds {
            cp.install_crd(crd).await?;
        }
        if opts.controller_manager {
            cp.start_controller_manager(&kcm_token, &ca, &sa_key, opts.kwok.as_ref())
                .await?;
        }
        if let Some(k) = &opts.kwok {
            let start = crate::kwok::Start {
                dir: cp.dir.path(),
                controlplane_bin: &bins,
                url: &cp.direct_url(),
                ca_pem: &cp.pki.ca_pem,
                kwok_token: &kwok_token,
                scheduler_token: &scheduler_token,
            };
            cp.kwok = Some(crate::kwok::Kwok::start(start, k).await?);
        }
        Ok(cp)
    }

    async fn start_controller_manager(
        &self,
        kcm_token: &str,
        ca: &Path,
        sa_key: &Path,
        kwok: Option<&crate::kwok::Options>,
    ) -> Result<()> {
        let d = self.dir.path();
        let kubeconfig = d.join("kube-controller-manager.kubeconfig");
        write_file(
            &kubeconfig,
            &kube_sim::kubeconfig(&self.direct_url(), Some(&self.pki.ca_pem), kcm_token),
        )?;
        let kc = kubeconfig.display().to_string();
        let mut controllers = concat!(
            "garbage-collector-controller,namespace-controller,",
            "serviceaccount-controller,serviceaccount-token-controller,",
            "endpointslice-controller,endpoints-controller,",
            "clusterrole-aggregation-controller,root-ca-certificate-publisher-controller"
        )
        .to_string();
        if kwok.is_some() {
            controllers.push_str(",deployment-controller,replicaset-controller");
        }
        let mut args: Vec<String> = vec![
            format!("--kubeconfig={kc}"),
            format!("--authentication-kubeconfig={kc}"),
            format!("--authorization-kubeconfig={kc}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={}", free_port()?),
            "--leader-elect=false".into(),
            "--use-service-account-credentials=true".into(),
            format!("--service-account-private-key-file={}", sa_key.display()),
            format!("--root-ca-file={}", ca.display()),
            format!("--controllers={controllers}"),
            // Pods change fast here; batch nothing.
            "--endpointslice-updates-batch-period=0s".into(),
            "--v=1".into(),
        ];
        args.extend(crate::kwok::qps_args(kwok.and_then(|k| k.api_qps)));
        let kcm = Proc::spawn(
            "kube-controller-manager",
            &bin_dir().join("kube-controller-manager"),
            args,
            &d.join("kube-controller-manager.log"),
        )?;
        *self.kcm.lock().unwrap_or_else(|p| p.into_inner()) = Some(kcm);
        // Ready when its ServiceAccount controller has made `default/default`.
        let admin = self.admin_client().await?;
        let sas: kube::Api<k8s_openapi::api::core::v1::ServiceAccount> =
            kube::Api::namespaced(admin, "default");
        let start = Instant::now();
        loop {
            self.check_alive()?;
            if let Ok(Some(_)) = sas.get_opt("default").await {
                return Ok(());
            }
            if start.elapsed() > READY_LIMIT {
                return Err(Error::Timeout {
                    what: "kube-controller-manager made no default ServiceAccount".into(),
                    limit: READY_LIMIT,
                    last: None,
                    log_tail: Some(self.kcm_tail()),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Creates a CRD from YAML and waits until it is established.
    pub async fn install_crd(&self, yaml: &str) -> Result<()> {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        let crd: CustomResourceDefinition =
            serde_saphyr::from_str(yaml).map_err(|source| Error::Yaml {
                what: "CRD YAML",
                source: Box::new(source),
            })?;
        let name = crd.metadata.name.clone().unwrap_or_default();
        let api: kube::Api<CustomResourceDefinition> = kube::Api::all(self.admin_client().await?);
        api.create(&kube::api::PostParams::default(), &crd)
            .await
            .map_err(|e| Error::kube(format!("creating CRD {name}"), e))?;
        let start = Instant::now();
        loop {
            let c = api
                .get(&name)
                .await
                .map_err(|e| Error::kube(format!("reading CRD {name}"), e))?;
            let established = c
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            if established {
                return Ok(());
            }
            if start.elapsed() > READY_LIMIT {
                return Err(Error::Timeout {
                    what: format!("CRD {name} not established"),
                    limit: READY_LIMIT,
                    last: None,
                    log_tail: None,
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn kcm_tail(&self) -> String {
        self.kcm
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(Proc::tail)
            .unwrap_or_default()
    }

    /// URL of the fault proxy in front of the API server (what controllers
    /// under test use).
    pub fn url(&self) -> String {
        format!("https://{}", self.proxy.addr())
    }

    /// The address of [`ControlPlane::url`] (the fault proxy).
    pub fn addr(&self) -> SocketAddr {
        self.proxy.addr()
    }

    /// URL of the API server itself (no faults).
    pub fn direct_url(&self) -> String {
        format!("https://{}", self.apiserver_addr)
    }

    /// The CA certificate of the API server (PEM).
    pub fn ca_pem(&self) -> String {
        self.pki.ca_pem.clone()
    }

    /// A bearer token of a `system:masters` user.
    pub fn admin_token(&self) -> String {
        self.admin_token.clone()
    }

    /// kwok's Nodes and Pods, when [`Options::kwok`] asked for them.
    pub fn kwok(&self) -> Option<&crate::kwok::Kwok> {
        self.kwok.as_ref()
    }

    /// The temporary directory of the certificates, configuration, logs and data.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The API server's audit log.
    pub fn audit(&self) -> &AuditLog {
        &self.audit
    }

    /// The fault-injecting proxy in front of the API server.
    pub fn proxy(&self) -> &FaultProxy {
        &self.proxy
    }

    /// The token of a plain user of [`Options::users`].
    pub fn user_token(&self, name: &str) -> Option<String> {
        self.users
            .iter()
            .find(|u| u.name == name)
            .map(|u| u.token.clone())
    }

    /// A kubeconfig for `token` against the proxy.
    pub fn kubeconfig_yaml(&self, token: &str) -> String {
        kube_sim::kubeconfig(&self.url(), Some(&self.pki.ca_pem), token)
    }

    /// A kube client for `token`, straight to the API server.
    pub async fn direct_client(&self, token: &str) -> Result<kube::Client> {
        crate::client_for(&self.direct_url(), &self.pki.ca_pem, token).await
    }

    /// A kube client for `token` through the fault proxy.
    pub async fn client_via_proxy(&self, token: &str) -> Result<kube::Client> {
        crate::client_for(&self.url(), &self.pki.ca_pem, token).await
    }

    /// The admin client, straight to the API server.
    pub async fn admin_client(&self) -> Result<kube::Client> {
        self.direct_client(&self.admin_token).await
    }

    /// Errors with the log tail of the first control-plane process that died.
    pub fn check_alive(&self) -> Result<()> {
        self.etcd
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .check_alive()?;
        self.apiserver
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .check_alive()?;
        if let Some(k) = self.kcm.lock().unwrap_or_else(|p| p.into_inner()).as_mut() {
            k.check_alive()?;
        }
        if let Some(k) = &self.kwok {
            k.check_alive()?;
        }
        Ok(())
    }

    /// Pids of the running processes (etcd, kube-apiserver,
    /// kube-controller-manager, kwok and kube-scheduler).
    pub fn pids(&self) -> Vec<u32> {
        let mut v = Vec::new();
        v.extend(self.etcd.lock().unwrap_or_else(|p| p.into_inner()).pid());
        v.extend(
            self.apiserver
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .pid(),
        );
        if let Some(k) = self.kcm.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
            v.extend(k.pid());
        }
        if let Some(k) = &self.kwok {
            v.extend(k.pids());
        }
        v
    }

    /// A ServiceAccount token from the TokenRequest API (creating the
    /// namespace and the ServiceAccount when missing), valid for a day.
    pub async fn issue_token(&self, namespace: &str, name: &str) -> Result<String> {
        let admin = self.admin_client().await?;
        ensure(
            &admin,
            "/api/v1/namespaces",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}),
        )
        .await?;
        ensure(
            &admin,
            &format!("/api/v1/namespaces/{namespace}/serviceaccounts"),
            json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": namespace}}),
        )
        .await?;
        let req = http::Request::post(format!(
            "/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token"
        ))
        .header("content-type", "application/json")
        .body(json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 86400}}).to_string().into_bytes())?;
        let v: Value = admin
            .request(req)
            .await
            .map_err(|e| Error::kube("TokenRequest", e))?;
        v["status"]["token"]
            .as_str()
            .map(str::to_string)
            .ok_or(Error::MalformedAnswer(
                "TokenRequest answer without status.token",
            ))
    }

    /// The current etcd revision (kube's resourceVersion).
    pub async fn etcd_revision(&self) -> Result<i64> {
        let v = etcd_post(
            self.etcd_addr,
            "/v3/kv/range",
            &json!({"key": base64::engine::general_purpose::STANDARD.encode("/"), "limit": 1, "keys_only": true}),
        )
        .await?;
        v["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .ok_or(Error::MalformedAnswer(
                "etcd range answer without header.revision",
            ))
    }

    /// Compacts etcd at its current revision and restarts kube-apiserver:
    /// its watch cache starts again at the current revision, so every watch
    /// resumed from an older resourceVersion gets `410 Gone` (as after an
    /// API server restart that follows an etcd compaction in a real cluster).
    /// Every open connection is cut by the restart.
    pub async fn compact(&self) -> Result<()> {
        self.compact_etcd().await?;
        self.restart_apiserver().await
    }

    /// Compacts etcd at its current revision, without restarting
    /// kube-apiserver: what it reads from etcd at an older revision is gone
    /// (a paged list's `continue` token gets `410 Expired`), its watch cache
    /// and open connections are untouched.
    pub async fn compact_etcd(&self) -> Result<()> {
        let rev = self.etcd_revision().await?;
        etcd_post(
            self.etcd_addr,
            "/v3/kv/compaction",
            &json!({"revision": rev.to_string(), "physical": true}),
        )
        .await
        .map(|_| ())
    }

    /// Stops kube-apiserver and starts it again (same port, same etcd).
    pub async fn restart_apiserver(&self) -> Result<()> {
        // Its graceful termination (audit log flushed within milliseconds of
        // SIGTERM) usually ends within about a second, but now and then hangs
        // until killed; nothing after the first second matters here.
        self.apiserver
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .restart(Duration::from_secs(2))?;
        self.proxy.cut_connections();
        let start = Instant::now();
        loop {
            self.check_alive()?;
            let ok = match self.admin_client().await {
                Ok(c) => {
                    let req = http::Request::get("/readyz").body(Vec::new())?;
                    c.request_text(req).await.is_ok()
                }
                Err(_) => false,
            };
            if ok {
                return Ok(());
            }
            if start.elapsed() > READY_LIMIT {
                return Err(Error::Timeout {
                    what: "kube-apiserver not ready again after a restart".into(),
                    limit: READY_LIMIT,
                    last: None,
                    log_tail: None,
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Applies a kube-sim fault request: `compact` compacts etcd and restarts
    /// the API server ([`ControlPlane::compact`], done first), every other
    /// field goes to the [`FaultProxy`].
    pub async fn fault(&self, req: &FaultRequest) -> Result<()> {
        kube_sim::faults::validate_faults(req).map_err(Error::InvalidFault)?;
        if req.compact {
            self.compact().await?;
        }
        self.proxy.apply(req);
        Ok(())
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        drop(self.kwok.take());
        if let Some(mut k) = self.kcm.lock().unwrap_or_else(|p| p.into_inner()).take() {
            k.stop(Duration::ZERO);
        }
        self.apiserver
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stop(Duration::ZERO);
        self.etcd
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .stop(Duration::ZERO);
    }
}

/// Writes `text` to `path`.
fn write_file(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).map_err(|source| Error::File {
        what: "writing",
        path: path.to_path_buf(),
        source,
    })
}

/// POSTs `body` to `path`; a 409 AlreadyExists is fine.
async fn ensure(client: &kube::Client, path: &str, body: Value) -> Result<()> {
    let req = http::Request::post(path)
        .header("content-type", "application/json")
        .body(body.to_string().into_bytes())?;
    match client.request::<Value>(req).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(Error::kube(format!("POST {path}"), e)),
    }
}

async fn wait_etcd(etcd: &mut Proc, addr: SocketAddr) -> Result<()> {
    let start = Instant::now();
    loop {
        etcd.check_alive()?;
        if let Ok(v) = etcd_get(addr, "/health").await
            && v["health"] == "true"
        {
            return Ok(());
        }
        if start.elapsed() > READY_LIMIT {
            return Err(Error::Timeout {
                what: "etcd not healthy".into(),
                limit: READY_LIMIT,
                last: None,
                log_tail: Some(etcd.tail()),
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_ready(
    apiserver: &mut Proc,
    etcd: &mut Proc,
    pki: &Pki,
    url: &str,
    token: &str,
) -> Result<()> {
    let client = crate::client_for(url, &pki.ca_pem, token).await?;
    let start = Instant::now();
    loop {
        etcd.check_alive()?;
        apiserver.check_alive()?;
        let req = http::Request::get("/readyz").body(Vec::new())?;
        let last = match client.request_text(req).await {
            Ok(_) => return Ok(()),
            Err(e) => e.to_string(),
        };
        if start.elapsed() > READY_LIMIT {
            return Err(Error::Timeout {
                what: "kube-apiserver not ready".into(),
                limit: READY_LIMIT,
                last: Some(last),
                log_tail: Some(apiserver.tail()),
            });
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One HTTP/1.1 request to etcd's JSON gateway.
async fn etcd_request(addr: SocketAddr, req: http::Request<String>) -> Result<Value> {
    let fut = async {
        let tcp = tokio::net::TcpStream::connect(addr)
            .await
            .map_err(|e| Error::io(format!("connecting to etcd at {addr}"), e))?;
        let http = |what| move |source| Error::Http { what, source };
        let (mut send, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp))
                .await
                .map_err(http("etcd handshake"))?;
        tokio::spawn(conn);
        let resp = send.send_request(req).await.map_err(http("etcd request"))?;
        let status = resp.status();
        let body = http_body_util::BodyExt::collect(resp.into_body())
            .await
            .map_err(http("etcd answer"))?
            .to_bytes();
        if !status.is_success() {
            return Err(Error::Etcd {
                status,
                body: String::from_utf8_lossy(&body).into_owned(),
            });
        }
        serde_json::from_slice(&body).map_err(|e| Error::json("etcd answer", e))
    };
    tokio::time::timeout(Duration::from_secs(10), fut)
        .await
        .map_err(|_| Error::EtcdTimeout)?
}

async fn etcd_get(addr: SocketAddr, path: &str) -> Result<Value> {
    let req = http::Request::get(path)
        .header("host", addr.to_string())
        .body(String::new())?;
    etcd_request(addr, req).await
}

async fn etcd_post(addr: SocketAddr, path: &str, body: &Value) -> Result<Value> {
    let req = http::Request::post(path)
        .header("host", addr.to_string())
        .header("content-type", "application/json")
        .body(body.to_string())?;
    etcd_request(addr, req).await
}
