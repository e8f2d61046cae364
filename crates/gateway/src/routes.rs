//! The route stage: which pool serves a model name, and the `/v1/models`
//! answer built from the same table.

use std::collections::HashMap;

use bytes::Bytes;
use serde_json::json;

use crate::error::ApiError;

/// Where a model name goes.
#[derive(Debug, Clone)]
pub struct Route {
    pub pool: usize,
    /// Set when the name is a LoRA adapter rather than a base model.
    pub adapter: Option<String>,
}

#[derive(Debug)]
pub struct ModelTable {
    routes: HashMap<String, Route>,
    /// `GET /v1/models`, rendered once.
    models_json: Bytes,
}

impl ModelTable {
    pub fn new(pools: &[config::Pool]) -> Self {
        let mut routes = HashMap::new();
        let mut data = Vec::new();
        for (i, pool) in pools.iter().enumerate() {
            for model in &pool.models {
                routes.insert(
                    model.clone(),
                    Route {
                        pool: i,
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
                        pool: i,
                        adapter: Some(adapter.clone()),
                    },
                );
                data.push(json!({
                    "id": adapter, "object": "model", "created": 0,
                    "owned_by": "infergate", "root": adapter, "parent": pool.base_model(),
                }));
            }
        }
        let models_json = Bytes::from(json!({"object": "list", "data": data}).to_string());
        Self {
            routes,
            models_json,
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
}
