//! The parsed selector as `kube::core::{Selector, Expression}` (feature `kube`,
//! on by default).
//!
//! kube's [`Expression`] has no `Gt`/`Lt`, so a selector with a `>` or `<`
//! requirement does not convert (the API server accepts it; send such a
//! selector as text). `k==v` becomes `Expression::Equal`.

use kube_core::{Expression, Selector};

use crate::selector::{LabelSelector, Operator, Requirement, SelectorError};

impl TryFrom<&Requirement> for Expression {
    type Error = SelectorError;

    fn try_from(r: &Requirement) -> Result<Self, SelectorError> {
        let key = r.key.clone();
        let value = || r.values.first().cloned().unwrap_or_default();
        let set = || r.values.iter().cloned().collect();
        Ok(match r.op {
            Operator::Equals | Operator::DoubleEquals => Expression::Equal(key, value()),
            Operator::NotEquals => Expression::NotEqual(key, value()),
            Operator::In => Expression::In(key, set()),
            Operator::NotIn => Expression::NotIn(key, set()),
            Operator::Exists => Expression::Exists(key),
            Operator::DoesNotExist => Expression::DoesNotExist(key),
            Operator::GreaterThan | Operator::LessThan => {
                return Err(SelectorError(format!(
                    "{r}: kube::core::Expression has no 'Gt'/'Lt' operator"
                )));
            }
        })
    }
}

impl TryFrom<&LabelSelector> for Selector {
    type Error = SelectorError;

    /// Fails when a requirement uses `>` or `<`.
    fn try_from(s: &LabelSelector) -> Result<Self, SelectorError> {
        s.requirements().iter().map(Expression::try_from).collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use kube_core::{Selector, SelectorExt};

    use crate::LabelSelector;

    #[test]
    fn converts_and_matches_the_same_without_gt_lt() {
        let sets: Vec<BTreeMap<String, String>> = [
            vec![],
            vec![("app", "web")],
            vec![("app", "web"), ("tier", "a"), ("canary", "")],
            vec![("app", "db"), ("tier", "c"), ("x", "")],
        ]
        .into_iter()
        .map(|l| l.into_iter().map(|(k, v)| (k.into(), v.into())).collect())
        .collect();
        for src in [
            "",
            "app=web",
            "app==web",
            "app!=web",
            "tier in (a,b)",
            "tier notin (a,b)",
            "canary",
            "!canary",
            "x in ()",
            "app=web,tier in (a, b),!canary,x notin (1)",
        ] {
            let ours = LabelSelector::parse(src).unwrap();
            let kube = Selector::try_from(&ours).unwrap();
            for l in &sets {
                assert_eq!(kube.matches(l), ours.matches(l), "{src:?} on {l:?}");
            }
            // kube prints what the API server parses back to the same selector.
            let back = LabelSelector::parse(&kube.to_string()).unwrap();
            assert_eq!(
                back.to_string(),
                ours.to_string().replace("==", "="),
                "{src:?}"
            );
            assert_eq!(kube.selects_all(), ours.is_empty());
        }
    }

    #[test]
    fn gt_and_lt_have_no_kube_expression() {
        let s = LabelSelector::parse("app=web,gen>3").unwrap();
        assert_eq!(
            Selector::try_from(&s).unwrap_err().to_string(),
            "gen>3: kube::core::Expression has no 'Gt'/'Lt' operator"
        );
    }
}
