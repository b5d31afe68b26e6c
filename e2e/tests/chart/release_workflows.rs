//! The GitHub Actions workflows (`.github/workflows/`), which cannot run here
//! (no GitHub, no Docker): every workflow passes actionlint v1.7.12 with
//! shellcheck on every `run:` script (both installed by
//! `e2e/tools/install-lint-tools.sh`), and the release workflow publishes what
//! the README promises (multi-arch image with SBOM + provenance, chart as OCI
//! artifact and in a Helm repository index, CLI binaries for linux/darwin x
//! amd64/arm64 with checksums and attestations; the kubectl plugin archives
//! and their krew manifest; completions and man pages in the archives). Its
//! version check, and its packaging, checksum and krew steps (with the debug
//! binary standing in for the release builds) are run here as scripts.

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
    // Completions and man pages: generated once by a native build, packed by
    // every binaries job (release_packs_... runs those scripts).
    let files = run_scripts(&wf, "cli-files");
    assert!(
        files.contains(
            "cargo build --locked --no-default-features -p kube-discovery --bin kube-discovery"
        ) && files.contains("deploy/cli-files.sh target/debug/kube-discovery cli-files"),
        "{files}"
    );
    assert!(
        wf["jobs"]["binaries"]["needs"]
            .as_array()
            .is_some_and(|n| n.iter().any(|j| j == "cli-files")),
        "the archives need the completions and man pages"
    );

    // Release: checksums of everything, attested, all on the GitHub release.
    let rel = run_scripts(&wf, "release");
    assert!(
        rel.contains("sha256sum ./*.tar.gz ./*.tgz kube-discovery.yaml"),
        "{rel}"
    );
    assert!(
        rel.contains("deploy/krew/render.sh \"$VERSION\" \"$GITHUB_REPOSITORY\""),
        "the krew manifest is rendered from the checksums:\n{rel}"
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
        "deploy/krew/render.sh",
        "deploy/cli-files.sh",
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

/// The `run:` script of the step named `name` in `job`.
fn step_script<'a>(wf: &'a Value, job: &str, name: &str) -> &'a str {
    wf["jobs"][job]["steps"]
        .as_array()
        .unwrap_or_else(|| panic!("job {job}"))
        .iter()
        .find_map(|s| (s["name"] == name).then(|| s["run"].as_str()).flatten())
        .unwrap_or_else(|| panic!("no step {name:?} with a run: script in job {job}"))
}

