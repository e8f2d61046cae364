//! Stage 1, accept: listeners and client connections (hyper), the edge
//! checks before anything else, the body read whole within its limits,
//! the JSON body parsed into what routing needs, and the drain of client
//! connections on shutdown.

pub mod drain;
pub mod edge;
pub mod parse;
pub mod read_body;
pub mod server;
