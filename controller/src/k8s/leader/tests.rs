use super::*;
use crate::test_support::sim_client;

fn spec(holder: &str, renew_secs_ago: i64, duration: i32) -> LeaseSpec {
    let now = jiff::Timestamp::now();
    LeaseSpec {
        holder_identity: Some(holder.into()),
        renew_time: Some(MicroTime(
            now - jiff::SignedDuration::from_secs(renew_secs_ago),
        )),
        lease_duration_seconds: Some(duration),
        ..LeaseSpec::default()
    }
}

#[test]
fn client_go_proportions_and_validation() {
    let c = LeaseConfig::new(
        "ns".into(),
        "l".into(),
        "me".into(),
        Duration::from_secs(15),
    );
    assert_eq!(c.renew_deadline, Duration::from_secs(10));
    assert_eq!(c.retry_period, Duration::from_secs(2));
    assert_eq!(c.round_timeout(), Duration::from_secs(8));
    assert_eq!(c.release_timeout(), Duration::from_secs(8));
    let long = LeaseConfig::new(
        "ns".into(),
        "l".into(),
        "me".into(),
        Duration::from_secs(60),
    );
    assert_eq!(long.release_timeout(), MAX_RELEASE_TIMEOUT);
    assert!(c.validate().is_ok());
    let small = LeaseConfig::new("ns".into(), "l".into(), "me".into(), Duration::ZERO);
    assert_eq!(small.duration, Duration::from_secs(1));
    assert!(small.validate().is_ok(), "{small:?}");
    let bad = LeaseConfig {
        renew_deadline: Duration::from_secs(15),
        ..c.clone()
    };
    assert!(bad.validate().unwrap_err().contains("renew deadline"));
    let bad = LeaseConfig {
        retry_period: Duration::from_secs(10),
        ..c
    };
    assert!(bad.validate().unwrap_err().contains("retry period"));
}

#[test]
fn leading_ends_at_the_renew_deadline() {
    let t0 = Instant::now();
    let d = Duration::from_secs(10);
    assert!(!still_leading(None, t0, d));
    assert!(still_leading(Some(t0), t0, d));
    assert!(still_leading(Some(t0), t0 + Duration::from_millis(9999), d));
    assert!(!still_leading(Some(t0), t0 + d, d));
    // A clock reading before the renewal (never happens) still leads.
    assert!(still_leading(Some(t0 + d), t0, d));
}

#[test]
fn decisions() {
    let t0 = Instant::now();
    let d = Duration::from_secs(15);
    let s = Duration::from_secs;
    assert_eq!(decide(None, "me", t0, t0, d), Decision::Create);
    assert_eq!(
        decide(Some(&spec("me", 100, 15)), "me", t0, t0 + s(100), d),
        Decision::Renew
    );
    assert_eq!(
        decide(Some(&spec("other", 1, 15)), "me", t0, t0 + s(14), d),
        Decision::Follow("other".into())
    );
    assert_eq!(
        decide(Some(&spec("other", 1, 15)), "me", t0, t0 + s(15), d),
        Decision::TakeOver
    );
    assert_eq!(
        decide(Some(&spec("", 0, 15)), "me", t0, t0, d),
        Decision::TakeOver
    );
    // The remote timestamps do not matter, only when the record changed.
    let mut no_renew = spec("other", 0, 15);
    no_renew.renew_time = None;
    assert_eq!(
        decide(Some(&no_renew), "me", t0, t0 + s(1), d),
        Decision::Follow("other".into())
    );
    assert_eq!(
        decide(Some(&spec("other", 3600, 15)), "me", t0, t0 + s(1), d),
        Decision::Follow("other".into())
    );
}

