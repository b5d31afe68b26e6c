//! A scriptable ADS client (state of the world and delta) for the tests and
//! kd-bench: it sends exactly the requests a test writes, so protocol cases
//! (ACK, NACK, stale nonces, reconnects with `initial_resource_versions`)
//! can be driven one message at a time, and decodes what comes back.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::config::cluster::v3::Cluster;
use envoy_types::pb::envoy::config::core::v3::{HealthStatus, Node, address, socket_address};
use envoy_types::pb::envoy::config::endpoint::v3::{ClusterLoadAssignment, lb_endpoint};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryRequest, DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse,
    aggregated_discovery_service_client::AggregatedDiscoveryServiceClient,
};
use envoy_types::pb::google::rpc::Status as RpcStatus;
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Streaming;
use tonic::transport::Channel;

/// The type URL of Clusters.
pub const CDS: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// The type URL of ClusterLoadAssignments.
pub const EDS: &str = "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment";
/// The type URL of Listeners.
pub const LDS: &str = "type.googleapis.com/envoy.config.listener.v3.Listener";
/// The type URL of RouteConfigurations.
pub const RDS: &str = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration";

/// A channel to `addr` (plain HTTP/2).
pub async fn channel(addr: SocketAddr) -> Result<Channel, tonic::transport::Error> {
    Channel::from_shared(format!("http://{addr}"))
        .expect("valid URI")
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
}

/// A TLS channel to `addr` trusting `ca_pem`, presenting `identity`
/// (certificate and key PEM) when given (mTLS).
pub async fn tls_channel(
    addr: SocketAddr,
    ca_pem: &str,
    identity: Option<(&str, &str)>,
) -> Result<Channel, tonic::transport::Error> {
    use tonic::transport::{Certificate, ClientTlsConfig, Identity};
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca_pem))
        .domain_name(addr.ip().to_string());
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(cert, key));
    }
    Channel::from_shared(format!("https://{addr}"))
        .expect("valid URI")
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
}

fn with_token<T>(msg: T, token: Option<&str>) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    if let Some(t) = token {
        req.metadata_mut().insert(
            "authorization",
            format!("Bearer {t}").parse().expect("ascii token"),
        );
    }
    req
}

/// The node a test client presents.
pub fn node(id: &str) -> Node {
    Node {
        id: id.to_string(),
        cluster: "kd-test".to_string(),
        ..Node::default()
    }
}

/// A state-of-the-world ADS stream.
#[derive(Debug)]
pub struct Sotw {
    tx: mpsc::Sender<DiscoveryRequest>,
    rx: Streaming<DiscoveryResponse>,
    node: Option<Node>,
}

impl Sotw {
    /// Opens a stream (the call fails with the server's status, e.g.
    /// UNAUTHENTICATED).
    pub async fn open(
        ch: Channel,
        token: Option<&str>,
        node_id: &str,
    ) -> Result<Self, tonic::Status> {
        let (tx, rx) = mpsc::channel(16);
        let mut client =
            AggregatedDiscoveryServiceClient::new(ch).max_decoding_message_size(usize::MAX);
        let resp = client
            .stream_aggregated_resources(with_token(ReceiverStream::new(rx), token))
            .await?;
        Ok(Self {
            tx,
            rx: resp.into_inner(),
            node: Some(node(node_id)),
        })
    }

    /// Opens a stream whose first request (`type_url`, `names`, with the
    /// node) is already on its way when the call starts. A server that sends
    /// its response headers only with its first response (grpc-go, hence
    /// go-control-plane) answers [`Sotw::open`] only after a request, which
    /// [`Sotw::open`] sends only once it returns: this is the way to open
    /// a stream to such a server.
    pub async fn open_with(
        ch: Channel,
        token: Option<&str>,
        node_id: &str,
        type_url: &str,
        names: &[&str],
    ) -> Result<Self, tonic::Status> {
        let (tx, rx) = mpsc::channel(16);
        let first = DiscoveryRequest {
            node: Some(node(node_id)),
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            type_url: type_url.to_string(),
            ..DiscoveryRequest::default()
        };
        tx.send(first).await.expect("receiver held here");
        let mut client =
            AggregatedDiscoveryServiceClient::new(ch).max_decoding_message_size(usize::MAX);
        let resp = client
            .stream_aggregated_resources(with_token(ReceiverStream::new(rx), token))
            .await?;
        Ok(Self {
            tx,
            rx: resp.into_inner(),
            node: None,
        })
    }

    /// Sends a request (the node goes with the first one only, as Envoy does).
    pub async fn send(
        &mut self,
        type_url: &str,
        names: &[&str],
        version: &str,
        nonce: &str,
        error: Option<&str>,
    ) {
        let req = DiscoveryRequest {
            version_info: version.to_string(),
            node: self.node.take(),
            resource_names: names.iter().map(|s| s.to_string()).collect(),
            type_url: type_url.to_string(),
            response_nonce: nonce.to_string(),
            error_detail: error.map(|m| RpcStatus {
                code: 3,
                message: m.to_string(),
                ..RpcStatus::default()
            }),
            ..DiscoveryRequest::default()
        };
        self.tx.send(req).await.expect("stream open");
    }

