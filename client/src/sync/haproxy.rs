//! `sync haproxy`: keep HAProxy backends in step with DiscoveredServices
//! through the Runtime API, so changes never drop a connection; reload only
//! when a backend needs more server slots than it has.
//!
//! Each `--service` is one `backend` with a fixed number of server slots
//! `s1..sN` in a file we own (`--output`, loaded with an extra `-f`). A slot
//! is either enabled (`state ready`, serving one node) or in maintenance
//! (`state maint`, no new traffic; in-flight requests finish). On each batch of
//! changes, per backend:
//!
//! 1. read the live slots (`show servers state <backend>`),
//! 2. [`plan`] (pure): nodes already in an enabled slot stay there (weight
//!    fixed if needed); new nodes go to free slots (`set server b/s addr IP
//!    port P`, `weight`, `state ready`); slots of removed nodes go to `maint`,
//!    after the new ones are ready, so a replacement never passes through zero
//!    servers,
//! 3. send the commands over the stats socket (admin level),
//! 4. re-render the file from the resulting slots ([`render`], pure), check it
//!    with `haproxy -c` BEFORE it replaces the old one, and write it without
//!    reloading, so a restart starts from the current state.
//!
//! When a backend needs more slots than it has, the file is rendered with
//! `max(--min-slots, next power of two)` slots, checked, written, and HAProxy
//! is reloaded through the master CLI (`reload`, master-worker mode `-W -S`);
//! the sync then waits until the new worker shows the new slots.
//!
//! HAProxy weights are 0..=256: weights above 256 are scaled down
//! proportionally (minimum 1). Only IP hosts are used (`set server addr`
//! takes addresses); other nodes are skipped with a warning. An unavailable
//! service ([`EmptyPolicy`]) has all its slots in maintenance, so HAProxy
//! answers 503. Backends inherit the last `defaults` section of the main
//! configuration; each also gets `balance roundrobin`, `retries 3` and
//! `option redispatch 1` so a request to a backend that just went away is
//! retried on another slot.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use kube_discovery_core::Node;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::nginx::write_atomic;
use super::{Error, KubeArgs, Result};
use crate::policy::{Decider, EmptyPolicy, HostRule, ServiceRef, Target, check_unique};

/// Flags of `sync haproxy`.
#[derive(Debug, Clone, clap::Args)]
pub struct HaproxyArgs {
    /// Where to read DiscoveredServices.
    #[command(flatten)]
    pub kube: KubeArgs,
    /// A service to keep as a backend: `[BACKEND=][id/]namespace/name:port` (repeatable).
    /// Default backend name: `kd_` + the name with `_` for other characters.
    #[arg(long = "service", required = true)]
    pub services: Vec<ServiceRef>,
    /// The backends file we own (load it with an extra `-f` after the main config).
    #[arg(long)]
    pub output: PathBuf,
    /// HAProxy's other configuration files, in order (for `haproxy -c`).
    #[arg(long = "haproxy-conf", required = true)]
    pub haproxy_conf: Vec<PathBuf>,
    /// The HAProxy binary.
    #[arg(long, default_value = "haproxy")]
    pub haproxy_bin: PathBuf,
    /// The worker's stats socket (`stats socket PATH level admin`): the Runtime API.
    #[arg(long)]
    pub socket: PathBuf,
    /// The master CLI socket (`haproxy -W -S PATH`), used to reload when slots must grow.
    #[arg(long)]
    pub master_socket: Option<PathBuf>,
    /// Server slots per backend at least.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub min_slots: u16,
    /// When a service has no usable node or is missing: `keep` the last good set, or `503`.
    #[arg(long, value_enum, default_value_t = EmptyPolicy::Keep)]
    pub empty_policy: EmptyPolicy,
    /// Write the backends file once after the initial list (reload if a master socket is given), then exit.
    #[arg(long)]
    pub once: bool,
}

/// One server slot of a backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// `s1`, `s2`, ...
    pub name: String,
    /// Address (placeholder `127.0.0.1` for never-used slots).
    pub host: String,
    /// Port (placeholder `1`).
    pub port: u16,
    /// HAProxy weight 0..=256.
    pub weight: u16,
    /// `true` = ready, `false` = maintenance.
    pub enabled: bool,
}

