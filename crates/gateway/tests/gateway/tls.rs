//! TLS end to end, with real handshakes: listeners (HTTP/1.1 and HTTP/2
//! by ALPN, TLS 1.2 and 1.3, RSA and ECDSA keys in every PEM format),
//! certificates replaced while the gateway runs, client certificates, and
//! `https://` replicas. Certificates are made by each test.

use std::time::Duration;

use config::ClientAuth;
use gateway::Gateway;
use http::StatusCode;
use serde_json::Value;
use tokio::io::AsyncReadExt;

use crate::support::tls::{Ca, Client, Files, Http, Key, replica_config, served};
use crate::support::{
    Behaviour, CHAT, FakeReplica, admin_get, client, config, plain_pool, poll_until, sample,
    until_debug_pools, within,
};

const H2: &[u8] = b"h2";
const HTTP1: &[u8] = b"http/1.1";

/// A gateway with the admin listener, its public listener under `tls`, in
/// front of `pool`.
async fn gateway(tls: config::ListenerTls, pool: &str) -> Gateway {
    let mut cfg = config("  admin: {address: \"127.0.0.1:0\"}\n", pool);
    cfg.spec.listeners[0].tls = Some(tls);
    Gateway::start(&cfg).await.unwrap()
}

/// A gateway over TLS with a certificate for `localhost` from `ca`, in
/// front of one plain replica.
async fn behind_tls(ca: &Ca, replica: &FakeReplica) -> (Gateway, Files) {
    let files = Files::new(&ca.server(&["localhost"], Key::EcdsaPkcs8));
    let gw = gateway(
        files.listener(),
        &plain_pool(&[&replica.addr.to_string()], ""),
    )
    .await;
    (gw, files)
}

/// The value of the series `series` on the admin listener's `/metrics`.
async fn metric(gw: &Gateway, series: &str) -> Option<f64> {
    sample(&admin_get(gw, "/metrics").await, series)
}

