//! Prometheus metrics (prometheus-client, prefix `kube_discovery`), all labelled
//! per cluster (`cluster=""` in single-cluster mode).
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `kube_discovery_watch_events_total` | counter | cluster, type (apply/delete/init_apply/relist) |
//! | `kube_discovery_watch_restarts_total` | counter | cluster |
//! | `kube_discovery_list_duration_seconds` | histogram | cluster |
//! | `kube_discovery_writes_total` | counter | cluster, result (applied/deleted/error_*; error_panic: a write task panicked; fenced: dropped, the Lease was lost, not an error; throttled: answered 429, written again when the limiter allows, not an error) |
//! | `kube_discovery_objects_failing` | gauge | cluster, reason (`name_taken`, `forbidden`, `conflict`, `api_error`, ...): services whose last write failed, retried with backoff; readiness does not wait for them |
//! | `kube_discovery_writes_skipped_total` | counter | cluster (content hash already on the API server) |
//! | `kube_discovery_event_to_write_seconds` | histogram | cluster (first source event -> write done) |
//! | `kube_discovery_services` | gauge | cluster |
//! | `kube_discovery_nodes` | gauge | cluster |
//! | `kube_discovery_source_skipped_total` | counter | cluster, kind (Endpoints/EndpointSlice/Service), reason (`SkipReason`: invalid_address, invalid_port, ...): bad parts of source objects skipped, counted once per object and change like the warning log |
//! | `kube_discovery_snapshot_writes_total` | counter | result (applied/deleted/error_*; fenced: a round dropped, the Lease was lost): ConfigMap snapshot writes |
//! | `kube_discovery_snapshot_shards` | gauge | - (shards of the current snapshot version) |
//! | `kube_discovery_snapshot_bytes` | gauge | - (bytes of all shards of the current version) |
//! | `kube_discovery_snapshot_last_publish_timestamp_seconds` | gauge | - (unix time the index last changed) |
//! | `kube_discovery_drift_corrections_total` | counter | cluster, kind (edited/deleted/orphan) |
//! | `kube_discovery_last_write_timestamp_seconds` | gauge | cluster (unix time of the last successful write or delete) |
//! | `kube_discovery_api_requests_in_flight` | gauge | client (`source`: a watched cluster's client, `writer`: the one writing DiscoveredServices, `home`: the drift watch, the Lease, Events and the ConfigMap snapshot), cluster (the watched cluster's id; `""` for `writer` and `home`): API requests started and not yet answered in full, open watches included (one per watched resource); read at scrape time |
//! | `kube_discovery_write_rate_limit` | gauge | - (writes per second the adaptive limiter allows now: grows while writes succeed, halves on a 429, never above `write_qps`) |
//! | `kube_discovery_writes_throttled_total` | counter | by (`apf`: rejected by API Priority and Fairness, `other`: another 429): 429 answers to the writer's requests |
//! | `kube_discovery_xds_streams` | gauge | protocol (`sotw`/`delta`): open xDS streams |
//! | `kube_discovery_xds_clients` | gauge | node_id, protocol: open xDS streams per client node id (gone with the client's last stream) |
//! | `kube_discovery_xds_pushes_total`, `kube_discovery_xds_sent_bytes_total`, `kube_discovery_xds_nacks_total` | counter | type (`cds`/`eds`/`lds`/`rds`): xDS responses sent, their encoded bytes, and those clients rejected |
//! | `kube_discovery_xds_push_latency_seconds` | histogram | - (a change reaching the xDS catalog -> its response handed to the stream) |
//! | `kube_discovery_build_info` | gauge | version, os, arch (always 1) |
//! | `kube_discovery_ready` | gauge | - (1 while `/readyz` answers 200; with [`Metrics::registry_with_state`]) |
//! | `kube_discovery_leader` | gauge | - (1 while this replica writes: it holds the Lease, or leader election is off; with [`Metrics::registry_with_state`]) |
//! | `kube_discovery_leader_election_failing` | gauge | - (1 while this replica's leader election rounds fail: the Lease cannot be read or written, an error or a timeout, not another holder; past `unready_after` `/readyz` is 503; with [`Metrics::registry_with_state`]) |
//! | `process_cpu_seconds_total`, `process_resident_memory_bytes`, `process_virtual_memory_bytes`, `process_open_fds`, `process_max_fds`, `process_threads`, `process_start_time_seconds` | counter / gauges | - (read from `/proc/self` at scrape time, Linux only; [`ProcessCollector`]) |
//!
//! Per-cluster counters that alerts take `increase()`/`rate()` of
//! (`writes_total{result="applied"|"deleted"}`, `watch_restarts_total`) are
//! created at 0 for every configured cluster by [`Metrics::registry_with_state`],
//! so the first write or restart after a start is an increase (Prometheus sees
//! no increase in a series that appears already at 1).
//!
//! Process metrics: prometheus-client 0.26 has no process collector (upstream
//! issue prometheus/client_rust#29 is open, its PR #232 unfinished), and the
//! crates that offer one pull in `procfs`/`rustix`; [`ProcessCollector`] reads
//! the same `/proc` files as client_golang's, with `USER_HZ` = 100 like
//! prometheus/procfs (the kernel exports CPU ticks in `USER_HZ`, 100 on every
//! architecture we build for), without `unsafe` (no `sysconf`).

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tower_http::metrics::in_flight_requests::InFlightRequestsCounter;

