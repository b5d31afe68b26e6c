//! What a gateway may be given for one service: which nodes are usable, and
//! what happens when none are.
//!
//! * A node is usable when its port is 1..=65535, its weight is > 0 (weight 0
//!   means "no traffic" in APISIX too; a draining node of
//!   `drain_terminating: always` has weight 0 and is left out without a
//!   warning, since it is expected) and its host is an IP address or, where
//!   the gateway can resolve names (nginx), a DNS name. Anything else is
//!   dropped with a reason, so no DiscoveredService content can ever put
//!   characters such as `;` or `}` into a gateway config.
//! * A service that is missing (no DiscoveredService, or no such port) and one
//!   with no usable node are treated the same, per [`EmptyPolicy`]:
//!   `keep` serves the last non-empty set seen by this process (and 503 until
//!   one was seen); `503` answers 503 right away.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use kube_discovery_core::{Node, parse_service_name};

/// What to do when a service has no usable node (or is missing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "sync", derive(clap::ValueEnum))]
pub enum EmptyPolicy {
    /// Keep serving the last non-empty set (503 until one was seen). Safe when
    /// the controller or API server hiccups; slower to notice a real scale-to-zero.
    #[default]
    #[cfg_attr(feature = "sync", value(name = "keep"))]
    Keep,
    /// Answer 503 as soon as the set is empty or the service is missing.
    #[cfg_attr(feature = "sync", value(name = "503"))]
    Serve503,
}

impl fmt::Display for EmptyPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EmptyPolicy::Keep => "keep",
            EmptyPolicy::Serve503 => "503",
        })
    }
}

/// One service a gateway routes to: `[UPSTREAM=][id/]namespace/name:port`.
/// Without `UPSTREAM=`, the upstream/backend name is derived from the service
/// name (`kd_` + the name with every non-alphanumeric character as `_`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceRef {
    /// nginx `upstream` / HAProxy `backend` name.
    pub upstream: String,
    /// The APISIX service name, e.g. `default/web:http`.
    pub service: String,
}

/// Whether `s` is a safe upstream/backend name (`[A-Za-z0-9_.-]`, 1..=64).
pub fn is_upstream_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
}

impl FromStr for ServiceRef {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (upstream, service) = match s.split_once('=') {
            Some((u, svc)) => (Some(u.trim()), svc.trim()),
            None => (None, s.trim()),
        };
        parse_service_name(service).map_err(|e| format!("--service {s:?}: {e}"))?;
        let upstream = match upstream {
            Some(u) if is_upstream_name(u) => u.to_string(),
            Some(u) => {
                return Err(format!(
                    "--service {s:?}: upstream name {u:?} must be 1..64 of [A-Za-z0-9_.-]"
                ));
            }
            None => {
                let derived: String = service
                    .chars()
                    .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                    .collect();
                format!("kd_{derived}")
            }
        };
        Ok(ServiceRef {
            upstream,
            service: service.to_string(),
        })
    }
}

/// Why a list of `--service` flags is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ServicesError {
    /// Two services map to one upstream name.
    #[error(
        "--service: {first} and {second} both map to upstream {upstream}; name one with UPSTREAM=NAME"
    )]
    SameUpstream {
        /// The service named first.
        first: String,
        /// The service named later.
        second: String,
        /// The upstream name both map to.
        upstream: String,
    },
    /// No service at all.
    #[error("at least one --service is required")]
    None,
}

/// Rejects two services with the same upstream name (e.g. `a-b` and `a_b`).
pub fn check_unique(services: &[ServiceRef]) -> Result<(), ServicesError> {
    let mut seen = std::collections::BTreeMap::new();
    for s in services {
        if let Some(other) = seen.insert(s.upstream.as_str(), s.service.as_str()) {
            return Err(ServicesError::SameUpstream {
                first: other.to_string(),
                second: s.service.clone(),
                upstream: s.upstream.clone(),
            });
        }
    }
    if services.is_empty() {
        return Err(ServicesError::None);
    }
    Ok(())
}

/// Which host forms a gateway accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostRule {
    /// IPv4/IPv6 literals only (HAProxy `set server addr`).
    IpOnly,
    /// IP literals or DNS names (resolved by the gateway when it loads its config).
    IpOrDns,
}

