//! The request that continues a broken answer on another replica: the
//! original request with the text generated so far, asking for what is
//! left of the answer.

use bytes::Bytes;
use serde_json::{Map, Value, json};
use signals::Dialect;

use super::not_continued::NotContinued;
use super::transcript::Transcript;

/// The API a continued request was made to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Chat,
    Completions,
}

impl Api {
    /// The API of a request path, when its answers can be continued.
    pub fn of_path(path: &str) -> Option<Self> {
        if path.ends_with("/chat/completions") {
            Some(Api::Chat)
        } else if path.ends_with("/completions") {
            Some(Api::Completions)
        } else {
            None
        }
    }
}

/// What to send next.
#[derive(Debug, PartialEq)]
pub enum Next {
    /// The request that generates the rest of the answer.
    Continue(Bytes),
    /// The answer already has every token it asked for: it only needs
    /// ending.
    Complete,
}

/// Whether a request may be continued at all, judged before anything was
/// generated: what its body asks for that a continuation would not give
/// faithfully.
pub fn check(body: &Value, api: Api, engine: Dialect) -> Result<(), NotContinued> {
    let Some(request) = body.as_object() else {
        return Err(NotContinued::Unreadable);
    };
    let number = |key: &str| request.get(key).and_then(Value::as_u64).unwrap_or(1);
    if number("n") > 1 || number("best_of") > 1 {
        return Err(NotContinued::SeveralChoices);
    }
    let format = request
        .get("response_format")
        .and_then(|f| f.get("type"))
        .and_then(Value::as_str);
    let guided = [
        "guided_json",
        "guided_regex",
        "guided_choice",
        "guided_grammar",
        "structured_outputs",
        "grammar",
        "json_schema",
        "regex",
        "ebnf",
    ]
    .iter()
    .any(|key| request.get(*key).is_some_and(|v| !v.is_null()));
    if matches!(format, Some("json_schema" | "json_object")) || guided {
        return Err(NotContinued::StructuredOutput);
    }
    let logprobs = match api {
        Api::Chat => request.get("logprobs").and_then(Value::as_bool) == Some(true),
        Api::Completions => request.get("logprobs").is_some_and(|l| !l.is_null()),
    };
    // vLLM and SGLang give the continued tokens' log-probabilities; other
    // engines are not known to.
    if logprobs && !matches!(engine, Dialect::Vllm | Dialect::Sglang) {
        return Err(NotContinued::Logprobs);
    }
    match api {
        Api::Chat => match request.get("messages") {
            Some(Value::Array(_)) => Ok(()),
            _ => Err(NotContinued::Unreadable),
        },
        Api::Completions => match request.get("prompt") {
            Some(Value::String(_)) => Ok(()),
            Some(Value::Array(items)) if items.len() == 1 && items[0].is_string() => Ok(()),
            Some(Value::Array(items)) if items.iter().all(Value::is_u64) => Ok(()),
            _ => Err(NotContinued::SeveralPrompts),
        },
    }
}

/// The request for the rest of the answer the client has `so_far` of.
pub fn continuation(
    body: &Value,
    api: Api,
    engine: Dialect,
    so_far: &Transcript,
) -> Result<Next, NotContinued> {
    check(body, api, engine)?;
    let mut request = body.as_object().cloned().unwrap_or_default();
    if !shrink_max_tokens(&mut request, so_far.tokens()) {
        return Ok(Next::Complete);
    }
    match api {
        Api::Chat => continue_chat(&mut request, engine, so_far.text()),
        Api::Completions => continue_completion(&mut request, so_far)?,
    }
    let bytes =
        serde_json::to_vec(&Value::Object(request)).map_err(|_| NotContinued::Unreadable)?;
    Ok(Next::Continue(Bytes::from(bytes)))
}

