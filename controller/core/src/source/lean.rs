//! The source objects as the watch decodes them: `v1/Endpoints`,
//! `discovery.k8s.io/v1/EndpointSlice` and `v1/Service` reduced, AT DECODE
//! TIME, to what the conversion reads.
//!
//! ```text
//!  watch line ──serde_json──▶ LeanEndpoints | LeanEndpointSlice ──▶ from_endpoints / SliceContribution
//!                             (unknown fields skipped by serde: scanned, never allocated)
//!  k8s-openapi Endpoints | EndpointSlice ──From──▶ the same lean types (tests, fuzz, render,
//!                                                   and the watch when topology output is on)
//! ```
//!
//! Why hand-written types instead of k8s-openapi's: those allocate every field
//! of every object (each `managedFields` entry with its `fieldsV1` tree as a
//! `serde_json::Value`, annotations, and per address an `ip`, a `nodeName` and
//! a four-string `targetRef`), which the index then drops: decoding was most
//! of an event's cost (BENCHMARKS.md, "Per-event cost"). Here serde skips every field the conversion does not read, hosts
//! and port names are [`CompactString`]s (inline up to 24 bytes: every IPv4
//! and most IPv6 addresses, so no allocation), and metadata keeps only name,
//! namespace, uid, resourceVersion, labels, ownerReferences and the
//! `kubediscovery.io/` annotations (never, e.g., the whole object that
//! `kubectl.kubernetes.io/last-applied-configuration` repeats). A
//! [`LeanService`] keeps its ports, `type` and `externalName`.
//!
//! Topology (`nodeName`, `zone`, `targetRef`) is NOT decoded by serde: a
//! decoded lean object never has it. It is opt-in output (`topology: true`),
//! and for it the controller watches the k8s-openapi types and converts them
//! with `From` (the [`Topology`] fields are filled then). One code path
//! converts both: [`AsLeanEndpoints`] / [`AsLeanSlice`].
//!
//! Same answers as k8s-openapi on any input it accepts: a field that is absent
//! or `null` is its default (k8s-openapi's rule for required fields too), and
//! the `kind`/`apiVersion`/plural come from the k8s-openapi types, so
//! kube-runtime's watcher asks for the same URLs. The one difference: a
//! duplicate key in one JSON object is an error here (serde's derive), where
//! k8s-openapi keeps the last; no API server sends one. The `lean_decode`
//! fuzz target and the tests below check this equivalence.

use std::borrow::Cow;
use std::collections::BTreeMap;

use compact_str::CompactString;
use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use crate::model::{NodeTargetRef, NodeTopology};

/// `null` or absent: the default (k8s-openapi's rule).
fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// The prefix of the Service annotations kube-discovery reads
/// (`kubediscovery.io/export`, `kubediscovery.io/weight`); a
/// [`LeanService`] keeps no other annotation.
pub const ANNOTATION_PREFIX: &str = "kubediscovery.io/";

/// The metadata kube-discovery reads, decoded into k8s-openapi's
/// [`ObjectMeta`] (kube's `Resource` trait hands that type out): name,
/// namespace, uid, resourceVersion, labels, ownerReferences and the
/// [`ANNOTATION_PREFIX`] annotations. Every other field (managedFields,
/// other annotations such as `last-applied-configuration` ...) is skipped,
/// not allocated.
fn lean_meta<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase")]
    struct Meta {
        #[serde(default)]
        name: Option<String>,
        #[serde(default)]
        namespace: Option<String>,
        #[serde(default)]
        uid: Option<String>,
        #[serde(default)]
        resource_version: Option<String>,
        #[serde(default)]
        labels: Option<BTreeMap<String, String>>,
        #[serde(default)]
        owner_references: Option<Vec<Owner>>,
        #[serde(default)]
        annotations: Option<Ours>,
    }
    /// The annotations map, reduced to ours while it is read.
    #[derive(Default)]
    struct Ours(BTreeMap<String, String>);
    impl<'de> Deserialize<'de> for Ours {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl<'de> Visitor<'de> for V {
                type Value = Ours;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("a map of annotations")
                }
                fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Ours, A::Error> {
                    let mut out = BTreeMap::new();
                    while let Some(Key(key)) = map.next_key::<Key>()? {
                        match key {
                            Some(k) => {
                                out.insert(k, map.next_value::<String>()?);
                            }
                            None => {
                                map.next_value::<IgnoredAny>()?;
                            }
                        }
                    }
                    Ok(Ours(out))
                }
            }
            d.deserialize_map(V)
        }
    }
    /// An annotation key: `Some` (owned) only for ours.
    struct Key(Option<String>);
    impl<'de> Deserialize<'de> for Key {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct V;
            impl Visitor<'_> for V {
                type Value = Key;
                fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                    f.write_str("an annotation key")
                }
                fn visit_str<E: serde::de::Error>(self, k: &str) -> Result<Key, E> {
                    Ok(Key(k.starts_with(ANNOTATION_PREFIX).then(|| k.to_string())))
                }
            }
            d.deserialize_str(V)
        }
    }
    /// What `convert::owner_service_uid` reads of an ownerReference (the
    /// name too: cheap, one per object, and an `OwnerReference` has one).
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Owner {
        #[serde(default, deserialize_with = "null_default")]
        api_version: String,
        #[serde(default, deserialize_with = "null_default")]
        kind: String,
        #[serde(default, deserialize_with = "null_default")]
        name: String,
        #[serde(default, deserialize_with = "null_default")]
        uid: String,
    }
    let m = Option::<Meta>::deserialize(d)?.unwrap_or_default();
    Ok(ObjectMeta {
        name: m.name,
        namespace: m.namespace,
        uid: m.uid,
        resource_version: m.resource_version,
        labels: m.labels,
        annotations: m.annotations.map(|a| a.0).filter(|a| !a.is_empty()),
        owner_references: m.owner_references.map(|refs| {
            refs.into_iter()
                .map(|o| OwnerReference {
                    api_version: o.api_version,
                    kind: o.kind,
                    name: o.name,
                    uid: o.uid,
                    ..OwnerReference::default()
                })
                .collect()
        }),
        ..ObjectMeta::default()
    })
}

