//! The record stage: what happened to one request, counted in the metrics
//! and written once as an access-log line when the request is over.
//!
//! A [`Record`] travels with the request. When the answer is a gateway error
//! it is dropped at the end of the pipeline; when the answer is streamed
//! from a replica it moves into the response body and is dropped when the
//! stream ends, so TTFT, inter-token times and duration cover what the
//! client actually saw. The request's span lives in the record too, so a
//! trace covers the whole response.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use config::Priority;
use http::StatusCode;
use picker::TopScores;
use tokio::time::Instant;

use crate::error::ApiError;
use crate::rate_limits::{Outcome, Reservation};
use crate::route::rewrite::Served;
use crate::telemetry::decisions::{Ended, Pending};
use crate::telemetry::response::{EventClock, ResponseMeter, Usage};
use crate::telemetry::rollout::MirrorMetrics;
use crate::telemetry::trace_context::TraceId32;
use crate::telemetry::{ACCESS_TARGET, RouteMetrics, TenantLabel, refusal_reason};

/// Status recorded when the client left before any response was produced
/// (nginx's convention; no response carries it).
pub const CLIENT_CLOSED: u16 = 499;

/// Who a request came from, as the access log shows it.
#[derive(Debug)]
pub struct Caller {
    pub tenant: Arc<str>,
    /// Its `tenant` label on metrics.
    pub label: TenantLabel,
    /// The API key's `name`, when an API key with a name authenticated it.
    pub key: Option<Arc<str>>,
    /// The token's issuer, when a token authenticated it.
    pub issuer: Option<Arc<str>>,
}

#[derive(Debug)]
pub struct Record {
    /// Shares the bytes of the header it came from (or was sent back in).
    pub request_id: http::HeaderValue,
    /// The authenticated caller (tenant `anonymous` when authentication
    /// is off), once known.
    pub caller: Option<Caller>,
    pub model: Option<String>,
    pub pool: Option<Arc<str>>,
    pub endpoint: Option<Arc<str>>,
    /// The global member that answered (or was tried last).
    pub member: Option<Arc<str>>,
    pub status: u16,
    pub stream: bool,
    pub retries: u32,
    /// Winner's and runner-up's scores, when the pool scores replicas.
    pub decision: Option<TopScores>,
    /// Flow-control band of the request, once admission has judged it.
    pub priority: Option<Priority>,
    /// Time spent waiting in flow control (zero when admitted at once).
    pub queue_wait: Option<Duration>,
    /// Trace id of the context sent to the replica.
    pub trace_id: Option<u128>,
    /// Held on the rate limits until the request ends, then settled.
    pub reservation: Option<Reservation>,
    /// Some of the request reached a replica, which may have worked on it.
    pub sent: bool,
    /// Set when the fleet page's decision feed samples the request.
    pub feed: Option<Pending>,
    /// The rewrite that chose the model served, which hears how the
    /// answer went (its guard's figures).
    pub rewrite: Option<Served>,
    /// Set when a copy of the request went to a mirror: the client's
    /// answer is measured beside the copy's.
    pub mirror: Option<MirrorMetrics>,
    /// The route's metric handles; set once the request reached routing.
    metrics: Option<Arc<RouteMetrics>>,
    span: tracing::Span,
    start: Instant,
    /// Set for a successful response from a replica.
    meter: Option<ResponseMeter>,
    clock: EventClock,
    ttft: Option<Duration>,
    usage: Option<Usage>,
    refusal: Option<&'static str>,
    /// The response body reached its end.
    finished: bool,
    error: Option<String>,
    /// The replica answering, and when the request went to it: its speed
    /// per generated token is measured on the answer.
    answering: Option<(Arc<picker::Endpoint>, Instant)>,
    /// Stream events (tokens) passed on.
    events: u64,
}

impl Record {
    pub fn new(request_id: http::HeaderValue, start: Instant, span: tracing::Span) -> Self {
        Self {
            request_id,
            caller: None,
            model: None,
            pool: None,
            endpoint: None,
            member: None,
            status: 0,
            stream: false,
            retries: 0,
            decision: None,
            priority: None,
            queue_wait: None,
            trace_id: None,
            reservation: None,
            sent: false,
            feed: None,
            rewrite: None,
            mirror: None,
            metrics: None,
            span,
            start,
            meter: None,
            clock: EventClock::default(),
            ttft: None,
            usage: None,
            refusal: None,
            finished: false,
            error: None,
            answering: None,
            events: 0,
        }
    }

