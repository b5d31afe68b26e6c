//! `sim-bench`: kube-sim write throughput with a large store and watchers attached.
//!
//! Starts kube-sim in-process (plain HTTP), stores `--slices` EndpointSlices with
//! `--endpoints` endpoints each, attaches `--watchers` watches on all
//! EndpointSlices, then runs `--writers` concurrent keep-alive connections doing
//! full-object PUTs (each changes one endpoint address) for `--seconds`. Prints one
//! JSON object (also written to `--out`): writes/s, latency percentiles, events
//! delivered to watchers, seed and full-list timings. The load generator shares
//! the machine (and its cores) with the server, so the numbers are conservative.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

#[derive(Parser, Debug, Clone)]
struct Args {
    #[arg(long, default_value_t = 10_000)]
    slices: usize,
    #[arg(long, default_value_t = 10)]
    endpoints: usize,
    #[arg(long, default_value_t = 5)]
    watchers: usize,
    #[arg(long, default_value_t = 16)]
    writers: usize,
    #[arg(long, default_value_t = 10.0)]
    seconds: f64,
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

const TOKEN: &str = "bench-admin";

/// A minimal HTTP/1.1 keep-alive client (no retries, no pooling): enough to drive
/// the server without a client library skewing the numbers.
struct Conn {
    addr: std::net::SocketAddr,
    io: BufReader<TcpStream>,
}

impl Conn {
    async fn open(addr: std::net::SocketAddr) -> anyhow::Result<Conn> {
        let s = TcpStream::connect(addr).await.context("connect")?;
        s.set_nodelay(true)?;
        Ok(Conn {
            addr,
            io: BufReader::new(s),
        })
    }

