//! Stage 4, route: which model serves the request (a rewrite may choose a
//! canary: [`rewrite`]), and which pool serves that model ([`table`]). A
//! request's session key ([`session_key`]) keeps a session on its
//! rewrite's target and its replica.

pub mod rewrite;
pub mod session_key;
pub mod table;
