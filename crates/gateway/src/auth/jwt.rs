//! JSON Web Tokens: which issuer, which key, then `jsonwebtoken` checks
//! the signature and the registered claims; this module only chooses what
//! it checks against and reads the gateway's own claims afterwards.
//!
//! The issuer is chosen by the token's `iss` (read before verification,
//! only to choose: the verification then requires that same `iss`). Each
//! issuer accepts only its pinned algorithms — asymmetric ones; the config
//! refuses `none` and HMAC — and only keys of its own JWKS, and a key only
//! for the algorithms its type (or its own `alg`) allows, so a public key
//! is never used as an HMAC secret. `exp` and `aud` are required, `nbf`
//! checked when present, both with the configured leeway.
//!
//! A token that passed is remembered by its SHA-256, until its `exp` and
//! for at most [`JWT_CACHE_TTL`], as long as its issuer's keys are
//! unchanged: a client reusing its token costs one hash per request.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use config::Priority;
use config::defaults::JWT_CACHE_TTL;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, Header, Validation};
use serde_json::{Map, Value};
use sha2::{Digest as _, Sha256};

use super::cache::{Bounded, Digest};
use super::jwks::{Jwks, Key};
use super::refusal::{Reason, Refusal};
use super::tenants::Globs;

/// Verified tokens remembered at once.
const REMEMBERED: usize = 10_000;
/// Keys tried for a token without a `kid`.
const MAX_KEYS_TRIED: usize = 8;

/// What a verified token says about its caller.
#[derive(Debug, Clone)]
pub struct TokenClaims {
    pub issuer: Arc<str>,
    pub tenant: Arc<str>,
    /// The token's models claim: narrower than its tenant's.
    pub models: Option<Arc<Globs>>,
    /// The token's priority claim: may lower its tenant's ceiling.
    pub max_priority: Option<Priority>,
}

pub struct JwtVerifier {
    issuers: HashMap<String, Issuer>,
    remembered: Bounded<Remembered>,
    leeway: Duration,
}

struct Issuer {
    name: Arc<str>,
    jwks: Arc<Jwks>,
    /// One validation per pinned algorithm.
    validations: Vec<(Algorithm, Validation)>,
    tenant_claim: String,
    models_claim: Option<String>,
    priority_claim: Option<String>,
}

#[derive(Clone)]
struct Remembered {
    claims: TokenClaims,
    until: Instant,
    jwks: Arc<Jwks>,
    keys_version: u64,
}

impl JwtVerifier {
    /// `jwks` has each issuer's key set, in the config's order.
    pub fn new(config: &config::Jwt, jwks: Vec<Arc<Jwks>>) -> Self {
        let leeway = config.leeway();
        let issuers = config
            .issuers
            .iter()
            .zip(jwks)
            .map(|(issuer, jwks)| {
                let validations = issuer
                    .algorithms
                    .iter()
                    .filter_map(|name| name.parse::<Algorithm>().ok())
                    .map(|alg| (alg, validation(issuer, alg, leeway)))
                    .collect();
                let issuer_config = Issuer {
                    name: Arc::from(issuer.issuer.as_str()),
                    jwks,
                    validations,
                    tenant_claim: issuer.tenant_claim().to_owned(),
                    models_claim: issuer.models_claim.clone(),
                    priority_claim: issuer.priority_claim.clone(),
                };
                (issuer.issuer.clone(), issuer_config)
            })
            .collect();
        Self {
            issuers,
            remembered: Bounded::new(REMEMBERED),
            leeway,
        }
    }

    pub async fn verify(&self, token: &str) -> Result<TokenClaims, Refusal> {
        let digest: Digest = Sha256::digest(token.as_bytes()).into();
        if let Some(r) = self.remembered.get(&digest) {
            if r.until > Instant::now() && r.jwks.version() == r.keys_version {
                return Ok(r.claims);
            }
            self.remembered.remove(&digest);
        }
        let header = jsonwebtoken::decode_header(token).map_err(|e| header_refusal(token, &e))?;
        let issuer = self.issuer(token)?;
        let Some(validation) = issuer
            .validations
            .iter()
            .find(|(alg, _)| *alg == header.alg)
            .map(|(_, v)| v)
        else {
            return Err(Refusal::new(
                Reason::AlgorithmNotAllowed,
                format!("{:?} is not pinned for issuer {}", header.alg, issuer.name),
            ));
        };
        let keys_version = issuer.jwks.version();
        let claims = self
            .check_signature(issuer, &header, token, validation)
            .await?;
        let claims_read = read_claims(issuer, &claims)?;
        if let Some(until) = self.remember_until(&claims) {
            self.remembered.insert(
                digest,
                Remembered {
                    claims: claims_read.clone(),
                    until,
                    jwks: Arc::clone(&issuer.jwks),
                    keys_version,
                },
            );
        }
        Ok(claims_read)
    }

