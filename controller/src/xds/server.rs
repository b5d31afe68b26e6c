//! The ADS gRPC service (tonic): state-of-the-world and incremental (delta)
//! streams, both thin encoders around the pure per-stream machine
//! (`kube_discovery_core::xds::Stream`): a request is decoded into the
//! machine's [`Request`], its [`Response`]s are filled with bodies from the
//! catalog and sent. The machine decides what to send and when; this file
//! only moves bytes, checks the token and counts.

use std::sync::{Arc, PoisonError};
use std::time::Duration;

use envoy_types::pb::envoy::config::core::v3::ControlPlane;
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use kube_discovery_core::xds::{ByteString, Event, Kind, Request, Response, Stream};
use prost::Message;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Status, Streaming};

use super::hub::{Hub, StreamHandle, short};
use super::resources::Resource;
use super::wire::{self, AdsServer, DeltaResource, DeltaResponse, Out, SotwRequest, SotwResponse};
use crate::serve::http::ApiToken;
use crate::serve::metrics::Metrics;

/// The largest request we decode: a reconnecting delta client lists every
/// resource it holds in `initial_resource_versions` (about 60 bytes each:
/// 16 MiB is some 250,000 names); gRPC's default of 4 MiB is too small for a
/// big fleet's reconnect.
pub const MAX_REQUEST_BYTES: usize = 16 << 20;

/// The most streams one replica serves at once; more are refused with
/// RESOURCE_EXHAUSTED (every server we run bounds its clients).
pub const MAX_STREAMS: usize = 10_000;

/// Responses queued per stream beyond the one being written: a slow client
/// holds its changes as pending names in the hub instead.
const QUEUE: usize = 1;

/// The identifier sent as `control_plane.identifier`.
const CONTROL_PLANE: &str = "kube-discovery";

/// The ADS service.
#[derive(Clone)]
pub struct Ads {
    hub: Arc<Hub>,
    metrics: Metrics,
    stop: CancellationToken,
}

impl Ads {
    /// The service over `hub`; its streams end (UNAVAILABLE, so clients
    /// reconnect elsewhere) when `stop` is cancelled.
    pub fn new(hub: Arc<Hub>, metrics: Metrics, stop: CancellationToken) -> Self {
        Self { hub, metrics, stop }
    }

    /// The tonic service, requests bounded by [`MAX_REQUEST_BYTES`].
    pub fn into_service(self) -> AdsServer<Self> {
        AdsServer::new(self, MAX_REQUEST_BYTES)
    }

    fn open<P: Protocol>(
        &self,
        peer: Option<std::net::SocketAddr>,
        inbound: Streaming<P::Req>,
    ) -> Result<Out<P::Resp>, Status> {
        if let Some(reason) = self.hub.stale() {
            return Err(unavailable(&reason));
        }
        if self.hub.streams() >= MAX_STREAMS {
            return Err(Status::resource_exhausted(format!(
                "kube-discovery xDS serves at most {MAX_STREAMS} streams per replica"
            )));
        }
        let handle = self
            .hub
            .connect(peer.map(|p| p.to_string()).unwrap_or_default());
        let (tx, rx) = mpsc::channel(QUEUE);
        let (hub, metrics, stop) = (self.hub.clone(), self.metrics.clone(), self.stop.clone());
        tokio::spawn(async move {
            let id = handle.id;
            metrics
                .xds_streams
                .get_or_create(&protocol_label::<P>())
                .inc();
            drive::<P>(&hub, &metrics, inbound, &tx, &handle, &stop).await;
            metrics
                .xds_streams
                .get_or_create(&protocol_label::<P>())
                .dec();
            let node_id = std::mem::take(
                &mut handle
                    .info
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .node_id,
            );
            if !node_id.is_empty() {
                let labels = client_labels::<P>(node_id);
                if metrics.xds_clients.get_or_create(&labels).dec() <= 1 {
                    metrics.xds_clients.remove(&labels);
                }
            }
            hub.disconnect(id);
        });
        Ok(Box::pin(ReceiverStream::new(rx)))
    }
}

fn client_labels<P: Protocol>(node_id: String) -> crate::serve::metrics::XdsClientLabels {
    crate::serve::metrics::XdsClientLabels {
        node_id,
        protocol: P::NAME,
    }
}

fn protocol_label<P: Protocol>() -> crate::serve::metrics::XdsProtocolLabel {
    crate::serve::metrics::XdsProtocolLabel { protocol: P::NAME }
}

