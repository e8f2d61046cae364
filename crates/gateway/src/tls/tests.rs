//! The names of a client's verified certificate reach the request
//! handler, over a real TLS listener.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::sync::watch;

use super::server::Acceptor;
use crate::inbound::drain::Drain;
use crate::inbound::server::{self, ConnectionSlots, Request, Timeouts, Workers};
use crate::telemetry::ListenerTlsMetrics;

/// A certificate signed by `ca`, and its key.
fn issue(
    names: &[&str],
    cn: &str,
    usage: ExtendedKeyUsagePurpose,
    ca: &(rcgen::Certificate, KeyPair),
) -> (rcgen::Certificate, KeyPair) {
    let mut params =
        CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>()).unwrap();
    params.distinguished_name.push(DnType::CommonName, cn);
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate().unwrap();
    (params.signed_by(&key, &ca.0, &ca.1).unwrap(), key)
}

fn ca() -> (rcgen::Certificate, KeyPair) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let key = KeyPair::generate().unwrap();
    (params.self_signed(&key).unwrap(), key)
}

#[tokio::test]
async fn the_client_certificates_names_reach_the_handler() {
    let (server_ca, client_ca) = (ca(), ca());
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = issue(
        &["localhost"],
        "gw",
        ExtendedKeyUsagePurpose::ServerAuth,
        &server_ca,
    );
    let path = |name: &str| dir.path().join(name).display().to_string();
    std::fs::write(path("tls.crt"), cert.pem()).unwrap();
    std::fs::write(path("tls.key"), key.serialize_pem()).unwrap();
    std::fs::write(path("ca.crt"), client_ca.0.pem()).unwrap();
    let spec = config::ListenerTls {
        cert_file: path("tls.crt"),
        key_file: path("tls.key"),
        client_ca_file: Some(path("ca.crt")),
        client_auth: config::ClientAuth::Optional,
    };
    let acceptor = Acceptor::start("public", &spec, ListenerTlsMetrics::default()).unwrap();

    let (listener, addr) = server::bind("127.0.0.1:0").await.unwrap();
    let workers = Arc::new(Workers::start(1).unwrap());
    let (_stop, stop_rx) = watch::channel(false);
    let handler = |_, req: Request| async move {
        let names = match &req.client_cert {
            Some(c) => format!("{:?} {:?} {}", c.common_name, c.dns_names, req.scheme()),
            None => format!("none {}", req.scheme()),
        };
        http::Response::new(crate::outbound::response_body::full(Bytes::from(names)))
    };
    let _serving = server::serve(
        listener,
        workers,
        handler,
        stop_rx,
        Arc::new(Drain::new()),
        Timeouts::new(Duration::from_secs(5)),
        ConnectionSlots::new(8, None),
        Some(acceptor),
    );

    let (client_cert, client_key) = issue(
        &["a.example", "b.example"],
        "tenant-a",
        ExtendedKeyUsagePurpose::ClientAuth,
        &client_ca,
    );
    let ask = |with_cert: bool| {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(server_ca.0.der().clone()).unwrap();
        let builder = rustls::ClientConfig::builder_with_provider(super::provider::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots);
        let config = if with_cert {
            builder
                .with_client_auth_cert(
                    vec![CertificateDer::from(client_cert.der().to_vec())],
                    PrivateKeyDer::from_pem_slice(client_key.serialize_pem().as_bytes()).unwrap(),
                )
                .unwrap()
        } else {
            builder.with_no_client_auth()
        };
        async move {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
                .connect(ServerName::try_from("localhost").unwrap(), tcp)
                .await
                .unwrap();
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
                .await
                .unwrap();
            tokio::spawn(conn);
            let req = http::Request::get("/")
                .header("host", "localhost")
                .body(Empty::<Bytes>::new())
                .unwrap();
            let resp = sender.send_request(req).await.unwrap();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            String::from_utf8(body.to_vec()).unwrap()
        }
    };
    assert_eq!(
        ask(true).await,
        r#"Some("tenant-a") ["a.example", "b.example"] https"#
    );
    assert_eq!(ask(false).await, "none https");
}
