//! The end of a request: every side effect of it, in one place, run once
//! when its [`Record`] is dropped — at the end of the pipeline for an
//! answer the gateway made, at the end of the response body for one a
//! replica streamed (finished, failed, or cut because the client left).

use std::fmt;
use std::time::Duration;

use config::Priority;
use picker::TopScores;

use super::Record;
use crate::telemetry::decisions::Ended;
use crate::telemetry::response::Usage;
use crate::telemetry::trace_context::TraceId32;
use crate::telemetry::{ACCESS_TARGET, TenantLabel};

/// Status recorded when the client left before any response was produced
/// (nginx's convention; no response carries it).
const CLIENT_CLOSED: u16 = 499;

impl Drop for Record {
    fn drop(&mut self) {
        self.settle();
    }
}

/// How the request ended, as every settlement step reads it.
#[derive(Clone, Copy)]
struct End {
    status: u16,
    duration: Duration,
    usage: Usage,
}

impl Record {
    /// Settle the request: in this order, so the rate limits see the
    /// outcome before anything is logged.
    fn settle(&mut self) {
        let end = self.close();
        self.settle_limits();
        self.count(end);
        self.feed_decisions(end);
        self.tell_rewrite_and_mirror(end);
        self.finish_span(end);
        self.write_access_log(end);
    }

    /// The request's final status and duration; a request the client
    /// left is recorded as such.
    fn close(&mut self) -> End {
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
        End {
            status,
            duration,
            usage: self.usage.unwrap_or_default(),
        }
    }

    /// The rate-limit reservation, settled to what the request cost.
    fn settle_limits(&mut self) {
        if let Some(reservation) = self.reservation.take() {
            reservation.settle(self.outcome());
        }
    }

    /// The route's metrics.
    fn count(&self, end: End) {
        let Some(m) = &self.metrics else {
            return;
        };
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
        m.count_request(tenant, end.status);
        m.observe_duration(end.duration);
        m.count_retries(self.retries);
        m.count_tokens(tenant, end.usage.prompt_tokens, end.usage.completion_tokens);
        if self.slo.is_some() {
            // A request refused or failed misses its objectives.
            let (ttft, itl) = match end.status {
                200..=299 => self.slo_met(),
                _ => (Some(false), Some(false)),
            };
            let band = self.priority.unwrap_or_default();
            let slo = self.slo.unwrap_or_default();
            if slo.ttft.is_some() {
                m.count_slo(tenant, band, "ttft", ttft);
            }
            if slo.itl.is_some() {
                m.count_slo(tenant, band, "itl", itl);
            }
        }
        if let Some(reason) = self.refusal {
            m.count_refusal(reason);
        }
    }

    /// The fleet page's decision feed, when it sampled the request.
    fn feed_decisions(&mut self, end: End) {
        if let Some(feed) = self.feed.take() {
            feed.finish(self.ended(end.status, end.duration, end.usage));
        }
    }

    /// The rewrite that chose the model hears how its target answered
    /// (its guard's figures); a mirror's comparison gets the client's side.
    fn tell_rewrite_and_mirror(&self, end: End) {
        if let Some(served) = &self.rewrite {
            served.finish(end.status, self.ttft);
        }
        if let Some(mirror) = &self.mirror {
            mirror.primary.observe(
                end.status,
                self.ttft,
                end.duration,
                end.usage.completion_tokens,
            );
        }
    }

    /// The request's span gets its outcome before it closes.
    fn finish_span(&self, end: End) {
        let span = &self.span;
        if span.is_disabled() {
            return;
        }
        span.record("http.response.status_code", end.status);
        span.record("gen_ai.request.model", self.model.as_deref());
        span.record("infergate.tenant", self.tenant());
        span.record("infergate.pool", self.pool.as_deref());
        span.record("infergate.endpoint", self.endpoint.as_deref());
        span.record("infergate.retries", self.retries);
        if let Some(legs) = &self.legs {
            span.record("infergate.disaggregation", legs.outcome);
            span.record("infergate.prefill_endpoint", legs.prefill.as_deref());
        }
        if let Some(error) = &self.error {
            span.record("error.message", error.as_str());
        }
    }

    /// One access-log line per request.
    fn write_access_log(&self, end: End) {
        let End {
            status,
            duration,
            usage,
        } = end;
        tracing::info!(
            target: ACCESS_TARGET,
            parent: &self.span,
            request_id = self.request_id.to_str().unwrap_or("-"),
            tenant = self.tenant(),
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
            prefix_source = self.prefix_source.map(picker::PrefixSource::as_str),
            moved = (!self.moves.is_empty()).then(|| tracing::field::display(Moves(&self.moves))),
            disaggregation = self.legs.as_ref().map(|l| l.outcome),
            prefill = self.legs.as_ref().and_then(|l| l.prefill.as_deref()),
            uncached_tokens = self.legs.as_ref().map(|l| l.uncached_tokens),
            prefill_ms = self.ttft_split().map(|(prefill, _)| millis(prefill)),
            decode_ttft_ms = self.ttft_split().map(|(_, decode)| millis(decode)),
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
            moves: &self.moves,
            disaggregation: self.legs.as_ref().map(|l| l.outcome),
            prefill: self.legs.as_ref().and_then(|l| l.prefill.as_ref()),
            prefill_time: self.ttft_split().map(|(prefill, _)| prefill),
        }
    }
}

/// `10.0.0.1:8000 broken after 12 tokens, 10.0.0.2:8000 stalled after 40
/// tokens`: the replicas an answer moved off.
struct Moves<'a>(&'a [super::Move]);

impl fmt::Display for Moves<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, m) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{} {} after {} tokens", m.from, m.cause, m.tokens)?;
        }
        Ok(())
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
