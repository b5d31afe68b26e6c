//! `./test.sh`'s choice of API servers (`e2e/controlplane/select-backends.sh`)
//! on a machine without Go or without the Go module proxy: under CI it fails
//! loudly; outside CI it says what is missing and how to get it, then runs the
//! kube-sim tier only (or fails, when only the real tier was asked for).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../controlplane/select-backends.sh")
}

/// `PATH` without any directory that holds `go`.
fn path_without_go() -> String {
    std::env::var("PATH")
        .unwrap_or_default()
        .split(':')
        .filter(|d| !Path::new(d).join("go").exists())
        .collect::<Vec<_>>()
        .join(":")
}

/// Runs the script with `vars` and an empty binary folder (nothing built
/// yet); returns (exit code, stdout, stderr).
fn select(vars: &[(&str, &str)]) -> (i32, String, String) {
    let empty = tempfile::tempdir().unwrap();
    let mut cmd = Command::new("bash");
    cmd.arg(script())
        .env_remove("KD_E2E_APISERVER")
        .env_remove("CI")
        .env("KD_CONTROLPLANE_BIN", empty.path().join("none"));
    for (k, v) in vars {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn without_go() {
    let path = path_without_go();
    let no_go = [("PATH", path.as_str())];
    // Outside CI, both: warned, what is missing and where to get it, kube-sim only.
    let (code, out, err) = select(&no_go);
    assert_eq!((code, out.as_str()), (0, "kube-sim"), "{err}");
    assert!(
        err.contains("Go: not on PATH") && err.contains("https://go.dev/dl/"),
        "{err}"
    );
    assert!(err.contains("WARNING") && err.contains("SKIPPED"), "{err}");
    // Under CI: a failure.
    let (code, out, err) = select(&[no_go[0], ("CI", "true")]);
    assert_eq!((code, out.as_str()), (1, ""), "{err}");
    assert!(
        err.contains("FAIL: CI runs the e2e tests on the real API server"),
        "{err}"
    );
    // Only the real tier asked for: a failure too.
    let (code, _, err) = select(&[no_go[0], ("KD_E2E_APISERVER", "real")]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("FAIL: KD_E2E_APISERVER=real"), "{err}");
    // kube-sim asked for: Go is not needed at all.
    let (code, out, err) = select(&[no_go[0], ("KD_E2E_APISERVER", "kube-sim")]);
    assert_eq!((code, out.as_str()), (0, "kube-sim"), "{err}");
}

#[test]
fn without_the_module_proxy() {
    // Nothing listens on port 9 here: the proxy does not answer.
    let (code, out, err) = select(&[("GOPROXY", "http://127.0.0.1:9")]);
    assert_eq!((code, out.as_str()), (0, "kube-sim"), "{err}");
    assert!(
        err.contains("the Go module proxy http://127.0.0.1:9 does not answer"),
        "{err}"
    );
    let (code, _, err) = select(&[("GOPROXY", "http://127.0.0.1:9"), ("CI", "true")]);
    assert_eq!(code, 1, "{err}");
}

#[test]
fn a_wrong_value_is_refused() {
    let (code, _, err) = select(&[("KD_E2E_APISERVER", "kind")]);
    assert_eq!(code, 2);
    assert!(
        err.contains("must be kube-sim, real or both (got 'kind')"),
        "{err}"
    );
}
