//! Draining replicas by hand, for maintenance: the one part of the admin
//! listener that changes anything.
//!
//! - `POST /admin/pools/{pool}/replicas/{addr}/drain`, with an optional
//!   body `{"evacuate": true}`: the replica takes no new requests from
//!   now on; its requests in flight finish where they are until the pool's
//!   `drain.deadline`, then move to other replicas — at once with
//!   `evacuate`.
//! - `DELETE` on the same path undoes it; `GET` answers the state.
//! - `/admin/replicas/{addr}/drain` does the same in every pool that has
//!   the replica (a server serving two pools is maintained once).
//!
//! Each answer is the replica's state as JSON (a list of them for the
//! second form). `{addr}` is the replica's address as `/debug/pools`
//! shows it, percent-encoded where it needs to be (`[`, `]`, `/`).
//!
//! A `POST` must say `content-type: application/json`, a header no web
//! page can send to another origin without the listener's consent (which
//! it never gives): a page the operator's browser opens cannot drain
//! replicas behind its back.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Response, StatusCode, header};
use http_body_util::{BodyExt, Limited};
use serde_json::{Value, json};

use crate::generation::drain::DrainState;
use crate::generation::pool::{Pool, ReplicaState};
use crate::inbound::server::Request;
use crate::outbound::response_body::{ResponseBody, full};
use crate::state::State;

/// The paths served here start with this.
pub const PREFIX: &str = "/admin/";

/// The largest body a drain request may have.
const MAX_BODY: usize = 4096;
/// How long its body may take to arrive.
const BODY_TIMEOUT: Duration = Duration::from_secs(5);

/// Which replicas a path names.
enum Target<'a> {
    /// One pool's replica.
    InPool {
        pool: Cow<'a, str>,
        addr: Cow<'a, str>,
    },
    /// The replica in every pool that has it.
    Everywhere { addr: Cow<'a, str> },
}

fn target(path: &str) -> Option<Target<'_>> {
    let rest = path.strip_prefix(PREFIX)?.strip_suffix("/drain")?;
    let segments: Vec<&str> = rest.split('/').collect();
    match segments.as_slice() {
        ["pools", pool, "replicas", addr] => Some(Target::InPool {
            pool: decode(pool)?,
            addr: decode(addr)?,
        }),
        ["replicas", addr] => Some(Target::Everywhere {
            addr: decode(addr)?,
        }),
        _ => None,
    }
}

/// A path segment, percent-decoded; `None` when empty or not UTF-8.
fn decode(segment: &str) -> Option<Cow<'_, str>> {
    let decoded = percent_encoding::percent_decode_str(segment)
        .decode_utf8()
        .ok()?;
    (!decoded.is_empty()).then_some(decoded)
}

/// Whether `path` is one this module serves.
pub fn serves(path: &str) -> bool {
    target(path).is_some()
}

/// What was asked of the replicas.
#[derive(Clone, Copy)]
enum Ask {
    Show,
    Drain { evacuate: bool },
    Undrain,
}

pub async fn handle(state: Arc<State>, req: Request) -> Response<ResponseBody> {
    let path = req.uri.path().to_owned();
    let Some(target) = target(&path) else {
        return error(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no such path: {path}"),
        );
    };
    let ask = match req.method {
        Method::GET => Ask::Show,
        Method::DELETE => Ask::Undrain,
        Method::POST => match drain_body(req).await {
            Ok(evacuate) => Ask::Drain { evacuate },
            Err(refusal) => return refusal,
        },
        _ => {
            return error(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                format!(
                    "{} is not allowed on {path}: GET, POST or DELETE",
                    req.method
                ),
            );
        }
    };
    let generation = state.generation();
    match target {
        Target::InPool { pool, addr } => {
            let Some(found) = generation.pool(&pool) else {
                return error(
                    StatusCode::NOT_FOUND,
                    "pool_not_found",
                    format!("no pool named {pool:?}"),
                );
            };
            match apply(found, &addr, ask) {
                Some(replica) => json_response(replica_json(&replica)),
                None => error(
                    StatusCode::NOT_FOUND,
                    "replica_not_found",
                    format!("pool {pool:?} has no replica {addr:?}"),
                ),
            }
        }
        Target::Everywhere { addr } => {
            let replicas: Vec<Value> = generation
                .pools
                .iter()
                .filter_map(|pool| apply(pool, &addr, ask))
                .map(|replica| replica_json(&replica))
                .collect();
            if replicas.is_empty() {
                return error(
                    StatusCode::NOT_FOUND,
                    "replica_not_found",
                    format!("no pool has a replica {addr:?}"),
                );
            }
            json_response(json!({"replicas": replicas}))
        }
    }
}

