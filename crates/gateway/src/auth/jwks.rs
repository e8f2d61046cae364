//! An issuer's signing keys (a JWKS), fetched from its URL or read from a
//! file, kept current by a task of its own: every `refreshInterval`, and at
//! once when a token names a key the set does not hold — at most once per
//! [`JWKS_MIN_REFETCH`], so tokens with made-up `kid`s cannot make the
//! gateway hammer the issuer. Requests never fetch: they read the current
//! set, or wait for the task's next fetch.
//!
//! A `Jwks` outlives generations (see `sources.rs`): a reload that names
//! the same URL or file keeps the keys fetched, and no token is refused
//! for lack of keys while they are fetched again.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use config::defaults::{JWKS_FETCH_TIMEOUT, JWKS_MIN_REFETCH};
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use parking_lot::Mutex;
use sha2::{Digest as _, Sha256};
use tokio::sync::{Notify, watch};

use super::refusal::AUTH_TARGET;

/// Largest JWKS read; real ones are a few kilobytes.
const MAX_JWKS_BYTES: usize = 1024 * 1024;
/// Keys kept from one JWKS; real ones hold two or three.
const MAX_KEYS: usize = 100;

/// One verification key of a set.
pub struct Key {
    pub decoding: DecodingKey,
    /// The algorithms this key may verify: its own `alg` when the JWK
    /// names one, else those of its type and curve.
    pub algorithms: Vec<Algorithm>,
}

/// The keys of one reading of a JWKS.
#[derive(Default)]
pub struct KeySet {
    pub by_kid: HashMap<String, Arc<Key>>,
    /// Keys without a `kid`, for tokens without one.
    pub without_kid: Vec<Arc<Key>>,
    /// SHA-256 of the document they were read from.
    fingerprint: [u8; 32],
}

impl KeySet {
    /// Read a JWKS document. Keys that cannot verify signatures (symmetric
    /// keys, encryption keys, unknown types) are left out, each logged.
    pub fn parse(bytes: &[u8]) -> Result<Self, String> {
        #[derive(serde::Deserialize)]
        struct Document {
            keys: Vec<serde_json::Value>,
        }
        let document: Document =
            serde_json::from_slice(bytes).map_err(|e| format!("not a JWKS: {e}"))?;
        let mut set = KeySet {
            fingerprint: Sha256::digest(bytes).into(),
            ..KeySet::default()
        };
        for value in document.keys.into_iter().take(MAX_KEYS) {
            let kid = value.get("kid").and_then(|k| k.as_str()).map(str::to_owned);
            let key = match serde_json::from_value::<Jwk>(value)
                .map_err(|e| e.to_string())
                .and_then(|jwk| verification_key(&jwk))
            {
                Ok(key) => Arc::new(key),
                Err(why) => {
                    tracing::debug!(target: AUTH_TARGET, kid = kid.as_deref(), why, "JWKS key left out");
                    continue;
                }
            };
            match kid {
                Some(kid) => {
                    set.by_kid.insert(kid, key);
                }
                None => set.without_kid.push(key),
            }
        }
        Ok(set)
    }

    pub fn count(&self) -> usize {
        self.by_kid.len() + self.without_kid.len()
    }
}

