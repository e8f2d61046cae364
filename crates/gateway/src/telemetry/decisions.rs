//! Recent routing decisions, for the fleet page's live feed
//! (`/debug/decisions`): a bounded ring of what happened to sampled
//! requests, filled only while someone is watching.
//!
//! The sampling rule, and why:
//!
//! - A request is sampled only if someone asked for the feed in the last
//!   [`WATCH_FOR`]. Nobody watching costs one relaxed atomic load per
//!   request and nothing else: no lock, no allocation, no extra scoring.
//! - While watched, at most [`PER_SECOND`] requests are sampled per second
//!   (the first ones of each second). A person reads a handful of lines a
//!   second, and the cap bounds what watching costs a busy gateway: a
//!   sampled request has every candidate scored for the record (as the
//!   decision log does) and takes a short lock to be pushed.
//! - The ring keeps the last [`CAPACITY`] sampled requests, so a request
//!   id the page showed can still be looked up for at least
//!   `CAPACITY / PER_SECOND` seconds, and memory stays bounded: each entry
//!   keeps at most [`CANDIDATES_KEPT`] candidates.
//!
//! A request is sampled when it starts (so its pick is explained) and
//! pushed when its record drops, with everything the record knows by then.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use config::Priority;
use parking_lot::Mutex;
use picker::{Decision, Scorer, TopScores};
use serde_json::{Map, Value, json};
use tokio::time::Instant;

/// Sampled requests kept.
pub const CAPACITY: usize = 500;
/// Requests sampled per second at most, while someone watches.
pub const PER_SECOND: u32 = 50;
/// How long one look at the feed keeps it recording.
pub const WATCH_FOR: Duration = Duration::from_secs(30);
/// Candidates kept per decision, best first (the rest are counted).
pub const CANDIDATES_KEPT: usize = 8;

/// The ring of recent decisions, shared by every request of the gateway.
pub struct DecisionFeed {
    /// Times are kept as nanoseconds after this instant.
    base: Instant,
    /// Until when (nanoseconds after `base`) requests are sampled; 0 when
    /// nobody ever asked.
    watched_until: AtomicU64,
    /// The second (after `base`) the per-second cap counts for, in the
    /// high 32 bits, and how many requests it sampled, in the low 32.
    budget: AtomicU64,
    ring: Mutex<Ring>,
}

struct Ring {
    entries: VecDeque<Arc<Entry>>,
    /// Sequence number of the next entry; the first is 1.
    next: u64,
}

impl Default for DecisionFeed {
    fn default() -> Self {
        Self::new()
    }
}

impl DecisionFeed {
    pub fn new() -> Self {
        Self {
            base: Instant::now(),
            watched_until: AtomicU64::new(0),
            budget: AtomicU64::new(0),
            ring: Mutex::new(Ring {
                entries: VecDeque::with_capacity(CAPACITY),
                next: 1,
            }),
        }
    }

    fn nanos(&self, at: Instant) -> u64 {
        u64::try_from(at.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Someone looked at the feed at `now`: record requests that start in
    /// the next [`WATCH_FOR`].
    pub fn watch(&self, now: Instant) {
        let until = self.nanos(now).saturating_add(WATCH_FOR.as_nanos() as u64);
        self.watched_until.fetch_max(until, Ordering::Relaxed);
    }

    /// Whether a request that started at `start` is recorded; `Some` holds
    /// its place until the request ends.
    pub fn sample(self: &Arc<Self>, start: Instant) -> Option<Pending> {
        let at = self.nanos(start);
        if at >= self.watched_until.load(Ordering::Relaxed) {
            return None;
        }
        self.take_budget(at / 1_000_000_000).then(|| Pending {
            feed: Arc::clone(self),
            picked: None,
        })
    }

    /// One of this second's [`PER_SECOND`] places, if any is left. A
    /// request that started a little before the newest one seen counts
    /// against the newest second.
    fn take_budget(&self, second: u64) -> bool {
        let mut current = self.budget.load(Ordering::Relaxed);
        loop {
            let (counted, taken) = (current >> 32, current & u64::from(u32::MAX));
            let next = if counted >= second {
                if taken >= u64::from(PER_SECOND) {
                    return false;
                }
                current + 1
            } else {
                (second << 32) | 1
            };
            match self.budget.compare_exchange_weak(
                current,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(seen) => current = seen,
            }
        }
    }

    fn push(&self, mut entry: Entry) {
        let mut ring = self.ring.lock();
        entry.seq = ring.next;
        ring.next += 1;
        if ring.entries.len() == CAPACITY {
            ring.entries.pop_front();
        }
        ring.entries.push_back(Arc::new(entry));
    }

    /// Entries after sequence number `after` that `keep` accepts, oldest
    /// first, at most the `limit` newest of them; and the sequence number
    /// to ask after next time.
    pub fn after(
        &self,
        after: u64,
        keep: impl Fn(&Entry) -> bool,
        limit: usize,
    ) -> (Vec<Arc<Entry>>, u64) {
        let ring = self.ring.lock();
        let newest = ring.next - 1;
        let mut found: Vec<Arc<Entry>> = ring
            .entries
            .iter()
            .rev()
            .take_while(|e| e.seq > after)
            .filter(|e| keep(e))
            .take(limit)
            .cloned()
            .collect();
        drop(ring);
        found.reverse();
        (found, newest)
    }

    /// The newest entry kept for `request_id`.
    pub fn find(&self, request_id: &str) -> Option<Arc<Entry>> {
        let ring = self.ring.lock();
        ring.entries
            .iter()
            .rev()
            .find(|e| e.request_id == request_id)
            .cloned()
    }
}

/// A sampled request on its way: what its pick was, until it ends.
#[derive(Debug)]
pub struct Pending {
    feed: Arc<DecisionFeed>,
    picked: Option<Picked>,
}

impl std::fmt::Debug for DecisionFeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecisionFeed").finish_non_exhaustive()
    }
}

