//! The status conditions of a DiscoveredService: why a service has the
//! nodes it has, for `kubectl describe dsvc` and `kubectl get dsvc` (the
//! `Ready` column), following the `metav1.Condition` conventions.
//!
//! [`conditions`] is pure: the desired [`ServiceNodes`] (with what the
//! conversion skipped), the conditions the object had before, and `now` in;
//! the conditions to write out.
//!
//! * `Ready`: `True` when every port key has at least one node. `False`
//!   with reason [`NO_ENDPOINTS`] (no port, or no node on any port: nothing
//!   ready, or the Service selects no pod), [`ALL_TERMINATING`] (every node
//!   is a serving-but-terminating fallback, `draining: true`; only with
//!   `drain_terminating`), [`PORT_WITHOUT_NODES`] (naming the ports), or
//!   [`TARGET_PORT_NOT_FOUND`] (a Service port whose `targetPort` no
//!   endpoint has, so it has no port key and no nodes; named with its
//!   targetPort). A deleted source deletes the object, so there is no
//!   `SourceDeleted`.
//! * `Degraded`: `True` with reason [`SOURCE_DATA_SKIPPED`] when the
//!   conversion skipped part of the source objects (a port out of range, an
//!   invalid address, ...); the message names each object and field.
//!   `False` ([`NOTHING_SKIPPED`]) otherwise.
//!
//! `lastTransitionTime` moves only when a condition's `status` changes: the
//! time of the previous condition of the same type is kept otherwise (the
//! writer passes what the object held: see `controller/src/write/sink.rs`).
//!
//! `observedGeneration` is not decided here: it is the generation of the
//! object, which only the writer knows (it stamps it on the status and
//! every condition, `crate::crd::stamp_generation`, and checks the
//! answer, `crate::crd::generation_fix`).
//!
//! The previous `Synced` condition (always `True` on every write) is gone:
//! an object is only ever written when the write succeeds, so it said
//! nothing. A failing write is reported by an Event and the metric
//! `kube_discovery_objects_failing`.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::model::ServiceNodes;

/// Condition type: every port has a node.
pub const READY: &str = "Ready";
/// Condition type: part of the source data was skipped.
pub const DEGRADED: &str = "Degraded";

/// `Ready=True`: every port key has at least one node.
pub const ALL_PORTS_HAVE_NODES: &str = "AllPortsHaveNodes";
/// `Ready=False`: no port, or no node on any port.
pub const NO_ENDPOINTS: &str = "NoEndpoints";
/// `Ready=False`: the only nodes are terminating ones (`draining: true`).
pub const ALL_TERMINATING: &str = "AllTerminating";
/// `Ready=False`: some port keys have no node.
pub const PORT_WITHOUT_NODES: &str = "PortWithoutNodes";
/// `Ready=False`: a Service port's `targetPort` is on no endpoint.
pub const TARGET_PORT_NOT_FOUND: &str = "TargetPortNotFound";
/// `Degraded=True`: the conversion skipped source data.
pub const SOURCE_DATA_SKIPPED: &str = "SourceDataSkipped";
/// `Degraded=False`.
pub const NOTHING_SKIPPED: &str = "NothingSkipped";

/// Upper bound on a condition message we write (the API allows 32768
/// bytes; a handful of skipped items is what a reader can use).
const MAX_MESSAGE: usize = 2048;

/// The conditions of `svc`'s object at `now`, keeping the
/// `lastTransitionTime` of each `previous` condition whose status did not
/// change (see the module docs). Always `[Ready, Degraded]`, in this order.
pub fn conditions(svc: &ServiceNodes, previous: &[Condition], now: &Time) -> Vec<Condition> {
    let (ready, reason, message) = readiness(svc);
    let (degraded, dreason, dmessage) = if svc.skipped.is_empty() {
        (
            false,
            NOTHING_SKIPPED,
            format!("all of the {} data was used", svc.source),
        )
    } else {
        (
            true,
            SOURCE_DATA_SKIPPED,
            format!(
                "{} item(s) of the {} data skipped: {}",
                svc.skipped.len(),
                svc.source,
                svc.skipped.join("; ")
            ),
        )
    };
    vec![
        condition(READY, ready, reason, message, previous, now),
        condition(DEGRADED, degraded, dreason, dmessage, previous, now),
    ]
}

/// `Ready`'s status, reason and message for `svc`.
fn readiness(svc: &ServiceNodes) -> (bool, &'static str, String) {
    let total = svc.node_count();
    if total == 0 {
        let message = if svc.ports.is_empty() {
            format!(
                "the {} has no port with a ready endpoint (no pod selected or ready, or no ports)",
                svc.source
            )
        } else {
            format!(
                "no ready endpoint on any port ({}): no pod selected or ready",
                keys(svc.ports.keys())
            )
        };
        return (false, NO_ENDPOINTS, message);
    }
    // Stops at the first serving node instead of counting the draining
    // ones: this runs per write, and a 100,000-node service has few.
    let all_draining = svc
        .ports
        .values()
        .flatten()
        .all(|n| n.draining == Some(true));
    if all_draining {
        return (
            false,
            ALL_TERMINATING,
            format!("all {total} node(s) are terminating endpoints still serving (draining)"),
        );
    }
    let empty: Vec<&String> = svc
        .ports
        .iter()
        .filter(|(_, nodes)| nodes.is_empty())
        .map(|(k, _)| k)
        .collect();
    if !empty.is_empty() {
        return (
            false,
            PORT_WITHOUT_NODES,
            format!(
                "port(s) {} have no ready endpoint; {total} node(s) on the other port(s)",
                keys(empty)
            ),
        );
    }
    if !svc.extras.unresolved.is_empty() {
        return (
            false,
            TARGET_PORT_NOT_FOUND,
            format!(
                "{}; {total} node(s) on port(s) {}",
                svc.extras.unresolved.join("; "),
                keys(svc.ports.keys())
            ),
        );
    }
    (
        true,
        ALL_PORTS_HAVE_NODES,
        format!("{total} node(s) on port(s) {}", keys(svc.ports.keys())),
    )
}

fn keys<'a>(keys: impl IntoIterator<Item = &'a String>) -> String {
    keys.into_iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}

fn condition(
    type_: &str,
    status: bool,
    reason: &str,
    mut message: String,
    previous: &[Condition],
    now: &Time,
) -> Condition {
    let status = if status { "True" } else { "False" };
    if message.len() > MAX_MESSAGE {
        let mut cut = MAX_MESSAGE - 3;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push_str("...");
    }
    let last_transition_time = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message,
        last_transition_time,
        observed_generation: None,
    }
}

/// The `type`/`status` of `conditions`' condition `type_`, if present.
pub fn status_of<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// The `Degraded=True` condition of `new` when it is news against
/// `previous` (the object's conditions before this write): it was not
/// `True` before, or it names other skipped data now. This is when the
/// controller emits a `SourceDataSkipped` Event, so an unchanged bad object
/// (a relist, a rewrite, a restart: the previous conditions come from the
/// object itself) emits nothing new.
pub fn degraded_news<'a>(previous: &[Condition], new: &'a [Condition]) -> Option<&'a Condition> {
    let now = status_of(new, DEGRADED).filter(|c| c.status == "True")?;
    match status_of(previous, DEGRADED) {
        Some(before) if before.status == "True" && before.message == now.message => None,
        _ => Some(now),
    }
}

#[cfg(test)]
mod tests;
