//! The state every connection shares: the store, the users' tokens, the
//! active faults, the request counters and the channels that wake watches.
//!
//! ```text
//!  Sim (lib.rs) ──creates──► SimState ◄──reads/writes── handler::* (one request each)
//!                              │  store: Mutex<Store>   objects, revisions, history
//!                              │  rv_tx / drop_tx       wake / end every watch stream
//!                              │  tokens, faults, stats
//!                              └─ refuse_tx ──────────► server.rs (accept loop)
//! ```
//!
//! Nothing here serves HTTP: the accept loop (`server.rs`) and the request
//! handlers (`handler/`) both depend on this module, never the other way round.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::faults::{FaultRequest, Faults};
use crate::machinery::User;
use crate::store::Store;

/// Configuration of a kube-sim server.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Bearer token that bypasses RBAC (test setup).
    pub admin_token: String,
    /// Serve HTTPS with a generated self-signed CA.
    pub tls: bool,
    /// Number of events kept for watches; older revisions get 410 Gone.
    pub history_size: usize,
    /// Interval of BOOKMARK events on watches that allow them.
    pub bookmark_interval: Duration,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            admin_token: format!("admin-{}", uuid::Uuid::new_v4().simple()),
            tls: false,
            history_size: 10_000,
            bookmark_interval: Duration::from_secs(5),
        }
    }
}

/// What `GET /_sim/stats` reports.
#[derive(Debug, Default)]
pub struct Stats {
    /// verb -> resource (`resource/subresource` for subresources) -> count
    pub requests: BTreeMap<String, BTreeMap<String, u64>>,
    /// user -> verb -> resource -> count (resource requests only)
    pub requests_by_user: BTreeMap<String, BTreeMap<String, BTreeMap<String, u64>>>,
    /// resource -> count
    pub writes: BTreeMap<String, u64>,
}

/// State shared by all connections.
pub struct SimState {
    /// The configuration the server was started with.
    pub cfg: SimConfig,
    /// Objects and history (lock with [`SimState::lock`]).
    pub store: Mutex<Store>,
    /// Current revision, for watch streams to wake up on.
    pub rv_tx: watch::Sender<u64>,
    /// Bumped to end every open watch.
    pub drop_tx: watch::Sender<u64>,
    /// Bearer tokens issued or registered, and their users.
    pub tokens: RwLock<HashMap<String, User>>,
    /// Fault rules in force (lock with [`SimState::faults`]).
    pub faults: Mutex<Faults>,
    /// Request and write counters (`/_sim/stats`).
    pub stats: Mutex<Stats>,
    /// Watch streams open now.
    pub open_watches: AtomicI64,
    /// Cancelled when the server stops.
    pub shutdown: CancellationToken,
    /// Refuse connections until this instant (fault).
    pub refuse_tx: watch::Sender<Option<Instant>>,
    /// The URL the server is reached at.
    pub url: String,
    /// Freezes connections (`freezeConnectionsSeconds` fault).
    pub freezer: Arc<crate::faults::Freezer>,
}

impl SimState {
    /// Empty state (no objects yet, see `bootstrap.rs`) serving at `url`.
    pub fn new(cfg: SimConfig, url: String) -> SimState {
        let (rv_tx, _) = watch::channel(0u64);
        let (drop_tx, _) = watch::channel(0u64);
        let (refuse_tx, _) = watch::channel(None);
        SimState {
            store: Mutex::new(Store::new(cfg.history_size)),
            cfg,
            rv_tx,
            drop_tx,
            tokens: RwLock::new(Default::default()),
            faults: Mutex::new(Default::default()),
            stats: Mutex::new(Default::default()),
            open_watches: AtomicI64::new(0),
            shutdown: CancellationToken::new(),
            refuse_tx,
            url,
            freezer: Arc::default(),
        }
    }

