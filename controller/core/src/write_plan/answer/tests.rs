use super::*;

const STAMP_REFUSED: &str = "failed to create typed patch object (shop/web; kubediscovery.io/v1alpha1, Kind=DiscoveredService): .status.observedGeneration: field not declared in schema";

#[test]
fn answers_are_classified_by_code_and_message() {
    assert_eq!(classify(500, STAMP_REFUSED), Answer::StampUndeclared);
    assert_eq!(
        classify(500, ".spec.aliases: field not declared in schema"),
        Answer::Failed
    );
    assert_eq!(
        classify(422, "observedGeneration: field not declared in schema"),
        Answer::Failed
    );
    assert_eq!(
        classify(
            422,
            "DiscoveredService.kubediscovery.io \"big\" is invalid: spec.shard.count: Required value"
        ),
        Answer::ShardFieldCoOwned
    );
    assert_eq!(
        classify(409, "Apply failed with 1 conflict"),
        Answer::Conflict
    );
    assert_eq!(classify(403, "forbidden"), Answer::Failed);
}

/// Plays one object's exchange: the API server answers with `answers` in
/// turn (then `Applied`), a 409 is answered by `owner`. Returns what each
/// request sent and how it ended (`Ok`: applied, `Err(true)`: the name is
/// taken, `Err(false)`: failed).
fn play(first: Sending, answers: &[Answer], owner: &Owner) -> (Vec<Sending>, Result<(), bool>) {
    let mut sent = Vec::new();
    let mut sending = first;
    let mut answers = answers.iter().copied();
    loop {
        sent.push(sending);
        let answer = answers.next().unwrap_or(Answer::Applied);
        match next(sending, answer) {
            Next::Done => return (sent, Ok(())),
            Next::Fail => return (sent, Err(false)),
            Next::Unstamped => sending.stamped = false,
            Next::OneOfOne => sending.one_of_one = true,
            Next::AskOwner => match after_owner(sending, owner) {
                Some(s) => sending = s,
                None => return (sent, Err(true)),
            },
        }
    }
}

#[test]
fn an_old_crd_then_a_hand_edit_of_our_object_costs_three_applies() {
    let (sent, end) = play(
        Sending::first(true, true),
        &[Answer::StampUndeclared, Answer::Conflict],
        &Owner::Us,
    );
    assert_eq!(end, Ok(()));
    assert_eq!(
        sent,
        vec![
            Sending::first(true, true),
            Sending::first(false, true),
            Sending {
                forced: true,
                ..Sending::first(false, true)
            },
        ]
    );
}

#[test]
fn someone_elses_object_is_never_forced() {
    for owner in [Owner::Instance("other".into()), Owner::Unmanaged] {
        let (sent, end) = play(Sending::first(true, false), &[Answer::Conflict], &owner);
        assert_eq!(end, Err(true), "{owner:?}");
        assert!(sent.iter().all(|s| !s.forced), "{owner:?}: {sent:?}");
    }
}

#[test]
fn a_co_owned_shard_field_is_answered_by_one_shard_of_one_only_when_unsharding() {
    let (sent, end) = play(
        Sending::first(true, true),
        &[Answer::ShardFieldCoOwned],
        &Owner::Us,
    );
    assert_eq!(end, Ok(()));
    assert_eq!(sent.len(), 2);
    assert!(sent[1].one_of_one);
    // A sharded object refused over its shard field: nothing to fall back to.
    let (sent, end) = play(
        Sending::first(true, false),
        &[Answer::ShardFieldCoOwned],
        &Owner::Us,
    );
    assert_eq!((sent.len(), end), (1, Err(false)));
}

#[test]
fn each_fallback_is_taken_once_and_an_object_costs_at_most_four_applies() {
    let all = [
        Answer::StampUndeclared,
        Answer::ShardFieldCoOwned,
        Answer::Conflict,
        Answer::Failed,
    ];
    // Every sequence of five non-applied answers, from every first apply.
    for n in 0..all.len().pow(5) {
        let answers: Vec<Answer> = (0..5)
            .map(|i| all[(n / all.len().pow(i)) % all.len()])
            .collect();
        for (stamped, unsharded) in [(true, true), (true, false), (false, true), (false, false)] {
            let (sent, _) = play(Sending::first(stamped, unsharded), &answers, &Owner::Us);
            assert!(sent.len() <= 4, "{answers:?}: {sent:?}");
            for w in sent.windows(2) {
                assert_ne!(w[0], w[1], "the same request twice: {answers:?}");
            }
            for w in sent.windows(2) {
                // Flags only ever turn one way: no fallback is undone.
                assert!(w[0].stamped || !w[1].stamped, "{answers:?}: {sent:?}");
                assert!(!w[0].one_of_one || w[1].one_of_one, "{answers:?}: {sent:?}");
                assert!(!w[0].forced || w[1].forced, "{answers:?}: {sent:?}");
            }
        }
    }
}

#[test]
fn leftovers_are_foreign_port_keys_and_a_shard_field_on_an_unsharded_object() {
    let got = ["http".to_string(), "extra".to_string()];
    let want = |k: &str| k == "http";
    assert_eq!(
        leftovers(want, &got, true, true),
        Leftovers {
            ports: vec!["extra".into()],
            shard: true
        }
    );
    let none = leftovers(|_| true, &got, false, true);
    assert!(none.is_empty(), "{none:?}");
}
