//! Stage 1, raw: the file as written. serde types with APISIX's keys (every
//! field optional, unknown keys refused), and the walk from YAML text to them
//! whose errors name the field (`discovery.kubernetes[1].service: invalid type
//! ...`) and never echo a token.
//!
//! The garde attributes say which rule of [`super::rules`] applies to which
//! key; [`super::validate`] runs them after `${VAR}` expansion and defaults.

use std::time::Duration;

use garde::Validate;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use super::error::Errors;
use super::rules::{
    Ctx, check_adopt_instances, check_allow_regex, check_cm_namespace, check_concurrency,
    check_context, check_drain, check_duration, check_export, check_fixed_namespace, check_host,
    check_id, check_instance, check_kubeconfig, check_label_selector, check_namespace_mode,
    check_namespace_name, check_object_name, check_path_len, check_plain_context,
    check_plain_namespace, check_plain_path, check_port, check_qps, check_regex, check_regex_list,
    check_schema, check_shared_size, check_socket_addr, check_token, check_weight, check_xds_addr,
    check_xds_client_ca, check_xds_pair, err, strip_ws,
};
use super::secret::Secret;

// ---------------------------------------------------------------- the document

/// Path of the single-cluster block (and prefix of the list items).
pub(super) const KUBERNETES: &str = "discovery.kubernetes";
/// Path of our own block.
pub(super) const KUBE_DISCOVERY: &str = "kube_discovery";

/// `discovery.kubernetes` as written, its entries not yet deserialized (each
/// entry is deserialized and validated in turn, so problems are reported in
/// file order).
pub(super) enum RawKubernetes {
    /// `kubernetes:` without a value: single cluster, in-cluster defaults.
    Empty,
    /// One mapping: single cluster.
    Single(Value),
    /// A list: multi cluster.
    Multi(Vec<Value>),
}

/// The two blocks read from a file; every other key is ignored.
pub(super) struct RawDocument {
    /// `None`: missing or of the wrong type (reported).
    pub(super) kubernetes: Option<RawKubernetes>,
    /// `kube_discovery`, if present (its type is checked by [`settings`]).
    pub(super) kube_discovery: Option<Value>,
}

impl RawDocument {
    /// Finds the blocks; `None` (reported) if the text is not a YAML mapping.
    pub(super) fn read(yaml: &str, errors: &mut Errors) -> Option<Self> {
        let root: Value = match crate::yaml::from_str(yaml) {
            Ok(v) => v,
            Err(e) => {
                errors.push("config", format!("invalid YAML: {e}"));
                return None;
            }
        };
        let root = match root {
            Value::Object(m) => m,
            Value::Null => serde_json::Map::new(),
            _ => {
                errors.push(
                    "config",
                    "must be a YAML mapping with a discovery.kubernetes key",
                );
                return None;
            }
        };
        let missing = "is missing (use {} for in-cluster defaults)";
        let kubernetes = match root.get("discovery") {
            Some(Value::Object(d)) => match d.get("kubernetes") {
                Some(k) => Some(k.clone()),
                None => {
                    errors.push(KUBERNETES, missing);
                    None
                }
            },
            Some(_) => {
                errors.push("discovery", "must be a mapping");
                None
            }
            None => {
                errors.push(KUBERNETES, missing);
                None
            }
        };
        let kubernetes = match kubernetes {
            None => None,
            Some(Value::Null) => Some(RawKubernetes::Empty),
            Some(v @ Value::Object(_)) => Some(RawKubernetes::Single(v)),
            Some(Value::Array(items)) => Some(RawKubernetes::Multi(items)),
            Some(_) => {
                errors.push(
                    KUBERNETES,
                    "must be a mapping (single cluster) or a list of mappings with id (multi cluster)",
                );
                None
            }
        };
        Some(Self {
            kubernetes,
            kube_discovery: root.get(KUBE_DISCOVERY).cloned(),
        })
    }
}

