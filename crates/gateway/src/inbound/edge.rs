//! What the public listener lets through to the pipeline: request targets
//! of sane length and shape, a `Host` where HTTP/1.1 requires one, and
//! only the paths of inference endpoints. An engine's admin endpoints
//! (vLLM's `/v1/load_lora_adapter`, for one) share the `/v1/` prefix with
//! them, so forwarding every `POST /v1/*` would hand them to any client.

use std::collections::HashSet;

use http::{Version, header};

use crate::error::ApiError;
use crate::headers;
use crate::inbound::server::Request;

/// Longest request target accepted (path and query). OpenAI-style APIs
/// carry everything in the body; nginx's default line buffer is 8 KiB.
pub const TARGET_LIMIT: usize = 8 * 1024;

/// `GET /v1/models/{id}`: one model or adapter, answered by the gateway.
pub const MODEL_PREFIX: &str = "/v1/models/";

/// The inference endpoints forwarded to replicas by default: OpenAI's, and
/// those the engines serve in the same shape (a JSON body with `model`).
pub const INFERENCE_PATHS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/messages",
    "/v1/rerank",
    "/v1/score",
    "/v1/moderations",
    "/v1/audio/speech",
    "/v1/images/generations",
];

/// The paths forwarded to replicas.
#[derive(Debug)]
pub struct ForwardedPaths(HashSet<String>);

impl ForwardedPaths {
    /// The inference endpoints and the operator's `extra`.
    pub fn new(extra: &[String]) -> Self {
        let paths = INFERENCE_PATHS.iter().map(|p| (*p).to_owned());
        Self(paths.chain(extra.iter().cloned()).collect())
    }

    pub fn forwards(&self, path: &str) -> bool {
        self.0.contains(path)
    }
}

/// Refuse what no route should see: a target over [`TARGET_LIMIT`], an
/// HTTP/1.1 request without exactly one `Host` (RFC 9112 §3.2), a transfer
/// coding other than one `chunked`, a path that is not plain.
pub fn check(req: &Request) -> Result<(), ApiError> {
    let target = req.uri.path_and_query().map_or(0, |pq| pq.as_str().len());
    if target > TARGET_LIMIT {
        return Err(ApiError::target_too_long(TARGET_LIMIT));
    }
    let hosts = req.headers.get_all(header::HOST).iter().count();
    let host_ok = match req.version {
        Version::HTTP_11 => headers::single(&req.headers, &header::HOST).is_some(),
        // HTTP/1.0 may leave it out; HTTP/2 has `:authority`.
        _ => hosts <= 1,
    };
    if !host_ok {
        return Err(ApiError::malformed(
            "an HTTP/1.1 request must carry exactly one Host header",
        ));
    }
    // hyper reads a body by its last coding, `chunked`; one chunked twice,
    // or gzipped under it, would reach the replica still encoded.
    if !headers::plain_transfer_coding(&req.headers) {
        return Err(ApiError::malformed(
            "a request body may use no transfer coding but a single chunked",
        ));
    }
    // The gateway answers `/v1/models/{id}` itself, never a replica, and
    // SDKs %-encode the slash of an id such as `meta-llama/Llama-3.1-8B`.
    if !is_plain(req.uri.path()) && !req.uri.path().starts_with(MODEL_PREFIX) {
        return Err(ApiError::invalid_path());
    }
    Ok(())
}

/// Whether a path means what it says to every server that might read it:
/// no dot segments, no %-encoding (of slashes, dots or anything else: no
/// route here needs it), no backslashes.
fn is_plain(path: &str) -> bool {
    !path.contains(['%', '\\'])
        && path
            .split('/')
            .all(|segment| segment != "." && segment != "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dot_segments_encodings_and_backslashes_are_not_plain() {
        for path in [
            "/v1/../admin",
            "/v1/./chat/completions",
            "/v1/chat/completions/..",
            "/v1/%2e%2e/admin",
            "/v1/chat%2fcompletions",
            "/v1/chat%2Fcompletions",
            "/v1\\chat",
        ] {
            assert!(!is_plain(path), "{path}");
        }
        for path in ["/v1/chat/completions", "/v1/models", "/", "/v1/a.b/c..d"] {
            assert!(is_plain(path), "{path}");
        }
    }

    #[test]
    fn only_inference_endpoints_and_the_operators_are_forwarded() {
        let paths = ForwardedPaths::new(&["/v1/load_lora_adapter".to_owned()]);
        assert!(paths.forwards("/v1/chat/completions"));
        assert!(paths.forwards("/v1/load_lora_adapter"));
        assert!(!paths.forwards("/v1/unload_lora_adapter"));
        assert!(!ForwardedPaths::new(&[]).forwards("/v1/load_lora_adapter"));
    }
}
