//! The chart's xDS values (`xds.*`, issue 32), rendered with real `helm
//! template`: off by default (nothing rendered), on with a generated or an
//! existing token Secret, TLS and mTLS from Secrets, the Service of every
//! pod, the NetworkPolicy rule; the rendered config is read by the
//! controller's own parser, and every file it names is where the pod mounts
//! it. (On an API server: `chart/sim.rs`.)

use crate::chart_support;

use std::path::{Path, PathBuf};

use chart_support::*;
use kube_discovery_core::config::{Config, XdsSettings, XdsTls};
use kube_discovery_core::parse_config;
use serde_json::{Value, json};

fn pod_env(name: &str) -> Option<String> {
    match name {
        "KUBERNETES_SERVICE_HOST" => Some("10.96.0.1".into()),
        "KUBERNETES_SERVICE_PORT" => Some("443".into()),
        _ => None,
    }
}

/// The rendered objects and the config the controller reads from them.
fn rendered(args: &[&str]) -> (Vec<Value>, Config) {
    let docs = render("kd", "kube-discovery", args);
    let yaml = rendered_config(&docs);
    let cfg = parse_config(&yaml, &pod_env).unwrap_or_else(|e| {
        panic!(
            "the controller rejects the chart's config for {args:?}:\n{e}\n--- config.yaml:\n{yaml}"
        )
    });
    (docs, cfg)
}

fn pod(docs: &[Value]) -> &Value {
    &find(docs, "Deployment", None)["spec"]["template"]["spec"]
}

fn named<'a>(list: &'a Value, name: &str) -> Option<&'a Value> {
    list.as_array()?.iter().find(|v| v["name"] == name)
}

/// Where in the container the pod puts `file` of the Secret volume `volume`
/// (its `items` path under the mount), `None` when it does not.
fn mounted_path(docs: &[Value], volume: &str, secret: &str, key: &str) -> Option<PathBuf> {
    let pod = pod(docs);
    let v = named(&pod["volumes"], volume)?;
    assert_eq!(v["secret"]["secretName"], secret, "{v}");
    let item = v["secret"]["items"]
        .as_array()?
        .iter()
        .find(|i| i["key"] == key)?;
    let mount = named(&pod["containers"][0]["volumeMounts"], volume)?;
    assert_eq!(mount["readOnly"], true, "{mount}");
    Some(Path::new(mount["mountPath"].as_str()?).join(item["path"].as_str()?))
}

fn is_xds_object(d: &Value) -> bool {
    d["metadata"]["name"]
        .as_str()
        .is_some_and(|n| n.contains("xds"))
}

#[test]
fn chart_xds_is_off_by_default_and_renders_nothing_for_it() {
    for args in [
        &[][..],
        // TLS and peers set but not enabled: still nothing.
        &[
            "--set",
            "xds.tls.secretName=t,xds.tls.clientCA.secretName=c,networkPolicy.enabled=true",
        ][..],
    ] {
        let (docs, cfg) = rendered(args);
        assert_eq!(cfg.settings.xds, None, "{args:?}");
        assert!(
            !rendered_config(&docs).contains("xds"),
            "{args:?}: {}",
            rendered_config(&docs)
        );
        let xds: Vec<String> = kinds(&docs)
            .into_iter()
            .filter(|k| k.contains("xds"))
            .collect();
        assert!(xds.is_empty(), "{args:?}: {xds:?}");
        let pod = pod(&docs);
        let text = pod.to_string();
        assert!(!text.contains("xds"), "{args:?}: {pod}");
        assert_eq!(
            pod["containers"][0]["ports"],
            json!([{"name": "http", "containerPort": 8080, "protocol": "TCP"}])
        );
    }
    assert!(
        !render("kd", "kube-discovery", &[])
            .iter()
            .any(is_xds_object)
    );
}

