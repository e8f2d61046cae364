//! The model families and settings docs/picker.md compares, run side by
//! side on the same synthetic requests. Print the table with
//! `cargo test -p infergate-picker variants -- --nocapture`.

use rand::SeedableRng;
use rand::rngs::StdRng;

use super::features::{LatencyFeatures, REGRESSORS};
use super::rls::Rls;
use super::synthetic::{self, Truth};

/// A way of predicting TTFT and ITL from features, learned online.
trait Variant {
    fn predict(&self, f: &LatencyFeatures) -> (f64, f64);
    fn observe(&mut self, f: &LatencyFeatures, ttft: f64, itl: f64);
}

/// Recursive least squares on the model's regressors.
struct Linear {
    ttft: Rls<REGRESSORS>,
    itl: Rls<REGRESSORS>,
    forgetting: f64,
    /// Keep the new tokens × load regressor.
    interaction: bool,
    relative: Weighing,
    /// Moving mean of each latency, for [`Weighing::Predicted`]'s floor.
    mean: [Option<f64>; 2],
}

/// How a fit weighs its observations.
#[derive(Clone, Copy, PartialEq)]
enum Weighing {
    /// All alike: least absolute squared error.
    Equal,
    /// By 1 / observed², so the fit minimises relative squared error.
    Observed,
    /// By 1 / predicted² (at least half the observation, and at least
    /// `floor` times the latency's moving mean): relative, with a weight
    /// that does not depend on the observation's own noise.
    Predicted { floor: f64 },
}

impl Linear {
    fn new(forgetting: f64, interaction: bool, relative: Weighing) -> Linear {
        Linear {
            ttft: Rls::default(),
            itl: Rls::default(),
            forgetting,
            interaction,
            relative,
            mean: [None; 2],
        }
    }

    fn x(&self, f: &LatencyFeatures) -> [f64; REGRESSORS] {
        let mut x = f.regressors();
        if !self.interaction {
            x[REGRESSORS - 1] = 0.0;
        }
        x
    }
}

impl Variant for Linear {
    fn predict(&self, f: &LatencyFeatures) -> (f64, f64) {
        let x = self.x(f);
        (
            self.ttft.predict(&x).max(0.0),
            self.itl.predict(&x).max(0.0),
        )
    }

    fn observe(&mut self, f: &LatencyFeatures, ttft: f64, itl: f64) {
        let x = self.x(f);
        let forgetting = self.forgetting;
        for ((fit, y), mean) in [(&mut self.ttft, ttft), (&mut self.itl, itl)]
            .into_iter()
            .zip(&mut self.mean)
        {
            let m = *mean.get_or_insert(y);
            *mean = Some(m + (1.0 - forgetting) * (y - m));
            let w = match self.relative {
                Weighing::Equal => 1.0,
                Weighing::Observed => 1.0 / y.max(1e-4),
                Weighing::Predicted { floor } => {
                    1.0 / fit.predict(&x).max(0.5 * y).max(floor * m).max(1e-4)
                }
            };
            fit.update(&x.map(|v| v * w), y * w, self.forgetting);
        }
    }
}

/// A hand-shaped workload scaled by a learned speed: TTFT ∝ queue plus
/// prefill slowed by the batch, ITL ∝ the batch, each ratio a moving
/// average of observed over shaped.
struct Ratio {
    ttft: f64,
    itl: f64,
}

impl Ratio {
    fn work(f: &LatencyFeatures) -> (f64, f64) {
        let batch = 1.0 + f.running + f.waiting;
        (
            1.0 + f.waiting + f.new_prompt_tokens / 1000.0 * batch,
            batch,
        )
    }
}

impl Variant for Ratio {
    fn predict(&self, f: &LatencyFeatures) -> (f64, f64) {
        let (t, i) = Ratio::work(f);
        (self.ttft * t, self.itl * i)
    }

    fn observe(&mut self, f: &LatencyFeatures, ttft: f64, itl: f64) {
        const WEIGHT: f64 = 0.05;
        let (t, i) = Ratio::work(f);
        self.ttft += WEIGHT * (ttft / t - self.ttft);
        self.itl += WEIGHT * (itl / i - self.itl);
    }
}

