//! What kube-discovery keeps of a `v1/Service`, and what it derives from it
//! for the service's port keys.
//!
//! The endpoint objects name a port by the Service port's `name` (or, for the
//! one unnamed port a Service may have, by the resolved target number), which
//! is the APISIX port key. Gateways written for apisix-ingress-controller or
//! Kong name the SERVICE port instead: `ns/name:80` or `ns/name:http`, meaning
//! "the endpoints of that Service port's `targetPort`". Only the Service says
//! which Service port maps to which endpoint port, so the controller watches
//! Services too and keeps a [`ServiceInfo`] per Service: the ports (name,
//! port, targetPort, appProtocol), nothing else of the object (no labels,
//! selector, status, managedFields), so a Service costs a few dozen bytes.
//!
//! [`port_extras`] turns a `ServiceInfo` and the port keys the endpoints gave
//! into [`PortExtras`]:
//!
//! * `aliases`: Service-port name or number -> the existing port key it
//!   resolves to. Resolved at READ time (`lookup`, the nodes API) from this
//!   small map, so node lists are never duplicated and the APISIX `ports` map
//!   (and the APISIX dump) is exactly what it was. A real port key always
//!   wins over an alias of the same text; an alias is only written when its
//!   target key exists.
//! * `app_protocols`: port key -> the Service port's `appProtocol`, so a
//!   gateway can choose h2c, gRPC or WebSocket per port.
//! * `unresolved`: Service ports whose target has no port key at all (e.g. a
//!   `targetPort` naming a container port no endpoint has). Data, not a
//!   warning: the port simply has no nodes, and status conditions can say why.

use compact_str::CompactString;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::source::lean::AsLeanService;

pub use crate::model::PortExtras;
use crate::model::PortMap;

/// A Service port's `targetPort`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TargetPort {
    /// A container port number.
    Number(i32),
    /// A container port name (resolved per Pod by Kubernetes).
    Name(CompactString),
}

/// What is kept of one Service port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServicePort {
    /// Port name (`""` when unnamed: allowed only for a Service's single port).
    pub name: CompactString,
    /// The Service port number.
    pub port: i32,
    /// `targetPort` (defaults to `port`, as Kubernetes does).
    pub target_port: TargetPort,
    /// `appProtocol`, when set.
    pub app_protocol: Option<CompactString>,
}

/// Annotation: `"false"` leaves the Service out, `"true"` lets it in under
/// `kube_discovery.export: opt-in`.
pub const ANNOTATION_EXPORT: &str = "kubediscovery.io/export";
/// Annotation: the weight (`0..=4294967295`) of every node of the Service,
/// instead of `default_weight`.
pub const ANNOTATION_WEIGHT: &str = "kubediscovery.io/weight";

/// What is kept of one Service (see the module docs): its ports and the
/// parsed values of its two annotations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceInfo {
    /// The ports, in the Service's order.
    pub ports: Vec<ServicePort>,
    /// [`ANNOTATION_EXPORT`], when set to a valid value.
    pub export: Option<bool>,
    /// [`ANNOTATION_WEIGHT`], when set to a valid value.
    pub weight: Option<u32>,
    /// One message per annotation with an invalid value (skipped, see
    /// [`ServiceInfo::from_service`]).
    pub invalid: Vec<String>,
    /// `spec.externalName` of a Service of `type: ExternalName`.
    pub external_name: Option<CompactString>,
}