impl wire::Ads for Ads {
    fn sotw(
        &self,
        request: tonic::Request<Streaming<SotwRequest>>,
    ) -> Result<Out<SotwResponse>, Status> {
        let peer = request.remote_addr();
        self.open::<Sotw>(peer, request.into_inner())
    }

    fn delta(
        &self,
        request: tonic::Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Out<DeltaResponse>, Status> {
        let peer = request.remote_addr();
        self.open::<Delta>(peer, request.into_inner())
    }
}

/// A decoded request: the client's node id (first request) and the
/// machine's request, or why not.
struct Decoded {
    node_id: Option<String>,
    request: Result<Request, Undecodable>,
}

/// A request the machine does not get.
enum Undecodable {
    /// A type URL we do not serve (ignored, logged once).
    Type(String),
    /// A malformed request: the stream ends with INVALID_ARGUMENT.
    Invalid(String),
}

/// One protocol variant: how its messages map to the machine's.
trait Protocol: Send + 'static {
    type Req: Send + 'static;
    type Resp: Send + 'static + Message;
    const NAME: &'static str;
    fn decode(req: Self::Req) -> Decoded;
    fn encode(resp: Response, bodies: Vec<Option<Arc<Resource>>>) -> Self::Resp;
    /// The names whose bodies `resp` needs.
    fn names(resp: &Response) -> Vec<&str> {
        match resp {
            Response::Sotw { names, .. } => names.iter().map(String::as_str).collect(),
            Response::Delta { resources, .. } => {
                resources.iter().map(|(n, _)| n.as_str()).collect()
            }
        }
    }
}

struct Sotw;
struct Delta;

fn kind_of(type_url: &str) -> Result<Kind, Undecodable> {
    Kind::from_type_url(type_url).ok_or_else(|| Undecodable::Type(type_url.to_string()))
}

/// `resource_names` as UTF-8 strings sharing the request's buffer.
fn utf8_names(names: Vec<bytes::Bytes>) -> Result<Vec<ByteString>, Undecodable> {
    names
        .into_iter()
        .enumerate()
        .map(|(i, n)| {
            ByteString::try_from(n).map_err(|_| {
                Undecodable::Invalid(format!(
                    "DiscoveryRequest.resource_names[{i}] is not valid UTF-8"
                ))
            })
        })
        .collect()
}

impl Protocol for Sotw {
    type Req = SotwRequest;
    type Resp = SotwResponse;
    const NAME: &'static str = "sotw";

    fn decode(r: SotwRequest) -> Decoded {
        Decoded {
            node_id: r.node.map(|n| n.id),
            request: kind_of(&r.type_url).and_then(|kind| {
                Ok(Request::Sotw {
                    kind,
                    version_info: r.version_info,
                    names: utf8_names(r.resource_names)?,
                    nonce: r.response_nonce,
                    error: r.error_detail.map(|e| e.message),
                })
            }),
        }
    }

    fn encode(resp: Response, bodies: Vec<Option<Arc<Resource>>>) -> SotwResponse {
        match resp {
            Response::Sotw {
                kind,
                version_info,
                nonce,
                ..
            } => SotwResponse {
                version_info,
                resources: bodies
                    .into_iter()
                    .flatten()
                    .map(|r| r.body.clone())
                    .collect(),
                type_url: kind.type_url().to_string(),
                nonce,
                control_plane: control_plane(),
            },
            // The machine answers a SotW request in SotW; a delta response
            // here is a bug: send nothing the client could misread.
            Response::Delta { kind, nonce, .. } => SotwResponse {
                type_url: kind.type_url().to_string(),
                nonce,
                ..Default::default()
            },
        }
    }
}

impl Protocol for Delta {
    type Req = DeltaDiscoveryRequest;
    type Resp = DeltaResponse;
    const NAME: &'static str = "delta";

    fn decode(r: DeltaDiscoveryRequest) -> Decoded {
        Decoded {
            node_id: r.node.map(|n| n.id),
            request: kind_of(&r.type_url).map(|kind| Request::Delta {
                kind,
                subscribe: r.resource_names_subscribe,
                unsubscribe: r.resource_names_unsubscribe,
                initial_versions: r.initial_resource_versions.into_iter().collect(),
                nonce: r.response_nonce,
                error: r.error_detail.map(|e| e.message),
            }),
        }
    }

