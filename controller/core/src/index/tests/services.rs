//! Service information: port names, aliases and appProtocols, export and weight
//! annotations, ExternalName services, unresolved ports.

use super::*;

fn service_info(ports: Value) -> ServiceInfo {
    let s: k8s_openapi::api::core::v1::Service = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "ns"},
        "spec": {"ports": ports}
    }))
    .unwrap();
    ServiceInfo::from_service(&s)
}

/// The Service's ports give aliases and appProtocols in both modes,
/// whichever of Service and endpoints comes first; without a Service
/// the value (and its version) is exactly what it was before Services
/// were read.
#[test]
fn service_ports_give_aliases_and_app_protocols_in_both_modes() {
    let http = service_info(json!([
        {"name": "http", "port": 8000, "targetPort": "web", "appProtocol": "kubernetes.io/h2c"}
    ]));
    for source in [SourceKind::Endpoints, SourceKind::EndpointSlice] {
        let mut i = idx(source);
        let apply = |i: &mut Index| match source {
            SourceKind::Endpoints => i.apply_endpoints(&ep("ns", "web", &["10.0.0.1"], json!({}))),
            SourceKind::EndpointSlice => i.apply_slice(&slice(
                "ns",
                "web-1",
                Some("web"),
                json!([{"addresses": ["10.0.0.1"]}]),
            )),
        };
        assert_eq!(apply(&mut i), vec![k("ns", "web")]);
        let plain = i.get(&k("ns", "web")).unwrap().clone();
        assert!(plain.extras.is_empty());
        assert_eq!(
            plain.version,
            crate::model::version::object_version(source, &plain.ports, plain.owner_uid.as_deref())
        );
        // The Service arrives: same nodes, aliases and appProtocol added.
        assert_eq!(
            i.set_service("ns", "web", Some(http.clone())),
            vec![k("ns", "web")]
        );
        let with = i.get(&k("ns", "web")).unwrap().clone();
        assert_eq!(with.ports, plain.ports);
        assert_eq!(with.extras.aliases["8000"], "http");
        assert_eq!(with.extras.app_protocols["http"], "kubernetes.io/h2c");
        assert_ne!(with.version, plain.version);
        assert_eq!(with.nodes("8000"), with.nodes("http"));
        assert!(with.nodes("8000").is_some() && with.nodes("9999").is_none());
        // Same Service again: nothing changed.
        assert!(i.set_service("ns", "web", Some(http.clone())).is_empty());
        // An endpoint change keeps the extras.
        let _ = apply(&mut i);
        assert_eq!(i.get(&k("ns", "web")).unwrap().extras, with.extras);
        // Service deleted: back to the plain value, same version as before.
        assert_eq!(i.set_service("ns", "web", None), vec![k("ns", "web")]);
        assert_eq!(i.get(&k("ns", "web")).unwrap(), &plain);
        // Service first, endpoints after: the same result.
        let mut j = idx(source);
        assert!(j.set_service("ns", "web", Some(http.clone())).is_empty());
        let _ = apply(&mut j);
        assert_eq!(j.get(&k("ns", "web")).unwrap().extras, with.extras);
    }
}

/// A Service (re)list replaces the known Services: changed and vanished
/// ones are reported, unchanged ones not; a Service change while an
/// endpoints relist is arriving ends up in the relist's result.
#[test]
fn service_relists_and_changes_during_an_endpoints_relist() {
    let mut i = idx(SourceKind::Endpoints);
    i.apply_endpoints(&ep("ns", "web", &["10.0.0.1"], json!({})));
    i.apply_endpoints(&ep("ns", "api", &["10.0.0.2"], json!({})));
    let http80 = service_info(json!([{"name": "http", "port": 80}]));
    let http81 = service_info(json!([{"name": "http", "port": 81}]));
    let all = |web: &ServiceInfo| {
        vec![
            ("ns".to_string(), "web".to_string(), web.clone()),
            ("ns".to_string(), "api".to_string(), http81.clone()),
        ]
    };
    assert_eq!(
        i.reset_services(all(&http80)),
        vec![k("ns", "api"), k("ns", "web")]
    );
    assert_eq!(i.service_count(), 2);
    assert_eq!(i.get(&k("ns", "web")).unwrap().extras.aliases["80"], "http");
    assert!(i.reset_services(all(&http80)).is_empty());
    // The Service changes while an endpoints relist is arriving.
    i.begin_reset();
    i.reset_add_endpoints(&ep("ns", "web", &["10.0.0.1"], json!({})));
    i.reset_add_endpoints(&ep("ns", "api", &["10.0.0.2"], json!({})));
    // Reported at once (the live state has it), and the relist built
    // before it does not undo it.
    assert_eq!(
        i.set_service("ns", "web", Some(http81.clone())),
        vec![k("ns", "web")]
    );
    assert!(i.finish_reset_endpoints().is_empty());
    assert_eq!(i.get(&k("ns", "web")).unwrap().extras.aliases["81"], "http");
    // Gone from the list: its extras go.
    assert_eq!(
        i.reset_services([("ns".to_string(), "api".to_string(), http81.clone())]),
        vec![k("ns", "web")]
    );
    assert!(i.get(&k("ns", "web")).unwrap().extras.is_empty());
    // A Service outside the namespace filter is not kept.
    let mut f = Index::new(
        String::new(),
        SourceKind::Endpoints,
        ConvertOptions::default(),
        NamespaceFilter::Match(vec![AnchoredRegex::new("dev").unwrap()]),
    );
    assert!(f.set_service("ns", "web", Some(http81.clone())).is_empty());
    assert_eq!(f.service_count(), 0);
}

