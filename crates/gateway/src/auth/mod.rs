//! Stage 2, authenticate, and stage 5, authorize: who the caller is (its
//! tenant), and whether its tenant may use the model it asks for.
//!
//! - [`authenticator`]: the [`Authenticator`] of a generation, and the
//!   caller's [`Identity`];
//! - [`credential`]: the credential in a request (`Authorization: Bearer`
//!   or `x-api-key`), an API key or a JWT by its shape;
//! - [`api_keys`]: hashed API keys from the config and a keys file;
//! - [`jwt`] and [`jwks`]: tokens of configured issuers, their keys;
//! - [`tenants`]: what each tenant may do;
//! - [`sources`]: what outlives generations (keys files, JWKS, argon2id
//!   results); [`cache`]: the bounded map that remembers checks;
//! - [`refusal`]: why a credential was refused, and the answer.
//!
//! An [`Authenticator`] is built with each generation of the config. A
//! refused credential is answered with 401 and one stable reason word
//! (`expired`, `unknown_key`); the whole reason is logged under
//! `infergate::auth` at debug level, never the credential itself.

pub mod api_keys;
mod authenticator;
mod cache;
mod credential;
mod jwks;
mod jwt;
mod refusal;
mod sources;
pub mod tenants;

pub use api_keys::generate as generate_api_key;
pub use authenticator::{Authenticator, Identity, Via};
pub use refusal::{AUTH_TARGET, AuthError, Kind, Reason};
pub use sources::Sources;

#[cfg(test)]
mod tests;
