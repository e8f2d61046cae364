//! Each pool's traffic over the last seconds and minutes, for the fleet
//! page (`/debug/traffic`): request rate, TTFT percentiles, 429s and
//! errors, answers moved off failing replicas and those moving now.
//!
//! Computed from the counters `/metrics` exports (`infergate_requests_total`
//! and `infergate_ttft_seconds`), as the difference between two snapshots
//! of them. A snapshot is taken when someone asks, at most one a second
//! however many ask, and kept for [`WINDOW`]: nothing is counted twice on
//! the request path, and nothing runs while nobody looks. Until the page
//! has been open for a window, the first snapshot is the one taken when the
//! gateway started (every counter zero), so the numbers cover the time
//! since then; `seconds` always says what a number covers.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use parking_lot::Mutex;
use serde_json::{Value, json};
use signals::prom::{self, Metric, Sample, Visitor};
use tokio::time::Instant;

use super::Metrics;

/// The short window: the request rate "now".
pub const RECENT: Duration = Duration::from_secs(10);
/// The long window: TTFT percentiles and error counts.
pub const WINDOW: Duration = Duration::from_secs(300);
/// Snapshots are at least this far apart.
const EVERY: Duration = Duration::from_secs(1);

const REQUESTS: &str = "infergate_requests";
const TTFT: &str = "infergate_ttft_seconds";
const MIGRATIONS: &str = "infergate_migrations";
const MIGRATING: &str = "infergate_migrating";

/// One pool's counters at one time, summed over its models.
#[derive(Debug, Clone, Default, PartialEq)]
struct Counts {
    /// Requests by final status.
    by_status: BTreeMap<u16, f64>,
    /// Cumulative TTFT bucket counts by upper bound (seconds), ascending,
    /// `+Inf` last.
    ttft: Vec<(f64, f64)>,
    /// Answers moved to another replica (continued, resent, completed).
    moved: f64,
    /// Answers whose replica failed them and that could not be moved.
    not_moved: f64,
    /// Answers moving now (a gauge: not differenced).
    migrating: f64,
}

impl Counts {
    fn add_ttft(&mut self, le: f64, count: f64) {
        match self.ttft.iter_mut().find(|(bound, _)| *bound == le) {
            Some((_, c)) => *c += count,
            None => {
                self.ttft.push((le, count));
                self.ttft.sort_by(|a, b| a.0.total_cmp(&b.0));
            }
        }
    }

    /// `self - earlier`, for counters that only grow (a series missing
    /// earlier counts from zero).
    fn since(&self, earlier: Option<&Counts>) -> Counts {
        let before_status = |code| {
            earlier
                .and_then(|e| e.by_status.get(&code).copied())
                .unwrap_or(0.0)
        };
        let before_ttft = |le: f64| {
            earlier
                .and_then(|e| e.ttft.iter().find(|(b, _)| *b == le).map(|(_, c)| *c))
                .unwrap_or(0.0)
        };
        Counts {
            by_status: self
                .by_status
                .iter()
                .map(|(code, n)| (*code, (n - before_status(*code)).max(0.0)))
                .collect(),
            ttft: self
                .ttft
                .iter()
                .map(|(le, n)| (*le, (n - before_ttft(*le)).max(0.0)))
                .collect(),
            moved: (self.moved - earlier.map_or(0.0, |e| e.moved)).max(0.0),
            not_moved: (self.not_moved - earlier.map_or(0.0, |e| e.not_moved)).max(0.0),
            migrating: self.migrating,
        }
    }

    fn requests(&self, status: impl Fn(u16) -> bool) -> f64 {
        // A fold from +0.0: an empty float `sum()` is -0.0, which JSON
        // writes as `-0.0`.
        self.by_status
            .iter()
            .filter(|(code, _)| status(**code))
            .fold(0.0, |total, (_, n)| total + n)
    }
}

#[derive(Debug, Clone)]
struct Snapshot {
    at: Instant,
    /// By pool name (pools only; unrouted requests have no pool).
    pools: BTreeMap<String, Counts>,
}

/// Reads the two families a snapshot needs out of the exposition.
#[derive(Default)]
struct Reader {
    pools: BTreeMap<String, Counts>,
}

