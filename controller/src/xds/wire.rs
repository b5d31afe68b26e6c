//! The ADS messages as this server reads and writes them, and the tonic service
//! that carries them: envoy-types' messages with the same field numbers and wire
//! types (a test compares bytes both ways), but with [`Bytes`] where envoy-types
//! copies:
//! - a resource in a response is its catalog entry's encoded `Any`, shared, not
//!   a `Vec<u8>` clone per stream (a first EDS response of 10,000 assignments
//!   copied 3.3 MB per stream, and held it twice while queued);
//! - a SotW request's `resource_names` are slices of the received buffer
//!   (prost allocates a `String` per name, and a SotW EDS ACK names every
//!   subscribed resource, on every response).
//!
//! Delta requests keep envoy-types' message (they name only what changes).
//! The service is tonic's streaming plumbing (`tonic::server::Grpc`) with a
//! prost codec of these messages: what envoy-types generates, for our types.

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::{ControlPlane, Node};
use envoy_types::pb::envoy::service::discovery::v3::DeltaDiscoveryRequest;
use envoy_types::pb::google::rpc::Status as RpcStatus;
use tonic::codegen;
use tonic::server::{Grpc, NamedService, StreamingService};
use tonic::{Request, Response, Status, Streaming};

/// A `google.protobuf.Any` whose bytes are shared (a clone is two reference
/// counts, not a copy).
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct SharedAny {
    /// `type_url`.
    #[prost(bytes = "bytes", tag = "1")]
    pub type_url: Bytes,
    /// `value`: the encoded resource.
    #[prost(bytes = "bytes", tag = "2")]
    pub value: Bytes,
}

/// `envoy.service.discovery.v3.DiscoveryRequest`, its names unparsed (see the
/// module doc); `resource_locators` (tag 7) are skipped.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SotwRequest {
    /// `version_info`.
    #[prost(string, tag = "1")]
    pub version_info: String,
    /// `node`.
    #[prost(message, optional, tag = "2")]
    pub node: Option<Node>,
    /// `resource_names`, as received (UTF-8 is checked by the caller).
    #[prost(bytes = "bytes", repeated, tag = "3")]
    pub resource_names: Vec<Bytes>,
    /// `type_url`.
    #[prost(string, tag = "4")]
    pub type_url: String,
    /// `response_nonce`.
    #[prost(string, tag = "5")]
    pub response_nonce: String,
    /// `error_detail`.
    #[prost(message, optional, tag = "6")]
    pub error_detail: Option<RpcStatus>,
}

/// `envoy.service.discovery.v3.DiscoveryResponse`, resources shared.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SotwResponse {
    /// `version_info`.
    #[prost(string, tag = "1")]
    pub version_info: String,
    /// `resources`.
    #[prost(message, repeated, tag = "2")]
    pub resources: Vec<SharedAny>,
    /// `type_url`.
    #[prost(string, tag = "4")]
    pub type_url: String,
    /// `nonce`.
    #[prost(string, tag = "5")]
    pub nonce: String,
    /// `control_plane`.
    #[prost(message, optional, tag = "6")]
    pub control_plane: Option<ControlPlane>,
}

/// `envoy.service.discovery.v3.Resource` (of a delta response), body shared.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeltaResource {
    /// `version`.
    #[prost(string, tag = "1")]
    pub version: String,
    /// `resource`.
    #[prost(message, optional, tag = "2")]
    pub resource: Option<SharedAny>,
    /// `name`.
    #[prost(string, tag = "3")]
    pub name: String,
}

/// `envoy.service.discovery.v3.DeltaDiscoveryResponse`, resources shared.
#[derive(Clone, PartialEq, prost::Message)]
pub struct DeltaResponse {
    /// `system_version_info`.
    #[prost(string, tag = "1")]
    pub system_version_info: String,
    /// `resources`.
    #[prost(message, repeated, tag = "2")]
    pub resources: Vec<DeltaResource>,
    /// `type_url`.
    #[prost(string, tag = "4")]
    pub type_url: String,
    /// `nonce`.
    #[prost(string, tag = "5")]
    pub nonce: String,
    /// `removed_resources`.
    #[prost(string, repeated, tag = "6")]
    pub removed_resources: Vec<String>,
    /// `control_plane`.
    #[prost(message, optional, tag = "7")]
    pub control_plane: Option<ControlPlane>,
}

