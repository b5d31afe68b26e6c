use std::net::SocketAddr;

use kube_discovery_core::{Node, PortMap, ServiceKey, ServiceNodes, SourceKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::serve::http::{AppState, serve_with_limits};
use crate::state::ControllerState;

/// A served state with `services` services of `nodes` nodes each.
async fn start(
    limits: ServerLimits,
    services: usize,
    nodes: usize,
) -> (SocketAddr, CancellationToken) {
    let shared = Arc::new(ControllerState::new([""]));
    for i in 0..services {
        let k = ServiceKey::new("", "default", format!("svc-{i}"));
        let ports = PortMap::from([(
            "http".to_string(),
            (0..nodes)
                .map(|n| Node::new(format!("10.{}.{}.{}", i / 250, i % 250, n % 250), 80, 100))
                .collect(),
        )]);
        shared.set_desired(
            &k,
            Some(ServiceNodes::new(
                k.clone(),
                SourceKind::Endpoints,
                ports,
                None,
            )),
        );
    }
    let state = AppState::new(
        shared,
        Arc::new(crate::serve::metrics::Metrics::default().registry()),
        serde_json::Value::Null,
        None,
    );
    let stop = CancellationToken::new();
    let (addr, _task) = serve_with_limits(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        state,
        limits,
        stop.clone(),
    )
    .await
    .unwrap();
    (addr, stop)
}

fn limits() -> ServerLimits {
    ServerLimits {
        header_read_timeout: Duration::from_millis(300),
        request_timeout: Duration::from_secs(5),
        write_timeout: Duration::from_millis(500),
        max_connections: 4,
    }
}

/// Reads until the server closes the connection (EOF or reset); whether
/// it did within `within`.
async fn closed_within(s: &mut TcpStream, within: Duration) -> bool {
    let mut buf = vec![0u8; 64 * 1024];
    tokio::time::timeout(within, async {
        loop {
            match s.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

/// One request on `s` (keep-alive); the status code.
async fn request(s: &mut TcpStream, path: &str) -> u16 {
    let req = format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n");
    s.write_all(req.as_bytes()).await.unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut byte).await.unwrap(), 1, "closed mid-answer");
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).to_string();
    let len: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length: ")
                .map(str::to_string)
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).await.unwrap();
    head.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// A half-sent header, a connection that sends nothing and an idle
/// keep-alive connection are all closed after the header read timeout.
#[tokio::test]
async fn stalled_and_idle_connections_are_closed() {
    let (addr, stop) = start(limits(), 1, 1).await;
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Slow: ")
        .await
        .unwrap();
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let mut idle = TcpStream::connect(addr).await.unwrap();
    assert_eq!(request(&mut idle, "/healthz").await, 200);
    for (what, s) in [
        ("half-sent", &mut half),
        ("silent", &mut silent),
        ("idle", &mut idle),
    ] {
        assert!(
            closed_within(s, Duration::from_secs(3)).await,
            "{what} still open"
        );
    }
    stop.cancel();
}

/// At the cap, the connection that has waited longest for a request is
/// closed and the newcomer (a prober) is answered.
#[tokio::test]
async fn at_the_cap_the_longest_waiting_connection_makes_room() {
    let (addr, stop) = start(
        ServerLimits {
            header_read_timeout: Duration::from_secs(30),
            ..limits()
        },
        1,
        1,
    )
    .await;
    let mut waiting = Vec::new();
    for _ in 0..4 {
        waiting.push(TcpStream::connect(addr).await.unwrap());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The probes stay open (idle, but newer than the waiting ones): the
    // server stays at its cap.
    let mut probes = Vec::new();
    for (round, oldest) in waiting.iter_mut().take(3).enumerate() {
        let mut probe = TcpStream::connect(addr).await.unwrap();
        let answered =
            tokio::time::timeout(Duration::from_secs(1), request(&mut probe, "/healthz")).await;
        assert_eq!(answered.ok(), Some(200), "round {round}");
        probes.push(probe);
        assert!(
            closed_within(oldest, Duration::from_secs(1)).await,
            "the oldest waiting connection {round} was not closed"
        );
    }
    // The newest waiting one was left alone.
    let mut last = waiting.pop().unwrap();
    assert_eq!(request(&mut last, "/healthz").await, 200);
    stop.cancel();
}

/// Stopping the server does not wait for a half-sent header's whole
/// header timeout: open connections get [`SHUTDOWN_GRACE`] at most.
#[tokio::test]
async fn shutdown_waits_for_stalled_clients_at_most_the_grace() {
    let state = AppState::new(
        Arc::new(ControllerState::new([""])),
        Arc::new(crate::serve::metrics::Metrics::default().registry()),
        serde_json::Value::Null,
        None,
    );
    let stop = CancellationToken::new();
    let limits = ServerLimits {
        header_read_timeout: Duration::from_secs(60),
        ..limits()
    };
    let (addr, task) = serve_with_limits(
        SocketAddr::from(([127, 0, 0, 1], 0)),
        state,
        limits,
        stop.clone(),
    )
    .await
    .unwrap();
    let mut half = TcpStream::connect(addr).await.unwrap();
    half.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Slow: ")
        .await
        .unwrap();
    let mut idle = TcpStream::connect(addr).await.unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t = Instant::now();
    stop.cancel();
    assert!(
        closed_within(&mut idle, Duration::from_secs(1)).await,
        "idle connection kept open"
    );
    tokio::time::timeout(SHUTDOWN_GRACE + Duration::from_secs(2), task)
        .await
        .expect("the server did not stop within the grace")
        .unwrap();
    assert!(
        t.elapsed() >= SHUTDOWN_GRACE - Duration::from_millis(100),
        "{:?}",
        t.elapsed()
    );
    assert!(closed_within(&mut half, Duration::from_secs(1)).await);
}

/// A client that does not read its dump is disconnected after the write
/// timeout; until then it holds a dump slot (the answer is memory), so
/// with both slots held a third dump is refused at once, and after it
/// one is served again.
#[tokio::test]
async fn a_client_that_does_not_read_its_dump_is_disconnected_and_frees_the_slot() {
    // About 10 MB of dump: more than the socket buffers take.
    let (addr, stop) = start(
        ServerLimits {
            header_read_timeout: Duration::from_secs(30),
            ..limits()
        },
        4000,
        40,
    )
    .await;
    let mut greedy = Vec::new();
    for _ in 0..crate::serve::http::MAX_CONCURRENT_DUMPS {
        // A small receive window: the answer does not fit in the buffers.
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.set_recv_buffer_size(4096).unwrap();
        let mut s = socket.connect(addr).await.unwrap();
        s.write_all(b"GET /v1/discovery/kubernetes/dump HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .unwrap();
        greedy.push(s);
    }
    // Both slots are taken while their answers are not read.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut third = TcpStream::connect(addr).await.unwrap();
    assert_eq!(
        request(&mut third, "/v1/discovery/kubernetes/dump").await,
        503
    );
    // Once their writes time out the slots are free again (reading
    // earlier would let the answers finish; building them takes a while).
    let freed = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let mut s = TcpStream::connect(addr).await.unwrap();
            if request(&mut s, "/v1/discovery/kubernetes/dump").await == 200 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(freed.is_ok(), "the dump slots were never freed");
    for s in &mut greedy {
        assert!(
            closed_within(s, Duration::from_secs(5)).await,
            "a reader that stalls stays connected"
        );
    }
    stop.cancel();
}
