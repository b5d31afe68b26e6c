//! What a user sees with kubectl, on both API servers and with both kubectl
//! versions this project supports (v1.32, the machine's, and v1.34):
//! `kubectl get dsvc -A` prints the CRD's printer columns (READY from the
//! `Ready` condition) for an object the
//! controller wrote, and `kubectl explain dsvc.spec` describes the schema.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::controller_support;

use std::process::Command;

use controller_support::{Backend, Controller, Env, Options, repo_root};
use testenv::both_backends;

/// Runs `.tools/bin/<bin> args` with `kubeconfig`; returns stdout (fails on error).
fn kubectl(bin: &str, kubeconfig: &std::path::Path, args: &[&str]) -> String {
    let path = repo_root().join(".tools/bin").join(bin);
    assert!(
        path.exists(),
        "{} is missing: run `bash e2e/tools/install-tools.sh`",
        path.display()
    );
    let home = tempfile::tempdir().expect("home");
    let out = tokio::task::block_in_place(|| {
        Command::new(&path)
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .env("HOME", home.path())
            .output()
            .expect("run kubectl")
    });
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(
        out.status.success(),
        "{bin} {args:?} failed:\n{stdout}\n{stderr}"
    );
    stdout
}

#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_and_explain_discoveredservices(backend: Backend) {
    // TLS: kubectl 1.32 sends no bearer token over plain HTTP.
    let opts = Options {
        tls: true,
        ..Options::default()
    };
    let env = Env::start_with(backend, opts).await;
    env.namespace("shop").await;
    env.slice(
        "shop",
        "web",
        "web-a",
        &[("10.0.0.1", true), ("10.0.0.2", true), ("10.0.0.3", false)],
        &[("http", 8080), ("metrics", 9090)],
    )
    .await;
    let cfg = format!(
        "discovery:\n  kubernetes:\n{}    watch_endpoint_slices: true\nkube_discovery:\n  coalesce_window: 20ms\n",
        env.service_block(&env.admin_token())
    );
    let ctl = Controller::start(&env, "kubectl", &cfg, &[]).await;
    ctl.wait_ready().await;
    env.wait_nodes("shop", "web", "http", &["10.0.0.1", "10.0.0.2"])
        .await;
    let kc = env.kubeconfig(&env.admin_token());
    for bin in ["kubectl", "kubectl-1.34"] {
        let version = kubectl(bin, &kc, &["version", "--client", "-o", "json"]);
        let v: serde_json::Value = serde_json::from_str(&version).unwrap();
        let want = if bin == "kubectl" { "1.32" } else { "1.34" };
        assert!(
            v["clientVersion"]["gitVersion"]
                .as_str()
                .is_some_and(|g| g.starts_with(&format!("v{want}."))),
            "{bin} is kubectl {want}: {version}"
        );

        let table = kubectl(bin, &kc, &["get", "dsvc", "-A"]);
        let mut lines = table.lines();
        let header: Vec<&str> = lines
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        assert_eq!(
            header,
            [
                "NAMESPACE",
                "NAME",
                "READY",
                "PORTS",
                "NODES",
                "SOURCE",
                "AGE"
            ],
            "{bin}: {table}"
        );
        let row: Vec<&str> = lines
            .find(|l| l.starts_with("shop "))
            .unwrap_or_else(|| panic!("{bin}: no shop row:\n{table}"))
            .split_whitespace()
            .collect();
        assert_eq!(
            &row[..6],
            ["shop", "web", "True", "http,metrics", "4", "EndpointSlice"],
            "{bin}: {table}"
        );

        let explain = kubectl(bin, &kc, &["explain", "dsvc.spec"]);
        for needle in [
            "GROUP:      kubediscovery.io",
            "KIND:       DiscoveredService",
            "VERSION:    v1alpha1",
            "FIELD: spec <Object>",
            "ports\t<map[string][]Object>",
            "service\t<string> -required-",
            "version\t<string> -required-",
        ] {
            assert!(
                explain.contains(needle),
                "{bin} explain lacks {needle:?}:\n{explain}"
            );
        }
        let explain = kubectl(bin, &kc, &["explain", "discoveredservices.spec.ports"]);
        assert!(
            explain.contains("host\t<string> -required-"),
            "{bin}: {explain}"
        );
    }
    ctl.stop().await;
}
