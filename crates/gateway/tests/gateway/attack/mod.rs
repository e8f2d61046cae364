//! The attack suite: the real gateway, started in-process, in front of
//! recording replicas (raw TCP listeners that keep every byte they receive
//! and answer with canned raw bytes), attacked by raw TCP clients writing
//! exact bytes.
//!
//! Every case checks both sides: what the client got back (status, and
//! for errors the OpenAI shape `{"error": {"message", "type", "param",
//! "code"}}`), and exactly what the replicas received (nothing at all, or
//! exactly these requests with exactly these bodies), parsed strictly from
//! the recorded bytes. Nothing sleeps for synchronization: a case waits for
//! answers, for end of file, for `100 Continue`, or for a sentinel request
//! sent after it to be answered (so it, and anything the case made the
//! gateway send before it, has reached the replica); every wait is bounded
//! so a hang fails the case instead of blocking CI.
//!
//! Helpers: [`wire`] parses raw HTTP/1.1 strictly, [`replica`] is the
//! recording replica, [`client`] starts the gateway and holds the raw
//! clients.
//!
//! Table-driven groups run every case and print `PASS`/`FAIL` per case
//! (`cargo test -p infergate-gateway --test gateway attack:: -- --nocapture`),
//! then fail with the list of failures.

mod client;
mod replica;
mod wire;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use client::{Exchanged, Lab, RawConn, WAIT, check_error_object, exchange, openai_error, post};
use replica::{Answer, Script, Seen};
use tokio::sync::Notify;
use wire::Fields;

use crate::support::CHAT;

/// The smallest body the gateway routes: 13 bytes (`d` in hex).
const B: &str = r#"{"model":"m"}"#;
/// [`B`] as one chunk and the last chunk.
const CB: &str = "d\r\n{\"model\":\"m\"}\r\n0\r\n\r\n";
/// A request head up to its framing fields.
const H: &str =
    "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n";
/// A whole request, used as a body or trailing bytes by smuggling cases:
/// the replica must never receive it as a request of its own.
const SMUGGLED: &str = "POST /v1/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: 22\r\n\r\n{\"model\":\"m\",\"smug\":1}";

// ---------------------------------------------------------------------------
// The case table and its runner
// ---------------------------------------------------------------------------

struct Case {
    name: &'static str,
    raw: Vec<u8>,
    expect: Expect,
}

fn case(name: &'static str, raw: impl Into<Vec<u8>>, expect: Expect) -> Case {
    Case {
        name,
        raw: raw.into(),
        expect,
    }
}