impl Slot {
    fn placeholder(i: usize) -> Slot {
        Slot {
            name: format!("s{}", i + 1),
            host: "127.0.0.1".into(),
            port: 1,
            weight: 1,
            enabled: false,
        }
    }
}

/// A node as HAProxy gets it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Want {
    /// IP address.
    pub host: String,
    /// Port.
    pub port: u16,
    /// Weight 1..=256.
    pub weight: u16,
}

/// Nodes -> HAProxy servers: ports as `u16`, weights scaled into 1..=256.
/// Expects usable nodes ([`crate::policy::usable_nodes`]); others are skipped.
pub fn wants(nodes: &[Node]) -> Vec<Want> {
    let max = nodes.iter().map(|n| n.weight).max().unwrap_or(1).max(1);
    nodes
        .iter()
        .filter_map(|n| {
            let port = u16::try_from(n.port).ok().filter(|p| *p > 0)?;
            let w = if max <= 256 {
                n.weight
            } else {
                ((u64::from(n.weight) * 256) / u64::from(max)) as u32
            };
            let weight = u16::try_from(w.clamp(1, 256)).unwrap_or(256);
            Some(Want {
                host: n.host.to_string(),
                port,
                weight,
            })
        })
        .collect()
}

/// The slot count for `n` nodes: `max(min, next power of two >= n)`.
pub fn slot_count(n: usize, min: usize) -> usize {
    n.max(1).next_power_of_two().max(min)
}

/// What to do for one backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendPlan {
    /// Runtime API commands, in order (empty when nothing changes or when growing).
    pub commands: Vec<String>,
    /// The slots once the plan is applied.
    pub slots: Vec<Slot>,
    /// The slots must grow: write `slots` and reload instead of sending commands.
    pub grow: bool,
}

fn same_addr(s: &Slot, w: &Want) -> bool {
    s.host == w.host && s.port == w.port
}

/// Plans the change of `backend` from `current` slots to the `want` set.
pub fn plan(backend: &str, current: &[Slot], want: &[Want], min_slots: usize) -> BackendPlan {
    let mut slots = current.to_vec();
    let mut placed = vec![false; want.len()];
    let mut kept = vec![false; slots.len()];
    let mut commands = Vec::new();
    // 1. enabled slots that already serve a wanted node stay as they are.
    for (si, s) in slots.iter_mut().enumerate() {
        if !s.enabled {
            continue;
        }
        if let Some(wi) = (0..want.len()).find(|&i| !placed[i] && same_addr(s, &want[i])) {
            placed[wi] = true;
            kept[si] = true;
            if s.weight != want[wi].weight {
                commands.push(format!(
                    "set server {backend}/{} weight {}",
                    s.name, want[wi].weight
                ));
                s.weight = want[wi].weight;
            }
        }
    }
    // 2. free slots: disabled ones first, then those of removed nodes.
    let mut free: Vec<usize> = (0..slots.len())
        .filter(|&i| !kept[i] && !slots[i].enabled)
        .collect();
    free.extend((0..slots.len()).filter(|&i| !kept[i] && slots[i].enabled));
    let missing: Vec<usize> = (0..want.len()).filter(|&i| !placed[i]).collect();
    if missing.len() > free.len() {
        return BackendPlan {
            commands: Vec::new(),
            slots: layout(current, want, min_slots),
            grow: true,
        };
    }
    for wi in missing {
        let w = &want[wi];
        // Prefer a free slot that already has this address (re-enable only).
        let pos = free
            .iter()
            .position(|&i| same_addr(&slots[i], w))
            .unwrap_or(0);
        let si = free.remove(pos);
        let s = &mut slots[si];
        if !same_addr(s, w) {
            commands.push(format!(
                "set server {backend}/{} addr {} port {}",
                s.name, w.host, w.port
            ));
            s.host = w.host.clone();
            s.port = w.port;
        }
        if s.weight != w.weight {
            commands.push(format!(
                "set server {backend}/{} weight {}",
                s.name, w.weight
            ));
            s.weight = w.weight;
        }
        if !s.enabled {
            commands.push(format!("set server {backend}/{} state ready", s.name));
            s.enabled = true;
        }
    }
    // 3. after the new ones are ready: removed nodes to maintenance.
    for si in free {
        if slots[si].enabled {
            commands.push(format!(
                "set server {backend}/{} state maint",
                slots[si].name
            ));
            slots[si].enabled = false;
        }
    }
    BackendPlan {
        commands,
        slots,
        grow: false,
    }
}

