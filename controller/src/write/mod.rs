//! Carrying out the write planner's decisions: the inbox it reads changes
//! from, the writer loop, the DiscoveredService sink, the drift watch that
//! feeds back what the API server holds, and the snapshot ConfigMap sink.

pub mod drift;
pub mod explain;
pub mod generation;
pub mod inbox;
pub mod sink;
pub mod snapshot_sink;
pub mod writer;
