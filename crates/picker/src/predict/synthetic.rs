//! Synthetic replicas for tests: requests under varied load, and their
//! latencies from known coefficients with multiplicative noise.

use rand::Rng;

use super::features::LatencyFeatures;
use super::model::Coefficients;

/// A replica's true latencies: linear in the features, in the model's own
/// form, so a fit can be checked against the coefficients it should find.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Truth {
    pub(crate) ttft: Coefficients,
    pub(crate) itl: Coefficients,
    /// Standard deviation of the multiplicative noise.
    pub(crate) noise: f64,
}

pub(crate) fn evaluate(c: &Coefficients, f: &LatencyFeatures) -> f64 {
    c.intercept
        + c.waiting * f.waiting
        + c.running * f.running
        + c.kv_usage * f.kv_usage
        + c.new_prompt_tokens * f.new_prompt_tokens
        + c.cached_prompt_tokens * f.cached_prompt_tokens
        + c.new_prompt_tokens_x_load * f.new_prompt_tokens * (f.waiting + f.running)
}

fn scaled(c: Coefficients, by: f64) -> Coefficients {
    Coefficients {
        intercept: c.intercept * by,
        waiting: c.waiting * by,
        running: c.running * by,
        kv_usage: c.kv_usage * by,
        new_prompt_tokens: c.new_prompt_tokens * by,
        cached_prompt_tokens: c.cached_prompt_tokens * by,
        new_prompt_tokens_x_load: c.new_prompt_tokens_x_load * by,
    }
}

impl Truth {
    /// A GPU replica: batching nearly free, prefill fast, a queue costly.
    pub(crate) fn gpu() -> Truth {
        Truth {
            ttft: Coefficients {
                intercept: 0.03,
                waiting: 0.25,
                running: 0.004,
                kv_usage: 0.02,
                new_prompt_tokens: 1e-4,
                cached_prompt_tokens: 1e-5,
                new_prompt_tokens_x_load: 5e-6,
            },
            itl: Coefficients {
                intercept: 0.012,
                waiting: 0.001,
                running: 6e-4,
                kv_usage: 0.008,
                new_prompt_tokens: 2e-6,
                cached_prompt_tokens: 1e-6,
                new_prompt_tokens_x_load: 0.0,
            },
            noise: 0.1,
        }
    }

    /// A CPU replica: every request in the batch slows every other
    /// almost in proportion.
    pub(crate) fn cpu() -> Truth {
        Truth {
            ttft: Coefficients {
                intercept: 0.1,
                waiting: 1.5,
                running: 0.05,
                kv_usage: 0.05,
                new_prompt_tokens: 2e-3,
                cached_prompt_tokens: 5e-5,
                new_prompt_tokens_x_load: 8e-4,
            },
            itl: Coefficients {
                intercept: 0.05,
                waiting: 0.01,
                running: 0.04,
                kv_usage: 0.02,
                new_prompt_tokens: 1e-5,
                cached_prompt_tokens: 5e-6,
                new_prompt_tokens_x_load: 0.0,
            },
            noise: 0.1,
        }
    }

    /// The same replica `by` times slower.
    pub(crate) fn slower(self, by: f64) -> Truth {
        Truth {
            ttft: scaled(self.ttft, by),
            itl: scaled(self.itl, by),
            ..self
        }
    }

    /// Noisy TTFT and ITL of a request with features `f`.
    pub(crate) fn sample<R: Rng + ?Sized>(&self, f: &LatencyFeatures, rng: &mut R) -> (f64, f64) {
        let mut noisy = |value: f64| value * (1.0 + self.noise * normal(rng)).max(0.1);
        (
            noisy(evaluate(&self.ttft, f)),
            noisy(evaluate(&self.itl, f)),
        )
    }
}

/// A standard normal draw (Box-Muller).
pub(crate) fn normal<R: Rng + ?Sized>(rng: &mut R) -> f64 {
    let u: f64 = rng.gen_range(f64::EPSILON..1.0);
    let v: f64 = rng.r#gen();
    (-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()
}

/// A request on a replica under varied load: mostly short queues, a
/// batch of up to 12, KV use that follows the batch, prompts from 50 to
/// 4,000 tokens of which a third are partly cached.
pub(crate) fn request<R: Rng + ?Sized>(rng: &mut R) -> LatencyFeatures {
    let waiting = [0.0, 0.0, 0.0, 1.0, 1.0, 2.0, 3.0, 4.0][rng.gen_range(0..8)];
    let running = rng.gen_range(0..=12) as f64;
    let prompt = (50f64.ln() + rng.r#gen::<f64>() * (4_000f64 / 50.0).ln()).exp();
    let cached = if rng.gen_bool(0.3) {
        (prompt * rng.gen_range(0.0..0.8)).round()
    } else {
        0.0
    };
    LatencyFeatures {
        waiting,
        running,
        kv_usage: (running * 0.05 + rng.gen_range(0.0..0.2)).min(0.95),
        new_prompt_tokens: prompt.round() - cached,
        cached_prompt_tokens: cached,
    }
}
