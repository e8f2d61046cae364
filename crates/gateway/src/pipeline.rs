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
//!     the rate-limit reservation, when the response body ends (record/);
//!     each stage above runs in its own span

use std::sync::Arc;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode, header};
use tokio::time::Instant;
use tracing::Instrument;

use crate::auth::{AuthError, Identity, Via};
use crate::error::{ApiError, DropReason};
use crate::flow::{Admitted, OwnedPick, Ticket};
use crate::generation::Generation;
use crate::generation::pool::Pool;
use crate::inbound::edge::{self, MODEL_PREFIX};
use crate::inbound::parse::InferenceRequest;
use crate::inbound::read_body::{self, Held};
use crate::inbound::server::{Request, WorkerId};
use crate::members;
use crate::outbound::forward::{DECISION_TARGET, Forward, forward};
use crate::outbound::held::{self, EarlyHead};
use crate::outbound::mirror::ShadowRequest;
use crate::outbound::response_body::ResponseBody;
use crate::outbound::{Forwarded, Outgoing, REQUEST_ID, stream_usage};
use crate::record::{Record, Refusal};
use crate::respond::{json, refuse, text};
use crate::route::rewrite::{Served, model_field};
use crate::route::table::Route;
use crate::state::State;
use crate::telemetry::{self, stage_span, trace_context};

/// Entry point for every request on a public listener.
pub async fn handle(state: Arc<State>, worker: WorkerId, req: Request) -> Response<ResponseBody> {
    let start = Instant::now();
    let request_id = request_id(&req.headers);
    let mut response = match edge::check(&req) {
        Err(e) => e.into_response(),
        Ok(()) => dispatch(&state, worker, req, start, &request_id).await,
    };
    response.headers_mut().insert(REQUEST_ID, request_id);
    response
}

/// Which handler answers: the gateway's own endpoints, or the pipeline
/// for a forwarded path.
async fn dispatch(
    state: &Arc<State>,
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
        // Authentication boxed on the model-list paths: its future would
        // otherwise be part of every request's, copied as it is moved.
        (&Method::GET, "/v1/models") => {
            let caller = match Box::pin(authenticate(state, &generation, &req)).await {
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
            let caller = match Box::pin(authenticate(state, &generation, &req)).await {
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
            let feed = state.decisions.sample(start);
            // Boxed: it goes by value from stage to stage and into the
            // response body, and a pointer moves for less than its bytes.
            let record = Box::new(Record::new(
                request_id.clone(),
                start,
                span.clone(),
                Some(trace.trace_id),
                feed,
            ));
            // The work is its own future, owning what it uses: a stream
            // held for a cold pool answers its head early and goes on
            // inside the body (outbound/held.rs).
            let (early, early_head) = EarlyHead::new();
            let work = {
                let state = Arc::clone(state);
                let request_id = request_id.clone();
                async move {
                    let ids = Ids {
                        request: &request_id,
                        traceparent: &traceparent,
                    };
                    infer(&state, generation, worker, req, record, ids, early).await
                }
            };
            // Boxed: the stages' state is kilobytes, and the request's
            // future is moved more than once before it first runs.
            held::respond(Box::pin(work.instrument(span)), early_head).await
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

/// Stages 2–9 for one inference request: each stage decides one thing and
/// hands the next its input, or refuses the request.
///
/// Not an `async fn`, whose future would keep each argument twice: the
/// request's future is copied whole when it is boxed.
#[allow(clippy::manual_async_fn)]
fn infer<'a>(
    state: &'a State,
    generation: Arc<Generation>,
    worker: WorkerId,
    req: Request,
    mut record: Box<Record>,
    ids: Ids<'a>,
    early: EarlyHead,
) -> impl Future<Output = Response<ResponseBody>> + Send + 'a {
    async move {
        let mut received = match receive(state, &generation, req, &mut record).await {
            Ok(received) => received,
            Err(refusal) => return refuse(*record, refusal),
        };
        received.early = Some(early);
        let decided = match decide(state, &generation, worker, &received, &mut record, ids).await {
            Ok(decided) => decided,
            Err(refusal) => return refuse(*record, refusal),
        };
        // 9. forward: to the admitted replica, or to a global member.
        let outgoing = received.outgoing(&generation, &decided.body, ids);
        match decided.target {
            Target::Replica {
                pool,
                ticket,
                pick,
                admitted,
                strip_usage,
            } => {
                let job = Forward {
                    generation: &generation,
                    pool: &pool,
                    worker,
                    outgoing,
                    ticket: &ticket,
                    pick: &pick,
                    strip_usage,
                };
                forward(job, admitted, record).await
            }
            Target::Members { model, residency } => {
                let job = members::forward::MemberRequest {
                    method: &received.method,
                    uri: &received.uri,
                    body: &decided.body,
                    outgoing,
                    model: &model,
                    residency,
                };
                // Boxed: the global members' path would otherwise add its
                // state to every request's future.
                Box::pin(members::forward::forward(state, &generation, job, *record))
                    .instrument(stage_span!("forward", otel.kind = "client"))
                    .await
            }
        }
    }
}

/// Stages 2–8, from the parsed body to an admitted replica (or the global
/// members), in order.
async fn decide(
    state: &State,
    generation: &Generation,
    worker: WorkerId,
    received: &Received,
    record: &mut Record,
    ids: Ids<'_>,
) -> Result<Decided, Refusal> {
    let request = parse(&received.body, record)?;
    let routed = route(state, generation, received, &request, record)?;
    authorize(generation, &received.caller, &request)?;
    limit(generation, &request, record).await?;
    let route = match routed.destination {
        Destination::Pool(route) => route,
        // Global members have their own flow control: no admission here.
        Destination::Members => {
            let tenant = generation.tenant(&received.caller.tenant);
            return Ok(Decided {
                body: routed.body,
                target: Target::Members {
                    model: routed.model,
                    residency: members::residency(tenant, &received.headers),
                },
            });
        }
    };
    let pool = Arc::clone(&route.pool);
    let asked = ask_for_usage(&request, &routed.body, record);
    let (ticket, pick, admitted) = admit(
        generation,
        route,
        received,
        &request,
        &asked,
        routed.session,
        record,
    )
    .await?;
    mirror(
        generation,
        worker,
        received,
        &request,
        &routed.body,
        &asked,
        ids,
        record,
    );
    let body = pool.engine_body(asked.body, ticket.band)?;
    Ok(Decided {
        body,
        target: Target::Replica {
            pool,
            ticket,
            pick,
            admitted,
            strip_usage: asked.strip_usage,
        },
    })
}

/// A request whose caller is known and whose body was read: what every
/// later stage reads of it.
struct Received {
    method: Method,
    uri: http::Uri,
    headers: HeaderMap,
    body: Bytes,
    forwarded: Forwarded,
    caller: Identity,
    /// Told when a stream starts waiting for a cold pool, so its head
    /// can go out early.
    early: Option<EarlyHead>,
    /// The body's share of the gateway's budget, held until the request
    /// is done with it.
    _held: Held,
}

impl Received {
    /// The request as a replica (or member) gets it, with `body`.
    fn outgoing<'a>(
        &'a self,
        generation: &'a Generation,
        body: &'a Bytes,
        ids: Ids<'a>,
    ) -> Outgoing<'a> {
        Outgoing {
            method: &self.method,
            uri: &self.uri,
            headers: &self.headers,
            body,
            request_id: ids.request,
            traceparent: ids.traceparent,
            forwarded: &self.forwarded,
            caller: generation.auth.caller_fields(&self.caller),
        }
    }
}

