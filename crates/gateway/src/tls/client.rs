//! TLS to a pool's `https://` replicas: one client configuration per
//! pool, for its requests (ALPN `http/1.1`, or `h2` for `protocol: h2c`)
//! and its metric scrapes (`http/1.1`).
//!
//! Replicas' certificates are checked against the pool's `tls.caFile`, or
//! the system's trust store when there is none (read once per process by
//! `rustls-native-certs`: the store operators already manage, including
//! `SSL_CERT_FILE`, rather than a copy of Mozilla's roots frozen into the
//! binary at build time). A reload builds the configuration again from
//! the config and the files as they are then; connections opened under
//! the old one are not reused ([`PoolTls::id`]).

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use config::{Protocol, UpstreamTls, endpoint_scheme};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature};
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use super::files::{self, FileProblem};
use super::provider::provider;

/// Ids of built configurations; 0 is no TLS.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// TLS to one pool's replicas, as its config and files were when built.
pub struct PoolTls {
    /// Unique to this build: a connection opened under another build is
    /// not reused, so a reload's settings hold for every request after it.
    pub id: u64,
    requests: TlsConnector,
    scrapes: TlsConnector,
    server_name: Option<ServerName<'static>>,
    source: Source,
}

impl std::fmt::Debug for PoolTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolTls")
            .field("id", &self.id)
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

/// What a [`PoolTls`] was built from: equal sources build the same thing.
#[derive(Debug, PartialEq)]
struct Source {
    spec: UpstreamTls,
    protocol: Protocol,
    files: Vec<Vec<u8>>,
}

impl PoolTls {
    /// TLS for `pool`'s replicas, or `None` when none is `https://`.
    /// Logs a warning when the pool's certificates are not checked.
    pub fn for_pool(pool: &config::Pool) -> Result<Option<Self>, Vec<FileProblem>> {
        let built = Self::build_for(pool)?;
        if built.is_some() && pool.tls.as_ref().is_some_and(|t| t.insecure_skip_verify) {
            tracing::warn!(
                pool = %pool.name,
                "tls.insecureSkipVerify: the replicas' certificates are not checked; \
                 anyone on the path can read and change this pool's traffic"
            );
        }
        Ok(built)
    }

    fn build_for(pool: &config::Pool) -> Result<Option<Self>, Vec<FileProblem>> {
        let https = pool
            .endpoints
            .iter()
            .any(|e| endpoint_scheme(e).0 == config::Scheme::Https);
        if !https {
            return Ok(None);
        }
        build(&pool.tls.clone().unwrap_or_default(), pool.protocol).map(Some)
    }

    /// Whether `other` was built from the same settings and files.
    pub fn same_as(&self, other: &Self) -> bool {
        self.source == other.source
    }

    /// The TLS handshake with the replica at `host_port` over `tcp`.
    pub async fn connect(
        &self,
        host_port: &str,
        tcp: TcpStream,
    ) -> io::Result<TlsStream<TcpStream>> {
        let name = match &self.server_name {
            Some(name) => name.clone(),
            None => server_name(host_port)?,
        };
        self.requests.connect(name, tcp).await
    }

    /// The same settings for the pool's scrapers.
    pub fn scrape(&self) -> signals::ScrapeTls {
        signals::ScrapeTls {
            connector: self.scrapes.clone(),
            server_name: self.server_name.clone(),
        }
    }
}

/// The name a replica's certificate must carry: its host.
fn server_name(host_port: &str) -> io::Result<ServerName<'static>> {
    let host = signals::address::host(host_port);
    ServerName::try_from(host.to_owned()).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{host:?} is not a name a certificate can be checked against"),
        )
    })
}

