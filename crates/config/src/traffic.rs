//! Traffic management: model rewrites (weighted, guarded canaries),
//! session keys, and mirrors (shadow traffic). Field for field as users
//! write them; defaults in [`crate::defaults`] and the accessors below.

use std::collections::BTreeMap;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::defaults;

/// Requests for `model` (an exact name or a glob such as `llama-*`) that
/// match `match` are sent to one of `targets`, chosen by weight; the
/// body's `model` is rewritten to the target's name.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Rewrite {
    /// Names the rewrite in metrics, logs and `/debug/rewrites`; its
    /// runtime state (weights, guard windows, sessions) carries over a
    /// reload by this name.
    pub name: String,
    /// The client's model name: exact, or a glob with `*`.
    pub model: String,
    /// Only requests that match every condition given are rewritten.
    #[serde(default, rename = "match")]
    pub matches: RewriteMatch,
    /// The first target is the stable one: it takes the share other
    /// targets give up (rollback) and gives up what they gain (promotion).
    /// Weights are percentages and add up to 100.
    pub targets: Vec<RewriteTarget>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RewriteMatch {
    /// The caller's tenant is one of these.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<String>,
    /// Each of these request header fields has exactly this value.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RewriteTarget {
    /// A model or adapter some pool serves.
    pub model: String,
    /// Percent of the matching requests, 0 to 100.
    pub weight: u32,
    /// Roll this target back (weight 0) when it does worse than this.
    #[serde(default)]
    pub guard: Option<Guard>,
    /// Raise this target's weight step by step while its guard holds.
    #[serde(default)]
    pub promote: Option<Promote>,
}

/// What a canary must hold to keep its traffic. With `baseline: stable`
/// (the default) `ttftP95` and `errorRate` are how much worse than the
/// stable target over the same window the canary may do; with
/// `baseline: absolute` they are ceilings.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Guard {
    /// Time to first token, 95th percentile (successful answers).
    #[serde(default, with = "humantime_serde")]
    #[schemars(schema_with = "crate::json_schema::duration")]
    pub ttft_p95: Option<Duration>,
    /// Share of answers that failed: 5xx, 429 and timeouts from admission
    /// on (refusals of the caller's own making, such as its rate limits
    /// or a bad body, do not count).
    #[serde(default)]
    pub error_rate: Option<f64>,
    #[serde(default)]
    pub min_requests: Option<u64>,
    #[serde(default, with = "humantime_serde")]
    #[schemars(schema_with = "crate::json_schema::duration")]
    pub window: Option<Duration>,
    #[serde(default)]
    pub baseline: GuardBaseline,
}

impl Guard {
    pub fn min_requests(&self) -> u64 {
        self.min_requests.unwrap_or(defaults::GUARD_MIN_REQUESTS)
    }
    pub fn window(&self) -> Duration {
        self.window.unwrap_or(defaults::GUARD_WINDOW)
    }
}

/// What a guard's figures are measured against.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum GuardBaseline {
    /// The stable target's own figures over the same window; when it has
    /// fewer than `minRequests` there, the figures are ceilings.
    #[default]
    Stable,
    /// Fixed ceilings.
    Absolute,
}

/// Raise the target's weight by `step` percent every `every` while its
/// guard holds with at least `minRequests` in its window, up to 100.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Promote {
    pub step: u32,
    #[serde(with = "humantime_serde")]
    #[schemars(schema_with = "crate::json_schema::duration")]
    pub every: Duration,
}

/// Where a request's session key comes from, tried in this order: the
/// header, the token's claim, the body's `user`. A request with none has
/// no session.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Sessions {
    /// A request header field, such as `x-session-id`.
    #[serde(default)]
    pub header: Option<String>,
    /// A claim of the caller's verified JWT, such as `sid`.
    #[serde(default)]
    pub jwt_claim: Option<String>,
    /// The OpenAI `user` field of the body.
    #[serde(default)]
    pub user: bool,
    /// A session silent for this long is forgotten by the rewrites.
    #[serde(default, with = "humantime_serde")]
    #[schemars(schema_with = "crate::json_schema::duration")]
    pub idle_timeout: Option<Duration>,
    /// Sessions each rewrite remembers at most.
    #[serde(default)]
    pub max_sessions: Option<usize>,
}

impl Sessions {
    pub fn idle_timeout(&self) -> Duration {
        self.idle_timeout.unwrap_or(defaults::SESSION_IDLE_TIMEOUT)
    }
    pub fn max_sessions(&self) -> usize {
        self.max_sessions.unwrap_or(defaults::MAX_SESSIONS)
    }
}

/// Copies of a sampled share of the requests for `model` go to a shadow
/// pool; their answers are read and discarded, never shown to the client.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mirror {
    /// The client's model name: exact, or a glob with `*`.
    pub model: String,
    /// Send the copy as this model (the body's `model` rewritten), to the
    /// pool that serves it.
    #[serde(default)]
    pub target_model: Option<String>,
    /// Send the copy, unchanged, to this pool.
    #[serde(default)]
    pub pool: Option<String>,
    /// Share of the requests copied, 0 to 1.
    pub fraction: f64,
    #[serde(default)]
    pub max_in_flight: Option<usize>,
}

impl Mirror {
    pub fn max_in_flight(&self) -> usize {
        self.max_in_flight.unwrap_or(defaults::MIRROR_MAX_IN_FLIGHT)
    }
    /// What the metrics call the mirror: its model and its target.
    pub fn label(&self) -> String {
        match (&self.target_model, &self.pool) {
            (Some(model), _) => format!("{}->{model}", self.model),
            (None, Some(pool)) => format!("{}->pool:{pool}", self.model),
            (None, None) => self.model.clone(),
        }
    }
}
