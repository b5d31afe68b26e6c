//! Configuration: APISIX's `discovery.kubernetes` block, unchanged, plus our own
//! `kube_discovery:` block. Pure: environment variables come from a lookup
//! closure, files are never read.
//!
//! Three stages, each a type that the next one is built from:
//!
//! ```text
//!  YAML text
//!    │ raw.rs        serde, APISIX's keys as written; errors name the field
//!    ▼
//!  Raw* (every key optional)
//!    │ validate.rs   defaults, ${VAR} expansion, the rules of rules.rs (garde)
//!    ▼                                          ── parse_config ──▶ Config
//!  Config (validated.rs: typed, the file's meaning; `render --config` reads it)
//!    │ plan.rs       + Overrides (--http-addr, --kubeconfig), the rules only `run` needs
//!    ▼                                          ── Config::resolve ──▶ Plan
//!  Plan (enums only: single | multi cluster, a token XOR a token file, a
//!        ConfigMap sink only with its namespace and name, a lease only if enabled)
//! ```
//!
//! [`parse_config`] and [`Config::resolve`] return [`ConfigErrors`] on
//! failure: every problem, one line each, each naming the field path
//! (`discovery.kubernetes[1].id: ...`). Token values never appear in errors,
//! in `Debug` output or in [`Config::redacted_json`].
//!
//! An APISIX `config.yaml` works as it is: other top-level keys (`apisix`,
//! `deployment`, `plugins`, ...) and other discovery kinds (`dns`, `consul`,
//! ...) are ignored. Unknown keys INSIDE `discovery.kubernetes` and
//! `kube_discovery` are errors (a misspelt `watch_endpoint_slices` silently
//! doing nothing is exactly APISIX issue 11631).
//!
//! Every key, its rule and its default are listed once, in README.md's
//! "Configuration" section (the user's reference);
//! `controller/core/tests/config_reference.rs` fails when a key this module
//! accepts is missing there, or one listed there is not accepted.

mod duration;
mod error;
mod plan;
mod raw;
mod rules;
mod secret;
mod validate;
mod validated;

#[cfg(test)]
mod tests;

pub use duration::parse_duration;
pub use error::{ConfigError, ConfigErrors};
pub use plan::{
    ClusterPlan, Clusters, LeasePlan, LeaseTimings, MAX_CONFIGMAP_NAME_LEN, Overrides, Plan, Writes,
};
pub use rules::MAX_CLUSTER_ID_LENGTH;
pub use secret::Secret;
pub use validate::parse_config;
pub use validated::{
    ClusterConfig, Config, ConfigMapSink, Connection, Credentials, DEFAULT_CA_FILE,
    DEFAULT_CONFIGMAP_NAME, DEFAULT_TOKEN_FILE, DEFAULT_WEIGHT, DiscoveredServicesSink,
    HomeCluster, HttpSettings, LeaderElection, Schema, Settings, Sinks, XdsSettings, XdsTls,
};

pub use crate::source::filter::{AnchoredRegex, LabelSelector, NamespaceFilter};
