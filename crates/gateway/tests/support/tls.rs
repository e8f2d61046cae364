//! TLS for the tests: certificate authorities and certificates made on the
//! fly (rcgen; RSA keys from `rsa`, which ring cannot generate), the files
//! a listener reads, and clients that speak HTTP/1.1 or HTTP/2 over TLS
//! with exactly the versions, ALPN and client certificate a test asks for.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, pem::PemObject};
use rustls::{ClientConfig, RootCertStore, ServerConfig, SupportedProtocolVersion};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The kind of key a certificate is made with, and how its PEM is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    /// ECDSA P-256, PKCS#8 (`BEGIN PRIVATE KEY`).
    EcdsaPkcs8,
    /// ECDSA P-256, SEC1 (`BEGIN EC PRIVATE KEY`).
    EcdsaSec1,
    /// RSA 2048, PKCS#8.
    RsaPkcs8,
    /// RSA 2048, PKCS#1 (`BEGIN RSA PRIVATE KEY`).
    RsaPkcs1,
}

/// One RSA key for the whole run: generating one takes a while.
fn rsa_key() -> &'static rsa::PrivateKey {
    static KEY: OnceLock<rsa::PrivateKey> = OnceLock::new();
    KEY.get_or_init(|| rsa::PrivateKey::new(&mut getrandom::SysRng, 2048).unwrap())
}

/// A key pair rcgen signs with, and its PEM as written to a key file.
fn key_pair(kind: Key) -> (KeyPair, String) {
    use rsa::pkcs1::EncodeRsaPrivateKey;
    use rsa::pkcs8::{EncodePrivateKey, LineEnding};
    match kind {
        Key::EcdsaPkcs8 => {
            let pair = KeyPair::generate().unwrap();
            let pem = pair.serialize_pem();
            (pair, pem)
        }
        Key::EcdsaSec1 => {
            use p256::pkcs8::DecodePrivateKey;
            let pair = KeyPair::generate().unwrap();
            let secret = p256::SecretKey::from_pkcs8_der(&pair.serialize_der()).unwrap();
            let pem = secret.to_sec1_pem(LineEnding::LF).unwrap().to_string();
            (pair, pem)
        }
        Key::RsaPkcs8 | Key::RsaPkcs1 => {
            let key = rsa_key();
            let der = key.to_pkcs8_der().unwrap();
            let pair = KeyPair::from_pkcs8_der_and_sign_algo(
                &der.as_bytes().into(),
                &rcgen::PKCS_RSA_SHA256,
            )
            .unwrap();
            let pem = if kind == Key::RsaPkcs1 {
                key.to_pkcs1_pem(LineEnding::LF).unwrap().to_string()
            } else {
                key.to_pkcs8_pem(LineEnding::LF).unwrap().to_string()
            };
            (pair, pem)
        }
    }
}

/// A certificate authority.
pub struct Ca {
    issuer: rcgen::Certificate,
    key: KeyPair,
    pub pem: String,
}

/// A certificate and its key, as PEM files hold them.
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: CertificateDer<'static>,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        let issuer = params.self_signed(&key).unwrap();
        Self {
            pem: issuer.pem(),
            issuer,
            key,
        }
    }

    /// A server certificate for `names` (DNS names or IP addresses).
    pub fn server(&self, names: &[&str], kind: Key) -> Issued {
        self.issue(names, None, ExtendedKeyUsagePurpose::ServerAuth, kind)
    }

    /// A client certificate with common name `cn` and DNS name `dns`.
    pub fn client(&self, cn: &str, dns: &str) -> Issued {
        self.issue(
            &[dns],
            Some(cn),
            ExtendedKeyUsagePurpose::ClientAuth,
            Key::EcdsaPkcs8,
        )
    }

    fn issue(
        &self,
        names: &[&str],
        cn: Option<&str>,
        usage: ExtendedKeyUsagePurpose,
        kind: Key,
    ) -> Issued {
        let names: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        if let Some(cn) = cn {
            params.distinguished_name.push(DnType::CommonName, cn);
        }
        params.extended_key_usages = vec![usage];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let (pair, key_pem) = key_pair(kind);
        let cert = params.signed_by(&pair, &self.issuer, &self.key).unwrap();
        Issued {
            cert_pem: cert.pem(),
            key_pem,
            der: cert.der().clone(),
        }
    }

    pub fn roots(&self) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        roots.add(self.issuer.der().clone()).unwrap();
        roots
    }
}

impl Issued {
    pub fn chain(&self) -> Vec<CertificateDer<'static>> {
        vec![self.der.clone()]
    }

    pub fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes()).unwrap()
    }
}

/// A listener's files, in a directory of their own.
pub struct Files {
    _dir: tempfile::TempDir,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

impl Files {
    pub fn new(issued: &Issued) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let files = Self {
            cert: dir.path().join("tls.crt"),
            key: dir.path().join("tls.key"),
            ca: dir.path().join("ca.crt"),
            _dir: dir,
        };
        files.write(issued);
        files
    }