    /// The store, locked (a poisoned lock is taken over).
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The fault rules, locked.
    pub fn faults(&self) -> std::sync::MutexGuard<'_, Faults> {
        self.faults.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Count one request of `verb` on `resource`.
    pub fn count_request(&self, verb: &str, resource: &str) {
        let mut s = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        *s.requests
            .entry(verb.to_string())
            .or_default()
            .entry(resource.to_string())
            .or_default() += 1;
    }

    /// [`Self::count_request`] that also counts under the user's name.
    pub fn count_user_request(&self, user: &str, verb: &str, resource: &str) {
        self.count_request(verb, resource);
        let mut s = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        *s.requests_by_user
            .entry(user.to_string())
            .or_default()
            .entry(verb.to_string())
            .or_default()
            .entry(resource.to_string())
            .or_default() += 1;
    }

    /// Count one committed write of `resource`.
    pub fn count_write(&self, resource: &str) {
        let mut s = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        *s.writes.entry(resource.to_string()).or_default() += 1;
    }

    /// The user a bearer token authenticates (the admin token: `system:masters`).
    pub fn user_for_token(&self, token: &str) -> Option<User> {
        if token == self.cfg.admin_token {
            return Some(User {
                name: "kube-sim-admin".into(),
                groups: vec!["system:masters".into(), "system:authenticated".into()],
                admin: true,
            });
        }
        self.tokens
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(token)
            .cloned()
    }

    /// Register a fresh token for a ServiceAccount.
    pub fn issue_token(&self, namespace: &str, service_account: &str) -> String {
        let token = format!("sa-{}", uuid::Uuid::new_v4().simple());
        let user = User {
            name: format!("system:serviceaccount:{namespace}:{service_account}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{namespace}"),
                "system:authenticated".into(),
            ],
            admin: false,
        };
        self.tokens
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(token.clone(), user);
        token
    }

    /// The `/_sim/stats` answer: counters, current resourceVersion, open watches.
    pub fn stats_json(&self) -> Value {
        let s = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        let rv = self.lock().rv;
        json!({
            "requests": s.requests,
            "requestsByUser": s.requests_by_user,
            "writes": s.writes,
            "resourceVersion": rv.to_string(),
            "openWatches": self.open_watches.load(Ordering::SeqCst),
        })
    }

    /// Apply a `POST /_sim/faults` request (`clear` first).
    pub fn apply_faults(&self, req: FaultRequest) {
        if req.clear {
            let mut f = self.faults();
            *f = Faults::default();
            self.freezer.clear();
        }
        if req.drop_watches {
            self.drop_tx.send_modify(|v| *v += 1);
        }
        if let Some(s) = req.stall_watches_seconds {
            self.faults().stall_until = Some(Instant::now() + Duration::from_secs_f64(s.max(0.0)));
        }
        if req.compact {
            self.lock().compact();
        }
        if let Some(rule) = req.fail {
            self.faults().fail.push(rule);
        }
        if let Some(rule) = req.latency {
            self.faults().latency.push(rule);
        }
        if let Some(s) = req.freeze_connections_seconds {
            self.freezer.freeze(s);
        }
        if let Some(n) = req.expire_continue_tokens {
            self.faults().expire_continue = n;
        }
        if let Some(r) = req.record_arrivals {
            let mut f = self.faults();
            f.record = Some(r);
            f.arrivals.clear();
        }
        if let Some(s) = req.refuse_connections_seconds {
            let until = Instant::now() + Duration::from_secs_f64(s.max(0.0));
            self.refuse_tx.send_replace(Some(until));
        }
    }
}

/// Count a watch as open while the guard lives.
pub struct WatchGuard(pub Arc<SimState>);

impl WatchGuard {
    /// Count a watch as open until the guard drops.
    pub fn new(sh: Arc<SimState>) -> Self {
        sh.open_watches.fetch_add(1, Ordering::SeqCst);
        WatchGuard(sh)
    }
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        self.0.open_watches.fetch_sub(1, Ordering::SeqCst);
    }
}