/// A replica whose latencies are not of the linear models' form: step
/// time grows with the batch (superlinearly on a CPU), queued prefills
/// interleave with decodes, and TTFT is the queue plus a prefill slowed
/// by the batch it shares.
#[derive(Clone, Copy)]
struct Engine {
    /// Seconds per decode step of one request.
    step: f64,
    /// Relative step time added per request in the batch, and per request
    /// squared.
    batch: f64,
    batch_squared: f64,
    /// Seconds per prompt token of prefill, alone.
    prefill: f64,
    /// Seconds of service per queued request.
    queued: f64,
    /// How much slower the replica has become.
    slower: f64,
    noise: f64,
}

impl Engine {
    const GPU: Engine = Engine {
        step: 0.012,
        batch: 0.04,
        batch_squared: 0.0,
        prefill: 1e-4,
        queued: 0.25,
        slower: 1.0,
        noise: 0.1,
    };
    const CPU: Engine = Engine {
        step: 0.05,
        batch: 0.6,
        batch_squared: 0.03,
        prefill: 2e-3,
        queued: 1.5,
        slower: 1.0,
        noise: 0.1,
    };

    fn truth(&self, f: &LatencyFeatures) -> (f64, f64) {
        let slowdown = |b: f64| 1.0 + self.batch * b + self.batch_squared * b * b;
        let itl = self.step * slowdown(f.running + 1.0) * (1.0 + 0.2 * f.kv_usage)
            + self.step * 0.05 * f.waiting;
        let ttft = self.queued * f.waiting
            + self.prefill * f.new_prompt_tokens * slowdown(f.running + f.waiting)
            + self.prefill * 0.02 * f.cached_prompt_tokens
            + self.step * 2.0;
        (ttft * self.slower, itl * self.slower)
    }
}

/// A source of requests and their latencies.
trait Replica {
    fn truth(&self, f: &LatencyFeatures) -> (f64, f64);
    fn noise(&self) -> f64;
    fn slower(self, by: f64) -> Self;
}

impl Replica for Engine {
    fn truth(&self, f: &LatencyFeatures) -> (f64, f64) {
        Engine::truth(self, f)
    }
    fn noise(&self) -> f64 {
        self.noise
    }
    fn slower(self, by: f64) -> Engine {
        Engine {
            slower: self.slower * by,
            ..self
        }
    }
}

impl Replica for Truth {
    fn truth(&self, f: &LatencyFeatures) -> (f64, f64) {
        (
            synthetic::evaluate(&self.ttft, f),
            synthetic::evaluate(&self.itl, f),
        )
    }
    fn noise(&self) -> f64 {
        self.noise
    }
    fn slower(self, by: f64) -> Truth {
        Truth::slower(self, by)
    }
}

/// What one variant achieved on one replica.
#[derive(Debug, Clone, Copy)]
struct Measured {
    /// Mean absolute percentage error against the noiseless latencies,
    /// requests 200 to 1,000 (each predicted before it is learned).
    ttft: f64,
    itl: f64,
    /// Mean signed percentage error of TTFT: below 0, predictions low.
    bias: f64,
    /// Requests after the replica became twice as slow until the TTFT
    /// error on a fixed probe set is under 0.2.
    relearned: usize,
}

