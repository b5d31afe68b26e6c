//! Stage 3, resolved: [`Config`] + the command line's [`Overrides`]
//! ─[`Config::resolve`]─▶ [`Plan`], what `kube-discovery run` starts. The
//! rules here are the ones only `run` needs (`render --config` accepts a file
//! that breaks them); what needs I/O (reading `http.auth_token_file`, the
//! pod's namespace and identity) is left to the runtime. They are
//! hand-written rather than garde rules: each compares settings of different
//! blocks, or the file with the command line, on the validated values.
//!
//! The types hold no invalid combination:
//!
//! | in the file | in the plan |
//! |---|---|
//! | `discovery.kubernetes` object or list, `kube_discovery.home` | [`Clusters::Single`] (writes where it reads) or [`Clusters::Multi`] with its `home` |
//! | `sinks.discoveredservices.enabled/namespace_mode/namespace` | always on (`enabled: false` is refused): [`ObjectNaming`], `Source` or `Fixed(namespace)` |
//! | `sinks.configmap.enabled/namespace/name` | `Option<`[`ConfigMapSink`]`>`: namespace and a name of at most [`MAX_CONFIGMAP_NAME_LEN`] |
//! | `leader_election.enabled/lease_duration/renew_deadline/retry_period` | `Option<`[`LeasePlan`]`>` with effective, ordered [`LeaseTimings`] |
//! | `xds.addr/auth_token_file/cert_file/key_file/client_ca_file` | `Option<`[`XdsSettings`]`>`: an address the HTTP server (`--http-addr` applied) does not take, TLS only with a certificate and its key |
//! | `service`/`client` or `kubeconfig`/`context`, `--kubeconfig` | [`Connection`] (override applied), a token XOR a token file ([`super::Credentials`]) |

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;

use super::error::{ConfigErrors, Errors};
use super::raw::KUBERNETES;
use super::rules::addrs_conflict;
use super::validated::{
    ClusterConfig, Config, ConfigMapSink, Connection, HttpSettings, XdsSettings,
};
use crate::crd::{NamespaceMode, ObjectNaming};
use crate::index::Index;
use crate::model::{ServiceKey, SourceKind};
use crate::source::convert::ConvertOptions;
use crate::source::filter::{LabelSelector, NamespaceFilter};

/// Longest `kube_discovery.sinks.configmap.name`: `<name>-<i>.json` must
/// stay a valid ConfigMap name and data key.
pub const MAX_CONFIGMAP_NAME_LEN: usize = 240;

/// What the command line changes (`kube-discovery run --http-addr --kubeconfig`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// Replaces `kube_discovery.http.addr`.
    pub http_addr: Option<SocketAddr>,
    /// Replaces the connection of the (single) cluster; refused in
    /// multi-cluster mode.
    pub kubeconfig: Option<PathBuf>,
}

/// What `run` starts.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The watched clusters and where objects are written.
    pub clusters: Clusters,
    /// Server-side watch timeout.
    pub watch_timeout: Duration,
    /// The client's read timeout of every API request
    /// (`kube_discovery.request_timeout`).
    pub request_timeout: Duration,
    /// How long a cluster's watch may fail before `/readyz` does
    /// (`kube_discovery.unready_after`).
    pub unready_after: Duration,
    /// The deadline of a graceful shutdown (`kube_discovery.shutdown_timeout`).
    pub shutdown_timeout: Duration,
    /// The DiscoveredServices sink (always on): where and under which names.
    pub discoveredservices: ObjectNaming,
    /// The ConfigMap snapshot sink, when enabled.
    pub configmap: Option<ConfigMapSink>,
    /// The writer's pace.
    pub writes: Writes,
    /// HTTP server (`--http-addr` applied).
    pub http: HttpSettings,
    /// xDS server (`None`: off); on every replica, leader or not.
    pub xds: Option<XdsSettings>,
    /// Leader election, when enabled.
    pub leader_election: Option<LeasePlan>,
    /// `discovery.kubernetes` as configured (before overrides), tokens
    /// redacted: the dump API's `config`.
    pub redacted_config: Value,
}