/// `service_port_aliases: false`: no aliases, appProtocols still.
#[test]
fn aliases_can_be_turned_off() {
    let mut i = Index::new(
        String::new(),
        SourceKind::Endpoints,
        ConvertOptions {
            service_port_aliases: false,
            ..ConvertOptions::default()
        },
        NamespaceFilter::All,
    );
    i.apply_endpoints(&ep("ns", "web", &["10.0.0.1"], json!({})));
    i.set_service(
        "ns",
        "web",
        Some(service_info(
            json!([{"name": "http", "port": 8000, "appProtocol": "grpc"}]),
        )),
    );
    let s = i.get(&k("ns", "web")).unwrap();
    assert!(s.extras.aliases.is_empty());
    assert_eq!(s.extras.app_protocols["http"], "grpc");
    assert!(s.nodes("8000").is_none());
}

fn annotated(annotations: Value) -> ServiceInfo {
    let s: k8s_openapi::api::core::v1::Service = serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "ns", "annotations": annotations},
        "spec": {"ports": [{"name": "http", "port": 80}]}
    }))
    .unwrap();
    ServiceInfo::from_service(&s)
}

/// `kubediscovery.io/export` and `kubediscovery.io/weight`, in both
/// modes and both export modes: "false" deletes the object and "true"
/// brings it back without a new endpoint event (Endpoints mode keeps
/// the nodes); the weight applies to every node and goes back to
/// `default_weight` without it; invalid values are skipped, warned once
/// and counted, never guessed.
#[test]
fn export_and_weight_annotations() {
    for source in [SourceKind::Endpoints, SourceKind::EndpointSlice] {
        for opt_in in [false, true] {
            let mut i = Index::new(
                String::new(),
                source,
                ConvertOptions {
                    export_opt_in: opt_in,
                    ..ConvertOptions::default()
                },
                NamespaceFilter::All,
            );
            let web = k("ns", "web");
            let _ = match source {
                SourceKind::Endpoints => {
                    i.apply_endpoints(&ep("ns", "web", &["10.0.0.1"], json!({})))
                }
                SourceKind::EndpointSlice => i.apply_slice(&slice(
                    "ns",
                    "web-1",
                    Some("web"),
                    json!([{"addresses": ["10.0.0.1"]}]),
                )),
            };
            // No Service known: published unless opt-in.
            assert_eq!(i.get(&web).is_some(), !opt_in, "{source} opt_in={opt_in}");
            // Unannotated Service: the same.
            let _ = i.set_service("ns", "web", Some(annotated(json!({}))));
            assert_eq!(i.get(&web).is_some(), !opt_in);
            // "true": published, with its nodes.
            let _ = i.set_service(
                "ns",
                "web",
                Some(annotated(json!({"kubediscovery.io/export": "true"}))),
            );
            assert_eq!(hosts(&i, &web), vec!["10.0.0.1"]);
            assert_eq!(i.len(), 1);
            // "false": gone (reported), nodes kept aside.
            assert_eq!(
                i.set_service(
                    "ns",
                    "web",
                    Some(annotated(json!({"kubediscovery.io/export": "false"})))
                ),
                vec![web.clone()]
            );
            assert!(i.get(&web).is_none() && i.is_empty() && i.node_count() == 0);
            // A relist while withheld keeps it withheld.
            match source {
                SourceKind::Endpoints => {
                    assert!(
                        i.reset_endpoints(&[ep("ns", "web", &["10.0.0.1"], json!({}))])
                            .is_empty()
                    )
                }
                SourceKind::EndpointSlice => assert!(
                    i.reset_slices(&[slice(
                        "ns",
                        "web-1",
                        Some("web"),
                        json!([{"addresses": ["10.0.0.1"]}]),
                    )])
                    .is_empty()
                ),
            }
            assert!(i.get(&web).is_none());
            // Weight 7 and "true": back, every node weighs 7.
            assert_eq!(
                i.set_service(
                    "ns",
                    "web",
                    Some(annotated(json!({"kubediscovery.io/export": "true",
                                               "kubediscovery.io/weight": "7"})))
                ),
                vec![web.clone()]
            );
            let s = i.get(&web).unwrap();
            assert_eq!(s.ports["http"][0].weight, 7);
            assert_eq!(i.node_count(), 1);
            assert!(i.take_skipped().is_empty());
            // Invalid values: skipped (as if absent), warned and counted once.
            let bad = annotated(json!({"kubediscovery.io/export": "yes",
                                           "kubediscovery.io/weight": "-1"}));
            let _ = i.set_service("ns", "web", Some(bad.clone()));
            assert_eq!(i.get(&web).is_some(), !opt_in);
            if let Some(s) = i.get(&web) {
                assert_eq!(s.ports["http"][0].weight, 50);
            }
            let w: Vec<&String> = i.warnings().flat_map(|(_, w)| w).collect();
            assert_eq!(w.len(), 2, "{w:?}");
            assert!(
                w[0].contains("Service ns/web") && w[0].contains("kubediscovery.io/export=\"yes\""),
                "{w:?}"
            );
            assert!(w[1].contains("kubediscovery.io/weight=\"-1\""), "{w:?}");
            assert_eq!(
                i.take_skipped(),
                BTreeMap::from([(SkipReason::InvalidAnnotation, 2)])
            );
            // The news for an Event: once, naming each annotation.
            let news = i.take_service_news();
            assert_eq!(news.len(), 1, "{news:?}");
            assert_eq!(
                (news[0].namespace.as_str(), news[0].name.as_str()),
                ("ns", "web")
            );
            assert_eq!(
                news[0].warnings.iter().map(|(r, _)| *r).collect::<Vec<_>>(),
                [SkipReason::InvalidAnnotation, SkipReason::InvalidAnnotation]
            );
            // The same bad Service again (event or relist): not counted again.
            let _ = i.set_service("ns", "web", Some(bad.clone()));
            let _ = i.reset_services([("ns".into(), "web".into(), bad)]);
            assert!(i.take_skipped().is_empty());
            assert!(i.take_service_news().is_empty());
            // Another bad value: news again.
            let worse = annotated(json!({"kubediscovery.io/weight": "heavy"}));
            let _ = i.reset_services([("ns".into(), "web".into(), worse)]);
            let news = i.take_service_news();
            assert_eq!(news.len(), 1, "{news:?}");
            assert!(news[0].warnings[0].1.contains("heavy"), "{news:?}");
            // Fixed, then gone: the warnings go.
            let _ = i.reset_services([("ns".into(), "web".into(), annotated(json!({})))]);
            assert_eq!(i.warnings().count(), 0);
            let _ = i.set_service("ns", "web", None);
            assert_eq!(i.get(&web).is_some(), !opt_in);
        }
    }
}

