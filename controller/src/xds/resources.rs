//! What xDS serves, built from the desired nodes: per port key of a service,
//! one Cluster (EDS over ADS) and one ClusterLoadAssignment, and for
//! proxyless gRPC one Listener (an `api_listener`) and one RouteConfiguration,
//! all named by the APISIX key `[id/]namespace/name:portKey`. Service-port
//! aliases get the same resources under the alias name (explicit
//! subscriptions only; a wildcard gets each port once).
//!
//! Pure: a [`Catalog`] is changed one service at a time and says which
//! resources changed. Versions are content hashes of the encoded resource, so
//! every replica, and a restarted one, names the same content the same way.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::Arc;

use envoy_types::pb::envoy::config::cluster::v3::{
    Cluster,
    cluster::{ClusterDiscoveryType, DiscoveryType, EdsClusterConfig},
};
use envoy_types::pb::envoy::config::core::v3::{
    Address, AggregatedConfigSource, ApiVersion, ConfigSource, Http2ProtocolOptions, Locality,
    SocketAddress, address, config_source::ConfigSourceSpecifier, socket_address::PortSpecifier,
};
use envoy_types::pb::envoy::config::endpoint::v3::{
    ClusterLoadAssignment, Endpoint, LbEndpoint, LocalityLbEndpoints, lb_endpoint::HostIdentifier,
};
use envoy_types::pb::envoy::config::listener::v3::{ApiListener, Listener};
use envoy_types::pb::envoy::config::route::v3::{
    Route, RouteAction, RouteConfiguration, RouteMatch, VirtualHost, route::Action,
    route_action::ClusterSpecifier, route_match::PathSpecifier,
};
use envoy_types::pb::envoy::extensions::filters::http::router::v3::Router;
use envoy_types::pb::envoy::extensions::filters::network::http_connection_manager::v3::{
    HttpConnectionManager, HttpFilter, Rds, http_connection_manager::RouteSpecifier,
    http_filter::ConfigType,
};
use envoy_types::pb::envoy::extensions::upstreams::http::v3::{
    HttpProtocolOptions, http_protocol_options::ExplicitHttpConfig,
    http_protocol_options::UpstreamProtocolOptions,
    http_protocol_options::explicit_http_config::ProtocolConfig,
};
use envoy_types::pb::google::protobuf::{Any, UInt32Value};
use envoy_types::util::pack_any;
use kube_discovery_core::xds::Kind;
use kube_discovery_core::{Node, ServiceKey, ServiceNodes};
use sha2::{Digest, Sha256};

use super::wire::SharedAny;

/// `appProtocol`s whose upstreams speak HTTP/2 without TLS: their clusters
/// tell Envoy so (Kubernetes' `kubernetes.io/h2c`, and what gRPC services
/// are commonly marked with).
const H2_APP_PROTOCOLS: [&str; 4] = ["kubernetes.io/h2c", "h2c", "grpc", "http2"];

/// The Envoy extension key of [`HttpProtocolOptions`].
const HTTP_PROTOCOL_OPTIONS: &str = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions";

/// One resource as it is sent: its body and its version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    /// The content hash of `body`.
    pub version: String,
    /// The encoded resource, shared by every response that carries it.
    pub body: SharedAny,
    /// Whether a wildcard subscription gets it (a port key's own name; not
    /// an alias, not the gRPC Listener and RouteConfiguration).
    pub wildcard: bool,
}

impl Resource {
    fn new(body: Any, wildcard: bool) -> Self {
        let digest = Sha256::new()
            .chain_update(body.type_url.as_bytes())
            .chain_update([0])
            .chain_update(&body.value)
            .finalize();
        Self {
            version: hex::encode(&digest[..8]),
            body: SharedAny {
                type_url: body.type_url.into(),
                value: body.value.into(),
            },
            wildcard,
        }
    }
}

/// Everything served, by kind and name.
#[derive(Debug, Default)]
pub struct Catalog {
    kinds: [BTreeMap<String, Arc<Resource>>; 4],
    /// The names each service contributes (to drop them when it changes).
    of_service: HashMap<ServiceKey, Vec<(Kind, String)>>,
}

fn slot(kind: Kind) -> usize {
    match kind {
        Kind::Cluster => 0,
        Kind::ClusterLoadAssignment => 1,
        Kind::Listener => 2,
        Kind::RouteConfiguration => 3,
    }
}

impl Catalog {
    /// The resource `name` of `kind`.
    pub fn get(&self, kind: Kind, name: &str) -> Option<&Arc<Resource>> {
        self.kinds[slot(kind)].get(name)
    }

    /// How many resources of `kind` there are.
    pub fn len(&self, kind: Kind) -> usize {
        self.kinds[slot(kind)].len()
    }

