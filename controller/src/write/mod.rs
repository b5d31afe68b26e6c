//! Carrying out the write planner's decisions: the inbox it reads changes
//! from, the writer loop, the DiscoveredService sink, the one record of
//! what the API server holds of our objects (fed by the sink and the drift
//! watch), and the snapshot ConfigMap sink.

pub mod drift;
pub mod explain;
pub mod generation;
pub mod inbox;
pub mod record;
pub mod sink;
pub mod snapshot_sink;
pub mod writer;
