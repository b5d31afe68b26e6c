use super::*;
use crate::source::convert::{ConvertOptions, SliceContribution, from_endpoints, merge_slices};
use serde_json::{Value, json};

/// `v` decoded both ways: the lean decode, and k8s-openapi then `From`
/// with the topology dropped (serde never decodes it).
fn both_endpoints(v: &Value) -> (LeanEndpoints, LeanEndpoints) {
    let lean: LeanEndpoints = serde_json::from_value(v.clone()).unwrap();
    let full: Endpoints = serde_json::from_value(v.clone()).unwrap();
    let mut via = LeanEndpoints::from(&full);
    for s in &mut via.subsets {
        for a in &mut s.addresses {
            a.topology = None;
        }
    }
    (lean, via)
}

fn both_slices(v: &Value) -> (LeanEndpointSlice, LeanEndpointSlice) {
    let lean: LeanEndpointSlice = serde_json::from_value(v.clone()).unwrap();
    let full: EndpointSlice = serde_json::from_value(v.clone()).unwrap();
    let mut via = LeanEndpointSlice::from(&full);
    for e in &mut via.endpoints {
        e.topology = None;
    }
    (lean, via)
}

fn managed_fields() -> Value {
    json!([{"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "v1",
            "time": "2026-12-05T10:00:00Z", "fieldsType": "FieldsV1",
            "fieldsV1": {"f:metadata": {"f:labels": {".": {}, "f:app": {}}}, "f:subsets": {}}}])
}

fn full_endpoints() -> Value {
    json!({"apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": "web", "namespace": "shop", "uid": "u-1", "resourceVersion": "17",
                     "generation": 2, "creationTimestamp": "2026-12-05T10:00:00Z",
                     "labels": {"app": "web"},
                     "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": "2026-12-05T10:00:00Z"},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "web", "uid": "svc-1",
                                          "controller": true, "blockOwnerDeletion": true}],
                     "managedFields": managed_fields()},
        "subsets": [{"addresses": [{"ip": "10.0.0.2", "nodeName": "n1", "hostname": "h",
                                    "targetRef": {"kind": "Pod", "namespace": "shop", "name": "web-1", "uid": "p1"}},
                                   {"ip": "fd00::1"}, {"ip": "bad ip"}],
                     "notReadyAddresses": [{"ip": "10.0.0.9"}],
                     "ports": [{"name": "http", "port": 8080, "protocol": "TCP", "appProtocol": "http"},
                               {"port": 9090}, {"name": "x"}, {"name": "http", "port": 81}]},
                    {"addresses": null, "ports": null}, {}]})
}

fn full_slice() -> Value {
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "web-abc", "namespace": "shop", "resourceVersion": "18",
                     "labels": {"kubernetes.io/service-name": "web"},
                     "annotations": {"a": "b"}, "managedFields": managed_fields(),
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": "web", "uid": "svc-1"}]},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.0.0.1"], "conditions": {"ready": true, "serving": true, "terminating": false},
                       "nodeName": "n1", "zone": "z1", "hints": {"forZones": [{"name": "z1"}]},
                       "targetRef": {"kind": "Pod", "name": "web-1"}},
                      {"addresses": ["nope", "10.0.0.2"], "conditions": {"ready": false, "serving": true, "terminating": true}},
                      {"addresses": ["10.0.0.3"], "conditions": null},
                      {"addresses": ["10.0.0.4"], "conditions": {"ready": null}},
                      {"addresses": []}, {}],
        "ports": [{"name": "http", "port": 80, "protocol": "TCP"}, {"name": "none"}, {"port": 0}, {"port": null}]})
}

#[test]
fn lean_endpoints_decode_equals_the_k8s_openapi_decode_reduced() {
    let (lean, via) = both_endpoints(&full_endpoints());
    assert_eq!(lean, via);
    assert_eq!(lean.subsets.len(), 3);
    assert_eq!(lean.subsets[0].addresses[0].ip, "10.0.0.2");
    assert_eq!(lean.subsets[0].ports[2].port, 0, "absent required port = 0");
    let m = &lean.metadata;
    assert_eq!(m.resource_version.as_deref(), Some("17"));
    assert_eq!(m.labels.as_ref().unwrap()["app"], "web");
    assert_eq!(
        crate::source::convert::owner_service_uid(m).as_deref(),
        Some("svc-1")
    );
    // Never decoded: what would be allocated and dropped.
    assert_eq!(m.managed_fields, None);
    assert_eq!(m.annotations, None);
    assert_eq!(m.creation_timestamp, None);
    assert_eq!(m.generation, None);
}

