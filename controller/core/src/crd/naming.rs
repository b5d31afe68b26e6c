//! Object names and label values of a service's DiscoveredServices.
//!
//! [`ObjectNaming`] maps a [`ServiceKey`] to the object's namespace and name:
//!
//! | mode | namespace | name |
//! |---|---|---|
//! | single cluster, `namespace_mode: source` | source namespace | `<name>` |
//! | single cluster, `namespace_mode: fixed`  | the fixed namespace | `<namespace>.<name>` |
//! | multi cluster, `namespace_mode: source`  | source namespace | `<id>.<name>` |
//! | multi cluster, `namespace_mode: fixed`   | the fixed namespace | `<id>.<namespace>.<name>` |
//!
//! Namespaces, Service names and cluster ids never contain `.`, so joining the
//! parts with `.` is collision-free, and the result (at most 8+1+63+1+63
//! characters) is always a valid object name (DNS subdomain, <= 253). Should a
//! name ever not be a valid DNS name (`k8s_syntax::is_dns_name`: also no label
//! over 63 characters; e.g. hand-written input to `render`), it is
//! sanitized (lowercase, other characters -> `-`), cut to 46 characters and
//! suffixed with `-<16 hex of sha256(parts)>` (63 characters at most), which
//! stays deterministic and practically collision-free. Label values longer than
//! 63 characters are shortened the same way. The ownerReference to the source
//! Service is only set in single-cluster `source` mode (owner references cannot
//! cross namespaces or clusters) and only when the Service UID is known.

use super::*;

/// Where DiscoveredServices are written.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum NamespaceMode {
    /// Into the namespace of the source Service (default).
    #[default]
    Source,
    /// All into one namespace.
    Fixed(String),
}

/// Maps a [`ServiceKey`] to the namespace and name of its object, and says
/// which installation ([`LABEL_INSTANCE`]) writes it. See the module docs for
/// the rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectNaming {
    /// Where objects go.
    pub namespace_mode: NamespaceMode,
    /// The installation writing the objects (`kube_discovery.instance`, a
    /// DNS-1123 label).
    pub instance: String,
    /// Earlier names of this installation (`kube_discovery.adopt_instances`):
    /// their objects are this instance's ([`ObjectNaming::owner_of`]), and
    /// its next write of each relabels it.
    pub adopt: Vec<String>,
}

impl Default for ObjectNaming {
    fn default() -> Self {
        Self::source()
    }
}

impl ObjectNaming {
    /// Objects next to their source Service.
    pub fn source() -> Self {
        Self {
            namespace_mode: NamespaceMode::Source,
            instance: DEFAULT_INSTANCE.to_string(),
            adopt: Vec::new(),
        }
    }

    /// All objects in `namespace`.
    pub fn fixed(namespace: impl Into<String>) -> Self {
        Self {
            namespace_mode: NamespaceMode::Fixed(namespace.into()),
            instance: DEFAULT_INSTANCE.to_string(),
            adopt: Vec::new(),
        }
    }

    /// The same naming for the installation `instance`.
    #[must_use]
    pub fn with_instance(mut self, instance: impl Into<String>) -> Self {
        self.instance = instance.into();
        self
    }

    /// The same naming, adopting the objects of the instances `adopt`
    /// (earlier names of this installation).
    #[must_use]
    pub fn with_adopted(mut self, adopt: Vec<String>) -> Self {
        self.adopt = adopt;
        self
    }

    /// Field manager of this instance's server-side applies:
    /// `kube-discovery/<instance>`.
    pub fn field_manager(&self) -> String {
        format!("{LEGACY_FIELD_MANAGER}/{}", self.instance)
    }

    /// Field manager of this instance's repair patches:
    /// `kube-discovery-drift/<instance>`.
    pub fn drift_field_manager(&self) -> String {
        format!("{LEGACY_FIELD_MANAGER}-drift/{}", self.instance)
    }