use crate::state::ControllerState;

/// Label set `{cluster}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabel {
    /// Cluster id (`""` single cluster).
    pub cluster: String,
}

/// Label set `{cluster, type}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EventLabels {
    /// Cluster id.
    pub cluster: String,
    /// Event type.
    pub r#type: String,
}

/// Label set `{cluster, result}`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// Cluster id.
    pub cluster: String,
    /// `applied`, `deleted`, or `error_<metric_label>`.
    pub result: String,
}

/// Label set `{cluster, reason}` of `kube_discovery_objects_failing`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FailingLabels {
    /// Cluster id.
    pub cluster: String,
    /// The `metric_label` of the last failure (`name_taken`, `forbidden`, ...).
    pub reason: String,
}

/// Label set `{cluster, kind}` of drift corrections.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DriftLabels {
    /// Cluster id.
    pub cluster: String,
    /// `edited`, `deleted` or `orphan`.
    pub kind: String,
}

/// Label set `{result}` of snapshot writes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `applied`, `deleted`, or `error_<metric_label>`.
    pub result: String,
}

/// Label set `{cluster, kind, reason}` of skipped source data.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SkipLabels {
    /// Cluster id.
    pub cluster: String,
    /// Source kind (`Endpoints` or `EndpointSlice`).
    pub kind: String,
    /// A `kube_discovery_core::source::convert::SkipReason` label.
    pub reason: String,
}

/// Label set `{client, cluster}` of `kube_discovery_api_requests_in_flight`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClientLabels {
    /// `source` (a watched cluster) or `home` (where objects are written).
    pub client: String,
    /// The watched cluster's id (`""` for `home`).
    pub cluster: String,
}

/// The in-flight counters of the API clients, read at scrape time.
#[derive(Clone, Default)]
struct InFlight(Arc<Mutex<Vec<(ClientLabels, InFlightRequestsCounter)>>>);

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("InFlight")
    }
}

impl Collector for InFlight {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let counters = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut family = encoder.encode_descriptor(
            "api_requests_in_flight",
            "API requests started and not yet answered in full (open watches included)",
            None,
            MetricType::Gauge,
        )?;
        for (labels, counter) in counters.iter() {
            let g = ConstGauge::new(counter.get() as i64);
            g.encode(family.encode_family(labels)?)?;
        }
        Ok(())
    }
}

/// Label set `{by}` of `kube_discovery_writes_throttled_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ThrottleLabel {
    /// `apf` or `other`.
    pub by: String,
}