/// A list entry of `discovery.kubernetes` at `path`; `None` (reported) if it
/// is not a mapping or does not deserialize.
pub(super) fn cluster_item(item: Value, path: &str, errors: &mut Errors) -> Option<RawCluster> {
    if !matches!(item, Value::Object(_)) {
        errors.push(path, "must be a mapping");
        return None;
    }
    deserialize_at(item, path, errors)
}

/// `kube_discovery` (absent or empty: all defaults); `None` (reported) if it
/// is not a mapping or does not deserialize.
pub(super) fn settings(value: Option<Value>, errors: &mut Errors) -> Option<RawSettings> {
    match value {
        None | Some(Value::Null) => Some(RawSettings::default()),
        Some(v @ Value::Object(_)) => deserialize_at(v, KUBE_DISCOVERY, errors),
        Some(_) => {
            errors.push(KUBE_DISCOVERY, "must be a mapping");
            None
        }
    }
}

/// Deserializes `value`; an error is reported at its field path below `prefix`.
pub(super) fn deserialize_at<T: serde::de::DeserializeOwned>(
    value: Value,
    prefix: &str,
    errors: &mut Errors,
) -> Option<T> {
    match serde_path_to_error::deserialize::<_, T>(value) {
        Ok(v) => Some(v),
        Err(e) => {
            let inner = e.path().to_string();
            let path = match inner.as_str() {
                "." => prefix.to_string(),
                p if p.starts_with('[') => format!("{prefix}{p}"),
                p => format!("{prefix}.{p}"),
            };
            // A key under `client` that is not one of ours may be a token typed
            // without its colon (`client: {token SECRET}`): cut the path there.
            let path = match path.find(".client.") {
                Some(i) => {
                    let rest = &path[i + ".client.".len()..];
                    let key = rest.split(['.', '[']).next().unwrap_or_default();
                    if key == "token" || key == "token_file" {
                        path
                    } else {
                        path[..i + ".client".len()].to_string()
                    }
                }
                None => path,
            };
            // serde names our internal types ("expected struct RawService");
            // the user needs to know that a mapping was expected.
            let msg = e.into_inner().to_string();
            let msg = regex::Regex::new(r"expected struct Raw[A-Za-z]+")
                .map(|re| re.replace_all(&msg, "expected a mapping").into_owned())
                .unwrap_or(msg);
            // Under `client` a wrongly typed value may be a token: never echo it.
            // Nor an unknown key: `client: {token SECRET}` (a missing colon)
            // turns the token into a key name.
            let msg = if path.contains(".client") {
                let msg =
                    regex::Regex::new(r#"(invalid (?:type|value): [a-z ]+?) (?:`[^`]*`|"[^"]*")"#)
                        .map(|re| re.replace_all(&msg, "$1 (value not shown)").into_owned())
                        .unwrap_or(msg);
                regex::Regex::new(r"unknown field `[^`]*`")
                    .map(|re| {
                        re.replace_all(&msg, "unknown field (name not shown: it may hold a token typed without its colon)")
                            .into_owned()
                    })
                    .unwrap_or(msg)
            } else {
                msg
            };
            errors.push(path, msg);
            None
        }
    }
}

impl<'de> Deserialize<'de> for Secret {
    /// Accepts only strings; the error for other types does not echo the value.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d) {
            Ok(Value::String(s)) => Ok(Secret::new(s)),
            _ => Err(serde::de::Error::custom(
                "must be a string (value not shown)",
            )),
        }
    }
}

/// Accepts a number or a string (for `service.port`).
fn de_scalar<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    match Value::deserialize(d)? {
        Value::Null => Ok(None),
        Value::String(s) => Ok(Some(s)),
        Value::Number(n) => Ok(Some(n.to_string())),
        _ => Err(serde::de::Error::custom(
            "must be a port number or a \"${VAR}\" string",
        )),
    }
}

// ---------------------------------------------------------------- discovery.kubernetes