/// `max_tokens` and `max_completion_tokens` less what was generated;
/// `false` when nothing is left to generate.
fn shrink_max_tokens(request: &mut Map<String, Value>, generated: u64) -> bool {
    let mut left = true;
    for key in ["max_tokens", "max_completion_tokens"] {
        if let Some(max) = request.get(key).and_then(Value::as_u64) {
            let rest = max.saturating_sub(generated);
            left &= rest > 0;
            request.insert(key.to_owned(), Value::from(rest));
        }
    }
    if let Some(min) = request.get("min_tokens").and_then(Value::as_u64) {
        request.insert(
            "min_tokens".to_owned(),
            Value::from(min.saturating_sub(generated)),
        );
    }
    left
}

/// The conversation with the text so far as the assistant's last message,
/// which the engine is asked to continue rather than answer.
fn continue_chat(request: &mut Map<String, Value>, engine: Dialect, text: &str) {
    let flag = request_flag(request);
    let Some(Value::Array(messages)) = request.get_mut("messages") else {
        return;
    };
    let continuing_own = request_continues_own(messages, flag);
    match messages.last_mut() {
        // The client itself asked to continue its assistant message: the
        // text so far goes on from it.
        Some(Value::Object(last)) if continuing_own => {
            let before = last.get("content").and_then(Value::as_str).unwrap_or("");
            let joined = format!("{before}{text}");
            last.insert("content".to_owned(), Value::from(joined));
        }
        _ => messages.push(json!({"role": "assistant", "content": text})),
    }
    // llama.cpp's server continues a final assistant message by itself;
    // vLLM and SGLang (and servers on their API) are told to.
    if engine != Dialect::Llamacpp {
        request.insert("continue_final_message".to_owned(), Value::Bool(true));
        request.insert("add_generation_prompt".to_owned(), Value::Bool(false));
    }
}

fn request_flag(request: &Map<String, Value>) -> bool {
    request
        .get("continue_final_message")
        .and_then(Value::as_bool)
        == Some(true)
}

fn request_continues_own(messages: &[Value], flag: bool) -> bool {
    flag && messages.last().is_some_and(|m| {
        m.get("role").and_then(Value::as_str) == Some("assistant")
            && m.get("content").is_some_and(Value::is_string)
    })
}

