//! Our wire shapes against envoy-types' messages: the same bytes both ways.

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::{ControlPlane, Node};
use envoy_types::pb::envoy::service::discovery::v3::{
    DeltaDiscoveryResponse, DiscoveryRequest, DiscoveryResponse, Resource,
};
use envoy_types::pb::google::protobuf::Any;
use envoy_types::pb::google::rpc::Status as RpcStatus;
use prost::Message;

use super::*;

fn any(type_url: &str, value: &[u8]) -> (Any, SharedAny) {
    (
        Any {
            type_url: type_url.into(),
            value: value.to_vec(),
        },
        SharedAny {
            type_url: Bytes::copy_from_slice(type_url.as_bytes()),
            value: Bytes::copy_from_slice(value),
        },
    )
}

#[test]
fn sotw_response_encodes_as_envoy_types_does() {
    let (a, sa) = any("type.googleapis.com/x.Y", b"\x0a\x03abc");
    let (b, sb) = any("type.googleapis.com/x.Y", b"");
    let theirs = DiscoveryResponse {
        version_info: "v1".into(),
        resources: vec![a, b],
        type_url: "type.googleapis.com/x.Y".into(),
        nonce: "7".into(),
        control_plane: Some(ControlPlane {
            identifier: "kube-discovery".into(),
        }),
        ..Default::default()
    };
    let ours = SotwResponse {
        version_info: "v1".into(),
        resources: vec![sa, sb],
        type_url: "type.googleapis.com/x.Y".into(),
        nonce: "7".into(),
        control_plane: Some(ControlPlane {
            identifier: "kube-discovery".into(),
        }),
    };
    assert_eq!(ours.encode_to_vec(), theirs.encode_to_vec());
    assert_eq!(ours.encoded_len(), theirs.encoded_len());
}

#[test]
fn delta_response_encodes_as_envoy_types_does() {
    let (a, sa) = any("type.googleapis.com/x.Y", b"\x0a\x01z");
    let theirs = DeltaDiscoveryResponse {
        system_version_info: "s".into(),
        resources: vec![Resource {
            name: "ns/a:http".into(),
            version: "abc".into(),
            resource: Some(a),
            ..Default::default()
        }],
        type_url: "type.googleapis.com/x.Y".into(),
        removed_resources: vec!["ns/gone:http".into(), "ns/b:http".into()],
        nonce: "3".into(),
        control_plane: Some(ControlPlane {
            identifier: "kube-discovery".into(),
        }),
        ..Default::default()
    };
    let ours = DeltaResponse {
        system_version_info: "s".into(),
        resources: vec![DeltaResource {
            name: "ns/a:http".into(),
            version: "abc".into(),
            resource: Some(sa),
        }],
        type_url: "type.googleapis.com/x.Y".into(),
        removed_resources: vec!["ns/gone:http".into(), "ns/b:http".into()],
        nonce: "3".into(),
        control_plane: Some(ControlPlane {
            identifier: "kube-discovery".into(),
        }),
    };
    assert_eq!(ours.encode_to_vec(), theirs.encode_to_vec());
}

#[test]
fn sotw_request_decodes_what_envoy_types_encodes() {
    let theirs = DiscoveryRequest {
        version_info: "v9".into(),
        node: Some(Node {
            id: "envoy-1".into(),
            cluster: "edge".into(),
            ..Default::default()
        }),
        resource_names: vec!["ns/a:http".into(), "*".into(), "ns/ü:grpc".into()],
        type_url: "type.googleapis.com/x.Y".into(),
        response_nonce: "12".into(),
        error_detail: Some(RpcStatus {
            code: 3,
            message: "bad".into(),
            details: vec![],
        }),
        // Not read by this server: skipped, not an error.
        resource_locators: vec![Default::default()],
    };
    let bytes = Bytes::from(theirs.encode_to_vec());
    let ours = SotwRequest::decode(bytes).unwrap();
    assert_eq!(ours.version_info, "v9");
    assert_eq!(ours.node.unwrap().id, "envoy-1");
    assert_eq!(
        ours.resource_names,
        [&b"ns/a:http"[..], b"*", "ns/ü:grpc".as_bytes()]
    );
    assert_eq!(ours.type_url, "type.googleapis.com/x.Y");
    assert_eq!(ours.response_nonce, "12");
    assert_eq!(ours.error_detail.unwrap().message, "bad");
}

/// The names of a request decoded from a `Bytes` buffer point into it: no copy
/// per name (the reason for the type).
#[test]
fn sotw_request_names_share_the_buffer() {
    let theirs = DiscoveryRequest {
        resource_names: (0..100).map(|i| format!("ns/svc-{i}:http")).collect(),
        ..Default::default()
    };
    let bytes = Bytes::from(theirs.encode_to_vec());
    let range = bytes.as_ptr_range();
    let ours = SotwRequest::decode(bytes.clone()).unwrap();
    assert_eq!(ours.resource_names.len(), 100);
    for n in &ours.resource_names {
        assert!(
            range.contains(&n.as_ptr()),
            "a name was copied out of the buffer"
        );
    }
}
