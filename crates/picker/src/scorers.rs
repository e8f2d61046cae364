//! Scorers: each gives every candidate a score in `[0, 1]`, higher is
//! better, from the candidates' [`Features`] alone.
//!
//! Unknown signals (`None`: the engine's dialect does not expose them) must
//! not make a replica look idle or full. A candidate whose signal is unknown
//! gets the mean score of the candidates whose signal is known, as if it
//! were a typical member of the pool; when no candidate knows the signal,
//! every candidate gets 1 and the scorer does not discriminate.

use serde::Serialize;

use crate::observation::EngineState;
pub use crate::policy::Scorer;
use crate::policy::{InflightTolerance, Weights};
use crate::prefix::PrefixSource;
use crate::session::SessionFit;

/// What the scorers know about one candidate, extracted once per pick.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Features {
    /// Requests waiting in the engine (scraped).
    pub waiting: Option<u64>,
    /// Requests this gateway sent that the replica has not answered yet (no
    /// response byte): in its queue or being prefilled. Current at every
    /// pick, where `waiting` is as old as the last scrape.
    pub unanswered: u64,
    /// KV cache fraction in use (scraped).
    pub kv_usage: Option<f64>,
    /// Requests this gateway has in flight to the replica.
    pub inflight_requests: u64,
    /// Estimated tokens of those requests.
    pub inflight_tokens: u64,
    /// Leading prompt blocks the replica is believed to have cached.
    pub prefix_blocks: usize,
    /// Which index said so.
    pub prefix_source: PrefixSource,
    pub lora: LoraFit,
    /// Seconds per generated token the gateway measured on the replica.
    pub token_time: Option<f64>,
    /// The replica's place for the request's session
    /// ([`crate::session`]).
    pub session: SessionFit,
}

/// How well a replica can serve the request's LoRA adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LoraFit {
    /// The request names no adapter.
    #[default]
    NotRequested,
    /// Loaded in GPU memory: no swap.
    Resident,
    /// Not loaded, but an adapter slot is free: a load, no eviction.
    FreeSlot,
    /// Requests are already waiting for it to load.
    Loading,
    /// Every slot is taken by other adapters: a swap behind other work.
    NoRoom,
    /// The engine does not report adapters.
    Unknown,
}

impl LoraFit {
    pub fn classify(adapter: Option<&str>, state: Option<&EngineState>) -> LoraFit {
        let Some(adapter) = adapter else {
            return LoraFit::NotRequested;
        };
        let Some(state) = state else {
            return LoraFit::Unknown;
        };
        let listed = |names: &[String]| names.iter().any(|name| name == adapter);
        if listed(&state.resident_adapters) {
            return LoraFit::Resident;
        }
        let loading = listed(&state.waiting_adapters);
        match state.max_adapters {
            Some(slots) if state.resident_adapters.len() < slots as usize => LoraFit::FreeSlot,
            _ if loading => LoraFit::Loading,
            Some(_) => LoraFit::NoRoom,
            None => LoraFit::Unknown,
        }
    }

    /// The fit's score; `None` when unknown.
    pub fn score(self) -> Option<f64> {
        match self {
            LoraFit::NotRequested | LoraFit::Resident => Some(1.0),
            LoraFit::FreeSlot => Some(0.8),
            LoraFit::Loading => Some(0.6),
            LoraFit::NoRoom => Some(0.0),
            LoraFit::Unknown => None,
        }
    }
}

/// Per-pick inputs the scorers share.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ScoreContext {
    /// Complete blocks in the request's prompt (its prefix hashes).
    pub prompt_blocks: usize,
    /// Queue gap that costs the whole queue score: the saturation queue
    /// depth (candidates at or above it were already filtered out).
    pub queue_depth: u64,
    pub inflight_tolerance: InflightTolerance,
}

impl Scorer {
    /// The scorer's weight; the scorers are declared, with their weights,
    /// in the table in [`crate::policy`].
    pub fn weight(self, weights: &Weights) -> f64 {
        weights.get(self)
    }

