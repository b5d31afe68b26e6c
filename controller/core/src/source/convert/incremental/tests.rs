use super::*;
use crate::source::convert::merge_slices;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use serde_json::json;

fn slice(name: &str, eps: serde_json::Value) -> EndpointSlice {
    serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": "ns"},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 80}],
        "endpoints": eps,
    }))
    .unwrap()
}

#[test]
fn the_state_gives_the_full_merge_and_patches_one_node() {
    let opts = ConvertOptions {
        drain_terminating: Drain::Fallback,
        ..ConvertOptions::default()
    };
    let a = SliceContribution::new(
        &slice(
            "a",
            json!([{"addresses": ["10.0.0.1"], "conditions": {"ready": false, "serving": true, "terminating": true}},
                       {"addresses": ["10.0.0.2"], "conditions": {"ready": false, "serving": true, "terminating": true}}]),
        ),
        &opts,
    );
    let b = SliceContribution::new(
        &slice(
            "b",
            json!([{"addresses": ["10.0.0.1"], "conditions": {"ready": true}}]),
        ),
        &opts,
    );
    let mut state = MergeState::new(&opts, 50, [("a", &a), ("b", &b)]);
    let mut ports = state.ports();
    assert_eq!(ports, merge_slices([&a, &b], &opts).ports);
    let mut buckets = Buckets::of(&ports);
    // Slice b goes: no ready endpoint is left, the port falls back to
    // the draining ones as a whole.
    let patch = state.replace_slice("b", Some(&b), None);
    assert!(matches!(patch.ports.as_slice(), [(k, PortPatch::Set(_))] if k == "http"));
    assert!(patch.apply(&mut ports, &mut buckets));
    assert_eq!(ports, merge_slices([&a], &opts).ports);
    assert_eq!(ports["http"].len(), 2);
    assert_eq!(buckets, Buckets::of(&ports));
    // And back: one patch, the draining nodes leave for the ready one.
    let patch = state.replace_slice("b", None, Some(&b));
    assert!(patch.apply(&mut ports, &mut buckets));
    assert_eq!(ports, merge_slices([&a, &b], &opts).ports);
    assert_eq!(buckets, Buckets::of(&ports));
    // The same slice again changes nothing.
    assert!(state.replace_slice("b", Some(&b), Some(&b)).is_empty());
}
