//! The router's own count of attempts per member, read from its
//! `/metrics` (`infergate_member_requests_total`,
//! `infergate_member_failovers_total`) every [`PERIOD`]: the attempts a
//! client never sees, such as a request refused by a dead member and
//! retried on another one.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// How often the router's metrics are read: the resolution of the
/// failover time.
pub const PERIOD: Duration = Duration::from_millis(50);

/// One reading, at `at` from the start of the traffic.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    pub at: Duration,
    /// Attempts sent to each member so far, every outcome.
    pub attempts: BTreeMap<String, f64>,
    /// Attempts that were not answered (no connection, 5xx, 429, cut):
    /// after a member is killed, every attempt to it is one of these,
    /// while the streams it drains still end as answered.
    pub unanswered: BTreeMap<String, f64>,
    /// Requests that failed at each member before any byte and were
    /// retried on another one, so far.
    pub failovers: BTreeMap<String, f64>,
}

/// Read `url` every [`PERIOD`] until `stop` turns true, and once more then.
pub async fn sample(url: String, start: Instant, mut stop: watch::Receiver<bool>) -> Vec<Sample> {
    let client = reqwest::Client::new();
    let mut samples = Vec::new();
    let mut tick = tokio::time::interval(PERIOD);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // A last reading once told to stop, so the samples cover every
        // answer the traffic saw.
        let stopping = tokio::select! {
            _ = tick.tick() => false,
            _ = stop.changed() => true,
        };
        let at = start.elapsed();
        let text = match client.get(&url).send().await {
            Ok(response) => response.text().await.ok(),
            Err(_) => None,
        };
        if let Some(text) = text {
            samples.push(Sample {
                at,
                attempts: by_member(&text, "infergate_member_requests_total", None),
                unanswered: by_member(&text, "infergate_member_requests_total", Some("answered")),
                failovers: by_member(&text, "infergate_member_failovers_total", None),
            });
        }
        if stopping {
            return samples;
        }
    }
}

/// `metric`'s values summed per `member` label, from Prometheus text,
/// leaving out the series whose `outcome` is `except`.
fn by_member(text: &str, metric: &str, except: Option<&str>) -> BTreeMap<String, f64> {
    let mut sums = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix(metric) else {
            continue;
        };
        let Some(labels) = rest.strip_prefix('{') else {
            continue;
        };
        let Some((labels, value)) = labels.split_once('}') else {
            continue;
        };
        let Some(member) = labels.split(',').find_map(|l| l.strip_prefix("member=\"")) else {
            continue;
        };
        let member = member.trim_end_matches('"');
        if let Some(except) = except
            && labels
                .split(',')
                .any(|l| l == format!("outcome=\"{except}\""))
        {
            continue;
        }
        if let Ok(value) = value.trim().parse::<f64>() {
            *sums.entry(member.to_owned()).or_default() += value;
        }
    }
    sums
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_every_outcome_per_member() {
        let text = "# TYPE infergate_member_requests counter
infergate_member_requests_total{member=\"m0\",outcome=\"answered\"} 10
infergate_member_requests_total{member=\"m1\",outcome=\"answered\"} 4
infergate_member_requests_total{outcome=\"failed\",member=\"m1\"} 3
infergate_member_requests_created{member=\"m1\"} 1.7e9
infergate_member_failovers_total{member=\"m1\"} 3
";
        let attempts = by_member(text, "infergate_member_requests_total", None);
        assert_eq!(attempts["m0"], 10.0);
        assert_eq!(attempts["m1"], 7.0);
        let unanswered = by_member(text, "infergate_member_requests_total", Some("answered"));
        assert_eq!(unanswered.get("m0"), None);
        assert_eq!(unanswered["m1"], 3.0);
        assert_eq!(
            by_member(text, "infergate_member_failovers_total", None)["m1"],
            3.0
        );
    }
}
