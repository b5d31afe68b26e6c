//! Any bytes decode into the lean source types (what the watch decodes)
//! without a panic, and agree with k8s-openapi: whatever k8s-openapi decodes,
//! the lean type decodes too (but for a duplicate key, which serde's derive
//! refuses and no API server sends) into an object that converts to exactly
//! the same nodes, warnings and Service info.
#![no_main]

use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube_discovery_core::ConvertOptions;
use kube_discovery_core::source::convert::{SliceContribution, from_endpoints, merge_slices};
use kube_discovery_core::source::lean::{LeanEndpointSlice, LeanEndpoints, LeanService};
use kube_discovery_core::source::service::ServiceInfo;
use libfuzzer_sys::fuzz_target;

/// The lean decode of what k8s-openapi decoded (`full`), or `None` when it
/// refused a duplicate key.
fn agree<L: serde::de::DeserializeOwned, F>(data: &[u8], full: &Result<F, serde_json::Error>) -> Option<L> {
    let lean = serde_json::from_slice::<L>(data);
    match (full, lean) {
        (Ok(_), Ok(l)) => Some(l),
        (Ok(_), Err(e)) => {
            assert!(e.to_string().contains("duplicate field"), "k8s-openapi decodes, the lean type does not: {e}");
            None
        }
        (Err(_), _) => None,
    }
}

fuzz_target!(|data: &[u8]| {
    let opts = ConvertOptions { index_port_numbers: true, default_weight: 7, ..ConvertOptions::default() };
    let full = serde_json::from_slice::<Endpoints>(data);
    if let (Some(lean), Ok(full)) = (agree::<LeanEndpoints, _>(data, &full), &full) {
        assert_eq!(from_endpoints(&lean, &opts), from_endpoints(full, &opts));
    }
    let full = serde_json::from_slice::<EndpointSlice>(data);
    if let (Some(lean), Ok(full)) = (agree::<LeanEndpointSlice, _>(data, &full), &full) {
        for drain in [kube_discovery_core::Drain::Off, kube_discovery_core::Drain::Fallback, kube_discovery_core::Drain::Always] {
            let opts = ConvertOptions { drain_terminating: drain, ..opts.clone() };
            assert_eq!(
                merge_slices([&SliceContribution::new(&lean, &opts)], &opts),
                merge_slices([&SliceContribution::new(full, &opts)], &opts)
            );
        }
    }
    let full = serde_json::from_slice::<Service>(data);
    if let (Some(lean), Ok(full)) = (agree::<LeanService, _>(data, &full), &full) {
        assert_eq!(ServiceInfo::from_service(&lean), ServiceInfo::from_service(full));
    }
});
