//! Per-request outcomes and the summary of a run, computed the same way in
//! both modes.
//!
//! Definitions (also written in BENCHMARKS.md):
//! - **TTFT**: arrival → first output token. Requests that time out before
//!   their first token count at the client timeout, so a tail that outgrew
//!   the timeout shows as the timeout rather than disappearing.
//! - **ITL**: per request, (last token − first token) / (tokens − 1), the
//!   mean gap between the request's tokens; percentiles are over requests.
//! - **e2e**: arrival → last token, for completed requests; timed-out
//!   requests count at the timeout. Its mean is reported beside its
//!   percentiles: a median can hide a share of requests queued behind a
//!   slow replica, a mean cannot.
//! - **output tokens/s**: output tokens of completed requests ÷ (last
//!   completion − first arrival).
//! - **prefix hit rate**: prompt tokens served from the replicas' prefix
//!   caches ÷ prompt tokens, over completed requests.
//!
//! - **queue wait**: time in the gateway's admission queue, from its
//!   `x-infergate-queue-wait-ms` header, for requests sent to a replica.
//!
//! All times are simulated seconds.

use config::Priority;
use gateway::DropReason;
use serde::Serialize;

use crate::flow::FlowMode;

/// How a request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Completed,
    /// The gateway answered 429 (every replica saturated); why, in
    /// [`Outcome::refusal`] when it said.
    Rejected,
    /// Any other failure: an error status, a broken stream, a refusal.
    Failed,
    /// No complete answer within the client timeout.
    TimedOut,
}

/// What happened to one request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    pub status: Status,
    /// Arrival time, seconds from the start of the run.
    pub arrival: f64,
    /// Seconds from arrival to the first token, if one came.
    pub ttft: Option<f64>,
    /// Seconds from arrival to the end, for completed requests.
    pub e2e: Option<f64>,
    /// Mean seconds between this request's tokens (two tokens or more).
    pub itl: Option<f64>,
    pub prompt_tokens: u32,
    pub cached_tokens: u32,
    pub output_tokens: u32,
    /// The band the request was marked with.
    pub band: Option<Priority>,
    /// Seconds it waited in the gateway's admission queue, when the
    /// gateway reported it (requests sent to a replica).
    pub queue_wait: Option<f64>,
    /// Why a rejected request was refused.
    pub refusal: Option<Refusal>,
}

/// A 429's `x-infergate-dropped-reason`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Saturated and the band may not wait (`maxWait: 0s`).
    Saturated,
    /// The band's queue was full.
    QueueFull,
    /// Waited the band's `maxWait` without room.
    WaitExpired,
    /// Another reason, or none given.
    Other,
}

impl Refusal {
    pub fn from_reason(reason: Option<&str>) -> Self {
        match reason.and_then(DropReason::parse) {
            Some(DropReason::Saturated) => Refusal::Saturated,
            Some(DropReason::QueueFull) => Refusal::QueueFull,
            Some(DropReason::WaitExpired) => Refusal::WaitExpired,
            Some(DropReason::NoReplicas | DropReason::SloUnmet | DropReason::ColdStartTimeout)
            | None => Refusal::Other,
        }
    }
}

impl Outcome {
    pub fn rejected(arrival: f64) -> Self {
        Self::ended(Status::Rejected, arrival)
    }

    /// A 429 that gave its reason.
    pub fn refused(arrival: f64, refusal: Refusal) -> Self {
        Outcome {
            refusal: Some(refusal),
            ..Self::rejected(arrival)
        }
    }

    /// The same outcome, for a request of `band`.
    pub fn in_band(self, band: Option<Priority>) -> Self {
        Outcome { band, ..self }
    }

    /// The same outcome, after `seconds` in the gateway's queue.
    pub fn after_queue_wait(self, seconds: Option<f64>) -> Self {
        Outcome {
            queue_wait: seconds,
            ..self
        }
    }

    pub fn failed(arrival: f64) -> Self {
        Self::ended(Status::Failed, arrival)
    }

    fn ended(status: Status, arrival: f64) -> Self {
        Outcome {
            status,
            arrival,
            ttft: None,
            e2e: None,
            itl: None,
            prompt_tokens: 0,
            cached_tokens: 0,
            output_tokens: 0,
            band: None,
            queue_wait: None,
            refusal: None,
        }
    }