/// The lean decode's metadata of a full object: the same fields, so both
/// paths give the index the same input.
fn reduce_meta(m: &ObjectMeta) -> ObjectMeta {
    ObjectMeta {
        name: m.name.clone(),
        namespace: m.namespace.clone(),
        uid: m.uid.clone(),
        resource_version: m.resource_version.clone(),
        labels: m.labels.clone(),
        annotations: m
            .annotations
            .as_ref()
            .map(|a| {
                a.iter()
                    .filter(|(k, _)| k.starts_with(ANNOTATION_PREFIX))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect::<BTreeMap<_, _>>()
            })
            .filter(|a| !a.is_empty()),
        owner_references: m.owner_references.as_ref().map(|refs| {
            refs.iter()
                .map(|o| OwnerReference {
                    api_version: o.api_version.clone(),
                    kind: o.kind.clone(),
                    name: o.name.clone(),
                    uid: o.uid.clone(),
                    ..OwnerReference::default()
                })
                .collect()
        }),
        ..ObjectMeta::default()
    }
}

/// The topology of one address/endpoint: never decoded by serde (see the
/// module docs), filled only by `From` a k8s-openapi object.
pub type Topology = Option<Box<NodeTopology>>;

fn topology(
    zone: Option<&String>,
    node_name: Option<&String>,
    target_ref: Option<&k8s_openapi::api::core::v1::ObjectReference>,
) -> Topology {
    NodeTopology {
        zone: zone.cloned(),
        node_name: node_name.cloned(),
        target_ref: target_ref.map(|r| NodeTargetRef {
            kind: r.kind.clone().unwrap_or_default(),
            namespace: r.namespace.clone(),
            name: r.name.clone().unwrap_or_default(),
            uid: r.uid.clone(),
        }),
    }
    .boxed()
}

/// `v1/Endpoints` as the conversion reads it: `subsets[].addresses[].ip` and
/// `subsets[].ports[]` (`notReadyAddresses` are never published, so they are
/// skipped like every other unread field).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct LeanEndpoints {
    /// Name, namespace, uid, resourceVersion, labels, ownerReferences and
    /// the `kubediscovery.io/` annotations only.
    #[serde(default, deserialize_with = "lean_meta")]
    pub metadata: ObjectMeta,
    /// `subsets`.
    #[serde(default, deserialize_with = "null_default")]
    pub subsets: Vec<LeanSubset>,
}

/// One subset of a [`LeanEndpoints`].
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct LeanSubset {
    /// `addresses` (the ready ones).
    #[serde(default, deserialize_with = "null_default")]
    pub addresses: Vec<LeanAddress>,
    /// `ports`.
    #[serde(default, deserialize_with = "null_default")]
    pub ports: Vec<LeanEndpointPort>,
}

/// One ready address of an Endpoints subset.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct LeanAddress {
    /// `ip` (inline: no allocation for any IPv4 address).
    #[serde(default, deserialize_with = "null_default")]
    pub ip: CompactString,
    /// `nodeName` and `targetRef`, only from a k8s-openapi object.
    #[serde(skip)]
    pub topology: Topology,
}

