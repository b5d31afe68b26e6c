//! Stage 2, validated: what [`super::parse_config`] returns. Every key
//! checked, `${VAR}`s expanded, defaults applied, values typed (a port is a
//! `u16`, a selector is compiled, a token is a [`Secret`]). This is the file's
//! meaning, as `render --config` and the chart tests read it; what `run`
//! starts is [`super::Plan`], resolved from it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Value, json};

use super::duration::format_duration;
use super::secret::{REDACTED, Secret};
use crate::crd::{NamespaceMode, ObjectNaming};
use crate::index::Index;
use crate::model::SourceKind;
use crate::source::convert::{ConvertOptions, Drain};
use crate::source::filter::{LabelSelector, NamespaceFilter};

/// Default `client.token_file` (single cluster).
pub const DEFAULT_TOKEN_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
/// Default `service.ca_file` (single cluster, in-cluster host).
pub const DEFAULT_CA_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
/// Default `default_weight`.
pub const DEFAULT_WEIGHT: u32 = 50;
/// Default `kube_discovery.sinks.configmap.name`.
pub const DEFAULT_CONFIGMAP_NAME: &str = "kube-discovery-nodes";

// ---------------------------------------------------------------- discovery.kubernetes

/// `http` or `https`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schema {
    /// Plain HTTP.
    Http,
    /// HTTPS.
    Https,
}

impl Schema {
    /// `"http"` / `"https"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Schema::Http => "http",
            Schema::Https => "https",
        }
    }
}

/// The bearer token of a [`Connection::Service`]: APISIX's `client.token`
/// or `client.token_file`, exactly one of them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credentials {
    /// Inline bearer token (whitespace stripped).
    Token(Secret),
    /// Bearer token file, re-read when it changes.
    TokenFile(PathBuf),
}

/// How to reach one API server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Connection {
    /// APISIX `service` + `client` (all `${VAR}`s expanded, defaults applied).
    Service {
        /// `http` or `https`.
        schema: Schema,
        /// IPv4, IPv6 (without brackets) or DNS name.
        host: String,
        /// Port.
        port: u16,
        /// Verify the server certificate (default true).
        ssl_verify: bool,
        /// CA bundle to trust (default: the ServiceAccount CA for in-cluster).
        ca_file: Option<PathBuf>,
        /// The bearer token.
        credentials: Credentials,
    },
    /// A kubeconfig (`path: None` = `KUBECONFIG` / `~/.kube/config`).
    Kubeconfig {
        /// The file.
        path: Option<PathBuf>,
        /// The context (default: current-context).
        context: Option<String>,
    },
}

/// One validated `discovery.kubernetes` entry.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// Cluster id (`""` in single-cluster mode).
    pub id: String,
    /// How to connect.
    pub connection: Connection,
    /// Compiled `namespace_selector`.
    pub namespace_selector: NamespaceFilter,
    /// Parsed `label_selector` (empty = everything).
    pub label_selector: LabelSelector,
    /// `default_weight`.
    pub default_weight: u32,
    /// `shared_size` as written (accepted for compatibility, unused).
    pub shared_size: Option<String>,
    /// `watch_endpoint_slices` as written: `Some(true)` watches
    /// EndpointSlices, `Some(false)` or unset (`None`) Endpoints.
    pub watch_endpoint_slices: Option<bool>,
}

impl ClusterConfig {
    /// The source kind this cluster watches.
    pub fn source(&self) -> SourceKind {
        if self.watch_endpoint_slices == Some(true) {
            SourceKind::EndpointSlice
        } else {
            SourceKind::Endpoints
        }
    }

    /// Conversion options for this cluster.
    pub fn convert_options(&self, settings: &Settings) -> ConvertOptions {
        ConvertOptions {
            default_weight: self.default_weight,
            drain_terminating: settings.drain_terminating,
            index_port_numbers: settings.index_port_numbers,
            topology: settings.topology,
            service_port_aliases: settings.service_port_aliases,
            export_opt_in: settings.export_opt_in,
            external_name: settings.external_name.clone(),
        }
    }

    /// An empty [`Index`] configured for this cluster (filters included).
    pub fn new_index(&self, settings: &Settings) -> Index {
        Index::new(
            self.id.clone(),
            self.source(),
            self.convert_options(settings),
            self.namespace_selector.clone(),
        )
        .with_label_selector(self.label_selector.clone())
    }