#[tokio::test]
async fn http1_and_h2_over_tls_reach_a_replica() {
    let replica = FakeReplica::start("r", Behaviour::Echo).await;
    let ca = Ca::new("ca");
    let (gw, _files) = behind_tls(&ca, &replica).await;

    for (alpn, version) in [(HTTP1, http::Version::HTTP_11), (H2, http::Version::HTTP_2)] {
        let stream = Client::new(&ca)
            .alpn(&[alpn])
            .connect(gw.addr())
            .await
            .unwrap();
        assert_eq!(stream.get_ref().1.alpn_protocol(), Some(alpn));
        let (status, got, body) = Http::over(stream).await.chat().await.unwrap();
        assert_eq!((status, got), (StatusCode::OK, version), "{body}");
        assert!(body.contains(r#""replica":"r""#), "{body}");
    }
    // The replica is told the client came over https.
    let received = replica.received();
    assert_eq!(received.len(), 2);
    for r in received {
        let forwarded = r.headers["forwarded"].to_str().unwrap();
        assert!(forwarded.ends_with("proto=https"), "{forwarded}");
    }
}

#[tokio::test]
async fn tls_1_2_only_and_1_3_only_clients_are_served() {
    let replica = FakeReplica::start("r", Behaviour::Echo).await;
    let ca = Ca::new("ca");
    let (gw, _files) = behind_tls(&ca, &replica).await;
    for version in [&rustls::version::TLS12, &rustls::version::TLS13] {
        let stream = Client::new(&ca)
            .versions(&[version])
            .connect(gw.addr())
            .await
            .unwrap();
        assert_eq!(stream.get_ref().1.protocol_version(), Some(version.version));
        let (status, ..) = Http::over(stream).await.chat().await.unwrap();
        assert_eq!(status, StatusCode::OK);
    }
}

#[tokio::test]
async fn rsa_and_ecdsa_keys_in_every_pem_format_are_served() {
    let replica = FakeReplica::start("r", Behaviour::Echo).await;
    let ca = Ca::new("ca");
    for kind in [
        Key::EcdsaPkcs8,
        Key::EcdsaSec1,
        Key::RsaPkcs8,
        Key::RsaPkcs1,
    ] {
        let issued = ca.server(&["localhost"], kind);
        let files = Files::new(&issued);
        let gw = gateway(
            files.listener(),
            &plain_pool(&[&replica.addr.to_string()], ""),
        )
        .await;
        let stream = Client::new(&ca).connect(gw.addr()).await.unwrap();
        assert_eq!(served(&stream), issued.der, "{kind:?}");
        let (status, ..) = Http::over(stream).await.chat().await.unwrap();
        assert_eq!(status, StatusCode::OK, "{kind:?}");
        gw.shutdown().await;
    }
}

#[tokio::test]
async fn a_new_certificate_is_served_to_new_connections_while_open_ones_go_on() {
    let replica = FakeReplica::start("r", Behaviour::Echo).await;
    let ca = Ca::new("ca");
    let first = ca.server(&["localhost"], Key::EcdsaPkcs8);
    let files = Files::new(&first);
    let gw = gateway(
        files.listener(),
        &plain_pool(&[&replica.addr.to_string()], ""),
    )
    .await;
    let tls = Client::new(&ca);
    let stream = tls.connect(gw.addr()).await.unwrap();
    assert_eq!(served(&stream), first.der);
    let mut open = Http::over(stream).await;
    assert_eq!(open.chat().await.unwrap().0, StatusCode::OK);

    // Rewritten in place, as cert-manager does; an RSA key this time.
    let second = ca.server(&["localhost"], Key::RsaPkcs8);
    files.write(&second);
    poll_until(
        Duration::from_secs(20),
        "the new certificate served",
        || async {
            let stream = tls.connect(gw.addr()).await.map_err(|e| e.to_string())?;
            if served(&stream) == second.der {
                Ok(())
            } else {
                Err("the first certificate".to_owned())
            }
        },
    )
    .await;
    // The connection made before goes on.
    assert_eq!(open.chat().await.unwrap().0, StatusCode::OK);
    let loaded = r#"infergate_tls_certificate_reloads_total{listener="public",outcome="loaded"}"#;
    assert!(metric(&gw, loaded).await >= Some(1.0));
}

#[tokio::test]
async fn unusable_new_files_leave_the_certificate_in_force() {
    let replica = FakeReplica::start("r", Behaviour::Echo).await;
    let ca = Ca::new("ca");
    let first = ca.server(&["localhost"], Key::EcdsaPkcs8);
    let files = Files::new(&first);
    let gw = gateway(
        files.listener(),
        &plain_pool(&[&replica.addr.to_string()], ""),
    )
    .await;
    let failed = r#"infergate_tls_certificate_reloads_total{listener="public",outcome="failed"}"#;
    assert_eq!(metric(&gw, failed).await, Some(0.0));

    std::fs::write(&files.cert, "-----BEGIN CERTIFICATE-----\ngarbage\n").unwrap();
    poll_until(
        Duration::from_secs(20),
        "the corrupt file refused",
        || async {
            match metric(&gw, failed).await {
                Some(n) if n >= 1.0 => Ok(()),
                n => Err(format!("{n:?}")),
            }
        },
    )
    .await;
    let stream = Client::new(&ca).connect(gw.addr()).await.unwrap();
    assert_eq!(served(&stream), first.der, "the old certificate stays");
    assert_eq!(
        Http::over(stream).await.chat().await.unwrap().0,
        StatusCode::OK
    );

    // A key that is not the certificate's is refused the same way.
    let other = ca.server(&["localhost"], Key::EcdsaPkcs8);
    std::fs::write(
        &files.cert,
        &ca.server(&["localhost"], Key::EcdsaPkcs8).cert_pem,
    )
    .unwrap();
    std::fs::write(&files.key, &other.key_pem).unwrap();
    poll_until(
        Duration::from_secs(20),
        "the mismatched key refused",
        || async {
            match metric(&gw, failed).await {
                Some(n) if n >= 2.0 => Ok(()),
                n => Err(format!("{n:?}")),
            }
        },
    )
    .await;
    let stream = Client::new(&ca).connect(gw.addr()).await.unwrap();
    assert_eq!(served(&stream), first.der, "the old certificate stays");
}

#[tokio::test]
async fn a_client_that_never_finishes_the_handshake_is_closed_without_holding_others_up() {
    let replica = FakeReplica::start("r", Behaviour::Echo).await;
    let ca = Ca::new("ca");
    let files = Files::new(&ca.server(&["localhost"], Key::EcdsaPkcs8));
    let mut cfg = config(
        "  admin: {address: \"127.0.0.1:0\"}\n  limits: {headerTimeout: 3s}\n",
        &plain_pool(&[&replica.addr.to_string()], ""),
    );
    cfg.spec.listeners[0].tls = Some(files.listener());
    let gw = Gateway::start(&cfg).await.unwrap();

    // More silent clients than there are workers.
    let started = tokio::time::Instant::now();
    let mut silent = Vec::new();
    for _ in 0..8 {
        silent.push(tokio::net::TcpStream::connect(gw.addr()).await.unwrap());
    }
    // Accepting goes on meanwhile, and so do other handshakes: were the
    // handshakes made one after the other, this one would wait 8 × 3 s.
    let served_meanwhile = within(Duration::from_secs(2), "a handshake meanwhile", async {
        let stream = Client::new(&ca).connect(gw.addr()).await.unwrap();
        Http::over(stream).await.chat().await.unwrap().0
    })
    .await;
    assert_eq!(served_meanwhile, StatusCode::OK);
    for mut conn in silent {
        let mut buf = [0; 16];
        let read = within(
            Duration::from_secs(10),
            "the silent client closed",
            conn.read(&mut buf),
        )
        .await;
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    }
    assert!(
        started.elapsed() >= Duration::from_millis(2900),
        "closed by the header timeout"
    );
    let failures = r#"infergate_tls_handshake_failures_total{listener="public"}"#;
    assert_eq!(
        metric(&gw, failures).await,
        Some(8.0),
        "each silent client counted"
    );
}

/// A gateway asking for client certificates from `clients`, `auth`.
async fn asking_for_certificates(
    ca: &Ca,
    clients: &Ca,
    auth: ClientAuth,
    replica: &FakeReplica,
) -> (Gateway, Files) {
    let files = Files::new(&ca.server(&["localhost"], Key::EcdsaPkcs8));
    files.write_ca(clients);
    let gw = gateway(
        files.with_client_ca(auth),
        &plain_pool(&[&replica.addr.to_string()], ""),
    )
    .await;
    (gw, files)
}

/// Whether a request from `client` gets an answer (with TLS 1.3 a refused
/// client certificate shows only once the client reads).
async fn answered(gw: &Gateway, client: Client) -> bool {
    let Ok(stream) = client.connect(gw.addr()).await else {
        return false;
    };
    matches!(
        Http::over(stream).await.chat().await,
        Ok((StatusCode::OK, ..))
    )
}

#[tokio::test]
async fn required_client_certificates_must_come_from_the_client_ca() {
    let replica = FakeReplica::start("r", Behaviour::Echo).await;
    let (ca, clients, strangers) = (Ca::new("ca"), Ca::new("clients"), Ca::new("strangers"));
    let (gw, _files) = asking_for_certificates(&ca, &clients, ClientAuth::Require, &replica).await;

    assert!(!answered(&gw, Client::new(&ca)).await, "no certificate");
    let foreign = strangers.client("tenant-a", "a.example");
    assert!(
        !answered(&gw, Client::new(&ca).cert(&foreign)).await,
        "another CA's"
    );
    let ours = clients.client("tenant-a", "a.example");
    assert!(
        answered(&gw, Client::new(&ca).cert(&ours)).await,
        "the client CA's"
    );
    assert_eq!(replica.count(), 1);
    let failures = r#"infergate_tls_handshake_failures_total{listener="public"}"#;
    assert!(metric(&gw, failures).await >= Some(2.0));
}

#[tokio::test]
async fn optional_client_certificates_may_be_left_out_but_not_forged() {
    let replica = FakeReplica::start("r", Behaviour::Echo).await;
    let (ca, clients, strangers) = (Ca::new("ca"), Ca::new("clients"), Ca::new("strangers"));
    let (gw, _files) = asking_for_certificates(&ca, &clients, ClientAuth::Optional, &replica).await;

    assert!(answered(&gw, Client::new(&ca)).await, "no certificate");
    let ours = clients.client("tenant-a", "a.example");
    assert!(
        answered(&gw, Client::new(&ca).cert(&ours)).await,
        "the client CA's"
    );
    let foreign = strangers.client("tenant-a", "a.example");
    assert!(
        !answered(&gw, Client::new(&ca).cert(&foreign)).await,
        "another CA's"
    );
}

/// With `auth.clientCertificates`, a verified client certificate is the
/// caller's credential: its common name is the tenant (passed on to the
/// replica), and a client without one is refused with 401.
#[tokio::test]
async fn a_client_certificate_names_the_callers_tenant() {
    let replica = FakeReplica::start("r", Behaviour::Echo).await;
    let (ca, clients) = (Ca::new("ca"), Ca::new("clients"));
    let files = Files::new(&ca.server(&["localhost"], Key::EcdsaPkcs8));
    files.write_ca(&clients);
    let mut cfg = config("", &plain_pool(&[&replica.addr.to_string()], ""));
    cfg.spec.listeners[0].tls = Some(files.with_client_ca(ClientAuth::Optional));
    cfg.spec.auth = Some(config::Auth {
        client_certificates: Some(config::ClientCertificates {
            tenant_from: config::CertificateName::CommonName,
        }),
        tenant_header: Some("x-tenant".to_owned()),
        ..Default::default()
    });
    let cfg = config::validated(cfg).unwrap();
    let gw = Gateway::start(&cfg).await.unwrap();

    let ours = clients.client("team-a", "a.example");
    assert!(answered(&gw, Client::new(&ca).cert(&ours)).await);
    assert_eq!(replica.received()[0].headers["x-tenant"], "team-a");

    let stream = Client::new(&ca).connect(gw.addr()).await.unwrap();
    let (status, _, body) = Http::over(stream).await.chat().await.unwrap();
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(replica.count(), 1);
}

#[tokio::test]
async fn a_new_client_ca_is_put_in_force() {
    let replica = FakeReplica::start("r", Behaviour::Echo).await;
    let (ca, old, new) = (Ca::new("ca"), Ca::new("old"), Ca::new("new"));
    let (gw, files) = asking_for_certificates(&ca, &old, ClientAuth::Require, &replica).await;
    let from_new = new.client("tenant-a", "a.example");
    assert!(!answered(&gw, Client::new(&ca).cert(&from_new)).await);

    files.write_ca(&new);
    poll_until(
        Duration::from_secs(20),
        "the new client CA in force",
        || async {
            if answered(&gw, Client::new(&ca).cert(&from_new)).await {
                Ok(())
            } else {
                Err("refused".to_owned())
            }
        },
    )
    .await;
    let from_old = old.client("tenant-a", "a.example");
    assert!(
        !answered(&gw, Client::new(&ca).cert(&from_old)).await,
        "the old CA is gone"
    );
}

/// A pool `p` of `https://` replicas with `tls` (YAML flow mapping) and
/// `protocol`.
fn https_pool(replicas: &[&FakeReplica], protocol: &str, tls: &str) -> String {
    let endpoints: Vec<String> = replicas
        .iter()
        .map(|r| format!("\"{}\"", r.https()))
        .collect();
    format!(
        "    - {{name: p, engine: none, models: [m], protocol: {protocol}, endpoints: [{}], \
         scheduling: {{policy: round-robin}}, retry: {{maxRetries: 0}}, tls: {tls}}}\n",
        endpoints.join(", ")
    )
}

/// A CA file for a pool, in a directory that lives as long as it.
struct CaFile {
    dir: tempfile::TempDir,
}

impl CaFile {
    fn new(ca: &Ca) -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("ca.crt"), &ca.pem).unwrap();
        Self { dir }
    }

    fn path(&self) -> String {
        self.dir.path().join("ca.crt").display().to_string()
    }
}

