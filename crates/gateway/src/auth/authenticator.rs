//! The authenticator of one generation: finds the caller's credential,
//! checks it, and says who the caller is ([`Identity`]) and what follows for
//! its request.

use std::sync::Arc;

use config::Priority;
use http::{HeaderMap, HeaderName, HeaderValue};
use picker::flow::FlowKey;

use super::api_keys::{self, ApiKeys, KeyRefused};
use super::credential::{self, Credential};
use super::jwt::JwtVerifier;
use super::refusal::{AUTH_TARGET, AuthError, Kind, Reason, Refusal};
use super::tenants::{Globs, TenantRules, Tenants};
use crate::error::ApiError;
use crate::outbound::CallerFields;
use crate::record::Caller;
use crate::telemetry::TenantLabel;

/// Who the caller is, and what follows from it for this request.
#[derive(Debug, Clone)]
pub struct Identity {
    /// The tenant's name as authenticated (listed in `spec.tenants` or not).
    pub tenant: Arc<str>,
    pub via: Via,
    policy: Arc<TenantRules>,
    /// A token's models claim, narrowing its tenant's models.
    token_models: Option<Arc<Globs>>,
    max_priority: Priority,
    /// The header that carried the credential: the replica does not get it.
    consumed: Option<&'static HeaderName>,
    /// The tenant, for `auth.tenantHeader`.
    header_value: Option<HeaderValue>,
}

/// How the caller proved who it is, for logs.
#[derive(Debug, Clone)]
pub enum Via {
    /// Authentication is off.
    Anonymous,
    /// An API key, and its `name` when it has one.
    ApiKey(Option<Arc<str>>),
    /// A token of this issuer.
    Token(Arc<str>),
    /// A verified client certificate.
    Certificate,
}

impl Identity {
    /// Whether the caller may use the model or adapter `model`: its
    /// tenant's `models` and its token's models claim both match it.
    pub fn may_use(&self, model: &str) -> bool {
        self.policy.models.as_ref().is_none_or(|g| g.matches(model))
            && self.token_models.as_ref().is_none_or(|g| g.matches(model))
    }

    /// Whether every model is allowed (no list to filter by).
    pub fn may_use_all(&self) -> bool {
        self.policy.models.is_none() && self.token_models.is_none()
    }

    /// The most urgent band the caller's requests may have.
    pub fn max_priority(&self) -> Priority {
        self.max_priority
    }

    /// The tenant's `tenant` label on metrics.
    pub fn label(&self) -> &TenantLabel {
        &self.policy.label
    }

    /// The caller as the access log shows it: tenant, API key name or
    /// token issuer.
    pub fn as_logged(&self) -> Caller {
        let (key, issuer) = match &self.via {
            Via::ApiKey(name) => (name.clone(), None),
            Via::Token(issuer) => (None, Some(Arc::clone(issuer))),
            Via::Anonymous | Via::Certificate => (None, None),
        };
        Caller {
            tenant: Arc::clone(&self.tenant),
            label: self.policy.label.clone(),
            key,
            issuer,
        }
    }

    /// The caller's place in flow control: its tenant, with the tenant's
    /// weight, and within it the key the client chose (a client can only
    /// divide its own tenant's share, never take another's).
    pub fn flow_key(&self, client_key: Arc<str>) -> FlowKey {
        FlowKey {
            tenant: Arc::clone(&self.tenant),
            key: client_key,
            weight: self.policy.weight,
        }
    }
}

pub struct Authenticator {
    /// Whether a credential is needed; when not, every caller is anonymous.
    required: bool,
    api_keys: Option<ApiKeys>,
    jwt: Option<JwtVerifier>,
    certificates: bool,
    tenants: Tenants,
    tenant_header: Option<HeaderName>,
    anonymous: Identity,
}

impl Authenticator {
    pub(super) fn new(
        spec: &config::Spec,
        api_keys: Option<ApiKeys>,
        jwt: Option<JwtVerifier>,
    ) -> Self {
        let auth = spec.auth.as_ref();
        let tenants = Tenants::new(&spec.tenants);
        let tenant_header = auth
            .and_then(|a| a.tenant_header.as_deref())
            .and_then(|h| HeaderName::try_from(h).ok());
        let policy = Arc::clone(tenants.anonymous());
        let anonymous_tenant: Arc<str> = Arc::from(config::defaults::ANONYMOUS_TENANT);
        let anonymous = Identity {
            header_value: tenant_header
                .as_ref()
                .map(|_| HeaderValue::from_static(config::defaults::ANONYMOUS_TENANT)),
            tenant: anonymous_tenant,
            via: Via::Anonymous,
            max_priority: policy.max_priority,
            policy,
            token_models: None,
            consumed: None,
        };
        Self {
            required: auth.is_some_and(|a| a.mode == config::AuthMode::Required),
            api_keys,
            jwt,
            certificates: auth.is_some_and(|a| a.client_certificates.is_some()),
            tenants,
            tenant_header,
            anonymous,
        }
    }