/// A DNS name ([`k8s_syntax::is_dns_name`]: labels of 1..=63 of `[a-z0-9-]`, not
/// starting or ending with `-`, 253 in all), case-insensitively as resolvers read it.
fn is_dns_name(s: &str) -> bool {
    k8s_syntax::is_dns_name(&s.to_ascii_lowercase())
}

/// Usable nodes of `nodes` (sorted, one per host:port) and one reason per dropped node.
pub fn usable_nodes(nodes: &[Node], rule: HostRule) -> (Vec<Node>, Vec<String>) {
    let mut out: Vec<Node> = Vec::new();
    let mut dropped = Vec::new();
    for n in nodes {
        let host_ok =
            n.host.parse::<IpAddr>().is_ok() || (rule == HostRule::IpOrDns && is_dns_name(&n.host));
        if !host_ok {
            dropped.push(format!(
                "node host {:?}: not an IP address{}",
                n.host,
                if rule == HostRule::IpOrDns {
                    " or DNS name"
                } else {
                    ""
                }
            ));
        } else if !(1..=65535).contains(&n.port) {
            dropped.push(format!("node {}: port {} outside 1..65535", n.host, n.port));
        } else if n.weight == 0 && n.draining == Some(true) {
            // `drain_terminating: always`: a terminating pod that still
            // serves; no new traffic, and nothing wrong to report.
        } else if n.weight == 0 {
            dropped.push(format!("node {}:{}: weight 0 (no traffic)", n.host, n.port));
        } else if out.iter().any(|o| o.host == n.host && o.port == n.port) {
            dropped.push(format!("node {}:{}: duplicate", n.host, n.port));
        } else {
            out.push(n.clone());
        }
    }
    out.sort();
    (out, dropped)
}

/// What a gateway should route one service to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// These nodes (never empty).
    Nodes(Vec<Node>),
    /// Nothing: answer 503.
    Unavailable,
}

/// Applies `policy`: `usable` when non-empty, else the last good set (keep) or 503.
pub fn decide(policy: EmptyPolicy, usable: Vec<Node>, last_good: Option<&[Node]>) -> Target {
    if !usable.is_empty() {
        return Target::Nodes(usable);
    }
    match (policy, last_good) {
        (EmptyPolicy::Keep, Some(prev)) if !prev.is_empty() => Target::Nodes(prev.to_vec()),
        _ => Target::Unavailable,
    }
}

/// Remembers the last non-empty set per upstream and applies [`decide`].
#[derive(Debug, Default)]
pub struct Decider {
    last_good: std::collections::BTreeMap<String, Vec<Node>>,
}

