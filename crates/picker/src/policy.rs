//! Picker configuration: the policy, scorer weights, saturation thresholds,
//! staleness, fallback and prefix hashing.
//!
//! Every default the picker uses lives in this file, next to the reason for
//! it. The gateway's config crate maps YAML onto these structs; anything a
//! user leaves out takes the `Default` below.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How a pool chooses a replica. The serde names are the config names
/// ([`Policy::name`]); variants are listed in the order a config error
/// offers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    /// Filter healthy, unsaturated replicas, score them with the weighted
    /// scorers and take the best. The default: it is the point of the product.
    #[default]
    Scored,
    /// Next replica in turn. Ignores every signal.
    RoundRobin,
    /// Fewest requests this gateway has in flight. Ignores scraped signals.
    LeastRequest,
    /// Uniformly at random. Ignores every signal.
    Random,
    /// The candidates of [`Policy::Scored`], ranked by each replica's
    /// predicted end-to-end time for the request, learned online per
    /// replica ([`crate::predict`]); the scored policy decides while a
    /// candidate's model is not yet trusted.
    Predicted,
}

impl Policy {
    pub const ALL: [Policy; 5] = [
        Policy::RoundRobin,
        Policy::LeastRequest,
        Policy::Random,
        Policy::Scored,
        Policy::Predicted,
    ];

    /// The name used in configuration files.
    pub fn name(self) -> &'static str {
        match self {
            Policy::RoundRobin => "round-robin",
            Policy::LeastRequest => "least-request",
            Policy::Random => "random",
            Policy::Scored => "scored",
            Policy::Predicted => "predicted",
        }
    }

    /// Whether the policy reads scraped engine signals (and therefore needs
    /// them to be fresh).
    pub fn uses_signals(self) -> bool {
        self.uses_scores()
    }

    /// Whether the policy filters and scores candidates as
    /// [`Policy::Scored`] does: the scored policy itself, and the
    /// predicted policy, which falls back to it.
    pub fn uses_scores(self) -> bool {
        matches!(self, Policy::Scored | Policy::Predicted)
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Policy {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Policy::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| UnknownName {
                kind: "policy",
                name: s.to_owned(),
                expected: "round-robin, least-request, random, scored, predicted",
            })
    }
}

/// A name that is not one of the accepted spellings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownName {
    pub kind: &'static str,
    pub name: String,
    pub expected: &'static str,
}

impl fmt::Display for UnknownName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown {} {:?} (expected one of: {})",
            self.kind, self.name, self.expected
        )
    }
}

impl std::error::Error for UnknownName {}

/// Declares the scorers from one table: the [`Scorer`] enum and its
/// [`Scorer::ALL`] order, each scorer's names and preset weights, and the
/// [`Weights`] struct with one field per scorer. Generating them together
/// is what keeps them from drifting: a scorer cannot exist without a field,
/// a weight in every preset and a config name, and everything that walks
/// [`Scorer::ALL`] (config validation, the config-to-picker mapping, sums,
/// checks, explanations) covers it without being touched.
macro_rules! scorer_table {
    ($(
        #[doc = $doc:literal]
        $variant:ident {
            field: $field:ident,
            name: $name:literal,
            label: $label:literal,
            default: $default:expr,
            latency: $latency:expr,
            throughput: $throughput:expr $(,)?
        }
    ),+ $(,)?) => {
        /// A scorer of the [`Policy::Scored`] policy; how each one scores
        /// is in [`crate::scorers`]. Serialized in kebab-case (`kv-cache`)
        /// for the gateway's debug output; its config name is
        /// [`Scorer::name`].
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
        #[serde(rename_all = "kebab-case")]
        pub enum Scorer {
            $(#[doc = $doc] $variant,)+
        }

        impl Scorer {
            /// Every scorer, in the order scores are reported.
            pub const ALL: [Scorer; [$(Scorer::$variant),+].len()] = [$(Scorer::$variant),+];
            pub const COUNT: usize = Scorer::ALL.len();

            /// The field of a pool's `scheduling.weights` in the config.
            pub const fn name(self) -> &'static str {
                match self {
                    $(Scorer::$variant => $name,)+
                }
            }

            /// Short label used in the `x-infergate-scores` header.
            pub const fn label(self) -> &'static str {
                match self {
                    $(Scorer::$variant => $label,)+
                }
            }

            /// What the scorer rates, in one line (the docs' table says the
            /// same).
            pub const fn doc(self) -> &'static str {
                match self {
                    $(Scorer::$variant => $doc.trim_ascii(),)+
                }
            }

            /// The [`Weights`] field, as [`PickerConfig::problems`] names it.
            const fn field(self) -> &'static str {
                match self {
                    $(Scorer::$variant => stringify!($field),)+
                }
            }
        }

        /// Relative weight of each scorer in the [`Policy::Scored`] sum. Only
        /// the ratios matter: the total is divided by the sum of the weights,
        /// so a replica's total is always in `[0, 1]`. A weight of 0 turns a
        /// scorer off.
        #[derive(Debug, Clone, Copy, PartialEq, Serialize)]
        pub struct Weights {
            $(#[doc = $doc] pub $field: f64,)+
        }

        impl Weights {
            /// The weight of `scorer`.
            pub const fn get(&self, scorer: Scorer) -> f64 {
                match scorer {
                    $(Scorer::$variant => self.$field,)+
                }
            }

            /// Set the weight of `scorer`.
            pub fn set(&mut self, scorer: Scorer, weight: f64) {
                match scorer {
                    $(Scorer::$variant => self.$field = weight,)+
                }
            }

            /// One preset's column of the table.
            const fn column(preset: Preset) -> Weights {
                match preset {
                    Preset::Default => Weights { $($field: $default,)+ },
                    Preset::Latency => Weights { $($field: $latency,)+ },
                    Preset::Throughput => Weights { $($field: $throughput,)+ },
                }
            }
        }
    };
}

