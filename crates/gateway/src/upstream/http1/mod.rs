//! The gateway's HTTP/1.1 client connection to a replica.
//!
//! One request at a time on a kept-alive TCP connection: the request head
//! and body go out in one `writev`, and the response is read by the task
//! that sent the request, straight from the socket. hyper's client
//! connection instead runs as a task of its own that each request reaches,
//! and is answered from, through channels — two task hand-offs and a
//! second HTTP machinery per request, for a protocol whose every use here
//! is the same: send a small head and a body we already hold, read a head,
//! then stream a body back as it arrives.
//!
//! Parsing ([`parse_head`], and [`Decoder`] for the body) is pure, over the
//! bytes read so far, so it is tested byte by byte; the I/O around it is
//! thin.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use http::{StatusCode, Version};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::fields::{self, Fields};
pub use crate::framing::Decoder;
use crate::framing::{DecodeError, Step};

/// Largest response head accepted (status line and headers).
const HEAD_LIMIT: usize = 64 * 1024;
/// Most headers in a response head.
const MAX_HEADERS: usize = 100;
/// Bytes asked of the socket per read.
const READ_SIZE: usize = 16 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Nothing of a response arrived: the connection failed or closed
    /// before its first byte.
    #[error("the replica closed the connection before answering{}", .0.as_ref().map(|e| format!(": {e}")).unwrap_or_default())]
    Unanswered(Option<io::Error>),
    #[error("reading the replica's response failed: {0}")]
    Io(io::Error),
    #[error("the replica's response ended before its end")]
    Incomplete,
    #[error("the replica sent an invalid response: {0}")]
    Invalid(String),
}

impl From<DecodeError> for Error {
    fn from(e: DecodeError) -> Self {
        match e {
            DecodeError::Incomplete => Error::Incomplete,
            DecodeError::Invalid(what) => Error::Invalid(what),
        }
    }
}

impl Error {
    /// The replica closed (or reset) the connection before answering — on
    /// a reused connection, the close of an idle connection crossing the
    /// request on the wire.
    pub fn is_stale(&self) -> bool {
        match self {
            Error::Unanswered(None) => true,
            Error::Unanswered(Some(e)) => is_closed_by_peer(e),
            _ => false,
        }
    }

    fn invalid(what: impl Into<String>) -> Self {
        Error::Invalid(what.into())
    }
}

/// The peer closed or reset the connection under the operation.
pub(super) fn is_closed_by_peer(e: &io::Error) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionAborted, ConnectionReset};
    matches!(e.kind(), ConnectionReset | BrokenPipe | ConnectionAborted)
}

/// A response head, and how its body is framed.
#[derive(Debug)]
pub struct Head {
    pub status: StatusCode,
    pub headers: Fields,
    pub decoder: Decoder,
    /// Whether the connection may carry another request once the body has
    /// been read to its end.
    pub keep_alive: bool,
}

pub struct Connection {
    io: TcpStream,
    /// Bytes read and not yet consumed.
    buf: BytesMut,
}

impl Connection {
    pub fn new(io: TcpStream) -> Self {
        Self {
            io,
            buf: BytesMut::new(),
        }
    }

