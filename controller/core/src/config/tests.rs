//! `parse_config` (stages 1 and 2): what each key accepts and how every
//! problem is reported.

use super::*;
use crate::crd::ObjectNaming;
use crate::model::SourceKind;
use std::collections::BTreeMap;
use std::time::Duration;

const TOKEN: &str = "s3cr3t.TOKEN-value_abc=";

fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let m: BTreeMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    move |k| m.get(k).cloned()
}

fn pod_env() -> impl Fn(&str) -> Option<String> {
    env_of(&[
        ("KUBERNETES_SERVICE_HOST", "10.96.0.1"),
        ("KUBERNETES_SERVICE_PORT", "443"),
        ("TOKEN_VAR", TOKEN),
    ])
}

fn ok(yaml: &str) -> Config {
    parse_config(yaml, &pod_env()).unwrap_or_else(|e| panic!("unexpected errors:\n{e}"))
}

/// Parses, expects failure, returns the error lines.
fn errs(yaml: &str) -> Vec<String> {
    errs_env(yaml, &pod_env())
}

fn errs_env(yaml: &str, env: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    match parse_config(yaml, env) {
        Ok(c) => panic!("expected errors, got {c:#?}"),
        Err(e) => {
            let text = e.to_string();
            assert!(!text.contains(TOKEN), "token leaked: {text}");
            text.lines().map(str::to_string).collect()
        }
    }
}

fn has(lines: &[String], path: &str, needle: &str) {
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with(&format!("{path}: ")) && l.contains(needle)),
        "no line `{path}: ...{needle}...` in:\n{}",
        lines.join("\n")
    );
}

#[test]
fn empty_block_means_in_cluster_defaults() {
    for yaml in [
        "discovery:\n  kubernetes: {}\n",
        "discovery:\n  kubernetes:\n",
    ] {
        let c = ok(yaml);
        assert!(!c.multi_cluster);
        assert_eq!(c.clusters.len(), 1);
        let k = &c.clusters[0];
        assert_eq!(k.id, "");
        assert_eq!(
            k.connection,
            Connection::Service {
                schema: Schema::Https,
                host: "10.96.0.1".into(),
                port: 443,
                ssl_verify: true,
                ca_file: Some(DEFAULT_CA_FILE.into()),
                credentials: Credentials::TokenFile(DEFAULT_TOKEN_FILE.into()),
            }
        );
        assert_eq!(k.default_weight, 50);
        assert_eq!(k.watch_endpoint_slices, None);
        assert_eq!(k.source(), SourceKind::Endpoints);
        assert_eq!(c.settings, Settings::default());
    }
}

#[test]
fn in_cluster_defaults_need_the_env() {
    let lines = errs_env("discovery: {kubernetes: {}}", &env_of(&[]));
    has(
        &lines,
        "discovery.kubernetes.service.host",
        "environment variable KUBERNETES_SERVICE_HOST is not set (in-cluster default",
    );
    has(
        &lines,
        "discovery.kubernetes.service.port",
        "KUBERNETES_SERVICE_PORT is not set",
    );
}