/// Label set `{version, os, arch}` of `kube_discovery_build_info`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    /// The crate version (`CARGO_PKG_VERSION`).
    pub version: String,
    /// `std::env::consts::OS`.
    pub os: String,
    /// `std::env::consts::ARCH`.
    pub arch: String,
}

/// Label set `{type}` of the xDS counters (`cds`, `eds`, `lds`, `rds`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct XdsTypeLabel {
    /// The resource type.
    pub r#type: &'static str,
}

/// Label set `{node_id, protocol}` of `kube_discovery_xds_clients`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct XdsClientLabels {
    /// The client's `node.id`.
    pub node_id: String,
    /// `sotw` or `delta`.
    pub protocol: &'static str,
}

/// Label set `{protocol}` of `kube_discovery_xds_streams` (`sotw`, `delta`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct XdsProtocolLabel {
    /// The protocol variant.
    pub protocol: &'static str,
}

type HistogramFamily = Family<ClusterLabel, Histogram, fn() -> Histogram>;

fn push_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 14))
}

fn list_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 2.0, 14))
}

/// All metrics of the process, cheap to clone (families are `Arc`s inside).
#[derive(Clone)]
pub struct Metrics {
    /// Watch events by type.
    pub watch_events: Family<EventLabels, Counter>,
    /// Watch stream errors (each one restarts the watch after a backoff).
    pub watch_restarts: Family<ClusterLabel, Counter>,
    /// Duration of complete (re)lists.
    pub list_duration: HistogramFamily,
    /// Writes by result.
    pub writes: Family<WriteLabels, Counter>,
    /// Services whose last write failed, by reason.
    pub objects_failing: Family<FailingLabels, Gauge>,
    /// Writes skipped because the API server already holds the same version.
    pub writes_skipped: Family<ClusterLabel, Counter>,
    /// First source event to completed write.
    pub event_to_write: HistogramFamily,
    /// Services currently discovered.
    pub services: Family<ClusterLabel, Gauge>,
    /// Nodes currently discovered.
    pub nodes: Family<ClusterLabel, Gauge>,
    /// Bad parts of source objects skipped, by reason.
    pub source_skipped: Family<SkipLabels, Counter>,
    /// ConfigMap snapshot writes by result.
    pub snapshot_writes: Family<ResultLabel, Counter>,
    /// Shards of the current snapshot version.
    pub snapshot_shards: Gauge,
    /// Bytes of all shards of the current snapshot version.
    pub snapshot_bytes: Gauge,
    /// Unix time the snapshot index was last written.
    pub snapshot_last_write: Gauge,
    /// DiscoveredServices restored or removed because someone changed them.
    pub drift_corrections: Family<DriftLabels, Counter>,
    /// Unix time of the last successful write (apply or delete), per cluster.
    pub last_write: Family<ClusterLabel, Gauge>,
    /// Always 1, labelled with the build.
    pub build_info: Family<BuildLabels, Gauge>,
    /// The adaptive write limiter's rate now (writes per second).
    pub write_rate_limit: Gauge<f64, AtomicU64>,
    /// 429 answers to the writer's requests, by who sent them.
    pub writes_throttled: Family<ThrottleLabel, Counter>,
    /// Open xDS streams, by protocol.
    pub xds_streams: Family<XdsProtocolLabel, Gauge>,
    /// Connected xDS clients: streams per node id (the series goes when its
    /// last stream does).
    pub xds_clients: Family<XdsClientLabels, Gauge>,
    /// xDS responses sent, by type.
    pub xds_pushes: Family<XdsTypeLabel, Counter>,
    /// Bytes of the xDS responses sent (encoded protobuf), by type.
    pub xds_bytes: Family<XdsTypeLabel, Counter>,
    /// xDS responses clients rejected (NACK), by type.
    pub xds_nacks: Family<XdsTypeLabel, Counter>,
    /// From a change reaching the xDS catalog to its response being handed
    /// to the stream's transport.
    pub xds_push_latency: Histogram,
    /// The API clients' in-flight counters ([`Metrics::track_client`]).
    in_flight: InFlight,
}