    /// Whether the replica closed the connection (or sent something no
    /// request asked for) while it sat idle. Costs a read only when the
    /// socket was reported readable, which an idle, open one is not.
    pub fn is_closed(&mut self) -> bool {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match self.io.poll_read_ready(&mut cx) {
            Poll::Pending => false,
            Poll::Ready(Err(_)) => true,
            Poll::Ready(Ok(())) => {
                let mut probe = [0u8; 1];
                !matches!(self.io.try_read(&mut probe), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
        }
    }

    /// Send a request (`head` ends with its blank line) and read the
    /// response's head. The body is read with [`Decoder`] over
    /// [`Connection::poll_data`].
    pub async fn send(&mut self, head: &[u8], body: &[u8]) -> Result<Head, Error> {
        debug_assert!(
            self.buf.is_empty(),
            "a connection is reused only when drained"
        );
        self.write_all(head, body)
            .await
            .map_err(|e| Error::Unanswered(Some(e)))?;
        // Whether any byte came back: after one (even of a 1xx response),
        // the replica has the request, and it must not be sent again.
        let mut answered = false;
        loop {
            if !self.buf.is_empty() {
                if let Some(head) = parse_head(&mut self.buf)? {
                    return Ok(head);
                }
                if self.buf.len() > HEAD_LIMIT {
                    return Err(Error::invalid(format!(
                        "response head over {HEAD_LIMIT} bytes"
                    )));
                }
            }
            match std::future::poll_fn(|cx| self.poll_fill(cx)).await {
                Ok(0) if answered => return Err(Error::Incomplete),
                Ok(0) => return Err(Error::Unanswered(None)),
                Ok(_) => answered = true,
                Err(e) if answered => return Err(Error::Io(e)),
                Err(e) => return Err(Error::Unanswered(Some(e))),
            }
        }
    }

    async fn write_all(&mut self, head: &[u8], body: &[u8]) -> io::Result<()> {
        let mut slices = [IoSlice::new(head), IoSlice::new(body)];
        let mut pending = &mut slices[..];
        IoSlice::advance_slices(&mut pending, 0);
        while !pending.is_empty() {
            let n = self.io.write_vectored(pending).await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            IoSlice::advance_slices(&mut pending, n);
        }
        Ok(())
    }

    /// The next piece of the body `decoder` frames; `None` at its end.
    pub fn poll_data(
        &mut self,
        decoder: &mut Decoder,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Error>>> {
        loop {
            match decoder.decode(&mut self.buf) {
                Ok(Step::Data(data)) => return Poll::Ready(Some(Ok(data))),
                Ok(Step::End) => return Poll::Ready(None),
                Ok(Step::NeedMore) => {}
                Err(e) => return Poll::Ready(Some(Err(e.into()))),
            }
            match ready!(self.poll_fill(cx)) {
                Ok(0) => decoder.set_eof(),
                Ok(_) => {}
                Err(e) => return Poll::Ready(Some(Err(Error::Io(e)))),
            }
        }
    }

    /// Let go of the read buffer of a connection going idle. It holds the
    /// memory of the responses read into it (up to [`READ_SIZE`] and
    /// more); a pool's idle connections would otherwise hold as much each,
    /// for as long as they stay idle. The next request allocates afresh.
    pub fn release_buffer(&mut self) {
        if self.buf.is_empty() {
            self.buf = BytesMut::new();
        }
    }

    /// The read buffer's capacity, for tests.
    #[cfg(test)]
    pub fn buffer_capacity(&self) -> usize {
        self.buf.capacity()
    }

    /// Whether nothing past the last response has arrived: only then may
    /// the connection carry another request.
    pub fn is_drained(&self) -> bool {
        self.buf.is_empty()
    }

    /// Read what the socket has into `buf`; 0 at end of file. A read that
    /// does not fill the space offered tells Tokio the socket is drained,
    /// so an idle connection is not reported readable again until
    /// something new arrives (see [`Connection::is_closed`]).
    fn poll_fill(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<usize>> {
        if self.buf.capacity() - self.buf.len() < READ_SIZE / 4 {
            self.buf.reserve(READ_SIZE);
        }
        tokio_util::io::poll_read_buf(Pin::new(&mut self.io), cx, &mut self.buf)
    }
}

/// Parse a complete response head from the start of `buf` and consume it;
/// `None` if more bytes are needed. Informational (1xx) responses are
/// skipped.
fn parse_head(buf: &mut BytesMut) -> Result<Option<Head>, Error> {
    loop {
        // Uninitialised: this runs per response, and most fill a handful.
        let mut headers = [const { std::mem::MaybeUninit::uninit() }; MAX_HEADERS];
        let mut response = httparse::Response::new(&mut []);
        let len = match httparse::ParserConfig::default().parse_response_with_uninit_headers(
            &mut response,
            buf,
            &mut headers,
        ) {
            Ok(httparse::Status::Complete(len)) => len,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => return Err(Error::invalid(e.to_string())),
        };
        let code = response.code.unwrap_or_default();
        if (100..200).contains(&code) {
            if code == 101 {
                return Err(Error::invalid("a protocol switch nobody asked for"));
            }
            buf.advance(len);
            continue;
        }
        let status = StatusCode::from_u16(code).map_err(|e| Error::invalid(e.to_string()))?;
        let version = match response.version {
            Some(1) => Version::HTTP_11,
            _ => Version::HTTP_10,
        };
        // The fields share the head's bytes once it is split off the
        // buffer.
        let spans = fields::spans(buf, response.headers);
        let headers = Fields::new(buf.split_to(len).freeze(), spans);
        let (decoder, keep_alive) = framing(status, version, &headers)?;
        return Ok(Some(Head {
            status,
            headers,
            decoder,
            keep_alive,
        }));
    }
}

/// How the body is delimited (RFC 9112 §6.3), and whether the connection
/// outlives it. A `Content-Length` next to `Transfer-Encoding` is ignored
/// (the latter wins, and the length is wrong; the gateway frames its own
/// response) and the connection is not reused: a replica framing its
/// answer two ways may not agree with us on where it ends.
fn framing(
    status: StatusCode,
    version: Version,
    headers: &Fields,
) -> Result<(Decoder, bool), Error> {
    let mut close = headers.has_token("connection", b"close");
    let decoder = if status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        Decoder::with_length(0)
    } else if headers.contains("transfer-encoding") {
        close |= headers.contains("content-length");
        if headers.ends_chunked() {
            Decoder::chunked()
        } else {
            Decoder::until_close()
        }
    } else {
        match headers.declared_length().map_err(Error::invalid)? {
            Some(length) => Decoder::with_length(length),
            None => Decoder::until_close(),
        }
    };
    let keep_alive = version == Version::HTTP_11 && !close && !decoder.is_until_close();
    Ok((decoder, keep_alive))
}

#[cfg(test)]
mod tests;
