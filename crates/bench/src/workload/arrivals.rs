//! Arrival times: a Poisson process whose rate may follow a burst pattern.
//!
//! Times come from a unit-rate Poisson process mapped through the inverse
//! of the cumulative rate, so the same seed gives the same sequence of
//! points at every mean rate: doubling the rate halves every steady-traffic
//! arrival time.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// How the arrival rate varies over time; its mean is always the rate the
/// run asks for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Traffic {
    /// Constant rate: exponential gaps.
    Poisson,
    /// Repeating cycles of a quiet period followed by a peak. Each cycle's
    /// peak runs at a multiple of the mean rate drawn uniformly from
    /// `peak_factor`, and its quiet period at whatever rate keeps the
    /// cycle's mean at the mean rate.
    Bursty {
        cycle_seconds: f64,
        peak_seconds: f64,
        peak_factor: (f64, f64),
    },
}

impl Traffic {
    /// Whether the shape is possible: peaks must leave the quiet period a
    /// non-negative rate.
    pub fn validate(&self) -> Result<(), String> {
        match *self {
            Traffic::Poisson => Ok(()),
            Traffic::Bursty {
                cycle_seconds,
                peak_seconds,
                peak_factor: (low, high),
            } => {
                if !(peak_seconds > 0.0 && peak_seconds < cycle_seconds) {
                    return Err("a peak must be shorter than its cycle".into());
                }
                if !(1.0 <= low && low <= high && high * peak_seconds <= cycle_seconds) {
                    return Err(format!(
                        "peak factors {low}..{high} over {peak_seconds} s do not fit a {cycle_seconds} s cycle at the mean rate"
                    ));
                }
                Ok(())
            }
        }
    }
}

/// Produces increasing arrival times.
pub(super) struct ArrivalClock {
    rng: SmallRng,
    traffic: Traffic,
    mean_rate: f64,
    /// Time of the last arrival.
    now: f64,
    /// End of the constant-rate piece `now` is in, and its rate.
    piece_end: f64,
    piece_rate: f64,
    /// Index of the current burst cycle, and whether `now` is in its peak.
    cycle: u64,
    in_peak: bool,
    /// Seeds the per-cycle peak factors independently of the gaps.
    cycle_seed: u64,
}

impl ArrivalClock {
    pub(super) fn new(traffic: &Traffic, mean_rate: f64, seed: u64) -> Self {
        assert!(
            mean_rate.is_finite() && mean_rate > 0.0,
            "arrival rate must be positive"
        );
        let mut clock = ArrivalClock {
            rng: SmallRng::seed_from_u64(seed),
            traffic: *traffic,
            mean_rate,
            now: 0.0,
            piece_end: f64::INFINITY,
            piece_rate: mean_rate,
            cycle: 0,
            in_peak: true,
            cycle_seed: seed ^ 0x5851_f42d_4c95_7f2d,
        };
        if let Traffic::Bursty { .. } = traffic {
            // Start at the beginning of cycle 0's quiet period.
            clock.in_peak = true;
            clock.cycle = u64::MAX;
            clock.piece_end = 0.0;
            clock.next_piece();
        }
        clock
    }

    pub(super) fn next_arrival(&mut self) -> f64 {
        // Unit-rate exponential gap, spent across constant-rate pieces.
        let mut work = -(1.0 - self.rng.r#gen::<f64>()).ln();
        loop {
            let room = (self.piece_end - self.now) * self.piece_rate;
            if work < room {
                self.now += work / self.piece_rate;
                return self.now;
            }
            work -= room;
            self.now = self.piece_end;
            self.next_piece();
        }
    }

    fn next_piece(&mut self) {
        let Traffic::Bursty {
            cycle_seconds,
            peak_seconds,
            peak_factor: (low, high),
        } = self.traffic
        else {
            unreachable!("steady traffic has one endless piece");
        };
        let start = self.piece_end;
        if self.in_peak {
            // Quiet part of the next cycle.
            self.cycle = self.cycle.wrapping_add(1);
            self.in_peak = false;
            let factor = self.peak_factor(low, high);
            let quiet = cycle_seconds - peak_seconds;
            self.piece_rate = self.mean_rate * (cycle_seconds - factor * peak_seconds) / quiet;
            self.piece_end = start + quiet;
        } else {
            self.in_peak = true;
            self.piece_rate = self.mean_rate * self.peak_factor(low, high);
            self.piece_end = start + peak_seconds;
        }
    }

    /// The peak factor of the current cycle; a pure function of the cycle
    /// index so the quiet and peak parts agree.
    fn peak_factor(&self, low: f64, high: f64) -> f64 {
        let mut rng = SmallRng::seed_from_u64(self.cycle_seed ^ self.cycle);
        low + (high - low) * rng.r#gen::<f64>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count_between(times: &[f64], from: f64, to: f64) -> usize {
        times.iter().filter(|&&t| t >= from && t < to).count()
    }

    #[test]
    fn poisson_has_the_mean_rate() {
        let mut clock = ArrivalClock::new(&Traffic::Poisson, 50.0, 1);
        let times: Vec<f64> = (0..20_000).map(|_| clock.next_arrival()).collect();
        let rate = times.len() as f64 / times.last().unwrap();
        assert!((48.0..52.0).contains(&rate), "{rate}");
        assert!(times.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn bursts_peak_at_several_times_the_mean_and_keep_the_mean() {
        let traffic = Traffic::Bursty {
            cycle_seconds: 20.0,
            peak_seconds: 3.0,
            peak_factor: (3.0, 5.0),
        };
        traffic.validate().unwrap();
        let mean = 40.0;
        let mut clock = ArrivalClock::new(&traffic, mean, 4);
        let mut times = Vec::new();
        while times.last().is_none_or(|&t| t < 400.0) {
            times.push(clock.next_arrival());
        }
        let overall = count_between(&times, 0.0, 400.0) as f64 / 400.0;
        assert!((mean * 0.93..mean * 1.07).contains(&overall), "{overall}");
        // Cycle: 17 s quiet, then 3 s of peak.
        let peaks = (0..20)
            .map(|c| count_between(&times, c as f64 * 20.0 + 17.0, c as f64 * 20.0 + 20.0))
            .sum::<usize>() as f64
            / (20.0 * 3.0);
        let quiet = (0..20)
            .map(|c| count_between(&times, c as f64 * 20.0, c as f64 * 20.0 + 17.0))
            .sum::<usize>() as f64
            / (20.0 * 17.0);
        assert!(
            (3.0 * mean * 0.9..5.0 * mean * 1.1).contains(&peaks),
            "peak rate {peaks}"
        );
        assert!(quiet < mean, "quiet rate {quiet}");
    }

    #[test]
    fn impossible_bursts_are_refused() {
        let traffic = Traffic::Bursty {
            cycle_seconds: 10.0,
            peak_seconds: 3.0,
            peak_factor: (3.0, 5.0),
        };
        assert!(traffic.validate().is_err());
    }
}
