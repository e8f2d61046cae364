//! The request path, top to bottom. Every inference request passes these
//! stages in order; any stage may answer the client directly with an
//! OpenAI-shaped error.
//!
//! 1. accept — listeners and HTTP (server/, hyper), the edge checks
//!    (edge.rs: target length, `Host`, plain paths, which paths are
//!    forwarded), and the body, read whole within its own limit and the
//!    gateway's budget of buffered bytes (request_body.rs) — once stage 2
//!    has passed, so a caller without a valid credential never holds any
//!    of that budget
//! 2. authenticate — API key / JWT → tenant (auth/); anonymous when
//!    authentication is off
//! 3. parse — body → [`InferenceRequest`]; the bytes are forwarded
//!    untouched but for a rewritten `model` (and the band's `priority`,
//!    for replicas that schedule by it)
//! 4. route — a rewrite may pick another model (a canary) and rewrite the
//!    body's `model` to it (rewrite/); model name → pool (+ adapter), or,
//!    for a model no local pool serves, the global members (members/):
//!    after stage 6 such a request is sent to the member the global
//!    picker chooses, with retries on the next member before any byte
//! 5. authorize — the caller's tenant (and token) may use this model
//! 6. limit — reserve the request and its tokens on every rate limit that
//!    applies (limits/), or refuse with 429 before it queues
//! 7. admit — flow control: when every replica is saturated, wait in line
//!    by priority band and fairness key (admit/); once admitted, a
//!    sampled copy may go to a mirror, off the request's task (mirror.rs)
//! 8. pick — the endpoint picker over the pool's current snapshot, run by
//!    admission for requests that go straight through and for waiters
//! 9. forward — proxy to the replica over the worker's own pooled
//!    connections (upstream/connections.rs), retrying another replica only
//!    when none of the request was sent (the replica may be generating
//!    it otherwise); hold a non-streaming answer's head until its body
//!    starts, so a replica failing first gets a 502, and stream the answer
//!    back
//! 10. record — metrics, access log, load release and the settlement of
//!     the rate-limit reservation, when the response body ends (record.rs);
//!     each stage above runs in its own span

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode, header};
use http_body::{Body as _, Frame};
use http_body_util::BodyExt;
use tokio::time::Instant;
use tracing::Instrument;

use crate::auth::{AuthError, Identity, Via};
use crate::error::{ApiError, DropReason};
use crate::flow::{Admitted, OwnedPick, Ticket};
use crate::generation::Generation;
use crate::generation::pool::Pool;
use crate::inbound::edge::{self, MODEL_PREFIX};
use crate::inbound::parse::InferenceRequest;
use crate::inbound::read_body;
use crate::inbound::server::{Request, WorkerId};
use crate::outbound::response_body::{ProxiedBody, ResponseBody};
use crate::outbound::{self, Forwarded, REQUEST_ID};
use crate::outbound::{mirror, replica_error};
use crate::record::Record;
use crate::respond::{json, text};
use crate::route::rewrite::Served;
use crate::route::table::Route;
use crate::state::State;
use crate::telemetry::{self, stage_span, trace_context};
use crate::{headers, members};

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
const DECISION_TARGET: &str = "infergate::decision";
/// Candidates listed in `x-infergate-scores`, best first.
const SCORES_HEADER_LIMIT: usize = 8;

/// Entry point for every request on a public listener.
pub async fn handle(state: Arc<State>, worker: WorkerId, req: Request) -> Response<ResponseBody> {
    let start = Instant::now();
    let request_id = request_id(&req.headers);
    let mut response = match edge::check(&req) {
        Err(e) => e.into_response(),
        Ok(()) => route(&state, worker, req, start, &request_id).await,
    };
    response.headers_mut().insert(REQUEST_ID, request_id);
    response
}

