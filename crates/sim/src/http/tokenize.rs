//! `POST /tokenize`, as vLLM serves it: a prompt's token ids as the engine
//! would get them, so a gateway can key a simulated replica's KV events (or
//! count tokens) without a tokenizer of its own.
//!
//! The ids come from the functions the generating endpoints tokenize with
//! (`chat_prompt`, `Prompt::tokens`), so they are the engine's for the same
//! body. The engine is not involved: no faults, no queueing.

use http::{Response, StatusCode};
use hyper::body::Incoming;

use super::body::{ApiError, ResponseBody, json, read_body};
use super::openai::{TokenizeRequest, chat_prompt};
use super::state::AppState;
use crate::metrics::Dialect;

pub(super) async fn handle(state: &AppState, body: Incoming) -> Response<ResponseBody> {
    match tokenize(state, body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn tokenize(state: &AppState, body: Incoming) -> Result<Response<ResponseBody>, ApiError> {
    let bytes = read_body(body).await?;
    let request: TokenizeRequest = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("Invalid request body: {e}")))?;
    state.resolve_model(request.model.as_deref())?;
    let tokens = match (&request.messages, &request.prompt) {
        (Some(messages), _) => {
            chat_prompt(
                messages,
                request.add_generation_prompt,
                request.continue_final_message,
                state.seed,
                state.dialect == Dialect::Llamacpp,
            )
            .map_err(ApiError::bad_request)?
            .tokens
        }
        (None, Some(prompt)) => prompt
            .tokens()
            .map_err(|message| ApiError::bad_request(message).with_param("prompt"))?,
        (None, None) => {
            return Err(ApiError::bad_request(
                "Send either `prompt` (a completion) or `messages` (a chat).",
            ));
        }
    };
    Ok(json(
        StatusCode::OK,
        &serde_json::json!({
            "count": tokens.len(),
            "max_model_len": state.max_model_len,
            "tokens": tokens,
        }),
    ))
}