impl ServiceInfo {
    /// The parts of `svc` kube-discovery uses. An annotation with an invalid
    /// value is skipped (as if absent) and described in `invalid`, naming
    /// the Service, the annotation and the value: the caller warns and
    /// counts it, nothing guesses a value. `svc` is what the watch decodes
    /// ([`crate::source::lean::LeanService`]) or a k8s-openapi `Service`.
    pub fn from_service(svc: &(impl AsLeanService + ?Sized)) -> Self {
        let svc = svc.lean();
        let annotations = svc.metadata.annotations.as_ref();
        let get = |k: &str| annotations.and_then(|a| a.get(k)).map(|v| v.trim());
        let object = format!(
            "Service {}/{}",
            svc.metadata.namespace.as_deref().unwrap_or(""),
            svc.metadata.name.as_deref().unwrap_or("")
        );
        let mut invalid = Vec::new();
        let export = match get(ANNOTATION_EXPORT) {
            None => None,
            Some("true") => Some(true),
            Some("false") => Some(false),
            Some(v) => {
                invalid.push(format!(
                    "{object}: annotation {ANNOTATION_EXPORT}={v:?} is not \"true\" or \"false\"; annotation skipped"
                ));
                None
            }
        };
        let weight = match get(ANNOTATION_WEIGHT) {
            None => None,
            Some(v) => match v.parse::<u32>() {
                Ok(w) => Some(w),
                Err(_) => {
                    invalid.push(format!(
                        "{object}: annotation {ANNOTATION_WEIGHT}={v:?} is not an integer 0..4294967295; annotation skipped (default_weight applies)"
                    ));
                    None
                }
            },
        };
        let ports = svc
            .spec
            .iter()
            .flat_map(|s| s.ports.iter())
            .map(|p| ServicePort {
                name: p.name.clone().unwrap_or_default(),
                port: p.port,
                target_port: match &p.target_port {
                    Some(IntOrString::Int(n)) if *n != 0 => TargetPort::Number(*n),
                    Some(IntOrString::String(s)) if !s.is_empty() => {
                        // The API server writes numeric strings as ints; a
                        // hand-made object may not.
                        s.parse::<i32>().map_or_else(
                            |_| TargetPort::Name(s.as_str().into()),
                            TargetPort::Number,
                        )
                    }
                    _ => TargetPort::Number(p.port),
                },
                app_protocol: p.app_protocol.clone().filter(|a| !a.is_empty()),
            })
            .collect();
        let external_name = svc
            .spec
            .as_ref()
            .filter(|s| s.type_.as_deref() == Some("ExternalName"))
            .map(|s| CompactString::from(s.external_name.as_deref().unwrap_or("").trim()));
        Self {
            ports,
            export,
            weight,
            invalid,
            external_name,
        }
    }

    /// Whether the Service is published: `"false"` never, `"true"` always,
    /// otherwise unless `opt_in`.
    pub fn exported(&self, opt_in: bool) -> bool {
        self.export.unwrap_or(!opt_in)
    }
}

/// The port key the endpoint objects use for Service port `sp`, given the
/// keys they produced (`ports`): the port name when named; for the unnamed
/// port, the target number, or (a named targetPort, resolved per Pod) the
/// only key there is.
fn target_key(sp: &ServicePort, ports: &PortMap) -> Option<String> {
    if !sp.name.is_empty() {
        return Some(sp.name.to_string());
    }
    match &sp.target_port {
        TargetPort::Number(n) => Some(n.to_string()),
        TargetPort::Name(_) => {
            let mut keys = ports.keys();
            match (keys.next(), keys.next()) {
                (Some(only), None) => Some(only.clone()),
                _ => None,
            }
        }
    }
}

/// [`PortExtras`] of a Service with ports `ports` (see the module docs).
/// `aliases: false` leaves the alias map out (config
/// `kube_discovery.service_port_aliases`). A number shared by two Service
/// ports (TCP and UDP 53) is ambiguous and gets no alias.
pub fn port_extras(info: &ServiceInfo, ports: &PortMap, aliases: bool) -> PortExtras {
    let mut out = PortExtras::default();
    let mut ambiguous: Vec<String> = Vec::new();
    for sp in &info.ports {
        let target = target_key(sp, ports).filter(|k| ports.contains_key(k));
        let Some(target) = target else {
            let target_port = match &sp.target_port {
                TargetPort::Number(n) => n.to_string(),
                TargetPort::Name(n) => n.to_string(),
            };
            let name = if sp.name.is_empty() {
                String::new()
            } else {
                format!(" ({})", sp.name)
            };
            out.unresolved.push(format!(
                "Service port {}{name}: no endpoint has targetPort {target_port}; the port has no nodes",
                sp.port
            ));
            continue;
        };
        if let Some(ap) = &sp.app_protocol {
            out.app_protocols.insert(target.clone(), ap.to_string());
        }
        if !aliases {
            continue;
        }
        let number = sp.port.to_string();
        if number == target || ports.contains_key(&number) || ambiguous.contains(&number) {
            continue;
        }
        if out.aliases.insert(number.clone(), target).is_some() {
            out.aliases.remove(&number);
            ambiguous.push(number);
        }
    }
    out
}

#[cfg(test)]
mod tests;
