//! The per-key rules garde runs on the raw values (after `${VAR}` expansion
//! and defaults): `fn(&value, &context) -> garde::Result`, named by the
//! garde attributes of [`super::raw`]. Each message is the text after
//! `path: ` of one error line. The two rules that look inside a raw type
//! (`check_client`, `check_exactly_one`) are in `raw.rs`, next to it, so this
//! module uses nothing of the raw document.
//!
//! A few rules look at a sibling key (`client` at the schema and at
//! `kubeconfig`, `namespace` at `namespace_mode`): garde passes the sibling
//! in, so each problem is still reported once, on the key the user must fix.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use serde_json::Value;

use super::duration::{format_duration, parse_duration};
use super::secret::Secret;
use crate::source::convert::Drain;
use crate::source::filter::{AnchoredRegex, LabelSelector};

/// Validation context of a cluster entry.
pub(super) struct Ctx {
    /// The entry is an item of the multi-cluster list.
    pub(super) multi: bool,
}

pub(super) fn err(msg: impl Into<String>) -> garde::Result {
    Err(garde::Error::new(msg.into()))
}

// ---------------------------------------------------------------- discovery.kubernetes

/// Longest cluster id (APISIX: `^[a-z0-9]{1,64}$`). Object names and label
/// values of longer-than-63 ids are shortened with a hash (`crd::label_value`,
/// `ObjectNaming::name`); the spec keeps the whole id.
pub const MAX_CLUSTER_ID_LENGTH: usize = 64;

pub(super) fn check_id(v: &Option<String>, ctx: &Ctx) -> garde::Result {
    match (v, ctx.multi) {
        (None, true) => err("is required in the multi-cluster (list) form"),
        (Some(_), false) => err("is only allowed in the multi-cluster (list) form"),
        (Some(id), true) => {
            // APISIX's rule since apisix#12536 (it was `{1,8}` before).
            if !id.is_empty()
                && id.len() <= MAX_CLUSTER_ID_LENGTH
                && id
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            {
                Ok(())
            } else {
                err(format!(
                    "{id:?} must match ^[a-z0-9]{{1,{MAX_CLUSTER_ID_LENGTH}}}$"
                ))
            }
        }
        (None, false) => Ok(()),
    }
}

pub(super) fn check_schema(v: &Option<String>, _: &Ctx) -> garde::Result {
    match v.as_deref() {
        None | Some("http") | Some("https") => Ok(()),
        Some(s) => err(format!("{s:?} must be \"http\" or \"https\"")),
    }
}

fn is_hostname(s: &str) -> bool {
    let s = s.strip_suffix('.').unwrap_or(s);
    k8s_syntax::is_dns_name(&s.to_ascii_lowercase())
}

