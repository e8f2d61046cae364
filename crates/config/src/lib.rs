//! The gateway's configuration: the `InferenceGatewayConfig` document, its
//! defaults, and validation that reports every problem with its path.
//!
//! Modules depend one way: `defaults` ← `schema` ← `validate` ← `load`;
//! `load` reads documents through `read` (YAML into any type, noting every
//! structural problem), and `read`, `validate` and `load` all report
//! through the leaf `problem`. `json_schema` describes, for the schema
//! derived from `schema`, the fields whose YAML form is not their Rust shape.

pub mod defaults;
mod global;
mod json_schema;
mod load;
mod problem;
mod read;
pub mod schema;
mod security;
mod traffic;
mod validate;

pub use global::*;
pub use load::{
    api_keys_from_yaml, from_yaml, from_yaml_with, load_file, load_file_with, validated,
};
pub use problem::{ConfigError, Problem, Unreadable};
pub use schema::*;
pub use security::*;
pub use traffic::*;
pub use validate::tenant_name;