/// Runs `script` with `bash -e` in `dir` with `env`; panics with its output on failure.
fn run_step(script: &str, dir: &std::path::Path, env: &[(&str, &str)]) -> String {
    let mut c = Command::new("bash");
    c.args(["-e", "-c", script]).current_dir(dir);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = run(c);
    assert!(out.status.success(), "{script}\n{}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn tar_list(archive: &std::path::Path) -> Vec<String> {
    let mut c = Command::new("tar");
    c.arg("-tzf").arg(archive);
    let out = run(c);
    assert!(out.status.success(), "{}", text(&out));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

const PLATFORMS: [(&str, &str); 4] = [
    ("linux", "amd64"),
    ("linux", "arm64"),
    ("darwin", "amd64"),
    ("darwin", "arm64"),
];

/// Checks a krew Plugin manifest: the four platforms, each selecting os and
/// arch, with `bin: kubectl-discovery` and a file rule for it.
fn check_krew_platforms(doc: &Value) -> Vec<(String, String, &Value)> {
    assert_eq!(
        doc["apiVersion"],
        "krew.googlecontainertools.github.com/v1alpha2"
    );
    assert_eq!(doc["kind"], "Plugin");
    assert_eq!(doc["metadata"]["name"], "discovery");
    for f in ["version", "homepage", "shortDescription", "description"] {
        assert!(doc["spec"][f].is_string(), "spec.{f}: {doc}");
    }
    let platforms = doc["spec"]["platforms"].as_array().expect("spec.platforms");
    let mut got: Vec<(String, String, &Value)> = platforms
        .iter()
        .map(|p| {
            let labels = &p["selector"]["matchLabels"];
            assert_eq!(p["bin"], "kubectl-discovery", "{p}");
            assert!(p["uri"].is_string() && p["sha256"].is_string(), "{p}");
            let from = p["files"][0]["from"].as_str().expect("files[0].from");
            assert!(from.ends_with("/kubectl-discovery"), "{p}");
            (
                labels["os"].as_str().expect("os").to_string(),
                labels["arch"].as_str().expect("arch").to_string(),
                p,
            )
        })
        .collect();
    got.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    let mut want: Vec<(String, String)> = PLATFORMS
        .iter()
        .map(|(o, a)| (o.to_string(), a.to_string()))
        .collect();
    want.sort();
    assert_eq!(
        got.iter()
            .map(|(o, a, _)| (o.clone(), a.clone()))
            .collect::<Vec<_>>(),
        want
    );
    got
}

#[test]
fn krew_manifest_template_is_a_plugin_for_four_platforms() {
    let docs = read_docs("deploy/krew/discovery.yaml");
    assert_eq!(docs.len(), 1);
    for (os, arch, p) in check_krew_platforms(&docs[0]) {
        let tag = format!("{os}_{arch}");
        assert_eq!(p["sha256"], format!("@SHA256_{}@", tag.to_uppercase()));
        assert!(
            p["uri"]
                .as_str()
                .is_some_and(|u| u.ends_with(&format!("/kubectl-discovery_@VERSION@_{tag}.tar.gz"))),
            "{p}"
        );
    }
}

/// The release's packaging, checksum and krew steps as scripts, on the debug
/// binary: both archives per platform hold what the docs promise, and the
/// rendered krew manifest points at the plugin archives with their real
/// sha256 and names the file inside them that is the plugin.
#[test]
fn release_packs_cli_files_and_the_plugin_and_renders_the_krew_manifest() {
    let wf = release();
    let root = repo_root();
    let work = tempfile::tempdir().expect("temp dir");
    let w = work.path();
    let version = "0.1.0";
    // What the runner has: the checkout, the cli-files artifact, the build.
    for f in ["README.md", "docs", "deploy"] {
        std::os::unix::fs::symlink(root.join(f), w.join(f)).expect("symlink");
    }
    let bin = crate::install_support::controller_bin();
    let mut c = Command::new(root.join("deploy/cli-files.sh"));
    c.arg(&bin).arg(w.join("cli-files"));
    let out = run(c);
    assert!(out.status.success(), "cli-files.sh: {}", text(&out));
    // Release builds stand-in: a script that runs the debug binary under the
    // name it was started as (8 copies of the debug binary would be ~1 GB).
    let stand_in = format!(
        "#!/usr/bin/env bash\nexec -a \"$0\" '{}' \"$@\"\n",
        bin.display()
    );
    let package = step_script(&wf, "binaries", "package");
    for (os, arch) in PLATFORMS {
        let release = w.join(format!("target/{os}-{arch}/release"));
        std::fs::create_dir_all(&release).expect("mkdir");
        let b = release.join("kube-discovery");
        std::fs::write(&b, &stand_in).expect("write");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&b, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        run_step(
            package,
            w,
            &[
                ("VERSION", version),
                ("OS", os),
                ("ARCH", arch),
                ("TARGET", &format!("{os}-{arch}")),
            ],
        );
    }
    // The chart job's files, then the release job's steps.
    std::fs::write(w.join("dist/kube-discovery-0.1.0.tgz"), "chart").expect("write");
    std::fs::write(w.join("dist/kube-discovery.yaml"), "manifest").expect("write");
    run_step(
        step_script(&wf, "release", "checksums"),
        &w.join("dist"),
        &[("VERSION", version)],
    );
    run_step(
        step_script(&wf, "release", "krew manifest"),
        w,
        &[
            ("VERSION", version),
            ("GITHUB_REPOSITORY", "example/kube-discovery"),
        ],
    );

    for (os, arch) in PLATFORMS {
        let name = format!("kube-discovery_{version}_{os}_{arch}");
        let files = tar_list(&w.join(format!("dist/{name}.tar.gz")));
        for f in [
            "kube-discovery",
            "README.md",
            "cli.md",
            "completions/kube-discovery.bash",
            "completions/_kube-discovery",
            "completions/kube-discovery.fish",
            "completions/kubectl-discovery.bash",
            "completions/_kubectl-discovery",
            "man/man1/kube-discovery.1",
            "man/man1/kube-discovery-nodes.1",
        ] {
            assert!(
                files.contains(&format!("{name}/{f}")),
                "{name}: {f} in {files:?}"
            );
        }
        let plugin = format!("kubectl-discovery_{version}_{os}_{arch}");
        let files = tar_list(&w.join(format!("dist/{plugin}.tar.gz")));
        assert!(
            files.contains(&format!("{plugin}/kubectl-discovery")),
            "{files:?}"
        );
    }
    // Completions of the plugin name are the plugin's.
    let bash = std::fs::read_to_string(w.join("cli-files/completions/kubectl-discovery.bash"))
        .expect("plugin completion");
    assert!(
        bash.contains("kubectl-discovery") && !bash.contains(" kube-discovery\n"),
        "{bash}"
    );

    // The krew manifest: real checksums of the plugin archives.
    let manifest =
        std::fs::read_to_string(w.join("dist/kubectl-discovery.yaml")).expect("krew manifest");
    assert!(
        !manifest.contains('@'),
        "a placeholder is left:\n{manifest}"
    );
    let docs = parse_docs(&manifest);
    assert_eq!(docs.len(), 1, "{manifest}");
    assert_eq!(docs[0]["spec"]["version"], "v0.1.0");
    assert_eq!(
        docs[0]["spec"]["homepage"],
        "https://github.com/example/kube-discovery"
    );
    for (os, arch, p) in check_krew_platforms(&docs[0]) {
        let plugin = format!("kubectl-discovery_{version}_{os}_{arch}");
        assert_eq!(
            p["uri"],
            format!(
                "https://github.com/example/kube-discovery/releases/download/v{version}/{plugin}.tar.gz"
            )
        );
        let mut c = Command::new("sha256sum");
        c.arg(w.join(format!("dist/{plugin}.tar.gz")));
        let sum = String::from_utf8_lossy(&run(c).stdout)
            .split_whitespace()
            .next()
            .expect("sha256sum")
            .to_string();
        assert_eq!(p["sha256"], sum, "{plugin}");
        assert_eq!(p["files"][0]["from"], format!("{plugin}/kubectl-discovery"));
    }

    // The extracted plugin is the plugin: it names itself `kubectl discovery`.
    let x = w.join("x");
    std::fs::create_dir_all(&x).expect("mkdir");
    let mut c = Command::new("tar");
    c.arg("-xzf")
        .arg(w.join(format!(
            "dist/kubectl-discovery_{version}_linux_amd64.tar.gz"
        )))
        .arg("-C")
        .arg(&x);
    assert!(run(c).status.success());
    let mut c = Command::new(x.join(format!(
        "kubectl-discovery_{version}_linux_amd64/kubectl-discovery"
    )));
    c.arg("--help");
    let out = run(c);
    assert!(
        text(&out).contains("Usage: kubectl discovery"),
        "{}",
        text(&out)
    );
}

/// `deploy/krew/render.sh` refuses what would publish a broken manifest.
#[test]
fn krew_render_refuses_missing_checksums_and_bad_arguments() {
    let dir = tempfile::tempdir().expect("temp dir");
    let sums = dir.path().join("sums.txt");
    let line = |p: &str| format!("{}  ./kubectl-discovery_1.2.3_{p}.tar.gz\n", "a".repeat(64));
    std::fs::write(
        &sums,
        [
            line("linux_amd64"),
            line("linux_arm64"),
            line("darwin_arm64"),
        ]
        .concat(),
    )
    .expect("write");
    let render = |args: &[&str]| {
        let mut c = Command::new(repo_root().join("deploy/krew/render.sh"));
        c.args(args);
        run(c)
    };
    let s = sums.to_str().expect("path");
    let out = render(&["1.2.3", "o/r", s]);
    assert!(
        !out.status.success() && out.stdout.is_empty(),
        "{}",
        text(&out)
    );
    assert!(
        text(&out).contains("kubectl-discovery_1.2.3_darwin_amd64.tar.gz"),
        "{}",
        text(&out)
    );

    // With the fourth it renders.
    std::fs::write(
        &sums,
        [
            line("linux_amd64"),
            line("linux_arm64"),
            line("darwin_arm64"),
            line("darwin_amd64"),
        ]
        .concat(),
    )
    .expect("write");
    let out = render(&["1.2.3", "o/r", s]);
    assert!(out.status.success(), "{}", text(&out));
    // A checksum listed twice is ambiguous.
    let mut twice = std::fs::read_to_string(&sums).expect("read");
    twice.push_str(&format!(
        "{}  ./kubectl-discovery_1.2.3_linux_amd64.tar.gz\n",
        "b".repeat(64)
    ));
    std::fs::write(&sums, twice).expect("write");
    assert!(!render(&["1.2.3", "o/r", s]).status.success());

    for args in [
        &["v1.2.3", "o/r", s][..],
        &["1.2.3", "not a repo", s],
        &["1.2.3", "o/r", "/nonexistent/sums.txt"],
        &["1.2.3", "o/r"],
    ] {
        let out = render(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", text(&out));
        assert!(out.stdout.is_empty(), "{args:?}");
    }
}
