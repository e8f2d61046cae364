//! HTTP/1.1 messages as raw bytes, parsed strictly: what the recording
//! replica received from the gateway, and what a raw client received
//! back. Heads are parsed by `httparse`; bodies are delimited here
//! (RFC 9112 §6.3), with no leniency a smuggling attack could hide behind:
//! a message framed two ways, a malformed length or a chunk framed
//! loosely is an error, never a guess.

/// One parse attempt over the bytes received so far.
#[derive(Debug)]
pub enum Parsed<T> {
    /// A whole message, and how many bytes it took.
    Complete(T, usize),
    /// Not all of it has arrived.
    Partial,
    /// Not a valid message.
    Invalid(String),
}

/// Header fields: names lower-cased, values as sent, in order.
pub type Headers = Vec<(String, Vec<u8>)>;

#[derive(Debug, Clone)]
pub struct Request {
    pub method: String,
    pub target: String,
    /// The minor version: 1 for HTTP/1.1.
    pub version: u8,
    pub headers: Headers,
    /// The body, decoded from its framing.
    pub body: Vec<u8>,
}

#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Headers,
    /// The body, decoded from its framing.
    pub body: Vec<u8>,
    /// The body as framed on the wire (chunk sizes and all).
    pub raw_body: Vec<u8>,
    pub chunked: bool,
}

/// Header lookups shared by requests and responses.
pub trait Fields {
    fn fields(&self) -> &Headers;

    /// Every value of `name` (any case), in order, as text.
    fn values(&self, name: &str) -> Vec<String> {
        self.fields()
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .collect()
    }

    /// The only value of `name`; `None` when absent (or repeated).
    fn value(&self, name: &str) -> Option<String> {
        let mut all = self.values(name);
        (all.len() == 1).then(|| all.remove(0))
    }
}

impl Fields for Request {
    fn fields(&self) -> &Headers {
        &self.headers
    }
}

impl Fields for Response {
    fn fields(&self) -> &Headers {
        &self.headers
    }
}

impl Response {
    pub fn body_text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// `status` and the start of the body, for failure messages.
    pub fn summary(&self) -> String {
        format!("{} {}", self.status, preview(&self.body, 160))
    }
}

impl Request {
    /// Method, target and the start of the body, for failure messages.
    pub fn summary(&self) -> String {
        format!(
            "{} {} body={}",
            self.method,
            preview(self.target.as_bytes(), 80),
            preview(&self.body, 80)
        )
    }
}

/// Up to `max` bytes of `bytes`, escaped, for failure messages.
pub fn preview(bytes: &[u8], max: usize) -> String {
    let shown: String = bytes
        .iter()
        .take(max)
        .flat_map(|&b| std::ascii::escape_default(b))
        .map(char::from)
        .collect();
    if bytes.len() > max {
        format!("\"{shown}\"… ({} bytes)", bytes.len())
    } else {
        format!("\"{shown}\"")
    }
}

const MAX_HEADERS: usize = 256;

/// The request at the start of `buf`.
pub fn request(buf: &[u8]) -> Parsed<Request> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut headers);
    let head = match req.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(e) => return Parsed::Invalid(format!("request head: {e}: {}", preview(buf, 200))),
    };
    let headers = lower(req.headers);
    let mut request = Request {
        method: req.method.unwrap_or_default().to_owned(),
        target: req.path.unwrap_or_default().to_owned(),
        version: req.version.unwrap_or_default(),
        headers,
        body: Vec::new(),
    };
    let framing = match request_framing(&request) {
        Ok(f) => f,
        Err(e) => return Parsed::Invalid(e),
    };
    match body(&buf[head..], framing, false) {
        Parsed::Complete((body, _), n) => {
            request.body = body;
            Parsed::Complete(request, head + n)
        }
        Parsed::Partial => Parsed::Partial,
        Parsed::Invalid(e) => Parsed::Invalid(format!("request body: {e}")),
    }
}

/// The response at the start of `buf`; `eof` when the peer has closed the
/// connection, which ends a body delimited by closing.
pub fn response(buf: &[u8], eof: bool) -> Parsed<Response> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let head = match resp.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(e) => return Parsed::Invalid(format!("response head: {e}: {}", preview(buf, 200))),
    };
    let status = resp.code.unwrap_or_default();
    let mut response = Response {
        status,
        headers: lower(resp.headers),
        body: Vec::new(),
        raw_body: Vec::new(),
        chunked: false,
    };
    let framing = match response_framing(&response) {
        Ok(f) => f,
        Err(e) => return Parsed::Invalid(e),
    };
    response.chunked = framing == Framing::Chunked;
    match body(&buf[head..], framing, eof) {
        Parsed::Complete((body, raw), n) => {
            response.body = body;
            response.raw_body = raw;
            Parsed::Complete(response, head + n)
        }
        Parsed::Partial => Parsed::Partial,
        Parsed::Invalid(e) => Parsed::Invalid(format!(
            "the {status} response's body: {e}; head: {}",
            preview(&buf[..head], 300)
        )),
    }
}

