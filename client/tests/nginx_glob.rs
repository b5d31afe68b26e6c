//! `sync nginx`'s candidate check with the REAL nginx binary (Debian package;
//! the test FAILS when it is not installed: `e2e/tools/install-gateways.sh`) and
//! Debian's layout: the main config reaches the output only through
//! `include conf.d/*.conf;`. nginx runs through a small wrapper that records
//! what the LIVE output held at each call, then execs nginx; nginx itself is
//! not started (the reload fails, which `apply` reports as
//! `WrittenNotReloaded`).

use std::path::{Path, PathBuf};

use kube_discovery_client::policy::EmptyPolicy;
use kube_discovery_client::sync::KubeArgs;
use kube_discovery_client::sync::nginx::{
    Applied, NginxArgs, apply, candidate_path, shadow_config,
};

fn real_nginx() -> PathBuf {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/sbin")])
        .map(|d| d.join("nginx"))
        .find(|p| p.is_file())
        .expect("nginx is not installed (e2e/tools/install-gateways.sh installs it)")
}

fn main_conf(d: &Path) -> String {
    let d = d.display();
    format!(
        "pid {d}/nginx.pid;\nerror_log {d}/error.log;\nevents {{ worker_connections 64; }}\n\
http {{\n  access_log off;\n  client_body_temp_path {d}/t-body;\n  proxy_temp_path {d}/t-proxy;\n  fastcgi_temp_path {d}/t-fcgi;\n  uwsgi_temp_path {d}/t-uwsgi;\n  scgi_temp_path {d}/t-scgi;\n\
  include conf.d/*.conf;\n  server {{ listen 127.0.0.1:1; location / {{ proxy_pass http://web; }} }}\n}}\n"
    )
}

/// The configuration files `nginx -T` reads, in its order.
fn files_read(nginx: &Path, d: &Path, conf: &Path) -> Vec<String> {
    let out = std::process::Command::new(nginx)
        .arg("-p")
        .arg(d)
        .arg("-c")
        .arg(conf)
        .arg("-T")
        .output()
        .expect("nginx -T");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("# configuration file "))
        .map(|l| l.trim_end_matches(':').to_string())
        .collect()
}

