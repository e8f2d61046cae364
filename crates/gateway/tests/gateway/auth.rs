//! Authentication and tenants end to end: API keys (in the config and in a
//! keys file that changes), JWTs minted here with the real library and
//! keys generated here, their JWKS served by the test on 127.0.0.1, every
//! attack refused with its reason, and what a tenant's rules do to its
//! requests: which models, which band, which turns in flow control, what
//! the replica and the metrics are told.
//!
//! Tests run on the current-thread runtime so that a per-test `tracing`
//! subscriber sees every event the gateway's tasks emit.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use bytes::Bytes;
use gateway::Gateway;
use gateway::auth::api_keys::sha256_hex;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use parking_lot::Mutex;
use serde_json::{Value, json};
use tokio::net::TcpListener;

use crate::support::exposition::scrape;
use crate::support::logs::Logs;
use crate::support::{
    Behaviour, CHAT, FakeReplica, MetricsFault, client, closed_port, config, idle_vllm_metrics,
    poll_until, until_debug_pools, vllm_metrics,
};

const DEADLINE: Duration = Duration::from_secs(20);
const ISSUER: &str = "https://issuer.test";
const AUDIENCE: &str = "infergate";
const KEY_A: &str = "ig-key-of-tenant-a";
const KEY_B: &str = "ig-key-of-tenant-b";
const KEY_STRANGER: &str = "ig-key-of-a-tenant-not-listed";

// ---------------------------------------------------------------------
// Signing keys, made once per test process

/// A signing key and its public half as a JWK.
struct SigningKey {
    alg: Algorithm,
    encoding: EncodingKey,
    /// The JWK without `kid`.
    jwk: Value,
    /// The public key as PEM (RSA only): what an attacker signs HS256 with.
    public_pem: Option<String>,
}

impl SigningKey {
    fn jwk(&self, kid: &str) -> Value {
        let mut jwk = self.jwk.clone();
        jwk["kid"] = json!(kid);
        jwk
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn rsa_key() -> SigningKey {
    use rsa::pkcs1::EncodeRsaPrivateKey as _;
    use rsa::pkcs8::EncodePublicKey as _;
    use rsa::traits::PublicKeyParts as _;
    let private = rsa::PrivateKey::new(&mut getrandom::SysRng, 2048).unwrap();
    let public = private.to_public_key();
    SigningKey {
        alg: Algorithm::RS256,
        encoding: EncodingKey::from_rsa_der(private.to_pkcs1_der().unwrap().as_bytes()),
        jwk: json!({"kty": "RSA", "use": "sig", "n": b64(&public.n_bytes()), "e": b64(&public.e_bytes())}),
        public_pem: Some(
            public
                .to_public_key_pem(rsa::pkcs8::LineEnding::LF)
                .unwrap(),
        ),
    }
}

fn random_32() -> [u8; 32] {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).unwrap();
    bytes
}

fn ec_key() -> SigningKey {
    use p256::pkcs8::EncodePrivateKey as _;
    let private = p256::ecdsa::SigningKey::from_slice(&random_32()).unwrap();
    let point = private.verifying_key().to_sec1_point(false);
    let point = point.as_bytes();
    SigningKey {
        alg: Algorithm::ES256,
        encoding: EncodingKey::from_ec_der(private.to_pkcs8_der().unwrap().as_bytes()),
        jwk: json!({"kty": "EC", "crv": "P-256", "x": b64(&point[1..33]), "y": b64(&point[33..65])}),
        public_pem: None,
    }
}

fn ed_key() -> SigningKey {
    use ed25519_dalek::pkcs8::EncodePrivateKey as _;
    let private = ed25519_dalek::SigningKey::from_bytes(&random_32());
    SigningKey {
        alg: Algorithm::EdDSA,
        encoding: EncodingKey::from_ed_der(private.to_pkcs8_der().unwrap().as_bytes()),
        jwk: json!({"kty": "OKP", "crv": "Ed25519", "x": b64(private.verifying_key().as_bytes())}),
        public_pem: None,
    }
}

/// Two RSA keys (RSA key generation is the slow part: once per process),
/// an EC key and an Ed25519 key.
static KEYS: LazyLock<[SigningKey; 4]> =
    LazyLock::new(|| [rsa_key(), rsa_key(), ec_key(), ed_key()]);

fn rsa1() -> &'static SigningKey {
    &KEYS[0]
}
fn rsa2() -> &'static SigningKey {
    &KEYS[1]
}
fn ec() -> &'static SigningKey {
    &KEYS[2]
}
fn ed() -> &'static SigningKey {
    &KEYS[3]
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Claims of a good token of tenant `tenant`, to change in a test.
fn claims(tenant: &str) -> Value {
    json!({"iss": ISSUER, "aud": AUDIENCE, "tenant": tenant, "exp": now() + 600, "nbf": now() - 10})
}

