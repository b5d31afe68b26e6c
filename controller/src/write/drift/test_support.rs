//! Builders shared by the drift tests.

use kube::runtime::watcher::Event;
use kube_discovery_core::crd::{DiscoveredService, ObjectNaming};
use kube_discovery_core::{Node, PortMap, ServiceKey, ServiceNodes, SourceKind};

use super::{DriftFeed, DriftView, Watched};

pub(super) fn svc(hosts: &[&str]) -> ServiceNodes {
    svc_at(ServiceKey::new("", "ns", "web"), hosts, Some("uid-1"))
}

pub(super) fn svc_at(key: ServiceKey, hosts: &[&str], uid: Option<&str>) -> ServiceNodes {
    let mut ports = PortMap::new();
    ports.insert(
        "http".into(),
        hosts.iter().map(|h| Node::new(*h, 80, 50)).collect(),
    );
    ServiceNodes::new(key, SourceKind::EndpointSlice, ports, uid.map(String::from))
}

/// A service of `n` nodes on two ports (big enough to shard with a
/// small limit).
pub(super) fn big(n: usize) -> ServiceNodes {
    let mut ports = PortMap::new();
    for port in ["grpc", "http"] {
        ports.insert(
            port.into(),
            (0..n)
                .map(|i| Node::new(format!("10.0.{}.{}", i / 250, i % 250 + 1), 80, 50))
                .collect(),
        );
    }
    ServiceNodes::new(
        ServiceKey::new("", "ns", "web"),
        SourceKind::EndpointSlice,
        ports,
        Some("uid-1".into()),
    )
}

pub(super) fn with_rv(mut o: DiscoveredService, rv: u64) -> DiscoveredService {
    o.metadata.resource_version = Some(rv.to_string());
    o
}

pub(super) fn apply(o: &DiscoveredService) -> Event<Watched> {
    Event::Apply(Watched::of(o))
}

pub(super) fn init_apply(o: &DiscoveredService) -> Event<Watched> {
    Event::InitApply(Watched::of(o))
}

pub(super) fn delete(o: &DiscoveredService) -> Event<Watched> {
    Event::Delete(Watched::of(o))
}

/// A listed, ready view.
pub(super) fn listed(naming: ObjectNaming) -> (DriftView, DriftFeed) {
    let (view, mut w) = DriftView::new(naming);
    w.apply(&Event::Init);
    w.apply(&Event::InitDone);
    (view, w)
}
