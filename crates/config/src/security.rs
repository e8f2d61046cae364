//! Who may call the gateway, over what, and how much: TLS on listeners and
//! to replicas, authentication (API keys, JWT, client certificates),
//! tenants, and rate limits. docs/security.md describes every field.

use std::collections::BTreeMap;
use std::time::Duration;

use picker::flow::Priority;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::defaults;

/// TLS on a public or admin listener.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ListenerTls {
    /// PEM certificate chain, leaf first. Reloaded when the file changes.
    pub cert_file: String,
    /// PEM private key (PKCS#8, PKCS#1 RSA or SEC1 EC).
    pub key_file: String,
    /// PEM certificates of the CAs that sign client certificates; client
    /// certificates are not asked for when absent.
    #[serde(default)]
    pub client_ca_file: Option<String>,
    #[serde(default)]
    pub client_auth: ClientAuth,
}

/// Whether a client must present a certificate (with `clientCaFile`).
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum ClientAuth {
    /// A client without a valid certificate is refused in the handshake.
    #[default]
    Require,
    /// A client may present one; an invalid one is still refused.
    Optional,
}

/// TLS to a pool's replicas (`https://` endpoints).
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UpstreamTls {
    /// PEM CA certificates the replicas' certificates chain to; the
    /// system's roots when absent.
    #[serde(default)]
    pub ca_file: Option<String>,
    /// Accept any certificate. For testing only: it gives up the point of TLS.
    #[serde(default)]
    pub insecure_skip_verify: bool,
    /// Name checked against the replicas' certificates (and sent as SNI);
    /// the endpoint's host when absent.
    #[serde(default)]
    pub server_name: Option<String>,
    /// A client certificate for replicas that ask for one.
    #[serde(default)]
    pub cert_file: Option<String>,
    #[serde(default)]
    pub key_file: Option<String>,
}

/// How callers prove who they are. When the section is absent, a gateway
/// with a listener beyond loopback refuses to start.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Auth {
    /// `required` (the default): a request without a valid credential is
    /// refused with 401. `none`: every caller is anonymous, on purpose.
    #[serde(default)]
    pub mode: AuthMode,
    #[serde(default)]
    pub api_keys: Option<ApiKeys>,
    #[serde(default)]
    pub jwt: Option<Jwt>,
    /// Callers identified by a verified client certificate (a listener's
    /// `tls.clientCaFile`).
    #[serde(default)]
    pub client_certificates: Option<ClientCertificates>,
    /// Header that carries the caller's tenant to replicas; not sent when
    /// absent.
    #[serde(default)]
    pub tenant_header: Option<String>,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum AuthMode {
    #[default]
    Required,
    None,
}

/// API keys, stored as hashes. `infergate keys new --tenant NAME` makes one.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApiKeys {
    #[serde(default)]
    pub keys: Vec<ApiKey>,
    /// A YAML file holding a list of the same entries (a mounted Kubernetes
    /// Secret), read at start and again whenever it changes.
    #[serde(default)]
    pub file: Option<String>,
}

/// One key: its hash and whose it is. Exactly one of `sha256` and
/// `argon2id` is given.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApiKey {
    pub tenant: String,
    /// Lowercase hex SHA-256 of the key.
    #[serde(default)]
    pub sha256: Option<String>,
    /// A PHC string (`$argon2id$v=19$...`).
    #[serde(default)]
    pub argon2id: Option<String>,
    /// Shown in logs instead of the key.
    #[serde(default)]
    pub name: Option<String>,
}

/// JSON Web Tokens from one or more issuers.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Jwt {
    pub issuers: Vec<JwtIssuer>,
    /// Clock skew allowed on `exp` and `nbf`.
    #[serde(default, with = "humantime_serde")]
    #[schemars(schema_with = "crate::json_schema::duration")]
    pub leeway: Option<Duration>,
}

impl Jwt {
    pub fn leeway(&self) -> Duration {
        self.leeway.unwrap_or(defaults::JWT_LEEWAY)
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JwtIssuer {
    /// The `iss` a token must carry.
    pub issuer: String,
    /// A token's `aud` must name one of these.
    pub audiences: Vec<String>,
    /// Where the issuer's JWKS is served (`https://`; `http://` only on
    /// loopback). Exactly one of `jwksUrl` and `jwksFile` is given.
    #[serde(default)]
    pub jwks_url: Option<String>,
    #[serde(default)]
    pub jwks_file: Option<String>,
    /// How often the JWKS is fetched again (also fetched at once, at most
    /// every few seconds, when a token names an unknown `kid`).
    #[serde(default, with = "humantime_serde")]
    #[schemars(schema_with = "crate::json_schema::duration")]
    pub refresh_interval: Option<Duration>,
    /// Algorithms accepted from this issuer: `RS256`, `RS384`, `RS512`,
    /// `PS256`, `PS384`, `PS512`, `ES256`, `ES384`, `EdDSA`.
    pub algorithms: Vec<String>,
    /// Claim naming the tenant.
    #[serde(default)]
    pub tenant_claim: Option<String>,
    /// Claim listing the models the token may use (within its tenant's).
    #[serde(default)]
    pub models_claim: Option<String>,
    /// Claim naming the highest priority band the token may use (within
    /// its tenant's).
    #[serde(default)]
    pub priority_claim: Option<String>,
}

impl JwtIssuer {
    pub fn refresh_interval(&self) -> Duration {
        self.refresh_interval
            .unwrap_or(defaults::JWKS_REFRESH_INTERVAL)
    }
    pub fn tenant_claim(&self) -> &str {
        self.tenant_claim
            .as_deref()
            .unwrap_or(defaults::JWT_TENANT_CLAIM)
    }
}

/// Callers identified by their client certificate.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClientCertificates {
    /// Which part of the verified certificate names the tenant.
    #[serde(default)]
    pub tenant_from: CertificateName,
}

#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum CertificateName {
    /// The subject's common name.
    #[default]
    CommonName,
    /// The first DNS subject alternative name.
    DnsName,
}