/// A port of an Endpoints subset (`port` is required there: absent = 0,
/// which the conversion rejects as outside 1..65535, as before).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct LeanEndpointPort {
    /// `name`.
    #[serde(default)]
    pub name: Option<CompactString>,
    /// `port`.
    #[serde(default, deserialize_with = "null_default")]
    pub port: i32,
}

/// `discovery.k8s.io/v1/EndpointSlice` as the conversion reads it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeanEndpointSlice {
    /// See [`LeanEndpoints::metadata`].
    #[serde(default, deserialize_with = "lean_meta")]
    pub metadata: ObjectMeta,
    /// `addressType` (IPv4, IPv6, FQDN).
    #[serde(default, deserialize_with = "null_default")]
    pub address_type: CompactString,
    /// `endpoints`.
    #[serde(default, deserialize_with = "null_default")]
    pub endpoints: Vec<LeanSliceEndpoint>,
    /// `ports`.
    #[serde(default, deserialize_with = "null_default")]
    pub ports: Vec<LeanSlicePort>,
}

/// One endpoint of a [`LeanEndpointSlice`].
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct LeanSliceEndpoint {
    /// `addresses` (the first valid one is used).
    #[serde(default, deserialize_with = "null_default")]
    pub addresses: Vec<CompactString>,
    /// `conditions` (absent = all unset).
    #[serde(default, deserialize_with = "null_default")]
    pub conditions: LeanConditions,
    /// `zone`, `nodeName` and `targetRef`, only from a k8s-openapi object.
    #[serde(skip)]
    pub topology: Topology,
}

/// `conditions` of a slice endpoint; unset ones take kube-proxy's defaults
/// in the conversion.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct LeanConditions {
    /// `ready`.
    #[serde(default)]
    pub ready: Option<bool>,
    /// `serving`.
    #[serde(default)]
    pub serving: Option<bool>,
    /// `terminating`.
    #[serde(default)]
    pub terminating: Option<bool>,
}

/// A port of an EndpointSlice (`port` is optional there).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct LeanSlicePort {
    /// `name`.
    #[serde(default)]
    pub name: Option<CompactString>,
    /// `port`.
    #[serde(default)]
    pub port: Option<i32>,
}

