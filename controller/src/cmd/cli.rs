//! The command line (clap). `main.rs` parses it, sets up tracing and calls
//! into the library; each subcommand lives in its own module.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand, ValueEnum};

/// kube-discovery: Endpoints/EndpointSlices -> DiscoveredService custom resources,
/// APISIX-compatible.
#[derive(Debug, Parser)]
#[command(name = "kube-discovery", version, about)]
pub struct Cli {
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, env = "KUBE_DISCOVERY_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// The command.
    #[command(subcommand)]
    pub command: Command,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Output format of `render`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// YAML documents separated by `---`.
    Yaml,
    /// A JSON `List`.
    Json,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the controller.
    Run {
        /// Configuration file (YAML with a `discovery.kubernetes` block).
        #[arg(long, short = 'c')]
        config: PathBuf,
        /// HTTP listen address (overrides `kube_discovery.http.addr`).
        #[arg(long)]
        http_addr: Option<SocketAddr>,
        /// Kubeconfig to use instead of the `service`/`client` settings
        /// (single cluster; also where DiscoveredServices are written).
        #[arg(long, env = "KUBECONFIG")]
        kubeconfig: Option<PathBuf>,
    },
    /// Print the DiscoveredService CustomResourceDefinition YAML.
    Crd,
    /// Print the DiscoveredServices the controller would write for the given
    /// Kubernetes objects (Endpoints, EndpointSlices; one object, multi-document
    /// YAML/JSON, or a List).
    Render {
        /// Input file, `-` for stdin.
        #[arg(short = 'f', long = "filename")]
        file: String,
        /// Configuration file (same as `run`); defaults apply without it.
        #[arg(long, short = 'c')]
        config: Option<PathBuf>,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = OutputFormat::Yaml)]
        output: OutputFormat,
        /// Print only the nodes JSON of `[id/]namespace/name:port`.
        #[arg(long)]
        nodes: Option<String>,
    },
    /// Print the nodes of `[id/]namespace/name:port` from the DiscoveredServices
    /// on the API server (default), or from the ConfigMap snapshot.
    Nodes {
        /// `[id/]namespace/name:port`.
        service: String,
        /// Kubeconfig (default: `KUBECONFIG`, `~/.kube/config`, in-cluster).
        #[arg(long, env = "KUBECONFIG")]
        kubeconfig: Option<PathBuf>,
        /// Kubeconfig context.
        #[arg(long)]
        context: Option<String>,
        /// Read the ConfigMap snapshot `NAMESPACE/NAME` (its index ConfigMap)
        /// through the API instead of the DiscoveredServices.
        #[arg(long, value_name = "NAMESPACE/NAME", conflicts_with = "snapshot_dir")]
        snapshot: Option<String>,
        /// Read a snapshot mounted as files (`index.json` + shard keys in one
        /// directory); needs no API access.
        #[arg(long, value_name = "DIR")]
        snapshot_dir: Option<PathBuf>,
        /// The controller runs with `namespace_mode: fixed` and writes every
        /// DiscoveredService into this namespace: only objects there count
        /// (default: each object in its Service's namespace). Objects whose
        /// namespace, name or labels disagree with their spec are ignored
        /// with a warning.
        #[arg(long, value_name = "NAMESPACE", conflicts_with_all = ["snapshot", "snapshot_dir"])]
        fixed_namespace: Option<String>,
        /// Count only the objects of this installation
        /// (`kube_discovery.instance`, label `kubediscovery.io/instance`;
        /// default: of any installation).
        #[arg(long, value_name = "NAME", conflicts_with_all = ["snapshot", "snapshot_dir"])]
        instance: Option<String>,
    },
    /// Start an in-process kube-sim with sample workloads, run the controller
    /// against it, and keep changing endpoints so updates are visible.
    Demo {
        /// Stop after this many seconds (default: until Ctrl-C).
        #[arg(long)]
        duration: Option<u64>,
        /// HTTP listen address of the controller.
        #[arg(long, default_value = "127.0.0.1:8080")]
        http_addr: SocketAddr,
        /// Directory for the kubeconfig (default: a new temporary directory).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Seconds between endpoint changes.
        #[arg(long, default_value_t = 3)]
        interval: u64,
    },
    /// Keep a gateway (nginx, HAProxy) following DiscoveredServices.
    Sync {
        /// The gateway.
        #[command(subcommand)]
        gateway: SyncGateway,
    },
    /// Print a shell completion script for this command's name.
    #[command(after_help = "Load it in the running shell or install it:\n  \
        bash: source <(kube-discovery completion bash)\n  \
        zsh:  kube-discovery completion zsh > \"${fpath[1]}/_kube-discovery\"\n  \
        fish: kube-discovery completion fish > ~/.config/fish/completions/kube-discovery.fish\n\
        Run as kubectl-discovery, it completes kubectl-discovery.")]
    Completion {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff), or write one page per command to a directory.
    #[command(after_help = "Read it: kube-discovery man | man -l -\n\
        Install: kube-discovery man --dir /usr/local/share/man/man1")]
    Man {
        /// Write `kube-discovery.1`, `kube-discovery-<command>.1`, ... into
        /// this directory (created if missing) instead of printing the main page.
        #[arg(long, value_name = "DIR")]
        dir: Option<PathBuf>,
    },
}

/// Gateways `sync` can drive.
#[derive(Debug, Subcommand)]
pub enum SyncGateway {
    /// Render nginx `upstream` blocks, validate with `nginx -t`, reload when changed.
    Nginx(kube_discovery_client::sync::NginxArgs),
    /// Drive HAProxy server slots over the Runtime API (reload only to grow).
    Haproxy(kube_discovery_client::sync::HaproxyArgs),
}

#[cfg(test)]
mod tests;
