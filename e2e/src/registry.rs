//! The resource registry: which resources kube-sim serves and how.
//!
//! Built-in types are a fixed table; custom resources are added and removed as
//! `CustomResourceDefinition` objects are written. The registry drives discovery
//! documents, URL parsing (scope), kinds for responses, Table columns and which
//! resources have a `status` subresource. A CRD's `openAPIV3Schema` is compiled once
//! per version when the CRD is stored (see [`crate::machinery`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use serde_json::Value;

use crate::machinery::CompiledSchema;

/// One printer column of a CRD version (`additionalPrinterColumns`).
#[derive(Debug, Clone)]
pub struct PrinterColumn {
    /// Column header.
    pub name: String,
    /// Column type (`string`, `integer`, `date`, ...).
    pub type_: String,
    /// Column format (`name`, ...), or empty.
    pub format: String,
    /// Column description.
    pub description: String,
    /// JSONPath of the value in the object.
    pub json_path: String,
    /// 0: shown by default; higher: only with `-o wide`.
    pub priority: i64,
}

/// Everything kube-sim needs to know about one served resource.
#[derive(Debug, Clone)]
pub struct ResourceInfo {
    /// API group (`""` for the core group).
    pub group: String,
    /// Served versions; the first is the preferred (and storage) one.
    pub versions: Vec<String>,
    /// Plural name (`services`).
    pub resource: String,
    /// Singular name (`service`).
    pub singular: String,
    /// Kind (`Service`).
    pub kind: String,
    /// Kind of lists (`ServiceList`).
    pub list_kind: String,
    /// Whether objects live in namespaces.
    pub namespaced: bool,
    /// Short names for kubectl (`svc`).
    pub short_names: Vec<String>,
    /// Categories (`all`, ...).
    pub categories: Vec<String>,
    /// Verbs discovery lists for the resource.
    pub verbs: Vec<&'static str>,
    /// Whether a `status` subresource is served.
    pub has_status: bool,
    /// `metadata.generation` is maintained (bumps on non-metadata/non-status changes).
    pub has_generation: bool,
    /// PUT of an absent object creates it.
    pub create_on_update: bool,
    /// A PUT without `metadata.resourceVersion` overwrites whatever is
    /// stored (the registry strategy's `AllowUnconditionalUpdate()`); when
    /// false it is a 422 `Invalid` on `metadata.resourceVersion`. Holds for
    /// the `status` subresource too (the status strategies embed the main one).
    pub unconditional_update: bool,
    /// Present for custom resources.
    pub crd: Option<CrdInfo>,
}

/// Custom-resource specifics.
#[derive(Debug, Clone)]
pub struct CrdInfo {
    /// Name of the CRD (`<plural>.<group>`).
    pub crd_name: String,
    /// Per served version: printer columns and compiled schema.
    pub versions: BTreeMap<String, CrdVersion>,
}

/// What one served version of a custom resource has of its own.
#[derive(Debug, Clone)]
pub struct CrdVersion {
    /// Printer columns (Tables for kubectl).
    pub columns: Vec<PrinterColumn>,
    /// The compiled schema objects are validated against.
    pub schema: Option<Arc<CompiledSchema>>,
    /// The raw `openAPIV3Schema` (served in OpenAPI documents).
    pub raw_schema: Option<Value>,
    /// Whether this version serves a `status` subresource.
    pub status_subresource: bool,
    /// `selectableFields` (their JSON paths without the leading `.`): field
    /// labels of this version besides `metadata.name`/`metadata.namespace`.
    pub selectable_fields: Vec<String>,
}

const ALL_VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

impl ResourceInfo {
    /// `apiVersion` of objects in `version` (`v1`, `group/v1`).
    pub fn api_version(&self, version: &str) -> String {
        if self.group.is_empty() {
            version.to_string()
        } else {
            format!("{}/{}", self.group, version)
        }
    }

    /// Whether `version` is served.
    pub fn serves(&self, version: &str) -> bool {
        self.versions.iter().any(|v| v == version)
    }

