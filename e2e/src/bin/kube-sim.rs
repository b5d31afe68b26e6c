//! `kube-sim`: run the simulated API server until SIGTERM/SIGINT.
//!
//! Prints `listening on <url>` as its first stdout line, then writes the kubeconfig
//! (and, with `--tls`, the CA certificate next to it as `<kubeconfig>.ca.crt`, or to
//! `--ca-out`).

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;

#[derive(Parser, Debug)]
#[command(
    name = "kube-sim",
    about = "A small, honest Kubernetes API server for tests and demos"
)]
struct Args {
    /// Address to listen on (127.0.0.1 only is recommended).
    #[arg(long, default_value = "127.0.0.1:6443")]
    listen: SocketAddr,
    /// Where to write a kubeconfig that authenticates with the admin token.
    #[arg(long)]
    kubeconfig_out: Option<PathBuf>,
    /// Bearer token that bypasses RBAC. Also read from KUBE_SIM_ADMIN_TOKEN.
    #[arg(long, env = "KUBE_SIM_ADMIN_TOKEN", hide_env_values = true)]
    admin_token: String,
    /// Serve HTTPS with a generated self-signed CA.
    #[arg(long)]
    tls: bool,
    /// Where to write the CA certificate (PEM) with --tls; default `<kubeconfig-out>.ca.crt`.
    #[arg(long)]
    ca_out: Option<PathBuf>,
    /// Events kept for watches (older resourceVersions get 410 Gone).
    #[arg(long, default_value_t = 10_000)]
    history_size: usize,
    /// Seconds between watch BOOKMARK events.
    #[arg(long, default_value_t = 5.0)]
    bookmark_interval: f64,
    /// Issue a ServiceAccount token at startup and print it: `NAMESPACE/NAME` (repeatable).
    /// Printed as `token <namespace>/<name> <token>` lines after the first line.
    #[arg(long = "sa-token")]
    sa_tokens: Vec<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("KUBE_SIM_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cfg = kube_sim::SimConfig {
        admin_token: args.admin_token.clone(),
        tls: args.tls,
        history_size: args.history_size,
        bookmark_interval: Duration::from_secs_f64(args.bookmark_interval.max(0.01)),
    };
    let sim = kube_sim::Sim::start_on(args.listen, cfg).await?;
    // Signal handlers and every file come before the first stdout line: a
    // caller that waits for `listening on` may read the kubeconfig and CA, or
    // stop the server, at once.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("SIGTERM handler")?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())
        .context("SIGINT handler")?;
    if let Some(path) = &args.kubeconfig_out {
        sim.write_kubeconfig(path, &args.admin_token)
            .with_context(|| format!("writing the kubeconfig to {}", path.display()))?;
        if let Some(ca) = sim.ca_pem() {
            let ca_path = args.ca_out.clone().unwrap_or_else(|| {
                let mut p = path.clone().into_os_string();
                p.push(".ca.crt");
                PathBuf::from(p)
            });
            std::fs::write(&ca_path, ca)
                .with_context(|| format!("writing CA to {}", ca_path.display()))?;
        }
    } else if let (Some(ca), Some(p)) = (sim.ca_pem(), &args.ca_out) {
        std::fs::write(p, ca).with_context(|| format!("writing CA to {}", p.display()))?;
    }
    let mut tokens = Vec::new();
    for sa in &args.sa_tokens {
        let (ns, name) = sa
            .split_once('/')
            .with_context(|| format!("--sa-token {sa:?}: expected NAMESPACE/NAME"))?;
        tokens.push(format!("token {ns}/{name} {}", sim.issue_token(ns, name)));
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "listening on {}", sim.url())?;
    for line in &tokens {
        writeln!(out, "{line}")?;
    }
    out.flush()?;
    drop(out);
    tokio::select! {
        _ = int.recv() => {}
        _ = term.recv() => {}
    }
    sim.shutdown().await;
    Ok(())
}
