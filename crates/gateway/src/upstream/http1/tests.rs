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

#[test]
fn a_head_is_parsed_once_complete_and_the_body_bytes_stay() {
    let response = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Two: a\r\nx-two: b\r\nContent-Length: 5\r\n\r\nhello";
    let (head, rest) = head_by_bytes(response);
    assert_eq!(head.status, StatusCode::OK);
    assert_eq!(
        head.headers.get("content-type"),
        Some(&b"application/json"[..])
    );
    let twos: Vec<_> = head.headers.get_all("x-two").collect();
    assert_eq!(twos, [b"a", b"b"]);
    assert!(head.keep_alive);
    assert_eq!(head.decoder.remaining(), Some(5));
    assert_eq!(&rest[..], b"hello");
}

#[test]
fn informational_responses_are_skipped() {
    let (head, rest) =
        head_by_bytes(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\nHTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n");
    assert_eq!(head.status, StatusCode::NOT_FOUND);
    assert!(head.headers.get("link").is_none());
    assert!(head.decoder.is_end());
    assert!(rest.is_empty());
    let switch = parse("HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\n\r\n");
    assert!(matches!(switch, Err(Error::Invalid(_))));
}

#[test]
fn framing_and_keep_alive_follow_the_head() {
    let framed = |text: &str| {
        let head = parse(text).unwrap().unwrap();
        (head.decoder, head.keep_alive)
    };
    assert_eq!(
        framed("HTTP/1.1 200 OK\r\ncontent-length: 3, 3\r\ncontent-length: 3\r\n\r\n"),
        (Decoder::with_length(3), true)
    );
    assert_eq!(
        framed("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, Chunked\r\n\r\n"),
        (Decoder::chunked(), true)
    );
    // Transfer-Encoding wins over a Content-Length, and the connection is
    // not trusted with another request.
    assert_eq!(
        framed("HTTP/1.1 200 OK\r\ncontent-length: 3\r\ntransfer-encoding: chunked\r\n\r\n"),
        (Decoder::chunked(), false)
    );
    assert_eq!(
        framed("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n"),
        (Decoder::until_close(), false)
    );
    assert_eq!(
        framed("HTTP/1.1 200 OK\r\n\r\n"),
        (Decoder::until_close(), false)
    );
    assert_eq!(
        framed("HTTP/1.1 200 OK\r\nConnection: keep-alive, Close\r\ncontent-length: 0\r\n\r\n"),
        (Decoder::with_length(0), false)
    );
    assert_eq!(
        framed("HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\n"),
        (Decoder::with_length(2), false)
    );
    // No body, whatever the head says.
    assert_eq!(
        framed("HTTP/1.1 204 No Content\r\ntransfer-encoding: chunked\r\n\r\n"),
        (Decoder::with_length(0), true)
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
fn only_a_close_before_any_response_byte_is_stale() {
    use std::io::ErrorKind;
    assert!(Error::Unanswered(None).is_stale());
    assert!(Error::Unanswered(Some(ErrorKind::ConnectionReset.into())).is_stale());
    assert!(Error::Unanswered(Some(ErrorKind::BrokenPipe.into())).is_stale());
    assert!(!Error::Unanswered(Some(ErrorKind::TimedOut.into())).is_stale());
    assert!(!Error::Incomplete.is_stale());
    assert!(!Error::Io(ErrorKind::ConnectionReset.into()).is_stale());
}
