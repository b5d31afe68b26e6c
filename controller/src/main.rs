//! `kube-discovery` binary: parse the command line, set up logging, dispatch.
//! Exit codes: 0 ok, 1 runtime failure, 2 invalid configuration or input.

use std::process::ExitCode;

use kube_discovery::Error;
use kube_discovery::cmd::cli::{Cli, Command, LogFormat, SyncGateway};
use kube_discovery::cmd::shell::{self, Invocation};
use tracing_subscriber::EnvFilter;

fn init_tracing(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colours only on a terminal: piped or collected logs stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

async fn dispatch(cli: Cli, invocation: Invocation) -> Result<(), Error> {
    match cli.command {
        Command::Run {
            config,
            http_addr,
            kubeconfig,
        } => kube_discovery::cmd::run::run_from_file(&config, http_addr, kubeconfig).await,
        Command::Crd => {
            print!("{}", kube_discovery_core::crd::crd_yaml());
            Ok(())
        }
        Command::Render {
            file,
            config,
            output,
            nodes,
        } => {
            let out = kube_discovery::cmd::render_cmd::render_command(
                &file,
                config.as_deref(),
                output,
                nodes.as_deref(),
            )?;
            print!("{out}");
            Ok(())
        }
        Command::Nodes {
            service,
            kubeconfig,
            context,
            snapshot,
            snapshot_dir,
            fixed_namespace,
            instance,
        } => {
            use kube_discovery_client::NodesFrom;
            let from = match (snapshot, snapshot_dir) {
                (Some(s), _) => NodesFrom::snapshot(&s)?,
                (None, Some(d)) => NodesFrom::SnapshotDir(d),
                (None, None) => {
                    NodesFrom::DiscoveredServices(kube_discovery_client::lookup::reader_rule(
                        fixed_namespace.as_deref(),
                        instance.as_deref(),
                    ))
                }
            };
            let out =
                kube_discovery::cmd::nodes_cmd::nodes_command(&service, kubeconfig, context, from)
                    .await?;
            println!("{out}");
            Ok(())
        }
        #[cfg(feature = "demo")]
        Command::Demo {
            duration,
            http_addr,
            dir,
            interval,
        } => {
            kube_discovery::cmd::demo::run(kube_discovery::cmd::demo::DemoOptions {
                duration,
                http_addr,
                dir,
                interval,
            })
            .await
        }
        #[cfg(not(feature = "demo"))]
        Command::Demo { .. } => Err(kube_discovery::InputError::NoDemo.into()),
        Command::Sync { gateway } => match gateway {
            SyncGateway::Nginx(a) => kube_discovery_client::sync::run_nginx(a).await,
            SyncGateway::Haproxy(a) => kube_discovery_client::sync::run_haproxy(a).await,
        }
        .map_err(Error::Sync),
        Command::Completion { shell } => shell::write_stdout(&shell::completion(invocation, shell)),
        Command::Man { dir: None } => shell::write_stdout(&shell::man_page(invocation)?),
        Command::Man { dir: Some(dir) } => {
            for f in shell::man_pages_to(invocation, &dir)? {
                println!("{}", dir.join(f).display());
            }
            Ok(())
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    // `kubectl-discovery` (the kubectl plugin) names itself `kubectl discovery`.
    let invocation = Invocation::from_argv0(std::env::args_os().next().as_deref());
    if invocation == Invocation::KubectlComplete {
        // kubectl's completion of `kubectl discovery ...`: words, not a command.
        let words: Vec<String> = std::env::args_os()
            .skip(1)
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        return Ok(
            match shell::write_stdout(shell::kubectl_complete(&words).as_bytes()) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("error: {e}");
                    ExitCode::from(1)
                }
            },
        );
    }
    let cli = invocation.parse();
    init_tracing(cli.log_format);
    match dispatch(cli, invocation).await {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) if e.is_usage() => {
            // One line per problem, already naming the field; never a token.
            eprintln!("{e}");
            Ok(ExitCode::from(2))
        }
        Err(e) => {
            eprintln!("error: {e}");
            Ok(ExitCode::from(1))
        }
    }
}
