//! kube-discovery: Endpoints/EndpointSlices -> DiscoveredService custom resources.
