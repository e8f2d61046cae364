//! A request for a model no local pool serves, sent to a member: the one
//! the picker chooses, then the next of its group while an attempt fails
//! before the first response byte (no connection, or a 5xx or 429 head).
//! Once a member's answer is passed on it is never sent again, so a
//! stream already running is never duplicated. Every attempt's outcome
//! feeds the member's health.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, Response, StatusCode, Uri, header};

use super::answer_body::MemberBody;
use super::member::{InFlight, Member, Outcome, noted};
use super::roster::{Choice, Roster};
use crate::error::ApiError;
use crate::generation::Generation;
use crate::outbound;
use crate::outbound::response_body::ResponseBody;
use crate::record::Record;
use crate::respond::refuse;
use crate::state::State;

/// Decision header naming the member that answered.
pub const X_MEMBER: &str = "x-infergate-member";

/// What the members need of the request.
pub struct MemberRequest<'a> {
    pub method: &'a Method,
    pub uri: &'a Uri,
    pub body: &'a Bytes,
    /// The request as a replica would get it (headers, ids, caller).
    pub outgoing: outbound::Outgoing<'a>,
    /// The model the body names (after a rewrite, if any).
    pub model: &'a str,
    /// Residency tags the request is held to; anywhere when `None`.
    pub residency: Option<Vec<String>>,
}

/// Send the request to its member and pass the answer on.
pub async fn forward(
    state: &State,
    generation: &Arc<Generation>,
    request: MemberRequest<'_>,
    mut record: Record,
) -> Response<ResponseBody> {
    let Some(roster) = state.members.roster() else {
        return refuse(record, ApiError::model_not_found(request.model));
    };
    let choice = match roster.choose(request.model, request.residency.as_deref(), &state.metrics) {
        Ok(c) => c,
        Err(no) => {
            return refuse(record, no_member(&no.message(request.model)));
        }
    };
    let Choice {
        order, fallback, ..
    } = choice;
    let tier = if fallback {
        "global:fallback"
    } else {
        "global"
    };
    record.routed(Arc::from(tier), None);
    let mut headers = request.outgoing.header_map();
    headers.remove(header::CONTENT_LENGTH);
    let mut last_failure: Option<ApiError> = None;
    for (attempt, member) in order.iter().enumerate() {
        let last = attempt + 1 == order.len();
        record.sent_to_member(member.name());
        let Some(mapped) = member.model_for(request.model) else {
            continue;
        };
        let body = if mapped == request.model {
            request.body.clone()
        } else {
            match crate::route::rewrite::model_field::with_model(request.body, &mapped) {
                Some(b) => b,
                None => {
                    return refuse(record, ApiError::missing_model("`model` must be a string."));
                }
            }
        };
        let in_flight = InFlight::new(Arc::clone(member));
        let sent = send(
            state, generation, &roster, &request, &headers, member, body, last,
        );
        record.reached_replica(true);
        let failure = match sent.await {
            Attempt::Answered(response) => {
                return pass_on(generation, response, member, in_flight, record, fallback);
            }
            Attempt::Failed(error) => return refuse(record, error),
            Attempt::Next(failure) => failure,
        };
        if !last {
            let next = order[attempt + 1].name();
            tracing::warn!(member = member.name(), next, error = %failure.message,
                "failover: request failed at the member before any answer; retried on the next member");
            state.metrics.count_member_failover(member.name());
            record.retried();
        }
        last_failure = Some(failure);
    }
    refuse(
        record,
        last_failure.unwrap_or_else(|| no_member("no member could take the request")),
    )
}

/// How one attempt at a member went.
enum Attempt {
    /// An answer to pass on.
    Answered(reqwest::Response),
    /// The member may be generating: never sent again.
    Failed(ApiError),
    /// Failed before any answer: the next member may try.
    Next(ApiError),
}

/// One attempt at `member`, its outcome fed to the member's health. A
/// throttled or failing answer is passed on only from the `last` member.
#[allow(clippy::too_many_arguments)]
async fn send(
    state: &State,
    generation: &Generation,
    roster: &Roster,
    request: &MemberRequest<'_>,
    headers: &HeaderMap,
    member: &Member,
    body: Bytes,
    last: bool,
) -> Attempt {
    let mut sent_headers = headers.clone();
    if let Some(auth) = &member.authorization {
        sent_headers.insert(header::AUTHORIZATION, auth.clone());
    }
    let url = format!(
        "{}{}",
        member.base_url,
        request.uri.path_and_query().map_or("/", |p| p.as_str())
    );
    let send = roster
        .client
        .request(request.method.clone(), &url)
        .headers(sent_headers)
        .body(body)
        .send();
    let answer = tokio::time::timeout(generation.timeouts.first_byte(), send).await;
    let now = Instant::now();
    let who = format!("member {}", member.name());
    match answer {
        Err(_elapsed) => {
            outcome(state, member, Outcome::Failed, now);
            Attempt::Failed(ApiError::upstream_timeout(&who))
        }
        Ok(Err(e)) => {
            outcome(state, member, Outcome::Failed, now);
            Attempt::Next(ApiError::upstream_failed(&who, &error_chain(&e)))
        }
        Ok(Ok(response)) => {
            let status = response.status();
            let kind = match status {
                s if s.is_server_error() => Outcome::Failed,
                StatusCode::TOO_MANY_REQUESTS => Outcome::Throttled,
                _ => Outcome::Answered,
            };
            outcome(state, member, kind, now);
            if kind == Outcome::Answered || last {
                Attempt::Answered(response)
            } else {
                Attempt::Next(ApiError::upstream_failed(
                    &who,
                    &format!("it answered {status}"),
                ))
            }
        }
    }
}

fn outcome(state: &State, member: &Member, outcome: Outcome, now: Instant) {
    state
        .metrics
        .count_member_request(member.name(), outcome.as_str());
    noted(member, member.on_outcome(outcome, now), &state.metrics);
}

fn pass_on(
    generation: &Arc<Generation>,
    response: reqwest::Response,
    member: &Arc<Member>,
    in_flight: InFlight,
    mut record: Record,
    fallback: bool,
) -> Response<ResponseBody> {
    let status = response.status();
    let answer: http::Response<reqwest::Body> = response.into();
    let (parts, body) = answer.into_parts();
    record.on_response(status, &parts.headers);
    let mut headers = HeaderMap::with_capacity(parts.headers.len() + 2);
    for (name, value) in crate::headers::end_to_end(&parts.headers) {
        headers.append(name.clone(), value.clone());
    }
    record.rate_headers(&mut headers);
    if generation.debug.decision_headers {
        if let Ok(v) = HeaderValue::from_str(member.name()) {
            headers.insert(X_MEMBER, v);
        }
        if fallback {
            headers.insert("x-infergate-tier", HeaderValue::from_static("fallback"));
        }
    }
    let sse = crate::headers::is_event_stream(&parts.headers);
    let keep = Arc::clone(generation) as _;
    let body = MemberBody::new(body, sse, in_flight, record, keep);
    let mut out = Response::new(ResponseBody::Member(Box::new(body)));
    *out.status_mut() = status;
    *out.headers_mut() = headers;
    out
}

/// 503 in the OpenAI shape: no member may take the request, and why.
fn no_member(why: &str) -> ApiError {
    ApiError::no_member(why)
}

/// The error and its causes, which say what failed (reqwest's own
/// message alone is "error sending request").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