    fn encode(resp: Response, bodies: Vec<Option<Arc<Resource>>>) -> DeltaResponse {
        match resp {
            Response::Delta {
                kind,
                nonce,
                system_version_info,
                resources,
                removed,
            } => DeltaResponse {
                system_version_info,
                resources: resources
                    .into_iter()
                    .zip(bodies)
                    .filter_map(|((name, version), body)| {
                        body.map(|b| DeltaResource {
                            name,
                            version,
                            resource: Some(b.body.clone()),
                        })
                    })
                    .collect(),
                type_url: kind.type_url().to_string(),
                removed_resources: removed,
                nonce,
                control_plane: control_plane(),
            },
            Response::Sotw { kind, nonce, .. } => DeltaResponse {
                type_url: kind.type_url().to_string(),
                nonce,
                ..Default::default()
            },
        }
    }
}

fn control_plane() -> Option<ControlPlane> {
    Some(ControlPlane {
        identifier: CONTROL_PLANE.to_string(),
    })
}

/// Fetches the bodies of `responses` under one catalog read lock.
fn with_bodies<P: Protocol>(
    hub: &Hub,
    responses: Vec<Response>,
) -> Vec<(Response, Vec<Option<Arc<Resource>>>)> {
    let cat = hub.catalog();
    responses
        .into_iter()
        .map(|r| {
            let kind = match &r {
                Response::Sotw { kind, .. } | Response::Delta { kind, .. } => *kind,
            };
            let bodies = P::names(&r)
                .into_iter()
                .map(|n| cat.get(kind, n).cloned())
                .collect();
            (r, bodies)
        })
        .collect()
}