/// The last pick made for a request (a retry picks again).
#[derive(Debug, Clone)]
struct Picked {
    fallback: bool,
    policy: &'static str,
    /// Best first, at most [`CANDIDATES_KEPT`].
    candidates: Vec<Candidate>,
    /// Candidates that were scored, kept or not.
    scored: usize,
}

#[derive(Debug, Clone)]
struct Candidate {
    address: Arc<str>,
    total: f64,
    parts: [f64; Scorer::COUNT],
}

impl Pending {
    /// The picker chose `decision` for the request (explained: its
    /// candidates' scores are filled in for sampled requests).
    pub fn picked(&mut self, decision: &Decision) {
        self.picked = Some(Picked {
            fallback: decision.fallback,
            policy: decision.policy.name(),
            candidates: decision
                .scores
                .iter()
                .take(CANDIDATES_KEPT)
                .map(|c| Candidate {
                    address: Arc::clone(&c.endpoint.addr),
                    total: c.total,
                    parts: c.parts,
                })
                .collect(),
            scored: decision.scores.len(),
        });
    }

    /// The request is over: keep what happened to it.
    pub fn finish(self, ended: Ended<'_>) {
        let entry = Entry {
            seq: 0,
            at: SystemTime::now(),
            request_id: ended.request_id.to_owned(),
            tenant: ended.tenant.map(str::to_owned),
            model: ended.model.map(str::to_owned),
            pool: ended.pool.cloned(),
            endpoint: ended.endpoint.cloned(),
            status: ended.status,
            stream: ended.stream,
            band: ended.band,
            queue_wait: ended.queue_wait,
            ttft: ended.ttft,
            duration: ended.duration,
            retries: ended.retries,
            top: ended.top,
            prompt_tokens: ended.prompt_tokens,
            completion_tokens: ended.completion_tokens,
            trace_id: ended.trace_id,
            error: ended.error.map(str::to_owned),
            moves: ended.moves.to_vec(),
            picked: self.picked,
            disaggregation: ended.disaggregation,
            prefill: ended.prefill.cloned(),
            prefill_time: ended.prefill_time,
        };
        self.feed.push(entry);
    }
}

/// The answer left a replica that failed it.
#[derive(Debug, Clone)]
pub struct Move {
    pub from: Arc<str>,
    /// Why, as `infergate_migrations_total` names it.
    pub cause: &'static str,
    /// Tokens the client had by then.
    pub tokens: u64,
}

/// What a request's record knows when it ends.
pub struct Ended<'a> {
    pub request_id: &'a str,
    pub tenant: Option<&'a str>,
    pub model: Option<&'a str>,
    pub pool: Option<&'a Arc<str>>,
    pub endpoint: Option<&'a Arc<str>>,
    pub status: u16,
    pub stream: bool,
    pub band: Option<Priority>,
    pub queue_wait: Option<Duration>,
    pub ttft: Option<Duration>,
    pub duration: Duration,
    pub retries: u32,
    pub top: Option<TopScores>,
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub trace_id: Option<u128>,
    pub error: Option<&'a str>,
    /// The replicas the answer moved off, in order.
    pub moves: &'a [Move],
    /// For a disaggregated pool: what became of the prefill leg, its
    /// replica, and how long it took.
    pub disaggregation: Option<&'static str>,
    pub prefill: Option<&'a Arc<str>>,
    pub prefill_time: Option<Duration>,
}