async fn chat_plain(gw: &Gateway) -> (StatusCode, Value) {
    let resp = client()
        .post(format!("http://{}{CHAT}", gw.addr()))
        .header("content-type", "application/json")
        .body(r#"{"model": "m", "messages": []}"#)
        .send()
        .await
        .unwrap();
    (resp.status(), resp.json().await.unwrap())
}

#[tokio::test]
async fn https_replicas_are_checked_against_the_pools_ca_file() {
    let ca = Ca::new("replicas");
    let replica = FakeReplica::start_tls(
        "r",
        Behaviour::Echo,
        replica_config(&ca.server(&["127.0.0.1"], Key::EcdsaPkcs8), None),
    )
    .await;
    let ca_file = CaFile::new(&ca);
    for protocol in ["http1", "h2c"] {
        let pool = https_pool(
            &[&replica],
            protocol,
            &format!("{{caFile: {}}}", ca_file.path()),
        );
        let gw = Gateway::start(&config("", &pool)).await.unwrap();
        let (status, body) = chat_plain(&gw).await;
        assert_eq!(status, StatusCode::OK, "{protocol}: {body}");
        assert_eq!(body["replica"], "r");
        gw.shutdown().await;
    }
    let versions: Vec<_> = replica.received().iter().map(|r| r.version).collect();
    assert_eq!(versions, [http::Version::HTTP_11, http::Version::HTTP_2]);
    let host = replica.received()[0].headers["host"]
        .to_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        host,
        replica.addr.to_string(),
        "Host is host:port, no scheme"
    );
}

