//! What the gateway learns from a response body as it streams through:
//! when each server-sent event arrived (TTFT, inter-token time) and the
//! token `usage` the replica reported. Nothing is buffered: events are
//! found by looking at line starts, and only the last kilobyte of the body
//! is kept to read `usage` from when the body ends.

use std::time::Duration;

use serde::Deserialize;
use tokio::time::Instant;

/// Bytes of the body's end searched for `usage`. OpenAI-style servers put
/// it last, in a JSON body or in the final event before `[DONE]`, and
/// write it in well under this.
const TAIL: usize = 1024;
/// Bytes of a line read to tell a data event from `data: [DONE]`.
const LINE_HEAD: usize = 12;

/// Token counts from a response's `usage` object.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub struct Usage {
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
}

/// Event timing found in one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Events {
    /// Data events that started in the frame (`[DONE]` excluded).
    pub count: u32,
}

/// Scans one response body. `sse` is whether the body is an event stream;
/// for any other body only the tail is kept.
#[derive(Debug)]
pub struct ResponseMeter {
    sse: bool,
    /// The current line's first bytes, while fewer than `LINE_HEAD`.
    line_head: [u8; LINE_HEAD],
    /// Bytes of the current line seen so far, capped at `LINE_HEAD + 1`
    /// (past the head: the line is already judged).
    line_len: usize,
    /// The body's last bytes; filled on the first frame.
    tail: Vec<u8>,
}

impl ResponseMeter {
    pub fn new(sse: bool) -> Self {
        Self {
            sse,
            line_head: [0; LINE_HEAD],
            line_len: 0,
            tail: Vec::new(),
        }
    }

    pub fn is_sse(&self) -> bool {
        self.sse
    }

    /// Take one frame of the body; returns the data events it started.
    pub fn on_frame(&mut self, data: &[u8]) -> Events {
        self.keep_tail(data);
        let count = if self.sse { self.count_events(data) } else { 0 };
        Events { count }
    }

    /// The `usage` the body ended with, if any.
    pub fn usage(&self) -> Option<Usage> {
        find_usage(&self.tail)
    }

    fn keep_tail(&mut self, data: &[u8]) {
        if self.tail.capacity() == 0 {
            self.tail.reserve_exact(2 * TAIL);
        }
        if data.len() > TAIL {
            // Only the frame's end is kept: the old tail is no longer next
            // to it in the body, and must not be read across.
            self.tail.clear();
        }
        let data = &data[data.len().saturating_sub(TAIL)..];
        if self.tail.len() + data.len() > 2 * TAIL {
            // Keep the newest TAIL bytes; moving at most TAIL bytes once
            // per TAIL bytes received keeps the cost linear and small.
            let drop = (self.tail.len() + data.len()).saturating_sub(TAIL);
            self.tail.drain(..drop.min(self.tail.len()));
        }
        self.tail.extend_from_slice(data);
    }

    /// Count lines starting with `data:` (not `data: [DONE]`), carrying a
    /// partial line head across frames.
    fn count_events(&mut self, data: &[u8]) -> u32 {
        let mut events = 0;
        let mut i = 0;
        while i < data.len() {
            if self.line_len <= LINE_HEAD {
                // Still reading the head of the current line.
                let b = data[i];
                i += 1;
                if b == b'\n' {
                    events += u32::from(self.judge_line());
                    self.line_len = 0;
                    continue;
                }
                if self.line_len < LINE_HEAD {
                    self.line_head[self.line_len] = b;
                    self.line_len += 1;
                    continue;
                }
                // The head is full and the line goes on: judge it now.
                events += u32::from(self.judge_line());
                self.line_len = LINE_HEAD + 1;
            }
            match memchr::memchr(b'\n', &data[i..]) {
                Some(at) => {
                    i += at + 1;
                    self.line_len = 0;
                }
                None => break,
            }
        }
        events
    }

    /// Whether the line whose head is buffered is a data event.
    fn judge_line(&self) -> bool {
        let head = &self.line_head[..self.line_len.min(LINE_HEAD)];
        let Some(payload) = head.strip_prefix(b"data:") else {
            return false;
        };
        let payload = payload.strip_prefix(b" ").unwrap_or(payload);
        let payload = payload.strip_suffix(b"\r").unwrap_or(payload);
        !payload.is_empty() && !b"[DONE]".starts_with(payload) && !payload.starts_with(b"[DONE]")
    }
}

/// The last parsable, non-null `"usage": {...}` in `tail`.
fn find_usage(tail: &[u8]) -> Option<Usage> {
    let finder = memchr::memmem::FinderRev::new(b"\"usage\"");
    let mut end = tail.len();
    while let Some(at) = finder.rfind(&tail[..end]) {
        let after = &tail[at + b"\"usage\"".len()..];
        let value = after
            .iter()
            .position(|b| !b.is_ascii_whitespace() && *b != b':')
            .map(|start| &after[start..]);
        if let Some(value) = value
            && value.first() == Some(&b'{')
            && let Some(Ok(usage)) = serde_json::Deserializer::from_slice(value)
                .into_iter::<Usage>()
                .next()
        {
            return Some(usage);
        }
        end = at;
    }
    None
}

/// Inter-token gaps of one stream: each data event's distance from the
/// previous one. Events that arrive in one frame share the frame's gap
/// evenly: the client saw them together, but they were generated over it.
#[derive(Debug, Default)]
pub struct EventClock {
    first: Option<Instant>,
    last: Option<Instant>,
}

