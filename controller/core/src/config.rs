//! Configuration: APISIX's `discovery.kubernetes` block, unchanged, plus our own
//! `kube_discovery:` block. Parsed with serde, validated with garde, pure
//! (environment variables come from a lookup closure, files are never read).
//!
//! [`parse_config`] returns either a fully resolved [`Config`] or
//! [`ConfigErrors`]: one line per problem, each naming the field path
//! (`discovery.kubernetes[1].id: ...`). Token values never appear in errors,
//! in `Debug` output or in [`Config::redacted_json`].
//!
//! An APISIX `config.yaml` works as it is: other top-level keys (`apisix`,
//! `deployment`, `plugins`, ...) and other discovery kinds (`dns`, `consul`,
//! ...) are ignored. Unknown keys INSIDE `discovery.kubernetes` and
//! `kube_discovery` are errors (a misspelt `watch_endpoint_slices` silently
//! doing nothing is exactly APISIX issue 11631).
//!
//! # `discovery.kubernetes`
//!
//! One object = single cluster; a list of objects, each with an `id` = multi
//! cluster. `kubernetes: {}` (or an empty value) means "in-cluster defaults".
//!
//! | key | rule | default (single cluster) | default (multi cluster) |
//! |---|---|---|---|
//! | `id` | `^[a-z0-9]{1,8}$`, unique; multi cluster only | - | required |
//! | `service.schema` | `http` or `https` | `https` | `https` |
//! | `service.host` | IPv4, IPv6, DNS name; `${VAR}` allowed | `${KUBERNETES_SERVICE_HOST}` | required |
//! | `service.port` | 1..65535 (number or string); `${VAR}` allowed | `${KUBERNETES_SERVICE_PORT}` | required |
//! | `service.ssl_verify` | bool (APISIX: false; **we default to true**) | `true` | `true` |
//! | `service.ca_file` | PEM file of the API server CA; `${VAR}` allowed | `/var/run/secrets/kubernetes.io/serviceaccount/ca.crt` when `service.host` is defaulted (in-cluster), else none (system roots) | none |
//! | `client.token` | `${VAR}` or up to 4096 of `[A-Za-z0-9+/._=-]` after stripping whitespace | - | - |
//! | `client.token_file` | path of 1..500 characters; `${VAR}` allowed; re-read by the runtime when it changes | `/var/run/secrets/kubernetes.io/serviceaccount/token` if no `token` | - |
//! | `kubeconfig` | path of a kubeconfig file (alternative to `service`/`client`; contexts, client certificates, exec plugins) | - | - |
//! | `context` | kubeconfig context (alternative to `service`/`client`; alone = default kubeconfig) | current-context | current-context |
//! | `namespace_selector` | exactly one of `equal` (namespace), `not_equal` (namespace), `match` (list of regex), `not_match` (list of regex); regexes must match the WHOLE namespace name | all namespaces | all namespaces |
//! | `label_selector` | Kubernetes label selector (`a=b,c in (d,e),!f`) | none | none |
//! | `default_weight` | integer 0..4294967295 | 50 | 50 |
//! | `shared_size` | APISIX shared memory size like `1m`; accepted and ignored | `1m` | `1m` |
//! | `watch_endpoint_slices` | bool; `true` = watch `discovery.k8s.io/v1` EndpointSlices, else `v1` Endpoints (deprecated since Kubernetes 1.33) | `false` | `false` |
//!
//! Rules: `${VAR}` (anywhere in `service.host`, `service.port`,
//! `service.ca_file`, `client.token`, `client.token_file`, `kubeconfig`,
//! `context`) must be set, or it is an error. Exactly one of `token`/`token_file`
//! (after defaults). `https` with an empty `token` is an error.
//! `service`/`client` and `kubeconfig`/`context` exclude each other. Multi-cluster
//! entries get no `service`/`client` defaults.
//!
//! # `kube_discovery` (our additions)
//!
//! | key | rule | default |
//! |---|---|---|
//! | `coalesce_window` | duration 0s..60s: per-service quiet time before a write, so a rolling update's burst becomes few writes | `100ms` |
//! | `drain_terminating` | bool: when a port has no ready endpoint, use serving+terminating ones (flagged `draining: true`; EndpointSlices only) | `false` |
//! | `index_port_numbers` | bool: also index named ports under their number | `false` |
//! | `topology` | bool: add `zone`, `nodeName`, `targetRef` to nodes | `false` |
//! | `watch_timeout` | duration 1s..290s: server-side watch timeout | `290s` |
//! | `write_concurrency` | 1..256 concurrent writes | `32` |
//! | `write_qps` | 0.1..10000 writes per second (client-side rate limit) | `50` |
//! | `http.addr` | `ip:port` of the HTTP server | `0.0.0.0:8080` |
//! | `http.auth_token_file` | file with a bearer token required by the dump and nodes APIs | none (no auth) |
//! | `sinks.discoveredservices.enabled` | bool | `true` |
//! | `sinks.discoveredservices.namespace_mode` | `source` (next to the Service) or `fixed` | `source` |
//! | `sinks.discoveredservices.namespace` | namespace (DNS label); required with `fixed`, not allowed with `source` | - |
//! | `sinks.configmap.enabled` | bool: also write a ConfigMap snapshot | `false` |
//! | `sinks.configmap.namespace` | namespace; required when enabled | - |
//! | `sinks.configmap.name` | name of the index ConfigMap (DNS subdomain; at most 240 characters, checked at startup); shards are `<name>-<i>` | `kube-discovery-nodes` |
//! | `home.kubeconfig` / `home.context` | where DiscoveredServices are written in multi-cluster mode | in-cluster |
//! | `leader_election.enabled` | bool | `false` |
//! | `leader_election.lease_name` | Lease name (DNS subdomain) | `kube-discovery` |
//! | `leader_election.lease_namespace` | namespace; unset = the runtime's own namespace | unset |
//! | `leader_election.lease_duration` | duration 1s..300s | `15s` |
//! | `leader_election.renew_deadline` | duration 100ms..300s, shorter than `lease_duration`: a leader that has not renewed within it stops writing | 2/3 of `lease_duration` (`10s`) |
//! | `leader_election.retry_period` | duration 100ms..300s, shorter than `renew_deadline`: time between renewals / acquisition attempts | 2/15 of `lease_duration` (`2s`) |
//!
//! Durations are strings such as `100ms`, `5s`, `1m 30s`.
//!
//! ```yaml
//! discovery:
//!   kubernetes:
//!     service: {schema: https, host: "${KUBERNETES_SERVICE_HOST}", port: "${KUBERNETES_SERVICE_PORT}"}
//!     client: {token_file: /var/run/secrets/kubernetes.io/serviceaccount/token}
//!     namespace_selector: {not_match: ["kube-.*"]}
//!     watch_endpoint_slices: true
//! kube_discovery:
//!   drain_terminating: true
//!   sinks: {discoveredservices: {namespace_mode: source}}
//! ```

use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use garde::Validate;
use serde::{Deserialize, Deserializer};
use serde_json::{Value, json};

use crate::convert::ConvertOptions;
use crate::crd::ObjectNaming;
pub use crate::filter::{AnchoredRegex, LabelSelector, NamespaceFilter};
use crate::index::Index;
use crate::model::SourceKind;

/// Default `client.token_file` (single cluster).
pub const DEFAULT_TOKEN_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
/// Default `service.ca_file` (single cluster, in-cluster host).
pub const DEFAULT_CA_FILE: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";
/// Default `default_weight`.
pub const DEFAULT_WEIGHT: u32 = 50;
const REDACTED: &str = "<redacted>";

// ---------------------------------------------------------------- errors

/// One configuration problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    /// Field path, e.g. `discovery.kubernetes[1].id`.
    pub path: String,
    /// What is wrong (never contains a token value).
    pub message: String,
}

/// All problems found; `Display` prints one `path: message` line each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{}: {}", e.path, e.message)?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

#[derive(Default)]
struct Errors(Vec<ConfigError>);

impl Errors {
    fn push(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.0.push(ConfigError {
            path: path.into(),
            message: message.into(),
        });
    }

    fn report(&mut self, prefix: &str, report: garde::Report) {
        for (path, err) in report.iter() {
            // garde names raw identifiers `r#match`; the YAML key is `match`.
            let p = path.to_string().replace("r#", "");
            let full = if p.is_empty() {
                prefix.to_string()
            } else if p.starts_with('[') {
                format!("{prefix}{p}")
            } else {
                format!("{prefix}.{p}")
            };
            self.push(full, err.message().to_string());
        }
    }
}

