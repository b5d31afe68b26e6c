//! `kd-bench xds-client`: the ADS load of the `xds` scenario, a separate
//! process so `/proc` gives its CPU and memory alone. It opens `--streams`
//! streams (one HTTP/2 connection each, as every Envoy has its own), each
//! subscribed like Envoy: CDS wildcard, then EDS for every cluster name,
//! ACKing every response.
//!
//! The plan (`--plan`, JSON written by the harness) lists each cluster's
//! endpoint sets: the one it starts with (sequence 0) and one per change
//! (1, 2, ... in the order the harness makes them). A stream "holds" change
//! `c` once it received an assignment of that cluster whose endpoints equal
//! the set of `c` or of a later change of the same cluster. Per change a
//! countdown of the streams still missing it: the first and the last stream
//! to hold it are timed (wall clock, nanoseconds since the epoch, the
//! harness's clock too).
//!
//! Decoding: an assignment's bytes are hashed, and only the first copy of
//! given bytes is decoded (`testenv::ads::assignment`) and matched to the
//! plan; every stream receives the same bytes for the same content, so 100
//! streams cost one decode. Bytes received are `prost::Message::encoded_len`
//! of each response, counted once the stream holds the starting state.
//!
//! Protocol on stdio: prints `{"ready": ...}` once every stream holds the
//! starting state, `{"all_held": true}` once every change reached every
//! stream, and the result object after a `stop` line on stdin.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use prost::Message;
use serde::{Deserialize, Serialize};
use serde_json::json;
use testenv::ads::{self, CDS, EDS};
use tokio::sync::Notify;

use crate::scenarios::now_nanos;

/// What the harness hands the client.
#[derive(Debug, Serialize, Deserialize)]
pub struct Plan {
    /// Cluster names, in the order of `start`.
    pub names: Vec<String>,
    /// Each cluster's starting endpoints (`ip:port`, sorted).
    pub start: Vec<Vec<String>>,
    /// The changes in order: (cluster index, its new endpoints, sorted).
    pub changes: Vec<(usize, Vec<String>)>,
}

/// SotW or delta.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proto {
    /// State of the world.
    Sotw,
    /// Incremental.
    Delta,
}

impl Proto {
    /// `sotw` / `delta`.
    pub fn as_str(self) -> &'static str {
        match self {
            Proto::Sotw => "sotw",
            Proto::Delta => "delta",
        }
    }

    /// Parses `sotw` / `delta`.
    pub fn parse(s: &str) -> Result<Self> {
        match s {
            "sotw" => Ok(Proto::Sotw),
            "delta" => Ok(Proto::Delta),
            other => bail!("unknown xDS protocol {other:?} (sotw, delta)"),
        }
    }
}

/// Which plan entry some assignment bytes are.
#[derive(Debug, Clone, Copy)]
enum Content {
    /// Cluster index and sequence (0 = the start, k = its k-th change).
    Known(u32, u16),
    /// Endpoints the plan does not list for that cluster (or no such cluster).
    Unknown,
}

struct Shared {
    plan: Plan,
    /// `plan.names` as static `Bytes` (leaked once): a SotW ACK names them
    /// all, and a clone of a static `Bytes` costs nothing.
    names: Vec<bytes::Bytes>,
    index: HashMap<String, usize>,
    /// Per cluster, per sequence: the endpoint set (0 = start).
    sets: Vec<Vec<Vec<String>>>,
    /// Per cluster, per sequence >= 1: the change index.
    change_of: Vec<Vec<usize>>,
    streams: u32,
    remaining: Vec<AtomicU32>,
    first: Vec<AtomicU64>,
    last: Vec<AtomicU64>,
    done: AtomicUsize,
    contents: Mutex<HashMap<u64, Content>>,
    /// Encoded size of each distinct assignment decoded (sum, count).
    assignment_bytes: AtomicU64,
    assignments_decoded: AtomicU64,
    /// Counted once a stream holds the start.
    bytes: AtomicU64,
    responses: AtomicU64,
    /// Every response, also those of the start (progress on stderr).
    all_responses: AtomicU64,
    resources: AtomicU64,
    unknown: AtomicU64,
    removed: AtomicU64,
    ready: AtomicUsize,
    failed: AtomicUsize,
    errors: Mutex<Vec<String>>,
    wake: Notify,
}

