//! Metrics of traffic management: each rewrite target's requests,
//! failures, current weight, rollbacks and promotions; each mirror's
//! copies (sent, dropped, failed) and the primary and shadow answers'
//! TTFT, duration and token rate side by side. Label values come from the
//! config (rewrite names, target models, mirror names), never from
//! clients, so the series stay bounded.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Time to first token and request duration of mirrored requests: 5 ms to
/// 60 s, as the gateway's other latency histograms.
const LATENCY_BUCKETS: [f64; 22] = [
    0.005, 0.01, 0.02, 0.035, 0.05, 0.075, 0.1, 0.15, 0.25, 0.35, 0.5, 0.75, 1.0, 1.5, 2.5, 4.0,
    6.0, 10.0, 15.0, 25.0, 40.0, 60.0,
];
/// Completion tokens per second of one answer after its first token: a
/// few per second (a 70B model on a busy GPU) to thousands (a tiny one).
const RATE_BUCKETS: [f64; 14] = [
    1.0, 2.5, 5.0, 10.0, 20.0, 35.0, 50.0, 75.0, 100.0, 150.0, 250.0, 500.0, 1000.0, 5000.0,
];

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TargetLabels {
    rewrite: String,
    target: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MirrorLabels {
    mirror: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CopyLabels {
    mirror: String,
    /// `sent`, `dropped-saturated` (no room under maxInFlight),
    /// `dropped-no-replica`, `failed` (the shadow answered an error or
    /// failed).
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoleLabels {
    mirror: String,
    /// `primary` or `shadow`.
    role: &'static str,
}

#[derive(Clone)]
pub struct RolloutMetrics {
    requests: Family<TargetLabels, Counter>,
    failures: Family<TargetLabels, Counter>,
    weight: Family<TargetLabels, Gauge>,
    rollbacks: Family<TargetLabels, Counter>,
    promotions: Family<TargetLabels, Counter>,
    copies: Family<CopyLabels, Counter>,
    ttft: HistogramFamily<RoleLabels>,
    duration: HistogramFamily<RoleLabels>,
    token_rate: HistogramFamily<RoleLabels>,
    errors: Family<RoleLabels, Counter>,
    in_flight: Family<MirrorLabels, Gauge>,
}

impl RolloutMetrics {
    /// Counters are registered without `_total`: the encoder appends it.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self {
            requests: Family::default(),
            failures: Family::default(),
            weight: Family::default(),
            rollbacks: Family::default(),
            promotions: Family::default(),
            copies: Family::default(),
            ttft: Family::new_with_constructor(|| Histogram::new(LATENCY_BUCKETS)),
            duration: Family::new_with_constructor(|| Histogram::new(LATENCY_BUCKETS)),
            token_rate: Family::new_with_constructor(|| Histogram::new(RATE_BUCKETS)),
            errors: Family::default(),
            in_flight: Family::default(),
        };
        registry.register(
            "infergate_rewrite_requests",
            "Requests a rewrite sent to each of its targets (the requested model is the rewrite's; the target is the model served)",
            m.requests.clone(),
        );
        registry.register(
            "infergate_rewrite_failures",
            "Answers of a rewrite target its guard counts as failed: 5xx, timeouts and 429 from admission on",
            m.failures.clone(),
        );
        registry.register(
            "infergate_rewrite_weight",
            "A rewrite target's current weight in percent, after rollbacks and promotions",
            m.weight.clone(),
        );
        registry.register(
            "infergate_rewrite_rollbacks",
            "Times a rewrite target breached its guard and was rolled back to weight 0",
            m.rollbacks.clone(),
        );
        registry.register(
            "infergate_rewrite_promotions",
            "Promotion steps of a rewrite target",
            m.promotions.clone(),
        );
        registry.register(
            "infergate_mirror_copies",
            "Copies of requests for a mirror, by outcome: sent, dropped-saturated, dropped-no-replica, failed",
            m.copies.clone(),
        );
        registry.register(
            "infergate_mirror_ttft_seconds",
            "Time to first token of mirrored requests: the client's answer (primary) and the copy's (shadow)",
            m.ttft.clone(),
        );
        registry.register(
            "infergate_mirror_duration_seconds",
            "Duration of mirrored requests, primary and shadow",
            m.duration.clone(),
        );
        registry.register(
            "infergate_mirror_tokens_per_second",
            "Completion tokens per second after the first token, primary and shadow",
            m.token_rate.clone(),
        );
        registry.register(
            "infergate_mirror_errors",
            "Mirrored requests that ended in an error (429, 5xx, timeout), primary and shadow",
            m.errors.clone(),
        );
        registry.register(
            "infergate_mirror_in_flight",
            "Copies of a mirror in flight now",
            m.in_flight.clone(),
        );
        m
    }

    /// Handles of one rewrite target.
    pub fn target(&self, rewrite: &str, target: &str) -> TargetMetrics {
        let labels = TargetLabels {
            rewrite: rewrite.to_owned(),
            target: target.to_owned(),
        };
        TargetMetrics {
            requests: self.requests.get_or_create(&labels).clone(),
            failures: self.failures.get_or_create(&labels).clone(),
            weight: self.weight.get_or_create(&labels).clone(),
            rollbacks: self.rollbacks.get_or_create(&labels).clone(),
            promotions: self.promotions.get_or_create(&labels).clone(),
        }
    }

    /// Handles of one mirror.
    pub fn mirror(&self, mirror: &str) -> MirrorMetrics {
        let copies = |outcome| {
            self.copies
                .get_or_create(&CopyLabels {
                    mirror: mirror.to_owned(),
                    outcome,
                })
                .clone()
        };
        let side = |role| {
            let labels = RoleLabels {
                mirror: mirror.to_owned(),
                role,
            };
            Side {
                ttft: self.ttft.get_or_create(&labels).clone(),
                duration: self.duration.get_or_create(&labels).clone(),
                token_rate: self.token_rate.get_or_create(&labels).clone(),
                errors: self.errors.get_or_create(&labels).clone(),
            }
        };
        MirrorMetrics {
            sent: copies("sent"),
            dropped_saturated: copies("dropped-saturated"),
            dropped_no_replica: copies("dropped-no-replica"),
            failed: copies("failed"),
            in_flight: self
                .in_flight
                .get_or_create(&MirrorLabels {
                    mirror: mirror.to_owned(),
                })
                .clone(),
            primary: side("primary"),
            shadow: side("shadow"),
        }
    }
}

/// One rewrite target's handles.
#[derive(Clone)]
pub struct TargetMetrics {
    pub requests: Counter,
    pub failures: Counter,
    pub weight: Gauge,
    pub rollbacks: Counter,
    pub promotions: Counter,
}

/// One mirror's handles.
#[derive(Clone, Debug)]
pub struct MirrorMetrics {
    pub sent: Counter,
    pub dropped_saturated: Counter,
    pub dropped_no_replica: Counter,
    pub failed: Counter,
    pub in_flight: Gauge,
    pub primary: Side,
    pub shadow: Side,
}

/// The figures of one side of a mirror.
#[derive(Clone, Debug)]
pub struct Side {
    ttft: Histogram,
    duration: Histogram,
    token_rate: Histogram,
    errors: Counter,
}

impl Side {
    /// One answer ended: its status, TTFT, duration and completion tokens.
    pub fn observe(
        &self,
        status: u16,
        ttft: Option<Duration>,
        duration: Duration,
        completion_tokens: Option<u64>,
    ) {
        self.duration.observe(duration.as_secs_f64());
        if status == 429 || status >= 500 {
            self.errors.inc();
            return;
        }
        if let Some(ttft) = ttft {
            self.ttft.observe(ttft.as_secs_f64());
            let decoding = duration.saturating_sub(ttft).as_secs_f64();
            if let Some(tokens) = completion_tokens.filter(|&t| t > 1)
                && decoding > 0.0
            {
                self.token_rate.observe((tokens - 1) as f64 / decoding);
            }
        }
    }
}
