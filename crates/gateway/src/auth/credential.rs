//! Finding the caller's credential in a request's header fields.
//!
//! `Authorization: Bearer <credential>` is what the OpenAI SDKs send for
//! `api_key`; `x-api-key` is what Anthropic's SDKs and many scripts send.
//! Either may carry an API key or a JWT: a JWT is told apart by its shape
//! (three base64url parts joined by dots; API keys have no dots).

use http::header::{AUTHORIZATION, HeaderMap, HeaderName};

use super::refusal::Reason;

/// Statics, not constants: an [`Identity`](super::Identity) keeps a
/// `'static` reference to the field that carried its credential.
pub static X_API_KEY: HeaderName = HeaderName::from_static("x-api-key");
pub static AUTHORIZATION_FIELD: HeaderName = AUTHORIZATION;

/// Longest credential looked at. Generated API keys are 46 bytes; JWTs
/// of identity providers are one or two kilobytes, rarely more than four.
/// Longer ones are refused before any work is done on them.
pub const MAX_CREDENTIAL_BYTES: usize = 8 * 1024;

/// The credential a request carries, and where it came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Credential<'a> {
    pub value: &'a str,
    pub header: &'static HeaderName,
}

impl Credential<'_> {
    /// Whether it has the shape of a JWS compact serialization.
    pub fn is_jwt(&self) -> bool {
        self.value.bytes().filter(|&b| b == b'.').count() == 2
    }
}

/// What the request carries cannot be a credential (two different
/// credentials, a scheme other than Bearer, bytes that are not text, one
/// too long); the credential when there is one.
#[derive(Debug, PartialEq, Eq)]
pub struct Unusable<'a> {
    pub reason: Reason,
    pub credential: Option<Credential<'a>>,
}

impl From<Reason> for Unusable<'_> {
    fn from(reason: Reason) -> Self {
        Self {
            reason,
            credential: None,
        }
    }
}

/// The request's credential: `None` when it has none.
pub fn find(headers: &HeaderMap) -> Result<Option<Credential<'_>>, Unusable<'_>> {
    let bearer = one(headers, &AUTHORIZATION_FIELD)?
        .map(|v| {
            let (scheme, rest) = v.split_once(' ').ok_or(Reason::Malformed)?;
            if !scheme.eq_ignore_ascii_case("bearer") {
                return Err(Reason::Malformed);
            }
            Ok(Credential {
                value: rest.trim_matches(' '),
                header: &AUTHORIZATION_FIELD,
            })
        })
        .transpose()?;
    let key = one(headers, &X_API_KEY)?.map(|v| Credential {
        value: v.trim_matches(' '),
        header: &X_API_KEY,
    });
    let found = match (bearer, key) {
        (Some(b), Some(k)) if b.value != k.value => return Err(Reason::Conflicting.into()),
        (Some(b), _) => b,
        (None, Some(k)) => k,
        (None, None) => return Ok(None),
    };
    if found.value.is_empty() {
        return Err(Reason::Malformed.into());
    }
    if found.value.len() > MAX_CREDENTIAL_BYTES {
        return Err(Unusable {
            reason: Reason::TooLong,
            credential: Some(found),
        });
    }
    Ok(Some(found))
}

/// The one value of header `name`, as text.
fn one<'h>(headers: &'h HeaderMap, name: &HeaderName) -> Result<Option<&'h str>, Reason> {
    let mut values = headers.get_all(name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(Reason::Conflicting);
    }
    value.to_str().map(Some).map_err(|_| Reason::Malformed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (n, v) in pairs {
            map.append(
                HeaderName::from_bytes(n.as_bytes()).unwrap(),
                v.parse().unwrap(),
            );
        }
        map
    }

    fn found(pairs: &[(&str, &str)]) -> Result<Option<(String, &'static str)>, Reason> {
        let h = headers(pairs);
        find(&h)
            .map(|c| c.map(|c| (c.value.to_owned(), c.header.as_str())))
            .map_err(|e| e.reason)
    }

    #[test]
    fn bearer_or_x_api_key() {
        let bearer = Ok(Some(("k1".to_owned(), "authorization")));
        assert_eq!(found(&[("authorization", "Bearer k1")]), bearer);
        assert_eq!(found(&[("authorization", "bearer  k1 ")]), bearer);
        assert_eq!(
            found(&[("x-api-key", "k1")]),
            Ok(Some(("k1".to_owned(), "x-api-key")))
        );
        assert_eq!(
            found(&[("x-api-key", "k1"), ("authorization", "Bearer k1")]),
            bearer
        );
        assert_eq!(found(&[]), Ok(None));
    }

    #[test]
    fn what_cannot_be_a_credential() {
        assert_eq!(
            found(&[("authorization", "Basic dTpw")]),
            Err(Reason::Malformed)
        );
        assert_eq!(
            found(&[("authorization", "Bearer")]),
            Err(Reason::Malformed)
        );
        assert_eq!(
            found(&[("authorization", "Bearer  ")]),
            Err(Reason::Malformed)
        );
        assert_eq!(
            found(&[("x-api-key", "k1"), ("authorization", "Bearer k2")]),
            Err(Reason::Conflicting)
        );
        assert_eq!(
            found(&[("x-api-key", "k1"), ("x-api-key", "k1")]),
            Err(Reason::Conflicting)
        );
        let long = "k".repeat(MAX_CREDENTIAL_BYTES + 1);
        assert_eq!(found(&[("x-api-key", &long)]), Err(Reason::TooLong));
        let h = headers(&[("x-api-key", &long)]);
        assert_eq!(find(&h).unwrap_err().credential.unwrap().value, long);
        let mut h = HeaderMap::new();
        h.insert(&X_API_KEY, http::HeaderValue::from_bytes(b"k\xff").unwrap());
        assert_eq!(find(&h).unwrap_err().reason, Reason::Malformed);
    }

    #[test]
    fn jwts_by_their_shape() {
        let c = |value| Credential {
            value,
            header: &AUTHORIZATION_FIELD,
        };
        assert!(c("eyJh.eyJi.sig").is_jwt());
        assert!(!c("ig-abc_DEF-123").is_jwt());
        assert!(!c("a.b").is_jwt());
    }
}
