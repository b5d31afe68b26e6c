//! kube-sim: a small, honest Kubernetes API server for tests and demos.
