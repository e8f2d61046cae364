//! The global tier: this gateway as a router in front of other gateways
//! ("members") in other clusters and regions, and OpenAI-compatible
//! endpoints of another tier to spill to. Field for field as users write
//! it; defaults in [`crate::defaults`] and the accessors below.
//! docs/global.md describes how the fields are used.

use std::collections::BTreeMap;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::defaults;

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Global {
    /// The region this router runs in; region proximity is measured from
    /// here.
    pub region: String,
    pub members: Vec<Member>,
    /// How much each signal counts when members are compared.
    #[serde(default)]
    pub weights: GlobalWeights,
    #[serde(default)]
    pub failover: Failover,
    /// Distance between regions (any unit, such as milliseconds of round
    /// trip), by region and then region; one direction is enough. Regions
    /// not listed are as far apart as the farthest pair listed (or, with no
    /// table, every other region is equally far).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub region_distances: BTreeMap<String, BTreeMap<String, f64>>,
}

impl Global {
    /// The distance from this router's region to `region`, as the table
    /// gives it in either direction; 0 for its own region.
    pub fn distance_to(&self, region: &str) -> Option<f64> {
        if region == self.region {
            return Some(0.0);
        }
        let one_way = |a: &str, b: &str| self.region_distances.get(a)?.get(b).copied();
        one_way(&self.region, region).or_else(|| one_way(region, &self.region))
    }

    /// The largest distance in the table; 0 when it is empty.
    pub fn farthest(&self) -> f64 {
        self.region_distances
            .values()
            .flat_map(|row| row.values().copied())
            .fold(0.0, f64::max)
    }
}

/// Another gateway, or an OpenAI-compatible endpoint, that requests may be
/// sent to.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Member {
    /// Unique; names the member in logs, metrics and decision headers.
    pub name: String,
    /// `http://host:port` or `https://host:port` where requests go.
    pub url: String,
    /// An infergate member's admin listener, where its load summary is
    /// read (`/global/summary`); without it the member is scored only on
    /// what this router sees of it, as an `openai` member is.
    #[serde(default)]
    pub admin_url: Option<String>,
    /// The member's region; this router's own when absent.
    #[serde(default)]
    pub region: Option<String>,
    /// Price per million tokens, in any currency as long as every member
    /// uses the same; scored with `weights.cost`.
    #[serde(default)]
    pub cost_per_million_tokens: Option<f64>,
    /// Residency tags this member satisfies (`eu`, `us`...). A request
    /// restricted to a tag goes only to members that carry it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub residency: Vec<String>,
    #[serde(default)]
    pub kind: MemberKind,
    /// A file holding the bearer token sent to the member in
    /// `Authorization` (its own credentials, not the caller's).
    #[serde(default)]
    pub api_key_file: Option<String>,
    /// Models the member serves: the client's name → the member's name.
    /// Required for `openai` members and for members without `adminUrl`;
    /// otherwise, when empty, the member serves what its summary lists,
    /// under the same names.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub models: BTreeMap<String, String>,
    #[serde(default)]
    pub tier: Tier,
}

impl Member {
    /// The member's region: its own, else the router's.
    pub fn region<'a>(&'a self, global: &'a Global) -> &'a str {
        self.region.as_deref().unwrap_or(&global.region)
    }
}

/// What a member is, which says what it can tell about its load.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum MemberKind {
    /// Another infergate gateway: it publishes a load summary.
    #[default]
    Infergate,
    /// Any OpenAI-compatible endpoint: scored on what the router sees.
    Openai,
}

impl MemberKind {
    pub fn as_str(self) -> &'static str {
        match self {
            MemberKind::Infergate => "infergate",
            MemberKind::Openai => "openai",
        }
    }
}

/// Primary members take the traffic; fallback members only what no
/// primary can take.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub enum Tier {
    #[default]
    Primary,
    /// Used only when every primary member that serves the model (and may
    /// take the request) is saturated, unhealthy or refusing.
    Fallback,
}

impl Tier {
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Primary => "primary",
            Tier::Fallback => "fallback",
        }
    }
}

/// Weights of the member scores, each `>= 0`; they need not add up to 1
/// (a member's score is their weighted mean).
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GlobalWeights {
    pub kv_headroom: Option<f64>,
    pub queue_depth: Option<f64>,
    pub region_proximity: Option<f64>,
    pub error_rate: Option<f64>,
    pub cost: Option<f64>,
}

impl GlobalWeights {
    pub fn kv_headroom(&self) -> f64 {
        self.kv_headroom
            .unwrap_or(defaults::GLOBAL_WEIGHT_KV_HEADROOM)
    }
    pub fn queue_depth(&self) -> f64 {
        self.queue_depth
            .unwrap_or(defaults::GLOBAL_WEIGHT_QUEUE_DEPTH)
    }
    pub fn region_proximity(&self) -> f64 {
        self.region_proximity
            .unwrap_or(defaults::GLOBAL_WEIGHT_REGION_PROXIMITY)
    }
    pub fn error_rate(&self) -> f64 {
        self.error_rate
            .unwrap_or(defaults::GLOBAL_WEIGHT_ERROR_RATE)
    }
    pub fn cost(&self) -> f64 {
        self.cost.unwrap_or(defaults::GLOBAL_WEIGHT_COST)
    }
}

/// When a member stops getting requests, and how it comes back.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Failover {
    /// A member whose requests have failed (connection refused, 5xx) for
    /// this long without a success in between, or whose summary stream
    /// has been silent for this long, gets no new requests.
    #[serde(default, with = "humantime_serde")]
    #[schemars(schema_with = "crate::json_schema::duration")]
    pub unhealthy_after: Option<Duration>,
    /// A member that recovers gets a share of its traffic that rises from
    /// nothing to all of it over this time.
    #[serde(default, with = "humantime_serde")]
    #[schemars(schema_with = "crate::json_schema::duration")]
    pub ramp_up: Option<Duration>,
    /// Share of a member's recent answers that may be 5xx or 429 before
    /// it counts as refusing (a primary above it spills to fallbacks).
    #[serde(default)]
    pub max_error_rate: Option<f64>,
}

impl Failover {
    pub fn unhealthy_after(&self) -> Duration {
        self.unhealthy_after
            .unwrap_or(defaults::GLOBAL_UNHEALTHY_AFTER)
    }
    pub fn ramp_up(&self) -> Duration {
        self.ramp_up.unwrap_or(defaults::GLOBAL_RAMP_UP)
    }
    pub fn max_error_rate(&self) -> f64 {
        self.max_error_rate
            .unwrap_or(defaults::GLOBAL_MAX_ERROR_RATE)
    }
}
