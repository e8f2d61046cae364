//! `POST /v1/embeddings` in the OpenAI shape.
//!
//! `input` is a string, a list of strings, a list of token ids or a list of
//! token-id lists; text goes through the simulator's tokenizer as a
//! completion prompt does. Each input runs through the engine as a prefill
//! (an engine request for one token, which the engine emits at the end of
//! the prompt's last prefill chunk, with no decode step), so an embedding
//! queues, batches, hits the prefix cache and takes time like the prompt
//! half of a completion on the same replica.
//!
//! The vectors are deterministic: a unit vector seeded by `--seed` and the
//! input's token ids, so the same input gets the same vector on every
//! replica and in every run, and different inputs get unrelated (nearly
//! orthogonal) vectors. Their size is the model's hidden size unless
//! `dimensions` asks for fewer; a shorter vector is the start of the full
//! one, normalized again (as Matryoshka embeddings are).

use std::sync::Arc;

use http::{Response, StatusCode};
use hyper::body::Incoming;
use kv_events::tokenizer;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Deserialize;
use serde_json::{Value, json};

use super::body::{ApiError, ResponseBody, json as json_response, read_body};
use super::generate;
use super::openai::unix_now;
use super::output::content_seed;
use super::state::AppState;
use crate::replica::Generation;

/// Inputs accepted in one request (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;
/// Vector size when the model's profile is unknown.
const FALLBACK_DIMENSIONS: usize = 4096;

#[derive(Debug, Deserialize)]
struct EmbeddingRequest {
    #[serde(default)]
    model: Option<String>,
    input: Input,
    #[serde(default)]
    dimensions: Option<i64>,
    #[serde(default)]
    encoding_format: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum Input {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

impl Input {
    /// The token ids of each input.
    fn token_lists(self) -> Vec<Vec<u32>> {
        match self {
            Input::Text(text) => vec![tokenizer::encode_prompt(&text)],
            Input::Texts(texts) => texts.iter().map(|t| tokenizer::encode_prompt(t)).collect(),
            Input::Tokens(ids) => vec![ids],
            Input::TokenLists(lists) => lists,
        }
    }
}

/// How the vectors are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    /// A JSON array of numbers.
    Float,
    /// The little-endian `f32` bytes in base64 (what OpenAI's SDKs ask for).
    Base64,
}

pub(super) async fn handle(state: Arc<AppState>, body: Incoming) -> Response<ResponseBody> {
    match embed(state, body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn embed(state: Arc<AppState>, body: Incoming) -> Result<Response<ResponseBody>, ApiError> {
    generate::faults(&state).await?;
    let bytes = read_body(body).await?;
    let request: EmbeddingRequest = serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::bad_request(format!("Invalid request body: {e}")))?;
    let (model, adapter) = state.resolve_model(request.model.as_deref())?;
    let encoding = match request.encoding_format.as_deref() {
        None | Some("float") => Encoding::Float,
        Some("base64") => Encoding::Base64,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "encoding_format must be \"float\" or \"base64\", got {other:?}."
            ))
            .with_param("encoding_format"));
        }
    };
    let native = native_dimensions(&state);
    let dimensions = match request.dimensions {
        None => native,
        Some(d) if d >= 1 && d as u64 <= native as u64 => d as usize,
        Some(d) => {
            return Err(ApiError::bad_request(format!(
                "dimensions must be between 1 and {native} for this model, got {d}."
            ))
            .with_param("dimensions"));
        }
    };
    let inputs = request.input.token_lists();
    check_inputs(&inputs, state.max_model_len)?;

    // Every input is in the engine before the first is awaited, so they
    // are scheduled together as a batch would be.
    let mut requests = Vec::with_capacity(inputs.len());
    for tokens in &inputs {
        let generation = Generation {
            prompt: tokens.clone(),
            max_tokens: 1,
            adapter: adapter.clone(),
            priority: 0,
            limited_by_max_tokens: true,
        };
        requests.push(generate::submit(&state, generation)?);
    }
    let mut prompt_tokens: u64 = 0;
    for request in &mut requests {
        prompt_tokens += u64::from(generate::finished(request).await?.tokens.prompt);
    }

    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(index, tokens)| {
            let vector = embedding(state.seed, tokens, dimensions);
            let embedding = match encoding {
                Encoding::Float => json!(vector),
                Encoding::Base64 => json!(base64_f32(&vector)),
            };
            json!({"object": "embedding", "index": index, "embedding": embedding})
        })
        .collect();
    Ok(json_response(
        StatusCode::OK,
        &json!({
            "id": format!("embd-{:032x}", rand::random::<u128>()),
            "object": "list",
            "created": unix_now(),
            "model": model,
            "data": data,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "total_tokens": prompt_tokens,
                "completion_tokens": 0,
            },
        }),
    ))
}

/// The model's hidden size: the width of its last hidden state, which an
/// embedding pools.
fn native_dimensions(state: &AppState) -> usize {
    crate::engine::model(&state.model_root).map_or(FALLBACK_DIMENSIONS, |m| m.hidden as usize)
}

