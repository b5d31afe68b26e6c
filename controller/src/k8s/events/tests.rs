use super::*;

#[test]
fn notes_are_cut_to_the_api_limit_on_a_character_boundary() {
    let mut s = "é".repeat(600);
    cut(&mut s, NOTE_LIMIT);
    assert!(s.len() <= NOTE_LIMIT && s.ends_with("..."), "{}", s.len());
    let mut short = "ok".to_string();
    cut(&mut short, NOTE_LIMIT);
    assert_eq!(short, "ok");
}

#[test]
fn failing_writes_regard_the_local_service_else_the_object() {
    let naming = ObjectNaming::fixed("kd");
    let local = service_target(
        &ServiceKey::new("", "shop", "web"),
        Some("u1".into()),
        &naming,
    );
    assert_eq!(
        (
            local.kind.as_deref(),
            local.namespace.as_deref(),
            local.name.as_deref()
        ),
        (Some("Service"), Some("shop"), Some("web"))
    );
    assert_eq!(local.uid.as_deref(), Some("u1"));
    let remote = service_target(&ServiceKey::new("c1", "shop", "web"), None, &naming);
    assert_eq!(
        (
            remote.kind.as_deref(),
            remote.namespace.as_deref(),
            remote.name.as_deref()
        ),
        (Some("DiscoveredService"), Some("kd"), Some("c1.shop.web"))
    );
}

/// `emit` never waits: a disabled handle drops the Event; on a queue
/// nobody drains, the first [`QUEUE`] Events are queued in order (notes
/// cut to the limit) and the rest dropped at once. The emits run on their
/// own thread with a deadline, so an `emit` that blocks fails the test
/// instead of hanging it.
#[test]
fn a_disabled_or_full_queue_never_blocks() {
    let report = |note: String| Report {
        warning: false,
        reason: "X",
        action: "Y",
        note,
    };
    let disabled = Events::disabled();
    assert!(disabled.tx.is_none());
    let (tx, mut rx) = mpsc::channel(QUEUE);
    let (done_tx, done) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        disabled.emit(discovered_service("a", "b", None), report("dropped".into()));
        let ev = Events { tx: Some(tx) };
        for i in 0..QUEUE * 2 {
            let long = if i == 0 {
                "x".repeat(2 * NOTE_LIMIT)
            } else {
                String::new()
            };
            ev.emit(
                discovered_service("a", "b", None),
                report(format!("{i} {long}")),
            );
        }
        // The handle is handed back: the queue stays open.
        let _ = done_tx.send(ev);
    });
    let _ev = done
        .recv_timeout(Duration::from_secs(10))
        .expect("emit blocked on a full queue");
    assert_eq!(rx.len(), QUEUE, "QUEUE Events are queued, the rest dropped");
    let notes: Vec<String> = std::iter::from_fn(|| rx.try_recv().ok())
        .map(|(r, _)| r.note)
        .collect();
    assert!(
        notes[0].starts_with("0 x") && notes[0].len() == NOTE_LIMIT && notes[0].ends_with("..."),
        "the first note, cut: {} bytes",
        notes[0].len()
    );
    let rest: Vec<String> = (1..QUEUE).map(|i| format!("{i} ")).collect();
    assert_eq!(notes[1..], rest[..], "the first QUEUE Events, in order");
}
