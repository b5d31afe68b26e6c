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
mod tests {
    use super::*;
    use serde_json::json;

    fn plat_dev() -> Value {
        json!({
            "apiVersion": "v1", "kind": "Endpoints",
            "metadata": {"name": "plat-dev", "namespace": "default"},
            "subsets": [{"addresses": [{"ip": "10.5.10.109"}, {"ip": "10.5.10.110"}],
                         "ports": [{"name": "port", "port": 3306}]}]
        })
    }

    fn web_slice(name: &str, ip: &str) -> Value {
        json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": name, "namespace": "shop", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "port": 8080}],
            "endpoints": [{"addresses": [ip], "conditions": {"ready": true}}]
        })
    }

    #[test]
    fn reference_example_renders() {
        let out = render(&[plat_dev()], &RenderOptions::default()).unwrap();
        assert_eq!(out.len(), 1);
        let ds = &out[0];
        assert_eq!(ds.metadata.name.as_deref(), Some("plat-dev"));
        assert_eq!(ds.spec.source, SourceKind::Endpoints);
        assert_eq!(
            serde_json::to_value(&ds.spec.ports["port"]).unwrap(),
            json!([{"host": "10.5.10.109", "port": 3306, "weight": 50},
                   {"host": "10.5.10.110", "port": 3306, "weight": 50}])
        );
    }

    #[test]
    fn slices_auto_detected_merged_and_owner_from_service() {
        let svc = json!({"apiVersion": "v1", "kind": "Service",
                         "metadata": {"name": "web", "namespace": "shop", "uid": "svc-123"}, "spec": {}});
        let deploy =
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}});
        let out = render(
            &[
                svc,
                deploy,
                web_slice("web-a", "10.0.0.2"),
                web_slice("web-b", "10.0.0.1"),
                Value::Null,
            ],
            &RenderOptions::default(),
        )
        .unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].spec.source, SourceKind::EndpointSlice);
        assert_eq!(
            out[0].metadata.owner_references.as_ref().unwrap()[0].uid,
            "svc-123"
        );
        assert_eq!(
            out[0].spec.ports["http"]
                .iter()
                .map(|n| n.host.as_str())
                .collect::<Vec<_>>(),
            vec!["10.0.0.1", "10.0.0.2"]
        );
    }

    #[test]
    fn configured_source_wins_over_auto() {
        let opts = RenderOptions {
            source: Some(SourceKind::Endpoints),
            ..Default::default()
        };
        let out = render(&[plat_dev(), web_slice("web-a", "10.0.0.1")], &opts).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].spec.source_name, "plat-dev");
    }

    #[test]
    fn lists_are_flattened_and_namespace_defaults() {
        let list = json!({"apiVersion": "v1", "kind": "EndpointsList", "items": [
            {"metadata": {"name": "a"}, "subsets": [{"addresses": [{"ip": "10.0.0.1"}], "ports": [{"port": 80}]}]}
        ]});
        let generic = json!({"apiVersion": "v1", "kind": "List", "items": [plat_dev()]});
        let out = render(&[list, generic], &RenderOptions::default()).unwrap();
        let names: Vec<_> = out.iter().map(|d| d.spec.service.clone()).collect();
        assert_eq!(names, vec!["default/a", "default/plat-dev"]);
        assert!(out[0].spec.ports.contains_key("80"));
    }

    #[test]
    fn config_driven_options_filter_and_name() {
        let cfg = crate::config::parse_config(
            "discovery: {kubernetes: [{id: c1, kubeconfig: /k, namespace_selector: {equal: shop}}]}\n\
             kube_discovery: {index_port_numbers: true, sinks: {discoveredservices: {namespace_mode: fixed, namespace: kd}}}",
            &|_| None,
        )
        .unwrap();
        let opts = RenderOptions::from_config(&cfg, "c1").unwrap();
        assert!(RenderOptions::from_config(&cfg, "zz").is_none());
        let out = render(&[plat_dev(), web_slice("web-a", "10.0.0.1")], &opts).unwrap();
        // Endpoints is the configured source; plat-dev is in `default`, filtered out.
        assert!(out.is_empty());
        let slices_opts = RenderOptions {
            source: Some(SourceKind::EndpointSlice),
            ..opts
        };
        let out = render(&[web_slice("web-a", "10.0.0.1")], &slices_opts).unwrap();
        assert_eq!(out[0].metadata.namespace.as_deref(), Some("kd"));
        assert_eq!(out[0].metadata.name.as_deref(), Some("c1.shop.web"));
        assert_eq!(out[0].spec.cluster, "c1");
        assert!(out[0].spec.ports.contains_key("8080"));
    }

    #[test]
    fn errors_name_the_object() {
        let bad = json!({"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "x", "namespace": "ns"},
                         "subsets": [{"ports": [{"port": "eighty"}]}]});
        let e = render(&[plat_dev(), bad], &RenderOptions::default())
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("object #2 (Endpoints ns/x): "), "{e}");
        let e = render(&[json!("text")], &RenderOptions::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("object #1: not an object"), "{e}");
        let beta = json!({"apiVersion": "discovery.k8s.io/v1beta1", "kind": "EndpointSlice", "metadata": {"name": "s"}});
        let e = render(&[beta], &RenderOptions::default())
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("unsupported apiVersion \"discovery.k8s.io/v1beta1\""),
            "{e}"
        );
    }

    #[test]
    fn warnings_are_reported() {
        let mut ep = plat_dev();
        ep["subsets"][0]["addresses"][1]["ip"] = json!("bogus");
        let r = render_report(&[ep], &RenderOptions::default()).unwrap();
        assert_eq!(r.objects[0].spec.ports["port"].len(), 1);
        assert_eq!(r.warnings.len(), 1);
        assert!(r.warnings[0].contains("bogus"));
    }
}
