//! The `kube-sim` binary: first stdout line, kubeconfig + CA files that the real
//! kubectl accepts over verified TLS, ServiceAccount tokens, clean SIGTERM exit.
//!
//! kube-sim only: this is the `kube-sim` binary's own command line.

use crate::sim_support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn binary_serves_tls_writes_kubeconfig_and_stops_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kube-sim"))
        .args([
            "--listen",
            "127.0.0.1:0",
            "--tls",
            "--admin-token",
            "cli-admin",
            "--sa-token",
            "default/robot",
        ])
        .arg("--kubeconfig-out")
        .arg(&kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn kube-sim");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = lines.next().expect("a first line").expect("utf-8");
    let url = first
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("first line was {first:?}"));
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");
    let token_line = lines.next().expect("token line").expect("utf-8");
    assert!(
        token_line.starts_with("token default/robot "),
        "{token_line}"
    );

    let kc = std::fs::read_to_string(&kubeconfig).expect("kubeconfig written");
    assert!(
        kc.contains(url) && kc.contains("certificate-authority-data"),
        "{kc}"
    );
    assert!(!kc.contains("insecure-skip-tls-verify"));
    let ca =
        std::fs::read_to_string(dir.path().join("kubeconfig.ca.crt")).expect("CA file written");
    assert!(ca.starts_with("-----BEGIN CERTIFICATE-----"));

    // The real kubectl verifies the server certificate with that CA.
    let kubectl = sim_support::tool("kubectl");
    let out = Command::new(&kubectl)
        .args(["get", "namespaces", "-o", "name"])
        .env("KUBECONFIG", &kubeconfig)
        .env("HOME", dir.path())
        .output()
        .expect("kubectl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("namespace/default"));
    // Without the CA, verification fails (the TLS is real).
    let out = Command::new(&kubectl)
        .args([
            "--server",
            url,
            "--token",
            "cli-admin",
            "--kubeconfig",
            "/dev/null",
            "get",
            "namespaces",
        ])
        .env("HOME", dir.path())
        .output()
        .expect("kubectl");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("certificate"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    stops_cleanly_on(&mut child, "TERM");
}

/// Sends `SIG<sig>` to kube-sim and asserts that it exits with status 0
/// within 10 s.
fn stops_cleanly_on(child: &mut std::process::Child, sig: &str) {
    let status = Command::new("kill")
        .args([&format!("-{sig}"), &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let exit = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "kube-sim did not stop on SIG{sig}"
        );
        #[expect(
            clippy::disallowed_methods,
            reason = "a synchronous test polling a child process"
        )]
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(exit.success(), "exit status {exit}");
}

#[test]
fn binary_rejects_bad_arguments() {
    let out = Command::new(env!("CARGO_BIN_EXE_kube-sim"))
        .args(["--listen", "not-an-address", "--admin-token", "x"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--listen"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(env!("CARGO_BIN_EXE_kube-sim"))
        .args(["--listen", "127.0.0.1:0"])
        .env_remove("KUBE_SIM_ADMIN_TOKEN")
        .output()
        .expect("run");
    assert!(!out.status.success(), "an admin token is required");
}

/// Every file is written before the first stdout line: a kubeconfig that cannot
/// be written fails the start-up with no `listening on` line at all (a caller
/// that waits for that line can rely on the files being there).
#[test]
fn binary_writes_its_files_before_announcing_the_url() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(env!("CARGO_BIN_EXE_kube-sim"))
        .args(["--listen", "127.0.0.1:0", "--admin-token", "x"])
        .arg("--kubeconfig-out")
        .arg(dir.path().join("missing-dir/kubeconfig"))
        .output()
        .expect("run");
    assert!(!out.status.success());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        !stdout.contains("listening on"),
        "announced before the kubeconfig was written: {stdout}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("kubeconfig"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// SIGINT right after the first line stops the server cleanly (exit 0), with the
/// kubeconfig already in place when the line was read.
#[test]
fn binary_stops_on_sigint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = dir.path().join("kubeconfig");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kube-sim"))
        .args(["--listen", "127.0.0.1:0", "--admin-token", "x", "--tls"])
        .arg("--kubeconfig-out")
        .arg(&kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn kube-sim");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = lines.next().expect("a first line").expect("utf-8");
    assert!(first.starts_with("listening on https://"), "{first}");
    assert!(
        kubeconfig.exists(),
        "kubeconfig missing when the URL was printed"
    );
    assert!(
        dir.path().join("kubeconfig.ca.crt").exists(),
        "CA missing when the URL was printed"
    );
    stops_cleanly_on(&mut child, "INT");
}
