use super::*;
use crate::model::version::*;

#[test]
fn service_key_display_single_and_multi() {
    assert_eq!(
        ServiceKey::new("", "default", "web").to_string(),
        "default/web"
    );
    assert_eq!(
        ServiceKey::new("c1", "default", "web").to_string(),
        "c1/default/web"
    );
}

/// Keys are kept several times per service (index, desired state,
/// slices): typical names live inside the key, and the JSON is the same
/// strings as before.
#[test]
fn service_key_is_inline_and_serializes_as_strings() {
    let k = ServiceKey::new("", "default", "svc-1234");
    assert!(!k.namespace.is_heap_allocated() && !k.name.is_heap_allocated());
    let json = r#"{"cluster":"","namespace":"default","name":"svc-1234"}"#;
    assert_eq!(serde_json::to_string(&k).unwrap(), json);
    assert_eq!(serde_json::from_str::<ServiceKey>(json).unwrap(), k);
    // Order is the string order (BTreeMap keys, merge order).
    assert!(ServiceKey::new("", "a", "b") < ServiceKey::new("", "a", "ba"));
    let long = "n".repeat(63);
    assert_eq!(ServiceKey::new("", &long, "x").namespace, long);
}

#[test]
fn node_serializes_as_apisix_shape_without_extras() {
    let n = Node::new("10.0.0.1", 80, 50);
    assert_eq!(
        serde_json::to_string(&n).unwrap(),
        r#"{"host":"10.0.0.1","port":80,"weight":50}"#
    );
    let mut n = n;
    n.set_zone(Some("z1".into()));
    n.set_node_name(Some("n1".into()));
    n.draining = Some(true);
    let v = serde_json::to_value(&n).unwrap();
    assert_eq!(v["zone"], "z1");
    assert_eq!(v["nodeName"], "n1");
    assert_eq!(v["draining"], true);
    let back: Node = serde_json::from_value(v).unwrap();
    assert_eq!(back, n);
}

/// The layout goal of issue 6: a node is at most 48 bytes, and typical
/// IPv4/IPv6 hosts live inside it (no heap allocation of their own).
#[test]
fn node_is_small_and_ip_hosts_are_inline() {
    assert!(
        std::mem::size_of::<Node>() <= 48,
        "Node is {} bytes",
        std::mem::size_of::<Node>()
    );
    for host in [
        "10.0.0.1",
        "255.255.255.255",
        "fd00::1",
        "fd00:10:244:1::a3",
        "2001:db8:85a3::8a2e:370",
    ] {
        assert!(
            !Node::new(host, 80, 1).host.is_heap_allocated(),
            "{host} is on the heap"
        );
    }
    // A long FQDN still works (on the heap).
    let fqdn = "a-rather-long-service-name.namespace.svc.cluster.local";
    assert_eq!(Node::new(fqdn, 80, 1).host, fqdn);
}

