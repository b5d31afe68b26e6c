//! `v1/Endpoints` -> [`PortMap`]: `subsets[].addresses x subsets[].ports`.

use std::collections::BTreeMap;

#[cfg(test)]
use k8s_openapi::api::core::v1::Endpoints;

use super::{
    AddressType, ConvertOptions, Converted, SkipReason, Warnings, finish, object_name,
    valid_address, validate_ports,
};
use crate::model::Node;
use crate::source::lean::AsLeanEndpoints;

/// Converts one Endpoints object. Only `addresses` count, never
/// `notReadyAddresses`. A port key whose subset has no ready address is still
/// present, with an empty node list (as in APISIX).
///
/// `ep` is what the watch decodes ([`crate::source::lean::LeanEndpoints`]) or a
/// k8s-openapi `Endpoints`.
pub fn from_endpoints(ep: &(impl AsLeanEndpoints + ?Sized), opts: &ConvertOptions) -> Converted {
    let ep = ep.lean();
    let obj = object_name("Endpoints", &ep.metadata);
    let mut warnings = Warnings::default();
    let mut ports: BTreeMap<String, Vec<Node>> = BTreeMap::new();
    for (si, subset) in ep.subsets.iter().enumerate() {
        let what = format!("{obj}: subsets[{si}]");
        let specs = validate_ports(
            subset
                .ports
                .iter()
                .map(|p| (p.name.as_deref(), Some(p.port))),
            opts,
            &what,
            &mut warnings,
        );
        for spec in &specs {
            for key in spec.keys() {
                ports.entry(key.clone()).or_default();
            }
        }
        for (ai, addr) in subset.addresses.iter().enumerate() {
            if !valid_address(&addr.ip, AddressType::AnyIp) {
                warnings.push(
                    SkipReason::InvalidAddress,
                    format!(
                        "{what}.addresses[{ai}].ip {:?} is not a valid IP address; address skipped",
                        addr.ip
                    ),
                );
                continue;
            }
            for spec in &specs {
                let mut node = Node::new(addr.ip.clone(), spec.number, opts.default_weight);
                if opts.topology {
                    node = node.with_boxed_topology(addr.topology.clone());
                }
                for key in spec.keys() {
                    ports.entry(key.clone()).or_default().push(node.clone());
                }
            }
        }
    }
    warnings.finish(finish(ports))
}

#[cfg(test)]
mod tests;
