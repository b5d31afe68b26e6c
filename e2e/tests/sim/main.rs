//! End-to-end tests, one binary per area (fewer links and less disk than one
//! binary per file): kube-sim's own API semantics, its CLI, faults, watch, and real kubectl/helm against it.
//!
//! Every module is one former test file; `#[both_backends]` tests are named
//! `<module>::<test>::kube_sim` and `<module>::<test>::real`.

#[path = "../sim_support/mod.rs"]
mod sim_support;

mod api;
mod cli;
mod faults;
mod helm;
mod kubectl;
mod watch;
