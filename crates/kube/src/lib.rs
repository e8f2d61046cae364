//! infergate on Kubernetes.
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
pub mod status;
pub mod status_writer;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
