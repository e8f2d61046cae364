//! The request phase: the head the data plane received (who is asking,
//! for what path, within which subset), the body, and the decision — the
//! pipeline's own stages (pipeline.rs: parse, route, authorize, limit,
//! admit), run on what the data plane passed.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use envoy_types::pb::envoy::config::core::v3::{HeaderMap as EnvoyHeaders, Metadata};
use http::{HeaderMap, HeaderName, HeaderValue, Response};
use tokio::time::Instant;

use super::protocol::{FAIRNESS_ID, OBJECTIVE};
use crate::auth::Identity;
use crate::error::ApiError;
use crate::flow::{Admitted, Candidates, FAIRNESS_HEADER, PRIORITY_HEADER, host_port};
use crate::generation::Generation;
use crate::generation::pool::Pool;
use crate::inbound::read_body::Held;
use crate::outbound::Forwarded;
use crate::outbound::response_body::ResponseBody;
use crate::pipeline::{self, Ids, Relayed, Target};
use crate::record::Record;
use crate::respond::{json, refuse};
use crate::state::State;
use crate::telemetry::{self, trace_context};

/// What the picker answers the client with itself: a refusal, or the
/// model list.
pub type OwnAnswer = Response<ResponseBody>;

/// The request's head, its caller known.
pub struct Head {
    uri: http::Uri,
    headers: HeaderMap,
    caller: Identity,
    candidates: Option<Candidates>,
    forwarded: Forwarded,
    request_id: HeaderValue,
    traceparent: HeaderValue,
    pub record: Box<Record>,
}

/// The pseudo-headers and headers of `envoy`, as an HTTP head: the path,
/// and every regular header (values Envoy sends in `raw_value`, or in
/// `value` for older versions).
fn split_head(envoy: Option<&EnvoyHeaders>) -> (Option<String>, Option<String>, HeaderMap) {
    let mut path = None;
    let mut method = None;
    let mut headers = HeaderMap::new();
    for h in envoy.map(|h| h.headers.as_slice()).unwrap_or_default() {
        let value = if h.raw_value.is_empty() {
            h.value.as_bytes()
        } else {
            &h.raw_value
        };
        if h.key == ":path" {
            path = Some(String::from_utf8_lossy(value).into_owned());
        } else if h.key == ":method" {
            method = Some(String::from_utf8_lossy(value).into_owned());
        } else if !h.key.starts_with(':')
            && let (Ok(name), Ok(value)) = (
                HeaderName::from_bytes(h.key.as_bytes()),
                HeaderValue::from_bytes(value),
            )
        {
            headers.append(name, value);
        }
    }
    (method, path, headers)
}

/// The protocol's identity headers, as infergate's own flow control
/// reads them: the fairness id divides the caller's turns; the objective
/// names a band (`critical`, `standard`, `sheddable`) or a model whose
/// band the config's `objectives` set. infergate's own headers win.
fn translate(headers: &mut HeaderMap, generation: &Generation) {
    if !headers.contains_key(FAIRNESS_HEADER)
        && let Some(id) = headers.get(FAIRNESS_ID).cloned()
    {
        headers.insert(FAIRNESS_HEADER, id);
    }
    if !headers.contains_key(PRIORITY_HEADER)
        && let Some(objective) = headers.get(OBJECTIVE).and_then(|v| v.to_str().ok())
    {
        let band = config::Priority::parse(objective)
            .or_else(|| generation.objectives.get(objective).copied());
        if let Some(band) = band {
            headers.insert(PRIORITY_HEADER, HeaderValue::from_static(band.as_str()));
        }
    }
}

/// The request headers arrived: who the caller is (stage 2, as the
/// gateway's listeners authenticate), and the request's record from now.
pub async fn head(
    state: &State,
    generation: &Generation,
    envoy: Option<&EnvoyHeaders>,
    metadata: Option<&Metadata>,
    peer: SocketAddr,
) -> Result<Head, OwnAnswer> {
    let start = Instant::now();
    let (method, path, mut headers) = split_head(envoy);
    let request_id = pipeline::request_id(&headers);
    let path = path.unwrap_or_else(|| "/".to_owned());
    // The model list, which clients ask the same route for: answered by
    // the picker from its routes, as its own listeners answer it.
    if method.as_deref() == Some("GET") && path == "/v1/models" {
        return Err(models(state, generation, &headers).await);
    }
    // Only the paths the gateway's own listeners forward are picked for:
    // an engine's admin endpoints stay out of reach unless listed.
    let Ok(uri) = path.parse::<http::Uri>() else {
        return Err(ApiError::invalid_path().into_response());
    };
    if !generation.forwarded_paths.forwards(uri.path()) {
        return Err(ApiError::not_found(uri.path()).into_response());
    }
    let span = telemetry::request_span(&http::Method::POST, &path, &request_id);
    // A mirror's copy carries the trace on, as the gateway's own do.
    let sampling = generation.trace_sampling(peer.ip());
    let (trace, traceparent) = trace_context::upstream(&headers, &span, sampling);
    let feed = state.decisions.sample(start);
    let record = Box::new(Record::new(
        request_id.clone(),
        start,
        span,
        Some(trace.trace_id),
        feed,
    ));
    if state.is_shutting_down() {
        return Err(refuse(*record, ApiError::shutting_down()));
    }
    translate(&mut headers, generation);
    let mut record = record;
    let caller = match pipeline::authenticate_headers(state, generation, &headers, None).await {
        Ok(caller) => caller,
        Err(e) => return Err(refuse(*record, e)),
    };
    record.identified(caller.as_logged());
    // The client's address is the data plane's to tell (X-Forwarded-For
    // from a trusted proxy); the peer here is the data plane.
    let forwarded = Forwarded::new(&headers, peer, "http", &generation.trusted_proxies);
    Ok(Head {
        uri,
        headers,
        caller,
        candidates: super::protocol::subset_hint(metadata),
        forwarded,
        request_id,
        traceparent,
        record,
    })
}

