//! A small HTTP reverse proxy on the kube-discovery Rust library API: every
//! request asks `NodesResolver::nodes("ns/name:port")` (an in-memory
//! reflector over DiscoveredServices), picks a node at random in proportion
//! to its weight, and forwards the request. Changes in Kubernetes show up on
//! the next request; nothing is restarted or reloaded.
//!
//! ```text
//! cargo run -p kube-discovery-client --example reverse_proxy -- \
//!     --listen 127.0.0.1:8081 --service default/web:http [--kubeconfig FILE]
//! ```
//!
//! * no usable node (service missing, empty set): `--empty-policy keep`
//!   (default) keeps routing to the last non-empty set this process has seen
//!   (503 until one was seen), `--empty-policy 503` answers 503 at once: the
//!   same names and rules as the `sync nginx|haproxy` commands
//!   ([`kube_discovery_client::policy`]); each switch is logged once;
//! * a node refuses the connection: the request is retried on another node
//!   (up to 3 tries; the body is buffered so it can be replayed);
//! * any other upstream failure: 502.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use kube_discovery_client::NodesResolver;
use kube_discovery_client::policy::{EmptyPolicy, HostRule, Target, decide, usable_nodes};
use kube_discovery_core::Node;

#[derive(Parser)]
#[command(
    name = "reverse_proxy",
    about = "HTTP reverse proxy over kube-discovery nodes()"
)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8081")]
    listen: SocketAddr,
    /// Service to proxy to: `[id/]namespace/name:port`.
    #[arg(long)]
    service: String,
    /// Kubeconfig file (default: `KUBECONFIG`, `~/.kube/config`, or in-cluster).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Kubeconfig context.
    #[arg(long)]
    context: Option<String>,
    /// When the service has no usable node or is missing: `keep` the last good set, or `503`.
    #[arg(long, value_enum, default_value_t = EmptyPolicy::Keep)]
    empty_policy: EmptyPolicy,
    /// The controller writes every DiscoveredService into this namespace
    /// (`namespace_mode: fixed`); default: each in its Service's namespace.
    /// Objects elsewhere, or whose name or labels disagree with their spec,
    /// are ignored with a warning.
    #[arg(long, value_name = "NAMESPACE")]
    fixed_namespace: Option<String>,
    /// Count only the objects of this installation (`kube_discovery.instance`);
    /// default: of any installation.
    #[arg(long, value_name = "NAME")]
    instance: Option<String>,
}

thread_local! {
    static RANDOM: RandomState = RandomState::new();
}

struct Proxy {
    seq: AtomicU64,
    resolver: NodesResolver,
    service: String,
    http: HttpClient<HttpConnector, Full<Bytes>>,
    policy: EmptyPolicy,
    /// The last non-empty usable set, and whether the previous request found none.
    last_good: std::sync::Mutex<(Option<Vec<Node>>, bool)>,
}

/// A node chosen at random in proportion to its weight (weight 0 never).
/// The randomness is std's per-process random hasher over a counter, which
/// is plenty for load spreading and needs no extra crate.
fn pick<'a>(nodes: &'a [Node], exclude: &[usize], seq: u64) -> Option<(usize, &'a Node)> {
    let total: u64 = nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| !exclude.contains(i))
        .map(|(_, n)| u64::from(n.weight))
        .sum();
    if total == 0 {
        return None;
    }
    let mut r = RANDOM.with(|s| s.hash_one(seq)) % total;
    for (i, n) in nodes
        .iter()
        .enumerate()
        .filter(|(i, _)| !exclude.contains(i))
    {
        if r < u64::from(n.weight) {
            return Some((i, n));
        }
        r -= u64::from(n.weight);
    }
    None
}

fn text(status: StatusCode, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r
}