/// Which handler answers: the gateway's own endpoints, or the pipeline
/// for a forwarded path.
async fn route(
    state: &State,
    worker: WorkerId,
    req: Request,
    start: Instant,
    request_id: &HeaderValue,
) -> Response<ResponseBody> {
    // The request sees this generation of the config to its end.
    let generation = state.generation();
    match (&req.method, req.path()) {
        // `/health` is the model servers' own path (vLLM, SGLang): tools
        // written for them (load generators, probes) find it unchanged.
        (&Method::GET, "/healthz" | "/health") => text(StatusCode::OK, "ok"),
        (&Method::GET, "/readyz") => crate::respond::readyz(state.readiness()),
        (&Method::GET, "/v1/models") => {
            let caller = match authenticate(state, &generation, &req).await {
                Ok(caller) => caller,
                Err(e) => return e.into_response(),
            };
            if caller.may_use_all() {
                json(generation.routes.models_json())
            } else {
                json(generation.routes.models_json_where(|id| caller.may_use(id)))
            }
        }
        (&Method::GET, path) if path.starts_with(MODEL_PREFIX) => {
            let caller = match authenticate(state, &generation, &req).await {
                Ok(caller) => caller,
                Err(e) => return e.into_response(),
            };
            let id = percent_encoding::percent_decode_str(&path[MODEL_PREFIX.len()..])
                .decode_utf8_lossy();
            // A model the caller may not use is not there, for it.
            match generation.routes.model_json(&id) {
                Ok(model) if caller.may_use(&id) => json(model),
                Ok(_) => ApiError::model_not_found(&id).into_response(),
                Err(e) => e.into_response(),
            }
        }
        (_, "/healthz" | "/health" | "/readyz" | "/v1/models") => {
            ApiError::method_not_allowed(&req.method, req.path()).into_response()
        }
        (_, path) if path.starts_with(MODEL_PREFIX) => {
            ApiError::method_not_allowed(&req.method, path).into_response()
        }
        (&Method::POST, path) if generation.forwarded_paths.forwards(path) => {
            let span = telemetry::request_span(&req.method, path, request_id);
            // Before the span is first entered: it may join the caller's trace.
            let sampling = generation.trace_sampling(req.peer.ip());
            let (trace, traceparent) = trace_context::upstream(&req.headers, &span, sampling);
            let mut record = Record::new(request_id.clone(), start, span.clone());
            record.trace_id = Some(trace.trace_id);
            record.feed = state.decisions.sample(start);
            // Boxed: the stages' state is kilobytes, and the request's
            // future is moved more than once before it first runs.
            let ids = Ids {
                request: request_id,
                traceparent: &traceparent,
            };
            Box::pin(infer(state, generation, worker, req, record, ids))
                .instrument(span)
                .await
        }
        (_, path) if generation.forwarded_paths.forwards(path) => {
            let mut r = ApiError::method_not_allowed(&req.method, path).into_response();
            r.headers_mut()
                .insert(header::ALLOW, HeaderValue::from_static("POST"));
            r
        }
        (_, path) => ApiError::not_found(path).into_response(),
    }
}

/// The ids a forwarded request carries to its replica.
#[derive(Clone, Copy)]
struct Ids<'a> {
    request: &'a HeaderValue,
    traceparent: &'a HeaderValue,
}

