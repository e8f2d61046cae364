//! One replica's latency model: a fit of TTFT and one of ITL on the
//! request's features at pick time, learned from each finished request,
//! and whether its predictions are trusted.
//!
//! Learning takes a lock (once per finished request); predicting does not:
//! after each update the coefficients and the trust are published in a
//! sequence lock, which a pick reads with plain loads.

use parking_lot::Mutex;
use serde::Serialize;

use super::error::{self, RecentError};
use super::features::{
    LatencyFeatures, LatencyPrediction, REGRESSOR_SCALES, REGRESSORS, one_more_running,
};
use super::rls::Rls;
use crate::policy::PredictConfig;
use crate::seqlock::SeqLock;

/// Published words: the TTFT coefficients, the ITL coefficients, then the
/// observation count shifted left by one with the trust in the low bit.
const WORDS: usize = 2 * REGRESSORS + 1;
const STATUS: usize = 2 * REGRESSORS;

/// A replica's latency model. One lives in each
/// [`Endpoint`](crate::Endpoint) ([`Endpoint::latency`](crate::Endpoint::latency)).
#[derive(Debug, Default)]
pub struct LatencyModel {
    state: Mutex<State>,
    published: SeqLock<WORDS>,
}

#[derive(Debug, Default)]
struct State {
    config: PredictConfig,
    /// Calls to [`LatencyModel::observe`] that brought a usable value.
    observations: u64,
    ttft: Target,
    itl: Target,
}

/// The fit of one latency and its recent error.
#[derive(Debug, Default)]
struct Target {
    fit: Rls<REGRESSORS>,
    error: RecentError,
    observations: u64,
}

impl Target {
    /// Measure the error of the prediction, then learn from `actual`.
    ///
    /// The fit minimises relative rather than absolute squared error: each
    /// observation is weighed by the inverse of the latency predicted for
    /// it (at least half the observed one, so an untrained or outdated
    /// model does not give one observation an outsized weight). Unweighted,
    /// the fit is ruled by the longest latencies, and short ones, most
    /// requests, carry the largest relative errors; weighed by the observed
    /// latency instead, it is biased low by about twice the noise's
    /// variance (a fifth at 30 % noise), since an observation that came out
    /// low weighs more (docs/picker.md, "Predicted latency").
    fn observe(&mut self, x: &[f64; REGRESSORS], actual: f64, forgetting: f64) {
        let predicted = self.fit.predict(x).max(0.0);
        self.error.record(predicted, actual);
        let weight = 1.0 / predicted.max(0.5 * actual).max(error::FLOOR);
        self.fit
            .update(&x.map(|v| v * weight), actual * weight, forgetting);
        self.observations += 1;
    }

    fn trusted(&self, config: &PredictConfig) -> bool {
        self.observations >= config.min_observations
            && self.error.get().is_some_and(|e| e < config.max_error)
    }

    fn summary(&self) -> TargetSummary {
        TargetSummary {
            observations: self.observations,
            mape: self.error.get(),
            coefficients: Coefficients::of(self.fit.coefficients()),
        }
    }
}

impl State {
    fn trusted(&self) -> bool {
        self.ttft.trusted(&self.config) && self.itl.trusted(&self.config)
    }

    fn status(&self) -> Status {
        Status {
            observations: self.observations,
            fitted: self.trusted().then(|| Fitted {
                ttft: *self.ttft.fit.coefficients(),
                itl: *self.itl.fit.coefficients(),
            }),
        }
    }
}

/// What a pick reads of a model.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Status {
    pub(crate) observations: u64,
    /// The coefficients, when the model is trusted.
    pub(crate) fitted: Option<Fitted>,
}

/// A trusted model's coefficients.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fitted {
    ttft: [f64; REGRESSORS],
    itl: [f64; REGRESSORS],
}

impl Fitted {
    /// The prediction for `features`, never below 0.
    pub(crate) fn predict(&self, features: &LatencyFeatures) -> LatencyPrediction {
        let x = features.regressors();
        LatencyPrediction {
            ttft: dot(&self.ttft, &x).max(0.0),
            itl: dot(&self.itl, &x).max(0.0),
        }
    }

    /// How much one more request in the running batch raises the ITL of
    /// the requests already in it (seconds per token, never below 0).
    pub(crate) fn itl_per_request(&self, features: &LatencyFeatures) -> f64 {
        dot(&self.itl, &one_more_running(features)).max(0.0)
    }
}

fn dot(a: &[f64; REGRESSORS], b: &[f64; REGRESSORS]) -> f64 {
    a.iter().zip(b).map(|(a, b)| a * b).sum()
}