    async fn request(
        &mut self,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> anyhow::Result<(u16, Vec<u8>)> {
        let head = format!(
            "{method} {path} HTTP/1.1\r\nhost: {}\r\nauthorization: Bearer {TOKEN}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
            self.addr,
            body.len()
        );
        let s = self.io.get_mut();
        s.write_all(head.as_bytes()).await?;
        s.write_all(body).await?;
        let mut line = String::new();
        self.io.read_line(&mut line).await?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .context("status line")?;
        let mut len = 0usize;
        loop {
            line.clear();
            self.io.read_line(&mut line).await?;
            if line == "\r\n" || line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                len = v.trim().parse().context("content-length")?;
            }
        }
        let mut buf = vec![0; len];
        self.io.read_exact(&mut buf).await?;
        Ok((status, buf))
    }
}

fn slice(i: usize, endpoints: usize, generation: u64) -> Value {
    let eps: Vec<Value> = (0..endpoints)
        .map(|e| {
            let last = if e == 0 { (generation % 250) as usize + 1 } else { e + 1 };
            json!({
                "addresses": [format!("10.{}.{}.{}", i / 250 % 250, i % 250, last)],
                "conditions": {"ready": true, "serving": true, "terminating": false},
                "nodeName": format!("node-{}", e % 7),
                "targetRef": {"kind": "Pod", "namespace": "bench", "name": format!("svc-{i}-pod-{e}")},
                "zone": "zone-a",
            })
        })
        .collect();
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": format!("svc-{i}-abcde"), "namespace": "bench", "labels": {"kubernetes.io/service-name": format!("svc-{i}"), "endpointslice.kubernetes.io/managed-by": "bench"}},
        "addressType": "IPv4",
        "endpoints": eps,
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
    })
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx.min(sorted.len() - 1)].as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let cfg = kube_sim::SimConfig {
        admin_token: TOKEN.into(),
        tls: false,
        history_size: 10_000,
        bookmark_interval: Duration::from_secs(5),
    };
    let sim = kube_sim::Sim::start(cfg).await?;
    let addr = sim.addr();
    let mut c = Conn::open(addr).await?;
    let (s, b) = c
        .request(
            "POST",
            "/api/v1/namespaces",
            br#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"bench"}}"#,
        )
        .await?;
    if s != 201 {
        bail!("creating namespace: {s} {}", String::from_utf8_lossy(&b));
    }

    // Seed.
    let seed_start = Instant::now();
    let per = args.slices.div_ceil(8);
    let mut tasks = Vec::new();
    for w in 0..8 {
        let args = args.clone();
        tasks.push(tokio::spawn(async move {
            let mut c = Conn::open(addr).await?;
            for i in (w * per)..((w + 1) * per).min(args.slices) {
                let body = serde_json::to_vec(&slice(i, args.endpoints, 0))?;
                let (s, b) = c
                    .request(
                        "POST",
                        "/apis/discovery.k8s.io/v1/namespaces/bench/endpointslices",
                        &body,
                    )
                    .await?;
                if s != 201 {
                    bail!("seeding slice {i}: {s} {}", String::from_utf8_lossy(&b));
                }
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    let seed_secs = seed_start.elapsed().as_secs_f64();

    // A full list of everything.
    let list_start = Instant::now();
    let (s, body) = c
        .request("GET", "/apis/discovery.k8s.io/v1/endpointslices", b"")
        .await?;
    let list_ms = list_start.elapsed().as_secs_f64() * 1000.0;
    let list: Value = serde_json::from_slice(&body)?;
    let listed = list["items"].as_array().map(Vec::len).unwrap_or(0);
    if s != 200 || listed != args.slices {
        bail!("list returned {s} with {listed} items");
    }
    let rv = list["metadata"]["resourceVersion"]
        .as_str()
        .unwrap_or("0")
        .to_string();
    let list_bytes = body.len();

    // Watchers: count delivered events.
    let stop = tokio_util::sync::CancellationToken::new();
    let mut watchers = Vec::new();
    for _ in 0..args.watchers {
        let stop = stop.clone();
        let rv = rv.clone();
        watchers.push(tokio::spawn(async move {
            let mut s = TcpStream::connect(addr).await?;
            let req = format!("GET /apis/discovery.k8s.io/v1/endpointslices?watch=1&allowWatchBookmarks=true&resourceVersion={rv} HTTP/1.1\r\nhost: {addr}\r\nauthorization: Bearer {TOKEN}\r\n\r\n");
            s.write_all(req.as_bytes()).await?;
            let mut buf = vec![0u8; 1 << 16];
            let mut events = 0u64;
            let mut carry = Vec::new();
            loop {
                tokio::select! {
                    _ = stop.cancelled() => break,
                    n = s.read(&mut buf) => {
                        let n = n?;
                        if n == 0 { break; }
                        carry.extend_from_slice(&buf[..n]);
                        let needle = b"{\"type\":\"MODIFIED\"";
                        let mut i = 0;
                        while i + needle.len() <= carry.len() {
                            if &carry[i..i + needle.len()] == needle { events += 1; i += needle.len(); } else { i += 1; }
                        }
                        let keep = carry.len().min(needle.len() - 1);
                        carry.drain(..carry.len() - keep);
                    }
                }
            }
            anyhow::Ok(events)
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;

    // Writers.
    let write_start = Instant::now();
    let deadline = write_start + Duration::from_secs_f64(args.seconds);
    let mut writers = Vec::new();
    for w in 0..args.writers {
        let args = args.clone();
        writers.push(tokio::spawn(async move {
            let mut c = Conn::open(addr).await?;
            let mut lat = Vec::new();
            let mut n = 0u64;
            let cycle = args.slices.div_ceil(args.writers) as u64;
            while Instant::now() < deadline {
                let i = (w + (n as usize) * args.writers) % args.slices;
                // Each pass over this writer's slices changes an address again.
                let round = 1 + n / cycle;
                let body = serde_json::to_vec(&slice(i, args.endpoints, round))?;
                let path = format!(
                    "/apis/discovery.k8s.io/v1/namespaces/bench/endpointslices/svc-{i}-abcde"
                );
                let t = Instant::now();
                let (s, b) = c.request("PUT", &path, &body).await?;
                lat.push(t.elapsed());
                if s != 200 {
                    bail!("PUT {path}: {s} {}", String::from_utf8_lossy(&b));
                }
                n += 1;
            }
            anyhow::Ok((n, lat))
        }));
    }
    let mut writes = 0u64;
    let mut lat = Vec::new();
    for t in writers {
        let (n, l) = t.await??;
        writes += n;
        lat.extend(l);
    }
    let write_secs = write_start.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_millis(1000)).await;
    stop.cancel();
    let mut delivered = Vec::new();
    for t in watchers {
        delivered.push(t.await??);
    }
    lat.sort();
    let result = json!({
        "benchmark": "kube-sim write throughput",
        "slices": args.slices,
        "endpoints_per_slice": args.endpoints,
        "endpoints_total": args.slices * args.endpoints,
        "watchers": args.watchers,
        "writers": args.writers,
        "seconds": write_secs,
        "writes": writes,
        "writes_per_second": writes as f64 / write_secs,
        "write_latency_ms": {"p50": pct(&lat, 0.5), "p90": pct(&lat, 0.9), "p99": pct(&lat, 0.99), "max": pct(&lat, 1.0)},
        "watch_events_delivered": delivered,
        "seed_slices_per_second": args.slices as f64 / seed_secs,
        "full_list_ms": list_ms,
        "full_list_bytes": list_bytes,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
    });
    let text = serde_json::to_string_pretty(&result)?;
    println!("{text}");
    if let Some(p) = &args.out {
        std::fs::write(p, &text).with_context(|| format!("writing {}", p.display()))?;
    }
    sim.shutdown().await;
    Ok(())
}
