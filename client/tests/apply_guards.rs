//! The write guards of the sync commands, with stand-in gateway binaries
//! (small shell scripts that log their arguments and accept or reject the
//! config), so they run without nginx/HAProxy: a rejected config is never
//! left in place, and nothing is written or reloaded when the content did not
//! change. The real binaries are exercised by `e2e/tests/gateway_*.rs`.

use std::path::{Path, PathBuf};

use kube_discovery_client::policy::EmptyPolicy;
use kube_discovery_client::sync::KubeArgs;
use kube_discovery_client::sync::haproxy::{HaproxyArgs, write_checked};
use kube_discovery_client::sync::nginx::{Applied, NginxArgs, apply};

/// A fake binary: appends its arguments to `calls`. nginx `-t` checks the
/// `-c` file and every file it includes, recursively (globs expanded by the
/// shell, as nginx does; several includes on one line), failing when one
/// contains `BROKEN`; it appends the `-c` file to `checked-conf` and what the
/// LIVE `upstreams.conf` held at that moment to `live-at-check` (so a test
/// sees whether an unvalidated file was ever in place). haproxy `-c` fails
/// when the last `-f` argument contains `BROKEN`.
fn fake(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    let script = r#"#!/bin/sh
echo "$@" >> @CALLS@
last=""
conf=""
prev=""
for a in "$@"; do last="$a"; [ "$prev" = -c ] && conf="$a"; prev="$a"; done
check() {
  grep -q BROKEN "$1" && { echo "emerg: broken in $1" >&2; exit 1; }
  for f in $(grep -o 'include  *"*[^";]*' "$1" | sed 's/^include  *"*//'); do check "$f"; done
}
case "$*" in
  *" -t"*) { cat @DIR@/upstreams.conf 2>/dev/null; echo '--'; } >> @DIR@/live-at-check
    { cat "$conf"; echo '--'; } >> @DIR@/checked-conf
    check "$conf"; exit 0;;
  "-c "*) grep -q BROKEN "$last" && { echo 'ALERT: broken' >&2; exit 1; }; exit 0;;
esac
exit 0
"#
    .replace("@CALLS@", &dir.join("calls").display().to_string())
    .replace("@DIR@", &dir.display().to_string());
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
        fixed_namespace: None,
        instance: None,
        selector: "a=b".into(),
    }
}

fn nginx_args(dir: &Path) -> NginxArgs {
    NginxArgs {
        kube: kube(),
        services: vec!["web=default/web:http".parse().expect("svc")],
        output: dir.join("upstreams.conf"),
        nginx_bin: fake(dir, "nginx"),
        nginx_conf: Some(dir.join("nginx.conf")),
        nginx_prefix: None,
        empty_policy: EmptyPolicy::Keep,
        once: false,
    }
}

fn live_at_check(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("live-at-check")).unwrap_or_default()
}

