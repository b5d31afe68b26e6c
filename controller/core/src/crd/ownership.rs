//! Whose an object is: instances, adoption, field managers.
//!
//! Several installations may share one API server. Each has an instance name
//! (`kube_discovery.instance`, a DNS label, default [`DEFAULT_INSTANCE`]; the
//! chart sets the release name), stamped on every object as the label
//! [`LABEL_INSTANCE`] and used in the field manager
//! ([`ObjectNaming::field_manager`]). [`owner_of`] decides whose an object is;
//! an instance writes, repairs and deletes only its own objects and leaves a
//! name held by another instance or by a hand-made object alone. Renaming
//! an installation (a Helm reinstall under another release name) is an
//! explicit handover: the new name lists the old one in
//! `kube_discovery.adopt_instances` ([`ObjectNaming::adopt`]) and takes its
//! objects over; without it, the controller reports itself unready while a
//! name it needs is held by another instance (the runtime's `/readyz`).

use super::*;

/// Whose an object is, as seen by one instance ([`owner_of`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owner {
    /// This instance's (also: written before instances existed).
    Us,
    /// Another kube-discovery installation's, by its instance name.
    Instance(String),
    /// Not kube-discovery's: made by hand or by another tool.
    Unmanaged,
}

impl std::fmt::Display for Owner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Owner::Us => f.write_str("this instance"),
            Owner::Instance(i) => write!(f, "kube-discovery instance {i:?}"),
            Owner::Unmanaged => f.write_str("not kube-discovery (made by hand or another tool)"),
        }
    }
}

/// `owner`, except that an object of one of the instances `adopt` (earlier
/// names of this installation, `kube_discovery.adopt_instances`) is ours.
pub fn adopted(owner: Owner, adopt: &[String]) -> Owner {
    match owner {
        Owner::Instance(i) if adopt.contains(&i) => Owner::Us,
        o => o,
    }
}

/// Whose an object is, for the instance `instance`, from its `labels` and the
/// field `managers` of its server-side applies (`metadata.managedFields`
/// entries with `operation: Apply`), in this order:
///
/// 1. the label [`LABEL_INSTANCE`] decides when present;
/// 2. else an apply by `kube-discovery/<name>` names the instance (someone
///    removed the label; ours when it is our name);
/// 3. else the label `app.kubernetes.io/managed-by: kube-discovery` or an
///    apply by [`LEGACY_FIELD_MANAGER`] marks an object written before
///    instances existed: every instance adopts it (the first write stamps
///    the label);
/// 4. anything else is [`Owner::Unmanaged`].
pub fn owner_of<'a>(
    instance: &str,
    labels: Option<&BTreeMap<String, String>>,
    managers: impl IntoIterator<Item = &'a str>,
) -> Owner {
    let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    owner_from(
        instance,
        label(LABEL_INSTANCE),
        label(LABEL_MANAGED_BY) == Some(MANAGED_BY),
        managers,
    )
}

/// The field managers of an object's server-side applies: the `manager` of
/// every `metadata.managedFields` entry with `operation: Apply`. Only those
/// say whose an object is ([`owner_of`]); an `Update` (kubectl edit, a merge
/// patch such as our own repair patches) does not.
pub fn apply_managers(fields: Option<&[ManagedFieldsEntry]>) -> impl Iterator<Item = &str> {
    fields
        .unwrap_or_default()
        .iter()
        .filter(|f| f.operation.as_deref() == Some("Apply"))
        .filter_map(|f| f.manager.as_deref())
}

/// [`owner_of`] from the value of [`LABEL_INSTANCE`] and whether
/// `app.kubernetes.io/managed-by: kube-discovery` is set (for readers that
/// keep only those of an object's labels).
pub fn owner_from<'a>(
    instance: &str,
    instance_label: Option<&str>,
    managed_by_label: bool,
    managers: impl IntoIterator<Item = &'a str>,
) -> Owner {
    let mine = |i: &str| {
        if i == instance {
            Owner::Us
        } else {
            Owner::Instance(i.to_string())
        }
    };
    if let Some(i) = instance_label {
        return mine(i);
    }
    let mut legacy = managed_by_label;
    let mut other = None;
    for m in managers {
        match m.strip_prefix(LEGACY_FIELD_MANAGER) {
            Some("") => legacy = true,
            Some(rest) => {
                if let Some(i) = rest.strip_prefix('/') {
                    if i == instance {
                        return Owner::Us;
                    }
                    other.get_or_insert(i);
                }
            }
            None => {}
        }
    }
    match other {
        Some(i) => mine(i),
        None if legacy => Owner::Us,
        None => Owner::Unmanaged,
    }
}