/// A JWK as a key that verifies signatures, or why it cannot be one.
fn verification_key(jwk: &Jwk) -> Result<Key, String> {
    if let Some(usage) = &jwk.common.public_key_use
        && *usage != PublicKeyUse::Signature
    {
        return Err("not a signature key (`use`)".to_owned());
    }
    let by_type: Vec<Algorithm> = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => vec![
            Algorithm::RS256,
            Algorithm::RS384,
            Algorithm::RS512,
            Algorithm::PS256,
            Algorithm::PS384,
            Algorithm::PS512,
        ],
        AlgorithmParameters::EllipticCurve(ec) => match ec.curve {
            EllipticCurve::P256 => vec![Algorithm::ES256],
            EllipticCurve::P384 => vec![Algorithm::ES384],
            _ => return Err("unsupported curve".to_owned()),
        },
        AlgorithmParameters::OctetKeyPair(okp) => match okp.curve {
            EllipticCurve::Ed25519 => vec![Algorithm::EdDSA],
            _ => return Err("unsupported curve".to_owned()),
        },
        // A symmetric key is never accepted: a public document cannot hold
        // a shared secret.
        AlgorithmParameters::OctetKey(_) => return Err("a symmetric key".to_owned()),
        _ => return Err("an unknown key type".to_owned()),
    };
    let algorithms = match jwk.common.key_algorithm {
        None => by_type,
        Some(alg) => {
            let alg = Algorithm::try_from(alg).map_err(|_| format!("`alg` {alg} cannot sign"))?;
            if !by_type.contains(&alg) {
                return Err(format!("`alg` {alg:?} does not fit the key's type"));
            }
            vec![alg]
        }
    };
    let decoding = DecodingKey::from_jwk(jwk).map_err(|e| e.to_string())?;
    Ok(Key {
        decoding,
        algorithms,
    })
}

/// Where a JWKS comes from.
pub enum Source {
    Url {
        url: String,
        client: reqwest::Client,
    },
    File(PathBuf),
}

impl Source {
    fn describe(&self) -> String {
        match self {
            Source::Url { url, .. } => url.clone(),
            Source::File(path) => path.display().to_string(),
        }
    }

    async fn read(&self) -> Result<Vec<u8>, String> {
        match self {
            Source::File(path) => tokio::fs::read(path).await.map_err(|e| e.to_string()),
            Source::Url { url, client } => {
                let fetch = async {
                    let mut response = client.get(url).send().await.map_err(|e| e.to_string())?;
                    if response.status() != reqwest::StatusCode::OK {
                        return Err(format!("answered {}", response.status()));
                    }
                    let mut body = Vec::new();
                    while let Some(chunk) = response.chunk().await.map_err(|e| e.to_string())? {
                        if body.len() + chunk.len() > MAX_JWKS_BYTES {
                            return Err(format!("larger than {MAX_JWKS_BYTES} bytes"));
                        }
                        body.extend_from_slice(&chunk);
                    }
                    Ok(body)
                };
                tokio::time::timeout(JWKS_FETCH_TIMEOUT, fetch)
                    .await
                    .unwrap_or_else(|_| Err(format!("no answer within {JWKS_FETCH_TIMEOUT:?}")))
            }
        }
    }
}

/// One issuer's JWKS, kept current. Dropping it stops its task.
pub struct Jwks {
    inner: Arc<Inner>,
}

struct Inner {
    source: Source,
    keys: ArcSwap<KeySet>,
    /// Changes when the keys change (not on every fetch): what verified
    /// tokens are remembered with.
    version: AtomicU64,
    /// Whether keys were ever read.
    loaded: AtomicBool,
    interval_ms: AtomicU64,
    fetches: Mutex<Fetches>,
    /// The number of fetches finished, failed ones included.
    finished: watch::Sender<u64>,
    wake: Notify,
    stopped: AtomicBool,
}

#[derive(Default)]
struct Fetches {
    started: u64,
    /// When the latest fetch started or was asked for.
    last: Option<Instant>,
    /// A token asked for a fetch that has not started yet.
    asked: bool,
}

impl Drop for Jwks {
    fn drop(&mut self) {
        self.inner.stopped.store(true, Ordering::Relaxed);
        self.inner.wake.notify_one();
    }
}