    /// The issuer the token names: read without verification, only to
    /// choose what to verify it against.
    fn issuer(&self, token: &str) -> Result<&Issuer, Refusal> {
        #[derive(serde::Deserialize)]
        struct Iss {
            #[serde(default)]
            iss: Option<Value>,
        }
        let iss = jsonwebtoken::dangerous::insecure_decode_claims::<Iss>(token)
            .map_err(|e| Refusal::new(Reason::Malformed, format!("claims unreadable: {e}")))?
            .iss;
        match iss {
            Some(Value::String(iss)) => self.issuers.get(&iss).ok_or_else(|| {
                Refusal::new(
                    Reason::WrongIssuer,
                    format!("issuer {iss:?} is not configured"),
                )
            }),
            Some(other) => Err(Refusal::new(
                Reason::WrongIssuer,
                format!("`iss` is not a string: {other}"),
            )),
            None => Err(Refusal::new(Reason::MissingClaim, "no `iss`".to_owned())),
        }
    }

    /// The token's claims once its signature and registered claims pass.
    async fn check_signature(
        &self,
        issuer: &Issuer,
        header: &Header,
        token: &str,
        validation: &Validation,
    ) -> Result<Map<String, Value>, Refusal> {
        let candidates = match &header.kid {
            Some(kid) => vec![self.key(issuer, kid).await?],
            None => {
                let keys = issuer.jwks.keys();
                if !issuer.jwks.is_loaded() {
                    return Err(unavailable(issuer));
                }
                keys.without_kid
                    .iter()
                    .chain(keys.by_kid.values())
                    .filter(|k| k.algorithms.contains(&header.alg))
                    .take(MAX_KEYS_TRIED)
                    .cloned()
                    .collect()
            }
        };
        let mut last = Refusal::new(
            Reason::UnknownKey,
            format!(
                "no key of issuer {} verifies {:?} without a kid",
                issuer.name, header.alg
            ),
        );
        for key in candidates {
            if !key.algorithms.contains(&header.alg) {
                last = Refusal::new(
                    Reason::AlgorithmNotAllowed,
                    format!("key {:?} does not verify {:?}", header.kid, header.alg),
                );
                continue;
            }
            match jsonwebtoken::decode::<Map<String, Value>>(token, &key.decoding, validation) {
                Ok(data) => return Ok(data.claims),
                Err(e) => last = decode_refusal(e.kind(), &issuer.name),
            }
        }
        Err(last)
    }

    /// The key `kid` of the issuer, fetching its JWKS again if it lacks it.
    async fn key(&self, issuer: &Issuer, kid: &str) -> Result<Arc<Key>, Refusal> {
        if let Some(key) = issuer.jwks.keys().by_kid.get(kid) {
            return Ok(Arc::clone(key));
        }
        let fetched = issuer.jwks.refetch().await;
        if let Some(key) = issuer.jwks.keys().by_kid.get(kid) {
            return Ok(Arc::clone(key));
        }
        if !issuer.jwks.is_loaded() {
            return Err(unavailable(issuer));
        }
        let how = if fetched {
            "fetched again, still not there"
        } else {
            "not fetched again: fetched moments ago"
        };
        Err(Refusal::new(
            Reason::UnknownKey,
            format!("kid {kid:?} is not in {} ({how})", issuer.jwks.describe()),
        ))
    }

    /// When to forget a verified token: at its `exp` (plus the leeway
    /// verification allows), and no later than [`JWT_CACHE_TTL`] from now.
    fn remember_until(&self, claims: &Map<String, Value>) -> Option<Instant> {
        let exp = claims.get("exp")?.as_f64()?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .ok()?
            .as_secs_f64();
        let left = exp + self.leeway.as_secs_f64() - now;
        if !left.is_finite() || left <= 0.0 {
            return None;
        }
        let left = Duration::from_secs_f64(left.min(JWT_CACHE_TTL.as_secs_f64()));
        Some(Instant::now() + left)
    }
}

fn validation(issuer: &config::JwtIssuer, alg: Algorithm, leeway: Duration) -> Validation {
    let mut v = Validation::new(alg);
    v.set_issuer(&[&issuer.issuer]);
    v.set_audience(&issuer.audiences);
    v.set_required_spec_claims(&["exp", "iss", "aud"]);
    v.validate_exp = true;
    v.validate_nbf = true;
    v.validate_aud = true;
    v.leeway = leeway.as_secs();
    v
}

fn unavailable(issuer: &Issuer) -> Refusal {
    Refusal {
        reason: Reason::KeysUnavailable,
        detail: format!("the JWKS of issuer {} was never read", issuer.name),
    }
}

