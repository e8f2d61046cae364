//! The tasks that keep each member's state current:
//!
//! - a member with `adminUrl`: its summary stream
//!   (`/global/summary/stream`), read line by line; when the stream cannot
//!   be opened, `/global/summary` polled at the heartbeat instead (the
//!   stream is tried again after a while); reconnects with back-off. A
//!   stream that sends nothing for longer than `unhealthyAfter` is given
//!   up (the health state machine has judged the silence already);
//! - every member: `GET /v1/models`, timed every
//!   [`GLOBAL_RTT_INTERVAL`] for the round trip that stands in for region
//!   proximity when there is no distance table; and every
//!   [`GLOBAL_PROBE_INTERVAL`] while the member is down for its failures,
//!   since it gets no requests that could bring it back;
//! - every member: the health tick, which takes a silent member down even
//!   when no request looks, logs the change and updates its gauge.
//!
//! Each task holds the gateway's state weakly and ends when it is gone
//! (or when its roster is replaced, which aborts it).

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use config::defaults::{
    GLOBAL_CONNECT_TIMEOUT, GLOBAL_HEALTH_TICK, GLOBAL_PROBE_INTERVAL, GLOBAL_RECONNECT_MAX,
    GLOBAL_RECONNECT_MIN, GLOBAL_RTT_INTERVAL, SUMMARY_HEARTBEAT,
};
use global::{LoadSummary, Verdict};
use tokio::task::JoinHandle;

use super::member::{Member, Outcome, noted};
use crate::state::State;

/// Polls made before the stream is tried again.
const POLLS_BEFORE_STREAM_RETRY: u32 = 20;

/// The client members are reached with: requests, summaries and probes.
pub fn client(idle: Duration) -> reqwest::Result<reqwest::Client> {
    reqwest::Client::builder()
        .connect_timeout(GLOBAL_CONNECT_TIMEOUT)
        .read_timeout(idle)
        .tcp_nodelay(true)
        .build()
}

/// The tasks of one roster. A summary stream that sends nothing for
/// `silence` (`unhealthyAfter`: the member counts as silent by then) is
/// given up and opened again.
pub fn spawn(
    state: &Weak<State>,
    members: &[Arc<Member>],
    client: &reqwest::Client,
    silence: Duration,
) -> Vec<JoinHandle<()>> {
    let mut tasks = vec![tokio::spawn(tick(state.clone(), members.to_vec()))];
    for m in members {
        if let Some(admin) = &m.spec.admin_url {
            let admin = admin.trim_end_matches('/').to_owned();
            tasks.push(tokio::spawn(follow(
                state.clone(),
                Arc::clone(m),
                client.clone(),
                admin,
                silence,
            )));
        }
        tasks.push(tokio::spawn(probe(
            state.clone(),
            Arc::clone(m),
            client.clone(),
        )));
    }
    tasks
}

async fn tick(state: Weak<State>, members: Vec<Arc<Member>>) {
    let mut interval = tokio::time::interval(GLOBAL_HEALTH_TICK);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        interval.tick().await;
        let Some(state) = state.upgrade() else { return };
        let now = Instant::now();
        for m in &members {
            let (verdict, transition) = m.verdict(now);
            noted(m, transition, &state.metrics);
            state
                .metrics
                .set_member_up(m.name(), !matches!(verdict, Verdict::Unhealthy { .. }));
        }
    }
}

/// Follow the member's summaries for as long as the roster lives.
async fn follow(
    state: Weak<State>,
    member: Arc<Member>,
    client: reqwest::Client,
    admin: String,
    silence: Duration,
) {
    let mut backoff = GLOBAL_RECONNECT_MIN;
    loop {
        if state.strong_count() == 0 {
            return;
        }
        let heard = match stream(&member, &client, &admin, silence).await {
            Ok(heard) => heard,
            // No stream: poll, then try the stream again.
            Err(e) => {
                tracing::debug!(member = member.name(), error = %e, "summary stream unavailable; polling");
                poll(&member, &client, &admin).await
            }
        };
        if heard {
            backoff = GLOBAL_RECONNECT_MIN;
        } else {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(GLOBAL_RECONNECT_MAX);
        }
    }
}

