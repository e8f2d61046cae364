//! Kubernetes discovery for infergate: the replicas of a pool that gives
//! `endpointSelector` or `inferencePool`, followed through kube-rs watches
//! and handed to a [`Sink`] (the gateway) on every change.
//!
//! Until a pool's first full list succeeds it gets no replicas (it is not
//! ready); when the API server cannot be reached the sink keeps the last
//! replicas it was given and hears that the pool's discovery is down.

mod follow;
mod gateway_sink;
mod replicas;
mod sink;
mod start;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

pub use follow::inference_pool_resource;
pub use gateway_sink::Discoveries;
pub use replicas::{Ports, Replica, is_serving};
pub use sink::{Sink, Task};
pub use start::{client, follow};
