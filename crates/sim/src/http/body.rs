//! Request and response bodies: reading a request's within its limit, and
//! the small response builders every route uses.

use std::convert::Infallible;

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full, Limited};
use hyper::body::Incoming;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// Largest request body accepted (a long prompt is a few MB of JSON).
const MAX_BODY_BYTES: usize = 32 * 1024 * 1024;

/// The body type of every response: a full buffer or a token stream.
pub type ResponseBody = UnsyncBoxBody<Bytes, Infallible>;

pub fn boxed<B>(body: B) -> ResponseBody
where
    B: http_body::Body<Data = Bytes, Error = Infallible> + Send + 'static,
{
    body.boxed_unsync()
}

/// A body that keeps `held` alive until it is dropped (when the response has
/// been written, or its connection is gone).
pub struct Holding<B, T> {
    inner: B,
    _held: T,
}

impl<B, T> Holding<B, T> {
    pub fn new(inner: B, held: T) -> Self {
        Self { inner, _held: held }
    }
}

impl<B, T> http_body::Body for Holding<B, T>
where
    B: http_body::Body + Unpin,
    T: Unpin,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        std::pin::Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

pub fn empty(status: StatusCode) -> Response<ResponseBody> {
    with_status(status, boxed(Empty::new()))
}

pub fn text(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<ResponseBody> {
    let mut response = with_status(status, boxed(Full::new(body.into())));
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

pub fn json(status: StatusCode, value: &impl Serialize) -> Response<ResponseBody> {
    let bytes = serde_json::to_vec(value).expect("response types serialize");
    text(status, "application/json", bytes)
}

fn with_status(status: StatusCode, body: ResponseBody) -> Response<ResponseBody> {
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response
}

/// An OpenAI-shaped error as vLLM writes it:
/// `{"error": {"message", "type", "param", "code"}}` with the HTTP status as
/// `code`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<&'static str>,
}

impl ApiError {
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "BadRequestError", message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "NotFoundError", message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalServerError",
            message,
        )
    }

    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
        }
    }

    pub fn with_param(mut self, param: &'static str) -> Self {
        self.param = Some(param);
        self
    }

    /// The JSON value of the error body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.status.as_u16(),
            }
        })
    }

    pub fn into_response(self) -> Response<ResponseBody> {
        json(self.status, &self.body())
    }
}

/// Reads a request body, refusing bodies over [`MAX_BODY_BYTES`].
pub async fn read_body(body: Incoming) -> Result<Bytes, ApiError> {
    match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "BadRequestError",
            format!("The request body exceeds {MAX_BODY_BYTES} bytes."),
        )),
        Err(error) => Err(ApiError::bad_request(format!(
            "Could not read the request body: {error}"
        ))),
    }
}

/// Reads and parses a JSON body; malformed JSON is a 400.
pub async fn read_json<T: DeserializeOwned>(body: Incoming) -> Result<T, ApiError> {
    let bytes = read_body(body).await?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("Invalid request body: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_have_the_openai_shape() {
        let error = ApiError::not_found("The model `x` does not exist.").with_param("model");
        assert_eq!(
            error.body(),
            serde_json::json!({"error": {
                "message": "The model `x` does not exist.",
                "type": "NotFoundError",
                "param": "model",
                "code": 404
            }})
        );
        let response = ApiError::internal("boom").into_response();
        assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(response.headers()[header::CONTENT_TYPE], "application/json");
    }
}