/// The presets, as the scorer table's columns name them.
#[derive(Clone, Copy)]
enum Preset {
    Default,
    Latency,
    Throughput,
}

// The scorer table: one entry per scorer, in the order scores are reported
// (docs/picker.md, "Scorers", lists them the same way; a test compares).
// The one `///` line says what the scorer rates; `field` is its `Weights`
// field, `name` its field under the config's `scheduling.weights`, `label`
// its name in the scores header; `default`, `latency` and `throughput` are
// its weight in each preset, whose reasons are on `Weights::CHAT`, `LATENCY`
// and `THROUGHPUT`.
scorer_table! {
    /// The replica's backlog: requests waiting in its engine or not yet answered.
    Queue {
        field: queue,
        name: "queue",
        label: "q",
        default: 3.0,
        latency: 4.0,
        throughput: 1.0,
    },
    /// Free KV cache.
    KvCache {
        field: kv_cache,
        name: "kvCache",
        label: "kv",
        default: 2.0,
        latency: 2.0,
        throughput: 3.0,
    },
    /// Requests and tokens this gateway has in flight to the replica.
    Inflight {
        field: inflight,
        name: "inflight",
        label: "if",
        default: 3.0,
        latency: 4.0,
        throughput: 4.0,
    },
    /// Prompt-prefix cache affinity: how much of the prompt the replica holds.
    Prefix {
        field: prefix,
        name: "prefix",
        label: "px",
        default: 9.0,
        latency: 2.0,
        throughput: 9.0,
    },
    /// LoRA adapter residency.
    Lora {
        field: lora,
        name: "lora",
        label: "lora",
        default: 2.0,
        latency: 2.0,
        throughput: 3.0,
    },
    /// The replica's measured time per generated token.
    Speed {
        field: speed,
        name: "speed",
        label: "sp",
        default: 2.0,
        latency: 3.0,
        throughput: 1.0,
    },
    /// Session affinity: a session's requests stay on its replica.
    Session {
        field: session,
        name: "session",
        label: "ss",
        default: Weights::SESSION,
        latency: Weights::SESSION,
        throughput: Weights::SESSION,
    },
}