    /// Rewrite the certificate and key in place, as cert-manager does.
    pub fn write(&self, issued: &Issued) {
        std::fs::write(&self.cert, &issued.cert_pem).unwrap();
        std::fs::write(&self.key, &issued.key_pem).unwrap();
    }

    pub fn write_ca(&self, ca: &Ca) {
        std::fs::write(&self.ca, &ca.pem).unwrap();
    }

    /// The listener section naming these files.
    pub fn listener(&self) -> config::ListenerTls {
        config::ListenerTls {
            cert_file: self.cert.display().to_string(),
            key_file: self.key.display().to_string(),
            client_ca_file: None,
            client_auth: config::ClientAuth::Require,
        }
    }

    pub fn with_client_ca(&self, auth: config::ClientAuth) -> config::ListenerTls {
        config::ListenerTls {
            client_ca_file: Some(self.ca.display().to_string()),
            client_auth: auth,
            ..self.listener()
        }
    }
}

/// What a test client offers.
pub struct Client {
    pub roots: RootCertStore,
    pub versions: Vec<&'static SupportedProtocolVersion>,
    pub alpn: Vec<&'static [u8]>,
    pub cert: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
}

impl Client {
    /// TLS 1.2 and 1.3, ALPN `http/1.1`, no client certificate.
    pub fn new(ca: &Ca) -> Self {
        Self {
            roots: ca.roots(),
            versions: vec![&rustls::version::TLS13, &rustls::version::TLS12],
            alpn: vec![b"http/1.1"],
            cert: None,
        }
    }

    pub fn alpn(mut self, alpn: &[&'static [u8]]) -> Self {
        self.alpn = alpn.to_vec();
        self
    }

    pub fn versions(mut self, versions: &[&'static SupportedProtocolVersion]) -> Self {
        self.versions = versions.to_vec();
        self
    }

    pub fn cert(mut self, issued: &Issued) -> Self {
        self.cert = Some((issued.chain(), issued.key()));
        self
    }

    pub fn config(&self) -> Arc<ClientConfig> {
        let builder = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(&self.versions)
            .unwrap()
            .with_root_certificates(self.roots.clone());
        let mut config = match &self.cert {
            Some((chain, key)) => builder
                .with_client_auth_cert(chain.clone(), key.clone_key())
                .unwrap(),
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = self.alpn.iter().map(|p| p.to_vec()).collect();
        Arc::new(config)
    }

    /// A TLS connection to `addr`, checked against the name `localhost`.
    pub async fn connect(
        &self,
        addr: std::net::SocketAddr,
    ) -> std::io::Result<TlsStream<TcpStream>> {
        let tcp = TcpStream::connect(addr).await?;
        tokio_rustls::TlsConnector::from(self.config())
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
    }
}

/// The certificate `stream`'s server sent.
pub fn served(stream: &TlsStream<TcpStream>) -> CertificateDer<'static> {
    stream.get_ref().1.peer_certificates().unwrap()[0].clone()
}

/// An HTTP connection over `stream`: HTTP/2 when ALPN chose `h2`.
pub enum Http {
    H1(http1::SendRequest<Full<Bytes>>),
    H2(http2::SendRequest<Full<Bytes>>),
}

impl Http {
    pub async fn over(stream: TlsStream<TcpStream>) -> Self {
        let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2");
        let io = TokioIo::new(stream);
        if h2 {
            let (sender, conn) = http2::handshake(TokioExecutor::new(), io).await.unwrap();
            tokio::spawn(conn);
            Http::H2(sender)
        } else {
            let (sender, conn) = http1::handshake(io).await.unwrap();
            tokio::spawn(conn);
            Http::H1(sender)
        }
    }

    /// A chat completion for model `m`: its status, version and body.
    pub async fn chat(&mut self) -> hyper::Result<(StatusCode, http::Version, String)> {
        let body = r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}]}"#;
        let mut req = Request::post(super::CHAT)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .unwrap();
        let resp = match self {
            Http::H1(sender) => {
                req.headers_mut()
                    .insert("host", http::HeaderValue::from_static("localhost"));
                sender.ready().await?;
                sender.send_request(req).await?
            }
            Http::H2(sender) => {
                *req.uri_mut() = format!("https://localhost{}", super::CHAT).parse().unwrap();
                sender.ready().await?;
                sender.send_request(req).await?
            }
        };
        let (status, version) = (resp.status(), resp.version());
        let body = resp.into_body().collect().await?.to_bytes();
        Ok((status, version, String::from_utf8_lossy(&body).into_owned()))
    }
}

/// A server configuration for a replica behind TLS: `issued`, ALPN `h2`
/// and `http/1.1`, and client certificates from `clients` required when
/// given.
pub fn replica_config(issued: &Issued, clients: Option<&Ca>) -> Arc<ServerConfig> {
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = match clients {
        Some(ca) => builder.with_client_cert_verifier(
            rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(ca.roots()),
                provider(),
            )
            .build()
            .unwrap(),
        ),
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(issued.chain(), issued.key())
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Arc::new(config)
}
