//! The gateway's HTTP/1.1 server connection.
//!
//! One task per client connection reads a request — its head, then its
//! whole body — hands it to the handler, and writes the response back,
//! streaming its body frame by frame; then the next request, while the
//! connection is kept alive. While the handler runs, and while a streamed
//! response waits for its next frame, the connection watches for the
//! client leaving, and then drops the response, which aborts the replica's
//! request.
//!
//! hyper's server does this through a general dispatcher, a body channel
//! the handler reads the request body from, and a header map rebuilt into
//! bytes. Every request here has a small body the pipeline needs whole
//! before it can route, so it is read first, in place: the head's fields
//! ([`Fields`]) and the body are slices of the bytes read, and the response
//! head goes out with the first piece of the body in one `writev`.

use std::future::Future;
use std::io::{self, IoSlice};
use std::pin::{Pin, pin};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Method, Response, StatusCode, Uri, Version, header};
use http_body::Body as _;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use super::{IDLE_TIMEOUT, Request, SEND_TIMEOUT, WorkerId};
use crate::body::{RequestBody, ResponseBody};
use crate::drain::Watch;
use crate::error::ApiError;
use crate::fields::{self, Fields};
use crate::framing::{Decoder, Step};

/// Largest request head accepted (request line and headers).
const HEAD_LIMIT: usize = 64 * 1024;
/// Most headers in a request head.
const MAX_HEADERS: usize = 100;
/// Bytes asked of the socket per read.
const READ_SIZE: usize = 16 * 1024;
/// Time a request has to arrive in full once its first byte has: a client
/// sending a byte now and then must not hold a connection forever.
const ARRIVAL_TIMEOUT: Duration = Duration::from_secs(30);
/// After a refusal whose request body was left unread, this much of it is
/// read and dropped, for at most [`LINGER`], before the connection closes:
/// closing on unread bytes resets the connection, and the reset can reach
/// the client before the refusal does.
const DISCARD_LIMIT: usize = 1024 * 1024;
const LINGER: Duration = Duration::from_secs(1);
/// How HTTP/2 with prior knowledge opens a connection (RFC 9113 §3.4).
const HTTP2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// A client connection, and the bytes read from it not yet consumed.
pub struct Connection {
    io: TcpStream,
    buf: BytesMut,
    /// The response head being written; kept for the next response.
    out: Vec<u8>,
    /// Some of the request being read has arrived.
    started: bool,
    /// Armed once a started request makes the connection wait; see
    /// [`ARRIVAL_TIMEOUT`].
    arrival: Option<Pin<Box<Sleep>>>,
    /// Responses written so far.
    served: u64,
    /// Fires [`IDLE_TIMEOUT`] after it was armed, at the first wait for a
    /// request; `served` then. When it fires after more responses, it is
    /// moved on by another [`IDLE_TIMEOUT`]: a busy connection touches
    /// neither the timer nor the clock per request.
    idle: Option<(Pin<Box<Sleep>>, u64)>,
    /// [`SEND_TIMEOUT`].
    send_timeout: Duration,
}

/// What the client sent that the handler does not see, but the response
/// depends on.
struct Exchange {
    version: Version,
    head_only: bool,
    /// The client asked for the connection to stay open.
    keep_alive: bool,
    /// The request body was read to its end, so the next request's bytes
    /// follow.
    body_read: bool,
}

/// How a response body is delimited.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Framing {
    Length(u64),
    Chunked,
    /// By closing the connection: a stream to an HTTP/1.0 client.
    Close,
    /// No body at all: a response to HEAD, a 204 or a 304.
    None,
}

/// What a response being written waits for next.
enum Next {
    Frame(Option<Result<http_body::Frame<Bytes>, crate::body::BoxError>>),
    /// No frame yet, and the head is still unsent.
    Waiting,
    /// The client closed the connection.
    Gone,
}

/// Why a request was not read.
enum Unread {
    /// The client closed the connection (or draining started while it sat
    /// idle): nothing to answer.
    Closed,
    /// Answer this, then close.
    Refused(ApiError),
}