impl Weights {
    /// Names accepted by [`Weights::preset`].
    pub const PRESETS: [&'static str; 3] = ["default", "latency", "throughput"];

    /// Tuned for interactive chat, the common case.
    ///
    /// Affinity (prefix 9 + LoRA 2 = 11) outweighs load (queue 3 + KV 2 +
    /// in-flight 3 = 8), so a replica holding the prompt loses only to
    /// one clearly busier. Prefix weighs three times in-flight: a turn of a
    /// long conversation or a request over a shared document is sent where
    /// its context is cached through the load gaps of ordinary traffic,
    /// since moving it costs a whole prefill and leaves the context cached
    /// on two replicas. Measured in virtual time over three seeds against
    /// lower weights (docs/picker.md, "Load against affinity"): at 3,
    /// multi-turn turns strayed at every small gap (one seed in three
    /// collapsed); at 6, long multi-turn runs held 1 point fewer prefix
    /// hits than cache-aware peers and TTFT p95 was 11-18 % higher than at
    /// 9, shared-prefix 25-40 % higher, and one agent seed collapsed at
    /// 50 % load. Scenarios without shared prompts do not feel it.
    /// Raising in-flight with prefix instead helped nothing and made mixed
    /// fleets worse (speed's share fell). A burst of one new prompt still
    /// spreads: the prefix score fades with the holder's unanswered
    /// requests (`scorers::prefix`).
    /// Queue weighs 3 because a waiting request in vLLM-style engines means
    /// the batch is already full, which costs more time to first token
    /// than the prefill a cache hit saves, except for a very small queue.
    /// LoRA weight 2 makes a resident adapter (an avoided swap) worth
    /// about as much as a modest load gap.
    pub const CHAT: Weights = Weights::column(Preset::Default);

    /// Lowest time to first token under bursty load: spread load first,
    /// keep prefix affinity as a tie-breaker among similarly loaded replicas.
    pub const LATENCY: Weights = Weights::column(Preset::Latency);

    /// Highest tokens per second for batch work: every cache hit is prefill
    /// compute saved and every avoided adapter swap keeps the batch full;
    /// queueing is acceptable, KV pressure is not (preemption recomputes).
    /// Prefix weighs as in the chat preset: at 4 (equal to in-flight) the
    /// turns of agent loops strayed from their context and two seeds of
    /// three collapsed at 50 % load in virtual time (TTFT p95 19-21 s
    /// against 1.4-1.6 s at 9), and shared-prefix, prefix-pressure and
    /// multi-turn kept 6-8 points fewer prefix hits. Bursts of one shared
    /// prompt spread through the fading of prefix affinity with unanswered
    /// requests (`scorers::prefix`), not through in-flight's weight.
    pub const THROUGHPUT: Weights = Weights::column(Preset::Throughput);

    /// Session affinity's weight in every preset. A session's replica
    /// gets the whole session score and every other replica none, so 4
    /// (half the load weights of the chat preset) keeps a session where it
    /// is against load gaps of up to half the load score; past that, or
    /// past the load bound of [`crate::session`], it moves. Its prefix
    /// affinity usually points the same way and adds to it.
    pub const SESSION: f64 = 4.0;

    /// A named preset: `"default"` (chat), `"latency"` or `"throughput"`.
    pub fn preset(name: &str) -> Option<Weights> {
        match name {
            "default" => Some(Weights::CHAT),
            "latency" => Some(Weights::LATENCY),
            "throughput" => Some(Weights::THROUGHPUT),
            _ => None,
        }
    }

    pub fn sum(&self) -> f64 {
        Scorer::ALL.iter().map(|&s| self.get(s)).sum()
    }
}

impl Default for Weights {
    fn default() -> Self {
        Weights::CHAT
    }
}

/// When a replica counts as saturated: it is skipped by [`Policy::Scored`],
/// and when every healthy replica is saturated the pool answers 429.
///
/// A replica is saturated when `waiting >= queue_depth` OR
/// `kv_usage >= kv_cache`. An unknown signal never makes a replica
/// saturated.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Saturation {
    /// Waiting requests at which a replica is full. Default 5: in
    /// vLLM-style engines anything waiting means the running batch is full,
    /// and five waiting is a few scheduler steps of backlog, enough to
    /// absorb scrape noise without letting queues grow long. (The same
    /// threshold as the Gateway API Inference Extension's default.)
    pub queue_depth: u64,
    /// KV cache fraction at which a replica is full. Default 1.0: only a
    /// full cache saturates. A replica whose cache runs full stops
    /// admitting, so its queue trips `queue_depth` soon after; a lower
    /// bound held work back from replicas that had room (at 0.8, 12 % of
    /// shared-prefix requests were refused at 100 % load in virtual runs,
    /// none at 1.0, and TTFT P95 fell tenfold). Lower it for engines that
    /// preempt long generations badly.
    pub kv_cache: f64,
}

impl Saturation {
    pub const DEFAULT_QUEUE_DEPTH: u64 = 5;
    pub const DEFAULT_KV_CACHE: f64 = 1.0;