impl From<&Endpoints> for LeanEndpoints {
    fn from(ep: &Endpoints) -> Self {
        LeanEndpoints {
            metadata: reduce_meta(&ep.metadata),
            subsets: ep
                .subsets
                .iter()
                .flatten()
                .map(|s| LeanSubset {
                    addresses: s
                        .addresses
                        .iter()
                        .flatten()
                        .map(|a| LeanAddress {
                            ip: CompactString::from(a.ip.as_str()),
                            topology: topology(None, a.node_name.as_ref(), a.target_ref.as_ref()),
                        })
                        .collect(),
                    ports: s
                        .ports
                        .iter()
                        .flatten()
                        .map(|p| LeanEndpointPort {
                            name: p.name.as_deref().map(CompactString::from),
                            port: p.port,
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

impl From<&EndpointSlice> for LeanEndpointSlice {
    fn from(s: &EndpointSlice) -> Self {
        LeanEndpointSlice {
            metadata: reduce_meta(&s.metadata),
            address_type: CompactString::from(s.address_type.as_str()),
            endpoints: s
                .endpoints
                .iter()
                .map(|e| LeanSliceEndpoint {
                    addresses: e
                        .addresses
                        .iter()
                        .map(|a| CompactString::from(a.as_str()))
                        .collect(),
                    conditions: e
                        .conditions
                        .as_ref()
                        .map(|c| LeanConditions {
                            ready: c.ready,
                            serving: c.serving,
                            terminating: c.terminating,
                        })
                        .unwrap_or_default(),
                    topology: topology(
                        e.zone.as_ref(),
                        e.node_name.as_ref(),
                        e.target_ref.as_ref(),
                    ),
                })
                .collect(),
            ports: s
                .ports
                .iter()
                .flatten()
                .map(|p| LeanSlicePort {
                    name: p.name.as_deref().map(CompactString::from),
                    port: p.port,
                })
                .collect(),
        }
    }
}

/// `v1/Service` as [`crate::source::service::ServiceInfo`] reads it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct LeanService {
    /// See [`LeanEndpoints::metadata`].
    #[serde(default, deserialize_with = "lean_meta")]
    pub metadata: ObjectMeta,
    /// `spec`.
    #[serde(default)]
    pub spec: Option<LeanServiceSpec>,
}

/// The `spec` of a [`LeanService`].
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeanServiceSpec {
    /// `type` (ClusterIP, ExternalName ...).
    #[serde(default, rename = "type")]
    pub type_: Option<CompactString>,
    /// `externalName`.
    #[serde(default)]
    pub external_name: Option<String>,
    /// `ports`.
    #[serde(default, deserialize_with = "null_default")]
    pub ports: Vec<LeanServicePort>,
}

/// A port of a [`LeanServiceSpec`] (`port` is required: absent = 0).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeanServicePort {
    /// `name`.
    #[serde(default)]
    pub name: Option<CompactString>,
    /// `port`.
    #[serde(default, deserialize_with = "null_default")]
    pub port: i32,
    /// `targetPort`.
    #[serde(default)]
    pub target_port: Option<IntOrString>,
    /// `appProtocol`.
    #[serde(default)]
    pub app_protocol: Option<CompactString>,
}

impl From<&Service> for LeanService {
    fn from(svc: &Service) -> Self {
        LeanService {
            metadata: reduce_meta(&svc.metadata),
            spec: svc.spec.as_ref().map(|s| LeanServiceSpec {
                type_: s.type_.as_deref().map(CompactString::from),
                external_name: s.external_name.clone(),
                ports: s
                    .ports
                    .iter()
                    .flatten()
                    .map(|p| LeanServicePort {
                        name: p.name.as_deref().map(CompactString::from),
                        port: p.port,
                        target_port: p.target_port.clone(),
                        app_protocol: p.app_protocol.as_deref().map(CompactString::from),
                    })
                    .collect(),
            }),
        }
    }
}

/// A trait for "anything that can be read as this lean type": the lean type
/// itself (borrowed, no copy), a k8s-openapi object (converted), or a
/// reference to either.
macro_rules! as_lean {
    ($(#[$doc:meta])* $trait:ident: $lean:ty, $full:ty) => {
        $(#[$doc])*
        pub trait $trait {
            /// The object in its lean form.
            fn lean(&self) -> Cow<'_, $lean>;
        }

        impl $trait for $lean {
            fn lean(&self) -> Cow<'_, $lean> {
                Cow::Borrowed(self)
            }
        }

        impl<T: $trait + ?Sized> $trait for &T {
            fn lean(&self) -> Cow<'_, $lean> {
                (**self).lean()
            }
        }

        impl $trait for $full {
            fn lean(&self) -> Cow<'_, $lean> {
                Cow::Owned(self.into())
            }
        }
    };
}

as_lean!(
    /// Anything the conversion can read as a [`LeanEndpoints`]: the lean
    /// type (what the watch decodes) or a k8s-openapi [`Endpoints`].
    AsLeanEndpoints: LeanEndpoints, Endpoints
);
as_lean!(
    /// Anything the conversion can read as a [`LeanEndpointSlice`]: the lean
    /// type (what the watch decodes) or a k8s-openapi [`EndpointSlice`].
    AsLeanSlice: LeanEndpointSlice, EndpointSlice
);
as_lean!(
    /// Anything [`crate::source::service::ServiceInfo`] can read as a
    /// [`LeanService`]: the lean type (what the watch decodes) or a
    /// k8s-openapi [`Service`].
    AsLeanService: LeanService, Service
);

// kube's `Resource` comes from these through its blanket impl for
// k8s-openapi resources: the same kind, apiVersion and URL path segment as
// the real types (copied from them, so they cannot drift), so `Api<Lean*>`
// and kube-runtime's watcher request exactly what they request for them.
macro_rules! lean_resource {
    ($lean:ty, $real:ty) => {
        impl k8s_openapi::Resource for $lean {
            const API_VERSION: &'static str = <$real as k8s_openapi::Resource>::API_VERSION;
            const GROUP: &'static str = <$real as k8s_openapi::Resource>::GROUP;
            const KIND: &'static str = <$real as k8s_openapi::Resource>::KIND;
            const VERSION: &'static str = <$real as k8s_openapi::Resource>::VERSION;
            const URL_PATH_SEGMENT: &'static str =
                <$real as k8s_openapi::Resource>::URL_PATH_SEGMENT;
            type Scope = <$real as k8s_openapi::Resource>::Scope;
        }

        impl k8s_openapi::Metadata for $lean {
            type Ty = ObjectMeta;
            fn metadata(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

lean_resource!(LeanEndpoints, Endpoints);
lean_resource!(LeanEndpointSlice, EndpointSlice);
lean_resource!(LeanService, Service);

#[cfg(test)]
mod tests;
