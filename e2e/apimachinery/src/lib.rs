//! Pure Kubernetes API machinery used by kube-sim. No I/O in this crate.
