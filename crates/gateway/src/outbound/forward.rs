//! Stage 9, forward: send the request to the replica admission chose, and
//! to another while none of it was sent (the replica may be generating it
//! otherwise); then pass the replica's answer on to the client.

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Response, header};
use http_body::{Body as _, Frame};
use http_body_util::BodyExt;
use tokio::time::Instant;
use tracing::Instrument;

use super::continuation::{self, Cause, Outcome};
use super::disaggregated;
use super::response_body::{ProxiedBody, ResponseBody};
use super::{Outgoing, replica_error};
use crate::error::{ApiError, DropReason};
use crate::flow::{Admitted, OwnedPick, Ticket};
use crate::generation::Generation;
use crate::generation::pool::Pool;
use crate::headers;
use crate::inbound::server::WorkerId;
use crate::record::Record;
use crate::respond::refuse;
use crate::telemetry::stage_span;

const X_POOL: &str = "x-infergate-pool";
const X_ENDPOINT: &str = "x-infergate-endpoint";
const X_SCORES: &str = "x-infergate-scores";
/// A rewritten request's model as the client asked for it, the model that
/// served it, and the rewrite that chose it.
const X_REQUESTED_MODEL: &str = "x-infergate-requested-model";
const X_MODEL: &str = "x-infergate-model";
const X_REWRITE: &str = "x-infergate-rewrite";
/// Milliseconds the request waited in the admission queue (0 when it went
/// straight through), to the microsecond.
const X_QUEUE_WAIT: &str = "x-infergate-queue-wait-ms";
/// Target of the per-request decision log (every candidate's scores), at
/// debug level: `INFERGATE_LOG=info,infergate::decision=debug`.
pub const DECISION_TARGET: &str = "infergate::decision";
/// Candidates listed in `x-infergate-scores`, best first.
const SCORES_HEADER_LIMIT: usize = 8;

/// What the forward stage needs of the request.
pub struct Forward<'a> {
    pub generation: &'a Arc<Generation>,
    pub pool: &'a Arc<Pool>,
    pub worker: WorkerId,
    pub outgoing: Outgoing<'a>,
    pub ticket: &'a Ticket,
    pub pick: &'a OwnedPick,
    /// The gateway asked for the stream's usage in the client's place.
    pub strip_usage: bool,
}