impl Connection {
    pub fn new(io: TcpStream) -> Self {
        Self {
            io,
            buf: BytesMut::with_capacity(READ_SIZE),
            out: Vec::with_capacity(512),
            started: false,
            arrival: None,
            served: 0,
            idle: None,
            send_timeout: SEND_TIMEOUT,
        }
    }

    /// A shorter [`SEND_TIMEOUT`], for tests in real time.
    #[cfg(test)]
    pub fn with_send_timeout(mut self, timeout: Duration) -> Self {
        self.send_timeout = timeout;
        self
    }

    /// Whether the client opens with the HTTP/2 preface; `None` if it left
    /// (or draining started) first. Reads only until the bytes differ from
    /// the preface, which for HTTP/1.1 is the first read.
    pub async fn starts_with_http2(&mut self, watch: &Watch) -> Option<bool> {
        loop {
            let n = self.buf.len().min(HTTP2_PREFACE.len());
            if self.buf[..n] != HTTP2_PREFACE[..n] {
                return Some(false);
            }
            if n == HTTP2_PREFACE.len() {
                return Some(true);
            }
            match std::future::poll_fn(|cx| self.poll_fill_idle(cx, watch)).await {
                Ok(n) if n > 0 => {}
                _ => return None,
            }
        }
    }

    /// The socket and the bytes read from it so far, for another protocol.
    pub fn into_parts(self) -> (TcpStream, Bytes) {
        (self.io, self.buf.freeze())
    }

    /// Serve requests until the client closes the connection, asks for it
    /// to close, or draining starts.
    pub async fn serve<H, F>(mut self, handler: H, worker: WorkerId, max_body: u64, watch: Watch)
    where
        H: Fn(WorkerId, Request) -> F,
        F: Future<Output = Response<ResponseBody>>,
    {
        loop {
            let (request, exchange) = match self.read_request(max_body, &watch).await {
                Ok(read) => read,
                Err(Unread::Closed) => return,
                Err(Unread::Refused(error)) => {
                    let exchange = Exchange {
                        version: Version::HTTP_11,
                        head_only: false,
                        keep_alive: false,
                        body_read: false,
                    };
                    let _ = self.respond(error.into_response(), &exchange, true).await;
                    self.linger().await;
                    return;
                }
            };
            let response = {
                let mut handling = pin!(handler(worker, request));
                let answered = std::future::poll_fn(|cx| {
                    if let Poll::Ready(response) = handling.as_mut().poll(cx) {
                        return Poll::Ready(Some(response));
                    }
                    self.poll_gone(cx).map(|()| None)
                });
                match answered.await {
                    Some(response) => response,
                    // Dropping the handler's future aborts its work.
                    None => return,
                }
            };
            let close = !exchange.keep_alive || !exchange.body_read || watch.is_draining();
            match self.respond(response, &exchange, close).await {
                Ok(true) => self.served += 1,
                Ok(false) if exchange.body_read => {
                    let _ = self.io.shutdown().await;
                    return;
                }
                Ok(false) => {
                    self.linger().await;
                    return;
                }
                Err(_) => return,
            }
        }
    }

    /// The next request, its body read whole (or refused, in the
    /// request's body, for the pipeline to answer).
    async fn read_request(
        &mut self,
        max_body: u64,
        watch: &Watch,
    ) -> Result<(Request, Exchange), Unread> {
        self.started = !self.buf.is_empty();
        self.arrival = None;
        let head = loop {
            if !self.buf.is_empty() {
                if let Some(head) = parse_head(&mut self.buf).map_err(Unread::Refused)? {
                    break head;
                }
                if self.buf.len() > HEAD_LIMIT {
                    return Err(Unread::Refused(ApiError::head_too_large(HEAD_LIMIT)));
                }
            }
            self.fill_arriving(watch).await?;
        };
        let Head {
            method,
            uri,
            version,
            headers,
            body,
            keep_alive,
            expect_continue,
        } = head;
        let mut exchange = Exchange {
            version,
            head_only: method == Method::HEAD,
            keep_alive,
            body_read: false,
        };
        let body = match body {
            BodyFraming::Refused(e) => Err(e),
            // Declared too large: refused unread, and not invited by a
            // 100 Continue.
            BodyFraming::Decoder(decoder) if decoder.remaining().is_some_and(|n| n > max_body) => {
                Err(ApiError::body_too_large(max_body))
            }
            BodyFraming::Decoder(decoder) => {
                if expect_continue && !decoder.is_end() && self.buf.is_empty() {
                    write_all(
                        &mut self.io,
                        &mut [IoSlice::new(b"HTTP/1.1 100 Continue\r\n\r\n")],
                        self.send_timeout,
                    )
                    .await
                    .map_err(|_| Unread::Closed)?;
                }
                let body = self.read_body(decoder, max_body, watch).await?;
                exchange.body_read = body.is_ok();
                body
            }
        };
        let request = Request {
            method,
            uri,
            version,
            headers,
            body: RequestBody::Read(body),
        };
        Ok((request, exchange))
    }

