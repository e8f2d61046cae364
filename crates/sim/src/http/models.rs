//! `GET /v1/models` and vLLM's runtime LoRA endpoints
//! (`POST /v1/load_lora_adapter`, `POST /v1/unload_lora_adapter`), with
//! vLLM's messages and status codes (`vllm/entrypoints/openai/serving_models.py`).

use std::sync::Arc;

use http::{Response, StatusCode};
use hyper::body::Incoming;
use serde::Deserialize;

use super::body::{ApiError, ResponseBody, json, read_json, text};
use super::openai::unix_now;
use super::state::{AppState, LoadedAdapter};

/// `GET /v1/models`: the base model, then each adapter with `parent` = base.
pub(super) fn list(state: &AppState) -> Response<ResponseBody> {
    let created = unix_now();
    let card = |id: &str, root: &str, parent: Option<&str>, max_model_len: Option<u32>| {
        serde_json::json!({
            "id": id,
            "object": "model",
            "created": created,
            "owned_by": "vllm",
            "root": root,
            "parent": parent,
            "max_model_len": max_model_len,
            "permission": [{
                "id": format!("modelperm-{:032x}", rand::random::<u128>()),
                "object": "model_permission",
                "created": created,
                "allow_create_engine": false,
                "allow_sampling": true,
                "allow_logprobs": true,
                "allow_search_indices": false,
                "allow_view": true,
                "allow_fine_tuning": false,
                "organization": "*",
                "group": null,
                "is_blocking": false,
            }],
        })
    };
    let mut data = vec![card(
        &state.served_model,
        &state.model_root,
        None,
        Some(state.max_model_len),
    )];
    for adapter in state.adapters.lock().iter() {
        data.push(card(
            &adapter.name,
            &adapter.path,
            Some(&state.served_model),
            None,
        ));
    }
    json(
        StatusCode::OK,
        &serde_json::json!({"object": "list", "data": data}),
    )
}

#[derive(Debug, Deserialize)]
struct LoadAdapterRequest {
    #[serde(default)]
    lora_name: Option<String>,
    #[serde(default)]
    lora_path: Option<String>,
}

#[derive(Debug, Deserialize)]
struct UnloadAdapterRequest {
    #[serde(default)]
    lora_name: Option<String>,
    #[serde(default)]
    lora_int_id: Option<u64>,
}

pub(super) async fn load_adapter(state: Arc<AppState>, body: Incoming) -> Response<ResponseBody> {
    let request: LoadAdapterRequest = match read_json(body).await {
        Ok(request) => request,
        Err(error) => return error.into_response(),
    };
    let (Some(name), Some(path)) = (
        request.lora_name.filter(|n| !n.is_empty()),
        request.lora_path.filter(|p| !p.is_empty()),
    ) else {
        return invalid_input("Both 'lora_name' and 'lora_path' must be provided.");
    };
    match state.load_adapter(&name, &path) {
        Ok(()) => success(format!(
            "Success: LoRA adapter '{name}' added successfully."
        )),
        Err(error) => error.into_response(),
    }
}

pub(super) async fn unload_adapter(state: Arc<AppState>, body: Incoming) -> Response<ResponseBody> {
    let request: UnloadAdapterRequest = match read_json(body).await {
        Ok(request) => request,
        Err(error) => return error.into_response(),
    };
    let Some(name) = request.lora_name.filter(|n| !n.is_empty()) else {
        let message = if request.lora_int_id.is_some() {
            "The simulator identifies adapters by 'lora_name'."
        } else {
            "either 'lora_name' and 'lora_int_id' needs to be provided."
        };
        return invalid_input(message);
    };
    if state.unload_adapter(&name) {
        success(format!(
            "Success: LoRA adapter '{name}' removed successfully."
        ))
    } else {
        ApiError::not_found(format!("The lora adapter '{name}' cannot be found.")).into_response()
    }
}

impl AppState {
    /// Registers an adapter with the engine and lists it. vLLM refuses a
    /// name that is already loaded.
    pub(crate) fn load_adapter(&self, name: &str, path: &str) -> Result<(), ApiError> {
        if !self.lora_enabled {
            return Err(ApiError::bad_request(
                "LoRA is not enabled on this server (max_loras is 0).",
            ));
        }
        let mut adapters = self.adapters.lock();
        if name == self.served_model || adapters.iter().any(|a| a.name == name) {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "InvalidUserInput",
                format!("The lora adapter '{name}' has already been loaded."),
            ));
        }
        self.engine
            .register_adapter(name)
            .map_err(|_| ApiError::internal("The engine has stopped."))?;
        adapters.push(LoadedAdapter {
            name: name.to_owned(),
            path: path.to_owned(),
        });
        Ok(())
    }

    /// Removes an adapter; `false` if it was not loaded.
    pub(crate) fn unload_adapter(&self, name: &str) -> bool {
        let mut adapters = self.adapters.lock();
        let Some(at) = adapters.iter().position(|a| a.name == name) else {
            return false;
        };
        adapters.remove(at);
        // A stopped engine has nothing left to unload.
        let _ = self.engine.unregister_adapter(name);
        true
    }
}

fn invalid_input(message: &str) -> Response<ResponseBody> {
    ApiError::new(StatusCode::BAD_REQUEST, "InvalidUserInput", message).into_response()
}

fn success(message: String) -> Response<ResponseBody> {
    text(StatusCode::OK, "text/plain; charset=utf-8", message)
}