/// Send the request to the admitted replica, and to another while none of
/// it was sent; pass the answer on.
///
/// Not an `async fn`: the future of one keeps each argument twice (as it
/// was passed and as the body's own variable), where an `async move` block
/// works on what it captured, in place. The request's future is copied
/// whole as it is moved and boxed, so its every byte costs.
#[allow(clippy::manual_async_fn)]
pub fn forward(
    job: Forward<'_>,
    mut admitted: Admitted,
    mut record: Box<Record>,
) -> impl Future<Output = Response<ResponseBody>> + Send {
    async move {
        // A disaggregated pool's prefill leg, before (vLLM) or beside
        // (SGLang) the decode leg this stage sends.
        let legs = disaggregated::Job {
            pool: job.pool,
            worker: job.worker,
            outgoing: &job.outgoing,
            prompt_tokens: job.pick.prompt_tokens,
        };
        // Only the decode leg's sending reads the split: a continuation or
        // a resend elsewhere starts from the client's body.
        let split = Box::pin(disaggregated::split(&legs, &admitted, &mut record)).await;
        let name = job.pool.name();
        let mut tried: Vec<usize> = Vec::new();
        let mut resent = 0;
        loop {
            let sent_at = Instant::now();
            let deadline = sent_at + job.generation.timeouts.first_byte();
            let again = match send(&job, split.as_ref(), &admitted, &mut record, deadline).await {
                Attempt::Answered(mut answer) => {
                    if answer.status.is_success() {
                        record.answering(Arc::clone(&admitted.decision.endpoint), sent_at);
                    }
                    match pass_on(&job, deadline, &mut answer, &admitted, &mut record).await {
                        Ok(passed) if passed.not_here => {
                            // Another replica may serve what this one
                            // refused; with none, the refusal is the answer.
                            tried.push(admitted.decision.endpoint.index);
                            match next_for_not_here(&job, &tried) {
                                Some(next) => {
                                    job.pool.metrics().count_migration(
                                        Cause::NotHere.as_str(),
                                        Outcome::Resent.as_str(),
                                    );
                                    record.moved(Cause::NotHere.as_str(), 0);
                                    admitted = next;
                                    continue;
                                }
                                None => return respond(&job, answer, passed, admitted, record),
                            }
                        }
                        Ok(passed) => return respond(&job, answer, passed, admitted, record),
                        Err(failure) => failure,
                    }
                }
                Attempt::Failed(failure) => failure,
                Attempt::NotSent(e) => Failure::NotSent(e),
            };
            let endpoint = &admitted.decision.endpoint;
            tried.push(endpoint.index);
            admitted = match again {
                // None of the request reached the replica, so another may
                // try. Replacing `admitted` releases this replica's load.
                Failure::NotSent(failed) => {
                    if failed.is_connect() {
                        endpoint.set_reachable(false);
                    }
                    tracing::debug!(pool = %name, endpoint = %endpoint.addr, error = %failed,
                        "request not sent to the replica");
                    match next_replica(&job, &tried, &failed) {
                        Ok(next) => {
                            record.retried();
                            next
                        }
                        Err(error) => return refuse(*record, error),
                    }
                }
                // The replica had the request and failed before answering:
                // it will not answer it. Nothing reached the client, so
                // for a pool that continues answers another replica gets
                // it whole; otherwise it may be acting on it, and it is
                // not sent again.
                Failure::Broke(detail) => {
                    // Boxed: the rare path's state stays out of every
                    // request's future.
                    match Box::pin(resend_broken(&job, &tried, &mut resent)).await {
                        Some(next) => {
                            job.pool
                                .metrics()
                                .count_migration(Cause::Broken.as_str(), Outcome::Resent.as_str());
                            record.moved(Cause::Broken.as_str(), 0);
                            next
                        }
                        None => return refuse(*record, ApiError::upstream_failed(name, &detail)),
                    }
                }
                Failure::Refused(error) => return refuse(*record, error),
            };
        }
    }
}

/// How sending to one replica went.
enum Attempt {
    Answered(super::Response),
    Failed(Failure),
    /// None of the request reached the replica.
    NotSent(super::connections::Error),
}

/// Why a replica gave no answer to pass on.
enum Failure {
    /// The client gets this error.
    Refused(ApiError),
    /// The replica broke before its answer's first byte reached the
    /// client: it will not answer.
    Broke(String),
    /// None of the request reached the replica.
    NotSent(super::connections::Error),
}

/// One attempt: the decision recorded, the request sent, its head awaited
/// until `deadline`.
async fn send(
    job: &Forward<'_>,
    split: Option<&disaggregated::Split>,
    admitted: &Admitted,
    record: &mut Record,
    deadline: Instant,
) -> Attempt {
    let name = job.pool.name();
    let decision = &admitted.decision;
    let endpoint = &decision.endpoint;
    job.pool.metrics().count_decision(decision);
    record.picked(decision);
    tracing::debug!(target: DECISION_TARGET, pool = %name, endpoint = %endpoint.addr,
        scores = %decision.scores_header(SCORES_HEADER_LIMIT), "picked");
    if decision.fallback {
        tracing::warn!(pool = %name, endpoint = %endpoint.addr,
            "no replica has fresh metrics; picked by least-request");
    }
    let connections = job.pool.runtime().connections(job.worker);
    let sending =
        disaggregated::send_decode(connections, &endpoint.addr, &job.outgoing, split, record);
    let sent = tokio::time::timeout_at(deadline, sending)
        .instrument(stage_span!("forward", endpoint = %endpoint.addr, otel.kind = "client"))
        .await;
    // The replica has the request from here (or may have part of it):
    // whatever happens, it is charged, and it is sent again only if the
    // replica is known not to answer it.
    record.reached_replica(!matches!(&sent, Ok(Err(e)) if !e.was_sent()));
    match sent {
        Ok(Ok(answer)) => Attempt::Answered(answer),
        // The replica may still be working on it: never sent again.
        Err(_elapsed) => Attempt::Failed(Failure::Refused(ApiError::upstream_timeout(name))),
        Ok(Err(e)) if e.was_sent() => Attempt::Failed(Failure::Broke(e.to_string())),
        Ok(Err(e)) => Attempt::NotSent(e),
    }
}