/// A fresh layout with enough slots for `want`: nodes already enabled keep
/// their slot, the others fill the remaining slots in order.
pub fn layout(current: &[Slot], want: &[Want], min_slots: usize) -> Vec<Slot> {
    let n = slot_count(want.len(), min_slots).max(current.len());
    let mut slots: Vec<Slot> = (0..n)
        .map(|i| {
            current
                .get(i)
                .cloned()
                .unwrap_or_else(|| Slot::placeholder(i))
        })
        .collect();
    for (i, s) in slots.iter_mut().enumerate() {
        s.name = format!("s{}", i + 1);
    }
    let mut placed = vec![false; want.len()];
    let mut taken = vec![false; n];
    for (si, s) in slots.iter_mut().enumerate() {
        match (0..want.len()).find(|&i| !placed[i] && s.enabled && same_addr(s, &want[i])) {
            Some(wi) => {
                placed[wi] = true;
                taken[si] = true;
                s.weight = want[wi].weight;
            }
            None => s.enabled = false,
        }
    }
    let mut free = (0..n).filter(|&i| !taken[i]);
    for (wi, w) in want.iter().enumerate() {
        if placed[wi] {
            continue;
        }
        if let Some(si) = free.next() {
            slots[si] = Slot {
                name: format!("s{}", si + 1),
                host: w.host.clone(),
                port: w.port,
                weight: w.weight,
                enabled: true,
            };
        }
    }
    slots
}

/// Renders the backends file.
pub fn render(backends: &[(String, String, Vec<Slot>)]) -> String {
    let mut out = String::from(
        "# Generated by kube-discovery sync haproxy from DiscoveredServices; rewritten on change, do not edit.\n",
    );
    for (name, service, slots) in backends {
        let _ = write!(
            out,
            "\n# {service}\nbackend {name}\n    balance roundrobin\n    retries 3\n    option redispatch 1\n"
        );
        for s in slots {
            let host = if s.host.contains(':') {
                format!("[{}]", s.host)
            } else {
                s.host.clone()
            };
            let _ = writeln!(
                out,
                "    server {} {host}:{} weight {}{}",
                s.name,
                s.port,
                s.weight,
                if s.enabled { "" } else { " disabled" }
            );
        }
    }
    out
}

// Admin-state bits of `show servers state` that mean "not taking traffic":
// FMAINT 0x01, IMAINT 0x02, FDRAIN 0x08, IDRAIN 0x10, RMAINT 0x20, HMAINT 0x40.
// CMAINT (0x04, from `disabled` in the file) stays set after `state ready`.
const NOT_READY: u32 = 0x01 | 0x02 | 0x08 | 0x10 | 0x20 | 0x40;

/// Parses `show servers state <backend>` into slots (servers not named
/// `s<N>` are ignored; slots ordered by number).
pub fn parse_servers_state(text: &str, backend: &str) -> Result<Vec<Slot>> {
    let mut header: Option<Vec<&str>> = None;
    let mut slots: Vec<(u32, Slot)> = Vec::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(h) = line.strip_prefix("# ") {
            header = Some(h.split_whitespace().collect());
            continue;
        }
        let Some(h) = &header else { continue };
        let f: Vec<&str> = line.split_whitespace().collect();
        let get = |k: &str| {
            h.iter()
                .position(|x| *x == k)
                .and_then(|i| f.get(i).copied())
        };
        if get("be_name") != Some(backend) {
            continue;
        }
        let field = |k: &'static str| {
            get(k).ok_or_else(|| Error::MissingField {
                backend: backend.to_string(),
                field: k,
                line: line.to_string(),
            })
        };

        let name = field("srv_name")?;
        let Some(num) = name.strip_prefix('s').and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let admin: u32 = column(field("srv_admin_state")?, "srv_admin_state", line)?;
        let slot = Slot {
            name: name.to_string(),
            host: field("srv_addr")?.to_string(),
            port: column(field("srv_port")?, "srv_port", line)?,
            weight: column(field("srv_uweight")?, "srv_uweight", line)?,
            enabled: admin & NOT_READY == 0,
        };
        slots.push((num, slot));
    }
    if header.is_none() {
        return Err(Error::NoServersState {
            backend: backend.to_string(),
            answer: text.trim().to_string(),
        });
    }
    slots.sort_by_key(|(n, _)| *n);
    Ok(slots.into_iter().map(|(_, s)| s).collect())
}

