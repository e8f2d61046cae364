//! HTTP/1.1 message bodies as both the server (requests) and the upstream
//! client (responses) read them: how a body is delimited (RFC 9112 §6) and
//! reading it out of the bytes received so far. Pure over a buffer, so it
//! is tested a byte at a time. The head's fields are [`crate::fields`].

use bytes::{Buf, Bytes, BytesMut};

/// Longest chunk-size or trailer line.
const LINE_LIMIT: usize = 4 * 1024;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("the body ended before its end")]
    Incomplete,
    #[error("{0}")]
    Invalid(String),
}

impl DecodeError {
    fn invalid(what: impl Into<String>) -> Self {
        DecodeError::Invalid(what.into())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// This many bytes are left.
    Length(u64),
    Chunked(Chunk),
    /// Everything until the peer closes the connection.
    UntilClose,
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chunk {
    /// A chunk-size line is next.
    Size,
    /// This many bytes of chunk data are left.
    Data(u64),
    /// The CRLF after a chunk's data.
    DataEnd,
    /// Trailer lines, up to a blank one.
    Trailers,
}

/// Reads a body's framing out of the bytes received and yields its data.
#[derive(Debug, PartialEq, Eq)]
pub struct Decoder {
    framing: Framing,
    /// The peer closed the connection.
    eof: bool,
}

/// What [`Decoder::decode`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    Data(Bytes),
    /// Nothing more can be decoded from the bytes so far.
    NeedMore,
    End,
}

impl Decoder {
    fn new(framing: Framing) -> Self {
        let framing = match framing {
            Framing::Length(0) => Framing::Done,
            f => f,
        };
        Self {
            framing,
            eof: false,
        }
    }

    /// Whether the body has been read to its end. A chunked body is known
    /// to end as soon as its last chunk and terminator have arrived, even
    /// if the data before them has not been asked for.
    pub fn is_end(&self) -> bool {
        self.framing == Framing::Done
    }

    /// Bytes of body left, when known.
    pub fn remaining(&self) -> Option<u64> {
        match self.framing {
            Framing::Length(n) => Some(n),
            Framing::Done => Some(0),
            _ => None,
        }
    }

    /// Everything until the peer closes the connection.
    pub fn until_close() -> Self {
        Self::new(Framing::UntilClose)
    }

    pub fn is_until_close(&self) -> bool {
        self.framing == Framing::UntilClose
    }

    /// The peer closed the connection: no more bytes will come.
    pub fn set_eof(&mut self) {
        self.eof = true;
    }

    /// A body of `length` bytes.
    pub fn with_length(length: u64) -> Self {
        Self::new(Framing::Length(length))
    }

    pub fn chunked() -> Self {
        Self::new(Framing::Chunked(Chunk::Size))
    }

    /// The next piece of body data in `buf` (consumed from it).
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Step, DecodeError> {
        loop {
            match self.framing {
                Framing::Done => return Ok(Step::End),
                Framing::Length(left) => {
                    let Some(data) = take(buf, left) else {
                        return self.need_more(DecodeError::Incomplete);
                    };
                    let left = left - data.len() as u64;
                    self.framing = if left == 0 {
                        Framing::Done
                    } else {
                        Framing::Length(left)
                    };
                    return Ok(Step::Data(data));
                }
                Framing::UntilClose => {
                    if !buf.is_empty() {
                        return Ok(Step::Data(buf.split().freeze()));
                    }
                    if self.eof {
                        self.framing = Framing::Done;
                        return Ok(Step::End);
                    }
                    return Ok(Step::NeedMore);
                }
                Framing::Chunked(Chunk::Data(left)) => {
                    let Some(data) = take(buf, left) else {
                        return self.need_more(DecodeError::Incomplete);
                    };
                    let left = left - data.len() as u64;
                    self.framing = Framing::Chunked(if left == 0 {
                        Chunk::DataEnd
                    } else {
                        Chunk::Data(left)
                    });
                    // Step over the framing that follows if it has arrived,
                    // so that the end is known with the last data.
                    self.settle(buf);
                    return Ok(Step::Data(data));
                }
                Framing::Chunked(chunk) => {
                    if !self.step_chunked(buf, chunk)? {
                        return self.need_more(DecodeError::Incomplete);
                    }
                }
            }
        }
    }