fn mint(key: &SigningKey, kid: Option<&str>, claims: &Value) -> String {
    let mut header = Header::new(key.alg);
    header.kid = kid.map(str::to_owned);
    jsonwebtoken::encode(&header, claims, &key.encoding).unwrap()
}

// ---------------------------------------------------------------------
// A JWKS served by the test

struct JwksServer {
    url: String,
    document: Arc<Mutex<Value>>,
    fetches: Arc<AtomicUsize>,
}

impl JwksServer {
    async fn start(keys: &[Value]) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/jwks", listener.local_addr().unwrap());
        let document = Arc::new(Mutex::new(json!({"keys": keys})));
        let fetches = Arc::new(AtomicUsize::new(0));
        let (doc, count) = (Arc::clone(&document), Arc::clone(&fetches));
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (doc, count) = (Arc::clone(&doc), Arc::clone(&count));
                tokio::spawn(async move {
                    let service = service_fn(move |_req| {
                        count.fetch_add(1, Ordering::SeqCst);
                        let body = doc.lock().to_string();
                        async move {
                            Ok::<_, Infallible>(hyper::Response::new(Full::new(Bytes::from(body))))
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            url,
            document,
            fetches,
        }
    }

    fn serve(&self, keys: &[Value]) {
        *self.document.lock() = json!({"keys": keys});
    }

    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }
}

// ---------------------------------------------------------------------
// The gateway

/// Tenant `a` may use `m-a*` and ask for critical; `b` only `m-b`.
/// Keys of `a`, `b` and a tenant not listed in the config, more in the
/// keys file; tokens of one issuer whose JWKS is at `jwks_url`.
fn auth_spec(keys_file: &str, jwks_url: &str, extra: &str) -> String {
    format!(
        "  admin: {{address: \"127.0.0.1:0\"}}
  flowControl: {{headerMayRaise: true}}
  auth:
    tenantHeader: x-tenant
    apiKeys:
      keys:
        - {{tenant: a, sha256: {a}}}
        - {{tenant: b, sha256: {b}, name: b-laptop}}
        - {{tenant: stranger, sha256: {s}}}
      file: {keys_file}
    jwt:
      leeway: 5s
      issuers:
        - issuer: {ISSUER}
          audiences: [{AUDIENCE}, other-audience]
          jwksUrl: {jwks_url}
          algorithms: [RS256, ES256, EdDSA]
          tenantClaim: tenant
          modelsClaim: models
          priorityClaim: priority
  tenants:
    - {{name: a, models: [\"m-a*\"], maxPriority: critical}}
    - {{name: b, models: [m-b]}}
{extra}",
        a = sha256_hex(KEY_A),
        b = sha256_hex(KEY_B),
        s = sha256_hex(KEY_STRANGER),
    )
}

fn pool(replica: &FakeReplica) -> String {
    format!(
        "    - {{name: p, engine: none, models: [m-a, m-a2, m-b], endpoints: [\"{}\"], scheduling: {{policy: round-robin}}}}\n",
        replica.addr
    )
}

struct Setup {
    gw: Gateway,
    replica: FakeReplica,
    jwks: JwksServer,
    keys_file: tempfile::NamedTempFile,
}

async fn setup(keys_file_text: &str) -> Setup {
    let replica = FakeReplica::start("r", Behaviour::Echo).await;
    let jwks = JwksServer::start(&[rsa1().jwk("k1"), ec().jwk("ec1"), ed().jwk("ed1")]).await;
    let keys_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(keys_file.path(), keys_file_text).unwrap();
    let spec = auth_spec(&keys_file.path().display().to_string(), &jwks.url, "");
    let gw = Gateway::start(&config(&spec, &pool(&replica)))
        .await
        .unwrap();
    Setup {
        gw,
        replica,
        jwks,
        keys_file,
    }
}

/// A chat request for `model` with extra header fields.
async fn chat(gw: &Gateway, model: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut req = client()
        .post(format!("http://{}{CHAT}", gw.addr()))
        .header("content-type", "application/json")
        .body(json!({"model": model, "messages": [{"role": "user", "content": "hi"}]}).to_string());
    for (name, value) in headers {
        req = req.header(*name, *value);
    }
    req.send().await.unwrap()
}

fn bearer(credential: &str) -> String {
    format!("Bearer {credential}")
}

/// The refusal's status, `code`, and the reason word in the challenge.
async fn refusal(resp: reqwest::Response) -> (u16, String, Option<String>) {
    let status = resp.status().as_u16();
    let challenge = resp
        .headers()
        .get("www-authenticate")
        .map(|v| v.to_str().unwrap().to_owned());
    let body: Value = resp.json().await.unwrap();
    let error = &body["error"];
    assert!(error["message"].is_string(), "{body}");
    assert_eq!(error["type"], "invalid_request_error", "{body}");
    let reason = challenge.as_ref().and_then(|c| {
        c.split("error_description=\"")
            .nth(1)
            .map(|rest| rest.trim_end_matches('"').to_owned())
    });
    if status == 401 {
        let c = challenge.as_deref().unwrap_or_default();
        assert!(c.starts_with("Bearer realm=\"infergate\""), "{c}");
        if reason.is_some() {
            assert!(c.contains("error=\"invalid_token\""), "{c}");
        }
    }
    (
        status,
        error["code"].as_str().unwrap_or_default().to_owned(),
        reason,
    )
}

async fn token_refused(gw: &Gateway, token: &str) -> (u16, String, Option<String>) {
    refusal(chat(gw, "m-a", &[("authorization", &bearer(token))]).await).await
}

/// What the gateway answers a request whose head carries `token`, read
/// off the socket: an answer written before the connection closes.
async fn raw_answer(gw: &Gateway, token: &str) -> String {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut conn = tokio::net::TcpStream::connect(gw.addr()).await.unwrap();
    let head = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {token}\r\ncontent-length: 2\r\n\r\n{{}}"
    );
    // The gateway may answer and close before reading all of it.
    let _ = conn.write_all(head.as_bytes()).await;
    let mut answer = vec![0; 4096];
    let n = tokio::time::timeout(DEADLINE, conn.read(&mut answer))
        .await
        .expect("answered")
        .unwrap_or(0);
    String::from_utf8_lossy(&answer[..n]).into_owned()
}

fn invalid_token(reason: &str) -> (u16, String, Option<String>) {
    (401, "invalid_token".to_owned(), Some(reason.to_owned()))
}

// ---------------------------------------------------------------------
// API keys

#[tokio::test]
async fn an_api_key_works_as_bearer_and_as_x_api_key_and_the_replica_gets_the_tenant_not_the_key() {
    let s = setup("").await;
    let by_bearer = chat(
        &s.gw,
        "m-a",
        &[("authorization", &bearer(KEY_A)), ("x-tenant", "b")],
    )
    .await;
    assert_eq!(by_bearer.status(), 200);
    let by_header = chat(&s.gw, "m-a", &[("x-api-key", KEY_A)]).await;
    assert_eq!(by_header.status(), 200);
    let received = s.replica.received();
    assert_eq!(received.len(), 2);
    for r in &received {
        assert!(r.headers.get("authorization").is_none(), "{:?}", r.headers);
        assert!(r.headers.get("x-api-key").is_none(), "{:?}", r.headers);
        // The client's own `x-tenant: b` never arrives: the gateway's does.
        let tenants: Vec<_> = r.headers.get_all("x-tenant").iter().collect();
        assert_eq!(tenants, ["a"]);
    }
}

#[tokio::test]
async fn a_missing_or_wrong_key_is_a_401_with_a_challenge_and_reaches_no_replica() {
    let s = setup("").await;
    let missing = chat(&s.gw, "m-a", &[]).await;
    assert_eq!(
        missing.headers()["www-authenticate"],
        "Bearer realm=\"infergate\""
    );
    assert_eq!(
        refusal(missing).await,
        (401, "invalid_api_key".to_owned(), None)
    );
    let wrong = chat(&s.gw, "m-a", &[("authorization", &bearer("ig-guess"))]).await;
    assert_eq!(
        refusal(wrong).await,
        (
            401,
            "invalid_api_key".to_owned(),
            Some("unknown_key".to_owned())
        )
    );
    let basic = chat(&s.gw, "m-a", &[("authorization", "Basic dTpw")]).await;
    assert_eq!(refusal(basic).await.2.as_deref(), Some("malformed"));
    let two = chat(
        &s.gw,
        "m-a",
        &[("authorization", &bearer(KEY_A)), ("x-api-key", KEY_B)],
    )
    .await;
    assert_eq!(
        refusal(two).await.2.as_deref(),
        Some("conflicting_credentials")
    );
    assert_eq!(s.replica.count(), 0);
    let m = scrape(&s.gw).await;
    let failures = |reason| {
        m.value(
            "infergate_auth_failures_total",
            &[("credential", "api_key"), ("reason", reason)],
        )
    };
    assert_eq!(failures("missing"), 1.0);
    assert_eq!(failures("unknown_key"), 1.0);
}

#[tokio::test]
async fn a_key_of_another_tenant_cannot_use_a_model_only_that_tenant_may_use() {
    let s = setup("").await;
    let (status, code, _) = refusal(chat(&s.gw, "m-a", &[("x-api-key", KEY_B)]).await).await;
    assert_eq!((status, code.as_str()), (403, "model_not_allowed"));
    // An adapter or model is matched by the name asked for: `m-a*`.
    assert_eq!(
        chat(&s.gw, "m-a2", &[("x-api-key", KEY_A)]).await.status(),
        200
    );
    assert_eq!(
        chat(&s.gw, "m-b", &[("x-api-key", KEY_B)]).await.status(),
        200
    );
    assert_eq!(
        chat(&s.gw, "m-b", &[("x-api-key", KEY_A)]).await.status(),
        403
    );
    // A tenant not listed may use every model.
    assert_eq!(
        chat(&s.gw, "m-b", &[("x-api-key", KEY_STRANGER)])
            .await
            .status(),
        200
    );
    assert_eq!(s.replica.count(), 3);
    let m = scrape(&s.gw).await;
    assert_eq!(
        m.value(
            "infergate_refused_total",
            &[("pool", "p"), ("reason", "model-not-allowed")]
        ),
        2.0
    );
}

#[tokio::test]
async fn the_models_list_shows_only_what_the_caller_may_use() {
    let s = setup("").await;
    let models = |key: &'static str, path: &'static str| {
        let gw = &s.gw;
        async move {
            let mut req = client().get(format!("http://{}{path}", gw.addr()));
            if !key.is_empty() {
                req = req.header("authorization", bearer(key));
            }
            req.send().await.unwrap()
        }
    };
    let ids = |body: Value| -> Vec<String> {
        body["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_owned())
            .collect()
    };
    let a: Value = models(KEY_A, "/v1/models").await.json().await.unwrap();
    assert_eq!(a["object"], "list");
    assert_eq!(ids(a), ["m-a", "m-a2"]);
    let b = models(KEY_B, "/v1/models").await.json().await.unwrap();
    assert_eq!(ids(b), ["m-b"]);
    let all = models(KEY_STRANGER, "/v1/models")
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(ids(all), ["m-a", "m-a2", "m-b"]);
    assert_eq!(models("", "/v1/models").await.status(), 401);
    assert_eq!(models(KEY_A, "/v1/models/m-a").await.status(), 200);
    let hidden = models(KEY_A, "/v1/models/m-b").await;
    assert_eq!(hidden.status(), 404, "not there, for tenant a");
    assert_eq!(models("", "/v1/models/m-a").await.status(), 401);
}

#[tokio::test]
async fn a_key_revoked_in_the_keys_file_stops_working_and_a_bad_file_changes_nothing() {
    let (logs, _guard) = Logs::capture();
    let line =
        |tenant: &str, key: &str| format!("- {{tenant: {tenant}, sha256: {}}}\n", sha256_hex(key));
    let s = setup(&line("a", "ig-from-the-file")).await;
    let with = |key: &'static str| {
        let gw = &s.gw;
        async move { chat(gw, "m-a", &[("x-api-key", key)]).await }
    };
    assert_eq!(with("ig-from-the-file").await.status(), 200);

    std::fs::write(s.keys_file.path(), line("a", "ig-its-successor")).unwrap();
    poll_until(DEADLINE, "the revoked key refused", || async {
        match with("ig-from-the-file").await.status().as_u16() {
            401 => Ok(()),
            other => Err(other.to_string()),
        }
    })
    .await;
    assert_eq!(with("ig-its-successor").await.status(), 200);

    // A file that is not a list of keys: logged, and the keys stay.
    std::fs::write(s.keys_file.path(), "- {tenant: a, sha256: not-hex}\n").unwrap();
    tokio::time::timeout(DEADLINE, logs.wait_for_text("the API keys file is invalid"))
        .await
        .expect("the bad file is reported");
    assert!(
        logs.text().contains("must be 64 hex digits"),
        "{}",
        logs.text()
    );
    assert_eq!(with("ig-its-successor").await.status(), 200);
    // The config's own keys never depended on the file.
    assert_eq!(with(KEY_A).await.status(), 200);
}

// ---------------------------------------------------------------------
// Tokens

#[tokio::test]
async fn tokens_of_each_algorithm_work() {
    let s = setup("").await;
    for (key, kid) in [(rsa1(), "k1"), (ec(), "ec1"), (ed(), "ed1")] {
        let token = mint(key, Some(kid), &claims("a"));
        let resp = chat(&s.gw, "m-a", &[("authorization", &bearer(&token))]).await;
        assert_eq!(resp.status(), 200, "{:?}", key.alg);
    }
    // Any of the issuer's audiences; a token of a tenant not listed.
    let mut other = claims("someone");
    other["aud"] = json!(["unrelated", "other-audience"]);
    let token = mint(rsa1(), Some("k1"), &other);
    assert_eq!(
        chat(&s.gw, "m-b", &[("x-api-key", &token)]).await.status(),
        200
    );
    let tenants: Vec<_> = s
        .replica
        .received()
        .iter()
        .map(|r| r.headers["x-tenant"].to_str().unwrap().to_owned())
        .collect();
    assert_eq!(tenants, ["a", "a", "a", "someone"]);
    // The token is remembered: the same one again costs no JWKS fetch and
    // passes.
    let fetched = s.jwks.fetches();
    assert_eq!(
        chat(&s.gw, "m-b", &[("x-api-key", &token)]).await.status(),
        200
    );
    assert_eq!(s.jwks.fetches(), fetched);
    let m = scrape(&s.gw).await;
    let requests = |tenant| {
        m.value(
            "infergate_requests_total",
            &[
                ("pool", "p"),
                ("model", "m-a"),
                ("tenant", tenant),
                ("code", "200"),
            ],
        )
    };
    assert_eq!(requests("a"), 3.0);
    assert_eq!(
        m.value(
            "infergate_requests_total",
            &[
                ("pool", "p"),
                ("model", "m-b"),
                ("tenant", "other"),
                ("code", "200")
            ],
        ),
        2.0,
        "a tenant not listed counts as `other`"
    );
}

#[tokio::test]
async fn every_forged_or_stale_token_is_refused_with_its_reason() {
    let s = setup("").await;
    let good = claims("a");
    let with = |change: &dyn Fn(&mut Value)| {
        let mut c = good.clone();
        change(&mut c);
        c
    };

    // alg: none, with the claims of a good token and no signature.
    let none = format!(
        "{}.{}.",
        b64(json!({"alg": "none", "typ": "JWT", "kid": "k1"})
            .to_string()
            .as_bytes()),
        b64(good.to_string().as_bytes())
    );
    assert_eq!(
        token_refused(&s.gw, &none).await,
        invalid_token("algorithm_not_allowed")
    );

    // HS256 with the RSA public key (as published) as the HMAC secret.
    let secret = rsa1().public_pem.as_ref().unwrap();
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("k1".to_owned());
    let confused = jsonwebtoken::encode(
        &header,
        &good,
        &EncodingKey::from_secret(secret.as_bytes()).unwrap(),
    )
    .unwrap();
    assert_eq!(
        token_refused(&s.gw, &confused).await,
        invalid_token("algorithm_not_allowed")
    );

    // An algorithm not pinned for the issuer, signed right.
    let mut ps = Header::new(Algorithm::PS256);
    ps.kid = Some("k1".to_owned());
    let unpinned = jsonwebtoken::encode(&ps, &good, &rsa1().encoding).unwrap();
    assert_eq!(
        token_refused(&s.gw, &unpinned).await,
        invalid_token("algorithm_not_allowed")
    );

    // An EC token claiming the RSA key's kid.
    let mismatched = mint(ec(), Some("k1"), &good);
    assert_eq!(
        token_refused(&s.gw, &mismatched).await,
        invalid_token("algorithm_not_allowed")
    );

    // Past its leeway either way.
    let expired = mint(rsa1(), Some("k1"), &with(&|c| c["exp"] = json!(now() - 60)));
    assert_eq!(
        token_refused(&s.gw, &expired).await,
        invalid_token("expired")
    );
    let early = mint(
        rsa1(),
        Some("k1"),
        &with(&|c| c["nbf"] = json!(now() + 600)),
    );
    assert_eq!(
        token_refused(&s.gw, &early).await,
        invalid_token("not_yet_valid")
    );
    // A string where a time belongs is not "no time" (CVE-2026-25537).
    let typed = mint(
        rsa1(),
        Some("k1"),
        &with(&|c| c["nbf"] = json!("99999999999")),
    );
    assert_eq!(token_refused(&s.gw, &typed).await.0, 401);

    let audience = mint(
        rsa1(),
        Some("k1"),
        &with(&|c| c["aud"] = json!("someone-else")),
    );
    assert_eq!(
        token_refused(&s.gw, &audience).await,
        invalid_token("wrong_audience")
    );
    let no_audience = mint(
        rsa1(),
        Some("k1"),
        &with(&|c| {
            c.as_object_mut().unwrap().remove("aud");
        }),
    );
    assert_eq!(
        token_refused(&s.gw, &no_audience).await,
        invalid_token("missing_claim")
    );
    let issuer = mint(
        rsa1(),
        Some("k1"),
        &with(&|c| c["iss"] = json!("https://evil.test")),
    );
    assert_eq!(
        token_refused(&s.gw, &issuer).await,
        invalid_token("wrong_issuer")
    );
    let no_tenant = mint(
        rsa1(),
        Some("k1"),
        &with(&|c| {
            c.as_object_mut().unwrap().remove("tenant");
        }),
    );
    assert_eq!(
        token_refused(&s.gw, &no_tenant).await,
        invalid_token("missing_claim")
    );
    let bad_priority = mint(
        rsa1(),
        Some("k1"),
        &with(&|c| c["priority"] = json!("urgent")),
    );
    assert_eq!(
        token_refused(&s.gw, &bad_priority).await,
        invalid_token("bad_claim")
    );

    // Signed by a key that is not the issuer's, under the issuer's kid.
    let forged = mint(rsa2(), Some("k1"), &good);
    assert_eq!(
        token_refused(&s.gw, &forged).await,
        invalid_token("bad_signature")
    );
    // A good token with its claims changed after signing.
    let good_token = mint(rsa1(), Some("k1"), &good);
    let mut parts: Vec<&str> = good_token.split('.').collect();
    let lifted = b64(with(&|c| c["tenant"] = json!("b")).to_string().as_bytes());
    parts[1] = &lifted;
    assert_eq!(
        token_refused(&s.gw, &parts.join(".")).await,
        invalid_token("bad_signature")
    );

    let unknown = mint(rsa1(), Some("no-such-kid"), &good);
    assert_eq!(
        token_refused(&s.gw, &unknown).await,
        invalid_token("unknown_key")
    );
    assert_eq!(
        token_refused(&s.gw, "eyJ!!!.eyJ@@@.c2ln").await,
        invalid_token("malformed")
    );

    // A huge token: refused unread, in the OpenAI shape.
    let huge = format!(
        "{}.{}.{}",
        "e".repeat(6000),
        "e".repeat(6000),
        "e".repeat(100)
    );
    assert_eq!(token_refused(&s.gw, &huge).await, invalid_token("too_long"));
    // Past the 64 KiB head limit hyper answers itself, with a plain 431.
    let enormous = format!("a.{}.b", "e".repeat(65 * 1024));
    assert!(
        raw_answer(&s.gw, &enormous)
            .await
            .starts_with("HTTP/1.1 431")
    );

    // None of it reached the replica; the good token still works.
    assert_eq!(s.replica.count(), 0);
    let resp = chat(&s.gw, "m-a", &[("authorization", &bearer(&good_token))]).await;
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn a_tokens_claims_narrow_its_tenants_models_and_band() {
    let (logs, _guard) = Logs::capture();
    let s = setup("").await;
    let mut narrow = claims("a");
    narrow["models"] = json!(["m-a2"]);
    narrow["priority"] = json!("sheddable");
    let token = mint(rsa1(), Some("k1"), &narrow);
    let auth = bearer(&token);
    let (status, code, _) = refusal(chat(&s.gw, "m-a", &[("authorization", &auth)]).await).await;
    assert_eq!((status, code.as_str()), (403, "model_not_allowed"));
    let resp = chat(
        &s.gw,
        "m-a2",
        &[
            ("authorization", &auth),
            ("x-infergate-priority", "critical"),
        ],
    )
    .await;
    assert_eq!(resp.status(), 200);
    let lines = logs.wait_for_access(2).await;
    let served = lines.iter().find(|l| l["status"] == 200).unwrap();
    assert_eq!(served["tenant"], "a");
    assert_eq!(served["issuer"], ISSUER);
    assert_eq!(served["priority"], "sheddable", "{served}");
}

#[tokio::test]
async fn a_rotated_key_works_at_once_and_a_rotated_out_key_stops() {
    let s = setup("").await;
    let old = mint(rsa1(), Some("k1"), &claims("a"));
    let new = mint(rsa2(), Some("k2"), &claims("a"));
    assert_eq!(
        chat(&s.gw, "m-a", &[("x-api-key", &old)]).await.status(),
        200
    );
    assert_eq!(
        token_refused(&s.gw, &new).await,
        invalid_token("unknown_key")
    );

    // The issuer rotates: k2 in, k1 out. A token naming k2 makes the
    // gateway fetch the JWKS again (once the last fetch is old enough).
    s.jwks.serve(&[rsa2().jwk("k2")]);
    poll_until(DEADLINE, "the token of the new key accepted", || async {
        match chat(&s.gw, "m-a", &[("x-api-key", &new)])
            .await
            .status()
            .as_u16()
        {
            200 => Ok(()),
            other => Err(other.to_string()),
        }
    })
    .await;
    // The old token was remembered as good; its key is gone, so it is
    // checked again and refused.
    assert_eq!(
        token_refused(&s.gw, &old).await,
        invalid_token("unknown_key")
    );
}

#[tokio::test]
async fn made_up_kids_cost_the_issuer_at_most_one_fetch_per_interval() {
    let s = setup("").await;
    // The first fetch, at start.
    poll_until(DEADLINE, "the JWKS fetched", || async {
        match s.jwks.fetches() {
            0 => Err("0".to_owned()),
            n => Ok(n),
        }
    })
    .await;
    let before = s.jwks.fetches();
    for i in 0..20 {
        let token = mint(rsa1(), Some(&format!("made-up-{i}")), &claims("a"));
        assert_eq!(
            token_refused(&s.gw, &token).await,
            invalid_token("unknown_key")
        );
    }
    let fetched = s.jwks.fetches() - before;
    assert!(fetched <= 1, "{fetched} fetches for 20 unknown kids");
}

#[tokio::test]
async fn an_issuer_whose_keys_cannot_be_fetched_is_a_503_not_the_callers_fault() {
    let replica = FakeReplica::start("r", Behaviour::Echo).await;
    let keys_file = tempfile::NamedTempFile::new().unwrap();
    let url = format!("http://{}/jwks", closed_port().await);
    let spec = auth_spec(&keys_file.path().display().to_string(), &url, "");
    let gw = Gateway::start(&config(&spec, &pool(&replica)))
        .await
        .unwrap();
    let token = mint(rsa1(), Some("k1"), &claims("a"));
    let resp = chat(&gw, "m-a", &[("authorization", &bearer(&token))]).await;
    assert_eq!(resp.status(), 503);
    assert!(resp.headers().contains_key("retry-after"));
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "auth_unavailable");
    // API keys do not depend on it.
    assert_eq!(
        chat(&gw, "m-a", &[("x-api-key", KEY_A)]).await.status(),
        200
    );
}

// ---------------------------------------------------------------------
// Tenants in flow control

#[tokio::test]
async fn a_header_never_lifts_a_request_above_its_tenants_ceiling() {
    let (logs, _guard) = Logs::capture();
    let s = setup("").await;
    // `stranger` is not listed: its ceiling is standard. `a` may ask for
    // critical (headerMayRaise is on). Anyone may lower.
    let cases = [
        (KEY_STRANGER, "critical", "standard"),
        (KEY_A, "critical", "critical"),
        (KEY_B, "critical", "standard"),
        (KEY_A, "sheddable", "sheddable"),
    ];
    for (i, (key, asked, _)) in cases.iter().enumerate() {
        let id = format!("req-{i}");
        let model = if *key == KEY_B { "m-b" } else { "m-a" };
        let resp = chat(
            &s.gw,
            model,
            &[
                ("x-api-key", key),
                ("x-infergate-priority", asked),
                ("x-request-id", &id),
            ],
        )
        .await;
        assert_eq!(resp.status(), 200);
    }
    let lines = logs.wait_for_access(cases.len()).await;
    for (i, (_, asked, used)) in cases.iter().enumerate() {
        let line = lines
            .iter()
            .find(|l| l["request_id"] == format!("req-{i}"))
            .unwrap();
        assert_eq!(line["priority"], *used, "asked {asked}: {line}");
    }
    // A named key is logged by its name, never the key itself.
    let by_b = lines.iter().find(|l| l["request_id"] == "req-2").unwrap();
    assert_eq!(
        (&by_b["tenant"], &by_b["key"]),
        (&json!("b"), &json!("b-laptop"))
    );
    assert!(!logs.text().contains(KEY_B));
}

/// One replica scraped every 20 ms, saturated at one waiting request, as
/// in `flow.rs`: requests dispatch one at a time, in queue order.
async fn saturable(tenants: &str) -> (Gateway, FakeReplica) {
    let replica = FakeReplica::start("r", Behaviour::Echo).await;
    let keys = [("ka", "a"), ("kb", "b"), ("kc", "c")]
        .iter()
        .map(|(key, tenant)| {
            format!(
                "        - {{tenant: {tenant}, sha256: {}}}\n",
                sha256_hex(key)
            )
        })
        .collect::<String>();
    let spec = format!(
        "  admin: {{address: \"127.0.0.1:0\"}}\n  auth:\n    apiKeys:\n      keys:\n{keys}  tenants:\n{tenants}"
    );
    let pools = format!(
        "    - {{name: p, models: [m], endpoints: [\"{}\"], scheduling: {{saturation: {{queueDepth: 1}}, metrics: {{interval: 20ms, staleAfter: 2s}}}}}}\n",
        replica.addr
    );
    let gw = Gateway::start(&config(&spec, &pools)).await.unwrap();
    replica.set_metrics(&vllm_metrics(3, 8, 0.5, &[]));
    until_debug_pools(&gw, DEADLINE, "saturated", |pools| {
        pools["pools"][0]["endpoints"][0]["waiting"] == json!(3)
    })
    .await;
    (gw, replica)
}

fn send(gw: &Gateway, id: &str, key: &str, fairness: Option<&str>) -> tokio::task::JoinHandle<u16> {
    let mut req = client()
        .post(format!("http://{}{CHAT}", gw.addr()))
        .header("x-request-id", id)
        .header("x-api-key", key)
        .body(r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#);
    if let Some(f) = fairness {
        req = req.header("x-infergate-fairness-id", f);
    }
    tokio::spawn(async move { req.send().await.unwrap().status().as_u16() })
}

async fn waiting(gw: &Gateway, n: usize) {
    poll_until(DEADLINE, &format!("{n} waiting"), || async {
        match gw.queued("p") {
            Some([0, seen, 0]) if seen == n => Ok(()),
            seen => Err(format!("{seen:?}")),
        }
    })
    .await;
}

/// The replica reports room for exactly one scrape: the dispatcher then
/// hands out one request at a time, each after the previous one was
/// answered (see `flow.rs`).
async fn dispatch_in_order(
    replica: &FakeReplica,
    waiters: Vec<tokio::task::JoinHandle<u16>>,
) -> Vec<String> {
    replica.set_metrics(&idle_vllm_metrics());
    replica.set_metrics_fault(MetricsFault::OnceThenHang);
    for w in waiters {
        assert_eq!(w.await.unwrap(), 200);
    }
    replica
        .received()
        .iter()
        .map(|r| r.headers["x-request-id"].to_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn a_fairness_id_naming_another_tenant_does_not_take_its_turns() {
    let (gw, replica) = saturable("    - {name: a}\n    - {name: b}\n").await;
    let mut waiters = Vec::new();
    // Tenant a sends three requests under b's name, before b's one.
    for i in 0..3 {
        waiters.push(send(&gw, &format!("a{i}"), "ka", Some("b")));
        waiting(&gw, i + 1).await;
    }
    waiters.push(send(&gw, "b0", "kb", Some("b")));
    waiting(&gw, 4).await;
    let order = dispatch_in_order(&replica, waiters).await;
    // With the fairness id as the whole key, b0 would share a's line and
    // go last; within its own tenant it gets the second turn.
    assert_eq!(order, ["a0", "b0", "a1", "a2"]);
}

#[tokio::test]
async fn tenants_take_turns_by_weight() {
    let (gw, replica) = saturable("    - {name: a, weight: 2}\n    - {name: b}\n").await;
    let mut waiters = Vec::new();
    for i in 0..4 {
        waiters.push(send(&gw, &format!("a{i}"), "ka", None));
        waiting(&gw, i + 1).await;
    }
    for i in 0..2 {
        waiters.push(send(&gw, &format!("b{i}"), "kb", None));
        waiting(&gw, 5 + i).await;
    }
    let order = dispatch_in_order(&replica, waiters).await;
    assert_eq!(order, ["a0", "a1", "b0", "a2", "a3", "b1"]);
}

#[tokio::test]
async fn with_authentication_off_every_caller_is_anonymous() {
    let replica = FakeReplica::start("r", Behaviour::Echo).await;
    let spec = "  auth: {mode: none, tenantHeader: x-tenant}\n";
    let gw = Gateway::start(&config(spec, &pool(&replica)))
        .await
        .unwrap();
    let resp = chat(
        &gw,
        "m-a",
        &[
            ("authorization", "Bearer the-replicas-own-key"),
            ("x-tenant", "forged"),
        ],
    )
    .await;
    assert_eq!(resp.status(), 200);
    let received = &replica.received()[0];
    assert_eq!(received.headers["x-tenant"], "anonymous");
    // Not the gateway's credential: the replica gets it as it was sent.
    assert_eq!(
        received.headers["authorization"],
        "Bearer the-replicas-own-key"
    );
}

#[tokio::test]
async fn a_reload_keeps_the_fetched_jwks_and_refuses_an_unreadable_keys_file() {
    let s = setup("").await;
    let token = mint(rsa1(), Some("k1"), &claims("a"));
    assert_eq!(
        chat(&s.gw, "m-a", &[("x-api-key", &token)]).await.status(),
        200
    );
    let fetched = s.jwks.fetches();

    // The same config again, with tenant b now allowed m-a too: the rules
    // change, the JWKS stays as fetched (no fetch, no window without keys).
    let spec = auth_spec(&s.keys_file.path().display().to_string(), &s.jwks.url, "")
        .replace("{name: b, models: [m-b]}", "{name: b, models: [m-b, m-a]}");
    s.gw.apply(&config(&spec, &pool(&s.replica))).unwrap();
    assert_eq!(
        chat(&s.gw, "m-a", &[("x-api-key", KEY_B)]).await.status(),
        200
    );
    let fresh = mint(rsa1(), Some("k1"), &claims("b"));
    assert_eq!(
        chat(&s.gw, "m-a", &[("x-api-key", &fresh)]).await.status(),
        200
    );
    assert_eq!(s.jwks.fetches(), fetched);

    // A keys file that cannot be read refuses the config; the one in force
    // stays.
    let missing = auth_spec("/nonexistent/keys.yaml", &s.jwks.url, "");
    let e =
        s.gw.apply(&config(&missing, &pool(&s.replica)))
            .unwrap_err();
    assert!(format!("{e:#}").contains("/nonexistent/keys.yaml"), "{e:#}");
    assert_eq!(
        chat(&s.gw, "m-a", &[("x-api-key", KEY_B)]).await.status(),
        200
    );
}
