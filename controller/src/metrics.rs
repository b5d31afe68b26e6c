//! Prometheus metrics (prometheus-client, prefix `kube_discovery`), all labelled
//! per cluster (`cluster=""` in single-cluster mode).
//!
//! | metric | type | labels |
//! |---|---|---|
//! | `kube_discovery_watch_events_total` | counter | cluster, type (apply/delete/init_apply/relist) |
//! | `kube_discovery_watch_restarts_total` | counter | cluster |
//! | `kube_discovery_list_duration_seconds` | histogram | cluster |
//! | `kube_discovery_writes_total` | counter | cluster, result (applied/deleted/error_*) |
//! | `kube_discovery_writes_skipped_total` | counter | cluster (content hash already on the API server) |
//! | `kube_discovery_event_to_write_seconds` | histogram | cluster (first source event -> write done) |
//! | `kube_discovery_services` | gauge | cluster |
//! | `kube_discovery_nodes` | gauge | cluster |
//! | `kube_discovery_source_skipped_total` | counter | cluster, kind (Endpoints/EndpointSlice), reason (`SkipReason`: invalid_address, invalid_port, ...): bad parts of source objects skipped, counted once per object and change like the warning log |
//! | `kube_discovery_snapshot_writes_total` | counter | result (applied/deleted/error_*): ConfigMap snapshot writes |
//! | `kube_discovery_snapshot_shards` | gauge | - (shards of the current snapshot version) |
//! | `kube_discovery_snapshot_bytes` | gauge | - (bytes of all shards of the current version) |
//! | `kube_discovery_snapshot_last_publish_timestamp_seconds` | gauge | - (unix time the index last changed) |
//! | `kube_discovery_drift_corrections_total` | counter | cluster, kind (edited/deleted/orphan) |

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

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
    /// A `kube_discovery_core::convert::SkipReason` label.
    pub reason: String,
}

type HistogramFamily = Family<ClusterLabel, Histogram, fn() -> Histogram>;

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
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            watch_events: Family::default(),
            watch_restarts: Family::default(),
            list_duration: Family::new_with_constructor(list_histogram as fn() -> Histogram),
            writes: Family::default(),
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
        }
    }
}

impl Metrics {
    /// Registers every family into a new registry with prefix `kube_discovery`.
    pub fn registry(&self) -> Registry {
        let mut r = Registry::with_prefix("kube_discovery");
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
        r
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

    /// Counts one write outcome.
    pub fn write(&self, cluster: &str, result: &str) {
        self.writes
            .get_or_create(&WriteLabels {
                cluster: cluster.to_string(),
                result: result.to_string(),
            })
            .inc();
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
mod tests {
    use super::*;

    #[test]
    fn encodes_families_with_cluster_labels() {
        let m = Metrics::default();
        m.event("c1", "apply");
        m.write("", "applied");
        m.writes_skipped.get_or_create(&Metrics::cluster("")).inc();
        m.services.get_or_create(&Metrics::cluster("")).set(3);
        m.skipped("", "Endpoints", "invalid_port", 2);
        m.event_to_write
            .get_or_create(&Metrics::cluster(""))
            .observe(0.2);
        let text = encode(&m.registry());
        assert!(
            text.contains(r#"kube_discovery_watch_events_total{cluster="c1",type="apply"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"kube_discovery_writes_total{cluster="",result="applied"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"kube_discovery_writes_skipped_total{cluster=""} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"kube_discovery_services{cluster=""} 3"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"kube_discovery_source_skipped_total{cluster="",kind="Endpoints",reason="invalid_port"} 2"#
            ),
            "{text}"
        );
        assert!(
            text.contains("kube_discovery_event_to_write_seconds_count{cluster=\"\"} 1"),
            "{text}"
        );
    }
}