    /// A request that streamed `output_tokens` tokens, the first `ttft`
    /// and the last `e2e` seconds after it arrived.
    pub fn completed(
        arrival: f64,
        ttft: f64,
        e2e: f64,
        output_tokens: u32,
        prompt_tokens: u32,
        cached_tokens: u32,
    ) -> Self {
        Outcome {
            status: Status::Completed,
            arrival,
            ttft: Some(ttft),
            e2e: Some(e2e),
            itl: (output_tokens >= 2).then(|| (e2e - ttft) / f64::from(output_tokens - 1)),
            prompt_tokens,
            cached_tokens,
            output_tokens,
            band: None,
            queue_wait: None,
            refusal: None,
        }
    }

    /// A request cut off by the client timeout; `ttft` if its first token
    /// came in time.
    pub fn timed_out(arrival: f64, ttft: Option<f64>) -> Self {
        Outcome {
            ttft,
            ..Self::ended(Status::TimedOut, arrival)
        }
    }
}

/// One policy at one load: the row of the report and of `NAME.json`.
/// Latencies in milliseconds; `None` (JSON `null`) when no request
/// provides the figure.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub policy: String,
    /// Offered load as a fraction of the fleet's estimated capacity.
    pub load: f64,
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p95_ms: Option<f64>,
    pub ttft_p99_ms: Option<f64>,
    pub itl_p50_ms: Option<f64>,
    pub itl_p99_ms: Option<f64>,
    pub e2e_p50_ms: Option<f64>,
    pub e2e_p95_ms: Option<f64>,
    pub e2e_p99_ms: Option<f64>,
    /// Mean end-to-end time (timed-out requests at the timeout).
    pub e2e_mean_ms: Option<f64>,
    pub output_tokens_per_s: f64,
    pub completed: u64,
    /// Failed and timed-out requests.
    pub errors: u64,
    pub rejected_429: u64,
    pub prefix_hit_rate: f64,
    /// CPU seconds the router (gateway or peer) used during the run, when
    /// it ran as a process of its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub router_cpu_s: Option<f64>,
    /// Whether the gateway's admission queue was on, in scenarios that
    /// compare the two.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flow_control: Option<FlowMode>,
    /// Per priority band, then `all`, when the requests were marked.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub bands: Vec<BandSummary>,
}

/// The requests of one priority band in a run. Every request is counted
/// once: `requests == completed + refused + errors`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BandSummary {
    /// `critical`, `standard`, `sheddable`, or `all`.
    pub band: String,
    pub requests: u64,
    pub completed: u64,
    /// 429s, whatever the reason (the next four fields split them).
    pub refused: u64,
    pub refused_saturated: u64,
    pub refused_queue_full: u64,
    pub refused_wait_expired: u64,
    pub refused_other: u64,
    /// Failed and timed-out requests.
    pub errors: u64,
    /// Of the errors, requests cut off by the client timeout.
    pub timed_out: u64,
    /// TTFT of completed requests.
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p99_ms: Option<f64>,
    /// Gateway queue wait of the requests sent to a replica.
    pub queue_wait_p50_ms: Option<f64>,
    pub queue_wait_p99_ms: Option<f64>,
}

impl BandSummary {
    /// Whether every request is counted exactly once.
    pub fn accounted(&self) -> bool {
        self.completed + self.refused + self.errors == self.requests
            && self.refused
                == self.refused_saturated
                    + self.refused_queue_full
                    + self.refused_wait_expired
                    + self.refused_other
    }
}

/// One row per band present in `outcomes` (in band order), then `all`;
/// nothing when no request was marked with a band.
pub fn band_summaries(outcomes: &[Outcome]) -> Vec<BandSummary> {
    if outcomes.iter().all(|o| o.band.is_none()) {
        return Vec::new();
    }
    let mut rows: Vec<BandSummary> = Priority::ALL
        .into_iter()
        .filter(|band| outcomes.iter().any(|o| o.band == Some(*band)))
        .map(|band| {
            band_summary(
                band.as_str(),
                outcomes.iter().filter(|o| o.band == Some(band)),
            )
        })
        .collect();
    rows.push(band_summary("all", outcomes.iter()));
    rows
}

