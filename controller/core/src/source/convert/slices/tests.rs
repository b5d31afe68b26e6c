use super::*;
use serde_json::{Value, json};

fn slice(name: &str, address_type: &str, ports: Value, endpoints: Value) -> EndpointSlice {
    serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "ns", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": address_type,
            "ports": ports,
            "endpoints": endpoints,
        }))
        .unwrap()
}

fn hosts(c: &Converted, key: &str) -> Vec<String> {
    c.ports[key]
        .iter()
        .map(|n| format!("{}:{}", n.host, n.port))
        .collect()
}

fn http() -> Value {
    json!([{"name": "http", "port": 80}])
}

#[test]
fn reference_plat_dev_example_as_slice() {
    let s = slice(
        "plat-dev-abc",
        "IPv4",
        json!([{"name": "port", "port": 3306}]),
        json!([{"addresses": ["10.5.10.110"], "conditions": {"ready": true}},
                   {"addresses": ["10.5.10.109"], "conditions": {"ready": true}}]),
    );
    let c = from_slices([&s], &ConvertOptions::default());
    assert_eq!(
        serde_json::to_value(&c.ports["port"]).unwrap(),
        json!([{"host": "10.5.10.109", "port": 3306, "weight": 50},
                   {"host": "10.5.10.110", "port": 3306, "weight": 50}])
    );
}