    async fn read_body(
        &mut self,
        mut decoder: Decoder,
        max_body: u64,
        watch: &Watch,
    ) -> Result<Result<Bytes, ApiError>, Unread> {
        let mut first = None;
        let mut more: Option<BytesMut> = None;
        let mut total = 0u64;
        loop {
            match decoder.decode(&mut self.buf) {
                Ok(Step::Data(data)) => {
                    total += data.len() as u64;
                    if total > max_body {
                        return Ok(Err(ApiError::body_too_large(max_body)));
                    }
                    match (&first, &mut more) {
                        (None, _) => first = Some(data),
                        (Some(first), None) => {
                            let mut joined = BytesMut::from(&first[..]);
                            joined.extend_from_slice(&data);
                            more = Some(joined);
                        }
                        (Some(_), Some(joined)) => joined.extend_from_slice(&data),
                    }
                }
                Ok(Step::End) => {
                    return Ok(Ok(match more {
                        Some(joined) => joined.freeze(),
                        None => first.unwrap_or_default(),
                    }));
                }
                Ok(Step::NeedMore) => self.fill_arriving(watch).await?,
                Err(e) => return Ok(Err(ApiError::malformed(format!("the body: {e}")))),
            }
        }
    }

    /// Read more of a request: the first bytes of a request may be awaited
    /// for as long as the client keeps the connection open, unless
    /// draining starts; the rest must arrive within [`ARRIVAL_TIMEOUT`].
    async fn fill_arriving(&mut self, watch: &Watch) -> Result<(), Unread> {
        let read = if !self.started {
            std::future::poll_fn(|cx| self.poll_fill_idle(cx, watch)).await
        } else {
            let arrival = self
                .arrival
                .get_or_insert_with(|| Box::pin(tokio::time::sleep(ARRIVAL_TIMEOUT)));
            let (io, buf) = (&mut self.io, &mut self.buf);
            std::future::poll_fn(|cx| {
                if arrival.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Err(io::ErrorKind::TimedOut.into()));
                }
                poll_fill(io, buf, cx)
            })
            .await
        };
        match read {
            Ok(0) => Err(Unread::Closed),
            Ok(_) => {
                self.started = true;
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                Err(Unread::Refused(ApiError::request_timeout(ARRIVAL_TIMEOUT)))
            }
            Err(_) => Err(Unread::Closed),
        }
    }

    /// A read while no request is under way; ends (as end of file) when
    /// draining starts or the connection has been idle too long.
    fn poll_fill_idle(&mut self, cx: &mut Context<'_>, watch: &Watch) -> Poll<io::Result<usize>> {
        if watch.poll_draining(cx).is_ready() {
            return Poll::Ready(Ok(0));
        }
        if let Poll::Ready(read) = poll_fill(&mut self.io, &mut self.buf, cx) {
            return Poll::Ready(read);
        }
        match &mut self.idle {
            // Polled once, to register this task's waker, which stays.
            None => {
                let mut timer = Box::pin(tokio::time::sleep(IDLE_TIMEOUT));
                let _ = timer.as_mut().poll(cx);
                self.idle = Some((timer, self.served));
            }
            Some((timer, served_then)) if timer.is_elapsed() => {
                if *served_then == self.served {
                    return Poll::Ready(Ok(0));
                }
                *served_then = self.served;
                timer.as_mut().reset(Instant::now() + IDLE_TIMEOUT);
                let _ = timer.as_mut().poll(cx);
            }
            Some(_) => {}
        }
        Poll::Pending
    }

    /// Ready when the client has closed the connection. Bytes it sends
    /// meanwhile (a pipelined request) are kept, up to a head's worth.
    fn poll_gone(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        while self.buf.len() < HEAD_LIMIT {
            match poll_fill(&mut self.io, &mut self.buf, cx) {
                Poll::Ready(Ok(0) | Err(_)) => return Poll::Ready(()),
                Poll::Ready(Ok(_)) => {}
                Poll::Pending => return Poll::Pending,
            }
        }
        Poll::Pending
    }

    /// Write `response`; whether the connection may carry another request.
    /// An error means the client is gone or the body failed midway, and
    /// the connection must close at once.
    async fn respond(
        &mut self,
        response: Response<ResponseBody>,
        exchange: &Exchange,
        mut close: bool,
    ) -> io::Result<bool> {
        let (parts, mut body) = response.into_parts();
        let framing = if exchange.head_only
            || parts.status.is_informational()
            || parts.status == StatusCode::NO_CONTENT
            || parts.status == StatusCode::NOT_MODIFIED
        {
            Framing::None
        } else if let Some(length) = body.size_hint().exact() {
            Framing::Length(length)
        } else if exchange.version == Version::HTTP_11 {
            Framing::Chunked
        } else {
            Framing::Close
        };
        close |= framing == Framing::Close;
        self.out.clear();
        encode_head(
            &mut self.out,
            parts.status,
            &parts.headers,
            body.forwarded_headers(&parts.headers),
            framing,
            close,
            exchange.version,
        );
        if framing == Framing::None {
            write_all(
                &mut self.io,
                &mut [IoSlice::new(&self.out)],
                self.send_timeout,
            )
            .await?;
            return Ok(!close);
        }
        let mut head_sent = false;
        let mut sent = 0u64;
        loop {
            let next = std::future::poll_fn(|cx| {
                if let Poll::Ready(frame) = Pin::new(&mut body).poll_frame(cx) {
                    return Poll::Ready(Next::Frame(frame));
                }
                if !head_sent {
                    return Poll::Ready(Next::Waiting);
                }
                self.poll_gone(cx).map(|()| Next::Gone)
            })
            .await;
            let data = match next {
                // The head goes alone when the body is not there yet: a
                // stream's client learns at once that it was accepted.
                Next::Waiting => {
                    write_all(
                        &mut self.io,
                        &mut [IoSlice::new(&self.out)],
                        self.send_timeout,
                    )
                    .await?;
                    head_sent = true;
                    continue;
                }
                // The client left: dropping the body aborts the replica's
                // request.
                Next::Gone => return Err(io::ErrorKind::ConnectionAborted.into()),
                Next::Frame(Some(Ok(frame))) => match frame.into_data() {
                    Ok(data) if !data.is_empty() => Some(data),
                    _ => continue,
                },
                Next::Frame(None) => None,
                // Too late for another status: the client sees the
                // response cut short.
                Next::Frame(Some(Err(e))) => return Err(io::Error::other(e)),
            };
            if let Some(d) = &data {
                sent += d.len() as u64;
            } else if matches!(framing, Framing::Length(n) if n != sent) {
                // Ended short of its length: only closing tells the client.
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            let end = data.is_none() || body.is_end_stream();
            let head: &[u8] = if head_sent { &[] } else { &self.out };
            let mut size_line = [0u8; 20];
            let (size_line, after): (&[u8], &[u8]) = match (framing, &data) {
                (Framing::Chunked, Some(d)) => (
                    chunk_size_line(d.len(), &mut size_line),
                    if end { b"\r\n0\r\n\r\n" } else { b"\r\n" },
                ),
                (Framing::Chunked, None) => (&[], b"0\r\n\r\n"),
                _ => (&[], &[]),
            };
            let data = data.as_deref().unwrap_or_default();
            write_all(
                &mut self.io,
                &mut [
                    IoSlice::new(head),
                    IoSlice::new(size_line),
                    IoSlice::new(data),
                    IoSlice::new(after),
                ],
                self.send_timeout,
            )
            .await?;
            head_sent = true;
            if end {
                return Ok(!close);
            }
        }
    }

    /// Read and drop what the client still sends, within bounds, before
    /// the connection closes; see [`DISCARD_LIMIT`].
    async fn linger(&mut self) {
        let _ = self.io.shutdown().await;
        let discard = async {
            let mut scratch = vec![0u8; READ_SIZE];
            let mut discarded = 0;
            while discarded < DISCARD_LIMIT {
                match self.io.read(&mut scratch).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => discarded += n,
                }
            }
        };
        let _ = tokio::time::timeout(LINGER, discard).await;
    }
}

