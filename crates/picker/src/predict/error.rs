//! A model's recent error: the moving average of its absolute percentage
//! error, each measured on an observation before the model learns from it,
//! so it is the error the picker met, not how well the model fits what it
//! has already seen.

use crate::policy::PredictConfig;

/// Latencies are counted as at least this many seconds where one divides
/// by them, so a near-zero one cannot make an error or a weight infinite.
pub(crate) const FLOOR: f64 = 1e-4;
/// One observation's error counts at most this much: a wild miss should
/// cost trust, not keep it away for a hundred requests.
const MAX_ONE: f64 = 2.0;

#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RecentError {
    /// `None` before the first observation.
    mean: Option<f64>,
}

impl RecentError {
    /// Count the error of `predicted` against `actual` (seconds).
    pub(crate) fn record(&mut self, predicted: f64, actual: f64) {
        let error = ((predicted - actual).abs() / actual.max(FLOOR)).min(MAX_ONE);
        self.mean = Some(match self.mean {
            Some(mean) => mean + PredictConfig::ERROR_WEIGHT * (error - mean),
            None => error,
        });
    }

    /// The recent mean absolute percentage error, as a fraction.
    pub(crate) fn get(&self) -> Option<f64> {
        self.mean
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_is_relative_bounded_and_recent() {
        let mut error = RecentError::default();
        assert_eq!(error.get(), None);
        error.record(1.5, 1.0);
        assert_eq!(error.get(), Some(0.5));
        error.record(100.0, 1.0);
        let after_miss = 0.5 + PredictConfig::ERROR_WEIGHT * (MAX_ONE - 0.5);
        assert!((error.get().unwrap() - after_miss).abs() < 1e-12);
        for _ in 0..100 {
            error.record(1.0, 1.0);
        }
        assert!(error.get().unwrap() < 1e-4, "recent: the misses faded");
        error.record(0.001, 0.0);
        assert!(error.get().unwrap() <= MAX_ONE, "a zero actual is floored");
    }
}