/// One sampled request, as kept.
#[derive(Debug)]
pub struct Entry {
    pub seq: u64,
    at: SystemTime,
    pub request_id: String,
    tenant: Option<String>,
    pub model: Option<String>,
    pub pool: Option<Arc<str>>,
    endpoint: Option<Arc<str>>,
    status: u16,
    stream: bool,
    band: Option<Priority>,
    queue_wait: Option<Duration>,
    ttft: Option<Duration>,
    duration: Duration,
    retries: u32,
    top: Option<TopScores>,
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    trace_id: Option<u128>,
    error: Option<String>,
    moves: Vec<Move>,
    picked: Option<Picked>,
    disaggregation: Option<&'static str>,
    prefill: Option<Arc<str>>,
    prefill_time: Option<Duration>,
}

fn millis(d: Duration) -> f64 {
    d.as_micros() as f64 / 1e3
}

/// A scorer's name as `/debug/pools` writes it (`queue`, `kv-cache`, …).
pub fn scorer_name(scorer: Scorer) -> String {
    serde_json::to_value(scorer)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| scorer.label().to_owned())
}

impl Entry {
    /// The replica that scored best after the chosen one.
    fn runner_up(&self) -> Option<&Arc<str>> {
        let chosen = self.endpoint.as_deref();
        self.picked.as_ref().and_then(|p| {
            p.candidates
                .iter()
                .find(|c| Some(&*c.address) != chosen)
                .map(|c| &c.address)
        })
    }

    /// The line the feed shows.
    pub fn summary_json(&self) -> Value {
        let at_ms = self
            .at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        json!({
            "seq": self.seq,
            "atMs": at_ms,
            "requestId": self.request_id,
            "tenant": self.tenant,
            "model": self.model,
            "pool": self.pool.as_deref(),
            "band": self.band.map(Priority::as_str),
            "endpoint": self.endpoint.as_deref(),
            "runnerUp": self.runner_up().map(|a| &**a),
            "score": self.top.map(|t| t.winner),
            "runnerUpScore": self.top.and_then(|t| t.runner_up),
            "gap": self.top.and_then(|t| t.runner_up.map(|r| t.winner - r)),
            "fallback": self.picked.as_ref().is_some_and(|p| p.fallback),
            "status": self.status,
            "queueWaitMs": self.queue_wait.map(millis),
            "ttftMs": self.ttft.map(millis),
            "durationMs": millis(self.duration),
            "retries": self.retries,
            "moved": self.moves.iter().map(|m| json!({
                "from": &*m.from,
                "reason": m.cause,
                "tokens": m.tokens,
            })).collect::<Vec<_>>(),
            "error": self.error,
            "disaggregation": self.disaggregation,
            "prefillEndpoint": self.prefill.as_deref(),
            "prefillMs": self.prefill_time.map(millis),
        })
    }

