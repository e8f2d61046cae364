//! TLS on a listener: the server configuration built from the listener's
//! files, the handshake (on the worker that will serve the connection),
//! and putting changed files in force while the listener runs.
//!
//! - TLS 1.3 and 1.2, ALPN `h2` and `http/1.1`: hyper's automatic
//!   connection then serves whichever the client speaks, as on a plain
//!   listener.
//! - The certificate and key are swapped in the [`Resolver`] when their
//!   files change; the session cache survives, open connections are not
//!   touched.
//! - A change of the client CA file builds a new server configuration
//!   (a new verifier) with a fresh session cache: a session resumed from
//!   before the change would otherwise skip the new CAs.
//! - New files that cannot be used (unparsable, a key that is not the
//!   certificate's) are logged at `warn` and counted, and the files in
//!   force stay.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use config::{ClientAuth, ListenerTls};
use parking_lot::Mutex;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls::sign::CertifiedKey;
use rustls::{ServerConfig, version};
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

use super::files::{self, FileProblem};
use super::identity::{self, ClientCertificate};
use super::provider::provider;
use super::reload::{self, Contents, Resolver};
use crate::file_watch::FileWatch;
use crate::telemetry::ListenerTlsMetrics;

/// ALPN protocols offered to clients, preferred first.
const ALPN: [&[u8]; 2] = [b"h2", b"http/1.1"];

/// A listener's TLS: what each new connection shakes hands with.
pub struct Acceptor {
    config: ArcSwap<ServerConfig>,
    certs: Arc<Resolver>,
    /// The files in force, as they were read.
    loaded: Mutex<Contents>,
    listener: String,
    metrics: ListenerTlsMetrics,
}

/// A connection after its handshake.
pub struct Accepted {
    pub stream: TlsStream<TcpStream>,
    /// The client's certificate, verified against the client CAs.
    pub client_cert: Option<Arc<ClientCertificate>>,
}

/// The files of a listener's TLS section, in the order they are read.
fn paths(spec: &ListenerTls) -> Vec<String> {
    let mut paths = vec![spec.cert_file.clone(), spec.key_file.clone()];
    paths.extend(spec.client_ca_file.clone());
    paths
}

impl Acceptor {
    /// Read the listener's files and watch them from now on, with a task
    /// on the calling runtime that ends when the acceptor is dropped.
    pub fn start(
        listener: &str,
        spec: &ListenerTls,
        metrics: ListenerTlsMetrics,
    ) -> anyhow::Result<Arc<Self>> {
        let paths = paths(spec);
        let (watch, read) = FileWatch::start(&paths);
        let contents = reload::contents(&paths, read);
        let (key, verifier) = load(spec, &contents).map_err(|problems| {
            anyhow::anyhow!(
                "listener {listener:?}: TLS: {}",
                FileProblem::joined(&problems)
            )
        })?;
        set_expiry(&metrics, &key);
        let certs = Arc::new(Resolver::new(key));
        let acceptor = Arc::new(Self {
            config: ArcSwap::from_pointee(server_config(&certs, verifier)),
            certs,
            loaded: Mutex::new(contents.clone()),
            listener: listener.to_owned(),
            metrics,
        });
        let spec = spec.clone();
        watch.spawn(&acceptor, move |acceptor, read| {
            reload_changed(acceptor, &spec, &reload::contents(&paths, read));
        });
        Ok(acceptor)
    }

    /// The TLS handshake on `stream`, within `timeout`. Failures are
    /// counted, running out of time included.
    pub async fn accept(&self, stream: TcpStream, timeout: Duration) -> io::Result<Accepted> {
        let config = self.config.load_full();
        let shaken = tokio::time::timeout(timeout, TlsAcceptor::from(config).accept(stream))
            .await
            .unwrap_or_else(|_| {
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("no handshake within {timeout:?}"),
                ))
            });
        let stream = match shaken {
            Ok(stream) => stream,
            Err(e) => {
                self.metrics.handshake_failures.inc();
                return Err(e);
            }
        };
        let client_cert = stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .and_then(|leaf| ClientCertificate::from_der(leaf))
            .map(Arc::new);
        Ok(Accepted {
            stream,
            client_cert,
        })
    }
}