impl Plan {
    /// The one namespace that holds every DiscoveredService of this
    /// controller, when there is one: a single cluster whose
    /// `namespace_selector` is `equal: ns` writes to `ns` (`namespace_mode:
    /// source`) or to the fixed namespace. The start-up list and the drift
    /// watch of our objects are then namespaced requests too, so the whole
    /// controller runs with Roles (the chart's `rbac.namespaced`). `None`:
    /// cluster-wide (any other selector, or several clusters).
    pub fn home_namespace(&self) -> Option<&str> {
        let Clusters::Single(c) = &self.clusters else {
            return None;
        };
        let watched = c.watch_namespace()?;
        Some(match &self.discoveredservices.namespace_mode {
            NamespaceMode::Source => watched,
            NamespaceMode::Fixed(ns) => ns,
        })
    }
}

/// Single or multi cluster.
#[derive(Debug, Clone)]
pub enum Clusters {
    /// One cluster (id `""`); DiscoveredServices go to the same API server.
    Single(ClusterPlan),
    /// Several clusters, each with its id; DiscoveredServices go to `home`.
    Multi {
        /// In file order.
        clusters: Vec<ClusterPlan>,
        /// `kube_discovery.home` (a kubeconfig; unset = in-cluster / default).
        home: Connection,
    },
}

impl Clusters {
    /// Every watched cluster, in file order.
    pub fn iter(&self) -> impl Iterator<Item = &ClusterPlan> {
        match self {
            Clusters::Single(c) => std::slice::from_ref(c).iter(),
            Clusters::Multi { clusters, .. } => clusters.iter(),
        }
    }

    /// Where DiscoveredServices (and the snapshot, and the Lease) are written.
    pub fn home(&self) -> &Connection {
        match self {
            Clusters::Single(c) => &c.connection,
            Clusters::Multi { home, .. } => home,
        }
    }
}

/// One watched cluster.
#[derive(Debug, Clone)]
pub struct ClusterPlan {
    /// Cluster id (`""` single cluster).
    pub id: String,
    /// How to connect (`--kubeconfig` applied).
    pub connection: Connection,
    /// Endpoints or EndpointSlices.
    pub source: SourceKind,
    /// `namespace_selector`.
    pub namespace_selector: NamespaceFilter,
    /// `label_selector`.
    pub label_selector: LabelSelector,
    /// Conversion options.
    pub convert: ConvertOptions,
    /// Also watch Services for their UIDs: Endpoints carry no
    /// ownerReferences, and only objects of a single cluster in source mode
    /// may carry one.
    pub watch_services: bool,
}

impl ClusterPlan {
    /// The label selector sent to the API server (`None`: everything).
    pub fn server_label_selector(&self) -> Option<String> {
        (!self.label_selector.is_empty()).then(|| self.label_selector.as_str().to_string())
    }

    /// The namespace the source watches are limited to (`namespace_selector:
    /// {equal: ns}`): they are then namespaced requests, so a Role in that
    /// namespace is enough RBAC. `None`: cluster-wide requests.
    pub fn watch_namespace(&self) -> Option<&str> {
        self.namespace_selector.single_namespace()
    }

    /// The field selector sent to the API server (`metadata.namespace=`/`!=`).
    pub fn server_field_selector(&self) -> Option<String> {
        self.namespace_selector.field_selector()
    }

    /// An empty [`Index`] configured for this cluster (filters included).
    pub fn new_index(&self) -> Index {
        Index::new(
            self.id.clone(),
            self.source,
            self.convert.clone(),
            self.namespace_selector.clone(),
        )
        .with_label_selector(self.label_selector.clone())
    }
}

/// The writer's pace.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Writes {
    /// Writes of a service start at least this far apart; a change after a
    /// quiet window is written at once (also the snapshot's rounds).
    pub coalesce_window: Duration,
    /// Whether a change after a quiet window is written at once (`false`:
    /// every change waits the window).
    pub coalesce_leading_edge: bool,
    /// Concurrent writes.
    pub concurrency: usize,
    /// The adaptive rate limit's ceiling (writes per second).
    pub qps: f64,
    /// Where the adaptive rate limit starts (writes per second, at most
    /// `qps`).
    pub start_qps: f64,
}

/// An enabled leader election.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeasePlan {
    /// Lease name.
    pub name: String,
    /// Lease namespace (`None`: the runtime's own namespace).
    pub namespace: Option<String>,
    /// Effective timings.
    pub timings: LeaseTimings,
}

/// Lease timings, `retry_period < renew_deadline < duration`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseTimings {
    /// Lease duration (`leaseDurationSeconds`).
    pub duration: Duration,
    /// The leader stops leading when it could not renew for this long.
    pub renew_deadline: Duration,
    /// Time between rounds (acquire or renew).
    pub retry_period: Duration,
}

