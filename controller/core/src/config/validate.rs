//! Stage 1 → 2: raw → validated. [`parse_config`] walks the file in order; for
//! each block it applies the defaults, expands `${VAR}`s, runs the garde
//! rules (reported at their field paths) and builds the typed values of
//! [`super::validated`].
//!
//! Hand-written, not garde, because they are not about one key: the
//! multi-cluster requirements (`service.host`/`port` required, no defaults)
//! depend on the form of the whole block and are checked before the defaults
//! that would hide them; duplicate cluster ids compare list entries; the
//! leader election ordering compares effective values, some of them derived
//! from another key.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use garde::Validate;

use super::duration::{format_duration, parse_duration};
use super::error::{ConfigErrors, Errors};
use super::raw::{
    self, KUBE_DISCOVERY, KUBERNETES, RawClient, RawCluster, RawDocument, RawExternalName,
    RawKubernetes, RawService, RawSettings, RawXds,
};
use super::rules::{Ctx, addrs_conflict, drain_of, strip_ws};
use super::secret::Secret;
use super::validated::{
    ClusterConfig, Config, ConfigMapSink, Connection, Credentials, DEFAULT_CA_FILE,
    DEFAULT_CONFIGMAP_NAME, DEFAULT_TOKEN_FILE, DEFAULT_WEIGHT, DiscoveredServicesSink,
    HomeCluster, HttpSettings, LeaderElection, Schema, Settings, Sinks, XdsSettings, XdsTls,
};
use crate::crd::{DEFAULT_INSTANCE, ObjectNaming};
use crate::source::filter::{AnchoredRegex, LabelSelector, NamespaceFilter};