impl Jwks {
    /// Start keeping the JWKS at `source` current. A file is read now (and
    /// must be valid); a URL is fetched by the task at once, and tokens
    /// arriving before it answers wait for that fetch.
    pub fn start(source: Source, interval: Duration) -> Result<Arc<Self>, String> {
        let mut keys = KeySet::default();
        let loaded = match &source {
            Source::File(path) => {
                let bytes = std::fs::read(path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
                keys = KeySet::parse(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
                true
            }
            Source::Url { .. } => false,
        };
        let inner = Arc::new(Inner {
            source,
            keys: ArcSwap::from_pointee(keys),
            version: AtomicU64::new(0),
            loaded: AtomicBool::new(loaded),
            interval_ms: AtomicU64::new(millis(interval)),
            fetches: Mutex::new(Fetches::default()),
            finished: watch::Sender::new(0),
            wake: Notify::new(),
            stopped: AtomicBool::new(false),
        });
        tokio::spawn(Arc::clone(&inner).run(!loaded));
        Ok(Arc::new(Self { inner }))
    }

    /// The keys in force.
    pub fn keys(&self) -> Arc<KeySet> {
        self.inner.keys.load_full()
    }

    pub fn version(&self) -> u64 {
        self.inner.version.load(Ordering::Acquire)
    }

    pub fn is_loaded(&self) -> bool {
        self.inner.loaded.load(Ordering::Acquire)
    }

    pub fn describe(&self) -> String {
        self.inner.source.describe()
    }

    /// A reload may change how often the set is fetched.
    pub fn set_interval(&self, interval: Duration) {
        let new = millis(interval);
        if self.inner.interval_ms.swap(new, Ordering::Relaxed) != new {
            self.inner.wake.notify_one();
        }
    }

    /// A token names a key the set does not hold (or the set was never
    /// read): have the set fetched again, unless a fetch started within
    /// [`JWKS_MIN_REFETCH`], and wait for it. Returns whether a fetch
    /// finished meanwhile; its keys are then in [`Jwks::keys`].
    pub async fn refetch(&self) -> bool {
        let inner = &self.inner;
        let mut finished = inner.finished.subscribe();
        let target = {
            let mut fetches = inner.fetches.lock();
            let done = *finished.borrow_and_update();
            if fetches.started > done {
                // One is under way: wait for it.
                fetches.started
            } else if fetches.last.is_some_and(|l| l.elapsed() < JWKS_MIN_REFETCH) {
                return false;
            } else {
                fetches.last = Some(Instant::now());
                fetches.asked = true;
                inner.wake.notify_one();
                fetches.started + 1
            }
        };
        let waited = tokio::time::timeout(
            JWKS_FETCH_TIMEOUT + Duration::from_secs(1),
            finished.wait_for(|&done| done >= target),
        )
        .await;
        matches!(waited, Ok(Ok(_)))
    }
}

impl Inner {
    async fn run(self: Arc<Self>, fetch_first: bool) {
        if fetch_first {
            self.fetch().await;
        }
        loop {
            let interval = Duration::from_millis(self.interval_ms.load(Ordering::Relaxed));
            let sleep = tokio::time::sleep(interval);
            tokio::select! {
                () = sleep => {}
                () = self.wake.notified() => {}
            }
            if self.stopped.load(Ordering::Relaxed) {
                return;
            }
            // Woken with neither a token asking nor the interval over: the
            // interval changed; sleep the new one.
            let go = {
                let f = self.fetches.lock();
                f.asked || f.last.is_none_or(|l| l.elapsed() >= interval)
            };
            if go {
                self.fetch().await;
            }
        }
    }

    async fn fetch(&self) {
        let number = {
            let mut f = self.fetches.lock();
            f.started += 1;
            f.last = Some(Instant::now());
            f.asked = false;
            f.started
        };
        let source = self.source.describe();
        match self
            .source
            .read()
            .await
            .and_then(|bytes| KeySet::parse(&bytes))
        {
            Ok(keys) if keys.fingerprint == self.keys.load().fingerprint => {
                tracing::debug!(target: AUTH_TARGET, jwks = %source, "JWKS unchanged");
            }
            Ok(keys) => {
                tracing::info!(target: AUTH_TARGET, jwks = %source, keys = keys.count(),
                    kids = ?keys.by_kid.keys().collect::<Vec<_>>(), "JWKS loaded");
                self.keys.store(Arc::new(keys));
                self.version.fetch_add(1, Ordering::AcqRel);
                self.loaded.store(true, Ordering::Release);
            }
            Err(e) => tracing::warn!(target: AUTH_TARGET, jwks = %source, error = %e,
                "cannot read the JWKS; the keys read before stay in force"),
        }
        self.finished.send_modify(|done| *done = number.max(*done));
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}
