//! A replica's context length, from its OpenAI model list: vLLM and SGLang
//! give `max_model_len` on each model (`null` or absent in older
//! versions). Read when the replica is first scraped and now and then
//! after, as a restart with another `--max-model-len` changes it.

use std::time::Duration;

use serde::Deserialize;

/// How often the model list is read again.
pub const REFRESH: Duration = Duration::from_secs(30);

#[derive(Deserialize)]
struct ModelList {
    data: Vec<ModelCard>,
}

#[derive(Deserialize)]
struct ModelCard {
    #[serde(default)]
    max_model_len: Option<u64>,
}

/// The longest `max_model_len` the list gives (adapters share their base
/// model's), or `None` when it gives none.
pub fn from_model_list(body: &[u8]) -> Option<u64> {
    let list: ModelList = serde_json::from_slice(body).ok()?;
    list.data
        .iter()
        .filter_map(|m| m.max_model_len)
        .filter(|&n| n > 0)
        .max()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_model_len_is_read_from_vllm_and_sglang_lists() {
        let vllm = br#"{"object": "list", "data": [
            {"id": "meta-llama/Llama-3.1-8B-Instruct", "object": "model", "owned_by": "vllm", "root": "/models/llama", "parent": null, "max_model_len": 32768, "permission": []},
            {"id": "sql-lora", "object": "model", "owned_by": "vllm", "root": "/adapters/sql", "parent": "meta-llama/Llama-3.1-8B-Instruct", "max_model_len": null, "permission": []}
        ]}"#;
        assert_eq!(from_model_list(vllm), Some(32768));
        let sglang =
            br#"{"object": "list", "data": [{"id": "qwen", "object": "model", "owned_by": "sglang", "root": "qwen", "max_model_len": 131072}]}"#;
        assert_eq!(from_model_list(sglang), Some(131072));
    }

    #[test]
    fn lists_without_a_length_give_none() {
        assert_eq!(
            from_model_list(br#"{"object": "list", "data": [{"id": "m"}]}"#),
            None
        );
        assert_eq!(from_model_list(b"not json"), None);
        assert_eq!(
            from_model_list(br#"{"data": [{"id": "m", "max_model_len": 0}]}"#),
            None
        );
    }
}
