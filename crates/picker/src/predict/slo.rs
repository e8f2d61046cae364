//! A request's latency objectives and whether a prediction meets them.

use std::time::Duration;

use serde::Serialize;

use super::features::LatencyPrediction;

/// Latency objectives of a request: a replica predicted to miss one is
/// avoided by [`crate::Policy::Predicted`]. `None` sets no objective.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Slo {
    /// Time to first token at most this.
    pub ttft: Option<Duration>,
    /// Mean time between output tokens at most this.
    pub itl: Option<Duration>,
}

impl Slo {
    /// Whether `prediction` meets every objective set.
    pub fn met_by(&self, prediction: &LatencyPrediction) -> bool {
        let within = |bound: Option<Duration>, value: f64| {
            bound.is_none_or(|bound| value <= bound.as_secs_f64())
        };
        within(self.ttft, prediction.ttft) && within(self.itl, prediction.itl)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_objective_set_must_be_met() {
        let p = LatencyPrediction {
            ttft: 0.4,
            itl: 0.06,
        };
        let ms = Duration::from_millis;
        assert!(Slo::default().met_by(&p));
        assert!(
            Slo {
                ttft: Some(ms(500)),
                itl: None
            }
            .met_by(&p)
        );
        assert!(
            !Slo {
                ttft: Some(ms(300)),
                itl: None
            }
            .met_by(&p)
        );
        assert!(
            !Slo {
                ttft: Some(ms(500)),
                itl: Some(ms(50))
            }
            .met_by(&p)
        );
        assert!(
            Slo {
                ttft: None,
                itl: Some(ms(60))
            }
            .met_by(&p)
        );
    }
}
