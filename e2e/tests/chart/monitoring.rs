//! The chart's monitoring kit:
//!
//! * `chart_alerts_pass_promtool`: the rendered PrometheusRule passes
//!   `promtool check rules` and the unit tests of
//!   `testdata/monitoring/alerts.test.yaml`, where every alert has a case that
//!   fires and one that must not; a mutated rule fails them (the tests bite).
//! * `every_metric_of_the_alerts_and_dashboard_exists` (both API servers):
//!   every metric name a rule or a dashboard panel uses is served by a running
//!   controller (installed with the chart, run as its Deployment says), after
//!   it has written, skipped an up-to-date write, skipped bad source data,
//!   repaired a hand edit and published the ConfigMap snapshot.
//!
//! promtool comes from Debian's `prometheus` package (`e2e/tools/install-lint-tools.sh`).

use crate::chart_support;
use crate::install_support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use chart_support::*;
use install_support::*;
use serde_json::Value;
use testenv::{Backend, both_backends};

const NS: &str = "kube-discovery";

fn promtool() -> PathBuf {
    for dir in std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .chain(["/usr/bin"])
    {
        let p = Path::new(dir).join("promtool");
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "promtool is missing: run `bash e2e/tools/install-lint-tools.sh` (./test.sh does; Debian's prometheus package)"
    );
}

/// The rules of the chart's PrometheusRule with every alert on (leader
/// election is on by default; the snapshot alert needs the snapshot).
fn rendered_rules() -> Value {
    let docs = render(
        "kd",
        NS,
        &[
            "--set",
            "prometheusRule.enabled=true",
            "--set",
            "controller.configMapSnapshot.enabled=true",
        ],
    );
    find(&docs, "PrometheusRule", None)["spec"].clone()
}

fn promtool_test(dir: &Path, rules: &Value) -> std::process::Output {
    std::fs::write(
        dir.join("rules.yaml"),
        kube_discovery_core::yaml::to_string(rules).expect("rules YAML"),
    )
    .expect("write rules");
    std::fs::copy(
        repo_root().join("e2e/tests/testdata/monitoring/alerts.test.yaml"),
        dir.join("alerts.test.yaml"),
    )
    .expect("copy the unit tests");
    let mut c = Command::new(promtool());
    c.args(["test", "rules"]).arg(dir.join("alerts.test.yaml"));
    run(c)
}

