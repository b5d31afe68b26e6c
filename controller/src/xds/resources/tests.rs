use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::cluster::v3::cluster::{ClusterDiscoveryType, DiscoveryType};
use envoy_types::pb::envoy::config::core::v3::HealthStatus;
use envoy_types::pb::envoy::config::endpoint::v3::ClusterLoadAssignment;
use kube_discovery_core::model::PortExtras;
use kube_discovery_core::xds::Catalog as _;
use kube_discovery_core::{Node, NodeTopology, PortMap, ServiceKey, ServiceNodes, SourceKind};
use prost::Message;

use super::*;

fn svc(ports: Vec<(&str, Vec<Node>)>) -> ServiceNodes {
    let ports: PortMap = ports.into_iter().map(|(k, n)| (k.to_string(), n)).collect();
    ServiceNodes::new(
        ServiceKey::new("", "shop", "cart"),
        SourceKind::EndpointSlice,
        ports,
        None,
    )
}

fn zoned(host: &str, port: i32, weight: u32, zone: &str) -> Node {
    Node::new(host, port, weight).with_topology(NodeTopology {
        zone: Some(zone.to_string()),
        ..NodeTopology::default()
    })
}

fn cla(r: &BTreeMap<(Kind, String), Resource>, name: &str) -> ClusterLoadAssignment {
    let any = &r[&(Kind::ClusterLoadAssignment, name.to_string())].body;
    ClusterLoadAssignment::decode(any.value.as_ref()).unwrap()
}

fn cluster(r: &BTreeMap<(Kind, String), Resource>, name: &str) -> Cluster {
    let any = &r[&(Kind::Cluster, name.to_string())].body;
    Cluster::decode(any.value.as_ref()).unwrap()
}

/// (zone, locality weight, [(host, port, weight, health)]) of an assignment.
type Flat = Vec<(String, u32, Vec<(String, u32, u32, HealthStatus)>)>;

fn flat(a: &ClusterLoadAssignment) -> Flat {
    a.endpoints
        .iter()
        .map(|l| {
            (
                l.locality.as_ref().unwrap().zone.clone(),
                l.load_balancing_weight.as_ref().unwrap().value,
                l.lb_endpoints
                    .iter()
                    .map(|e| {
                        let (host, port) = endpoint_key(e);
                        (
                            host,
                            port,
                            e.load_balancing_weight.as_ref().unwrap().value,
                            HealthStatus::try_from(e.health_status).unwrap(),
                        )
                    })
                    .collect(),
            )
        })
        .collect()
}

#[test]
fn one_cluster_and_one_assignment_per_port_named_by_the_apisix_key() {
    let s = svc(vec![
        ("http", vec![Node::new("10.0.0.1", 8080, 50)]),
        ("metrics", vec![Node::new("10.0.0.1", 9090, 50)]),
    ]);
    let r = service_resources(&s);
    let names: Vec<(Kind, &str)> = r.keys().map(|(k, n)| (*k, n.as_str())).collect();
    assert_eq!(
        names,
        vec![
            (Kind::Cluster, "shop/cart:http"),
            (Kind::Cluster, "shop/cart:metrics"),
            (Kind::ClusterLoadAssignment, "shop/cart:http"),
            (Kind::ClusterLoadAssignment, "shop/cart:metrics"),
            (Kind::Listener, "shop/cart:http"),
            (Kind::Listener, "shop/cart:metrics"),
            (Kind::RouteConfiguration, "shop/cart:http"),
            (Kind::RouteConfiguration, "shop/cart:metrics"),
        ]
    );
    let c = cluster(&r, "shop/cart:http");
    assert_eq!(c.name, "shop/cart:http");
    assert_eq!(
        c.cluster_discovery_type,
        Some(ClusterDiscoveryType::Type(DiscoveryType::Eds as i32))
    );
    assert!(c.eds_cluster_config.unwrap().eds_config.is_some());
    assert_eq!(cla(&r, "shop/cart:http").cluster_name, "shop/cart:http");
}

#[test]
fn weights_are_at_least_one_and_draining_or_weight_zero_nodes_are_draining() {
    let mut draining = Node::new("10.0.0.3", 80, 50);
    draining.draining = Some(true);
    let s = svc(vec![(
        "http",
        vec![
            Node::new("10.0.0.1", 80, 7),
            Node::new("10.0.0.2", 80, 0),
            draining,
        ],
    )]);
    let a = cla(&service_resources(&s), "shop/cart:http");
    assert_eq!(
        flat(&a),
        vec![(
            String::new(),
            58,
            vec![
                ("10.0.0.1".into(), 80, 7, HealthStatus::Healthy),
                ("10.0.0.2".into(), 80, 1, HealthStatus::Draining),
                ("10.0.0.3".into(), 80, 50, HealthStatus::Draining),
            ]
        )]
    );
}

#[test]
fn localities_by_zone_weigh_the_sum_of_their_nodes() {
    let s = svc(vec![(
        "http",
        vec![
            zoned("10.0.0.1", 80, 50, "b"),
            zoned("10.0.0.2", 80, 50, "a"),
            zoned("10.0.0.3", 80, 20, "b"),
            Node::new("10.0.0.4", 80, 5),
        ],
    )]);
    let a = cla(&service_resources(&s), "shop/cart:http");
    let zones: Vec<(String, u32, usize)> = flat(&a)
        .into_iter()
        .map(|(z, w, e)| (z, w, e.len()))
        .collect();
    assert_eq!(
        zones,
        vec![("".into(), 5, 1), ("a".into(), 50, 1), ("b".into(), 70, 2)]
    );
}