    /// Everything kept: the summary, and the pick's candidates with each
    /// scorer's part.
    pub fn full_json(&self) -> Value {
        let mut v = self.summary_json();
        let candidates: Vec<Value> = self
            .picked
            .iter()
            .flat_map(|p| &p.candidates)
            .map(|c| {
                let parts: Map<String, Value> = Scorer::ALL
                    .iter()
                    .map(|s| (scorer_name(*s), json!(c.parts[*s as usize])))
                    .collect();
                json!({"address": &*c.address, "total": c.total, "parts": parts})
            })
            .collect();
        let extra = json!({
            "stream": self.stream,
            "policy": self.picked.as_ref().map(|p| p.policy),
            "promptTokens": self.prompt_tokens,
            "completionTokens": self.completion_tokens,
            "traceId": self.trace_id.map(|t| format!("{t:032x}")),
            "candidatesScored": self.picked.as_ref().map_or(0, |p| p.scored),
            "candidates": candidates,
        });
        if let (Value::Object(v), Value::Object(extra)) = (&mut v, extra) {
            v.extend(extra);
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ended(id: &str) -> Ended<'_> {
        Ended {
            request_id: id,
            tenant: None,
            model: Some("m"),
            pool: None,
            endpoint: None,
            status: 200,
            stream: false,
            band: Some(Priority::Standard),
            queue_wait: Some(Duration::ZERO),
            ttft: Some(Duration::from_millis(12)),
            duration: Duration::from_millis(40),
            retries: 0,
            top: Some(TopScores {
                winner: 0.9,
                runner_up: Some(0.6),
            }),
            prompt_tokens: None,
            completion_tokens: None,
            trace_id: Some(1),
            error: None,
            moves: &[],
            disaggregation: None,
            prefill: None,
            prefill_time: None,
        }
    }

    fn ids(entries: &[Arc<Entry>]) -> Vec<&str> {
        entries.iter().map(|e| e.request_id.as_str()).collect()
    }

    #[test]
    fn nothing_is_sampled_until_someone_watches_and_after_they_stop() {
        let feed = Arc::new(DecisionFeed::new());
        let t0 = feed.base;
        assert!(feed.sample(t0).is_none());
        assert!(feed.sample(t0 + Duration::from_secs(5)).is_none());
        feed.watch(t0 + Duration::from_secs(10));
        assert!(feed.sample(t0 + Duration::from_secs(11)).is_some());
        assert!(
            feed.sample(t0 + Duration::from_secs(10) + WATCH_FOR)
                .is_none()
        );
    }

    #[test]
    fn at_most_per_second_requests_are_sampled_each_second() {
        let feed = Arc::new(DecisionFeed::new());
        let t0 = feed.base;
        feed.watch(t0);
        let sampled = |at: Instant| (0..200).filter(|_| feed.sample(at).is_some()).count();
        assert_eq!(sampled(t0), PER_SECOND as usize);
        assert_eq!(sampled(t0 + Duration::from_millis(900)), 0);
        // A new second, a new budget; a late request of the old second
        // counts against the new one.
        assert_eq!(
            sampled(t0 + Duration::from_millis(1000)),
            PER_SECOND as usize
        );
        assert_eq!(sampled(t0 + Duration::from_millis(999)), 0);
    }

    #[test]
    fn the_ring_keeps_the_newest_and_reads_after_a_sequence_number() {
        let feed = Arc::new(DecisionFeed::new());
        for i in 0..CAPACITY + 7 {
            let pending = Pending {
                feed: Arc::clone(&feed),
                picked: None,
            };
            pending.finish(ended(&format!("r{i}")));
        }
        let (all, newest) = feed.after(0, |_| true, usize::MAX);
        assert_eq!(all.len(), CAPACITY);
        assert_eq!(newest, (CAPACITY + 7) as u64);
        assert_eq!(all[0].request_id, "r7");
        assert_eq!(all.last().unwrap().request_id, format!("r{}", CAPACITY + 6));

        let (tail, _) = feed.after(newest - 2, |_| true, usize::MAX);
        assert_eq!(
            ids(&tail),
            [format!("r{}", CAPACITY + 5), format!("r{}", CAPACITY + 6)]
        );
        let (limited, _) = feed.after(0, |_| true, 3);
        assert_eq!(limited.len(), 3);
        assert_eq!(limited[2].request_id, format!("r{}", CAPACITY + 6));
        let (none, same) = feed.after(newest, |_| true, 10);
        assert!(none.is_empty());
        assert_eq!(same, newest);
        let (odd, _) = feed.after(0, |e| e.seq % 2 == 1, 2);
        assert!(odd.iter().all(|e| e.seq % 2 == 1));

        assert!(feed.find("r3").is_none(), "pushed out of the ring");
        assert_eq!(feed.find("r100").unwrap().request_id, "r100");
    }

    #[test]
    fn a_record_names_the_runner_up_and_keeps_the_best_candidates() {
        let feed = Arc::new(DecisionFeed::new());
        let scores: Vec<picker::CandidateScore> = (0..12)
            .map(|i| picker::CandidateScore {
                endpoint: picker::Endpoint::new(i, format!("10.0.0.{i}:8000")),
                total: 1.0 - i as f64 / 20.0,
                parts: [1.0, 0.5, 1.0, 0.0, 1.0, 1.0, 1.0],
            })
            .collect();
        let decision = Decision {
            endpoint: Arc::clone(&scores[0].endpoint),
            policy: picker::Policy::Scored,
            fallback: false,
            top: Some(TopScores {
                winner: 1.0,
                runner_up: Some(0.95),
            }),
            scores,
            estimated_tokens: 1,
            prefix_source: picker::PrefixSource::Approximate,
            latency: None,
        };
        let mut pending = Pending {
            feed: Arc::clone(&feed),
            picked: None,
        };
        pending.picked(&decision);
        let chosen: Arc<str> = Arc::clone(&decision.endpoint.addr);
        let moves = [Move {
            from: Arc::from("10.0.0.9:8000"),
            cause: "broken",
            tokens: 7,
        }];
        pending.finish(Ended {
            endpoint: Some(&chosen),
            moves: &moves,
            ..ended("x")
        });
        let entry = feed.find("x").unwrap();
        let summary = entry.summary_json();
        assert_eq!(summary["endpoint"], "10.0.0.0:8000");
        assert_eq!(summary["runnerUp"], "10.0.0.1:8000");
        assert!((summary["gap"].as_f64().unwrap() - 0.3).abs() < 1e-9);
        assert_eq!(
            summary["moved"],
            json!([{"from": "10.0.0.9:8000", "reason": "broken", "tokens": 7}])
        );
        let full = entry.full_json();
        assert_eq!(
            full["candidates"].as_array().unwrap().len(),
            CANDIDATES_KEPT
        );
        assert_eq!(full["candidatesScored"], 12);
        assert_eq!(full["candidates"][0]["parts"]["kv-cache"], 0.5);
        assert_eq!(full["traceId"], "00000000000000000000000000000001");
        assert_eq!(full["policy"], "scored");
    }
}