fn external(name: &str, host: &str) -> ServiceInfo {
    let s: k8s_openapi::api::core::v1::Service = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns"},
        "spec": {"type": "ExternalName", "externalName": host,
                 "ports": [{"name": "https", "port": 443}, {"port": 80}]}
    }))
    .unwrap();
    ServiceInfo::from_service(&s)
}

/// ExternalName Services: ignored unless enabled; allowed hosts (full
/// match) become one node per port in both modes and survive endpoint
/// relists; a host outside the allowlist or not a DNS name is skipped
/// with a warning and counted; a Service that stops being ExternalName
/// loses those nodes.
#[test]
fn external_name_services() {
    let allow = vec![AnchoredRegex::new(r"[a-z0-9-]+\.example\.com").unwrap()];
    for source in [SourceKind::Endpoints, SourceKind::EndpointSlice] {
        // Disabled (default): nothing, no warning.
        let mut off = idx(source);
        assert!(
            off.set_service("ns", "ext", Some(external("ext", "db.example.com")))
                .is_empty()
        );
        assert!(off.is_empty() && off.warnings().count() == 0);

        let mut i = Index::new(
            String::new(),
            source,
            ConvertOptions {
                external_name: Some(allow.clone()),
                service_port_aliases: true,
                ..ConvertOptions::default()
            },
            NamespaceFilter::All,
        );
        let ext = k("ns", "ext");
        assert_eq!(
            i.set_service("ns", "ext", Some(external("ext", "db.example.com"))),
            vec![ext.clone()]
        );
        let s = i.get(&ext).unwrap();
        assert_eq!(
            serde_json::to_value(&s.ports).unwrap(),
            json!({"80": [{"host": "db.example.com", "port": 80, "weight": 50}],
                       "https": [{"host": "db.example.com", "port": 443, "weight": 50}]})
        );
        assert_eq!(s.extras.aliases["443"], "https");
        // An endpoints relist does not drop it.
        match source {
            SourceKind::Endpoints => assert!(i.reset_endpoints::<Endpoints>(&[]).is_empty()),
            SourceKind::EndpointSlice => {
                assert!(i.reset_slices::<EndpointSlice>(&[]).is_empty())
            }
        }
        assert!(i.get(&ext).is_some());
        // Outside the allowlist ("evil.example.com.attacker.io" does not
        // fully match) and not a DNS name: skipped, warned, counted.
        assert_eq!(
            i.set_service(
                "ns",
                "ext",
                Some(external("ext", "db.example.com.attacker.io"))
            ),
            vec![ext.clone()]
        );
        assert!(i.get(&ext).is_none());
        let _ = i.set_service("ns", "bad", Some(external("bad", "not a host")));
        assert!(i.get(&k("ns", "bad")).is_none());
        assert_eq!(
            i.take_skipped(),
            BTreeMap::from([
                (SkipReason::InvalidExternalName, 1),
                (SkipReason::ExternalNameRefused, 1)
            ])
        );
        let w: Vec<&String> = i.warnings().flat_map(|(_, w)| w).collect();
        assert!(
            w.iter().any(|m| m.contains("Service ns/ext")
                && m.contains("db.example.com.attacker.io")
                && m.contains("external_name.allow")),
            "{w:?}"
        );
        // Allowed again, then turned into a ClusterIP Service: gone.
        let _ = i.set_service("ns", "ext", Some(external("ext", "db.example.com")));
        assert!(i.get(&ext).is_some());
        assert_eq!(
            i.set_service(
                "ns",
                "ext",
                Some(service_info(json!([{"name": "http", "port": 80}])))
            ),
            vec![ext.clone()]
        );
        assert!(i.get(&ext).is_none());
    }
}