#[tokio::test]
async fn real_nginx_checks_a_candidate_reached_through_conf_d_glob() {
    let nginx = real_nginx();
    let tmp = tempfile::tempdir().expect("tempdir");
    let d = tmp.path().canonicalize().expect("tempdir");
    let conf_d = d.join("conf.d");
    std::fs::create_dir(&conf_d).expect("conf.d");
    let conf = d.join("nginx.conf");
    std::fs::write(&conf, main_conf(&d)).expect("nginx.conf");
    // Neighbours in conf.d: nginx sorts glob matches with strcmp (`A` < `a`, `-` < `.`).
    std::fs::write(
        conf_d.join("a.conf"),
        "upstream a_up { server 127.0.0.1:9; }\n",
    )
    .expect("a.conf");
    std::fs::write(conf_d.join("A.conf"), "# A\n").expect("A.conf");
    std::fs::write(conf_d.join("a-b.conf"), "# a-b\n").expect("a-b.conf");
    std::fs::write(conf_d.join("z.conf"), "map $uri $kd_z { default 1; }\n").expect("z.conf");
    let output = conf_d.join("upstreams.conf");

    // nginx through a wrapper that records the live output at every call.
    let wrapper = d.join("nginx-wrapper");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\n{{ cat {out} 2>/dev/null; echo '--'; }} >> {d}/live-at-call\nexec {nginx} \"$@\"\n",
            out = output.display(),
            d = d.display(),
            nginx = nginx.display()
        ),
    )
    .expect("wrapper");
    let status = std::process::Command::new("chmod")
        .arg("+x")
        .arg(&wrapper)
        .status()
        .expect("chmod");
    assert!(status.success());
    let args = NginxArgs {
        kube: KubeArgs {
            kubeconfig: None,
            context: None,
            namespace: None,
            fixed_namespace: None,
            instance: None,
            selector: "a=b".into(),
        },
        services: vec!["web=default/web:http".parse().expect("svc")],
        output: output.clone(),
        nginx_bin: wrapper,
        nginx_conf: Some(conf.clone()),
        nginx_prefix: Some(d.clone()),
        empty_policy: EmptyPolicy::Keep,
        once: false,
    };
    let live_at_call = || std::fs::read_to_string(d.join("live-at-call")).unwrap_or_default();

    // The check copy lists conf.d in the order nginx reads it, candidate in the output's place.
    let shadow = shadow_config(&main_conf(&d), &d, &output, &candidate_path(&output))
        .expect("reached through the glob");
    let c = conf_d.display();
    assert!(
        shadow.contains(&format!(
            "include \"{c}/A.conf\"; include \"{c}/a-b.conf\"; include \"{c}/a.conf\"; include \"{c}/.upstreams.conf.kd-candidate\"; include \"{c}/z.conf\";"
        )),
        "{shadow}"
    );

    // First run: checked as a candidate (the live path was empty during `nginx -t`), written;
    // nginx is not running, so the reload fails.
    let good = "upstream web {\n    server 127.0.0.1:8080 weight=1;\n}\n";
    assert_eq!(
        apply(&args, good).await.expect("valid"),
        Applied::WrittenNotReloaded
    );
    assert_eq!(std::fs::read_to_string(&output).expect("output"), good);
    assert!(live_at_call().starts_with("--\n"), "{}", live_at_call());
    // The live configuration now reads the output where the candidate was checked.
    let read = files_read(&nginx, &d, &conf);
    assert_eq!(
        read,
        [
            conf.display().to_string(),
            format!("{c}/A.conf"),
            format!("{c}/a-b.conf"),
            format!("{c}/a.conf"),
            format!("{c}/upstreams.conf"),
            format!("{c}/z.conf"),
        ]
    );

    // Rejected because of a neighbour: `a_up` is already defined in conf.d/a.conf,
    // which only a check of the whole configuration sees.
    let calls_before = live_at_call().matches("--\n").count();
    let dup = "upstream a_up {\n    server 127.0.0.1:8081 weight=1;\n}\n";
    let err = apply(&args, dup).await.expect_err("duplicate upstream");
    assert!(format!("{err:#}").contains("duplicate upstream"), "{err:#}");
    assert!(
        format!("{err:#}").contains("previous content kept"),
        "{err:#}"
    );
    // A syntax error.
    let err = apply(&args, "upstream web {\n    server ;\n}\n")
        .await
        .expect_err("syntax error");
    assert!(format!("{err:#}").contains("nginx -t failed"), "{err:#}");
    assert_eq!(std::fs::read_to_string(&output).expect("output"), good);
    let seen = live_at_call();
    assert_eq!(
        seen.matches("--\n").count(),
        calls_before + 2,
        "one `nginx -t` per rejected text, no reload: {seen}"
    );
    assert!(
        !seen.contains("a_up") && !seen.contains("server ;"),
        "a rejected text was at the live path: {seen}"
    );

    // A valid change goes through; nothing left behind in conf.d or next to nginx.conf.
    let newer = "upstream web {\n    server 127.0.0.1:8082 weight=2;\n}\n";
    assert_eq!(
        apply(&args, newer).await.expect("valid"),
        Applied::WrittenNotReloaded
    );
    assert_eq!(std::fs::read_to_string(&output).expect("output"), newer);
    let mut left: Vec<String> = std::fs::read_dir(&conf_d)
        .expect("conf.d")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(
        left,
        ["A.conf", "a-b.conf", "a.conf", "upstreams.conf", "z.conf"]
    );
    assert!(
        !std::fs::read_dir(&d).expect("dir").any(|e| e
            .expect("entry")
            .file_name()
            .to_string_lossy()
            .contains("kd-check")),
        "check copy left"
    );
}