/// The documented setup (the main config includes the output directly): a
/// candidate is checked through a copy of the main config that includes the
/// candidate, so a rejected text never appears at the live path, not even
/// while `nginx -t` runs.
#[tokio::test]
async fn nginx_apply_validates_a_candidate_before_it_replaces_the_live_file() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let args = nginx_args(dir);
    std::fs::write(
        dir.join("nginx.conf"),
        format!(
            "events {{}}\nhttp {{\n  include {};\n}}\n",
            args.output.display()
        ),
    )
    .expect("nginx.conf");
    let good = "upstream web {\n    server 10.0.0.1:80 weight=1;\n}\n";
    assert_eq!(apply(&args, good).await.expect("apply"), Applied::Reloaded);
    let c = calls(dir);
    assert_eq!(c.len(), 2, "{c:?}");
    assert!(
        c[0].ends_with("-t -q") && c[1].ends_with("-s reload"),
        "{c:?}"
    );
    assert!(
        c[0].contains("-c ")
            && c[0].contains(&format!(".kd-check.{}.nginx.conf", std::process::id())),
        "checked through the copy of the main config: {c:?}"
    );
    assert!(
        c[1].contains("-c ") && c[1].ends_with("/nginx.conf -s reload"),
        "reloaded with the real main config: {c:?}"
    );
    assert_eq!(std::fs::read_to_string(&args.output).expect("read"), good);
    assert_eq!(
        live_at_check(dir),
        "--\n",
        "no live file while the first one was checked"
    );

    // Same content: no nginx call at all.
    assert_eq!(apply(&args, good).await.expect("apply"), Applied::Unchanged);
    assert_eq!(calls(dir).len(), 2);

    // Rejected: error, the live file held the good text during the check and still does.
    let err = apply(&args, "upstream web { BROKEN }\n")
        .await
        .expect_err("must be rejected");
    assert!(format!("{err:#}").contains("emerg: broken"), "{err:#}");
    assert!(
        format!("{err:#}").contains("previous content kept"),
        "{err:#}"
    );
    assert_eq!(std::fs::read_to_string(&args.output).expect("read"), good);
    let seen = live_at_check(dir);
    assert!(
        !seen.contains("BROKEN"),
        "the rejected text was at the live path: {seen}"
    );
    assert!(seen.ends_with(&format!("{good}--\n")), "{seen}");
    let c = calls(dir);
    assert_eq!(c.len(), 3, "{c:?}");
    assert!(!c[2].contains("reload"));
    // Nothing left behind: no candidate, no check copy.
    let mut left: Vec<String> = std::fs::read_dir(dir)
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left,
        [
            "calls",
            "checked-conf",
            "live-at-check",
            "nginx",
            "nginx.conf",
            "upstreams.conf"
        ],
        "temp files left"
    );

    // Rejected with no previous file: no file appears.
    std::fs::remove_file(&args.output).expect("rm");
    apply(&args, "BROKEN\n")
        .await
        .expect_err("must be rejected");
    assert!(!args.output.exists());
    assert!(!dir.join(".upstreams.conf.kd-candidate").exists());
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut left: Vec<String> = std::fs::read_dir(dir)
        .expect("dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    left
}

