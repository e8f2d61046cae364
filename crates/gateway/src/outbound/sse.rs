//! Server-sent events as they arrive in frames: the complete events of a
//! stream, whatever frame boundaries cut them, and the `data:` payload of
//! one.

use bytes::{Bytes, BytesMut};

/// Holds the bytes of an event whose end has not arrived yet.
#[derive(Default)]
pub struct EventBuffer {
    pending: BytesMut,
}

impl EventBuffer {
    /// The complete events `data` ends (with what was pending before it),
    /// as one run of bytes; an event cut by the frame's end waits for the
    /// rest.
    pub fn push(&mut self, data: &[u8]) -> Option<Bytes> {
        self.pending.extend_from_slice(data);
        let end = last_event_end(&self.pending)?;
        Some(self.pending.split_to(end).freeze())
    }

    /// Nothing waits for the rest of an event.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// The bytes of an event the stream ended in the middle of.
    pub fn take_rest(&mut self) -> Option<Bytes> {
        (!self.pending.is_empty()).then(|| self.pending.split().freeze())
    }
}

/// Just past the blank line that ends the last complete event.
fn last_event_end(bytes: &[u8]) -> Option<usize> {
    let lf = memchr::memmem::rfind(bytes, b"\n\n").map(|i| i + 2);
    let crlf = memchr::memmem::rfind(bytes, b"\r\n\r\n").map(|i| i + 4);
    lf.max(crlf)
}

/// Each complete event in `bytes`, with the blank line that ends it.
pub fn events(bytes: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut rest = bytes;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let lf = memchr::memmem::find(rest, b"\n\n").map(|i| i + 2);
        let crlf = memchr::memmem::find(rest, b"\r\n\r\n").map(|i| i + 4);
        let end = match (lf, crlf) {
            (Some(a), Some(b)) => a.min(b),
            (a, b) => a.or(b).unwrap_or(rest.len()),
        };
        let (event, after) = rest.split_at(end);
        rest = after;
        Some(event)
    })
}

/// An event's `data:` lines joined, or `None` for an event without data
/// (a comment, a keep-alive) or that is not UTF-8.
pub fn data(event: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(event).ok()?;
    let mut lines = text
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(|d| d.strip_prefix(' ').unwrap_or(d))
        .peekable();
    lines.peek()?;
    Some(lines.collect::<Vec<_>>().join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn complete_events_whatever_the_frames() {
        let whole = b"data: a\n\n: keep-alive\n\ndata: b\r\n\r\ndata: [DONE]\n\n";
        for cut in 1..whole.len() {
            let mut buffer = EventBuffer::default();
            let mut out = Vec::new();
            for part in [&whole[..cut], &whole[cut..]] {
                if let Some(done) = buffer.push(part) {
                    out.extend(events(&done).map(<[u8]>::to_vec));
                }
            }
            assert!(buffer.is_empty(), "cut at {cut}");
            let data: Vec<_> = out.iter().map(|e| data(e)).collect();
            assert_eq!(
                data,
                [
                    Some("a".to_owned()),
                    None,
                    Some("b".to_owned()),
                    Some("[DONE]".to_owned())
                ],
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn a_cut_event_is_kept_apart() {
        let mut buffer = EventBuffer::default();
        assert_eq!(
            &buffer.push(b"data: a\n\ndata: b").unwrap()[..],
            b"data: a\n\n"
        );
        assert_eq!(&buffer.take_rest().unwrap()[..], b"data: b");
        assert!(buffer.take_rest().is_none());
    }
}