/// Stages 2 and 1's last step: who the caller is, then — for a caller
/// that may send one — the body, within its limit and the gateway's
/// budget.
async fn receive(
    state: &State,
    generation: &Generation,
    req: Request,
    record: &mut Record,
) -> Result<Received, Refusal> {
    if state.is_shutting_down() {
        return Err(ApiError::shutting_down().into());
    }
    let proto = req.scheme();
    // Before the body is read: a caller without a valid credential never
    // holds any of the body budget.
    let caller = authenticate(state, generation, &req)
        .instrument(stage_span!("authenticate"))
        .await?;
    record.identified(caller.as_logged());
    let Request {
        method,
        uri,
        headers,
        body,
        peer,
        ..
    } = req;
    let limit = generation.limits.max_body_bytes();
    let (body, held) = read_body::read(body, &headers, limit, &state.body_budget).await?;
    let forwarded = Forwarded::new(&headers, peer, proto, &generation.trusted_proxies);
    Ok(Received {
        method,
        uri,
        headers,
        body,
        forwarded,
        caller,
        early: None,
        _held: held,
    })
}

/// Stage 3: the JSON body → what routing needs of it.
fn parse<'b>(body: &'b Bytes, record: &mut Record) -> Result<InferenceRequest<'b>, ApiError> {
    let request = stage_span!("parse").in_scope(|| InferenceRequest::parse(body))?;
    record.parsed(&request.model, request.stream);
    Ok(request)
}

/// Where stage 4 sends the request, and the body it is sent with.
struct Routed<'g> {
    destination: Destination<'g>,
    /// The model served: the one asked for, or a rewrite's target.
    model: Arc<str>,
    /// The body, its `model` rewritten when a rewrite chose another.
    body: Bytes,
    session: Option<u64>,
}

