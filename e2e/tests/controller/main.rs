//! End-to-end tests, one binary per area (fewer links and less disk than one
//! binary per file): The controller end to end: sources, writes, drift, shards, snapshot, leader election,
//! TLS/RBAC, the CLI, kubectl on DiscoveredServices, the fault suite and the gateways
//! (nginx, HAProxy, the Rust proxy).
//!
//! Every module is one former test file; `#[both_backends]` tests are named
//! `<module>::<test>::kube_sim` and `<module>::<test>::real`.

#[path = "../controller_support/mod.rs"]
mod controller_support;
#[path = "../fault_support/mod.rs"]
mod fault_support;
#[path = "../gateway_support/mod.rs"]
mod gateway_support;

mod api;
mod cli;
mod conditions;
mod drift;
mod endpointslice_controller;
mod fault_bad_config;
mod fault_ha;
mod fault_io;
mod fault_security;
mod fault_suite;
mod gateway_envoy;
mod gateway_grpc;
mod gateway_haproxy;
mod gateway_nginx;
mod gateway_rust_proxy;
mod health;
mod instances;
mod kubectl_dsvc;
mod leader;
mod readers;
mod services;
mod shards;
mod snapshot;
mod sources;
mod tls_rbac;
mod writes;
mod xds;