    /// The APISIX-shaped config of this cluster with secrets redacted (for the dump API).
    pub fn redacted_json(&self) -> Value {
        let mut v = json!({
            "default_weight": self.default_weight,
            "watch_endpoint_slices": self.source() == SourceKind::EndpointSlice,
        });
        if !self.id.is_empty() {
            v["id"] = json!(self.id);
        }
        match &self.connection {
            Connection::Service {
                schema,
                host,
                port,
                ssl_verify,
                ca_file,
                credentials,
            } => {
                v["service"] = json!({"schema": schema.as_str(), "host": host, "port": port, "ssl_verify": ssl_verify});
                if let Some(ca) = ca_file {
                    v["service"]["ca_file"] = json!(ca.display().to_string());
                }
                v["client"] = match credentials {
                    Credentials::Token(_) => json!({"token": REDACTED}),
                    Credentials::TokenFile(f) => json!({"token_file": f.display().to_string()}),
                };
            }
            Connection::Kubeconfig { path, context } => {
                if let Some(p) = path {
                    v["kubeconfig"] = json!(p.display().to_string());
                }
                if let Some(c) = context {
                    v["context"] = json!(c);
                }
            }
        }
        let ns = self.namespace_selector.to_json();
        if !ns.is_null() {
            v["namespace_selector"] = ns;
        }
        if !self.label_selector.is_empty() {
            v["label_selector"] = json!(self.label_selector.as_str());
        }
        if let Some(s) = &self.shared_size {
            v["shared_size"] = json!(s);
        }
        v
    }
}

// ---------------------------------------------------------------- kube_discovery

/// `kube_discovery.http`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpSettings {
    /// Listen address.
    pub addr: SocketAddr,
    /// Bearer token file protecting the dump and nodes APIs (re-read while
    /// running).
    pub auth_token_file: Option<PathBuf>,
}

/// `kube_discovery.xds` (None: off): the xDS (ADS) server every replica
/// runs for Envoy and proxyless gRPC clients.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdsSettings {
    /// Listen address (never the HTTP server's).
    pub addr: SocketAddr,
    /// Bearer token file clients send as `authorization: Bearer <token>`
    /// gRPC metadata (`None`: no authentication).
    pub auth_token_file: Option<PathBuf>,
    /// TLS (`None`: plaintext).
    pub tls: Option<XdsTls>,
}

/// `kube_discovery.xds.cert_file`/`key_file`/`client_ca_file`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XdsTls {
    /// PEM certificate chain of the server.
    pub cert_file: PathBuf,
    /// PEM private key of the server.
    pub key_file: PathBuf,
    /// PEM CA bundle client certificates must chain to (`Some`: mTLS,
    /// a client without a valid certificate is refused).
    pub client_ca_file: Option<PathBuf>,
}

/// `kube_discovery.sinks.discoveredservices`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveredServicesSink {
    /// Write DiscoveredServices (`false` is valid in the file, for `render`,
    /// but refused by [`super::Config::resolve`]: it is the only sink).
    pub enabled: bool,
    /// Where and under which names: `namespace_mode: source`, or `fixed`
    /// with its namespace.
    pub naming: ObjectNaming,
}

/// `kube_discovery.sinks.configmap` when enabled: its namespace and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigMapSink {
    /// Namespace of the ConfigMaps.
    pub namespace: String,
    /// Name of the index ConfigMap; shards are `<name>-<i>`.
    pub name: String,
}

/// `kube_discovery.sinks`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sinks {
    /// DiscoveredService objects.
    pub discoveredservices: DiscoveredServicesSink,
    /// ConfigMap snapshot (`None`: disabled).
    pub configmap: Option<ConfigMapSink>,
}

/// `kube_discovery.home`: where objects are written in multi-cluster mode.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HomeCluster {
    /// Kubeconfig path (`None` = in-cluster / default).
    pub kubeconfig: Option<PathBuf>,
    /// Context.
    pub context: Option<String>,
}

/// `kube_discovery.leader_election` as configured (all keys have defaults,
/// so every value is valid whether or not it is enabled).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderElection {
    /// Enabled.
    pub enabled: bool,
    /// Lease name.
    pub lease_name: String,
    /// Lease namespace (`None`: the runtime's own namespace).
    pub lease_namespace: Option<String>,
    /// Lease duration.
    pub lease_duration: Duration,
    /// Renew deadline (`None`: 2/3 of the lease duration, as client-go).
    pub renew_deadline: Option<Duration>,
    /// Retry period (`None`: 2/15 of the lease duration, as client-go).
    pub retry_period: Option<Duration>,
}