#[test]
fn lean_endpoints_convert_exactly_like_k8s_openapi_with_the_same_warnings() {
    let v = full_endpoints();
    let full: Endpoints = serde_json::from_value(v.clone()).unwrap();
    let lean: LeanEndpoints = serde_json::from_value(v).unwrap();
    for opts in [
        ConvertOptions::default(),
        ConvertOptions {
            index_port_numbers: true,
            default_weight: 3,
            ..Default::default()
        },
    ] {
        let a = from_endpoints(&lean, &opts);
        assert_eq!(a, from_endpoints(&full, &opts));
        assert!(!a.ports["http"].is_empty());
    }
    let c = from_endpoints(&lean, &ConvertOptions::default());
    assert!(
        c.warnings
            .iter()
            .any(|w| w.contains("Endpoints shop/web") && w.contains("addresses[2].ip \"bad ip\"")),
        "{:#?}",
        c.warnings
    );
    assert!(c.warnings.iter().any(|w| w.contains("port 0 outside")));
    assert!(
        c.warnings
            .iter()
            .any(|w| w.contains("duplicates port name"))
    );
}

#[test]
fn lean_slice_decode_and_conversion_equal_k8s_openapi() {
    let v = full_slice();
    let (lean, via) = both_slices(&v);
    assert_eq!(lean, via);
    assert_eq!(lean.endpoints.len(), 6);
    assert_eq!(lean.endpoints[2].conditions, LeanConditions::default());
    assert_eq!(lean.metadata.managed_fields, None);
    assert_eq!(lean.metadata.annotations, None);
    let full: EndpointSlice = serde_json::from_value(v).unwrap();
    for drain in [
        crate::Drain::Off,
        crate::Drain::Fallback,
        crate::Drain::Always,
    ] {
        let opts = ConvertOptions {
            drain_terminating: drain,
            ..Default::default()
        };
        let a = merge_slices([&SliceContribution::new(&lean, &opts)], &opts);
        let b = merge_slices([&SliceContribution::new(&full, &opts)], &opts);
        assert_eq!(a, b);
        assert!(
            a.warnings
                .iter()
                .any(|w| w.contains("EndpointSlice shop/web-abc")
                    && w.contains("endpoints[1].addresses[0] \"nope\""))
        );
        assert!(a.warnings.iter().any(|w| w.contains("has no port number")));
        assert!(
            a.warnings
                .iter()
                .any(|w| w.contains("endpoints[4] has no address"))
        );
    }
}

#[test]
fn topology_comes_only_from_k8s_openapi_objects() {
    let opts = ConvertOptions {
        topology: true,
        ..Default::default()
    };
    let full: EndpointSlice = serde_json::from_value(full_slice()).unwrap();
    let c = crate::source::convert::from_slices([&full], &opts);
    let n = &c.ports["http"][0];
    assert_eq!(n.node_name(), Some("n1"));
    assert_eq!(n.zone(), Some("z1"));
    assert_eq!(n.target_ref().unwrap().name, "web-1");
    // The lean decode skips it (the controller watches the full type then).
    let lean: LeanEndpointSlice = serde_json::from_value(full_slice()).unwrap();
    let c = crate::source::convert::from_slices([&lean], &opts);
    assert_eq!(c.ports["http"][0].topology(), None);
    let ep: Endpoints = serde_json::from_value(full_endpoints()).unwrap();
    let c = from_endpoints(&ep, &opts);
    let n = c.ports["http"]
        .iter()
        .find(|n| n.host == "10.0.0.2")
        .unwrap();
    assert_eq!(n.node_name(), Some("n1"));
    assert_eq!(n.target_ref().unwrap().uid.as_deref(), Some("p1"));
}

#[test]
fn nulls_and_absent_fields_are_defaults_like_k8s_openapi() {
    for v in [
        json!({}),
        json!({"metadata": null, "subsets": null}),
        json!({"metadata": {"name": null, "labels": null, "ownerReferences": null}}),
        json!({"metadata": {"ownerReferences": [{"kind": "Service", "uid": null}]}}),
        json!({"subsets": [{"addresses": [{"ip": null}], "ports": [{"name": null, "port": null}]}]}),
    ] {
        let (lean, via) = both_endpoints(&v);
        assert_eq!(lean, via, "{v}");
        let full: Endpoints = serde_json::from_value(v.clone()).unwrap();
        let opts = ConvertOptions::default();
        assert_eq!(from_endpoints(&lean, &opts), from_endpoints(&full, &opts));
    }
    for v in [
        json!({}),
        json!({"metadata": null, "addressType": null, "endpoints": null, "ports": null}),
        json!({"addressType": "IPv4", "endpoints": [{"addresses": null, "conditions": {}}]}),
    ] {
        let (lean, via) = both_slices(&v);
        assert_eq!(lean, via, "{v}");
    }
}

