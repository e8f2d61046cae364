//! What authentication costs per request, side by side: authentication
//! off, an API key (SHA-256 lookup; argon2id once remembered), a JWT
//! remembered from an earlier request (RS256, ES256), and the first check
//! of a token or an argon2id key, which a client pays once.
//!
//! Run: `cargo bench -p infergate-gateway --bench auth` (a few seconds;
//! `-- --seconds S` measures each case longer). Prints a markdown table:
//! the median time of one `authenticate` call over batches, and its ratio
//! to the call with authentication off. For scale, the gateway spends
//! about 50 µs of CPU on a proxied request (BENCHMARKS.md, "Proxy
//! overhead").

use std::hint::black_box;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use gateway::auth::api_keys::sha256_hex;
use gateway::auth::{Authenticator, Sources};
use http::{HeaderMap, HeaderValue};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

const ISSUER: &str = "https://issuer.bench";
const KEY: &str = "ig-bench-key-0123456789abcdefghijklmnopqrstuvwxyz";
const ARGON2_KEY: &str = "a key a person chose";
/// The gateway's CPU per proxied request at maximum rate, user and system
/// (BENCHMARKS.md, "Proxy overhead": 49–53 µs).
const PROXIED_REQUEST_CPU_US: f64 = 50.0;

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

struct Signer {
    encoding: EncodingKey,
    alg: Algorithm,
    kid: &'static str,
}

/// An RSA and a P-256 key, and the JWKS with both.
fn signers() -> (Signer, Signer, Value) {
    use p256::pkcs8::EncodePrivateKey as _;
    use rsa::pkcs1::EncodeRsaPrivateKey as _;
    use rsa::traits::PublicKeyParts as _;
    let rsa = rsa::PrivateKey::new(&mut getrandom::SysRng, 2048).unwrap();
    let mut scalar = [0u8; 32];
    getrandom::fill(&mut scalar).unwrap();
    let ec = p256::ecdsa::SigningKey::from_slice(&scalar).unwrap();
    let point = ec.verifying_key().to_sec1_point(false);
    let point = point.as_bytes();
    let jwks = json!({"keys": [
        {"kid": "rsa", "kty": "RSA", "n": b64(&rsa.n_bytes()), "e": b64(&rsa.e_bytes())},
        {"kid": "ec", "kty": "EC", "crv": "P-256", "x": b64(&point[1..33]), "y": b64(&point[33..65])},
    ]});
    (
        Signer {
            encoding: EncodingKey::from_rsa_der(rsa.to_pkcs1_der().unwrap().as_bytes()),
            alg: Algorithm::RS256,
            kid: "rsa",
        },
        Signer {
            encoding: EncodingKey::from_ec_der(ec.to_pkcs8_der().unwrap().as_bytes()),
            alg: Algorithm::ES256,
            kid: "ec",
        },
        jwks,
    )
}

fn token(signer: &Signer, n: usize) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let claims =
        json!({"iss": ISSUER, "aud": "infergate", "sub": format!("user-{n}"), "exp": now + 3600});
    let mut header = Header::new(signer.alg);
    header.kid = Some(signer.kid.to_owned());
    jsonwebtoken::encode(&header, &claims, &signer.encoding).unwrap()
}

fn argon2id(key: &str) -> String {
    use argon2::PasswordHasher as _;
    // The crate's defaults: what a hash made by its CLI or library holds.
    argon2::Argon2::default()
        .hash_password(key.as_bytes())
        .unwrap()
        .to_string()
}

fn authenticator(auth: &str, jwks_file: &str) -> Authenticator {
    let auth = auth.replace("JWKS", jwks_file);
    let yaml = format!(
        "apiVersion: infergate.dev/v1alpha1\nkind: InferenceGatewayConfig\nspec:\n  listeners: [{{name: p, address: \"127.0.0.1:0\"}}]\n{auth}  pools: [{{name: p, models: [m], endpoints: [\"127.0.0.1:1\"]}}]\n"
    );
    let spec = config::from_yaml(&yaml).unwrap().spec;
    Sources::default().build(&spec).unwrap()
}

fn bearer(credential: &str) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        "authorization",
        HeaderValue::from_str(&format!("Bearer {credential}")).unwrap(),
    );
    headers
}