/// One caller (or group of callers) of the gateway.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Tenant {
    pub name: String,
    /// Models and adapters the tenant may use, as globs (`llama-*`); every
    /// one when absent.
    #[serde(default)]
    pub models: Option<Vec<String>>,
    /// Highest priority band the tenant's requests may have; a header or a
    /// model's band never lifts a request above it.
    #[serde(default)]
    #[schemars(schema_with = "crate::json_schema::priority")]
    pub max_priority: Option<Priority>,
    /// Share of a saturated pool against other tenants waiting in the same
    /// band.
    #[serde(default)]
    pub weight: Option<u32>,
    #[serde(default)]
    pub limits: RateLimit,
    /// Limits of the tenant on one model (glob → limits), on top of `limits`.
    #[serde(default)]
    pub model_limits: BTreeMap<String, RateLimit>,
    /// Residency tags: the tenant's requests go only to global members
    /// that carry one of them (docs/global.md); anywhere when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub residency: Vec<String>,
    /// Let the `x-infergate-residency` header restrict a request's
    /// members further (it can never widen `residency`).
    #[serde(default)]
    pub residency_header: bool,
    /// Latency objectives the tenant's requests carry unless they send
    /// their own (`x-infergate-slo-ttft-ms`, `x-infergate-slo-itl-ms`):
    /// replicas predicted to miss them are avoided, and attainment is
    /// counted per tenant and band (docs/picker.md).
    #[serde(default)]
    pub slo: Option<LatencyObjectives>,
}

/// Latency objectives of a request.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LatencyObjectives {
    /// Time to first token at most this.
    #[serde(default, with = "humantime_serde")]
    #[schemars(schema_with = "crate::json_schema::duration")]
    pub ttft: Option<Duration>,
    /// Mean time between output tokens at most this.
    #[serde(default, with = "humantime_serde")]
    #[schemars(schema_with = "crate::json_schema::duration")]
    pub itl: Option<Duration>,
}

impl Tenant {
    pub fn max_priority(&self) -> Priority {
        self.max_priority.unwrap_or(defaults::TENANT_MAX_PRIORITY)
    }
    pub fn weight(&self) -> u32 {
        self.weight.unwrap_or(1)
    }
}

/// Requests and tokens in a window. Each given field is one limit.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RateLimit {
    pub requests_per_second: Option<u64>,
    pub requests_per_minute: Option<u64>,
    pub tokens_per_minute: Option<u64>,
    pub tokens_per_day: Option<u64>,
}

impl RateLimit {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }
}

/// Where limits are counted, and the gateway-wide limits.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RateLimits {
    #[serde(default)]
    pub backend: LimitBackend,
    #[serde(default)]
    pub redis: Option<Redis>,
    /// When the backend cannot be reached in time.
    #[serde(default)]
    pub on_backend_error: OnBackendError,
    /// Tokens reserved for the completion of a request without
    /// `max_tokens` (or `max_completion_tokens`).
    #[serde(default)]
    pub default_max_tokens: Option<u64>,
    /// Limits over every caller together.
    #[serde(default)]
    pub global: RateLimit,
}

impl RateLimits {
    pub fn default_max_tokens(&self) -> u64 {
        self.default_max_tokens
            .unwrap_or(defaults::DEFAULT_MAX_TOKENS)
    }
}

#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum LimitBackend {
    /// In the gateway process: exact for one gateway replica.
    #[default]
    Local,
    /// Shared by every gateway replica through one Redis.
    Redis,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Redis {
    /// `redis://[:password@]host:port/db`, or `rediss://` for Redis over
    /// TLS.
    pub url: String,
    /// Longest wait for one answer before `onBackendError` decides.
    #[serde(default, with = "humantime_serde")]
    #[schemars(schema_with = "crate::json_schema::duration")]
    pub timeout: Option<Duration>,
    /// Prefix of every key the gateway writes.
    #[serde(default)]
    pub key_prefix: Option<String>,
    /// For `rediss://`: the CAs to trust and a client certificate.
    #[serde(default)]
    pub tls: Option<RedisTls>,
}

/// TLS to Redis (`rediss://`). The server's certificate is checked against
/// the system's roots, or `caFile`, and the URL's host.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RedisTls {
    /// PEM CA certificates Redis's certificate chains to (a private CA, as
    /// cert-manager issues in a cluster); the system's roots when absent.
    #[serde(default)]
    pub ca_file: Option<String>,
    /// A client certificate, for a Redis that asks for one
    /// (`tls-auth-clients yes`).
    #[serde(default)]
    pub cert_file: Option<String>,
    #[serde(default)]
    pub key_file: Option<String>,
}

impl Redis {
    pub fn timeout(&self) -> Duration {
        self.timeout.unwrap_or(defaults::REDIS_TIMEOUT)
    }
    pub fn key_prefix(&self) -> &str {
        self.key_prefix
            .as_deref()
            .unwrap_or(defaults::REDIS_KEY_PREFIX)
    }
}

#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum OnBackendError {
    /// Let the request through (counted and warned about).
    #[default]
    Allow,
    /// Refuse it with 503.
    Deny,
}
