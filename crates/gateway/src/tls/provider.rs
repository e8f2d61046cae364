//! The one crypto provider: ring, named explicitly rather than left to
//! rustls' process default (which is ambiguous when another crate in the
//! build enables a second provider).

use std::sync::{Arc, OnceLock};

use rustls::crypto::CryptoProvider;

pub fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: OnceLock<Arc<CryptoProvider>> = OnceLock::new();
    Arc::clone(PROVIDER.get_or_init(|| Arc::new(rustls::crypto::ring::default_provider())))
}