impl LeaseTimings {
    /// client-go's proportions (15 s / 10 s / 2 s) scaled to `duration` (at
    /// least 1 s): renew deadline 2/3, retry period 2/15 of it (at least 100 ms).
    pub fn client_go(duration: Duration) -> Self {
        let duration = duration.max(Duration::from_secs(1));
        Self {
            duration,
            renew_deadline: duration.mul_f64(2.0 / 3.0),
            retry_period: duration.mul_f64(2.0 / 15.0).max(Duration::from_millis(100)),
        }
    }

    /// Checks `retry_period < renew_deadline < duration`; the error (for
    /// `kube_discovery.leader_election`) names the values.
    pub fn check(&self) -> Result<(), String> {
        if self.renew_deadline >= self.duration {
            return Err(format!(
                "renew deadline {:?} must be shorter than lease_duration {:?}",
                self.renew_deadline, self.duration
            ));
        }
        if self.retry_period >= self.renew_deadline {
            return Err(format!(
                "retry period {:?} must be shorter than the renew deadline {:?}",
                self.retry_period, self.renew_deadline
            ));
        }
        Ok(())
    }
}

impl Config {
    /// Resolves the validated configuration and the command line's
    /// overrides into what `run` starts; every problem is reported.
    pub fn resolve(&self, overrides: &Overrides) -> Result<Plan, ConfigErrors> {
        let mut errors = Errors::default();
        let s = &self.settings;
        if !s.sinks.discoveredservices.enabled {
            errors.push(
                "kube_discovery.sinks.discoveredservices.enabled",
                "false is not supported by this version (it is the only sink)",
            );
        }
        if let Some(cm) = &s.sinks.configmap
            && cm.name.len() > MAX_CONFIGMAP_NAME_LEN
        {
            errors.push(
                "kube_discovery.sinks.configmap.name",
                format!(
                    "at most {MAX_CONFIGMAP_NAME_LEN} characters (shards are named <name>-<i>), got {}",
                    cm.name.len()
                ),
            );
        }
        let leader_election = s.leader_election.enabled.then(|| {
            let le = &s.leader_election;
            let mut timings = LeaseTimings::client_go(le.lease_duration);
            if let Some(d) = le.renew_deadline {
                timings.renew_deadline = d;
            }
            if let Some(d) = le.retry_period {
                timings.retry_period = d;
            }
            LeasePlan {
                name: le.lease_name.clone(),
                namespace: le.lease_namespace.clone(),
                timings,
            }
        });
        if let Some(le) = &leader_election
            && let Err(m) = le.timings.check()
        {
            errors.push("kube_discovery.leader_election", m);
        }
        if self.multi_cluster && overrides.kubeconfig.is_some() {
            errors.push(
                "--kubeconfig",
                "only valid in single-cluster mode (use discovery.kubernetes[].kubeconfig and kube_discovery.home)",
            );
        }
        let http_addr = overrides.http_addr.unwrap_or(s.http.addr);
        if let (Some(o), Some(x)) = (overrides.http_addr, &s.xds)
            && addrs_conflict(o, x.addr)
        {
            errors.push(
                "--http-addr",
                format!(
                    "{o} conflicts with kube_discovery.xds.addr {} (the same port on the same or every address); the two servers need different ports",
                    x.addr
                ),
            );
        }
        let clusters = self.resolve_clusters(overrides, &mut errors);
        let Some(clusters) = clusters else {
            return Err(ConfigErrors(errors.0));
        };
        errors.finish(Plan {
            clusters,
            watch_timeout: s.watch_timeout,
            request_timeout: s.request_timeout,
            unready_after: s.unready_after,
            shutdown_timeout: s.shutdown_timeout,
            discoveredservices: s.sinks.discoveredservices.naming.clone(),
            configmap: s.sinks.configmap.clone(),
            writes: Writes {
                coalesce_window: s.coalesce_window,
                coalesce_leading_edge: s.coalesce_leading_edge,
                concurrency: s.write_concurrency,
                qps: s.write_qps,
                start_qps: s.write_qps_start.min(s.write_qps),
            },
            http: HttpSettings {
                addr: http_addr,
                auth_token_file: s.http.auth_token_file.clone(),
            },
            xds: s.xds.clone(),
            leader_election,
            redacted_config: self.kubernetes_redacted_json(),
        })
    }