/// Where a request goes: the local pool that serves its model, or else
/// the global members that do.
enum Destination<'g> {
    Pool(&'g Route),
    Members,
}

/// Stage 4: a rewrite may send the request to another model (a canary),
/// whose name the body then carries; then model → local pool, or the
/// global members when no local pool serves it.
fn route<'g>(
    state: &State,
    generation: &'g Generation,
    received: &Received,
    request: &InferenceRequest<'_>,
    record: &mut Record,
) -> Result<Routed<'g>, ApiError> {
    let _span = stage_span!("route").entered();
    let caller = &received.caller;
    let session = generation.sessions.key(
        &caller.tenant,
        &received.headers,
        matches!(caller.via, Via::Token(_)),
        request.user.as_deref(),
    );
    let chosen =
        generation
            .rewrites
            .choose(&request.model, &caller.tenant, &received.headers, session);
    let model: Arc<str> = match &chosen {
        Some(chosen) => Arc::clone(&chosen.model),
        None => Arc::from(&*request.model),
    };
    let rewritten = chosen.is_some();
    record.rewritten(chosen.map(Served::from));
    let destination = match generation.routes.resolve(&model) {
        Ok(route) => {
            let metrics = route.pool.metrics().route(&model);
            record.routed(route.pool.name().clone(), metrics);
            Destination::Pool(route)
        }
        Err(_) if state.members.serves(&model) => Destination::Members,
        Err(e) => {
            record.unrouted(state.metrics.unrouted());
            return Err(e);
        }
    };
    // The only change the gateway makes to a body's model: the rewritten
    // one, in place (the parse stage has found the body's `model`).
    let body = if rewritten {
        model_field::with_model(&received.body, &model)
            .ok_or_else(|| ApiError::missing_model("`model` must be a string."))?
    } else {
        received.body.clone()
    };
    Ok(Routed {
        destination,
        model,
        body,
        session,
    })
}

/// Stage 5: the caller's tenant (and token) may use the model or adapter,
/// by the name it was asked for.
fn authorize(
    generation: &Generation,
    caller: &Identity,
    request: &InferenceRequest<'_>,
) -> Result<(), ApiError> {
    generation.auth.authorize(caller, &request.model)
}

/// Stage 6: the request and its tokens reserved on every rate limit that
/// applies, or refused before it queues. The record holds the
/// reservation until the request ends.
async fn limit(
    generation: &Generation,
    request: &InferenceRequest<'_>,
    record: &mut Record,
) -> Result<(), Refusal> {
    let limiter = &generation.limiter;
    let tokens = limiter.tokens_to_reserve(request.prompt_tokens, request.max_output);
    let reservation = limiter
        .reserve(record.tenant(), &request.model, tokens)
        .instrument(stage_span!("limit"))
        .await?;
    record.reserved(reservation);
    Ok(())
}

/// The body a pool's replica gets before its band is known.
struct AskedUsage {
    body: Bytes,
    /// The gateway asked for the stream's usage in the client's place.
    strip_usage: bool,
}

/// A stream charged in tokens is settled to its usage: ask for it when the
/// client did not, and keep it from the client (stream_usage.rs).
fn ask_for_usage(request: &InferenceRequest<'_>, body: &Bytes, record: &Record) -> AskedUsage {
    let asked = (request.stream && record.charges_tokens())
        .then(|| stream_usage::ask_for_usage(body))
        .flatten();
    match asked {
        Some(body) => AskedUsage {
            body,
            strip_usage: true,
        },
        None => AskedUsage {
            body: body.clone(),
            strip_usage: false,
        },
    }
}

/// Stages 7 and 8: straight through when a replica has room, else wait in
/// line by band and fairness key; the picker chooses the replica (the
/// dispatcher picks for waiters).
async fn admit(
    generation: &Generation,
    route: &Route,
    received: &Received,
    request: &InferenceRequest<'_>,
    asked: &AskedUsage,
    session: Option<u64>,
    record: &mut Record,
) -> Result<(Ticket, OwnedPick, Admitted), ApiError> {
    let ticket = Ticket::from_request(
        &received.headers,
        &request.model,
        &generation.objectives,
        &generation.flow_control,
        asked.body.len() as u64,
        &received.caller,
    )?;
    let explain = generation.debug.decision_headers
        || record.is_sampled()
        || tracing::event_enabled!(target: DECISION_TARGET, tracing::Level::DEBUG);
    let runtime = route.pool.runtime();
    let adapter = route.adapter.as_deref();
    let mut pick = runtime.pick_request(request, adapter, explain);
    pick.session = session;
    let tenant_slo = generation
        .tenant(&received.caller.tenant)
        .and_then(|t| t.slo.as_ref());
    pick.slo = objectives(&received.headers, tenant_slo)?;
    record.objectives(ticket.band, pick.slo);
    // A pool that follows its engines' KV-cache events matches the prompt
    // against what they hold; else (or when it cannot) the picker guesses.
    pick.exact_prefix = runtime
        .exact_prefix(&asked.body, request, adapter)
        .instrument(stage_span!("match_prefix"))
        .await;
    if request.stream
        && let (Some(early), Some(every)) = (&received.early, runtime.admission().cold_heartbeat())
    {
        early.waiting_cold(every);
    }
    let admit_started = Instant::now();
    let admitted = runtime
        .admission()
        .admit(route.pool.name(), &ticket, pick.clone(), &[])
        .instrument(stage_span!("admit", priority = ticket.band.as_str()))
        .await;
    match admitted {
        Ok(admitted) => {
            record.waited(ticket.band, admitted.queue_wait);
            Ok((ticket, pick, admitted))
        }
        Err(e) => {
            if e.dropped_reason == Some(DropReason::WaitExpired) {
                record.waited(ticket.band, admit_started.elapsed());
            }
            Err(e)
        }
    }
}