    /// Whose an object with these `labels`, written by these server-side
    /// apply field `managers`, is ([`owner_of`] for this instance; an
    /// adopted instance's objects are ours: [`adopted`]).
    pub fn owner_of<'a>(
        &self,
        labels: Option<&BTreeMap<String, String>>,
        managers: impl IntoIterator<Item = &'a str>,
    ) -> Owner {
        adopted(owner_of(&self.instance, labels, managers), &self.adopt)
    }

    /// Whose the object with this metadata is: [`ObjectNaming::owner_of`]
    /// of its labels and its [`apply_managers`].
    pub fn owner_of_meta(&self, meta: &ObjectMeta) -> Owner {
        self.owner_of(
            meta.labels.as_ref(),
            apply_managers(meta.managed_fields.as_deref()),
        )
    }

    /// Namespace of the object for `key`.
    pub fn namespace(&self, key: &ServiceKey) -> String {
        match &self.namespace_mode {
            NamespaceMode::Source => key.namespace.to_string(),
            NamespaceMode::Fixed(ns) => ns.clone(),
        }
    }

    /// Name of the object for `key`.
    pub fn name(&self, key: &ServiceKey) -> String {
        let mut parts: Vec<&str> = Vec::with_capacity(3);
        if !key.cluster.is_empty() {
            parts.push(&key.cluster);
        }
        if matches!(self.namespace_mode, NamespaceMode::Fixed(_)) {
            parts.push(&key.namespace);
        }
        parts.push(&key.name);
        let joined = parts.join(".");
        // Every label <= 63 (stricter than an object name needs): keeps the
        // names objects have always had.
        if is_dns_name(&joined) {
            joined
        } else {
            // One RFC 1123 label (<= 63) is also a valid subdomain.
            shorten(&joined, &parts.join("\0"), DNS1123_LABEL_MAX_LENGTH, true)
        }
    }

    /// Whether objects carry an ownerReference to the source Service.
    pub fn owner_references_allowed(&self, key: &ServiceKey) -> bool {
        key.cluster.is_empty() && self.namespace_mode == NamespaceMode::Source
    }
}

/// Sanitizes `s`, cuts it so that `-<16 hex>` fits into `max`, and appends the
/// hash of `hash_input`. `lower` forces lowercase (object names).
pub(super) fn shorten(s: &str, hash_input: &str, max: usize, lower: bool) -> String {
    let hash = {
        let mut h = hex::encode(Sha256::digest(hash_input.as_bytes()));
        h.truncate(16);
        h
    };
    let keep = max - hash.len() - 1;
    let mut prefix: String = s
        .chars()
        .map(|c| {
            let c = if lower { c.to_ascii_lowercase() } else { c };
            if c.is_ascii_lowercase() || c.is_ascii_digit() || (!lower && c.is_ascii_uppercase()) {
                c
            } else {
                '-'
            }
        })
        .take(keep)
        .collect();
    while prefix.ends_with(|c: char| !c.is_ascii_alphanumeric()) {
        prefix.pop();
    }
    while prefix.starts_with(|c: char| !c.is_ascii_alphanumeric()) {
        prefix.remove(0);
    }
    if prefix.is_empty() {
        hash
    } else {
        format!("{prefix}-{hash}")
    }
}

/// A valid label value for `s` (unchanged when already valid).
pub fn label_value(s: &str) -> String {
    if is_label_value(s) {
        s.to_string()
    } else {
        shorten(s, s, LABEL_VALUE_MAX_LENGTH, false)
    }
}

/// The labels every object for `key` written by `instance` carries.
pub fn labels_for(key: &ServiceKey, instance: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_MANAGED_BY.to_string(), MANAGED_BY.to_string()),
        (LABEL_INSTANCE.to_string(), instance.to_string()),
        (LABEL_CLUSTER.to_string(), label_value(&key.cluster)),
        (
            LABEL_SERVICE_NAMESPACE.to_string(),
            label_value(&key.namespace),
        ),
        (LABEL_SERVICE_NAME.to_string(), label_value(&key.name)),
    ])
}