enum Expect {
    /// One answer with one of these statuses, in the OpenAI shape, with no
    /// `100 Continue` before it; the replicas receive nothing.
    Refused(&'static [u16]),
    /// These answers, in order; the replicas receive exactly these
    /// requests, in order, each exactly as sent.
    Served(Vec<Ans>, Vec<Up>),
    /// Refused by hyper's HTTP/1.1 parser before a request exists: one of
    /// these statuses, in hyper's bare form (no body needed), and the
    /// replicas receive nothing.
    Malformed(&'static [u16]),
    /// Either refused as [`Expect::Refused`] or served as this one request:
    /// both are safe, and which one is the gateway's choice (the RFC
    /// allows either, or a strict parser and hyper differ harmlessly).
    RefusedOrServed(&'static [u16], Up),
}

/// One answer the client expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ans {
    /// The replica's 200, answering the next forwarded request in order.
    Replica,
    /// The gateway's own answer with this status (OpenAI shape if ≥ 400).
    Gateway(u16),
}

/// A request the replica must receive.
#[derive(Debug, Clone)]
struct Up {
    path: String,
    body: Vec<u8>,
    /// Fields whose values must be exactly these, in order (none: absent).
    headers: Vec<(&'static str, Vec<String>)>,
}

fn up(path: &str, body: &str) -> Up {
    Up {
        path: path.to_owned(),
        body: body.as_bytes().to_vec(),
        headers: Vec::new(),
    }
}

impl Up {
    fn with(mut self, name: &'static str, values: &[&str]) -> Self {
        self.headers
            .push((name, values.iter().map(|v| v.to_string()).collect()));
        self
    }
}

/// `Served` with every answer from the replica.
fn served(ups: Vec<Up>) -> Expect {
    Expect::Served(vec![Ans::Replica; ups.len()], ups)
}

/// Run every case against a fresh gateway (`spec` added to its config)
/// and a fresh recording replica; print each outcome; fail listing the
/// cases that failed.
async fn run_table(group: &str, spec: &str, cases: Vec<Case>) {
    let mut failed = Vec::new();
    for case in &cases {
        match run_case(spec, case).await {
            Ok(()) => println!("PASS {group}/{}", case.name),
            Err(e) => {
                println!("FAIL {group}/{}: {e}", case.name);
                failed.push(format!("  {}: {e}", case.name));
            }
        }
    }
    assert!(
        failed.is_empty(),
        "{group}: {} of {} cases failed:\n{}",
        failed.len(),
        cases.len(),
        failed.join("\n")
    );
}

async fn run_case(spec: &str, case: &Case) -> Result<(), String> {
    let lab = Lab::start(spec, "", vec![Arc::new(replica::ok)]).await;
    let answers = match &case.expect {
        Expect::Refused(_) | Expect::Malformed(_) | Expect::RefusedOrServed(..) => 1,
        Expect::Served(answers, _) => answers.len(),
    };
    let got = exchange(lab.addr(), &case.raw, answers).await;
    // Whatever happened, the replica's side is read only after a later
    // request has gone through: anything the case made the gateway send
    // upstream has arrived by then.
    let barrier = lab.sentinel().await;
    let upstream = lab.upstream();
    let got = got.map_err(|e| with_upstream(e, &upstream))?;
    barrier?;
    let upstream = upstream?;
    match &case.expect {
        Expect::Refused(statuses) => refused(statuses, &got, &upstream),
        Expect::Malformed(statuses) => malformed(statuses, &got, &upstream),
        Expect::Served(answers, ups) => served_as(answers, ups, &got, &upstream),
        Expect::RefusedOrServed(statuses, one) => {
            if got.responses[0].status == 200 {
                served_as(&[Ans::Replica], std::slice::from_ref(one), &got, &upstream)
                    .map_err(|e| format!("served (refusing with {statuses:?} was fine too): {e}"))
            } else {
                refused(statuses, &got, &upstream)
                    .map_err(|e| format!("{e} (serving it intact was fine too)"))
            }
        }
    }
}

/// A client-side failure, with what the replica received meanwhile.
fn with_upstream(e: String, upstream: &Result<Vec<Seen>, String>) -> String {
    match upstream {
        Ok(seen) if seen.is_empty() => format!("{e}; the replica received nothing"),
        Ok(seen) => format!("{e}; the replica received {}", summaries(seen)),
        Err(problem) => format!("{e}; {problem}"),
    }
}

fn summaries(seen: &[Seen]) -> String {
    let all: Vec<String> = seen.iter().map(|s| s.request.summary()).collect();
    format!("{} request(s): {all:?}", seen.len())
}

fn refused(statuses: &[u16], got: &Exchanged, upstream: &[Seen]) -> Result<(), String> {
    let r = &got.responses[0];
    if !statuses.contains(&r.status) {
        return Err(format!(
            "expected {statuses:?}, got {}; the replica received {}",
            r.summary(),
            summaries(upstream)
        ));
    }
    openai_error(r)?;
    if !got.informational.is_empty() {
        return Err(format!(
            "the gateway invited the body ({:?}) before refusing it",
            got.informational
        ));
    }
    if !upstream.is_empty() {
        return Err(format!(
            "refused with {}, yet the replica received {}",
            r.status,
            summaries(upstream)
        ));
    }
    Ok(())
}

/// Like [`refused`], for hyper's own refusals, which carry no body.
fn malformed(statuses: &[u16], got: &Exchanged, upstream: &[Seen]) -> Result<(), String> {
    let r = &got.responses[0];
    if !statuses.contains(&r.status) {
        return Err(format!(
            "expected {statuses:?}, got {}; the replica received {}",
            r.summary(),
            summaries(upstream)
        ));
    }
    if !upstream.is_empty() {
        return Err(format!(
            "refused with {}, yet the replica received {}",
            r.status,
            summaries(upstream)
        ));
    }
    Ok(())
}

fn served_as(
    answers: &[Ans],
    ups: &[Up],
    got: &Exchanged,
    upstream: &[Seen],
) -> Result<(), String> {
    let statuses: Vec<u16> = got.responses.iter().map(|r| r.status).collect();
    let expected: Vec<u16> = answers
        .iter()
        .map(|a| match a {
            Ans::Replica => 200,
            Ans::Gateway(s) => *s,
        })
        .collect();
    if statuses != expected {
        let bodies: Vec<String> = got.responses.iter().map(|r| r.summary()).collect();
        return Err(format!(
            "expected answers {expected:?}, got {bodies:?}; the replica received {}",
            summaries(upstream)
        ));
    }
    let mut forwarded = 0;
    for (i, (r, a)) in got.responses.iter().zip(answers).enumerate() {
        match a {
            Ans::Gateway(s) if *s >= 400 => openai_error(r)?,
            Ans::Gateway(_) => {}
            // The replica numbers its answers: the k-th forwarded request's
            // answer must be the k-th answer the client gets from it.
            Ans::Replica => {
                forwarded += 1;
                let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
                if body["seen"] != forwarded {
                    return Err(format!(
                        "answer {} is not the replica's answer to forwarded request {forwarded}: {}",
                        i + 1,
                        r.summary()
                    ));
                }
            }
        }
    }
    if upstream.len() != ups.len() {
        return Err(format!(
            "the replica should have received {} request(s), it received {}",
            ups.len(),
            summaries(upstream)
        ));
    }
    for (i, (seen, up)) in upstream.iter().zip(ups).enumerate() {
        forwarded_as(seen, up).map_err(|e| format!("forwarded request {}: {e}", i + 1))?;
    }
    Ok(())
}

/// `seen` is `up` exactly, and carries nothing a client may not send on.
fn forwarded_as(seen: &Seen, up: &Up) -> Result<(), String> {
    let r = &seen.request;
    if r.method != "POST" || r.target != up.path || r.version != 1 {
        return Err(format!(
            "expected POST {} HTTP/1.1, got {} (HTTP/1.{})",
            up.path,
            r.summary(),
            r.version
        ));
    }
    if r.body != up.body {
        return Err(format!(
            "body changed: sent {}, the replica got {}",
            wire::preview(&up.body, 120),
            wire::preview(&r.body, 120)
        ));
    }
    if r.values("host").len() != 1 {
        return Err(format!("Host fields upstream: {:?}", r.values("host")));
    }
    for (name, value) in &r.headers {
        if name.starts_with("x-infergate-") {
            return Err(format!(
                "the client's {name}: {} reached the replica",
                String::from_utf8_lossy(value)
            ));
        }
        if value.windows(4).any(|w| w == b"evil") {
            return Err(format!(
                "an attacker's value reached the replica: {name}: {}",
                String::from_utf8_lossy(value)
            ));
        }
    }
    for (name, values) in &up.headers {
        let got = r.values(name);
        if &got != values {
            return Err(format!("{name}: expected {values:?}, got {got:?}"));
        }
    }
    Ok(())
}

// Building raw requests.

/// `head` (up to its framing) with a Content-Length for `body`, then `body`.
fn with_length(head: &str, body: &str) -> String {
    format!("{head}Content-Length: {}\r\n\r\n{body}", body.len())
}

/// `data` as one chunk.
fn chunk(data: &str) -> String {
    format!("{:x}\r\n{data}\r\n", data.len())
}

/// A keep-alive POST of `body` to `path`.
fn post_ka(path: &str, body: &str) -> String {
    with_length(
        &format!("POST {path} HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n"),
        body,
    )
}

// ---------------------------------------------------------------------------
// Smuggling classics: no request may ever reach the replica as anything
// other than what a correct HTTP/1.1 parser reads.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn smuggling_length_and_transfer_encoding() {
    use Expect::{Malformed, Refused, RefusedOrServed};
    let cases = vec![
        // CL.TE: framed both ways; hops that pick different framings desync.
        // RFC 9112 §6.3 lets a server refuse it or read it by its
        // Transfer-Encoding alone and then close the connection; hyper
        // does the latter, so what follows the last chunk is never read.
        case(
            "cl_and_te",
            format!("{H}Content-Length: 13\r\nTransfer-Encoding: chunked\r\n\r\n{CB}"),
            RefusedOrServed(&[400], up(CHAT, B)),
        ),
        // TE.CL: the same, fields the other way round.
        case(
            "te_and_cl",
            format!("{H}Transfer-Encoding: chunked\r\nContent-Length: 23\r\n\r\n{CB}"),
            RefusedOrServed(&[400], up(CHAT, B)),
        ),
        // CL.TE with a whole request after the last chunk, inside the length.
        case(
            "cl_te_with_smuggled_request",
            format!(
                "{H}Content-Length: {}\r\nTransfer-Encoding: chunked\r\n\r\n{CB}{SMUGGLED}",
                CB.len() + SMUGGLED.len()
            ),
            RefusedOrServed(&[400], up(CHAT, B)),
        ),
        // Two Content-Length fields that disagree: which one ends the body?
        case(
            "cl_twice_differing",
            format!("{H}Content-Length: 13\r\nContent-Length: 14\r\n\r\n{B} "),
            Malformed(&[400]),
        ),
        // The same disagreement as one comma-separated field.
        case(
            "cl_list_differing",
            format!("{H}Content-Length: 13, 14\r\n\r\n{B} "),
            Malformed(&[400]),
        ),
        // Equal duplicates are one length (RFC 9110 §8.6 lets a recipient
        // take it or refuse).
        case(
            "cl_twice_equal",
            format!("{H}Content-Length: 13\r\nContent-Length: 13\r\n\r\n{B}"),
            RefusedOrServed(&[400], up(CHAT, B)),
        ),
        // A sign, which lenient integer parsers take.
        case(
            "cl_plus",
            format!("{H}Content-Length: +13\r\n\r\n{B}"),
            Malformed(&[400]),
        ),
        // Hexadecimal, which `strtol(…, 0)`-style parsers take.
        case(
            "cl_hex",
            format!("{H}Content-Length: 0xd\r\n\r\n{B}"),
            Malformed(&[400]),
        ),
        // Digits split by a space: `1` to one parser, `13` to another.
        case(
            "cl_inner_space",
            format!("{H}Content-Length: 1 3\r\n\r\n{B}"),
            Malformed(&[400]),
        ),
        // Negative: a signed parser may read backwards or as huge.
        case(
            "cl_negative",
            format!("{H}Content-Length: -1\r\n\r\n{B}"),
            Malformed(&[400]),
        ),
        // Empty: 0 to some, malformed to others.
        case(
            "cl_empty",
            format!("{H}Content-Length: \r\n\r\n{B}"),
            Malformed(&[400]),
        ),
        // 2^64 + 13: wraps to 13 in a u64 that overflows silently.
        case(
            "cl_overflow",
            format!("{H}Content-Length: 18446744073709551629\r\n\r\n{B}"),
            Malformed(&[400]),
        ),
        // A coding after chunked: the body is not delimited by chunked.
        case(
            "te_chunked_identity",
            format!("{H}Transfer-Encoding: chunked, identity\r\n\r\n{CB}"),
            Malformed(&[400, 501]),
        ),
        // A coding that merely contains `chunked`.
        case(
            "te_xchunked",
            format!("{H}Transfer-Encoding: xchunked\r\n\r\n{CB}"),
            Malformed(&[400, 501]),
        ),
        // A tab before the value: optional whitespace, so it is `chunked`
        // (RFC 9110 §5.5); refusing is safe too.
        case(
            "te_value_leading_tab",
            format!("{H}Transfer-Encoding:\tchunked\r\n\r\n{CB}"),
            RefusedOrServed(&[400, 501], up(CHAT, B)),
        ),
        // Spaces before the value: the same.
        case(
            "te_value_leading_spaces",
            format!("{H}Transfer-Encoding:   chunked\r\n\r\n{CB}"),
            RefusedOrServed(&[400, 501], up(CHAT, B)),
        ),
        // The field line itself starts with a space: a continuation (obs-fold)
        // of the line before, which some hops unfold and others drop.
        case(
            "te_line_leading_space",
            format!("{H} Transfer-Encoding: chunked\r\n\r\n{CB}"),
            Malformed(&[400]),
        ),
        // Space before the colon: RFC 9112 §5.1 says refuse with 400.
        case(
            "te_space_before_colon",
            format!("{H}Transfer-Encoding : chunked\r\n\r\n{CB}"),
            Malformed(&[400]),
        ),
        // A vertical tab before the value: whitespace to some parsers only.
        case(
            "te_vertical_tab_value",
            format!("{H}Transfer-encoding:\x0bchunked\r\n\r\n{CB}"),
            Malformed(&[400, 501]),
        ),
        // A vertical tab ending the name.
        case(
            "te_vertical_tab_name",
            format!("{H}Transfer-encoding\x0b: chunked\r\n\r\n{CB}"),
            Malformed(&[400, 501]),
        ),
        // chunked applied twice (RFC 9112 §6.1 forbids it): decoded once,
        // the body is still chunked.
        case(
            "te_chunked_twice",
            format!("{H}Transfer-Encoding: chunked, chunked\r\n\r\n{CB}"),
            Refused(&[400, 501]),
        ),
        // The same, as two fields.
        case(
            "te_chunked_two_fields",
            format!("{H}Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n{CB}"),
            Refused(&[400, 501]),
        ),
        // A coding the gateway cannot undo, not ending in chunked: the body
        // is delimited by closing, which a request cannot do.
        case(
            "te_gzip",
            format!("{H}Transfer-Encoding: gzip\r\n\r\n{B}"),
            Malformed(&[400, 501]),
        ),
        // gzip then chunked: forwarding the de-chunked bytes would send
        // gzip data as if it were plain JSON.
        case(
            "te_gzip_chunked",
            format!("{H}Transfer-Encoding: gzip, chunked\r\n\r\n{CB}"),
            Refused(&[400, 501]),
        ),
        // identity, an obsolete coding some hops skip.
        case(
            "te_identity",
            format!("{H}Transfer-Encoding: identity\r\n\r\n{B}"),
            Malformed(&[400, 501]),
        ),
        // Transfer-Encoding on HTTP/1.0, which has none (RFC 9112 §6.1).
        case(
            "te_on_http10",
            format!(
                "POST {CHAT} HTTP/1.0\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n{CB}"
            ),
            Malformed(&[400]),
        ),
    ];
    run_table("length-and-transfer-encoding", "", cases).await;
}

#[tokio::test]
async fn smuggling_chunk_framing() {
    use Expect::{Malformed, RefusedOrServed};
    let te = format!("{H}Transfer-Encoding: chunked\r\n\r\n");
    let cases = vec![
        // Control: a short chunk extension is ignored, the body is intact.
        case(
            "extension_short",
            format!("{te}d;name=value\r\n{B}\r\n0\r\n\r\n"),
            served(vec![up(CHAT, B)]),
        ),
        // Control: the body split over several chunks is joined intact.
        case(
            "several_chunks",
            format!(
                "{te}{}{}{}0\r\n\r\n",
                chunk("{\"mo"),
                chunk("del\":"),
                chunk("\"m\"}")
            ),
            served(vec![up(CHAT, B)]),
        ),
        // A `0x` prefix: 0 (the last chunk) to a strict parser, 13 to a
        // lenient one.
        case(
            "size_0x_prefix",
            format!("{te}0xd\r\n{B}\r\n0\r\n\r\n"),
            Malformed(&[400]),
        ),
        // Whitespace before the size.
        case(
            "size_leading_space",
            format!("{te} d\r\n{B}\r\n0\r\n\r\n"),
            Malformed(&[400]),
        ),
        case(
            "size_leading_tab",
            format!("{te}\td\r\n{B}\r\n0\r\n\r\n"),
            Malformed(&[400]),
        ),
        // Whitespace between the size and CRLF: not in RFC 9112's grammar,
        // but the size is unambiguous and hyper takes it; either is safe.
        case(
            "size_trailing_space",
            format!("{te}d \r\n{B}\r\n0\r\n\r\n"),
            RefusedOrServed(&[400], up(CHAT, B)),
        ),
        // A negative size.
        case(
            "size_negative",
            format!("{te}-d\r\n{B}\r\n0\r\n\r\n"),
            Malformed(&[400]),
        ),
        // No size at all.
        case(
            "size_missing",
            format!("{te}\r\n{B}\r\n0\r\n\r\n"),
            Malformed(&[400]),
        ),
        // 17 hex digits, 2^64 + 13: wraps to 13 in a u64 that overflows.
        case(
            "size_overflow_wraps",
            format!("{te}1000000000000000d\r\n{B}\r\n0\r\n\r\n"),
            Malformed(&[400]),
        ),
        // 17 hex digits of f.
        case(
            "size_overflow_f17",
            format!("{te}fffffffffffffffff\r\n{B}\r\n0\r\n\r\n"),
            Malformed(&[400]),
        ),
        // A 100 KiB chunk extension: memory and CPU spent on nothing.
        case(
            "extension_100k",
            format!("{te}d;{}\r\n{B}\r\n0\r\n\r\n", "x".repeat(100 * 1024)),
            Malformed(&[400]),
        ),
        // Bare LF ending the size line.
        case(
            "bare_lf_after_size",
            format!("{te}d\n{B}\r\n0\r\n\r\n"),
            Malformed(&[400]),
        ),
        // Bare LF after the chunk data.
        case(
            "bare_lf_after_data",
            format!("{te}d\r\n{B}\n0\r\n\r\n"),
            Malformed(&[400]),
        ),
        // Bare LFs in the last chunk and the end of the trailers.
        case(
            "bare_lf_last_chunk",
            format!("{te}d\r\n{B}\r\n0\n\n"),
            Malformed(&[400]),
        ),
        // No CRLF after the data: the next size line starts early.
        case(
            "data_without_crlf",
            format!("{te}d\r\n{B}0\r\n\r\n"),
            Malformed(&[400]),
        ),
        // More data than the size says: the excess would be read as framing.
        case(
            "data_longer_than_size",
            format!("{te}5\r\n{B}\r\n0\r\n\r\n"),
            Malformed(&[400]),
        ),
        // Trailers naming framing, routing and a made-up field: never merged
        // into the forwarded head (RFC 9110 §6.5.1). Refusing is fine too.
        case(
            "trailer_forbidden_fields",
            format!(
                "{te}d\r\n{B}\r\n0\r\nContent-Length: 50\r\nTransfer-Encoding: gzip\r\nHost: evil\r\nX-Trailer-Injected: 1\r\n\r\n"
            ),
            RefusedOrServed(&[400], up(CHAT, B).with("x-trailer-injected", &[])),
        ),
    ];
    run_table("chunk-framing", "", cases).await;
}

#[tokio::test]
async fn smuggling_pipelining() {
    use Expect::Served;
    let b2 = r#"{"model":"m","n":2}"#;
    let b3 = r#"{"model":"m","n":3}"#;
    // Valid JSON whose whitespace holds `0\r\n\r\n`: a hop that ends a
    // chunked body at the first such bytes, not by its sizes, stops early.
    let tricky = "{\"model\":\"m\",\"x\":\r\n0\r\n\r\n}";
    let cases = vec![
        // Two requests in one write: both forwarded, in order, intact.
        case(
            "two_in_one_write",
            format!("{}{}", post_ka(CHAT, B), post_ka("/v1/completions", b2)),
            served(vec![up(CHAT, B), up("/v1/completions", b2)]),
        ),
        // Chunked, then length-delimited, then chunked, in one write.
        case(
            "mixed_framings_in_one_write",
            format!(
                "{H}Transfer-Encoding: chunked\r\n\r\n{CB}{}{H}Transfer-Encoding: chunked\r\n\r\n{}0\r\n\r\n",
                post_ka(CHAT, b2),
                chunk(b3)
            ),
            served(vec![up(CHAT, B), up(CHAT, b2), up(CHAT, b3)]),
        ),
        // A chunked body holding `0\r\n\r\n` inside its one chunk, then the
        // next request.
        case(
            "terminator_inside_chunk",
            format!(
                "{H}Transfer-Encoding: chunked\r\n\r\n{}0\r\n\r\n{}",
                chunk(tricky),
                post_ka(CHAT, B)
            ),
            served(vec![up(CHAT, tricky), up(CHAT, B)]),
        ),
        // A body that is itself a request: a hop ignoring this request's
        // length (CL.0) would forward the body as a second request. It is
        // not JSON (400); only the request after it reaches the replica.
        case(
            "body_is_a_request",
            format!("{}{}", post_ka(CHAT, SMUGGLED), post_ka(CHAT, B)),
            Served(vec![Ans::Gateway(400), Ans::Replica], vec![up(CHAT, B)]),
        ),
        // The same behind a GET, whose body some hops never read.
        case(
            "get_body_is_a_request",
            format!(
                "GET /healthz HTTP/1.1\r\nHost: gw\r\nContent-Length: {}\r\n\r\n{SMUGGLED}{}",
                SMUGGLED.len(),
                post_ka(CHAT, B)
            ),
            Served(vec![Ans::Gateway(200), Ans::Replica], vec![up(CHAT, B)]),
        ),
        // A request refused for its model, then one served: the refusal
        // leaves the connection in step.
        case(
            "refused_then_served",
            format!(
                "{}{}",
                post_ka(CHAT, r#"{"model":"nope"}"#),
                post_ka(CHAT, B)
            ),
            Served(vec![Ans::Gateway(404), Ans::Replica], vec![up(CHAT, B)]),
        ),
    ];
    run_table("pipelining", "", cases).await;
}

#[tokio::test]
async fn smuggling_malformed_heads() {
    use Expect::{Malformed, Refused, Served};
    let cases = vec![
        // obs-fold: a header continued on the next line.
        case(
            "obs_fold",
            with_length(&format!("{H}X-Note: a\r\n  b\r\n"), B),
            Malformed(&[400]),
        ),
        // obs-fold carrying the length itself.
        case(
            "obs_fold_content_length",
            format!("{H}Content-Length:\r\n 13\r\n\r\n{B}"),
            Malformed(&[400]),
        ),
        // A bare CR inside a value: a line break to some parsers.
        case(
            "bare_cr_in_value",
            with_length(&format!("{H}X-Note: a\rb\r\n"), B),
            Malformed(&[400]),
        ),
        // A bare CR ending a line, hiding the next field from CRLF parsers.
        case(
            "bare_cr_line_end",
            format!("{H}X-Note: a\rContent-Length: 13\r\n\r\n{B}"),
            Malformed(&[400]),
        ),
        // NUL in a value: C string handling truncates it.
        case(
            "nul_in_value",
            with_length(&format!("{H}X-Note: a\0b\r\n"), B),
            Malformed(&[400]),
        ),
        // NUL in the request line.
        case(
            "nul_in_request_line",
            with_length(
                "POST /v1/chat/completions\0 HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n",
                B,
            ),
            Malformed(&[400]),
        ),
        // NUL in the target.
        case(
            "nul_in_target",
            with_length(
                "POST /v1/chat\0/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n",
                B,
            ),
            Malformed(&[400]),
        ),
        // A space in the target: the request line splits differently.
        case(
            "space_in_target",
            with_length(
                "POST /v1/chat completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n",
                B,
            ),
            Malformed(&[400]),
        ),
        // A space in the query.
        case(
            "space_in_query",
            with_length(
                "POST /v1/chat/completions?a=b c HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n",
                B,
            ),
            Malformed(&[400]),
        ),
        // HTTP/1.1 without Host (RFC 9112 §3.2: 400).
        case(
            "no_host",
            with_length(
                "POST /v1/chat/completions HTTP/1.1\r\nContent-Type: application/json\r\n",
                B,
            ),
            Refused(&[400]),
        ),
        // Two Host fields: which one is the authority?
        case(
            "two_hosts",
            with_length(&format!("{H}Host: evil\r\n"), B),
            Refused(&[400]),
        ),
        // Control: HTTP/1.0 needs no Host.
        case(
            "http10_without_host",
            with_length(
                "POST /v1/chat/completions HTTP/1.0\r\nContent-Type: application/json\r\n",
                B,
            ),
            Served(vec![Ans::Replica], vec![up(CHAT, B)]),
        ),
    ];
    run_table("malformed-heads", "", cases).await;
}

// ---------------------------------------------------------------------------
// Security review, finding 1: request targets longer than 8 KiB.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn finding1_request_target_over_8k_is_414() {
    use Expect::Refused;
    // A target of exactly `len` bytes: the chat path and a padded query.
    let target = |len: usize| {
        let prefix = format!("{CHAT}?pad=");
        format!("{prefix}{}", "a".repeat(len - prefix.len()))
    };
    let (under, over, huge) = (
        target(8 * 1024 - 100),
        target(8 * 1024 + 1),
        target(60 * 1024),
    );
    let cases = vec![
        // Control: a long target under the limit is forwarded as is.
        case(
            "just_under_8k",
            post(&under, "", B),
            served(vec![up(&under, B)]),
        ),
        // One byte over 8 KiB.
        case("just_over_8k", post(&over, "", B), Refused(&[414])),
        // 60 KiB, under the 64 KiB head limit.
        case("60k", post(&huge, "", B), Refused(&[414])),
    ];
    run_table("long-target", "", cases).await;
}

/// An h2c pool whose replica address is a 60,000-character hostname (a
/// hexadecimal IPv4 address padded with zeros, which the system resolver
/// reads as 127.0.0.1): the URI built for the replica, authority and
/// target, is far over what `http::Uri` holds. The gateway must answer
/// cleanly, not panic and drop the connection.
#[tokio::test]
async fn finding1_h2c_pool_with_a_huge_authority_answers_cleanly() {
    let h2 = crate::support::FakeReplica::start("h2", crate::support::Behaviour::Echo).await;
    let endpoint = format!("0x{}7f000001:{}", "0".repeat(60_000), h2.addr.port());
    let gw = client::start_gateway("", &[endpoint], ", protocol: h2c").await;
    let mut failed = Vec::new();
    let target = |len: usize| {
        let prefix = format!("{CHAT}?pad=");
        format!("{prefix}{}", "a".repeat(len - prefix.len()))
    };
    for (name, target, refused) in [
        // Under the target limit: forwarded, or a clean error.
        ("h2c_target_7k", target(7 * 1024), false),
        // Over it: 414 before any replica is involved.
        ("h2c_target_9k", target(9 * 1024), true),
    ] {
        let before = h2.count();
        let outcome = match exchange(gw.addr(), &post(&target, "", B), 1).await {
            Err(e) => Err(e),
            Ok(got) => {
                let r = &got.responses[0];
                let sent = h2.count() - before;
                println!("  ({name}: {}, replica received {sent})", r.summary());
                if refused && r.status != 414 {
                    Err(format!("expected 414, got {}", r.summary()))
                } else if refused && sent != 0 {
                    Err(format!(
                        "refused, yet the replica received {sent} request(s)"
                    ))
                } else if sent > 1 {
                    Err(format!("the replica received the request {sent} times"))
                } else if r.status >= 400 {
                    openai_error(r)
                } else if r.status == 200 && sent == 1 {
                    Ok(())
                } else {
                    Err(format!(
                        "unexpected answer {} (replica received {sent})",
                        r.summary()
                    ))
                }
            }
        };
        report("h2c-huge-authority", name, outcome, &mut failed);
    }
    // The gateway still serves.
    let health = exchange(gw.addr(), crate::support::HEALTHZ, 1)
        .await
        .and_then(|got| match got.responses[0].status {
            200 => Ok(()),
            s => Err(format!("/healthz afterwards: {s}")),
        });
    report("h2c-huge-authority", "still_serving", health, &mut failed);
    assert!(failed.is_empty(), "failed: {failed:#?}");
}

fn report(group: &str, name: &str, outcome: Result<(), String>, failed: &mut Vec<String>) {
    match outcome {
        Ok(()) => println!("PASS {group}/{name}"),
        Err(e) => {
            println!("FAIL {group}/{name}: {e}");
            failed.push(format!("{name}: {e}"));
        }
    }
}

// ---------------------------------------------------------------------------
// Finding 2: only inference endpoints are forwarded; paths are not
// normalized, so any that would need it is refused.
// ---------------------------------------------------------------------------

const INFERENCE_PATHS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/rerank",
    "/v1/score",
    "/v1/audio/speech",
    "/v1/images/generations",
    "/v1/moderations",
];

#[tokio::test]
async fn finding2_only_inference_endpoints_are_forwarded() {
    use Expect::Refused;
    let mut cases: Vec<Case> = INFERENCE_PATHS
        .iter()
        // Each inference endpoint reaches the replica.
        .map(|&path| {
            case(
                path_name(path),
                post(path, "", B),
                served(vec![up(path, B)]),
            )
        })
        .collect();
    cases.extend([
        // vLLM's adapter management: loading arbitrary weights from a path.
        case(
            "/v1/load_lora_adapter",
            post("/v1/load_lora_adapter", "", B),
            Refused(&[404]),
        ),
        case(
            "/v1/unload_lora_adapter",
            post("/v1/unload_lora_adapter", "", B),
            Refused(&[404]),
        ),
        // Anything else under /v1/.
        case(
            "/v1/anything_else",
            post("/v1/anything_else", "", B),
            Refused(&[404]),
        ),
        // A trailing slash is another path.
        case(
            "/v1/chat/completions/",
            post("/v1/chat/completions/", "", B),
            Refused(&[404]),
        ),
        // Case differs: another path.
        case(
            "/V1/chat/completions",
            post("/V1/chat/completions", "", B),
            Refused(&[404]),
        ),
    ]);
    run_table("inference-paths", "", cases).await;
}

#[tokio::test]
async fn finding2_extra_paths_are_forwarded_when_configured() {
    use Expect::Refused;
    let spec = "  forwarding: {extraPaths: [\"/v1/load_lora_adapter\"]}\n";
    let cases = vec![
        // Listed: forwarded.
        case(
            "/v1/load_lora_adapter",
            post("/v1/load_lora_adapter", "", B),
            served(vec![up("/v1/load_lora_adapter", B)]),
        ),
        // Not listed: still refused.
        case(
            "/v1/unload_lora_adapter",
            post("/v1/unload_lora_adapter", "", B),
            Refused(&[404]),
        ),
        // Exact paths only: no prefix match.
        case(
            "/v1/load_lora_adapter/x",
            post("/v1/load_lora_adapter/x", "", B),
            Refused(&[404]),
        ),
        // Inference endpoints still forwarded.
        case(CHAT, post(CHAT, "", B), served(vec![up(CHAT, B)])),
    ];
    run_table("extra-paths", spec, cases).await;
}

#[tokio::test]
async fn finding2_dot_segments_and_encoded_paths_are_refused() {
    let paths = [
        // Up out of /v1/ to a replica's admin route.
        "/v1/../admin",
        // A `.` segment the replica would normalize to an inference path.
        "/v1/./chat/completions",
        // Encoded dots.
        "/v1/%2e%2e/admin",
        "/v1/%2E%2E/admin",
        "/v1/%2e/chat/completions",
        // Encoded slashes, lower and upper case.
        "/v1/chat%2fcompletions",
        "/v1/chat%2Fcompletions",
        // Ends in a `..` segment: normalizes to /v1/chat.
        "/v1/chat/completions/..",
        "/v1/chat/completions/.",
        // Backslashes, slashes to some servers.
        "/v1/chat\\completions",
        "/v1\\..\\admin",
        // An empty segment.
        "/v1//chat/completions",
        // An encoded ordinary letter: the same path to a normalizing hop.
        "/v1/chat/%63ompletions",
        // An encoded NUL.
        "/v1/chat/completions%00",
    ];
    let cases = paths
        .iter()
        .map(|&p| case(path_name(p), post(p, "", B), Expect::Refused(&[400, 404])))
        .collect();
    run_table("dot-segments", "", cases).await;
}

/// A path as a case name (case names are `&'static str`).
fn path_name(path: &str) -> &'static str {
    Box::leak(path.to_owned().into_boxed_str())
}