impl<'a> Visitor<'a> for Reader {
    fn wants(&mut self, metric: &Metric<'a>) -> bool {
        (metric.family == REQUESTS && metric.suffix() == "_total")
            || (metric.family == TTFT && metric.suffix() == "_bucket")
            || (metric.family == MIGRATIONS && metric.suffix() == "_total")
            || metric.family == MIGRATING
    }

    fn sample(&mut self, sample: Sample<'a>) {
        let Some(pool) = sample.labels.get("pool").filter(|p| !p.is_empty()) else {
            return;
        };
        let counts = self.pools.entry(pool.into_owned()).or_default();
        if sample.metric.family == MIGRATIONS {
            match sample.labels.get("outcome").as_deref() {
                Some("not_continued" | "failed") => counts.not_moved += sample.value,
                _ => counts.moved += sample.value,
            }
        } else if sample.metric.family == MIGRATING {
            counts.migrating += sample.value;
        } else if sample.metric.family == REQUESTS {
            if let Some(code) = sample.labels.get("code").and_then(|c| c.parse().ok()) {
                *counts.by_status.entry(code).or_default() += sample.value;
            }
        } else if let Some(le) = sample.labels.get("le").and_then(|le| parse_bound(&le)) {
            counts.add_ttft(le, sample.value);
        }
    }
}

fn parse_bound(le: &str) -> Option<f64> {
    match le {
        "+Inf" => Some(f64::INFINITY),
        le => le.parse().ok(),
    }
}

/// The snapshots of the last [`WINDOW`], and one before it.
pub struct Traffic {
    history: Mutex<VecDeque<Snapshot>>,
}

impl Traffic {
    /// Starts with every counter at zero `now`: create it with the metrics.
    pub fn new(now: Instant) -> Self {
        let zero = Snapshot {
            at: now,
            pools: BTreeMap::new(),
        };
        Self {
            history: Mutex::new(VecDeque::from([zero])),
        }
    }

    /// Every pool's traffic over [`RECENT`] and [`WINDOW`] up to `now`
    /// (or up to the last snapshot, when it is less than a second old).
    pub fn report(&self, metrics: &Metrics, now: Instant) -> Value {
        let mut history = self.history.lock();
        let due = history
            .back()
            .is_none_or(|s| now.saturating_duration_since(s.at) >= EVERY);
        if due {
            let mut reader = Reader::default();
            // The gateway's own exposition always parses; a failure would
            // only leave this snapshot partial.
            if let Err(e) = prom::parse(&metrics.encode(), &mut reader) {
                tracing::warn!(error = %e, "cannot read the gateway's own metrics");
            }
            history.push_back(Snapshot {
                at: now,
                pools: reader.pools,
            });
            // Keep one snapshot at or before the window's start as its base.
            while history.len() > 2 && now.saturating_duration_since(history[1].at) >= WINDOW {
                history.pop_front();
            }
        }
        let latest = history.back().expect("never empty");
        let pools: Vec<Value> = latest
            .pools
            .iter()
            .map(|(name, counts)| {
                let window = |length| {
                    let base = base(&history, latest.at, length);
                    let seconds = latest.at.saturating_duration_since(base.at);
                    summary(&counts.since(base.pools.get(name)), seconds)
                };
                json!({
                    "name": name,
                    "migrating": counts.migrating,
                    "recent": window(RECENT),
                    "window": window(WINDOW),
                })
            })
            .collect();
        json!({
            "recentSeconds": RECENT.as_secs(),
            "windowSeconds": WINDOW.as_secs(),
            "pools": pools,
        })
    }
}

/// Where a window of `length` ending at the last snapshot starts: the
/// oldest snapshot within `length` of it, or, when only the last one is
/// (nobody asked for a while), the one before it — a longer window, which
/// its `seconds` then says.
fn base(history: &VecDeque<Snapshot>, latest: Instant, length: Duration) -> &Snapshot {
    let before_latest = history.len().saturating_sub(1);
    history
        .iter()
        .take(before_latest)
        .find(|s| latest.saturating_duration_since(s.at) <= length)
        .unwrap_or(&history[before_latest.saturating_sub(1)])
}

