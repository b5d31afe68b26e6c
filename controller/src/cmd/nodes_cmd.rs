//! `kube-discovery nodes`: one read of what the controller published (the
//! DiscoveredServices, or the ConfigMap snapshot through the API or as
//! mounted files), one lookup, JSON out. The reading is the client crate's
//! ([`kube_discovery_client::NodesFrom`]); in-process Rust gateways use its
//! `NodesResolver`.

use std::path::PathBuf;

use kube_discovery_client::NodesFrom;
use kube_discovery_core::parse_service_name;

use crate::{Error, InputError, Result};

/// Looks `service` (`[id/]ns/name:port`) up in `from`; the kubeconfig and
/// context are used when `from` needs the API server.
pub async fn nodes_command(
    service: &str,
    kubeconfig: Option<PathBuf>,
    context: Option<String>,
    from: NodesFrom,
) -> Result<String> {
    let q = parse_service_name(service).map_err(InputError::ServiceName)?;
    let client = if from.needs_client() {
        Some(
            crate::k8s::client::client(
                &crate::k8s::client::Connection::Kubeconfig {
                    path: kubeconfig,
                    context,
                },
                &crate::k8s::client::ClientLimits::default(),
            )
            .await?,
        )
    } else {
        None
    };
    match from.nodes(client.as_ref(), &q).await? {
        Some(nodes) => Ok(serde_json::to_string_pretty(&nodes)?),
        None => Err(Error::NoNodes {
            query: q.to_string(),
            reason: "no such service and port",
        }),
    }
}
