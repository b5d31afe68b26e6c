//! The xDS subscription state machine of ONE ADS stream: pure (no I/O, no clock,
//! no protobuf). SotW and delta are thin encoders around it in the controller crate,
//! which turn protobuf requests into [`Request`]s and [`Response`]s into protobuf
//! responses, fetching resource bodies by name from the catalog.
//!
//! It follows the xDS protocol document (envoy `docs/root/api-docs/xds_protocol.rst`;
//! "the doc" in the comments): per kind it keeps the subscription (explicit names,
//! wildcard) and what the client holds (name -> version, as sent), so it sends only what
//! the client lacks, never the same content twice, and answers ACKs, NACKs and stale
//! nonces as the doc says. A request is answered for what it changed (the first one of a
//! kind always); catalog changes arrive through [`Stream::on_change`]. Several kinds due
//! at once go out in [`Kind::ALL`] order, and a new or changed Cluster is followed by its
//! ClusterLoadAssignment (Envoy completes a cluster's warming only then).
//! `version_info` is a content hash of what the client holds, equal on every replica.

use std::collections::BTreeMap;

pub use bytestring::ByteString;

mod machine;
#[cfg(test)]
mod tests;

pub use machine::{MAX_RESOURCES_PER_RESPONSE, Stream};

/// The resource types we serve, in the order pushes are sent when several are due at once
/// (xDS "eventual consistency considerations": CDS before EDS, LDS before RDS).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
pub enum Kind {
    /// `type.googleapis.com/envoy.config.cluster.v3.Cluster` (wildcard-capable)
    Cluster,
    /// `type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment`
    ClusterLoadAssignment,
    /// `type.googleapis.com/envoy.config.listener.v3.Listener` (wildcard-capable)
    Listener,
    /// `type.googleapis.com/envoy.config.route.v3.RouteConfiguration`
    RouteConfiguration,
}

impl Kind {
    /// All kinds, in push order.
    pub const ALL: [Kind; 4] = [
        Kind::Cluster,
        Kind::ClusterLoadAssignment,
        Kind::Listener,
        Kind::RouteConfiguration,
    ];

    /// The type URL.
    pub const fn type_url(self) -> &'static str {
        match self {
            Kind::Cluster => "type.googleapis.com/envoy.config.cluster.v3.Cluster",
            Kind::ClusterLoadAssignment => {
                "type.googleapis.com/envoy.config.endpoint.v3.ClusterLoadAssignment"
            }
            Kind::Listener => "type.googleapis.com/envoy.config.listener.v3.Listener",
            Kind::RouteConfiguration => {
                "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
            }
        }
    }

    /// The kind of a type URL (`None`: a type we do not serve).
    pub fn from_type_url(url: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.type_url() == url)
    }

    /// Cluster and Listener: the "state of the world" types (a SotW response carries the
    /// complete set; an empty first subscription means wildcard).
    pub const fn is_full_state(self) -> bool {
        matches!(self, Kind::Cluster | Kind::Listener)
    }
}

/// What the server holds right now (the controller's catalog, built from the index).
/// The machine only needs names and versions; bodies are fetched by the encoder.
pub trait Catalog {
    /// The version (a content hash) of resource `name` of `kind`; `None`: it does not
    /// exist. Must also answer for alias names (a Service-port alias resolves to the same
    /// content under the alias name; the catalog decides).
    fn version(&self, kind: Kind, name: &str) -> Option<&str>;
    /// The names a wildcard subscription of `kind` gets (canonical names only), sorted.
    fn wildcard_names(&self, kind: Kind) -> Vec<&str>;
    /// Whether `name` is one of [`Catalog::wildcard_names`]. The default searches that
    /// list; a catalog with an index should answer directly, so a change reaching a delta
    /// wildcard stream costs no walk over every resource.
    fn in_wildcard(&self, kind: Kind, name: &str) -> bool {
        self.wildcard_names(kind).binary_search(&name).is_ok()
    }
}