#[test]
fn apisix_config_yaml_works_as_is() {
    let c = ok(r#"
apisix:
  node_listen: 9080
deployment:
  role: traditional
discovery:
  dns:
    servers: ["127.0.0.1:53"]
  kubernetes:
    service:
      schema: https
      host: "${KUBERNETES_SERVICE_HOST}"
      port: "${KUBERNETES_SERVICE_PORT}"
    client:
      token: "${TOKEN_VAR}"
    namespace_selector:
      match: ["dev", "prod-.*"]
    label_selector: "app=web,tier in (a,b)"
    default_weight: 0
    shared_size: 1m
    watch_endpoint_slices: true
plugins: [proxy-rewrite]
"#);
    let k = &c.clusters[0];
    match &k.connection {
        Connection::Service {
            credentials,
            ca_file,
            ..
        } => {
            assert_eq!(credentials, &Credentials::Token(Secret::new(TOKEN)));
            // host was set explicitly: no in-cluster CA default
            assert_eq!(*ca_file, None);
        }
        other => panic!("{other:?}"),
    }
    assert!(k.namespace_selector.matches("prod-eu") && !k.namespace_selector.matches("dev-2"));
    assert_eq!(k.label_selector.as_str(), "app=web,tier in (a,b)");
    assert_eq!(k.default_weight, 0);
    assert_eq!(k.source(), SourceKind::EndpointSlice);
    assert_eq!(k.watch_endpoint_slices, Some(true));
    assert_eq!(k.convert_options(&c.settings).default_weight, 0);
}

#[test]
fn explicit_service_and_port_forms() {
    let c = ok(
        "discovery: {kubernetes: {service: {schema: http, host: \"::1\", port: 6443}, client: {token_file: /t}}}",
    );
    match &c.clusters[0].connection {
        Connection::Service {
            schema,
            host,
            port,
            ssl_verify,
            ..
        } => {
            assert_eq!(
                (*schema, host.as_str(), *port, *ssl_verify),
                (Schema::Http, "::1", 6443, true)
            );
        }
        other => panic!("{other:?}"),
    }
    let c = ok(
        "discovery: {kubernetes: {service: {host: \"[fd00::1]\", port: \"8443\", ssl_verify: false, ca_file: /ca.pem}, client: {token_file: /t}}}",
    );
    match &c.clusters[0].connection {
        Connection::Service {
            host,
            port,
            ssl_verify,
            ca_file,
            ..
        } => {
            assert_eq!(
                (host.as_str(), *port, *ssl_verify),
                ("fd00::1", 8443, false)
            );
            assert_eq!(ca_file.as_deref(), Some(std::path::Path::new("/ca.pem")));
        }
        other => panic!("{other:?}"),
    }
    ok("discovery: {kubernetes: {service: {host: api.example.com, port: 443}}}");
}

#[test]
fn schema_host_port_rules() {
    let lines =
        errs("discovery: {kubernetes: {service: {schema: ftp, host: \"bad host!\", port: 70000}}}");
    has(
        &lines,
        "discovery.kubernetes.service.schema",
        "must be \"http\" or \"https\"",
    );
    has(
        &lines,
        "discovery.kubernetes.service.host",
        "is not an IPv4 address, an IPv6 address or a DNS name",
    );
    has(
        &lines,
        "discovery.kubernetes.service.port",
        "must be a port number 1..65535",
    );
    has(
        &errs("discovery: {kubernetes: {service: {port: 0}}}"),
        "discovery.kubernetes.service.port",
        "1..65535",
    );
    has(
        &errs("discovery: {kubernetes: {service: {port: abc}}}"),
        "discovery.kubernetes.service.port",
        "1..65535",
    );
    has(
        &errs("discovery: {kubernetes: {service: {port: [1]}}}"),
        "discovery.kubernetes.service.port",
        "must be a port number",
    );
}

#[test]
fn env_expansion_rules() {
    let lines = errs(
        "discovery: {kubernetes: {service: {host: \"${NOPE}\"}, client: {token: \"${ALSO_NOPE}\"}}}",
    );
    has(
        &lines,
        "discovery.kubernetes.service.host",
        "environment variable NOPE is not set",
    );
    has(
        &lines,
        "discovery.kubernetes.client.token",
        "environment variable ALSO_NOPE is not set",
    );
    has(
        &errs("discovery: {kubernetes: {service: {host: \"${BROKEN\"}}}"),
        "discovery.kubernetes.service.host",
        "unterminated",
    );
    has(
        &errs("discovery: {kubernetes: {service: {host: \"${1X}\"}}}"),
        "discovery.kubernetes.service.host",
        "not a valid environment variable reference",
    );
    // Embedded references work too.
    let env = env_of(&[
        ("KUBERNETES_SERVICE_HOST", "h"),
        ("KUBERNETES_SERVICE_PORT", "1"),
        ("DIR", "/secrets"),
    ]);
    let c = parse_config(
        "discovery: {kubernetes: {client: {token_file: \"${DIR}/token\"}}}",
        &env,
    )
    .unwrap();
    match &c.clusters[0].connection {
        Connection::Service { credentials, .. } => assert_eq!(
            credentials,
            &Credentials::TokenFile("/secrets/token".into())
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_unset_variable_does_not_hide_other_errors_nor_add_fake_ones() {
    let lines = errs(
        "discovery: {kubernetes: {service: {schema: ftp, host: \"${NOPE}\"}, client: {token: \"${NOPE2}\"}}}",
    );
    assert_eq!(lines.len(), 3, "{lines:?}");
    has(
        &lines,
        "discovery.kubernetes.service.host",
        "NOPE is not set",
    );
    has(
        &lines,
        "discovery.kubernetes.client.token",
        "NOPE2 is not set",
    );
    has(
        &lines,
        "discovery.kubernetes.service.schema",
        "must be \"http\" or \"https\"",
    );
}

#[test]
fn token_rules_never_echo_the_token() {
    let lines = errs(&format!(
        "discovery: {{kubernetes: {{client: {{token: \"{TOKEN}\", token_file: /t}}}}}}"
    ));
    has(
        &lines,
        "discovery.kubernetes.client",
        "either token or token_file, not both",
    );
    let bad = format!("{TOKEN}$%");
    let lines = errs(&format!(
        "discovery: {{kubernetes: {{client: {{token: \"{bad}\"}}}}}}"
    ));
    has(
        &lines,
        "discovery.kubernetes.client.token",
        "outside [A-Za-z0-9+/._=-] (value not shown)",
    );
    assert!(!lines.join("\n").contains(&bad));
    let long = "a".repeat(4097);
    has(
        &errs(&format!(
            "discovery: {{kubernetes: {{client: {{token: {long}}}}}}}"
        )),
        "discovery.kubernetes.client.token",
        "longer than 4096",
    );
    // Whitespace is stripped (APISIX), so a wrapped token is fine.
    let c = ok("discovery: {kubernetes: {client: {token: \"abc\\n def \"}}}");
    match &c.clusters[0].connection {
        Connection::Service { credentials, .. } => {
            assert_eq!(credentials, &Credentials::Token(Secret::new("abcdef")))
        }
        other => panic!("{other:?}"),
    }
    // A non-string token is rejected without echoing it.
    let lines = errs("discovery: {kubernetes: {client: {token: 1234567}}}");
    has(
        &lines,
        "discovery.kubernetes.client.token",
        "must be a string (value not shown)",
    );
    assert!(!lines.join("\n").contains("1234567"));
    // A token written where the client mapping belongs is not echoed either.
    let lines = errs(&format!(
        "discovery: {{kubernetes: {{client: \"{TOKEN}\"}}}}"
    ));
    has(
        &lines,
        "discovery.kubernetes.client",
        "invalid type: string (value not shown), expected a mapping",
    );
    // Tokens expanded from the environment are not echoed either.
    let env = env_of(&[
        ("KUBERNETES_SERVICE_HOST", "h"),
        ("KUBERNETES_SERVICE_PORT", "1"),
        ("T", "bad token%%zqxj"),
    ]);
    let lines = errs_env("discovery: {kubernetes: {client: {token: \"${T}\"}}}", &env);
    has(&lines, "discovery.kubernetes.client.token", "outside");
    assert!(!lines.join("\n").contains("zqxj"), "{lines:?}");
}

#[test]
fn https_with_empty_token_is_an_error_http_is_not() {
    has(
        &errs("discovery: {kubernetes: {client: {token: \"\"}}}"),
        "discovery.kubernetes.client",
        "token is empty but the API server schema is https",
    );
    ok("discovery: {kubernetes: {service: {schema: http}, client: {token: \"\"}}}");
}

#[test]
fn token_file_length() {
    has(
        &errs("discovery: {kubernetes: {client: {token_file: \"\"}}}"),
        "discovery.kubernetes.client.token_file",
        "1..500",
    );
    let long = format!("/{}", "x".repeat(500));
    has(
        &errs(&format!(
            "discovery: {{kubernetes: {{client: {{token_file: {long}}}}}}}"
        )),
        "discovery.kubernetes.client.token_file",
        "got 501",
    );
}

#[test]
fn client_without_credentials() {
    has(
        &errs("discovery: {kubernetes: [{id: a, service: {host: h, port: 1}, client: {}}]}"),
        "discovery.kubernetes[0].client",
        "one of token or token_file is required",
    );
}

#[test]
fn namespace_selector_exactly_one_form() {
    has(
        &errs("discovery: {kubernetes: {namespace_selector: {}}}"),
        "discovery.kubernetes.namespace_selector",
        "(none is)",
    );
    has(
        &errs("discovery: {kubernetes: {namespace_selector: {equal: a, match: [b]}}}"),
        "discovery.kubernetes.namespace_selector",
        "(found equal, match)",
    );
    let c = ok("discovery: {kubernetes: {namespace_selector: {not_equal: kube-system}}}");
    assert_eq!(
        c.clusters[0].namespace_selector.field_selector().as_deref(),
        Some("metadata.namespace!=kube-system")
    );
    let c = ok("discovery: {kubernetes: {namespace_selector: {equal: default}}}");
    assert_eq!(
        c.clusters[0].namespace_selector.single_namespace(),
        Some("default")
    );
    let c = ok("discovery: {kubernetes: {namespace_selector: {not_match: [\"kube-.*\"]}}}");
    assert!(!c.clusters[0].namespace_selector.matches("kube-system"));
    has(
        &errs("discovery: {kubernetes: {namespace_selector: {equal: Bad_NS}}}"),
        "discovery.kubernetes.namespace_selector.equal",
        "not a valid namespace name",
    );
}

#[test]
fn regexes_must_compile_and_lists_be_non_empty() {
    let lines = errs("discovery: {kubernetes: {namespace_selector: {match: [ok, \"(unclosed\"]}}}");
    has(
        &lines,
        "discovery.kubernetes.namespace_selector.match[1]",
        "is not a valid regex",
    );
    for field in ["match", "not_match"] {
        let lines = errs(&format!(
            "discovery: {{kubernetes: {{namespace_selector: {{{field}: [\"dev)|(.*\"]}}}}}}"
        ));
        has(
            &lines,
            &format!("discovery.kubernetes.namespace_selector.{field}[0]"),
            "is not a valid regex",
        );
    }
    has(
        &errs("discovery: {kubernetes: {namespace_selector: {not_match: []}}}"),
        "discovery.kubernetes.namespace_selector.not_match",
        "at least one regex",
    );
}

#[test]
fn label_selector_must_parse() {
    has(
        &errs("discovery: {kubernetes: {label_selector: \"app in (a\"}}"),
        "discovery.kubernetes.label_selector",
        "not a valid label selector",
    );
}

/// The grammar is the API server's (`k8s_syntax`): what it accepts loads,
/// `>`/`<` and `in ()` included (refused before), and errors are its texts.
#[test]
fn label_selector_takes_what_the_api_server_takes() {
    for sel in ["a>1", "gen<10,app=web", "x in ()"] {
        let c = ok(&format!(
            "discovery: {{kubernetes: {{label_selector: \"{sel}\"}}}}"
        ));
        assert_eq!(c.clusters[0].label_selector.as_str(), sel);
    }
    let c = ok("discovery: {kubernetes: {label_selector: \"a>1\"}}");
    let l = |v: &str| BTreeMap::from([("a".to_string(), v.to_string())]);
    assert!(c.clusters[0].label_selector.matches(&l("2")));
    assert!(!c.clusters[0].label_selector.matches(&l("1")));
    has(
        &errs("discovery: {kubernetes: {label_selector: \"a>x\"}}"),
        "discovery.kubernetes.label_selector",
        "is not a valid label selector: unable to parse requirement: values[0]: Invalid value: \"x\": for 'Gt', 'Lt' operators, the value must be an integer",
    );
}

/// Object names are the API server's DNS-1123 subdomains: labels over 63
/// characters are fine (they were refused before), 253 in all.
#[test]
fn object_names_are_dns1123_subdomains() {
    let long_label = "a".repeat(64);
    let c = ok(&format!(
        "discovery: {{kubernetes: {{}}}}\nkube_discovery: {{leader_election: {{lease_name: {long_label}}}}}"
    ));
    assert_eq!(c.settings.leader_election.lease_name, long_label);
    for bad in ["a..b", "-a", &"a".repeat(254)] {
        has(
            &errs(&format!(
                "discovery: {{kubernetes: {{}}}}\nkube_discovery: {{sinks: {{configmap: {{name: \"{bad}\"}}}}}}"
            )),
            "kube_discovery.sinks.configmap.name",
            "not a valid object name",
        );
    }
}

#[test]
fn default_weight_range_and_shared_size() {
    has(
        &errs("discovery: {kubernetes: {default_weight: -1}}"),
        "discovery.kubernetes.default_weight",
        "must be an integer >= 0",
    );
    has(
        &errs("discovery: {kubernetes: {default_weight: 1.5}}"),
        "discovery.kubernetes.default_weight",
        "invalid type",
    );
    has(
        &errs("discovery: {kubernetes: {shared_size: lots}}"),
        "discovery.kubernetes.shared_size",
        "size like 1m",
    );
    ok("discovery: {kubernetes: {shared_size: 10m}}");
}

#[test]
fn unknown_keys_are_errors_including_the_misspelt_slices_flag() {
    has(
        &errs("discovery: {kubernetes: {watch_endpoint_slice: true}}"),
        "discovery.kubernetes.watch_endpoint_slice",
        "unknown field `watch_endpoint_slice`",
    );
    has(
        &errs("discovery: {kubernetes: {service: {hots: x}}}"),
        "discovery.kubernetes.service.hots",
        "unknown field `hots`",
    );
    has(
        &errs("discovery: {kubernetes: {}}\nkube_discovery: {colesce_window: 1s}"),
        "kube_discovery.colesce_window",
        "unknown field `colesce_window`",
    );
}

const MULTI: &str = r#"
discovery:
  kubernetes:
    - id: release
      service: {schema: https, host: "1.2.3.4", port: 6443}
      client: {token: "${TOKEN_VAR}"}
    - id: dev2
      kubeconfig: /etc/kd/dev.kubeconfig
      context: dev
      watch_endpoint_slices: true
"#;

#[test]
fn multi_cluster_parses() {
    let c = ok(MULTI);
    assert!(c.multi_cluster);
    assert_eq!(
        c.clusters.iter().map(|k| k.id.as_str()).collect::<Vec<_>>(),
        vec!["release", "dev2"]
    );
    match &c.clusters[0].connection {
        Connection::Service {
            ca_file,
            credentials: Credentials::Token(_),
            ..
        } => assert_eq!(ca_file, &None),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        c.clusters[1].connection,
        Connection::Kubeconfig {
            path: Some("/etc/kd/dev.kubeconfig".into()),
            context: Some("dev".into())
        }
    );
    assert!(c.cluster("dev2").is_some());
    let idx = c.clusters[1].new_index(&c.settings);
    assert_eq!(idx.cluster(), "dev2");
    assert_eq!(idx.source(), SourceKind::EndpointSlice);
}

#[test]
fn multi_cluster_rules() {
    let lines = errs(
        r#"
discovery:
  kubernetes:
    - id: Bad_Id
      service: {host: h, port: 1}
      client: {token_file: /t}
    - id: abc
      service: {host: h, port: 1}
      client: {token_file: /t}
    - id: abc
      service: {host: h, port: 1}
      client: {token_file: /t}
    - service: {host: h, port: 1}
      client: {token_file: /t}
    - id: nodef
    - id: nohost
      service: {schema: https}
      client: {token_file: /t}
    - id: a123456789b123456789c123456789d123456789e123456789f123456789abcde
      service: {host: h, port: 1}
      client: {token_file: /t}
    - "not a mapping"
"#,
    );
    has(
        &lines,
        "discovery.kubernetes[0].id",
        "must match ^[a-z0-9]{1,64}$",
    );
    has(
        &lines,
        "discovery.kubernetes[2].id",
        "duplicate cluster id \"abc\"",
    );
    has(
        &lines,
        "discovery.kubernetes[3].id",
        "is required in the multi-cluster",
    );
    // No defaults for service/client in the multi-cluster form.
    has(
        &lines,
        "discovery.kubernetes[4].service",
        "is required in the multi-cluster form",
    );
    has(
        &lines,
        "discovery.kubernetes[4].client",
        "is required in the multi-cluster form",
    );
    has(
        &lines,
        "discovery.kubernetes[5].service.host",
        "is required",
    );
    has(
        &lines,
        "discovery.kubernetes[5].service.port",
        "is required",
    );
    has(
        &lines,
        "discovery.kubernetes[6].id",
        "must match ^[a-z0-9]{1,64}$",
    );
    // 64 characters are APISIX's limit (apisix#12536), and fine.
    let long = "a123456789b123456789c123456789d123456789e123456789f123456789abcd";
    assert_eq!(long.len(), 64);
    let c = ok(&format!(
        "discovery:\n  kubernetes:\n    - id: {long}\n      service: {{host: h, port: 1}}\n      client: {{token_file: /t}}\n"
    ));
    assert_eq!(c.clusters[0].id, long);
    has(&lines, "discovery.kubernetes[7]", "must be a mapping");
    has(
        &errs("discovery: {kubernetes: []}"),
        "discovery.kubernetes",
        "at least one cluster",
    );
    has(
        &errs("discovery: {kubernetes: {id: x}}"),
        "discovery.kubernetes.id",
        "only allowed in the multi-cluster",
    );
    has(
        &errs("discovery: {kubernetes: [{id: a, service: {host: h, port: 1}}]}"),
        "discovery.kubernetes[0].client",
        "is required in the multi-cluster",
    );
}

#[test]
fn kubeconfig_and_service_are_alternatives() {
    let c = ok("discovery: {kubernetes: {kubeconfig: /k}}");
    assert_eq!(
        c.clusters[0].connection,
        Connection::Kubeconfig {
            path: Some("/k".into()),
            context: None
        }
    );
    let c = ok("discovery: {kubernetes: {context: kind-a}}");
    assert_eq!(
        c.clusters[0].connection,
        Connection::Kubeconfig {
            path: None,
            context: Some("kind-a".into())
        }
    );
    has(
        &errs("discovery: {kubernetes: {kubeconfig: /k, service: {host: h}}}"),
        "discovery.kubernetes.kubeconfig",
        "alternatives",
    );
    has(
        &errs("discovery: {kubernetes: {kubeconfig: \"\"}}"),
        "discovery.kubernetes.kubeconfig",
        "non-empty",
    );
}

#[test]
fn type_errors_name_the_field_not_internal_types() {
    let lines = errs("discovery: {kubernetes: {service: 5}}\nkube_discovery: 7");
    has(
        &lines,
        "discovery.kubernetes.service",
        "invalid type: integer `5`, expected a mapping",
    );
    has(&lines, "kube_discovery", "must be a mapping");
    assert!(!lines.join("\n").contains("Raw"), "{lines:?}");
    let lines = errs("discovery: {kubernetes: {}}\nkube_discovery: {sinks: {configmap: true}}");
    has(
        &lines,
        "kube_discovery.sinks.configmap",
        "invalid type: boolean `true`, expected a mapping",
    );
}

#[test]
fn top_level_shape_errors() {
    has(&errs("apisix: {}"), "discovery.kubernetes", "is missing");
    has(
        &errs("discovery: {kubernetes: 5}"),
        "discovery.kubernetes",
        "must be a mapping (single cluster) or a list",
    );
    has(&errs("- a\n- b"), "config", "must be a YAML mapping");
    has(
        &errs("discovery: {kubernetes: {a: [}"),
        "config",
        "invalid YAML",
    );
}

#[test]
fn errors_are_one_line_each_and_all_reported() {
    let e = parse_config(
            "discovery: {kubernetes: {service: {schema: ftp, port: 0}, default_weight: -3}}\nkube_discovery: {write_concurrency: 0}",
            &pod_env(),
        )
        .unwrap_err();
    assert_eq!(e.0.len(), 4, "{e}");
    assert_eq!(e.to_string().lines().count(), 4);
    for line in e.to_string().lines() {
        assert!(line.contains(": "), "{line}");
    }
}

#[test]
fn leader_election_timings_default_to_client_go_proportions_or_are_checked() {
    let base = "discovery: {kubernetes: {}}\nkube_discovery:\n  leader_election: ";
    let c = ok(&format!("{base}{{enabled: true, lease_duration: 30s}}\n"));
    let le = &c.settings.leader_election;
    assert_eq!((le.renew_deadline, le.retry_period), (None, None));
    let c = ok(&format!(
        "{base}{{lease_duration: 30s, renew_deadline: 20s, retry_period: 500ms}}\n"
    ));
    let le = &c.settings.leader_election;
    assert_eq!(le.renew_deadline, Some(Duration::from_secs(20)));
    assert_eq!(le.retry_period, Some(Duration::from_millis(500)));
    // Ordering against the effective (possibly derived) values.
    let lines = errs(&format!(
        "{base}{{lease_duration: 15s, renew_deadline: 15s}}\n"
    ));
    has(
        &lines,
        "kube_discovery.leader_election.renew_deadline",
        "shorter than lease_duration (15s)",
    );
    // Unset renew deadline of a 15 s lease is 10 s.
    let lines = errs(&format!("{base}{{retry_period: 10s}}\n"));
    has(
        &lines,
        "kube_discovery.leader_election.retry_period",
        "shorter than the renew deadline (10s)",
    );
    let lines = errs(&format!(
        "{base}{{retry_period: 10ms, renew_deadline: soon}}\n"
    ));
    has(&lines, "kube_discovery.leader_election.retry_period", "");
    has(
        &lines,
        "kube_discovery.leader_election.renew_deadline",
        "is not a duration",
    );
}

#[test]
fn kube_discovery_settings_defaults_and_values() {
    let c = ok(r#"
discovery: {kubernetes: {}}
kube_discovery:
  instance: edge-a
  adopt_instances: [kd, edge-old]
  coalesce_window: 250ms
  drain_terminating: true
  index_port_numbers: true
  topology: true
  service_port_aliases: true
  export: opt-in
  watch_timeout: 1m
  request_timeout: 30s
  unready_after: 2m
  shutdown_timeout: 25s
  write_concurrency: 4
  write_qps: 12.5
  write_qps_start: 5
  http: {addr: "127.0.0.1:9090", auth_token_file: /etc/kd/token}
  sinks:
    discoveredservices: {enabled: true, namespace_mode: fixed, namespace: kube-discovery}
    configmap: {enabled: true, namespace: kd}
  home: {kubeconfig: /home.kubeconfig, context: home}
  leader_election: {enabled: true, lease_namespace: kd, lease_duration: 20s}
"#);
    let s = &c.settings;
    assert_eq!(s.coalesce_window, Duration::from_millis(250));
    assert_eq!(s.drain_terminating, crate::Drain::Fallback);
    assert!(s.index_port_numbers && s.topology);
    assert!(s.service_port_aliases && s.export_opt_in);
    assert!(!Settings::default().service_port_aliases && !Settings::default().export_opt_in);
    assert_eq!(s.watch_timeout, Duration::from_secs(60));
    assert_eq!(
        (s.request_timeout, s.unready_after, s.shutdown_timeout),
        (
            Duration::from_secs(30),
            Duration::from_secs(120),
            Duration::from_secs(25)
        )
    );
    assert_eq!(
        (s.write_concurrency, s.write_qps, s.write_qps_start),
        (4, 12.5, 5.0)
    );
    assert_eq!(s.http.addr, "127.0.0.1:9090".parse().unwrap());
    assert_eq!(
        s.http.auth_token_file.as_deref(),
        Some(std::path::Path::new("/etc/kd/token"))
    );
    assert_eq!(
        s.sinks.discoveredservices.naming,
        ObjectNaming::fixed("kube-discovery")
            .with_instance("edge-a")
            .with_adopted(vec!["kd".into(), "edge-old".into()])
    );
    assert_eq!(
        s.sinks.discoveredservices.naming.field_manager(),
        "kube-discovery/edge-a"
    );
    assert_eq!(
        s.sinks.configmap,
        Some(ConfigMapSink {
            namespace: "kd".into(),
            name: "kube-discovery-nodes".into()
        })
    );
    assert_eq!(s.home.context.as_deref(), Some("home"));
    assert!(s.leader_election.enabled);
    assert_eq!(s.leader_election.lease_name, "kube-discovery");
    assert_eq!(s.leader_election.lease_duration, Duration::from_secs(20));
    let o = c.clusters[0].convert_options(s);
    assert_eq!(o.drain_terminating, crate::Drain::Fallback);
    assert!(o.index_port_numbers && o.topology);
    assert!(o.service_port_aliases && o.export_opt_in);
}

#[test]
fn drain_terminating_is_a_bool_or_a_mode() {
    for (text, want) in [
        ("false", crate::Drain::Off),
        ("true", crate::Drain::Fallback),
        ("fallback", crate::Drain::Fallback),
        ("always", crate::Drain::Always),
    ] {
        let c = ok(&format!(
            "discovery: {{kubernetes: {{}}}}\nkube_discovery: {{drain_terminating: {text}}}\n"
        ));
        assert_eq!(c.settings.drain_terminating, want, "{text}");
        // The effective config prints it back as written (true for fallback).
        let again = c.settings.drain_terminating.to_json();
        let round = ok(&format!(
            "discovery: {{kubernetes: {{}}}}\nkube_discovery: {{drain_terminating: {again}}}\n"
        ));
        assert_eq!(round.settings.drain_terminating, want, "{again}");
    }
    assert_eq!(
        ok("discovery: {kubernetes: {}}\n")
            .settings
            .drain_terminating,
        crate::Drain::Off
    );
    for bad in ["sometimes", "1", "\"true\"", "[always]"] {
        let lines = errs(&format!(
            "discovery: {{kubernetes: {{}}}}\nkube_discovery: {{drain_terminating: {bad}}}\n"
        ));
        has(
            &lines,
            "kube_discovery.drain_terminating",
            "must be false, true (same as \"fallback\") or \"always\"",
        );
    }
}

#[test]
fn kube_discovery_settings_rules() {
    let lines = errs(
        r#"
discovery: {kubernetes: {}}
kube_discovery:
  instance: Edge_A
  adopt_instances: [ok, Old.Name]
  export: opt_in
  coalesce_window: soon
  watch_timeout: 10m
  request_timeout: 1s
  write_concurrency: 0
  write_qps: 0
  write_qps_start: 20000
  http: {addr: "localhost"}
  sinks:
    discoveredservices: {namespace_mode: fixed}
    configmap: {enabled: true, name: "Bad_Name"}
  leader_election: {lease_duration: 0s, lease_namespace: "a.b"}
"#,
    );
    has(
        &lines,
        "kube_discovery.coalesce_window",
        "is not a duration",
    );
    has(
        &lines,
        "kube_discovery.export",
        r#""opt_in" must be "all" or "opt-in""#,
    );
    has(
        &lines,
        "kube_discovery.instance",
        "\"Edge_A\" is not a valid instance name (a DNS label",
    );
    has(
        &lines,
        "kube_discovery.adopt_instances",
        "\"Old.Name\" is not a valid instance name (a DNS label",
    );
    has(
        &lines,
        "kube_discovery.watch_timeout",
        "must be between 1s and 290s",
    );
    has(
        &lines,
        "kube_discovery.request_timeout",
        "must be between 3s and 300s",
    );
    has(
        &lines,
        "kube_discovery.write_concurrency",
        "0 must be between 1 and 256",
    );
    has(
        &lines,
        "kube_discovery.write_qps",
        "0 must be between 0.1 and 10000",
    );
    has(
        &lines,
        "kube_discovery.write_qps_start",
        "20000 must be between 0.1 and 10000",
    );
    has(&lines, "kube_discovery.http.addr", "must be ip:port");
    has(
        &lines,
        "kube_discovery.sinks.discoveredservices.namespace",
        "required with namespace_mode: fixed",
    );
    has(
        &lines,
        "kube_discovery.sinks.configmap.namespace",
        "required when the configmap sink is enabled",
    );
    has(
        &lines,
        "kube_discovery.sinks.configmap.name",
        "not a valid object name",
    );
    has(
        &lines,
        "kube_discovery.leader_election.lease_duration",
        "between 1s and 300s",
    );
    has(
        &lines,
        "kube_discovery.leader_election.lease_namespace",
        "not a valid namespace name",
    );
    has(
        &errs(
            "discovery: {kubernetes: {}}\nkube_discovery: {sinks: {discoveredservices: {namespace: x}}}",
        ),
        "kube_discovery.sinks.discoveredservices.namespace",
        "only used with namespace_mode: fixed",
    );
    has(
        &errs(
            "discovery: {kubernetes: {}}\nkube_discovery: {sinks: {discoveredservices: {namespace_mode: other}}}",
        ),
        "kube_discovery.sinks.discoveredservices.namespace_mode",
        "\"source\" or \"fixed\"",
    );
}

#[test]
fn redacted_json_hides_tokens() {
    let c = ok(
        "discovery: {kubernetes: {client: {token: \"${TOKEN_VAR}\"}, namespace_selector: {match: [\"a.*\"]}}}",
    );
    let v = c.redacted_json();
    let text = v.to_string();
    assert!(!text.contains(TOKEN), "{text}");
    assert_eq!(
        v["discovery"]["kubernetes"]["client"]["token"],
        "<redacted>"
    );
    assert_eq!(v["discovery"]["kubernetes"]["service"]["host"], "10.96.0.1");
    assert_eq!(
        v["discovery"]["kubernetes"]["namespace_selector"]["match"][0],
        "a.*"
    );
    assert_eq!(v["kube_discovery"]["coalesce_window"], "100ms");
    assert!(!format!("{c:?}").contains(TOKEN));
    let m = ok(MULTI);
    let dump = m.kubernetes_redacted_json();
    assert!(dump.is_array());
    assert_eq!(dump[0]["id"], "release");
    assert_eq!(dump[0]["client"]["token"], "<redacted>");
    assert!(!m.redacted_json().to_string().contains(TOKEN));
}

#[test]
fn durations() {
    assert_eq!(parse_duration("100ms").unwrap(), Duration::from_millis(100));
    assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
    assert_eq!(parse_duration("1m 30s").unwrap(), Duration::from_secs(90));
    assert!(parse_duration("-5s").is_err());
    assert!(parse_duration("5").is_err());
}

/// Where YAML parsers differ (YAML 1.1 against 1.2, duplicate keys, merge
/// keys): the file reads as it always has, and each problem names its field.
#[test]
fn yaml_1_2_reading_and_repeated_keys() {
    // `yes`/`on` are strings in YAML 1.2, not booleans.
    has(
        &errs("discovery: {kubernetes: {watch_endpoint_slices: yes}}"),
        "discovery.kubernetes.watch_endpoint_slices",
        "invalid type: string \"yes\", expected a boolean",
    );
    has(
        &errs("discovery: {kubernetes: {default_weight: on}}"),
        "discovery.kubernetes.default_weight",
        "invalid type: string \"on\"",
    );
    // A key written twice is refused, naming the key (never "last one wins").
    let lines = errs("discovery:\n  kubernetes:\n    default_weight: 1\n    default_weight: 2\n");
    assert_eq!(lines.len(), 1, "{lines:?}");
    has(&lines, "config", "duplicate key `default_weight`");
    has(&lines, "config", "line 4");
    // `<<` is an ordinary (unknown) key, not a merge.
    has(
        &errs("discovery: {kubernetes: {<<: {default_weight: 5}}}"),
        "discovery.kubernetes.<<",
        "unknown field `<<`",
    );
    // Wrong types name the field and the expected type.
    has(
        &errs("discovery: {kubernetes: {service: {host: [a]}}}"),
        "discovery.kubernetes.service.host",
        "invalid type: sequence, expected a string",
    );
    // A wrongly typed token is not echoed, nor a repeated key holding one.
    let lines = errs(&format!(
        "discovery: {{kubernetes: {{client: {{token: [{TOKEN}]}}}}}}"
    ));
    has(
        &lines,
        "discovery.kubernetes.client.token",
        "must be a string",
    );
    // Leading zeros and underscores make a string, not a number.
    for n in ["0100", "1_000"] {
        has(
            &errs(&format!(
                "discovery: {{kubernetes: {{default_weight: {n}}}}}"
            )),
            "discovery.kubernetes.default_weight",
            &format!("invalid type: string \"{n}\""),
        );
    }
}

#[test]
fn external_name_is_off_by_default_and_validated() {
    assert!(Settings::default().external_name.is_none());
    let c = ok(r#"
discovery: {kubernetes: {}}
kube_discovery:
  external_name: {enabled: true, allow: ['.*\.example\.com']}
"#);
    let allow = c.settings.external_name.as_ref().unwrap();
    assert!(allow[0].is_match("db.example.com") && !allow[0].is_match("db.example.com.evil"));
    assert_eq!(
        c.clusters[0]
            .convert_options(&c.settings)
            .external_name
            .unwrap()
            .len(),
        1
    );
    // Listed but not enabled: still off.
    let c = ok(r#"
discovery: {kubernetes: {}}
kube_discovery: {external_name: {allow: [x]}}
"#);
    assert!(c.settings.external_name.is_none());
    let lines = errs(
        r#"
discovery: {kubernetes: {}}
kube_discovery: {external_name: {enabled: true, allow: ["("]}}
"#,
    );
    has(
        &lines,
        "kube_discovery.external_name.allow[0]",
        "is not a valid regex",
    );
    // A pattern that closes the anchoring group early would match every
    // host (`^(?:a)|(.*)$`): refused, as is any pattern that does not
    // compile on its own (the guard of CVE-2021-32783 must hold).
    let lines = errs(
        r#"
discovery: {kubernetes: {}}
kube_discovery: {external_name: {enabled: true, allow: ['a\.example\.com)|(.*']}}
"#,
    );
    has(
        &lines,
        "kube_discovery.external_name.allow[0]",
        "is not a valid regex",
    );
    let lines = errs(
        r#"
discovery: {kubernetes: {}}
kube_discovery: {external_name: {enabled: true}}
"#,
    );
    has(
        &lines,
        "kube_discovery.external_name.allow",
        "at least one regex",
    );
}

#[test]
fn coalesce_leading_edge_is_on_by_default_and_takes_a_boolean() {
    let c = ok("discovery: {kubernetes: {}}");
    assert!(c.settings.coalesce_leading_edge);
    assert_eq!(
        c.redacted_json()["kube_discovery"]["coalesce_leading_edge"],
        true
    );
    let c = ok("discovery: {kubernetes: {}}\nkube_discovery: {coalesce_leading_edge: false}");
    assert!(!c.settings.coalesce_leading_edge);
    assert_eq!(
        c.redacted_json()["kube_discovery"]["coalesce_leading_edge"],
        false
    );
    for bad in ["no", "\"false\"", "0"] {
        has(
            &errs(&format!(
                "discovery: {{kubernetes: {{}}}}\nkube_discovery: {{coalesce_leading_edge: {bad}}}"
            )),
            "kube_discovery.coalesce_leading_edge",
            "expected a boolean",
        );
    }
}

#[test]
fn xds_is_off_without_an_addr_and_takes_its_keys() {
    for yaml in [
        "discovery: {kubernetes: {}}\n",
        "discovery: {kubernetes: {}}\nkube_discovery: {xds: }\n",
        "discovery: {kubernetes: {}}\nkube_discovery: {xds: {}}\n",
    ] {
        let c = ok(yaml);
        assert_eq!(c.settings.xds, None, "{yaml}");
        assert!(c.redacted_json()["kube_discovery"]["xds"].is_null());
    }
    let env = env_of(&[
        ("KUBERNETES_SERVICE_HOST", "h"),
        ("KUBERNETES_SERVICE_PORT", "1"),
        ("TLS", "/tls"),
    ]);
    let yaml = r#"
discovery: {kubernetes: {}}
kube_discovery:
  http: {addr: "0.0.0.0:8080"}
  xds:
    addr: "0.0.0.0:18000"
    auth_token_file: /etc/kd/xds-token
    cert_file: "${TLS}/tls.crt"
    key_file: "${TLS}/tls.key"
    client_ca_file: "${TLS}/ca.crt"
"#;
    let c = parse_config(yaml, &env).unwrap_or_else(|e| panic!("{e}"));
    let want = XdsSettings {
        addr: "0.0.0.0:18000".parse().unwrap(),
        auth_token_file: Some("/etc/kd/xds-token".into()),
        tls: Some(XdsTls {
            cert_file: "/tls/tls.crt".into(),
            key_file: "/tls/tls.key".into(),
            client_ca_file: Some("/tls/ca.crt".into()),
        }),
    };
    assert_eq!(c.settings.xds.as_ref(), Some(&want));
    let plan = c
        .resolve(&Overrides::default())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(plan.xds.as_ref(), Some(&want));
    // The effective config shows the keys as written (expanded) and reads back
    // as the same settings.
    let shown = c.redacted_json()["kube_discovery"]["xds"].clone();
    assert_eq!(
        shown,
        serde_json::json!({"addr": "0.0.0.0:18000", "auth_token_file": "/etc/kd/xds-token",
            "cert_file": "/tls/tls.crt", "key_file": "/tls/tls.key", "client_ca_file": "/tls/ca.crt"})
    );
    let again = ok(&format!(
        "discovery: {{kubernetes: {{}}}}\nkube_discovery: {{xds: {shown}}}\n"
    ));
    assert_eq!(again.settings.xds, Some(want));
    // TLS without client certificates, no token; port 0 (a free port, as
    // the tests bind) next to an HTTP port 0.
    let c = ok(
        "discovery: {kubernetes: {}}\nkube_discovery: {http: {addr: \"127.0.0.1:0\"}, xds: {addr: \"127.0.0.1:0\", cert_file: /c, key_file: /k}}\n",
    );
    assert_eq!(
        c.settings.xds,
        Some(XdsSettings {
            addr: "127.0.0.1:0".parse().unwrap(),
            auth_token_file: None,
            tls: Some(XdsTls {
                cert_file: "/c".into(),
                key_file: "/k".into(),
                client_ca_file: None
            }),
        })
    );
    // Plaintext, on [::1].
    let x = ok("discovery: {kubernetes: {}}\nkube_discovery: {xds: {addr: \"[::1]:18000\"}}\n")
        .settings
        .xds
        .unwrap();
    assert_eq!(
        (x.addr.to_string(), x.auth_token_file, x.tls),
        ("[::1]:18000".to_string(), None, None)
    );
}

#[test]
fn xds_rules_name_the_field() {
    let kd = |s: &str| format!("discovery: {{kubernetes: {{}}}}\nkube_discovery:\n  {s}\n");
    let only = |s: &str| {
        let lines = errs(&kd(s));
        assert_eq!(lines.len(), 1, "{s}: {lines:?}");
        lines[0].clone()
    };
    assert_eq!(
        only(r#"xds: {addr: "localhost:18000"}"#),
        r#"kube_discovery.xds.addr: "localhost:18000" must be ip:port, e.g. 0.0.0.0:8080"#
    );
    assert_eq!(
        only("xds: {auth_token_file: /t, cert_file: /c, key_file: /k}"),
        "kube_discovery.xds.addr: is required when auth_token_file, cert_file, key_file is set (without addr xDS is off; remove the xds section to turn it off)"
    );
    assert_eq!(
        only(r#"xds: {addr: "0.0.0.0:18000", cert_file: /c}"#),
        "kube_discovery.xds.key_file: is required when cert_file is set"
    );
    assert_eq!(
        only(r#"xds: {addr: "0.0.0.0:18000", key_file: /k, client_ca_file: /ca}"#),
        "kube_discovery.xds.cert_file: is required when key_file is set"
    );
    assert_eq!(
        only(r#"xds: {addr: "0.0.0.0:18000", client_ca_file: /ca}"#),
        "kube_discovery.xds.client_ca_file: needs cert_file and key_file (client certificates are checked on a TLS connection)"
    );
    assert_eq!(
        only(r#"xds: {addr: "0.0.0.0:18000", auth_token_file: ""}"#),
        "kube_discovery.xds.auth_token_file: must be a path of 1..4096 characters"
    );
    assert_eq!(
        only(r#"xds: {addr: "0.0.0.0:18000", cert_file: "${NOPE}/c", key_file: /k}"#),
        "kube_discovery.xds.cert_file: environment variable NOPE is not set"
    );
    has(
        &errs(&kd(r#"xds: {addr: "0.0.0.0:18000", port: 18000}"#)),
        "kube_discovery.xds.port",
        "unknown field `port`, expected one of `addr`, `auth_token_file`, `cert_file`, `key_file`, `client_ca_file`",
    );
    // The HTTP server's address (default 0.0.0.0:8080, or as set) is taken:
    // the same address, or the same port where one of them is the wildcard.
    for (http, xds) in [
        (None, "0.0.0.0:8080"),
        (None, "127.0.0.1:8080"),
        (Some("10.0.0.1:9000"), "10.0.0.1:9000"),
        (Some("127.0.0.1:9000"), "0.0.0.0:9000"),
        (Some("127.0.0.1:9000"), "[::]:9000"),
        (Some("[::1]:9000"), "[::1]:9000"),
    ] {
        let http_key = http
            .map(|h| format!("http: {{addr: \"{h}\"}}\n  "))
            .unwrap_or_default();
        assert_eq!(
            only(&format!("{http_key}xds: {{addr: \"{xds}\"}}")),
            format!(
                "kube_discovery.xds.addr: {xds} conflicts with kube_discovery.http.addr {} (the same port on the same or every address); the two servers need different ports",
                http.unwrap_or("0.0.0.0:8080")
            ),
            "{http:?} {xds}"
        );
    }
    // Different ports, different addresses, other families, port 0: fine.
    for (http, xds) in [
        ("0.0.0.0:8080", "0.0.0.0:18000"),
        ("127.0.0.1:9000", "127.0.0.2:9000"),
        ("0.0.0.0:9000", "[::1]:9000"),
        ("127.0.0.1:0", "127.0.0.1:0"),
    ] {
        ok(&kd(&format!(
            "http: {{addr: \"{http}\"}}\n  xds: {{addr: \"{xds}\"}}"
        )));
    }
    // Every problem at once, one line each.
    let lines = errs(&kd(
        r#"xds: {addr: "0.0.0.0:8080", cert_file: "", client_ca_file: /ca}"#,
    ));
    has(
        &lines,
        "kube_discovery.xds.addr",
        "conflicts with kube_discovery.http.addr",
    );
    has(&lines, "kube_discovery.xds.cert_file", "must be a path");
    has(
        &lines,
        "kube_discovery.xds.key_file",
        "is required when cert_file is set",
    );
    assert_eq!(lines.len(), 3, "{lines:?}");
}

#[test]
fn the_http_addr_override_must_not_take_the_xds_addr() {
    let c = ok("discovery: {kubernetes: {}}\nkube_discovery: {xds: {addr: \"0.0.0.0:18000\"}}\n");
    let resolve = |addr: &str| {
        c.resolve(&Overrides {
            http_addr: Some(addr.parse().unwrap()),
            ..Overrides::default()
        })
    };
    assert_eq!(
        resolve("127.0.0.1:18000").unwrap_err().to_string(),
        "--http-addr: 127.0.0.1:18000 conflicts with kube_discovery.xds.addr 0.0.0.0:18000 (the same port on the same or every address); the two servers need different ports"
    );
    let p = resolve("127.0.0.1:0").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(p.http.addr, "127.0.0.1:0".parse().unwrap());
    assert_eq!(
        p.xds.map(|x| x.addr),
        Some("0.0.0.0:18000".parse().unwrap())
    );
}