#[test]
fn wrong_types_are_errors_as_in_k8s_openapi() {
    for v in [
        json!({"subsets": [{"ports": [{"port": "80"}]}]}),
        json!({"subsets": {"a": 1}}),
        json!({"metadata": {"labels": {"a": 1}}}),
    ] {
        assert!(
            serde_json::from_value::<Endpoints>(v.clone()).is_err(),
            "{v}"
        );
        assert!(
            serde_json::from_value::<LeanEndpoints>(v.clone()).is_err(),
            "{v}"
        );
    }
    let v = json!({"endpoints": [{"conditions": {"ready": "yes"}}]});
    assert!(serde_json::from_value::<EndpointSlice>(v.clone()).is_err());
    assert!(serde_json::from_value::<LeanEndpointSlice>(v).is_err());
}

/// The one documented difference: a duplicate key (no API server sends one).
#[test]
fn a_duplicate_key_is_an_error_where_k8s_openapi_keeps_the_last() {
    let line = r#"{"metadata": {"name": "a", "name": "b"}}"#;
    assert_eq!(
        serde_json::from_str::<Endpoints>(line)
            .unwrap()
            .metadata
            .name
            .as_deref(),
        Some("b")
    );
    let err = serde_json::from_str::<LeanEndpoints>(line).unwrap_err();
    assert!(err.to_string().contains("duplicate field"), "{err}");
}

#[test]
fn same_kind_api_version_and_plural_as_the_k8s_openapi_types() {
    fn id<K: kube::Resource<DynamicType = ()>>() -> [String; 4] {
        [
            K::kind(&()).into(),
            K::group(&()).into(),
            K::api_version(&()).into(),
            K::plural(&()).into(),
        ]
    }
    assert_eq!(id::<LeanEndpoints>(), id::<Endpoints>());
    assert_eq!(id::<LeanEndpointSlice>(), id::<EndpointSlice>());
    assert_eq!(id::<LeanService>(), id::<Service>());
    assert_eq!(
        id::<LeanEndpointSlice>(),
        [
            "EndpointSlice",
            "discovery.k8s.io",
            "discovery.k8s.io/v1",
            "endpointslices"
        ]
    );
    assert_eq!(
        <LeanEndpoints as kube::Resource>::url_path(&(), Some("ns")),
        "/api/v1/namespaces/ns/endpoints"
    );
}

/// A watch line, as kube-runtime's watcher decodes it.
#[test]
fn a_watch_event_line_decodes_into_the_lean_type() {
    let line = serde_json::to_string(&json!({"type": "MODIFIED", "object": full_slice()})).unwrap();
    match serde_json::from_str::<kube::core::WatchEvent<LeanEndpointSlice>>(&line).unwrap() {
        kube::core::WatchEvent::Modified(s) => {
            assert_eq!(s.metadata.name.as_deref(), Some("web-abc"));
            assert_eq!(s.endpoints.len(), 6);
        }
        other => panic!("{other:?}"),
    }
}

fn full_service() -> Value {
    json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "shop", "uid": "svc-1", "resourceVersion": "5",
                     "labels": {"app": "web"}, "managedFields": managed_fields(),
                     "annotations": {
                         "kubectl.kubernetes.io/last-applied-configuration": "{\"apiVersion\":\"v1\",\"kind\":\"Service\"}",
                         "kubediscovery.io/export": "true",
                         "kubediscovery.io/weight": " nine ",
                         "kubediscovery.io.other/x": "y"}},
        "spec": {"type": "ClusterIP", "clusterIP": "10.96.0.7", "selector": {"app": "web"},
                 "ports": [{"name": "http", "port": 80, "targetPort": "web", "protocol": "TCP", "appProtocol": "h2c"},
                           {"name": "grpc", "port": 81, "targetPort": 9090},
                           {"name": "n", "port": 82, "targetPort": "8082", "appProtocol": ""},
                           {"name": null, "port": null, "targetPort": null}]},
        "status": {"loadBalancer": {}}})
}

