//! A client connection as the server sees it: hyper's HTTP/1.1 (or h2c)
//! framing and the limits around it (`server::connection`), via
//! `gateway::fuzzing::serve_bytes`, with a handler that reads each body.
//!
//! Input: a header, then the bytes the client sends.
//! - byte 0: its low 4 bits are how many cuts follow;
//! - 2 bytes per cut, little-endian, modulo the length + 1: where the bytes
//!   are cut into separate writes, so reads can end anywhere (inside a
//!   header name, between `\r` and `\n`, inside a chunk-size line).
//!
//! Checked beyond "no panic or hang": the statuses the server answers with
//! are the same whether the bytes arrive in pieces or in one write. How a
//! request is framed must not depend on how its bytes arrive.

#![no_main]

use gateway::fuzzing::Cut;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some(Cut {
        pieces,
        whole: input,
        ..
    }) = gateway::fuzzing::cut(data)
    else {
        return;
    };

    let split = gateway::fuzzing::serve_bytes(&pieces);
    let whole = gateway::fuzzing::serve_bytes(&[input]);
    // HTTP/2 output is binary frames; compare HTTP/1.x status lines.
    if !input.starts_with(b"PRI * HTTP/2.0") {
        assert_eq!(statuses(&split), statuses(&whole), "in pieces vs whole");
    }
});

/// The status codes of the HTTP/1.x responses in `out`, in order.
fn statuses(out: &[u8]) -> Vec<&[u8]> {
    out.windows(12)
        .filter(|w| w.starts_with(b"HTTP/1.") && w[8] == b' ')
        .map(|w| &w[9..12])
        .collect()
}