/// The `kube_discovery:` block, defaults applied.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Per-key coalescing window (leading and trailing edge).
    pub coalesce_window: Duration,
    /// A change after a quiet window is written at once (`false`: every
    /// change waits the window).
    pub coalesce_leading_edge: bool,
    /// Serving+terminating endpoints: off, fallback or always.
    pub drain_terminating: Drain,
    /// Index named ports under their number too.
    pub index_port_numbers: bool,
    /// Topology fields on nodes.
    pub topology: bool,
    /// Service-port aliases (`ns/name:80` for the port key `http`).
    pub service_port_aliases: bool,
    /// `export: opt-in`: only Services annotated `kubediscovery.io/export: "true"`.
    pub export_opt_in: bool,
    /// `external_name`: `Some(allow)` when enabled.
    pub external_name: Option<Vec<crate::source::filter::AnchoredRegex>>,
    /// Server-side watch timeout.
    pub watch_timeout: Duration,
    /// The longest an API request waits for the server to send anything
    /// (the client's read timeout; watches are renewed within it).
    pub request_timeout: Duration,
    /// A cluster whose watch has failed for longer than this makes
    /// `/readyz` fail.
    pub unready_after: Duration,
    /// The most a graceful shutdown (SIGTERM) may take.
    pub shutdown_timeout: Duration,
    /// Concurrent writes.
    pub write_concurrency: usize,
    /// The ceiling of the adaptive write rate limit (writes per second).
    pub write_qps: f64,
    /// Where the adaptive write rate limit starts (writes per second;
    /// at most `write_qps`).
    pub write_qps_start: f64,
    /// HTTP server.
    pub http: HttpSettings,
    /// xDS server (`None`: off).
    pub xds: Option<XdsSettings>,
    /// Sinks.
    pub sinks: Sinks,
    /// Home cluster (multi-cluster mode).
    pub home: HomeCluster,
    /// Leader election.
    pub leader_election: LeaderElection,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            coalesce_window: Duration::from_millis(100),
            coalesce_leading_edge: true,
            drain_terminating: Drain::Off,
            index_port_numbers: false,
            topology: false,
            service_port_aliases: false,
            export_opt_in: false,
            external_name: None,
            watch_timeout: Duration::from_secs(290),
            request_timeout: Duration::from_secs(10),
            unready_after: Duration::from_secs(60),
            // Below the chart's terminationGracePeriodSeconds (30).
            shutdown_timeout: Duration::from_secs(20),
            // 8 in flight could not keep up with 500 changes/s (churn p99
            // 3.1 s vs 0.14 s with 32, BENCHMARKS.md); the adaptive limiter
            // is the throttle on the API server.
            write_concurrency: 32,
            // The limiter starts at the old fixed limit (known safe) and grows
            // while writes succeed; it halves on a 429. The ceiling allows a
            // 10,000-service first sync in seconds where the server takes it
            // (BENCHMARKS.md, issue 19 item 4); a server that cannot take it
            // says so with 429s.
            write_qps: crate::write_plan::limiter::RateOptions::default().ceiling,
            write_qps_start: crate::write_plan::limiter::RateOptions::default().start,
            http: HttpSettings {
                addr: SocketAddr::from(([0, 0, 0, 0], 8080)),
                auth_token_file: None,
            },
            xds: None,
            sinks: Sinks {
                discoveredservices: DiscoveredServicesSink {
                    enabled: true,
                    naming: ObjectNaming::source(),
                },
                configmap: None,
            },
            home: HomeCluster::default(),
            leader_election: LeaderElection {
                enabled: false,
                lease_name: "kube-discovery".to_string(),
                lease_namespace: None,
                lease_duration: Duration::from_secs(15),
                renew_deadline: None,
                retry_period: None,
            },
        }
    }
}