#[test]
fn chart_alerts_pass_promtool() {
    let dir = tempfile::tempdir().expect("temp dir");
    let rules = rendered_rules();
    let out = promtool_test(dir.path(), &rules);
    assert!(out.status.success(), "promtool test rules:\n{}", text(&out));
    let mut c = Command::new(promtool());
    c.args(["check", "rules"])
        .arg(dir.path().join("rules.yaml"));
    let out = run(c);
    let t = text(&out);
    assert!(out.status.success(), "promtool check rules:\n{t}");
    let alerts: Vec<String> = rules["groups"][0]["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .filter_map(|r| r["alert"].as_str().map(str::to_string))
        .collect();
    assert!(
        t.contains(&format!("SUCCESS: {} rules found", alerts.len())),
        "{t}"
    );

    // Every alert has a case that fires and one where it must not.
    let tests: Value = kube_discovery_core::yaml::from_str(
        &std::fs::read_to_string(dir.path().join("alerts.test.yaml")).expect("tests"),
    )
    .expect("tests YAML");
    let cases: Vec<&Value> = tests["tests"]
        .as_array()
        .expect("tests")
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().into_iter().flatten())
        .collect();
    for a in &alerts {
        let of = |fires: bool| {
            cases.iter().any(|c| {
                c["alertname"] == a.as_str()
                    && c["exp_alerts"]
                        .as_array()
                        .is_some_and(|e| e.is_empty() != fires)
            })
        };
        assert!(of(true), "{a}: no promtool case where it fires");
        assert!(of(false), "{a}: no promtool case where it must stay silent");
    }

    // The unit tests bite: a rule with another threshold fails them.
    let mut mutated = rules.clone();
    for r in mutated["groups"][0]["rules"].as_array_mut().expect("rules") {
        if r["alert"] == "KubeDiscoveryWatchRestarts" {
            let e = r["expr"].as_str().expect("expr").replace("> 5", "> 50");
            r["expr"] = Value::String(e);
        }
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let out = promtool_test(dir.path(), &mutated);
    assert!(
        !out.status.success() && text(&out).contains("KubeDiscoveryWatchRestarts"),
        "a changed threshold must fail the unit tests:\n{}",
        text(&out)
    );
}

/// Metric names in a PromQL expression: identifiers outside label matchers
/// (`{...}`), ranges (`[...]`), strings and grouping clauses, that are not
/// functions (followed by `(`) or keywords.
fn metric_names(expr: &str) -> BTreeSet<String> {
    const KEYWORDS: &[&str] = &[
        "and",
        "or",
        "unless",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "offset",
        "inf",
        "nan",
        // Aggregation operators, which may stand before `by (...)` instead of `(`.
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
        "limitk",
        "limit_ratio",
    ];
    const GROUPING: &[&str] = &[
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let chars: Vec<char> = expr.chars().collect();
    let mut out = BTreeSet::new();
    let mut i = 0;
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => {
                i += 1;
                while i < chars.len() && chars[i] != c {
                    i += if chars[i] == '\\' { 2 } else { 1 };
                }
                i += 1;
            }
            '{' | '[' => {
                let close = if c == '{' { '}' } else { ']' };
                while i < chars.len() && chars[i] != close {
                    i += 1;
                }
                i += 1;
            }
            c if c.is_ascii_digit() || c == '.' => {
                while i < chars.len() && (ident(chars[i]) || chars[i] == '.') {
                    i += 1;
                }
            }
            c if ident(c) => {
                let start = i;
                while i < chars.len() && ident(chars[i]) {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let mut j = i;
                while j < chars.len() && chars[j].is_whitespace() {
                    j += 1;
                }
                let call = j < chars.len() && chars[j] == '(';
                if call && GROUPING.contains(&word.as_str()) {
                    // by (...) and friends: label names, not metrics.
                    while j < chars.len() && chars[j] != ')' {
                        j += 1;
                    }
                    i = j + 1;
                } else if !call && !KEYWORDS.contains(&word.as_str()) && !word.starts_with('$') {
                    out.insert(word);
                }
            }
            _ => i += 1,
        }
    }
    out
}

#[test]
fn metric_names_are_found_in_promql() {
    let got = metric_names(
        r#"histogram_quantile(0.99, sum by (le, cluster) (rate(kube_discovery_list_duration_seconds_bucket{namespace=~"$namespace",x="a b"}[$__rate_interval])))
           / on (pod) group_left (version) kube_discovery_build_info > bool 1e3 and time() - process_start_time_seconds offset 5m"#,
    );
    assert_eq!(
        got.into_iter().collect::<Vec<_>>(),
        [
            "kube_discovery_build_info",
            "kube_discovery_list_duration_seconds_bucket",
            "process_start_time_seconds"
        ]
    );
}

/// Every metric name the rules and the dashboard use, with where.
fn used_metrics() -> Vec<(String, String)> {
    let mut used = Vec::new();
    for r in rendered_rules()["groups"][0]["rules"]
        .as_array()
        .expect("rules")
    {
        for m in metric_names(r["expr"].as_str().expect("expr")) {
            used.push((m, format!("alert {}", r["alert"])));
        }
    }
    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(chart_dir().join("dashboards/kube-discovery.json"))
            .expect("dashboard"),
    )
    .expect("dashboard JSON");
    for p in dash["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().into_iter().flatten() {
            for m in metric_names(t["expr"].as_str().expect("expr")) {
                used.push((m, format!("panel {}", p["title"])));
            }
        }
    }
    for v in dash["templating"]["list"].as_array().expect("variables") {
        if let Some(q) = v["definition"].as_str() {
            let inner = q
                .strip_prefix("label_values(")
                .and_then(|q| q.rsplit_once(',').map(|(m, _)| m))
                .unwrap_or(q);
            for m in metric_names(inner) {
                used.push((m, format!("variable {}", v["name"])));
            }
        }
    }
    used
}

/// Sample names of a Prometheus/OpenMetrics text scrape.
fn sample_names(scrape: &str) -> BTreeSet<String> {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next().map(str::to_string))
        .collect()
}