impl Shared {
    fn new(plan: Plan, streams: usize) -> Self {
        let n = plan.names.len();
        let index = plan
            .names
            .iter()
            .enumerate()
            .map(|(i, s)| (s.clone(), i))
            .collect();
        let mut sets: Vec<Vec<Vec<String>>> = plan.start.iter().map(|s| vec![s.clone()]).collect();
        let mut change_of = vec![Vec::new(); n];
        for (c, (svc, set)) in plan.changes.iter().enumerate() {
            sets[*svc].push(set.clone());
            change_of[*svc].push(c);
        }
        let changes = plan.changes.len();
        let names = plan
            .names
            .iter()
            .map(|n| bytes::Bytes::from_static(Box::leak(n.clone().into_boxed_str()).as_bytes()))
            .collect();
        Shared {
            plan,
            names,
            index,
            sets,
            change_of,
            streams: streams as u32,
            remaining: (0..changes)
                .map(|_| AtomicU32::new(streams as u32))
                .collect(),
            first: (0..changes).map(|_| AtomicU64::new(0)).collect(),
            last: (0..changes).map(|_| AtomicU64::new(0)).collect(),
            done: AtomicUsize::new(0),
            contents: Mutex::default(),
            assignment_bytes: AtomicU64::new(0),
            assignments_decoded: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            responses: AtomicU64::new(0),
            all_responses: AtomicU64::new(0),
            resources: AtomicU64::new(0),
            unknown: AtomicU64::new(0),
            removed: AtomicU64::new(0),
            ready: AtomicUsize::new(0),
            failed: AtomicUsize::new(0),
            errors: Mutex::default(),
            wake: Notify::new(),
        }
    }

    fn content(&self, value: &[u8]) -> Content {
        let mut h = std::hash::DefaultHasher::new();
        value.hash(&mut h);
        let key = h.finish();
        if let Some(c) = self
            .contents
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
        {
            return *c;
        }
        let (name, eps) = ads::assignment(value);
        let addrs: Vec<String> = eps.into_iter().map(|e| e.addr).collect();
        let c = match self.index.get(&name) {
            Some(&svc) => match self.sets[svc].iter().rposition(|s| *s == addrs) {
                Some(seq) => Content::Known(svc as u32, seq as u16),
                None => Content::Unknown,
            },
            None => Content::Unknown,
        };
        self.assignment_bytes
            .fetch_add(value.len() as u64, Ordering::Relaxed);
        self.assignments_decoded.fetch_add(1, Ordering::Relaxed);
        self.contents
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, c);
        c
    }

    fn error(&self, e: String) {
        self.failed.fetch_add(1, Ordering::Relaxed);
        self.errors
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(e);
        self.wake.notify_one();
    }
}

/// One stream's view: what it holds per cluster (0 = nothing, k + 1 =
/// sequence k) and how many clusters it still lacks the start of.
struct Held {
    seq: Vec<u16>,
    missing_start: usize,
    ready: bool,
}

impl Held {
    fn new(n: usize) -> Self {
        Held {
            seq: vec![0; n],
            missing_start: n,
            ready: false,
        }
    }