/// Stages 2–9 for one inference request.
async fn infer(
    state: &State,
    generation: Arc<Generation>,
    worker: WorkerId,
    req: Request,
    mut record: Record,
    ids: Ids<'_>,
) -> Response<ResponseBody> {
    if state.is_shutting_down() {
        return refuse(record, ApiError::shutting_down());
    }
    let proto = req.scheme();
    // 2. authenticate, before the body is read: a caller without a valid
    // credential never holds any of the body budget.
    let caller = match authenticate(state, &generation, &req)
        .instrument(stage_span!("authenticate"))
        .await
    {
        Ok(caller) => caller,
        Err(e) => return refuse(record, e),
    };
    let Request {
        method,
        uri,
        headers,
        body,
        peer,
        ..
    } = req;
    record.identified(caller.as_logged());

    // 1. accept, its last step: the body, within its limit and the
    // gateway's budget; its share of the budget is held until the request
    // is done with it.
    let limit = generation.limits.max_body_bytes();
    let (body, _held) = match read_body::read(body, &headers, limit, &state.body_budget).await {
        Ok(read) => read,
        Err(e) => return refuse(record, e),
    };
    let forwarded = Forwarded::new(&headers, peer, proto, &generation.trusted_proxies);

    // 3. parse
    let request = match stage_span!("parse").in_scope(|| InferenceRequest::parse(&body)) {
        Ok(r) => r,
        Err(e) => return refuse(record, e),
    };
    record.model = Some(request.model.to_string());
    record.stream = request.stream;

    // 4. route: a rewrite may send the request to another model (a
    // canary), whose name the body then carries; then model → pool.
    let session = generation.sessions.key(
        &caller.tenant,
        &headers,
        matches!(caller.via, Via::Token(_)),
        request.user.as_deref(),
    );
    let route_span = stage_span!("route");
    let chosen = route_span.in_scope(|| {
        generation
            .rewrites
            .choose(&request.model, &caller.tenant, &headers, session)
    });
    let served_model = chosen.as_ref().map(|c| Arc::clone(&c.model));
    let model: &str = served_model.as_deref().unwrap_or(&*request.model);
    record.rewrite = chosen.map(Served::from);
    let destination = match route_span.in_scope(|| destination(state, &generation, model)) {
        Ok(destination) => destination,
        Err(e) => {
            record.routed(state.metrics.unrouted());
            return refuse(record, e);
        }
    };
    if let Destination::Pool(route) = destination {
        record.pool = Some(route.pool.name().clone());
        if let Some(metrics) = route.pool.metrics().route(model) {
            record.routed(metrics);
        }
    }
    // The only change the gateway makes to a body: the rewritten model,
    // in place (the parse stage has found the body's `model`).
    let body = match &served_model {
        Some(served) => match crate::route::rewrite::model_field::with_model(&body, served) {
            Some(rewritten) => rewritten,
            None => return refuse(record, ApiError::missing_model("`model` must be a string.")),
        },
        None => body.clone(),
    };

    // 5. authorize: the model (or adapter), by the name it was asked for.
    if let Err(e) = generation.auth.authorize(&caller, &request.model) {
        return refuse(record, e);
    }

    // 6. limit: reserve the request and its tokens on every rate limit
    // that applies, or refuse before it queues.
    let limiter = &generation.limiter;
    let tokens = limiter.tokens_to_reserve(request.prompt_tokens, request.max_output);
    let reserved = limiter
        .reserve(
            record.caller.as_ref().map(|c| &*c.tenant),
            &request.model,
            tokens,
        )
        .instrument(stage_span!("limit"))
        .await;
    match reserved {
        // The record carries it: settled when the request ends, and its
        // headers go on every answer (refuse and pass_on add them).
        Ok(reservation) => {
            record.reservation = reservation;
            // From here on, how the request ends is the target's doing.
            if let Some(served) = &mut record.rewrite {
                served.judged = true;
            }
        }
        Err(refused) => {
            let mut response = refuse(record, refused.error);
            refused.headers.apply(response.headers_mut());
            return response;
        }
    }
    // A model no local pool serves goes to a global member (members/),
    // which has its own flow control: no admission here.
    let route = match destination {
        Destination::Pool(route) => route,
        Destination::Members => {
            let tenant = generation
                .applied
                .spec
                .tenants
                .iter()
                .find(|t| *t.name == *caller.tenant);
            let job = members::forward::MemberRequest {
                method: &method,
                uri: &uri,
                body: &body,
                outgoing: outbound::Outgoing {
                    method: &method,
                    uri: &uri,
                    headers: &headers,
                    body: &body,
                    request_id: ids.request,
                    traceparent: ids.traceparent,
                    forwarded: &forwarded,
                    caller: generation.auth.caller_fields(&caller),
                },
                model,
                residency: members::residency(tenant, &headers),
            };
            return members::forward::forward(state, &generation, job, record)
                .instrument(stage_span!("forward", otel.kind = "client"))
                .await;
        }
    };
    let pool = Arc::clone(&route.pool);
    // A stream charged in tokens is settled to its usage: ask for it when
    // the client did not, and keep it from the client (stream_usage.rs).
    let asked_usage = (request.stream
        && record
            .reservation
            .as_ref()
            .is_some_and(|r| r.charges_tokens()))
    .then(|| crate::outbound::stream_usage::ask_for_usage(&body))
    .flatten();
    let strip_usage = asked_usage.is_some();
    // The body as the request's pool gets it, before the gateway asks a
    // stream for its usage: what a mirror to a pool sends unchanged.
    let original_body = body.clone();
    let body = asked_usage.unwrap_or_else(|| body.clone());

    // 7. admit: straight through when a replica has room, else wait in line.
    let ticket = match Ticket::from_request(
        &headers,
        &request.model,
        &generation.objectives,
        &generation.flow_control,
        body.len() as u64,
        &caller,
    ) {
        Ok(t) => t,
        Err(e) => return refuse(record, e),
    };
    // 8. pick happens inside admission (the dispatcher picks for waiters).
    let explain = generation.debug.decision_headers
        || record.feed.is_some()
        || tracing::event_enabled!(target: DECISION_TARGET, tracing::Level::DEBUG);
    let mut pick = pool
        .runtime()
        .pick_request(&request, route.adapter.as_deref(), explain);
    pick.session = session;
    let admit_started = Instant::now();
    let admitted = match pool
        .runtime()
        .admission()
        .admit(pool.name(), &ticket, pick.clone())
        .instrument(stage_span!("admit", priority = ticket.band.as_str()))
        .await
    {
        Ok(a) => a,
        Err(e) => {
            if e.dropped_reason == Some(DropReason::WaitExpired) {
                record.waited(ticket.band, admit_started.elapsed());
            }
            return refuse(record, e);
        }
    };
    record.waited(ticket.band, admitted.queue_wait);

    // A copy for a mirror, sent off this task; the client never waits
    // for it.
    if let Some(mirror) = generation.mirrors.sample(&request.model) {
        record.mirror = Some(mirror.metrics.clone());
        let copy_body = if mirror.keeps_model() {
            &original_body
        } else {
            &body
        };
        mirror.send(
            worker,
            mirror::ShadowRequest {
                method: method.clone(),
                uri: uri.clone(),
                headers: mirror::ShadowRequest::headers(
                    &headers,
                    generation.auth.caller_fields(&caller),
                ),
                body: copy_body.clone(),
                request_id: ids.request.clone(),
                traceparent: ids.traceparent.clone(),
                forwarded: forwarded.clone(),
                estimated_tokens: request.estimated_tokens,
                first_byte: generation.timeouts.first_byte(),
                idle: generation.timeouts.idle(),
            },
        );
    }

    // Replicas that schedule by priority get the band in the body, in
    // place of any the client sent (a client may not jump their queue).
    let body = match pool.engine_body(body, ticket.band) {
        Ok(body) => body,
        Err(e) => return refuse(record, e),
    };

    // 9. forward, retrying other replicas before any byte.
    let outgoing = outbound::Outgoing {
        method: &method,
        uri: &uri,
        headers: &headers,
        body: &body,
        request_id: ids.request,
        traceparent: ids.traceparent,
        forwarded: &forwarded,
        caller: generation.auth.caller_fields(&caller),
    };
    let job = Forward {
        generation: &generation,
        pool: &pool,
        worker,
        outgoing,
        pick: &pick,
        strip_usage,
    };
    forward(job, admitted, record).await
}