// ---------------------------------------------------------------------------
// Finding 3: forwarding headers are the gateway's to set; `x-infergate-*`
// are the gateway's own and never reach a replica.
// ---------------------------------------------------------------------------

#[tokio::test]
async fn finding3_forwarding_headers_from_an_untrusted_peer_are_replaced() {
    let ours = |u: Up| {
        u.with("x-forwarded-for", &["127.0.0.1"])
            .with("forwarded", &["for=127.0.0.1;proto=http"])
    };
    let cases = vec![
        // A client claiming to be 1.2.3.4 by both fields.
        case(
            "client_sets_both",
            post(
                CHAT,
                "X-Forwarded-For: 1.2.3.4\r\nForwarded: for=1.2.3.4\r\n",
                B,
            ),
            served(vec![ours(up(CHAT, B))]),
        ),
        // No fields from the client: the gateway adds its own.
        case(
            "client_sets_none",
            post(CHAT, "", B),
            served(vec![ours(up(CHAT, B))]),
        ),
        // Several fields, mixed case, with a proto claim.
        case(
            "client_sets_several",
            post(
                CHAT,
                "x-forwarded-for: 1.2.3.4\r\nX-FORWARDED-FOR: 5.6.7.8\r\nforwarded: for=1.2.3.4;proto=https\r\nForwarded: for=5.6.7.8\r\n",
                B,
            ),
            served(vec![ours(up(CHAT, B))]),
        ),
        // The gateway's own headers, set by a client to steer or spoof.
        case(
            "client_sets_infergate_headers",
            post(
                CHAT,
                "X-Infergate-Priority: critical\r\nx-infergate-endpoint: evil\r\nX-INFERGATE-FAIRNESS-ID: tenant\r\nx-infergate-pool: other\r\n",
                B,
            ),
            served(vec![up(CHAT, B)]),
        ),
    ];
    run_table("forwarding-untrusted", "", cases).await;
}