fn band_summary<'a>(band: &str, outcomes: impl Iterator<Item = &'a Outcome>) -> BandSummary {
    let mut row = BandSummary {
        band: band.to_owned(),
        requests: 0,
        completed: 0,
        refused: 0,
        refused_saturated: 0,
        refused_queue_full: 0,
        refused_wait_expired: 0,
        refused_other: 0,
        errors: 0,
        timed_out: 0,
        ttft_p50_ms: None,
        ttft_p99_ms: None,
        queue_wait_p50_ms: None,
        queue_wait_p99_ms: None,
    };
    let (mut ttft, mut waits) = (Vec::new(), Vec::new());
    for o in outcomes {
        row.requests += 1;
        waits.extend(o.queue_wait);
        match o.status {
            Status::Completed => {
                row.completed += 1;
                ttft.extend(o.ttft);
            }
            Status::Rejected => {
                row.refused += 1;
                match o.refusal.unwrap_or(Refusal::Other) {
                    Refusal::Saturated => row.refused_saturated += 1,
                    Refusal::QueueFull => row.refused_queue_full += 1,
                    Refusal::WaitExpired => row.refused_wait_expired += 1,
                    Refusal::Other => row.refused_other += 1,
                }
            }
            Status::Failed => row.errors += 1,
            Status::TimedOut => {
                row.errors += 1;
                row.timed_out += 1;
            }
        }
    }
    let ms = |values: &mut Vec<f64>, p: f64| percentile(values, p).map(|s| s * 1e3);
    row.ttft_p50_ms = ms(&mut ttft, 50.0);
    row.ttft_p99_ms = ms(&mut ttft, 99.0);
    row.queue_wait_p50_ms = ms(&mut waits, 50.0);
    row.queue_wait_p99_ms = ms(&mut waits, 99.0);
    row
}

/// The summary of a run's outcomes. `timeout` is the client timeout, the
/// value a request that never got its first token counts at.
pub fn summarize(policy: &str, load: f64, outcomes: &[Outcome], timeout: f64) -> Summary {
    let mut ttft = Vec::with_capacity(outcomes.len());
    let mut itl = Vec::with_capacity(outcomes.len());
    let mut e2e = Vec::with_capacity(outcomes.len());
    let (mut completed, mut errors, mut rejected) = (0u64, 0u64, 0u64);
    let (mut prompt, mut cached, mut output) = (0u64, 0u64, 0u64);
    let mut first_arrival = f64::INFINITY;
    let mut last_completion = f64::NEG_INFINITY;
    for o in outcomes {
        first_arrival = first_arrival.min(o.arrival);
        match o.status {
            Status::Completed => {
                completed += 1;
                ttft.extend(o.ttft);
                itl.extend(o.itl);
                if let Some(e) = o.e2e {
                    e2e.push(e);
                    last_completion = last_completion.max(o.arrival + e);
                }
                prompt += u64::from(o.prompt_tokens);
                cached += u64::from(o.cached_tokens);
                output += u64::from(o.output_tokens);
            }
            Status::TimedOut => {
                errors += 1;
                ttft.push(o.ttft.unwrap_or(timeout));
                e2e.push(timeout);
            }
            Status::Failed => errors += 1,
            Status::Rejected => rejected += 1,
        }
    }
    let span = last_completion - first_arrival;
    let e2e_mean_ms = mean(&e2e).map(|s| s * 1e3);
    let ms = |values: &mut Vec<f64>, p: f64| percentile(values, p).map(|s| s * 1e3);
    Summary {
        policy: policy.to_owned(),
        load,
        ttft_p50_ms: ms(&mut ttft, 50.0),
        ttft_p95_ms: ms(&mut ttft, 95.0),
        ttft_p99_ms: ms(&mut ttft, 99.0),
        itl_p50_ms: ms(&mut itl, 50.0),
        itl_p99_ms: ms(&mut itl, 99.0),
        e2e_p50_ms: ms(&mut e2e, 50.0),
        e2e_p95_ms: ms(&mut e2e, 95.0),
        e2e_p99_ms: ms(&mut e2e, 99.0),
        e2e_mean_ms,
        output_tokens_per_s: if span > 0.0 {
            output as f64 / span
        } else {
            0.0
        },
        completed,
        errors,
        rejected_429: rejected,
        prefix_hit_rate: if prompt > 0 {
            cached as f64 / prompt as f64
        } else {
            0.0
        },
        router_cpu_s: None,
        flow_control: None,
        bands: band_summaries(outcomes),
    }
}

