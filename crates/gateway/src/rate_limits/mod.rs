//! The limit stage: requests and tokens per tenant, per tenant and model,
//! and over every caller, reserved before a request is admitted and
//! settled when it ends.
//!
//! A request reserves one request and its token estimate (prompt estimate
//! plus `max_tokens`, or `rateLimits.defaultMaxTokens`) on every limit that
//! applies to it, all or nothing; a refusal costs nothing and comes before
//! the request queues. When the response ends the token reservation is
//! settled to the `usage` the replica reported; a request that never
//! reached a replica gives its whole reservation back. Counting is
//! [`gcra`], in this process ([`local`]) or in Redis ([`redis`]).

mod gcra;
mod headers;
mod local;
mod redis;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use config::{LimitBackend, OnBackendError, RateLimit, RateLimits};

use crate::error::ApiError;
use gcra::{Cell, Verdict};
pub use headers::{Kind, RateHeaders};
use local::LocalStore;
use redis::RedisStore;
pub use redis::redacted;

/// Where the TATs live. Carried from one config generation to the next
/// while the backend settings stay the same, so a reload keeps the counts.
#[derive(Clone)]
pub enum Store {
    Local(Arc<LocalStore>),
    Redis(Arc<RedisStore>),
}

impl Store {
    /// The store for `limits`: `previous` when it serves the same backend.
    pub fn for_config(limits: &RateLimits, previous: Option<&Store>) -> anyhow::Result<Store> {
        match (limits.backend, &limits.redis, previous) {
            (LimitBackend::Local, _, Some(Store::Local(s))) => Ok(Store::Local(Arc::clone(s))),
            (LimitBackend::Local, _, _) => Ok(Store::Local(Arc::default())),
            (LimitBackend::Redis, Some(r), Some(Store::Redis(s))) if s.serves(r) => {
                Ok(Store::Redis(Arc::clone(s)))
            }
            (LimitBackend::Redis, Some(r), _) => Ok(Store::Redis(Arc::new(RedisStore::new(r)?))),
            (LimitBackend::Redis, None, _) => {
                anyhow::bail!("rateLimits.backend redis needs rateLimits.redis")
            }
        }
    }

    async fn charge(
        &self,
        keys: &[Arc<str>],
        cells: &[Cell],
        costs: &[f64],
    ) -> Result<(bool, Vec<Verdict>), redis::RedisError> {
        match self {
            Store::Local(s) => Ok(s.charge(keys, cells, costs)),
            Store::Redis(s) => s.charge(keys, cells, costs).await,
        }
    }

    fn adjust(&self, keys: Vec<Arc<str>>, cells: Vec<Cell>, deltas: Vec<f64>) {
        match self {
            Store::Local(s) => s.adjust(&keys, &cells, &deltas),
            Store::Redis(s) => s.adjust(keys, cells, deltas),
        }
    }
}

/// One limit on one scope.
#[derive(Debug, Clone)]
struct Rule {
    key: Arc<str>,
    kind: Kind,
    limit: u64,
    cell: Cell,
    /// As OpenAI words it: `tokens per min (TPM)`.
    name: &'static str,
    /// Whose limit: `tenant team-a`, `all callers`.
    scope: Arc<str>,
}

/// The limits of one tenant.
#[derive(Default)]
struct TenantRules {
    rules: Vec<Rule>,
    /// Model glob → the tenant's limits on the models it matches.
    by_model: Vec<(String, Vec<Rule>)>,
}

/// Every limit of one config generation.
pub struct Limiter {
    global: Vec<Rule>,
    tenants: HashMap<String, TenantRules>,
    store: Store,
    on_error: OnBackendError,
    default_max_tokens: u64,
    /// Counts answers Redis did not give; shared across generations.
    backend_errors: prometheus_client::metrics::counter::Counter,
}