    /// Score every candidate: `out[i]` for `signals[i]`.
    pub fn score(self, signals: &[Features], ctx: &ScoreContext, out: &mut [f64]) {
        match self {
            Scorer::Queue => queue(signals, ctx.queue_depth, out),
            Scorer::KvCache => kv_cache(signals, out),
            Scorer::Inflight => inflight(signals, ctx.inflight_tolerance, out),
            Scorer::Prefix => prefix(signals, ctx.prompt_blocks, out),
            Scorer::Lora => lora(signals, out),
            Scorer::Speed => speed(signals, out),
            Scorer::Session => session(signals, out),
        }
    }
}

/// A shorter queue is better: `1 - (q - min) / max(max - min,
/// queue_depth)` over the candidates, where `q` is the larger of the
/// scraped queue and this gateway's unanswered requests. Measured against
/// the saturation depth rather than the observed spread alone, so one stray
/// waiting request (a request sampled between engine steps) costs
/// `1/queue_depth`, not the whole score; all equal → 1.
///
/// The scraped queue is up to a scrape interval old but counts every
/// client's requests; the unanswered count is this gateway's alone but
/// current. Each is a lower bound of the replica's backlog, so the larger
/// one is used. Between scrapes the unanswered count is what keeps two
/// requests from landing in the same engine step on a replica that has
/// just taken one, and it gives engines that do not report a queue a queue
/// signal.
pub fn queue(signals: &[Features], queue_depth: u64, out: &mut [f64]) {
    lower_is_better(
        out,
        |i| Some(queue_of(&signals[i]) as f64),
        queue_depth.max(1) as f64,
    );
}

/// The backlog the queue scorer ranks by.
fn queue_of(signals: &Features) -> u64 {
    signals.waiting.unwrap_or(0).max(signals.unanswered)
}

/// More free KV cache is better: `1 - kv_usage`. Absolute, not relative:
/// a 30 % full cache is fine however full the others are.
pub fn kv_cache(signals: &[Features], out: &mut [f64]) {
    for (score, s) in out.iter_mut().zip(signals) {
        *score = match s.kv_usage {
            Some(kv) if kv.is_finite() => 1.0 - kv.clamp(0.0, 1.0),
            _ => f64::NAN,
        };
    }
    fill_unknown_with_mean(out);
}

/// Less in flight from this gateway is better: the mean of the request and
/// token scores, each `1 - (x - min) / max(max - min, tolerance)`. This is
/// the one signal that moves between scrapes, so a burst spreads instead
/// of landing on the replica that looked idle at the last scrape.
pub fn inflight(signals: &[Features], tolerance: InflightTolerance, out: &mut [f64]) {
    lower_is_better(
        out,
        |i| Some(signals[i].inflight_requests as f64),
        tolerance.requests.max(1) as f64,
    );
    let (mut min, mut max) = (u64::MAX, 0);
    for s in signals {
        min = min.min(s.inflight_tokens);
        max = max.max(s.inflight_tokens);
    }
    let range = (max.saturating_sub(min)).max(tolerance.tokens.max(1)) as f64;
    for (score, s) in out.iter_mut().zip(signals) {
        let tokens = 1.0 - (s.inflight_tokens - min) as f64 / range;
        *score = 0.5 * (*score + tokens);
    }
}

/// Unanswered requests beyond the fewest of any candidate at which a
/// replica's prefix affinity is gone ([`prefix`]).
pub const AFFINITY_UNANSWERED_BOUND: u64 = 8;