/// One `discovery.kubernetes` entry.
#[derive(Debug, Default, Deserialize, Validate)]
#[serde(deny_unknown_fields)]
#[garde(context(Ctx as ctx))]
pub(super) struct RawCluster {
    #[garde(custom(check_id))]
    pub(super) id: Option<String>,
    #[garde(dive)]
    pub(super) service: Option<RawService>,
    #[garde(dive, custom(check_client(self.https(), self.kubeconfig_mode())))]
    pub(super) client: Option<RawClient>,
    #[garde(custom(check_kubeconfig(self.service.is_some() || self.client.is_some())))]
    pub(super) kubeconfig: Option<String>,
    #[garde(custom(check_context))]
    pub(super) context: Option<String>,
    #[garde(dive, custom(check_exactly_one))]
    pub(super) namespace_selector: Option<RawNsSelector>,
    #[garde(custom(check_label_selector))]
    pub(super) label_selector: Option<String>,
    #[garde(custom(check_weight))]
    pub(super) default_weight: Option<i64>,
    #[garde(custom(check_shared_size))]
    pub(super) shared_size: Option<String>,
    #[garde(skip)]
    pub(super) watch_endpoint_slices: Option<bool>,
}

impl RawCluster {
    /// `kubeconfig`/`context` instead of `service`/`client`.
    pub(super) fn kubeconfig_mode(&self) -> bool {
        self.kubeconfig.is_some() || self.context.is_some()
    }

    /// `service.schema` is `https` (the default).
    fn https(&self) -> bool {
        self.service
            .as_ref()
            .and_then(|s| s.schema.as_deref())
            .unwrap_or("https")
            == "https"
    }
}

/// `service`.
#[derive(Debug, Default, Deserialize, Validate)]
#[serde(deny_unknown_fields)]
#[garde(context(Ctx))]
pub(super) struct RawService {
    #[garde(custom(check_schema))]
    pub(super) schema: Option<String>,
    #[garde(custom(check_host))]
    pub(super) host: Option<String>,
    #[serde(default, deserialize_with = "de_scalar")]
    #[garde(custom(check_port))]
    pub(super) port: Option<String>,
    #[garde(skip)]
    pub(super) ssl_verify: Option<bool>,
    #[garde(custom(check_path_len(4096)))]
    pub(super) ca_file: Option<String>,
}

/// `client`.
#[derive(Debug, Default, Deserialize, Validate)]
#[serde(deny_unknown_fields)]
#[garde(context(Ctx))]
pub(super) struct RawClient {
    #[garde(custom(check_token))]
    pub(super) token: Option<Secret>,
    #[garde(custom(check_path_len(500)))]
    pub(super) token_file: Option<String>,
}

/// `namespace_selector`.
#[derive(Debug, Default, Deserialize, Validate)]
#[serde(deny_unknown_fields)]
#[garde(context(Ctx))]
pub(super) struct RawNsSelector {
    #[garde(custom(check_namespace_name))]
    pub(super) equal: Option<String>,
    #[garde(custom(check_namespace_name))]
    pub(super) not_equal: Option<String>,
    #[garde(custom(check_regex_list), inner(inner(custom(check_regex))))]
    pub(super) r#match: Option<Vec<String>>,
    #[garde(custom(check_regex_list), inner(inner(custom(check_regex))))]
    pub(super) not_match: Option<Vec<String>>,
}

impl RawNsSelector {
    /// The forms that are set, in key order.
    pub(super) fn set_forms(&self) -> Vec<&'static str> {
        let mut v = Vec::new();
        if self.equal.is_some() {
            v.push("equal");
        }
        if self.not_equal.is_some() {
            v.push("not_equal");
        }
        if self.r#match.is_some() {
            v.push("match");
        }
        if self.not_match.is_some() {
            v.push("not_match");
        }
        v
    }
}

// ---------------------------------------------------------------- kube_discovery