/// The bytes from `io` into `buf`; 0 at end of file.
fn poll_fill(
    io: &mut TcpStream,
    buf: &mut BytesMut,
    cx: &mut Context<'_>,
) -> Poll<io::Result<usize>> {
    if buf.capacity() - buf.len() < READ_SIZE / 4 {
        buf.reserve(READ_SIZE);
    }
    tokio_util::io::poll_read_buf(Pin::new(io), cx, buf)
}

/// Write all of `slices`, or fail with `TimedOut` once the client has
/// taken none of it for `send_timeout`.
async fn write_all(
    io: &mut TcpStream,
    slices: &mut [IoSlice<'_>],
    send_timeout: Duration,
) -> io::Result<()> {
    let mut pending = slices;
    IoSlice::advance_slices(&mut pending, 0);
    // Armed only when the socket is full, which a client that reads
    // leaves it only briefly.
    let mut stalled: Option<Pin<Box<Sleep>>> = None;
    while !pending.is_empty() {
        let n = std::future::poll_fn(|cx| {
            let written = Pin::new(&mut *io).poll_write_vectored(cx, pending);
            if written.is_ready() {
                return written;
            }
            let timer = stalled.get_or_insert_with(|| Box::pin(tokio::time::sleep(send_timeout)));
            timer
                .as_mut()
                .poll(cx)
                .map(|()| Err(io::ErrorKind::TimedOut.into()))
        })
        .await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        stalled = None;
        IoSlice::advance_slices(&mut pending, n);
    }
    Ok(())
}

/// A parsed request head.
struct Head {
    method: Method,
    uri: Uri,
    version: Version,
    headers: Fields,
    body: BodyFraming,
    keep_alive: bool,
    expect_continue: bool,
}

enum BodyFraming {
    Decoder(Decoder),
    /// Refused from the head alone; the body is left unread.
    Refused(ApiError),
}

/// Parse a complete request head from the start of `buf` and consume it;
/// `None` if more bytes are needed.
fn parse_head(buf: &mut BytesMut) -> Result<Option<Head>, ApiError> {
    // Uninitialised: this runs per request, and most fill a handful.
    let mut headers = [const { std::mem::MaybeUninit::uninit() }; MAX_HEADERS];
    let mut request = httparse::Request::new(&mut []);
    let len = match httparse::ParserConfig::default().parse_request_with_uninit_headers(
        &mut request,
        buf,
        &mut headers,
    ) {
        Ok(httparse::Status::Complete(len)) if len > HEAD_LIMIT => {
            return Err(ApiError::head_too_large(HEAD_LIMIT));
        }
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => {
            return Err(ApiError::malformed(format!(
                "more than {MAX_HEADERS} headers"
            )));
        }
        Err(e) => return Err(ApiError::malformed(e)),
    };
    let method = Method::from_bytes(request.method.unwrap_or_default().as_bytes())
        .map_err(ApiError::malformed)?;
    let version = match request.version {
        Some(1) => Version::HTTP_11,
        _ => Version::HTTP_10,
    };
    // The target and header fields share the head's bytes once it is
    // split off the buffer.
    let target = fields::span_in(buf, request.path.unwrap_or_default().as_bytes());
    let spans = fields::spans(buf, request.headers);
    let head = buf.split_to(len).freeze();
    let uri = Uri::from_maybe_shared(head.slice(target)).map_err(ApiError::malformed)?;
    let headers = Fields::new(head, spans);
    let keep_alive = if version == Version::HTTP_11 {
        !headers.has_token("connection", b"close")
    } else {
        headers.has_token("connection", b"keep-alive")
    };
    // An HTTP/1.0 client does not know 1xx responses (RFC 9110 §15.2).
    let expect_continue =
        version == Version::HTTP_11 && headers.has_token("expect", b"100-continue");
    let body = body_framing(&headers)?;
    Ok(Some(Head {
        method,
        uri,
        version,
        headers,
        body,
        keep_alive,
        expect_continue,
    }))
}

/// How the request body is delimited (RFC 9112 §6.3). A request framed
/// both ways is refused: the two framings may disagree on where the next
/// request starts.
fn body_framing(headers: &Fields) -> Result<BodyFraming, ApiError> {
    if headers.contains("transfer-encoding") {
        if headers.contains("content-length") {
            return Err(ApiError::malformed(
                "both Content-Length and Transfer-Encoding",
            ));
        }
        return if headers.ends_chunked() {
            Ok(BodyFraming::Decoder(Decoder::chunked()))
        } else {
            Ok(BodyFraming::Refused(ApiError::unsupported_transfer_coding()))
        };
    }
    let length = headers.declared_length().map_err(ApiError::malformed)?;
    Ok(BodyFraming::Decoder(Decoder::with_length(
        length.unwrap_or(0),
    )))
}

/// The response head: status line, the replica's headers and the
/// handler's but those that frame the message (set here), a `Date` unless
/// the replica sent one, and the blank line.
fn encode_head<'a>(
    out: &mut Vec<u8>,
    status: StatusCode,
    headers: &HeaderMap,
    replica: impl Iterator<Item = (&'a [u8], &'a [u8])>,
    framing: Framing,
    close: bool,
    version: Version,
) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    let mut field = |name: &[u8], value: &[u8]| {
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    };
    let mut dated = headers.contains_key(header::DATE);
    for (name, value) in replica {
        dated |= name.eq_ignore_ascii_case(b"date");
        field(name, value);
    }
    for (name, value) in headers {
        if name == header::CONTENT_LENGTH
            || name == header::TRANSFER_ENCODING
            || name == header::CONNECTION
            || name.as_str() == "keep-alive"
        {
            continue;
        }
        field(name.as_str().as_bytes(), value.as_bytes());
    }
    if !dated {
        out.extend_from_slice(b"date: ");
        http_date(|date| out.extend_from_slice(date));
        out.extend_from_slice(b"\r\n");
    }
    match framing {
        Framing::Length(n) => {
            out.extend_from_slice(b"content-length: ");
            out.extend_from_slice(itoa(n, &mut [0; 20]));
            out.extend_from_slice(b"\r\n");
        }
        Framing::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        Framing::Close | Framing::None => {}
    }
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    } else if version == Version::HTTP_10 {
        out.extend_from_slice(b"connection: keep-alive\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// `n` in decimal, in `buf`.
fn itoa(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut at = buf.len();
    loop {
        at -= 1;
        buf[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[at..];
        }
    }
}

/// A chunk's size line: `len` in hexadecimal and CRLF.
fn chunk_size_line(len: usize, buf: &mut [u8; 20]) -> &[u8] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    buf[18] = b'\r';
    buf[19] = b'\n';
    let mut at = 18;
    let mut n = len;
    loop {
        at -= 1;
        buf[at] = HEX[n & 0xf];
        n >>= 4;
        if n == 0 {
            return &buf[at..];
        }
    }
}

/// The current time as an HTTP-date, formatted once a second per thread.
fn http_date<R>(f: impl FnOnce(&[u8]) -> R) -> R {
    thread_local! {
        static DATE: std::cell::RefCell<(u64, String)> = const {
            std::cell::RefCell::new((u64::MAX, String::new()))
        };
    }
    let now = SystemTime::now();
    let secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    DATE.with_borrow_mut(|(formatted_at, date)| {
        if *formatted_at != secs {
            *formatted_at = secs;
            *date = httpdate::fmt_http_date(now);
        }
        f(date.as_bytes())
    })
}

#[cfg(test)]
mod tests;