#[test]
fn a_host_and_port_is_sent_once_and_a_ready_copy_wins() {
    let mut d = Node::new("10.0.0.1", 80, 50);
    d.draining = Some(true);
    let s = svc(vec![(
        "http",
        vec![
            d,
            Node::new("10.0.0.1", 80, 50),
            Node::new("10.0.0.1", 80, 9),
        ],
    )]);
    let a = cla(&service_resources(&s), "shop/cart:http");
    assert_eq!(
        flat(&a)[0].2,
        vec![("10.0.0.1".into(), 80, 50, HealthStatus::Healthy)]
    );
}

#[test]
fn dns_names_become_a_strict_dns_cluster_without_an_assignment() {
    let s = svc(vec![("http", vec![Node::new("db.example.com", 5432, 50)])]);
    let r = service_resources(&s);
    assert!(!r.contains_key(&(Kind::ClusterLoadAssignment, "shop/cart:http".into())));
    let c = cluster(&r, "shop/cart:http");
    assert_eq!(
        c.cluster_discovery_type,
        Some(ClusterDiscoveryType::Type(DiscoveryType::StrictDns as i32))
    );
    assert_eq!(
        flat(c.load_assignment.as_ref().unwrap())[0].2[0].0,
        "db.example.com"
    );
}

#[test]
fn aliases_resolve_to_the_same_nodes_but_a_wildcard_gets_each_port_once() {
    let mut s = svc(vec![("http", vec![Node::new("10.0.0.1", 8080, 50)])]);
    s.extras = PortExtras {
        aliases: [("web".to_string(), "http".to_string())].into(),
        app_protocols: [("http".to_string(), "kubernetes.io/h2c".to_string())].into(),
        unresolved: vec![],
    };
    let mut c = Catalog::default();
    c.apply(&s.key.clone(), Some(&s));
    assert_eq!(c.wildcard_names(Kind::Cluster), vec!["shop/cart:http"]);
    assert_eq!(c.wildcard_names(Kind::Listener), Vec::<&str>::new());
    assert!(c.in_wildcard(Kind::Cluster, "shop/cart:http"));
    assert!(!c.in_wildcard(Kind::Cluster, "shop/cart:web"));
    assert!(!c.in_wildcard(Kind::Listener, "shop/cart:http"));
    let alias = c.get(Kind::ClusterLoadAssignment, "shop/cart:web").unwrap();
    let a = ClusterLoadAssignment::decode(alias.body.value.as_ref()).unwrap();
    assert_eq!(a.cluster_name, "shop/cart:web");
    assert_eq!(flat(&a)[0].2[0].0, "10.0.0.1");
    // appProtocol h2c: the cluster speaks HTTP/2 upstream.
    let any = &c.get(Kind::Cluster, "shop/cart:http").unwrap().body;
    let cl = Cluster::decode(any.value.as_ref()).unwrap();
    assert!(
        cl.typed_extension_protocol_options
            .contains_key(HTTP_PROTOCOL_OPTIONS)
    );
}

#[test]
fn versions_are_content_hashes_and_apply_reports_only_what_changed() {
    let key = ServiceKey::new("", "shop", "cart");
    let one = svc(vec![("http", vec![Node::new("10.0.0.1", 80, 50)])]);
    let mut c = Catalog::default();
    let first = c.apply(&key, Some(&one));
    assert_eq!(first.len(), 4);
    let v = c
        .version(Kind::ClusterLoadAssignment, "shop/cart:http")
        .unwrap()
        .to_string();
    // The same content again, from another value: nothing changed.
    let again = svc(vec![("http", vec![Node::new("10.0.0.1", 80, 50)])]);
    assert_eq!(c.apply(&key, Some(&again)), vec![]);
    // Another catalog (a second replica) names the content the same way.
    let mut other = Catalog::default();
    other.apply(&key, Some(&again));
    assert_eq!(
        other.version(Kind::ClusterLoadAssignment, "shop/cart:http"),
        Some(v.as_str())
    );
    // A node more: only the assignment changed.
    let two = svc(vec![(
        "http",
        vec![Node::new("10.0.0.1", 80, 50), Node::new("10.0.0.2", 80, 50)],
    )]);
    assert_eq!(
        c.apply(&key, Some(&two)),
        vec![(Kind::ClusterLoadAssignment, "shop/cart:http".to_string())]
    );
    assert_ne!(
        c.version(Kind::ClusterLoadAssignment, "shop/cart:http"),
        Some(v.as_str())
    );
    // The service is gone: all four are removed.
    assert_eq!(c.apply(&key, None).len(), 4);
    assert_eq!(c.len(Kind::Cluster), 0);
    assert_eq!(c.version(Kind::Cluster, "shop/cart:http"), None);
}

#[test]
fn an_empty_port_is_an_assignment_with_no_endpoints() {
    let s = svc(vec![("http", vec![])]);
    let a = cla(&service_resources(&s), "shop/cart:http");
    assert!(a.endpoints.is_empty());
}
