//! Entry points for the fuzz targets in `fuzz/` (cargo-fuzz), and for
//! nothing else.
//!
//! The code the targets drive lives in private modules; these thin wrappers
//! reach it without making those modules public API. Hidden from the docs
//! and not a stable interface: each wrapper follows the code it wraps, and
//! should do what the pipeline does with it, no more.
//!
//! One section per target, named after it.

use std::sync::OnceLock;
use std::time::Duration;

use http::{HeaderMap, HeaderValue, StatusCode, header};
use tokio::time::Instant;

use crate::record::Record;
use crate::telemetry::Metrics;

// Input layout shared by the targets that cut a byte stream ----------------

/// An input that carries its own cuts: byte 0 is a mode byte (its low 4
/// bits say how many cuts follow; the targets may use its high bits), then
/// 2 bytes per cut, little-endian, modulo the length of the rest + 1: where
/// the rest is cut into pieces, so that boundaries can fall anywhere.
pub fn cut(data: &[u8]) -> Option<Cut<'_>> {
    let (&mode, rest) = data.split_first()?;
    let cut_bytes = (usize::from(mode & 0x0f) * 2).min(rest.len());
    let (cuts, bytes) = rest.split_at(cut_bytes);
    let mut cuts: Vec<usize> = cuts
        .chunks_exact(2)
        .map(|c| usize::from(u16::from_le_bytes([c[0], c[1]])) % (bytes.len() + 1))
        .collect();
    cuts.sort_unstable();
    let mut pieces = Vec::with_capacity(cuts.len() + 1);
    let mut start = 0;
    for cut in cuts.into_iter().chain([bytes.len()]) {
        pieces.push(&bytes[start..cut]);
        start = cut;
    }
    Some(Cut {
        mode,
        pieces,
        whole: bytes,
    })
}

/// An input [`cut`] into pieces.
pub struct Cut<'a> {
    /// The first byte; its low 4 bits counted the cuts.
    pub mode: u8,
    pub pieces: Vec<&'a [u8]>,
    /// All the pieces together.
    pub whole: &'a [u8],
}

// `request_json` ------------------------------------------------------------

/// The parse stage: body → model, stream, token estimate, and the prompt's
/// prefix hashes. Re-exported as is, so the target checks the real thing.
pub use crate::inbound::parse::{InferenceRequest, MAX_ESTIMATED_TOKENS};

// `sse` ---------------------------------------------------------------------

/// Pass a replica's `200 OK` response through a request's record as the
/// pipeline does: the head (an event stream when `sse`, else a JSON body),
/// each body frame, the end; then drop the record, which counts it in the
/// metrics and writes its access-log line.
///
/// The record keeps what it learns (TTFT, token usage) to itself, so the
/// `sse` target checks those numbers on
/// [`ResponseMeter`](crate::telemetry::response::ResponseMeter), the type
/// the record reads them with.
pub fn record_response<'a>(sse: bool, frames: impl IntoIterator<Item = &'a [u8]>) {
    // One registry for the whole run: building one per input would be most
    // of the work, and the histograms only ever grow.
    static METRICS: OnceLock<Metrics> = OnceLock::new();
    let metrics = METRICS.get_or_init(Metrics::new);

    let content_type = if sse {
        "text/event-stream; charset=utf-8"
    } else {
        "application/json"
    };
    let mut head = HeaderMap::new();
    head.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));

    let mut record = Record::new(
        HeaderValue::from_static("fuzz"),
        Instant::now(),
        tracing::Span::none(),
        None,
        None,
    );
    record.parsed("fuzz", sse);
    record.unrouted(metrics.unrouted());
    record.on_response(StatusCode::OK, &head);
    for frame in frames {
        record.on_data(frame);
    }
    record.on_end();
}

// `server` ------------------------------------------------------------------