/// `GET /v1/models`: the models the caller may use.
async fn models(state: &State, generation: &Generation, headers: &HeaderMap) -> OwnAnswer {
    match pipeline::authenticate_headers(state, generation, headers, None).await {
        Ok(caller) if caller.may_use_all() => json(generation.routes.models_json()),
        Ok(caller) => json(generation.routes.models_json_where(|id| caller.may_use(id))),
        Err(e) => e.into_response(),
    }
}

/// The request body as it arrives, within the gateway's limit and its
/// budget of buffered bytes.
pub struct Body {
    bytes: BytesMut,
    held: Held,
    limit: u64,
}

impl Body {
    pub fn new(generation: &Generation) -> Self {
        Self {
            bytes: BytesMut::new(),
            held: Held::none(),
            limit: generation.limits.max_body_bytes(),
        }
    }

    pub async fn push(&mut self, state: &State, chunk: &[u8]) -> Result<(), ApiError> {
        if (self.bytes.len() + chunk.len()) as u64 > self.limit {
            return Err(ApiError::body_too_large(self.limit));
        }
        state
            .body_budget
            .take(chunk.len() as u64, &mut self.held)
            .await?;
        self.bytes.extend_from_slice(chunk);
        Ok(())
    }
}

/// The decision: the replica admitted, the endpoints the data plane is
/// told (the chosen one first), the body it sends.
pub struct Picked {
    pub pool: Arc<Pool>,
    pub admitted: Admitted,
    /// The chosen replica, then fallbacks in the picker's order.
    pub endpoints: String,
    pub body: Bytes,
    /// The body differs from the client's (a rewritten model, the band's
    /// priority for the engine).
    pub changed: bool,
    /// The model served, when a rewrite chose another than the client's.
    pub rewritten: Option<Arc<str>>,
    /// The picker asked the stream for its usage in the client's place
    /// (a token limit settles on it): the usage event is taken out of the
    /// answer on its way back.
    pub strip_usage: bool,
    pub record: Box<Record>,
}

/// Stages 3–8 on the whole request; a refusal is answered by the picker.
pub async fn decide(
    state: &State,
    generation: &Generation,
    head: Head,
    body: Body,
    fallbacks: usize,
) -> Result<Picked, OwnAnswer> {
    let Head {
        uri,
        headers,
        caller,
        candidates,
        forwarded,
        request_id,
        traceparent,
        mut record,
    } = head;
    let original = body.bytes.freeze();
    let received = Relayed {
        uri,
        headers,
        body: original.clone(),
        forwarded,
        caller,
        candidates: candidates.clone(),
        held: body.held,
    }
    .into();
    let ids = Ids {
        request: &request_id,
        traceparent: &traceparent,
    };
    // The picker runs no workers of its own: a mirror's copy goes out
    // through the first worker's connections.
    let decided = match pipeline::decide(state, generation, 0, &received, &mut record, ids).await {
        Ok(decided) => decided,
        Err(refusal) => return Err(refuse(*record, refusal)),
    };
    let (pool, admitted, strip_usage) = match decided.target {
        Target::Replica {
            pool,
            admitted,
            strip_usage,
            ..
        } => (pool, admitted, strip_usage),
        // A model only global members serve has no replica here to pick.
        Target::Members { model, .. } => {
            return Err(refuse(*record, ApiError::model_not_found(&model)));
        }
    };
    pool.metrics().count_decision(&admitted.decision);
    record.picked(&admitted.decision);
    let endpoints = endpoint_list(&pool, &admitted, candidates.as_ref(), fallbacks);
    let rewritten = record.served().map(|s| Arc::clone(&s.model));
    Ok(Picked {
        changed: decided.body != original,
        body: decided.body,
        pool,
        admitted,
        endpoints,
        rewritten,
        strip_usage,
        record,
    })
}

/// The chosen replica, then up to `fallbacks` others the data plane may
/// fall back to: in the picker's order when it explained its scores, else
/// the least loaded first; never one outside the subset, unreachable or
/// draining.
fn endpoint_list(
    pool: &Pool,
    admitted: &Admitted,
    candidates: Option<&Candidates>,
    fallbacks: usize,
) -> String {
    let chosen = &admitted.decision.endpoint;
    let eligible = |e: &picker::Endpoint| {
        e.index != chosen.index
            && e.is_reachable()
            && !e.draining()
            && candidates.is_none_or(|c| c.0.iter().any(|a| a == host_port(&e.addr)))
    };
    let mut list = vec![host_port(&chosen.addr).to_owned()];
    let scored = &admitted.decision.scores;
    if scored.len() > 1 {
        list.extend(
            scored
                .iter()
                .filter(|s| eligible(&s.endpoint))
                .take(fallbacks)
                .map(|s| host_port(&s.endpoint.addr).to_owned()),
        );
    } else {
        let endpoints = pool.runtime().picker().endpoints();
        let mut others: Vec<_> = endpoints.iter().filter(|e| eligible(e)).collect();
        others.sort_by_key(|e| e.load.requests());
        list.extend(
            others
                .into_iter()
                .take(fallbacks)
                .map(|e| host_port(&e.addr).to_owned()),
        );
    }
    list.join(",")
}