// ---------------------------------------------------------------- secret

/// A token. `Debug`, `Display` and the redacted JSON never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a value.
    pub fn new(s: impl Into<String>) -> Self {
        Self(s.into())
    }

    /// The secret value (hand it only to the HTTP client).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({REDACTED})")
    }
}

impl<'de> Deserialize<'de> for Secret {
    /// Accepts only strings; the error for other types does not echo the value.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match serde_yaml::Value::deserialize(d) {
            Ok(serde_yaml::Value::String(s)) => Ok(Secret(s)),
            _ => Err(serde::de::Error::custom(
                "must be a string (value not shown)",
            )),
        }
    }
}

/// Accepts a number or a string (for `service.port`).
fn de_scalar<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    match serde_yaml::Value::deserialize(d)? {
        serde_yaml::Value::Null => Ok(None),
        serde_yaml::Value::String(s) => Ok(Some(s)),
        serde_yaml::Value::Number(n) => Ok(Some(n.to_string())),
        _ => Err(serde::de::Error::custom(
            "must be a port number or a \"${VAR}\" string",
        )),
    }
}

// ---------------------------------------------------------------- raw (as written)

/// Validation context of a cluster entry.
struct Ctx {
    multi: bool,
}

#[derive(Debug, Default, Deserialize, Validate)]
#[serde(deny_unknown_fields)]
#[garde(context(Ctx as ctx))]
struct RawCluster {
    #[garde(custom(check_id))]
    id: Option<String>,
    #[garde(dive)]
    service: Option<RawService>,
    #[garde(dive, custom(check_client(&self.service, self.kubeconfig_mode())))]
    client: Option<RawClient>,
    #[garde(custom(check_kubeconfig(self.service.is_some() || self.client.is_some())))]
    kubeconfig: Option<String>,
    #[garde(custom(check_context))]
    context: Option<String>,
    #[garde(dive, custom(check_exactly_one))]
    namespace_selector: Option<RawNsSelector>,
    #[garde(custom(check_label_selector))]
    label_selector: Option<String>,
    #[garde(custom(check_weight))]
    default_weight: Option<i64>,
    #[garde(custom(check_shared_size))]
    shared_size: Option<String>,
    #[garde(skip)]
    watch_endpoint_slices: Option<bool>,
}

impl RawCluster {
    fn kubeconfig_mode(&self) -> bool {
        self.kubeconfig.is_some() || self.context.is_some()
    }
}

#[derive(Debug, Default, Deserialize, Validate)]
#[serde(deny_unknown_fields)]
#[garde(context(Ctx))]
struct RawService {
    #[garde(custom(check_schema))]
    schema: Option<String>,
    #[garde(custom(check_host))]
    host: Option<String>,
    #[serde(default, deserialize_with = "de_scalar")]
    #[garde(custom(check_port))]
    port: Option<String>,
    #[garde(skip)]
    ssl_verify: Option<bool>,
    #[garde(custom(check_path_len(4096)))]
    ca_file: Option<String>,
}

#[derive(Debug, Default, Deserialize, Validate)]
#[serde(deny_unknown_fields)]
#[garde(context(Ctx))]
struct RawClient {
    #[garde(custom(check_token))]
    token: Option<Secret>,
    #[garde(custom(check_path_len(500)))]
    token_file: Option<String>,
}

#[derive(Debug, Default, Deserialize, Validate)]
#[serde(deny_unknown_fields)]
#[garde(context(Ctx))]
struct RawNsSelector {
    #[garde(custom(check_namespace_name))]
    equal: Option<String>,
    #[garde(custom(check_namespace_name))]
    not_equal: Option<String>,
    #[garde(custom(check_regex_list), inner(inner(custom(check_regex))))]
    r#match: Option<Vec<String>>,
    #[garde(custom(check_regex_list), inner(inner(custom(check_regex))))]
    not_match: Option<Vec<String>>,
}

impl RawNsSelector {
    fn set_forms(&self) -> Vec<&'static str> {
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

// ---------------------------------------------------------------- rules

fn err(msg: impl Into<String>) -> garde::Result {
    Err(garde::Error::new(msg.into()))
}

fn check_id(v: &Option<String>, ctx: &Ctx) -> garde::Result {
    match (v, ctx.multi) {
        (None, true) => err("is required in the multi-cluster (list) form"),
        (Some(_), false) => err("is only allowed in the multi-cluster (list) form"),
        (Some(id), true) => {
            if !id.is_empty()
                && id.len() <= 8
                && id
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            {
                Ok(())
            } else {
                err(format!("{id:?} must match ^[a-z0-9]{{1,8}}$"))
            }
        }
        (None, false) => Ok(()),
    }
}

fn check_schema(v: &Option<String>, _: &Ctx) -> garde::Result {
    match v.as_deref() {
        None | Some("http") | Some("https") => Ok(()),
        Some(s) => err(format!("{s:?} must be \"http\" or \"https\"")),
    }
}

fn is_hostname(s: &str) -> bool {
    let s = s.strip_suffix('.').unwrap_or(s);
    k8s_syntax::is_dns_name(&s.to_ascii_lowercase())
}

fn check_host(v: &Option<String>, _: &Ctx) -> garde::Result {
    let Some(h) = v else { return Ok(()) };
    let bare = h
        .strip_prefix('[')
        .and_then(|x| x.strip_suffix(']'))
        .unwrap_or(h);
    if bare.parse::<IpAddr>().is_ok() || is_hostname(h) {
        Ok(())
    } else {
        err(format!(
            "{h:?} is not an IPv4 address, an IPv6 address or a DNS name"
        ))
    }
}

fn check_port(v: &Option<String>, _: &Ctx) -> garde::Result {
    let Some(p) = v else { return Ok(()) };
    match p.trim().parse::<u32>() {
        Ok(n) if (1..=65535).contains(&n) => Ok(()),
        _ => err(format!("{p:?} must be a port number 1..65535")),
    }
}

fn check_path_len(max: usize) -> impl FnOnce(&Option<String>, &Ctx) -> garde::Result {
    move |v, _| match v {
        Some(p) if p.is_empty() || p.chars().count() > max => err(format!(
            "must be a path of 1..{max} characters (got {})",
            p.chars().count()
        )),
        _ => Ok(()),
    }
}

fn check_token(v: &Option<Secret>, _: &Ctx) -> garde::Result {
    let Some(t) = v else { return Ok(()) };
    let t = strip_ws(t.expose());
    if t.len() > 4096 {
        return err(format!(
            "is longer than 4096 characters ({}; value not shown)",
            t.len()
        ));
    }
    if !t
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'.' | b'_' | b'=' | b'-'))
    {
        return err("contains characters outside [A-Za-z0-9+/._=-] (value not shown)");
    }
    Ok(())
}

fn strip_ws(s: &str) -> String {
    s.chars().filter(|c| !c.is_whitespace()).collect()
}

fn check_client<'a>(
    service: &'a Option<RawService>,
    kubeconfig_mode: bool,
) -> impl FnOnce(&Option<RawClient>, &Ctx) -> garde::Result + 'a {
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
                let https = service
                    .as_ref()
                    .and_then(|s| s.schema.as_deref())
                    .unwrap_or("https")
                    == "https";
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

fn check_kubeconfig(
    has_service_or_client: bool,
) -> impl FnOnce(&Option<String>, &Ctx) -> garde::Result {
    move |v, _| match v {
        Some(p) if p.is_empty() => err("must be a path (non-empty)"),
        Some(_) if has_service_or_client => {
            err("kubeconfig/context and service/client are alternatives; set only one of them")
        }
        _ => Ok(()),
    }
}

fn check_context(v: &Option<String>, _: &Ctx) -> garde::Result {
    match v {
        Some(c) if c.is_empty() => err("must not be empty"),
        _ => Ok(()),
    }
}