impl Proxy {
    /// The nodes to use now, per the empty policy (`None`: answer 503).
    fn target(&self, found: Option<Vec<Node>>) -> Option<Vec<Node>> {
        let (usable, _) = usable_nodes(found.as_deref().unwrap_or_default(), HostRule::IpOrDns);
        let empty = usable.is_empty();
        let mut g = self.last_good.lock().unwrap_or_else(|e| e.into_inner());
        let t = decide(self.policy, usable, g.0.as_deref());
        if empty != g.1 {
            match (&t, empty) {
                (_, false) => tracing::info!(service = %self.service, "usable nodes again"),
                (Target::Nodes(n), true) => {
                    tracing::warn!(service = %self.service, nodes = n.len(), "no usable node; keeping the last good set (empty policy keep)")
                }
                (Target::Unavailable, true) => {
                    tracing::warn!(service = %self.service, policy = %self.policy, "no usable node; answering 503")
                }
            }
            g.1 = empty;
        }
        match t {
            Target::Nodes(n) => {
                // Remember a new good set (a comparison, not a copy, per request).
                if !empty && g.0.as_deref() != Some(n.as_slice()) {
                    g.0 = Some(n.clone());
                }
                Some(n)
            }
            Target::Unavailable => None,
        }
    }

    async fn handle(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let found = match self.resolver.nodes(&self.service) {
            Ok(n) => n,
            Err(e) => return text(StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")),
        };
        let Some(nodes) = self.target(found) else {
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                format!("no nodes for {}\n", self.service),
            );
        };
        let (parts, body) = req.into_parts();
        let body = match body.collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) => {
                return text(
                    StatusCode::BAD_REQUEST,
                    format!("reading the request body: {e}\n"),
                );
            }
        };
        let path = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/");
        let mut tried = Vec::new();
        while tried.len() < 3 {
            let Some((i, node)) = pick(&nodes, &tried, self.seq.fetch_add(1, Ordering::Relaxed))
            else {
                break;
            };
            tried.push(i);
            let host = if node.host.contains(':') {
                format!("[{}]", node.host)
            } else {
                node.host.to_string()
            };
            let mut out = Request::builder()
                .method(parts.method.clone())
                .uri(format!("http://{host}:{}{path}", node.port));
            for (k, v) in parts
                .headers
                .iter()
                .filter(|(k, _)| *k != hyper::header::HOST)
            {
                out = out.header(k, v);
            }
            let Ok(out) = out.body(Full::new(body.clone())) else {
                return text(
                    StatusCode::BAD_REQUEST,
                    "cannot build the upstream request\n".into(),
                );
            };
            match self.http.request(out).await {
                Ok(resp) => {
                    let (p, b) = resp.into_parts();
                    return match b.collect().await {
                        Ok(b) => Response::from_parts(p, Full::new(b.to_bytes())),
                        Err(e) => text(
                            StatusCode::BAD_GATEWAY,
                            format!("reading from {host}:{}: {e}\n", node.port),
                        ),
                    };
                }
                Err(e) if e.is_connect() => continue,
                Err(e) => {
                    return text(
                        StatusCode::BAD_GATEWAY,
                        format!("{host}:{}: {e}\n", node.port),
                    );
                }
            }
        }
        text(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("no reachable node for {}\n", self.service),
        )
    }
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
    let args = Args::parse();
    kube_discovery_core::parse_service_name(&args.service)
        .map_err(|e| anyhow::anyhow!("--service {}: {e}", args.service))?;
    let client =
        kube_discovery_client::connect::client(args.kubeconfig.as_deref(), args.context.as_deref())
            .await?;
    let resolver = NodesResolver::start_with_rule(
        client,
        None,
        kube_discovery_client::MANAGED_BY_SELECTOR,
        kube_discovery_client::lookup::reader_rule(
            args.fixed_namespace.as_deref(),
            args.instance.as_deref(),
        ),
    );
    resolver.wait_ready().await;
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(std::time::Duration::from_secs(1)));
    let proxy = Arc::new(Proxy {
        seq: AtomicU64::new(0),
        resolver,
        service: args.service.clone(),
        http: HttpClient::builder(TokioExecutor::new()).build(connector),
        policy: args.empty_policy,
        last_good: std::sync::Mutex::new((None, false)),
    });
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    tracing::info!(addr = %listener.local_addr()?, service = %args.service, policy = %args.empty_policy, "proxy listening");
    loop {
        let (stream, _) = listener.accept().await?;
        let proxy = proxy.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| {
                let proxy = proxy.clone();
                async move { Ok::<_, std::convert::Infallible>(proxy.handle(req).await) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await
            {
                tracing::debug!(error = %e, "connection ended");
            }
        });
    }
}
