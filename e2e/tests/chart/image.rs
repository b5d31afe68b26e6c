//! Checks of the shipping files that cannot be exercised on this machine (no
//! Docker): the Dockerfile builds the package and binary that exist, its
//! build context (`.dockerignore`) keeps everything the workspace needs, the
//! runtime image is non-root and the chart runs the image the way the CLI
//! expects; the kind e2e script and the sync script are valid bash.

use crate::chart_support;

use std::process::Command;

use chart_support::*;

fn read(rel: &str) -> String {
    let p = repo_root().join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
}

/// `true` when `.dockerignore` (simple patterns: `dir/`, `name`, `**/*.ext`) excludes `path`.
fn ignored(patterns: &[String], path: &str) -> bool {
    patterns.iter().any(|p| {
        if let Some(suffix) = p.strip_prefix("**/*") {
            path.ends_with(suffix)
        } else if let Some(dir) = p.strip_suffix('/') {
            path == dir || path.starts_with(&format!("{dir}/"))
        } else {
            path == p || path.starts_with(&format!("{p}/"))
        }
    })
}

#[test]
fn chart_image_dockerfile_builds_the_controller_binary_as_non_root() {
    let dockerfile = read("Dockerfile");
    let controller: toml_like::Manifest = toml_like::parse(&read("controller/Cargo.toml"));
    let (package, bin) = (controller.package_name, controller.bin_name);
    assert_eq!(
        (package.as_str(), bin.as_str()),
        ("kube-discovery", "kube-discovery")
    );
    assert!(
        dockerfile.contains(&format!("-p {package} --bin {bin}")),
        "the Dockerfile must build package {package}, binary {bin}"
    );
    assert!(
        dockerfile.contains("--locked"),
        "reproducible: cargo build --locked"
    );
    assert!(
        dockerfile.contains("--no-default-features -p kube-discovery"),
        "the image leaves the demo (kube-sim) out: cargo build --no-default-features"
    );
    let froms: Vec<&str> = dockerfile
        .lines()
        .filter(|l| l.starts_with("FROM "))
        .collect();
    assert_eq!(froms.len(), 2, "multi-stage: builder + runtime: {froms:?}");
    assert!(
        froms[1].contains("distroless/static"),
        "static distroless runtime: {}",
        froms[1]
    );
    assert!(froms[1].contains(":nonroot"), "non-root base: {}", froms[1]);
    assert!(
        dockerfile.lines().any(|l| l.trim() == "USER 65532:65532"),
        "explicit non-root USER"
    );
    // The chart's securityContext uses the same uid/gid.
    let docs = render("kd", "kube-discovery", &[]);
    let pod = &find(&docs, "Deployment", None)["spec"]["template"]["spec"];
    assert_eq!(pod["securityContext"]["runAsUser"], 65532);
    assert_eq!(pod["securityContext"]["runAsGroup"], 65532);
    // ENTRYPOINT is the binary; the chart passes `run --config ...` as args.
    assert!(dockerfile.contains(&format!("ENTRYPOINT [\"/usr/local/bin/{bin}\"]")));
    assert_eq!(pod["containers"][0]["args"][0], "run");
}

