//! Reading the PEM files the config names: certificate chains, private
//! keys and CA bundles. Every failure names the file and the reason, in
//! the words `infergate check` prints and `serve` refuses with.

use std::sync::Arc;

use rustls::RootCertStore;
use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::{self, PemObject};
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// What is wrong with one file, reported at the config field naming it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileProblem {
    /// The field, relative to the TLS section (`certFile`).
    pub field: &'static str,
    pub message: String,
}

impl std::fmt::Display for FileProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.message)
    }
}

impl FileProblem {
    fn new(field: &'static str, message: String) -> Self {
        Self { field, message }
    }

    /// Problems of a whole section, joined for an error that names them all.
    pub fn joined(problems: &[FileProblem]) -> String {
        problems
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// The bytes of `path`, named by `field`.
pub fn read(field: &'static str, path: &str) -> Result<Vec<u8>, FileProblem> {
    if path.is_empty() {
        return Err(FileProblem::new(field, "must not be empty".to_owned()));
    }
    std::fs::read(path).map_err(|e| FileProblem::new(field, format!("cannot read {path:?}: {e}")))
}

/// Every certificate in the PEM text `bytes` of `path`; at least one.
pub fn certificates(
    field: &'static str,
    path: &str,
    bytes: &[u8],
) -> Result<Vec<CertificateDer<'static>>, FileProblem> {
    let certs = CertificateDer::pem_slice_iter(bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| FileProblem::new(field, format!("{path:?} is not valid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(FileProblem::new(
            field,
            format!("{path:?} holds no PEM certificate (-----BEGIN CERTIFICATE-----)"),
        ));
    }
    Ok(certs)
}

/// The first private key in the PEM text `bytes` of `path`: PKCS#8
/// (`BEGIN PRIVATE KEY`), PKCS#1 RSA (`BEGIN RSA PRIVATE KEY`) or SEC1 EC
/// (`BEGIN EC PRIVATE KEY`).
pub fn private_key(
    field: &'static str,
    path: &str,
    bytes: &[u8],
) -> Result<PrivateKeyDer<'static>, FileProblem> {
    PrivateKeyDer::from_pem_slice(bytes).map_err(|e| {
        let reason = match e {
            pem::Error::NoItemsFound => {
                "holds no PEM private key (PKCS#8, PKCS#1 RSA or SEC1 EC)".to_owned()
            }
            e => format!("is not a valid PEM private key: {e}"),
        };
        FileProblem::new(field, format!("{path:?} {reason}"))
    })
}

/// A certificate chain (leaf first) and its key, checked to belong
/// together: what a listener serves, or a client certificate for replicas.
pub fn certified_key(
    provider: &CryptoProvider,
    (cert_field, cert_path, cert_bytes): (&'static str, &str, &[u8]),
    (key_field, key_path, key_bytes): (&'static str, &str, &[u8]),
) -> Result<CertifiedKey, Vec<FileProblem>> {
    let chain = certificates(cert_field, cert_path, cert_bytes);
    let key = private_key(key_field, key_path, key_bytes);
    let (chain, key) = match (chain, key) {
        (Ok(chain), Ok(key)) => (chain, key),
        (chain, key) => {
            return Err([chain.err(), key.err()].into_iter().flatten().collect());
        }
    };
    CertifiedKey::from_der(chain, key, provider).map_err(|e| {
        let message = match e {
            rustls::Error::InconsistentKeys(_) => {
                format!(
                    "the key in {key_path:?} does not belong to the certificate in {cert_path:?}"
                )
            }
            e => format!("{key_path:?} cannot be used with {cert_path:?}: {e}"),
        };
        vec![FileProblem::new(key_field, message)]
    })
}

/// A CA bundle: every certificate in it becomes a trust anchor.
pub fn roots(
    field: &'static str,
    path: &str,
    bytes: &[u8],
) -> Result<Arc<RootCertStore>, FileProblem> {
    let mut store = RootCertStore::empty();
    for cert in certificates(field, path, bytes)? {
        store.add(cert).map_err(|e| {
            FileProblem::new(
                field,
                format!("{path:?} holds an unusable CA certificate: {e}"),
            )
        })?;
    }
    Ok(Arc::new(store))
}
