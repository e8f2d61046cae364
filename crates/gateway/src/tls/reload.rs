//! Certificates that change under a running listener: the resolver rustls
//! asks for the certificate at every handshake, and a listener's files as
//! [`crate::file_watch`] hands them over when they change.

use std::sync::Arc;

use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::file_watch;

/// The certificate served now. Swapping it touches no open connection;
/// the next handshake gets the new one.
#[derive(Debug)]
pub struct Resolver(ArcSwap<CertifiedKey>);

impl Resolver {
    pub fn new(key: CertifiedKey) -> Self {
        Self(ArcSwap::from_pointee(key))
    }

    pub fn set(&self, key: CertifiedKey) {
        self.0.store(Arc::new(key));
    }
}

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.load_full())
    }
}

/// One read of a listener's files: each one's bytes, or why it could not
/// be read, in the words `check` prints.
pub type Contents = Vec<Result<Vec<u8>, String>>;

/// `read`, a look at `paths` (in the same order), as [`Contents`].
pub fn contents(paths: &[String], read: Vec<file_watch::Read>) -> Contents {
    paths
        .iter()
        .zip(read)
        .map(|(path, read)| read.map_err(|e| format!("cannot read {path:?}: {e}")))
        .collect()
}

/// Read `paths`, in order, on this thread (for `check`).
pub fn read_blocking(paths: &[String]) -> Contents {
    contents(paths, paths.iter().map(std::fs::read).collect())
}
