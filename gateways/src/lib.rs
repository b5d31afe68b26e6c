//! Gateways that follow DiscoveredServices without anyone touching their config.
//!
//! kube-discovery writes one `DiscoveredService` per Kubernetes Service; this
//! crate keeps real gateways in step with them:
//!
//! ```text
//!  DiscoveredServices ──reflector (label selector)──▶ watch.rs  Snapshot ──changed──┐
//!                                                                                  ▼
//!   policy.rs  per service: nodes -> usable nodes (invalid ones dropped, empty/missing per EmptyPolicy)
//!        │                                             │
//!        ▼                                             ▼
//!   nginx.rs   render upstream blocks (pure)     haproxy.rs  desired slots -> Runtime API commands (pure)
//!              if changed: candidate, `nginx -t`,            `set server b/s addr|weight|state` over the
//!              rename over the live file, reload             stats socket; reload only to grow the slots
//! ```
//!
//! Everything that decides *what* to write or send is a pure function with
//! unit tests ([`nginx::render`], [`haproxy::plan`], [`haproxy::render`],
//! [`policy::usable_nodes`]); the `run_*` functions only do I/O around them.
//! The end-to-end proof (kube-sim, the controller, real nginx/HAProxy
//! processes and real backends) lives in `e2e/tests/gateway_*.rs`.
//!
//! Entry points for the CLI: [`nginx::run_nginx`] with [`nginx::NginxArgs`],
//! [`haproxy::run_haproxy`] with [`haproxy::HaproxyArgs`]; both are also
//! reachable through the `kube-discovery-sync` binary of this crate.

pub mod haproxy;
pub mod nginx;
pub mod policy;
pub mod watch;

pub use haproxy::{HaproxyArgs, run_haproxy};
pub use nginx::{NginxArgs, run_nginx};
pub use policy::{EmptyPolicy, ServiceRef};
pub use watch::{KubeArgs, Snapshot};
