//! The messages the picker sends back to the data plane.

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::header_value_option::HeaderAppendAction;
use envoy_types::pb::envoy::config::core::v3::{HeaderValue, HeaderValueOption};
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, ImmediateResponse,
    ProcessingResponse, StreamedBodyResponse, TrailersResponse, body_mutation::Mutation,
    processing_response::Response,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use http_body_util::BodyExt;

use super::protocol;
use crate::outbound::response_body::ResponseBody;

/// Bytes of body sent back in one streamed mutation: well under the
/// 4 MiB a gRPC message may carry by default.
const BODY_CHUNK: usize = 64 * 1024;

fn respond(response: Response) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(response),
        ..Default::default()
    }
}

/// Set (replacing any the client sent) each header.
pub fn set_headers(headers: &[(&str, String)]) -> HeaderMutation {
    HeaderMutation {
        set_headers: headers
            .iter()
            .map(|(name, value)| HeaderValueOption {
                header: Some(HeaderValue {
                    key: (*name).to_owned(),
                    raw_value: value.clone().into_bytes(),
                    ..Default::default()
                }),
                append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
                ..Default::default()
            })
            .collect(),
        remove_headers: Vec::new(),
    }
}

/// Go on, unchanged.
pub fn request_headers_continue() -> ProcessingResponse {
    respond(Response::RequestHeaders(HeadersResponse::default()))
}

pub fn response_headers_continue() -> ProcessingResponse {
    respond(Response::ResponseHeaders(HeadersResponse::default()))
}

pub fn request_body_continue() -> ProcessingResponse {
    respond(Response::RequestBody(BodyResponse::default()))
}

pub fn response_body_continue() -> ProcessingResponse {
    respond(Response::ResponseBody(BodyResponse::default()))
}

pub fn request_trailers_continue() -> ProcessingResponse {
    respond(Response::RequestTrailers(TrailersResponse::default()))
}

pub fn response_trailers_continue() -> ProcessingResponse {
    respond(Response::ResponseTrailers(TrailersResponse::default()))
}

/// The decision, where the request's headers are still held: `headers`
/// (the destination first) set and the route recomputed for them; the
/// caller puts the destination in the dynamic metadata as well.
fn picked(headers: HeaderMutation, body: Option<Mutation>) -> CommonResponse {
    CommonResponse {
        header_mutation: Some(headers),
        body_mutation: body.map(|m| BodyMutation { mutation: Some(m) }),
        clear_route_cache: true,
        ..Default::default()
    }
}

/// FULL_DUPLEX_STREAMED: the headers answered with the decision, then the
/// body sent back whole as streamed mutations.
pub fn picked_streamed(
    headers: HeaderMutation,
    endpoints: &str,
    body: &Bytes,
) -> Vec<ProcessingResponse> {
    let mut answers = Vec::with_capacity(1 + body.len() / BODY_CHUNK + 1);
    answers.push(ProcessingResponse {
        response: Some(Response::RequestHeaders(HeadersResponse {
            response: Some(picked(headers, None)),
        })),
        dynamic_metadata: Some(protocol::destination(endpoints)),
        ..Default::default()
    });
    let chunks: Vec<&[u8]> = if body.is_empty() {
        vec![&[]]
    } else {
        body.chunks(BODY_CHUNK).collect()
    };
    let last = chunks.len() - 1;
    for (i, chunk) in chunks.into_iter().enumerate() {
        answers.push(respond(Response::RequestBody(BodyResponse {
            response: Some(CommonResponse {
                body_mutation: Some(BodyMutation {
                    mutation: Some(Mutation::StreamedResponse(StreamedBodyResponse {
                        body: chunk.to_vec(),
                        end_of_stream: i == last,
                        ..Default::default()
                    })),
                }),
                ..Default::default()
            }),
        })));
    }
    answers
}

/// BUFFERED: the body answered with the decision in its headers, and the
/// body replaced when the picker changed it.
pub fn picked_buffered(
    headers: HeaderMutation,
    endpoints: &str,
    changed: Option<&Bytes>,
) -> ProcessingResponse {
    let body = changed.map(|b| Mutation::Body(b.to_vec()));
    ProcessingResponse {
        response: Some(Response::RequestBody(BodyResponse {
            response: Some(picked(headers, body)),
        })),
        dynamic_metadata: Some(protocol::destination(endpoints)),
        ..Default::default()
    }
}

/// The answer's body (BUFFERED) with what the client gets of it.
pub fn response_body_replaced(body: Vec<u8>) -> ProcessingResponse {
    respond(Response::ResponseBody(BodyResponse {
        response: Some(CommonResponse {
            body_mutation: Some(BodyMutation {
                mutation: Some(Mutation::Body(body)),
            }),
            ..Default::default()
        }),
    }))
}

/// A chunk of the answer passed back as it came (FULL_DUPLEX_STREAMED).
pub fn response_body_echo(body: Vec<u8>, end_of_stream: bool) -> ProcessingResponse {
    respond(Response::ResponseBody(BodyResponse {
        response: Some(CommonResponse {
            body_mutation: Some(BodyMutation {
                mutation: Some(Mutation::StreamedResponse(StreamedBodyResponse {
                    body,
                    end_of_stream,
                    ..Default::default()
                })),
            }),
            ..Default::default()
        }),
    }))
}

/// The picker answers the client itself (a refusal), as the gateway's
/// own listeners would: the same status, headers and OpenAI-shaped body.
pub async fn immediate(response: http::Response<ResponseBody>) -> ProcessingResponse {
    let (head, body) = response.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let headers: Vec<(&str, String)> = head
        .headers
        .iter()
        .filter_map(|(name, value)| Some((name.as_str(), value.to_str().ok()?.to_owned())))
        .collect();
    respond(Response::ImmediateResponse(ImmediateResponse {
        status: Some(HttpStatus {
            code: i32::from(head.status.as_u16()),
        }),
        headers: Some(set_headers(&headers)),
        body: body.to_vec(),
        details: format!("infergate_{}", head.status.as_u16()),
        ..Default::default()
    }))
}