    /// The bound for a request that may fill `share` of the queue depth
    /// (at least one waiting request); the KV bound is the same for all.
    pub fn for_share(self, share: Option<f64>) -> Saturation {
        match share {
            Some(share) if share < 1.0 => Saturation {
                queue_depth: ((self.queue_depth as f64 * share).round() as u64).max(1),
                ..self
            },
            _ => self,
        }
    }

    pub fn is_saturated(&self, waiting: Option<u64>, kv_usage: Option<f64>) -> bool {
        waiting.is_some_and(|w| w >= self.queue_depth)
            || kv_usage.is_some_and(|kv| kv >= self.kv_cache)
    }
}

impl Default for Saturation {
    fn default() -> Self {
        Saturation {
            queue_depth: Self::DEFAULT_QUEUE_DEPTH,
            kv_cache: Self::DEFAULT_KV_CACHE,
        }
    }
}

/// What [`Policy::Scored`] does when no replica has fresh, healthy metrics
/// but some are reachable (for example the metrics port is down while the
/// serving port works).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Fallback {
    /// Keep serving: pick the reachable replica with the fewest requests in
    /// flight from this gateway. The default, because failing a whole pool
    /// over a metrics outage is worse than routing blind for a while
    /// (llm-d #2100: a strict staleness threshold halted whole pools).
    #[default]
    LeastRequest,
    /// Refuse with [`crate::PickError::NoHealthyReplicas`].
    Refuse,
}

impl Fallback {
    pub fn name(self) -> &'static str {
        match self {
            Fallback::LeastRequest => "least-request",
            Fallback::Refuse => "refuse",
        }
    }
}

impl FromStr for Fallback {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        [Fallback::LeastRequest, Fallback::Refuse]
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| UnknownName {
                kind: "fallback",
                name: s.to_owned(),
                expected: "least-request, refuse",
            })
    }
}

/// How far ahead of the least-loaded candidate a replica's in-flight load
/// must be before the in-flight scorer gives it the lowest score. Smaller
/// gaps are scored in proportion, so a difference of one request among
/// otherwise equal replicas still decides, but does not swing the score
/// from 1 to 0 and override prefix affinity on noise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct InflightTolerance {
    /// Default 4 requests.
    pub requests: u64,
    /// Default 16,384 estimated tokens (a few long prompts).
    pub tokens: u64,
}

impl InflightTolerance {
    pub const DEFAULT_REQUESTS: u64 = 4;
    pub const DEFAULT_TOKENS: u64 = 16_384;
}

impl Default for InflightTolerance {
    fn default() -> Self {
        InflightTolerance {
            requests: Self::DEFAULT_REQUESTS,
            tokens: Self::DEFAULT_TOKENS,
        }
    }
}

/// How each replica's latency model learns and when [`Policy::Predicted`]
/// trusts it ([`crate::predict`]; docs/picker.md, "Predicted latency").
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PredictConfig {
    /// Observations a replica's model needs before its predictions are
    /// used; a replica with fewer is explored. Default 20: about three per
    /// coefficient of the model (7 per target), and with the recent error's
    /// weight of 0.1 the first, untrained guesses weigh about a tenth of
    /// the error by then.
    pub min_observations: u64,
    /// Recent mean absolute percentage error, of TTFT and of ITL, under
    /// which a model is trusted. Default 0.35: on the synthetic replicas
    /// of the tests a model of the right form meets about 0.1 with 10 %
    /// noise and 0.25-0.3 with 30 %, while one that has not caught up with
    /// its replica (a speed that doubled: 0.5 at first) goes over it within
    /// about 15 requests, and a model without the term for batching's cost
    /// stays over it on a CPU-like replica.
    pub max_error: f64,
    /// The forgetting factor λ of the least-squares fits: each
    /// observation's weight falls by λ per later one, so a fit remembers
    /// about `1 / (1 - λ)` requests. Default 0.97 (about 33 requests): on
    /// the synthetic replicas a replica twice as slow was learned again
    /// within 64 requests, where 0.98 took 85 and 0.99 several hundred;
    /// 0.95 took 52 but its error was a quarter higher (docs/picker.md,
    /// "Predicted latency").
    pub forgetting: f64,
    /// Share of picks that go, at random, to a replica still being
    /// measured (fewer than `min_observations`), so a replica that has
    /// just joined is measured even when the others look faster.
    /// Default 0.1: a newcomer is measured within about 200 picks of the
    /// pool, and at most a tenth of the pool's requests go where nothing
    /// is known yet.
    pub explore_share: f64,
}

