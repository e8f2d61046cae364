//! A request's session key, from where `spec.sessions` says: a header,
//! a claim of the caller's verified token, or the body's `user`. The key
//! is hashed with the caller's tenant, so two tenants' sessions of the
//! same name are two sessions. The picker keeps a session on its replica
//! (`picker::session`); a rewrite keeps it on its first target.

use http::{HeaderMap, HeaderName, header};
use serde_json::{Map, Value};

/// Where session keys come from in one generation.
#[derive(Debug, Default)]
pub struct SessionKeys {
    header: Option<HeaderName>,
    jwt_claim: Option<String>,
    user: bool,
}

impl SessionKeys {
    pub fn new(sessions: Option<&config::Sessions>) -> Self {
        let Some(s) = sessions else {
            return Self::default();
        };
        Self {
            // Validation refused names that are not header names.
            header: s
                .header
                .as_deref()
                .and_then(|h| HeaderName::from_bytes(h.as_bytes()).ok()),
            jwt_claim: s.jwt_claim.clone(),
            user: s.user,
        }
    }

    /// The request's session key, hashed with its tenant; `None` without
    /// one. `token_verified`: the caller authenticated with the bearer
    /// token in `Authorization`, so its claims may be read.
    pub fn key(
        &self,
        tenant: &str,
        headers: &HeaderMap,
        token_verified: bool,
        user: Option<&str>,
    ) -> Option<u64> {
        let from_header = || {
            let name = self.header.as_ref()?;
            headers.get(name).map(|v| v.as_bytes().to_vec())
        };
        let from_claim = || {
            let claim = self.jwt_claim.as_deref().filter(|_| token_verified)?;
            claim_of(headers, claim)
        };
        let from_user = || user.filter(|_| self.user).map(|u| u.as_bytes().to_vec());
        let key = from_header()
            .or_else(from_claim)
            .or_else(from_user)
            .filter(|k| !k.is_empty())?;
        let mut scoped = Vec::with_capacity(tenant.len() + 1 + key.len());
        scoped.extend_from_slice(tenant.as_bytes());
        scoped.push(0);
        scoped.extend_from_slice(&key);
        Some(picker::session_key(&scoped))
    }
}

/// A claim of the caller's token, as bytes (strings as they are, other
/// values as JSON). The token is found where authentication found it (a
/// bearer token in `Authorization`, else `x-api-key`) and read without
/// checking its signature: only call this once authentication has
/// verified that very token.
fn claim_of(headers: &HeaderMap, claim: &str) -> Option<Vec<u8>> {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token);
    let token = match bearer {
        Some(token) => token,
        None => headers.get("x-api-key")?.to_str().ok()?,
    }
    .trim_matches(' ');
    let claims =
        jsonwebtoken::dangerous::insecure_decode_claims::<Map<String, Value>>(token).ok()?;
    match claims.get(claim)? {
        Value::String(s) => Some(s.as_bytes().to_vec()),
        Value::Null => None,
        other => Some(other.to_string().into_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(header: Option<&str>, jwt_claim: Option<&str>, user: bool) -> SessionKeys {
        SessionKeys::new(Some(&config::Sessions {
            header: header.map(str::to_owned),
            jwt_claim: jwt_claim.map(str::to_owned),
            user,
            ..config::Sessions::default()
        }))
    }

    #[test]
    fn header_then_claim_then_user() {
        let k = keys(Some("x-session-id"), None, true);
        let mut h = HeaderMap::new();
        let by_user = k.key("t", &h, false, Some("alice")).unwrap();
        h.insert("x-session-id", "s1".parse().unwrap());
        let by_header = k.key("t", &h, false, Some("alice")).unwrap();
        assert_ne!(by_user, by_header);
        assert_eq!(k.key("t", &h, false, None), Some(by_header));
        // Another tenant's session of the same name is another session.
        assert_ne!(k.key("u", &h, false, None), Some(by_header));
        assert_eq!(
            keys(Some("x-session-id"), None, false).key("t", &HeaderMap::new(), false, Some("a")),
            None
        );
    }

    #[test]
    fn a_claim_only_of_a_verified_token() {
        // {"alg":"none"}.{"sub":"a","sid":"chat-1"}.
        let token = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJhIiwic2lkIjoiY2hhdC0xIn0.";
        let mut h = HeaderMap::new();
        h.insert(
            header::AUTHORIZATION,
            format!("Bearer {token}").parse().unwrap(),
        );
        let k = keys(None, Some("sid"), false);
        assert!(k.key("t", &h, true, None).is_some());
        assert_eq!(k.key("t", &h, false, None), None);
        assert_eq!(
            keys(None, Some("nope"), false).key("t", &h, true, None),
            None
        );
    }
}