/// The normal (non-dev) dependency names of `kube-discovery` (cargo tree).
fn product_deps(features: &[&str]) -> Vec<String> {
    let out = Command::new(env!("CARGO"))
        .current_dir(repo_root())
        .args(["tree", "--locked", "-p", "kube-discovery", "-e", "normal"])
        .args(["--prefix", "none", "--format", "{p}"])
        .args(features)
        .output()
        .expect("run cargo tree");
    assert!(
        out.status.success(),
        "cargo tree: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split_whitespace().take(2).collect::<Vec<_>>().join(" "))
        .collect()
}

/// The shipped binary (built with `--no-default-features`, as the Dockerfile
/// and the release workflow do) links no part of the test API server; the
/// default build (for `cargo run -- demo`) does, which shows the check sees it.
#[test]
fn chart_image_product_binary_links_no_test_server() {
    let banned = |d: &String| {
        let name = d.split(' ').next().unwrap_or_default();
        matches!(name, "kube-sim" | "kube-sim-apimachinery" | "jsonschema" | "rcgen")
            // kube-runtime itself needs json-patch 4 (kube-client's `jsonpatch`);
            // kube-sim's is 5.
            || d.starts_with("json-patch v5")
    };
    let product = product_deps(&["--no-default-features"]);
    assert!(
        product
            .iter()
            .any(|d| d.starts_with("kube-discovery-client ")),
        "cargo tree output not understood: {product:?}"
    );
    let linked: Vec<&String> = product.iter().filter(|d| banned(d)).collect();
    assert!(linked.is_empty(), "the product links {linked:?}");
    let with_demo = product_deps(&[]);
    assert!(
        with_demo.iter().any(|d| d.starts_with("kube-sim ")),
        "the default build has the demo, so kube-sim: {with_demo:?}"
    );
}

#[test]
fn chart_image_build_context_keeps_the_workspace() {
    let patterns: Vec<String> = read(".dockerignore")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect();
    // Sanity of the matcher on what must be excluded.
    for heavy in [
        "target/debug/kube-discovery",
        ".tools/bin/helm",
        ".git/HEAD",
    ] {
        assert!(
            ignored(&patterns, heavy),
            "{heavy} should not be sent to Docker"
        );
    }
    // Cargo loads every workspace member, so all of them must be in the context.
    let root = read("Cargo.toml");
    let members_line = root
        .lines()
        .find(|l| l.trim_start().starts_with("members"))
        .expect("workspace members");
    let members: Vec<&str> = members_line.split('"').skip(1).step_by(2).collect();
    assert!(members.len() >= 2, "{members_line}");
    let mut needed = vec![
        "Cargo.toml".to_string(),
        "Cargo.lock".to_string(),
        "crds/discoveredservices.yaml".to_string(),
    ];
    for m in &members {
        needed.push(format!("{m}/Cargo.toml"));
        // Every Rust source of the member (targets, modules, build scripts).
        rust_files(&repo_root(), m, &mut needed);
    }
    for path in &needed {
        assert!(
            repo_root().join(path).exists(),
            "{path} missing in the repository"
        );
        assert!(
            !ignored(&patterns, path),
            ".dockerignore excludes {path}, which the build needs"
        );
    }
}

#[test]
fn chart_image_scripts_are_valid_bash() {
    for script in ["e2e/kind/run.sh", "charts/sync-crds.sh"] {
        let p = repo_root().join(script);
        let out = run({
            let mut c = Command::new("bash");
            c.arg("-n").arg(&p);
            c
        });
        assert!(out.status.success(), "bash -n {script}:\n{}", text(&out));
        let meta = std::fs::metadata(&p).expect("metadata");
        use std::os::unix::fs::PermissionsExt;
        assert!(
            meta.permissions().mode() & 0o111 != 0,
            "{script} must be executable"
        );
    }
    // The sync script's --check agrees with the CRD test.
    let out = run({
        let mut c = Command::new("bash");
        c.arg(repo_root().join("charts/sync-crds.sh"))
            .arg("--check");
        c
    });
    assert!(
        out.status.success(),
        "charts/sync-crds.sh --check:\n{}",
        text(&out)
    );
}

/// Relative paths of the `.rs` files under `dir` (skipping `target`).
fn rust_files(root: &std::path::Path, dir: &str, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let rel = format!("{dir}/{name}");
        if e.path().is_dir() {
            if name != "target" {
                rust_files(root, &rel, out);
            }
        } else if name.ends_with(".rs") {
            out.push(rel);
        }
    }
}

/// Just enough of Cargo.toml for the package and binary names (no TOML
/// dependency for two keys).
mod toml_like {
    pub struct Manifest {
        pub package_name: String,
        pub bin_name: String,
    }

    pub fn parse(text: &str) -> Manifest {
        let mut section = String::new();
        let (mut package_name, mut bin_name) = (String::new(), String::new());
        for line in text.lines().map(str::trim) {
            if line.starts_with('[') {
                section = line.to_string();
            } else if let Some(v) = line.strip_prefix("name = ") {
                let v = v.trim_matches('"').to_string();
                match section.as_str() {
                    "[package]" => package_name = v,
                    "[[bin]]" => bin_name = v,
                    _ => {}
                }
            }
        }
        Manifest {
            package_name,
            bin_name,
        }
    }
}