/// An allowed ExternalName Service ignores its EndpointSlices, so the
/// warnings of what its slices skipped are not current: they must not
/// stay in `Index::warnings` when the Service becomes ExternalName after
/// its slices arrived (the other order never records them). Found by
/// `tests/order_independence.rs`.
#[test]
fn an_external_name_service_drops_the_warnings_of_its_slices_in_either_order() {
    let new = || {
        Index::new(
            String::new(),
            SourceKind::EndpointSlice,
            ConvertOptions {
                external_name: Some(vec![AnchoredRegex::new(r"db\.example\.com").unwrap()]),
                ..ConvertOptions::default()
            },
            NamespaceFilter::All,
        )
    };
    let bad = slice(
        "ns",
        "ext-1",
        Some("ext"),
        json!([{"addresses": ["999.0.0.1"]}]),
    );
    let info = external("ext", "db.example.com");
    let objects = |i: &Index| -> Vec<String> { i.warnings().map(|(o, _)| o.clone()).collect() };
    // Its slice while a plain Service: the skipped address is warned.
    let mut late = new();
    late.apply_slice(&bad);
    assert_eq!(objects(&late), ["EndpointSlices of ns/ext"]);
    let _ = late.set_service("ns", "ext", Some(info.clone()));
    // The Service first.
    let mut early = new();
    let _ = early.set_service("ns", "ext", Some(info));
    early.apply_slice(&bad);
    let ext = k("ns", "ext");
    assert!(late.get(&ext).is_some() && late.get(&ext) == early.get(&ext));
    assert!(objects(&early).is_empty(), "{:?}", objects(&early));
    assert_eq!(objects(&late), objects(&early), "the order does not matter");
    // No longer ExternalName: its slices count again, with their warnings.
    let _ = late.set_service("ns", "ext", None);
    assert_eq!(objects(&late), ["EndpointSlices of ns/ext"]);
}

/// A Service port whose targetPort no endpoint has: no port key, no
/// alias, lookups find nothing, and the index says why.
#[test]
fn unresolved_service_ports_are_exposed_as_data() {
    let mut i = idx(SourceKind::Endpoints);
    i.apply_endpoints(&ep("ns", "web", &["10.0.0.1"], json!({})));
    let _ = i.set_service(
        "ns",
        "web",
        Some(service_info(json!([
            {"name": "http", "port": 80},
            {"name": "admin", "port": 9000, "targetPort": "admin"}
        ]))),
    );
    let web = k("ns", "web");
    let s = i.get(&web).unwrap();
    assert!(s.nodes("admin").is_none() && s.nodes("9000").is_none());
    assert!(s.nodes("80").is_some());
    assert_eq!(
        i.unresolved_ports(&web),
        ["Service port 9000 (admin): no endpoint has targetPort admin; the port has no nodes"]
    );
    assert!(i.unresolved_ports(&k("ns", "nope")).is_empty());
}