    /// ACKs `resp`, keeping `names` subscribed.
    pub async fn ack(&mut self, resp: &DiscoveryResponse, names: &[&str]) {
        let (t, v, n) = (
            resp.type_url.clone(),
            resp.version_info.clone(),
            resp.nonce.clone(),
        );
        self.send(&t, names, &v, &n, None).await;
    }

    /// The next response within `wait` (`Ok(None)`: none came).
    pub async fn recv(
        &mut self,
        wait: Duration,
    ) -> Result<Option<DiscoveryResponse>, tonic::Status> {
        next(&mut self.rx, wait).await
    }
}

/// The next message of `rx` within `wait` (`Ok(None)`: none came).
async fn next<T>(rx: &mut Streaming<T>, wait: Duration) -> Result<Option<T>, tonic::Status> {
    match tokio::time::timeout(wait, rx.message()).await {
        Err(_) => Ok(None),
        Ok(r) => r.map(|m| Some(m.expect("stream ended by the server"))),
    }
}

/// A `DiscoveryRequest` whose names are shared `Bytes`: kd-bench's SotW load
/// ACKs every response naming all 10,000 resources, and cloning 10,000
/// `String`s per ACK made the load client, not the server, the busiest
/// process of the run (BENCHMARKS.md, xDS). Same field numbers as envoy-types'
/// message.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SharedNamesRequest {
    /// `version_info`.
    #[prost(string, tag = "1")]
    pub version_info: String,
    /// `node`.
    #[prost(message, optional, tag = "2")]
    pub node: Option<Node>,
    /// `resource_names`.
    #[prost(bytes = "bytes", repeated, tag = "3")]
    pub resource_names: Vec<bytes::Bytes>,
    /// `type_url`.
    #[prost(string, tag = "4")]
    pub type_url: String,
    /// `response_nonce`.
    #[prost(string, tag = "5")]
    pub response_nonce: String,
}

/// A state-of-the-world ADS stream for load: requests name resources with
/// shared `Bytes` ([`SharedNamesRequest`]), responses are envoy-types'.
#[derive(Debug)]
pub struct SotwLoad {
    tx: mpsc::Sender<SharedNamesRequest>,
    rx: Streaming<DiscoveryResponse>,
}

impl SotwLoad {
    /// Opens a stream whose first request (`type_url`, `names`, the node) is
    /// on its way when the call starts (see [`Sotw::open_with`]).
    pub async fn open(
        ch: Channel,
        token: Option<&str>,
        node_id: &str,
        type_url: &str,
        names: &[bytes::Bytes],
    ) -> Result<Self, tonic::Status> {
        let (tx, rx) = mpsc::channel(16);
        let first = SharedNamesRequest {
            node: Some(node(node_id)),
            resource_names: names.to_vec(),
            type_url: type_url.to_string(),
            ..SharedNamesRequest::default()
        };
        tx.send(first).await.expect("receiver held here");
        let mut grpc = tonic::client::Grpc::new(ch).max_decoding_message_size(usize::MAX);
        grpc.ready()
            .await
            .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
        let path = tonic::codegen::http::uri::PathAndQuery::from_static(
            "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources",
        );
        let codec = tonic_prost::ProstCodec::<SharedNamesRequest, DiscoveryResponse>::default();
        let resp = grpc
            .streaming(with_token(ReceiverStream::new(rx), token), path, codec)
            .await?;
        Ok(Self {
            tx,
            rx: resp.into_inner(),
        })
    }

    /// Sends a request.
    pub async fn send(
        &mut self,
        type_url: &str,
        names: &[bytes::Bytes],
        version: &str,
        nonce: &str,
    ) {
        let req = SharedNamesRequest {
            version_info: version.to_string(),
            node: None,
            resource_names: names.to_vec(),
            type_url: type_url.to_string(),
            response_nonce: nonce.to_string(),
        };
        self.tx.send(req).await.expect("stream open");
    }

    /// ACKs `resp`, keeping `names` subscribed.
    pub async fn ack(&mut self, resp: &DiscoveryResponse, names: &[bytes::Bytes]) {
        self.send(&resp.type_url, names, &resp.version_info, &resp.nonce)
            .await;
    }

    /// The next response within `wait` (`Ok(None)`: none came).
    pub async fn recv(
        &mut self,
        wait: Duration,
    ) -> Result<Option<DiscoveryResponse>, tonic::Status> {
        next(&mut self.rx, wait).await
    }
}

/// An incremental (delta) ADS stream.
#[derive(Debug)]
pub struct Delta {
    tx: mpsc::Sender<DeltaDiscoveryRequest>,
    rx: Streaming<DeltaDiscoveryResponse>,
    node: Option<Node>,
}