/// A numeric column `field` of a `show servers state` line.
fn column<T>(value: &str, field: &'static str, line: &str) -> Result<T>
where
    T: std::str::FromStr<Err = std::num::ParseIntError>,
{
    value.parse().map_err(|source| Error::BadField {
        field,
        line: line.to_string(),
        source,
    })
}

/// Whether a Runtime API answer to `cmd` means success.
pub fn command_ok(cmd: &str, answer: &str) -> bool {
    let a = answer.trim();
    a.is_empty()
        || (cmd.contains(" addr ")
            && (a.contains("changed from") || a.starts_with("no need to change")))
}

/// Sends one command over a HAProxy CLI socket and returns the answer.
pub async fn cli(socket: &Path, cmd: &str) -> Result<String> {
    let fut = async {
        let mut s = tokio::net::UnixStream::connect(socket)
            .await
            .map_err(|source| Error::Connect {
                socket: socket.to_path_buf(),
                source,
            })?;
        let talk = |source| Error::Socket {
            socket: socket.to_path_buf(),
            source,
        };
        s.write_all(format!("{cmd}\n").as_bytes())
            .await
            .map_err(talk)?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.map_err(talk)?;
        Ok(out)
    };
    tokio::time::timeout(Duration::from_secs(5), fut)
        .await
        .map_err(|_| Error::NoAnswer {
            socket: socket.to_path_buf(),
            command: cmd.to_string(),
        })?
}

async fn check_config(args: &HaproxyArgs, candidate: &Path) -> Result<()> {
    let mut c = tokio::process::Command::new(&args.haproxy_bin);
    c.arg("-c").arg("-q");
    for f in &args.haproxy_conf {
        c.arg("-f").arg(f);
    }
    c.arg("-f").arg(candidate).kill_on_drop(true);
    let out = c.output().await.map_err(|source| Error::Spawn {
        program: args.haproxy_bin.display().to_string(),
        source,
    })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::HaproxyRejected {
            status: out.status,
            output: format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout).trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        })
    }
}

/// Checks `text` with `haproxy -c` as a candidate file, then moves it over
/// `--output`. Returns `false` when the file already had this content.
pub async fn write_checked(args: &HaproxyArgs, text: &str) -> Result<bool> {
    if tokio::fs::read_to_string(&args.output)
        .await
        .ok()
        .as_deref()
        == Some(text)
    {
        return Ok(false);
    }
    let mut cand = args.output.as_os_str().to_owned();
    cand.push(".candidate");
    let cand = PathBuf::from(cand);
    tokio::fs::write(&cand, text)
        .await
        .map_err(|source| Error::File {
            action: "write",
            path: cand.clone(),
            source,
        })?;
    let checked = check_config(args, &cand).await;
    let _ = tokio::fs::remove_file(&cand).await;
    checked?;
    write_atomic(&args.output, text).await?;
    Ok(true)
}

struct Backend {
    svc: ServiceRef,
    want: Vec<Want>,
}

async fn live_slots(args: &HaproxyArgs, backend: &str) -> Result<Vec<Slot>> {
    let text = cli(&args.socket, &format!("show servers state {backend}")).await?;
    parse_servers_state(&text, backend)
}

