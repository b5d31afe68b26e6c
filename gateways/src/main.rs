//! `kube-discovery-sync nginx|haproxy ...`: the gateway sync commands of this
//! crate as a stand-alone binary (the same functions back `kube-discovery sync`).

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "kube-discovery-sync",
    version,
    about = "Keep nginx or HAProxy following DiscoveredServices"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Render nginx `upstream` blocks, `nginx -t`, reload when changed.
    Nginx(kube_discovery_gateways::nginx::NginxArgs),
    /// Drive HAProxy server slots through the Runtime API (reload only to grow).
    Haproxy(kube_discovery_gateways::haproxy::HaproxyArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match Cli::parse().cmd {
        Cmd::Nginx(a) => kube_discovery_gateways::nginx::run_nginx(a).await,
        Cmd::Haproxy(a) => kube_discovery_gateways::haproxy::run_haproxy(a).await,
    }
}
