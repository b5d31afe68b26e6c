use super::*;

fn key(i: usize) -> ServiceKey {
    ServiceKey::new("", "ns", format!("svc-{i}"))
}

#[tokio::test]
async fn a_million_changes_of_ten_keys_wait_as_ten_entries_with_their_first_time() {
    let (h, mut inbox) = channel();
    let t0 = Instant::now();
    for round in 0..100_000u64 {
        let at = t0 + std::time::Duration::from_millis(round);
        h.changed((0..10).map(key).collect(), at);
    }
    assert_eq!(inbox.waiting(), 10, "bounded by keys, not events");
    let Some(WriterMsg::Changed { mut keys }) = inbox.recv().await else {
        panic!("changed keys first");
    };
    keys.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    assert_eq!(keys.len(), 10);
    assert!(
        keys.iter().all(|(_, at)| *at == t0),
        "first change time kept"
    );
    assert_eq!(inbox.waiting(), 0);
}

#[tokio::test]
async fn a_barrier_never_overtakes_a_change_sent_before_it() {
    let (h, mut inbox) = channel();
    h.synced("c1");
    h.changed(vec![key(1)], Instant::now());
    h.drifted(vec![key(2)]);
    h.synced("c2");
    let mut order = Vec::new();
    drop(h);
    while let Some(m) = inbox.recv().await {
        order.push(match m {
            WriterMsg::Changed { .. } => "changed".to_string(),
            WriterMsg::Drifted { .. } => "drifted".to_string(),
            WriterMsg::Synced { cluster } => format!("synced {cluster}"),
        });
    }
    // c1's barrier comes after a later change (harmless: it waits for one
    // more write); c2's after everything sent before it.
    assert_eq!(order, ["changed", "drifted", "synced c1", "synced c2"]);
}

#[tokio::test]
async fn the_inbox_closes_when_the_last_sender_is_gone_after_delivering_everything() {
    let (h, mut inbox) = channel();
    let h2 = h.clone();
    drop(h);
    h2.changed(vec![key(1)], Instant::now());
    let waiter = tokio::spawn(async move {
        let mut n = 0;
        while inbox.recv().await.is_some() {
            n += 1;
        }
        n
    });
    tokio::task::yield_now().await;
    drop(h2);
    assert_eq!(waiter.await.unwrap(), 1);
}