    /// Consume the chunked framing at the front of `buf` up to the next
    /// data or the end. An error is left for the next [`Decoder::decode`]
    /// to report, as nothing is consumed by a step that fails.
    fn settle(&mut self, buf: &mut BytesMut) {
        while let Framing::Chunked(c @ (Chunk::DataEnd | Chunk::Size | Chunk::Trailers)) =
            self.framing
        {
            if !matches!(self.step_chunked(buf, c), Ok(true)) {
                break;
            }
        }
    }

    fn need_more(&self, at_eof: DecodeError) -> Result<Step, DecodeError> {
        if self.eof {
            Err(at_eof)
        } else {
            Ok(Step::NeedMore)
        }
    }

    /// Consume one piece of chunked framing (a size line, a data CRLF, a
    /// trailer line) from `buf`; false if it has not fully arrived.
    fn step_chunked(&mut self, buf: &mut BytesMut, chunk: Chunk) -> Result<bool, DecodeError> {
        match chunk {
            Chunk::Data(_) => unreachable!("data is taken by decode"),
            Chunk::DataEnd => {
                if buf.starts_with(b"\r\n") {
                    buf.advance(2);
                } else if buf.starts_with(b"\n") {
                    buf.advance(1);
                } else if buf.is_empty() || &buf[..] == b"\r" {
                    return Ok(false);
                } else {
                    return Err(DecodeError::invalid("chunk data not followed by CRLF"));
                }
                self.framing = Framing::Chunked(Chunk::Size);
            }
            Chunk::Size => {
                let Some((len, next)) = line(buf)? else {
                    return Ok(false);
                };
                let size = chunk_size(&buf[..len])?;
                buf.advance(next);
                self.framing = Framing::Chunked(if size == 0 {
                    Chunk::Trailers
                } else {
                    Chunk::Data(size)
                });
            }
            Chunk::Trailers => {
                let Some((len, next)) = line(buf)? else {
                    return Ok(false);
                };
                buf.advance(next);
                // Trailers are not passed on: the client's response is
                // framed anew, and nothing the replicas send needs them.
                if len == 0 {
                    self.framing = Framing::Done;
                }
            }
        }
        Ok(true)
    }
}

/// Up to `left` bytes from the front of `buf`; `None` if it is empty.
fn take(buf: &mut BytesMut, left: u64) -> Option<Bytes> {
    if buf.is_empty() {
        return None;
    }
    let n = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
    Some(buf.split_to(n).freeze())
}

/// The length of the first line in `buf` without its line ending, and
/// where the next line starts; `None` if it has not fully arrived.
fn line(buf: &[u8]) -> Result<Option<(usize, usize)>, DecodeError> {
    let Some(end) = memchr::memchr(b'\n', buf) else {
        if buf.len() > LINE_LIMIT {
            return Err(DecodeError::invalid(format!(
                "a line over {LINE_LIMIT} bytes"
            )));
        }
        return Ok(None);
    };
    let len = if end > 0 && buf[end - 1] == b'\r' {
        end - 1
    } else {
        end
    };
    Ok(Some((len, end + 1)))
}

/// A chunk-size line: hexadecimal digits, then optional extensions.
fn chunk_size(line: &[u8]) -> Result<u64, DecodeError> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    let rest = line[digits..].trim_ascii_start();
    if digits == 0 || digits > 16 || !(rest.is_empty() || rest[0] == b';') {
        return Err(DecodeError::invalid("an invalid chunk size"));
    }
    let digits = std::str::from_utf8(&line[..digits]).expect("hex digits are ASCII");
    u64::from_str_radix(digits, 16).map_err(|_| DecodeError::invalid("an invalid chunk size"))
}

#[cfg(test)]
mod tests;
