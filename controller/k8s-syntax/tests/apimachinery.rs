//! The crate against apimachinery itself: every case of
//! `testdata/apimachinery.jsonl` carries the result that apimachinery v0.34.4
//! (the library the real kube-apiserver v1.34.4 is built from) computed for it
//! (`testdata/regenerate.sh` runs `testdata/oracle/main.go`), and ours must be
//! the same: the same messages for the name rules, and for `labels.Parse` the
//! same error text, or the same canonical string and the same match result on
//! every label set of the file.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use k8s_syntax::LabelSelector;
use serde_json::Value;

const CASES: &str = include_str!("../testdata/apimachinery.jsonl");

fn cases() -> impl Iterator<Item = (String, String, Value)> {
    CASES.lines().map(|line| {
        let v: Value = serde_json::from_str(line).expect("a JSON line");
        let text = |k: &str| v[k].as_str().unwrap_or_default().to_string();
        (text("f"), text("s"), v.clone())
    })
}

#[test]
fn every_name_rule_gives_apimachinery_s_result() {
    let mut checked = 0;
    for (f, s, case) in cases() {
        let ours = match f.as_str() {
            "IsDNS1123Label" => k8s_syntax::validate_dns1123_label(&s),
            "IsDNS1123Subdomain" => k8s_syntax::validate_dns1123_subdomain(&s),
            "IsDNS1035Label" => k8s_syntax::validate_dns1035_label(&s),
            "IsQualifiedName" => k8s_syntax::validate_qualified_name(&s),
            "IsValidLabelValue" => k8s_syntax::validate_label_value(&s),
            "IsValidPathSegmentName" => k8s_syntax::validate_path_segment_name(&s),
            _ => continue,
        };
        let want = case["out"].as_str().expect("a message or \"\"");
        assert_eq!(ours.err().unwrap_or_default(), want, "{f}({s:?})");
        let is = match f.as_str() {
            "IsDNS1123Label" => Some(k8s_syntax::is_dns1123_label(&s)),
            "IsDNS1123Subdomain" => Some(k8s_syntax::is_dns1123_subdomain(&s)),
            "IsDNS1035Label" => Some(k8s_syntax::is_dns1035_label(&s)),
            "IsQualifiedName" => Some(k8s_syntax::is_qualified_name(&s)),
            "IsValidLabelValue" => Some(k8s_syntax::is_label_value(&s)),
            _ => None,
        };
        if let Some(is) = is {
            assert_eq!(is, want.is_empty(), "is_* of {f}({s:?})");
        }
        checked += 1;
    }
    assert!(checked > 400, "only {checked} cases");
}

#[test]
fn the_label_selector_grammar_gives_apimachinery_s_result() {
    let mut sets: Vec<BTreeMap<String, String>> = Vec::new();
    let mut checked = 0;
    for (f, s, case) in cases() {
        match f.as_str() {
            "label_sets" => sets = serde_json::from_value(case["sets"].clone()).unwrap(),
            "labels.Parse" => {
                let out = &case["out"];
                match (LabelSelector::parse(&s), out["error"].as_str()) {
                    (Err(e), Some(want)) => assert_eq!(e.to_string(), want, "parse({s:?})"),
                    (Err(e), None) => {
                        panic!("parse({s:?}) failed ({e}); the API server accepts it")
                    }
                    (Ok(sel), Some(want)) => {
                        panic!("parse({s:?}) = {sel}; the API server says: {want}")
                    }
                    (Ok(sel), None) => {
                        assert_eq!(sel.to_string(), out["string"].as_str().unwrap(), "{s:?}");
                        let ours: Vec<bool> = sets.iter().map(|l| sel.matches(l)).collect();
                        let want: Vec<bool> =
                            serde_json::from_value(out["matches"].clone()).unwrap();
                        assert_eq!(ours, want, "matches of {s:?} on {sets:?}");
                    }
                }
                checked += 1;
            }
            _ => {}
        }
    }
    assert!(!sets.is_empty() && checked > 150, "only {checked} cases");
}
