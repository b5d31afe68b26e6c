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
//! # `discovery.kubernetes`
//!
//! One object = single cluster; a list of objects, each with an `id` = multi
//! cluster. `kubernetes: {}` (or an empty value) means "in-cluster defaults".
//!
//! | key | rule | default (single cluster) | default (multi cluster) |
//! |---|---|---|---|
//! | `id` | `^[a-z0-9]{1,64}$` (APISIX's rule), unique; multi cluster only | - | required |
//! | `service.schema` | `http` or `https` | `https` | `https` |
//! | `service.host` | IPv4, IPv6, DNS name; `${VAR}` allowed | `${KUBERNETES_SERVICE_HOST}` | required |
//! | `service.port` | 1..65535 (number or string); `${VAR}` allowed | `${KUBERNETES_SERVICE_PORT}` | required |
//! | `service.ssl_verify` | bool (APISIX: false; **we default to true**) | `true` | `true` |
//! | `service.ca_file` | PEM file of the API server CA; `${VAR}` allowed | `/var/run/secrets/kubernetes.io/serviceaccount/ca.crt` when `service.host` is defaulted (in-cluster), else none (system roots) | none |
//! | `client.token` | `${VAR}` or up to 4096 of `[A-Za-z0-9+/._=-]` after stripping whitespace | - | - |
//! | `client.token_file` | path of 1..500 characters; `${VAR}` allowed; re-read by the runtime when it changes | `/var/run/secrets/kubernetes.io/serviceaccount/token` if no `token` | - |
//! | `kubeconfig` | path of a kubeconfig file (alternative to `service`/`client`; contexts, client certificates, exec plugins) | - | - |
//! | `context` | kubeconfig context (alternative to `service`/`client`; alone = default kubeconfig) | current-context | current-context |
//! | `namespace_selector` | exactly one of `equal` (namespace), `not_equal` (namespace), `match` (list of regex), `not_match` (list of regex); regexes must match the WHOLE namespace name | all namespaces | all namespaces |
//! | `label_selector` | Kubernetes label selector (`a=b,c in (d,e),!f`) | none | none |
//! | `default_weight` | integer 0..4294967295 | 50 | 50 |
//! | `shared_size` | APISIX shared memory size like `1m`; accepted and ignored | `1m` | `1m` |
//! | `watch_endpoint_slices` | bool; `true` = watch `discovery.k8s.io/v1` EndpointSlices, else `v1` Endpoints (deprecated since Kubernetes 1.33) | `false` | `false` |
//!
//! Rules: `${VAR}` (anywhere in `service.host`, `service.port`,
//! `service.ca_file`, `client.token`, `client.token_file`, `kubeconfig`,
//! `context`) must be set, or it is an error. Exactly one of `token`/`token_file`
//! (after defaults). `https` with an empty `token` is an error.
//! `service`/`client` and `kubeconfig`/`context` exclude each other. Multi-cluster
//! entries get no `service`/`client` defaults.
//!
//! # `kube_discovery` (our additions)
//!
//! | key | rule | default |
//! |---|---|---|
//! | `instance` | DNS label naming this installation: stamped on every object as the label `kubediscovery.io/instance` and in the field manager `kube-discovery/<instance>`; an instance never writes, repairs or deletes another instance's objects (or hand-made ones) | `default` |
//! | `adopt_instances` | list of DNS labels: earlier names of this installation (a Helm reinstall under another release name, `deploy/` to Helm): their objects are this instance's, relabelled at its next write of each. Never list an instance that still runs | `[]` |
//! | `coalesce_window` | duration 0s..60s: per-service quiet time before a write, so a rolling update's burst becomes few writes | `100ms` |
//! | `drain_terminating` | `false`, `true` (= `fallback`) or `always` (EndpointSlices only). `true`: a port with no ready endpoint uses its serving+terminating ones, flagged `draining: true`, at their usual weight. `always`: serving+terminating endpoints are always published next to the ready ones, flagged `draining: true` with weight 0, so gateways send them no new traffic but can finish sticky sessions and open connections | `false` |
//! | `index_port_numbers` | bool: also index named ports under their number | `false` |
//! | `topology` | bool: add `zone`, `nodeName`, `targetRef` to nodes | `false` |
//! | `export` | `all` or `opt-in`: which Services are published. `all`: every Service but those annotated `kubediscovery.io/export: "false"`; `opt-in`: only those annotated `"true"` (endpoints without a Service are then not published). Per Service, `kubediscovery.io/weight: "N"` (0..4294967295) sets the weight of all its nodes instead of `default_weight`. An annotation with another value is skipped with a warning naming the Service and the annotation and counted (`kube_discovery_source_skipped_total{kind="Service",reason="invalid_annotation"}`); the Service is then handled as without it. Changing an annotation updates or deletes the object at once | `all` |
//! | `external_name.enabled` / `external_name.allow` | bool / list of regexes (each must match the WHOLE host): publish ExternalName Services whose `spec.externalName` an `allow` regex matches, one node per Service port (`host` = the name, `port` = the Service port, key = port name or number). Off by default: an ExternalName lets whoever can create a Service in a watched namespace point a gateway at any host (Contour's CVE-2021-32783). A host outside the allowlist or not a DNS name is skipped with a warning naming the Service and counted (`reason` `external_name_refused` / `invalid_external_name`). `enabled: true` needs at least one regex | `false` / - |
//! | `service_port_aliases` | bool: also resolve a Service port's number (`ns/name:80`) to the port key holding its nodes (`http`), read from the Service; stored as the small map `spec.aliases` (node lists are not duplicated, APISIX keys and dump values are unchanged). Off by default: it adds a spec field, which a CRD older than this version refuses (upgrade the CRD first), and changes `spec.version` of every service with a Service (one rewrite each) | `false` |
//! | `watch_timeout` | duration 1s..290s: server-side watch timeout (capped at `request_timeout` minus 2 s) | `290s` |
//! | `request_timeout` | duration 3s..300s: the longest any API request (list page, watch, write, lease, ConfigMap) waits for the next byte from the API server; watches are renewed within it, so a silent connection is dropped and replaced | `10s` |
//! | `unready_after` | duration 1s..1h: a watch (each cluster's endpoint and Service watch on its own) or leader election's Lease that has failed (unreachable, forbidden, timing out) for longer turns `/readyz` 503 until it recovers | `60s` |
//! | `shutdown_timeout` | duration 1s..1h: the most a graceful shutdown (SIGTERM: in-flight writes, watches, the HTTP server) takes before the process exits anyway; keep it below the pod's `terminationGracePeriodSeconds` (the chart sets it to that minus 5 s) | `20s` |
//! | `write_concurrency` | 1..256 concurrent writes | `32` |
//! | `write_qps` | 0.1..10000 writes per second: the ceiling of the adaptive write limiter, never exceeded. The limiter starts at `write_qps_start`, adds one write/s per successful write (doubling about every 0.7 s at full use), and on a 429 from the API server (API Priority and Fairness, max-in-flight) halves its rate and pauses all writes for the answer's `Retry-After` (at most 10 s); after a 429 it grows by only `write_qps_start` writes/s per second. The throttled write is retried, not reported failing. Set it to the old fixed limit (e.g. `50`) to never write faster than that | `2000` |
//! | `write_qps_start` | 0.1..10000 writes per second: where the adaptive write limiter starts (capped at `write_qps`) | `50` |
//! | `http.addr` | `ip:port` of the HTTP server | `0.0.0.0:8080` |
//! | `http.auth_token_file` | file with a bearer token required by the dump and nodes APIs; must be readable and non-empty at start, then re-read when it changes (within a second; a rotated Secret needs no restart, the old token stops working; a file that becomes unreadable or empty keeps the last token) | none (no auth) |
//! | `sinks.discoveredservices.enabled` | bool; `false` is refused by `run` ([`Config::resolve`]): it is the only sink | `true` |
//! | `sinks.discoveredservices.namespace_mode` | `source` (next to the Service) or `fixed` | `source` |
//! | `sinks.discoveredservices.namespace` | namespace (DNS label); required with `fixed`, not allowed with `source` | - |
//! | `sinks.configmap.enabled` | bool: also write a ConfigMap snapshot | `false` |
//! | `sinks.configmap.namespace` | namespace; required when enabled | - |
//! | `sinks.configmap.name` | name of the index ConfigMap (DNS subdomain; at most 240 characters, checked by `run` ([`Config::resolve`])); shards are `<name>-<i>` | `kube-discovery-nodes` |
//! | `home.kubeconfig` / `home.context` | where DiscoveredServices are written in multi-cluster mode | in-cluster |
//! | `leader_election.enabled` | bool | `false` |
//! | `leader_election.lease_name` | Lease name (DNS subdomain) | `kube-discovery` |
//! | `leader_election.lease_namespace` | namespace; unset = the runtime's own namespace | unset |
//! | `leader_election.lease_duration` | duration 1s..300s | `15s` |
//! | `leader_election.renew_deadline` | duration 100ms..300s, shorter than `lease_duration`: a leader that has not renewed within it stops writing | 2/3 of `lease_duration` (`10s`) |
//! | `leader_election.retry_period` | duration 100ms..300s, shorter than `renew_deadline`: time between renewals / acquisition attempts | 2/15 of `lease_duration` (`2s`) |
//!
//! Durations are strings such as `100ms`, `5s`, `1m 30s`.
//!
//! ```yaml
//! discovery:
//!   kubernetes:
//!     service: {schema: https, host: "${KUBERNETES_SERVICE_HOST}", port: "${KUBERNETES_SERVICE_PORT}"}
//!     client: {token_file: /var/run/secrets/kubernetes.io/serviceaccount/token}
//!     namespace_selector: {not_match: ["kube-.*"]}
//!     watch_endpoint_slices: true
//! kube_discovery:
//!   drain_terminating: true
//!   sinks: {discoveredservices: {namespace_mode: source}}
//! ```

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
    HomeCluster, HttpSettings, LeaderElection, Schema, Settings, Sinks,
};

pub use crate::filter::{AnchoredRegex, LabelSelector, NamespaceFilter};