/// One request of the client, decoded (both protocol variants).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum Request {
    /// `DiscoveryRequest` (state of the world).
    Sotw {
        /// The resource type (`type_url`).
        kind: Kind,
        /// `version_info`: the version the client last ACKed ("" on the first request).
        version_info: String,
        /// `resource_names` (empty on a full-state kind's first request = wildcard; "*" = wildcard).
        /// `ByteString`s, so a server can hand over slices of the received message: a SotW
        /// EDS ACK repeats every subscribed name, on every response.
        names: Vec<ByteString>,
        /// `response_nonce` ("" on the first request of a type).
        nonce: String,
        /// `error_detail.message` when the request is a NACK.
        error: Option<String>,
    },
    /// `DeltaDiscoveryRequest` (incremental).
    Delta {
        /// The resource type (`type_url`).
        kind: Kind,
        /// `resource_names_subscribe` ("*" = wildcard; on a full-state kind's first request an
        /// empty list also means wildcard).
        subscribe: Vec<String>,
        /// `resource_names_unsubscribe`.
        unsubscribe: Vec<String>,
        /// `initial_resource_versions` (first request of a stream/type only; what a
        /// reconnecting client already has).
        initial_versions: BTreeMap<String, String>,
        /// `response_nonce` ("" when the request is not an ACK/NACK).
        nonce: String,
        /// `error_detail.message` when the request is a NACK.
        error: Option<String>,
    },
}

impl Request {
    /// The resource type of the request.
    pub fn kind(&self) -> Kind {
        match self {
            Request::Sotw { kind, .. } | Request::Delta { kind, .. } => *kind,
        }
    }
}

/// One response to send, by name; the encoder fills in the bodies from the catalog
/// (SotW: `DiscoveryResponse`; delta: `DeltaDiscoveryResponse`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum Response {
    /// A `DiscoveryResponse`.
    Sotw {
        /// The resource type (`type_url`).
        kind: Kind,
        /// `version_info`: a content hash of the (name, version) pairs this response makes the
        /// client's state (the same on every replica for the same content).
        version_info: String,
        /// `nonce`: "1", "2", ... per stream.
        nonce: String,
        /// The resources to include (for full-state kinds: all of the subscribed set that
        /// exists; for EDS/RDS: only those that changed or are newly subscribed).
        names: Vec<String>,
    },
    /// A `DeltaDiscoveryResponse`.
    Delta {
        /// The resource type (`type_url`).
        kind: Kind,
        /// `nonce`: "1", "2", ... per stream.
        nonce: String,
        /// `system_version_info`: the content hash of what the client holds after this
        /// response (for debugging only, as the doc says).
        system_version_info: String,
        /// (name, version) of resources added or changed.
        resources: Vec<(String, String)>,
        /// `removed_resources`: deleted (subscription kept) or, for a name subscribed that
        /// does not exist, "does not exist" as the protocol doc describes.
        removed: Vec<String>,
    },
}

impl Response {
    /// The resource type of the response.
    pub fn kind(&self) -> Kind {
        match self {
            Response::Sotw { kind, .. } | Response::Delta { kind, .. } => *kind,
        }
    }

    /// The nonce of the response.
    pub fn nonce(&self) -> &str {
        match self {
            Response::Sotw { nonce, .. } | Response::Delta { nonce, .. } => nonce,
        }
    }
}

/// What a request meant, for logs and metrics (never sent).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum Event {
    /// The client accepted the response with `nonce`.
    Ack {
        /// The resource type.
        kind: Kind,
        /// The nonce of the accepted response.
        nonce: String,
    },
    /// The client rejected the response with `nonce`; `detail` is its error_detail message.
    Nack {
        /// The resource type.
        kind: Kind,
        /// The nonce of the rejected response.
        nonce: String,
        /// The client's `error_detail.message`.
        detail: String,
    },
    /// A request carried a nonce that is not the latest sent for its kind (ignored as the
    /// protocol doc says: SotW drops the whole request, delta still applies its
    /// subscription changes).
    StaleNonce {
        /// The resource type.
        kind: Kind,
        /// The stale nonce.
        nonce: String,
    },
    /// A request of the other protocol variant than the stream's first one (a SotW request
    /// on a delta stream or the reverse). Nothing was changed; the server closes the stream
    /// with an error status (`INVALID_ARGUMENT`) carrying `detail`.
    ProtocolError {
        /// The resource type of the offending request.
        kind: Kind,
        /// What was wrong, for the error status.
        detail: String,
    },
}

/// What one input produced: responses in send order, and events.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Step {
    /// The responses to send, in this order.
    pub responses: Vec<Response>,
    /// What the input meant (for logs and metrics).
    pub events: Vec<Event>,
}

/// Which names of a kind a stream wants to hear about (the server routes changes with it,
/// so a change wakes only the streams subscribed to it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Interest<'a> {
    /// Nothing of this kind.
    None,
    /// Every resource of this kind (also for a mixed wildcard + names subscription).
    Wildcard,
    /// These names, sorted.
    Names(Vec<&'a str>),
}
