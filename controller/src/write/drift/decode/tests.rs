use super::*;
use crate::write::drift::test_support::*;
use kube_discovery_core::crd::{DEFAULT_INSTANCE, ObjectNaming, desired_object};
use kube_discovery_core::write_plan::record::WantedObject;

#[test]
fn the_watch_decodes_only_what_drift_compares() {
    let want = desired_object(&svc(&["10.0.0.1"]), &ObjectNaming::source());
    let full = |o: &DiscoveredService| {
        let mut v = serde_json::to_value(o).unwrap();
        v["metadata"]["resourceVersion"] = serde_json::json!("7");
        v["metadata"]["managedFields"] = serde_json::json!([{
            "manager": "kube-discovery", "operation": "Apply",
            "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:ports": {}}}
        }]);
        v["metadata"]["annotations"] = serde_json::json!({"someone/else": "x"});
        v["status"] = serde_json::json!({"nodeCount": 1, "ports": "http"});
        v
    };
    let w: Watched = serde_json::from_value(full(&want)).unwrap();
    assert_eq!((w.ns(), w.name()), ("ns", "web"));
    assert_eq!(w.meta.resource_version.as_deref(), Some("7"));
    assert!(w.meta.labels.is_none() && w.meta.managed_fields.is_none());
    assert!(w.meta.annotations.is_none());
    assert_eq!(w.key, ServiceKey::new("", "ns", "web"));
    assert_eq!(w.facts, Watched::of(&want).facts);
    assert!(w.facts.satisfies(&WantedObject::of(&want)));
    let mut edited = want.clone();
    edited
        .spec
        .ports
        .values_mut()
        .for_each(|v| v[0].weight += 1);
    let w: Watched = serde_json::from_value(full(&edited)).unwrap();
    assert!(
        !w.facts.satisfies(&WantedObject::of(&want)),
        "a node edit is seen"
    );
    let err = serde_json::from_value::<Watched>(serde_json::json!({"metadata": {}}));
    assert!(
        err.is_err(),
        "no spec: a decode error, not a default object"
    );
    // Whose it is: the instance label of `desired_object` (default).
    assert_eq!(w.mark.owner(DEFAULT_INSTANCE), Owner::Us);
    assert_eq!(w.mark.owner("b"), Owner::Instance(DEFAULT_INSTANCE.into()));
    // The sink's lean decode: no nodes, annotations or status; of the
    // managedFields only manager and operation.
    let lean: Lean = serde_json::from_value(full(&want)).unwrap();
    let o = lean.into_inner();
    let fields = o.metadata.managed_fields.as_deref().unwrap();
    assert_eq!(fields.len(), 1);
    assert_eq!(fields[0].manager.as_deref(), Some("kube-discovery"));
    assert!(fields[0].fields_v1.is_none() && o.status.is_none());
    assert!(o.metadata.annotations.is_none() && o.spec.ports.is_empty());
    assert_eq!(o.metadata.labels, want.metadata.labels);
    assert_eq!(o.spec.version, want.spec.version);
    assert_eq!(o.metadata.resource_version.as_deref(), Some("7"));
}