fn apply(pool: &Pool, addr: &str, ask: Ask) -> Option<ReplicaState> {
    let runtime = pool.runtime();
    match ask {
        Ask::Show => runtime.replica(addr),
        Ask::Drain { evacuate } => runtime.drain(addr, evacuate),
        Ask::Undrain => runtime.undrain(addr),
    }
}

/// A drain request's `evacuate`, from its JSON body (none: `false`).
async fn drain_body(req: Request) -> Result<bool, Response<ResponseBody>> {
    let json_type = req
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
    if !json_type {
        return Err(error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            "a drain is asked with content-type: application/json (the body may be empty)",
        ));
    }
    let read = Limited::new(req.body, MAX_BODY).collect();
    let body = match tokio::time::timeout(BODY_TIMEOUT, read).await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(_)) => {
            return Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request",
                format!("the body is unreadable or longer than {MAX_BODY} bytes"),
            ));
        }
        Err(_) => {
            return Err(error(
                StatusCode::REQUEST_TIMEOUT,
                "request_timeout",
                "the body did not arrive in time",
            ));
        }
    };
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(false);
    }
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        #[serde(default)]
        evacuate: bool,
    }
    serde_json::from_slice::<Body>(&body)
        .map(|b| b.evacuate)
        .map_err(|e| {
            error(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                format!("the body must be {{\"evacuate\": true|false}}: {e}"),
            )
        })
}

/// A replica's state as the drain endpoints answer it.
pub fn replica_json(replica: &ReplicaState) -> Value {
    json!({
        "pool": &*replica.pool,
        "address": &*replica.addr,
        "member": replica.member,
        "draining": replica.draining,
        "evacuating": replica.evacuating,
        "inflightRequests": replica.inflight,
        "drain": replica.drain.as_ref().map(drain_json),
    })
}

/// Why and since when a replica drains, as `/debug/pools` and the drain
/// endpoints show it.
pub fn drain_json(d: &DrainState) -> Value {
    json!({
        "reason": d.why.as_str(),
        "byHand": d.by_hand,
        "drainingForMs": d.draining_for.as_millis() as u64,
        // null once evacuating.
        "evacuateInMs": d.evacuate_in.map(|t| t.as_millis() as u64),
    })
}

/// A draining replica that has left its pool, as `/debug/pools` lists it.
pub fn leaving_json(d: &DrainState) -> Value {
    json!({
        "address": &*d.addr,
        "evacuating": d.evacuating,
        "inflightRequests": d.inflight,
        "drain": drain_json(d),
    })
}

fn json_response(body: Value) -> Response<ResponseBody> {
    crate::respond::json(Bytes::from(body.to_string()))
}

/// An error in the OpenAI shape, as the rest of the gateway answers them.
fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response<ResponseBody> {
    let body = json!({"error": {
        "message": message.into(),
        "type": "invalid_request_error",
        "param": null,
        "code": code,
    }});
    let mut response = Response::new(full(Bytes::from(body.to_string())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_a_pool_and_an_address_percent_decoded() {
        match target("/admin/pools/llama/replicas/10.0.0.1:8000/drain") {
            Some(Target::InPool { pool, addr }) => {
                assert_eq!((&*pool, &*addr), ("llama", "10.0.0.1:8000"));
            }
            _ => panic!("a pool's replica"),
        }
        match target("/admin/replicas/%5Bfd00%3A%3A1%5D%3A8000/drain") {
            Some(Target::Everywhere { addr }) => assert_eq!(&*addr, "[fd00::1]:8000"),
            _ => panic!("every pool's replica"),
        }
        match target("/admin/pools/p/replicas/https%3A%2F%2Fa.example%3A8443/drain") {
            Some(Target::InPool { addr, .. }) => assert_eq!(&*addr, "https://a.example:8443"),
            _ => panic!("an https replica"),
        }
        for path in [
            "/admin/pools/p/replicas/a/drained",
            "/admin/pools/p/replicas//drain",
            "/admin/pools/p/a/drain",
            "/admin/replicas/a/b/drain",
            "/debug/pools",
        ] {
            assert!(target(path).is_none(), "{path}");
        }
    }
}
