//! `render`: Kubernetes objects in, the DiscoveredServices the controller would
//! write out, through the SAME [`Index`] and conversion code. Used by
//! `kube-discovery render -f FILE` (whose `--nodes` answers a query with the
//! client crate's `lookup`).
//!
//! ```text
//!  [Value] ──flatten Lists──▶ Endpoints | EndpointSlice | Service (others ignored)
//!          ──Index::reset_*──▶ ServiceNodes ──desired_objects──▶ [DiscoveredService]
//! ```
//!
//! Input rules: `null` documents are skipped; `*List` objects are flattened
//! (items of typed lists such as `EndpointsList` get the item kind); objects
//! without `metadata.namespace` are in `default` (as with `kubectl apply`);
//! Services only contribute their UID (for the ownerReference); any other kind
//! is ignored. An object of a known kind that does not deserialize is an error
//! naming its position, kind and name.

use k8s_openapi::api::core::v1::{Endpoints, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::Value;

use crate::config::{ClusterConfig, Config, Settings};
use crate::crd::{DiscoveredService, ObjectNaming, desired_objects};
use crate::index::Index;
use crate::model::SourceKind;
use crate::source::convert::ConvertOptions;
use crate::source::filter::{LabelSelector, NamespaceFilter};
use crate::source::service::ServiceInfo;

/// What `render` needs from the configuration.
#[derive(Debug, Clone, Default)]
pub struct RenderOptions {
    /// Cluster id (`""` single cluster).
    pub cluster: String,
    /// Source kind; `None` = EndpointSlices if the input has any, else Endpoints.
    pub source: Option<SourceKind>,
    /// Conversion knobs.
    pub convert: ConvertOptions,
    /// Namespace filter.
    pub namespace_selector: NamespaceFilter,
    /// Label selector.
    pub label_selector: LabelSelector,
    /// Object naming.
    pub naming: ObjectNaming,
}

impl RenderOptions {
    /// Options equal to what the controller uses for `cluster`.
    pub fn from_cluster(cluster: &ClusterConfig, settings: &Settings) -> Self {
        Self {
            cluster: cluster.id.clone(),
            source: Some(cluster.source()),
            convert: cluster.convert_options(settings),
            namespace_selector: cluster.namespace_selector.clone(),
            label_selector: cluster.label_selector.clone(),
            naming: settings.sinks.discoveredservices.naming.clone(),
        }
    }

    /// Options for cluster `id` of `config` (`""` in single-cluster mode).
    pub fn from_config(config: &Config, id: &str) -> Option<Self> {
        config
            .cluster(id)
            .map(|c| Self::from_cluster(c, &config.settings))
    }
}

/// Why an input could not be rendered.
#[derive(Debug, Clone, thiserror::Error)]
pub enum RenderError {
    /// A document is not a JSON/YAML object.
    #[error("object #{index}: not an object (expected a Kubernetes object or List)")]
    NotAnObject {
        /// Position in the (flattened) input, from 1.
        index: usize,
    },
    /// A known kind failed to deserialize.
    #[error("object #{index} ({kind} {name}): {source}")]
    Invalid {
        /// Position in the (flattened) input, from 1.
        index: usize,
        /// Kind.
        kind: String,
        /// `namespace/name`.
        name: String,
        /// The deserialization error.
        #[source]
        source: std::sync::Arc<serde_json::Error>,
    },
    /// A known kind with an apiVersion we do not read.
    #[error(
        "object #{index} ({kind} {name}): unsupported apiVersion {api_version:?} (expected {expected})"
    )]
    UnsupportedApiVersion {
        /// Position in the (flattened) input, from 1.
        index: usize,
        /// Kind.
        kind: String,
        /// `namespace/name`.
        name: String,
        /// What the object says.
        api_version: String,
        /// What we read.
        expected: &'static str,
    },
}

/// Result of [`render_report`].
#[derive(Debug, Clone, Default)]
pub struct Rendered {
    /// The objects, ordered by service key.
    pub objects: Vec<DiscoveredService>,
    /// Conversion warnings (skipped bad data), one line each.
    pub warnings: Vec<String>,
}

fn flatten(values: &[Value], kind_hint: Option<&str>, out: &mut Vec<(Value, Option<String>)>) {
    for v in values {
        if let Some(kind) = v.get("kind").and_then(Value::as_str)
            && let Some(base) = kind.strip_suffix("List")
            && let Some(items) = v.get("items").and_then(Value::as_array)
        {
            let hint = (!base.is_empty()).then_some(base);
            flatten(items, hint, out);
            continue;
        }
        out.push((v.clone(), kind_hint.map(str::to_string)));
    }
}