/// Serve `pieces`, in order, as the bytes a client sends on one connection
/// (split where the pieces are, as a socket may deliver them), then the
/// client's end of file; return every byte the server wrote back. The
/// handler reads each request's body as the pipeline does and answers with
/// its method, path and body length. Time is paused, so every timeout
/// fires as soon as nothing else can happen: no input hangs the target.
pub fn serve_bytes(pieces: &[&[u8]]) -> Vec<u8> {
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use crate::inbound::server::connection::{self, Timeouts};

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let (client, server) = tokio::io::duplex(64 * 1024);
        let handler = |_, req: crate::inbound::server::Request| async move {
            let limited = http_body_util::Limited::new(req.body, 1 << 20);
            match limited.collect().await {
                Ok(body) => {
                    let len = body.to_bytes().len();
                    let answer = format!("{} {} {len}", req.method, req.uri.path());
                    http::Response::new(crate::outbound::response_body::full(answer.into()))
                }
                Err(_) => crate::error::ApiError::body_too_large(1 << 20).into_response(),
            }
        };
        let drain = crate::inbound::drain::Drain::new();
        let peer: std::net::SocketAddr = ([127, 0, 0, 1], 1).into();
        let timeouts = Timeouts::new(Duration::from_secs(1));
        let serving = tokio::spawn(connection::serve(
            server,
            peer,
            handler,
            0,
            drain.watch(),
            timeouts,
        ));
        let (mut read, mut write) = tokio::io::split(client);
        let sending = async {
            for piece in pieces {
                if write.write_all(piece).await.is_err() {
                    return;
                }
            }
            let _ = write.shutdown().await;
        };
        let mut out = Vec::new();
        let receiving = read.read_to_end(&mut out);
        let _ = tokio::join!(sending, receiving);
        let _ = serving.await;
        out
    })
}

// `upstream_response` -------------------------------------------------------

/// What the gateway made of a replica's answer.
#[derive(Debug)]
pub enum Upstream {
    /// The answer's status, whether the pipeline would pass it on (its
    /// transfer coding is plain), the end-to-end header names, and its body
    /// or the error that cut it.
    Answered {
        status: u16,
        passed_on: bool,
        forwarded_headers: Vec<String>,
        body: Result<Vec<u8>, String>,
    },
    Failed(String),
}

/// Send a chat request through a pool's connections to a replica on
/// 127.0.0.1 that reads it and answers with `pieces` (written in turn),
/// then closes the connection.
pub fn upstream_response(pieces: &[&[u8]]) -> Upstream {
    use http_body_util::BodyExt;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use crate::outbound::connections::Settings;
    use crate::outbound::{Connections, Forwarded, Outgoing, TrustedProxies};

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        // One listening socket for the whole run: a port bound per input
        // would run the machine out of ports (each closed connection holds
        // its port for a minute).
        static LISTENER: OnceLock<std::net::TcpListener> = OnceLock::new();
        let shared = LISTENER.get_or_init(|| {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port on 127.0.0.1");
            listener
                .set_nonblocking(true)
                .expect("a non-blocking socket");
            listener
        });
        let listener = tokio::net::TcpListener::from_std(shared.try_clone().expect("a socket"))
            .expect("a listener on this runtime");
        let addr = listener.local_addr().expect("an address").to_string();
        let pieces: Vec<Vec<u8>> = pieces.iter().map(|p| p.to_vec()).collect();
        let replica = tokio::spawn(async move {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            // The request: its head and its 2-byte body.
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            while !got.windows(6).any(|w| w == b"\r\n\r\n{}") {
                match stream.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            for piece in pieces {
                if stream.write_all(&piece).await.is_err() {
                    return;
                }
            }
        });
        let pool = Connections::new(Settings::new(
            config::Protocol::Http1,
            Duration::from_secs(1),
        ));
        let headers = HeaderMap::new();
        let forwarded = Forwarded::new(
            &headers,
            ([127, 0, 0, 1], 1).into(),
            "http",
            &TrustedProxies::default(),
        );
        let uri = http::Uri::from_static("/v1/chat/completions");
        let body = bytes::Bytes::from_static(b"{}");
        let id = HeaderValue::from_static("fuzz");
        let outgoing = Outgoing {
            method: &http::Method::POST,
            uri: &uri,
            headers: &headers,
            body: &body,
            request_id: &id,
            traceparent: &id,
            forwarded: &forwarded,
            caller: Default::default(),
        };
        let limit = Duration::from_secs(2);
        let answer = match tokio::time::timeout(limit, pool.send(&addr, &outgoing)).await {
            Err(_) => Upstream::Failed("timed out".into()),
            Ok(Err(e)) => Upstream::Failed(e.to_string()),
            Ok(Ok(response)) => {
                let forwarded_headers = crate::headers::end_to_end(&response.headers)
                    .map(|(name, _)| name.to_string())
                    .collect();
                let passed_on = crate::headers::plain_transfer_coding(&response.headers);
                let body = match tokio::time::timeout(limit, response.body.collect()).await {
                    Err(_) => Err("timed out".into()),
                    Ok(Err(e)) => Err(e.to_string()),
                    Ok(Ok(collected)) => Ok(collected.to_bytes().to_vec()),
                };
                Upstream::Answered {
                    status: response.status.as_u16(),
                    passed_on,
                    forwarded_headers,
                    body,
                }
            }
        };
        replica.abort();
        answer
    })
}