    /// Replaces what `key` contributes with the resources of `nodes` (`None`:
    /// the service is gone) and returns the resources whose content changed,
    /// appeared or disappeared.
    pub fn apply(&mut self, key: &ServiceKey, nodes: Option<&ServiceNodes>) -> Vec<(Kind, String)> {
        let new = nodes.map(service_resources).unwrap_or_default();
        let old_names = self.of_service.remove(key).unwrap_or_default();
        let mut changed = Vec::new();
        for (kind, name) in &old_names {
            if !new.contains_key(&(*kind, name.clone()))
                && self.kinds[slot(*kind)].remove(name).is_some()
            {
                changed.push((*kind, name.clone()));
            }
        }
        let mut names = Vec::with_capacity(new.len());
        for ((kind, name), res) in new {
            let map = &mut self.kinds[slot(kind)];
            if map
                .get(&name)
                .is_none_or(|old| old.version != res.version || old.wildcard != res.wildcard)
            {
                map.insert(name.clone(), Arc::new(res));
                changed.push((kind, name.clone()));
            }
            names.push((kind, name));
        }
        if !names.is_empty() {
            self.of_service.insert(key.clone(), names);
        }
        changed.sort();
        changed
    }
}

impl kube_discovery_core::xds::Catalog for Catalog {
    fn version(&self, kind: Kind, name: &str) -> Option<&str> {
        self.get(kind, name).map(|r| r.version.as_str())
    }

    fn wildcard_names(&self, kind: Kind) -> Vec<&str> {
        self.kinds[slot(kind)]
            .iter()
            .filter(|(_, r)| r.wildcard)
            .map(|(n, _)| n.as_str())
            .collect()
    }

    fn in_wildcard(&self, kind: Kind, name: &str) -> bool {
        self.get(kind, name).is_some_and(|r| r.wildcard)
    }
}

/// The resources of one service, by (kind, name).
pub fn service_resources(svc: &ServiceNodes) -> BTreeMap<(Kind, String), Resource> {
    let mut out = BTreeMap::new();
    let base = svc.key.to_string();
    let mut names: Vec<(String, &str, bool)> = svc
        .ports
        .keys()
        .map(|port| (port.clone(), port.as_str(), true))
        .collect();
    for alias in svc.extras.aliases.keys() {
        if svc.ports.contains_key(alias.as_str()) {
            continue;
        }
        if let Some(target) = svc.extras.resolve(&svc.ports, alias) {
            names.push((alias.clone(), target, false));
        }
    }
    for (port, target, canonical) in names {
        let Some(nodes) = svc.ports.get(target) else {
            continue;
        };
        let name = format!("{base}:{port}");
        let h2 = svc
            .extras
            .app_protocols
            .get(target)
            .is_some_and(|p| H2_APP_PROTOCOLS.contains(&p.as_str()));
        let assignment = load_assignment(&name, nodes);
        if nodes.iter().all(|n| n.host.parse::<IpAddr>().is_ok()) {
            out.insert(
                (Kind::Cluster, name.clone()),
                Resource::new(pack_any(eds_cluster(&name, h2)), canonical),
            );
            out.insert(
                (Kind::ClusterLoadAssignment, name.clone()),
                Resource::new(pack_any(assignment), canonical),
            );
        } else {
            // A DNS name (ExternalName): Envoy resolves it itself.
            out.insert(
                (Kind::Cluster, name.clone()),
                Resource::new(pack_any(dns_cluster(&name, h2, assignment)), canonical),
            );
        }
        out.insert(
            (Kind::Listener, name.clone()),
            Resource::new(pack_any(grpc_listener(&name)), false),
        );
        out.insert(
            (Kind::RouteConfiguration, name.clone()),
            Resource::new(pack_any(grpc_route(&name)), false),
        );
    }
    out
}

fn ads() -> Option<ConfigSource> {
    Some(ConfigSource {
        resource_api_version: ApiVersion::V3 as i32,
        config_source_specifier: Some(ConfigSourceSpecifier::Ads(AggregatedConfigSource {})),
        ..Default::default()
    })
}

fn http2_options(h2: bool) -> HashMap<String, Any> {
    let mut m = HashMap::new();
    if h2 {
        m.insert(
            HTTP_PROTOCOL_OPTIONS.to_string(),
            pack_any(HttpProtocolOptions {
                upstream_protocol_options: Some(UpstreamProtocolOptions::ExplicitHttpConfig(
                    ExplicitHttpConfig {
                        protocol_config: Some(ProtocolConfig::Http2ProtocolOptions(
                            Http2ProtocolOptions::default(),
                        )),
                    },
                )),
                ..Default::default()
            }),
        );
    }
    m
}

fn eds_cluster(name: &str, h2: bool) -> Cluster {
    Cluster {
        name: name.to_string(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32)),
        eds_cluster_config: Some(EdsClusterConfig {
            eds_config: ads(),
            service_name: String::new(),
        }),
        typed_extension_protocol_options: http2_options(h2),
        ..Default::default()
    }
}

