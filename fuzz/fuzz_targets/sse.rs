//! A replica's response body streaming through the gateway: the record
//! stage (`Record::on_data`, via `gateway::fuzzing::record_response`) and
//! the meter it reads events and token usage with
//! (`telemetry::response::ResponseMeter`).
//!
//! Input: a header, then the body.
//! - byte 0: bit 7 set for a JSON body, clear for an event stream; the low
//!   4 bits are how many cuts follow;
//! - 2 bytes per cut, little-endian, modulo the body length + 1: where the
//!   body is cut into frames, so frame boundaries can fall anywhere (inside
//!   `data:`, between `\r` and `\n`, inside `"usage"`).
//!
//! Checked beyond "no panic", against the same body in one frame:
//! - the frames start as many events as the whole body does, and no more
//!   than it has lines starting with `data:`; a JSON body has none;
//! - a usage found in the whole body is found in the frames too, and a
//!   short body (all of it kept) gives the same answer in frames, whole, and
//!   by a plain search of the body;
//! - a usage found is one the body holds: never read from bytes that were
//!   not next to each other in the body.

#![no_main]

use gateway::fuzzing::Cut;
use gateway::telemetry::response::{ResponseMeter, Usage};
use libfuzzer_sys::fuzz_target;

/// The meter keeps (at least) the body's last kilobyte to find `usage` in;
/// a body this short is kept whole however it is cut.
const KEPT_WHOLE: usize = 1024;

fuzz_target!(|data: &[u8]| {
    let Some(Cut {
        mode,
        pieces: frames,
        whole: body,
    }) = gateway::fuzzing::cut(data)
    else {
        return;
    };
    let sse = mode & 0x80 == 0;

    gateway::fuzzing::record_response(sse, frames.iter().copied());

    let mut split = ResponseMeter::new(sse);
    let split_events: u64 = frames
        .iter()
        .map(|f| u64::from(split.on_frame(f).count))
        .sum();
    let mut whole = ResponseMeter::new(sse);
    let whole_events = u64::from(whole.on_frame(body).count);

    assert_eq!(split_events, whole_events, "events in frames vs whole");
    if sse {
        let data_lines = body
            .split(|&b| b == b'\n')
            .filter(|l| l.starts_with(b"data:"))
            .count();
        assert!(
            whole_events <= data_lines as u64,
            "{whole_events} events in {data_lines} data lines"
        );
    } else {
        assert_eq!(whole_events, 0, "a JSON body has no events");
    }

    let (split_usage, whole_usage) = (split.usage(), whole.usage());
    if whole_usage.is_some() {
        assert_eq!(split_usage, whole_usage, "usage in frames vs whole");
    }
    if body.len() <= KEPT_WHOLE {
        assert_eq!(
            whole_usage,
            last_usage(body),
            "usage vs a search of the body"
        );
        assert_eq!(split_usage, whole_usage, "usage in frames vs whole");
    }
    if let Some(usage) = split_usage {
        assert!(
            usages(body).any(|u| u == usage),
            "usage {usage:?} is not in the body"
        );
    }
});

/// Every `"usage": {...}` value in `body` that reads as a [`Usage`], last
/// first.
fn usages(body: &[u8]) -> impl Iterator<Item = Usage> + '_ {
    const KEY: &[u8] = b"\"usage\"";
    (0..body.len().saturating_sub(KEY.len() - 1))
        .rev()
        .filter(|&at| body[at..].starts_with(KEY))
        .filter_map(|at| {
            let after = &body[at + KEY.len()..];
            let start = after
                .iter()
                .position(|b| !b.is_ascii_whitespace() && *b != b':')?;
            let value = &after[start..];
            if value.first() != Some(&b'{') {
                return None;
            }
            serde_json::Deserializer::from_slice(value)
                .into_iter::<Usage>()
                .next()?
                .ok()
        })
}

/// The last usage in `body`: what the replica reported last.
fn last_usage(body: &[u8]) -> Option<Usage> {
    usages(body).next()
}
