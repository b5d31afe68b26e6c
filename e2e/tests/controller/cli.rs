//! The `kube-discovery` CLI as a process: `crd`, `render`, `nodes`, config
//! errors (exit code 2, one line per problem naming the field, never the
//! token), `demo --duration`, the kubectl plugin (`kubectl discovery nodes`
//! and kubectl's completion of it, through the real kubectl v1.34), shell
//! completions loaded into bash and man pages rendered by groff.
//!
//! The `nodes` and plugin tests read from an API server and run on both
//! backends; `crd`, `render`, the config errors, completions and man pages
//! talk to no API server, and `demo` starts its own embedded kube-sim (that is
//! what the command does), so those have no backend to choose.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::controller_support;

use std::process::Stdio;
use std::time::Duration;

use controller_support::{Backend, Controller, Env, LIMIT, Options, bin, eventually, repo_root};
use kube::api::{Api, DynamicObject, ListParams};
use serde_json::{Value, json};
use testenv::both_backends;

/// Exit code (-1 when killed by a signal), stdout and stderr of a finished process.
fn outcome(out: std::process::Output) -> (i32, String, String) {
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

fn run(args: &[&str], stdin: Option<&str>) -> (i32, String, String) {
    use std::io::Write;
    let mut child = std::process::Command::new(bin())
        .args(args)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn kube-discovery");
    if let Some(s) = stdin {
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(s.as_bytes())
            .expect("write stdin");
    } else {
        drop(child.stdin.take());
    }
    let out = child.wait_with_output().expect("wait");
    outcome(out)
}

/// Async variant for tests with an API server: a blocking wait would stall
/// the runtime that serves kube-sim in-process (and the real backend's fault
/// proxy) that the child process talks to.
async fn run_async(args: &[&str]) -> (i32, String, String) {
    let out = tokio::process::Command::new(bin())
        .args(args)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run kube-discovery");
    outcome(out)
}

#[test]
fn crd_prints_the_committed_crd() {
    let (code, out, err) = run(&["crd"], None);
    assert_eq!(code, 0, "{err}");
    let want = std::fs::read_to_string(repo_root().join("crds/discoveredservices.yaml"))
        .expect("crd file");
    assert_eq!(out, want);
}

#[test]
fn config_errors_exit_2_name_the_field_and_hide_the_token() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.yaml");
    std::fs::write(
        &cfg,
        "discovery:\n  kubernetes:\n    - id: BAD_ID\n      service: {host: 10.0.0.1, port: 99999}\n      client: {token: \"SuperSecret!!value\"}\n",
    )
    .unwrap();
    let (code, out, err) = run(&["run", "--config", cfg.to_str().unwrap()], None);
    assert_eq!(code, 2, "stdout: {out}\nstderr: {err}");
    assert!(err.contains("discovery.kubernetes[0].id"), "{err}");
    assert!(
        err.contains("discovery.kubernetes[0].service.port"),
        "{err}"
    );
    assert!(
        err.contains("discovery.kubernetes[0].client.token"),
        "{err}"
    );
    assert!(!err.contains("SuperSecret"), "the token leaked: {err}");

    // Unset ${VAR}.
    std::fs::write(&cfg, "discovery:\n  kubernetes:\n    service: {host: \"${KD_E2E_UNSET_VAR}\", port: 443}\n    client: {token: abc}\n").unwrap();
    let (code, _, err) = run(&["run", "--config", cfg.to_str().unwrap()], None);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("discovery.kubernetes.service.host") && err.contains("KD_E2E_UNSET_VAR"),
        "{err}"
    );

    // A missing file is an error too (not a panic).
    let (code, _, err) = run(&["run", "--config", "/nonexistent/kd.yaml"], None);
    assert_ne!(code, 0);
    assert!(err.contains("/nonexistent/kd.yaml"), "{err}");
}

const SOURCES: &str = r#"
apiVersion: v1
kind: List
items:
  - apiVersion: v1
    kind: Endpoints
    metadata: {name: plat-dev, namespace: default}
    subsets:
      - addresses: [{ip: 10.5.10.110}, {ip: 10.5.10.109}]
        notReadyAddresses: [{ip: 10.5.10.111}]
        ports: [{name: port, port: 3306}]