    /// Authentication found who the caller is.
    pub fn identified(&mut self, caller: Caller) {
        self.caller = Some(caller);
    }

    /// The request reached routing; `metrics` are its route's handles (the
    /// unrouted ones when no pool serves the model).
    pub fn routed(&mut self, metrics: Arc<RouteMetrics>) {
        self.metrics = Some(metrics);
    }

    /// Flow control let the request through after `waited`, or refused it
    /// when its wait expired (the longest waits belong in the histogram).
    pub fn waited(&mut self, band: Priority, waited: Duration) {
        self.priority = Some(band);
        self.queue_wait = Some(waited);
        if let Some(m) = &self.metrics {
            m.observe_queue_wait(band, waited);
        }
    }

    /// The gateway answers with `error` itself.
    pub fn refused(&mut self, error: &ApiError) {
        self.status = error.status.as_u16();
        self.refusal = Some(refusal_reason(error));
        self.on_error(&error.message);
    }

    /// The `x-ratelimit-*` headers of the request's reservation, if any.
    pub fn rate_headers(&self, headers: &mut http::HeaderMap) {
        if let Some(reservation) = &self.reservation {
            reservation.headers().apply(headers);
        }
    }

    /// What the request's tokens cost: what the replica reported; nothing
    /// when it never ran or answered with an error; what was reserved when
    /// it ran but its usage is unknown (a stream without usage, a client
    /// that left).
    fn outcome(&self) -> Outcome {
        let usage = self
            .usage
            .filter(|u| u.prompt_tokens.is_some() || u.completion_tokens.is_some());
        match (self.sent, usage) {
            (false, _) => Outcome::NotRun,
            (true, Some(u)) => Outcome::Used(
                u.prompt_tokens
                    .unwrap_or_default()
                    .saturating_add(u.completion_tokens.unwrap_or_default()),
            ),
            (true, None) if self.status >= 400 && self.meter.is_none() => Outcome::Used(0),
            (true, None) => Outcome::Unknown,
        }
    }

    /// A replica's response head arrived and is passed on.
    pub fn on_response(&mut self, status: StatusCode, headers: &http::HeaderMap) {
        self.status = status.as_u16();
        if status.is_success() {
            let sse = crate::headers::is_event_stream(headers);
            self.meter = Some(ResponseMeter::new(sse));
        }
    }

    /// `replica` answers the request, sent to it at `sent`.
    pub fn answering(&mut self, replica: Arc<picker::Endpoint>, sent: Instant) {
        self.answering = Some((replica, sent));
    }

    pub fn on_data(&mut self, data: &[u8]) {
        let Some(meter) = &mut self.meter else {
            return;
        };
        let events = meter.on_frame(data).count;
        if events == 0 {
            return;
        }
        self.events += u64::from(events);
        let now = Instant::now();
        let metrics = self.metrics.as_deref();
        self.clock.tick(events, now, |gap| {
            if let Some(m) = metrics {
                m.observe_inter_token(gap);
            }
        });
        if self.ttft.is_none() {
            let ttft = now.saturating_duration_since(self.start);
            self.ttft = Some(ttft);
            if let Some(m) = metrics {
                m.observe_ttft(ttft);
            }
        }
    }

    pub fn on_error(&mut self, error: &str) {
        self.error.get_or_insert_with(|| error.to_owned());
    }

    /// The body is complete; may be called more than once.
    pub fn on_end(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        let Some(meter) = &self.meter else {
            return;
        };
        // A whole body is the first token of a non-streamed answer.
        if !meter.is_sse() && self.ttft.is_none() {
            let ttft = self.start.elapsed();
            self.ttft = Some(ttft);
            if let Some(m) = &self.metrics {
                m.observe_ttft(ttft);
            }
        }
        self.usage = meter.usage();
        self.measure_speed();
    }