fn measure<V: Variant, P: Replica + Copy>(mut variant: V, replica: P, seed: u64) -> Measured {
    let mut rng = StdRng::seed_from_u64(seed);
    let noisy = |value: f64, rng: &mut StdRng| {
        value * (1.0 + replica.noise() * synthetic::normal(rng)).max(0.1)
    };
    let (mut ttft, mut itl, mut bias, mut counted) = (0.0, 0.0, 0.0, 0);
    for n in 0..1_000 {
        let f = synthetic::request(&mut rng);
        let (true_ttft, true_itl) = replica.truth(&f);
        if n >= 200 {
            let (p_ttft, p_itl) = variant.predict(&f);
            ttft += (p_ttft - true_ttft).abs() / true_ttft;
            bias += (p_ttft - true_ttft) / true_ttft;
            itl += (p_itl - true_itl).abs() / true_itl;
            counted += 1;
        }
        variant.observe(&f, noisy(true_ttft, &mut rng), noisy(true_itl, &mut rng));
    }
    let slower = replica.slower(2.0);
    let probes: Vec<LatencyFeatures> = (0..200).map(|_| synthetic::request(&mut rng)).collect();
    let probe_error = |variant: &V| {
        probes
            .iter()
            .map(|f| {
                let truth = slower.truth(f).0;
                (variant.predict(f).0 - truth).abs() / truth
            })
            .sum::<f64>()
            / probes.len() as f64
    };
    let mut relearned = usize::MAX;
    for n in 1..=1_000 {
        let f = synthetic::request(&mut rng);
        let (true_ttft, true_itl) = slower.truth(&f);
        variant.observe(&f, noisy(true_ttft, &mut rng), noisy(true_itl, &mut rng));
        if probe_error(&variant) < 0.2 {
            relearned = n;
            break;
        }
    }
    Measured {
        ttft: ttft / counted as f64,
        itl: itl / counted as f64,
        bias: bias / counted as f64,
        relearned,
    }
}

/// Requests until the TTFT error on a probe set is under 0.2 after 300
/// requests whose latencies had nothing to do with their features
/// (log-normal, a factor of 4.5 either way at one standard deviation).
fn recovery<V: Variant, P: Replica + Copy>(mut variant: V, replica: P, seed: u64) -> usize {
    let mut rng = StdRng::seed_from_u64(seed);
    for _ in 0..300 {
        let f = synthetic::request(&mut rng);
        let ttft = (1.5 * synthetic::normal(&mut rng)).exp();
        let itl = 0.05 * (1.5 * synthetic::normal(&mut rng)).exp();
        variant.observe(&f, ttft, itl);
    }
    let probes: Vec<LatencyFeatures> = (0..200).map(|_| synthetic::request(&mut rng)).collect();
    for n in 1..=1_000 {
        let f = synthetic::request(&mut rng);
        let (ttft, itl) = replica.truth(&f);
        let noisy = |v: f64, rng: &mut StdRng| {
            v * (1.0 + replica.noise() * synthetic::normal(rng)).max(0.1)
        };
        variant.observe(&f, noisy(ttft, &mut rng), noisy(itl, &mut rng));
        let error = probes
            .iter()
            .map(|f| {
                let truth = replica.truth(f).0;
                (variant.predict(f).0 - truth).abs() / truth
            })
            .sum::<f64>()
            / probes.len() as f64;
        if error < 0.2 {
            return n;
        }
    }
    usize::MAX
}

/// Each variant over three seeds: the worst of each figure.
fn worst<P: Replica + Copy>(make: &dyn Fn() -> Box<dyn Variant>, replica: P) -> Measured {
    let runs: Vec<Measured> = (1..=3)
        .map(|seed| measure(BoxedVariant(make()), replica, seed))
        .collect();
    Measured {
        ttft: runs.iter().map(|m| m.ttft).fold(0.0, f64::max),
        itl: runs.iter().map(|m| m.itl).fold(0.0, f64::max),
        bias: runs.iter().map(|m| m.bias).sum::<f64>() / runs.len() as f64,
        relearned: runs.iter().map(|m| m.relearned).max().unwrap(),
    }
}

struct BoxedVariant(Box<dyn Variant>);

impl Variant for BoxedVariant {
    fn predict(&self, f: &LatencyFeatures) -> (f64, f64) {
        self.0.predict(f)
    }
    fn observe(&mut self, f: &LatencyFeatures, ttft: f64, itl: f64) {
        self.0.observe(f, ttft, itl)
    }
}