impl LatencyModel {
    /// The predicted TTFT and ITL of a request with these features, or
    /// `None` while the model is not trusted: fewer than
    /// [`PredictConfig::min_observations`] of either, or a recent error of
    /// either at or above [`PredictConfig::max_error`].
    pub fn predict(&self, f: &LatencyFeatures) -> Option<LatencyPrediction> {
        if !f.is_finite() {
            return None;
        }
        self.status().fitted.map(|fitted| fitted.predict(f))
    }

    /// Learn from one finished request: its features at pick time, its
    /// observed time to first token and its mean time per output token
    /// after the first (seconds; `None` where not observed, such as the
    /// ITL of a one-token answer). Each is first compared with what the
    /// model would have predicted, for the recent error. Values that are
    /// not finite or are negative are ignored.
    pub fn observe(&self, f: &LatencyFeatures, ttft: Option<f64>, itl: Option<f64>) {
        let usable = |v: Option<f64>| v.filter(|v| v.is_finite() && *v >= 0.0);
        let (ttft, itl) = (usable(ttft), usable(itl));
        if !f.is_finite() || (ttft.is_none() && itl.is_none()) {
            return;
        }
        let x = f.regressors();
        let mut state = self.state.lock();
        let forgetting = state.config.forgetting;
        if let Some(ttft) = ttft {
            state.ttft.observe(&x, ttft, forgetting);
        }
        if let Some(itl) = itl {
            state.itl.observe(&x, itl, forgetting);
        }
        state.observations += 1;
        self.publish(&state);
    }

    /// The model as `/debug/pools` shows it.
    pub fn summary(&self) -> LatencyModelSummary {
        let state = self.state.lock();
        LatencyModelSummary {
            observations: state.observations,
            trusted: state.trusted(),
            ttft: state.ttft.summary(),
            itl: state.itl.summary(),
        }
    }

    /// Learn and trust by `config` from now on (the pool's settings).
    pub(crate) fn configure(&self, config: &PredictConfig) {
        let mut state = self.state.lock();
        if state.config != *config {
            state.config = *config;
            self.publish(&state);
        }
    }

    /// What a pick needs: the observation count and, when trusted, the
    /// coefficients. Plain loads, unless a write is in progress.
    #[inline]
    pub(crate) fn status(&self) -> Status {
        match self.published.read() {
            Some((_, words)) => {
                let status = words[STATUS];
                let coefficients = |at: usize| -> [f64; REGRESSORS] {
                    std::array::from_fn(|k| f64::from_bits(words[at + k]))
                };
                Status {
                    observations: status >> 1,
                    fitted: (status & 1 == 1).then(|| Fitted {
                        ttft: coefficients(0),
                        itl: coefficients(REGRESSORS),
                    }),
                }
            }
            None => self.state.lock().status(),
        }
    }

    /// Publish `state` for picks; called with its lock held, so writes
    /// never overlap.
    fn publish(&self, state: &State) {
        let mut words = [0; WORDS];
        let coefficients = state
            .ttft
            .fit
            .coefficients()
            .iter()
            .chain(state.itl.fit.coefficients());
        for (word, value) in words.iter_mut().zip(coefficients) {
            *word = value.to_bits();
        }
        words[STATUS] = state.observations << 1 | u64::from(state.trusted());
        self.published.write(words);
    }
}

/// A replica's latency model in short.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LatencyModelSummary {
    /// Finished requests it has learned from.
    pub observations: u64,
    /// Whether its predictions are used.
    pub trusted: bool,
    /// The fit of time to first token.
    pub ttft: TargetSummary,
    /// The fit of the mean time per output token.
    pub itl: TargetSummary,
}

/// One fit of a [`LatencyModelSummary`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TargetSummary {
    /// Observations of this latency.
    pub observations: u64,
    /// Recent mean absolute percentage error (a fraction), each measured
    /// before the model learned from the observation; `None` before the
    /// first.
    pub mape: Option<f64>,
    pub coefficients: Coefficients,
}

/// A fit's coefficients in the features' own units: seconds, per waiting
/// or running request, per unit of KV use, per prompt token, and per prompt
/// token and request of load (waiting + running).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Coefficients {
    pub intercept: f64,
    pub waiting: f64,
    pub running: f64,
    pub kv_usage: f64,
    pub new_prompt_tokens: f64,
    pub cached_prompt_tokens: f64,
    pub new_prompt_tokens_x_load: f64,
}