/// Runs one stream until the client leaves, an error, or `stop`.
async fn drive<P: Protocol>(
    hub: &Hub,
    metrics: &Metrics,
    mut inbound: Streaming<P::Req>,
    out: &mpsc::Sender<Result<P::Resp, Status>>,
    handle: &StreamHandle,
    stop: &CancellationToken,
) {
    // Nothing is answered before the first complete list: a restarting
    // replica never hands out an empty or partial set.
    tokio::select! {
        _ = hub.wait_ready() => {}
        _ = stop.cancelled() => return,
        _ = out.closed() => return,
    }
    let mut machine = Stream::new();
    // The subscription epoch the hub's routing of this stream reflects.
    let mut routed = None;
    let mut nacked: std::collections::HashSet<String> = std::collections::HashSet::new();
    let mut unknown_logged = std::collections::HashSet::new();
    loop {
        let step = tokio::select! {
            biased;
            _ = stop.cancelled() => {
                let _ = out.try_send(Err(Status::unavailable("kube-discovery is shutting down; reconnect to another replica")));
                return;
            }
            msg = inbound.message() => match msg {
                Ok(Some(req)) => {
                    let d = P::decode(req);
                    if let Some(id) = d.node_id {
                        let mut info = handle.info.lock().unwrap_or_else(PoisonError::into_inner);
                        if info.node_id.is_empty() && !id.is_empty() {
                            tracing::info!(node = %id, peer = %info.peer, protocol = P::NAME, "xDS client connected");
                            metrics.xds_clients.get_or_create(&client_labels::<P>(id.clone())).inc();
                            info.node_id = id;
                            info.protocol = P::NAME;
                        }
                    }
                    let request = match d.request {
                        Ok(r) => r,
                        Err(Undecodable::Type(url)) => {
                            if unknown_logged.insert(url.clone()) {
                                tracing::warn!(type_url = %url, "xDS request for a type kube-discovery does not serve (it serves CDS, EDS, LDS, RDS); ignored");
                            }
                            continue;
                        }
                        Err(Undecodable::Invalid(detail)) => {
                            tracing::warn!(node = %node(handle), detail = %detail, "malformed xDS request; closing the stream");
                            let _ = out.send(Err(Status::invalid_argument(detail))).await;
                            return;
                        }
                    };
                    let step = machine.on_request(request, &*hub.catalog());
                    // Only a changed subscription is re-indexed: an ACK (a SotW EDS
                    // ACK repeats every name) leaves the routing as it is.
                    if routed != Some(machine.subscription_epoch()) {
                        hub.route(handle.id, &machine);
                        routed = Some(machine.subscription_epoch());
                    }
                    (step, None)
                }
                Ok(None) => return,
                Err(status) => {
                    tracing::debug!(error = %status, "xDS stream ended by the client");
                    return;
                }
            },
            _ = handle.notify.notified() => {
                if let Some(reason) = hub.stale() {
                    let _ = out.send(Err(unavailable(&reason))).await;
                    return;
                }
                let pending = handle.take();
                let names: Vec<(Kind, Vec<&str>)> = pending
                    .names
                    .iter()
                    .map(|(k, n)| (*k, n.iter().map(String::as_str).collect()))
                    .collect();
                let changes: Vec<(Kind, &[&str])> =
                    names.iter().map(|(k, n)| (*k, n.as_slice())).collect();
                let step = machine.on_changes(&changes, &*hub.catalog());
                (step, pending.since)
            }
        };
        let (step, since) = step;
        for event in step.events {
            match event {
                Event::Ack { kind, .. } => {
                    tracing::trace!(node = %node(handle), r#type = short(kind), "xDS ACK");
                }
                Event::Nack { kind, detail, .. } => {
                    metrics.xds_nacks.get_or_create(&type_label(kind)).inc();
                    let mut info = handle.info.lock().unwrap_or_else(PoisonError::into_inner);
                    info.nacks += 1;
                    info.last_nack = Some(detail.clone());
                    if nacked.insert(detail.clone()) {
                        tracing::warn!(node = %info.node_id, r#type = short(kind), detail = %detail, "xDS client rejected an update (NACK)");
                    }
                }
                Event::StaleNonce { kind, .. } => {
                    tracing::debug!(node = %node(handle), r#type = short(kind), "xDS request with a stale nonce ignored");
                }
                Event::ProtocolError { kind, detail } => {
                    tracing::warn!(node = %node(handle), r#type = short(kind), detail = %detail, "xDS protocol error; closing the stream");
                    let _ = out
                        .send(Err(Status::invalid_argument(format!(
                            "xDS protocol error: {detail}"
                        ))))
                        .await;
                    return;
                }
            }
        }
        for (resp, bodies) in with_bodies::<P>(hub, step.responses) {
            let kind = match &resp {
                Response::Sotw { kind, .. } | Response::Delta { kind, .. } => *kind,
            };
            let msg = P::encode(resp, bodies);
            let bytes = msg.encoded_len() as u64;
            if out.send(Ok(msg)).await.is_err() {
                return;
            }
            let label = type_label(kind);
            metrics.xds_pushes.get_or_create(&label).inc();
            metrics.xds_bytes.get_or_create(&label).inc_by(bytes);
            handle
                .info
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .pushes += 1;
            if let Some(since) = since {
                metrics
                    .xds_push_latency
                    .observe(since.elapsed().as_secs_f64());
            }
        }
    }
}

fn node(h: &StreamHandle) -> String {
    h.info
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .node_id
        .clone()
}

fn type_label(kind: Kind) -> crate::serve::metrics::XdsTypeLabel {
    crate::serve::metrics::XdsTypeLabel {
        r#type: short(kind),
    }
}

/// The status that ends (or refuses) a stream while this replica does not
/// follow the API server: UNAVAILABLE, so the client keeps what it has and
/// reconnects, through the Service, to a replica that follows.
fn unavailable(reason: &str) -> Status {
    Status::unavailable(format!(
        "this kube-discovery replica stopped following the API server ({reason}); reconnect to another replica"
    ))
}

/// The bearer-token check of every call: `authorization: Bearer <token>`
/// metadata, compared in constant time; anything else is UNAUTHENTICATED
/// (the message never repeats what was sent).
pub fn check_token(token: &ApiToken, req: &tonic::Request<()>) -> Result<(), Status> {
    let got = req
        .metadata()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    match got {
        Some(t) if token.matches(t.trim()) => Ok(()),
        Some(_) => Err(Status::unauthenticated(
            "kube-discovery xDS: wrong bearer token",
        )),
        None => Err(Status::unauthenticated(
            "kube-discovery xDS: missing `authorization: Bearer <token>` metadata",
        )),
    }
}

/// HTTP/2 keepalive: a client that vanished without closing its connection
/// is found within about 40 s and its stream freed.
pub const KEEPALIVE: (Duration, Duration) = (Duration::from_secs(30), Duration::from_secs(10));

#[cfg(test)]
mod tests {
    use super::*;

    /// A name that is not UTF-8 is refused with an error naming the field and its
    /// position; valid names pass through as they are.
    #[test]
    fn resource_names_must_be_utf8() {
        let ok = utf8_names(vec!["ns/a:http".into(), "*".into()])
            .ok()
            .unwrap();
        assert_eq!(ok, ["ns/a:http", "*"]);
        let bad = vec![
            bytes::Bytes::from("ns/a:http"),
            bytes::Bytes::from(vec![0xff, 0xfe]),
        ];
        match utf8_names(bad) {
            Err(Undecodable::Invalid(detail)) => assert_eq!(
                detail,
                "DiscoveryRequest.resource_names[1] is not valid UTF-8"
            ),
            _ => panic!("a non-UTF-8 name must be refused"),
        }
    }
}