---
apiVersion: v1
kind: Endpoints
metadata: {name: web, namespace: shop}
subsets:
  - addresses: [{ip: 10.0.0.1}]
    ports: [{name: http, port: 80}]
"#;

#[test]
fn render_prints_objects_and_nodes_like_the_controller() {
    let (code, out, err) = run(&["render", "-f", "-", "-o", "json"], Some(SOURCES));
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).expect("JSON output");
    let items = v["items"].as_array().expect("a List");
    assert_eq!(items.len(), 2, "{out}");
    let plat = items
        .iter()
        .find(|i| i["metadata"]["name"] == "plat-dev")
        .expect("plat-dev");
    assert_eq!(plat["kind"], "DiscoveredService");
    assert_eq!(plat["metadata"]["namespace"], "default");
    assert_eq!(
        plat["spec"]["ports"]["port"],
        json!([{"host": "10.5.10.109", "port": 3306, "weight": 50}, {"host": "10.5.10.110", "port": 3306, "weight": 50}])
    );

    let (code, out, err) = run(
        &["render", "-f", "-", "--nodes", "default/plat-dev:port"],
        Some(SOURCES),
    );
    assert_eq!(code, 0, "{err}");
    let nodes: Value = serde_json::from_str(&out).expect("nodes JSON");
    assert_eq!(
        nodes,
        json!([{"host": "10.5.10.109", "port": 3306, "weight": 50}, {"host": "10.5.10.110", "port": 3306, "weight": 50}])
    );

    // The same config as the controller: default_weight applies.
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("c.yaml");
    std::fs::write(&cfg, "discovery:\n  kubernetes:\n    service: {host: 10.0.0.1, port: 443}\n    client: {token: abc}\n    default_weight: 7\n").unwrap();
    let (code, out, err) = run(
        &[
            "render",
            "-f",
            "-",
            "--config",
            cfg.to_str().unwrap(),
            "--nodes",
            "shop/web:http",
        ],
        Some(SOURCES),
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap(),
        json!([{"host": "10.0.0.1", "port": 80, "weight": 7}])
    );

    // YAML output is multi-document.
    let (code, out, _) = run(&["render", "-f", "-"], Some(SOURCES));
    assert_eq!(code, 0);
    assert!(
        out.contains("kind: DiscoveredService") && out.contains("\n---\n"),
        "{out}"
    );

    // Malformed input and an unknown service are clear errors.
    let (code, _, err) = run(&["render", "-f", "-"], Some("kind: [unclosed"));
    assert_eq!(code, 2, "{err}");
    let (code, _, err) = run(
        &["render", "-f", "-", "--nodes", "default/nope:port"],
        Some(SOURCES),
    );
    assert_ne!(code, 0);
    assert!(err.contains("default/nope"), "{err}");
}

/// The Endpoints `default/plat-dev` (10.5.10.109 and .110, port `port`
/// 3306) and a controller (`name`) that has published its DiscoveredService.
async fn plat_dev_published(env: &Env, name: &str) -> Controller {
    env.namespace("default").await;
    env.endpoints(
        "default",
        "plat-dev",
        &["10.5.10.109", "10.5.10.110"],
        &[("port", 3306)],
        json!({}),
    )
    .await;
    let cfg = format!(
        "discovery:\n  kubernetes:\n{}kube_discovery:\n  coalesce_window: 20ms\n",
        env.service_block(&env.admin_token())
    );
    let ctl = Controller::start(env, name, &cfg, &[]).await;
    ctl.wait_ready().await;
    env.wait_nodes(
        "default",
        "plat-dev",
        "port",
        &["10.5.10.109", "10.5.10.110"],
    )
    .await;
    ctl
}

