//! Why a credential was refused: the word the client is told, and the
//! error the pipeline answers with.

use crate::error::ApiError;

/// Target of authentication's logs: `INFERGATE_LOG=info,infergate::auth=debug`
/// shows why each credential was refused.
pub const AUTH_TARGET: &str = "infergate::auth";

/// Why a credential was refused: the word the client is told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    /// No credential, and one is required.
    Missing,
    /// Not a credential at all: a scheme other than Bearer, a token that
    /// does not decode.
    Malformed,
    /// Two different credentials in one request.
    Conflicting,
    TooLong,
    /// No configured API key is this one; no key of the issuer has this
    /// `kid` (after fetching its keys again).
    UnknownKey,
    Expired,
    NotYetValid,
    BadSignature,
    WrongAudience,
    /// The token's `iss` is not a configured issuer.
    WrongIssuer,
    /// `none`, HMAC, or an algorithm not pinned for the issuer or its key.
    AlgorithmNotAllowed,
    MissingClaim,
    BadClaim,
    /// The issuer's keys were never read (not the caller's fault: 503).
    KeysUnavailable,
    /// Every argon2id check is busy (503).
    Busy,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Missing => "missing",
            Reason::Malformed => "malformed",
            Reason::Conflicting => "conflicting_credentials",
            Reason::TooLong => "too_long",
            Reason::UnknownKey => "unknown_key",
            Reason::Expired => "expired",
            Reason::NotYetValid => "not_yet_valid",
            Reason::BadSignature => "bad_signature",
            Reason::WrongAudience => "wrong_audience",
            Reason::WrongIssuer => "wrong_issuer",
            Reason::AlgorithmNotAllowed => "algorithm_not_allowed",
            Reason::MissingClaim => "missing_claim",
            Reason::BadClaim => "bad_claim",
            Reason::KeysUnavailable => "keys_unavailable",
            Reason::Busy => "busy",
        }
    }
}

/// A reason and, for the log, everything known about it.
#[derive(Debug)]
pub struct Refusal {
    pub reason: Reason,
    pub detail: String,
}

impl Refusal {
    pub(super) fn new(reason: Reason, detail: String) -> Self {
        Self { reason, detail }
    }
}

/// What kind of credential was refused: decides the error's `code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    ApiKey,
    Token,
}

/// Authentication failed.
#[derive(Debug)]
pub struct AuthError {
    pub kind: Kind,
    pub reason: Reason,
}

impl AuthError {
    /// The metrics label of the credential kind.
    pub fn credential(&self) -> &'static str {
        match self.kind {
            Kind::ApiKey => "api_key",
            Kind::Token => "token",
        }
    }

    pub fn into_api(self) -> ApiError {
        match self.reason {
            Reason::KeysUnavailable => {
                ApiError::auth_unavailable("the issuer's keys could not be fetched yet")
            }
            Reason::Busy => ApiError::auth_unavailable("every API key check is busy"),
            reason => {
                let code = match self.kind {
                    Kind::ApiKey => "invalid_api_key",
                    Kind::Token => "invalid_token",
                };
                ApiError::unauthorized(code, reason.as_str(), reason == Reason::Missing)
            }
        }
    }
}
