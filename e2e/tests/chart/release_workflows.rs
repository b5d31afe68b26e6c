//! The GitHub Actions workflows (`.github/workflows/`), which cannot run here
//! (no GitHub, no Docker): every workflow passes actionlint v1.7.12 with
//! shellcheck on every `run:` script (both installed by
//! `e2e/tools/install-lint-tools.sh`), and the release workflow publishes what
//! the README promises (multi-arch image with SBOM + provenance, chart as OCI
//! artifact and in a Helm repository index, CLI binaries for linux/darwin x
//! amd64/arm64 with checksums and attestations). Its version check is run
//! here as a script.

use crate::chart_support;

use std::path::PathBuf;
use std::process::Command;

use chart_support::*;
use serde_json::Value;

fn workflows() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(repo_root().join(".github/workflows"))
        .expect(".github/workflows")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    v.sort();
    v
}

fn actionlint(files: &[PathBuf]) -> std::process::Output {
    let mut c = Command::new(tool("actionlint"));
    c.arg("-no-color")
        .arg("-shellcheck")
        .arg(tool("shellcheck"))
        .args(files)
        .current_dir(repo_root());
    run(c)
}

#[test]
fn workflows_pass_actionlint_with_shellcheck() {
    let files = workflows();
    assert!(files.len() >= 2, "{files:?}");
    let out = actionlint(&files);
    assert!(
        out.status.success() && text(&out).trim().is_empty(),
        "actionlint findings (fix them; nothing is ignored):\n{}",
        text(&out)
    );
    // The linter reads what it is given: an unknown action input and a shell
    // bug in a copy of the release workflow are both reported.
    let dir = tempfile::tempdir().expect("temp dir");
    let wf = dir.path().join(".github/workflows");
    std::fs::create_dir_all(&wf).expect("mkdir");
    let release = std::fs::read_to_string(repo_root().join(".github/workflows/release.yaml"))
        .expect("release.yaml")
        .replacen(
            "push-to-registry: true",
            "push-to-registry: true\n          pushh: yes",
            1,
        )
        .replacen(
            "version=\"${GITHUB_REF_NAME#v}\"",
            "version=\"${GITHUB_REF_NAME#v}\"\n          cd $HOME/$version",
            1,
        );
    let bad = wf.join("release.yaml");
    std::fs::write(&bad, release).expect("write");
    let out = actionlint(&[bad]);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(t.contains(r#"input "pushh" is not defined"#), "{t}");
    assert!(
        t.contains("SC2086"),
        "shellcheck runs on run: scripts:\n{t}"
    );
}

fn release() -> Value {
    kube_discovery_core::yaml::from_str(
        &std::fs::read_to_string(repo_root().join(".github/workflows/release.yaml"))
            .expect("release.yaml"),
    )
    .expect("release.yaml is YAML")
}

/// The steps of `job` that use `action` (`owner/name`, any version).
fn uses<'a>(wf: &'a Value, job: &str, action: &str) -> Vec<&'a Value> {
    wf["jobs"][job]["steps"]
        .as_array()
        .unwrap_or_else(|| panic!("job {job}"))
        .iter()
        .filter(|s| {
            s["uses"]
                .as_str()
                .is_some_and(|u| u.split('@').next() == Some(action))
        })
        .collect()
}