/// Refuses empty requests, empty inputs, too many inputs and inputs longer
/// than the context window.
fn check_inputs(inputs: &[Vec<u32>], max_model_len: u32) -> Result<(), ApiError> {
    let invalid = |message: String| Err(ApiError::bad_request(message).with_param("input"));
    if inputs.is_empty() {
        return invalid("input is empty; send at least one string or token list.".to_owned());
    }
    if inputs.len() > MAX_INPUTS {
        return invalid(format!(
            "input has {} items; at most {MAX_INPUTS} are accepted per request.",
            inputs.len()
        ));
    }
    for tokens in inputs {
        if tokens.is_empty() {
            return invalid("An input is empty; send at least one token.".to_owned());
        }
        // The engine needs room for the one token it computes.
        if tokens.len() as u64 >= u64::from(max_model_len) {
            return invalid(format!(
                "This model's maximum context length is {max_model_len} tokens. However, you \
                 requested {} tokens in the input for embedding generation. Please reduce the \
                 length of the input.",
                tokens.len()
            ));
        }
    }
    Ok(())
}

/// A unit vector of `dimensions` components, a function of `seed` and
/// `tokens` only. Its first `n` components are those of every longer
/// vector of the same input, before normalization.
fn embedding(seed: u64, tokens: &[u32], dimensions: usize) -> Vec<f32> {
    let mut rng = SmallRng::seed_from_u64(content_seed(seed, tokens));
    let mut normal = || {
        // Box–Muller: a standard normal draw from two uniforms, so the
        // direction is uniform on the sphere.
        let u1: f64 = rng.gen_range(f64::EPSILON..1.0);
        let u2: f64 = rng.r#gen();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    };
    let raw: Vec<f64> = (0..dimensions).map(|_| normal()).collect();
    let norm = raw
        .iter()
        .map(|x| x * x)
        .sum::<f64>()
        .sqrt()
        .max(f64::MIN_POSITIVE);
    raw.iter().map(|x| (x / norm) as f32).collect()
}

/// The vector's little-endian `f32` bytes in standard base64, padded.
fn base64_f32(vector: &[f32]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = u32::from(b[0]) << 16 | u32::from(b[1]) << 8 | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_are_unit_length_deterministic_and_nest() {
        let tokens = tokenizer::encode_prompt("hello world");
        let full = embedding(1, &tokens, 4096);
        assert_eq!(full, embedding(1, &tokens, 4096));
        let norm: f64 = full
            .iter()
            .map(|&x| f64::from(x).powi(2))
            .sum::<f64>()
            .sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "{norm}");
        // A shorter vector points the way the full one starts.
        let short = embedding(1, &tokens, 256);
        assert_eq!(short.len(), 256);
        let scale = short[0] / full[0];
        assert!(
            short
                .iter()
                .zip(&full)
                .all(|(s, f)| (s - f * scale).abs() < 1e-5)
        );
        // Another input, or another seed: an unrelated direction.
        let other = embedding(1, &tokenizer::encode_prompt("goodbye"), 4096);
        let cosine: f32 = full.iter().zip(&other).map(|(a, b)| a * b).sum();
        assert!(cosine.abs() < 0.1, "{cosine}");
        assert_ne!(embedding(2, &tokens, 8), embedding(1, &tokens, 8));
    }

    #[test]
    fn base64_matches_the_standard_alphabet_and_padding() {
        // 1.0f32 is 00 00 80 3f.
        assert_eq!(base64_f32(&[1.0]), "AACAPw==");
        // 1.0, -2.0: 00 00 80 3f 00 00 00 c0.
        assert_eq!(base64_f32(&[1.0, -2.0]), "AACAPwAAAMA=");
        assert_eq!(base64_f32(&[0.0, 0.0, 0.0]), "AAAAAAAAAAAAAAAA");
        assert_eq!(base64_f32(&[]), "");
    }

    #[test]
    fn inputs_parse_in_every_shape() {
        let parse = |body: Value| {
            serde_json::from_value::<EmbeddingRequest>(body)
                .unwrap()
                .input
                .token_lists()
        };
        let one = parse(json!({"input": "hello"}));
        assert_eq!(one, [tokenizer::encode_prompt("hello")]);
        assert_eq!(parse(json!({"input": ["hello", "x"]})).len(), 2);
        assert_eq!(parse(json!({"input": [1, 2, 3]})), [vec![1, 2, 3]]);
        assert_eq!(
            parse(json!({"input": [[1], [2, 3]]})),
            [vec![1], vec![2, 3]]
        );
        assert!(check_inputs(&parse(json!({"input": []})), 100).is_err());
        assert!(check_inputs(&parse(json!({"input": [[]]})), 100).is_err());
        let long = check_inputs(&[vec![1; 100]], 100).unwrap_err();
        assert!(
            long.message.contains("maximum context length is 100"),
            "{long:?}"
        );
        assert!(check_inputs(&[vec![1; 99]], 100).is_ok());
        let many = vec![vec![1]; MAX_INPUTS + 1];
        assert!(check_inputs(&many, 100).is_err());
    }
}
