//! What the watches deliver, reduced to what the index needs: lean decoding
//! of watch lines ([`lean`]), Endpoints and EndpointSlices converted and
//! merged into a [`crate::PortMap`] ([`convert`]), a Service reduced to its
//! ports and annotations ([`service`]), and the namespace and label filters
//! ([`filter`]).

pub mod convert;
pub mod filter;
pub mod lean;
pub mod service;