/// Where a request goes: the local pool that serves its model, or else
/// the global members that do.
enum Destination<'g> {
    Pool(&'g Route),
    Members,
}

/// Stage 4's last step: model → local pool; a model no local pool serves
/// goes to the global members when one of them serves it.
fn destination<'g>(
    state: &State,
    generation: &'g Generation,
    model: &str,
) -> Result<Destination<'g>, ApiError> {
    match generation.routes.resolve(model) {
        Ok(route) => Ok(Destination::Pool(route)),
        Err(_) if state.members.serves(model) => Ok(Destination::Members),
        Err(e) => Err(e),
    }
}

/// What the forward stage needs of the request.
struct Forward<'a> {
    generation: &'a Arc<Generation>,
    pool: &'a Pool,
    worker: WorkerId,
    outgoing: outbound::Outgoing<'a>,
    pick: &'a OwnedPick,
    /// The gateway asked for the stream's usage in the client's place.
    strip_usage: bool,
}

/// Stage 8: send the request to the admitted replica, and to another while
/// none of it was sent (the replica may be generating it otherwise); pass
/// the answer on.
async fn forward(
    job: Forward<'_>,
    mut admitted: Admitted,
    mut record: Record,
) -> Response<ResponseBody> {
    let Forward {
        generation,
        pool,
        worker,
        outgoing,
        pick,
        strip_usage,
    } = job;
    let name = pool.name();
    let mut tried: Vec<usize> = Vec::new();
    loop {
        let decision = &admitted.decision;
        let endpoint = &decision.endpoint;
        pool.metrics().count_decision(decision);
        record.endpoint = Some(endpoint.addr.clone());
        record.decision = decision.top;
        if let Some(feed) = &mut record.feed {
            feed.picked(decision);
        }
        tracing::debug!(target: DECISION_TARGET, pool = %name, endpoint = %endpoint.addr,
            scores = %decision.scores_header(SCORES_HEADER_LIMIT), "picked");
        if decision.fallback {
            tracing::warn!(pool = %name, endpoint = %endpoint.addr,
                "no replica has fresh metrics; picked by least-request");
        }
        let sent_at = Instant::now();
        let deadline = sent_at + generation.timeouts.first_byte();
        let sent = tokio::time::timeout_at(
            deadline,
            pool.runtime()
                .connections(worker)
                .send(&endpoint.addr, &outgoing),
        )
        .instrument(stage_span!("forward", endpoint = %endpoint.addr, otel.kind = "client"))
        .await;
        // The replica has the request from here (or may have part of it):
        // whatever happens, it is not sent again, and it is charged.
        record.sent = !matches!(&sent, Ok(Err(e)) if !e.was_sent());
        let e = match sent {
            Ok(Ok(answer)) => {
                if answer.status.is_success() {
                    record.answering(Arc::clone(endpoint), sent_at);
                }
                let passed = PassOn {
                    generation,
                    pool,
                    deadline,
                    strip_usage,
                };
                return pass_on(passed, answer, admitted, record).await;
            }
            // The replica may be generating: never send the work twice.
            Err(_elapsed) => return refuse(record, ApiError::upstream_timeout(name)),
            Ok(Err(e)) if e.was_sent() => {
                return refuse(record, ApiError::upstream_failed(name, &e.to_string()));
            }
            Ok(Err(e)) => e,
        };
        // None of the request reached the replica, so another may try.
        // Replacing `admitted` below releases this replica's load.
        if e.is_connect() {
            endpoint.set_reachable(false);
        }
        tracing::debug!(pool = %name, endpoint = %endpoint.addr, error = %e, "request not sent to the replica");
        tried.push(endpoint.index);
        if tried.len() > pool.max_retries() {
            return refuse(record, ApiError::upstream_failed(name, &e.to_string()));
        }
        admitted = match pool
            .runtime()
            .admission()
            .pick_now(&pick.as_request(), &tried)
        {
            Ok(a) => a,
            // Nothing left to try. A replica that answered badly is the
            // failure to report; one that could not be reached leaves the
            // pool without a reachable replica.
            Err(_) if !e.is_connect() => {
                return refuse(record, ApiError::upstream_failed(name, &e.to_string()));
            }
            Err(no_pick) => return refuse(record, pick_error(name, no_pick)),
        };
        record.retries += 1;
    }
}