/// Another replica for a request a replica refused as "not here" (its
/// context is too short for the prompt, or it is shutting down), within
/// the pool's retries.
fn next_for_not_here(job: &Forward<'_>, tried: &[usize]) -> Option<Admitted> {
    if tried.len() > job.pool.max_retries() {
        return None;
    }
    job.pool
        .runtime()
        .admission()
        .pick_now(&job.pick.as_request(), tried)
        .ok()
}

/// Another replica, through flow control, for a generation whose replica
/// broke before answering, within the pool's continuation attempts; `None`
/// when the pool does not continue answers, the API is not a generation,
/// or no replica took it.
async fn resend_broken(job: &Forward<'_>, tried: &[usize], resent: &mut u32) -> Option<Admitted> {
    let settings = job.pool.continuation();
    if !settings.enabled
        || *resent >= settings.max_attempts
        || continuation::Api::of_path(job.outgoing.uri.path()).is_none()
    {
        return None;
    }
    *resent += 1;
    let _migrating = job.pool.metrics().migrating();
    job.pool
        .runtime()
        .admission()
        .admit(job.pool.name(), job.ticket, job.pick.clone(), tried)
        .await
        .ok()
}

/// Another replica for a request none of which was sent, or the refusal
/// when none is left.
fn next_replica(
    job: &Forward<'_>,
    tried: &[usize],
    failed: &super::connections::Error,
) -> Result<Admitted, ApiError> {
    let name = job.pool.name();
    if tried.len() > job.pool.max_retries() {
        return Err(ApiError::upstream_failed(name, &failed.to_string()));
    }
    let admission = job.pool.runtime().admission();
    match admission.pick_now(&job.pick.as_request(), tried) {
        Ok(next) => Ok(next),
        // Nothing left to try. A replica that answered badly is the
        // failure to report; one that could not be reached leaves the
        // pool without a reachable replica.
        Err(_) if !failed.is_connect() => Err(ApiError::upstream_failed(name, &failed.to_string())),
        Err(no_pick) => Err(pick_error(name, no_pick)),
    }
}

/// What [`pass_on`] found of the replica's answer, to pass on.
struct Passed {
    first: Option<Frame<Bytes>>,
    sse: bool,
    headers: HeaderMap,
    /// The replica refused what another may serve.
    not_here: bool,
}

/// What [`first_frame`] found of an error answer.
#[derive(Default)]
struct Shape {
    /// Its body was put in the OpenAI shape.
    wrapped: bool,
    /// It refuses what another replica may serve: a prompt longer than
    /// its context, or the replica is shutting down.
    not_here: bool,
}

/// The replica answered: pass its answer on. A non-streaming answer goes
/// on once its body starts, so a replica failing before that is the
/// client's 502, not a 200 with a cut body; a stream's head goes at once.
/// The record and the lease are borrowed, not moved in: [`respond`] takes
/// them into the body once this is done waiting.
async fn pass_on(
    job: &Forward<'_>,
    deadline: Instant,
    answer: &mut super::Response,
    admitted: &Admitted,
    record: &mut Record,
) -> Result<Passed, Failure> {
    let name = job.pool.name();
    if !headers::plain_transfer_coding(&answer.headers) {
        let coding = answer.headers.get(header::TRANSFER_ENCODING);
        let detail = format!(
            "it answered with the transfer coding {coding:?}, which the gateway does not pass on"
        );
        return Err(Failure::Refused(ApiError::upstream_failed(name, &detail)));
    }
    record.on_response(answer.status, &answer.headers);
    let sse = headers::is_event_stream(&answer.headers);
    let (first, shape) =
        first_frame(answer, sse, deadline, admitted)
            .await
            .map_err(|e| match e {
                BodyFailed::Failed(detail) => Failure::Broke(detail),
                BodyFailed::TimedOut => Failure::Refused(ApiError::upstream_timeout(name)),
            })?;
    let wrapped = shape.wrapped;
    let mut headers = answer_headers(&answer.headers, wrapped, record);
    if job.generation.debug.decision_headers {
        let waited = record.queue_wait().unwrap_or_default();
        decision_headers(&mut headers, name, &admitted.decision, waited);
        rewrite_headers(&mut headers, record);
    }
    Ok(Passed {
        first,
        sse,
        headers,
        not_here: shape.not_here,
    })
}