    /// A stream received assignment bytes `value`.
    fn receive(&mut self, sh: &Shared, value: &[u8]) {
        let (svc, seq) = match sh.content(value) {
            Content::Known(svc, seq) => (svc as usize, seq),
            Content::Unknown => {
                sh.unknown.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        let had = self.seq[svc];
        if seq < had {
            return;
        }
        if had == 0 {
            self.missing_start -= 1;
        }
        self.seq[svc] = seq + 1;
        // Changes of this cluster from the one after what it held to `seq`.
        let from = had.max(1);
        let now = now_nanos();
        for q in from..=seq {
            let c = sh.change_of[svc][q as usize - 1];
            let before = sh.remaining[c].fetch_sub(1, Ordering::AcqRel);
            if before == sh.streams {
                sh.first[c].store(now, Ordering::Relaxed);
            }
            if before == 1 {
                sh.last[c].store(now, Ordering::Relaxed);
                if sh.done.fetch_add(1, Ordering::AcqRel) + 1 == sh.plan.changes.len() {
                    sh.wake.notify_one();
                }
            }
        }
        if !self.ready && self.missing_start == 0 {
            self.ready = true;
            sh.ready.fetch_add(1, Ordering::AcqRel);
            sh.wake.notify_one();
        }
    }

    fn count(&self, sh: &Shared, len: usize) {
        sh.all_responses.fetch_add(1, Ordering::Relaxed);
        if self.ready {
            sh.bytes.fetch_add(len as u64, Ordering::Relaxed);
            sh.responses.fetch_add(1, Ordering::Relaxed);
        }
    }
}

const WAIT: Duration = Duration::from_secs(1);

async fn sotw_stream(
    sh: Arc<Shared>,
    addr: SocketAddr,
    token: Option<String>,
    id: usize,
    opening: std::result::Result<tokio::sync::OwnedSemaphorePermit, tokio::sync::AcquireError>,
) -> Result<()> {
    let ch = ads::channel(addr).await.context("connecting")?;
    let mut s = ads::SotwLoad::open(ch, token.as_deref(), &format!("kd-bench-{id}"), CDS, &[])
        .await
        .context("opening a SotW stream")?;
    drop(opening);
    let names = &sh.names;
    let mut held = Held::new(names.len());
    let mut eds_sent = false;
    loop {
        let Some(r) = s.recv(WAIT).await? else {
            continue;
        };
        held.count(&sh, r.encoded_len());
        if r.type_url == CDS {
            s.ack(&r, &[]).await;
            if !eds_sent {
                s.send(EDS, names, "", "").await;
                eds_sent = true;
            }
        } else if r.type_url == EDS {
            sh.resources
                .fetch_add(r.resources.len() as u64, Ordering::Relaxed);
            for res in &r.resources {
                held.receive(&sh, &res.value);
            }
            s.ack(&r, names).await;
        }
    }
}

async fn delta_stream(
    sh: Arc<Shared>,
    addr: SocketAddr,
    token: Option<String>,
    id: usize,
    opening: std::result::Result<tokio::sync::OwnedSemaphorePermit, tokio::sync::AcquireError>,
) -> Result<()> {
    let ch = ads::channel(addr).await.context("connecting")?;
    let mut s = ads::Delta::open_with(ch, token.as_deref(), &format!("kd-bench-{id}"), CDS, &["*"])
        .await
        .context("opening a delta stream")?;
    drop(opening);
    let names: Vec<&str> = sh.plan.names.iter().map(String::as_str).collect();
    let none = std::collections::BTreeMap::new();
    let mut held = Held::new(names.len());
    let mut eds_sent = false;
    loop {
        let Some(r) = s.recv(WAIT).await? else {
            continue;
        };
        held.count(&sh, r.encoded_len());
        if r.type_url == CDS {
            s.ack(&r).await;
            if !eds_sent {
                s.send(EDS, &names, &[], &none, "", None).await;
                eds_sent = true;
            }
        } else if r.type_url == EDS {
            sh.resources
                .fetch_add(r.resources.len() as u64, Ordering::Relaxed);
            sh.removed
                .fetch_add(r.removed_resources.len() as u64, Ordering::Relaxed);
            for res in &r.resources {
                if let Some(any) = &res.resource {
                    held.receive(&sh, &any.value);
                }
            }
            s.ack(&r).await;
        }
    }
}

fn print(v: serde_json::Value) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

/// Runs the client until `stop` on stdin (or stdin closes).
pub async fn run(
    addr: SocketAddr,
    proto: Proto,
    streams: usize,
    plan: &Path,
    token: Option<String>,
) -> Result<()> {
    let text =
        std::fs::read_to_string(plan).with_context(|| format!("reading {}", plan.display()))?;
    let plan: Plan = serde_json::from_str(&text).context("parsing the plan")?;
    let sh = Arc::new(Shared::new(plan, streams));
    let t0 = Instant::now();
    // Connect a few at a time, as a fleet does not start in one instant.
    let opening = Arc::new(tokio::sync::Semaphore::new(50));
    for id in 0..streams {
        let (sh, token, opening) = (sh.clone(), token.clone(), opening.clone());
        tokio::spawn(async move {
            let permit = opening.acquire_owned().await;
            let inner = sh.clone();
            // The stream runs in its own task: a stream the server ends
            // panics in `testenv::ads`, which is a failure here.
            let r = tokio::spawn(async move {
                match proto {
                    Proto::Sotw => sotw_stream(inner, addr, token, id, permit).await,
                    Proto::Delta => delta_stream(inner, addr, token, id, permit).await,
                }
            })
            .await;
            match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => sh.error(format!("stream {id}: {e:#}")),
                Err(e) => sh.error(format!("stream {id}: {e}")),
            }
        });
    }
    // Stdin from a thread (tokio's `io-std` is not enabled in the workspace):
    // a line `stop`, or the end of the input, ends the run.
    let (stop_tx, mut stop_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::stdin().lock().lines() {
            match line {
                Ok(l) if l.trim() != "stop" => continue,
                _ => break,
            }
        }
        let _ = stop_tx.send(());
    });
    let mut said_ready = false;
    let mut said_all = false;
    let mut progress = Instant::now();
    loop {
        if progress.elapsed() >= Duration::from_secs(5) {
            progress = Instant::now();
            eprintln!(
                "xds-client: {:.0} s: {}/{streams} streams hold the start, {} responses, {} resources, {} distinct assignments, {} unknown, {}/{} changes everywhere",
                t0.elapsed().as_secs_f64(),
                sh.ready.load(Ordering::Relaxed),
                sh.all_responses.load(Ordering::Relaxed),
                sh.resources.load(Ordering::Relaxed),
                sh.assignments_decoded.load(Ordering::Relaxed),
                sh.unknown.load(Ordering::Relaxed),
                sh.done.load(Ordering::Relaxed),
                sh.plan.changes.len(),
            );
        }
        if !said_ready && sh.ready.load(Ordering::Acquire) == streams {
            said_ready = true;
            print(json!({"ready": true, "setup_s": t0.elapsed().as_secs_f64(),
                         "start_bytes_per_assignment": sh.assignment_bytes.load(Ordering::Relaxed) as f64
                             / sh.assignments_decoded.load(Ordering::Relaxed).max(1) as f64}));
        }
        if said_ready && !said_all && sh.done.load(Ordering::Acquire) == sh.plan.changes.len() {
            said_all = true;
            print(json!({"all_held": true}));
        }
        if sh.failed.load(Ordering::Acquire) > 0 {
            let errors = sh.errors.lock().unwrap_or_else(PoisonError::into_inner);
            print(
                json!({"failed": errors.len(), "errors": errors.iter().take(5).collect::<Vec<_>>()}),
            );
            bail!("{} stream(s) failed: {}", errors.len(), errors[0]);
        }
        tokio::select! {
            _ = sh.wake.notified() => {}
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            _ = stop_rx.recv() => break,
        }
    }
    let load = |v: &Vec<AtomicU64>| {
        v.iter()
            .map(|a| a.load(Ordering::Relaxed))
            .collect::<Vec<_>>()
    };
    print(json!({
        "first": load(&sh.first),
        "last": load(&sh.last),
        "bytes": sh.bytes.load(Ordering::Relaxed),
        "responses": sh.responses.load(Ordering::Relaxed),
        "resources": sh.resources.load(Ordering::Relaxed),
        "removed": sh.removed.load(Ordering::Relaxed),
        "unknown": sh.unknown.load(Ordering::Relaxed),
        "distinct_assignments": sh.assignments_decoded.load(Ordering::Relaxed),
        "assignment_bytes_mean": sh.assignment_bytes.load(Ordering::Relaxed) as f64
            / sh.assignments_decoded.load(Ordering::Relaxed).max(1) as f64,
    }));
    Ok(())
}