fn summary(counts: &Counts, seconds: Duration) -> Value {
    let requests = counts.requests(|_| true);
    let secs = seconds.as_secs_f64();
    let ms = |q| quantile(&counts.ttft, q).map(|s| s * 1e3);
    json!({
        "seconds": secs,
        "requests": requests,
        "perSecond": if secs > 0.0 { requests / secs } else { 0.0 },
        "ok": counts.requests(|c| (200..300).contains(&c)),
        "rateLimited": counts.requests(|c| c == 429),
        "clientClosed": counts.requests(|c| c == 499),
        "clientErrors": counts.requests(|c| (400..500).contains(&c) && c != 429 && c != 499),
        "serverErrors": counts.requests(|c| c >= 500),
        "ttftMs": {
            "count": counts.ttft.last().map_or(0.0, |(_, n)| *n),
            "p50": ms(0.5),
            "p95": ms(0.95),
        },
        "migrations": {"moved": counts.moved, "notMoved": counts.not_moved},
    })
}

/// The `q` quantile of cumulative `buckets`, interpolated linearly within
/// its bucket as Prometheus's `histogram_quantile` does; the highest finite
/// bound when it falls in the `+Inf` bucket. `None` without observations.
fn quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut lower = (0.0, 0.0);
    for &(le, count) in buckets {
        if count >= rank {
            if le.is_infinite() {
                return Some(lower.0);
            }
            let within = count - lower.1;
            let fraction = if within > 0.0 {
                (rank - lower.1) / within
            } else {
                1.0
            };
            return Some(lower.0 + (le - lower.0) * fraction);
        }
        lower = (le, count);
    }
    Some(lower.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXPOSITION: &str = "\
# TYPE infergate_requests counter
infergate_requests_total{pool=\"a\",model=\"m1\",code=\"200\"} 6
infergate_requests_total{pool=\"a\",model=\"m2\",code=\"200\"} 2
infergate_requests_total{pool=\"a\",model=\"m1\",code=\"429\"} 3
infergate_requests_total{pool=\"a\",model=\"m1\",code=\"502\"} 1
infergate_requests_total{pool=\"\",model=\"\",code=\"404\"} 9
# TYPE infergate_ttft_seconds histogram
infergate_ttft_seconds_bucket{le=\"0.1\",pool=\"a\",model=\"m1\"} 2
infergate_ttft_seconds_bucket{le=\"0.2\",pool=\"a\",model=\"m1\"} 6
infergate_ttft_seconds_bucket{le=\"+Inf\",pool=\"a\",model=\"m1\"} 6
infergate_ttft_seconds_bucket{le=\"0.1\",pool=\"a\",model=\"m2\"} 2
infergate_ttft_seconds_bucket{le=\"0.2\",pool=\"a\",model=\"m2\"} 2
infergate_ttft_seconds_bucket{le=\"+Inf\",pool=\"a\",model=\"m2\"} 2
infergate_ttft_seconds_count{pool=\"a\",model=\"m1\"} 6
# TYPE infergate_migrations counter
infergate_migrations_total{pool=\"a\",reason=\"broken\",outcome=\"continued\"} 4
infergate_migrations_total{pool=\"a\",reason=\"not_here\",outcome=\"resent\"} 1
infergate_migrations_total{pool=\"a\",reason=\"broken\",outcome=\"not_continued\"} 2
# TYPE infergate_migrating gauge
infergate_migrating{pool=\"a\"} 3
# EOF
";

    fn read(text: &str) -> BTreeMap<String, Counts> {
        let mut reader = Reader::default();
        prom::parse(text, &mut reader).unwrap();
        reader.pools
    }

    #[test]
    fn reads_pools_summed_over_models_and_skips_unrouted() {
        let pools = read(EXPOSITION);
        assert_eq!(pools.keys().collect::<Vec<_>>(), ["a"]);
        let a = &pools["a"];
        assert_eq!(a.by_status[&200], 8.0);
        assert_eq!(a.by_status[&429], 3.0);
        assert_eq!(a.ttft, [(0.1, 4.0), (0.2, 8.0), (f64::INFINITY, 8.0)]);
        assert_eq!((a.moved, a.not_moved, a.migrating), (5.0, 2.0, 3.0));
    }

    #[test]
    fn quantiles_interpolate_within_their_bucket() {
        let b = [(0.1, 4.0), (0.2, 8.0), (f64::INFINITY, 8.0)];
        assert!((quantile(&b, 0.5).unwrap() - 0.1).abs() < 1e-12);
        assert!((quantile(&b, 0.75).unwrap() - 0.15).abs() < 1e-12);
        assert!((quantile(&b, 0.25).unwrap() - 0.05).abs() < 1e-12);
        // Past the last finite bound: that bound.
        assert_eq!(
            quantile(&[(0.1, 1.0), (f64::INFINITY, 4.0)], 0.95),
            Some(0.1)
        );
        assert_eq!(quantile(&[(0.1, 0.0), (f64::INFINITY, 0.0)], 0.5), None);
        assert_eq!(quantile(&[], 0.5), None);
    }

    #[test]
    fn windows_are_differences_between_snapshots() {
        let t0 = Instant::now();
        let snapshot = |secs, text| Snapshot {
            at: t0 + Duration::from_secs(secs),
            pools: read(text),
        };
        let later = EXPOSITION.replace("} 6\n", "} 16\n");
        let mut history = VecDeque::from([
            Snapshot {
                at: t0,
                pools: BTreeMap::new(),
            },
            snapshot(100, EXPOSITION),
            snapshot(105, &later),
        ]);
        let latest = history.back().unwrap().clone();
        let latest_at = latest.at;
        // The short window starts at the snapshot within 10 s.
        let recent = base(&history, latest.at, RECENT);
        assert_eq!(recent.at, t0 + Duration::from_secs(100));
        let delta = latest.pools["a"].since(recent.pools.get("a"));
        let v = summary(&delta, latest.at - recent.at);
        assert_eq!(v["requests"], 10.0);
        assert_eq!(v["perSecond"], 2.0);
        assert_eq!(v["rateLimited"].to_string(), "0.0", "not -0.0");
        assert_eq!(v["ttftMs"]["count"], 10.0);
        // All ten new TTFTs fell between 0.1 s and 0.2 s.
        assert!((v["ttftMs"]["p50"].as_f64().unwrap() - 150.0).abs() < 1e-9);

        // The long window reaches back to the start: everything counts.
        let whole = base(&history, latest.at, WINDOW);
        assert_eq!(whole.at, t0);
        let v = summary(
            &latest.pools["a"].since(whole.pools.get("a")),
            latest.at - t0,
        );
        assert_eq!(v["requests"], 22.0);
        assert_eq!(v["ok"], 18.0);
        assert_eq!(v["rateLimited"], 3.0);
        assert_eq!(v["serverErrors"], 1.0);
        assert_eq!(v["seconds"], 105.0);
        assert_eq!(v["migrations"]["moved"], 5.0);
        assert_eq!(v["migrations"]["notMoved"], 2.0);

        // Nothing within 10 s but the last: the window reaches further back.
        history.remove(1);
        let recent = base(&history, latest_at, RECENT);
        assert_eq!(recent.at, t0);
        history.truncate(1);
        assert_eq!(
            base(&history, t0, RECENT).at,
            t0,
            "one snapshot: an empty window"
        );
    }

    #[test]
    fn snapshots_are_taken_at_most_once_a_second_and_kept_for_the_window() {
        let metrics = Metrics::new();
        let t0 = Instant::now();
        let traffic = Traffic::new(t0);
        traffic.report(&metrics, t0 + Duration::from_millis(500));
        assert_eq!(traffic.history.lock().len(), 1, "less than a second later");
        for s in 1..=400 {
            traffic.report(&metrics, t0 + Duration::from_secs(s));
        }
        let history = traffic.history.lock();
        let oldest = history[0].at;
        let newest = history.back().unwrap().at;
        assert!(newest - oldest >= WINDOW);
        assert!(newest - history[1].at < WINDOW);
        assert!(history.len() <= WINDOW.as_secs() as usize + 2);
    }
}