#[tokio::test]
async fn a_replica_whose_certificate_the_pool_does_not_trust_is_a_502() {
    let replica = FakeReplica::start_tls(
        "r",
        Behaviour::Echo,
        replica_config(
            &Ca::new("replicas").server(&["127.0.0.1"], Key::EcdsaPkcs8),
            None,
        ),
    )
    .await;
    let other = CaFile::new(&Ca::new("another"));
    let pool = https_pool(
        &[&replica],
        "http1",
        &format!("{{caFile: {}}}", other.path()),
    );
    let gw = Gateway::start(&config("", &pool)).await.unwrap();
    let (status, body) = chat_plain(&gw).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "{body}");
    assert_eq!(body["error"]["type"], "upstream_error", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("TLS handshake"), "{message}");
    assert!(message.contains("UnknownIssuer"), "{message}");
    assert_eq!(replica.count(), 0);
}

#[tokio::test]
async fn server_name_names_the_certificate_a_replica_must_have() {
    let ca = Ca::new("replicas");
    let replica = FakeReplica::start_tls(
        "r",
        Behaviour::Echo,
        replica_config(&ca.server(&["vllm.internal"], Key::EcdsaPkcs8), None),
    )
    .await;
    let ca_file = CaFile::new(&ca);
    let without = https_pool(
        &[&replica],
        "http1",
        &format!("{{caFile: {}}}", ca_file.path()),
    );
    let gw = Gateway::start(&config("", &without)).await.unwrap();
    let (status, body) = chat_plain(&gw).await;
    assert_eq!(
        status,
        StatusCode::BAD_GATEWAY,
        "the address is not the name: {body}"
    );

    // Applied as a reload would: the new setting holds for new connections.
    let with = https_pool(
        &[&replica],
        "http1",
        &format!("{{caFile: {}, serverName: vllm.internal}}", ca_file.path()),
    );
    gw.apply(&config("", &with)).unwrap();
    let (status, body) = chat_plain(&gw).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn insecure_skip_verify_accepts_any_certificate() {
    let replica = FakeReplica::start_tls(
        "r",
        Behaviour::Echo,
        replica_config(
            &Ca::new("unknown").server(&["elsewhere"], Key::EcdsaPkcs8),
            None,
        ),
    )
    .await;
    let pool = https_pool(&[&replica], "http1", "{insecureSkipVerify: true}");
    let gw = Gateway::start(&config("", &pool)).await.unwrap();
    let (status, body) = chat_plain(&gw).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn a_replica_that_asks_for_a_client_certificate_gets_the_pools() {
    let (ca, clients) = (Ca::new("replicas"), Ca::new("gateways"));
    let replica = FakeReplica::start_tls(
        "r",
        Behaviour::Echo,
        replica_config(&ca.server(&["127.0.0.1"], Key::EcdsaPkcs8), Some(&clients)),
    )
    .await;
    let ca_file = CaFile::new(&ca);
    let ours = clients.client("gateway", "gateway.internal");
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("c.crt"), dir.path().join("c.key"));
    std::fs::write(&cert, &ours.cert_pem).unwrap();
    std::fs::write(&key, &ours.key_pem).unwrap();

    let without = https_pool(
        &[&replica],
        "http1",
        &format!("{{caFile: {}}}", ca_file.path()),
    );
    let gw = Gateway::start(&config("", &without)).await.unwrap();
    let (status, _) = chat_plain(&gw).await;
    assert_eq!(status, StatusCode::BAD_GATEWAY, "no client certificate");

    let with = https_pool(
        &[&replica],
        "http1",
        &format!(
            "{{caFile: {}, certFile: {}, keyFile: {}}}",
            ca_file.path(),
            cert.display(),
            key.display()
        ),
    );
    gw.apply(&config("", &with)).unwrap();
    let (status, body) = chat_plain(&gw).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn https_replicas_are_scraped_over_tls() {
    let ca = Ca::new("replicas");
    let replica = FakeReplica::start_tls(
        "r",
        Behaviour::Echo,
        replica_config(&ca.server(&["127.0.0.1"], Key::EcdsaPkcs8), None),
    )
    .await;
    replica.set_metrics(&crate::support::vllm_metrics(7, 1, 0.25, &[]));
    let ca_file = CaFile::new(&ca);
    let pool = format!(
        "    - {{name: p, engine: vllm, models: [m], endpoints: [\"{}\"], tls: {{caFile: {}}}}}\n",
        replica.https(),
        ca_file.path()
    );
    let gw = Gateway::start(&config("  admin: {address: \"127.0.0.1:0\"}\n", &pool))
        .await
        .unwrap();
    let pools = until_debug_pools(&gw, Duration::from_secs(10), "the replica scraped", |p| {
        p["pools"][0]["endpoints"][0]["waiting"] == 7
    })
    .await;
    let endpoint = &pools["pools"][0]["endpoints"][0];
    assert_eq!(endpoint["address"], replica.https().as_str());
    assert_eq!(endpoint["lastError"], Value::Null);
}

#[tokio::test]
async fn connections_opened_under_replaced_tls_settings_are_not_reused() {
    let replica = FakeReplica::start_tls(
        "r",
        Behaviour::Echo,
        replica_config(
            &Ca::new("replicas").server(&["127.0.0.1"], Key::EcdsaPkcs8),
            None,
        ),
    )
    .await;
    for protocol in ["http1", "h2c"] {
        let trusting = https_pool(&[&replica], protocol, "{insecureSkipVerify: true}");
        let gw = Gateway::start(&config("", &trusting)).await.unwrap();
        // Each request comes on a connection of its own, which the workers
        // take in turn: every worker gets a pooled replica connection.
        const REQUESTS: usize = 16;
        for _ in 0..REQUESTS {
            assert_eq!(chat_plain(&gw).await.0, StatusCode::OK, "{protocol}");
        }

        // The pooled connections would still work; the new settings refuse
        // the replica's certificate, and hold at once on every worker.
        let other = CaFile::new(&Ca::new("another"));
        let strict = https_pool(
            &[&replica],
            protocol,
            &format!("{{caFile: {}}}", other.path()),
        );
        gw.apply(&config("", &strict)).unwrap();
        for _ in 0..REQUESTS {
            let (status, body) = chat_plain(&gw).await;
            assert_eq!(status, StatusCode::BAD_GATEWAY, "{protocol}: {body}");
        }
        gw.shutdown().await;
    }
}
