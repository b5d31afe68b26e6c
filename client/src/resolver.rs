//! [`NodesResolver`]: a live, in-memory view of the DiscoveredServices (a
//! reflector selected by label) that answers `nodes("[id/]ns/name:port")` and
//! says when something changed. The `sync` commands and in-process Rust
//! gateways (the `reverse_proxy` example) are built on it.
//!
//! Changes are signalled through a `tokio::sync::watch` counter: a consumer
//! that is busy (running `nginx -t`, talking to HAProxy) sees one change for
//! a whole burst of events, which coalesces a rolling update for free. The
//! first signal comes after the initial list (`InitDone`), so nothing is
//! rendered from a half-listed cache. Reconnects follow the controller's
//! policy ([`WatchBackoff`]: at most ~1 s between retries). Lookups go
//! through [`crate::lookup()`], which merges the shards of a big service.
//!
//! Only objects that pass the resolver's [`ReaderRule`] enter the cache: a
//! DiscoveredService whose namespace, name or labels disagree with its spec
//! is logged (warning naming it, once per event) and kept out; one that
//! stops agreeing is dropped from the cache as if deleted.

use futures::StreamExt;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use kube_discovery_core::backoff::WatchBackoff;
use kube_discovery_core::crd::{DiscoveredService, MANAGED_BY_SELECTOR, ReaderRule};
use kube_discovery_core::{Node, parse_service_name};

use crate::{Error, Result};

/// A running reflector over DiscoveredServices; dropping it stops the watch.
pub struct NodesResolver {
    store: Store<DiscoveredService>,
    rule: ReaderRule,
    /// The last consistent answer per service name asked
    /// ([`NodesResolver::nodes`]): what a read during a shard rewrite
    /// returns. Bounded by the names a consumer asks for.
    last_good: std::sync::Mutex<std::collections::HashMap<String, Option<Vec<Node>>>>,
    changed: tokio::sync::watch::Receiver<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for NodesResolver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl NodesResolver {
    /// Starts a reflector over the DiscoveredServices kube-discovery manages
    /// ([`MANAGED_BY_SELECTOR`]) in `namespace` (all when `None`), written
    /// with `namespace_mode: source` (the default [`ReaderRule`]).
    pub fn start(client: Client, namespace: Option<&str>) -> Self {
        Self::start_with_selector(client, namespace, MANAGED_BY_SELECTOR)
    }

    /// Starts a reflector over the DiscoveredServices in `namespace` (all
    /// when `None`) matching the label selector `selector`, written with
    /// `namespace_mode: source`.
    pub fn start_with_selector(client: Client, namespace: Option<&str>, selector: &str) -> Self {
        Self::start_with_rule(client, namespace, selector, ReaderRule::default())
    }

    /// [`Self::start_with_selector`] accepting only the objects `rule`
    /// accepts (e.g. `ReaderRule::new(ObjectNaming::fixed("kd"))` for a
    /// controller running with `namespace_mode: fixed, namespace: kd`).
    pub fn start_with_rule(
        client: Client,
        namespace: Option<&str>,
        selector: &str,
        rule: ReaderRule,
    ) -> Self {
        let api: Api<DiscoveredService> = match namespace {
            Some(ns) => Api::namespaced(client, ns),
            None => Api::all(client),
        };
        let (store, writer) = reflector::store();
        let (tx, changed) = tokio::sync::watch::channel(0u64);
        let stream = watcher(api, watcher::Config::default().labels(selector))
            .backoff(WatchBackoff::new())
            .modify(|o: &mut DiscoveredService| {
                o.managed_fields_mut().clear();
                o.annotations_mut().clear();
            })
            .filter_map({
                let rule = rule.clone();
                move |ev| std::future::ready(admit(ev, &rule))
            })
            .reflect(writer);
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(ev) = stream.next().await {
                match ev {
                    Ok(watcher::Event::Apply(o) | watcher::Event::Delete(o)) => {
                        // Names the event, so a test (or an operator) can see
                        // that a given write was processed.
                        tracing::debug!(
                            dsvc = %format!("{}/{}", o.namespace().unwrap_or_default(), o.name_any()),
                            resource_version = %o.resource_version().unwrap_or_default(),
                            "DiscoveredService event"
                        );
                        tx.send_modify(|n| *n += 1);
                    }
                    Ok(watcher::Event::InitDone) => {
                        tx.send_modify(|n| *n += 1);
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "DiscoveredService watch failed; retrying")
                    }
                }
            }
        });
        Self {
            store,
            rule,
            last_good: Default::default(),
            changed,
            task,
        }
    }

    /// Waits for the next change (returns at once if one is pending), then marks it seen.
    /// The first change is the end of the initial list.
    pub async fn changed(&mut self) -> Result<()> {
        self.changed
            .changed()
            .await
            .map_err(|_| Error::WatchStopped)?;
        self.changed.borrow_and_update();
        Ok(())
    }

    /// [`Self::changed`] bounded by `limit` (for one-shot runs that must not hang
    /// when the API server or the CRD is unreachable).
    pub async fn changed_within(&mut self, limit: Option<std::time::Duration>) -> Result<()> {
        match limit {
            None => self.changed().await,
            Some(d) => tokio::time::timeout(d, self.changed())
                .await
                .map_err(|_| Error::NotListed(d))?,
        }
    }

    /// Waits until the first complete list is in the cache (without
    /// consuming a change signal).
    pub async fn wait_ready(&self) {
        // Only fails when the writer side is dropped, i.e. the task stopped.
        let _ = self.store.wait_until_ready().await;
    }

    /// Nodes of `service_name` (`[id/]ns/name:port`) in the current cache,
    /// merged over the shards of a big service: `Ok(None)` when the service
    /// or port is unknown, [`Error::ServiceName`] when the name is malformed.
    ///
    /// While the controller rewrites a big service's shards, the cache
    /// holds shards of two versions for a moment: then the last answer this
    /// resolver gave for `service_name` is returned again (never a mix of
    /// both versions), or [`Error::Incomplete`] when it has none; the
    /// change signal fires again when shard 0 arrives.
    pub fn nodes(&self, service_name: &str) -> Result<Option<Vec<Node>>> {
        let q = parse_service_name(service_name)?;
        let state = self.store.state();
        let found = crate::lookup(state.iter().map(AsRef::as_ref), &q, &self.rule);
        let mut last = self
            .last_good
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match found {
            Ok(nodes) => {
                last.insert(service_name.to_string(), nodes.clone());
                Ok(nodes)
            }
            Err(why) => last.get(service_name).cloned().ok_or(Error::Incomplete {
                service: q.key().to_string(),
                why,
            }),
        }
    }
}

