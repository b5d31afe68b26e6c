use super::*;
use serde_json::json;

fn plat_dev() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Endpoints",
        "metadata": {"name": "plat-dev", "namespace": "default"},
        "subsets": [{"addresses": [{"ip": "10.5.10.109"}, {"ip": "10.5.10.110"}],
                     "ports": [{"name": "port", "port": 3306}]}]
    })
}

fn web_slice(name: &str, ip: &str) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080}],
        "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}]
    })
}

#[test]
fn reference_example_renders() {
    let out = render(&[plat_dev()], &RenderOptions::default()).unwrap();
    assert_eq!(out.len(), 1);
    let ds = &out[0];
    assert_eq!(ds.metadata.name.as_deref(), Some("plat-dev"));
    assert_eq!(ds.spec.source, SourceKind::Endpoints);
    assert_eq!(
        serde_json::to_value(&ds.spec.ports["port"]).unwrap(),
        json!([{"host": "10.5.10.109", "port": 3306, "weight": 50},
                   {"host": "10.5.10.110", "port": 3306, "weight": 50}])
    );
}

#[test]
fn slices_auto_detected_merged_and_owner_from_service() {
    let svc = json!({"apiVersion": "v1", "kind": "Service",
                         "metadata": {"name": "web", "namespace": "shop", "uid": "svc-123"}, "spec": {}});
    let deploy =
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}});
    let out = render(
        &[
            svc,
            deploy,
            web_slice("web-a", "10.0.0.2"),
            web_slice("web-b", "10.0.0.1"),
            Value::Null,
        ],
        &RenderOptions::default(),
    )
    .unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].spec.source, SourceKind::EndpointSlice);
    assert_eq!(
        out[0].metadata.owner_references.as_ref().unwrap()[0].uid,
        "svc-123"
    );
    assert_eq!(
        out[0].spec.ports["http"]
            .iter()
            .map(|n| n.host.as_str())
            .collect::<Vec<_>>(),
        vec!["10.0.0.1", "10.0.0.2"]
    );
}

#[test]
fn configured_source_wins_over_auto() {
    let opts = RenderOptions {
        source: Some(SourceKind::Endpoints),
        ..Default::default()
    };
    let out = render(&[plat_dev(), web_slice("web-a", "10.0.0.1")], &opts).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].spec.source_name, "plat-dev");
}

#[test]
fn lists_are_flattened_and_namespace_defaults() {
    let list = json!({"apiVersion": "v1", "kind": "EndpointsList", "items": [
        {"metadata": {"name": "a"}, "subsets": [{"addresses": [{"ip": "10.0.0.1"}], "ports": [{"port": 80}]}]}
    ]});
    let generic = json!({"apiVersion": "v1", "kind": "List", "items": [plat_dev()]});
    let out = render(&[list, generic], &RenderOptions::default()).unwrap();
    let names: Vec<_> = out.iter().map(|d| d.spec.service.clone()).collect();
    assert_eq!(names, vec!["default/a", "default/plat-dev"]);
    assert!(out[0].spec.ports.contains_key("80"));
}

#[test]
fn config_driven_options_filter_and_name() {
    let cfg = crate::config::parse_config(
            "discovery: {kubernetes: [{id: c1, kubeconfig: /k, namespace_selector: {equal: shop}}]}\n\
             kube_discovery: {index_port_numbers: true, sinks: {discoveredservices: {namespace_mode: fixed, namespace: kd}}}",
            &|_| None,
        )
        .unwrap();
    let opts = RenderOptions::from_config(&cfg, "c1").unwrap();
    assert!(RenderOptions::from_config(&cfg, "zz").is_none());
    let out = render(&[plat_dev(), web_slice("web-a", "10.0.0.1")], &opts).unwrap();
    // Endpoints is the configured source; plat-dev is in `default`, filtered out.
    assert!(out.is_empty());
    let slices_opts = RenderOptions {
        source: Some(SourceKind::EndpointSlice),
        ..opts
    };
    let out = render(&[web_slice("web-a", "10.0.0.1")], &slices_opts).unwrap();
    assert_eq!(out[0].metadata.namespace.as_deref(), Some("kd"));
    assert_eq!(out[0].metadata.name.as_deref(), Some("c1.shop.web"));
    assert_eq!(out[0].spec.cluster, "c1");
    assert!(out[0].spec.ports.contains_key("8080"));
}

#[test]
fn errors_name_the_object() {
    let bad = json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "x", "namespace": "ns"},
                         "subsets": [{"ports": [{"port": "eighty"}]}]});
    let e = render(&[plat_dev(), bad], &RenderOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("object #2 (Endpoints ns/x): "), "{e}");
    let e = render(&[json!("text")], &RenderOptions::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("object #1: not an object"), "{e}");
    let beta = json!({"apiVersion": "discovery.k8s.io/v1beta1", "kind": "EndpointSlice", "metadata": {"name": "s"}});
    let e = render(&[beta], &RenderOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("unsupported apiVersion \"discovery.k8s.io/v1beta1\""),
        "{e}"
    );
}

#[test]
fn warnings_are_reported() {
    let mut ep = plat_dev();
    ep["subsets"][0]["addresses"][1]["ip"] = json!("bogus");
    let r = render_report(&[ep], &RenderOptions::default()).unwrap();
    assert_eq!(r.objects[0].spec.ports["port"].len(), 1);
    assert_eq!(r.warnings.len(), 1);
    assert!(r.warnings[0].contains("bogus"));
}