    /// Tell the picker how fast the replica answered.
    fn measure_speed(&self) {
        let Some((replica, sent)) = &self.answering else {
            return;
        };
        let tokens = self
            .usage
            .and_then(|u| u.completion_tokens)
            .unwrap_or(self.events);
        replica.observe_answer(sent.elapsed().as_secs_f64(), tokens);
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        let duration = self.start.elapsed();
        let status = match self.status {
            0 => {
                self.on_error("the client closed the request before the response started");
                CLIENT_CLOSED
            }
            s => s,
        };
        if self.meter.is_some() && !self.finished && self.error.is_none() {
            self.on_error("the client closed the connection before the response ended");
        }
        if let Some(reservation) = self.reservation.take() {
            reservation.settle(self.outcome());
        }
        let usage = self.usage.unwrap_or_default();
        if let Some(m) = &self.metrics {
            // Routing comes after authentication: a routed request has a
            // caller.
            let anonymous;
            let tenant = match &self.caller {
                Some(c) => &c.label,
                None => {
                    anonymous = TenantLabel::new(config::defaults::ANONYMOUS_TENANT);
                    &anonymous
                }
            };
            m.count_request(tenant, status);
            m.observe_duration(duration);
            m.count_retries(self.retries);
            m.count_tokens(tenant, usage.prompt_tokens, usage.completion_tokens);
            if let Some(reason) = self.refusal {
                m.count_refusal(reason);
            }
        }
        if let Some(feed) = self.feed.take() {
            feed.finish(self.ended(status, duration, usage));
        }
        if let Some(served) = &self.rewrite {
            served.finish(status, self.ttft);
        }
        if let Some(mirror) = &self.mirror {
            mirror
                .primary
                .observe(status, self.ttft, duration, usage.completion_tokens);
        }
        let span = &self.span;
        if !span.is_disabled() {
            span.record("http.response.status_code", status);
            span.record("gen_ai.request.model", self.model.as_deref());
            span.record("infergate.tenant", self.caller.as_ref().map(|c| &*c.tenant));
            span.record("infergate.pool", self.pool.as_deref());
            span.record("infergate.endpoint", self.endpoint.as_deref());
            span.record("infergate.retries", self.retries);
            if let Some(error) = &self.error {
                span.record("error.message", error.as_str());
            }
        }
        tracing::info!(
            target: ACCESS_TARGET,
            parent: span,
            request_id = self.request_id.to_str().unwrap_or("-"),
            tenant = self.caller.as_ref().map(|c| &*c.tenant),
            key = self.caller.as_ref().and_then(|c| c.key.as_deref()),
            issuer = self.caller.as_ref().and_then(|c| c.issuer.as_deref()),
            model = self.model.as_deref(),
            served_model = self.rewrite.as_ref().map(|r| &*r.model),
            rewrite = self.rewrite.as_ref().map(|r| r.rewrite.name.as_str()),
            pool = self.pool.as_deref(),
            endpoint = self.endpoint.as_deref(),
            member = self.member.as_deref(),
            status,
            stream = self.stream,
            priority = self.priority.map(Priority::as_str),
            ttft_ms = self.ttft.map(millis),
            duration_ms = millis(duration),
            prompt_tokens = usage.prompt_tokens,
            completion_tokens = usage.completion_tokens,
            queue_wait_ms = self.queue_wait.map(millis),
            retries = self.retries,
            decision = self.decision.map(DecisionSummary).map(tracing::field::display),
            trace_id = self.trace_id.map(TraceId32).map(tracing::field::display),
            error = self.error.as_deref(),
        );
    }
}

impl Record {
    /// What the decision feed keeps of the request when it ends.
    fn ended(&self, status: u16, duration: Duration, usage: Usage) -> Ended<'_> {
        Ended {
            request_id: self.request_id.to_str().unwrap_or("-"),
            tenant: self.caller.as_ref().map(|c| &*c.tenant),
            model: self.model.as_deref(),
            pool: self.pool.as_ref(),
            endpoint: self.endpoint.as_ref(),
            status,
            stream: self.stream,
            band: self.priority,
            queue_wait: self.queue_wait,
            ttft: self.ttft,
            duration,
            retries: self.retries,
            top: self.decision,
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            trace_id: self.trace_id,
            error: self.error.as_deref(),
        }
    }
}

fn millis(d: Duration) -> f64 {
    // Microsecond precision: enough for latencies, and no float noise.
    d.as_micros() as f64 / 1e3
}

/// `0.812 vs 0.640`: the winner's score and the runner-up's.
#[derive(Debug, Clone, Copy)]
struct DecisionSummary(TopScores);

impl fmt::Display for DecisionSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0.runner_up {
            Some(r) => write!(f, "{:.3} vs {r:.3}", self.0.winner),
            None => write!(f, "{:.3} alone", self.0.winner),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decision_summary() {
        let s = |winner, runner_up| DecisionSummary(TopScores { winner, runner_up }).to_string();
        assert_eq!(s(0.8126, Some(0.64)), "0.813 vs 0.640");
        assert_eq!(s(1.0, None), "1.000 alone");
    }
}