    /// `None` (reported) when the layout has no cluster to watch (a
    /// [`Config`] built by hand; [`super::parse_config`] never returns one).
    fn resolve_clusters(&self, overrides: &Overrides, errors: &mut Errors) -> Option<Clusters> {
        let s = &self.settings;
        let plan = |c: &ClusterConfig| ClusterPlan {
            id: c.id.clone(),
            connection: match &overrides.kubeconfig {
                Some(p) => Connection::Kubeconfig {
                    path: Some(p.clone()),
                    context: None,
                },
                None => c.connection.clone(),
            },
            source: c.source(),
            namespace_selector: c.namespace_selector.clone(),
            label_selector: c.label_selector.clone(),
            convert: c.convert_options(s),
            // Endpoints carry no ownerReferences: look the Services up, but
            // only where an object may carry one (single cluster, source mode).
            watch_services: c.source() == SourceKind::Endpoints
                && !self.multi_cluster
                && s.sinks
                    .discoveredservices
                    .naming
                    .owner_references_allowed(&ServiceKey::new(&c.id, "", "")),
        };
        match (self.multi_cluster, self.clusters.as_slice()) {
            (_, []) => {
                errors.push(KUBERNETES, "no cluster configured");
                None
            }
            (false, [c]) => Some(Clusters::Single(plan(c))),
            (false, _) => {
                errors.push(
                    KUBERNETES,
                    "more than one cluster needs the multi-cluster (list) form",
                );
                None
            }
            (true, list) => Some(Clusters::Multi {
                clusters: list.iter().map(plan).collect(),
                home: Connection::Kubeconfig {
                    path: s.home.kubeconfig.clone(),
                    context: s.home.context.clone(),
                },
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Credentials, parse_config};
    use super::*;
    use crate::crd::NamespaceMode;

    fn env(k: &str) -> Option<String> {
        match k {
            "KUBERNETES_SERVICE_HOST" => Some("10.96.0.1".into()),
            "KUBERNETES_SERVICE_PORT" => Some("443".into()),
            _ => None,
        }
    }

    const SINGLE: &str = "discovery:\n  kubernetes:\n    service: {schema: http, host: 127.0.0.1, port: 8001}\n    client: {token: abc}\n";
    const MULTI: &str = "discovery:\n  kubernetes:\n    - {id: a, kubeconfig: /a}\n    - {id: b, service: {host: h, port: 1}, client: {token_file: /t}}\n";

    fn resolve(text: &str, overrides: &Overrides) -> Result<Plan, String> {
        parse_config(text, &env)
            .unwrap_or_else(|e| panic!("{e}"))
            .resolve(overrides)
            .map_err(|e| e.to_string())
    }

    fn plan(text: &str) -> Plan {
        resolve(text, &Overrides::default()).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn single_cluster_writes_where_it_reads_and_the_override_replaces_the_connection() {
        let p = plan(SINGLE);
        let Clusters::Single(c) = &p.clusters else {
            panic!("{:?}", p.clusters)
        };
        assert_eq!(c.id, "");
        assert!(matches!(
            &c.connection,
            Connection::Service {
                credentials: Credentials::Token(_),
                ..
            }
        ));
        assert_eq!(p.clusters.home(), &c.connection);
        assert!(c.watch_services, "Endpoints, single cluster, source mode");
        assert_eq!(p.http.addr, "0.0.0.0:8080".parse().unwrap());
        assert!(p.configmap.is_none() && p.leader_election.is_none());

        let o = Overrides {
            http_addr: Some("127.0.0.1:9".parse().unwrap()),
            kubeconfig: Some("/kc".into()),
        };
        let p = resolve(SINGLE, &o).unwrap();
        let kc = Connection::Kubeconfig {
            path: Some("/kc".into()),
            context: None,
        };
        assert_eq!(p.clusters.iter().next().map(|c| &c.connection), Some(&kc));
        assert_eq!(p.clusters.home(), &kc);
        assert_eq!(p.http.addr, "127.0.0.1:9".parse().unwrap());
        assert!(
            !p.redacted_config.to_string().contains("/kc"),
            "as configured"
        );
    }

    #[test]
    fn multi_cluster_writes_home_and_refuses_the_kubeconfig_override() {
        let p = plan(&format!(
            "{MULTI}kube_discovery: {{home: {{context: home}}, sinks: {{discoveredservices: {{namespace_mode: fixed, namespace: kd}}}}}}\n"
        ));
        let Clusters::Multi { clusters, home } = &p.clusters else {
            panic!("{:?}", p.clusters)
        };
        let ids: Vec<_> = clusters.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
        assert_eq!(
            home,
            &Connection::Kubeconfig {
                path: None,
                context: Some("home".into())
            }
        );
        assert!(clusters.iter().all(|c| !c.watch_services));
        assert_eq!(
            p.discoveredservices.namespace_mode,
            NamespaceMode::Fixed("kd".into())
        );
        let o = Overrides {
            kubeconfig: Some("/k".into()),
            ..Overrides::default()
        };
        assert_eq!(
            resolve(MULTI, &o).unwrap_err(),
            "--kubeconfig: only valid in single-cluster mode (use discovery.kubernetes[].kubeconfig and kube_discovery.home)"
        );
    }

    #[test]
    fn run_only_rules_keep_their_messages() {
        let kd = |s: &str| format!("{SINGLE}kube_discovery:\n  {s}\n");
        let none = Overrides::default();
        assert_eq!(
            resolve(&kd("sinks: {discoveredservices: {enabled: false}}"), &none).unwrap_err(),
            "kube_discovery.sinks.discoveredservices.enabled: false is not supported by this version (it is the only sink)"
        );
        let long = "a".repeat(241);
        assert_eq!(
            resolve(
                &kd(&format!(
                    "sinks: {{configmap: {{enabled: true, namespace: kd, name: {long}}}}}"
                )),
                &none
            )
            .unwrap_err(),
            "kube_discovery.sinks.configmap.name: at most 240 characters (shards are named <name>-<i>), got 241"
        );
        let ok = plan(&kd(&format!(
            "sinks: {{configmap: {{enabled: true, namespace: kd, name: {}}}}}",
            "a".repeat(240)
        )));
        assert_eq!(ok.configmap.map(|c| c.namespace).as_deref(), Some("kd"));
        // A derived retry period (2/15 of 300 s) not shorter than a short
        // renew deadline: only the effective values show it.
        assert_eq!(
            resolve(
                &kd("leader_election: {enabled: true, lease_duration: 300s, renew_deadline: 1s}"),
                &none
            )
            .unwrap_err(),
            "kube_discovery.leader_election: retry period 40s must be shorter than the renew deadline 1s"
        );
        // Every problem is reported, one line each.
        let e = resolve(
            &format!(
                "{MULTI}kube_discovery: {{sinks: {{discoveredservices: {{enabled: false}}}}}}\n"
            ),
            &Overrides {
                kubeconfig: Some("/k".into()),
                ..Overrides::default()
            },
        )
        .unwrap_err();
        assert_eq!(e.lines().count(), 2, "{e}");
    }

    #[test]
    fn lease_timings_are_client_gos_or_the_configured_ones() {
        let base = |extra: &str| {
            format!(
                "{SINGLE}kube_discovery:\n  leader_election: {{enabled: true, lease_namespace: kd, lease_duration: 30s{extra}}}\n"
            )
        };
        let le = plan(&base("")).leader_election.unwrap();
        assert_eq!(
            (le.name.as_str(), le.namespace.as_deref()),
            ("kube-discovery", Some("kd"))
        );
        assert_eq!(
            le.timings,
            LeaseTimings {
                duration: Duration::from_secs(30),
                renew_deadline: Duration::from_secs(20),
                retry_period: Duration::from_secs(4)
            }
        );
        let le = plan(&base(", renew_deadline: 25s, retry_period: 1s"))
            .leader_election
            .unwrap();
        assert_eq!(
            (le.timings.renew_deadline, le.timings.retry_period),
            (Duration::from_secs(25), Duration::from_secs(1))
        );
        assert_eq!(
            LeaseTimings::client_go(Duration::ZERO).duration,
            Duration::from_secs(1)
        );
    }

    #[test]
    fn a_hand_built_config_without_a_cluster_is_refused() {
        let mut cfg = parse_config(SINGLE, &env).unwrap();
        cfg.clusters.clear();
        assert_eq!(
            cfg.resolve(&Overrides::default()).unwrap_err().to_string(),
            "discovery.kubernetes: no cluster configured"
        );
    }
}
