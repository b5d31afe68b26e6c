//! Pure Kubernetes API machinery used by kube-sim. No I/O in this crate.
//!
//! Modules, each self-contained and deterministic:
//! - [`selector`]: label selectors (the grammar is `k8s_syntax::selector`) and field selectors.
//! - [`endpoints`]: Endpoints and EndpointSlice defaults and validation (addresses, ports).
//! - [`field`]: Kubernetes field errors (`FieldError`) and the 422 message.
//! - [`names`]: `ObjectMeta` checks; the name rules (DNS-1123, DNS-1035, qualified name,
//!   label value) are `k8s_syntax::names`, re-exported.
//! - [`patch`]: JSON merge patch, JSON patch and strategic merge patch.
//! - [`rbac`]: RBAC authorization over stored Role/ClusterRole/bindings and 403 messages.
//! - [`schema`]: CRD openAPIV3Schema pruning, defaulting and validation (via `jsonschema`).
//! - [`ssa`]: server-side apply, managedFields (FieldsV1), update ownership tracking.

#![warn(missing_docs)]

pub mod endpoints;
pub mod field;
pub mod names;
pub mod patch;
pub mod rbac;
pub mod schema;
pub mod selector;
pub mod ssa;