#[test]
fn ready_true_or_absent_counts_false_does_not() {
    let s = slice(
        "a",
        "IPv4",
        http(),
        json!([{"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
                   {"addresses": ["10.0.0.2"], "conditions": {}},
                   {"addresses": ["10.0.0.3"]},
                   {"addresses": ["10.0.0.4"], "conditions": {"ready": false}}]),
    );
    let c = from_slices([&s], &ConvertOptions::default());
    assert_eq!(
        hosts(&c, "http"),
        vec!["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"]
    );
}

#[test]
fn slices_are_merged_and_deduplicated_non_terminating_wins() {
    let a = slice(
        "a",
        "IPv4",
        http(),
        json!([{"addresses": ["10.0.0.1"], "conditions": {"ready": false, "serving": true, "terminating": true}},
                   {"addresses": ["10.0.0.2"]}]),
    );
    let b = slice(
        "b",
        "IPv4",
        http(),
        json!([{"addresses": ["10.0.0.1"], "conditions": {"ready": true}},
                   {"addresses": ["10.0.0.2"]},
                   {"addresses": ["10.0.0.3"]}]),
    );
    let c = from_slices([&a, &b], &ConvertOptions::default());
    assert_eq!(
        hosts(&c, "http"),
        vec!["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"]
    );
    // Same result in the other order.
    let c2 = from_slices([&b, &a], &ConvertOptions::default());
    assert_eq!(c.ports, c2.ports);
    // A terminating duplicate never replaces a non-terminating one.
    let t = slice(
        "c",
        "IPv4",
        http(),
        json!([{"addresses": ["10.0.0.3"], "conditions": {"ready": false, "serving": true, "terminating": true}}]),
    );
    let c3 = from_slices([&b, &t], &ConvertOptions::default());
    assert_eq!(
        hosts(&c3, "http"),
        vec!["10.0.0.1:80", "10.0.0.2:80", "10.0.0.3:80"]
    );
}

#[test]
fn draining_fallback_is_opt_in_and_per_port() {
    let s = slice(
        "a",
        "IPv4",
        http(),
        json!([{"addresses": ["10.0.0.1"], "conditions": {"ready": false, "serving": true, "terminating": true}},
                   {"addresses": ["10.0.0.2"], "conditions": {"ready": false, "serving": false, "terminating": true}},
                   {"addresses": ["10.0.0.3"], "conditions": {"ready": false, "serving": false, "terminating": false}}]),
    );
    let off = from_slices([&s], &ConvertOptions::default());
    assert_eq!(off.ports["http"], vec![]);
    let on = from_slices(
        [&s],
        &ConvertOptions {
            drain_terminating: Drain::Fallback,
            ..Default::default()
        },
    );
    assert_eq!(hosts(&on, "http"), vec!["10.0.0.1:80"]);
    assert_eq!(on.ports["http"][0].draining, Some(true));
    // With a ready endpoint present, terminating ones are not used.
    let s2 = slice(
        "b",
        "IPv4",
        http(),
        json!([{"addresses": ["10.0.0.1"], "conditions": {"ready": false, "serving": true, "terminating": true}},
                   {"addresses": ["10.0.0.5"], "conditions": {"ready": true}}]),
    );
    let on2 = from_slices(
        [&s2],
        &ConvertOptions {
            drain_terminating: Drain::Fallback,
            ..Default::default()
        },
    );
    assert_eq!(hosts(&on2, "http"), vec!["10.0.0.5:80"]);
    assert_eq!(on2.ports["http"][0].draining, None);
}

#[test]
fn draining_always_publishes_serving_terminating_with_weight_zero_next_to_ready() {
    let s = slice(
        "a",
        "IPv4",
        http(),
        json!([{"addresses": ["10.0.0.1"], "conditions": {"ready": false, "serving": true, "terminating": true}},
                   {"addresses": ["10.0.0.2"], "conditions": {"ready": false, "serving": false, "terminating": true}},
                   {"addresses": ["10.0.0.3"], "conditions": {"ready": false, "serving": false, "terminating": false}},
                   {"addresses": ["10.0.0.5"], "conditions": {"ready": true}}]),
    );
    let always = ConvertOptions {
        drain_terminating: Drain::Always,
        ..Default::default()
    };
    let c = from_slices([&s], &always);
    // Ready with its weight, serving+terminating with weight 0; neither
    // the not-serving terminating one nor the plain not-ready one.
    let got: Vec<(String, u32, Option<bool>)> = c.ports["http"]
        .iter()
        .map(|n| (n.host.to_string(), n.weight, n.draining))
        .collect();
    assert_eq!(
        got,
        vec![
            ("10.0.0.1".to_string(), 0, Some(true)),
            ("10.0.0.5".to_string(), 50, None),
        ]
    );
    // Nothing ready: the draining node alone, still weight 0 (no
    // fallback to full weight: that is `true`'s job).
    let only = slice(
        "b",
        "IPv4",
        http(),
        json!([{"addresses": ["10.0.0.1"], "conditions": {"ready": false, "serving": true, "terminating": true}}]),
    );
    let c = from_slices([&only], &always);
    assert_eq!(c.ports["http"][0].weight, 0);
    assert_eq!(c.ports["http"][0].draining, Some(true));
    // The same endpoint ready in one slice and terminating in another:
    // the non-terminating one wins, published once with its weight.
    let dup = slice(
        "c",
        "IPv4",
        http(),
        json!([{"addresses": ["10.0.0.5"], "conditions": {"ready": false, "serving": true, "terminating": true}}]),
    );
    let c = from_slices([&s, &dup], &always);
    let five: Vec<_> = c.ports["http"]
        .iter()
        .filter(|n| n.host == "10.0.0.5")
        .map(|n| (n.weight, n.draining))
        .collect();
    assert_eq!(five, vec![(50, None)]);
}

#[test]
fn port_keys_name_then_number_and_aliases() {
    let s = slice(
        "a",
        "IPv4",
        json!([{"name": "http", "port": 8080}, {"name": "", "port": 9090}, {"port": 9091}]),
        json!([{"addresses": ["10.0.0.1"]}]),
    );
    let c = from_slices([&s], &ConvertOptions::default());
    assert_eq!(
        c.ports.keys().collect::<Vec<_>>(),
        vec!["9090", "9091", "http"]
    );
    let c = from_slices(
        [&s],
        &ConvertOptions {
            index_port_numbers: true,
            ..Default::default()
        },
    );
    assert_eq!(
        c.ports.keys().collect::<Vec<_>>(),
        vec!["8080", "9090", "9091", "http"]
    );
    assert_eq!(c.ports["8080"], c.ports["http"]);
}

#[test]
fn ipv6_and_fqdn_slices() {
    let v6 = slice(
        "a",
        "IPv6",
        http(),
        json!([{"addresses": ["fd00::1"]}, {"addresses": ["10.0.0.1"]}]),
    );
    let c = from_slices([&v6], &ConvertOptions::default());
    assert_eq!(hosts(&c, "http"), vec!["fd00::1:80"]);
    assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
    assert!(c.warnings[0].contains("not a valid IPv6 address"));
    let fqdn = slice(
        "b",
        "FQDN",
        http(),
        json!([{"addresses": ["db.example.com"]}, {"addresses": ["bad_name!"]}]),
    );
    let c = from_slices([&fqdn], &ConvertOptions::default());
    assert_eq!(hosts(&c, "http"), vec!["db.example.com:80"]);
    assert_eq!(c.warnings.len(), 1);
}

#[test]
fn bad_data_skipped_with_warnings_good_kept() {
    let bad_type = slice("t", "IPX", http(), json!([{"addresses": ["10.0.0.9"]}]));
    let s = slice(
        "a",
        "IPv4",
        json!([{"name": "http", "port": 80}, {"name": "none"}, {"name": "zero", "port": 0},
                   {"name": "big", "port": 65536}, {"name": "http", "port": 81}]),
        json!([{"addresses": ["10.0.0.1"]}, {"addresses": ["10.0.0.256"]}, {"addresses": []},
                   {"addresses": ["nope", "10.0.0.2"]}]),
    );
    let c = from_slices([&bad_type, &s], &ConvertOptions::default());
    assert_eq!(c.ports.keys().collect::<Vec<_>>(), vec!["http"]);
    assert_eq!(hosts(&c, "http"), vec!["10.0.0.1:80", "10.0.0.2:80"]);
    let w = c.warnings.join("\n");
    assert!(
        w.contains("EndpointSlice ns/t: unknown addressType \"IPX\""),
        "{w}"
    );
    assert!(w.contains("ports[1] has no port number"), "{w}");
    assert!(w.contains("port 0 outside"), "{w}");
    assert!(w.contains("port 65536 outside"), "{w}");
    assert!(w.contains("duplicates port name \"http\""), "{w}");
    assert!(w.contains("\"10.0.0.256\" is not a valid IPv4"), "{w}");
    assert!(w.contains("endpoints[2] has no address"), "{w}");
    assert!(w.contains("\"nope\""), "{w}");
}

#[test]
fn topology_fields() {
    let s = slice(
        "a",
        "IPv4",
        http(),
        json!([{"addresses": ["10.0.0.1"], "zone": "z1", "nodeName": "n1",
                    "targetRef": {"kind": "Pod", "name": "web-1", "namespace": "ns"}}]),
    );
    let c = from_slices(
        [&s],
        &ConvertOptions {
            topology: true,
            ..Default::default()
        },
    );
    let n = &c.ports["http"][0];
    assert_eq!((n.zone(), n.node_name()), (Some("z1"), Some("n1")));
    assert_eq!(n.target_ref().unwrap().name, "web-1");
    let plain = from_slices([&s], &ConvertOptions::default());
    assert_eq!(
        serde_json::to_value(&plain.ports["http"][0]).unwrap(),
        json!({"host": "10.0.0.1", "port": 80, "weight": 50})
    );
}
