//! The gateway's configuration: the `InferenceGatewayConfig` document, its
//! defaults, and validation that reports every problem with its path.

pub mod defaults;
mod load;
pub mod schema;
mod validate;

pub use load::{ConfigError, Problem, from_yaml, load_file, validated};
pub use schema::*;