/// A response stream.
pub type Out<T> = Pin<Box<dyn futures::Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The two ADS calls, as [`AdsServer`] hands them over.
pub trait Ads: Send + Sync + 'static {
    /// `StreamAggregatedResources` (state of the world).
    fn sotw(&self, request: Request<Streaming<SotwRequest>>) -> Result<Out<SotwResponse>, Status>;
    /// `DeltaAggregatedResources` (incremental).
    fn delta(
        &self,
        request: Request<Streaming<DeltaDiscoveryRequest>>,
    ) -> Result<Out<DeltaResponse>, Status>;
}

const SOTW_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
const DELTA_PATH: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// `envoy.service.discovery.v3.AggregatedDiscoveryService` over an [`Ads`].
pub struct AdsServer<T> {
    inner: Arc<T>,
    max_request_bytes: usize,
}

impl<T> Clone for AdsServer<T> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            max_request_bytes: self.max_request_bytes,
        }
    }
}

impl<T: Ads> AdsServer<T> {
    /// The service; requests larger than `max_request_bytes` are refused.
    pub fn new(inner: T, max_request_bytes: usize) -> Self {
        Self {
            inner: Arc::new(inner),
            max_request_bytes,
        }
    }
}

impl<T> NamedService for AdsServer<T> {
    const NAME: &'static str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
}

struct SotwCall<T>(Arc<T>);
struct DeltaCall<T>(Arc<T>);

impl<T: Ads> StreamingService<SotwRequest> for SotwCall<T> {
    type Response = SotwResponse;
    type ResponseStream = Out<SotwResponse>;
    type Future = std::future::Ready<Result<Response<Self::ResponseStream>, Status>>;
    fn call(&mut self, request: Request<Streaming<SotwRequest>>) -> Self::Future {
        std::future::ready(self.0.sotw(request).map(Response::new))
    }
}

impl<T: Ads> StreamingService<DeltaDiscoveryRequest> for DeltaCall<T> {
    type Response = DeltaResponse;
    type ResponseStream = Out<DeltaResponse>;
    type Future = std::future::Ready<Result<Response<Self::ResponseStream>, Status>>;
    fn call(&mut self, request: Request<Streaming<DeltaDiscoveryRequest>>) -> Self::Future {
        std::future::ready(self.0.delta(request).map(Response::new))
    }
}

impl<T, B> codegen::Service<codegen::http::Request<B>> for AdsServer<T>
where
    T: Ads,
    B: codegen::Body + Send + 'static,
    B::Error: Into<codegen::StdError> + Send + 'static,
{
    type Response = codegen::http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = codegen::BoxFuture<Self::Response, Infallible>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: codegen::http::Request<B>) -> Self::Future {
        let limit = Some(self.max_request_bytes);
        let inner = self.inner.clone();
        match req.uri().path() {
            SOTW_PATH => Box::pin(async move {
                let codec = tonic_prost::ProstCodec::<SotwResponse, SotwRequest>::default();
                let mut grpc = Grpc::new(codec).apply_max_message_size_config(limit, None);
                Ok(grpc.streaming(SotwCall(inner), req).await)
            }),
            DELTA_PATH => Box::pin(async move {
                let codec =
                    tonic_prost::ProstCodec::<DeltaResponse, DeltaDiscoveryRequest>::default();
                let mut grpc = Grpc::new(codec).apply_max_message_size_config(limit, None);
                Ok(grpc.streaming(DeltaCall(inner), req).await)
            }),
            _ => Box::pin(async move { Ok(Status::unimplemented("").into_http()) }),
        }
    }
}

#[cfg(test)]
mod tests;
