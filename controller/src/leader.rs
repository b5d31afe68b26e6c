//! Leader election on a `coordination.k8s.io/v1` Lease, so several replicas
//! can run and exactly one writes (`kube_discovery.leader_election`).
//!
//! ```text
//!  every lease_duration/3:  GET lease ─▶ decide(spec, me, now)
//!      Create    (absent)                         ─▶ POST   holder=me
//!      Renew     (holder == me)                   ─▶ PUT    renewTime=now  (resourceVersion-guarded)
//!      TakeOver  (holder empty or renewTime+duration < now) ─▶ PUT holder=me, transitions+1
//!      Follow    (someone else holds a fresh lease)
//!  leader = last successful Create/Renew/TakeOver is younger than lease_duration
//!  shutdown: a leader releases the lease (holder="") so a standby takes over at once
//! ```
//!
//! All replicas watch and index (standbys are warm and serve the HTTP API);
//! only the leader's writer writes (see [`crate::writer::spawn_gated`]).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// What to do with the lease as seen now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// No lease yet: create it.
    Create,
    /// We hold it: renew.
    Renew,
    /// Free or expired: take it over.
    TakeOver,
    /// Someone else holds a fresh lease.
    Follow(String),
}

/// Pure decision from the lease spec (`None`: no lease object).
pub fn decide(
    spec: Option<&LeaseSpec>,
    me: &str,
    now: jiff::Timestamp,
    default_duration: Duration,
) -> Decision {
    let Some(spec) = spec else {
        return Decision::Create;
    };
    let holder = spec.holder_identity.clone().unwrap_or_default();
    if holder == me {
        return Decision::Renew;
    }
    if holder.is_empty() {
        return Decision::TakeOver;
    }
    let secs = spec
        .lease_duration_seconds
        .map(|s| i64::from(s.max(1)))
        .unwrap_or_else(|| i64::try_from(default_duration.as_secs()).unwrap_or(15));
    match &spec.renew_time {
        Some(MicroTime(t)) if t.as_second() + secs >= now.as_second() => Decision::Follow(holder),
        _ => Decision::TakeOver,
    }
}

/// Lease settings.
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// Lease namespace.
    pub namespace: String,
    /// Lease name.
    pub name: String,
    /// This replica's identity (pod name or hostname + pid).
    pub identity: String,
    /// Lease duration.
    pub duration: Duration,
}

/// This replica's identity: `POD_NAME`, else `HOSTNAME`, plus the pid.
pub fn default_identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "kube-discovery".to_string());
    format!("{host}-{}", std::process::id())
}

/// The namespace the process runs in (ServiceAccount namespace file or `POD_NAMESPACE`).
pub fn own_namespace() -> Option<String> {
    std::env::var("POD_NAMESPACE")
        .ok()
        .filter(|s| !s.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
                .ok()
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
        })
}

fn spec_for(
    me: &str,
    now: jiff::Timestamp,
    duration: Duration,
    transitions: i32,
    acquire: Option<MicroTime>,
) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(me.to_string()),
        lease_duration_seconds: Some(i32::try_from(duration.as_secs().max(1)).unwrap_or(i32::MAX)),
        acquire_time: Some(acquire.unwrap_or(MicroTime(now))),
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(transitions),
        ..LeaseSpec::default()
    }
}

/// One round: returns whether we hold the lease afterwards.
async fn round(api: &Api<Lease>, cfg: &LeaseConfig) -> kube::Result<bool> {
    let now = jiff::Timestamp::now();
    let current = api.get_opt(&cfg.name).await?;
    match decide(
        current.as_ref().and_then(|l| l.spec.as_ref()),
        &cfg.identity,
        now,
        cfg.duration,
    ) {
        Decision::Create => {
            let lease = Lease {
                metadata: kube::api::ObjectMeta {
                    name: Some(cfg.name.clone()),
                    ..Default::default()
                },
                spec: Some(spec_for(&cfg.identity, now, cfg.duration, 0, None)),
            };
            match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
        Decision::Follow(_) => Ok(false),
        d @ (Decision::Renew | Decision::TakeOver) => {
            let Some(mut lease) = current else {
                return Ok(false);
            };
            let old = lease.spec.clone().unwrap_or_default();
            let transitions =
                old.lease_transitions.unwrap_or(0) + i32::from(d == Decision::TakeOver);
            let acquire = if d == Decision::Renew {
                old.acquire_time
            } else {
                None
            };
            lease.spec = Some(spec_for(
                &cfg.identity,
                now,
                cfg.duration,
                transitions,
                acquire,
            ));
            // replace() sends metadata.resourceVersion: a concurrent change is a 409.
            match api.replace(&cfg.name, &PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
    }
}

async fn release(api: &Api<Lease>, cfg: &LeaseConfig) {
    if let Ok(Some(mut lease)) = api.get_opt(&cfg.name).await
        && lease
            .spec
            .as_ref()
            .and_then(|s| s.holder_identity.as_deref())
            == Some(cfg.identity.as_str())
    {
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = Some(String::new());
        }
        if let Err(e) = api.replace(&cfg.name, &PostParams::default(), &lease).await {
            tracing::warn!(error = %e, "cannot release the leader lease");
        } else {
            tracing::info!(lease = %cfg.name, "released the leader lease");
        }
    }
}

/// Runs the election until `shutdown`; the receiver says whether we lead.
/// The returned task resolves after the lease is released.
pub fn spawn(
    client: Client,
    cfg: LeaseConfig,
    shutdown: CancellationToken,
) -> (watch::Receiver<bool>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(false);
    let api: Api<Lease> = Api::namespaced(client, &cfg.namespace);
    let task = tokio::spawn(async move {
        let mut last_ok: Option<tokio::time::Instant> = None;
        loop {
            let leading = match round(&api, &cfg).await {
                Ok(true) => {
                    last_ok = Some(tokio::time::Instant::now());
                    true
                }
                Ok(false) => {
                    last_ok = None;
                    false
                }
                Err(e) => {
                    tracing::warn!(error = %e, "leader election round failed");
                    // Keep leading only while our last renewal is still valid.
                    last_ok.is_some_and(|t| t.elapsed() < cfg.duration)
                }
            };
            if *tx.borrow() != leading {
                tracing::info!(identity = %cfg.identity, leading, "leadership changed");
                let _ = tx.send(leading);
            }
            let wait = if leading {
                cfg.duration / 3
            } else {
                cfg.duration / 4
            };
            tokio::select! {
                () = tokio::time::sleep(wait.max(Duration::from_millis(200))) => {}
                () = shutdown.cancelled() => break,
            }
        }
        let _ = tx.send(false);
        release(&api, &cfg).await;
    });
    (rx, task)
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn decisions() {
        let now = jiff::Timestamp::now();
        let d = Duration::from_secs(15);
        assert_eq!(decide(None, "me", now, d), Decision::Create);
        assert_eq!(
            decide(Some(&spec("me", 100, 15)), "me", now, d),
            Decision::Renew
        );
        assert_eq!(
            decide(Some(&spec("other", 1, 15)), "me", now, d),
            Decision::Follow("other".into())
        );
        assert_eq!(
            decide(Some(&spec("other", 30, 15)), "me", now, d),
            Decision::TakeOver
        );
        assert_eq!(
            decide(Some(&spec("", 0, 15)), "me", now, d),
            Decision::TakeOver
        );
        let mut no_renew = spec("other", 0, 15);
        no_renew.renew_time = None;
        assert_eq!(decide(Some(&no_renew), "me", now, d), Decision::TakeOver);
    }
}