fn dns_cluster(name: &str, h2: bool, assignment: ClusterLoadAssignment) -> Cluster {
    Cluster {
        name: name.to_string(),
        cluster_discovery_type: Some(ClusterDiscoveryType::Type(DiscoveryType::StrictDns as i32)),
        load_assignment: Some(assignment),
        typed_extension_protocol_options: http2_options(h2),
        ..Default::default()
    }
}

/// The endpoints of one port key: a locality per zone (the empty locality
/// for nodes without one), weights at least 1 (Envoy and gRPC reject 0),
/// draining nodes (and weight 0) as `DRAINING`, each `host:port` once (a
/// ready copy wins over a draining one).
pub fn load_assignment(name: &str, nodes: &[Node]) -> ClusterLoadAssignment {
    use envoy_types::pb::envoy::config::core::v3::HealthStatus;
    let draining = |n: &Node| n.draining == Some(true) || n.weight == 0;
    let mut seen = std::collections::HashSet::new();
    let mut by_zone: BTreeMap<Option<&str>, Vec<LbEndpoint>> = BTreeMap::new();
    let ordered = nodes
        .iter()
        .filter(|n| !draining(n))
        .chain(nodes.iter().filter(|n| draining(n)));
    for n in ordered {
        if !seen.insert((n.host.as_str(), n.port)) {
            continue;
        }
        let health = if draining(n) {
            HealthStatus::Draining
        } else {
            HealthStatus::Healthy
        };
        by_zone.entry(n.zone()).or_default().push(LbEndpoint {
            host_identifier: Some(HostIdentifier::Endpoint(Endpoint {
                address: Some(Address {
                    address: Some(address::Address::SocketAddress(SocketAddress {
                        address: n.host.to_string(),
                        port_specifier: Some(PortSpecifier::PortValue(
                            u32::try_from(n.port).unwrap_or(0),
                        )),
                        ..Default::default()
                    })),
                }),
                ..Default::default()
            })),
            health_status: health as i32,
            load_balancing_weight: Some(UInt32Value {
                value: n.weight.max(1),
            }),
            ..Default::default()
        });
    }
    ClusterLoadAssignment {
        cluster_name: name.to_string(),
        endpoints: by_zone
            .into_iter()
            .map(|(zone, mut lb_endpoints)| {
                lb_endpoints.sort_by_key(endpoint_key);
                let weight = lb_endpoints
                    .iter()
                    .map(|e| e.load_balancing_weight.as_ref().map_or(1, |w| w.value))
                    .fold(0u32, u32::saturating_add);
                LocalityLbEndpoints {
                    locality: Some(Locality {
                        zone: zone.unwrap_or_default().to_string(),
                        ..Default::default()
                    }),
                    lb_endpoints,
                    load_balancing_weight: Some(UInt32Value {
                        value: weight.max(1),
                    }),
                    ..Default::default()
                }
            })
            .collect(),
        ..Default::default()
    }
}

fn endpoint_key(e: &LbEndpoint) -> (String, u32) {
    match &e.host_identifier {
        Some(HostIdentifier::Endpoint(Endpoint {
            address:
                Some(Address {
                    address: Some(address::Address::SocketAddress(s)),
                }),
            ..
        })) => (
            s.address.clone(),
            match s.port_specifier {
                Some(PortSpecifier::PortValue(p)) => p,
                _ => 0,
            },
        ),
        _ => (String::new(), 0),
    }
}

/// The Listener a grpc-go `xds:///NAME` target asks for: an `api_listener`
/// whose HTTP connection manager takes route `NAME` over ADS.
fn grpc_listener(name: &str) -> Listener {
    let hcm = HttpConnectionManager {
        route_specifier: Some(RouteSpecifier::Rds(Rds {
            config_source: ads(),
            route_config_name: name.to_string(),
        })),
        http_filters: vec![HttpFilter {
            name: "envoy.filters.http.router".to_string(),
            config_type: Some(ConfigType::TypedConfig(pack_any(Router::default()))),
            ..Default::default()
        }],
        ..Default::default()
    };
    Listener {
        name: name.to_string(),
        api_listener: Some(ApiListener {
            api_listener: Some(pack_any(hcm)),
        }),
        ..Default::default()
    }
}

/// The RouteConfiguration of [`grpc_listener`]: every request to cluster `NAME`.
fn grpc_route(name: &str) -> RouteConfiguration {
    RouteConfiguration {
        name: name.to_string(),
        virtual_hosts: vec![VirtualHost {
            name: name.to_string(),
            domains: vec!["*".to_string()],
            routes: vec![Route {
                r#match: Some(RouteMatch {
                    path_specifier: Some(PathSpecifier::Prefix(String::new())),
                    ..Default::default()
                }),
                action: Some(Action::Route(RouteAction {
                    cluster_specifier: Some(ClusterSpecifier::Cluster(name.to_string())),
                    ..Default::default()
                })),
                ..Default::default()
            }],
            ..Default::default()
        }],
        ..Default::default()
    }
}

#[cfg(test)]
mod tests;
