use super::*;
use crate::model::Node;
use k8s_openapi::api::core::v1::Service;
use serde_json::json;
use std::collections::BTreeMap;

fn svc(ports: serde_json::Value) -> ServiceInfo {
    let s: Service = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "ns"},
        "spec": {"ports": ports}
    }))
    .unwrap();
    ServiceInfo::from_service(&s)
}

fn keys(ks: &[&str]) -> PortMap {
    ks.iter()
        .map(|k| (k.to_string(), vec![Node::new("10.0.0.1", 8080, 1)]))
        .collect()
}

#[test]
fn keeps_only_the_ports() {
    let info = svc(json!([
        {"name": "http", "port": 80, "targetPort": "web", "appProtocol": "kubernetes.io/h2c"},
        {"name": "metrics", "port": 9090},
        {"name": "grpc", "port": 81, "targetPort": 9000}
    ]));
    assert_eq!(
        info.ports,
        vec![
            ServicePort {
                name: "http".into(),
                port: 80,
                target_port: TargetPort::Name("web".into()),
                app_protocol: Some("kubernetes.io/h2c".into()),
            },
            ServicePort {
                name: "metrics".into(),
                port: 9090,
                target_port: TargetPort::Number(9090),
                app_protocol: None,
            },
            ServicePort {
                name: "grpc".into(),
                port: 81,
                target_port: TargetPort::Number(9000),
                app_protocol: None,
            },
        ]
    );
    let none: Service = serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap();
    assert_eq!(ServiceInfo::from_service(&none), ServiceInfo::default());
}

#[test]
fn named_ports_alias_their_number_and_carry_app_protocol() {
    let info = svc(json!([
        {"name": "http", "port": 80, "targetPort": "web", "appProtocol": "kubernetes.io/h2c"},
        {"name": "grpc", "port": 81, "targetPort": 9000, "appProtocol": "grpc"}
    ]));
    let x = port_extras(&info, &keys(&["grpc", "http"]), true);
    assert_eq!(
        x.aliases,
        BTreeMap::from([("80".into(), "http".into()), ("81".into(), "grpc".into())])
    );
    assert_eq!(
        x.app_protocols,
        BTreeMap::from([
            ("grpc".into(), "grpc".into()),
            ("http".into(), "kubernetes.io/h2c".into())
        ])
    );
    assert!(x.unresolved.is_empty());
    // Aliases off: the appProtocols stay.
    let off = port_extras(&info, &keys(&["grpc", "http"]), false);
    assert!(off.aliases.is_empty());
    assert_eq!(off.app_protocols.len(), 2);
}

#[test]
fn unnamed_port_aliases_to_the_target_number_or_the_only_key() {
    let info = svc(json!([{"port": 80, "targetPort": 8080}]));
    let x = port_extras(&info, &keys(&["8080"]), true);
    assert_eq!(x.aliases, BTreeMap::from([("80".into(), "8080".into())]));
    // Same number as the key: nothing to alias.
    let same = svc(json!([{"port": 8080}]));
    assert!(port_extras(&same, &keys(&["8080"]), true).is_empty());
    // A named targetPort: the only key, never a guess between several.
    let named = svc(json!([{"port": 80, "targetPort": "web"}]));
    let x = port_extras(&named, &keys(&["8080"]), true);
    assert_eq!(x.aliases, BTreeMap::from([("80".into(), "8080".into())]));
    let x = port_extras(&named, &keys(&["8080", "8081"]), true);
    assert!(x.aliases.is_empty());
    assert_eq!(x.unresolved.len(), 1);
}

#[test]
fn real_keys_win_and_shared_numbers_are_ambiguous() {
    // index_port_numbers made "80" a real key: no alias shadows it.
    let info = svc(json!([
        {"name": "a", "port": 80, "targetPort": 8080},
        {"name": "b", "port": 8080, "targetPort": 80}
    ]));
    let ports = keys(&["80", "8080", "a", "b"]);
    assert!(port_extras(&info, &ports, true).aliases.is_empty());
    // TCP and UDP 53: the number names two ports, so no alias.
    let dns = svc(json!([
        {"name": "dns", "port": 53, "protocol": "UDP"},
        {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
        {"name": "metrics", "port": 9153}
    ]));
    let x = port_extras(&dns, &keys(&["dns", "dns-tcp", "metrics"]), true);
    assert_eq!(
        x.aliases,
        BTreeMap::from([("9153".into(), "metrics".into())])
    );
}

#[test]
fn a_target_without_endpoints_is_unresolved_not_aliased() {
    let info = svc(json!([
        {"name": "http", "port": 80, "targetPort": "web"},
        {"name": "admin", "port": 9000, "targetPort": "admin"}
    ]));
    let x = port_extras(&info, &keys(&["http"]), true);
    assert_eq!(x.aliases, BTreeMap::from([("80".into(), "http".into())]));
    assert_eq!(
        x.unresolved,
        vec![
            "Service port 9000 (admin): no endpoint has targetPort admin; the port has no nodes"
                .to_string()
        ]
    );
}

#[test]
fn resolve_prefers_real_keys() {
    let ports = keys(&["http", "80x"]);
    let x = PortExtras {
        aliases: BTreeMap::from([
            ("80".into(), "http".into()),
            ("http".into(), "80x".into()),
            ("81".into(), "gone".into()),
        ]),
        ..PortExtras::default()
    };
    assert_eq!(x.resolve(&ports, "http"), Some("http"));
    assert_eq!(x.resolve(&ports, "80"), Some("http"));
    assert_eq!(x.resolve(&ports, "81"), None);
    assert_eq!(x.resolve(&ports, "nope"), None);
}

/// The object-size effect of aliases, measured on the JSON of the
/// written object: the node lists and `ports` are byte-identical, the
/// only growth is the small `aliases` map (and `appProtocols` where a
/// port sets one), whatever the number of nodes. Sizes are printed for
/// the docs (`--nocapture`).
#[test]
fn aliases_cost_only_their_small_map() {
    use crate::crd::{ObjectNaming, desired_object};
    use crate::model::{ServiceKey, ServiceNodes, SourceKind};
    let info = svc(json!([
        {"name": "http", "port": 80, "targetPort": "web"},
        {"name": "metrics", "port": 9090, "targetPort": 9091}
    ]));
    for nodes in [2usize, 100, 1000] {
        let ports: PortMap = ["http", "metrics"]
            .iter()
            .map(|k| {
                let list = (0..nodes)
                    .map(|i| Node::new(format!("10.0.{}.{}", i / 250, i % 250), 8080, 50))
                    .collect();
                (k.to_string(), list)
            })
            .collect();
        let plain = ServiceNodes::new(
            ServiceKey::new("", "ns", "web"),
            SourceKind::EndpointSlice,
            ports.clone(),
            None,
        );
        let with = plain.clone().with_extras(port_extras(&info, &ports, true));
        let obj = |s: &ServiceNodes| desired_object(s, &ObjectNaming::source());
        let (a, b) = (obj(&plain), obj(&with));
        assert_eq!(
            serde_json::to_string(&a.spec.ports).unwrap(),
            serde_json::to_string(&b.spec.ports).unwrap()
        );
        let size = |o| serde_json::to_vec(o).unwrap().len();
        let growth = size(&b) - size(&a);
        // Exactly the alias map (versions have equal length).
        let map = r#","aliases":{"80":"http","9090":"metrics"}"#;
        assert_eq!(growth, map.len());
        eprintln!(
            "{nodes} nodes x 2 ports: object {} -> {} bytes (+{growth})",
            size(&a),
            size(&b)
        );
    }
}