/// The prompt followed by the text so far: as token ids when the engine
/// reported both the prompt's and the answer's (re-tokenizing the joined
/// text can cut it into other tokens than the model generated), as text
/// otherwise.
fn continue_completion(
    request: &mut Map<String, Value>,
    so_far: &Transcript,
) -> Result<(), NotContinued> {
    // The client has the echo of its prompt already.
    request.remove("echo");
    if let Some((prompt, answer)) = so_far.token_ids() {
        let ids: Vec<Value> = prompt
            .iter()
            .chain(answer)
            .map(|&id| Value::from(id))
            .collect();
        request.insert("prompt".to_owned(), Value::Array(ids));
        return Ok(());
    }
    let prompt = match request.get("prompt") {
        Some(Value::String(p)) => p.clone(),
        Some(Value::Array(items)) if items.len() == 1 && items[0].is_string() => {
            items[0].as_str().unwrap_or_default().to_owned()
        }
        // Token ids with text after them: the text has no ids to join.
        _ => return Err(NotContinued::SeveralPrompts),
    };
    request.insert(
        "prompt".to_owned(),
        Value::from(format!("{prompt}{}", so_far.text())),
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn so_far(events: &str) -> Transcript {
        let mut t = Transcript::new(1 << 20);
        t.relay(Bytes::from(events.to_owned()));
        t
    }

    fn next(body: Value, api: Api, engine: Dialect, t: &Transcript) -> Value {
        match continuation(&body, api, engine, t).unwrap() {
            Next::Continue(bytes) => serde_json::from_slice(&bytes).unwrap(),
            Next::Complete => panic!("expected a continuation"),
        }
    }

    const TWO_TOKENS: &str = concat!(
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hel\"}}]}\n\n",
        "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo\"}}]}\n\n",
    );

    #[test]
    fn chat_continues_a_final_assistant_message() {
        let t = so_far(TWO_TOKENS);
        let body = json!({"model": "m", "stream": true, "max_tokens": 10,
            "messages": [{"role": "user", "content": "hi"}]});
        let vllm = next(body.clone(), Api::Chat, Dialect::Vllm, &t);
        assert_eq!(
            vllm["messages"][1],
            json!({"role": "assistant", "content": "Hello"})
        );
        assert_eq!(vllm["continue_final_message"], true);
        assert_eq!(vllm["add_generation_prompt"], false);
        assert_eq!(vllm["max_tokens"], 8);
        let llama = next(body, Api::Chat, Dialect::Llamacpp, &t);
        assert_eq!(llama["messages"][1]["content"], "Hello");
        assert!(llama.get("continue_final_message").is_none());
    }

    #[test]
    fn a_client_continuing_its_own_message_goes_on_from_it() {
        let t = so_far(TWO_TOKENS);
        let body = json!({"continue_final_message": true, "add_generation_prompt": false,
            "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Well: "}]});
        let next = next(body, Api::Chat, Dialect::Vllm, &t);
        assert_eq!(next["messages"].as_array().unwrap().len(), 2);
        assert_eq!(next["messages"][1]["content"], "Well: Hello");
    }

    #[test]
    fn completions_continue_the_prompt_as_text_or_token_ids() {
        let t = so_far(concat!(
            "data: {\"choices\":[{\"index\":0,\"text\":\" a\"}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"text\":\" b\"}]}\n\n",
        ));
        let body = json!({"prompt": "x", "echo": true, "max_completion_tokens": 5});
        let text = next(body, Api::Completions, Dialect::Tgi, &t);
        assert_eq!(text["prompt"], "x a b");
        assert!(text.get("echo").is_none());
        assert_eq!(text["max_completion_tokens"], 3);
        let t = so_far(
            "data: {\"choices\":[{\"index\":0,\"text\":\" a\",\"token_ids\":[7],\"prompt_token_ids\":[1,2]}]}\n\n",
        );
        let ids = next(json!({"prompt": "x"}), Api::Completions, Dialect::Vllm, &t);
        assert_eq!(ids["prompt"], json!([1, 2, 7]));
    }

    #[test]
    fn an_answer_with_every_token_asked_for_needs_only_ending() {
        let t = so_far(TWO_TOKENS);
        let body = json!({"max_tokens": 2, "messages": []});
        assert_eq!(
            continuation(&body, Api::Chat, Dialect::Vllm, &t),
            Ok(Next::Complete)
        );
    }

    #[test]
    fn requests_that_cannot_be_continued_faithfully_are_named() {
        let chat = |extra: Value| {
            let mut body = json!({"messages": []});
            body.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            check(&body, Api::Chat, Dialect::Tgi)
        };
        assert_eq!(chat(json!({"n": 2})), Err(NotContinued::SeveralChoices));
        assert_eq!(
            chat(json!({"response_format": {"type": "json_schema"}})),
            Err(NotContinued::StructuredOutput)
        );
        assert_eq!(
            chat(json!({"guided_regex": "a+"})),
            Err(NotContinued::StructuredOutput)
        );
        assert_eq!(chat(json!({"logprobs": true})), Err(NotContinued::Logprobs));
        assert_eq!(chat(json!({"response_format": {"type": "text"}})), Ok(()));
        let logprobs = json!({"messages": [], "logprobs": true});
        assert_eq!(check(&logprobs, Api::Chat, Dialect::Vllm), Ok(()));
        let batch = json!({"prompt": ["a", "b"]});
        assert_eq!(
            check(&batch, Api::Completions, Dialect::Vllm),
            Err(NotContinued::SeveralPrompts)
        );
        assert_eq!(Api::of_path("/v1/embeddings"), None);
        assert_eq!(Api::of_path("/v1/chat/completions"), Some(Api::Chat));
    }
}