impl Coefficients {
    fn of(theta: &[f64; REGRESSORS]) -> Coefficients {
        let [a, b, c, d, e, f, g] = std::array::from_fn(|k| theta[k] / REGRESSOR_SCALES[k].1);
        Coefficients {
            intercept: a,
            waiting: b,
            running: c,
            kv_usage: d,
            new_prompt_tokens: e,
            cached_prompt_tokens: f,
            new_prompt_tokens_x_load: g,
        }
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    use super::*;
    use crate::predict::synthetic::{self, Truth};

    /// Feed `model` `count` requests of `truth`.
    fn train(model: &LatencyModel, truth: &Truth, count: usize, rng: &mut StdRng) {
        for _ in 0..count {
            let f = synthetic::request(rng);
            let (ttft, itl) = truth.sample(&f, rng);
            model.observe(&f, Some(ttft), Some(itl));
        }
    }

    /// Mean absolute percentage error of `model` on fresh requests,
    /// without noise.
    fn mape(model: &LatencyModel, truth: &Truth, rng: &mut StdRng) -> (f64, f64) {
        let mut sum = (0.0, 0.0);
        const N: usize = 1_000;
        for _ in 0..N {
            let f = synthetic::request(rng);
            let p = model.status().fitted.expect("trusted").predict(&f);
            let ttft = synthetic::evaluate(&truth.ttft, &f);
            let itl = synthetic::evaluate(&truth.itl, &f);
            sum.0 += (p.ttft - ttft).abs() / ttft;
            sum.1 += (p.itl - itl).abs() / itl;
        }
        (sum.0 / N as f64, sum.1 / N as f64)
    }

    fn with(config: PredictConfig) -> LatencyModel {
        let model = LatencyModel::default();
        model.configure(&config);
        model
    }

    /// Each coefficient within 10 % of the truth, or, for those too small
    /// to matter, within 1 % of the typical latency at a typical value of
    /// its feature.
    fn assert_close(fitted: &Coefficients, truth: &Coefficients, what: &str) {
        let f = serde_json::to_value(fitted).unwrap();
        let t = serde_json::to_value(truth).unwrap();
        let typical = LatencyFeatures {
            waiting: 1.0,
            running: 6.0,
            kv_usage: 0.4,
            new_prompt_tokens: 800.0,
            cached_prompt_tokens: 300.0,
        };
        let magnitude = [
            1.0,
            typical.waiting,
            typical.running,
            typical.kv_usage,
            typical.new_prompt_tokens,
            typical.cached_prompt_tokens,
            typical.new_prompt_tokens * (typical.waiting + typical.running),
        ];
        let latency = synthetic::evaluate(truth, &typical);
        for (k, (name, _)) in REGRESSOR_SCALES.iter().enumerate() {
            let (f, t) = (f[name].as_f64().unwrap(), t[name].as_f64().unwrap());
            let off = (f - t).abs();
            assert!(
                off <= 0.1 * t.abs() || off * magnitude[k] <= 0.01 * latency,
                "{what} {name}: fitted {f}, true {t}"
            );
        }
    }

    #[test]
    fn a_fit_recovers_known_coefficients() {
        let mut rng = StdRng::seed_from_u64(11);
        for truth in [Truth::gpu(), Truth::cpu()] {
            // Without forgetting: every observation counts, as in batch
            // least squares.
            let model = with(PredictConfig {
                forgetting: 1.0,
                ..PredictConfig::default()
            });
            train(&model, &truth, 5_000, &mut rng);
            let summary = model.summary();
            assert_close(&summary.ttft.coefficients, &truth.ttft, "ttft");
            assert_close(&summary.itl.coefficients, &truth.itl, "itl");
            assert!(summary.trusted);
            let (ttft, itl) = mape(&model, &truth, &mut rng);
            assert!(ttft < 0.03 && itl < 0.03, "{ttft} {itl}");
        }
    }

    #[test]
    fn with_the_default_forgetting_the_error_falls_below_the_threshold() {
        let mut rng = StdRng::seed_from_u64(12);
        let config = PredictConfig::default();
        for truth in [Truth::gpu(), Truth::cpu()] {
            let model = with(config);
            train(&model, &truth, 500, &mut rng);
            let summary = model.summary();
            // The recent error the model met, noise (10 %) included...
            let (ttft, itl) = (summary.ttft.mape.unwrap(), summary.itl.mape.unwrap());
            assert!(ttft < config.max_error, "{ttft}");
            assert!(itl < config.max_error, "{itl}");
            assert!(summary.trusted);
            // ...and the predictions against the noiseless truth.
            let (ttft, itl) = mape(&model, &truth, &mut rng);
            assert!(ttft < 0.1 && itl < 0.1, "{ttft} {itl}");
        }
    }

    #[test]
    fn trust_comes_with_enough_observations_of_low_error() {
        let mut rng = StdRng::seed_from_u64(13);
        let config = PredictConfig::default();
        let model = with(config);
        let f = synthetic::request(&mut rng);
        assert_eq!(model.predict(&f), None, "nothing learned yet");
        let truth = Truth::gpu();
        train(
            &model,
            &truth,
            config.min_observations as usize - 1,
            &mut rng,
        );
        assert_eq!(model.predict(&f), None, "one short of the minimum");
        assert_eq!(model.status().observations, config.min_observations - 1);
        let mut trusted_after = None;
        for n in config.min_observations..200 {
            train(&model, &truth, 1, &mut rng);
            if model.predict(&f).is_some() {
                trusted_after = Some(n);
                break;
            }
        }
        let trusted_after = trusted_after.expect("trusted within 200 observations");
        assert!(trusted_after <= 40, "trusted after {trusted_after}");
        let summary = model.summary();
        assert!(summary.trusted && summary.ttft.mape.unwrap() < config.max_error);
        assert_eq!(summary.observations, trusted_after);

        // A stricter pool's settings take effect at once.
        model.configure(&PredictConfig {
            min_observations: 1_000,
            ..config
        });
        assert_eq!(model.predict(&f), None);
        assert!(!model.summary().trusted);
    }

    #[test]
    fn a_latency_the_features_do_not_explain_is_never_trusted() {
        let mut rng = StdRng::seed_from_u64(14);
        let model = LatencyModel::default();
        for _ in 0..1_000 {
            let f = synthetic::request(&mut rng);
            // Heavy-tailed and unrelated to the features.
            let ttft = (synthetic::normal(&mut rng) * 1.2).exp();
            model.observe(&f, Some(ttft), Some(0.02));
        }
        let summary = model.summary();
        assert!(!summary.trusted);
        assert!(summary.ttft.mape.unwrap() > PredictConfig::DEFAULT_MAX_ERROR);
        assert!(summary.itl.mape.unwrap() < 0.01, "the ITL alone fits");
    }

    #[test]
    fn a_replica_that_becomes_slower_is_learned_again_within_a_bound() {
        // The bounds for the default forgetting; docs/picker.md quotes what
        // it takes. The recent error goes over the threshold, then back
        // under it within the first; by the second the fit is as close to
        // the new truth as to the old one before.
        const TRUSTED_AGAIN_WITHIN: u64 = 40;
        const RELEARNED_WITHIN: u64 = 80;
        let config = PredictConfig::default();
        for (seed, truth) in [(15, Truth::gpu()), (16, Truth::cpu())] {
            let mut rng = StdRng::seed_from_u64(seed);
            let model = with(config);
            train(&model, &truth, 500, &mut rng);
            assert!(model.summary().trusted);
            let slower = truth.slower(2.0);
            let (mut lost, mut regained) = (None, None);
            for n in 1..=RELEARNED_WITHIN {
                train(&model, &slower, 1, &mut rng);
                let trusted = model.summary().trusted;
                if !trusted && lost.is_none() {
                    lost = Some(n);
                }
                if trusted && lost.is_some() && regained.is_none() {
                    regained = Some(n);
                }
            }
            eprintln!("seed {seed}: trust lost after {lost:?}, back after {regained:?}");
            assert!(
                lost.is_some(),
                "seed {seed}: the error exceeds the threshold"
            );
            let regained = regained.expect("trust comes back");
            assert!(
                regained <= TRUSTED_AGAIN_WITHIN,
                "seed {seed}: trusted again after {regained} requests"
            );
            assert!(model.summary().trusted, "seed {seed}: and stays");
            let (ttft, itl) = mape(&model, &slower, &mut rng);
            assert!(ttft < 0.15 && itl < 0.15, "seed {seed}: {ttft} {itl}");
        }
    }

    #[test]
    fn unusable_observations_are_ignored() {
        let model = LatencyModel::default();
        let f = LatencyFeatures::default();
        model.observe(&f, None, None);
        model.observe(&f, Some(f64::NAN), Some(-1.0));
        let bad = LatencyFeatures {
            waiting: f64::INFINITY,
            ..f
        };
        model.observe(&bad, Some(0.1), Some(0.01));
        assert_eq!(model.summary().observations, 0);
        model.observe(&f, Some(0.1), None);
        let summary = model.summary();
        assert_eq!(
            (
                summary.observations,
                summary.ttft.observations,
                summary.itl.observations
            ),
            (1, 1, 0)
        );
        assert_eq!(model.predict(&bad), None);
    }

    #[test]
    fn the_summary_names_the_regressors_in_order() {
        let theta: [f64; REGRESSORS] = std::array::from_fn(|k| (k + 1) as f64);
        let value = serde_json::to_value(Coefficients::of(&theta)).unwrap();
        let names: Vec<&str> = value
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let mut expected: Vec<&str> = REGRESSOR_SCALES.iter().map(|(name, _)| *name).collect();
        expected.sort_unstable();
        assert_eq!(names, expected, "serde_json orders keys");
        for (k, (name, scale)) in REGRESSOR_SCALES.iter().enumerate() {
            assert_eq!(value[name].as_f64().unwrap(), (k + 1) as f64 / scale);
        }
    }
}
