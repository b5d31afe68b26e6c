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
mod tests {
    use super::*;
    use crate::model::Node;
    use k8s_openapi::api::core::v1::Service;
    use serde_json::json;
    use std::collections::BTreeMap;

    fn svc(ports: serde_json::Value) -> ServiceInfo {
        let s: Service = serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "ns"},
            "spec": {"ports": ports}
        }))
        .unwrap();
        ServiceInfo::from_service(&s)
    }

    fn keys(ks: &[&str]) -> PortMap {
        ks.iter()
            .map(|k| (k.to_string(), vec![Node::new("10.0.0.1", 8080, 1)]))
            .collect()
    }

    #[test]
    fn keeps_only_the_ports() {
        let info = svc(json!([
            {"name": "http", "port": 80, "targetPort": "web", "appProtocol": "kubernetes.io/h2c"},
            {"name": "metrics", "port": 9090},
            {"name": "grpc", "port": 81, "targetPort": 9000}
        ]));
        assert_eq!(
            info.ports,
            vec![
                ServicePort {
                    name: "http".into(),
                    port: 80,
                    target_port: TargetPort::Name("web".into()),
                    app_protocol: Some("kubernetes.io/h2c".into()),
                },
                ServicePort {
                    name: "metrics".into(),
                    port: 9090,
                    target_port: TargetPort::Number(9090),
                    app_protocol: None,
                },
                ServicePort {
                    name: "grpc".into(),
                    port: 81,
                    target_port: TargetPort::Number(9000),
                    app_protocol: None,
                },
            ]
        );
        let none: Service = serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap();
        assert_eq!(ServiceInfo::from_service(&none), ServiceInfo::default());
    }

    #[test]
    fn named_ports_alias_their_number_and_carry_app_protocol() {
        let info = svc(json!([
            {"name": "http", "port": 80, "targetPort": "web", "appProtocol": "kubernetes.io/h2c"},
            {"name": "grpc", "port": 81, "targetPort": 9000, "appProtocol": "grpc"}
        ]));
        let x = port_extras(&info, &keys(&["grpc", "http"]), true);
        assert_eq!(
            x.aliases,
            BTreeMap::from([("80".into(), "http".into()), ("81".into(), "grpc".into())])
        );
        assert_eq!(
            x.app_protocols,
            BTreeMap::from([
                ("grpc".into(), "grpc".into()),
                ("http".into(), "kubernetes.io/h2c".into())
            ])
        );
        assert!(x.unresolved.is_empty());
        // Aliases off: the appProtocols stay.
        let off = port_extras(&info, &keys(&["grpc", "http"]), false);
        assert!(off.aliases.is_empty());
        assert_eq!(off.app_protocols.len(), 2);
    }

    #[test]
    fn unnamed_port_aliases_to_the_target_number_or_the_only_key() {
        let info = svc(json!([{"port": 80, "targetPort": 8080}]));
        let x = port_extras(&info, &keys(&["8080"]), true);
        assert_eq!(x.aliases, BTreeMap::from([("80".into(), "8080".into())]));
        // Same number as the key: nothing to alias.
        let same = svc(json!([{"port": 8080}]));
        assert!(port_extras(&same, &keys(&["8080"]), true).is_empty());
        // A named targetPort: the only key, never a guess between several.
        let named = svc(json!([{"port": 80, "targetPort": "web"}]));
        let x = port_extras(&named, &keys(&["8080"]), true);
        assert_eq!(x.aliases, BTreeMap::from([("80".into(), "8080".into())]));
        let x = port_extras(&named, &keys(&["8080", "8081"]), true);
        assert!(x.aliases.is_empty());
        assert_eq!(x.unresolved.len(), 1);
    }

    #[test]
    fn real_keys_win_and_shared_numbers_are_ambiguous() {
        // index_port_numbers made "80" a real key: no alias shadows it.
        let info = svc(json!([
            {"name": "a", "port": 80, "targetPort": 8080},
            {"name": "b", "port": 8080, "targetPort": 80}
        ]));
        let ports = keys(&["80", "8080", "a", "b"]);
        assert!(port_extras(&info, &ports, true).aliases.is_empty());
        // TCP and UDP 53: the number names two ports, so no alias.
        let dns = svc(json!([
            {"name": "dns", "port": 53, "protocol": "UDP"},
            {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
            {"name": "metrics", "port": 9153}
        ]));
        let x = port_extras(&dns, &keys(&["dns", "dns-tcp", "metrics"]), true);
        assert_eq!(
            x.aliases,
            BTreeMap::from([("9153".into(), "metrics".into())])
        );
    }

    #[test]
    fn a_target_without_endpoints_is_unresolved_not_aliased() {
        let info = svc(json!([
            {"name": "http", "port": 80, "targetPort": "web"},
            {"name": "admin", "port": 9000, "targetPort": "admin"}
        ]));
        let x = port_extras(&info, &keys(&["http"]), true);
        assert_eq!(x.aliases, BTreeMap::from([("80".into(), "http".into())]));
        assert_eq!(
            x.unresolved,
            vec![
                "Service port 9000 (admin): no endpoint has targetPort admin; the port has no nodes"
                    .to_string()
            ]
        );
    }

    #[test]
    fn resolve_prefers_real_keys() {
        let ports = keys(&["http", "80x"]);
        let x = PortExtras {
            aliases: BTreeMap::from([
                ("80".into(), "http".into()),
                ("http".into(), "80x".into()),
                ("81".into(), "gone".into()),
            ]),
            ..PortExtras::default()
        };
        assert_eq!(x.resolve(&ports, "http"), Some("http"));
        assert_eq!(x.resolve(&ports, "80"), Some("http"));
        assert_eq!(x.resolve(&ports, "81"), None);
        assert_eq!(x.resolve(&ports, "nope"), None);
    }

    /// The object-size effect of aliases, measured on the JSON of the
    /// written object: the node lists and `ports` are byte-identical, the
    /// only growth is the small `aliases` map (and `appProtocols` where a
    /// port sets one), whatever the number of nodes. Sizes are printed for
    /// the docs (`--nocapture`).
    #[test]
    fn aliases_cost_only_their_small_map() {
        use crate::crd::{ObjectNaming, desired_object};
        use crate::model::{ServiceKey, ServiceNodes, SourceKind};
        let info = svc(json!([
            {"name": "http", "port": 80, "targetPort": "web"},
            {"name": "metrics", "port": 9090, "targetPort": 9091}
        ]));
        for nodes in [2usize, 100, 1000] {
            let ports: PortMap = ["http", "metrics"]
                .iter()
                .map(|k| {
                    let list = (0..nodes)
                        .map(|i| Node::new(format!("10.0.{}.{}", i / 250, i % 250), 8080, 50))
                        .collect();
                    (k.to_string(), list)
                })
                .collect();
            let plain = ServiceNodes::new(
                ServiceKey::new("", "ns", "web"),
                SourceKind::EndpointSlice,
                ports.clone(),
                None,
            );
            let with = plain.clone().with_extras(port_extras(&info, &ports, true));
            let obj = |s: &ServiceNodes| desired_object(s, &ObjectNaming::source());
            let (a, b) = (obj(&plain), obj(&with));
            assert_eq!(
                serde_json::to_string(&a.spec.ports).unwrap(),
                serde_json::to_string(&b.spec.ports).unwrap()
            );
            let size = |o| serde_json::to_vec(o).unwrap().len();
            let growth = size(&b) - size(&a);
            // Exactly the alias map (versions have equal length).
            let map = r#","aliases":{"80":"http","9090":"metrics"}"#;
            assert_eq!(growth, map.len());
            eprintln!(
                "{nodes} nodes x 2 ports: object {} -> {} bytes (+{growth})",
                size(&a),
                size(&b)
            );
        }
    }
}
