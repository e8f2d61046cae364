//! The figures of a replica's latest observation that every scored pick
//! reads, kept in a `SeqLock` beside the observation itself.
//!
//! Loading an observation through its `ArcSwap` costs two atomic
//! read-modify-writes (take a debt slot, pay it back); over a thousand
//! candidates that was half of every pick. A `SummaryCell` is written once
//! per scrape and read with plain loads. A reader that races a write falls
//! back to the observation.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::health::{Health, health_of};
use crate::observation::Observation;
use crate::seqlock::SeqLock;

/// What the scored pick needs of one observation.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ObservationSummary {
    /// Changes with every stored observation; 0 before the first.
    pub generation: u64,
    pub waiting: Option<u64>,
    /// Requests in the engine's running batch.
    pub running: Option<u64>,
    pub kv_usage: Option<f64>,
    /// Requests wait for LoRA adapter slots (`waiting_adapters` non-empty).
    pub adapter_bound: bool,
    pub last_good: Option<Instant>,
    /// The most recent scrape failed.
    pub failed: bool,
}

impl ObservationSummary {
    /// Read straight from an observation (the slow path).
    pub fn of(observation: &Observation) -> ObservationSummary {
        let state = observation.state.as_deref();
        ObservationSummary {
            generation: 0,
            waiting: state.and_then(|s| s.waiting),
            running: state.and_then(|s| s.running),
            kv_usage: state.and_then(|s| s.kv_usage),
            adapter_bound: state.is_some_and(|s| !s.waiting_adapters.is_empty()),
            last_good: observation.last_good,
            failed: observation.last_error.is_some(),
        }
    }

    pub fn health(&self, now: Instant, stale_after: Duration) -> Health {
        health_of(self.failed, self.last_good, now, stale_after)
    }
}

/// Sentinels for `None` in the words.
const NO_WAITING: u64 = u64::MAX;
const NO_RUNNING: u64 = u64::MAX;
const NO_INSTANT: u64 = u64::MAX;
const FAILED: u64 = 1;
const ADAPTER_BOUND: u64 = 2;

/// Word positions in the lock.
const WAITING: usize = 0;
/// `f64` bits; NaN when unknown.
const KV_USAGE: usize = 1;
/// Nanoseconds after [`epoch`], biased by `i64::MAX` so earlier instants
/// fit; `NO_INSTANT` when there has been no good scrape.
const LAST_GOOD: usize = 2;
const FLAGS: usize = 3;
const RUNNING: usize = 4;
const WORDS: usize = 5;

#[derive(Debug, Default)]
pub(crate) struct SummaryCell {
    lock: SeqLock<WORDS>,
}

impl SummaryCell {
    /// Only one writer at a time (the caller serialises).
    pub(crate) fn write(&self, observation: &Observation) {
        let summary = ObservationSummary::of(observation);
        let mut words = [0; WORDS];
        words[WAITING] = summary.waiting.unwrap_or(NO_WAITING);
        words[RUNNING] = summary.running.unwrap_or(NO_RUNNING);
        words[KV_USAGE] = summary.kv_usage.unwrap_or(f64::NAN).to_bits();
        words[LAST_GOOD] = summary.last_good.map_or(NO_INSTANT, encode);
        words[FLAGS] = if summary.failed { FAILED } else { 0 }
            | if summary.adapter_bound {
                ADAPTER_BOUND
            } else {
                0
            };
        self.lock.write(words);
    }

    /// A consistent copy, or `None` if a write was in progress.
    #[inline]
    pub(crate) fn read(&self) -> Option<ObservationSummary> {
        let (generation, words) = self.lock.read()?;
        if generation == 0 {
            // Nothing stored yet: the default observation.
            return Some(ObservationSummary::of(&Observation::default()));
        }
        let waiting = words[WAITING];
        let running = words[RUNNING];
        let kv_usage = f64::from_bits(words[KV_USAGE]);
        let last_good = words[LAST_GOOD];
        let flags = words[FLAGS];
        Some(ObservationSummary {
            generation,
            waiting: (waiting != NO_WAITING).then_some(waiting),
            running: (running != NO_RUNNING).then_some(running),
            kv_usage: (!kv_usage.is_nan()).then_some(kv_usage),
            adapter_bound: flags & ADAPTER_BOUND != 0,
            last_good: (last_good != NO_INSTANT).then(|| decode(last_good)),
            failed: flags & FAILED != 0,
        })
    }
}

/// A fixed instant that stored instants are counted from.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

const BIAS: u64 = i64::MAX as u64;

fn encode(at: Instant) -> u64 {
    let epoch = epoch();
    let nanos = |d: Duration| {
        u64::try_from(d.as_nanos())
            .unwrap_or(u64::MAX)
            .min(BIAS - 1)
    };
    match at.checked_duration_since(epoch) {
        Some(after) => BIAS + nanos(after),
        None => BIAS - nanos(epoch - at),
    }
}

fn decode(bits: u64) -> Instant {
    let epoch = epoch();
    if bits >= BIAS {
        epoch + Duration::from_nanos(bits - BIAS)
    } else {
        epoch - Duration::from_nanos(BIAS - bits)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::observation::EngineState;

    fn observation(waiting: Option<u64>, kv: Option<f64>, at: Option<Instant>) -> Observation {
        Observation {
            state: Some(Arc::new(EngineState {
                waiting,
                running: waiting.map(|w| w * 2 + 1),
                kv_usage: kv,
                waiting_adapters: vec!["sql".into()],
                ..EngineState::default()
            })),
            last_good: at,
            last_error: None,
        }
    }

    #[test]
    fn a_summary_reads_back_what_the_observation_says() {
        let cell = SummaryCell::default();
        let unwritten = cell.read().unwrap();
        assert_eq!(unwritten, ObservationSummary::of(&Observation::default()));

        let now = Instant::now();
        for (waiting, kv, at) in [
            (Some(3), Some(0.25), Some(now)),
            (None, None, None),
            (Some(0), Some(1.0), Some(now - Duration::from_secs(5))),
            (Some(7), None, Some(now + Duration::from_millis(3))),
        ] {
            let obs = observation(waiting, kv, at);
            cell.write(&obs);
            let summary = cell.read().unwrap();
            assert_eq!(
                ObservationSummary {
                    generation: 0,
                    ..summary
                },
                ObservationSummary::of(&obs)
            );
            assert!(summary.generation > 0 && summary.generation % 2 == 0);
        }
        let failed = Observation {
            last_error: Some("refused".into()),
            ..observation(Some(1), None, Some(now))
        };
        cell.write(&failed);
        let summary = cell.read().unwrap();
        assert!(summary.failed && summary.adapter_bound);
        assert_eq!(
            summary.health(now, Duration::from_secs(1)),
            crate::health(&failed, now, Duration::from_secs(1))
        );
    }

    #[test]
    fn every_write_changes_the_generation() {
        let cell = SummaryCell::default();
        let obs = observation(Some(1), Some(0.5), Some(Instant::now()));
        cell.write(&obs);
        let first = cell.read().unwrap().generation;
        cell.write(&obs);
        assert_ne!(cell.read().unwrap().generation, first);
    }
}