impl PredictConfig {
    pub const DEFAULT_MIN_OBSERVATIONS: u64 = 20;
    pub const DEFAULT_MAX_ERROR: f64 = 0.35;
    pub const DEFAULT_FORGETTING: f64 = 0.97;
    pub const DEFAULT_EXPLORE_SHARE: f64 = 0.1;
    /// Output tokens assumed for a request that says nothing of its length
    /// (`PickRequest::expected_output_tokens` 0): a typical chat answer.
    pub const DEFAULT_OUTPUT_TOKENS: u64 = 256;
    /// Weight of the newest observation in the recent error: about the
    /// last ten requests count, so a model that goes wrong loses trust
    /// within a few.
    pub const ERROR_WEIGHT: f64 = 0.1;

    /// Every problem with these settings, in one message each.
    fn problems(&self, problems: &mut Vec<String>) {
        if self.min_observations == 0 {
            problems.push("predict.min_observations must be >= 1".into());
        }
        let error = self.max_error;
        if !(error.is_finite() && error > 0.0) {
            problems.push(format!("predict.max_error must be > 0, got {error}"));
        }
        let forgetting = self.forgetting;
        if !(forgetting > 0.5 && forgetting <= 1.0) {
            problems.push(format!(
                "predict.forgetting must be in (0.5, 1], got {forgetting}"
            ));
        }
        let share = self.explore_share;
        if !(0.0..=1.0).contains(&share) {
            problems.push(format!(
                "predict.explore_share must be in [0, 1], got {share}"
            ));
        }
    }
}

impl Default for PredictConfig {
    fn default() -> Self {
        PredictConfig {
            min_observations: Self::DEFAULT_MIN_OBSERVATIONS,
            max_error: Self::DEFAULT_MAX_ERROR,
            forgetting: Self::DEFAULT_FORGETTING,
            explore_share: Self::DEFAULT_EXPLORE_SHARE,
        }
    }
}

/// How prompts are cut into blocks for prefix affinity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct PrefixConfig {
    /// Bytes of prompt text per block. Default 64 bytes, about 16 tokens at
    /// the usual ~4 characters per token of English text, which is vLLM's
    /// KV block size: a block here roughly matches a block the engine can
    /// reuse. (Text is hashed, not tokens, so the match is approximate.)
    pub block_bytes: usize,
    /// Blocks hashed at most per prompt. Default 1,024 blocks (64 KiB, about
    /// 16k tokens): beyond that affinity is already decided, and the bound
    /// keeps hashing and index updates cheap for very long prompts.
    pub max_blocks: usize,
    /// How many blocks the index remembers per replica when the replica
    /// does not report its KV capacity. Default 16,384 blocks (about 262k
    /// tokens), the KV capacity of a mid-size GPU replica.
    pub default_capacity_blocks: usize,
}

impl PrefixConfig {
    pub const DEFAULT_BLOCK_BYTES: usize = 64;
    pub const DEFAULT_MAX_BLOCKS: usize = 1024;
    pub const DEFAULT_CAPACITY_BLOCKS: usize = 16_384;
    /// Blocks the index remembers for a whole pool, shared out evenly
    /// between its replicas when that is less than their KV capacity.
    pub const POOL_BUDGET_BLOCKS: u64 = 4 << 20;
    /// Prompt bytes per token assumed when converting a replica's KV
    /// capacity (in tokens) into prompt blocks.
    pub const BYTES_PER_TOKEN: u64 = 4;

    /// A replica's KV capacity in prompt blocks, from the engine's KV blocks
    /// and tokens per KV block.
    pub fn capacity_from_kv(&self, kv_blocks: u64, tokens_per_kv_block: u32) -> u64 {
        let bytes = kv_blocks
            .saturating_mul(u64::from(tokens_per_kv_block))
            .saturating_mul(Self::BYTES_PER_TOKEN);
        (bytes / self.block_bytes.max(1) as u64).max(1)
    }
}

impl Default for PrefixConfig {
    fn default() -> Self {
        PrefixConfig {
            block_bytes: Self::DEFAULT_BLOCK_BYTES,
            max_blocks: Self::DEFAULT_MAX_BLOCKS,
            default_capacity_blocks: Self::DEFAULT_CAPACITY_BLOCKS,
        }
    }
}