/// Reloads through the master CLI and waits until the worker shows `expect` slots per backend.
async fn reload(args: &HaproxyArgs, expect: &[(String, usize)]) -> Result<()> {
    let Some(master) = &args.master_socket else {
        return Err(Error::NoMasterSocket);
    };
    // The master re-executes itself on `reload` and may close the connection without an answer.
    let _ = cli(master, "reload")
        .await
        .map_err(|e| Error::MasterReload(Box::new(e)))?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut done = true;
        for (b, n) in expect {
            match live_slots(args, b).await {
                Ok(s) if s.len() == *n => {}
                _ => done = false,
            }
        }
        if done {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(Error::ReloadTimeout);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One apply cycle: runtime commands where possible, a reload when slots must grow.
async fn sync_once(args: &HaproxyArgs, backends: &[Backend], first: bool) -> Result<&'static str> {
    let min = usize::from(args.min_slots);
    let mut live = Vec::with_capacity(backends.len());
    let mut missing = false;
    for b in backends {
        match live_slots(args, &b.svc.upstream).await {
            Ok(s) => live.push(s),
            Err(e) => {
                if !first {
                    tracing::warn!(backend = %b.svc.upstream, error = format!("{e:#}"), "cannot read live slots; rewriting the file");
                }
                missing = true;
                live.push(Vec::new());
            }
        }
    }
    let plans: Vec<BackendPlan> = backends
        .iter()
        .zip(&live)
        .map(|(b, cur)| plan(&b.svc.upstream, cur, &b.want, min))
        .collect();
    if missing || plans.iter().any(|p| p.grow) {
        let layouts: Vec<(String, String, Vec<Slot>)> = backends
            .iter()
            .zip(&live)
            .map(|(b, cur)| {
                (
                    b.svc.upstream.clone(),
                    b.svc.service.clone(),
                    layout(cur, &b.want, min),
                )
            })
            .collect();
        write_checked(args, &render(&layouts)).await?;
        if first && args.master_socket.is_none() {
            return Ok("written");
        }
        let expect: Vec<(String, usize)> = layouts
            .iter()
            .map(|(n, _, s)| (n.clone(), s.len()))
            .collect();
        reload(args, &expect).await?;
        // Addresses and states are in the file; nothing else to send.
        return Ok("reloaded");
    }
    let mut sent = 0;
    for p in &plans {
        for c in &p.commands {
            let answer = cli(&args.socket, c).await?;
            if !command_ok(c, &answer) {
                return Err(Error::Refused {
                    command: c.clone(),
                    answer: answer.trim().to_string(),
                });
            }
            sent += 1;
        }
    }
    let layouts: Vec<(String, String, Vec<Slot>)> = backends
        .iter()
        .zip(plans)
        .map(|(b, p)| (b.svc.upstream.clone(), b.svc.service.clone(), p.slots))
        .collect();
    write_checked(args, &render(&layouts)).await?;
    Ok(if sent == 0 { "unchanged" } else { "runtime" })
}

/// Runs `sync haproxy` until the watch stops (or once with `--once`).
pub async fn run_haproxy(args: HaproxyArgs) -> Result<()> {
    check_unique(&args.services)?;
    let mut watch = args.kube.resolver().await?;
    let mut decider = Decider::default();
    tracing::info!(services = args.services.len(), output = %args.output.display(), policy = %args.empty_policy, "sync haproxy started");
    let mut first = true;
    'changes: loop {
        watch
            .changed_within(args.once.then_some(std::time::Duration::from_secs(30)))
            .await?;
        let mut backends = Vec::with_capacity(args.services.len());
        for svc in &args.services {
            let nodes = match watch.nodes(&svc.service) {
                // A big service's shards mid-rewrite and no earlier answer:
                // nothing is written this round; shard 0's write signals
                // the next change.
                Err(e @ crate::Error::Incomplete { .. }) => {
                    tracing::info!(error = %e, "waiting for the next change");
                    continue 'changes;
                }
                other => other?,
            };
            let want = match decider.target(svc, nodes, HostRule::IpOnly, args.empty_policy) {
                Target::Nodes(n) => wants(&n),
                Target::Unavailable => Vec::new(),
            };
            backends.push(Backend {
                svc: svc.clone(),
                want,
            });
        }
        let summary: Vec<String> = backends
            .iter()
            .map(|b| format!("{}={}", b.svc.upstream, b.want.len()))
            .collect();
        let result = sync_once(&args, &backends, first).await;
        match &result {
            Ok("unchanged") => tracing::debug!("backends unchanged"),
            Ok(how) => tracing::info!(
                applied = how,
                backends = summary.join(","),
                "backends applied"
            ),
            Err(e) => tracing::error!(error = format!("{e:#}"), "backends not applied"),
        }
        first = false;
        if args.once {
            return result.map(|_| ());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn want(h: &str, p: u16, w: u16) -> Want {
        Want {
            host: h.into(),
            port: p,
            weight: w,
        }
    }

    fn slot(i: usize, h: &str, p: u16, w: u16, enabled: bool) -> Slot {
        Slot {
            name: format!("s{i}"),
            host: h.into(),
            port: p,
            weight: w,
            enabled,
        }
    }

    #[test]
    fn weights_are_scaled_into_haproxy_range() {
        let w = wants(&[
            Node::new("10.0.0.1", 80, 50),
            Node::new("10.0.0.2", 80, 150),
        ]);
        assert_eq!(w.iter().map(|w| w.weight).collect::<Vec<_>>(), [50, 150]);
        let w = wants(&[
            Node::new("10.0.0.1", 80, 1000),
            Node::new("10.0.0.2", 80, 4000),
            Node::new("10.0.0.3", 80, 1),
        ]);
        assert_eq!(w.iter().map(|w| w.weight).collect::<Vec<_>>(), [64, 256, 1]);
    }

    #[test]
    fn slot_counts_grow_in_powers_of_two() {
        assert_eq!(slot_count(0, 4), 4);
        assert_eq!(slot_count(3, 4), 4);
        assert_eq!(slot_count(5, 4), 8);
        assert_eq!(slot_count(9, 1), 16);
    }

    #[test]
    fn scale_up_uses_free_slots_and_keeps_existing_ones() {
        let cur = vec![
            slot(1, "10.0.0.1", 80, 50, true),
            slot(2, "127.0.0.1", 1, 1, false),
            slot(3, "127.0.0.1", 1, 1, false),
        ];
        let p = plan(
            "be",
            &cur,
            &[
                want("10.0.0.1", 80, 50),
                want("10.0.0.2", 80, 50),
                want("10.0.0.3", 80, 50),
            ],
            4,
        );
        assert!(!p.grow);
        assert_eq!(
            p.commands,
            [
                "set server be/s2 addr 10.0.0.2 port 80",
                "set server be/s2 weight 50",
                "set server be/s2 state ready",
                "set server be/s3 addr 10.0.0.3 port 80",
                "set server be/s3 weight 50",
                "set server be/s3 state ready",
            ]
        );
        assert!(p.slots.iter().all(|s| s.enabled));
        // Applying the same want again is a no-op.
        assert!(
            plan(
                "be",
                &p.slots,
                &[
                    want("10.0.0.3", 80, 50),
                    want("10.0.0.2", 80, 50),
                    want("10.0.0.1", 80, 50)
                ],
                4
            )
            .commands
            .is_empty()
        );
    }

    #[test]
    fn scale_down_puts_removed_nodes_in_maintenance() {
        let cur = vec![
            slot(1, "10.0.0.1", 80, 50, true),
            slot(2, "10.0.0.2", 80, 50, true),
            slot(3, "10.0.0.3", 80, 50, true),
        ];
        let p = plan("be", &cur, &[want("10.0.0.2", 80, 50)], 4);
        assert_eq!(
            p.commands,
            [
                "set server be/s1 state maint",
                "set server be/s3 state maint"
            ]
        );
        assert_eq!(p.slots.iter().filter(|s| s.enabled).count(), 1);
    }

    #[test]
    fn replacement_readies_new_before_retiring_old() {
        let cur = vec![
            slot(1, "10.0.0.1", 80, 50, true),
            slot(2, "10.0.0.1", 81, 9, false),
        ];
        let p = plan("be", &cur, &[want("10.0.0.9", 80, 50)], 2);
        // The disabled slot is reused (it is free) and readied before s1 goes to maintenance.
        assert_eq!(
            p.commands,
            [
                "set server be/s2 addr 10.0.0.9 port 80",
                "set server be/s2 weight 50",
                "set server be/s2 state ready",
                "set server be/s1 state maint",
            ]
        );
    }

    #[test]
    fn a_disabled_slot_with_the_same_address_is_just_re_enabled() {
        let cur = vec![
            slot(1, "127.0.0.1", 1, 1, false),
            slot(2, "10.0.0.2", 80, 50, false),
        ];
        let p = plan("be", &cur, &[want("10.0.0.2", 80, 50)], 2);
        assert_eq!(p.commands, ["set server be/s2 state ready"]);
    }

    #[test]
    fn weight_change_only() {
        let cur = vec![slot(1, "10.0.0.1", 80, 50, true)];
        let p = plan("be", &cur, &[want("10.0.0.1", 80, 20)], 1);
        assert_eq!(p.commands, ["set server be/s1 weight 20"]);
    }

    #[test]
    fn empty_want_disables_everything_and_more_nodes_than_slots_grow() {
        let cur = vec![
            slot(1, "10.0.0.1", 80, 50, true),
            slot(2, "10.0.0.2", 80, 50, true),
        ];
        assert_eq!(
            plan("be", &cur, &[], 2).commands,
            [
                "set server be/s1 state maint",
                "set server be/s2 state maint"
            ]
        );
        let many: Vec<Want> = (1..=5)
            .map(|i| want(&format!("10.0.1.{i}"), 80, 50))
            .collect();
        let p = plan("be", &cur, &many, 2);
        assert!(p.grow && p.commands.is_empty());
        assert_eq!(p.slots.len(), 8);
        assert_eq!(p.slots.iter().filter(|s| s.enabled).count(), 5);
        let names: Vec<_> = p.slots.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8"]);
    }

    #[test]
    fn layout_keeps_enabled_nodes_in_place() {
        let cur = vec![
            slot(1, "10.0.0.1", 80, 50, true),
            slot(2, "10.0.0.2", 80, 50, true),
        ];
        let l = layout(
            &cur,
            &[want("10.0.0.3", 80, 50), want("10.0.0.2", 80, 50)],
            4,
        );
        assert_eq!(l.len(), 4);
        assert_eq!((l[1].host.as_str(), l[1].enabled), ("10.0.0.2", true));
        assert_eq!((l[0].host.as_str(), l[0].enabled), ("10.0.0.3", true));
        assert!(!l[2].enabled && !l[3].enabled);
    }

    #[test]
    fn renders_backends() {
        let text = render(&[(
            "web".into(),
            "default/web:http".into(),
            vec![
                slot(1, "10.0.0.1", 80, 50, true),
                slot(2, "fd00::1", 1, 1, false),
            ],
        )]);
        assert!(
            text.contains(
                "backend web\n    balance roundrobin\n    retries 3\n    option redispatch 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "    server s1 10.0.0.1:80 weight 50\n    server s2 [fd00::1]:1 weight 1 disabled\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn parses_show_servers_state() {
        // Captured from HAProxy 2.6: s1 ready, s2 `disabled` in the file then
        // `state ready` (admin 4 = CMAINT only), s3 `state maint` (1), s4 `disabled` (5).
        let text = "1\n# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight srv_time_since_last_change srv_check_status srv_check_result srv_check_health srv_check_state srv_agent_state bk_f_forced_id srv_f_forced_id srv_fqdn srv_port srvrecord srv_use_ssl srv_check_port srv_check_addr srv_agent_addr srv_agent_port\n\
3 kd_web 1 s1 127.0.0.2 2 0 50 50 0 1 0 2 0 0 0 0 - 8080 - 0 0 - - 0\n\
3 kd_web 2 s2 127.0.0.3 2 4 1 1 0 1 0 0 8 0 0 0 - 8081 - 0 0 - - 0\n\
3 kd_web 3 s3 127.0.0.4 0 1 50 50 0 1 0 0 0 0 0 0 - 8080 - 0 0 - - 0\n\
3 kd_web 4 s10 127.0.0.1 0 5 1 1 0 1 0 0 8 0 0 0 - 1 - 0 0 - - 0\n\
4 other 1 s1 127.0.0.9 2 0 1 1 0 1 0 0 8 0 0 0 - 1 - 0 0 - - 0\n";
        let s = parse_servers_state(text, "kd_web").expect("parse");
        assert_eq!(s.len(), 4);
        assert_eq!(s[0], slot(1, "127.0.0.2", 8080, 50, true));
        assert_eq!(s[1], slot(2, "127.0.0.3", 8081, 1, true));
        assert!(!s[2].enabled);
        assert_eq!((s[3].name.as_str(), s[3].enabled), ("s10", false));
        assert!(
            parse_servers_state("Can't find backend.\n", "kd_web")
                .expect_err("must fail")
                .to_string()
                .contains("Can't find backend")
        );
    }

    #[test]
    fn runtime_answers() {
        assert!(command_ok("set server b/s1 state ready", "\n"));
        assert!(!command_ok(
            "set server b/s9 state ready",
            "No such server.\n"
        ));
        assert!(command_ok(
            "set server b/s1 addr 1.2.3.4 port 80",
            "IP changed from '127.0.0.1' to '1.2.3.4', port changed from '1' to '80' by 'stats socket command'\n"
        ));
        assert!(!command_ok(
            "set server b/s1 weight 300",
            "Absolute weight can only be between 0 and 256 inclusive.\n"
        ));
    }
}
