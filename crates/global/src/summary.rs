//! The load summary: what a gateway publishes about itself for global
//! routers, one entry per model it serves. Sent as JSON
//! (`GET /global/summary`) and as a stream of JSON lines
//! (`GET /global/summary/stream`), one whole summary a line.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A gateway's load, per model, at one moment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadSummary {
    /// Rises by one whenever anything in `models` changes (never for a
    /// new timestamp alone), so a reader can tell news from a heartbeat.
    /// Starts at 1 when the gateway starts; a lower number than the last
    /// one seen means the gateway restarted.
    pub generation: u64,
    /// When the summary was made, in milliseconds since the Unix epoch.
    pub at_unix_ms: u64,
    /// Model or adapter name, as clients write it → its load.
    pub models: BTreeMap<String, ModelLoad>,
}

/// The load of the pool that serves one model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelLoad {
    /// The local pool that serves the model.
    pub pool: String,
    /// Replicas a request could be sent to now.
    pub ready_replicas: u32,
    /// Replicas in the pool, ready or not.
    pub replicas: u32,
    /// Mean free share of the KV cache over the ready replicas, 0 to 1;
    /// absent when no ready replica reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_headroom: Option<f64>,
    /// Requests waiting: in the replicas' queues and in the gateway's
    /// flow-control queue.
    pub queue_depth: u64,
    /// Requests the gateway has sent to the pool's replicas and not yet
    /// seen end.
    pub in_flight: u64,
    /// Every ready replica is saturated: a new request would queue or be
    /// refused.
    pub saturated: bool,
    /// The pool is cold: no replica is ready, and a request sent here
    /// waits for one (while the pool wakes, or an autoscaler brings one).
    /// Global routers send elsewhere meanwhile when they can.
    #[serde(default)]
    pub cold: bool,
    /// Share of the recent answers (about the last ten seconds) that were
    /// 5xx, and that were 429; 0 when there were none.
    pub error_rate: f64,
    pub throttle_rate: f64,
}

impl LoadSummary {
    /// One line of the stream: the summary as JSON and a newline.
    pub fn to_line(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).unwrap_or_default();
        line.push(b'\n');
        line
    }
}

impl ModelLoad {
    /// Requests waiting per ready replica (all of them when none is
    /// ready): how deep a new request would queue.
    pub fn queue_per_replica(&self) -> f64 {
        self.queue_depth as f64 / f64::from(self.ready_replicas.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_reads_back_as_the_summary() {
        let summary = LoadSummary {
            generation: 7,
            at_unix_ms: 1_700_000_000_000,
            models: BTreeMap::from([(
                "llama".to_owned(),
                ModelLoad {
                    pool: "p".into(),
                    ready_replicas: 2,
                    replicas: 3,
                    kv_headroom: Some(0.25),
                    queue_depth: 4,
                    in_flight: 9,
                    saturated: false,
                    cold: false,
                    error_rate: 0.0,
                    throttle_rate: 0.5,
                },
            )]),
        };
        let line = summary.to_line();
        assert_eq!(line.last(), Some(&b'\n'));
        assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1);
        let back: LoadSummary = serde_json::from_slice(&line).unwrap();
        assert_eq!(back, summary);
        let text = String::from_utf8(line).unwrap();
        assert!(text.contains("\"atUnixMs\":1700000000000"), "{text}");
        assert!(text.contains("\"kvHeadroom\":0.25"), "{text}");
        assert_eq!(back.models["llama"].queue_per_replica(), 2.0);
    }
}