    /// Who sent a request with these header fields. `verified_client` is
    /// the tenant a verified client certificate names (from the TLS
    /// listener, per `auth.clientCertificates.tenantFrom`); a credential in
    /// the header fields, when there is one, is what counts.
    pub async fn authenticate(
        &self,
        headers: &HeaderMap,
        verified_client: Option<&str>,
    ) -> Result<Identity, AuthError> {
        if !self.required {
            return Ok(self.anonymous.clone());
        }
        let found = credential::find(headers).map_err(|unusable| {
            let kind = unusable
                .credential
                .map_or(self.default_kind(), |c| self.kind_of(&c));
            let refusal = Refusal::new(unusable.reason, String::new());
            self.refused(kind, refusal, unusable.credential.map(|c| c.header))
        })?;
        let Some(credential) = found else {
            if self.certificates
                && let Some(tenant) = verified_client
            {
                return Ok(self.identity(Arc::from(tenant), Via::Certificate, None));
            }
            return Err(self.refused(
                self.default_kind(),
                Refusal::new(Reason::Missing, "no credential".to_owned()),
                None,
            ));
        };
        if credential.is_jwt()
            && let Some(jwt) = &self.jwt
        {
            let claims = jwt
                .verify(credential.value)
                .await
                .map_err(|r| self.refused(Kind::Token, r, None))?;
            let mut identity = self.identity(
                claims.tenant,
                Via::Token(claims.issuer),
                Some(credential.header),
            );
            identity.token_models = claims.models;
            if let Some(p) = claims.max_priority {
                identity.max_priority = identity.max_priority.max(p);
            }
            return Ok(identity);
        }
        let Some(keys) = &self.api_keys else {
            let why = "not a JWT, and no API keys are configured";
            return Err(self.refused(
                Kind::Token,
                Refusal::new(Reason::Malformed, why.into()),
                None,
            ));
        };
        match keys.check(credential.value).await {
            Ok(owner) => Ok(self.identity(
                owner.tenant,
                Via::ApiKey(owner.name),
                Some(credential.header),
            )),
            Err(refused) => {
                let reason = match refused {
                    KeyRefused::Unknown => Reason::UnknownKey,
                    KeyRefused::Busy => Reason::Busy,
                };
                let hash = api_keys::sha256_hex(credential.value);
                let detail = format!(
                    "no configured key has this one's SHA-256 ({}…)",
                    &hash[..12]
                );
                Err(self.refused(
                    Kind::ApiKey,
                    Refusal::new(reason, detail),
                    Some(credential.header),
                ))
            }
        }
    }

    /// Stage 5: whether the caller may use `model` (a model or adapter
    /// name, as requested).
    pub fn authorize(&self, identity: &Identity, model: &str) -> Result<(), ApiError> {
        if identity.may_use(model) {
            Ok(())
        } else {
            tracing::debug!(target: AUTH_TARGET, tenant = %identity.tenant, model,
                "model not allowed for the tenant (or its token)");
            Err(ApiError::model_not_allowed(model))
        }
    }

    /// What the replica is told about the caller: not the credential the
    /// gateway consumed, never a client's own copy of the tenant header,
    /// and the tenant in it when `auth.tenantHeader` is set.
    pub fn caller_fields<'a>(&'a self, identity: &'a Identity) -> CallerFields<'a> {
        CallerFields {
            removed: [identity.consumed, self.tenant_header.as_ref()],
            tenant: self
                .tenant_header
                .as_ref()
                .zip(identity.header_value.as_ref()),
        }
    }

    fn identity(
        &self,
        tenant: Arc<str>,
        via: Via,
        consumed: Option<&'static HeaderName>,
    ) -> Identity {
        let policy = Arc::clone(self.tenants.policy(&tenant));
        Identity {
            header_value: self
                .tenant_header
                .as_ref()
                .and_then(|_| HeaderValue::from_bytes(tenant.as_bytes()).ok()),
            tenant,
            via,
            max_priority: policy.max_priority,
            policy,
            token_models: None,
            consumed,
        }
    }

    /// How `credential` is checked: as a token when it looks like one and
    /// tokens are configured, else as an API key.
    fn kind_of(&self, credential: &Credential<'_>) -> Kind {
        if self.jwt.is_some() && (credential.is_jwt() || self.api_keys.is_none()) {
            Kind::Token
        } else {
            Kind::ApiKey
        }
    }

    /// The kind of credential a request that has none, or an unreadable
    /// one, was expected to carry: API keys when configured (what the
    /// OpenAI SDKs send), else a token.
    fn default_kind(&self) -> Kind {
        if self.api_keys.is_some() {
            Kind::ApiKey
        } else {
            Kind::Token
        }
    }

    fn refused(&self, kind: Kind, refusal: Refusal, header: Option<&HeaderName>) -> AuthError {
        tracing::debug!(target: AUTH_TARGET, reason = refusal.reason.as_str(),
            detail = %refusal.detail, header = header.map(HeaderName::as_str), "credential refused");
        AuthError {
            kind,
            reason: refusal.reason,
        }
    }
}
