//! What a latency model reads of a request on one replica, what it
//! predicts, and the regressors a fit sees: the features scaled so each
//! is of order 1 where replicas usually are.

use serde::Serialize;

/// What the picker knows at pick time about a request on one replica (all
/// `f64` for the fit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LatencyFeatures {
    /// Requests queued ahead of this one: the engine's waiting requests
    /// (scraped; 0 if unknown) plus the requests this gateway sent since
    /// that scrape, or this gateway's unanswered requests if more.
    pub waiting: f64,
    /// The engine's running batch (scraped), or this gateway's requests in
    /// flight where the engine does not say.
    pub running: f64,
    /// KV cache in use, `0..=1` (0 if unknown).
    pub kv_usage: f64,
    /// Prompt tokens the replica must prefill: the prompt minus the prefix
    /// it is believed to hold.
    pub new_prompt_tokens: f64,
    /// Prompt tokens the replica is believed to hold already.
    pub cached_prompt_tokens: f64,
}

/// A replica's predicted latency for a request.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LatencyPrediction {
    /// Time to first token, seconds.
    pub ttft: f64,
    /// Mean time between output tokens (inter-token latency), seconds per
    /// token.
    pub itl: f64,
}

impl LatencyPrediction {
    /// Predicted time from sending the request to its last token, for
    /// `output_tokens` tokens of output.
    pub fn end_to_end(&self, output_tokens: f64) -> f64 {
        self.ttft + output_tokens * self.itl
    }
}

/// Regressors per fit: the features, an intercept, and the one interaction
/// that makes batching's cost visible (docs/picker.md, "Predicted
/// latency").
pub(crate) const REGRESSORS: usize = 7;

/// Requests per unit of the waiting and running regressors.
const REQUESTS: f64 = 10.0;
/// Tokens per unit of the prompt regressors.
const TOKENS: f64 = 1000.0;

/// Each regressor's name (for summaries) and how many of the feature's own
/// units make one unit of it: a fitted coefficient divided by the scale is
/// in seconds per request, per token, or per token and request.
pub(crate) const REGRESSOR_SCALES: [(&str, f64); REGRESSORS] = [
    ("intercept", 1.0),
    ("waiting", REQUESTS),
    ("running", REQUESTS),
    ("kv_usage", 1.0),
    ("new_prompt_tokens", TOKENS),
    ("cached_prompt_tokens", TOKENS),
    ("new_prompt_tokens_x_load", TOKENS * REQUESTS),
];

/// Position of the running regressor, for the cost of one more request.
const RUNNING: usize = 2;
const INTERACTION: usize = 6;

impl LatencyFeatures {
    /// Whether every feature is a finite number (a fit takes no other).
    pub fn is_finite(&self) -> bool {
        [
            self.waiting,
            self.running,
            self.kv_usage,
            self.new_prompt_tokens,
            self.cached_prompt_tokens,
        ]
        .iter()
        .all(|v| v.is_finite())
    }

    /// The regressors of a fit: `1`, waiting and running in tens of
    /// requests, KV use, new and cached prompt tokens in thousands, and new
    /// tokens × (waiting + running), the prefill of this request in a batch
    /// of that size: on an engine whose step time grows with the batch (a
    /// CPU, a compute-bound GPU on long prompts) it is what a linear sum
    /// of the two cannot express.
    pub(crate) fn regressors(&self) -> [f64; REGRESSORS] {
        let new = self.new_prompt_tokens / TOKENS;
        let load = (self.waiting + self.running) / REQUESTS;
        [
            1.0,
            self.waiting / REQUESTS,
            self.running / REQUESTS,
            self.kv_usage,
            new,
            self.cached_prompt_tokens / TOKENS,
            new * load,
        ]
    }
}

/// How the regressors change when one more request runs beside the same
/// ones: `regressors(running + 1) - regressors(running)`.
pub(crate) fn one_more_running(features: &LatencyFeatures) -> [f64; REGRESSORS] {
    let mut delta = [0.0; REGRESSORS];
    delta[RUNNING] = 1.0 / REQUESTS;
    delta[INTERACTION] = features.new_prompt_tokens / TOKENS / REQUESTS;
    delta
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_more_running_is_the_difference_of_the_regressors() {
        let features = LatencyFeatures {
            waiting: 3.0,
            running: 5.0,
            kv_usage: 0.4,
            new_prompt_tokens: 1_500.0,
            cached_prompt_tokens: 500.0,
        };
        let more = LatencyFeatures {
            running: 6.0,
            ..features
        };
        let (before, after) = (features.regressors(), more.regressors());
        let delta = one_more_running(&features);
        for k in 0..REGRESSORS {
            assert!((after[k] - before[k] - delta[k]).abs() < 1e-12, "{k}");
        }
        assert_eq!(before[0], 1.0);
        assert!((before[6] - 1.5 * 0.8).abs() < 1e-12);
    }

    #[test]
    fn end_to_end_is_first_token_then_every_other() {
        let p = LatencyPrediction {
            ttft: 0.5,
            itl: 0.02,
        };
        assert!((p.end_to_end(100.0) - 2.5).abs() < 1e-12);
        assert!(
            !LatencyFeatures {
                kv_usage: f64::NAN,
                ..LatencyFeatures::default()
            }
            .is_finite()
        );
    }
}