impl Default for Metrics {
    fn default() -> Self {
        let m = Self {
            watch_events: Family::default(),
            watch_restarts: Family::default(),
            list_duration: Family::new_with_constructor(list_histogram as fn() -> Histogram),
            writes: Family::default(),
            objects_failing: Family::default(),
            writes_skipped: Family::default(),
            event_to_write: Family::new_with_constructor(latency_histogram as fn() -> Histogram),
            services: Family::default(),
            nodes: Family::default(),
            source_skipped: Family::default(),
            snapshot_writes: Family::default(),
            snapshot_shards: Gauge::default(),
            snapshot_bytes: Gauge::default(),
            snapshot_last_write: Gauge::default(),
            drift_corrections: Family::default(),
            last_write: Family::default(),
            build_info: Family::default(),
            write_rate_limit: Gauge::default(),
            writes_throttled: Family::default(),
            xds_streams: Family::default(),
            xds_clients: Family::default(),
            xds_pushes: Family::default(),
            xds_bytes: Family::default(),
            xds_nacks: Family::default(),
            xds_push_latency: push_histogram(),
            in_flight: InFlight::default(),
        };
        m.build_info
            .get_or_create(&BuildLabels {
                version: env!("CARGO_PKG_VERSION").to_string(),
                os: std::env::consts::OS.to_string(),
                arch: std::env::consts::ARCH.to_string(),
            })
            .set(1);
        m
    }
}

impl Metrics {
    /// A registry of every family (prefix `kube_discovery`) and the process
    /// metrics (`process_*`, unprefixed).
    pub fn registry(&self) -> Registry {
        let mut root = Registry::default();
        root.register_collector(Box::new(ProcessCollector::default()));
        self.register(root.sub_registry_with_prefix("kube_discovery"));
        root
    }

    /// [`Self::registry`] plus `kube_discovery_ready` and `kube_discovery_leader`,
    /// read from `shared` at scrape time; the per-cluster counters of every
    /// cluster `shared` knows are created at 0.
    pub fn registry_with_state(&self, shared: Arc<ControllerState>) -> Registry {
        for cluster in shared.clusters().keys() {
            self.init_cluster(cluster);
        }
        let mut root = self.registry();
        root.sub_registry_with_prefix("kube_discovery")
            .register_collector(Box::new(StateCollector { shared }));
        root
    }

    /// Creates the per-cluster counters that alerts take increases of, at 0.
    pub fn init_cluster(&self, cluster: &str) {
        for result in ["applied", "deleted"] {
            drop(self.writes.get_or_create(&WriteLabels {
                cluster: cluster.to_string(),
                result: result.to_string(),
            }));
        }
        drop(self.watch_restarts.get_or_create(&Self::cluster(cluster)));
    }

