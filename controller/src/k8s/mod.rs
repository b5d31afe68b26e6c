//! Talking to API servers: the client stack, the one watch loop, the endpoint
//! sources built on it, leader election, Events, and safe error summaries.

pub mod client;
pub mod events;
pub mod leader;
pub mod redact;
pub mod source;
pub mod watch;
