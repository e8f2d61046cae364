//! Response parsing and body framing, fed a byte at a time as well as whole.

use super::*;

/// Parse a head from `bytes` fed one byte at a time: `None` until the last
/// byte of the head, then the head, with the rest left in the buffer.
fn head_by_bytes(bytes: &[u8]) -> (Head, BytesMut) {
    let mut buf = BytesMut::new();
    for (i, &b) in bytes.iter().enumerate() {
        buf.extend_from_slice(&[b]);
        if let Some(head) = parse_head(&mut buf).unwrap() {
            return (head, BytesMut::from(&bytes[i + 1..]));
        }
    }
    panic!("no complete head in {:?}", String::from_utf8_lossy(bytes));
}

fn parse(bytes: &str) -> Result<Option<Head>, Error> {
    parse_head(&mut BytesMut::from(bytes))
}

/// Decode a whole body, offering `buf`'s bytes `step` at a time, then the
/// end of file; the data, and whether the end was known with the last data.
fn decode(decoder: &mut Decoder, bytes: &[u8], step: usize) -> Result<(Vec<u8>, bool), Error> {
    let mut buf = BytesMut::new();
    let mut offered = 0;
    let mut data = Vec::new();
    let mut end_with_last_data = false;
    loop {
        match decoder.decode(&mut buf)? {
            Step::Data(d) => {
                data.extend_from_slice(&d);
                end_with_last_data = decoder.is_end();
            }
            Step::End => return Ok((data, end_with_last_data)),
            Step::NeedMore if offered < bytes.len() => {
                let n = step.min(bytes.len() - offered);
                buf.extend_from_slice(&bytes[offered..offered + n]);
                offered += n;
            }
            Step::NeedMore => decoder.eof = true,
        }
    }
}

#[test]
fn a_head_is_parsed_once_complete_and_the_body_bytes_stay() {
    let response = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Two: a\r\nx-two: b\r\nContent-Length: 5\r\n\r\nhello";
    let (head, rest) = head_by_bytes(response);
    assert_eq!(head.parts.status, StatusCode::OK);
    assert_eq!(head.parts.version, Version::HTTP_11);
    assert_eq!(head.parts.headers["content-type"], "application/json");
    let twos: Vec<_> = head.parts.headers.get_all("x-two").iter().collect();
    assert_eq!(twos, ["a", "b"]);
    assert!(head.keep_alive);
    assert_eq!(head.decoder.remaining(), Some(5));
    assert_eq!(&rest[..], b"hello");
}

