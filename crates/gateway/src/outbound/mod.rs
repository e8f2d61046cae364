//! Stage 9, forward: talking to replicas: each worker's connections to each pool
//! ([`connections`], over hyper's client connections), the request a
//! replica receives ([`Outgoing`]) and who it is told the client is
//! ([`forwarded`]).

pub mod connections;
pub mod continuation;
pub mod disaggregated;
pub mod forward;
pub mod forwarded;
pub mod held;
pub mod mirror;
mod outgoing;
pub mod replica_error;
pub mod response_body;
mod sse;
pub mod stream_usage;

pub use connections::{Connections, Response};
pub use forwarded::{Forwarded, TrustedProxies};
pub use outgoing::{CallerFields, KeptRequest, Outgoing, REQUEST_ID};