/// What passing an answer on needs besides the answer.
struct PassOn<'a> {
    generation: &'a Arc<Generation>,
    pool: &'a Pool,
    deadline: Instant,
    strip_usage: bool,
}

/// The replica answered: pass its answer on. A non-streaming answer goes
/// on once its body starts, so a replica failing before that is the
/// client's 502, not a 200 with a cut body; a stream's head goes at once.
async fn pass_on(
    job: PassOn<'_>,
    mut answer: outbound::Response,
    admitted: Admitted,
    mut record: Record,
) -> Response<ResponseBody> {
    let PassOn {
        generation,
        pool,
        deadline,
        strip_usage,
    } = job;
    let name = pool.name();
    if !headers::plain_transfer_coding(&answer.headers) {
        let coding = answer.headers.get(header::TRANSFER_ENCODING);
        let detail = format!(
            "it answered with the transfer coding {coding:?}, which the gateway does not pass on"
        );
        return refuse(record, ApiError::upstream_failed(name, &detail));
    }
    record.on_response(answer.status, &answer.headers);
    let sse = headers::is_event_stream(&answer.headers);
    let first = if sse {
        None
    } else {
        match tokio::time::timeout_at(deadline, answer.body.frame()).await {
            Ok(Some(Ok(frame))) => Some(frame),
            Ok(None) => None,
            Ok(Some(Err(e))) => {
                return refuse(record, ApiError::upstream_failed(name, &e.to_string()));
            }
            Err(_elapsed) => return refuse(record, ApiError::upstream_timeout(name)),
        }
    };
    // An error the SDKs could not read is put in the OpenAI shape.
    let (first, wrapped) =
        if !sse && (answer.status.is_client_error() || answer.status.is_server_error()) {
            match error_body(first, &mut answer.body, deadline).await {
                Ok(ErrorBody::Whole(bytes)) => {
                    let translated = replica_error::translate(answer.status, &bytes);
                    if let Some(limit) = translated.context_limit {
                        // Later requests too long for it go elsewhere.
                        admitted.decision.endpoint.set_context_limit(limit);
                    }
                    match translated.body {
                        Some(shaped) => (Some(Frame::data(shaped)), true),
                        None => (Some(Frame::data(bytes)), false),
                    }
                }
                Ok(ErrorBody::Partial(bytes)) => (Some(Frame::data(bytes)), false),
                Err(e) => return refuse(record, e.into_api(name)),
            }
        } else {
            (first, false)
        };
    // The replica's end-to-end headers, then the gateway's.
    let mut response_headers = HeaderMap::with_capacity(answer.headers.len() + 4);
    for (name, value) in headers::end_to_end(&answer.headers) {
        response_headers.append(name.clone(), value.clone());
    }
    if wrapped {
        response_headers.remove(header::CONTENT_LENGTH);
        response_headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
    }
    record.rate_headers(&mut response_headers);
    if generation.debug.decision_headers {
        let waited = record.queue_wait.unwrap_or_default();
        decision_headers(&mut response_headers, name, &admitted.decision, waited);
        rewrite_headers(&mut response_headers, &record);
    }
    let idle = generation.timeouts.idle();
    let keep = Arc::clone(generation) as _;
    let mut body = ProxiedBody::new(answer.body, first, sse, admitted.lease, record, idle, keep);
    if strip_usage {
        body = body.strip_usage();
    }
    let mut response = Response::new(ResponseBody::Proxied(Box::new(body)));
    *response.status_mut() = answer.status;
    *response.headers_mut() = response_headers;
    response
}

