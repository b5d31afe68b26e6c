//! README.md's "Configuration" tables are the one reference of the config
//! file's keys: every key the parser accepts is listed there (itself or a
//! key above it, e.g. `namespace_selector` for `namespace_selector.match`),
//! and every key listed there is accepted.
//!
//! The accepted keys are found through the parser itself: an unknown key
//! placed in a mapping is refused with serde's list of that mapping's keys
//! ("expected `a` or `b`"), and a key whose value is a mapping refuses an
//! unknown key under it the same way.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use kube_discovery_core::config::parse_config;

const PROBE: &str = "zz_not_a_key";

/// The YAML that sets `path` (dotted) to `value` under `root`.
fn nested(root: &str, path: &[&str], value: &str) -> String {
    let mut yaml = value.to_string();
    for key in path.iter().rev() {
        yaml = format!("{{{key}: {yaml}}}");
    }
    match root {
        "discovery.kubernetes" => format!("discovery: {{kubernetes: {yaml}}}"),
        _ => format!("discovery: {{kubernetes: {{}}}}\nkube_discovery: {yaml}"),
    }
}

/// The keys of the mapping at `path` under `root`, or `None` when the value
/// there is not a mapping.
fn keys_at(root: &str, path: &[&str]) -> Option<Vec<String>> {
    let yaml = nested(root, path, &format!("{{{PROBE}: 1}}"));
    let env = |var: &str| Some(if var.ends_with("_PORT") { "443" } else { "x" }.to_string());
    let errors = match parse_config(&yaml, &env) {
        Ok(_) => return None,
        Err(e) => e.to_string(),
    };
    // serde: "expected `a`", "expected `a` or `b`", "expected one of `a`, `b`, `c`".
    let line = errors.lines().find(|l| l.contains("unknown field"))?;
    let list = &line[line.find(", expected ")?..];
    Some(
        list.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect(),
    )
}

/// Every accepted leaf key under `root` (dotted, without `root`).
fn accepted(root: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut todo: Vec<Vec<String>> = vec![Vec::new()];
    while let Some(path) = todo.pop() {
        let refs: Vec<&str> = path.iter().map(String::as_str).collect();
        match keys_at(root, &refs) {
            Some(keys) => {
                for k in keys {
                    let mut p = path.clone();
                    p.push(k);
                    todo.push(p);
                }
            }
            None => {
                out.insert(path.join("."));
            }
        }
    }
    out
}

/// The keys of the README table under the heading that starts with
/// `heading`: the backquoted names of each row's first cell.
fn documented(readme: &str, heading: &str) -> BTreeSet<String> {
    let start = readme
        .find(heading)
        .unwrap_or_else(|| panic!("README.md has no heading {heading:?}"));
    let section = &readme[start + heading.len()..];
    let section = &section[..section.find("\n#").unwrap_or(section.len())];
    section
        .lines()
        .filter(|l| l.starts_with("| `"))
        .flat_map(|l| {
            let cell = l.trim_start_matches('|').split(" | ").next().unwrap_or("");
            cell.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

fn check(root: &str, heading: &str) {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../README.md"))
        .expect("README.md");
    let documented = documented(&readme, heading);
    let accepted = accepted(root);
    assert!(
        accepted.len() > 10,
        "the probe found too few keys: {accepted:?}"
    );
    let covered = |key: &str| {
        documented
            .iter()
            .any(|d| key == d || key.starts_with(&format!("{d}.")))
    };
    let missing: Vec<&String> = accepted.iter().filter(|k| !covered(k)).collect();
    assert!(
        missing.is_empty(),
        "{root}: keys the parser accepts that README.md's table does not list: {missing:?}"
    );
    let unknown: Vec<&String> = documented
        .iter()
        .filter(|d| {
            !accepted
                .iter()
                .any(|k| k == *d || k.starts_with(&format!("{d}.")))
        })
        .collect();
    assert!(
        unknown.is_empty(),
        "{root}: keys README.md's table lists that the parser does not accept: {unknown:?}"
    );
}

#[test]
fn every_discovery_kubernetes_key_is_in_the_readme_and_only_those() {
    check("discovery.kubernetes", "### `discovery.kubernetes`");
}

#[test]
fn every_kube_discovery_key_is_in_the_readme_and_only_those() {
    check("kube_discovery", "### `kube_discovery`");
}