/// The client's response: the replica's status and the headers
/// [`pass_on`] made, its body streamed from the replica's, owning the
/// request's lease and record until it ends.
fn respond(
    job: &Forward<'_>,
    answer: super::Response,
    passed: Passed,
    admitted: Admitted,
    record: Box<Record>,
) -> Response<ResponseBody> {
    let idle = job.generation.timeouts.idle();
    let keep = Arc::clone(job.generation) as _;
    let status = answer.status;
    let relay = (passed.sse && status.is_success()).then(|| relay(job, &admitted));
    let endpoint = Arc::clone(&admitted.decision.endpoint);
    let mut body = ProxiedBody::new(
        answer.body,
        passed.first,
        passed.sse,
        admitted.lease,
        record,
        idle,
        keep,
    );
    if job.strip_usage {
        body = body.strip_usage();
    }
    match relay {
        Some(Ok(relay)) => body = body.continuable(relay, endpoint),
        Some(Err(Some(why))) => body = body.not_continuable(why, Arc::clone(job.pool)),
        _ => {}
    }
    let mut response = Response::new(ResponseBody::Proxied(Box::new(body)));
    *response.status_mut() = status;
    *response.headers_mut() = passed.headers;
    response
}

/// A continuable stream's relay: for a pool that continues answers, a
/// chat or completions request whose body asks for nothing a continuation
/// would not give faithfully.
/// `Err(None)` when the pool does not continue answers or the API's
/// cannot be.
fn relay(
    job: &Forward<'_>,
    admitted: &Admitted,
) -> Result<continuation::Relay, Option<continuation::NotContinued>> {
    let settings = *job.pool.continuation();
    if !settings.enabled {
        return Err(None);
    }
    let api = continuation::Api::of_path(job.outgoing.uri.path()).ok_or(None)?;
    continuation::may_continue(job.outgoing.body, api, job.pool.engine()).map_err(Some)?;
    let resend = continuation::Resend {
        pool: Arc::clone(job.pool),
        worker: job.worker,
        ticket: job.ticket.clone(),
        pick: job.pick.clone(),
        request: job.outgoing.keep(),
        body: job.outgoing.body.clone(),
        api,
        first_byte_timeout: job.generation.timeouts.first_byte(),
    };
    Ok(continuation::Relay::new(
        resend,
        settings,
        admitted.decision.endpoint.index,
    ))
}

/// The answer's first frame, held back for a non-streaming answer until
/// its body starts; an error body the SDKs could not read is put in the
/// OpenAI shape (`true` when it was).
async fn first_frame(
    answer: &mut super::Response,
    sse: bool,
    deadline: Instant,
    admitted: &Admitted,
) -> Result<(Option<Frame<Bytes>>, Shape), BodyFailed> {
    if sse {
        return Ok((None, Shape::default()));
    }
    let first = match tokio::time::timeout_at(deadline, answer.body.frame()).await {
        Ok(Some(Ok(frame))) => Some(frame),
        Ok(None) => None,
        Ok(Some(Err(e))) => return Err(BodyFailed::Failed(e.to_string())),
        Err(_elapsed) => return Err(BodyFailed::TimedOut),
    };
    if !(answer.status.is_client_error() || answer.status.is_server_error()) {
        return Ok((first, Shape::default()));
    }
    // A replica shutting down refuses what it would otherwise serve.
    let unavailable = answer.status == http::StatusCode::SERVICE_UNAVAILABLE;
    match error_body(first, &mut answer.body, deadline).await? {
        ErrorBody::Whole(bytes) => {
            let translated = replica_error::translate(answer.status, &bytes);
            if let Some(limit) = translated.context_limit {
                // Later requests too long for it go elsewhere.
                admitted.decision.endpoint.set_context_limit(limit);
            }
            let not_here = unavailable || translated.context_limit.is_some();
            Ok(match translated.body {
                Some(shaped) => (
                    Some(Frame::data(shaped)),
                    Shape {
                        wrapped: true,
                        not_here,
                    },
                ),
                None => (
                    Some(Frame::data(bytes)),
                    Shape {
                        wrapped: false,
                        not_here,
                    },
                ),
            })
        }
        ErrorBody::Partial(bytes) => Ok((
            Some(Frame::data(bytes)),
            Shape {
                wrapped: false,
                not_here: unavailable,
            },
        )),
    }
}

