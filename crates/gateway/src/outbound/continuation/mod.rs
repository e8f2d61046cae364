//! Mid-stream continuation: when the replica streaming an answer breaks,
//! stalls past the pool's idle limit, or is evacuated, the rest of the
//! answer is asked of another replica and the client's one stream goes on.
//!
//! The client's stream is relayed event by event ([`Transcript`]): only
//! complete events reach the client, so a replica dying mid-event leaves
//! nothing half-sent, and the transcript holds exactly the text the client
//! has. The continuation is a new request ([`request`]): the conversation
//! with that text as the assistant's final message to continue (chat), or
//! the prompt followed by it (completions), with `max_tokens` less what
//! was generated. It goes through the picker like any request (prefix
//! affinity favours a replica that holds the prompt), skipping the
//! replicas that failed it; the tenant's limits were charged for the whole
//! answer when it was admitted, and are settled once, to the whole
//! answer's usage. Its events are stamped with the first part's `id`,
//! `created` and `model`, its role-only opening is dropped, and its usage
//! is made the whole answer's.

mod not_continued;
mod request;
mod transcript;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde_json::Value;
use tokio::time::Instant;

pub use not_continued::NotContinued;
pub use request::Api;
use request::Next;
pub use transcript::Transcript;

use crate::error::ApiError;
use crate::flow::{Admitted, OwnedPick, Ticket};
use crate::generation::pool::{Continuation as Settings, Pool};
use crate::headers;
use crate::inbound::server::WorkerId;
use crate::outbound::KeptRequest;
use crate::outbound::connections;
use crate::outbound::sse::EventBuffer;

/// Why an answer moved to another replica: `reason` of
/// `infergate_migrations_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// The replica's connection broke.
    Broken,
    /// The replica sent nothing for the idle limit.
    Stalled,
    /// The replica is being drained with evacuation.
    Evacuated,
    /// Before answering, the replica refused what another may serve.
    NotHere,
}

impl Cause {
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Broken => "broken",
            Cause::Stalled => "stalled",
            Cause::Evacuated => "evacuated",
            Cause::NotHere => "not_here",
        }
    }
}

/// What became of an answer whose replica failed it: `outcome` of
/// `infergate_migrations_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Another replica generates the rest.
    Continued,
    /// Nothing had been generated: another replica got the request again.
    Resent,
    /// Only the answer's end was missing; the gateway sent it.
    Completed,
    NotContinued,
    /// No replica could take the continuation.
    Failed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Continued => "continued",
            Outcome::Resent => "resent",
            Outcome::Completed => "completed",
            Outcome::NotContinued => "not_continued",
            Outcome::Failed => "failed",
        }
    }
}

/// What sending a continuation needs, kept from the request's stages.
pub struct Resend {
    pub pool: Arc<Pool>,
    pub worker: WorkerId,
    pub ticket: Ticket,
    pub pick: OwnedPick,
    pub request: KeptRequest,
    /// The body the first replica was sent.
    pub body: Bytes,
    pub api: Api,
    pub first_byte_timeout: Duration,
}

/// A continuation that reached a replica and is streaming.
pub struct Continued {
    pub answer: connections::Response,
    pub admitted: Admitted,
    pub sent_at: Instant,
}

/// How continuing went, when it did not.
pub enum Stopped {
    /// The answer ended before the replica failed: only its end is missing.
    Complete,
    NotContinued(NotContinued),
    /// No replica could take the continuation, or the one that took it
    /// refused it.
    Failed(ApiError),
}

/// The continuable stream's state in the response body.
pub struct Relay {
    pub transcript: Transcript,
    pub events: EventBuffer,
    pub resend: Arc<Resend>,
    /// Replicas that had the request, by index.
    pub tried: Vec<usize>,
    pub continuations: u32,
    pub settings: Settings,
    /// Why the answer last moved.
    pub last_cause: Option<Cause>,
}

impl Relay {
    pub fn new(resend: Resend, settings: Settings, first: usize) -> Self {
        Self {
            transcript: Transcript::new(settings.max_text_bytes),
            events: EventBuffer::default(),
            resend: Arc::new(resend),
            tried: vec![first],
            continuations: 0,
            settings,
            last_cause: None,
        }
    }

    /// No event waits for its end.
    pub fn is_idle(&self) -> bool {
        self.events.is_empty()
    }