/// `kube_discovery`.
#[derive(Debug, Default, Deserialize, Validate)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSettings {
    #[garde(custom(check_instance))]
    pub(super) instance: Option<String>,
    #[garde(custom(check_adopt_instances))]
    pub(super) adopt_instances: Option<Vec<String>>,
    #[garde(custom(check_duration(Duration::ZERO, Duration::from_secs(60))))]
    pub(super) coalesce_window: Option<String>,
    #[garde(skip)]
    pub(super) coalesce_leading_edge: Option<bool>,
    #[garde(custom(check_drain))]
    pub(super) drain_terminating: Option<Value>,
    #[garde(skip)]
    pub(super) index_port_numbers: Option<bool>,
    #[garde(skip)]
    pub(super) topology: Option<bool>,
    #[garde(skip)]
    pub(super) service_port_aliases: Option<bool>,
    #[garde(custom(check_export))]
    pub(super) export: Option<String>,
    #[garde(dive)]
    pub(super) external_name: Option<RawExternalName>,
    #[garde(custom(check_duration(Duration::from_secs(1), Duration::from_secs(290))))]
    pub(super) watch_timeout: Option<String>,
    #[garde(custom(check_duration(Duration::from_secs(3), Duration::from_secs(300))))]
    pub(super) request_timeout: Option<String>,
    #[garde(custom(check_duration(Duration::from_secs(1), Duration::from_secs(3600))))]
    pub(super) unready_after: Option<String>,
    #[garde(custom(check_duration(Duration::from_secs(1), Duration::from_secs(3600))))]
    pub(super) shutdown_timeout: Option<String>,
    #[garde(custom(check_concurrency))]
    pub(super) write_concurrency: Option<u64>,
    #[garde(custom(check_qps))]
    pub(super) write_qps: Option<f64>,
    #[garde(custom(check_qps))]
    pub(super) write_qps_start: Option<f64>,
    #[garde(dive)]
    pub(super) http: Option<RawHttp>,
    #[garde(dive)]
    pub(super) xds: Option<RawXds>,
    #[garde(dive)]
    pub(super) sinks: Option<RawSinks>,
    #[garde(dive)]
    pub(super) home: Option<RawHome>,
    #[garde(dive)]
    pub(super) leader_election: Option<RawLeader>,
}

/// `kube_discovery.external_name`.
#[derive(Debug, Default, Deserialize, Validate)]
#[serde(deny_unknown_fields)]
pub(super) struct RawExternalName {
    #[garde(skip)]
    pub(super) enabled: Option<bool>,
    #[garde(inner(inner(custom(check_allow_regex))))]
    pub(super) allow: Option<Vec<String>>,
}

/// `kube_discovery.http`.
#[derive(Debug, Default, Deserialize, Validate)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHttp {
    #[garde(custom(check_socket_addr))]
    pub(super) addr: Option<String>,
    #[garde(custom(check_plain_path))]
    pub(super) auth_token_file: Option<String>,
}

/// `kube_discovery.xds`: no `addr`, no xDS server.
#[derive(Debug, Default, Deserialize, Validate)]
#[serde(deny_unknown_fields)]
pub(super) struct RawXds {
    #[garde(custom(check_xds_addr(self.other_keys())))]
    pub(super) addr: Option<String>,
    #[garde(custom(check_plain_path))]
    pub(super) auth_token_file: Option<String>,
    #[garde(custom(check_plain_path), custom(check_xds_pair("key_file", self.key_file.is_some())))]
    pub(super) cert_file: Option<String>,
    #[garde(custom(check_plain_path), custom(check_xds_pair("cert_file", self.cert_file.is_some())))]
    pub(super) key_file: Option<String>,
    #[garde(custom(check_plain_path), custom(check_xds_client_ca(self.cert_file.is_some() || self.key_file.is_some())))]
    pub(super) client_ca_file: Option<String>,
}

impl RawXds {
    /// The keys other than `addr` that are set, in key order.
    fn other_keys(&self) -> Vec<&'static str> {
        [
            ("auth_token_file", self.auth_token_file.is_some()),
            ("cert_file", self.cert_file.is_some()),
            ("key_file", self.key_file.is_some()),
            ("client_ca_file", self.client_ca_file.is_some()),
        ]
        .into_iter()
        .filter_map(|(k, set)| set.then_some(k))
        .collect()
    }
}

