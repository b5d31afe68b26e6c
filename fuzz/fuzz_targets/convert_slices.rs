//! Any JSON list of `discovery.k8s.io/v1` EndpointSlices converts without a
//! panic; every node has a valid port.
#![no_main]

use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube_discovery_core::ConvertOptions;
use kube_discovery_core::source::convert::from_slices;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(slices) = serde_json::from_slice::<Vec<EndpointSlice>>(data) else { return };
    for opts in [
        ConvertOptions::default(),
        ConvertOptions { index_port_numbers: true, topology: true, drain_terminating: kube_discovery_core::Drain::Always, default_weight: 7, service_port_aliases: true, export_opt_in: false, external_name: None },
    ] {
        let c = from_slices(slices.iter(), &opts);
        for nodes in c.ports.values() {
            for n in nodes {
                assert!((1..=65535).contains(&n.port), "port {} out of range", n.port);
            }
        }
    }
});