/// Parses and validates the configuration text. `env` looks up environment
/// variables for `${VAR}` expansion (pass `&|k| std::env::var(k).ok()`).
pub fn parse_config(
    yaml: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigErrors> {
    let mut errors = Errors::default();
    let Some(doc) = RawDocument::read(yaml, &mut errors) else {
        return Err(ConfigErrors(errors.0));
    };

    let mut multi_cluster = false;
    let mut clusters = Vec::new();
    match doc.kubernetes {
        None => {}
        Some(RawKubernetes::Empty) => clusters.push(validate_cluster(
            RawCluster::default(),
            KUBERNETES,
            false,
            env,
            &mut errors,
        )),
        Some(RawKubernetes::Single(v)) => {
            if let Some(raw) = raw::deserialize_at::<RawCluster>(v, KUBERNETES, &mut errors) {
                clusters.push(validate_cluster(raw, KUBERNETES, false, env, &mut errors));
            }
        }
        Some(RawKubernetes::Multi(items)) => {
            multi_cluster = true;
            if items.is_empty() {
                errors.push(KUBERNETES, "must list at least one cluster");
            }
            let mut seen = BTreeSet::new();
            for (i, item) in items.into_iter().enumerate() {
                let path = format!("{KUBERNETES}[{i}]");
                let Some(raw) = raw::cluster_item(item, &path, &mut errors) else {
                    continue;
                };
                if let Some(id) = &raw.id
                    && !seen.insert(id.clone())
                {
                    errors.push(format!("{path}.id"), format!("duplicate cluster id {id:?}"));
                }
                clusters.push(validate_cluster(raw, &path, true, env, &mut errors));
            }
        }
    }

    let settings = raw::settings(doc.kube_discovery, &mut errors)
        .map(|raw| validate_settings(raw, env, &mut errors));

    if !errors.is_empty() {
        return Err(ConfigErrors(errors.0));
    }
    let clusters: Vec<ClusterConfig> = clusters.into_iter().flatten().collect();
    match settings {
        Some(settings) => Ok(Config {
            multi_cluster,
            clusters,
            settings,
        }),
        None => Err(ConfigErrors(vec![super::ConfigError {
            path: KUBE_DISCOVERY.into(),
            message: "invalid".into(),
        }])),
    }
}

// ---------------------------------------------------------------- env expansion

/// Replaces every `${NAME}` in `s`; unset variables are errors (named, never
/// their values).
fn expand(
    s: &str,
    path: &str,
    env: &dyn Fn(&str) -> Option<String>,
    errors: &mut Errors,
    hint: &str,
) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let Some(end) = after.find('}') else {
            errors.push(path, "has an unterminated \"${\"");
            return s.to_string();
        };
        let name = &after[..end];
        let valid = name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !valid {
            errors.push(
                path,
                format!("\"${{{name}}}\" is not a valid environment variable reference"),
            );
        } else {
            match env(name) {
                Some(v) => out.push_str(&v),
                None => errors.push(
                    path,
                    format!("environment variable {name} is not set{hint}"),
                ),
            }
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}

/// Expands `v` in place. On failure the error is recorded and the value is
/// replaced by `placeholder` (a value that passes validation), so that the
/// other fields are still validated and reported, without a second, confusing
/// error about the unexpanded text.
fn expand_opt(
    v: &mut Option<String>,
    path: &str,
    env: &dyn Fn(&str) -> Option<String>,
    errors: &mut Errors,
    hint: &str,
    placeholder: &str,
) {
    if let Some(s) = v.as_mut() {
        let before = errors.len();
        *s = expand(s, path, env, errors, hint);
        if errors.len() > before {
            *s = placeholder.to_string();
        }
    }
}

// ---------------------------------------------------------------- discovery.kubernetes

/// Applies defaults and `${VAR}` expansion, validates, and builds the cluster.
/// Returns `None` (with errors recorded) when invalid.
fn validate_cluster(
    mut raw: RawCluster,
    path: &str,
    multi: bool,
    env: &dyn Fn(&str) -> Option<String>,
    errors: &mut Errors,
) -> Option<ClusterConfig> {
    let before = errors.len();
    let kubeconfig_mode = raw.kubeconfig_mode();
    let mut in_cluster_host = false;
    // Defaults (single cluster, service mode only), before expansion.
    if !multi && !kubeconfig_mode {
        let svc = raw.service.get_or_insert_with(RawService::default);
        if svc.host.is_none() {
            svc.host = Some("${KUBERNETES_SERVICE_HOST}".into());
            in_cluster_host = true;
        }
        if svc.port.is_none() {
            svc.port = Some("${KUBERNETES_SERVICE_PORT}".into());
        }
        let client = raw.client.get_or_insert_with(RawClient::default);
        if client.token.is_none() && client.token_file.is_none() {
            client.token_file = Some(DEFAULT_TOKEN_FILE.into());
        }
    }
    if multi && !kubeconfig_mode {
        if let Some(svc) = &raw.service {
            if svc.host.is_none() {
                errors.push(
                    format!("{path}.service.host"),
                    "is required in the multi-cluster form",
                );
            }
            if svc.port.is_none() {
                errors.push(
                    format!("{path}.service.port"),
                    "is required in the multi-cluster form",
                );
            }
        } else {
            errors.push(
                format!("{path}.service"),
                "is required in the multi-cluster form (schema, host, port), or use kubeconfig/context",
            );
        }
    }
    // ${VAR} expansion.
    let in_cluster_hint = if in_cluster_host {
        " (in-cluster default; outside a pod set service.host/service.port or kubeconfig)"
    } else {
        ""
    };
    if let Some(svc) = raw.service.as_mut() {
        expand_opt(
            &mut svc.host,
            &format!("{path}.service.host"),
            env,
            errors,
            in_cluster_hint,
            "unset.invalid",
        );
        expand_opt(
            &mut svc.port,
            &format!("{path}.service.port"),
            env,
            errors,
            in_cluster_hint,
            "1",
        );
        expand_opt(
            &mut svc.ca_file,
            &format!("{path}.service.ca_file"),
            env,
            errors,
            "",
            "/unset",
        );
    }
    if let Some(client) = raw.client.as_mut() {
        if let Some(t) = client.token.as_mut() {
            let before_token = errors.len();
            let expanded = expand(t.expose(), &format!("{path}.client.token"), env, errors, "");
            *t = if errors.len() > before_token {
                Secret::new("unset")
            } else {
                Secret::new(strip_ws(&expanded))
            };
        }
        expand_opt(
            &mut client.token_file,
            &format!("{path}.client.token_file"),
            env,
            errors,
            "",
            "/unset",
        );
    }
    expand_opt(
        &mut raw.kubeconfig,
        &format!("{path}.kubeconfig"),
        env,
        errors,
        "",
        "/unset",
    );
    expand_opt(
        &mut raw.context,
        &format!("{path}.context"),
        env,
        errors,
        "",
        "unset",
    );
    if let Err(report) = raw.validate_with(&Ctx { multi }) {
        errors.report(path, report);
    }
    if errors.len() > before {
        return None;
    }
    build_cluster(raw, in_cluster_host)
}

fn build_cluster(raw: RawCluster, in_cluster_host: bool) -> Option<ClusterConfig> {
    let connection = if raw.kubeconfig_mode() {
        Connection::Kubeconfig {
            path: raw.kubeconfig.map(PathBuf::from),
            context: raw.context,
        }
    } else {
        let svc = raw.service.unwrap_or_default();
        let client = raw.client.unwrap_or_default();
        let schema = match svc.schema.as_deref() {
            Some("http") => Schema::Http,
            _ => Schema::Https,
        };
        let host = svc.host?;
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .map(str::to_string)
            .unwrap_or(host);
        let port = svc.port?.trim().parse::<u16>().ok()?;
        let ca_file = svc
            .ca_file
            .or_else(|| in_cluster_host.then(|| DEFAULT_CA_FILE.to_string()))
            .map(PathBuf::from);
        Connection::Service {
            schema,
            host,
            port,
            ssl_verify: svc.ssl_verify.unwrap_or(true),
            ca_file,
            // Exactly one of them (checked by `check_client`).
            credentials: match (client.token, client.token_file) {
                (Some(token), _) => Credentials::Token(token),
                (None, Some(file)) => Credentials::TokenFile(PathBuf::from(file)),
                (None, None) => return None,
            },
        }
    };
    let namespace_selector = match raw.namespace_selector {
        None => NamespaceFilter::All,
        Some(sel) => {
            let compile = |l: Vec<String>| {
                l.iter()
                    .map(|p| AnchoredRegex::new(p))
                    .collect::<Result<Vec<_>, _>>()
                    .ok()
            };
            if let Some(n) = sel.equal {
                NamespaceFilter::Equal(n)
            } else if let Some(n) = sel.not_equal {
                NamespaceFilter::NotEqual(n)
            } else if let Some(l) = sel.r#match {
                NamespaceFilter::Match(compile(l)?)
            } else {
                NamespaceFilter::NotMatch(compile(sel.not_match?)?)
            }
        }
    };
    let label_selector = LabelSelector::parse(raw.label_selector.as_deref().unwrap_or("")).ok()?;
    Some(ClusterConfig {
        id: raw.id.unwrap_or_default(),
        connection,
        namespace_selector,
        label_selector,
        default_weight: raw
            .default_weight
            .map_or(Some(DEFAULT_WEIGHT), |w| u32::try_from(w).ok())?,
        shared_size: raw.shared_size,
        watch_endpoint_slices: raw.watch_endpoint_slices,
    })
}

