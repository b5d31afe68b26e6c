use super::*;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn namespace_filter_forms() {
    assert!(NamespaceFilter::All.matches("x"));
    assert!(NamespaceFilter::Equal("a".into()).matches("a"));
    assert!(!NamespaceFilter::Equal("a".into()).matches("b"));
    assert!(NamespaceFilter::NotEqual("a".into()).matches("b"));
    assert!(!NamespaceFilter::NotEqual("a".into()).matches("a"));
    let m = NamespaceFilter::Match(vec![
        AnchoredRegex::new("dev").unwrap(),
        AnchoredRegex::new("prod-.*").unwrap(),
    ]);
    assert!(m.matches("dev"));
    assert!(!m.matches("dev-2"), "regex must match the whole name");
    assert!(!m.matches("my-dev"));
    assert!(m.matches("prod-eu"));
    let n = NamespaceFilter::NotMatch(vec![AnchoredRegex::new("kube-.*").unwrap()]);
    assert!(!n.matches("kube-system"));
    assert!(n.matches("default"));
    assert!(n.matches("my-kube-x"));
}

#[test]
fn a_pattern_that_escapes_the_anchors_is_refused() {
    // Wrapped as `^(?:…)$`, these would compile and match anything.
    for p in [r"a\.example\.com)|(.*", "x)|(?:.*", ")|("] {
        assert!(AnchoredRegex::new(p).is_err(), "{p:?} must be refused");
    }
    assert!(AnchoredRegex::new("(a)|(b)").is_ok());
}

#[test]
fn alternation_is_anchored_as_a_whole() {
    let m = AnchoredRegex::new("a|b").unwrap();
    assert!(m.is_match("a") && m.is_match("b"));
    assert!(!m.is_match("ab") && !m.is_match("xa"));
}

#[test]
fn field_selectors() {
    assert_eq!(
        NamespaceFilter::Equal("a".into())
            .field_selector()
            .as_deref(),
        Some("metadata.namespace=a")
    );
    assert_eq!(
        NamespaceFilter::NotEqual("a".into())
            .field_selector()
            .as_deref(),
        Some("metadata.namespace!=a")
    );
    assert_eq!(NamespaceFilter::All.field_selector(), None);
}

/// The grammar is `k8s_syntax`'s (tested there against apimachinery);
/// here: the text is kept as written, and matching goes through.
#[test]
fn label_selector_keeps_the_text_and_matches() {
    let s = LabelSelector::parse("  tier in (a, b),app=web ").unwrap();
    assert_eq!(s.as_str(), "tier in (a, b),app=web");
    assert_eq!(s.to_string(), "tier in (a, b),app=web");
    assert_eq!(s.parsed().to_string(), "app=web,tier in (a,b)");
    assert_eq!(s.requirements().len(), 2);
    assert!(s.matches(&labels(&[("app", "web"), ("tier", "a")])));
    assert!(!s.matches(&labels(&[("app", "web"), ("tier", "c")])));
    assert!(LabelSelector::parse("").unwrap().matches(&labels(&[])));
    let empty = LabelSelector::parse("  ").unwrap();
    assert!(empty.is_empty() && empty.as_str().is_empty());
    assert_eq!(empty, LabelSelector::default());
    // What the API server accepts, e.g. integer comparisons.
    let gt = LabelSelector::parse("a>1").unwrap();
    assert!(gt.matches(&labels(&[("a", "2")])) && !gt.matches(&labels(&[("a", "1")])));
    assert_eq!(
        LabelSelector::parse("app in (a").unwrap_err().to_string(),
        "unable to parse requirement: found '', expected: ',' or ')'"
    );
}
