use super::*;
use serde_json::json;

fn ep(v: serde_json::Value) -> Endpoints {
    serde_json::from_value(v).unwrap()
}

fn hosts(c: &Converted, key: &str) -> Vec<(String, i32)> {
    c.ports[key]
        .iter()
        .map(|n| (n.host.to_string(), n.port))
        .collect()
}

/// The reference page's example: `nodes("default/plat-dev:port")`.
#[test]
fn reference_plat_dev_example() {
    let e = ep(json!({
        "metadata": {"name": "plat-dev", "namespace": "default"},
        "subsets": [{
            "addresses": [{"ip": "10.5.10.110"}, {"ip": "10.5.10.109"}],
            "ports": [{"name": "port", "port": 3306}]
        }]
    }));
    let c = from_endpoints(&e, &ConvertOptions::default());
    assert!(c.warnings.is_empty());
    assert_eq!(
        serde_json::to_value(&c.ports["port"]).unwrap(),
        json!([
            {"host": "10.5.10.109", "port": 3306, "weight": 50},
            {"host": "10.5.10.110", "port": 3306, "weight": 50}
        ])
    );
    assert_eq!(c.ports.len(), 1);
}

#[test]
fn addresses_times_ports_never_not_ready() {
    let e = ep(json!({
        "metadata": {"name": "web", "namespace": "ns"},
        "subsets": [{
            "addresses": [{"ip": "10.0.0.1"}],
            "notReadyAddresses": [{"ip": "10.0.0.9"}],
            "ports": [{"name": "http", "port": 80}, {"name": "metrics", "port": 9090}]
        }, {
            "addresses": [{"ip": "10.0.0.2"}],
            "ports": [{"name": "http", "port": 8080}]
        }]
    }));
    let c = from_endpoints(&e, &ConvertOptions::default());
    assert_eq!(
        hosts(&c, "http"),
        vec![("10.0.0.1".into(), 80), ("10.0.0.2".into(), 8080)]
    );
    assert_eq!(hosts(&c, "metrics"), vec![("10.0.0.1".into(), 9090)]);
}

#[test]
fn unnamed_port_keyed_by_number_and_empty_name_too() {
    let e = ep(json!({
        "metadata": {"name": "web", "namespace": "ns"},
        "subsets": [{"addresses": [{"ip": "10.0.0.1"}], "ports": [{"port": 80}]},
                    {"addresses": [{"ip": "10.0.0.2"}], "ports": [{"name": "", "port": 81}]}]
    }));
    let c = from_endpoints(&e, &ConvertOptions::default());
    assert_eq!(c.ports.keys().collect::<Vec<_>>(), vec!["80", "81"]);
}

#[test]
fn only_not_ready_gives_empty_port_and_no_subsets_gives_nothing() {
    let e = ep(json!({
        "metadata": {"name": "web", "namespace": "ns"},
        "subsets": [{"notReadyAddresses": [{"ip": "10.0.0.1"}], "ports": [{"name": "http", "port": 80}]}]
    }));
    let c = from_endpoints(&e, &ConvertOptions::default());
    assert_eq!(c.ports["http"], vec![]);
    let e = ep(json!({"metadata": {"name": "web", "namespace": "ns"}}));
    assert!(
        from_endpoints(&e, &ConvertOptions::default())
            .ports
            .is_empty()
    );
}

#[test]
fn index_port_numbers_adds_alias() {
    let e = ep(json!({
        "metadata": {"name": "web", "namespace": "ns"},
        "subsets": [{"addresses": [{"ip": "10.0.0.1"}], "ports": [{"name": "http", "port": 80}]}]
    }));
    let opts = ConvertOptions {
        index_port_numbers: true,
        ..Default::default()
    };
    let c = from_endpoints(&e, &opts);
    assert_eq!(c.ports["http"], c.ports["80"]);
    assert_eq!(c.ports.len(), 2);
    assert!(
        !from_endpoints(&e, &ConvertOptions::default())
            .ports
            .contains_key("80")
    );
}

#[test]
fn weight_ipv6_and_sorting() {
    let e = ep(json!({
        "metadata": {"name": "web", "namespace": "ns"},
        "subsets": [{"addresses": [{"ip": "fd00::2"}, {"ip": "10.0.0.2"}, {"ip": "10.0.0.1"}, {"ip": "fd00::1"}],
                     "ports": [{"name": "http", "port": 80}]}]
    }));
    let opts = ConvertOptions {
        default_weight: 7,
        ..Default::default()
    };
    let c = from_endpoints(&e, &opts);
    assert_eq!(
        c.ports["http"]
            .iter()
            .map(|n| n.host.as_str())
            .collect::<Vec<_>>(),
        vec!["10.0.0.1", "10.0.0.2", "fd00::1", "fd00::2"]
    );
    assert!(c.ports["http"].iter().all(|n| n.weight == 7));
    let e0 = ep(json!({
        "metadata": {"name": "web", "namespace": "ns"},
        "subsets": [{"addresses": [{"ip": "10.0.0.1"}], "ports": [{"name": "http", "port": 80}]}]
    }));
    let c0 = from_endpoints(
        &e0,
        &ConvertOptions {
            default_weight: 0,
            ..Default::default()
        },
    );
    assert_eq!(c0.ports["http"][0].weight, 0);
}

#[test]
fn bad_data_skipped_with_warning_good_data_kept() {
    let e = ep(json!({
        "metadata": {"name": "web", "namespace": "ns"},
        "subsets": [{
            "addresses": [{"ip": "10.0.0.1"}, {"ip": "not-an-ip"}, {"ip": "999.0.0.1"}],
            "ports": [{"name": "http", "port": 80}, {"name": "bad", "port": 0}, {"name": "big", "port": 70000},
                      {"name": "http", "port": 81}]
        }]
    }));
    let c = from_endpoints(&e, &ConvertOptions::default());
    assert_eq!(c.ports.keys().collect::<Vec<_>>(), vec!["http"]);
    assert_eq!(hosts(&c, "http"), vec![("10.0.0.1".into(), 80)]);
    assert_eq!(c.warnings.len(), 5, "{:#?}", c.warnings);
    assert!(
        c.warnings
            .iter()
            .any(|w| w.contains("Endpoints ns/web") && w.contains("not-an-ip"))
    );
    assert!(c.warnings.iter().any(|w| w.contains("port 0 outside")));
    assert!(c.warnings.iter().any(|w| w.contains("port 70000 outside")));
    assert!(
        c.warnings
            .iter()
            .any(|w| w.contains("duplicates port name \"http\""))
    );
}

#[test]
fn topology_fills_node_name_and_target_ref() {
    let e = ep(json!({
        "metadata": {"name": "web", "namespace": "ns"},
        "subsets": [{"addresses": [{"ip": "10.0.0.1", "nodeName": "n1",
                                    "targetRef": {"kind": "Pod", "namespace": "ns", "name": "web-1", "uid": "u1"}}],
                     "ports": [{"name": "http", "port": 80}]}]
    }));
    let plain = from_endpoints(&e, &ConvertOptions::default());
    assert_eq!(plain.ports["http"][0].node_name(), None);
    assert_eq!(plain.ports["http"][0].target_ref(), None);
    let c = from_endpoints(
        &e,
        &ConvertOptions {
            topology: true,
            ..Default::default()
        },
    );
    let n = &c.ports["http"][0];
    assert_eq!(n.node_name(), Some("n1"));
    let t = n.target_ref().unwrap();
    assert_eq!(
        (t.kind.as_str(), t.name.as_str(), t.uid.as_deref()),
        ("Pod", "web-1", Some("u1"))
    );
}