fn check_exactly_one(v: &Option<RawNsSelector>, _: &Ctx) -> garde::Result {
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

fn check_namespace_name(v: &Option<String>, _: &Ctx) -> garde::Result {
    let Some(ns) = v else { return Ok(()) };
    if k8s_syntax::is_dns1123_label(ns) {
        Ok(())
    } else {
        err(format!(
            "{ns:?} is not a valid namespace name (RFC 1123 label)"
        ))
    }
}

fn check_regex_list(v: &Option<Vec<String>>, _: &Ctx) -> garde::Result {
    match v {
        Some(l) if l.is_empty() => err("must list at least one regex"),
        _ => Ok(()),
    }
}

fn check_regex(v: &String, _: &Ctx) -> garde::Result {
    match AnchoredRegex::new(v) {
        Ok(_) => Ok(()),
        Err(e) => err(format!(
            "{v:?} is not a valid regex: {}",
            e.to_string().lines().last().unwrap_or("invalid")
        )),
    }
}

fn check_label_selector(v: &Option<String>, _: &Ctx) -> garde::Result {
    match v.as_deref().map(LabelSelector::parse) {
        Some(Err(e)) => err(format!("is not a valid label selector: {e}")),
        _ => Ok(()),
    }
}

fn check_weight(v: &Option<i64>, _: &Ctx) -> garde::Result {
    match v {
        Some(w) if *w < 0 || *w > i64::from(u32::MAX) => {
            err(format!("{w} must be an integer >= 0 (and <= {})", u32::MAX))
        }
        _ => Ok(()),
    }
}

fn check_shared_size(v: &Option<String>, _: &Ctx) -> garde::Result {
    let Some(s) = v else { return Ok(()) };
    let digits = s.trim_end_matches(['k', 'K', 'm', 'M', 'g', 'G']);
    if !digits.is_empty()
        && digits.len() + 1 >= s.len()
        && digits.bytes().all(|b| b.is_ascii_digit())
    {
        Ok(())
    } else {
        err(format!("{s:?} must be a size like 1m, 512k or 1g"))
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
        let before = errors.0.len();
        *s = expand(s, path, env, errors, hint);
        if errors.0.len() > before {
            *s = placeholder.to_string();
        }
    }
}

// ---------------------------------------------------------------- resolved config

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
        /// Inline bearer token (whitespace stripped).
        token: Option<Secret>,
        /// Bearer token file, re-read when it changes.
        token_file: Option<PathBuf>,
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
    /// Watch EndpointSlices instead of Endpoints.
    pub watch_endpoint_slices: bool,
    /// Whether `watch_endpoint_slices` was written at all (absent: log the
    /// one-time notice recommending EndpointSlices).
    pub watch_endpoint_slices_explicit: bool,
}

impl ClusterConfig {
    /// The source kind this cluster watches.
    pub fn source(&self) -> SourceKind {
        if self.watch_endpoint_slices {
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
            "watch_endpoint_slices": self.watch_endpoint_slices,
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
                token,
                token_file,
            } => {
                v["service"] = json!({"schema": schema.as_str(), "host": host, "port": port, "ssl_verify": ssl_verify});
                if let Some(ca) = ca_file {
                    v["service"]["ca_file"] = json!(ca.display().to_string());
                }
                let mut client = json!({});
                if token.is_some() {
                    client["token"] = json!(REDACTED);
                }
                if let Some(f) = token_file {
                    client["token_file"] = json!(f.display().to_string());
                }
                v["client"] = client;
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

/// `kube_discovery.http`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpSettings {
    /// Listen address.
    pub addr: SocketAddr,
    /// Bearer token file protecting the dump and nodes APIs.
    pub auth_token_file: Option<PathBuf>,
}

/// `kube_discovery.sinks.discoveredservices`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveredServicesSink {
    /// Write DiscoveredServices.
    pub enabled: bool,
    /// Where and under which names.
    pub naming: ObjectNaming,
}

/// `kube_discovery.sinks.configmap`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigMapSink {
    /// Write a ConfigMap snapshot.
    pub enabled: bool,
    /// Its namespace (set when enabled).
    pub namespace: Option<String>,
    /// Its name.
    pub name: String,
}

/// `kube_discovery.sinks`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sinks {
    /// DiscoveredService objects.
    pub discoveredservices: DiscoveredServicesSink,
    /// ConfigMap snapshot.
    pub configmap: ConfigMapSink,
}

/// `kube_discovery.home`: where objects are written in multi-cluster mode.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HomeCluster {
    /// Kubeconfig path (`None` = in-cluster / default).
    pub kubeconfig: Option<PathBuf>,
    /// Context.
    pub context: Option<String>,
}