fn sample(scrape: &str, name: &str) -> Option<f64> {
    scrape
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_metric_of_the_alerts_and_dashboard_exists(backend: Backend) {
    let used = used_metrics();
    assert!(used.len() > 30, "{used:?}");
    let env = Env::start(backend).await;
    env.apply_yaml("backend.yaml", &backend_yaml(2));
    // A slice without its Service label: skipped (and counted) by the controller.
    env.apply_yaml(
        "stray.yaml",
        r#"apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: stray, namespace: shop}
addressType: IPv4
ports: [{name: http, port: 8080, protocol: TCP}]
endpoints: [{addresses: ["10.0.9.9"]}]
"#,
    );
    let chart = chart_dir().display().to_string();
    env.helm_ok(&[
        "install",
        "kd",
        &chart,
        "--namespace",
        NS,
        "--create-namespace",
        "--set",
        "controller.configMapSnapshot.enabled=true",
        "--set",
        "controller.coalesceWindow=50ms",
    ]);
    let deployment = "kd-kube-discovery";
    // A first replica writes everything, then stops.
    {
        let mut first = run_pod(&env, NS, deployment, "kd-kube-discovery-0").await;
        wait_nodes(&env, &mut [&mut first], "shop", "web", &nodes(2)).await;
    }
    // The next one finds it all written (skips), then follows a change,
    // publishes the snapshot and repairs a hand edit.
    let mut pod = run_pod(&env, NS, deployment, "kd-kube-discovery-1").await;
    let metrics = |pod: &Pod| pod.get("/metrics").map(|(_, b)| b).unwrap_or_default();
    wait_for(60, "an up-to-date write skipped", |last| {
        pod.assert_alive();
        let m = metrics(&pod);
        *last = m
            .lines()
            .filter(|l| l.contains("skipped"))
            .collect::<Vec<_>>()
            .join("\n");
        sample(&m, "kube_discovery_writes_skipped_total")
            .is_some_and(|v| v >= 1.0)
            .then_some(())
    })
    .await;
    env.apply_yaml("backend3.yaml", &backend_yaml(3));
    wait_nodes(&env, &mut [&mut pod], "shop", "web", &nodes(3)).await;
    env.kubectl_ok(&[
        "patch",
        "dsvc",
        "web",
        "-n",
        "shop",
        "--type=merge",
        "-p",
        r#"{"spec":{"ports":{"http":[{"host":"10.9.9.9","port":1,"weight":1}]}}}"#,
    ]);
    wait_nodes(&env, &mut [&mut pod], "shop", "web", &nodes(3)).await;
    let scrape = wait_for(60, "drift corrected and snapshot published", |last| {
        pod.assert_alive();
        let m = metrics(&pod);
        *last = m.clone();
        (sample(&m, "kube_discovery_drift_corrections_total").is_some()
            && sample(&m, "kube_discovery_snapshot_last_publish_timestamp_seconds")
                .is_some_and(|v| v > 0.0)
            && sample(&m, "kube_discovery_ready") == Some(1.0))
        .then_some(m)
    })
    .await;

    let served = sample_names(&scrape);
    let missing: Vec<&(String, String)> =
        used.iter().filter(|(m, _)| !served.contains(m)).collect();
    assert!(
        missing.is_empty(),
        "metrics used by the chart's alerts/dashboard but not served: {missing:?}\nserved: {served:?}"
    );
    // And what they say is right.
    assert_eq!(
        sample(&scrape, "kube_discovery_leader"),
        Some(1.0),
        "the only replica leads"
    );
    let build = format!(
        r#"kube_discovery_build_info{{version="{}","#,
        env!("CARGO_PKG_VERSION")
    );
    assert!(
        scrape
            .lines()
            .any(|l| l.starts_with(&build) && l.ends_with("} 1")),
        "{build}... 1 in:\n{scrape}"
    );
    assert!(sample(&scrape, "process_cpu_seconds_total").is_some_and(|v| v > 0.0));
    assert!(sample(&scrape, "process_resident_memory_bytes").is_some_and(|v| v > 1_048_576.0));
    assert!(sample(&scrape, "process_open_fds").is_some_and(|v| v >= 3.0));
    assert!(
        sample(&scrape, r#"kube_discovery_source_skipped_total{cluster="",kind="EndpointSlice",reason="missing_service_label"}"#)
            .is_some_and(|v| v >= 1.0),
        "{scrape}"
    );
    pod.assert_no_forbidden();
}
