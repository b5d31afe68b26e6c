//! The config the chart renders into its ConfigMap must be accepted by the
//! controller's own parser (`kube_discovery_core::parse_config`, the function
//! `kube-discovery run --config` uses), and mean what the values say — for
//! the default values, the multi-cluster example and the other settings.

use crate::chart_support;

use std::path::PathBuf;
use std::time::Duration;

use chart_support::*;
use kube_discovery_core::config::{Config, ConfigMapSink, Connection, Credentials};
use kube_discovery_core::crd::NamespaceMode;
use kube_discovery_core::{SourceKind, parse_config};

/// The environment of a pod: what Kubernetes injects for in-cluster access.
fn pod_env(name: &str) -> Option<String> {
    match name {
        "KUBERNETES_SERVICE_HOST" => Some("10.96.0.1".into()),
        "KUBERNETES_SERVICE_PORT" => Some("443".into()),
        _ => None,
    }
}

fn parsed(args: &[&str]) -> Config {
    let docs = render("kd", "kube-discovery", args);
    let yaml = rendered_config(&docs);
    parse_config(&yaml, &pod_env).unwrap_or_else(|e| {
        panic!(
            "the controller rejects the chart's config for {args:?}:\n{e}\n--- config.yaml:\n{yaml}"
        )
    })
}

#[test]
fn chart_default_config_parses_as_in_cluster_single_cluster() {
    let cfg = parsed(&[]);
    assert!(!cfg.multi_cluster);
    assert_eq!(cfg.clusters.len(), 1);
    let c = &cfg.clusters[0];
    assert_eq!(c.id, "");
    assert_eq!(
        c.source(),
        SourceKind::EndpointSlice,
        "the chart defaults to EndpointSlices"
    );
    assert_eq!(c.default_weight, 50);
    match &c.connection {
        Connection::Service {
            host,
            port,
            ssl_verify,
            ca_file,
            credentials,
            ..
        } => {
            assert_eq!(
                (host.as_str(), *port),
                ("10.96.0.1", 443),
                "in-cluster API server"
            );
            assert!(*ssl_verify);
            assert_eq!(
                ca_file.as_deref(),
                Some(std::path::Path::new(
                    "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
                ))
            );
            assert_eq!(
                credentials,
                &Credentials::TokenFile(PathBuf::from(
                    "/var/run/secrets/kubernetes.io/serviceaccount/token"
                ))
            );
        }
        other => panic!("expected in-cluster service connection, got {other:?}"),
    }
    let s = &cfg.settings;
    assert_eq!(s.http.addr.to_string(), "0.0.0.0:8080");
    // The dump and nodes APIs require the generated token by default.
    assert_eq!(
        s.http.auth_token_file,
        Some(PathBuf::from("/etc/kube-discovery/http-auth/token"))
    );
    assert!(s.leader_election.enabled, "2 replicas need leader election");
    assert_eq!(s.leader_election.lease_name, "kd-kube-discovery");
    assert_eq!(
        s.leader_election.lease_namespace.as_deref(),
        Some("kube-discovery")
    );
    assert!(s.sinks.discoveredservices.enabled);
    assert_eq!(
        s.sinks.discoveredservices.naming.namespace_mode,
        NamespaceMode::Source
    );
    assert!(s.sinks.configmap.is_none());
    assert_eq!(s.write_concurrency, 32);
    assert_eq!(s.drain_terminating, kube_discovery_core::Drain::Off);
    assert!(!s.index_port_numbers && !s.topology);
    assert!(!s.service_port_aliases && !s.export_opt_in && s.external_name.is_none());
}

#[test]
fn chart_drain_terminating_takes_a_bool_or_a_mode_and_refuses_others() {
    use kube_discovery_core::Drain;
    for (set, want) in [
        ("false", Drain::Off),
        ("true", Drain::Fallback),
        ("fallback", Drain::Fallback),
        ("always", Drain::Always),
    ] {
        let cfg = parsed(&["--set", &format!("controller.drainTerminating={set}")]);
        assert_eq!(cfg.settings.drain_terminating, want, "{set}");
    }
    // The values schema refuses anything else before the controller sees it.
    let out = run(template_cmd(
        "kd",
        "kube-discovery",
        &["--set", "controller.drainTerminating=sometimes"],
    ));
    let err = text(&out);
    assert!(
        !out.status.success() && err.contains("drainTerminating"),
        "{err}"
    );
}