impl Delta {
    /// Opens a stream.
    pub async fn open(
        ch: Channel,
        token: Option<&str>,
        node_id: &str,
    ) -> Result<Self, tonic::Status> {
        let (tx, rx) = mpsc::channel(16);
        let mut client =
            AggregatedDiscoveryServiceClient::new(ch).max_decoding_message_size(usize::MAX);
        let resp = client
            .delta_aggregated_resources(with_token(ReceiverStream::new(rx), token))
            .await?;
        Ok(Self {
            tx,
            rx: resp.into_inner(),
            node: Some(node(node_id)),
        })
    }

    /// Opens a stream whose first request (subscribing `type_url` to
    /// `subscribe`, with the node) is already on its way when the call
    /// starts: see [`Sotw::open_with`].
    pub async fn open_with(
        ch: Channel,
        token: Option<&str>,
        node_id: &str,
        type_url: &str,
        subscribe: &[&str],
    ) -> Result<Self, tonic::Status> {
        let (tx, rx) = mpsc::channel(16);
        let first = DeltaDiscoveryRequest {
            node: Some(node(node_id)),
            type_url: type_url.to_string(),
            resource_names_subscribe: subscribe.iter().map(|s| s.to_string()).collect(),
            ..DeltaDiscoveryRequest::default()
        };
        tx.send(first).await.expect("receiver held here");
        let mut client =
            AggregatedDiscoveryServiceClient::new(ch).max_decoding_message_size(usize::MAX);
        let resp = client
            .delta_aggregated_resources(with_token(ReceiverStream::new(rx), token))
            .await?;
        Ok(Self {
            tx,
            rx: resp.into_inner(),
            node: None,
        })
    }

    /// Sends a request.
    pub async fn send(
        &mut self,
        type_url: &str,
        subscribe: &[&str],
        unsubscribe: &[&str],
        initial: &BTreeMap<String, String>,
        nonce: &str,
        error: Option<&str>,
    ) {
        let req = DeltaDiscoveryRequest {
            node: self.node.take(),
            type_url: type_url.to_string(),
            resource_names_subscribe: subscribe.iter().map(|s| s.to_string()).collect(),
            resource_names_unsubscribe: unsubscribe.iter().map(|s| s.to_string()).collect(),
            initial_resource_versions: initial.clone().into_iter().collect(),
            response_nonce: nonce.to_string(),
            error_detail: error.map(|m| RpcStatus {
                code: 3,
                message: m.to_string(),
                ..RpcStatus::default()
            }),
            ..DeltaDiscoveryRequest::default()
        };
        self.tx.send(req).await.expect("stream open");
    }

    /// ACKs `resp`.
    pub async fn ack(&mut self, resp: &DeltaDiscoveryResponse) {
        let (t, n) = (resp.type_url.clone(), resp.nonce.clone());
        self.send(&t, &[], &[], &BTreeMap::new(), &n, None).await;
    }

    /// The next response within `wait` (`Ok(None)`: none came).
    pub async fn recv(
        &mut self,
        wait: Duration,
    ) -> Result<Option<DeltaDiscoveryResponse>, tonic::Status> {
        next(&mut self.rx, wait).await
    }
}

/// One endpoint of an assignment: `ip:port`, weight, and whether it drains.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Ep {
    /// `ip:port`.
    pub addr: String,
    /// The load-balancing weight.
    pub weight: u32,
    /// `health_status: DRAINING`.
    pub draining: bool,
    /// The locality's zone.
    pub zone: String,
}

/// Decodes a ClusterLoadAssignment: its name and endpoints, sorted.
pub fn assignment(any_value: &[u8]) -> (String, Vec<Ep>) {
    let a = ClusterLoadAssignment::decode(any_value).expect("a ClusterLoadAssignment");
    let mut eps = Vec::new();
    for l in &a.endpoints {
        let zone = l
            .locality
            .as_ref()
            .map(|l| l.zone.clone())
            .unwrap_or_default();
        for e in &l.lb_endpoints {
            let Some(lb_endpoint::HostIdentifier::Endpoint(ep)) = &e.host_identifier else {
                continue;
            };
            let Some(address::Address::SocketAddress(s)) =
                ep.address.as_ref().and_then(|a| a.address.clone())
            else {
                continue;
            };
            let port = match s.port_specifier {
                Some(socket_address::PortSpecifier::PortValue(p)) => p,
                _ => 0,
            };
            eps.push(Ep {
                addr: format!("{}:{port}", s.address),
                weight: e.load_balancing_weight.as_ref().map_or(0, |w| w.value),
                draining: e.health_status == HealthStatus::Draining as i32,
                zone: zone.clone(),
            });
        }
    }
    eps.sort();
    (a.cluster_name, eps)
}

/// Decodes a Cluster's name.
pub fn cluster_name(any_value: &[u8]) -> String {
    Cluster::decode(any_value).expect("a Cluster").name
}