/// `kube_discovery.sinks`.
#[derive(Debug, Default, Deserialize, Validate)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSinks {
    #[garde(dive)]
    pub(super) discoveredservices: Option<RawDsSink>,
    #[garde(dive)]
    pub(super) configmap: Option<RawCmSink>,
}

/// `kube_discovery.sinks.discoveredservices`.
#[derive(Debug, Default, Deserialize, Validate)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDsSink {
    #[garde(skip)]
    pub(super) enabled: Option<bool>,
    #[garde(custom(check_namespace_mode))]
    pub(super) namespace_mode: Option<String>,
    #[garde(custom(check_fixed_namespace(self.namespace_mode.as_deref())))]
    pub(super) namespace: Option<String>,
}

/// `kube_discovery.sinks.configmap`.
#[derive(Debug, Default, Deserialize, Validate)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCmSink {
    #[garde(skip)]
    pub(super) enabled: Option<bool>,
    #[garde(custom(check_cm_namespace(self.enabled.unwrap_or(false))))]
    pub(super) namespace: Option<String>,
    #[garde(custom(check_object_name))]
    pub(super) name: Option<String>,
}

/// `kube_discovery.home`.
#[derive(Debug, Default, Deserialize, Validate)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHome {
    #[garde(custom(check_plain_path))]
    pub(super) kubeconfig: Option<String>,
    #[garde(custom(check_plain_context))]
    pub(super) context: Option<String>,
}

/// `kube_discovery.leader_election`.
#[derive(Debug, Default, Deserialize, Validate)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLeader {
    #[garde(skip)]
    pub(super) enabled: Option<bool>,
    #[garde(custom(check_object_name))]
    pub(super) lease_name: Option<String>,
    #[garde(custom(check_plain_namespace))]
    pub(super) lease_namespace: Option<String>,
    #[garde(custom(check_duration(Duration::from_secs(1), Duration::from_secs(300))))]
    pub(super) lease_duration: Option<String>,
    #[garde(custom(check_duration(Duration::from_millis(100), Duration::from_secs(300))))]
    pub(super) renew_deadline: Option<String>,
    #[garde(custom(check_duration(Duration::from_millis(100), Duration::from_secs(300))))]
    pub(super) retry_period: Option<String>,
}

// ---------------------------------------------------------------- rules on raw types
//
// The two rules that look inside a raw type live next to it, so `rules.rs`
// needs nothing of this module.

pub(super) fn check_client(
    https: bool,
    kubeconfig_mode: bool,
) -> impl FnOnce(&Option<RawClient>, &Ctx) -> garde::Result {
    move |client, ctx| {
        if kubeconfig_mode {
            return Ok(()); // reported once, on `kubeconfig`/`context`
        }
        let Some(c) = client else {
            return if ctx.multi {
                err(
                    "is required in the multi-cluster form (token or token_file), or use kubeconfig/context",
                )
            } else {
                Ok(())
            };
        };
        match (&c.token, &c.token_file) {
            (Some(_), Some(_)) => err("set either token or token_file, not both"),
            (None, None) => err("one of token or token_file is required"),
            (Some(t), None) => {
                if https && strip_ws(t.expose()).is_empty() {
                    err("token is empty but the API server schema is https")
                } else {
                    Ok(())
                }
            }
            (None, Some(_)) => Ok(()),
        }
    }
}

pub(super) fn check_exactly_one(v: &Option<RawNsSelector>, _: &Ctx) -> garde::Result {
    let Some(sel) = v else { return Ok(()) };
    let set = sel.set_forms();
    if set.len() == 1 {
        Ok(())
    } else if set.is_empty() {
        err("exactly one of equal, not_equal, match, not_match must be set (none is)")
    } else {
        err(format!(
            "exactly one of equal, not_equal, match, not_match must be set (found {})",
            set.join(", ")
        ))
    }
}