#[test]
fn chart_multi_cluster_config_parses_with_mounted_credentials() {
    let values = chart_dir()
        .join("ci/multi-cluster-values.yaml")
        .display()
        .to_string();
    let cfg = parsed(&["-f", &values]);
    assert!(cfg.multi_cluster);
    let ids: Vec<&str> = cfg.clusters.iter().map(|c| c.id.as_str()).collect();
    assert_eq!(ids, ["local", "east", "west"]);
    match &cfg.clusters[0].connection {
        Connection::Service {
            host,
            port,
            credentials,
            ..
        } => {
            assert_eq!((host.as_str(), *port), ("10.96.0.1", 443));
            assert_eq!(
                credentials,
                &Credentials::TokenFile(PathBuf::from(
                    "/var/run/secrets/kubernetes.io/serviceaccount/token"
                ))
            );
        }
        other => panic!("local: {other:?}"),
    }
    match &cfg.clusters[1].connection {
        Connection::Service {
            host,
            port,
            ssl_verify,
            ca_file,
            credentials,
            ..
        } => {
            assert_eq!(
                (host.as_str(), *port, *ssl_verify),
                ("api.east.example.com", 6443, true)
            );
            assert_eq!(
                ca_file,
                &Some(PathBuf::from("/etc/kube-discovery/clusters/east/ca.crt"))
            );
            assert_eq!(
                credentials,
                &Credentials::TokenFile(PathBuf::from("/etc/kube-discovery/clusters/east/token"))
            );
        }
        other => panic!("east: {other:?}"),
    }
    assert_eq!(cfg.clusters[1].default_weight, 10);
    assert_eq!(
        cfg.clusters[2].connection,
        Connection::Kubeconfig {
            path: Some(PathBuf::from(
                "/etc/kube-discovery/clusters/west/kubeconfig"
            )),
            context: Some("west".into()),
        }
    );
    let s = &cfg.settings;
    assert_eq!(s.drain_terminating, kube_discovery_core::Drain::Fallback);
    assert!(s.sinks.configmap.is_none());
    assert_eq!(
        s.sinks.discoveredservices.naming.namespace_mode,
        NamespaceMode::Fixed("kube-discovery".into())
    );
}

#[test]
fn chart_settings_reach_the_controller_config() {
    let cfg = parsed(&[
        "--set",
        "controller.coalesceWindow=250ms",
        "--set",
        "controller.coalesceLeadingEdge=false",
        "--set",
        "controller.watchTimeout=60s",
        "--set",
        "controller.writeConcurrency=3",
        "--set-json",
        "controller.writeQps=7.5",
        "--set-json",
        "controller.writeQpsStart=2.5",
        "--set",
        "controller.indexPortNumbers=true",
        "--set",
        "controller.servicePortAliases=true",
        "--set",
        "controller.export=opt-in",
        "--set",
        "controller.externalName.enabled=true",
        "--set",
        "controller.externalName.allow[0]=db-[0-9]+",
        "--set",
        "controller.topology=true",
        "--set",
        "controller.discoveredServices.namespaceMode=fixed",
        "--set",
        "controller.leaderElection.leaseName=my-lease",
        "--set",
        "controller.leaderElection.leaseDuration=20s",
        "--set",
        "controller.leaderElection.renewDeadline=12s",
        "--set",
        "controller.leaderElection.retryPeriod=3s",
        "--set",
        "controller.configMapSnapshot.enabled=true",
        "--set",
        "controller.configMapSnapshot.namespace=gw",
        "--set",
        "http.port=9090",
        "--set",
        "http.authTokenSecret.name=api-token",
        "--set",
        "discovery.kubernetes.namespace_selector.match[0]=shop-.*",
        "--set",
        "discovery.kubernetes.label_selector=tier in (web)",
        "--set",
        "discovery.kubernetes.default_weight=0",
    ]);
    let s = &cfg.settings;
    assert_eq!(
        s.sinks.configmap,
        Some(ConfigMapSink {
            namespace: "gw".into(),
            name: "kd-kube-discovery-snapshot".into()
        })
    );
    assert_eq!(s.coalesce_window, Duration::from_millis(250));
    assert!(!s.coalesce_leading_edge);
    assert_eq!(s.watch_timeout, Duration::from_secs(60));
    assert_eq!(s.write_concurrency, 3);
    assert!((s.write_qps - 7.5).abs() < f64::EPSILON);
    assert!((s.write_qps_start - 2.5).abs() < f64::EPSILON);
    assert!(s.index_port_numbers && s.topology && s.service_port_aliases);
    assert!(s.export_opt_in);
    let allow = s.external_name.as_ref().expect("external_name enabled");
    assert!(allow[0].is_match("db-1") && !allow[0].is_match("db-1.evil"));
    assert_eq!(
        s.sinks.discoveredservices.naming.namespace_mode,
        NamespaceMode::Fixed("kube-discovery".into()),
        "fixed mode defaults to the release namespace"
    );
    assert_eq!(s.leader_election.lease_name, "my-lease");
    assert_eq!(s.leader_election.lease_duration, Duration::from_secs(20));
    assert_eq!(
        s.leader_election.renew_deadline,
        Some(Duration::from_secs(12))
    );
    assert_eq!(s.leader_election.retry_period, Some(Duration::from_secs(3)));
    assert_eq!(s.http.addr.to_string(), "0.0.0.0:9090");
    assert_eq!(
        s.http.auth_token_file,
        Some(PathBuf::from("/etc/kube-discovery/http-auth/token"))
    );
    let c = &cfg.clusters[0];
    assert_eq!(c.default_weight, 0);
    assert!(c.namespace_selector.matches("shop-a") && !c.namespace_selector.matches("kube-system"));
    // The lease the chart's Role allows is the one the controller uses.
    let docs = render(
        "kd",
        "kube-discovery",
        &["--set", "controller.leaderElection.leaseName=my-lease"],
    );
    let role = find(&docs, "Role", Some("kd-kube-discovery-leader-election"));
    assert!(
        role["rules"]
            .as_array()
            .expect("rules")
            .iter()
            .any(|r| r["resourceNames"] == serde_json::json!(["my-lease"])),
        "{role}"
    );
}