impl Limiter {
    pub fn new(
        spec: &config::Spec,
        store: Store,
        backend_errors: prometheus_client::metrics::counter::Counter,
    ) -> Self {
        let prefix = match &spec.rate_limits.redis {
            Some(r) => r.key_prefix().to_owned(),
            None => config::defaults::REDIS_KEY_PREFIX.to_owned(),
        };
        let global = rules(
            &format!("{prefix}global"),
            "all callers",
            &spec.rate_limits.global,
        );
        let tenants = spec
            .tenants
            .iter()
            .map(|t| {
                let base = format!("{prefix}tenant:{}", t.name);
                let scope = format!("tenant {}", t.name);
                let by_model = t
                    .model_limits
                    .iter()
                    .map(|(glob, limit)| {
                        let rules = rules(
                            &format!("{base}:model:{glob}"),
                            &format!("{scope} on {glob}"),
                            limit,
                        );
                        (glob.clone(), rules)
                    })
                    .collect();
                let rules = TenantRules {
                    rules: rules(&base, &scope, &t.limits),
                    by_model,
                };
                (t.name.clone(), rules)
            })
            .collect();
        Self {
            global,
            tenants,
            store,
            on_error: spec.rate_limits.on_backend_error,
            default_max_tokens: spec.rate_limits.default_max_tokens(),
            backend_errors,
        }
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Tokens a request reserves: its prompt estimate and its output bound.
    pub fn tokens_to_reserve(&self, prompt_tokens: u64, max_output: Option<u64>) -> u64 {
        prompt_tokens.saturating_add(max_output.unwrap_or(self.default_max_tokens))
    }

    /// The limits that apply to `tenant` using `model`.
    fn applicable(&self, tenant: Option<&str>, model: &str) -> Vec<&Rule> {
        let mut applied: Vec<&Rule> = self.global.iter().collect();
        if let Some(t) = tenant.and_then(|t| self.tenants.get(t)) {
            applied.extend(&t.rules);
            for (glob, rules) in &t.by_model {
                if glob_matches(glob, model) {
                    applied.extend(rules);
                }
            }
        }
        applied
    }

    /// Reserve one request and `tokens` on every limit that applies, or
    /// refuse with 429 (nothing charged). With no limit, no reservation.
    pub async fn reserve(
        &self,
        tenant: Option<&str>,
        model: &str,
        tokens: u64,
    ) -> Result<Option<Reservation>, Refused> {
        let applied = self.applicable(tenant, model);
        if applied.is_empty() {
            return Ok(None);
        }
        let keys: Vec<Arc<str>> = applied.iter().map(|r| Arc::clone(&r.key)).collect();
        let cells: Vec<Cell> = applied.iter().map(|r| r.cell).collect();
        let costs: Vec<f64> = applied
            .iter()
            .map(|r| match r.kind {
                Kind::Requests => 1.0,
                Kind::Tokens => tokens as f64,
            })
            .collect();
        let (fits, verdicts) = match self.store.charge(&keys, &cells, &costs).await {
            Ok(answer) => answer,
            Err(e) => {
                self.backend_errors.inc();
                tracing::warn!(error = %e, on_backend_error = ?self.on_error,
                    "rate limits could not be checked");
                return match self.on_error {
                    OnBackendError::Allow => Ok(None),
                    OnBackendError::Deny => Err(Refused {
                        error: ApiError::limits_unavailable(),
                        headers: RateHeaders::default(),
                    }),
                };
            }
        };
        let headers = RateHeaders::from_verdicts(
            applied
                .iter()
                .zip(&verdicts)
                .map(|(r, v)| (r.kind, r.limit, v)),
        );
        if !fits {
            let (rule, verdict, cost) = applied
                .iter()
                .zip(&verdicts)
                .zip(&costs)
                .map(|((r, v), c)| (*r, v, *c))
                .max_by(|a, b| a.1.retry_ms.total_cmp(&b.1.retry_ms))
                .expect("a refusal names a limit");
            let refusal = Refusal {
                model,
                rule,
                verdict,
                requested: cost as u64,
            };
            return Err(Refused {
                error: refusal.error(),
                headers,
            });
        }
        Ok(Some(Reservation {
            store: self.store.clone(),
            rules: applied.into_iter().cloned().collect(),
            tokens,
            headers,
            settled: false,
        }))
    }
}

/// A `*`-only glob (`llama-*`, `*-lora`, `*`).
pub fn glob_matches(glob: &str, name: &str) -> bool {
    let mut parts = glob.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else {
        return rest.is_empty();
    };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// The rules one `RateLimit` block gives a scope.
fn rules(key: &str, scope: &str, limit: &RateLimit) -> Vec<Rule> {
    const SECOND: f64 = 1e3;
    const MINUTE: f64 = 60e3;
    const DAY: f64 = 86_400e3;
    let scope: Arc<str> = Arc::from(scope);
    [
        (
            limit.requests_per_second,
            Kind::Requests,
            SECOND,
            "rps",
            "requests per sec (RPS)",
        ),
        (
            limit.requests_per_minute,
            Kind::Requests,
            MINUTE,
            "rpm",
            "requests per min (RPM)",
        ),
        (
            limit.tokens_per_minute,
            Kind::Tokens,
            MINUTE,
            "tpm",
            "tokens per min (TPM)",
        ),
        (
            limit.tokens_per_day,
            Kind::Tokens,
            DAY,
            "tpd",
            "tokens per day (TPD)",
        ),
    ]
    .into_iter()
    .filter_map(|(n, kind, period, suffix, name)| {
        let n = n?;
        Some(Rule {
            key: Arc::from(format!("{key}:{suffix}")),
            kind,
            limit: n,
            cell: Cell {
                interval: period / n as f64,
                tolerance: period,
            },
            name,
            scope: Arc::clone(&scope),
        })
    })
    .collect()
}

/// Why a request was refused, in OpenAI's words.
struct Refusal<'a> {
    model: &'a str,
    rule: &'a Rule,
    verdict: &'a Verdict,
    requested: u64,
}

impl Refusal<'_> {
    fn error(&self) -> ApiError {
        let Refusal {
            model,
            rule,
            verdict,
            requested,
        } = self;
        let kind = match rule.kind {
            Kind::Requests => "requests",
            Kind::Tokens => "tokens",
        };
        if verdict.retry_ms.is_infinite() {
            return ApiError::too_large_for_limit(
                kind,
                format!(
                    "Request too large for {model} on {} for {}: Limit {}, Requested {requested}. \
                     Lower max_tokens or shorten the prompt.",
                    rule.name, rule.scope, rule.limit
                ),
            );
        }
        let used = rule.limit.saturating_sub(verdict.remaining);
        let retry = Duration::from_secs_f64(verdict.retry_ms / 1e3);
        ApiError::rate_limited(
            kind,
            format!(
                "Rate limit reached for {model} on {} for {}: Limit {}, Used {used}, \
                 Requested {requested}. Please try again in {}.",
                rule.name,
                rule.scope,
                rule.limit,
                headers::go_duration(verdict.retry_ms)
            ),
            retry,
        )
    }
}