#[test]
fn lean_service_keeps_ports_type_and_only_our_annotations() {
    use crate::source::service::ServiceInfo;
    let v = full_service();
    let lean: LeanService = serde_json::from_value(v.clone()).unwrap();
    let full: Service = serde_json::from_value(v).unwrap();
    assert_eq!(lean, LeanService::from(&full));
    let a = lean.metadata.annotations.as_ref().unwrap();
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        ["kubediscovery.io/export", "kubediscovery.io/weight"]
    );
    assert_eq!(lean.metadata.managed_fields, None);
    let info = ServiceInfo::from_service(&lean);
    assert_eq!(info, ServiceInfo::from_service(&full));
    assert_eq!(info.export, Some(true));
    assert_eq!(info.ports.len(), 4);
    assert!(
        info.invalid[0].contains("Service shop/web: annotation kubediscovery.io/weight=\"nine\""),
        "{:?}",
        info.invalid
    );
    // ExternalName, and the null cases k8s-openapi takes as defaults.
    for v in [
        json!({"metadata": {"name": "x", "namespace": "n"},
               "spec": {"type": "ExternalName", "externalName": " db.example.com "}}),
        json!({"metadata": {"annotations": null}, "spec": null}),
        json!({"metadata": {"annotations": {"kubediscovery.io/export": "maybe"}}, "spec": {"ports": null}}),
        json!({}),
    ] {
        let lean: LeanService = serde_json::from_value(v.clone()).unwrap();
        let full: Service = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(lean, LeanService::from(&full), "{v}");
        assert_eq!(
            ServiceInfo::from_service(&lean),
            ServiceInfo::from_service(&full),
            "{v}"
        );
    }
    assert!(
        serde_json::from_value::<LeanService>(
            json!({"metadata": {"annotations": {"kubediscovery.io/export": 1}}})
        )
        .is_err()
    );
    assert!(
        serde_json::from_value::<Service>(
            json!({"metadata": {"annotations": {"kubediscovery.io/export": 1}}})
        )
        .is_err()
    );
}

/// A small deterministic generator (no dependency): xorshift64*.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// `v` with a few random edits: a value nulled, removed, replaced by
/// another JSON type, or an array emptied.
fn mutate(v: &mut Value, rng: &mut Rng) {
    let edits = 1 + rng.below(3);
    for _ in 0..edits {
        let mut at = &mut *v;
        loop {
            let children = match at {
                Value::Object(m) => m.len(),
                Value::Array(a) => a.len(),
                _ => 0,
            };
            if children == 0 || rng.below(4) == 0 {
                break;
            }
            let i = usize::try_from(rng.below(children as u64)).unwrap();
            at = match at {
                Value::Object(m) => m.values_mut().nth(i).unwrap(),
                Value::Array(a) => &mut a[i],
                _ => unreachable!(),
            };
        }
        *at = match rng.below(7) {
            0 => Value::Null,
            1 => json!(rng.below(70_000)),
            2 => json!("x"),
            3 => json!(true),
            4 => json!([]),
            5 => json!({}),
            _ => {
                if let Value::Object(m) = at {
                    let n = m.len() as u64;
                    if n > 0 {
                        let i = usize::try_from(rng.below(n)).unwrap();
                        let k = m.keys().nth(i).unwrap().clone();
                        m.remove(&k);
                    }
                }
                continue;
            }
        };
    }
}

/// The `lean_decode` fuzz target's property on every test run: randomly
/// edited objects decode into the lean types whenever k8s-openapi decodes
/// them, and convert to the same result. Also checks that the edits reach
/// both outcomes (the test could not pass by never decoding).
#[test]
fn random_edits_decode_and_convert_like_k8s_openapi() {
    use crate::source::service::ServiceInfo;
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let opts = ConvertOptions {
        index_port_numbers: true,
        ..Default::default()
    };
    let (mut ok, mut refused) = (0, 0);
    for round in 0..3000 {
        let mut v = match round % 3 {
            0 => full_endpoints(),
            1 => full_slice(),
            _ => full_service(),
        };
        mutate(&mut v, &mut rng);
        match round % 3 {
            0 => match serde_json::from_value::<Endpoints>(v.clone()) {
                Ok(full) => {
                    let lean: LeanEndpoints =
                        serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{e}: {v}"));
                    assert_eq!(
                        from_endpoints(&lean, &opts),
                        from_endpoints(&full, &opts),
                        "{v}"
                    );
                    ok += 1;
                }
                Err(_) => refused += 1,
            },
            1 => match serde_json::from_value::<EndpointSlice>(v.clone()) {
                Ok(full) => {
                    let lean: LeanEndpointSlice =
                        serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{e}: {v}"));
                    assert_eq!(
                        merge_slices([&SliceContribution::new(&lean, &opts)], &opts),
                        merge_slices([&SliceContribution::new(&full, &opts)], &opts),
                        "{v}"
                    );
                    ok += 1;
                }
                Err(_) => refused += 1,
            },
            _ => match serde_json::from_value::<Service>(v.clone()) {
                Ok(full) => {
                    let lean: LeanService =
                        serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{e}: {v}"));
                    assert_eq!(
                        ServiceInfo::from_service(&lean),
                        ServiceInfo::from_service(&full),
                        "{v}"
                    );
                    ok += 1;
                }
                Err(_) => refused += 1,
            },
        }
    }
    assert!(ok > 500 && refused > 500, "decoded {ok}, refused {refused}");
}