/// Issue 16 item 6, the rule: a standby acts on changes it observes on
/// its own monotonic clock. A leader whose wall clock is 20 s behind the
/// standby's (its `renewTime` looks expired to the standby's wall clock
/// at every renewal) is followed while it renews; once it stops, the
/// standby takes over `lease_duration` after the last change it saw.
#[test]
fn a_skewed_renew_time_is_followed_while_it_changes() {
    let t0 = Instant::now();
    let ms = Duration::from_millis;
    let d = Duration::from_secs(15);
    let mut observed = Observed::default();
    let mut lease = spec("leader", 20, 15);
    let mut now = t0;
    // The leader renews every 2 s, the standby reads every 2 s, for 2 minutes.
    for _ in 0..60 {
        now += ms(2000);
        let renew = lease.renew_time.as_ref().unwrap().0 + jiff::SignedDuration::from_secs(2);
        lease.renew_time = Some(MicroTime(renew));
        observed.see(Some(&lease), now);
        assert_eq!(
            decide(Some(&lease), "me", observed.changed_at().unwrap(), now, d),
            Decision::Follow("leader".into())
        );
    }
    // It stops renewing: the same record for 14.9 s is still followed.
    let last = now;
    for step in 1..=149 {
        now = last + ms(100 * step);
        observed.see(Some(&lease), now);
        assert_eq!(observed.changed_at(), Some(last));
        assert_eq!(
            decide(Some(&lease), "me", last, now, d),
            Decision::Follow("leader".into()),
            "{step}"
        );
    }
    now = last + d;
    observed.see(Some(&lease), now);
    assert_eq!(
        decide(Some(&lease), "me", observed.changed_at().unwrap(), now, d),
        Decision::TakeOver
    );
}

#[test]
fn epochs_change_on_every_gain_and_loss_and_fence_old_ones() {
    let (tx, rx) = watch::channel(Leadership::default());
    let fence = Fence::new(rx);
    assert!(fence.begin().is_err(), "not leading");
    assert!(publish(&tx, true));
    assert!(!publish(&tx, true), "no change, no new epoch");
    let t1 = fence.begin().unwrap();
    assert_eq!(fence.check(t1), Ok(()));
    assert!(publish(&tx, false));
    let e = fence.check(t1).unwrap_err();
    assert_eq!(e.started, Some(1));
    assert_eq!(e.now.epoch, 2);
    assert!(publish(&tx, true));
    assert!(fence.check(t1).is_err(), "a write of an earlier epoch");
    let t3 = fence.begin().unwrap();
    assert_eq!(fence.check(t3), Ok(()));
    assert!(Fence::always().begin().is_ok());
}

/// Issue 29 item 9: a request in flight is abandoned when its term
/// ends ([`Leadership::until`]), not when `request_timeout` would end
/// it; a renewal that moves the end on lets it finish; a loss ends it
/// at once.
#[tokio::test(start_paused = true)]
async fn a_request_in_flight_is_abandoned_at_the_end_of_its_term() {
    let s = Duration::from_secs;
    let (tx, rx) = watch::channel(Leadership::default());
    let fence = Fence::new(rx);
    let t0 = Instant::now();
    assert!(publish_until(&tx, true, Some(t0 + s(2))));
    let token = fence.begin().unwrap();
    let slow = |d| async move {
        tokio::time::sleep(d).await;
        "answered"
    };
    // A 5 s answer in a term that ends after 2 s: abandoned at 2 s.
    let e = fence.send(token, slow(s(5))).await.unwrap_err();
    assert_eq!(e.started, Some(token.epoch));
    assert_eq!(Instant::now(), t0 + s(2));
    assert!(fence.check(token).is_err(), "the term is over");
    // Renewed at 1.5 s (the end moves to 4 s, no receiver is woken): a
    // 3 s answer arrives.
    let t1 = Instant::now();
    assert!(!publish_until(&tx, true, Some(t1 + s(2))));
    let renew = async {
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(!publish_until(&tx, true, Some(t1 + s(4))));
    };
    let (out, ()) = tokio::join!(fence.send(token, slow(s(3))), renew);
    assert_eq!(out, Ok("answered"));
    // A loss ends the request at once.
    let lose = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        publish(&tx, false);
    };
    let started = Instant::now();
    let (out, ()) = tokio::join!(fence.send(token, slow(s(1))), lose);
    assert!(out.is_err());
    assert_eq!(Instant::now(), started + Duration::from_millis(100));
    // Without an end (no election), only the answer ends it.
    assert_eq!(
        Fence::always().send_epoch(0, slow(s(60))).await,
        Ok("answered")
    );
}

