//! Kubernetes discovery for infergate. For now: the API server double
//! ([`testing`]) the discovery tests run kube-rs against.

#[cfg(any(test, feature = "testing"))]
pub mod testing;
