//! The one crypto provider: ring, named explicitly rather than left to
//! rustls' process default (which is ambiguous when another crate in the
//! build enables a second provider).

use std::sync::{Arc, OnceLock};

use rustls::crypto::CryptoProvider;

pub fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    Arc::clone(PROVIDER.get_or_init(|| Arc::new(rustls::crypto::ring::default_provider())))
}

/// Make ring the process-wide default too, for a library that builds its
/// own rustls configuration with `ClientConfig::builder()` (the redis
/// crate for `rediss://`), which panics when the build holds two providers
/// and none was chosen. Keeps a default someone else installed.
pub fn install_process_default() {
    if CryptoProvider::get_default().is_none() {
        let _ = CryptoProvider::install_default((*provider()).clone());
    }
}
