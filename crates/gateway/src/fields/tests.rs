use super::*;

fn names<'a>(fields: impl Iterator<Item = (&'a [u8], &'a [u8])>) -> Vec<String> {
    fields
        .map(|(n, _)| String::from_utf8_lossy(n).into_owned())
        .collect()
}

/// Fields parsed from a raw request head, as the server reads them.
fn parsed(head: &'static str) -> Fields {
    let mut buf = BytesMut::from(head);
    let mut headers = [httparse::EMPTY_HEADER; 16];
    let mut req = httparse::Request::new(&mut headers);
    let len = match req.parse(&buf).expect("a valid head") {
        httparse::Status::Complete(len) => len,
        httparse::Status::Partial => panic!("a whole head"),
    };
    let spans = spans(&buf, req.headers);
    Fields::new(buf.split_to(len).freeze(), spans)
}

#[test]
fn lookups_ignore_case_and_keep_order() {
    let f = parsed("POST / HTTP/1.1\r\nX-Tag: a\r\nHost: gw\r\nx-tag: b\r\n\r\n");
    assert_eq!(f.len(), 3);
    assert_eq!(f.get("x-tag"), Some(&b"a"[..]));
    assert_eq!(f.get_all("x-tag").collect::<Vec<_>>(), [b"a", b"b"]);
    assert_eq!(f.get("host"), Some(&b"gw"[..]));
    assert_eq!(f.get("x-other"), None);
    assert_eq!(f.get_shared("x-tag").as_deref(), Some(&b"a"[..]));
    // Names go on as received.
    let all: Vec<_> = f.iter().map(|(n, v)| (n.to_vec(), v.to_vec())).collect();
    assert_eq!(all[0], (b"X-Tag".to_vec(), b"a".to_vec()));
}

#[test]
fn tokens_are_found_in_any_case_and_any_field() {
    let f = Fields::from_pairs(&[("connection", "Keep-Alive"), ("connection", " x-a , Close")]);
    assert!(f.has_token("connection", b"close"));
    assert!(f.has_token("connection", b"keep-alive"));
    assert!(f.has_token("connection", b"x-a"));
    assert!(!f.has_token("connection", b"x"));
}

#[test]
fn the_last_transfer_coding_decides_chunking() {
    let chunked = |values: &[&str]| {
        let pairs: Vec<_> = values.iter().map(|v| ("transfer-encoding", *v)).collect();
        Fields::from_pairs(&pairs).ends_chunked()
    };
    assert!(chunked(&["chunked"]));
    assert!(chunked(&["gzip, Chunked"]));
    assert!(chunked(&["gzip", "chunked"]));
    assert!(!chunked(&["chunked, gzip"]));
    assert!(!chunked(&["chunked", "gzip"]));
    assert!(!chunked(&[]));
}

#[test]
fn content_length_must_be_one_valid_number() {
    let length = |values: &[&str]| {
        let pairs: Vec<_> = values.iter().map(|v| ("content-length", *v)).collect();
        Fields::from_pairs(&pairs).declared_length()
    };
    assert_eq!(length(&[]), Ok(None));
    assert_eq!(length(&["12"]), Ok(Some(12)));
    assert_eq!(length(&["12", "12, 12"]), Ok(Some(12)));
    assert_eq!(length(&["18446744073709551615"]).ok(), None);
    assert_eq!(
        length(&["9999999999999999999"]),
        Ok(Some(9_999_999_999_999_999_999))
    );
    for bad in [
        &["12", "13"][..],
        &["1 2"],
        &["+1"],
        &["-1"],
        &[""],
        &["0x1"],
    ] {
        assert!(length(bad).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn hop_by_hop_and_connection_named_fields_do_not_go_on() {
    let f = parsed(
        "POST / HTTP/1.1\r\n\
         Host: gw\r\n\
         Connection: keep-alive, X-Secret\r\n\
         x-secret: 1\r\n\
         Keep-Alive: timeout=5\r\n\
         Authorization: Bearer t\r\n\
         TE: trailers\r\n\
         Transfer-Encoding: chunked\r\n\
         Content-Length: 3\r\n\
         Upgrade: h2c\r\n\
         Trailer: x\r\n\
         Proxy-Authorization: p\r\n\
         Proxy-Authenticate: p\r\n\
         Set-Cookie: a=1\r\n\
         set-cookie: b=2\r\n\
         \r\n",
    );
    assert_eq!(
        names(f.end_to_end()),
        ["Authorization", "Set-Cookie", "set-cookie"]
    );
}

#[test]
fn without_a_connection_field_naming_one_every_end_to_end_field_goes_on() {
    let f = Fields::from_pairs(&[("x-secret", "1"), ("content-type", "a/b")]);
    assert_eq!(names(f.end_to_end()), ["x-secret", "content-type"]);
    let f = Fields::from_pairs(&[("connection", "Keep-Alive, , close"), ("x-secret", "1")]);
    assert_eq!(names(f.end_to_end()), ["x-secret"]);
}

#[test]
fn a_map_round_trips() {
    let f = Fields::from_pairs(&[("a", "1"), ("b", "2"), ("a", "3")]);
    let map = header_map(f.iter());
    assert_eq!(map.len(), 3);
    assert_eq!(
        map.get_all("a").iter().collect::<Vec<_>>(),
        [
            &HeaderValue::from_static("1"),
            &HeaderValue::from_static("3")
        ]
    );
    let back = Fields::from_map(&map);
    assert_eq!(back.get_all("a").collect::<Vec<_>>(), [b"1", b"3"]);
    assert_eq!(back.get("b"), Some(&b"2"[..]));
}