// ---------------------------------------------------------------- kube_discovery

fn validate_settings(
    mut raw: RawSettings,
    env: &dyn Fn(&str) -> Option<String>,
    errors: &mut Errors,
) -> Settings {
    if let Some(http) = raw.http.as_mut() {
        expand_opt(
            &mut http.auth_token_file,
            "kube_discovery.http.auth_token_file",
            env,
            errors,
            "",
            "/unset",
        );
    }
    if let Some(xds) = raw.xds.as_mut() {
        for (v, key) in [
            (&mut xds.auth_token_file, "auth_token_file"),
            (&mut xds.cert_file, "cert_file"),
            (&mut xds.key_file, "key_file"),
            (&mut xds.client_ca_file, "client_ca_file"),
        ] {
            expand_opt(
                v,
                &format!("kube_discovery.xds.{key}"),
                env,
                errors,
                "",
                "/unset",
            );
        }
    }
    if let Some(home) = raw.home.as_mut() {
        expand_opt(
            &mut home.kubeconfig,
            "kube_discovery.home.kubeconfig",
            env,
            errors,
            "",
            "/unset",
        );
        expand_opt(
            &mut home.context,
            "kube_discovery.home.context",
            env,
            errors,
            "",
            "unset",
        );
    }
    if let Err(report) = raw.validate() {
        errors.report(KUBE_DISCOVERY, report);
    }
    let external_name = match raw.external_name.take() {
        Some(RawExternalName {
            enabled: Some(true),
            allow,
        }) => {
            let allow = allow.unwrap_or_default();
            if allow.is_empty() {
                errors.push(
                    "kube_discovery.external_name.allow",
                    "must list at least one regex when external_name is enabled",
                );
            }
            // Invalid patterns were reported by `validate` above.
            Some(
                allow
                    .iter()
                    .filter_map(|p| AnchoredRegex::new(p).ok())
                    .collect(),
            )
        }
        _ => None,
    };
    let d = Settings::default();
    let dur = |v: &Option<String>, default: Duration| {
        v.as_deref()
            .and_then(|s| parse_duration(s).ok())
            .unwrap_or(default)
    };
    let http = raw.http.unwrap_or_default();
    let http = HttpSettings {
        addr: http
            .addr
            .and_then(|a| a.parse().ok())
            .unwrap_or(d.http.addr),
        auth_token_file: http.auth_token_file.map(PathBuf::from),
    };
    let xds = raw.xds.and_then(|x| xds_settings(x, &http, errors));
    let sinks = raw.sinks.unwrap_or_default();
    let ds = sinks.discoveredservices.unwrap_or_default();
    let cm = sinks.configmap.unwrap_or_default();
    let home = raw.home.unwrap_or_default();
    let le = raw.leader_election.unwrap_or_default();
    let lease_duration = dur(&le.lease_duration, d.leader_election.lease_duration);
    let parsed = |v: &Option<String>| v.as_deref().and_then(|s| parse_duration(s).ok());
    let (renew_deadline, retry_period) = (parsed(&le.renew_deadline), parsed(&le.retry_period));
    // The same proportions as client-go when unset; the ordering is checked
    // on the effective values, naming the key the user set.
    let renew = renew_deadline.unwrap_or(lease_duration * 2 / 3);
    let retry = retry_period.unwrap_or(lease_duration * 2 / 15);
    if renew_deadline.is_some() && renew >= lease_duration {
        errors.push(
            "kube_discovery.leader_election.renew_deadline",
            format!(
                "must be shorter than lease_duration ({})",
                format_duration(lease_duration)
            ),
        );
    }
    if retry_period.is_some() && retry >= renew {
        errors.push(
            "kube_discovery.leader_election.retry_period",
            format!(
                "must be shorter than the renew deadline ({})",
                format_duration(renew)
            ),
        );
    }
    Settings {
        coalesce_window: dur(&raw.coalesce_window, d.coalesce_window),
        coalesce_leading_edge: raw.coalesce_leading_edge.unwrap_or(d.coalesce_leading_edge),
        drain_terminating: raw
            .drain_terminating
            .as_ref()
            .and_then(drain_of)
            .unwrap_or(d.drain_terminating),
        index_port_numbers: raw.index_port_numbers.unwrap_or(d.index_port_numbers),
        topology: raw.topology.unwrap_or(d.topology),
        service_port_aliases: raw.service_port_aliases.unwrap_or(d.service_port_aliases),
        external_name,
        export_opt_in: raw
            .export
            .as_deref()
            .map_or(d.export_opt_in, |m| m == "opt-in"),
        watch_timeout: dur(&raw.watch_timeout, d.watch_timeout),
        request_timeout: dur(&raw.request_timeout, d.request_timeout),
        unready_after: dur(&raw.unready_after, d.unready_after),
        shutdown_timeout: dur(&raw.shutdown_timeout, d.shutdown_timeout),
        write_concurrency: raw
            .write_concurrency
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(d.write_concurrency),
        write_qps: raw.write_qps.unwrap_or(d.write_qps),
        write_qps_start: raw.write_qps_start.unwrap_or(d.write_qps_start),
        http,
        xds,
        sinks: Sinks {
            discoveredservices: DiscoveredServicesSink {
                enabled: ds.enabled.unwrap_or(true),
                naming: match (ds.namespace_mode.as_deref(), ds.namespace) {
                    (Some("fixed"), Some(ns)) => ObjectNaming::fixed(ns),
                    _ => ObjectNaming::source(),
                }
                .with_instance(
                    raw.instance
                        .clone()
                        .unwrap_or_else(|| DEFAULT_INSTANCE.to_string()),
                )
                .with_adopted(raw.adopt_instances.clone().unwrap_or_default()),
            },
            // Enabled without a namespace is reported by `check_cm_namespace`.
            configmap: match (cm.enabled.unwrap_or(false), cm.namespace) {
                (true, Some(namespace)) => Some(ConfigMapSink {
                    namespace,
                    name: cm
                        .name
                        .unwrap_or_else(|| DEFAULT_CONFIGMAP_NAME.to_string()),
                }),
                _ => None,
            },
        },
        home: HomeCluster {
            kubeconfig: home.kubeconfig.map(PathBuf::from),
            context: home.context,
        },
        leader_election: LeaderElection {
            enabled: le.enabled.unwrap_or(false),
            lease_name: le.lease_name.unwrap_or(d.leader_election.lease_name),
            lease_namespace: le.lease_namespace,
            lease_duration,
            renew_deadline,
            retry_period,
        },
    }
}

/// `kube_discovery.xds` (its keys already checked by the garde rules): `None`
/// without an `addr` (off) or when its `addr` is also the HTTP server's
/// (reported: one of the two servers could not listen).
fn xds_settings(raw: RawXds, http: &HttpSettings, errors: &mut Errors) -> Option<XdsSettings> {
    let addr: SocketAddr = raw.addr?.parse().ok()?;
    if addrs_conflict(addr, http.addr) {
        errors.push(
            "kube_discovery.xds.addr",
            format!(
                "{addr} conflicts with kube_discovery.http.addr {} (the same port on the same or every address); the two servers need different ports",
                http.addr
            ),
        );
    }
    let tls = match (raw.cert_file, raw.key_file) {
        (Some(cert), Some(key)) => Some(XdsTls {
            cert_file: PathBuf::from(cert),
            key_file: PathBuf::from(key),
            client_ca_file: raw.client_ca_file.map(PathBuf::from),
        }),
        _ => None,
    };
    Some(XdsSettings {
        addr,
        auth_token_file: raw.auth_token_file.map(PathBuf::from),
        tls,
    })
}