/// Share of the prompt the replica is believed to have cached
/// (matched blocks / prompt blocks), bounded by load: it fades with the
/// requests this gateway sent the replica that have no answer yet beyond
/// the fewest any candidate has, to nothing at
/// [`AFFINITY_UNANSWERED_BOUND`] more. A burst of one prompt therefore
/// spreads before the next scrape whatever the saturation depth, while a
/// conversation stays where its context is cached through the scraped
/// queue gaps of ordinary traffic: fading by the scraped queue too sent
/// strayed turns elsewhere and brought back the multi-turn collapse (one
/// seed in three at 11 s TTFT p95 in virtual time). A prompt shorter than
/// one block has nothing to match: every candidate gets 1.
pub fn prefix(signals: &[Features], prompt_blocks: usize, out: &mut [f64]) {
    if prompt_blocks == 0 {
        out.fill(1.0);
        return;
    }
    let fewest = signals.iter().map(|s| s.unanswered).min().unwrap_or(0);
    for (score, s) in out.iter_mut().zip(signals) {
        let matched = (s.prefix_blocks as f64 / prompt_blocks as f64).min(1.0);
        let excess = (s.unanswered - fewest).min(AFFINITY_UNANSWERED_BOUND);
        *score = matched * (1.0 - excess as f64 / AFFINITY_UNANSWERED_BOUND as f64);
    }
}

/// Adapter resident → 1, a free slot → 0.8, already loading → 0.6, no room
/// → 0; no adapter requested → 1 for every candidate.
pub fn lora(signals: &[Features], out: &mut [f64]) {
    for (score, s) in out.iter_mut().zip(signals) {
        *score = s.lora.score().unwrap_or(f64::NAN);
    }
    fill_unknown_with_mean(out);
}

/// The session's home → 1, other replicas → 0 ([`crate::session`]);
/// without a session every candidate gets 1.
pub fn session(signals: &[Features], out: &mut [f64]) {
    for (score, s) in out.iter_mut().zip(signals) {
        *score = match s.session {
            SessionFit::NoSession | SessionFit::Home => 1.0,
            SessionFit::Away => 0.0,
        };
    }
}

/// `1 - (v - min) / max(max - min, floor)` for known values; unknown ones
/// get the mean. `value(i)` is candidate `i`'s value.
/// The fastest measured replica scores 1, another its speed relative to
/// it (a replica three times slower per token scores 1/3): at equal load
/// the faster replica wins, and a slower one gets work once the faster
/// ones' load outweighs the difference.
pub fn speed(signals: &[Features], out: &mut [f64]) {
    let fastest = signals
        .iter()
        .filter_map(|s| s.token_time)
        .filter(|t| t.is_finite() && *t > 0.0)
        .fold(f64::INFINITY, f64::min);
    for (score, s) in out.iter_mut().zip(signals) {
        *score = match s.token_time {
            Some(t) if t.is_finite() && t > 0.0 => (fastest / t).min(1.0),
            _ => f64::NAN,
        };
    }
    fill_unknown_with_mean(out);
}

fn lower_is_better(out: &mut [f64], value: impl Fn(usize) -> Option<f64>, floor: f64) {
    let (mut min, mut max) = (f64::INFINITY, f64::NEG_INFINITY);
    for i in 0..out.len() {
        if let Some(v) = value(i).filter(|v| v.is_finite()) {
            min = min.min(v);
            max = max.max(v);
        }
    }
    let range = (max - min).max(floor);
    for (i, score) in out.iter_mut().enumerate() {
        *score = match value(i).filter(|v| v.is_finite()) {
            Some(v) if range > 0.0 => 1.0 - (v - min) / range,
            Some(_) => 1.0,
            None => f64::NAN,
        };
    }
    fill_unknown_with_mean(out);
}

