//! The wire format against payloads msgspec wrote (`fixtures/payloads.txt`,
//! from `fixtures/make_payloads.py`): what vLLM's publisher sends, in both
//! encodings.

use kv_events::wire::{
    BlockHash, BlockRemoved, BlockStored, Encoding, EventBatch, KvEvent, Value, WireError,
    decode_batch, decode_message, decode_sequence, encode_batch, encode_message,
};

fn fixture(name: &str) -> Vec<u8> {
    let line = include_str!("fixtures/payloads.txt")
        .lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no fixture {name}"));
    (0..line.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&line[i..i + 2], 16).unwrap())
        .collect()
}

fn stored(event: &KvEvent) -> &BlockStored {
    match event {
        KvEvent::BlockStored(stored) => stored,
        other => panic!("expected BlockStored, got {other:?}"),
    }
}

fn removed(event: &KvEvent) -> &BlockRemoved {
    match event {
        KvEvent::BlockRemoved(removed) => removed,
        other => panic!("expected BlockRemoved, got {other:?}"),
    }
}

#[test]
fn array_batch_with_integer_hashes_and_optional_fields_absent() {
    let batch = decode_batch(&fixture("array_int_minimal")).unwrap();
    assert_eq!(batch.ts, 1_700_000_000.25);
    assert_eq!(batch.data_parallel_rank, None);
    assert_eq!(batch.events.len(), 2);

    let s = stored(&batch.events[0]);
    assert_eq!(
        s.block_hashes,
        [BlockHash::Unsigned(u64::MAX - 4), BlockHash::Unsigned(17)]
    );
    assert_eq!(s.parent_block_hash, None);
    assert_eq!(s.token_ids, [1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(s.block_size, 4);
    assert_eq!(s.lora_id, None);
    assert_eq!(s.medium.as_deref(), Some("GPU"));
    assert_eq!(s.lora_name, None);
    assert_eq!(s.extra_keys, None);
    assert_eq!(s.group_idx, None);
    assert_eq!(s.kv_cache_spec_kind, None);
    assert_eq!(s.kv_cache_spec_sliding_window, None);

    let r = removed(&batch.events[1]);
    assert_eq!(r.block_hashes, [BlockHash::Signed(-42)]);
    assert_eq!(r.medium.as_deref(), Some("GPU"));
    assert_eq!(r.group_idx, None);
}

#[test]
fn array_batch_with_every_optional_field_and_an_unknown_kind() {
    let batch = decode_batch(&fixture("array_int_full")).unwrap();
    assert_eq!(batch.ts, 12.5);
    assert_eq!(batch.data_parallel_rank, Some(1));
    let kinds: Vec<&str> = batch.events.iter().map(KvEvent::kind).collect();
    assert_eq!(
        kinds,
        [
            "BlockStored",
            "BlocksMoved",
            "BlockRemoved",
            "AllBlocksCleared"
        ]
    );
    assert!(matches!(&batch.events[1], KvEvent::Unknown { kind } if kind == "BlocksMoved"));

    let s = stored(&batch.events[0]);
    assert_eq!(s.block_hashes, [BlockHash::Unsigned(101)]);
    assert_eq!(s.parent_block_hash, Some(BlockHash::Unsigned(17)));
    assert_eq!(s.lora_id, Some(7));
    assert_eq!(s.medium.as_deref(), Some("CPU"));
    assert_eq!(s.lora_name.as_deref(), Some("sql-lora"));
    assert_eq!(
        s.extra_keys,
        Some(vec![Some(Value::Array(vec![
            Value::from("sql-lora"),
            Value::from("img-abc")
        ]))])
    );
    assert_eq!(s.group_idx, Some(0));
    assert_eq!(s.kv_cache_spec_kind.as_deref(), Some("full_attention"));
    assert_eq!(s.kv_cache_spec_sliding_window, Some(4096));

    let r = removed(&batch.events[2]);
    assert_eq!(
        r.block_hashes,
        [BlockHash::Unsigned(101), BlockHash::Unsigned(17)]
    );
    assert_eq!(r.medium.as_deref(), Some("CPU"));
    assert_eq!(r.group_idx, Some(0));
}

#[test]
fn map_batch_with_bytes_hashes() {
    let batch = decode_batch(&fixture("map_bytes")).unwrap();
    assert_eq!(batch.ts, 3.0);
    assert_eq!(batch.data_parallel_rank, Some(0));
    let h1: Vec<u8> = (0..32).collect();
    let h2: Vec<u8> = (32..64).collect();

    let s = stored(&batch.events[0]);
    assert_eq!(
        s.block_hashes,
        [BlockHash::Bytes(h1.clone()), BlockHash::Bytes(h2.clone())]
    );
    assert_eq!(s.parent_block_hash, None);
    assert_eq!(s.token_ids, (100..108).collect::<Vec<u32>>());
    assert_eq!(s.extra_keys, Some(vec![None, None]));
    assert_eq!(s.group_idx, None);

    assert_eq!(batch.events[1], KvEvent::AllBlocksCleared);
    assert!(matches!(&batch.events[2], KvEvent::Unknown { kind } if kind == "BlocksMoved"));
    let r = removed(&batch.events[3]);
    assert_eq!(r.block_hashes, [BlockHash::Bytes(h2)]);
    assert_eq!(r.medium, None);
}

#[test]
fn map_batch_writes_fields_without_default_even_when_nil() {
    let batch = decode_batch(&fixture("map_minimal")).unwrap();
    let s = stored(&batch.events[0]);
    assert_eq!(
        s.parent_block_hash,
        Some(BlockHash::Bytes((0..32).collect()))
    );
    assert_eq!(s.medium, None);
    assert_eq!(s.block_size, 2);
    assert_eq!(batch.data_parallel_rank, None);
}

#[test]
fn the_encoder_writes_what_msgspec_writes() {
    for (name, encoding) in [
        ("array_int_minimal", Encoding::Array),
        ("map_minimal", Encoding::Map),
    ] {
        let payload = fixture(name);
        let batch = decode_batch(&payload).unwrap();
        assert_eq!(encode_batch(&batch, encoding), payload, "{name}");
    }
}

#[test]
fn every_fixture_survives_both_encodings() {
    for name in [
        "array_int_minimal",
        "array_int_full",
        "map_bytes",
        "map_minimal",
    ] {
        let batch = decode_batch(&fixture(name)).unwrap();
        for encoding in [Encoding::Array, Encoding::Map] {
            let again = decode_batch(&encode_batch(&batch, encoding)).unwrap();
            assert_eq!(again, batch, "{name} as {encoding:?}");
        }
    }
}

#[test]
fn a_message_is_topic_sequence_payload() {
    let batch = decode_batch(&fixture("map_bytes")).unwrap();
    let frames = encode_message(
        b"kv@pod-a@llama",
        0x0102_0304_0506_0708,
        &batch,
        Encoding::Map,
    );
    assert_eq!(frames[1], [1, 2, 3, 4, 5, 6, 7, 8]);
    let message = decode_message(&frames).unwrap();
    assert_eq!(message.topic, b"kv@pod-a@llama");
    assert_eq!(message.seq, 0x0102_0304_0506_0708);
    assert_eq!(message.batch, batch);
}

#[test]
fn a_truncated_payload_is_an_error_at_every_length() {
    let payload = fixture("array_int_full");
    for len in 0..payload.len() {
        assert_eq!(
            decode_batch(&payload[..len]),
            Err(WireError::Truncated),
            "cut at {len}"
        );
    }
}

#[test]
fn bad_frames_are_typed_errors() {
    let payload = fixture("map_minimal");
    assert_eq!(
        decode_message(&[b"topic".as_slice(), &payload]),
        Err(WireError::FrameCount(2))
    );
    assert_eq!(
        decode_message(&[b"topic".as_slice(), &[0; 7], &payload]),
        Err(WireError::SequenceLength(7))
    );
    assert_eq!(decode_sequence(&[0, 0, 0, 0, 0, 0, 1, 0]), Ok(256));
    let mut long = payload.clone();
    long.extend_from_slice(&[0xc0, 0xc0]);
    assert_eq!(decode_batch(&long), Err(WireError::TrailingBytes(2)));
    // Nested deeper than the decoder's limit: an error, not a stack overflow.
    let mut deep = vec![0x91; 5000];
    deep.push(0xc0);
    assert!(matches!(decode_batch(&deep), Err(WireError::Msgpack(_))));
}

fn payload(value: Value) -> Vec<u8> {
    let mut out = Vec::new();
    rmpv::encode::write_value(&mut out, &value).unwrap();
    out
}

fn array_batch(events: Vec<Value>) -> Value {
    Value::Array(vec![Value::F64(1.0), Value::Array(events), Value::Nil])
}

#[test]
fn malformed_fields_name_the_event_and_the_field() {
    let stored_with_tokens = |tokens: Value| {
        Value::Array(vec![
            Value::from("BlockStored"),
            Value::Array(vec![Value::from(1)]),
            Value::Nil,
            tokens,
            Value::from(1),
        ])
    };
    let good = stored_with_tokens(Value::Array(vec![Value::from(5)]));
    let bad = stored_with_tokens(Value::Array(vec![Value::from("five")]));
    // A short array: the optional trailing fields are simply absent.
    let batch = decode_batch(&payload(array_batch(vec![good.clone()]))).unwrap();
    assert_eq!(stored(&batch.events[0]).medium, None);
    assert_eq!(
        decode_batch(&payload(array_batch(vec![good, bad]))),
        Err(WireError::Malformed {
            event: Some(1),
            field: "token_ids",
            expected: "token ids below 2^32"
        })
    );
    let too_big = stored_with_tokens(Value::Array(vec![Value::from(1u64 << 32)]));
    assert!(decode_batch(&payload(array_batch(vec![too_big]))).is_err());
    let float_hash = Value::Array(vec![
        Value::from("BlockRemoved"),
        Value::Array(vec![Value::F64(1.0)]),
    ]);
    assert!(matches!(
        decode_batch(&payload(array_batch(vec![float_hash]))),
        Err(WireError::Malformed {
            event: Some(0),
            field: "block_hashes",
            ..
        })
    ));
    let untagged = Value::Map(vec![(Value::from("block_hashes"), Value::Array(vec![]))]);
    assert!(matches!(
        decode_batch(&payload(array_batch(vec![untagged]))),
        Err(WireError::Malformed { field: "type", .. })
    ));
    assert!(matches!(
        decode_batch(&payload(Value::from("hello"))),
        Err(WireError::Malformed {
            event: None,
            field: "batch",
            ..
        })
    ));
    let no_events = Value::Map(vec![(Value::from("ts"), Value::F64(1.0))]);
    assert!(matches!(
        decode_batch(&payload(no_events)),
        Err(WireError::Malformed {
            field: "events",
            ..
        })
    ));
}

#[test]
fn unknown_fields_in_a_map_are_ignored() {
    let event = Value::Map(vec![
        (Value::from("type"), Value::from("BlockRemoved")),
        (Value::from("added_later"), Value::from(true)),
        (
            Value::from("block_hashes"),
            Value::Array(vec![Value::from(-1)]),
        ),
        (Value::from("medium"), Value::from("GPU")),
    ]);
    let batch = Value::Map(vec![
        (Value::from("events"), Value::Array(vec![event])),
        (Value::from("ts"), Value::from(2)),
        (Value::from("shard"), Value::from("x")),
    ]);
    let batch: EventBatch = decode_batch(&payload(batch)).unwrap();
    assert_eq!(batch.ts, 2.0);
    assert_eq!(
        batch.events,
        [KvEvent::BlockRemoved(BlockRemoved::new(vec![
            BlockHash::Signed(-1)
        ]))]
    );
}
