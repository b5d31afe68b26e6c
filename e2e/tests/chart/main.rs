//! End-to-end tests, one binary per area (fewer links and less disk than one
//! binary per file): The Helm chart, the static deploy/ manifest, the image and the release workflows.
//!
//! Every module is one former test file; `#[both_backends]` tests are named
//! `<module>::<test>::kube_sim` and `<module>::<test>::real`.

#[path = "../chart_support/mod.rs"]
mod chart_support;
#[path = "../install_support/mod.rs"]
mod install_support;

mod config;
mod dependencies;
mod deploy_manifest;
mod image;
mod monitoring;
mod release_workflows;
mod render;
mod sim;
mod upgrade;
mod values;
mod xds;