/// The arithmetic mean, when there are values.
pub fn mean(values: &[f64]) -> Option<f64> {
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// Nearest-rank percentile (`p` in 0..=100); sorts `values` in place.
pub fn percentile(values: &mut [f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable_by(f64::total_cmp);
    let rank = ((p / 100.0) * values.len() as f64).ceil() as usize;
    Some(values[rank.clamp(1, values.len()) - 1])
}

/// `(value − base) / base` in percent, when both exist and base > 0.
pub fn change_percent(value: Option<f64>, base: Option<f64>) -> Option<f64> {
    match (value, base) {
        (Some(v), Some(b)) if b > 0.0 => Some((v - b) / b * 100.0),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut v: Vec<f64> = (1..=100).map(f64::from).collect();
        v.reverse();
        assert_eq!(percentile(&mut v, 50.0), Some(50.0));
        assert_eq!(percentile(&mut v, 95.0), Some(95.0));
        assert_eq!(percentile(&mut v, 99.0), Some(99.0));
        assert_eq!(percentile(&mut v, 100.0), Some(100.0));
        assert_eq!(percentile(&mut [7.0], 99.0), Some(7.0));
        assert_eq!(percentile(&mut [], 50.0), None);
    }

    #[test]
    fn summary_counts_and_rates() {
        let outcomes = [
            Outcome::completed(0.0, 0.1, 1.1, 11, 100, 50),
            Outcome::completed(1.0, 0.3, 2.3, 21, 300, 0),
            Outcome::rejected(1.5),
            Outcome::failed(1.6),
            Outcome::timed_out(1.7, None),
        ];
        let s = summarize("round-robin", 0.8, &outcomes, 60.0);
        assert_eq!((s.completed, s.errors, s.rejected_429), (2, 2, 1));
        // Output tokens 32 between the first arrival (0) and the last
        // completion (1.0 + 2.3).
        assert!((s.output_tokens_per_s - 32.0 / 3.3).abs() < 1e-9);
        assert!((s.prefix_hit_rate - 50.0 / 400.0).abs() < 1e-12);
        // ITL: (1.1 - 0.1) / 10 = 0.1 and (2.3 - 0.3) / 20 = 0.1.
        assert!((s.itl_p50_ms.unwrap() - 100.0).abs() < 1e-9);
        // The timed-out request counts at the timeout in TTFT and e2e.
        assert_eq!(s.ttft_p99_ms, Some(60_000.0));
        assert_eq!(s.e2e_p99_ms, Some(60_000.0));
        assert!((s.ttft_p50_ms.unwrap() - 300.0).abs() < 1e-9);
        // The mean e2e counts the timed-out request too: (1.1 + 2.3 + 60) / 3,
        // while the median is the second completed one.
        assert!((s.e2e_mean_ms.unwrap() - 63_400.0 / 3.0).abs() < 1e-6);
        assert!((s.e2e_p50_ms.unwrap() - 2300.0).abs() < 1e-9);
        assert_eq!(mean(&[]), None);
    }

    #[test]
    fn bands_count_every_request_once() {
        let critical = Some(Priority::Critical);
        let sheddable = Some(Priority::Sheddable);
        let outcomes = [
            Outcome::completed(0.0, 0.2, 1.0, 5, 10, 0)
                .in_band(critical)
                .after_queue_wait(Some(0.1)),
            Outcome::completed(0.1, 0.4, 1.0, 5, 10, 0)
                .in_band(critical)
                .after_queue_wait(Some(0.0)),
            Outcome::refused(0.2, Refusal::WaitExpired).in_band(critical),
            Outcome::refused(0.3, Refusal::Saturated).in_band(sheddable),
            Outcome::rejected(0.4).in_band(sheddable),
            Outcome::timed_out(0.5, Some(3.0))
                .in_band(sheddable)
                .after_queue_wait(Some(2.0)),
            Outcome::failed(0.6).in_band(sheddable),
        ];
        let rows = band_summaries(&outcomes);
        let names: Vec<&str> = rows.iter().map(|r| r.band.as_str()).collect();
        assert_eq!(names, ["critical", "sheddable", "all"]);
        assert!(rows.iter().all(BandSummary::accounted), "{rows:?}");
        let (c, s, all) = (&rows[0], &rows[1], &rows[2]);
        assert_eq!((c.requests, c.completed, c.refused_wait_expired), (3, 2, 1));
        assert_eq!((c.ttft_p50_ms, c.ttft_p99_ms), (Some(200.0), Some(400.0)));
        assert_eq!(
            (c.queue_wait_p50_ms, c.queue_wait_p99_ms),
            (Some(0.0), Some(100.0))
        );
        assert_eq!((s.refused_saturated, s.refused_other, s.errors), (1, 1, 2));
        assert_eq!(s.timed_out, 1);
        // TTFT is of completed requests only; the wait of a request that
        // reached a replica counts whatever happened next.
        assert_eq!(s.ttft_p99_ms, None);
        assert_eq!(s.queue_wait_p99_ms, Some(2000.0));
        assert_eq!((all.requests, all.refused), (7, 3));
        assert!(band_summaries(&[Outcome::failed(0.0)]).is_empty());
        assert_eq!(summarize("scored", 1.0, &outcomes, 60.0).bands, rows);
    }

    #[test]
    fn change_against_a_baseline() {
        assert_eq!(change_percent(Some(50.0), Some(200.0)), Some(-75.0));
        assert_eq!(change_percent(Some(50.0), None), None);
        assert_eq!(change_percent(Some(50.0), Some(0.0)), None);
    }
}
