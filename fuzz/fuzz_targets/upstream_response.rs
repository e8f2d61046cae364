//! A replica's answer as the gateway reads it: hyper's client connection
//! under the per-worker pool (`upstream::connections`), and the checks the
//! pipeline makes of the answer (transfer coding, end-to-end headers), via
//! `gateway::fuzzing::upstream_response` against a replica on 127.0.0.1
//! that answers with the input.
//!
//! Input: a header, then the replica's bytes.
//! - byte 0: its low 4 bits are how many cuts follow;
//! - 2 bytes per cut, little-endian, modulo the length + 1: where the
//!   answer is cut into separate writes.
//!
//! Checked beyond "no panic or hang": no hop-by-hop or framing header is
//! ever among those passed on to the client.

#![no_main]

use gateway::fuzzing::Cut;
use gateway::fuzzing::Upstream;
use libfuzzer_sys::fuzz_target;

const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
];

fuzz_target!(|data: &[u8]| {
    let Some(Cut { pieces, .. }) = gateway::fuzzing::cut(data) else {
        return;
    };

    if let Upstream::Answered {
        forwarded_headers, ..
    } = gateway::fuzzing::upstream_response(&pieces)
    {
        for name in &forwarded_headers {
            assert!(!HOP_BY_HOP.contains(&name.as_str()), "{name} passed on");
        }
    }
});