/// Byte-exact JSON, field order `host, port, weight, zone, nodeName,
/// targetRef, draining` as the flat struct had it, and back.
#[test]
fn node_json_round_trip_with_and_without_topology() {
    let plain = Node::new("fd00::1", 8080, 1);
    let json = r#"{"host":"fd00::1","port":8080,"weight":1}"#;
    assert_eq!(serde_json::to_string(&plain).unwrap(), json);
    assert_eq!(serde_json::from_str::<Node>(json).unwrap(), plain);
    assert!(plain.topology().is_none());

    let full = Node::new("10.0.0.1", 80, 50).with_topology(NodeTopology {
        zone: Some("z1".into()),
        node_name: Some("n1".into()),
        target_ref: Some(NodeTargetRef {
            kind: "Pod".into(),
            namespace: Some("ns".into()),
            name: "web-1".into(),
            uid: Some("u1".into()),
        }),
    });
    let mut full = full;
    full.draining = Some(true);
    let json = concat!(
        r#"{"host":"10.0.0.1","port":80,"weight":50,"zone":"z1","nodeName":"n1","#,
        r#""targetRef":{"kind":"Pod","namespace":"ns","name":"web-1","uid":"u1"},"#,
        r#""draining":true}"#
    );
    assert_eq!(serde_json::to_string(&full).unwrap(), json);
    assert_eq!(serde_json::from_str::<Node>(json).unwrap(), full);

    // One topology field alone, out of order on input: normalized output.
    let only_ref = serde_json::from_str::<Node>(
        r#"{"targetRef":{"name":"p"},"weight":1,"port":1,"host":"h"}"#,
    )
    .unwrap();
    assert_eq!((only_ref.zone(), only_ref.node_name()), (None, None));
    assert_eq!(
        serde_json::to_string(&only_ref).unwrap(),
        r#"{"host":"h","port":1,"weight":1,"targetRef":{"name":"p"}}"#
    );
    // Explicit nulls read as unset, and an all-unset topology is not kept,
    // so the node equals the plain one.
    let nulls: Node = serde_json::from_str(
        r#"{"host":"fd00::1","port":8080,"weight":1,"zone":null,"nodeName":null}"#,
    )
    .unwrap();
    assert_eq!(nulls, plain);
    // Missing required fields are named.
    let err = serde_json::from_str::<Node>(r#"{"host":"h","port":1}"#).unwrap_err();
    assert!(err.to_string().contains("weight"), "{err}");
}

/// The same content as a `PortMap` and as the `BTreeMap` it replaced
/// serializes to the same bytes (so versions and objects are unchanged),
/// including the empty map, and reads back from any key order.
#[test]
fn port_map_json_equals_btreemap_json() {
    let entries = [
        ("metrics".to_string(), vec![Node::new("10.0.0.2", 9090, 1)]),
        ("http".to_string(), vec![Node::new("10.0.0.1", 80, 1)]),
        ("80".to_string(), vec![]),
        ("grpc".to_string(), vec![Node::new("fd00::1", 81, 2)]),
    ];
    let bt: BTreeMap<String, Vec<Node>> = entries.clone().into_iter().collect();
    let pm: PortMap = entries.clone().into_iter().collect();
    let json = serde_json::to_string(&pm).unwrap();
    assert_eq!(json, serde_json::to_string(&bt).unwrap());
    assert!(json.starts_with(r#"{"80":[],"grpc":"#), "{json}");
    assert_eq!(
        pm.keys().map(String::as_str).collect::<Vec<_>>(),
        ["80", "grpc", "http", "metrics"]
    );
    assert_eq!(format!("{pm:?}"), format!("{bt:?}"));
    for source in [SourceKind::Endpoints, SourceKind::EndpointSlice] {
        #[derive(Serialize)]
        struct Canonical<'a> {
            source: SourceKind,
            ports: &'a BTreeMap<String, Vec<Node>>,
        }
        let bytes = serde_json::to_vec(&Canonical { source, ports: &bt }).unwrap();
        let want = hex::encode(Sha256::digest(&bytes))[..16].to_string();
        assert_eq!(content_version(source, &pm), want);
    }

    // Empty: an object, not LiteMap's `[]`.
    assert_eq!(serde_json::to_string(&PortMap::new()).unwrap(), "{}");
    assert_eq!(
        serde_json::from_str::<PortMap>("{}").unwrap(),
        PortMap::new()
    );

    // Unsorted input with a duplicate key: sorted, the last one wins.
    let back: PortMap = serde_json::from_str(
            r#"{"http":[],"80":[{"host":"h","port":1,"weight":1}],"http":[{"host":"h","port":2,"weight":1}]}"#,
        )
        .unwrap();
    assert_eq!(back.keys().collect::<Vec<_>>(), ["80", "http"]);
    assert_eq!(back["http"][0].port, 2);
    let bt_back: BTreeMap<String, Vec<Node>> = serde_json::from_str(
            r#"{"http":[],"80":[{"host":"h","port":1,"weight":1}],"http":[{"host":"h","port":2,"weight":1}]}"#,
        )
        .unwrap();
    assert_eq!(
        serde_json::to_string(&back).unwrap(),
        serde_json::to_string(&bt_back).unwrap()
    );
    // A list is not a port map.
    assert!(serde_json::from_str::<PortMap>("[]").is_err());
}

/// The BTreeMap operations the code relies on behave the same.
#[test]
fn port_map_behaves_like_the_btreemap() {
    let mut pm = PortMap::new();
    let mut bt = BTreeMap::new();
    for (k, port) in [("b", 1), ("a", 2), ("c", 3), ("a", 4)] {
        let n = vec![Node::new("h", port, 1)];
        assert_eq!(pm.insert(k.into(), n.clone()), bt.insert(k.to_string(), n));
    }
    pm.entry("d".into()).or_default().push(Node::new("h", 5, 1));
    bt.entry("d".to_string())
        .or_default()
        .push(Node::new("h", 5, 1));
    assert_eq!(pm.get("a"), bt.get("a"));
    assert_eq!(pm.contains_key("zz"), bt.contains_key("zz"));
    assert_eq!(pm.remove("b"), bt.remove("b"));
    assert_eq!(pm.len(), bt.len());
    pm.values_mut().for_each(|v| v[0].weight = 7);
    bt.values_mut().for_each(|v| v[0].weight = 7);
    assert!(pm.iter().eq(bt.iter()));
    assert!((&pm).into_iter().rev().eq(bt.iter().rev()));
    pm.shrink_to_fit();
    assert!(pm.clone().into_iter().eq(bt.clone()));
    pm.retain(|k, _| k != "c");
    bt.retain(|k, _| k != "c");
    assert!(pm.iter().eq(bt.iter()));
    pm.clear();
    assert!(pm.is_empty() && pm == PortMap::default());
}

/// The CRD schema of the spec's `ports` is the `BTreeMap` one.
#[test]
fn port_map_schema_is_the_btreemap_schema() {
    assert_eq!(
        schemars::schema_for!(PortMap),
        schemars::schema_for!(BTreeMap<String, Vec<Node>>)
    );
}

/// Setters keep the "no empty box" rule, so equality and order are those
/// of the flat fields.
#[test]
fn topology_setters_normalize() {
    let mut n = Node::new("10.0.0.1", 80, 1);
    n.set_zone(Some("z".into()));
    assert_eq!(n.zone(), Some("z"));
    assert!(n > Node::new("10.0.0.1", 80, 1));
    n.set_zone(None);
    assert!(n.topology().is_none());
    assert_eq!(n, Node::new("10.0.0.1", 80, 1));
    let with_empty = Node::new("10.0.0.1", 80, 1).with_boxed_topology(Some(Box::default()));
    assert_eq!(with_empty, n);
    // Flat-field order: zone decides before nodeName.
    let mut a = Node::new("h", 1, 1);
    a.set_node_name(Some("zz".into()));
    let mut b = Node::new("h", 1, 1);
    b.set_zone(Some("a".into()));
    assert!(a < b);
}

#[test]
fn source_kind_serde_names() {
    assert_eq!(
        serde_json::to_string(&SourceKind::Endpoints).unwrap(),
        r#""Endpoints""#
    );
    assert_eq!(
        serde_json::to_string(&SourceKind::EndpointSlice).unwrap(),
        r#""EndpointSlice""#
    );
}

#[test]
fn parse_single_cluster() {
    let q = parse_service_name("default/plat-dev:port").unwrap();
    assert_eq!(q.cluster, "");
    assert_eq!(q.namespace, "default");
    assert_eq!(q.name, "plat-dev");
    assert_eq!(q.port, "port");
    assert_eq!(q.to_string(), "default/plat-dev:port");
}

#[test]
fn parse_multi_cluster() {
    let q = parse_service_name("c1/default/web:8080").unwrap();
    assert_eq!(
        (
            q.cluster.as_str(),
            q.namespace.as_str(),
            q.name.as_str(),
            q.port.as_str()
        ),
        ("c1", "default", "web", "8080")
    );
    assert_eq!(q.to_string(), "c1/default/web:8080");
}

#[test]
fn parse_errors_are_specific() {
    let msg = |s: &str| parse_service_name(s).unwrap_err().to_string();
    assert!(
        msg("default/web").contains("missing ':<port>'"),
        "{}",
        msg("default/web")
    );
    assert!(msg("default/web:").contains("empty port"));
    assert!(msg("/web:http").contains("empty namespace"));
    assert!(msg("default/:http").contains("empty name"));
    assert!(msg("/default/web:http").contains("empty cluster id"));
    assert!(msg("web:http").contains("must have the form"));
    assert!(msg("a/b/c/d:http").contains("must have the form"));
    assert!(msg("default/w eb:http").contains("whitespace"));
}

#[test]
fn content_version_is_stable_and_content_sensitive() {
    let mut ports = PortMap::new();
    ports.insert("http".into(), vec![Node::new("10.0.0.1", 80, 50)]);
    let v1 = content_version(SourceKind::Endpoints, &ports);
    assert_eq!(v1.len(), 16);
    assert!(v1.chars().all(|c| c.is_ascii_hexdigit()));
    assert_eq!(v1, content_version(SourceKind::Endpoints, &ports.clone()));
    assert_ne!(v1, content_version(SourceKind::EndpointSlice, &ports));
    ports.insert("http".into(), vec![Node::new("10.0.0.1", 80, 51)]);
    assert_ne!(v1, content_version(SourceKind::Endpoints, &ports));
    assert_ne!(v1, content_version(SourceKind::Endpoints, &PortMap::new()));
}

#[test]
fn object_version_covers_the_owner() {
    let mut ports = PortMap::new();
    ports.insert("http".into(), vec![Node::new("10.0.0.1", 80, 50)]);
    let key = ServiceKey::new("", "ns", "web");
    let plain = ServiceNodes::new(key.clone(), SourceKind::Endpoints, ports.clone(), None);
    assert_eq!(
        plain.version,
        content_version(SourceKind::Endpoints, &ports)
    );
    let owned = ServiceNodes::new(
        key.clone(),
        SourceKind::Endpoints,
        ports.clone(),
        Some("u1".into()),
    );
    assert_ne!(owned.version, plain.version);
    let other = ServiceNodes::new(key, SourceKind::Endpoints, ports, Some("u2".into()));
    assert_ne!(owned.version, other.version);
}

#[test]
fn sort_nodes_by_host_then_port() {
    let mut nodes = vec![
        Node::new("10.0.0.2", 80, 1),
        Node::new("10.0.0.1", 90, 1),
        Node::new("10.0.0.1", 80, 1),
    ];
    sort_nodes(&mut nodes);
    let got: Vec<_> = nodes.iter().map(|n| (n.host.as_str(), n.port)).collect();
    assert_eq!(
        got,
        vec![("10.0.0.1", 80), ("10.0.0.1", 90), ("10.0.0.2", 80)]
    );
}
