//! Bad configuration through the BINARY (issue 7): `kube-discovery run` with
//! each config below exits with code 2 at once, printing exactly one line that
//! names the field, and never the token. Covers the checks made after parsing
//! too (files that do not exist, unsupported settings), which the core's
//! table (`controller/core/tests/bad_input.rs`) cannot see.
//!
//! No API server at all, so no backend: every config is refused before the
//! controller connects anywhere (its `service` points at port 1, where
//! nothing listens), the same on kube-sim and on a real cluster.

use crate::controller_support;

use std::time::{Duration, Instant};

use controller_support::bin;

const TOKEN: &str = "BadConfigSecret42";

fn base(cluster_extra: &str, settings: &str) -> String {
    format!(
        "discovery:\n  kubernetes:\n    service: {{schema: http, host: 127.0.0.1, port: 1}}\n    client: {{token: {TOKEN}}}\n{cluster_extra}kube_discovery:\n  coalesce_window: 50ms\n{settings}"
    )
}

#[test]
fn each_bad_config_exits_2_with_one_line_naming_the_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("does-not-exist");
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "port",
            base("", "").replace("port: 1", "port: 70000"),
            "discovery.kubernetes.service.port",
        ),
        (
            "misspelt key",
            base("    watch_endpoint_slice: true\n", ""),
            "discovery.kubernetes.watch_endpoint_slice",
        ),
        (
            "duration",
            base("", "  watch_timeout: 1h\n"),
            "kube_discovery.watch_timeout",
        ),
        (
            "lease",
            base("", "  leader_election: {lease_duration: 0s}\n"),
            "kube_discovery.leader_election.lease_duration",
        ),
        (
            "auth token file",
            base(
                "",
                &format!("  http: {{auth_token_file: {}}}\n", missing.display()),
            ),
            "kube_discovery.http.auth_token_file",
        ),
        (
            "configmap sink without namespace",
            base("", "  sinks: {configmap: {enabled: true}}\n"),
            "kube_discovery.sinks.configmap.namespace",
        ),
        (
            "ca file",
            base("", "").replace(
                "schema: http,",
                &format!("schema: https, ca_file: {},", missing.display()),
            ),
            "discovery.kubernetes.service.ca_file",
        ),
    ];
    let mut failures = Vec::new();
    for (name, yaml, field) in &cases {
        let cfg = dir.path().join(format!("{}.yaml", name.replace(' ', "-")));
        std::fs::write(&cfg, yaml).expect("write");
        let started = Instant::now();
        let out = std::process::Command::new(bin())
            .args(["run", "--config"])
            .arg(&cfg)
            .args(["--http-addr", "127.0.0.1:0"])
            .env_remove("KUBECONFIG")
            .output()
            .expect("run");
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        if out.status.code() != Some(2) {
            failures.push(format!(
                "{name}: exit {:?}, stderr:\n{stderr}",
                out.status.code()
            ));
        } else if lines.len() != 1 || !lines[0].contains(field) {
            failures.push(format!(
                "{name}: want one line naming {field}, got:\n{stderr}"
            ));
        }
        if stderr.contains(TOKEN) || String::from_utf8_lossy(&out.stdout).contains(TOKEN) {
            failures.push(format!("{name}: the token leaked"));
        }
        if started.elapsed() > Duration::from_secs(10) {
            failures.push(format!(
                "{name}: took {:?} to refuse the config",
                started.elapsed()
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases wrong:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
}