fn ns_name(v: &Value) -> String {
    let m = v.get("metadata");
    let get = |k: &str| {
        m.and_then(|m| m.get(k))
            .and_then(Value::as_str)
            .unwrap_or("")
    };
    let ns = match get("namespace") {
        "" => "default",
        n => n,
    };
    format!("{ns}/{}", get("name"))
}

fn typed<T: serde::de::DeserializeOwned>(
    index: usize,
    kind: &str,
    v: Value,
) -> Result<T, RenderError> {
    let name = ns_name(&v);
    let mut v = v;
    // Manifests often omit the namespace: kubectl puts them into `default`.
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut)
        && meta
            .get("namespace")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
    {
        meta.insert("namespace".into(), Value::String("default".into()));
    }
    serde_json::from_value(v).map_err(|e| RenderError::Invalid {
        index,
        kind: kind.to_string(),
        name,
        source: e.into(),
    })
}

fn check_api_version(
    index: usize,
    kind: &str,
    v: &Value,
    expected: &'static str,
) -> Result<(), RenderError> {
    match v.get("apiVersion").and_then(Value::as_str) {
        None => Ok(()),
        Some(a) if a == expected => Ok(()),
        Some(a) => Err(RenderError::UnsupportedApiVersion {
            index,
            kind: kind.to_string(),
            name: ns_name(v),
            api_version: a.to_string(),
            expected,
        }),
    }
}

/// Renders and returns the objects plus conversion warnings.
pub fn render_report(objects: &[Value], opts: &RenderOptions) -> Result<Rendered, RenderError> {
    let mut flat = Vec::new();
    flatten(objects, None, &mut flat);
    let mut endpoints = Vec::new();
    let mut slices = Vec::new();
    let mut service_uids = Vec::new();
    let mut services = Vec::new();
    for (i, (v, hint)) in flat.into_iter().enumerate() {
        let index = i + 1;
        if v.is_null() {
            continue;
        }
        if !v.is_object() {
            return Err(RenderError::NotAnObject { index });
        }
        let kind = v
            .get("kind")
            .and_then(Value::as_str)
            .map(str::to_string)
            .or(hint)
            .unwrap_or_default();
        match kind.as_str() {
            "Endpoints" => {
                check_api_version(index, &kind, &v, "v1")?;
                endpoints.push(typed::<Endpoints>(index, &kind, v)?);
            }
            "EndpointSlice" => {
                check_api_version(index, &kind, &v, "discovery.k8s.io/v1")?;
                slices.push(typed::<EndpointSlice>(index, &kind, v)?);
            }
            "Service" => {
                check_api_version(index, &kind, &v, "v1")?;
                let svc = typed::<Service>(index, &kind, v)?;
                let info = ServiceInfo::from_service(&svc);
                if let (Some(ns), Some(name)) = (&svc.metadata.namespace, &svc.metadata.name) {
                    services.push((ns.clone(), name.clone(), info));
                }
                if let (Some(ns), Some(name), Some(uid)) =
                    (svc.metadata.namespace, svc.metadata.name, svc.metadata.uid)
                {
                    service_uids.push((ns, name, uid));
                }
            }
            _ => {}
        }
    }
    let source = opts.source.unwrap_or(if slices.is_empty() {
        SourceKind::Endpoints
    } else {
        SourceKind::EndpointSlice
    });
    let mut index = Index::new(
        opts.cluster.clone(),
        source,
        opts.convert.clone(),
        opts.namespace_selector.clone(),
    )
    .with_label_selector(opts.label_selector.clone());
    for (ns, name, uid) in service_uids {
        index.set_service_uid(&ns, &name, Some(uid));
    }
    index.reset_services(services);
    match source {
        SourceKind::Endpoints => index.reset_endpoints(&endpoints),
        SourceKind::EndpointSlice => index.reset_slices(&slices),
    };
    let warnings = index
        .warnings()
        .flat_map(|(_, w)| w.iter().cloned())
        .collect();
    let objects = index
        .iter()
        .flat_map(|s| desired_objects(s, &opts.naming))
        .collect();
    Ok(Rendered { objects, warnings })
}

/// The DiscoveredServices the controller would write for `objects`.
pub fn render(
    objects: &[Value],
    opts: &RenderOptions,
) -> Result<Vec<DiscoveredService>, RenderError> {
    render_report(objects, opts).map(|r| r.objects)
}

#[cfg(test)]
mod tests;
