//! infergate on Kubernetes.
//!
//! Discovery: the replicas of a pool that gives `endpointSelector` or
//! `inferencePool`, followed through kube-rs watches ([`follow`]) and handed
//! to a [`Sink`] (the gateway) on every change. Until a pool's first full
//! list succeeds it gets no replicas (it is not ready); when the API server
//! cannot be reached the sink keeps the last replicas it was given and hears
//! that the pool's discovery is down.
//!
//! The config as a custom resource: its definition generated from the
//! config's types ([`crd`]), read and followed ([`config_source`]), its
//! status worked out ([`status`]) and written by one gateway replica at a
//! time ([`status_writer`], [`lease`]); the API calls the gateway makes,
//! which its RBAC rules grant ([`access`]). The API server double
//! ([`testing`]) the tests run kube-rs against.

pub mod access;
pub mod config_source;
pub mod crd;
pub mod lease;
pub mod scale;
pub mod status;
pub mod status_writer;

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
