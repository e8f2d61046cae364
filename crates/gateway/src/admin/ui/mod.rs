//! The fleet page on the admin listener: one self-contained page (its
//! HTML, CSS and JS are compiled into the binary) and the small JSON API
//! it polls, which others can use as well.
//!
//! | path | what |
//! |---|---|
//! | `/`, `/ui` | redirect to `/ui/` |
//! | `/ui/`, `/ui/app.css`, `/ui/app.js`, `/ui/favicon.svg` | the page ([`page`]) |
//! | `/debug/traffic` | each pool's recent rate, TTFT, 429s and errors ([`api`]) |
//! | `/debug/decisions`, `/debug/decisions/{request id}` | recent routing decisions ([`api`]) |
//!
//! The replicas' live state comes from `/debug/pools` (`admin.rs`). The page
//! polls once a second while it is visible; nothing here runs, and the
//! request path records nothing for it, while nobody has it open.

mod api;
mod page;

use http::{Method, Response};

use crate::inbound::server::Request;
use crate::outbound::response_body::ResponseBody;
use crate::state::State;

/// Whether the page or its API answers `path` (for any method: the admin
/// listener answers other methods than GET with 405).
pub fn serves(path: &str) -> bool {
    page::serves(path) || api::serves(path)
}

/// Answer a GET for a path [`serves`] accepts.
pub fn get(state: &State, req: &Request) -> Response<ResponseBody> {
    debug_assert_eq!(req.method, Method::GET);
    let path = req.path();
    if page::serves(path) {
        page::get(path)
    } else {
        api::get(state, path, req.uri.query().unwrap_or(""))
    }
}
