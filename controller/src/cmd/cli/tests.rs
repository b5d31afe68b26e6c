use super::*;

#[test]
fn parses_every_subcommand() {
    let c = Cli::try_parse_from([
        "kube-discovery",
        "run",
        "--config",
        "c.yaml",
        "--http-addr",
        "127.0.0.1:9",
    ])
    .unwrap();
    assert!(matches!(
        c.command,
        Command::Run {
            http_addr: Some(_),
            ..
        }
    ));
    let c = Cli::try_parse_from(["kube-discovery", "--log-format", "json", "crd"]).unwrap();
    assert_eq!(c.log_format, LogFormat::Json);
    let c = Cli::try_parse_from([
        "kube-discovery",
        "render",
        "-f",
        "-",
        "-o",
        "json",
        "--nodes",
        "a/b:c",
    ])
    .unwrap();
    assert!(matches!(
        c.command,
        Command::Render {
            output: OutputFormat::Json,
            nodes: Some(_),
            ..
        }
    ));
    let c = Cli::try_parse_from([
        "kube-discovery",
        "sync",
        "nginx",
        "--service",
        "web=default/web:http",
        "--output",
        "/tmp/upstreams.conf",
    ])
    .unwrap();
    assert!(matches!(
        c.command,
        Command::Sync {
            gateway: SyncGateway::Nginx(_)
        }
    ));
    let c = Cli::try_parse_from(["kube-discovery", "demo", "--duration", "5"]).unwrap();
    assert!(matches!(
        c.command,
        Command::Demo {
            duration: Some(5),
            ..
        }
    ));
    assert!(
        Cli::try_parse_from(["kube-discovery", "run"]).is_err(),
        "--config is required"
    );
    let c = Cli::try_parse_from(["kube-discovery", "completion", "zsh"]).unwrap();
    assert!(matches!(
        c.command,
        Command::Completion {
            shell: clap_complete::Shell::Zsh
        }
    ));
    assert!(
        Cli::try_parse_from(["kube-discovery", "completion", "tcsh"]).is_err(),
        "an unknown shell is a usage error"
    );
    let c = Cli::try_parse_from(["kube-discovery", "man", "--dir", "/tmp/m"]).unwrap();
    assert!(matches!(c.command, Command::Man { dir: Some(_) }));
}