#[both_backends]
#[tokio::test]
async fn nodes_command_reads_discovered_services_from_the_api_server(backend: Backend) {
    let env = Env::start(backend).await;
    let ctl = plat_dev_published(&env, "nodescmd").await;
    let kc = env.kubeconfig(&env.admin_token());
    let (code, out, err) = run_async(&[
        "nodes",
        "default/plat-dev:port",
        "--kubeconfig",
        kc.to_str().unwrap(),
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap(),
        json!([{"host": "10.5.10.109", "port": 3306, "weight": 50}, {"host": "10.5.10.110", "port": 3306, "weight": 50}])
    );
    let (code, _, err) = run_async(&[
        "nodes",
        "default/plat-dev:nope",
        "--kubeconfig",
        kc.to_str().unwrap(),
    ])
    .await;
    assert_ne!(code, 0, "unknown port must fail");
    assert!(err.contains("default/plat-dev:nope"), "{err}");
    ctl.stop().await;
}

#[both_backends]
#[tokio::test]
async fn nodes_command_reads_the_configmap_snapshot_via_api_and_mounted_files(backend: Backend) {
    use k8s_openapi::api::core::v1::ConfigMap;
    let env = Env::start(backend).await;
    env.namespace("default").await;
    env.namespace("kd").await;
    env.endpoints(
        "default",
        "plat-dev",
        &["10.5.10.109", "10.5.10.110"],
        &[("port", 3306)],
        json!({}),
    )
    .await;
    let cfg = format!(
        "discovery:\n  kubernetes:\n{}kube_discovery:\n  coalesce_window: 20ms\n  sinks:\n    configmap: {{enabled: true, namespace: kd, name: nodes}}\n",
        env.service_block(&env.admin_token())
    );
    let ctl = Controller::start(&env, "nodessnap", &cfg, &[]).await;
    ctl.wait_ready().await;
    let kc = env.kubeconfig(&env.admin_token());
    let kc = kc.to_str().unwrap();
    let want = json!([{"host": "10.5.10.109", "port": 3306, "weight": 50}, {"host": "10.5.10.110", "port": 3306, "weight": 50}]);
    let cms: Api<ConfigMap> = Api::namespaced(env.admin.clone(), "kd");
    eventually("snapshot index written", LIMIT, || {
        let cms = cms.clone();
        async move { cms.get_opt("nodes").await.ok().flatten().map(|_| ()) }
    })
    .await;

    // Through the API.
    let (code, out, err) = run_async(&[
        "nodes",
        "default/plat-dev:port",
        "--snapshot",
        "kd/nodes",
        "--kubeconfig",
        kc,
    ])
    .await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap(), want);
    let (code, _, err) = run_async(&[
        "nodes",
        "default/plat-dev:nope",
        "--snapshot",
        "kd/nodes",
        "--kubeconfig",
        kc,
    ])
    .await;
    assert_ne!(code, 0, "unknown port must fail");
    assert!(err.contains("default/plat-dev:nope"), "{err}");
    let (code, _, err) = run_async(&[
        "nodes",
        "default/plat-dev:port",
        "--snapshot",
        "kd",
        "--kubeconfig",
        kc,
    ])
    .await;
    assert_ne!(code, 0);
    assert!(
        err.contains("--snapshot") && err.contains("NAMESPACE/NAME"),
        "{err}"
    );

    // As a pod would see it: every key of the snapshot ConfigMaps as files in one dir.
    let dir = tempfile::tempdir().unwrap();
    let all = cms
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=kube-discovery"))
        .await
        .unwrap();
    assert!(!all.items.is_empty());
    for cm in all.items {
        for (k, v) in cm.data.unwrap_or_default() {
            std::fs::write(dir.path().join(k), v).unwrap();
        }
    }
    let d = dir.path().to_str().unwrap();
    let (code, out, err) =
        run_async(&["nodes", "default/plat-dev:port", "--snapshot-dir", d]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap(), want);
    // A shard that does not match the index is refused, never silently used.
    let shard = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().unwrap() != "index.json")
        .expect("a shard file");
    std::fs::write(&shard, "[]").unwrap();
    let (code, _, err) = run_async(&["nodes", "default/plat-dev:port", "--snapshot-dir", d]).await;
    assert_ne!(code, 0, "a corrupt shard must fail");
    assert!(err.contains("shard") || err.contains("snapshot"), "{err}");
    ctl.stop().await;
}