pub(super) fn check_host(v: &Option<String>, _: &Ctx) -> garde::Result {
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

pub(super) fn check_port(v: &Option<String>, _: &Ctx) -> garde::Result {
    let Some(p) = v else { return Ok(()) };
    match p.trim().parse::<u32>() {
        Ok(n) if (1..=65535).contains(&n) => Ok(()),
        _ => err(format!("{p:?} must be a port number 1..65535")),
    }
}

pub(super) fn check_path_len(max: usize) -> impl FnOnce(&Option<String>, &Ctx) -> garde::Result {
    move |v, _| match v {
        Some(p) if p.is_empty() || p.chars().count() > max => err(format!(
            "must be a path of 1..{max} characters (got {})",
            p.chars().count()
        )),
        _ => Ok(()),
    }
}

pub(super) fn check_token(v: &Option<Secret>, _: &Ctx) -> garde::Result {
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

pub(super) fn strip_ws(s: &str) -> String {
    s.chars().filter(|c| !c.is_whitespace()).collect()
}

pub(super) fn check_kubeconfig(
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

pub(super) fn check_context(v: &Option<String>, _: &Ctx) -> garde::Result {
    match v {
        Some(c) if c.is_empty() => err("must not be empty"),
        _ => Ok(()),
    }
}

pub(super) fn check_namespace_name(v: &Option<String>, _: &Ctx) -> garde::Result {
    let Some(ns) = v else { return Ok(()) };
    if k8s_syntax::is_dns1123_label(ns) {
        Ok(())
    } else {
        err(format!(
            "{ns:?} is not a valid namespace name (RFC 1123 label)"
        ))
    }
}

pub(super) fn check_regex_list(v: &Option<Vec<String>>, _: &Ctx) -> garde::Result {
    match v {
        Some(l) if l.is_empty() => err("must list at least one regex"),
        _ => Ok(()),
    }
}

pub(super) fn check_regex(v: &String, _: &Ctx) -> garde::Result {
    match AnchoredRegex::new(v) {
        Ok(_) => Ok(()),
        Err(e) => err(format!(
            "{v:?} is not a valid regex: {}",
            e.to_string().lines().last().unwrap_or("invalid")
        )),
    }
}

pub(super) fn check_label_selector(v: &Option<String>, _: &Ctx) -> garde::Result {
    match v.as_deref().map(LabelSelector::parse) {
        Some(Err(e)) => err(format!("is not a valid label selector: {e}")),
        _ => Ok(()),
    }
}

pub(super) fn check_weight(v: &Option<i64>, _: &Ctx) -> garde::Result {
    match v {
        Some(w) if *w < 0 || *w > i64::from(u32::MAX) => {
            err(format!("{w} must be an integer >= 0 (and <= {})", u32::MAX))
        }
        _ => Ok(()),
    }
}

pub(super) fn check_shared_size(v: &Option<String>, _: &Ctx) -> garde::Result {
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

// ---------------------------------------------------------------- kube_discovery

pub(super) fn check_duration(
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

pub(super) fn check_concurrency(v: &Option<u64>, _: &()) -> garde::Result {
    match v {
        Some(n) if !(1..=256).contains(n) => err(format!("{n} must be between 1 and 256")),
        _ => Ok(()),
    }
}

pub(super) fn check_qps(v: &Option<f64>, _: &()) -> garde::Result {
    match v {
        Some(q) if !(0.1..=10000.0).contains(q) => err(format!(
            "{q} must be between 0.1 and 10000 writes per second"
        )),
        _ => Ok(()),
    }
}

pub(super) fn check_socket_addr(v: &Option<String>, _: &()) -> garde::Result {
    match v {
        Some(a) if a.parse::<SocketAddr>().is_err() => {
            err(format!("{a:?} must be ip:port, e.g. 0.0.0.0:8080"))
        }
        _ => Ok(()),
    }
}

/// `xds.addr`: `ip:port`; required once any other `xds` key is set (without
/// it xDS is off, and TLS or a token set for nothing is a mistake to report).
pub(super) fn check_xds_addr(
    others: Vec<&'static str>,
) -> impl FnOnce(&Option<String>, &()) -> garde::Result {
    move |v, ctx| match v {
        None if !others.is_empty() => err(format!(
            "is required when {} is set (without addr xDS is off; remove the xds section to turn it off)",
            others.join(", ")
        )),
        v => check_socket_addr(v, ctx),
    }
}

/// `xds.cert_file` / `xds.key_file`: both or neither; reported on the missing
/// one, naming the one that is set.
pub(super) fn check_xds_pair(
    other: &'static str,
    other_set: bool,
) -> impl FnOnce(&Option<String>, &()) -> garde::Result {
    move |v, _| match v {
        None if other_set => err(format!("is required when {other} is set")),
        _ => Ok(()),
    }
}

/// `xds.client_ca_file`: mTLS is TLS that also checks client certificates,
/// so it needs the server's `cert_file` and `key_file`.
pub(super) fn check_xds_client_ca(
    tls_set: bool,
) -> impl FnOnce(&Option<String>, &()) -> garde::Result {
    move |v, _| match v {
        Some(_) if !tls_set => err(
            "needs cert_file and key_file (client certificates are checked on a TLS connection)",
        ),
        _ => Ok(()),
    }
}

/// Two listen addresses one process cannot both bind: the same port (not 0,
/// which picks a free one) on the same address, or one of them the
/// wildcard of its family (`[::]` also takes IPv4 on a dual-stack host).
pub(super) fn addrs_conflict(a: SocketAddr, b: SocketAddr) -> bool {
    if a.port() != b.port() || a.port() == 0 {
        return false;
    }
    let (x, y) = (a.ip(), b.ip());
    let v6_any = |ip: IpAddr| ip.is_ipv6() && ip.is_unspecified();
    x == y
        || v6_any(x)
        || v6_any(y)
        || (x.is_ipv4() == y.is_ipv4() && (x.is_unspecified() || y.is_unspecified()))
}

pub(super) fn check_plain_path(v: &Option<String>, _: &()) -> garde::Result {
    match v {
        Some(p) if p.is_empty() || p.len() > 4096 => err("must be a path of 1..4096 characters"),
        _ => Ok(()),
    }
}

pub(super) fn check_plain_context(v: &Option<String>, _: &()) -> garde::Result {
    match v {
        Some(c) if c.is_empty() => err("must not be empty"),
        _ => Ok(()),
    }
}

pub(super) fn check_plain_namespace(v: &Option<String>, _: &()) -> garde::Result {
    check_namespace_name(v, &Ctx { multi: false })
}

pub(super) fn check_object_name(v: &Option<String>, _: &()) -> garde::Result {
    match v {
        Some(n) if !k8s_syntax::is_dns1123_subdomain(n) => err(format!(
            "{n:?} is not a valid object name (RFC 1123 subdomain)"
        )),
        _ => Ok(()),
    }
}

pub(super) fn check_instance(v: &Option<String>, _: &()) -> garde::Result {
    match v {
        Some(n) if !k8s_syntax::is_dns1123_label(n) => err(format!(
            "{n:?} is not a valid instance name (a DNS label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit)"
        )),
        _ => Ok(()),
    }
}

pub(super) fn check_adopt_instances(v: &Option<Vec<String>>, _: &()) -> garde::Result {
    for n in v.iter().flatten() {
        check_instance(&Some(n.clone()), &())?;
    }
    Ok(())
}

/// `kube_discovery.drain_terminating`: `false`, `true` (= `"fallback"`) or
/// `"always"`; `None` for anything else.
pub(super) fn drain_of(v: &Value) -> Option<Drain> {
    match v {
        Value::Bool(false) => Some(Drain::Off),
        Value::Bool(true) => Some(Drain::Fallback),
        Value::String(s) if s == "fallback" => Some(Drain::Fallback),
        Value::String(s) if s == "always" => Some(Drain::Always),
        _ => None,
    }
}

pub(super) fn check_drain(v: &Option<Value>, _: &()) -> garde::Result {
    match v {
        Some(d) if drain_of(d).is_none() => err(format!(
            "{d} must be false, true (same as \"fallback\") or \"always\""
        )),
        _ => Ok(()),
    }
}

pub(super) fn check_namespace_mode(v: &Option<String>, _: &()) -> garde::Result {
    match v.as_deref() {
        None | Some("source") | Some("fixed") => Ok(()),
        Some(m) => err(format!("{m:?} must be \"source\" or \"fixed\"")),
    }
}

pub(super) fn check_export(v: &Option<String>, _: &()) -> garde::Result {
    match v.as_deref() {
        None | Some("all") | Some("opt-in") => Ok(()),
        Some(m) => err(format!("{m:?} must be \"all\" or \"opt-in\"")),
    }
}

pub(super) fn check_allow_regex(v: &String, _: &()) -> garde::Result {
    check_regex(v, &Ctx { multi: false })
}

pub(super) fn check_fixed_namespace(
    mode: Option<&str>,
) -> impl FnOnce(&Option<String>, &()) -> garde::Result + '_ {
    move |v, _| match (mode, v) {
        (Some("fixed"), None) => err("is required with namespace_mode: fixed"),
        (Some("fixed"), ns @ Some(_)) => check_plain_namespace(ns, &()),
        (_, Some(_)) => err("is only used with namespace_mode: fixed"),
        _ => Ok(()),
    }
}

pub(super) fn check_cm_namespace(
    enabled: bool,
) -> impl FnOnce(&Option<String>, &()) -> garde::Result {
    move |v, _| match v {
        None if enabled => err("is required when the configmap sink is enabled"),
        ns => check_plain_namespace(ns, &()),
    }
}