/// A response whose body, delimited by its Content-Length, the connection
/// cut short: its status, the length declared and the bytes received.
pub fn cut_short(buf: &[u8]) -> Option<(u16, usize, usize)> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut headers);
    let Ok(httparse::Status::Complete(head)) = resp.parse(buf) else {
        return None;
    };
    let length = resp
        .headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("content-length"))?;
    let declared: usize = std::str::from_utf8(length.value).ok()?.parse().ok()?;
    let received = buf.len() - head;
    (received < declared).then_some((resp.code?, declared, received))
}

fn lower(headers: &[httparse::Header<'_>]) -> Headers {
    headers
        .iter()
        .map(|h| (h.name.to_ascii_lowercase(), h.value.to_vec()))
        .collect()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    Length(usize),
    Chunked,
    UntilClose,
}

fn request_framing(req: &Request) -> Result<Framing, String> {
    declared_framing(req, Framing::Length(0))
}

fn response_framing(resp: &Response) -> Result<Framing, String> {
    if (100..200).contains(&resp.status) || resp.status == 204 || resp.status == 304 {
        return Ok(Framing::Length(0));
    }
    declared_framing(resp, Framing::UntilClose)
}

/// The framing a message's fields declare, strictly: exactly one
/// `chunked`, or one well-formed length, never both; `unframed` when it
/// declares none.
fn declared_framing(message: &impl Fields, unframed: Framing) -> Result<Framing, String> {
    let te = message.values("transfer-encoding");
    let cl = message.values("content-length");
    if !te.is_empty() {
        if !cl.is_empty() {
            return Err("both Transfer-Encoding and Content-Length".into());
        }
        if te.len() != 1 || !te[0].trim().eq_ignore_ascii_case("chunked") {
            return Err(format!("Transfer-Encoding {te:?}"));
        }
        return Ok(Framing::Chunked);
    }
    match cl.as_slice() {
        [] => Ok(unframed),
        [one] => strict_length(one).map(Framing::Length),
        many => Err(format!("{} Content-Length fields: {many:?}", many.len())),
    }
}

fn strict_length(v: &str) -> Result<usize, String> {
    if v.is_empty() || v.len() > 15 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("Content-Length {v:?}"));
    }
    Ok(v.parse().expect("digits"))
}

/// The body framed by `framing` at the start of `buf`: decoded and raw.
fn body(buf: &[u8], framing: Framing, eof: bool) -> Parsed<(Vec<u8>, Vec<u8>)> {
    match framing {
        Framing::Length(n) if buf.len() >= n => {
            Parsed::Complete((buf[..n].to_vec(), buf[..n].to_vec()), n)
        }
        Framing::Length(n) if eof => Parsed::Invalid(format!(
            "the connection closed after {} of {n} body bytes",
            buf.len()
        )),
        Framing::Length(_) => Parsed::Partial,
        Framing::UntilClose if eof => Parsed::Complete((buf.to_vec(), buf.to_vec()), buf.len()),
        Framing::UntilClose => Parsed::Partial,
        Framing::Chunked => match chunked(buf) {
            Parsed::Complete(body, n) => Parsed::Complete((body, buf[..n].to_vec()), n),
            Parsed::Partial if eof => Parsed::Invalid(format!(
                "the connection closed inside the chunked body (no last chunk): {}",
                preview(buf, 300)
            )),
            Parsed::Partial => Parsed::Partial,
            Parsed::Invalid(e) => Parsed::Invalid(e),
        },
    }
}

/// A chunked body, strictly: `1*HEXDIG [;ext] CRLF data CRLF` … `0 CRLF`,
/// trailer lines, `CRLF`.
fn chunked(buf: &[u8]) -> Parsed<Vec<u8>> {
    let mut at = 0;
    let mut body = Vec::new();
    loop {
        let Some(len) = find_crlf(&buf[at..]) else {
            return Parsed::Partial;
        };
        let line = &buf[at..at + len];
        let size = line.split(|&b| b == b';').next().unwrap_or_default();
        if size.is_empty() || size.len() > 15 || !size.iter().all(u8::is_ascii_hexdigit) {
            return Parsed::Invalid(format!("chunk-size line {}", preview(line, 80)));
        }
        let size = usize::from_str_radix(std::str::from_utf8(size).expect("hex"), 16)
            .expect("at most 15 hex digits");
        at += len + 2;
        if size == 0 {
            // Trailer lines, then the blank line.
            loop {
                let Some(len) = find_crlf(&buf[at..]) else {
                    return Parsed::Partial;
                };
                at += len + 2;
                if len == 0 {
                    return Parsed::Complete(body, at);
                }
            }
        }
        if buf.len() < at + size + 2 {
            return Parsed::Partial;
        }
        body.extend_from_slice(&buf[at..at + size]);
        if &buf[at + size..at + size + 2] != b"\r\n" {
            return Parsed::Invalid("chunk data not followed by CRLF".into());
        }
        at += size + 2;
    }
}

fn find_crlf(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\r\n")
}