#[tokio::test]
async fn demo_runs_for_a_duration_with_live_updates_and_exits_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("demo.out");
    let child = tokio::process::Command::new(bin())
        .args([
            "demo",
            "--duration",
            "8",
            "--interval",
            "1",
            "--http-addr",
            "127.0.0.1:0",
            "--dir",
        ])
        .arg(dir.path())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(dir.path().join("demo.err")).unwrap())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn demo");
    let kc = dir.path().join("kubeconfig");
    let printed = eventually("demo prints its commands", LIMIT, || async {
        let s = std::fs::read_to_string(&out_path).ok()?;
        s.contains("kubectl get dsvc -A").then_some(s)
    })
    .await;
    assert!(printed.contains(&kc.display().to_string()), "{printed}");
    assert!(
        printed.contains("/v1/discovery/kubernetes/dump"),
        "{printed}"
    );

    // Look around like a user would: the DiscoveredServices exist and change.
    let kcfg = kube::config::Kubeconfig::read_from(&kc).expect("kubeconfig");
    let cfg = kube::Config::from_custom_kubeconfig(kcfg, &Default::default())
        .await
        .expect("config");
    let client = kube::Client::try_from(cfg).expect("client");
    let api: Api<DynamicObject> = Api::all_with(client, &controller_support::dsvc_resource());
    let counts = std::sync::Mutex::new(std::collections::BTreeSet::new());
    eventually("shop/web changes its node count", LIMIT, || async {
        let list = api.list(&ListParams::default()).await.ok()?;
        let web = list
            .items
            .iter()
            .find(|o| o.metadata.name.as_deref() == Some("web"))?;
        let n = web.data["spec"]["ports"]["http"].as_array().map(Vec::len)?;
        let mut c = counts.lock().unwrap();
        c.insert(n);
        (c.len() >= 2).then_some(())
    })
    .await;
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("demo ended")
        .expect("wait");
    assert!(status.status.success(), "demo exit {:?}", status.status);
    // Logs to a file (not a terminal) are plain text: no colour escapes.
    let logs = std::fs::read_to_string(dir.path().join("demo.err")).unwrap();
    assert!(logs.contains(" INFO "), "the controller logged:\n{logs}");
    assert!(
        !logs.contains('\u{1b}'),
        "ANSI escapes in piped logs:\n{logs}"
    );
}

/// A directory holding `kube-discovery`, `kubectl-discovery` and
/// `kubectl_complete-discovery`, symlinks to the binary under test (as `ln -s`
/// or krew installs them), to put first on PATH.
fn names_on_path() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for name in [
        "kube-discovery",
        "kubectl-discovery",
        "kubectl_complete-discovery",
    ] {
        std::os::unix::fs::symlink(bin(), dir.path().join(name)).unwrap();
    }
    dir
}