/// Median time of one call over batches of `batch` calls, for `budget`.
fn remembered(
    rt: &tokio::runtime::Runtime,
    auth: &Authenticator,
    headers: &HeaderMap,
    budget: Duration,
) -> Duration {
    let once = || {
        rt.block_on(auth.authenticate(headers, None))
            .expect("authenticated")
    };
    black_box(once());
    let batch = 1000;
    let mut samples = Vec::new();
    let started = Instant::now();
    while started.elapsed() < budget || samples.len() < 5 {
        let t = Instant::now();
        rt.block_on(async {
            for _ in 0..batch {
                black_box(auth.authenticate(black_box(headers), None).await.unwrap());
            }
        });
        samples.push(t.elapsed() / batch);
    }
    samples.sort();
    samples[samples.len() / 2]
}

/// Median time of each credential's first check, a fresh authenticator
/// (nothing remembered) per round.
fn first(
    rt: &tokio::runtime::Runtime,
    make: &dyn Fn() -> Authenticator,
    credentials: &[HeaderMap],
) -> Duration {
    let mut samples = Vec::new();
    for _ in 0..3 {
        let auth = make();
        for headers in credentials {
            let t = Instant::now();
            black_box(
                rt.block_on(auth.authenticate(headers, None))
                    .expect("authenticated"),
            );
            samples.push(t.elapsed());
        }
    }
    samples.sort();
    samples[samples.len() / 2]
}

fn main() {
    let mut budget = Duration::from_millis(500);
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--seconds" {
            let s: f64 = args
                .next()
                .and_then(|v| v.parse().ok())
                .expect("--seconds S");
            budget = Duration::from_secs_f64(s);
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let (rsa, ec, jwks) = signers();
    let jwks_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(jwks_file.path(), jwks.to_string()).unwrap();
    let jwks_path = jwks_file.path().display().to_string();
    let keys = format!(
        "  auth:\n    apiKeys:\n      keys:\n        - {{tenant: t, sha256: {}}}\n        - {{tenant: u, argon2id: \"{}\"}}\n    jwt:\n      issuers:\n        - {{issuer: \"{ISSUER}\", audiences: [infergate], jwksFile: JWKS, algorithms: [RS256, ES256]}}\n",
        sha256_hex(KEY),
        argon2id(ARGON2_KEY),
    );
    let off = authenticator("", &jwks_path);
    let on = authenticator(&keys, &jwks_path);

    let mut rows: Vec<(&str, Duration)> = vec![
        (
            "authentication off",
            remembered(&rt, &off, &bearer(KEY), budget),
        ),
        (
            "API key, SHA-256",
            remembered(&rt, &on, &bearer(KEY), budget),
        ),
        (
            "API key, argon2id, remembered",
            remembered(&rt, &on, &bearer(ARGON2_KEY), budget),
        ),
        (
            "JWT RS256, remembered",
            remembered(&rt, &on, &bearer(&token(&rsa, 0)), budget),
        ),
        (
            "JWT ES256, remembered",
            remembered(&rt, &on, &bearer(&token(&ec, 0)), budget),
        ),
    ];
    let make = || authenticator(&keys, &jwks_path);
    let rsa_tokens: Vec<HeaderMap> = (1..=20).map(|n| bearer(&token(&rsa, n))).collect();
    let ec_tokens: Vec<HeaderMap> = (1..=20).map(|n| bearer(&token(&ec, n))).collect();
    rows.push(("JWT RS256, first check", first(&rt, &make, &rsa_tokens)));
    rows.push(("JWT ES256, first check", first(&rt, &make, &ec_tokens)));
    rows.push((
        "API key, argon2id, first check",
        first(&rt, &make, &[bearer(ARGON2_KEY)]),
    ));

    let base = rows[0].1;
    println!(
        "| authenticate | per call | vs off | added to a proxied request (~{PROXIED_REQUEST_CPU_US} µs of gateway CPU) |"
    );
    println!("|---|---|---|---|");
    for (name, t) in &rows {
        let added = t.saturating_sub(base).as_secs_f64() * 1e6;
        println!(
            "| {name} | {} | {:.1}× | +{:.1} % |",
            human(*t),
            t.as_secs_f64() / base.as_secs_f64(),
            100.0 * added / PROXIED_REQUEST_CPU_US
        );
    }
}

fn human(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns < 10_000 {
        format!("{ns} ns")
    } else if ns < 10_000_000 {
        format!("{:.1} µs", ns as f64 / 1e3)
    } else {
        format!("{:.1} ms", ns as f64 / 1e6)
    }
}
