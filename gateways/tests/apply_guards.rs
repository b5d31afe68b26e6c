//! The write guards of the sync commands, with stand-in gateway binaries
//! (small shell scripts that log their arguments and accept or reject the
//! config), so they run without nginx/HAProxy: a rejected config is never
//! left in place, and nothing is written or reloaded when the content did not
//! change. The real binaries are exercised by `e2e/tests/gateway_*.rs`.

use std::path::{Path, PathBuf};

use kube_discovery_gateways::haproxy::{HaproxyArgs, write_checked};
use kube_discovery_gateways::nginx::{Applied, NginxArgs, apply};
use kube_discovery_gateways::{EmptyPolicy, KubeArgs};

/// A fake binary: appends its arguments to `calls`; `-t`/`-c` fail when the
/// checked file (nginx: `upstreams.conf` in the same dir; haproxy: the last
/// `-f` argument) contains `BROKEN`.
fn fake(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    let script = format!(
        "#!/bin/sh\necho \"$@\" >> {calls}\nlast=\"\"\nfor a in \"$@\"; do last=\"$a\"; done\n\
case \"$*\" in\n  *\" -t\"*) grep -q BROKEN {dir}/upstreams.conf && {{ echo 'emerg: broken' >&2; exit 1; }}; exit 0;;\n\
  \"-c \"*) grep -q BROKEN \"$last\" && {{ echo 'ALERT: broken' >&2; exit 1; }}; exit 0;;\nesac\nexit 0\n",
        calls = dir.join("calls").display(),
        dir = dir.display()
    );
    std::fs::write(&p, script).expect("write fake");
    let status = std::process::Command::new("chmod")
        .arg("+x")
        .arg(&p)
        .status()
        .expect("chmod");
    assert!(status.success());
    p
}

fn calls(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("calls"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn kube() -> KubeArgs {
    KubeArgs {
        kubeconfig: None,
        context: None,
        namespace: None,
        selector: "a=b".into(),
    }
}

#[tokio::test]
async fn nginx_apply_validates_reloads_once_and_restores_on_rejection() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let args = NginxArgs {
        kube: kube(),
        services: vec!["web=default/web:http".parse().expect("svc")],
        output: dir.join("upstreams.conf"),
        nginx_bin: fake(dir, "nginx"),
        nginx_conf: Some(dir.join("nginx.conf")),
        nginx_prefix: None,
        empty_policy: EmptyPolicy::Keep,
        once: false,
    };
    let good = "upstream web {\n    server 10.0.0.1:80 weight=1;\n}\n";
    assert_eq!(apply(&args, good).await.expect("apply"), Applied::Reloaded);
    let c = calls(dir);
    assert_eq!(c.len(), 2, "{c:?}");
    assert!(
        c[0].ends_with("-t -q") && c[1].ends_with("-s reload"),
        "{c:?}"
    );
    assert!(c[0].contains("-c ") && c[0].contains("nginx.conf"), "{c:?}");

    // Same content: no nginx call at all.
    assert_eq!(apply(&args, good).await.expect("apply"), Applied::Unchanged);
    assert_eq!(calls(dir).len(), 2);

    // Rejected by `nginx -t`: error, previous file back, no reload.
    let err = apply(&args, "upstream web { BROKEN }\n")
        .await
        .expect_err("must be rejected");
    assert!(format!("{err:#}").contains("emerg: broken"), "{err:#}");
    assert_eq!(std::fs::read_to_string(&args.output).expect("read"), good);
    let c = calls(dir);
    assert_eq!(c.len(), 3, "{c:?}");
    assert!(!c[2].contains("reload"));

    // Rejected with no previous file: no file is left behind.
    std::fs::remove_file(&args.output).expect("rm");
    apply(&args, "BROKEN\n")
        .await
        .expect_err("must be rejected");
    assert!(!args.output.exists());
}

#[tokio::test]
async fn haproxy_file_is_checked_before_it_replaces_the_old_one() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let args = HaproxyArgs {
        kube: kube(),
        services: vec!["web=default/web:http".parse().expect("svc")],
        output: dir.join("backends.cfg"),
        haproxy_conf: vec![dir.join("haproxy.cfg")],
        haproxy_bin: fake(dir, "haproxy"),
        socket: dir.join("admin.sock"),
        master_socket: None,
        min_slots: 4,
        empty_policy: EmptyPolicy::Keep,
        once: false,
    };
    let good = "backend web\n    server s1 10.0.0.1:80 weight 1\n";
    assert!(write_checked(&args, good).await.expect("write"));
    let c = calls(dir);
    assert_eq!(c.len(), 1, "{c:?}");
    assert!(
        c[0].starts_with("-c -q -f ") && c[0].ends_with("backends.cfg.candidate"),
        "{c:?}"
    );
    assert!(
        !write_checked(&args, good).await.expect("unchanged"),
        "same content: not rewritten"
    );
    assert_eq!(calls(dir).len(), 1, "same content: not even checked");
    let err = write_checked(&args, "backend web\n    BROKEN\n")
        .await
        .expect_err("rejected");
    assert!(format!("{err:#}").contains("ALERT: broken"), "{err:#}");
    assert_eq!(std::fs::read_to_string(&args.output).expect("read"), good);
    assert!(!dir.join("backends.cfg.candidate").exists());
}