    /// The answer's first event has reached the client.
    pub fn started(&self) -> bool {
        self.transcript.started()
    }

    /// Count what became of an answer that moved for `cause`.
    pub fn count(&self, cause: Option<Cause>, outcome: Outcome) {
        let reason = cause.unwrap_or(Cause::Broken).as_str();
        self.resend
            .pool
            .metrics()
            .count_migration(reason, outcome.as_str());
    }

    /// The events that end an answer that had every token but its end.
    pub fn ending(&self) -> Bytes {
        self.transcript.ending(self.resend.api == Api::Chat)
    }

    /// The complete events in `data`, as the client gets them.
    pub fn relay(&mut self, data: &[u8]) -> Option<Bytes> {
        let events = self.events.push(data)?;
        Some(self.transcript.relay(events))
    }

    /// The request for the rest of the answer, or why there is none.
    pub fn next_request(&mut self) -> Result<Bytes, Stopped> {
        // An event the replica left half-sent never reached the client.
        let _ = self.events.take_rest();
        match self.transcript.needs_continuation() {
            Ok(false) => return Err(Stopped::Complete),
            Ok(true) => {}
            Err(why) => return Err(Stopped::NotContinued(why)),
        }
        if self.continuations >= self.settings.max_attempts {
            let detail = format!(
                "the answer was continued {} times already",
                self.continuations
            );
            return Err(Stopped::Failed(ApiError::upstream_failed(
                self.resend.pool.name(),
                &detail,
            )));
        }
        let body: Value = serde_json::from_slice(&self.resend.body)
            .map_err(|_| Stopped::NotContinued(NotContinued::Unreadable))?;
        let engine = self.resend.pool.engine();
        match request::continuation(&body, self.resend.api, engine, &self.transcript) {
            Ok(Next::Continue(body)) => Ok(body),
            Ok(Next::Complete) => Err(Stopped::Complete),
            Err(why) => Err(Stopped::NotContinued(why)),
        }
    }
}

/// Whether a request may be continued, judged from its body before it is
/// sent, so that a stream that could never be continued is not relayed
/// event by event for nothing.
pub fn may_continue(body: &[u8], api: Api, engine: signals::Dialect) -> Result<(), NotContinued> {
    let body: Value = serde_json::from_slice(body).map_err(|_| NotContinued::Unreadable)?;
    request::check(&body, api, engine)
}

/// Send the continuation `body` to a replica the request has not been on:
/// picked now, or after waiting in the pool's line when every replica is
/// saturated; another when none of it could be sent.
pub async fn send(
    resend: Arc<Resend>,
    body: Bytes,
    mut tried: Vec<usize>,
) -> Result<Continued, ApiError> {
    let pool = &resend.pool;
    let name = pool.name();
    let _migrating = pool.metrics().migrating();
    let request = resend.request.with_body(body);
    loop {
        // Through flow control like any request, in its band and its
        // tenant's turn: waiting when every replica is saturated.
        let admitted = pool
            .runtime()
            .admission()
            .admit(name, &resend.ticket, resend.pick.clone(), &tried)
            .await?;
        let endpoint = Arc::clone(&admitted.decision.endpoint);
        tried.push(endpoint.index);
        let sent_at = Instant::now();
        let deadline = sent_at + resend.first_byte_timeout;
        let connections = pool.runtime().connections(resend.worker);
        let sent =
            tokio::time::timeout_at(deadline, connections.send(&endpoint.addr, &request)).await;
        let answer = match sent {
            Ok(Ok(answer)) => answer,
            Ok(Err(e)) if !e.was_sent() && tried.len() <= pool.max_retries() + 1 => {
                if e.is_connect() {
                    endpoint.set_reachable(false);
                }
                continue;
            }
            Ok(Err(e)) => return Err(ApiError::upstream_failed(name, &e.to_string())),
            Err(_elapsed) => return Err(ApiError::upstream_timeout(name)),
        };
        if !answer.status.is_success() {
            let detail = format!(
                "the replica refused the continuation with {}",
                answer.status
            );
            return Err(ApiError::upstream_failed(name, &detail));
        }
        if !headers::is_event_stream(&answer.headers) {
            let detail = "the replica answered the continuation without a stream";
            return Err(ApiError::upstream_failed(name, detail));
        }
        return Ok(Continued {
            answer,
            admitted,
            sent_at,
        });
    }
}
