//! Prefill/decode disaggregation of a pool: its replicas decode, a group of
//! prefill replicas computes long prompts for them, and the KV moves between
//! the two by the engines' own protocol. Field for field as users write
//! them; defaults in [`crate::defaults`] and the accessors below.

use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::defaults;

/// A disaggregated pool: the pool's own replicas (endpoints, simulated,
/// selector or InferencePool) are its decode replicas; `prefill` names the
/// prefill replicas.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Disaggregation {
    /// The hand-off the engines speak: `vllm` (a KV connector such as
    /// NixlConnector: the prefill first, its `kv_transfer_params` into the
    /// decode) or `sglang` (both at once, paired by a bootstrap room).
    pub protocol: KvProtocol,
    pub prefill: PrefillGroup,
    /// When a request goes through a prefill replica at all.
    #[serde(default)]
    pub decider: Decider,
    /// Longest wait for a prefill leg's answer (vLLM) before another
    /// prefill replica, or the decode replica alone, takes the request.
    #[serde(default, with = "humantime_serde")]
    #[schemars(schema_with = "crate::json_schema::duration")]
    pub prefill_timeout: Option<Duration>,
}

/// Which engines' disaggregation protocol a pool speaks.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum KvProtocol {
    Vllm,
    Sglang,
}

impl KvProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            KvProtocol::Vllm => "vllm",
            KvProtocol::Sglang => "sglang",
        }
    }
}

/// The prefill replicas: static addresses, or pods found by label.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PrefillGroup {
    /// Static prefill replica addresses (`host:port`). Exactly one of
    /// `endpoints` and `endpointSelector` is given.
    #[serde(default)]
    pub endpoints: Vec<String>,
    /// Every Ready pod these labels select, as a pool's
    /// `endpointSelector` (llm-d labels its prefill pods
    /// `llm-d.ai/role: prefill`).
    #[serde(default)]
    pub endpoint_selector: Option<crate::schema::EndpointSelector>,
    /// SGLang: the prefill servers' `--disaggregation-bootstrap-port`.
    #[serde(default)]
    pub bootstrap_port: Option<u16>,
}

/// The decider: a prompt whose part the decode replica has not cached is
/// shorter than `minUncachedTokens` is prefilled by the decode replica
/// itself (the hop and the transfer cost more than they save).
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Decider {
    #[serde(default)]
    pub min_uncached_tokens: Option<u32>,
}

/// The name a pool's prefill group is discovered under: the pool's name
/// and a suffix no pool name can have (`/`).
pub fn prefill_group_name(pool: &str) -> String {
    format!("{pool}{PREFILL_GROUP_SUFFIX}")
}

/// The pool whose prefill group `name` is, if it is one.
pub fn prefill_group_of(name: &str) -> Option<&str> {
    name.strip_suffix(PREFILL_GROUP_SUFFIX)
}

const PREFILL_GROUP_SUFFIX: &str = "/prefill";

impl Disaggregation {
    /// Where the prefill replicas are found in Kubernetes, if they are.
    pub fn prefill_discovery(&self) -> Option<crate::schema::Discovery<'_>> {
        self.prefill
            .endpoint_selector
            .as_ref()
            .map(crate::schema::Discovery::Selector)
    }

    pub fn min_uncached_tokens(&self) -> u32 {
        self.decider
            .min_uncached_tokens
            .unwrap_or(defaults::DISAGGREGATION_MIN_UNCACHED_TOKENS)
    }

    pub fn prefill_timeout(&self) -> Duration {
        self.prefill_timeout
            .unwrap_or(defaults::DISAGGREGATION_PREFILL_TIMEOUT)
    }

    pub fn bootstrap_port(&self) -> u16 {
        self.prefill
            .bootstrap_port
            .unwrap_or(defaults::SGLANG_BOOTSTRAP_PORT)
    }
}