/// Why the header could not be read. An algorithm `jsonwebtoken` does not
/// know (`none`) makes the header unreadable: say so by name.
fn header_refusal(token: &str, e: &jsonwebtoken::errors::Error) -> Refusal {
    let alg = token
        .split('.')
        .next()
        .and_then(|h| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(h)
                .ok()
        })
        .and_then(|h| serde_json::from_slice::<Value>(&h).ok())
        .and_then(|h| h.get("alg").and_then(Value::as_str).map(str::to_owned));
    match alg {
        Some(alg) if alg.parse::<Algorithm>().is_err() => Refusal::new(
            Reason::AlgorithmNotAllowed,
            format!("algorithm {alg:?} is never accepted"),
        ),
        _ => Refusal::new(Reason::Malformed, format!("header unreadable: {e}")),
    }
}

fn decode_refusal(kind: &ErrorKind, issuer: &str) -> Refusal {
    let reason = match kind {
        ErrorKind::ExpiredSignature => Reason::Expired,
        ErrorKind::ImmatureSignature => Reason::NotYetValid,
        ErrorKind::InvalidSignature => Reason::BadSignature,
        ErrorKind::InvalidAudience => Reason::WrongAudience,
        ErrorKind::InvalidIssuer => Reason::WrongIssuer,
        ErrorKind::InvalidAlgorithm | ErrorKind::MissingAlgorithm => Reason::AlgorithmNotAllowed,
        ErrorKind::MissingRequiredClaim(_) => Reason::MissingClaim,
        ErrorKind::InvalidClaimFormat(_) => Reason::BadClaim,
        ErrorKind::InvalidEcdsaKey | ErrorKind::InvalidEddsaKey | ErrorKind::InvalidRsaKey(_) => {
            Reason::BadSignature
        }
        _ => Reason::Malformed,
    };
    Refusal::new(reason, format!("issuer {issuer}: {kind:?}"))
}

/// The gateway's claims: tenant, models, priority.
fn read_claims(issuer: &Issuer, claims: &Map<String, Value>) -> Result<TokenClaims, Refusal> {
    let tenant = match claims.get(&issuer.tenant_claim) {
        None => {
            return Err(Refusal::new(
                Reason::MissingClaim,
                format!("no `{}` (the tenant claim)", issuer.tenant_claim),
            ));
        }
        Some(Value::String(t)) if config::tenant_name(t).is_ok() => Arc::from(t.as_str()),
        Some(other) => {
            return Err(Refusal::new(
                Reason::BadClaim,
                format!("`{}` is not a tenant name: {other}", issuer.tenant_claim),
            ));
        }
    };
    let models = match issuer.models_claim.as_ref().map(|c| (c, claims.get(c))) {
        None | Some((_, None)) => None,
        Some((claim, Some(value))) => Some(Arc::new(models_claim(value).ok_or_else(|| {
            Refusal::new(
                Reason::BadClaim,
                format!("`{claim}` is neither a list of names nor a space-separated string"),
            )
        })?)),
    };
    let max_priority = match issuer.priority_claim.as_ref().map(|c| (c, claims.get(c))) {
        None | Some((_, None)) => None,
        Some((claim, Some(value))) => {
            Some(value.as_str().and_then(Priority::parse).ok_or_else(|| {
                Refusal::new(
                    Reason::BadClaim,
                    format!("`{claim}` is not critical, standard or sheddable: {value}"),
                )
            })?)
        }
    };
    Ok(TokenClaims {
        issuer: Arc::clone(&issuer.name),
        tenant,
        models,
        max_priority,
    })
}

/// `["llama-*", "qwen"]`, or `"llama-* qwen"` as OAuth scopes are written.
fn models_claim(value: &Value) -> Option<Globs> {
    match value {
        Value::String(s) => Some(Globs::new(&s.split_whitespace().collect::<Vec<_>>())),
        Value::Array(items) => {
            let names: Option<Vec<&str>> = items.iter().map(Value::as_str).collect();
            Some(Globs::new(&names?))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn models_claims_as_lists_or_scopes() {
        let list = models_claim(&json!(["llama-*", "qwen"])).unwrap();
        assert!(list.matches("llama-8b") && list.matches("qwen") && !list.matches("mistral"));
        let scopes = models_claim(&json!("llama-* qwen")).unwrap();
        assert!(scopes.matches("llama-8b") && scopes.matches("qwen"));
        assert!(models_claim(&json!([1])).is_none());
        assert!(models_claim(&json!({"a": 1})).is_none());
        assert!(!models_claim(&json!([])).unwrap().matches("m"));
    }

    #[test]
    fn an_unknown_algorithm_is_named_in_the_refusal() {
        let b64 = |v: Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
        let none = format!(
            "{}.{}.",
            b64(json!({"alg": "none"})),
            b64(json!({"sub": "x"}))
        );
        let e = jsonwebtoken::decode_header(&none).unwrap_err();
        assert_eq!(
            header_refusal(&none, &e).reason,
            Reason::AlgorithmNotAllowed
        );
        let junk = "e30.e30.";
        let e = jsonwebtoken::decode_header(junk).unwrap_err();
        assert_eq!(header_refusal(junk, &e).reason, Reason::Malformed);
    }
}