/// `kube_discovery.leader_election`.
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
    /// Per-key coalescing window.
    pub coalesce_window: Duration,
    /// Draining fallback.
    pub drain_terminating: bool,
    /// Index named ports under their number too.
    pub index_port_numbers: bool,
    /// Topology fields on nodes.
    pub topology: bool,
    /// Server-side watch timeout.
    pub watch_timeout: Duration,
    /// Concurrent writes.
    pub write_concurrency: usize,
    /// Client-side write rate limit.
    pub write_qps: f64,
    /// HTTP server.
    pub http: HttpSettings,
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
            drain_terminating: false,
            index_port_numbers: false,
            topology: false,
            watch_timeout: Duration::from_secs(290),
            // 8 in flight could not keep up with 500 changes/s (churn p99
            // 3.1 s vs 0.14 s with 32, BENCHMARKS.md); `write_qps` stays the
            // throttle on the API server.
            write_concurrency: 32,
            write_qps: 50.0,
            http: HttpSettings {
                addr: SocketAddr::from(([0, 0, 0, 0], 8080)),
                auth_token_file: None,
            },
            sinks: Sinks {
                discoveredservices: DiscoveredServicesSink {
                    enabled: true,
                    naming: ObjectNaming::source(),
                },
                configmap: ConfigMapSink {
                    enabled: false,
                    namespace: None,
                    name: "kube-discovery-nodes".to_string(),
                },
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
            crate::crd::NamespaceMode::Source => ("source", None),
            crate::crd::NamespaceMode::Fixed(n) => ("fixed", Some(n.clone())),
        };
        json!({
            "coalesce_window": format_duration(self.coalesce_window),
            "drain_terminating": self.drain_terminating,
            "index_port_numbers": self.index_port_numbers,
            "topology": self.topology,
            "watch_timeout": format_duration(self.watch_timeout),
            "write_concurrency": self.write_concurrency,
            "write_qps": self.write_qps,
            "http": {"addr": self.http.addr.to_string(),
                     "auth_token_file": self.http.auth_token_file.as_ref().map(|p| p.display().to_string())},
            "sinks": {
                "discoveredservices": {"enabled": self.sinks.discoveredservices.enabled, "namespace_mode": mode, "namespace": ns},
                "configmap": {"enabled": self.sinks.configmap.enabled, "namespace": self.sinks.configmap.namespace,
                              "name": self.sinks.configmap.name},
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

fn format_duration(d: Duration) -> String {
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// The whole validated configuration.
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

// ---------------------------------------------------------------- kube_discovery raw

#[derive(Debug, Default, Deserialize, Validate)]
#[serde(deny_unknown_fields)]
struct RawSettings {
    #[garde(custom(check_duration(Duration::ZERO, Duration::from_secs(60))))]
    coalesce_window: Option<String>,
    #[garde(skip)]
    drain_terminating: Option<bool>,
    #[garde(skip)]
    index_port_numbers: Option<bool>,
    #[garde(skip)]
    topology: Option<bool>,
    #[garde(custom(check_duration(Duration::from_secs(1), Duration::from_secs(290))))]
    watch_timeout: Option<String>,
    #[garde(custom(check_concurrency))]
    write_concurrency: Option<u64>,
    #[garde(custom(check_qps))]
    write_qps: Option<f64>,
    #[garde(dive)]
    http: Option<RawHttp>,
    #[garde(dive)]
    sinks: Option<RawSinks>,
    #[garde(dive)]
    home: Option<RawHome>,
    #[garde(dive)]
    leader_election: Option<RawLeader>,
}

#[derive(Debug, Default, Deserialize, Validate)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    #[garde(custom(check_socket_addr))]
    addr: Option<String>,
    #[garde(custom(check_plain_path))]
    auth_token_file: Option<String>,
}

#[derive(Debug, Default, Deserialize, Validate)]
#[serde(deny_unknown_fields)]
struct RawSinks {
    #[garde(dive)]
    discoveredservices: Option<RawDsSink>,
    #[garde(dive)]
    configmap: Option<RawCmSink>,
}

#[derive(Debug, Default, Deserialize, Validate)]
#[serde(deny_unknown_fields)]
struct RawDsSink {
    #[garde(skip)]
    enabled: Option<bool>,
    #[garde(custom(check_namespace_mode))]
    namespace_mode: Option<String>,
    #[garde(custom(check_fixed_namespace(self.namespace_mode.as_deref())))]
    namespace: Option<String>,
}

#[derive(Debug, Default, Deserialize, Validate)]
#[serde(deny_unknown_fields)]
struct RawCmSink {
    #[garde(skip)]
    enabled: Option<bool>,
    #[garde(custom(check_cm_namespace(self.enabled.unwrap_or(false))))]
    namespace: Option<String>,
    #[garde(custom(check_object_name))]
    name: Option<String>,
}

#[derive(Debug, Default, Deserialize, Validate)]
#[serde(deny_unknown_fields)]
struct RawHome {
    #[garde(custom(check_plain_path))]
    kubeconfig: Option<String>,
    #[garde(custom(check_plain_context))]
    context: Option<String>,
}

#[derive(Debug, Default, Deserialize, Validate)]
#[serde(deny_unknown_fields)]
struct RawLeader {
    #[garde(skip)]
    enabled: Option<bool>,
    #[garde(custom(check_object_name))]
    lease_name: Option<String>,
    #[garde(custom(check_plain_namespace))]
    lease_namespace: Option<String>,
    #[garde(custom(check_duration(Duration::from_secs(1), Duration::from_secs(300))))]
    lease_duration: Option<String>,
    #[garde(custom(check_duration(Duration::from_millis(100), Duration::from_secs(300))))]
    renew_deadline: Option<String>,
    #[garde(custom(check_duration(Duration::from_millis(100), Duration::from_secs(300))))]
    retry_period: Option<String>,
}

/// Parses `100ms`, `5s`, `1m 30s` (jiff's friendly format, non-negative).
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d: jiff::SignedDuration = s
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a duration (examples: 100ms, 5s, 1m 30s)"))?;
    Duration::try_from(d).map_err(|_| format!("{s:?} must not be negative"))
}

fn check_duration(
    min: Duration,
    max: Duration,
) -> impl FnOnce(&Option<String>, &()) -> garde::Result {
    move |v, _| {
        let Some(s) = v else { return Ok(()) };
        let d = parse_duration(s).map_err(garde::Error::new)?;
        if d < min || d > max {
            return err(format!(
                "{s:?} must be between {} and {}",
                format_duration(min),
                format_duration(max)
            ));
        }
        Ok(())
    }
}

fn check_concurrency(v: &Option<u64>, _: &()) -> garde::Result {
    match v {
        Some(n) if !(1..=256).contains(n) => err(format!("{n} must be between 1 and 256")),
        _ => Ok(()),
    }
}

fn check_qps(v: &Option<f64>, _: &()) -> garde::Result {
    match v {
        Some(q) if !(0.1..=10000.0).contains(q) => err(format!(
            "{q} must be between 0.1 and 10000 writes per second"
        )),
        _ => Ok(()),
    }
}

fn check_socket_addr(v: &Option<String>, _: &()) -> garde::Result {
    match v {
        Some(a) if a.parse::<SocketAddr>().is_err() => {
            err(format!("{a:?} must be ip:port, e.g. 0.0.0.0:8080"))
        }
        _ => Ok(()),
    }
}

fn check_plain_path(v: &Option<String>, _: &()) -> garde::Result {
    match v {
        Some(p) if p.is_empty() || p.len() > 4096 => err("must be a path of 1..4096 characters"),
        _ => Ok(()),
    }
}

fn check_plain_context(v: &Option<String>, _: &()) -> garde::Result {
    match v {
        Some(c) if c.is_empty() => err("must not be empty"),
        _ => Ok(()),
    }
}

fn check_plain_namespace(v: &Option<String>, _: &()) -> garde::Result {
    check_namespace_name(v, &Ctx { multi: false })
}

fn check_object_name(v: &Option<String>, _: &()) -> garde::Result {
    match v {
        Some(n) if !k8s_syntax::is_dns1123_subdomain(n) => err(format!(
            "{n:?} is not a valid object name (RFC 1123 subdomain)"
        )),
        _ => Ok(()),
    }
}

fn check_namespace_mode(v: &Option<String>, _: &()) -> garde::Result {
    match v.as_deref() {
        None | Some("source") | Some("fixed") => Ok(()),
        Some(m) => err(format!("{m:?} must be \"source\" or \"fixed\"")),
    }
}

fn check_fixed_namespace(
    mode: Option<&str>,
) -> impl FnOnce(&Option<String>, &()) -> garde::Result + '_ {
    move |v, _| match (mode, v) {
        (Some("fixed"), None) => err("is required with namespace_mode: fixed"),
        (Some("fixed"), ns @ Some(_)) => check_plain_namespace(ns, &()),
        (_, Some(_)) => err("is only used with namespace_mode: fixed"),
        _ => Ok(()),
    }
}

fn check_cm_namespace(enabled: bool) -> impl FnOnce(&Option<String>, &()) -> garde::Result {
    move |v, _| match v {
        None if enabled => err("is required when the configmap sink is enabled"),
        ns => check_plain_namespace(ns, &()),
    }
}

fn deserialize_at<T: serde::de::DeserializeOwned>(
    value: serde_yaml::Value,
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

// ---------------------------------------------------------------- parse

/// Parses and validates the configuration text. `env` looks up environment
/// variables for `${VAR}` expansion (pass `&|k| std::env::var(k).ok()`).
pub fn parse_config(
    yaml: &str,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Config, ConfigErrors> {
    let mut errors = Errors::default();
    let root: serde_yaml::Value = match serde_yaml::from_str(yaml) {
        Ok(v) => v,
        Err(e) => {
            errors.push("config", format!("invalid YAML: {e}"));
            return Err(ConfigErrors(errors.0));
        }
    };
    let root = match root {
        serde_yaml::Value::Mapping(m) => m,
        serde_yaml::Value::Null => serde_yaml::Mapping::new(),
        _ => {
            errors.push(
                "config",
                "must be a YAML mapping with a discovery.kubernetes key",
            );
            return Err(ConfigErrors(errors.0));
        }
    };
    let kubernetes = match root.get("discovery") {
        Some(serde_yaml::Value::Mapping(d)) => match d.get("kubernetes") {
            Some(k) => Some(k.clone()),
            None => {
                errors.push(
                    "discovery.kubernetes",
                    "is missing (use {} for in-cluster defaults)",
                );
                None
            }
        },
        Some(_) => {
            errors.push("discovery", "must be a mapping");
            None
        }
        None => {
            errors.push(
                "discovery.kubernetes",
                "is missing (use {} for in-cluster defaults)",
            );
            None
        }
    };

    let mut multi_cluster = false;
    let mut clusters = Vec::new();
    match kubernetes {
        None => {}
        Some(serde_yaml::Value::Null) => clusters.push(resolve_cluster(
            RawCluster::default(),
            "discovery.kubernetes",
            false,
            env,
            &mut errors,
        )),
        Some(v @ serde_yaml::Value::Mapping(_)) => {
            if let Some(raw) = deserialize_at::<RawCluster>(v, "discovery.kubernetes", &mut errors)
            {
                clusters.push(resolve_cluster(
                    raw,
                    "discovery.kubernetes",
                    false,
                    env,
                    &mut errors,
                ));
            }
        }
        Some(serde_yaml::Value::Sequence(items)) => {
            multi_cluster = true;
            if items.is_empty() {
                errors.push("discovery.kubernetes", "must list at least one cluster");
            }
            let mut seen = BTreeSet::new();
            for (i, item) in items.into_iter().enumerate() {
                let path = format!("discovery.kubernetes[{i}]");
                if !matches!(item, serde_yaml::Value::Mapping(_)) {
                    errors.push(&path, "must be a mapping");
                    continue;
                }
                let Some(raw) = deserialize_at::<RawCluster>(item, &path, &mut errors) else {
                    continue;
                };
                if let Some(id) = &raw.id
                    && !seen.insert(id.clone())
                {
                    errors.push(format!("{path}.id"), format!("duplicate cluster id {id:?}"));
                }
                clusters.push(resolve_cluster(raw, &path, true, env, &mut errors));
            }
        }
        Some(_) => errors.push(
            "discovery.kubernetes",
            "must be a mapping (single cluster) or a list of mappings with id (multi cluster)",
        ),
    }

    let settings = match root.get("kube_discovery") {
        None | Some(serde_yaml::Value::Null) => {
            Some(resolve_settings(RawSettings::default(), env, &mut errors))
        }
        Some(v @ serde_yaml::Value::Mapping(_)) => {
            deserialize_at::<RawSettings>(v.clone(), "kube_discovery", &mut errors)
                .map(|raw| resolve_settings(raw, env, &mut errors))
        }
        Some(_) => {
            errors.push("kube_discovery", "must be a mapping");
            None
        }
    };

    if !errors.0.is_empty() {
        return Err(ConfigErrors(errors.0));
    }
    let clusters: Vec<ClusterConfig> = clusters.into_iter().flatten().collect();
    match settings {
        Some(settings) => Ok(Config {
            multi_cluster,
            clusters,
            settings,
        }),
        None => Err(ConfigErrors(vec![ConfigError {
            path: "kube_discovery".into(),
            message: "invalid".into(),
        }])),
    }
}

/// Applies defaults and `${VAR}` expansion, validates, and builds the cluster.
/// Returns `None` (with errors recorded) when invalid.
fn resolve_cluster(
    mut raw: RawCluster,
    path: &str,
    multi: bool,
    env: &dyn Fn(&str) -> Option<String>,
    errors: &mut Errors,
) -> Option<ClusterConfig> {
    let before = errors.0.len();
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
            let before_token = errors.0.len();
            let expanded = expand(t.expose(), &format!("{path}.client.token"), env, errors, "");
            *t = if errors.0.len() > before_token {
                Secret("unset".to_string())
            } else {
                Secret(strip_ws(&expanded))
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
    if errors.0.len() > before {
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
            token: client.token,
            token_file: client.token_file.map(PathBuf::from),
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
        watch_endpoint_slices: raw.watch_endpoint_slices.unwrap_or(false),
        watch_endpoint_slices_explicit: raw.watch_endpoint_slices.is_some(),
    })
}

fn resolve_settings(
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
        errors.report("kube_discovery", report);
    }
    let d = Settings::default();
    let dur = |v: &Option<String>, default: Duration| {
        v.as_deref()
            .and_then(|s| parse_duration(s).ok())
            .unwrap_or(default)
    };
    let http = raw.http.unwrap_or_default();
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
        drain_terminating: raw.drain_terminating.unwrap_or(d.drain_terminating),
        index_port_numbers: raw.index_port_numbers.unwrap_or(d.index_port_numbers),
        topology: raw.topology.unwrap_or(d.topology),
        watch_timeout: dur(&raw.watch_timeout, d.watch_timeout),
        write_concurrency: raw
            .write_concurrency
            .and_then(|n| usize::try_from(n).ok())
            .unwrap_or(d.write_concurrency),
        write_qps: raw.write_qps.unwrap_or(d.write_qps),
        http: HttpSettings {
            addr: http
                .addr
                .and_then(|a| a.parse().ok())
                .unwrap_or(d.http.addr),
            auth_token_file: http.auth_token_file.map(PathBuf::from),
        },
        sinks: Sinks {
            discoveredservices: DiscoveredServicesSink {
                enabled: ds.enabled.unwrap_or(true),
                naming: match (ds.namespace_mode.as_deref(), ds.namespace) {
                    (Some("fixed"), Some(ns)) => ObjectNaming::fixed(ns),
                    _ => ObjectNaming::source(),
                },
            },
            configmap: ConfigMapSink {
                enabled: cm.enabled.unwrap_or(false),
                namespace: cm.namespace,
                name: cm.name.unwrap_or(d.sinks.configmap.name),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    const TOKEN: &str = "s3cr3t.TOKEN-value_abc=";

    fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    fn pod_env() -> impl Fn(&str) -> Option<String> {
        env_of(&[
            ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
            ("KUBERNETES_SERVICE_PORT", "443"),
            ("TOKEN_VAR", TOKEN),
        ])
    }

    fn ok(yaml: &str) -> Config {
        parse_config(yaml, &pod_env()).unwrap_or_else(|e| panic!("unexpected errors:\n{e}"))
    }

    /// Parses, expects failure, returns the error lines.
    fn errs(yaml: &str) -> Vec<String> {
        errs_env(yaml, &pod_env())
    }

    fn errs_env(yaml: &str, env: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
        match parse_config(yaml, env) {
            Ok(c) => panic!("expected errors, got {c:#?}"),
            Err(e) => {
                let text = e.to_string();
                assert!(!text.contains(TOKEN), "token leaked: {text}");
                text.lines().map(str::to_string).collect()
            }
        }
    }

    fn has(lines: &[String], path: &str, needle: &str) {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&format!("{path}: ")) && l.contains(needle)),
            "no line `{path}: ...{needle}...` in:\n{}",
            lines.join("\n")
        );
    }

    #[test]
    fn empty_block_means_in_cluster_defaults() {
        for yaml in [
            "discovery:\n  kubernetes: {}\n",
            "discovery:\n  kubernetes:\n",
        ] {
            let c = ok(yaml);
            assert!(!c.multi_cluster);
            assert_eq!(c.clusters.len(), 1);
            let k = &c.clusters[0];
            assert_eq!(k.id, "");
            assert_eq!(
                k.connection,
                Connection::Service {
                    schema: Schema::Https,
                    host: "10.96.0.1".into(),
                    port: 443,
                    ssl_verify: true,
                    ca_file: Some(DEFAULT_CA_FILE.into()),
                    token: None,
                    token_file: Some(DEFAULT_TOKEN_FILE.into()),
                }
            );
            assert_eq!(k.default_weight, 50);
            assert!(!k.watch_endpoint_slices && !k.watch_endpoint_slices_explicit);
            assert_eq!(k.source(), SourceKind::Endpoints);
            assert_eq!(c.settings, Settings::default());
        }
    }

    #[test]
    fn in_cluster_defaults_need_the_env() {
        let lines = errs_env("discovery: {kubernetes: {}}", &env_of(&[]));
        has(
            &lines,
            "discovery.kubernetes.service.host",
            "environment variable KUBERNETES_SERVICE_HOST is not set (in-cluster default",
        );
        has(
            &lines,
            "discovery.kubernetes.service.port",
            "KUBERNETES_SERVICE_PORT is not set",
        );
    }

    #[test]
    fn apisix_config_yaml_works_as_is() {
        let c = ok(r#"
apisix:
  node_listen: 9080
deployment:
  role: traditional
discovery:
  dns:
    servers: ["127.0.0.1:53"]
  kubernetes:
    service:
      schema: https
      host: "${KUBERNETES_SERVICE_HOST}"
      port: "${KUBERNETES_SERVICE_PORT}"
    client:
      token: "${TOKEN_VAR}"
    namespace_selector:
      match: ["dev", "prod-.*"]
    label_selector: "app=web,tier in (a,b)"
    default_weight: 0
    shared_size: 1m
    watch_endpoint_slices: true
plugins: [proxy-rewrite]
"#);
        let k = &c.clusters[0];
        match &k.connection {
            Connection::Service {
                token,
                token_file,
                ca_file,
                ..
            } => {
                assert_eq!(token.as_ref().map(Secret::expose), Some(TOKEN));
                assert_eq!(*token_file, None);
                // host was set explicitly: no in-cluster CA default
                assert_eq!(*ca_file, None);
            }
            other => panic!("{other:?}"),
        }
        assert!(k.namespace_selector.matches("prod-eu") && !k.namespace_selector.matches("dev-2"));
        assert_eq!(k.label_selector.as_str(), "app=web,tier in (a,b)");
        assert_eq!(k.default_weight, 0);
        assert_eq!(k.source(), SourceKind::EndpointSlice);
        assert!(k.watch_endpoint_slices_explicit);
        assert_eq!(k.convert_options(&c.settings).default_weight, 0);
    }

    #[test]
    fn explicit_service_and_port_forms() {
        let c = ok(
            "discovery: {kubernetes: {service: {schema: http, host: \"::1\", port: 6443}, client: {token_file: /t}}}",
        );
        match &c.clusters[0].connection {
            Connection::Service {
                schema,
                host,
                port,
                ssl_verify,
                ..
            } => {
                assert_eq!(
                    (*schema, host.as_str(), *port, *ssl_verify),
                    (Schema::Http, "::1", 6443, true)
                );
            }
            other => panic!("{other:?}"),
        }
        let c = ok(
            "discovery: {kubernetes: {service: {host: \"[fd00::1]\", port: \"8443\", ssl_verify: false, ca_file: /ca.pem}, client: {token_file: /t}}}",
        );
        match &c.clusters[0].connection {
            Connection::Service {
                host,
                port,
                ssl_verify,
                ca_file,
                ..
            } => {
                assert_eq!(
                    (host.as_str(), *port, *ssl_verify),
                    ("fd00::1", 8443, false)
                );
                assert_eq!(ca_file.as_deref(), Some(std::path::Path::new("/ca.pem")));
            }
            other => panic!("{other:?}"),
        }
        ok("discovery: {kubernetes: {service: {host: api.example.com, port: 443}}}");
    }

    #[test]
    fn schema_host_port_rules() {
        let lines = errs(
            "discovery: {kubernetes: {service: {schema: ftp, host: \"bad host!\", port: 70000}}}",
        );
        has(
            &lines,
            "discovery.kubernetes.service.schema",
            "must be \"http\" or \"https\"",
        );
        has(
            &lines,
            "discovery.kubernetes.service.host",
            "is not an IPv4 address, an IPv6 address or a DNS name",
        );
        has(
            &lines,
            "discovery.kubernetes.service.port",
            "must be a port number 1..65535",
        );
        has(
            &errs("discovery: {kubernetes: {service: {port: 0}}}"),
            "discovery.kubernetes.service.port",
            "1..65535",
        );
        has(
            &errs("discovery: {kubernetes: {service: {port: abc}}}"),
            "discovery.kubernetes.service.port",
            "1..65535",
        );
        has(
            &errs("discovery: {kubernetes: {service: {port: [1]}}}"),
            "discovery.kubernetes.service.port",
            "must be a port number",
        );
    }

    #[test]
    fn env_expansion_rules() {
        let lines = errs(
            "discovery: {kubernetes: {service: {host: \"${NOPE}\"}, client: {token: \"${ALSO_NOPE}\"}}}",
        );
        has(
            &lines,
            "discovery.kubernetes.service.host",
            "environment variable NOPE is not set",
        );
        has(
            &lines,
            "discovery.kubernetes.client.token",
            "environment variable ALSO_NOPE is not set",
        );
        has(
            &errs("discovery: {kubernetes: {service: {host: \"${BROKEN\"}}}"),
            "discovery.kubernetes.service.host",
            "unterminated",
        );
        has(
            &errs("discovery: {kubernetes: {service: {host: \"${1X}\"}}}"),
            "discovery.kubernetes.service.host",
            "not a valid environment variable reference",
        );
        // Embedded references work too.
        let env = env_of(&[
            ("KUBERNETES_SERVICE_HOST", "h"),
            ("KUBERNETES_SERVICE_PORT", "1"),
            ("DIR", "/secrets"),
        ]);
        let c = parse_config(
            "discovery: {kubernetes: {client: {token_file: \"${DIR}/token\"}}}",
            &env,
        )
        .unwrap();
        match &c.clusters[0].connection {
            Connection::Service { token_file, .. } => assert_eq!(
                token_file.as_deref(),
                Some(std::path::Path::new("/secrets/token"))
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_unset_variable_does_not_hide_other_errors_nor_add_fake_ones() {
        let lines = errs(
            "discovery: {kubernetes: {service: {schema: ftp, host: \"${NOPE}\"}, client: {token: \"${NOPE2}\"}}}",
        );
        assert_eq!(lines.len(), 3, "{lines:?}");
        has(
            &lines,
            "discovery.kubernetes.service.host",
            "NOPE is not set",
        );
        has(
            &lines,
            "discovery.kubernetes.client.token",
            "NOPE2 is not set",
        );
        has(
            &lines,
            "discovery.kubernetes.service.schema",
            "must be \"http\" or \"https\"",
        );
    }

    #[test]
    fn token_rules_never_echo_the_token() {
        let lines = errs(&format!(
            "discovery: {{kubernetes: {{client: {{token: \"{TOKEN}\", token_file: /t}}}}}}"
        ));
        has(
            &lines,
            "discovery.kubernetes.client",
            "either token or token_file, not both",
        );
        let bad = format!("{TOKEN}$%");
        let lines = errs(&format!(
            "discovery: {{kubernetes: {{client: {{token: \"{bad}\"}}}}}}"
        ));
        has(
            &lines,
            "discovery.kubernetes.client.token",
            "outside [A-Za-z0-9+/._=-] (value not shown)",
        );
        assert!(!lines.join("\n").contains(&bad));
        let long = "a".repeat(4097);
        has(
            &errs(&format!(
                "discovery: {{kubernetes: {{client: {{token: {long}}}}}}}"
            )),
            "discovery.kubernetes.client.token",
            "longer than 4096",
        );
        // Whitespace is stripped (APISIX), so a wrapped token is fine.
        let c = ok("discovery: {kubernetes: {client: {token: \"abc\\n def \"}}}");
        match &c.clusters[0].connection {
            Connection::Service { token, .. } => {
                assert_eq!(token.as_ref().map(Secret::expose), Some("abcdef"))
            }
            other => panic!("{other:?}"),
        }
        // A non-string token is rejected without echoing it.
        let lines = errs("discovery: {kubernetes: {client: {token: 1234567}}}");
        has(
            &lines,
            "discovery.kubernetes.client.token",
            "must be a string (value not shown)",
        );
        assert!(!lines.join("\n").contains("1234567"));
        // A token written where the client mapping belongs is not echoed either.
        let lines = errs(&format!(
            "discovery: {{kubernetes: {{client: \"{TOKEN}\"}}}}"
        ));
        has(
            &lines,
            "discovery.kubernetes.client",
            "invalid type: string (value not shown), expected a mapping",
        );
        // Tokens expanded from the environment are not echoed either.
        let env = env_of(&[
            ("KUBERNETES_SERVICE_HOST", "h"),
            ("KUBERNETES_SERVICE_PORT", "1"),
            ("T", "bad token%%zqxj"),
        ]);
        let lines = errs_env("discovery: {kubernetes: {client: {token: \"${T}\"}}}", &env);
        has(&lines, "discovery.kubernetes.client.token", "outside");
        assert!(!lines.join("\n").contains("zqxj"), "{lines:?}");
    }

    #[test]
    fn https_with_empty_token_is_an_error_http_is_not() {
        has(
            &errs("discovery: {kubernetes: {client: {token: \"\"}}}"),
            "discovery.kubernetes.client",
            "token is empty but the API server schema is https",
        );
        ok("discovery: {kubernetes: {service: {schema: http}, client: {token: \"\"}}}");
    }

    #[test]
    fn token_file_length() {
        has(
            &errs("discovery: {kubernetes: {client: {token_file: \"\"}}}"),
            "discovery.kubernetes.client.token_file",
            "1..500",
        );
        let long = format!("/{}", "x".repeat(500));
        has(
            &errs(&format!(
                "discovery: {{kubernetes: {{client: {{token_file: {long}}}}}}}"
            )),
            "discovery.kubernetes.client.token_file",
            "got 501",
        );
    }

    #[test]
    fn client_without_credentials() {
        has(
            &errs("discovery: {kubernetes: [{id: a, service: {host: h, port: 1}, client: {}}]}"),
            "discovery.kubernetes[0].client",
            "one of token or token_file is required",
        );
    }

    #[test]
    fn namespace_selector_exactly_one_form() {
        has(
            &errs("discovery: {kubernetes: {namespace_selector: {}}}"),
            "discovery.kubernetes.namespace_selector",
            "(none is)",
        );
        has(
            &errs("discovery: {kubernetes: {namespace_selector: {equal: a, match: [b]}}}"),
            "discovery.kubernetes.namespace_selector",
            "(found equal, match)",
        );
        let c = ok("discovery: {kubernetes: {namespace_selector: {not_equal: kube-system}}}");
        assert_eq!(
            c.clusters[0].namespace_selector.field_selector().as_deref(),
            Some("metadata.namespace!=kube-system")
        );
        let c = ok("discovery: {kubernetes: {namespace_selector: {equal: default}}}");
        assert_eq!(
            c.clusters[0].namespace_selector.single_namespace(),
            Some("default")
        );
        let c = ok("discovery: {kubernetes: {namespace_selector: {not_match: [\"kube-.*\"]}}}");
        assert!(!c.clusters[0].namespace_selector.matches("kube-system"));
        has(
            &errs("discovery: {kubernetes: {namespace_selector: {equal: Bad_NS}}}"),
            "discovery.kubernetes.namespace_selector.equal",
            "not a valid namespace name",
        );
    }

    #[test]
    fn regexes_must_compile_and_lists_be_non_empty() {
        let lines =
            errs("discovery: {kubernetes: {namespace_selector: {match: [ok, \"(unclosed\"]}}}");
        has(
            &lines,
            "discovery.kubernetes.namespace_selector.match[1]",
            "is not a valid regex",
        );
        has(
            &errs("discovery: {kubernetes: {namespace_selector: {not_match: []}}}"),
            "discovery.kubernetes.namespace_selector.not_match",
            "at least one regex",
        );
    }

    #[test]
    fn label_selector_must_parse() {
        has(
            &errs("discovery: {kubernetes: {label_selector: \"app in (a\"}}"),
            "discovery.kubernetes.label_selector",
            "not a valid label selector",
        );
    }

    /// The grammar is the API server's (`k8s_syntax`): what it accepts loads,
    /// `>`/`<` and `in ()` included (refused before), and errors are its texts.
    #[test]
    fn label_selector_takes_what_the_api_server_takes() {
        for sel in ["a>1", "gen<10,app=web", "x in ()"] {
            let c = ok(&format!(
                "discovery: {{kubernetes: {{label_selector: \"{sel}\"}}}}"
            ));
            assert_eq!(c.clusters[0].label_selector.as_str(), sel);
        }
        let c = ok("discovery: {kubernetes: {label_selector: \"a>1\"}}");
        let l = |v: &str| BTreeMap::from([("a".to_string(), v.to_string())]);
        assert!(c.clusters[0].label_selector.matches(&l("2")));
        assert!(!c.clusters[0].label_selector.matches(&l("1")));
        has(
            &errs("discovery: {kubernetes: {label_selector: \"a>x\"}}"),
            "discovery.kubernetes.label_selector",
            "is not a valid label selector: unable to parse requirement: values[0]: Invalid value: \"x\": for 'Gt', 'Lt' operators, the value must be an integer",
        );
    }

    /// Object names are the API server's DNS-1123 subdomains: labels over 63
    /// characters are fine (they were refused before), 253 in all.
    #[test]
    fn object_names_are_dns1123_subdomains() {
        let long_label = "a".repeat(64);
        let c = ok(&format!(
            "discovery: {{kubernetes: {{}}}}\nkube_discovery: {{leader_election: {{lease_name: {long_label}}}}}"
        ));
        assert_eq!(c.settings.leader_election.lease_name, long_label);
        for bad in ["a..b", "-a", &"a".repeat(254)] {
            has(
                &errs(&format!(
                    "discovery: {{kubernetes: {{}}}}\nkube_discovery: {{sinks: {{configmap: {{name: \"{bad}\"}}}}}}"
                )),
                "kube_discovery.sinks.configmap.name",
                "not a valid object name",
            );
        }
    }

    #[test]
    fn default_weight_range_and_shared_size() {
        has(
            &errs("discovery: {kubernetes: {default_weight: -1}}"),
            "discovery.kubernetes.default_weight",
            "must be an integer >= 0",
        );
        has(
            &errs("discovery: {kubernetes: {default_weight: 1.5}}"),
            "discovery.kubernetes.default_weight",
            "invalid type",
        );
        has(
            &errs("discovery: {kubernetes: {shared_size: lots}}"),
            "discovery.kubernetes.shared_size",
            "size like 1m",
        );
        ok("discovery: {kubernetes: {shared_size: 10m}}");
    }

    #[test]
    fn unknown_keys_are_errors_including_the_misspelt_slices_flag() {
        has(
            &errs("discovery: {kubernetes: {watch_endpoint_slice: true}}"),
            "discovery.kubernetes.watch_endpoint_slice",
            "unknown field `watch_endpoint_slice`",
        );
        has(
            &errs("discovery: {kubernetes: {service: {hots: x}}}"),
            "discovery.kubernetes.service.hots",
            "unknown field `hots`",
        );
        has(
            &errs("discovery: {kubernetes: {}}\nkube_discovery: {colesce_window: 1s}"),
            "kube_discovery.colesce_window",
            "unknown field `colesce_window`",
        );
    }

    const MULTI: &str = r#"
discovery:
  kubernetes:
    - id: release
      service: {schema: https, host: "1.2.3.4", port: 6443}
      client: {token: "${TOKEN_VAR}"}
    - id: dev2
      kubeconfig: /etc/kd/dev.kubeconfig
      context: dev
      watch_endpoint_slices: true
"#;

    #[test]
    fn multi_cluster_parses() {
        let c = ok(MULTI);
        assert!(c.multi_cluster);
        assert_eq!(
            c.clusters.iter().map(|k| k.id.as_str()).collect::<Vec<_>>(),
            vec!["release", "dev2"]
        );
        match &c.clusters[0].connection {
            Connection::Service {
                ca_file,
                token_file,
                ..
            } => assert_eq!((ca_file, token_file), (&None, &None)),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            c.clusters[1].connection,
            Connection::Kubeconfig {
                path: Some("/etc/kd/dev.kubeconfig".into()),
                context: Some("dev".into())
            }
        );
        assert!(c.cluster("dev2").is_some());
        let idx = c.clusters[1].new_index(&c.settings);
        assert_eq!(idx.cluster(), "dev2");
        assert_eq!(idx.source(), SourceKind::EndpointSlice);
    }

    #[test]
    fn multi_cluster_rules() {
        let lines = errs(
            r#"
discovery:
  kubernetes:
    - id: Bad_Id
      service: {host: h, port: 1}
      client: {token_file: /t}
    - id: abc
      service: {host: h, port: 1}
      client: {token_file: /t}
    - id: abc
      service: {host: h, port: 1}
      client: {token_file: /t}
    - service: {host: h, port: 1}
      client: {token_file: /t}
    - id: nodef
    - id: nohost
      service: {schema: https}
      client: {token_file: /t}
    - id: toolongid
      service: {host: h, port: 1}
      client: {token_file: /t}
    - "not a mapping"
"#,
        );
        has(
            &lines,
            "discovery.kubernetes[0].id",
            "must match ^[a-z0-9]{1,8}$",
        );
        has(
            &lines,
            "discovery.kubernetes[2].id",
            "duplicate cluster id \"abc\"",
        );
        has(
            &lines,
            "discovery.kubernetes[3].id",
            "is required in the multi-cluster",
        );
        // No defaults for service/client in the multi-cluster form.
        has(
            &lines,
            "discovery.kubernetes[4].service",
            "is required in the multi-cluster form",
        );
        has(
            &lines,
            "discovery.kubernetes[4].client",
            "is required in the multi-cluster form",
        );
        has(
            &lines,
            "discovery.kubernetes[5].service.host",
            "is required",
        );
        has(
            &lines,
            "discovery.kubernetes[5].service.port",
            "is required",
        );
        has(&lines, "discovery.kubernetes[6].id", "must match");
        has(&lines, "discovery.kubernetes[7]", "must be a mapping");
        has(
            &errs("discovery: {kubernetes: []}"),
            "discovery.kubernetes",
            "at least one cluster",
        );
        has(
            &errs("discovery: {kubernetes: {id: x}}"),
            "discovery.kubernetes.id",
            "only allowed in the multi-cluster",
        );
        has(
            &errs("discovery: {kubernetes: [{id: a, service: {host: h, port: 1}}]}"),
            "discovery.kubernetes[0].client",
            "is required in the multi-cluster",
        );
    }

    #[test]
    fn kubeconfig_and_service_are_alternatives() {
        let c = ok("discovery: {kubernetes: {kubeconfig: /k}}");
        assert_eq!(
            c.clusters[0].connection,
            Connection::Kubeconfig {
                path: Some("/k".into()),
                context: None
            }
        );
        let c = ok("discovery: {kubernetes: {context: kind-a}}");
        assert_eq!(
            c.clusters[0].connection,
            Connection::Kubeconfig {
                path: None,
                context: Some("kind-a".into())
            }
        );
        has(
            &errs("discovery: {kubernetes: {kubeconfig: /k, service: {host: h}}}"),
            "discovery.kubernetes.kubeconfig",
            "alternatives",
        );
        has(
            &errs("discovery: {kubernetes: {kubeconfig: \"\"}}"),
            "discovery.kubernetes.kubeconfig",
            "non-empty",
        );
    }

    #[test]
    fn type_errors_name_the_field_not_internal_types() {
        let lines = errs("discovery: {kubernetes: {service: 5}}\nkube_discovery: 7");
        has(
            &lines,
            "discovery.kubernetes.service",
            "invalid type: integer `5`, expected a mapping",
        );
        has(&lines, "kube_discovery", "must be a mapping");
        assert!(!lines.join("\n").contains("Raw"), "{lines:?}");
        let lines = errs("discovery: {kubernetes: {}}\nkube_discovery: {sinks: {configmap: true}}");
        has(
            &lines,
            "kube_discovery.sinks.configmap",
            "invalid type: boolean `true`, expected a mapping",
        );
    }

    #[test]
    fn top_level_shape_errors() {
        has(&errs("apisix: {}"), "discovery.kubernetes", "is missing");
        has(
            &errs("discovery: {kubernetes: 5}"),
            "discovery.kubernetes",
            "must be a mapping (single cluster) or a list",
        );
        has(&errs("- a\n- b"), "config", "must be a YAML mapping");
        has(
            &errs("discovery: {kubernetes: {a: [}"),
            "config",
            "invalid YAML",
        );
    }

    #[test]
    fn errors_are_one_line_each_and_all_reported() {
        let e = parse_config(
            "discovery: {kubernetes: {service: {schema: ftp, port: 0}, default_weight: -3}}\nkube_discovery: {write_concurrency: 0}",
            &pod_env(),
        )
        .unwrap_err();
        assert_eq!(e.0.len(), 4, "{e}");
        assert_eq!(e.to_string().lines().count(), 4);
        for line in e.to_string().lines() {
            assert!(line.contains(": "), "{line}");
        }
    }

    #[test]
    fn leader_election_timings_default_to_client_go_proportions_or_are_checked() {
        let base = "discovery: {kubernetes: {}}\nkube_discovery:\n  leader_election: ";
        let c = ok(&format!("{base}{{enabled: true, lease_duration: 30s}}\n"));
        let le = &c.settings.leader_election;
        assert_eq!((le.renew_deadline, le.retry_period), (None, None));
        let c = ok(&format!(
            "{base}{{lease_duration: 30s, renew_deadline: 20s, retry_period: 500ms}}\n"
        ));
        let le = &c.settings.leader_election;
        assert_eq!(le.renew_deadline, Some(Duration::from_secs(20)));
        assert_eq!(le.retry_period, Some(Duration::from_millis(500)));
        // Ordering against the effective (possibly derived) values.
        let lines = errs(&format!(
            "{base}{{lease_duration: 15s, renew_deadline: 15s}}\n"
        ));
        has(
            &lines,
            "kube_discovery.leader_election.renew_deadline",
            "shorter than lease_duration (15s)",
        );
        // Unset renew deadline of a 15 s lease is 10 s.
        let lines = errs(&format!("{base}{{retry_period: 10s}}\n"));
        has(
            &lines,
            "kube_discovery.leader_election.retry_period",
            "shorter than the renew deadline (10s)",
        );
        let lines = errs(&format!(
            "{base}{{retry_period: 10ms, renew_deadline: soon}}\n"
        ));
        has(&lines, "kube_discovery.leader_election.retry_period", "");
        has(
            &lines,
            "kube_discovery.leader_election.renew_deadline",
            "is not a duration",
        );
    }

    #[test]
    fn kube_discovery_settings_defaults_and_values() {
        let c = ok(r#"
discovery: {kubernetes: {}}
kube_discovery:
  coalesce_window: 250ms
  drain_terminating: true
  index_port_numbers: true
  topology: true
  watch_timeout: 1m
  write_concurrency: 4
  write_qps: 12.5
  http: {addr: "127.0.0.1:9090", auth_token_file: /etc/kd/token}
  sinks:
    discoveredservices: {enabled: true, namespace_mode: fixed, namespace: kube-discovery}
    configmap: {enabled: true, namespace: kd}
  home: {kubeconfig: /home.kubeconfig, context: home}
  leader_election: {enabled: true, lease_namespace: kd, lease_duration: 20s}
"#);
        let s = &c.settings;
        assert_eq!(s.coalesce_window, Duration::from_millis(250));
        assert!(s.drain_terminating && s.index_port_numbers && s.topology);
        assert_eq!(s.watch_timeout, Duration::from_secs(60));
        assert_eq!((s.write_concurrency, s.write_qps), (4, 12.5));
        assert_eq!(s.http.addr, "127.0.0.1:9090".parse().unwrap());
        assert_eq!(
            s.http.auth_token_file.as_deref(),
            Some(std::path::Path::new("/etc/kd/token"))
        );
        assert_eq!(
            s.sinks.discoveredservices.naming,
            ObjectNaming::fixed("kube-discovery")
        );
        assert!(s.sinks.configmap.enabled);
        assert_eq!(s.sinks.configmap.namespace.as_deref(), Some("kd"));
        assert_eq!(s.sinks.configmap.name, "kube-discovery-nodes");
        assert_eq!(s.home.context.as_deref(), Some("home"));
        assert!(s.leader_election.enabled);
        assert_eq!(s.leader_election.lease_name, "kube-discovery");
        assert_eq!(s.leader_election.lease_duration, Duration::from_secs(20));
        let o = c.clusters[0].convert_options(s);
        assert!(o.drain_terminating && o.index_port_numbers && o.topology);
    }

    #[test]
    fn kube_discovery_settings_rules() {
        let lines = errs(
            r#"
discovery: {kubernetes: {}}
kube_discovery:
  coalesce_window: soon
  watch_timeout: 10m
  write_concurrency: 0
  write_qps: 0
  http: {addr: "localhost"}
  sinks:
    discoveredservices: {namespace_mode: fixed}
    configmap: {enabled: true, name: "Bad_Name"}
  leader_election: {lease_duration: 0s, lease_namespace: "a.b"}
"#,
        );
        has(
            &lines,
            "kube_discovery.coalesce_window",
            "is not a duration",
        );
        has(
            &lines,
            "kube_discovery.watch_timeout",
            "must be between 1s and 290s",
        );
        has(
            &lines,
            "kube_discovery.write_concurrency",
            "0 must be between 1 and 256",
        );
        has(
            &lines,
            "kube_discovery.write_qps",
            "must be between 0.1 and 10000",
        );
        has(&lines, "kube_discovery.http.addr", "must be ip:port");
        has(
            &lines,
            "kube_discovery.sinks.discoveredservices.namespace",
            "required with namespace_mode: fixed",
        );
        has(
            &lines,
            "kube_discovery.sinks.configmap.namespace",
            "required when the configmap sink is enabled",
        );
        has(
            &lines,
            "kube_discovery.sinks.configmap.name",
            "not a valid object name",
        );
        has(
            &lines,
            "kube_discovery.leader_election.lease_duration",
            "between 1s and 300s",
        );
        has(
            &lines,
            "kube_discovery.leader_election.lease_namespace",
            "not a valid namespace name",
        );
        has(
            &errs(
                "discovery: {kubernetes: {}}\nkube_discovery: {sinks: {discoveredservices: {namespace: x}}}",
            ),
            "kube_discovery.sinks.discoveredservices.namespace",
            "only used with namespace_mode: fixed",
        );
        has(
            &errs(
                "discovery: {kubernetes: {}}\nkube_discovery: {sinks: {discoveredservices: {namespace_mode: other}}}",
            ),
            "kube_discovery.sinks.discoveredservices.namespace_mode",
            "\"source\" or \"fixed\"",
        );
    }

    #[test]
    fn redacted_json_hides_tokens() {
        let c = ok(
            "discovery: {kubernetes: {client: {token: \"${TOKEN_VAR}\"}, namespace_selector: {match: [\"a.*\"]}}}",
        );
        let v = c.redacted_json();
        let text = v.to_string();
        assert!(!text.contains(TOKEN), "{text}");
        assert_eq!(
            v["discovery"]["kubernetes"]["client"]["token"],
            "<redacted>"
        );
        assert_eq!(v["discovery"]["kubernetes"]["service"]["host"], "10.96.0.1");
        assert_eq!(
            v["discovery"]["kubernetes"]["namespace_selector"]["match"][0],
            "a.*"
        );
        assert_eq!(v["kube_discovery"]["coalesce_window"], "100ms");
        assert!(!format!("{c:?}").contains(TOKEN));
        let m = ok(MULTI);
        let dump = m.kubernetes_redacted_json();
        assert!(dump.is_array());
        assert_eq!(dump[0]["id"], "release");
        assert_eq!(dump[0]["client"]["token"], "<redacted>");
        assert!(!m.redacted_json().to_string().contains(TOKEN));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("100ms").unwrap(), Duration::from_millis(100));
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("1m 30s").unwrap(), Duration::from_secs(90));
        assert!(parse_duration("-5s").is_err());
        assert!(parse_duration("5").is_err());
    }
}
