//! The drift checks as plain functions: a scripted record and desired
//! state in, verdicts out.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::*;
use crate::crd::{DiscoveredService, Owner, desired_object};
use crate::write_plan::record::Facts;
use crate::{Node, PortMap, SourceKind};

/// The desired state: services by key, clusters and whether they are listed.
#[derive(Default)]
struct Desired {
    services: BTreeMap<ServiceKey, Arc<ServiceNodes>>,
    clusters: BTreeMap<String, bool>,
}

impl DesiredView for Desired {
    fn version(&self, key: &ServiceKey) -> Option<String> {
        self.services.get(key).map(|s| s.version.clone())
    }
    fn listed(&self, cluster: &str) -> bool {
        self.clusters.get(cluster).copied().unwrap_or(false)
    }
    fn clusters(&self) -> Vec<(String, bool)> {
        self.clusters.iter().map(|(c, l)| (c.clone(), *l)).collect()
    }
    fn keys_of(&self, cluster: &str) -> Vec<ServiceKey> {
        self.services
            .keys()
            .filter(|k| k.cluster == cluster)
            .cloned()
            .collect()
    }
    fn nodes(&self, key: &ServiceKey) -> Option<Arc<ServiceNodes>> {
        self.services.get(key).cloned()
    }
}

fn svc(name: &str, host: &str) -> ServiceNodes {
    let mut ports = PortMap::new();
    ports.insert("http".into(), vec![Node::new(host, 80, 50)]);
    ServiceNodes::new(
        ServiceKey::new("", "ns", name),
        SourceKind::EndpointSlice,
        ports,
        None,
    )
}

fn naming() -> ObjectNaming {
    ObjectNaming::source()
}

/// Feeds `o` at `rv` to the record as the drift watch does, then asks
/// `suspicious` about it.
fn watch(r: &Mutex<Record>, o: &DiscoveredService, rv: u64, d: &Desired) -> Option<bool> {
    let key = ServiceKey::new(
        &o.spec.cluster,
        &o.spec.source_namespace,
        &o.spec.source_name,
    );
    let facts = Facts::of_object(o);
    let seen = ObjectSeen {
        ns: o.metadata.namespace.as_deref().unwrap_or_default(),
        name: o.metadata.name.as_deref().unwrap_or_default(),
        key: &key,
        owner: &Owner::Us,
        facts: &facts,
        resource_version: Some(rv),
        generation: Some(1),
    };
    r.lock().unwrap().apply(&seen);
    suspicious(r, &seen, false, d, &naming(), usize::MAX)
}

#[test]
fn only_events_that_differ_from_the_desired_state_are_suspicious() {
    let mut d = Desired::default();
    d.clusters.insert(String::new(), true);
    let want = svc("web", "10.0.0.1");
    d.services.insert(want.key.clone(), Arc::new(want.clone()));
    let r = Mutex::new(Record::default());
    r.lock().unwrap().init();
    r.lock().unwrap().init_done();
    // Our own write, echoed: not looked at.
    r.lock().unwrap().written("ns", "web", Some(3), Some(1));
    let old = desired_object(&svc("web", "10.0.0.9"), &naming());
    assert_eq!(watch(&r, &old, 3, &d), Some(false));
    // The same old content later: someone else's, and not what we want.
    assert_eq!(watch(&r, &old, 4, &d), Some(true));
    // Someone else writing exactly what we want is fine.
    assert_eq!(
        watch(&r, &desired_object(&want, &naming()), 5, &d),
        Some(false)
    );
    // No source: an orphan once its cluster is listed, undecided before.
    let gone = desired_object(&svc("gone", "10.0.0.1"), &naming());
    assert_eq!(watch(&r, &gone, 6, &d), Some(true));
    d.clusters.insert(String::new(), false);
    assert_eq!(watch(&r, &gone, 7, &d), None);
}

#[test]
fn a_sweep_finds_what_is_not_intact_and_orphans_and_drift_facts_show_it() {
    let mut d = Desired::default();
    d.clusters.insert(String::new(), true);
    let ok = svc("ok", "10.0.0.1");
    let missing = svc("missing", "10.0.0.2");
    for s in [&ok, &missing] {
        d.services.insert(s.key.clone(), Arc::new(s.clone()));
    }
    let r = Mutex::new(Record::default());
    assert!(
        sweep(&r, &d, &naming(), usize::MAX).is_empty(),
        "not listed"
    );
    assert!(!drift_facts(&r, &ok.key, Some(&ok), &naming(), usize::MAX).listed);
    r.lock().unwrap().init();
    r.lock().unwrap().init_done();
    watch(&r, &desired_object(&ok, &naming()), 2, &d);
    let orphan = svc("orphan", "10.0.0.3");
    watch(&r, &desired_object(&orphan, &naming()), 3, &d);
    assert_eq!(
        sweep(&r, &d, &naming(), usize::MAX),
        vec![missing.key.clone(), orphan.key.clone()]
    );
    let facts = drift_facts(&r, &ok.key, Some(&ok), &naming(), usize::MAX);
    assert_eq!(judge_drift(&facts), DriftResult::Intact);
    let facts = drift_facts(&r, &missing.key, Some(&missing), &naming(), usize::MAX);
    assert_eq!(judge_drift(&facts), DriftResult::Drift("deleted"));
    let facts = drift_facts(&r, &orphan.key, None, &naming(), usize::MAX);
    assert_eq!(judge_drift(&facts), DriftResult::Drift("orphan"));
}