/// GitOps (issue 29 item 6): Argo CD renders with `helm template`, where
/// `lookup` finds nothing, so the generated token is a new one on every
/// render (and sync). With `http.authTokenSecret.name` (a Secret the user
/// manages) two renders are equal and carry no token at all; the controller
/// mounts that Secret and re-reads it when it changes.
#[test]
fn chart_api_token_is_stable_across_renders_with_an_existing_secret() {
    let args = ["--set", "http.authTokenSecret.name=gitops-token"];
    let first = render("kd", "kube-discovery", &args);
    assert_eq!(
        first,
        render("kd", "kube-discovery", &args),
        "two renders differ"
    );
    assert!(
        !first.iter().any(|d| d["kind"] == "Secret"),
        "nothing generated: {:?}",
        kinds(&first)
    );
    let pod = &find(&first, "Deployment", None)["spec"]["template"]["spec"];
    assert!(
        pod["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .any(|v| v["name"] == "http-auth" && v["secret"]["secretName"] == "gitops-token"),
        "{pod}"
    );
    // The default's generated token is what changes under `helm template`
    // (the README says so and points GitOps users here).
    let token = |docs: &[serde_json::Value]| {
        find(docs, "Secret", Some("kd-kube-discovery-api-token"))["data"]["token"].clone()
    };
    assert_ne!(
        token(&render("kd", "kube-discovery", &[])),
        token(&render("kd", "kube-discovery", &[]))
    );
}

/// Authentication of the dump and nodes APIs: on by default (a generated
/// Secret), an existing Secret instead, or off; the Secret mounted is the one
/// the config points at.
#[test]
fn chart_api_token_is_required_by_default_and_can_be_turned_off() {
    for (args, secret) in [
        (&[][..], Some("kd-kube-discovery-api-token")),
        (
            &["--set", "http.authTokenSecret.name=mine"][..],
            Some("mine"),
        ),
        (&["--set", "http.authTokenSecret.create=false"][..], None),
    ] {
        let cfg = parsed(args);
        let docs = render("kd", "kube-discovery", args);
        let pod = &find(&docs, "Deployment", None)["spec"]["template"]["spec"];
        let volume = pod["volumes"]
            .as_array()
            .expect("volumes")
            .iter()
            .find(|v| v["name"] == "http-auth");
        let generated = docs.iter().find(|d| {
            d["kind"] == "Secret" && d["metadata"]["name"] == "kd-kube-discovery-api-token"
        });
        match secret {
            Some(name) => {
                assert_eq!(
                    cfg.settings.http.auth_token_file,
                    Some(PathBuf::from("/etc/kube-discovery/http-auth/token")),
                    "{args:?}"
                );
                let v = volume.unwrap_or_else(|| panic!("{args:?}: no http-auth volume"));
                assert_eq!(v["secret"]["secretName"], name, "{args:?}");
                assert_eq!(
                    v["secret"]["items"],
                    serde_json::json!([{"key": "token", "path": "token"}])
                );
                // Only the default generates a Secret, with a 32-character token.
                if name == "kd-kube-discovery-api-token" {
                    let g = generated.expect("the generated Secret");
                    let token = g["data"]["token"].as_str().expect("token");
                    use base64::Engine;
                    let raw = base64::engine::general_purpose::STANDARD
                        .decode(token)
                        .expect("base64");
                    assert_eq!(raw.len(), 32, "{token}");
                    assert!(raw.iter().all(u8::is_ascii_alphanumeric));
                } else {
                    assert!(generated.is_none(), "{args:?}: a Secret was generated");
                }
            }
            None => {
                assert!(cfg.settings.http.auth_token_file.is_none(), "{args:?}");
                assert!(volume.is_none() && generated.is_none(), "{args:?}");
            }
        }
    }
}

/// Issue 29 item 5: the instance is the release name unless set, and
/// `controller.adoptInstances` (earlier names) reaches `adopt_instances`.
#[test]
fn chart_instance_and_adopted_instances_reach_the_config() {
    let naming = |args: &[&str]| parsed(args).settings.sinks.discoveredservices.naming;
    let n = naming(&[]);
    assert_eq!((n.instance.as_str(), n.adopt.len()), ("kd", 0));
    let n = naming(&["--set", "controller.adoptInstances={old,kube-discovery}"]);
    assert_eq!(n.instance, "kd");
    assert_eq!(n.adopt, ["old", "kube-discovery"]);
}