fn lease_cfg(identity: &str, clock: WallClock) -> LeaseConfig {
    LeaseConfig {
        clock,
        ..LeaseConfig::new(
            "default".into(),
            "kd-test".into(),
            identity.into(),
            Duration::from_secs(1),
        )
    }
}

async fn wait_leading(rx: &mut watch::Receiver<Leadership>) {
    tokio::time::timeout(Duration::from_secs(30), async {
        while !rx.borrow_and_update().leading {
            rx.changed().await.unwrap();
        }
    })
    .await
    .expect("never became leader");
}

async fn holder(client: &Client) -> Option<String> {
    Api::<Lease>::namespaced(client.clone(), "default")
        .get("kd-test")
        .await
        .unwrap()
        .spec?
        .holder_identity
}

/// Issue 16 item 6 against an API server: a standby whose wall clock is
/// 20 s ahead never takes over from a leader that keeps renewing (watched
/// for 4 lease durations); it takes over once the leader stops renewing
/// (its task ends without releasing the lease, like a SIGKILL).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_with_a_clock_20s_ahead_takes_over_only_from_a_silent_leader() {
    let (_sim, client) = sim_client().await;
    let stop_a = CancellationToken::new();
    let (mut a_rx, a_task) = spawn(
        client.clone(),
        lease_cfg("a", WallClock::system()),
        stop_a.clone(),
    );
    wait_leading(&mut a_rx).await;
    let stop_b = CancellationToken::new();
    let (b_rx, b_task) = spawn(
        client.clone(),
        lease_cfg("b", WallClock::skewed(jiff::SignedDuration::from_secs(20))),
        stop_b.clone(),
    );
    let mut watch_b = b_rx.clone();
    let b_led = tokio::spawn(async move {
        loop {
            if watch_b.borrow_and_update().leading {
                return true;
            }
            if watch_b.changed().await.is_err() {
                return false;
            }
        }
    });
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(
        !b_led.is_finished(),
        "the standby with a skewed clock took over"
    );
    assert!(a_rx.borrow().leading);
    assert_eq!(holder(&client).await.as_deref(), Some("a"));
    // A stops renewing (no release).
    a_task.abort();
    assert!(
        tokio::time::timeout(Duration::from_secs(30), b_led)
            .await
            .expect("no takeover from a silent leader")
            .unwrap()
    );
    assert_eq!(holder(&client).await.as_deref(), Some("b"));
    stop_b.cancel();
    b_task.await.unwrap();
    stop_a.cancel();
}

/// Issue 16 item 7: the release at shutdown is bounded. With every Lease
/// request hanging (a latency fault of 10 minutes), the elector still
/// ends (within 30 s, its release timeout is ~0.5 s here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_release_at_shutdown_is_bounded() {
    let (_sim, client) = sim_client().await;
    let stop = CancellationToken::new();
    let (mut rx, task) = spawn(
        client.clone(),
        lease_cfg("a", WallClock::system()),
        stop.clone(),
    );
    wait_leading(&mut rx).await;
    let fault =
        serde_json::json!({"latency": {"verb": "*", "resource": "leases", "millis": 600_000}});
    let req = http::Request::post("/_sim/faults")
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&fault).unwrap())
        .unwrap();
    client.request_text(req).await.unwrap();
    stop.cancel();
    tokio::time::timeout(Duration::from_secs(30), task)
        .await
        .expect("the release at shutdown hung")
        .unwrap();
    assert!(!rx.borrow().leading, "not leading after the release");
}