fn path_with(dir: &std::path::Path) -> String {
    format!(
        "{}:{}",
        dir.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// The real kubectl v1.34 with only `plugins` (and the system) on PATH.
async fn kubectl_plugin(
    plugins: &std::path::Path,
    kubeconfig: &std::path::Path,
    args: &[&str],
) -> (i32, String, String) {
    let kubectl = repo_root().join(".tools/bin/kubectl-1.34");
    assert!(
        kubectl.exists(),
        "{} is missing: run `bash e2e/tools/install-tools.sh`",
        kubectl.display()
    );
    let home = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new(&kubectl)
        .args(args)
        .env("PATH", format!("{}:/usr/bin:/bin", plugins.display()))
        .env("KUBECONFIG", kubeconfig)
        .env("HOME", home.path())
        .stdin(Stdio::null())
        .output()
        .await
        .expect("run kubectl");
    outcome(out)
}

/// `kubectl discovery nodes ns/name:port`: kubectl finds `kubectl-discovery`
/// on PATH, runs it with the user's KUBECONFIG, and it prints the nodes the
/// controller wrote; help and usage errors name it `kubectl discovery`, and
/// its exit codes reach the shell through kubectl.
#[both_backends]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_discovery_plugin_prints_nodes(backend: Backend) {
    // TLS: kubectl sends no bearer token over plain HTTP.
    let opts = Options {
        tls: true,
        ..Options::default()
    };
    let env = Env::start_with(backend, opts).await;
    let ctl = plat_dev_published(&env, "plugin").await;
    let kc = env.kubeconfig(&env.admin_token());
    let plugins = names_on_path();

    let (code, out, err) = kubectl_plugin(plugins.path(), &kc, &["plugin", "list"]).await;
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!("{}/kubectl-discovery", plugins.path().display())),
        "kubectl lists the plugin:\n{out}{err}"
    );

    let (code, out, err) = kubectl_plugin(
        plugins.path(),
        &kc,
        &["discovery", "nodes", "default/plat-dev:port"],
    )
    .await;
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap_or_else(|e| panic!("{e}: {out}")),
        json!([{"host": "10.5.10.109", "port": 3306, "weight": 50}, {"host": "10.5.10.110", "port": 3306, "weight": 50}])
    );

    // An unknown port: the plugin's error and non-zero exit, through kubectl.
    let (code, _, err) = kubectl_plugin(
        plugins.path(),
        &kc,
        &["discovery", "nodes", "default/plat-dev:nope"],
    )
    .await;
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("default/plat-dev:nope"), "{err}");

    // Help and usage errors name the command as the user typed it.
    let (code, out, err) = kubectl_plugin(plugins.path(), &kc, &["discovery", "--help"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("Usage: kubectl discovery [OPTIONS] <COMMAND>"),
        "{out}"
    );
    assert!(!out.contains("kube-discovery ["), "{out}");
    let (code, _, err) = kubectl_plugin(plugins.path(), &kc, &["discovery", "nodes"]).await;
    assert_eq!(code, 2, "{err}");
    // (With KUBECONFIG set, clap shows `--kubeconfig <KUBECONFIG>` in it.)
    assert!(err.contains("Usage: kubectl discovery nodes "), "{err}");

    // kubectl's own completion (`kubectl discovery <TAB>`, what its bash/zsh
    // scripts ask through `kubectl __complete`) runs kubectl_complete-discovery.
    let (code, out, err) =
        kubectl_plugin(plugins.path(), &kc, &["__complete", "discovery", ""]).await;
    assert_eq!(code, 0, "{err}");
    for s in ["nodes", "render", "crd", "completion", "man"] {
        assert!(
            out.lines().any(|l| l.split('\t').next() == Some(s)),
            "{s}:\n{out}{err}"
        );
    }
    assert_eq!(out.lines().last(), Some(":4"), "{out}");
    let (code, out, err) = kubectl_plugin(
        plugins.path(),
        &kc,
        &["__complete", "discovery", "nodes", "--snap"],
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let words: Vec<&str> = out.lines().filter_map(|l| l.split('\t').next()).collect();
    assert_eq!(words, ["--snapshot", "--snapshot-dir", ":4"], "{out}{err}");
    ctl.stop().await;
}

/// Runs `script` in `bash --norc` with both names on PATH.
fn bash(script: &str) -> (i32, String, String) {
    let names = names_on_path();
    let out = std::process::Command::new("bash")
        .args(["--norc", "--noprofile", "-c", script])
        .env("PATH", path_with(names.path()))
        .stdin(Stdio::null())
        .output()
        .expect("run bash");
    outcome(out)
}

/// The bash completion of both names loads into bash, registers a function
/// for the name, and that function completes subcommands, shells and flags.
#[test]
fn bash_completion_loads_and_completes_both_names() {
    for name in ["kube-discovery", "kubectl-discovery"] {
        // `complete -p NAME` prints the registration; then call the registered
        // function the way bash does on TAB: COMP_WORDS/COMP_CWORD and
        // (command, word, previous word).
        let script = format!(
            r#"set -e
source <({name} completion bash)
complete -p {name}
fn="$(complete -p {name} | sed -n 's/.* -F \([^ ]*\) .*/\1/p')"
comp() {{
  COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); COMP_LINE="$*"; COMP_POINT=${{#COMP_LINE}}
  COMPREPLY=()
  "$fn" {name} "${{COMP_WORDS[COMP_CWORD]}}" "${{COMP_WORDS[COMP_CWORD-1]}}"
  echo "$*: ${{COMPREPLY[*]}}"
}}
comp {name} ''
comp {name} completion ''
comp {name} nodes --snap
comp {name} sync ''
"#
        );
        let (code, out, err) = bash(&script);
        assert_eq!(code, 0, "{name}:\n{out}{err}");
        assert!(err.is_empty(), "{name}: bash complained:\n{err}");
        let line = |prefix: &str| -> Vec<String> {
            let l = out
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{name} {prefix}: ")))
                .unwrap_or_else(|| panic!("no completion of {prefix:?}:\n{out}"));
            l.split_whitespace().map(str::to_string).collect()
        };
        assert!(
            out.lines()
                .next()
                .is_some_and(|l| l.starts_with("complete ")
                    && l.contains(" -F _")
                    && l.ends_with(&format!(" {name}"))),
            "{out}"
        );
        let subcommands = line("");
        for s in [
            "run",
            "crd",
            "render",
            "nodes",
            "demo",
            "sync",
            "completion",
            "man",
        ] {
            assert!(
                subcommands.iter().any(|c| c == s),
                "{name}: {s} in {subcommands:?}"
            );
        }
        let shells: Vec<String> = line("completion ")
            .into_iter()
            .filter(|w| !w.starts_with('-'))
            .collect();
        assert_eq!(
            shells,
            ["bash", "elvish", "fish", "powershell", "zsh"],
            "{name}"
        );
        assert_eq!(
            line("nodes --snap"),
            ["--snapshot", "--snapshot-dir"],
            "{name}"
        );
        let gateways = line("sync ");
        for g in ["nginx", "haproxy"] {
            assert!(
                gateways.iter().any(|c| c == g),
                "{name}: {g} in {gateways:?}"
            );
        }
    }
    // An unknown shell is a usage error naming the valid ones.
    let (code, _, err) = run(&["completion", "tcsh"], None);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("bash") && err.contains("zsh"), "{err}");
}

/// groff (what `man` runs) renders every generated page without a warning;
/// `man -l` shows the main page with its sections and subcommands.
#[test]
fn man_pages_render_with_groff_and_man() {
    let groff = |page: &[u8]| -> (bool, String, String) {
        use std::io::Write;
        let mut child = std::process::Command::new("groff")
            .args(["-man", "-Tutf8", "-ww"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect(
                "groff is missing: run `bash e2e/tools/install-lint-tools.sh` (Debian groff-base)",
            );
        child.stdin.take().unwrap().write_all(page).unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, page, err) = run(&["man"], None);
    assert_eq!(code, 0, "{err}");
    let (ok, text, warnings) = groff(page.as_bytes());
    assert!(ok && warnings.is_empty(), "groff: {warnings}");
    // groff's terminal output marks bold/underline with backspaces.
    let plain: String = {
        let mut s = String::new();
        for c in text.chars() {
            if c == '\u{8}' {
                s.pop();
            } else {
                s.push(c);
            }
        }
        s
    };
    for want in [
        "NAME",
        "SYNOPSIS",
        "OPTIONS",
        "SUBCOMMANDS",
        "kube-discovery-nodes(1)",
        "--log-format",
    ] {
        assert!(plain.contains(want), "{want} in:\n{plain}");
    }
    // A broken page is reported (the check can fail).
    let (_, _, warnings) = groff(b".TH x 1\n.SH NAME\n.BOGUS\n\\f\n");
    assert!(!warnings.is_empty(), "groff warns about a broken page");

    // `man --dir`: one page per command, each rendering cleanly.
    let dir = tempfile::tempdir().unwrap();
    let man1 = dir.path().join("share/man/man1");
    let (code, out, err) = run(&["man", "--dir", man1.to_str().unwrap()], None);
    assert_eq!(code, 0, "{err}");
    let mut pages: Vec<String> = std::fs::read_dir(&man1)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .collect();
    pages.sort();
    for p in [
        "kube-discovery.1",
        "kube-discovery-run.1",
        "kube-discovery-nodes.1",
        "kube-discovery-render.1",
        "kube-discovery-completion.1",
        "kube-discovery-man.1",
        "kube-discovery-sync-nginx.1",
        "kube-discovery-sync-haproxy.1",
    ] {
        assert!(pages.iter().any(|x| x == p), "{p} in {pages:?}");
        assert!(out.contains(&man1.join(p).display().to_string()), "{out}");
    }
    for p in &pages {
        let (ok, _, warnings) = groff(&std::fs::read(man1.join(p)).unwrap());
        assert!(ok && warnings.is_empty(), "{p}: {warnings}");
    }
    // man itself finds the page in a MANPATH tree.
    let out = std::process::Command::new("man")
        .args(["-P", "cat", "kube-discovery-nodes"])
        .env("MANPATH", dir.path().join("share/man"))
        .env("MANWIDTH", "100")
        .output()
        .expect("run man");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && shown.contains("--snapshot-dir"),
        "man kube-discovery-nodes:\n{shown}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A directory that cannot be created: exit 1 naming it, no panic.
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, "").unwrap();
    let (code, _, err) = run(
        &["man", "--dir", blocker.join("man1").to_str().unwrap()],
        None,
    );
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("file/man1") && !err.contains("panicked"),
        "{err}"
    );
}
