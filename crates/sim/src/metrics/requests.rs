//! Per-request latency and token accounting, fed by the replica's engine
//! events and read by the `/metrics` renderers.
//!
//! All times are **engine seconds**: the engine's own clock, which is what a
//! real server on that hardware would measure, not the scaled-down wall time
//! that passes in a time-scaled test. A TTFT of 0.2 in `/metrics` means the
//! simulated GPU took 0.2 s, whatever `--time-scale` was.

use std::collections::HashMap;

use super::histogram::{Histogram, one_two_five_buckets};

/// How a request ended, as `finished_reason` labels and OpenAI
/// `finish_reason` fields spell it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishKind {
    /// The model ended the answer by itself (no `max_tokens` limit was hit).
    Stop,
    /// The answer reached the requested `max_tokens`.
    Length,
    /// The client went away or the request was cancelled.
    Abort,
}

impl FinishKind {
    pub const ALL: [FinishKind; 3] = [FinishKind::Stop, FinishKind::Length, FinishKind::Abort];

    pub fn as_str(self) -> &'static str {
        match self {
            FinishKind::Stop => "stop",
            FinishKind::Length => "length",
            FinishKind::Abort => "abort",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Bucket bounds of the latency histograms; each dialect has its own.
#[derive(Debug, Clone)]
pub struct LatencyBuckets {
    pub time_to_first_token: Vec<f64>,
    pub inter_token: Vec<f64>,
    pub end_to_end: Vec<f64>,
}

/// Totals since the replica started. Cheap to clone for a `/metrics` render.
#[derive(Debug, Clone)]
pub struct RequestTotals {
    pub time_to_first_token: Histogram,
    pub inter_token_latency: Histogram,
    pub end_to_end_latency: Histogram,
    /// Prompt tokens per finished request.
    pub request_prompt_tokens: Histogram,
    /// Generated tokens per finished request.
    pub request_generation_tokens: Histogram,
    finished: [u64; 3],
    /// Requests handed to the engine.
    pub requests_received: u64,
    /// Requests the engine refused (never scheduled).
    pub requests_rejected: u64,
    /// Prompt tokens of finished requests, cached ones included.
    pub prompt_tokens: u64,
    /// Prompt tokens of finished requests that came from the prefix cache.
    pub cached_prompt_tokens: u64,
    /// Tokens generated for finished requests.
    pub generation_tokens: u64,
    /// Engine seconds from arrival to first token, summed (llama.cpp's
    /// `prompt_seconds_total`).
    pub prefill_seconds: f64,
    /// Engine seconds from first token to finish, summed.
    pub decode_seconds: f64,
    /// Distinct engine steps that produced at least one token.
    pub decode_steps: u64,
    /// Tokens produced, counted per step (`decode_steps` × batch size).
    pub step_tokens: u64,
    /// Longest prompt + generation seen.
    pub max_sequence_len: u64,
}

impl RequestTotals {
    pub fn new(latency: LatencyBuckets, max_model_len: u32) -> Self {
        let token_buckets = one_two_five_buckets(u64::from(max_model_len));
        Self {
            time_to_first_token: Histogram::new(latency.time_to_first_token),
            inter_token_latency: Histogram::new(latency.inter_token),
            end_to_end_latency: Histogram::new(latency.end_to_end),
            request_prompt_tokens: Histogram::new(token_buckets.clone()),
            request_generation_tokens: Histogram::new(token_buckets),
            finished: [0; 3],
            requests_received: 0,
            requests_rejected: 0,
            prompt_tokens: 0,
            cached_prompt_tokens: 0,
            generation_tokens: 0,
            prefill_seconds: 0.0,
            decode_seconds: 0.0,
            decode_steps: 0,
            step_tokens: 0,
            max_sequence_len: 0,
        }
    }

    /// Requests that ended this way.
    pub fn finished(&self, kind: FinishKind) -> u64 {
        self.finished[kind.index()]
    }

    /// Requests that ended normally (stop or length).
    pub fn succeeded(&self) -> u64 {
        self.finished(FinishKind::Stop) + self.finished(FinishKind::Length)
    }
}

/// What the tracker remembers about a request between its events.
#[derive(Debug, Clone, Copy)]
struct InFlight {
    arrival: f64,
    first_token_at: Option<f64>,
    last_token_at: f64,
    /// Whether the client set `max_tokens`: the answer then ends by length.
    limited_by_max_tokens: bool,
}

/// Turns the engine's request events into latency histograms and counters.
#[derive(Debug)]
pub struct RequestTracker {
    in_flight: HashMap<u64, InFlight>,
    totals: RequestTotals,
    last_step_at: Option<f64>,
}

impl RequestTracker {
    pub fn new(latency: LatencyBuckets, max_model_len: u32) -> Self {
        Self {
            in_flight: HashMap::new(),
            totals: RequestTotals::new(latency, max_model_len),
            last_step_at: None,
        }
    }

    pub fn totals(&self) -> &RequestTotals {
        &self.totals
    }

    pub fn on_submit(&mut self, id: u64, at: f64, limited_by_max_tokens: bool) {
        self.totals.requests_received += 1;
        self.in_flight.insert(
            id,
            InFlight {
                arrival: at,
                first_token_at: None,
                last_token_at: at,
                limited_by_max_tokens,
            },
        );
    }

    pub fn on_first_token(&mut self, id: u64, at: f64) {
        self.count_step(at);
        if let Some(request) = self.in_flight.get_mut(&id) {
            self.totals
                .time_to_first_token
                .observe(at - request.arrival);
            request.first_token_at = Some(at);
            request.last_token_at = at;
        }
    }

    pub fn on_token(&mut self, id: u64, at: f64) {
        self.count_step(at);
        if let Some(request) = self.in_flight.get_mut(&id) {
            self.totals
                .inter_token_latency
                .observe(at - request.last_token_at);
            request.last_token_at = at;
        }
    }

    /// Records the end of a request and says how it ended.
    pub fn on_finished(
        &mut self,
        id: u64,
        at: f64,
        tokens: FinishedTokens,
        aborted: bool,
    ) -> FinishKind {
        let Some(request) = self.in_flight.remove(&id) else {
            return if aborted {
                FinishKind::Abort
            } else {
                FinishKind::Length
            };
        };
        let kind = match (aborted, request.limited_by_max_tokens) {
            (true, _) => FinishKind::Abort,
            (false, true) => FinishKind::Length,
            (false, false) => FinishKind::Stop,
        };
        let totals = &mut self.totals;
        totals.finished[kind.index()] += 1;
        totals.end_to_end_latency.observe(at - request.arrival);
        totals
            .request_prompt_tokens
            .observe(f64::from(tokens.prompt));
        totals
            .request_generation_tokens
            .observe(f64::from(tokens.completion));
        totals.prompt_tokens += u64::from(tokens.prompt);
        totals.cached_prompt_tokens += u64::from(tokens.cached);
        totals.generation_tokens += u64::from(tokens.completion);
        if let Some(first) = request.first_token_at {
            totals.prefill_seconds += first - request.arrival;
            totals.decode_seconds += at - first;
        }
        let sequence_len = u64::from(tokens.prompt) + u64::from(tokens.completion);
        totals.max_sequence_len = totals.max_sequence_len.max(sequence_len);
        kind
    }

    pub fn on_rejected(&mut self, id: u64) {
        if self.in_flight.remove(&id).is_some() {
            self.totals.requests_rejected += 1;
        }
    }

    /// Tokens of one step arrive with the same timestamp: a new timestamp is
    /// a new step (llama.cpp's `n_decode_total`).
    fn count_step(&mut self, at: f64) {
        if self.last_step_at != Some(at) {
            self.totals.decode_steps += 1;
            self.last_step_at = Some(at);
        }
        self.totals.step_tokens += 1;
    }
}

/// Token counts reported when a request finishes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FinishedTokens {
    pub prompt: u32,
    pub completion: u32,
    pub cached: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tracker() -> RequestTracker {
        let buckets = LatencyBuckets {
            time_to_first_token: vec![0.1, 1.0],
            inter_token: vec![0.01, 0.1],
            end_to_end: vec![1.0, 10.0],
        };
        RequestTracker::new(buckets, 1000)
    }

    #[test]
    fn latencies_are_measured_from_arrival_in_engine_seconds() {
        let mut t = tracker();
        t.on_submit(1, 10.0, true);
        t.on_first_token(1, 10.5);
        t.on_token(1, 10.52);
        t.on_token(1, 10.54);
        let tokens = FinishedTokens {
            prompt: 100,
            completion: 3,
            cached: 32,
        };
        assert_eq!(t.on_finished(1, 10.54, tokens, false), FinishKind::Length);

        let totals = t.totals();
        assert_eq!(totals.time_to_first_token.count(), 1);
        assert!((totals.time_to_first_token.sum() - 0.5).abs() < 1e-9);
        assert_eq!(totals.inter_token_latency.count(), 2);
        assert!((totals.inter_token_latency.mean().unwrap() - 0.02).abs() < 1e-9);
        assert!((totals.end_to_end_latency.sum() - 0.54).abs() < 1e-9);
        assert_eq!(totals.finished(FinishKind::Length), 1);
        assert_eq!(
            (totals.prompt_tokens, totals.cached_prompt_tokens),
            (100, 32)
        );
        assert_eq!(totals.generation_tokens, 3);
        assert_eq!(totals.max_sequence_len, 103);
        assert!((totals.prefill_seconds - 0.5).abs() < 1e-9);
        assert!((totals.decode_seconds - 0.04).abs() < 1e-9);
    }

    #[test]
    fn finish_kind_depends_on_max_tokens_and_abort() {
        let mut t = tracker();
        t.on_submit(1, 0.0, false);
        t.on_submit(2, 0.0, true);
        t.on_submit(3, 0.0, true);
        let tokens = FinishedTokens::default();
        assert_eq!(t.on_finished(1, 1.0, tokens, false), FinishKind::Stop);
        assert_eq!(t.on_finished(2, 1.0, tokens, true), FinishKind::Abort);
        assert_eq!(t.on_finished(3, 1.0, tokens, false), FinishKind::Length);
        assert_eq!(t.totals().succeeded(), 2);
        assert_eq!(t.totals().finished(FinishKind::Abort), 1);
    }

    #[test]
    fn tokens_with_the_same_timestamp_are_one_step() {
        let mut t = tracker();
        t.on_submit(1, 0.0, true);
        t.on_submit(2, 0.0, true);
        t.on_first_token(1, 0.1);
        t.on_first_token(2, 0.1);
        t.on_token(1, 0.12);
        t.on_token(2, 0.12);
        assert_eq!(t.totals().decode_steps, 2);
        assert_eq!(t.totals().step_tokens, 4);
    }

    #[test]
    fn rejected_requests_are_counted_once() {
        let mut t = tracker();
        t.on_submit(7, 0.0, false);
        t.on_rejected(7);
        t.on_rejected(7);
        assert_eq!(t.totals().requests_rejected, 1);
        assert_eq!(t.totals().requests_received, 1);
    }
}
