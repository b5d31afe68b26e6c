//! Shared helpers of the chart tests (`chart_*.rs`): locating the repository's
//! helm/kubectl (`.tools/bin`, installed by `e2e/tools/install-tools.sh`),
//! running `helm template`/`helm lint`, and parsing rendered multi-document YAML.
//!
//! Missing tools are a test FAILURE with a clear message, never a silent skip.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// Repository root (`e2e/..`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("repository root")
}

/// The chart directory.
pub fn chart_dir() -> PathBuf {
    repo_root().join("charts/kube-discovery")
}

/// A tool from `.tools/bin`, or a panic telling how to install it.
pub fn tool(name: &str) -> PathBuf {
    let p = repo_root().join(".tools/bin").join(name);
    assert!(
        p.exists(),
        "{} is missing: run `bash e2e/tools/install-tools.sh` (./test.sh does it)",
        p.display()
    );
    p
}

/// `helm` with an isolated HOME/cache/config so tests never touch the user's
/// helm state, and nothing depends on it.
pub fn helm() -> Command {
    let mut c = Command::new(tool("helm"));
    let base = std::env::temp_dir().join("kube-discovery-chart-tests-helm");
    c.env("HELM_CACHE_HOME", base.join("cache"))
        .env("HELM_CONFIG_HOME", base.join("config"))
        .env("HELM_DATA_HOME", base.join("data"))
        .env_remove("KUBECONFIG");
    c
}

/// Runs a command, returning its output (never panics on a non-zero exit).
pub fn run(mut cmd: Command) -> Output {
    let shown = format!("{cmd:?}");
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {shown}: {e}"))
}

/// Combined stdout+stderr as text.
pub fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `helm template <release> charts/kube-discovery -n <ns> <args>`.
pub fn template_cmd(release: &str, namespace: &str, args: &[&str]) -> Command {
    let mut c = helm();
    c.arg("template")
        .arg(release)
        .arg(chart_dir())
        .args(["--namespace", namespace])
        .args(args);
    c
}

/// Renders the chart and parses every document; panics with helm's message
/// when rendering fails.
pub fn render(release: &str, namespace: &str, args: &[&str]) -> Vec<Value> {
    let out = run(template_cmd(release, namespace, args));
    assert!(
        out.status.success(),
        "helm template {args:?} failed:\n{}",
        text(&out)
    );
    parse_docs(&String::from_utf8_lossy(&out.stdout))
}

/// Parses multi-document YAML, dropping empty documents.
pub fn parse_docs(yaml: &str) -> Vec<Value> {
    kube_discovery_core::yaml::documents(yaml)
        .into_iter()
        .map(|d| d.expect("valid YAML document"))
        .collect()
}

/// Reads and parses a YAML file of the repository.
pub fn read_docs(rel: &str) -> Vec<Value> {
    let p = repo_root().join(rel);
    let s = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
    parse_docs(&s)
}

/// The one object of `kind` (and `name` if given); panics listing what exists.
pub fn find<'a>(docs: &'a [Value], kind: &str, name: Option<&str>) -> &'a Value {
    let hits: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == kind && name.is_none_or(|n| d["metadata"]["name"] == n))
        .collect();
    assert_eq!(
        hits.len(),
        1,
        "expected one {kind} {name:?}, found {} among {:?}",
        hits.len(),
        kinds(docs)
    );
    hits[0]
}

/// `kind/name` of every document.
pub fn kinds(docs: &[Value]) -> Vec<String> {
    docs.iter()
        .map(|d| {
            format!(
                "{}/{}",
                d["kind"].as_str().unwrap_or("?"),
                d["metadata"]["name"].as_str().unwrap_or("?")
            )
        })
        .collect()
}

/// The rendered controller config (`config.yaml` of the chart's ConfigMap).
pub fn rendered_config(docs: &[Value]) -> String {
    let cms: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == "ConfigMap" && d["data"]["config.yaml"].is_string())
        .collect();
    assert_eq!(
        cms.len(),
        1,
        "one ConfigMap with config.yaml: {:?}",
        kinds(docs)
    );
    cms[0]["data"]["config.yaml"]
        .as_str()
        .expect("config.yaml is a string")
        .to_string()
}