#[test]
fn variants_on_synthetic_replicas() {
    use Weighing::*;
    type Make = Box<dyn Fn() -> Box<dyn Variant>>;
    let linear = |forgetting: f64, interaction: bool, weighing: Weighing| -> Make {
        Box::new(move || Box::new(Linear::new(forgetting, interaction, weighing)))
    };
    // The model as built is the first: relative weights by prediction,
    // λ = 0.97, the interaction term.
    let variants: Vec<(&str, Make)> = vec![
        (
            "chosen: rel-pred 0.97",
            linear(0.97, true, Predicted { floor: 0.0 }),
        ),
        (
            "rel-pred 0.97 floor 0.1",
            linear(0.97, true, Predicted { floor: 0.1 }),
        ),
        (
            "rel-pred 0.95",
            linear(0.95, true, Predicted { floor: 0.0 }),
        ),
        (
            "rel-pred 0.98",
            linear(0.98, true, Predicted { floor: 0.0 }),
        ),
        (
            "rel-pred 0.97 no-x",
            linear(0.97, false, Predicted { floor: 0.0 }),
        ),
        ("rel-obs 0.97", linear(0.97, true, Observed)),
        ("equal 0.98", linear(0.98, true, Equal)),
        ("equal 0.95", linear(0.95, true, Equal)),
        ("equal 0.99", linear(0.99, true, Equal)),
        ("equal 0.98 no-x", linear(0.98, false, Equal)),
        (
            "ewma ratio",
            Box::new(|| {
                Box::new(Ratio {
                    ttft: 0.0,
                    itl: 0.0,
                })
            }),
        ),
    ];
    let noisy = |engine: Engine| Engine {
        noise: 0.3,
        ..engine
    };
    eprintln!(
        "variant | linear gpu | linear cpu | engine gpu | engine cpu | engine gpu 30 % | engine cpu 30 %"
    );
    eprintln!(
        "(each: TTFT MAPE / ITL MAPE / TTFT bias / requests to relearn a 2x slowdown; \
         last column: requests to relearn engine cpu after 300 unexplained latencies)"
    );
    let mut results = Vec::new();
    for (name, make) in &variants {
        let rows = [
            worst(make.as_ref(), Truth::gpu()),
            worst(make.as_ref(), Truth::cpu()),
            worst(make.as_ref(), Engine::GPU),
            worst(make.as_ref(), Engine::CPU),
            worst(make.as_ref(), noisy(Engine::GPU)),
            worst(make.as_ref(), noisy(Engine::CPU)),
        ];
        let count = |n: usize| match n {
            usize::MAX => "never".to_owned(),
            n => n.to_string(),
        };
        let cells: Vec<String> = rows
            .iter()
            .map(|m| {
                let relearned = count(m.relearned);
                format!(
                    "{:.3} / {:.3} / {:+.3} / {relearned}",
                    m.ttft, m.itl, m.bias
                )
            })
            .collect();
        let recovered = (1..=3)
            .map(|seed| recovery(BoxedVariant(make()), Engine::CPU, seed))
            .max()
            .unwrap();
        eprintln!("{name} | {} | {}", cells.join(" | "), count(recovered));
        results.push(rows);
    }
    let [chosen, .., no_interaction, _, equal, _, _, _, ratio] = &results[..] else {
        unreachable!()
    };
    let max_error = crate::PredictConfig::DEFAULT_MAX_ERROR;
    for (k, m) in chosen.iter().enumerate() {
        assert!(m.ttft < 0.15 && m.itl < 0.15, "replica {k}: {m:?}");
        assert!(m.bias.abs() < 0.03, "replica {k}: {m:?}");
        assert!(m.relearned <= 80, "replica {k}: {m:?}");
        assert!(
            m.ttft < equal[k].ttft,
            "replica {k}: {m:?} vs {:?}",
            equal[k]
        );
        assert!(
            m.ttft < ratio[k].ttft / 2.0,
            "replica {k}: {m:?} vs {:?}",
            ratio[k]
        );
    }
    // Where batching is costly, the interaction term is what fits.
    for cpu in [1, 3, 5] {
        let without = &no_interaction[cpu];
        assert!(without.ttft > 3.0 * chosen[cpu].ttft, "{without:?}");
        assert_eq!(without.relearned, usize::MAX, "{without:?}");
    }
    for engine_cpu in [3, 5] {
        assert!(no_interaction[engine_cpu].ttft > max_error);
    }
}