    fn register(&self, r: &mut Registry) {
        r.register_collector(Box::new(self.in_flight.clone()));
        r.register(
            "xds_streams",
            "Open xDS (ADS) streams, by protocol",
            self.xds_streams.clone(),
        );
        r.register(
            "xds_clients",
            "Connected xDS clients: open streams per node id and protocol",
            self.xds_clients.clone(),
        );
        r.register(
            "xds_pushes",
            "xDS responses sent, by resource type",
            self.xds_pushes.clone(),
        );
        r.register(
            "xds_sent_bytes",
            "Bytes of xDS responses sent (encoded), by resource type",
            self.xds_bytes.clone(),
        );
        r.register(
            "xds_nacks",
            "xDS responses rejected by clients (NACK), by resource type",
            self.xds_nacks.clone(),
        );
        r.register(
            "xds_push_latency_seconds",
            "From a change reaching the xDS catalog to its response being sent",
            self.xds_push_latency.clone(),
        );
        r.register(
            "watch_events",
            "Watch events received",
            self.watch_events.clone(),
        );
        r.register(
            "watch_restarts",
            "Watch stream failures (the watch restarts after a backoff)",
            self.watch_restarts.clone(),
        );
        r.register(
            "list_duration_seconds",
            "Duration of complete lists and relists",
            self.list_duration.clone(),
        );
        r.register(
            "writes",
            "DiscoveredService writes by result",
            self.writes.clone(),
        );
        r.register(
            "objects_failing",
            "Services whose last DiscoveredService write failed, by reason; retried with backoff",
            self.objects_failing.clone(),
        );
        r.register(
            "writes_skipped",
            "Writes skipped because the API server already holds the same content version",
            self.writes_skipped.clone(),
        );
        r.register(
            "event_to_write_seconds",
            "Time from the first source event of a change to its completed write",
            self.event_to_write.clone(),
        );
        r.register(
            "services",
            "Services currently discovered",
            self.services.clone(),
        );
        r.register("nodes", "Nodes currently discovered", self.nodes.clone());
        r.register(
            "source_skipped",
            "Bad parts of source objects skipped with a warning (an address, a port, a slice or an object), by reason; counted once per object and change",
            self.source_skipped.clone(),
        );
        r.register(
            "snapshot_writes",
            "ConfigMap snapshot writes (shards and index applied, stale shards deleted) by result",
            self.snapshot_writes.clone(),
        );
        r.register(
            "snapshot_shards",
            "Shards of the current ConfigMap snapshot version",
            self.snapshot_shards.clone(),
        );
        r.register(
            "snapshot_bytes",
            "Bytes of all shards of the current ConfigMap snapshot version",
            self.snapshot_bytes.clone(),
        );
        r.register(
            "snapshot_last_publish_timestamp_seconds",
            "Unix time the ConfigMap snapshot index was last written",
            self.snapshot_last_write.clone(),
        );
        r.register(
            "drift_corrections",
            "DiscoveredServices restored (edited/deleted) or removed (orphan) by drift correction",
            self.drift_corrections.clone(),
        );
        r.register(
            "last_write_timestamp_seconds",
            "Unix time of the last successful DiscoveredService write or delete",
            self.last_write.clone(),
        );
        r.register(
            "write_rate_limit",
            "Writes per second the adaptive write limiter allows now (at most write_qps)",
            self.write_rate_limit.clone(),
        );
        r.register(
            "writes_throttled",
            "429 answers to the writer's requests (apf: rejected by API Priority and Fairness)",
            self.writes_throttled.clone(),
        );
        r.register(
            "build_info",
            "Build of the running kube-discovery (always 1)",
            self.build_info.clone(),
        );
    }

    /// Counts 429 answers to the writer (`apf`: by API Priority and
    /// Fairness).
    pub fn throttled(&self, apf: u64, other: u64) {
        for (by, n) in [("apf", apf), ("other", other)] {
            if n > 0 {
                self.writes_throttled
                    .get_or_create(&ThrottleLabel { by: by.to_string() })
                    .inc_by(n);
            }
        }
    }

    /// Reports `counter` (an API client's requests in flight) as
    /// `kube_discovery_api_requests_in_flight{client, cluster}`.
    pub fn track_client(&self, client: &str, cluster: &str, counter: InFlightRequestsCounter) {
        self.in_flight
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((
                ClientLabels {
                    client: client.to_string(),
                    cluster: cluster.to_string(),
                },
                counter,
            ));
    }

    /// Label helper.
    pub fn cluster(cluster: &str) -> ClusterLabel {
        ClusterLabel {
            cluster: cluster.to_string(),
        }
    }

    /// Counts one watch event.
    pub fn event(&self, cluster: &str, kind: &str) {
        self.watch_events
            .get_or_create(&EventLabels {
                cluster: cluster.to_string(),
                r#type: kind.to_string(),
            })
            .inc();
    }

    /// Counts one drift correction of `kind` (`edited`, `deleted`, `orphan`).
    pub fn drift(&self, cluster: &str, kind: &str) {
        self.drift_corrections
            .get_or_create(&DriftLabels {
                cluster: cluster.to_string(),
                kind: kind.to_string(),
            })
            .inc();
    }

