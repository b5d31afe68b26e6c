//! What the controller serves: the HTTP API (probes, dump, nodes) and its
//! Prometheus metrics.

pub mod http;
pub mod metrics;