/// Debian's layout: the main config reaches the output only through a glob
/// include (`include ../*.conf;`, relative to the main config's directory).
/// The check copy lists every match explicitly with the candidate in the
/// output's place, so a rejected text never appears at the live path, and
/// the other matched files are still part of the check.
#[tokio::test]
async fn nginx_apply_validates_a_candidate_reached_through_a_glob_include() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let mut args = nginx_args(dir);
    std::fs::create_dir(dir.join("etc")).expect("etc");
    let main = dir.join("etc/nginx.conf");
    args.nginx_conf = Some(main.clone());
    std::fs::write(&main, "events {}\nhttp {\n  include ../*.conf;\n}\n").expect("nginx.conf");
    std::fs::write(dir.join("a.conf"), "# a\n").expect("a.conf");
    std::fs::write(dir.join("z.conf"), "# z\n").expect("z.conf");
    // `../*.conf` from `<dir>/etc`, as nginx's glob(3) spells its matches.
    let g = format!("{}/etc/..", dir.display());

    // First run (no output yet): the glob will read it, so it is checked as a candidate.
    let good = "upstream web {\n    server 10.0.0.1:80 weight=1;\n}\n";
    assert_eq!(apply(&args, good).await.expect("apply"), Applied::Reloaded);
    let c = calls(dir);
    assert_eq!(c.len(), 2, "{c:?}");
    assert!(
        c[0].contains(&format!(
            ".kd-check.{}.nginx.conf -t -q",
            std::process::id()
        )),
        "checked through the copy of the main config, not in place: {c:?}"
    );
    assert!(c[1].ends_with("/etc/nginx.conf -s reload"), "{c:?}");
    let checked = std::fs::read_to_string(dir.join("checked-conf")).expect("checked-conf");
    assert_eq!(
        checked,
        format!(
            "events {{}}\nhttp {{\n  include \"{g}/a.conf\"; include \"{g}/.upstreams.conf.kd-candidate\"; include \"{g}/z.conf\";\n}}\n--\n"
        ),
        "every match in order (spelled as the glob spells it), the output's entry swapped for the candidate"
    );
    assert_eq!(live_at_check(dir), "--\n");
    assert_eq!(std::fs::read_to_string(&args.output).expect("read"), good);

    // Rejected: the live file held the good text during the check and still does.
    let err = apply(&args, "upstream web { BROKEN }\n")
        .await
        .expect_err("must be rejected");
    assert!(format!("{err:#}").contains("emerg: broken in"), "{err:#}");
    assert!(
        format!("{err:#}").contains("previous content kept"),
        "{err:#}"
    );
    assert_eq!(std::fs::read_to_string(&args.output).expect("read"), good);
    let seen = live_at_check(dir);
    assert!(
        !seen.contains("BROKEN"),
        "the rejected text was at the live path: {seen}"
    );
    assert!(seen.ends_with(&format!("{good}--\n")), "{seen}");
    let checked = std::fs::read_to_string(dir.join("checked-conf")).expect("checked-conf");
    assert!(
        checked.ends_with(&format!(
            "include \"{g}/a.conf\"; include \"{g}/.upstreams.conf.kd-candidate\"; include \"{g}/z.conf\";\n}}\n--\n"
        )),
        "{checked}"
    );
    assert_eq!(calls(dir).len(), 3);

    // The other matches are still checked: a broken neighbour rejects the new file too.
    std::fs::write(dir.join("z.conf"), "BROKEN\n").expect("z.conf");
    let newer = "upstream web {\n    server 10.0.0.2:80 weight=1;\n}\n";
    let err = apply(&args, newer).await.expect_err("z.conf is broken");
    assert!(format!("{err:#}").contains("/z.conf"), "{err:#}");
    assert_eq!(std::fs::read_to_string(&args.output).expect("read"), good);
    std::fs::write(dir.join("z.conf"), "# z\n").expect("z.conf");
    assert_eq!(apply(&args, newer).await.expect("apply"), Applied::Reloaded);
    assert_eq!(std::fs::read_to_string(&args.output).expect("read"), newer);
    assert!(!live_at_check(dir).contains("BROKEN"));

    // Nothing left behind: no candidate, no check copy.
    assert_eq!(
        names_in(dir),
        [
            "a.conf",
            "calls",
            "checked-conf",
            "etc",
            "live-at-check",
            "nginx",
            "upstreams.conf",
            "z.conf"
        ],
        "temp files left"
    );
    assert_eq!(names_in(&dir.join("etc")), ["nginx.conf"]);
}

/// Fallback when the main config reaches the output only through a nested
/// include (a file it includes includes the output): validated in place, the
/// previous file put back when rejected.
#[tokio::test]
async fn nginx_apply_falls_back_to_validate_in_place_and_restore() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    let mut args = nginx_args(dir);
    std::fs::create_dir(dir.join("etc")).expect("etc");
    let main = dir.join("etc/nginx.conf");
    args.nginx_conf = Some(main.clone());
    std::fs::write(
        &main,
        format!(
            "events {{}}\nhttp {{\n  include {}/nested.inc;\n}}\n",
            dir.display()
        ),
    )
    .expect("nginx.conf");
    std::fs::write(
        dir.join("nested.inc"),
        format!("include {}/*.conf;\n", dir.display()),
    )
    .expect("nested.inc");
    let good = "upstream web {\n    server 10.0.0.1:80 weight=1;\n}\n";
    assert_eq!(apply(&args, good).await.expect("apply"), Applied::Reloaded);
    let c = calls(dir);
    assert!(
        c[0].ends_with("/etc/nginx.conf -t -q") && !c[0].contains("kd-check"),
        "{c:?}"
    );
    let err = apply(&args, "upstream web { BROKEN }\n")
        .await
        .expect_err("must be rejected");
    assert!(format!("{err:#}").contains("emerg: broken"), "{err:#}");
    assert_eq!(std::fs::read_to_string(&args.output).expect("read"), good);
    // In this mode the live file did hold the rejected text during the check (documented).
    assert!(live_at_check(dir).contains("BROKEN"));
    assert!(!dir.join(".upstreams.conf.kd-candidate").exists());
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
