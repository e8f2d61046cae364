//! Talking to replicas: each worker's connections to each pool
//! ([`connections`], over hyper's client connections), the request a
//! replica receives ([`Outgoing`]) and who it is told the client is
//! ([`forwarded`]).

pub mod connections;
pub mod forwarded;
mod outgoing;

pub use connections::{Connections, Response};
pub use forwarded::{Forwarded, TrustedProxies};
pub use outgoing::{CallerFields, Outgoing, REQUEST_ID};