    /// Counts one snapshot write outcome.
    pub fn snapshot_write(&self, result: &str) {
        self.snapshot_writes
            .get_or_create(&ResultLabel {
                result: result.to_string(),
            })
            .inc();
    }

    /// Counts `n` skipped pieces of `kind` source objects for `reason`.
    pub fn skipped(&self, cluster: &str, kind: &str, reason: &str, n: u64) {
        self.source_skipped
            .get_or_create(&SkipLabels {
                cluster: cluster.to_string(),
                kind: kind.to_string(),
                reason: reason.to_string(),
            })
            .inc_by(n);
    }

    /// Moves one service between the `kube_discovery_objects_failing`
    /// reasons: `from` (its previous failure, if any) to `to` (`None`: written).
    pub fn failing(&self, cluster: &str, from: Option<&str>, to: Option<&str>) {
        if from == to {
            return;
        }
        let gauge = |reason: &str| {
            self.objects_failing.get_or_create(&FailingLabels {
                cluster: cluster.to_string(),
                reason: reason.to_string(),
            })
        };
        if let Some(r) = from {
            gauge(r).dec();
        }
        if let Some(r) = to {
            gauge(r).inc();
        }
    }

    /// Counts one write outcome; a success (`applied`, `deleted`) also sets
    /// `kube_discovery_last_write_timestamp_seconds`.
    pub fn write(&self, cluster: &str, result: &str) {
        self.writes
            .get_or_create(&WriteLabels {
                cluster: cluster.to_string(),
                result: result.to_string(),
            })
            .inc();
        if result == "applied" || result == "deleted" {
            self.last_write
                .get_or_create(&Self::cluster(cluster))
                .set(jiff::Timestamp::now().as_second());
        }
    }
}

/// `kube_discovery_ready` and `kube_discovery_leader`, from the shared state
/// at scrape time (the same answers as `/readyz` and its `standby` field).
#[derive(Debug)]
struct StateCollector {
    shared: Arc<ControllerState>,
}

fn const_gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: impl Into<f64>,
) -> Result<(), std::fmt::Error> {
    let g = ConstGauge::new(value.into());
    g.encode(encoder.encode_descriptor(name, help, None, g.metric_type())?)
}

impl Collector for StateCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        const_gauge(
            &mut encoder,
            "ready",
            "1 while this replica is ready (/readyz answers 200), else 0",
            u8::from(self.shared.ready()),
        )?;
        const_gauge(
            &mut encoder,
            "leader",
            "1 while this replica writes (it holds the leader Lease, or leader election is off), else 0",
            u8::from(!self.shared.standby()),
        )?;
        const_gauge(
            &mut encoder,
            "leader_election_failing",
            "1 while this replica's leader election rounds fail (the Lease cannot be read or written), else 0",
            u8::from(self.shared.lease_failing()),
        )
    }
}

/// Clock ticks per second of `/proc/<pid>/stat` (`USER_HZ`; prometheus/procfs
/// assumes the same).
const USER_HZ: f64 = 100.0;

/// The standard process metrics of client_golang (`process_*`), read from
/// `/proc/self` at scrape time. Elsewhere (macOS builds of the CLI) it
/// reports nothing.
#[derive(Debug)]
pub struct ProcessCollector {
    proc_dir: std::path::PathBuf,
}

impl Default for ProcessCollector {
    fn default() -> Self {
        Self {
            proc_dir: "/proc".into(),
        }
    }
}

/// What [`ProcessCollector`] reads.
#[derive(Debug, Default, PartialEq)]
pub struct ProcessStats {
    /// User + system CPU seconds.
    pub cpu_seconds: f64,
    /// Resident set size in bytes.
    pub resident_bytes: u64,
    /// Virtual memory size in bytes.
    pub virtual_bytes: u64,
    /// OS threads.
    pub threads: u64,
    /// Unix start time in seconds (needs `btime` of `/proc/stat`).
    pub start_time_seconds: Option<f64>,
    /// Open file descriptors.
    pub open_fds: Option<u64>,
    /// The soft limit of open files (`None`: unlimited or unknown).
    pub max_fds: Option<u64>,
}