/// What of a watch event enters the cache under `rule`: an object the rule
/// refuses ([`crate::lookup::accept`], which logs it) is left out of the
/// initial list, and an update to one turns into its deletion (it may have
/// agreed before).
fn admit(
    ev: watcher::Result<watcher::Event<DiscoveredService>>,
    rule: &ReaderRule,
) -> Option<watcher::Result<watcher::Event<DiscoveredService>>> {
    match ev {
        Ok(watcher::Event::InitApply(o)) if !crate::lookup::accept(&o, rule) => None,
        Ok(watcher::Event::Apply(o)) if !crate::lookup::accept(&o, rule) => {
            Some(Ok(watcher::Event::Delete(o)))
        }
        other => Some(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube_discovery_core::crd::{ObjectNaming, desired_object};
    use kube_discovery_core::{PortMap, ServiceKey, ServiceNodes, SourceKind};

    fn web() -> DiscoveredService {
        let s = ServiceNodes::new(
            ServiceKey::new("", "default", "web"),
            SourceKind::EndpointSlice,
            PortMap::from([("http".to_string(), vec![Node::new("10.0.0.1", 80, 1)])]),
            None,
        );
        desired_object(&s, &ObjectNaming::source())
    }

    /// Refused objects never reach the cache: left out of the initial list,
    /// and an update that stops agreeing removes the object it replaces.
    #[test]
    fn refused_objects_are_kept_out_of_the_cache() {
        let rule = ReaderRule::default();
        let mut evil = web();
        evil.metadata.namespace = Some("evil".into());
        assert!(admit(Ok(watcher::Event::InitApply(evil.clone())), &rule).is_none());
        assert!(matches!(
            admit(Ok(watcher::Event::Apply(evil.clone())), &rule),
            Some(Ok(watcher::Event::Delete(o))) if o == evil
        ));
        // Agreeing objects, deletions and the list markers pass unchanged.
        assert!(matches!(
            admit(Ok(watcher::Event::InitApply(web())), &rule),
            Some(Ok(watcher::Event::InitApply(o))) if o == web()
        ));
        assert!(matches!(
            admit(Ok(watcher::Event::Apply(web())), &rule),
            Some(Ok(watcher::Event::Apply(o))) if o == web()
        ));
        assert!(matches!(
            admit(Ok(watcher::Event::Delete(evil.clone())), &rule),
            Some(Ok(watcher::Event::Delete(_)))
        ));
        assert!(matches!(
            admit(Ok(watcher::Event::InitDone), &rule),
            Some(Ok(watcher::Event::InitDone))
        ));
    }
}