impl Settings {
    fn redacted_json(&self) -> Value {
        let naming = &self.sinks.discoveredservices.naming;
        let (mode, ns) = match &naming.namespace_mode {
            NamespaceMode::Source => ("source", None),
            NamespaceMode::Fixed(n) => ("fixed", Some(n.clone())),
        };
        let configmap = match &self.sinks.configmap {
            Some(cm) => json!({"enabled": true, "namespace": cm.namespace, "name": cm.name}),
            None => json!({"enabled": false, "namespace": null, "name": DEFAULT_CONFIGMAP_NAME}),
        };
        json!({
            "instance": naming.instance,
            "adopt_instances": naming.adopt,
            "coalesce_window": format_duration(self.coalesce_window),
            "coalesce_leading_edge": self.coalesce_leading_edge,
            "drain_terminating": self.drain_terminating.to_json(),
            "index_port_numbers": self.index_port_numbers,
            "topology": self.topology,
            "service_port_aliases": self.service_port_aliases,
            "export": if self.export_opt_in { "opt-in" } else { "all" },
            "external_name": {
                "enabled": self.external_name.is_some(),
                "allow": self.external_name.iter().flatten().map(|r| r.pattern()).collect::<Vec<_>>(),
            },
            "watch_timeout": format_duration(self.watch_timeout),
            "request_timeout": format_duration(self.request_timeout),
            "unready_after": format_duration(self.unready_after),
            "shutdown_timeout": format_duration(self.shutdown_timeout),
            "write_concurrency": self.write_concurrency,
            "write_qps": self.write_qps,
            "write_qps_start": self.write_qps_start,
            "http": {"addr": self.http.addr.to_string(),
                     "auth_token_file": self.http.auth_token_file.as_ref().map(|p| p.display().to_string())},
            "xds": self.xds.as_ref().map(|x| {
                let tls = x.tls.as_ref();
                let path = |p: Option<&PathBuf>| p.map(|p| p.display().to_string());
                json!({"addr": x.addr.to_string(),
                       "auth_token_file": path(x.auth_token_file.as_ref()),
                       "cert_file": path(tls.map(|t| &t.cert_file)),
                       "key_file": path(tls.map(|t| &t.key_file)),
                       "client_ca_file": path(tls.and_then(|t| t.client_ca_file.as_ref()))})
            }),
            "sinks": {
                "discoveredservices": {"enabled": self.sinks.discoveredservices.enabled, "namespace_mode": mode, "namespace": ns},
                "configmap": configmap,
            },
            "home": {"kubeconfig": self.home.kubeconfig.as_ref().map(|p| p.display().to_string()), "context": self.home.context},
            "leader_election": {"enabled": self.leader_election.enabled, "lease_name": self.leader_election.lease_name,
                                "lease_namespace": self.leader_election.lease_namespace,
                                "lease_duration": format_duration(self.leader_election.lease_duration),
                                "renew_deadline": self.leader_election.renew_deadline.map(format_duration),
                                "retry_period": self.leader_election.retry_period.map(format_duration)},
        })
    }
}

// ---------------------------------------------------------------- the whole file

/// The whole validated configuration.
///
/// `multi_cluster` + `clusters` is the file's layout (one entry, id `""`, or
/// a list with ids); [`super::Plan`] holds it as an enum.
#[derive(Debug, Clone)]
pub struct Config {
    /// `true` when `discovery.kubernetes` is a list.
    pub multi_cluster: bool,
    /// The clusters, in file order (exactly one in single-cluster mode).
    pub clusters: Vec<ClusterConfig>,
    /// Our own settings.
    pub settings: Settings,
}

impl Config {
    /// The effective configuration as JSON with every token replaced by
    /// `"<redacted>"`: `{"discovery": {"kubernetes": <object or list>}, "kube_discovery": {...}}`.
    pub fn redacted_json(&self) -> Value {
        json!({
            "discovery": {"kubernetes": self.kubernetes_redacted_json()},
            "kube_discovery": self.settings.redacted_json(),
        })
    }

    /// Only the `discovery.kubernetes` part (object or list, as configured),
    /// redacted; the dump API's `config`.
    pub fn kubernetes_redacted_json(&self) -> Value {
        let list: Vec<Value> = self
            .clusters
            .iter()
            .map(ClusterConfig::redacted_json)
            .collect();
        if self.multi_cluster {
            Value::Array(list)
        } else {
            list.into_iter().next().unwrap_or(Value::Null)
        }
    }

    /// Cluster by id (`""` in single-cluster mode).
    pub fn cluster(&self, id: &str) -> Option<&ClusterConfig> {
        self.clusters.iter().find(|c| c.id == id)
    }
}