/// Put changed files in force, or keep the old ones and say why.
fn reload_changed(acceptor: &Acceptor, spec: &ListenerTls, new: &Contents) {
    let listener = acceptor.listener.as_str();
    match load(spec, new) {
        Ok((key, verifier)) => {
            let mut loaded = acceptor.loaded.lock();
            let pair_changed = loaded[..2] != new[..2];
            let ca_changed = loaded.get(2) != new.get(2);
            *loaded = new.clone();
            drop(loaded);
            if pair_changed {
                set_expiry(&acceptor.metrics, &key);
                acceptor.certs.set(key);
            }
            if ca_changed {
                acceptor
                    .config
                    .store(Arc::new(server_config(&acceptor.certs, verifier)));
            }
            acceptor.metrics.loaded.inc();
            tracing::info!(
                listener,
                certificate = pair_changed,
                client_ca = ca_changed,
                "TLS files changed: new handshakes use them"
            );
        }
        Err(problems) => {
            acceptor.metrics.failed.inc();
            tracing::warn!(
                listener,
                problems = %FileProblem::joined(&problems),
                "TLS files changed but cannot be used; the ones in force stay"
            );
        }
    }
}

fn set_expiry(metrics: &ListenerTlsMetrics, key: &CertifiedKey) {
    if let Some(not_after) = key.cert.first().and_then(|c| identity::not_after(c)) {
        metrics.expiry.set(not_after);
    }
}

/// The certificate with its key, and the client verifier.
type Loaded = (CertifiedKey, Option<Arc<dyn ClientCertVerifier>>);

/// [`Loaded`] from one read of the listener's files ([`paths`] order).
fn load(spec: &ListenerTls, contents: &Contents) -> Result<Loaded, Vec<FileProblem>> {
    let file = |field: &'static str, i: usize| -> Result<&[u8], FileProblem> {
        contents[i].as_deref().map_err(|reason| FileProblem {
            field,
            message: reason.clone(),
        })
    };
    let mut problems = Vec::new();
    let key = match (file("certFile", 0), file("keyFile", 1)) {
        (Ok(cert), Ok(key)) => files::certified_key(
            &provider(),
            ("certFile", &spec.cert_file, cert),
            ("keyFile", &spec.key_file, key),
        )
        .map_err(|p| problems.extend(p))
        .ok(),
        // Whichever file could be read is still checked on its own.
        (cert, key) => {
            match cert {
                Ok(bytes) => {
                    problems.extend(files::certificates("certFile", &spec.cert_file, bytes).err())
                }
                Err(p) => problems.push(p),
            }
            match key {
                Ok(bytes) => {
                    problems.extend(files::private_key("keyFile", &spec.key_file, bytes).err())
                }
                Err(p) => problems.push(p),
            }
            None
        }
    };
    let verifier = match &spec.client_ca_file {
        None => None,
        Some(path) => file("clientCaFile", 2)
            .and_then(|bytes| client_verifier(path, bytes, spec.client_auth))
            .map_err(|p| problems.push(p))
            .ok(),
    };
    match key {
        Some(key) if problems.is_empty() => Ok((key, verifier)),
        _ => Err(problems),
    }
}

/// Client certificates are checked against the CAs in `bytes`; a client
/// without one is refused in the handshake (`require`) or let through
/// (`optional`).
fn client_verifier(
    path: &str,
    bytes: &[u8],
    auth: ClientAuth,
) -> Result<Arc<dyn ClientCertVerifier>, FileProblem> {
    let roots = files::roots("clientCaFile", path, bytes)?;
    let builder = WebPkiClientVerifier::builder_with_provider(roots, provider());
    let builder = match auth {
        ClientAuth::Require => builder,
        ClientAuth::Optional => builder.allow_unauthenticated(),
    };
    builder.build().map_err(|e| FileProblem {
        field: "clientCaFile",
        message: format!("{path:?} cannot verify client certificates: {e}"),
    })
}

fn server_config(
    certs: &Arc<Resolver>,
    verifier: Option<Arc<dyn ClientCertVerifier>>,
) -> ServerConfig {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&version::TLS13, &version::TLS12])
        .expect("the ring provider supports TLS 1.2 and 1.3");
    let builder = match verifier {
        Some(verifier) => builder.with_client_cert_verifier(verifier),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder.with_cert_resolver(Arc::clone(certs) as _);
    config.alpn_protocols = ALPN.iter().map(|p| p.to_vec()).collect();
    config
}

/// What `serve` would refuse in a listener's TLS section, read from the
/// files as they are now.
pub fn problems(spec: &ListenerTls) -> Vec<FileProblem> {
    load(spec, &reload::read_blocking(&paths(spec)))
        .err()
        .unwrap_or_default()
}