/// Parses `/proc/<pid>/stat`: (cpu seconds, threads, start ticks after boot, vsize bytes).
pub fn parse_proc_stat(text: &str) -> Option<(f64, u64, u64, u64)> {
    // The command name (field 2) is in parentheses and may hold spaces and ')'.
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // f[0] is field 3 (state): field N is f[N - 3].
    let num = |n: usize| f.get(n - 3).and_then(|v| v.parse::<u64>().ok());
    let (utime, stime) = (num(14)?, num(15)?);
    Some((
        // Tick counts stay far below 2^52: the conversion is exact.
        #[allow(clippy::cast_precision_loss)]
        {
            (utime + stime) as f64 / USER_HZ
        },
        num(20)?,
        num(22)?,
        num(23)?,
    ))
}

/// `VmRSS` of `/proc/<pid>/status` in bytes.
pub fn parse_status_rss(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// `btime` of `/proc/stat` (unix seconds of the boot).
pub fn parse_btime(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("btime "))
        .and_then(|v| v.trim().parse().ok())
}

/// The soft "Max open files" of `/proc/<pid>/limits`.
pub fn parse_max_fds(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

impl ProcessCollector {
    /// Reads the stats of this process (`None` without `/proc`).
    pub fn read(&self) -> Option<ProcessStats> {
        let me = self.proc_dir.join("self");
        let read = |p: std::path::PathBuf| std::fs::read_to_string(p).ok();
        let (cpu_seconds, threads, start_ticks, virtual_bytes) =
            parse_proc_stat(&read(me.join("stat"))?)?;
        let start_time_seconds = read(self.proc_dir.join("stat"))
            .as_deref()
            .and_then(parse_btime)
            .map(|boot| {
                #[allow(clippy::cast_precision_loss)]
                {
                    boot as f64 + start_ticks as f64 / USER_HZ
                }
            });
        Some(ProcessStats {
            cpu_seconds,
            resident_bytes: read(me.join("status"))
                .as_deref()
                .and_then(parse_status_rss)
                .unwrap_or(0),
            virtual_bytes,
            threads,
            start_time_seconds,
            open_fds: std::fs::read_dir(me.join("fd"))
                .ok()
                .map(|d| d.count() as u64),
            max_fds: read(me.join("limits")).as_deref().and_then(parse_max_fds),
        })
    }
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(s) = self.read() else {
            return Ok(());
        };
        let cpu = ConstCounter::new(s.cpu_seconds);
        cpu.encode(encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            None,
            cpu.metric_type(),
        )?)?;
        #[allow(clippy::cast_precision_loss)]
        let gauges = [
            (
                "process_resident_memory_bytes",
                "Resident memory size in bytes.",
                Some(s.resident_bytes as f64),
            ),
            (
                "process_virtual_memory_bytes",
                "Virtual memory size in bytes.",
                Some(s.virtual_bytes as f64),
            ),
            (
                "process_open_fds",
                "Number of open file descriptors.",
                s.open_fds.map(|v| v as f64),
            ),
            (
                "process_max_fds",
                "Maximum number of open file descriptors.",
                s.max_fds.map(|v| v as f64),
            ),
            (
                "process_threads",
                "Number of OS threads in the process.",
                Some(s.threads as f64),
            ),
            (
                "process_start_time_seconds",
                "Start time of the process since unix epoch in seconds.",
                s.start_time_seconds,
            ),
        ];
        for (name, help, value) in gauges {
            if let Some(v) = value {
                const_gauge(&mut encoder, name, help, v)?;
            }
        }
        Ok(())
    }
}

/// Encodes `registry` in the Prometheus/OpenMetrics text format.
pub fn encode(registry: &Registry) -> String {
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, registry) {
        out = format!("# error encoding metrics: {e}\n");
    }
    out
}

#[cfg(test)]
mod tests;