    /// The preferred (storage) version.
    pub fn storage_version(&self) -> &str {
        self.versions.first().map(String::as_str).unwrap_or("v1")
    }

    /// Registry key: `group/resource`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.group, self.resource)
    }

    /// `status` subresource for the given version.
    pub fn status_subresource(&self, version: &str) -> bool {
        match &self.crd {
            Some(crd) => crd
                .versions
                .get(version)
                .map(|v| v.status_subresource)
                .unwrap_or(false),
            None => self.has_status,
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn builtin(
    group: &str,
    version: &str,
    resource: &str,
    singular: &str,
    kind: &str,
    namespaced: bool,
    short_names: &[&str],
    has_status: bool,
) -> ResourceInfo {
    ResourceInfo {
        group: group.into(),
        versions: vec![version.into()],
        resource: resource.into(),
        singular: singular.into(),
        kind: kind.into(),
        list_kind: format!("{kind}List"),
        namespaced,
        short_names: short_names.iter().map(|s| s.to_string()).collect(),
        categories: vec![],
        verbs: ALL_VERBS.to_vec(),
        has_status,
        has_generation: false,
        create_on_update: false,
        unconditional_update: true,
        crd: None,
    }
}

/// The built-in resources kube-sim serves.
pub fn builtins() -> Vec<ResourceInfo> {
    let mut v = vec![
        builtin(
            "",
            "v1",
            "namespaces",
            "namespace",
            "Namespace",
            false,
            &["ns"],
            true,
        ),
        builtin(
            "",
            "v1",
            "services",
            "service",
            "Service",
            true,
            &["svc"],
            true,
        ),
        builtin(
            "",
            "v1",
            "endpoints",
            "endpoints",
            "Endpoints",
            true,
            &["ep"],
            false,
        ),
        builtin(
            "",
            "v1",
            "configmaps",
            "configmap",
            "ConfigMap",
            true,
            &["cm"],
            false,
        ),
        builtin("", "v1", "secrets", "secret", "Secret", true, &[], false),
        builtin(
            "",
            "v1",
            "serviceaccounts",
            "serviceaccount",
            "ServiceAccount",
            true,
            &["sa"],
            false,
        ),
        builtin("", "v1", "events", "event", "Event", true, &["ev"], false),
        builtin(
            "events.k8s.io",
            "v1",
            "events",
            "event",
            "Event",
            true,
            &["ev"],
            false,
        ),
        builtin(
            "discovery.k8s.io",
            "v1",
            "endpointslices",
            "endpointslice",
            "EndpointSlice",
            true,
            &[],
            false,
        ),
        builtin(
            "coordination.k8s.io",
            "v1",
            "leases",
            "lease",
            "Lease",
            true,
            &[],
            false,
        ),
        builtin(
            "apps",
            "v1",
            "deployments",
            "deployment",
            "Deployment",
            true,
            &["deploy"],
            true,
        ),
        builtin(
            "authorization.k8s.io",
            "v1",
            "selfsubjectaccessreviews",
            "selfsubjectaccessreview",
            "SelfSubjectAccessReview",
            false,
            &[],
            false,
        ),
        builtin(
            "policy",
            "v1",
            "poddisruptionbudgets",
            "poddisruptionbudget",
            "PodDisruptionBudget",
            true,
            &["pdb"],
            true,
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "roles",
            "role",
            "Role",
            true,
            &[],
            false,
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "rolebindings",
            "rolebinding",
            "RoleBinding",
            true,
            &[],
            false,
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterroles",
            "clusterrole",
            "ClusterRole",
            false,
            &[],
            false,
        ),
        builtin(
            "rbac.authorization.k8s.io",
            "v1",
            "clusterrolebindings",
            "clusterrolebinding",
            "ClusterRoleBinding",
            false,
            &[],
            false,
        ),
        builtin(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "customresourcedefinition",
            "CustomResourceDefinition",
            false,
            &["crd", "crds"],
            true,
        ),
    ];
    for r in &mut v {
        match r.resource.as_str() {
            "namespaces" => {
                r.verbs = vec![
                    "create", "delete", "get", "list", "patch", "update", "watch",
                ];
            }
            "deployments" | "poddisruptionbudgets" => {
                r.has_generation = true;
                r.categories = vec!["all".into()];
            }
            "services" => r.categories = vec!["all".into()],
            "customresourcedefinitions" => {
                r.has_generation = true;
                r.categories = vec!["api-extensions".into()];
            }
            "endpoints" | "leases" | "events" => r.create_on_update = true,
            _ => {}
        }
        // The strategies of kubernetes/kubernetes whose
        // `AllowUnconditionalUpdate()` is false (coordination/lease,
        // policy/poddisruptionbudget, apiextensions customresourcedefinition);
        // every other built-in served here allows it.
        if matches!(
            r.resource.as_str(),
            "leases" | "poddisruptionbudgets" | "customresourcedefinitions"
        ) {
            r.unconditional_update = false;
        }
    }
    v
}

/// Build the registry entry for a stored CRD object. Returns a human-readable error
/// naming the offending field when the CRD cannot be served.
pub fn from_crd(crd: &Value) -> Result<ResourceInfo, String> {
    let spec = crd.get("spec").ok_or("spec: Required value")?;
    let s = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
    let group = s(spec.get("group")).ok_or("spec.group: Required value")?;
    let names = spec.get("names").ok_or("spec.names: Required value")?;
    let plural = s(names.get("plural")).ok_or("spec.names.plural: Required value")?;
    let kind = s(names.get("kind")).ok_or("spec.names.kind: Required value")?;
    let singular = s(names.get("singular")).unwrap_or_else(|| kind.to_lowercase());
    let list_kind = s(names.get("listKind")).unwrap_or_else(|| format!("{kind}List"));
    let strs = |v: Option<&Value>| -> Vec<String> {
        v.and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default()
    };
    let short_names = strs(names.get("shortNames"));
    let categories = strs(names.get("categories"));
    let namespaced = match s(spec.get("scope")).as_deref() {
        Some("Namespaced") => true,
        Some("Cluster") => false,
        Some(other) => {
            return Err(format!(
                "spec.scope: Unsupported value: {other:?}: supported values: \"Cluster\", \"Namespaced\""
            ));
        }
        None => return Err("spec.scope: Required value".into()),
    };
    let versions_json = spec
        .get("versions")
        .and_then(Value::as_array)
        .ok_or("spec.versions: Required value")?;
    let mut versions = Vec::new();
    let mut storage = None;
    let mut per_version = BTreeMap::new();
    for (i, v) in versions_json.iter().enumerate() {
        let name = s(v.get("name")).ok_or(format!("spec.versions[{i}].name: Required value"))?;
        let served = v.get("served").and_then(Value::as_bool).unwrap_or(false);
        if v.get("storage").and_then(Value::as_bool).unwrap_or(false) {
            storage = Some(name.clone());
        }
        let raw_schema = v.pointer("/schema/openAPIV3Schema").cloned();
        let schema = match &raw_schema {
            Some(raw) => Some(Arc::new(CompiledSchema::compile(raw).map_err(|e| {
                format!("spec.versions[{i}].schema.openAPIV3Schema: Invalid value: {e}")
            })?)),
            None => None,
        };
        let columns = v
            .get("additionalPrinterColumns")
            .and_then(Value::as_array)
            .map(|cols| {
                cols.iter()
                    .map(|c| PrinterColumn {
                        name: s(c.get("name")).unwrap_or_default(),
                        type_: s(c.get("type")).unwrap_or_else(|| "string".into()),
                        format: s(c.get("format")).unwrap_or_default(),
                        description: s(c.get("description")).unwrap_or_default(),
                        json_path: s(c.get("jsonPath")).unwrap_or_default(),
                        priority: c.get("priority").and_then(Value::as_i64).unwrap_or(0),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let status_subresource = v.pointer("/subresources/status").is_some();
        let selectable_fields = v
            .get("selectableFields")
            .and_then(Value::as_array)
            .map(|fs| {
                fs.iter()
                    .filter_map(|f| s(f.get("jsonPath")))
                    .map(|p| p.trim_start_matches('.').to_string())
                    .collect()
            })
            .unwrap_or_default();
        if served {
            versions.push(name.clone());
            per_version.insert(
                name,
                CrdVersion {
                    columns,
                    schema,
                    raw_schema,
                    status_subresource,
                    selectable_fields,
                },
            );
        }
    }
    let storage = storage.ok_or(
        "spec.versions: Invalid value: must have exactly one version marked as storage version",
    )?;
    // Preferred version first: the storage version if served, else the first served one.
    if let Some(pos) = versions.iter().position(|v| *v == storage) {
        let v = versions.remove(pos);
        versions.insert(0, v);
    }
    if versions.is_empty() {
        return Err("spec.versions: Invalid value: must have at least one served version".into());
    }
    let has_status = per_version.values().any(|v| v.status_subresource);
    Ok(ResourceInfo {
        group,
        versions,
        resource: plural,
        singular,
        kind,
        list_kind,
        namespaced,
        short_names,
        categories,
        verbs: ALL_VERBS.to_vec(),
        has_status,
        has_generation: true,
        create_on_update: false,
        // The custom resource strategy of apiextensions-apiserver.
        unconditional_update: false,
        crd: Some(CrdInfo {
            crd_name: s(crd.pointer("/metadata/name")).unwrap_or_default(),
            versions: per_version,
        }),
    })
}

/// The set of served resources, keyed by `group/resource`.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    /// Served resources by `group/resource`.
    pub resources: BTreeMap<String, Arc<ResourceInfo>>,
}

impl Registry {
    /// The built-in resources kube-sim serves.
    pub fn with_builtins() -> Self {
        let mut r = Registry::default();
        for info in builtins() {
            r.resources.insert(info.key(), Arc::new(info));
        }
        r
    }

    /// Look up by group, version and plural resource name.
    pub fn lookup(&self, group: &str, version: &str, resource: &str) -> Option<Arc<ResourceInfo>> {
        self.resources
            .get(&format!("{group}/{resource}"))
            .filter(|r| r.serves(version))
            .cloned()
    }

    /// Look up by group and plural resource name, whatever the version.
    pub fn get(&self, group: &str, resource: &str) -> Option<Arc<ResourceInfo>> {
        self.resources.get(&format!("{group}/{resource}")).cloned()
    }

    /// Served (group, versions) pairs, builtin groups first in a stable order.
    pub fn groups(&self) -> Vec<(String, Vec<String>)> {
        let mut out: Vec<(String, Vec<String>)> = Vec::new();
        for r in self.resources.values() {
            match out.iter_mut().find(|(g, _)| *g == r.group) {
                Some((_, vs)) => {
                    for v in &r.versions {
                        if !vs.contains(v) {
                            vs.push(v.clone());
                        }
                    }
                }
                None => out.push((r.group.clone(), r.versions.clone())),
            }
        }
        out
    }

    /// Resources served in `group/version`.
    pub fn in_group_version(&self, group: &str, version: &str) -> Vec<Arc<ResourceInfo>> {
        self.resources
            .values()
            .filter(|r| r.group == group && r.serves(version))
            .cloned()
            .collect()
    }

    /// Serve a custom resource (replacing one of the same key).
    pub fn add_crd(&mut self, info: ResourceInfo) {
        self.resources.insert(info.key(), Arc::new(info));
    }

    /// Stop serving a custom resource (built-ins stay).
    pub fn remove(&mut self, group: &str, resource: &str) {
        if let Some(r) = self.resources.get(&format!("{group}/{resource}"))
            && r.crd.is_some()
        {
            self.resources.remove(&format!("{group}/{resource}"));
        }
    }
}