#[test]
fn chart_xds_enabled_serves_every_pod_with_a_generated_token() {
    let (docs, cfg) = rendered(&["--set", "xds.enabled=true"]);
    let token_file = PathBuf::from("/etc/kube-discovery/xds-auth/token");
    assert_eq!(
        cfg.settings.xds,
        Some(XdsSettings {
            addr: "0.0.0.0:18000".parse().expect("addr"),
            auth_token_file: Some(token_file.clone()),
            tls: None,
        })
    );
    // The HTTP API keeps its own token.
    assert_eq!(
        cfg.settings.http.auth_token_file,
        Some(PathBuf::from("/etc/kube-discovery/http-auth/token"))
    );
    let deployment = find(&docs, "Deployment", None);
    let svc = find(&docs, "Service", Some("kd-kube-discovery-xds"));
    assert_eq!(
        svc["spec"]["ports"],
        json!([{"name": "grpc-xds", "port": 18000, "targetPort": "grpc-xds",
                "protocol": "TCP", "appProtocol": "grpc"}])
    );
    assert_eq!(svc["spec"]["type"], "ClusterIP");
    // Every replica serves xDS: the Service selects the Deployment's pods, all
    // of them (no leader label).
    assert_eq!(
        svc["spec"]["selector"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(
        svc["metadata"]["labels"]["app.kubernetes.io/instance"],
        "kd"
    );
    let ports = &pod(&docs)["containers"][0]["ports"];
    assert_eq!(
        named(ports, "grpc-xds"),
        Some(&json!({"name": "grpc-xds", "containerPort": 18000, "protocol": "TCP"}))
    );
    // The generated token: its own Secret, 32 characters, mounted where the
    // config points.
    let secret = find(&docs, "Secret", Some("kd-kube-discovery-xds-token"));
    let token = secret["data"]["token"].as_str().expect("token");
    use base64::Engine;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(token)
        .expect("base64");
    assert_eq!(raw.len(), 32, "{token}");
    assert!(raw.iter().all(u8::is_ascii_alphanumeric));
    assert_ne!(
        secret["data"]["token"],
        find(&docs, "Secret", Some("kd-kube-discovery-api-token"))["data"]["token"]
    );
    assert_eq!(
        mounted_path(&docs, "xds-auth", "kd-kube-discovery-xds-token", "token"),
        Some(token_file)
    );
    // A config change rolls the pods.
    let checksum = |docs: &[Value]| {
        find(docs, "Deployment", None)["spec"]["template"]["metadata"]["annotations"]
            ["checksum/config"]
            .clone()
    };
    assert_ne!(
        checksum(&docs),
        checksum(&render("kd", "kube-discovery", &[]))
    );
}

#[test]
fn chart_xds_ports_and_service_are_configurable() {
    let (docs, cfg) = rendered(&[
        "--set",
        "xds.enabled=true,xds.port=19000,xds.service.port=443,xds.service.type=LoadBalancer",
        "--set",
        "xds.service.annotations.lb=internal",
    ]);
    assert_eq!(
        cfg.settings.xds.map(|x| x.addr),
        Some("0.0.0.0:19000".parse().expect("addr"))
    );
    let svc = find(&docs, "Service", Some("kd-kube-discovery-xds"));
    assert_eq!(svc["spec"]["type"], "LoadBalancer");
    assert_eq!(svc["spec"]["ports"][0]["port"], 443);
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], "grpc-xds");
    assert_eq!(svc["metadata"]["annotations"], json!({"lb": "internal"}));
    assert_eq!(
        named(&pod(&docs)["containers"][0]["ports"], "grpc-xds").map(|p| &p["containerPort"]),
        Some(&json!(19000))
    );
}

/// GitOps: with an existing Secret nothing is generated and two renders are
/// equal; `create=false` turns authentication off.
#[test]
fn chart_xds_token_from_an_existing_secret_or_none() {
    let args = [
        "--set",
        "xds.enabled=true,xds.authTokenSecret.name=envoy-token,xds.authTokenSecret.key=xds",
        "--set",
        "http.authTokenSecret.name=api-token",
    ];
    let (docs, cfg) = rendered(&args);
    assert_eq!(
        docs,
        render("kd", "kube-discovery", &args),
        "two renders differ"
    );
    assert!(
        !docs.iter().any(|d| d["kind"] == "Secret"),
        "nothing generated: {:?}",
        kinds(&docs)
    );
    let file = cfg.settings.xds.and_then(|x| x.auth_token_file);
    assert_eq!(
        file,
        mounted_path(&docs, "xds-auth", "envoy-token", "xds"),
        "the config names the mounted key"
    );
    assert!(file.is_some());

    let (docs, cfg) = rendered(&["--set", "xds.enabled=true,xds.authTokenSecret.create=false"]);
    let xds = cfg.settings.xds.expect("xds on");
    assert_eq!(xds.auth_token_file, None);
    assert!(named(&pod(&docs)["volumes"], "xds-auth").is_none());
    assert!(
        !docs
            .iter()
            .any(|d| d["kind"] == "Secret" && is_xds_object(d)),
        "{:?}",
        kinds(&docs)
    );
}