/// Read the section's files (every problem collected, not just the
/// first), then build the two client configurations from them: how the
/// replicas' certificates are checked (the CA file, the system's store, or
/// not at all), the client certificate if any, and the ALPN protocol.
fn build(spec: &UpstreamTls, protocol: Protocol) -> Result<PoolTls, Vec<FileProblem>> {
    let mut problems = Vec::new();
    let mut sources = Vec::new();
    let mut read = |field, path: &str| match files::read(field, path) {
        Ok(bytes) => {
            sources.push(bytes.clone());
            Some(bytes)
        }
        Err(p) => {
            problems.push(p);
            None
        }
    };
    let ca = spec
        .ca_file
        .as_deref()
        .map(|path| (path, read("caFile", path)));
    let pair = match (&spec.cert_file, &spec.key_file) {
        (Some(cert), Some(key)) => Some((
            (cert.as_str(), read("certFile", cert)),
            (key.as_str(), read("keyFile", key)),
        )),
        _ => None,
    };
    let verifier: Option<Arc<dyn ServerCertVerifier>> = if spec.insecure_skip_verify {
        Some(Arc::new(AcceptAnyCertificate(provider())))
    } else {
        None
    };
    let roots = match (&verifier, ca) {
        (Some(_), _) => None,
        (None, Some((_, None))) => None,
        (None, Some((path, Some(bytes)))) => files::roots("caFile", path, &bytes)
            .map_err(|p| problems.push(p))
            .ok(),
        (None, None) => system_roots()
            .map_err(|message| {
                problems.push(FileProblem {
                    field: "caFile",
                    message,
                })
            })
            .ok(),
    };
    let client_cert = match pair {
        Some(((cert_path, Some(cert)), (key_path, Some(key)))) => {
            match files::certified_key(
                &provider(),
                ("certFile", cert_path, &cert),
                ("keyFile", key_path, &key),
            ) {
                Ok(_) => files::certificates("certFile", cert_path, &cert)
                    .ok()
                    .zip(files::private_key("keyFile", key_path, &key).ok()),
                Err(p) => {
                    problems.extend(p);
                    None
                }
            }
        }
        // Whichever file could be read is still checked on its own.
        Some(((cert_path, cert), (key_path, key))) => {
            if let Some(cert) = cert {
                problems.extend(files::certificates("certFile", cert_path, &cert).err());
            }
            if let Some(key) = key {
                problems.extend(files::private_key("keyFile", key_path, &key).err());
            }
            None
        }
        None => None,
    };
    let server_name = match &spec.server_name {
        Some(name) => ServerName::try_from(name.clone())
            .map_err(|_| {
                problems.push(FileProblem {
                    field: "serverName",
                    message: format!("{name:?} is not a DNS name or an IP address"),
                })
            })
            .ok(),
        None => None,
    };
    if !problems.is_empty() {
        return Err(problems);
    }
    let config = |alpn: &[u8]| -> Result<ClientConfig, Vec<FileProblem>> {
        let builder = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .expect("the ring provider supports TLS 1.2 and 1.3");
        let builder = match (&verifier, &roots) {
            (Some(verifier), _) => builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::clone(verifier)),
            (None, Some(roots)) => builder.with_root_certificates(Arc::clone(roots)),
            (None, None) => unreachable!("roots are read unless verification is off"),
        };
        let mut config = match &client_cert {
            Some((chain, key)) => builder
                .with_client_auth_cert(chain.clone(), key.clone_key())
                .map_err(|e| {
                    vec![FileProblem {
                        field: "keyFile",
                        message: format!("cannot be used as a client certificate: {e}"),
                    }]
                })?,
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![alpn.to_vec()];
        Ok(config)
    };
    let alpn: &[u8] = match protocol {
        Protocol::Http1 => b"http/1.1",
        Protocol::H2c => b"h2",
    };
    Ok(PoolTls {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        requests: TlsConnector::from(Arc::new(config(alpn)?)),
        scrapes: TlsConnector::from(Arc::new(config(b"http/1.1")?)),
        server_name,
        source: Source {
            spec: spec.clone(),
            protocol,
            files: sources,
        },
    })
}

/// The system's trust store, read once.
fn system_roots() -> Result<Arc<RootCertStore>, String> {
    static ROOTS: OnceLock<Result<Arc<RootCertStore>, String>> = OnceLock::new();
    ROOTS
        .get_or_init(|| {
            let found = rustls_native_certs::load_native_certs();
            let mut store = RootCertStore::empty();
            store.add_parsable_certificates(found.certs);
            if store.is_empty() {
                let why = found
                    .errors
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ");
                Err(format!(
                    "no CA certificates found in the system's trust store{}; give tls.caFile",
                    if why.is_empty() {
                        String::new()
                    } else {
                        format!(" ({why})")
                    }
                ))
            } else {
                Ok(Arc::new(store))
            }
        })
        .clone()
}

/// `insecureSkipVerify`: any certificate, for any name. The handshake's
/// signatures are still checked, so the peer at least holds the key of the
/// certificate it sent.
#[derive(Debug)]
struct AcceptAnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AcceptAnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// What `serve` would refuse in `pool`'s TLS settings, read from the files
/// as they are now.
pub fn problems(pool: &config::Pool) -> Vec<FileProblem> {
    PoolTls::build_for(pool).err().unwrap_or_default()
}