impl Decider {
    /// Target of `svc` given the looked-up nodes (`None` = service or port missing).
    /// Logs dropped nodes.
    pub fn target(
        &mut self,
        svc: &ServiceRef,
        nodes: Option<Vec<Node>>,
        rule: HostRule,
        policy: EmptyPolicy,
    ) -> Target {
        let (usable, dropped) = usable_nodes(nodes.as_deref().unwrap_or_default(), rule);
        for d in dropped {
            tracing::warn!(service = %svc.service, reason = %d, "node skipped");
        }
        let empty = usable.is_empty();
        let t = decide(
            policy,
            usable,
            self.last_good.get(&svc.upstream).map(Vec::as_slice),
        );
        match &t {
            Target::Nodes(n) => {
                if empty {
                    tracing::warn!(service = %svc.service, nodes = n.len(), "no usable node; keeping the last good set (empty policy keep)");
                }
                self.last_good.insert(svc.upstream.clone(), n.clone());
            }
            Target::Unavailable => {
                tracing::warn!(service = %svc.service, policy = %policy, "no usable node; answering 503");
            }
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_ref_parses_and_derives_names() {
        let s: ServiceRef = "default/web:http".parse().expect("parse");
        assert_eq!(
            s,
            ServiceRef {
                upstream: "kd_default_web_http".into(),
                service: "default/web:http".into()
            }
        );
        let s: ServiceRef = "web=c1/default/web:80".parse().expect("parse");
        assert_eq!(s.upstream, "web");
        assert_eq!(s.service, "c1/default/web:80");
        assert!(
            "w;x=default/web:http"
                .parse::<ServiceRef>()
                .expect_err("must fail")
                .contains("upstream name")
        );
        assert!("web=default-web".parse::<ServiceRef>().is_err());
    }

    #[test]
    fn duplicate_upstreams_are_rejected() {
        let a: ServiceRef = "default/a-b:http".parse().expect("a");
        let b: ServiceRef = "default/a_b:http".parse().expect("b");
        assert!(
            check_unique(&[a.clone(), b])
                .expect_err("must fail")
                .to_string()
                .contains("kd_default_a_b_http")
        );
        assert!(check_unique(&[a]).is_ok());
        assert!(check_unique(&[]).is_err());
    }

    #[test]
    fn unusable_nodes_are_dropped_with_reasons() {
        let nodes = vec![
            Node::new("10.0.0.2", 80, 5),
            Node::new("10.0.0.1", 80, 5),
            Node::new("10.0.0.1", 80, 7),
            Node::new("evil;host", 80, 1),
            Node::new("web.example.com", 80, 1),
            Node::new("10.0.0.3", 0, 1),
            Node::new("10.0.0.4", 80, 0),
            Node::new("fd00::1", 81, 1),
        ];
        let (ok, dropped) = usable_nodes(&nodes, HostRule::IpOrDns);
        let hosts: Vec<_> = ok
            .iter()
            .map(|n| format!("{}:{}", n.host, n.port))
            .collect();
        assert_eq!(
            hosts,
            [
                "10.0.0.1:80",
                "10.0.0.2:80",
                "fd00::1:81",
                "web.example.com:80"
            ]
        );
        assert_eq!(dropped.len(), 4, "{dropped:?}");
        let (ok, dropped) = usable_nodes(&nodes, HostRule::IpOnly);
        assert_eq!(ok.len(), 3);
        assert!(dropped.iter().any(|d| d.contains("web.example.com")));
    }

    #[test]
    fn draining_nodes_with_weight_zero_get_no_traffic_and_no_warning() {
        let mut drain = Node::new("10.0.0.2", 80, 0);
        drain.draining = Some(true);
        // Draining at full weight (`drain_terminating: true`) stays usable.
        let mut fallback = Node::new("10.0.0.3", 80, 50);
        fallback.draining = Some(true);
        let nodes = vec![Node::new("10.0.0.1", 80, 50), drain, fallback];
        let (ok, dropped) = usable_nodes(&nodes, HostRule::IpOnly);
        let hosts: Vec<_> = ok.iter().map(|n| n.host.to_string()).collect();
        assert_eq!(hosts, ["10.0.0.1", "10.0.0.3"]);
        assert!(dropped.is_empty(), "{dropped:?}");
    }

    #[test]
    fn empty_policy() {
        let prev = vec![Node::new("10.0.0.1", 80, 1)];
        assert_eq!(
            decide(EmptyPolicy::Keep, vec![], Some(&prev)),
            Target::Nodes(prev.clone())
        );
        assert_eq!(decide(EmptyPolicy::Keep, vec![], None), Target::Unavailable);
        assert_eq!(
            decide(EmptyPolicy::Serve503, vec![], Some(&prev)),
            Target::Unavailable
        );
        let now = vec![Node::new("10.0.0.2", 80, 1)];
        assert_eq!(
            decide(EmptyPolicy::Serve503, now.clone(), Some(&prev)),
            Target::Nodes(now)
        );
    }

    #[test]
    fn decider_remembers_last_good_per_upstream() {
        let svc: ServiceRef = "default/web:http".parse().expect("svc");
        let mut d = Decider::default();
        let set = vec![Node::new("10.0.0.1", 80, 1)];
        assert_eq!(
            d.target(&svc, Some(set.clone()), HostRule::IpOnly, EmptyPolicy::Keep),
            Target::Nodes(set.clone())
        );
        assert_eq!(
            d.target(&svc, None, HostRule::IpOnly, EmptyPolicy::Keep),
            Target::Nodes(set.clone())
        );
        assert_eq!(
            d.target(&svc, Some(vec![]), HostRule::IpOnly, EmptyPolicy::Serve503),
            Target::Unavailable
        );
    }
}