/// Replace NaN (unknown) scores by the mean of the known ones, or by 1 when
/// none is known.
fn fill_unknown_with_mean(out: &mut [f64]) {
    let (mut sum, mut known) = (0.0, 0usize);
    for &score in out.iter() {
        if !score.is_nan() {
            sum += score;
            known += 1;
        }
    }
    if known == out.len() {
        return;
    }
    let neutral = if known == 0 { 1.0 } else { sum / known as f64 };
    for score in out.iter_mut().filter(|s| s.is_nan()) {
        *score = neutral;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(scorer: Scorer, signals: &[Features], prompt_blocks: usize) -> Vec<f64> {
        let ctx = ScoreContext {
            prompt_blocks,
            queue_depth: 5,
            inflight_tolerance: InflightTolerance::default(),
        };
        let mut out = vec![f64::NAN; signals.len()];
        scorer.score(signals, &ctx, &mut out);
        for &s in &out {
            assert!(
                (0.0..=1.0).contains(&s),
                "{scorer:?} score {s} out of [0, 1]"
            );
        }
        out
    }

    fn waiting(w: Option<u64>) -> Features {
        Features {
            waiting: w,
            ..Features::default()
        }
    }

    fn approx(actual: &[f64], expected: &[f64]) {
        assert_eq!(actual.len(), expected.len());
        for (a, e) in actual.iter().zip(expected) {
            assert!((a - e).abs() < 1e-9, "{actual:?} != {expected:?}");
        }
    }

    #[test]
    fn queue_prefers_fewer_waiting_scaled_by_queue_depth() {
        let s = [waiting(Some(0)), waiting(Some(1)), waiting(Some(4))];
        approx(&run(Scorer::Queue, &s, 0), &[1.0, 0.8, 0.2]);
        // Wider spreads (possible with a larger depth elsewhere) are min-max.
        let s = [waiting(Some(2)), waiting(Some(12)), waiting(Some(22))];
        approx(&run(Scorer::Queue, &s, 0), &[1.0, 0.5, 0.0]);
        let s = [waiting(Some(3)), waiting(Some(3))];
        approx(&run(Scorer::Queue, &s, 0), &[1.0, 1.0]);
    }

    #[test]
    fn queue_is_the_larger_of_scraped_and_unanswered() {
        let queue = |waiting: Option<u64>, unanswered| Features {
            waiting,
            unanswered,
            ..Features::default()
        };
        // Two sent since the scrape said 0; a scraped 3 that includes
        // other clients' requests outweighs this gateway's 1.
        let s = [queue(Some(0), 0), queue(Some(0), 2), queue(Some(3), 1)];
        approx(&run(Scorer::Queue, &s, 0), &[1.0, 0.6, 0.4]);
        // An engine that reports no queue is ranked by what it owes us.
        let s = [queue(None, 0), queue(None, 1)];
        approx(&run(Scorer::Queue, &s, 0), &[1.0, 0.8]);
    }

    #[test]
    fn kv_cache_scores_free_fraction() {
        let kv = |v| Features {
            kv_usage: v,
            ..Features::default()
        };
        let s = [
            kv(Some(0.25)),
            kv(Some(0.75)),
            kv(None),
            kv(Some(f64::NAN)),
            kv(Some(1.5)),
        ];
        approx(
            &run(Scorer::KvCache, &s, 0),
            &[0.75, 0.25, 1.0 / 3.0, 1.0 / 3.0, 0.0],
        );
    }

    #[test]
    fn inflight_counts_requests_and_tokens() {
        let load = |requests, tokens| Features {
            inflight_requests: requests,
            inflight_tokens: tokens,
            ..Features::default()
        };
        // One request more: a quarter of the request tolerance.
        let s = [load(0, 0), load(1, 0)];
        approx(&run(Scorer::Inflight, &s, 0), &[1.0, 0.875]);
        // Past the tolerance: min-max on both halves.
        let s = [load(2, 0), load(10, 40_000), load(6, 20_000)];
        approx(&run(Scorer::Inflight, &s, 0), &[1.0, 0.0, 0.5]);
        let s = [load(3, 100), load(3, 100)];
        approx(&run(Scorer::Inflight, &s, 0), &[1.0, 1.0]);
    }

    #[test]
    fn prefix_is_matched_share_of_the_prompt() {
        let matched = |blocks| Features {
            prefix_blocks: blocks,
            ..Features::default()
        };
        let s = [matched(0), matched(5), matched(20)];
        approx(&run(Scorer::Prefix, &s, 20), &[0.0, 0.25, 1.0]);
        approx(&run(Scorer::Prefix, &s[..1], 0), &[1.0]);
    }

    #[test]
    fn prefix_affinity_fades_with_unanswered_requests_beyond_the_fewest() {
        let holder = |waiting, unanswered| Features {
            prefix_blocks: 20,
            waiting: Some(waiting),
            unanswered,
            ..Features::default()
        };
        // Unanswered 1, 5, 9, 1: 0, 4, 8 and 0 beyond the fewest. The
        // scraped queue (waiting) does not fade it.
        let s = [holder(0, 1), holder(0, 5), holder(0, 9), holder(6, 1)];
        approx(&run(Scorer::Prefix, &s, 20), &[1.0, 0.5, 0.0, 1.0]);
        // A short prompt matches nowhere and everywhere: no fading.
        approx(&run(Scorer::Prefix, &s, 0), &[1.0; 4]);
    }

    #[test]
    fn lora_ranks_resident_then_free_slot_then_loading() {
        let fit = |lora| Features {
            lora,
            ..Features::default()
        };
        let s = [
            fit(LoraFit::Resident),
            fit(LoraFit::FreeSlot),
            fit(LoraFit::Loading),
            fit(LoraFit::NoRoom),
        ];
        approx(&run(Scorer::Lora, &s, 0), &[1.0, 0.8, 0.6, 0.0]);
        let s = [fit(LoraFit::NotRequested), fit(LoraFit::NotRequested)];
        approx(&run(Scorer::Lora, &s, 0), &[1.0, 1.0]);
        let s = [
            fit(LoraFit::Resident),
            fit(LoraFit::Unknown),
            fit(LoraFit::NoRoom),
        ];
        approx(&run(Scorer::Lora, &s, 0), &[1.0, 0.5, 0.0]);
    }

    #[test]
    fn session_scores_home_one_and_others_zero() {
        let fit = |session| Features {
            session,
            ..Features::default()
        };
        let s = [
            fit(SessionFit::Away),
            fit(SessionFit::Home),
            fit(SessionFit::NoSession),
        ];
        approx(&run(Scorer::Session, &s, 0), &[0.0, 1.0, 1.0]);
    }

    #[test]
    fn lora_fit_from_engine_state() {
        let state = |resident: &[&str], waiting: &[&str], max: Option<u32>| EngineState {
            resident_adapters: resident.iter().map(|s| s.to_string()).collect(),
            waiting_adapters: waiting.iter().map(|s| s.to_string()).collect(),
            max_adapters: max,
            ..EngineState::default()
        };
        let fit = |s: &EngineState| LoraFit::classify(Some("sql"), Some(s));
        assert_eq!(fit(&state(&["sql"], &[], Some(1))), LoraFit::Resident);
        assert_eq!(fit(&state(&["a"], &[], Some(2))), LoraFit::FreeSlot);
        assert_eq!(fit(&state(&["a"], &["sql"], Some(1))), LoraFit::Loading);
        assert_eq!(fit(&state(&["a"], &[], Some(1))), LoraFit::NoRoom);
        assert_eq!(fit(&state(&[], &[], None)), LoraFit::Unknown);
        assert_eq!(fit(&state(&[], &["sql"], None)), LoraFit::Loading);
        assert_eq!(LoraFit::classify(Some("sql"), None), LoraFit::Unknown);
        assert_eq!(LoraFit::classify(None, None), LoraFit::NotRequested);
    }

    #[test]
    fn speed_is_relative_to_the_fastest_measured_replica() {
        let timed = |t| Features {
            token_time: t,
            ..Features::default()
        };
        let s = [timed(Some(0.01)), timed(Some(0.04)), timed(None)];
        // Unknown: the mean of the known, so a new replica gets tried.
        approx(&run(Scorer::Speed, &s, 0), &[1.0, 0.25, 0.625]);
        let s = [timed(None), timed(None)];
        approx(&run(Scorer::Speed, &s, 0), &[1.0, 1.0]);
    }
}