/// The request's latency objectives, from `x-infergate-slo-ttft-ms`
/// (time to first token) and `x-infergate-slo-itl-ms` (time per output
/// token), each else from its tenant's `slo`: replicas predicted to miss
/// them are avoided (docs/picker.md).
fn objectives(
    headers: &HeaderMap,
    tenant: Option<&config::LatencyObjectives>,
) -> Result<Option<picker::Slo>, ApiError> {
    let millis = |name: &str| -> Result<Option<std::time::Duration>, ApiError> {
        let Some(value) = headers.get(name) else {
            return Ok(None);
        };
        value
            .to_str()
            .ok()
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|ms| ms.is_finite() && *ms > 0.0 && *ms < 1e9)
            .map(|ms| Some(std::time::Duration::from_secs_f64(ms / 1e3)))
            .ok_or_else(|| {
                ApiError::invalid_request(format!(
                    "{name} must be a positive number of milliseconds"
                ))
            })
    };
    let slo = picker::Slo {
        ttft: millis(SLO_TTFT_HEADER)?.or(tenant.and_then(|t| t.ttft)),
        itl: millis(SLO_ITL_HEADER)?.or(tenant.and_then(|t| t.itl)),
    };
    Ok((slo.ttft.is_some() || slo.itl.is_some()).then_some(slo))
}

const SLO_TTFT_HEADER: &str = "x-infergate-slo-ttft-ms";
const SLO_ITL_HEADER: &str = "x-infergate-slo-itl-ms";

/// Once admitted, a sampled copy for a mirror, sent off this task: the
/// client never waits for it. A mirror that keeps the model gets the body
/// as the pool got it before the gateway asked a stream for its usage.
#[allow(clippy::too_many_arguments)]
fn mirror(
    generation: &Generation,
    worker: WorkerId,
    received: &Received,
    request: &InferenceRequest<'_>,
    routed_body: &Bytes,
    asked: &AskedUsage,
    ids: Ids<'_>,
    record: &mut Record,
) {
    let Some(mirror) = generation.mirrors.sample(&request.model) else {
        return;
    };
    record.mirrored(mirror.metrics.clone());
    let body = if mirror.keeps_model() {
        routed_body
    } else {
        &asked.body
    };
    let caller = generation.auth.caller_fields(&received.caller);
    mirror.send(
        worker,
        ShadowRequest {
            method: received.method.clone(),
            uri: received.uri.clone(),
            headers: ShadowRequest::headers(&received.headers, caller),
            body: body.clone(),
            request_id: ids.request.clone(),
            traceparent: ids.traceparent.clone(),
            forwarded: received.forwarded.clone(),
            estimated_tokens: request.estimated_tokens,
            first_byte: generation.timeouts.first_byte(),
            idle: generation.timeouts.idle(),
        },
    );
}

/// What stages 2–8 decided: the body to send and where.
struct Decided {
    body: Bytes,
    target: Target,
}

/// Who answers the request.
// One per request, built once and matched at once: boxing the larger
// variant would cost an allocation and save nothing.
#[allow(clippy::large_enum_variant)]
enum Target {
    /// A local pool's replica, admitted by flow control.
    Replica {
        pool: Arc<Pool>,
        /// Its place in flow control, which a continuation takes again.
        ticket: Ticket,
        pick: OwnedPick,
        admitted: Admitted,
        /// The gateway asked for the stream's usage in the client's place.
        strip_usage: bool,
    },
    /// A global member, for a model no local pool serves.
    Members {
        model: Arc<str>,
        /// Residency tags the request is held to; anywhere when `None`.
        residency: Option<Vec<String>>,
    },
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