fn run_scripts(wf: &Value, job: &str) -> String {
    wf["jobs"][job]["steps"]
        .as_array()
        .unwrap_or_else(|| panic!("job {job}"))
        .iter()
        .filter_map(|s| s["run"].as_str())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn release_workflow_publishes_image_chart_and_binaries() {
    let wf = release();
    assert_eq!(wf["on"]["push"]["tags"], serde_json::json!(["v*"]));

    // Image: both platforms, SBOM and provenance, attested in the registry.
    let build = uses(&wf, "image", "docker/build-push-action");
    assert_eq!(build.len(), 1);
    let with = &build[0]["with"];
    assert_eq!(with["platforms"], "linux/amd64,linux/arm64");
    assert_eq!(with["push"], true);
    assert_eq!(with["sbom"], true);
    assert_eq!(with["provenance"], "mode=max");
    let attest = uses(&wf, "image", "actions/attest-build-provenance");
    assert_eq!(attest.len(), 1);
    assert_eq!(attest[0]["with"]["push-to-registry"], true);
    assert!(
        attest[0]["with"]["subject-digest"]
            .as_str()
            .is_some_and(|d| d.contains("steps.build.outputs.digest"))
    );
    for p in ["id-token", "attestations", "packages"] {
        assert_eq!(
            wf["jobs"]["image"]["permissions"][p], "write",
            "image job permission {p}"
        );
    }

    // Chart: OCI push (attested) and a Helm repository index on gh-pages.
    let chart = run_scripts(&wf, "chart");
    for want in [
        "helm lint --strict charts/kube-discovery",
        "charts/sync-crds.sh --check",
        "deploy/render.sh --check",
        "helm package charts/kube-discovery",
        "helm push \"dist/kube-discovery-$VERSION.tgz\" \"$CHART_REPO\"",
        "helm repo index pages --url \"$url\" --merge pages/index.yaml",
        "git -C pages push origin gh-pages",
    ] {
        assert!(chart.contains(want), "chart job lacks {want:?}:\n{chart}");
    }
    assert!(
        wf["jobs"]["chart"]["env"]["CHART_REPO"]
            .as_str()
            .is_some_and(|r| r.starts_with("oci://ghcr.io/")),
        "{}",
        wf["jobs"]["chart"]["env"]
    );
    assert_eq!(
        uses(&wf, "chart", "actions/attest-build-provenance").len(),
        1
    );
    assert!(
        wf["jobs"]["chart"]["needs"]
            .as_array()
            .is_some_and(|n| n.iter().any(|j| j == "image")),
        "the chart is published after the image it points to"
    );

    // Binaries: linux and darwin, amd64 and arm64, each its Rust target.
    let matrix = wf["jobs"]["binaries"]["strategy"]["matrix"]["include"]
        .as_array()
        .expect("binaries matrix");
    let mut got: Vec<(String, String, String)> = matrix
        .iter()
        .map(|m| {
            (
                m["os"].as_str().expect("os").to_string(),
                m["arch"].as_str().expect("arch").to_string(),
                m["target"].as_str().expect("target").to_string(),
            )
        })
        .collect();
    got.sort();
    let want: Vec<(String, String, String)> = [
        ("darwin", "amd64", "x86_64-apple-darwin"),
        ("darwin", "arm64", "aarch64-apple-darwin"),
        ("linux", "amd64", "x86_64-unknown-linux-musl"),
        ("linux", "arm64", "aarch64-unknown-linux-musl"),
    ]
    .iter()
    .map(|(a, b, c)| (a.to_string(), b.to_string(), c.to_string()))
    .collect();
    assert_eq!(got, want);
    let bins = run_scripts(&wf, "binaries");
    assert!(
        bins.contains(
            "cargo build --release --locked --no-default-features -p kube-discovery --bin kube-discovery --target"
        ),
        "{bins}"
    );

    // Release: checksums of everything, attested, all on the GitHub release.
    let rel = run_scripts(&wf, "release");
    assert!(
        rel.contains("sha256sum ./*.tar.gz ./*.tgz kube-discovery.yaml"),
        "{rel}"
    );
    let attest = uses(&wf, "release", "actions/attest-build-provenance");
    assert_eq!(attest.len(), 1);
    assert!(attest[0]["with"]["subject-checksums"].is_string());
    let gh = uses(&wf, "release", "softprops/action-gh-release");
    assert_eq!(gh.len(), 1);
    assert_eq!(gh[0]["with"]["files"], "dist/*");
    let needs = &wf["jobs"]["release"]["needs"];
    for j in ["binaries", "chart"] {
        assert!(
            needs.as_array().is_some_and(|n| n.iter().any(|x| x == j)),
            "release needs {j}"
        );
    }

    // Every action is pinned to a release, never a branch.
    for (name, job) in wf["jobs"].as_object().expect("jobs") {
        for s in job["steps"].as_array().into_iter().flatten() {
            if let Some(u) = s["uses"].as_str() {
                let rev = u.split('@').nth(1).unwrap_or_default();
                // dtolnay/rust-toolchain's refs name the toolchain (its documented use).
                let toolchain = u.starts_with("dtolnay/rust-toolchain@") && rev == "stable";
                assert!(
                    toolchain || rev.starts_with('v'),
                    "{name}: {u} is not pinned to a release"
                );
            }
        }
    }
}

/// Runs the release workflow's version check as GitHub would, for `tag`.
fn version_check(tag: &str) -> (bool, String, String) {
    let wf = release();
    let script = wf["jobs"]["version"]["steps"]
        .as_array()
        .expect("steps")
        .iter()
        .find_map(|s| (s["id"] == "version").then(|| s["run"].as_str().expect("run")))
        .expect("the version step");
    let dir = tempfile::tempdir().expect("temp dir");
    let output = dir.path().join("github-output");
    let mut c = Command::new("bash");
    c.args(["-e", "-c", script])
        .current_dir(repo_root())
        .env("GITHUB_REF_NAME", tag)
        .env("GITHUB_OUTPUT", &output);
    let out = run(c);
    (
        out.status.success(),
        text(&out),
        std::fs::read_to_string(&output).unwrap_or_default(),
    )
}

#[test]
fn release_version_check_accepts_only_the_chart_and_crate_version() {
    let chart: Value = kube_discovery_core::yaml::from_str(
        &std::fs::read_to_string(chart_dir().join("Chart.yaml")).expect("Chart.yaml"),
    )
    .expect("Chart.yaml");
    let version = chart["appVersion"].as_str().expect("appVersion");
    assert_eq!(
        chart["version"], version,
        "chart version = appVersion = the tag"
    );
    let (ok, log, out) = version_check(&format!("v{version}"));
    assert!(ok, "{log}");
    assert_eq!(out.trim(), format!("version={version}"));
    let (ok, log, _) = version_check("v9.9.9");
    assert!(!ok, "a tag that matches nothing is refused:\n{log}");
    assert!(log.contains("does not match the appVersion"), "{log}");
}

#[test]
fn shipping_scripts_pass_shellcheck() {
    let scripts = [
        "deploy/render.sh",
        "charts/sync-crds.sh",
        "e2e/tools/install-lint-tools.sh",
        "e2e/tools/install-tools.sh",
    ];
    let mut c = Command::new(tool("shellcheck"));
    c.arg("-x").args(scripts).current_dir(repo_root());
    let out = run(c);
    assert!(
        out.status.success(),
        "shellcheck {scripts:?}:\n{}",
        text(&out)
    );
    for s in scripts {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(repo_root().join(s))
            .expect(s)
            .permissions()
            .mode();
        assert!(mode & 0o111 != 0, "{s} must be executable");
    }
}