/// A refusal, with the rate-limit headers its response carries.
pub struct Refused {
    pub error: ApiError,
    pub headers: RateHeaders,
}

/// What a request holds on its limits until it ends.
pub struct Reservation {
    store: Store,
    rules: Vec<Rule>,
    tokens: u64,
    headers: RateHeaders,
    settled: bool,
}

impl std::fmt::Debug for Reservation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reservation")
            .field("limits", &self.rules.len())
            .field("tokens", &self.tokens)
            .finish()
    }
}

/// How a request that held a reservation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// It never reached a replica: everything goes back.
    NotRun,
    /// The replica reported this many tokens (prompt and completion).
    Used(u64),
    /// It reached a replica but no usage is known: charged as reserved.
    Unknown,
}

impl Reservation {
    /// Some limit counts this request's tokens (so its usage matters).
    pub fn charges_tokens(&self) -> bool {
        self.rules.iter().any(|r| r.kind == Kind::Tokens)
    }

    /// The `x-ratelimit-*` values as of the reservation.
    pub fn headers(&self) -> &RateHeaders {
        &self.headers
    }

    pub fn settle(mut self, outcome: Outcome) {
        self.settled = true;
        let request_back = match outcome {
            Outcome::NotRun => -1.0,
            Outcome::Used(_) | Outcome::Unknown => 0.0,
        };
        let tokens_delta = match outcome {
            Outcome::NotRun => -(self.tokens as f64),
            Outcome::Used(used) => used as f64 - self.tokens as f64,
            Outcome::Unknown => 0.0,
        };
        let mut keys = Vec::new();
        let mut cells = Vec::new();
        let mut deltas = Vec::new();
        for rule in &self.rules {
            let delta = match rule.kind {
                Kind::Requests => request_back,
                Kind::Tokens => tokens_delta,
            };
            if delta != 0.0 {
                keys.push(Arc::clone(&rule.key));
                cells.push(rule.cell);
                deltas.push(delta);
            }
        }
        if !keys.is_empty() {
            self.store.adjust(keys, cells, deltas);
        }
    }
}

impl Drop for Reservation {
    /// Dropped unsettled: the request was refused or dropped before it
    /// reached a replica.
    fn drop(&mut self) {
        if !self.settled {
            let reservation = Reservation {
                store: self.store.clone(),
                rules: std::mem::take(&mut self.rules),
                tokens: self.tokens,
                headers: RateHeaders::default(),
                settled: false,
            };
            self.settled = true;
            reservation.settle(Outcome::NotRun);
        }
    }
}

#[cfg(test)]
mod tests;