/// A replica's error body, read whole up to [`replica_error::LIMIT`].
enum ErrorBody {
    Whole(Bytes),
    /// Longer than the limit: what was read, the rest still to stream.
    Partial(Bytes),
}

/// Why an error body could not be read.
enum BodyFailed {
    Failed(String),
    TimedOut,
}

impl BodyFailed {
    fn into_api(self, pool: &str) -> ApiError {
        match self {
            BodyFailed::Failed(e) => ApiError::upstream_failed(pool, &e),
            BodyFailed::TimedOut => ApiError::upstream_timeout(pool),
        }
    }
}

async fn error_body(
    first: Option<Frame<Bytes>>,
    body: &mut crate::outbound::connections::Body,
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

/// Stage 2: who the caller is. A refusal is counted by its reason, and
/// answered 401 (or 503 when the credential cannot be checked now).
async fn authenticate(
    state: &State,
    generation: &Generation,
    req: &Request,
) -> Result<Identity, ApiError> {
    // The tenant a verified client certificate names, when the config
    // identifies callers by their certificates.
    let tenant_from = generation
        .applied
        .spec
        .auth
        .as_ref()
        .and_then(|a| a.client_certificates.as_ref())
        .map(|c| c.tenant_from);
    let verified_client = req
        .client_cert
        .as_deref()
        .zip(tenant_from)
        .and_then(|(cert, from)| match from {
            config::CertificateName::CommonName => cert.common_name.as_deref(),
            config::CertificateName::DnsName => cert.dns_names.first().map(String::as_str),
        });
    generation
        .auth
        .authenticate(&req.headers, verified_client)
        .await
        .map_err(|e: AuthError| {
            state
                .metrics
                .count_auth_failure(e.credential(), e.reason.as_str());
            e.into_api()
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

fn refuse(mut record: Record, error: ApiError) -> Response<ResponseBody> {
    record.refused(&error);
    let mut response = error.into_response();
    record.rate_headers(response.headers_mut());
    response
}

fn decision_headers(
    headers: &mut http::HeaderMap,
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
    let Some(served) = &record.rewrite else {
        return;
    };
    let pairs = [
        (
            X_REQUESTED_MODEL,
            record.model.as_deref().unwrap_or_default(),
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

/// The client's request id, or a new one.
fn request_id(headers: &HeaderMap) -> HeaderValue {
    headers
        .get(REQUEST_ID)
        .filter(|v| !v.is_empty() && v.len() <= 128)
        .cloned()
        .unwrap_or_else(|| {
            let mut id = [0; 32];
            trace_context::lower_hex(rand::random(), &mut id);
            HeaderValue::from_bytes(&id).expect("hex is a valid header value")
        })
}