/// Bounds and assumptions of the `Retry-After` estimate for a saturated
/// pool (see [`crate::estimate_retry_after`]): the time to work through the
/// waiting requests at the pool's measured drain rate.
pub mod retry_after {
    use std::time::Duration;

    /// Never ask a client to come back sooner: a saturated pool rarely
    /// clears faster, and sooner retries only add load.
    pub const MIN: Duration = Duration::from_secs(1);
    /// Never ask a client to wait longer: past a minute the estimate is
    /// guesswork and the client should decide for itself.
    pub const MAX: Duration = Duration::from_secs(60);
    /// Completions per second per replica assumed before any are measured.
    /// Deliberately low (long generations take seconds each), so the first
    /// estimates err towards waiting longer.
    pub const ASSUMED_DRAIN_PER_REPLICA: f64 = 1.0;
    /// The drain rate is sampled at most this often.
    pub const SAMPLE_EVERY: Duration = Duration::from_secs(1);
    /// Samples further apart than this describe another load level and are
    /// not used for the rate.
    pub const MAX_SAMPLE_WINDOW: Duration = Duration::from_secs(10);
}

/// Everything that shapes a pool's picks.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PickerConfig {
    pub policy: Policy,
    pub weights: Weights,
    pub saturation: Saturation,
    pub inflight_tolerance: InflightTolerance,
    /// Metrics older than this make a replica stale (excluded from
    /// [`Policy::Scored`] until they resume). Default 1 s: twenty scrapes at
    /// the 50 ms interval, so a slow scrape or a pause does not drop a
    /// replica, yet a dead one leaves within a second (and a failed
    /// connection marks it unreachable at once).
    pub stale_after: Duration,
    pub fallback: Fallback,
    pub prefix: PrefixConfig,
    /// Context length of a replica that has not said its own.
    pub context_length: Option<u64>,
    /// The latency models of [`Policy::Predicted`].
    pub predict: PredictConfig,
}

impl PickerConfig {
    pub const DEFAULT_STALE_AFTER: Duration = Duration::from_secs(1);

    /// Whether picks read the prompt's prefix hashes: scored picks with
    /// prefix affinity weighed, or explained, and every predicted pick
    /// (the cached share of the prompt is a feature of its latency
    /// models). Other picks need not hash the prompt at all.
    pub fn uses_prompt_hashes(&self, explain: bool) -> bool {
        match self.policy {
            Policy::Predicted => true,
            Policy::Scored => self.weights.prefix > 0.0 || explain,
            _ => false,
        }
    }

    /// Every problem with the config, in one message each; empty when valid.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for scorer in Scorer::ALL {
            let weight = self.weights.get(scorer);
            if !weight.is_finite() || weight < 0.0 {
                problems.push(format!(
                    "weights.{} must be a finite number >= 0, got {weight}",
                    scorer.field()
                ));
            }
        }
        if self.policy.uses_scores() && self.weights.sum() <= 0.0 {
            problems.push(format!(
                "weights: at least one weight must be > 0 for the {} policy",
                self.policy
            ));
        }
        if self.saturation.queue_depth == 0 {
            problems.push("saturation.queue_depth must be >= 1".into());
        }
        let kv = self.saturation.kv_cache;
        if !(kv > 0.0 && kv <= 1.0) {
            problems.push(format!("saturation.kv_cache must be in (0, 1], got {kv}"));
        }
        if self.inflight_tolerance.requests == 0 || self.inflight_tolerance.tokens == 0 {
            problems.push("inflight_tolerance values must be >= 1".into());
        }
        if self.stale_after.is_zero() {
            problems.push("stale_after must be > 0".into());
        }
        if self.prefix.block_bytes == 0 {
            problems.push("prefix.block_bytes must be >= 1".into());
        }
        if self.prefix.max_blocks == 0 {
            problems.push("prefix.max_blocks must be >= 1".into());
        }
        if self.prefix.default_capacity_blocks == 0 {
            problems.push("prefix.default_capacity_blocks must be >= 1".into());
        }
        self.predict.problems(&mut problems);
        problems
    }

    /// `Ok` when [`PickerConfig::problems`] finds none.
    pub fn validate(&self) -> Result<(), Vec<String>> {
        let problems = self.problems();
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems)
        }
    }
}

