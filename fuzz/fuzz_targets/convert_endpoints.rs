//! Any JSON that deserializes as `v1/Endpoints` converts without a panic, with
//! and without the optional conversion features; every node has a valid port.
#![no_main]

use k8s_openapi::api::core::v1::Endpoints;
use kube_discovery_core::ConvertOptions;
use kube_discovery_core::source::convert::from_endpoints;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(ep) = serde_json::from_slice::<Endpoints>(data) else { return };
    for opts in [
        ConvertOptions::default(),
        ConvertOptions { index_port_numbers: true, topology: true, drain_terminating: kube_discovery_core::Drain::Fallback, default_weight: 0, service_port_aliases: true, export_opt_in: false, external_name: None },
    ] {
        let c = from_endpoints(&ep, &opts);
        for nodes in c.ports.values() {
            for n in nodes {
                assert!((1..=65535).contains(&n.port), "port {} out of range", n.port);
            }
        }
    }
});