/// Read the stream until it ends, fails or goes silent. `Err` when it
/// could not be opened; `Ok(heard)` says whether any summary arrived.
async fn stream(
    member: &Member,
    client: &reqwest::Client,
    admin: &str,
    silence: Duration,
) -> Result<bool, String> {
    let url = format!("{admin}/global/summary/stream");
    let mut response = tokio::time::timeout(silence, client.get(&url).send())
        .await
        .map_err(|_| "no answer".to_owned())?
        .map_err(|e| e.to_string())?;
    if !response.status().is_success() {
        return Err(format!("status {}", response.status()));
    }
    let mut heard = false;
    let mut buffer: Vec<u8> = Vec::new();
    loop {
        let chunk = match tokio::time::timeout(silence, response.chunk()).await {
            Ok(Ok(Some(chunk))) => chunk,
            Ok(Ok(None)) | Ok(Err(_)) => return Ok(heard),
            Err(_) => {
                tracing::debug!(
                    member = member.name(),
                    "summary stream silent; reconnecting"
                );
                return Ok(heard);
            }
        };
        buffer.extend_from_slice(&chunk);
        while let Some(end) = buffer.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buffer.drain(..=end).collect();
            match serde_json::from_slice::<LoadSummary>(&line) {
                Ok(summary) => {
                    heard = true;
                    member.on_summary(summary, Instant::now());
                }
                Err(e) => {
                    tracing::debug!(member = member.name(), error = %e, "unreadable summary line");
                }
            }
        }
    }
}

/// Poll `/global/summary` at the heartbeat, a while; whether any arrived.
async fn poll(member: &Member, client: &reqwest::Client, admin: &str) -> bool {
    let url = format!("{admin}/global/summary");
    let mut heard = false;
    for _ in 0..POLLS_BEFORE_STREAM_RETRY {
        let got = async {
            let response = client
                .get(&url)
                .timeout(SUMMARY_HEARTBEAT * 2)
                .send()
                .await
                .ok()?;
            if !response.status().is_success() {
                return None;
            }
            response.json::<LoadSummary>().await.ok()
        }
        .await;
        match got {
            Some(summary) => {
                heard = true;
                member.on_summary(summary, Instant::now());
            }
            None => return heard,
        }
        tokio::time::sleep(SUMMARY_HEARTBEAT).await;
    }
    heard
}

/// Time the member's round trip now and then, and probe it while it is
/// down for its failures: only a probe's answer brings it back. A timed
/// request that fails says nothing the requests themselves do not.
async fn probe(state: Weak<State>, member: Arc<Member>, client: reqwest::Client) {
    let mut interval = tokio::time::interval(GLOBAL_PROBE_INTERVAL);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_timed: Option<Instant> = None;
    loop {
        interval.tick().await;
        if state.strong_count() == 0 {
            return;
        }
        let down = member.needs_probe();
        let timing_due = last_timed.is_none_or(|at| at.elapsed() >= GLOBAL_RTT_INTERVAL);
        if !down && !timing_due {
            continue;
        }
        let mut request = client
            .get(format!("{}/v1/models", member.base_url))
            .timeout(GLOBAL_PROBE_INTERVAL.max(GLOBAL_CONNECT_TIMEOUT));
        if let Some(auth) = &member.authorization {
            request = request.header(http::header::AUTHORIZATION, auth.clone());
        }
        let sent = Instant::now();
        let answered = match request.send().await {
            Ok(r) => !r.status().is_server_error(),
            Err(_) => false,
        };
        last_timed = Some(Instant::now());
        if answered {
            let rtt = sent.elapsed();
            member.on_round_trip(rtt);
            if let Some(state) = state.upgrade() {
                state.metrics.set_member_rtt(member.name(), rtt);
            }
        }
        if down {
            let outcome = if answered {
                Outcome::Answered
            } else {
                Outcome::Failed
            };
            let transition = member.on_outcome(outcome, Instant::now());
            if let Some(state) = state.upgrade() {
                noted(&member, transition, &state.metrics);
            }
        }
    }
}