impl EventClock {
    /// Record `events` arriving at `now`; calls `gap` once per event that
    /// has a predecessor. Returns the time of the first event ever.
    pub fn tick(&mut self, events: u32, now: Instant, mut gap: impl FnMut(Duration)) {
        if events == 0 {
            return;
        }
        let mut spread = events;
        if self.first.is_none() {
            // The first event has no predecessor; others in its frame have
            // no measurable gap either.
            self.first = Some(now);
            spread = 0;
        }
        if let Some(last) = self.last
            && spread > 0
        {
            let each = now.saturating_duration_since(last) / spread;
            for _ in 0..spread {
                gap(each);
            }
        }
        self.last = Some(now);
    }

    pub fn first(&self) -> Option<Instant> {
        self.first
    }

    pub fn last(&self) -> Option<Instant> {
        self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(meter: &mut ResponseMeter, frames: &[&[u8]]) -> Vec<u32> {
        frames.iter().map(|f| meter.on_frame(f).count).collect()
    }

    #[test]
    fn counts_data_events_but_not_done_or_comments() {
        let mut m = ResponseMeter::new(true);
        let got = events(
            &mut m,
            &[
                b"data: {\"a\":1}\n\n",
                b": keep-alive\n\ndata: {\"a\":2}\n\ndata: {\"a\":3}\n\n",
                b"event: x\ndata:{}\n\n",
                b"data: [DONE]\n\n",
            ],
        );
        assert_eq!(got, [1, 2, 1, 0]);
    }

    #[test]
    fn a_line_head_split_across_frames_is_still_seen() {
        let mut m = ResponseMeter::new(true);
        let got = events(
            &mut m,
            &[b"da", b"ta: {\"x\"", b":1}\n\nd", b"ata: [DO", b"NE]\n\n"],
        );
        // The event is judged once its head (12 bytes) is complete.
        assert_eq!(got, [0, 0, 1, 0, 0]);
    }

    #[test]
    fn crlf_lines_and_bare_done() {
        let mut m = ResponseMeter::new(true);
        assert_eq!(m.on_frame(b"data: 1\r\n\r\ndata:[DONE]\r\n\r\n").count, 1);
        // A short event line judged at its newline.
        assert_eq!(m.on_frame(b"data: 7\n\n").count, 1);
    }

    #[test]
    fn json_bodies_have_no_events() {
        let mut m = ResponseMeter::new(false);
        assert_eq!(m.on_frame(b"data: not an event stream\n").count, 0);
    }

    #[test]
    fn usage_from_a_json_body_split_in_frames() {
        let mut m = ResponseMeter::new(false);
        m.on_frame(b"{\"choices\":[{\"message\":{\"content\":\"the usage is\"}}],\"us");
        m.on_frame(b"age\": {\"prompt_tokens\": 12, \"completion_tokens\": 5, \"total_tokens\": 17, \"prompt_tokens_details\": {\"cached_tokens\": 0}}}");
        assert_eq!(
            m.usage(),
            Some(Usage {
                prompt_tokens: Some(12),
                completion_tokens: Some(5)
            })
        );
    }

    #[test]
    fn usage_from_the_last_stream_event_skips_nulls() {
        let mut m = ResponseMeter::new(true);
        m.on_frame(b"data: {\"choices\":[{\"delta\":{}}],\"usage\":null}\n\n");
        m.on_frame(
            b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":9}}\n\n",
        );
        m.on_frame(b"data: [DONE]\n\n");
        assert_eq!(
            m.usage(),
            Some(Usage {
                prompt_tokens: Some(3),
                completion_tokens: Some(9)
            })
        );
        let mut none = ResponseMeter::new(true);
        none.on_frame(b"data: {\"usage\":null}\n\n");
        assert_eq!(none.usage(), None);
    }

    #[test]
    fn only_the_tail_is_kept_and_usage_at_the_end_survives() {
        let mut m = ResponseMeter::new(false);
        m.on_frame(b"{\"usage\":{\"prompt_tokens\":1},\"data\":[");
        for _ in 0..100 {
            m.on_frame(&[b'0'; 100]);
        }
        assert!(m.tail.len() <= 2 * TAIL);
        assert_eq!(m.usage(), None, "the early usage scrolled out");
        m.on_frame(&[b'1'; 5000]);
        m.on_frame(b"],\"usage\":{\"prompt_tokens\":40}}");
        assert!(m.tail.len() <= 2 * TAIL);
        assert_eq!(m.usage().unwrap().prompt_tokens, Some(40));
    }

    #[test]
    fn usage_is_never_read_across_bytes_a_long_frame_skipped() {
        // Found by fuzzing (fuzz/fuzz_targets/sse.rs): the end of a frame
        // longer than the tail was appended to the old tail, joining bytes
        // that were not next to each other into a `usage` the body never
        // had (here `completion_` + `tokens": 99`).
        let mut m = ResponseMeter::new(false);
        m.on_frame(br#"{"usage": {"prompt_tokens": 1, "completion_"#);
        let mut long = vec![b'y'; 200];
        long.extend_from_slice(br#"tokens": 99}}"#);
        long.resize(200 + TAIL, b' ');
        m.on_frame(&long);
        assert_eq!(m.usage(), None);
    }

    #[test]
    fn event_clock_spreads_a_frames_gap_over_its_events() {
        let t0 = Instant::now();
        let mut clock = EventClock::default();
        let mut gaps = Vec::new();
        clock.tick(0, t0, |g| gaps.push(g));
        assert_eq!(clock.first(), None);
        clock.tick(2, t0 + Duration::from_millis(100), |g| gaps.push(g));
        assert_eq!(clock.first(), Some(t0 + Duration::from_millis(100)));
        assert!(gaps.is_empty());
        clock.tick(1, t0 + Duration::from_millis(120), |g| gaps.push(g));
        clock.tick(4, t0 + Duration::from_millis(200), |g| gaps.push(g));
        assert_eq!(
            gaps,
            [20, 20, 20, 20, 20].map(Duration::from_millis).to_vec()
        );
    }
}
