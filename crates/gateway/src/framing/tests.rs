//! Body framing, fed a byte at a time as well as whole.

use super::*;

/// Decode a whole body, offering `buf`'s bytes `step` at a time, then the
/// end of file; the data, and whether the end was known with the last data.
fn decode(
    decoder: &mut Decoder,
    bytes: &[u8],
    step: usize,
) -> Result<(Vec<u8>, bool), DecodeError> {
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
            Step::NeedMore => decoder.set_eof(),
        }
    }
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
        Err(DecodeError::Incomplete)
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
            matches!(result, Err(DecodeError::Invalid(_))),
            "{:?}: {result:?}",
            String::from_utf8_lossy(bad)
        );
    }
    let long_line = vec![b'1'; LINE_LIMIT + 1];
    let mut decoder = Decoder::new(Framing::Chunked(Chunk::Size));
    assert!(matches!(
        decode(&mut decoder, &long_line, 64),
        Err(DecodeError::Invalid(_))
    ));
    // Cut off mid-chunk, or before the terminator.
    for cut in [&b"5\r\nhel"[..], b"5\r\nhello\r\n", b"5\r\nhello\r\n0\r\n"] {
        let mut decoder = Decoder::new(Framing::Chunked(Chunk::Size));
        assert!(matches!(
            decode(&mut decoder, cut, 2),
            Err(DecodeError::Incomplete)
        ));
    }
}