#[test]
fn informational_responses_are_skipped() {
    let (head, rest) =
        head_by_bytes(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n");
    assert_eq!(head.parts.status, StatusCode::NOT_FOUND);
    assert!(head.parts.headers.get("link").is_none());
    assert!(head.decoder.is_end());
    assert!(rest.is_empty());
    let switch = parse("HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\n");
    assert!(matches!(switch, Err(Error::Invalid(_))));
}

#[test]
fn framing_and_keep_alive_follow_the_head() {
    let framed = |text: &str| {
        let head = parse(text).unwrap().unwrap();
        (
            head.decoder.framing,
            head.keep_alive,
            head.parts.headers.contains_key(header::CONTENT_LENGTH),
        )
    };
    assert_eq!(
        framed("HTTP/1.1 200 OK\r\ncontent-length: 3, 3\r\ncontent-length: 3\r\n\r\n"),
        (Framing::Length(3), true, true)
    );
    assert_eq!(
        framed("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, Chunked\r\n\r\n"),
        (Framing::Chunked(Chunk::Size), true, false)
    );
    // Transfer-Encoding wins over a Content-Length, which is dropped, and
    // the connection is not trusted with another request.
    assert_eq!(
        framed("HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n"),
        (Framing::Chunked(Chunk::Size), false, false)
    );
    assert_eq!(
        framed("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n"),
        (Framing::UntilClose, false, false)
    );
    assert_eq!(
        framed("HTTP/1.1 200 OK\r\n\r\n"),
        (Framing::UntilClose, false, false)
    );
    assert_eq!(
        framed("HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\ncontent-length: 0\r\n\r\n"),
        (Framing::Done, false, true)
    );
    assert_eq!(
        framed("HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\n"),
        (Framing::Length(2), false, true)
    );
    // No body, whatever the head says.
    assert_eq!(
        framed("HTTP/1.1 204 No Content\r\ntransfer-encoding: chunked\r\n\r\n"),
        (Framing::Done, true, false)
    );
    for bad in [
        "HTTP/1.1 200 OK\r\ncontent-length: 3\r\ncontent-length: 4\r\n\r\n",
        "HTTP/1.1 200 OK\r\ncontent-length: +3\r\n\r\n",
        "HTTP/1.1 200 OK\r\ncontent-length: \r\n\r\n",
        "HTTP/1.1 200 OK\r\ncontent-length: 99999999999999999999999\r\n\r\n",
        "HTTP/1.1 2000 OK\r\n\r\n",
        "HTTP/1.1 200 OK\r\nbad header\r\n\r\n",
        "SSH-2.0-OpenSSH\r\n\r\n",
    ] {
        assert!(matches!(parse(bad), Err(Error::Invalid(_))), "{bad:?}");
    }
    assert!(parse("HTTP/1.1 200 OK\r\ncontent-le").unwrap().is_none());
}

#[test]
fn a_known_length_body_ends_at_its_length() {
    for step in [1, 2, 5, 100] {
        let mut decoder = Decoder::new(Framing::Length(11));
        let (data, end_with_last) = decode(&mut decoder, b"hello world", step).unwrap();
        assert_eq!(data, b"hello world");
        assert!(end_with_last);
    }
    // Bytes past the end are not body: the connection is not drained.
    let mut decoder = Decoder::new(Framing::Length(2));
    let mut buf = BytesMut::from(&b"okHTTP/1.1"[..]);
    assert_eq!(
        decoder.decode(&mut buf).unwrap(),
        Step::Data(Bytes::from_static(b"ok"))
    );
    assert_eq!(decoder.decode(&mut buf).unwrap(), Step::End);
    assert_eq!(&buf[..], b"HTTP/1.1");
    // The replica closed before the end.
    let mut decoder = Decoder::new(Framing::Length(20));
    assert!(matches!(
        decode(&mut decoder, b"short", 3),
        Err(Error::Incomplete)
    ));
}

#[test]
fn a_body_without_framing_runs_to_the_close() {
    let mut decoder = Decoder::new(Framing::UntilClose);
    let (data, _) = decode(&mut decoder, b"all of it", 4).unwrap();
    assert_eq!(data, b"all of it");
}

#[test]
fn chunked_bodies_are_decoded_with_extensions_and_trailers() {
    let body =
        b"5\r\nhello\r\n6;name=value\r\n world\r\nA \r\n, and more\r\n0\r\nx-trailer: 1\r\n\r\n";
    for step in [1, 2, 3, 7, body.len()] {
        let mut decoder = Decoder::new(Framing::Chunked(Chunk::Size));
        let (data, end_with_last) = decode(&mut decoder, body, step).unwrap();
        assert_eq!(data, b"hello world, and more", "step {step}");
        // Whole, the terminator arrives with the last data.
        if step == body.len() {
            assert!(end_with_last);
        }
    }
    // Bare LF line endings are read too.
    let mut decoder = Decoder::new(Framing::Chunked(Chunk::Size));
    let (data, _) = decode(&mut decoder, b"2\nhi\n0\n\n", 1).unwrap();
    assert_eq!(data, b"hi");
}

#[test]
fn the_end_of_a_chunked_body_is_known_with_its_last_data() {
    // An SSE stream's last event and the terminator, in one read: the
    // connection can go back to the pool without another poll.
    let mut decoder = Decoder::new(Framing::Chunked(Chunk::Size));
    let mut buf = BytesMut::from(&b"e\r\ndata: [DONE]\n\n\r\n0\r\n\r\n"[..]);
    assert_eq!(
        decoder.decode(&mut buf).unwrap(),
        Step::Data(Bytes::from_static(b"data: [DONE]\n\n"))
    );
    assert!(decoder.is_end());
    assert!(buf.is_empty());
    // Not yet all there: the end comes with the next bytes.
    let mut decoder = Decoder::new(Framing::Chunked(Chunk::Size));
    let mut buf = BytesMut::from(&b"2\r\nhi\r\n0\r"[..]);
    assert_eq!(
        decoder.decode(&mut buf).unwrap(),
        Step::Data(Bytes::from_static(b"hi"))
    );
    assert!(!decoder.is_end());
    assert_eq!(decoder.decode(&mut buf).unwrap(), Step::NeedMore);
    buf.extend_from_slice(b"\n\r\n");
    assert_eq!(decoder.decode(&mut buf).unwrap(), Step::End);
}

#[test]
fn malformed_chunked_bodies_are_errors() {
    for bad in [
        &b"g\r\nx\r\n0\r\n\r\n"[..],
        b"\r\n",
        b"2x\r\nhi\r\n0\r\n\r\n",
        b"2\r\nhiX0\r\n\r\n",
        b"11111111111111111\r\n",
    ] {
        let mut decoder = Decoder::new(Framing::Chunked(Chunk::Size));
        let result = decode(&mut decoder, bad, 1);
        assert!(
            matches!(result, Err(Error::Invalid(_))),
            "{:?}: {result:?}",
            String::from_utf8_lossy(bad)
        );
    }
    let long_line = vec![b'1'; LINE_LIMIT + 1];
    let mut decoder = Decoder::new(Framing::Chunked(Chunk::Size));
    assert!(matches!(
        decode(&mut decoder, &long_line, 64),
        Err(Error::Invalid(_))
    ));
    // Cut off mid-chunk, or before the terminator.
    for cut in [&b"5\r\nhel"[..], b"5\r\nhello\r\n", b"5\r\nhello\r\n0\r\n"] {
        let mut decoder = Decoder::new(Framing::Chunked(Chunk::Size));
        assert!(matches!(
            decode(&mut decoder, cut, 2),
            Err(Error::Incomplete)
        ));
    }
}

#[test]
fn only_a_close_before_any_response_byte_is_stale() {
    use std::io::ErrorKind;
    assert!(Error::Unanswered(None).is_stale());
    assert!(Error::Unanswered(Some(ErrorKind::ConnectionReset.into())).is_stale());
    assert!(Error::Unanswered(Some(ErrorKind::BrokenPipe.into())).is_stale());
    assert!(!Error::Unanswered(Some(ErrorKind::TimedOut.into())).is_stale());
    assert!(!Error::Incomplete.is_stale());
    assert!(!Error::Io(ErrorKind::ConnectionReset.into()).is_stale());
}
