//! The route stage: which pool serves a model name, and the `/v1/models`
//! answer built from the same table.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::json;

use crate::error::ApiError;
use crate::generation::pool::Pool;

/// Where a model name goes.
#[derive(Clone)]
pub struct Route {
    pub pool: Arc<Pool>,
    /// Set when the name is a LoRA adapter rather than a base model.
    pub adapter: Option<String>,
}

pub struct ModelTable {
    routes: HashMap<String, Route>,
    /// `GET /v1/models`, rendered once.
    models_json: Bytes,
    /// `GET /v1/models/{id}`, by id, rendered once.
    model_json: HashMap<String, Bytes>,
    /// Every model and adapter in `/v1/models` order, for lists filtered
    /// per caller.
    ids: Vec<String>,
}

impl ModelTable {
    /// `specs` and `pools` in the same order.
    pub fn new(specs: &[config::Pool], pools: &[Arc<Pool>]) -> Self {
        let mut routes = HashMap::new();
        let mut data = Vec::new();
        for (pool, runtime) in specs.iter().zip(pools) {
            for model in &pool.models {
                routes.insert(
                    model.clone(),
                    Route {
                        pool: Arc::clone(runtime),
                        adapter: None,
                    },
                );
                data.push(json!({
                    "id": model, "object": "model", "created": 0,
                    "owned_by": "infergate", "root": model, "parent": null,
                }));
            }
            for adapter in &pool.adapters {
                routes.insert(
                    adapter.clone(),
                    Route {
                        pool: Arc::clone(runtime),
                        adapter: Some(adapter.clone()),
                    },
                );
                data.push(json!({
                    "id": adapter, "object": "model", "created": 0,
                    "owned_by": "infergate", "root": adapter, "parent": pool.base_model(),
                }));
            }
        }
        let model_json = data
            .iter()
            .map(|m| {
                (
                    m["id"].as_str().unwrap_or_default().to_owned(),
                    Bytes::from(m.to_string()),
                )
            })
            .collect();
        let models_json = Bytes::from(json!({"object": "list", "data": data}).to_string());
        let ids = data
            .iter()
            .map(|m| m["id"].as_str().unwrap_or_default().to_owned())
            .collect();
        Self {
            routes,
            models_json,
            model_json,
            ids,
        }
    }

    pub fn resolve(&self, model: &str) -> Result<&Route, ApiError> {
        self.routes
            .get(model)
            .ok_or_else(|| ApiError::model_not_found(model))
    }

    pub fn models_json(&self) -> Bytes {
        self.models_json.clone()
    }

    /// `GET /v1/models` for a caller who may use only the names `may_use`
    /// accepts.
    pub fn models_json_where(&self, may_use: impl Fn(&str) -> bool) -> Bytes {
        let mut out = Vec::with_capacity(self.models_json.len());
        out.extend_from_slice(br#"{"object":"list","data":["#);
        let mut first = true;
        for id in self.ids.iter().filter(|id| may_use(id)) {
            if !first {
                out.push(b',');
            }
            first = false;
            out.extend_from_slice(&self.model_json[id]);
        }
        out.extend_from_slice(b"]}");
        Bytes::from(out)
    }

    /// One model or adapter as `GET /v1/models/{id}` shows it.
    pub fn model_json(&self, id: &str) -> Result<Bytes, ApiError> {
        self.model_json
            .get(id)
            .cloned()
            .ok_or_else(|| ApiError::model_not_found(id))
    }
}