/// The replica's end-to-end headers, then the gateway's.
fn answer_headers(replica: &HeaderMap, wrapped: bool, record: &Record) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(replica.len() + 4);
    for (name, value) in headers::end_to_end(replica) {
        headers.append(name.clone(), value.clone());
    }
    if wrapped {
        headers.remove(header::CONTENT_LENGTH);
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    record.rate_headers(&mut headers);
    headers
}

/// A replica's error body, read whole up to [`replica_error::LIMIT`].
enum ErrorBody {
    Whole(Bytes),
    /// Longer than the limit: what was read, the rest still to stream.
    Partial(Bytes),
}

/// Why an answer's body could not be read.
enum BodyFailed {
    Failed(String),
    TimedOut,
}

async fn error_body(
    first: Option<Frame<Bytes>>,
    body: &mut super::connections::Body,
    deadline: Instant,
) -> Result<ErrorBody, BodyFailed> {
    let mut bytes = first
        .and_then(|f| f.into_data().ok())
        .map(Vec::from)
        .unwrap_or_default();
    while bytes.len() <= replica_error::LIMIT && !body.is_end_stream() {
        match tokio::time::timeout_at(deadline, body.frame()).await {
            Ok(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    bytes.extend_from_slice(data);
                }
            }
            Ok(None) => break,
            Ok(Some(Err(e))) => return Err(BodyFailed::Failed(e.to_string())),
            Err(_elapsed) => return Err(BodyFailed::TimedOut),
        }
    }
    let bytes = Bytes::from(bytes);
    Ok(if bytes.len() > replica_error::LIMIT {
        ErrorBody::Partial(bytes)
    } else {
        ErrorBody::Whole(bytes)
    })
}

/// A retry's pick failed: nothing is left to try. Refused for the same
/// reasons, and saying so the same way, as a first pick.
fn pick_error(pool: &str, e: picker::PickError) -> ApiError {
    match e {
        picker::PickError::Saturated { retry_after, .. } => {
            ApiError::saturated(pool, retry_after).with_dropped_reason(DropReason::Saturated)
        }
        e => {
            ApiError::no_replicas(pool, &e.to_string()).with_dropped_reason(DropReason::NoReplicas)
        }
    }
}

fn decision_headers(
    headers: &mut HeaderMap,
    pool: &str,
    decision: &picker::Decision,
    queue_wait: std::time::Duration,
) {
    let pairs = [
        (X_POOL, pool.to_owned()),
        (X_ENDPOINT, decision.endpoint.addr.to_string()),
        (
            X_SCORES,
            decision.scores_header(SCORES_HEADER_LIMIT).to_string(),
        ),
        (
            X_QUEUE_WAIT,
            (queue_wait.as_micros() as f64 / 1e3).to_string(),
        ),
    ];
    for (name, value) in pairs {
        if let Ok(v) = HeaderValue::from_str(&value)
            && !value.is_empty()
        {
            headers.insert(name, v);
        }
    }
}

/// For a rewritten request, the model asked for, the model served and
/// the rewrite that chose it.
fn rewrite_headers(headers: &mut HeaderMap, record: &Record) {
    let Some(served) = record.served() else {
        return;
    };
    let pairs = [
        (
            X_REQUESTED_MODEL,
            record.requested_model().unwrap_or_default(),
        ),
        (X_MODEL, &*served.model),
        (X_REWRITE, served.rewrite.name.as_str()),
    ];
    for (name, value) in pairs {
        if let Ok(v) = HeaderValue::from_str(value) {
            headers.insert(name, v);
        }
    }
}