#[test]
fn chart_xds_tls_and_mtls_come_from_secrets() {
    let (docs, cfg) = rendered(&["--set", "xds.enabled=true,xds.tls.secretName=xds-cert"]);
    let tls = cfg.settings.xds.and_then(|x| x.tls).expect("TLS on");
    assert_eq!(tls.client_ca_file, None);
    assert_eq!(
        Some(tls.cert_file),
        mounted_path(&docs, "xds-tls", "xds-cert", "tls.crt")
    );
    assert_eq!(
        Some(tls.key_file),
        mounted_path(&docs, "xds-tls", "xds-cert", "tls.key")
    );
    assert!(named(&pod(&docs)["volumes"], "xds-client-ca").is_none());

    // mTLS: the CA from another Secret and key, or from the same Secret
    // (cert-manager's `ca.crt`, the default key).
    for (args, secret, key) in [
        (
            "xds.tls.clientCA.secretName=clients-ca,xds.tls.clientCA.key=bundle.pem",
            "clients-ca",
            "bundle.pem",
        ),
        ("xds.tls.clientCA.secretName=xds-cert", "xds-cert", "ca.crt"),
    ] {
        let (docs, cfg) = rendered(&[
            "--set",
            "xds.enabled=true,xds.tls.secretName=xds-cert",
            "--set",
            args,
        ]);
        let tls = cfg.settings.xds.and_then(|x| x.tls).expect("TLS on");
        assert_eq!(
            tls,
            XdsTls {
                cert_file: "/etc/kube-discovery/xds-tls/tls.crt".into(),
                key_file: "/etc/kube-discovery/xds-tls/tls.key".into(),
                client_ca_file: mounted_path(&docs, "xds-client-ca", secret, key),
            }
        );
        assert!(tls.client_ca_file.is_some(), "{args}");
    }
}

#[test]
fn chart_xds_network_policy_rule_admits_its_peers() {
    let docs = render(
        "kd",
        "kube-discovery",
        &[
            "--set",
            "networkPolicy.enabled=true,xds.enabled=true",
            "--set-json",
            r#"networkPolicy.ingressFrom=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}]"#,
            "--set-json",
            r#"xds.networkPolicy.from=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"edge"}}}]"#,
        ],
    );
    let np = find(&docs, "NetworkPolicy", None);
    assert_eq!(
        np["spec"]["ingress"],
        json!([
            {"ports": [{"port": "http", "protocol": "TCP"}],
             "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}]},
            {"ports": [{"port": "grpc-xds", "protocol": "TCP"}],
             "from": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "edge"}}}]},
        ])
    );
    // No peers: any source may reach the xDS port.
    let docs = render(
        "kd",
        "kube-discovery",
        &["--set", "networkPolicy.enabled=true,xds.enabled=true"],
    );
    let rule = &find(&docs, "NetworkPolicy", None)["spec"]["ingress"][1];
    assert_eq!(
        rule,
        &json!({"ports": [{"port": "grpc-xds", "protocol": "TCP"}]})
    );
}

/// Values the chart refuses, with the message helm prints.
#[test]
fn chart_xds_refuses_bad_values() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--set", "xds.enabled=true,xds.port=8080"],
            "xds.port: 8080 is also http.port; the xDS and HTTP servers need different ports",
        ),
        (
            &["--set", "xds.enabled=true,xds.tls.clientCA.secretName=ca"],
            "xds.tls.clientCA.secretName needs xds.tls.secretName",
        ),
        (&["--set", "xds.port=0"], "/xds/port': minimum"),
        (
            &["--set", "xds.service.type=External"],
            "/xds/service/type': value must be one of",
        ),
        (
            &["--set", "xds.authToken.existingSecret=x"],
            "additional properties 'authToken' not allowed",
        ),
        (
            &["--set", "xds.tls.secretName=Bad_Name"],
            "/xds/tls/secretName': 'Bad_Name' does not match pattern",
        ),
        (
            &["--set-string", "xds.enabled=yes"],
            "/xds/enabled': got string, want boolean",
        ),
    ];
    let mut failures = Vec::new();
    for (args, want) in cases {
        let out = run(template_cmd("kd", "kube-discovery", args));
        let t = text(&out);
        if out.status.success() {
            failures.push(format!("{args:?}: accepted, expected {want:?}"));
        } else if !t.contains(want) {
            failures.push(format!("{args:?}: message lacks {want:?}:\n{t}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn chart_xds_notes_tell_where_and_with_which_token() {
    let out = run({
        let mut c = helm();
        c.args(["install", "kd"])
            .arg(chart_dir())
            .args(["--namespace", "kube-discovery", "--dry-run=client"])
            .args(["--set", "xds.enabled=true,xds.tls.secretName=xds-cert"]);
        c
    });
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    for want in [
        "kd-kube-discovery-xds.kube-discovery.svc:18000 (TLS)",
        "token of Secret kube-discovery/kd-kube-discovery-xds-token as gRPC metadata `authorization: Bearer <token>`",
        "kubectl -n kube-discovery get secret kd-kube-discovery-xds-token -o jsonpath='{.data.token}' | base64 -d",
    ] {
        assert!(t.contains(want), "NOTES lack {want:?}:\n{t}");
    }
}