#[tokio::test]
async fn finding3_forwarding_headers_from_a_trusted_proxy_are_extended() {
    let spec = "  forwarding: {trustedProxies: [\"127.0.0.1/32\"]}\n";
    let cases = vec![
        // A proxy in front says the client is 1.2.3.4: kept, and extended.
        case(
            "proxy_sets_both",
            post(
                CHAT,
                "X-Forwarded-For: 1.2.3.4\r\nForwarded: for=1.2.3.4\r\n",
                B,
            ),
            served(vec![
                up(CHAT, B)
                    .with("x-forwarded-for", &["1.2.3.4, 127.0.0.1"])
                    .with("forwarded", &["for=1.2.3.4, for=127.0.0.1;proto=http"]),
            ]),
        ),
        // Trusted or not, x-infergate-* never reach a replica.
        case(
            "proxy_sets_infergate_headers",
            post(
                CHAT,
                "x-infergate-priority: critical\r\nx-infergate-endpoint: evil\r\n",
                B,
            ),
            served(vec![up(CHAT, B)]),
        ),
    ];
    run_table("forwarding-trusted", spec, cases).await;
}

// ---------------------------------------------------------------------------
// Finding 4: request bodies held in memory are bounded gateway-wide.
// ---------------------------------------------------------------------------

