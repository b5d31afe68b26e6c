//! `cargo deny` (deny.toml, cargo-deny pinned by
//! `e2e/tools/install-lint-tools.sh` into `.tools/cargo/bin`): the whole
//! workspace passes the licenses, bans and sources checks, and each check
//! fails when the policy is broken. The advisories check needs the RustSec
//! database from GitHub: `./test.sh` runs it when github.com answers and says
//! it skips it otherwise; `.github/workflows/ci.yaml` always runs it.

use crate::chart_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use chart_support::*;

fn cargo_deny() -> PathBuf {
    let p = repo_root().join(".tools/cargo/bin/cargo-deny");
    assert!(
        p.exists(),
        "{} is missing: run `bash e2e/tools/install-lint-tools.sh` (./test.sh does it)",
        p.display()
    );
    p
}

/// `cargo deny check licenses bans sources` with `config`. Not `--offline`:
/// `cargo metadata` needs the manifest of every locked crate, also of those
/// only other platforms build (windows-sys, ...), which a build here never
/// downloaded; crates.io is reachable. These checks fetch no database.
fn check(config: &Path) -> (bool, String) {
    let mut c = Command::new(cargo_deny());
    c.args(["--locked", "--config"])
        .arg(config)
        .args(["check", "licenses", "bans", "sources"])
        .current_dir(repo_root());
    let out = run(c);
    (out.status.success(), text(&out))
}

fn policy() -> String {
    std::fs::read_to_string(repo_root().join("deny.toml")).expect("deny.toml")
}

/// `deny.toml` with `from` replaced by `to` (which must occur once).
fn mutated(dir: &Path, from: &str, to: &str) -> PathBuf {
    let p = policy();
    assert_eq!(p.matches(from).count(), 1, "{from:?} once in deny.toml");
    let path = dir.join("deny.toml");
    std::fs::write(&path, p.replacen(from, to, 1)).expect("write");
    path
}

#[test]
fn workspace_passes_licenses_bans_and_sources() {
    let (ok, log) = check(&repo_root().join("deny.toml"));
    assert!(ok, "cargo deny check licenses bans sources:\n{log}");
    assert!(log.contains("bans ok, licenses ok, sources ok"), "{log}");
}

#[test]
fn each_check_fails_when_its_policy_is_broken() {
    let dir = tempfile::tempdir().expect("temp dir");
    // (what deny.toml says, what the broken policy says, what the report must name)
    let cases: [(&str, &str, &[&str]); 3] = [
        // MIT no longer allowed: most of the graph is refused.
        (
            "    \"MIT\",\n",
            "",
            &["licenses FAILED", "license = \"MIT"],
        ),
        // A banned crate the workspace uses.
        (
            "deny = [\n",
            "deny = [\n    { crate = \"serde_json\", reason = \"test\" },\n",
            &["bans FAILED", "serde_json"],
        ),
        // crates.io no longer an allowed registry.
        (
            "allow-registry = [\"https://github.com/rust-lang/crates.io-index\"]",
            "allow-registry = [\"https://example.invalid/index\"]",
            &["sources FAILED"],
        ),
    ];
    for (from, to, wants) in cases {
        let (ok, log) = check(&mutated(dir.path(), from, to));
        assert!(!ok, "{to:?} passed:\n{log}");
        for want in wants {
            assert!(log.contains(want), "{to:?}: {want:?} not in:\n{log}");
        }
    }
}

/// e2e no longer depends on rustls-pemfile, which it never used (its
/// `rustls_pemfile_der` test helper decodes PEM with base64).
#[test]
fn rustls_pemfile_is_gone() {
    let lock = std::fs::read_to_string(repo_root().join("Cargo.lock")).expect("Cargo.lock");
    assert!(
        !lock.contains("name = \"rustls-pemfile\"\n"),
        "rustls-pemfile is in Cargo.lock"
    );
}