impl Default for PickerConfig {
    fn default() -> Self {
        PickerConfig {
            policy: Policy::default(),
            weights: Weights::default(),
            saturation: Saturation::default(),
            inflight_tolerance: InflightTolerance::default(),
            stale_after: Self::DEFAULT_STALE_AFTER,
            fallback: Fallback::default(),
            prefix: PrefixConfig::default(),
            context_length: None,
            predict: PredictConfig::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn only_scored_picks_weighing_or_explaining_prefixes_need_the_prompt_hashed() {
        let scored = PickerConfig::default();
        assert!(scored.weights.prefix > 0.0);
        assert!(scored.uses_prompt_hashes(false));
        let mut unweighted = scored.clone();
        unweighted.weights.prefix = 0.0;
        assert!(!unweighted.uses_prompt_hashes(false));
        assert!(unweighted.uses_prompt_hashes(true));
        // The predicted policy reads the cached share of every prompt.
        unweighted.policy = Policy::Predicted;
        assert!(unweighted.uses_prompt_hashes(false));
        for policy in [Policy::RoundRobin, Policy::LeastRequest, Policy::Random] {
            let config = PickerConfig {
                policy,
                ..PickerConfig::default()
            };
            assert!(!config.uses_prompt_hashes(true), "{policy:?}");
        }
    }

    #[test]
    fn default_weights_are_the_default_preset() {
        assert_eq!(Weights::default(), Weights::preset("default").unwrap());
        for name in Weights::PRESETS {
            assert!(Weights::preset(name).is_some(), "{name}");
        }
        assert_eq!(Weights::preset("fastest"), None);
    }

    #[test]
    fn each_scorer_has_its_own_weight_field_and_names() {
        let mut weights = Weights::CHAT;
        for (i, scorer) in Scorer::ALL.into_iter().enumerate() {
            // Scores are stored at `scorer as usize` and reported in ALL order.
            assert_eq!(scorer as usize, i, "{scorer:?}");
            weights.set(scorer, 100.0 + i as f64);
        }
        let fields = serde_json::to_value(weights).unwrap();
        let fields = fields.as_object().unwrap();
        assert_eq!(fields.len(), Scorer::COUNT, "{fields:?}");
        for (i, scorer) in Scorer::ALL.into_iter().enumerate() {
            let expected = 100.0 + i as f64;
            assert_eq!(weights.get(scorer), expected, "{scorer:?}");
            assert_eq!(scorer.weight(&weights), expected, "{scorer:?}");
            assert_eq!(fields[scorer.field()], expected, "{scorer:?}");
            // The config's name is the field's, in the config's camelCase.
            let mut camel = String::new();
            for (j, part) in scorer.field().split('_').enumerate() {
                let mut chars = part.chars();
                if let (true, Some(first)) = (j > 0, chars.next()) {
                    camel.extend(first.to_uppercase());
                    camel.push_str(chars.as_str());
                } else {
                    camel.push_str(part);
                }
            }
            assert_eq!(scorer.name(), camel, "{scorer:?}");
            assert!(!scorer.doc().is_empty() && !scorer.doc().contains('\n'));
        }
        let distinct = |names: Vec<&str>| names.iter().collect::<HashSet<_>>().len();
        assert_eq!(
            distinct(Scorer::ALL.map(Scorer::name).into()),
            Scorer::COUNT
        );
        assert_eq!(
            distinct(Scorer::ALL.map(Scorer::label).into()),
            Scorer::COUNT
        );
    }

    #[test]
    fn presets_are_the_table_columns() {
        let columns = [
            ("default", Weights::CHAT),
            ("latency", Weights::LATENCY),
            ("throughput", Weights::THROUGHPUT),
        ];
        assert_eq!(columns.map(|(name, _)| name), Weights::PRESETS);
        for (name, weights) in columns {
            assert_eq!(Weights::preset(name), Some(weights), "{name}");
        }
    }

    /// docs/picker.md lists the scorers in a table (config name, what it
    /// rates, header label, formula, weight in each preset) and then one
    /// paragraph each; both follow the table in this file.
    #[test]
    fn the_docs_list_every_scorer_as_the_table_declares_it() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/picker.md");
        let docs = std::fs::read_to_string(path).unwrap();
        let section = docs
            .split_once("\n## Scorers\n")
            .and_then(|(_, rest)| rest.split_once("\n## "))
            .map(|(section, _)| section)
            .expect("docs/picker.md has a Scorers section");
        // Every column but the formula (the fourth), which is prose.
        let documented: Vec<Vec<String>> = section
            .lines()
            .skip_while(|line| !line.starts_with("| scorer"))
            .skip(2)
            .take_while(|line| line.starts_with('|'))
            .map(|line| {
                let cells = line.trim_matches('|').split(" | ").map(str::trim);
                cells
                    .enumerate()
                    .filter(|&(i, _)| i != 3)
                    .map(|(_, cell)| cell.to_owned())
                    .collect()
            })
            .collect();
        let presets = [Weights::CHAT, Weights::LATENCY, Weights::THROUGHPUT];
        let expected: Vec<Vec<String>> = Scorer::ALL
            .iter()
            .map(|&s| {
                let mut row = vec![
                    format!("`{}`", s.name()),
                    s.doc().to_owned(),
                    format!("`{}`", s.label()),
                ];
                row.extend(presets.iter().map(|w| w.get(s).to_string()));
                row
            })
            .collect();
        assert_eq!(documented, expected);
        let paragraphs: Vec<&str> = section
            .lines()
            .filter_map(|line| line.strip_prefix("- **`"))
            .filter_map(|line| line.split_once("`**").map(|(name, _)| name))
            .collect();
        assert_eq!(paragraphs, Scorer::ALL.map(Scorer::name));
    }

    #[test]
    fn saturation_rule() {
        let s = Saturation::default();
        assert!(!s.is_saturated(Some(4), Some(0.99)));
        assert!(s.is_saturated(Some(5), Some(0.1)));
        assert!(s.is_saturated(Some(0), Some(1.0)));
        assert!(!s.is_saturated(None, None), "unknown is not saturated");
        // A band's share of the queue depth; at least one place.
        assert!(s.for_share(Some(0.6)).is_saturated(Some(3), None));
        assert!(!s.for_share(Some(0.6)).is_saturated(Some(2), None));
        assert_eq!(s.for_share(Some(0.01)).queue_depth, 1);
        assert_eq!(s.for_share(None), s);
        assert_eq!(s.for_share(Some(1.0)), s);
    }

    #[test]
    fn policy_names_round_trip() {
        for p in Policy::ALL {
            assert_eq!(p.name().parse::<Policy>(), Ok(p));
        }
        let err = "fastest".parse::<Policy>().unwrap_err();
        assert!(err.to_string().contains("fastest"));
        assert_eq!("refuse".parse::<Fallback>(), Ok(Fallback::Refuse));
    }

    #[test]
    fn default_config_is_valid_and_bad_values_are_all_reported() {
        assert_eq!(PickerConfig::default().validate(), Ok(()));
        let bad = PickerConfig {
            weights: Weights {
                queue: -1.0,
                kv_cache: f64::NAN,
                ..Weights::default()
            },
            saturation: Saturation {
                queue_depth: 0,
                kv_cache: 1.5,
            },
            stale_after: Duration::ZERO,
            ..PickerConfig::default()
        };
        let problems = bad.validate().unwrap_err();
        assert_eq!(problems.len(), 5, "{problems:?}");
        assert!(problems[0].contains("weights.queue"));

        let bad = PickerConfig {
            policy: Policy::Predicted,
            weights: Weights {
                queue: 0.0,
                kv_cache: 0.0,
                inflight: 0.0,
                prefix: 0.0,
                lora: 0.0,
                speed: 0.0,
                session: 0.0,
            },
            predict: PredictConfig {
                min_observations: 0,
                max_error: f64::NAN,
                forgetting: 1.5,
                explore_share: -0.1,
            },
            ..PickerConfig::default()
        };
        let problems = bad.validate().unwrap_err();
        assert_eq!(problems.len(), 5, "{problems:?}");
        assert!(problems[0].contains("predicted policy"), "{problems:?}");
        for (problem, field) in problems[1..].iter().zip([
            "min_observations",
            "max_error",
            "forgetting",
            "explore_share",
        ]) {
            assert!(problem.contains(field), "{problem}");
        }
    }

    #[test]
    fn kv_capacity_converts_to_prompt_blocks() {
        let p = PrefixConfig::default();
        // 1000 KV blocks of 16 tokens = 16,000 tokens = 64,000 bytes = 1000 blocks of 64 B.
        assert_eq!(p.capacity_from_kv(1000, 16), 1000);
        assert_eq!(p.capacity_from_kv(0, 16), 1);
    }
}