const MIB: usize = 1024 * 1024;

/// Valid JSON of exactly `len` bytes, tagged so bodies can be told apart.
fn json_of_len(len: usize, tag: &str) -> String {
    let head = format!(r#"{{"model":"m","tag":"{tag}","pad":""#);
    let tail = r#""}"#;
    format!("{head}{}{tail}", "x".repeat(len - head.len() - tail.len()))
}

#[tokio::test]
async fn finding4_body_budget_refuses_with_503_while_full() {
    let lab = Lab::start(
        "  limits: {maxBodyBytes: 1048576, maxBufferedBodyBytes: 1048576}\n",
        "",
        vec![Arc::new(replica::ok)],
    )
    .await;
    let (a, b, c) = (
        json_of_len(MIB, "a"),
        json_of_len(MIB, "b"),
        json_of_len(MIB, "c"),
    );
    let head = |extra: &str| {
        format!("{H}{extra}Connection: close\r\nContent-Length: {MIB}\r\n\r\n").into_bytes()
    };

    // A declares 1 MiB and sends half. The gateway reserves a body's
    // declared length before inviting it, so `100 Continue` is the event
    // that A holds its room (without it, nothing a client can see tells
    // when the gateway has read part of A).
    let mut first = RawConn::open(lab.addr()).await.unwrap();
    first.send(&head("Expect: 100-continue\r\n")).await.unwrap();
    first
        .read_until(b"HTTP/1.1 100 Continue\r\n\r\n")
        .await
        .expect("the gateway invites A's body");
    first.send(&a.as_bytes()[..MIB / 2]).await.unwrap();

    // B, a whole 1 MiB request, finds no room: 503 with Retry-After after
    // waiting (up to about 2 s) for some.
    let mut second = RawConn::open(lab.addr()).await.unwrap();
    let _writer = second.send_in_background([head("").as_slice(), b.as_bytes()].concat());
    let started = Instant::now();
    let refused = second.answer().await;
    let waited = started.elapsed();

    // A finishes, and is served; so is C after it.
    first.send(&a.as_bytes()[MIB / 2..]).await.unwrap();
    let a_answer = first.answer().await;
    let c_answer = exchange(lab.addr(), &post(CHAT, "", &c), 1).await;
    let upstream = lab.upstream();

    let mut failed = Vec::new();
    let group = "body-budget";
    report(
        group,
        "second_1mib_body_gets_503",
        refused.and_then(|r| {
            if r.status != 503 {
                return Err(format!(
                    "expected 503, got {} after {waited:?}",
                    r.summary()
                ));
            }
            if r.values("retry-after").len() != 1 {
                return Err(format!("no Retry-After on the 503: {:?}", r.headers));
            }
            println!("  (B was refused after {waited:?})");
            openai_error(&r)
        }),
        &mut failed,
    );
    report(
        group,
        "first_is_served_when_complete",
        a_answer.and_then(|r| match r.status {
            200 => Ok(()),
            _ => Err(format!("A got {}", r.summary())),
        }),
        &mut failed,
    );
    report(
        group,
        "later_request_is_served",
        c_answer.and_then(|got| match got.responses[0].status {
            200 => Ok(()),
            _ => Err(format!("C got {}", got.responses[0].summary())),
        }),
        &mut failed,
    );
    report(
        group,
        "replica_gets_exactly_a_then_c",
        upstream.and_then(|seen| {
            let tags: Vec<String> = seen
                .iter()
                .map(|s| {
                    let v: serde_json::Value =
                        serde_json::from_slice(&s.request.body).unwrap_or_default();
                    v["tag"].as_str().unwrap_or("?").to_owned()
                })
                .collect();
            if tags != ["a", "c"] {
                return Err(format!("the replica received bodies {tags:?}"));
            }
            for (s, body) in seen.iter().zip([&a, &c]) {
                if s.request.body != body.as_bytes() {
                    return Err("a body changed on the way".into());
                }
            }
            Ok(())
        }),
        &mut failed,
    );
    assert!(failed.is_empty(), "failed: {failed:#?}");
}

#[tokio::test]
async fn finding4_bodies_over_the_limit_are_refused_unread() {
    use Expect::Refused;
    let over = MIB + 1;
    // 2 MiB in 64 KiB chunks, never ended.
    let chunks: String = (0..32).map(|_| chunk(&"x".repeat(64 * 1024))).collect();
    let cases = vec![
        // Declared over the limit; only the head is sent, so the answer
        // comes without the gateway reading any body.
        case(
            "declared_too_large",
            format!("{H}Content-Length: {over}\r\n\r\n"),
            Refused(&[413]),
        ),
        // The same asking `Expect: 100-continue`: refused, never invited.
        case(
            "declared_too_large_expect_continue",
            format!("{H}Expect: 100-continue\r\nContent-Length: {over}\r\n\r\n"),
            Refused(&[413]),
        ),
        // Chunked, so only counting can tell: refused once over.
        case(
            "chunked_too_large",
            format!("{H}Transfer-Encoding: chunked\r\n\r\n{chunks}"),
            Refused(&[413]),
        ),
    ];
    run_table("body-limit", "  limits: {maxBodyBytes: 1048576}\n", cases).await;
}

// ---------------------------------------------------------------------------
// Finding 5: connection slots cannot be held for free.
// ---------------------------------------------------------------------------

/// The answer (if any) a connection the gateway closed for slowness got:
/// nothing, or a 408 in the OpenAI shape.
fn closed_for_slowness(bytes: &[u8], waited: Duration) -> Result<(), String> {
    if waited < Duration::from_millis(900) {
        return Err(format!(
            "closed after {waited:?}, before the 1 s header timeout"
        ));
    }
    if bytes.is_empty() {
        return Ok(());
    }
    match wire::response(bytes, true) {
        wire::Parsed::Complete(r, _) if r.status == 408 => openai_error(&r),
        wire::Parsed::Complete(r, _) => Err(format!("answered {}", r.summary())),
        _ => Err(format!("sent {}", wire::preview(bytes, 200))),
    }
}

#[tokio::test]
async fn finding5_header_timeout_closes_silent_and_slow_connections() {
    let lab = Lab::start(
        "  limits: {headerTimeout: 1s}\n",
        "",
        vec![Arc::new(replica::ok)],
    )
    .await;
    let silent = async {
        let mut conn = RawConn::open(lab.addr()).await?;
        let started = Instant::now();
        let bytes = conn.rest_within(Duration::from_secs(6)).await?;
        closed_for_slowness(&bytes, started.elapsed())
    };
    let half_head = async {
        let mut conn = RawConn::open(lab.addr()).await?;
        conn.send(format!("{H}Content-Length: 13\r\n").as_bytes())
            .await?;
        let started = Instant::now();
        let bytes = conn.rest_within(Duration::from_secs(6)).await?;
        closed_for_slowness(&bytes, started.elapsed())
    };
    let (silent, half_head) = tokio::join!(silent, half_head);
    let mut failed = Vec::new();
    report("header-timeout", "sends_nothing", silent, &mut failed);
    report(
        "header-timeout",
        "sends_half_a_head",
        half_head,
        &mut failed,
    );
    report(
        "header-timeout",
        "replica_gets_nothing",
        lab.upstream().and_then(|seen| match seen.len() {
            0 => Ok(()),
            _ => Err(summaries(&seen)),
        }),
        &mut failed,
    );
    assert!(failed.is_empty(), "failed: {failed:#?}");
}

#[tokio::test]
async fn finding5_connections_per_client_are_limited() {
    let lab = Lab::start(
        "  limits: {maxConnectionsPerClient: 2}\n",
        "",
        vec![Arc::new(replica::ok)],
    )
    .await;
    let mut failed = Vec::new();
    let group = "connections-per-client";

    // Two connections from 127.0.0.1, each shown to be taken by an answer.
    let mut first = RawConn::open(lab.addr()).await.unwrap();
    let mut second = RawConn::open(lab.addr()).await.unwrap();
    let both = async {
        served_healthz(&mut first).await?;
        served_healthz(&mut second).await
    }
    .await;
    report(group, "two_connections_served", both, &mut failed);

    // A third is closed at once, without an answer.
    let third = async {
        let mut third = RawConn::open(lab.addr()).await?;
        let _ = third.send(crate::support::HEALTHZ).await;
        let started = Instant::now();
        let bytes = third.rest_within(Duration::from_secs(2)).await?;
        if !bytes.is_empty() {
            return Err(format!(
                "the third connection got {}",
                wire::preview(&bytes, 200)
            ));
        }
        println!("  (third connection closed after {:?})", started.elapsed());
        Ok(())
    }
    .await;
    report(group, "third_closed_at_once", third, &mut failed);

    // Once the first closes, a new connection is served (retried until
    // the gateway has seen the close: each try awaits its own outcome).
    drop(first);
    let later = tokio::time::timeout(WAIT, async {
        let mut tries = 0;
        loop {
            tries += 1;
            let mut conn = RawConn::open(lab.addr()).await?;
            let _ = conn.send(crate::support::HEALTHZ).await;
            match conn.answer().await {
                Ok(r) if r.status == 200 => return Ok(tries),
                Ok(r) => return Err(format!("answered {}", r.summary())),
                Err(_) => tokio::task::yield_now().await,
            }
        }
    })
    .await
    .unwrap_or_else(|_| Err("no new connection served within 5 s of one closing".into()))
    .map(|tries| println!("  (served on try {tries})"));
    report(group, "served_after_one_closes", later, &mut failed);

    // The second, open all along, still works.
    report(
        group,
        "second_still_served",
        served_healthz(&mut second).await,
        &mut failed,
    );
    assert!(failed.is_empty(), "failed: {failed:#?}");
}

async fn served_healthz(conn: &mut RawConn) -> Result<(), String> {
    conn.send(crate::support::HEALTHZ).await?;
    let r = conn.answer().await?;
    match r.status {
        200 => Ok(()),
        _ => Err(format!("/healthz answered {}", r.summary())),
    }
}

// ---------------------------------------------------------------------------
// Finding 7: a misbehaving replica.
// ---------------------------------------------------------------------------

/// What the client must get when the replica answers with given bytes.
enum FromReplica {
    /// 502 in the OpenAI shape.
    BadGateway,
    /// 502 in the OpenAI shape, or a 200 whose connection closes short of
    /// its declared length: a cut the client cannot take for a whole
    /// answer. (A 502 needs the whole body read before the head is sent;
    /// the gateway passes a non-streaming answer on once its body starts.)
    BadGatewayOrVisiblyCut,
    /// 200 with exactly this body, or 502 in the OpenAI shape; never
    /// bytes beyond the body.
    BodyOrBadGateway(&'static str),
}

/// The client's side of one request to a replica that answers badly.
async fn answered_from_replica(addr: SocketAddr, expect: &FromReplica) -> Result<(), String> {
    let mut conn = RawConn::open(addr).await?;
    conn.send(&post(CHAT, "", B)).await?;
    // The request says `Connection: close`: all the gateway sends, then
    // end of file.
    let all = conn.rest().await?;
    if let (FromReplica::BadGatewayOrVisiblyCut, Some((200, declared, got))) =
        (expect, wire::cut_short(&all))
    {
        println!("  (a 200 cut visibly: {got} of {declared} body bytes, then closed)");
        return Ok(());
    }
    let r = match wire::response(&all, true) {
        wire::Parsed::Complete(r, n) if n == all.len() => r,
        wire::Parsed::Complete(r, n) => {
            return Err(format!(
                "bytes after the {} answer: {}",
                r.status,
                wire::preview(&all[n..], 200)
            ));
        }
        wire::Parsed::Invalid(e) => return Err(format!("not a valid answer: {e}")),
        wire::Parsed::Partial => return Err("no answer".into()),
    };
    match (expect, r.status) {
        (_, 502) => openai_error(&r),
        (FromReplica::BodyOrBadGateway(body), 200) if r.body == body.as_bytes() => Ok(()),
        (FromReplica::BodyOrBadGateway(body), _) => Err(format!(
            "expected 200 with {body} or 502, got {}",
            r.summary()
        )),
        (_, _) => Err(format!("expected 502, got {}", r.summary())),
    }
}

#[tokio::test]
async fn finding7_replica_answers_that_must_not_pass() {
    let ok_json = r#"{"object":"chat.completion"}"#;
    let json_head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n";
    let pads: String = (0..70)
        .map(|i| format!("X-Pad-{i}: {}\r\n", "p".repeat(1000)))
        .collect();
    // A gzip member header and bytes that are not JSON.
    let gzip: &[u8] = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03\xcb\x48\xcd\xc9\xc9";
    let gzip_chunk = [format!("{:x}\r\n", gzip.len()).as_bytes(), gzip, b"\r\n"].concat();
    let after = "HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled";
    let cases: Vec<(&str, Vec<u8>, bool, FromReplica)> = vec![
        // (a) A response head over 64 KiB: 70 fields of 1 KiB.
        (
            "head_over_64k",
            format!("{json_head}{pads}Content-Length: 2\r\n\r\n{{}}").into_bytes(),
            false,
            FromReplica::BadGateway,
        ),
        // (b) A length, then the replica closes before any body byte: a
        // non-streaming client must not get a 200 cut short.
        (
            "length_then_close",
            format!("{json_head}Content-Length: 100\r\n\r\n").into_bytes(),
            true,
            FromReplica::BadGateway,
        ),
        // (b) The same with 10 of the 100 bytes sent: once the body has
        // started, a cut the client can see (beyond the brief's case).
        (
            "length_then_close_midway",
            format!("{json_head}Content-Length: 100\r\n\r\n{{\"object\":").into_bytes(),
            true,
            FromReplica::BadGatewayOrVisiblyCut,
        ),
        // (e) A coding the gateway cannot undo, delimited by closing.
        (
            "te_gzip",
            [format!("{json_head}Transfer-Encoding: gzip\r\n\r\n").as_bytes(), gzip].concat(),
            true,
            FromReplica::BadGateway,
        ),
        // (e) gzip, then chunked: de-chunked, the body is still gzip.
        (
            "te_gzip_chunked",
            [
                format!("{json_head}Transfer-Encoding: gzip, chunked\r\n\r\n").as_bytes(),
                &gzip_chunk,
                b"0\r\n\r\n",
            ]
            .concat(),
            false,
            FromReplica::BadGateway,
        ),
        // (f) Both a length and chunked, then bytes that look like another
        // response: chunked wins (or 502); nothing past the last chunk
        // reaches a client, now or on the next request.
        (
            "length_and_chunked",
            format!(
                "{json_head}Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n{}0\r\n\r\n{after}",
                chunk(ok_json)
            )
            .into_bytes(),
            false,
            FromReplica::BodyOrBadGateway(r#"{"object":"chat.completion"}"#),
        ),
    ];
    let mut failed = Vec::new();
    for (name, answer, close, expect) in cases {
        let lab = Lab::start("", "", vec![replica::always(&answer, close)]).await;
        // Twice: a connection left in a bad state would show on the second.
        let mut outcome = Ok(());
        for round in 1..=2 {
            let checked = answered_from_replica(lab.addr(), &expect).await;
            let upstream = lab.upstream();
            // Sent once per round: never retried after the replica had it.
            let checked = checked
                .map_err(|e| with_upstream(e, &upstream))
                .and_then(|()| match upstream {
                    Ok(seen) if seen.len() == round => Ok(()),
                    Ok(seen) => Err(format!(
                        "after {round} request(s) the replica received {}",
                        summaries(&seen)
                    )),
                    Err(e) => Err(e),
                });
            if let Err(e) = checked {
                outcome = Err(format!("request {round}: {e}"));
                break;
            }
        }
        report("replica-answers", name, outcome, &mut failed);
    }
    assert!(failed.is_empty(), "failed: {failed:#?}");
}

/// (c) A stream the replica cuts: the client gets the events so far, an
/// error event, and a properly ended chunked body.
#[tokio::test]
async fn finding7c_a_stream_cut_by_the_replica_ends_with_an_error_event() {
    let release = Arc::new(Notify::new());
    let event = "data: {\"n\":1}\n\n";
    let start = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n{}",
        chunk(event)
    );
    let script: Script = {
        let release = Arc::clone(&release);
        Arc::new(move |_| Answer::SendThenCloseOn(start.clone().into_bytes(), Arc::clone(&release)))
    };
    let lab = Lab::start("", "", vec![script]).await;
    let mut conn = RawConn::open(lab.addr()).await.unwrap();
    conn.send(&post(CHAT, "", r#"{"model":"m","stream":true}"#))
        .await
        .unwrap();
    // The first event arrives while the replica still holds the stream.
    let outcome = async {
        conn.read_until(event.as_bytes()).await?;
        release.notify_one();
        let all = conn.rest().await?;
        let r = match wire::response(&all, true) {
            wire::Parsed::Complete(r, _) => r,
            wire::Parsed::Invalid(e) => return Err(format!("not a properly ended answer: {e}")),
            wire::Parsed::Partial => return Err("half an answer".into()),
        };
        if r.status != 200 || !r.chunked {
            return Err(format!("expected a chunked 200, got {}", r.summary()));
        }
        if !r.raw_body.ends_with(b"0\r\n\r\n") {
            return Err("the body does not end with the last chunk".into());
        }
        let text = r.body_text();
        let rest = text
            .strip_prefix(event)
            .ok_or_else(|| format!("the first event is not first: {text:?}"))?;
        let error = rest
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<serde_json::Value>(d.trim()).ok())
            .find(|v| v.get("error").is_some())
            .ok_or_else(|| format!("no error event after the first: {rest:?}"))?;
        check_error_object(&error)
    }
    .await;
    let once = match lab.upstream() {
        Ok(seen) if seen.len() == 1 => Ok(()),
        Ok(seen) => Err(summaries(&seen)),
        Err(e) => Err(e),
    };
    let mut failed = Vec::new();
    report(
        "stream-cut",
        "error_event_and_last_chunk",
        outcome,
        &mut failed,
    );
    report("stream-cut", "replica_got_it_once", once, &mut failed);
    assert!(failed.is_empty(), "failed: {failed:#?}");
}

/// (d) A request written in full to a reused connection that the replica
/// then closes without answering may have been acted on: with
/// continuation off it is never sent again, to that replica or another.
/// (With it on, see the next case.)
#[tokio::test]
async fn finding7d_a_request_lost_on_a_reused_connection_is_not_resent() {
    // Each replica answers the first request on a connection and closes
    // the connection, unanswered, on the second.
    let script: Script = Arc::new(|seen: &Seen| {
        if seen.on_conn == 0 {
            replica::ok(seen)
        } else {
            Answer::Close
        }
    });
    let lab = Lab::start(
        "",
        ", continuation: {enabled: false}",
        vec![Arc::clone(&script), script],
    )
    .await;
    // One client connection, so one worker and its upstream connections:
    // round-robin sends 1 and 2 to fresh connections on each replica, and
    // 3 to the first one's, reused.
    let mut conn = RawConn::open(lab.addr()).await.unwrap();
    let bodies: Vec<String> = (1..=3)
        .map(|n| format!(r#"{{"model":"m","n":{n}}}"#))
        .collect();
    let mut statuses = Vec::new();
    for body in &bodies {
        conn.send(post_ka(CHAT, body).as_bytes()).await.unwrap();
        match conn.answer().await {
            Ok(r) => statuses.push(r.status),
            Err(e) => {
                println!("  (answer {}: {e})", statuses.len() + 1);
                break;
            }
        }
    }
    let seen: Vec<(usize, Seen)> = lab
        .replicas
        .iter()
        .enumerate()
        .flat_map(|(i, r)| r.seen().into_iter().map(move |s| (i, s)))
        .collect();
    let mut failed = Vec::new();
    report(
        "no-resend",
        "answers_200_200_502",
        if statuses == [200, 200, 502] {
            Ok(())
        } else {
            Err(format!("answers {statuses:?}"))
        },
        &mut failed,
    );
    let received = each_received_once(&seen, &bodies);
    report(
        "no-resend",
        "each_request_received_once",
        received,
        &mut failed,
    );
    assert!(failed.is_empty(), "failed: {failed:#?}");
}

/// (d, continued) For a pool that continues answers, the generation its
/// replica dropped unanswered goes whole to another replica, once: never
/// again to the replica that dropped it.
#[tokio::test]
async fn finding7d_with_continuation_a_dropped_generation_goes_to_another_replica() {
    let drops: Script = Arc::new(|seen: &Seen| {
        if seen.on_conn == 0 {
            replica::ok(seen)
        } else {
            Answer::Close
        }
    });
    let answers: Script = Arc::new(replica::ok);
    let lab = Lab::start(
        "  admin: {address: \"127.0.0.1:0\"}\n",
        "",
        vec![drops, answers],
    )
    .await;
    let mut conn = RawConn::open(lab.addr()).await.unwrap();
    let bodies: Vec<String> = (1..=3)
        .map(|n| format!(r#"{{"model":"m","n":{n}}}"#))
        .collect();
    let mut statuses = Vec::new();
    for body in &bodies {
        conn.send(post_ka(CHAT, body).as_bytes()).await.unwrap();
        statuses.push(conn.answer().await.unwrap().status);
    }
    // Round-robin: 1 to the first replica, 2 to the second, 3 to the
    // first's reused connection, which drops it.
    assert_eq!(statuses, [200, 200, 200]);
    let third: Vec<(usize, usize)> = lab
        .replicas
        .iter()
        .enumerate()
        .flat_map(|(i, r)| r.seen().into_iter().map(move |s| (i, s)))
        .filter(|(_, s)| s.request.body == bodies[2].as_bytes())
        .map(|(i, s)| (i, s.on_conn))
        .collect();
    assert_eq!(third, [(0, 1), (1, 1)], "request 3 reached: {third:?}");
    let metrics = crate::support::admin_get(&lab.gw, "/metrics").await;
    let series = r#"infergate_migrations_total{pool="p",reason="broken",outcome="resent"}"#;
    assert_eq!(
        crate::support::sample(&metrics, series),
        Some(1.0),
        "{metrics}"
    );
}

/// Every one of `bodies` reached the replicas exactly once, and the third
/// went to a reused connection (or the case did not test what it means to).
fn each_received_once(seen: &[(usize, Seen)], bodies: &[String]) -> Result<(), String> {
    for (n, body) in bodies.iter().enumerate() {
        let copies: Vec<&(usize, Seen)> = seen
            .iter()
            .filter(|(_, s)| s.request.body == body.as_bytes())
            .collect();
        if copies.len() != 1 {
            let places: Vec<String> = copies
                .iter()
                .map(|(r, s)| {
                    format!(
                        "replica {r} connection {} request {}",
                        s.conn,
                        s.on_conn + 1
                    )
                })
                .collect();
            return Err(format!(
                "request {} reached the replicas {} times: {places:?}",
                n + 1,
                copies.len()
            ));
        }
        if n == 2 && copies[0].1.on_conn != 1 {
            return Err("setup: request 3 did not go to a reused connection".into());
        }
    }
    Ok(())
}
