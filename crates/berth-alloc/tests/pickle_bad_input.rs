//! Malformed pickles and snapshots: typed errors naming the offset and opcode, never a panic.

use berth_alloc::pickle::{
    from_slice, load_snapshot, memory_budget, snapshot_from_value, to_vec, PickleError,
    PickleValue, BUDGET_FLOOR_BYTES, MAX_DEPTH, MAX_EXPANSION,
};
use proptest::prelude::*;

fn real_pickle() -> Vec<u8> {
    std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/data/two_stream_pipeline.snapshot.pickle"
    ))
    .unwrap()
}

fn malformed(data: &[u8]) -> (usize, &'static str, String) {
    match from_slice(data) {
        Err(PickleError::Malformed {
            offset,
            opcode,
            reason,
        }) => (offset, opcode, reason),
        other => panic!(
            "expected Malformed for a {}-byte input, got {other:?}",
            data.len()
        ),
    }
}

#[test]
fn pickle_bad_opcodes_are_named_with_their_offset() {
    assert_eq!(
        from_slice(b"\x80\x04\xff"),
        Err(PickleError::UnknownOpcode {
            offset: 2,
            byte: 0xff
        })
    );
    assert_eq!(from_slice(b""), Err(PickleError::MissingStop { offset: 0 }));
    assert_eq!(
        from_slice(b"\x80\x04N"),
        Err(PickleError::MissingStop { offset: 3 })
    );
    assert_eq!(
        from_slice(b"\x80\x04X\x10\x00\x00\x00abc"),
        Err(PickleError::Truncated {
            offset: 2,
            opcode: "BINUNICODE",
            needed: 13,
            len: 10
        })
    );
    // `pickle.dumps(collections.OrderedDict(), protocol=2)`: a class, not plain data.
    let err = from_slice(b"\x80\x02ccollections\nOrderedDict\nq\x00)Rq\x01.").unwrap_err();
    assert_eq!(
        err,
        PickleError::Unsupported {
            offset: 2,
            opcode: "GLOBAL",
            what: "a class instance or calls a function"
        }
    );
    assert!(err.to_string().contains("opcode GLOBAL at byte 2"));
    let err = from_slice(b"\x80\x04\x8f\x94.").unwrap_err();
    assert!(matches!(
        err,
        PickleError::Unsupported {
            offset: 2,
            opcode: "EMPTY_SET",
            ..
        }
    ));
    assert_eq!(malformed(b"\x80\x06N.").1, "PROTO");
}

#[test]
fn pickle_misused_opcodes_are_malformed() {
    // SETITEMS on a list.
    let (offset, opcode, reason) = malformed(b"](K\x01K\x02u.");
    assert_eq!((offset, opcode), (6, "SETITEMS"));
    assert!(
        reason.contains("list") && reason.contains("expected a dict"),
        "{reason}"
    );
    // APPEND on a dict.
    assert_eq!(malformed(b"}K\x01a.").1, "APPEND");
    // Stack underflow, missing MARK, odd number of dict items.
    assert_eq!(malformed(b"s.").1, "SETITEM");
    assert_eq!(malformed(b"K\x01t.").1, "TUPLE");
    assert_eq!(malformed(b"(K\x01d.").1, "DICT");
    assert_eq!(malformed(b"K\x01\x86.").1, "TUPLE2");
    assert_eq!(malformed(b".").1, "STOP");
    // A memo index never stored.
    let (offset, opcode, reason) = malformed(b"\x80\x04h\x05.");
    assert_eq!((offset, opcode), (2, "BINGET"));
    assert!(reason.contains("memo index 5"), "{reason}");
    // Invalid UTF-8 in a string.
    assert_eq!(malformed(b"\x8c\x02\xff\xfe.").1, "SHORT_BINUNICODE");
    // Text forms with garbage.
    assert_eq!(malformed(b"I12x\n.").1, "INT");
    assert_eq!(malformed(b"Fnope\n.").1, "FLOAT");
}

#[test]
fn pickle_self_reference_and_deep_nesting_are_errors() {
    // l = []; l.append(l): a list containing itself.
    let (_, opcode, reason) = malformed(b"\x80\x04]\x94h\x00a.");
    assert_eq!(opcode, "STOP");
    assert!(reason.contains("contains itself"), "{reason}");
    // 1001 nested lists.
    let mut deep = b"\x80\x04".to_vec();
    deep.extend(std::iter::repeat_n(b']', MAX_DEPTH + 1));
    deep.extend(std::iter::repeat_n(b'a', MAX_DEPTH));
    deep.push(b'.');
    assert_eq!(malformed(&deep).1, "STOP");
    // 1000 levels are fine.
    let mut ok = b"\x80\x04".to_vec();
    ok.extend(std::iter::repeat_n(b']', MAX_DEPTH));
    ok.extend(std::iter::repeat_n(b'a', MAX_DEPTH - 1));
    ok.push(b'.');
    assert!(from_slice(&ok).is_ok());
}

#[test]
fn pickle_shared_references_cannot_explode() {
    // Each level is a list holding the previous level twice: 2^40 nodes from a few hundred bytes.
    let mut data = b"\x80\x04]\x94".to_vec();
    for i in 0u32..40 {
        data.extend_from_slice(b"](j");
        data.extend_from_slice(&i.to_le_bytes());
        data.push(b'j');
        data.extend_from_slice(&i.to_le_bytes());
        data.extend_from_slice(b"e\x94");
    }
    data.push(b'.');
    let (_, opcode, reason) = malformed(&data);
    assert_eq!(opcode, "STOP");
    assert!(reason.contains("expand"), "{reason}");
}

/// The shape of the newcomer's `gen_amp.py` (defect 5): `A = [0] * 1000`, `B = [A] * 1000`,
/// `C = [B] * copies`, behind `padding` bytes; each `B` is a million ints (32 MB of tree).
fn amplifier(copies: usize, padding: usize) -> Vec<u8> {
    let mut d = b"\x80\x02](C".to_vec(); // protocol 2, outer list, MARK, SHORT_BINBYTES
    d.push(u8::try_from(padding.min(255)).unwrap());
    d.extend(std::iter::repeat_n(0u8, padding.min(255)));
    d.extend_from_slice(b"]q\x00(");
    d.extend(std::iter::repeat_n(*b"K\x00", 1000).flatten());
    d.extend_from_slice(b"e]q\x01(");
    d.extend(std::iter::repeat_n(*b"h\x00", 1000).flatten());
    d.extend_from_slice(b"e]q\x02(");
    d.extend(std::iter::repeat_n(*b"h\x01", copies).flatten());
    d.extend_from_slice(b"ee.");
    d
}

#[test]
fn pickle_budget_is_a_bound_checked_before_the_tree_is_built() {
    // B and three copies of it in C: 4 × 1001 × 1001 values of 32 bytes ≈ 128 MB > the 64 MiB
    // floor plus 64 × 6 KB. The reproducer (20 MB, 300 copies) reached 9.7 GB before failing.
    let data = amplifier(3, 100);
    assert!(data.len() < 8000, "{}", data.len());
    let t0 = std::time::Instant::now();
    let (_, opcode, reason) = malformed(&data);
    assert_eq!(opcode, "STOP");
    let limit = memory_budget(data.len());
    assert_eq!(limit, MAX_EXPANSION * data.len() + BUDGET_FLOOR_BYTES);
    assert!(
        reason.contains(&format!(
            "more than {limit} bytes of objects for {} bytes of input",
            data.len()
        )),
        "{reason}"
    );
    assert!(reason.contains("64× the input size"), "{reason}");
    // Refused from the costs alone: no 96 MB tree was built first (that takes seconds here).
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(2),
        "{:?}",
        t0.elapsed()
    );
    // B and one copy (64 MB of tree) is within the floor and decodes.
    let v = from_slice(&amplifier(1, 100)).unwrap();
    let PickleValue::List(outer) = v else {
        panic!("{v:?}")
    };
    // [padding, A, B, C]
    assert_eq!(outer.len(), 4);
    let PickleValue::List(c) = &outer[3] else {
        panic!()
    };
    let PickleValue::List(b) = &c[0] else {
        panic!()
    };
    assert_eq!(b.len(), 1000);
    assert_eq!(b[999], PickleValue::List(vec![PickleValue::Int(0); 1000]));
}

#[test]
fn pickle_budget_leaves_a_real_snapshot_far_inside() {
    // PyTorch's own snapshot: shared frame strings make its tree about 9× the file, well
    // inside MAX_EXPANSION.
    let data = real_pickle();
    fn size(v: &PickleValue) -> usize {
        std::mem::size_of::<PickleValue>()
            + match v {
                PickleValue::Str(s) => s.len(),
                PickleValue::Bytes(b) | PickleValue::BigInt(b) => b.len(),
                PickleValue::List(l) | PickleValue::Tuple(l) => l.iter().map(size).sum(),
                PickleValue::Dict(d) => d.iter().map(|(k, v)| 2 * size(k) + size(v)).sum(),
                _ => 0,
            }
    }
    let ratio = size(&from_slice(&data).unwrap()) / data.len();
    assert!((2..=16).contains(&ratio), "{ratio}");
}

#[test]
fn pickle_snapshot_schema_errors_name_the_field() {
    let good = from_slice(&real_pickle()).unwrap();
    let PickleValue::Dict(mut top) = good else {
        panic!("top level is a dict")
    };
    // Corrupt segments[0].blocks[0].state.
    let segs = &mut top[0].1;
    let PickleValue::List(segs) = segs else {
        panic!()
    };
    let PickleValue::Dict(seg0) = &mut segs[0] else {
        panic!()
    };
    let blocks = &mut seg0
        .iter_mut()
        .find(|(k, _)| k.as_str() == Some("blocks"))
        .unwrap()
        .1;
    let PickleValue::List(blocks) = blocks else {
        panic!()
    };
    let PickleValue::Dict(b0) = &mut blocks[0] else {
        panic!()
    };
    b0.iter_mut()
        .find(|(k, _)| k.as_str() == Some("state"))
        .unwrap()
        .1 = PickleValue::str("freed");
    let err = snapshot_from_value(&PickleValue::Dict(top.clone())).unwrap_err();
    assert_eq!(
        err,
        PickleError::Schema {
            path: "segments[0].blocks[0].state".into(),
            expected: "'active_allocated', 'active_pending_free' or 'inactive'".into(),
            found: "str \"freed\"".into()
        }
    );
    // Missing key, wrong type, not a dict.
    let err = load_snapshot(&to_vec(&PickleValue::dict([(
        "device_traces",
        PickleValue::List(vec![]),
    )])))
    .unwrap_err();
    assert!(
        matches!(&err, PickleError::Schema { path, .. } if path == "segments"),
        "{err}"
    );
    let bad = PickleValue::dict([("segments", PickleValue::Int(3))]);
    assert!(snapshot_from_value(&bad)
        .unwrap_err()
        .to_string()
        .contains("field `segments`: expected a list, found int 3"));
    assert!(matches!(
        load_snapshot(&to_vec(&PickleValue::List(vec![]))),
        Err(PickleError::Schema { .. })
    ));
    let negative = PickleValue::dict([(
        "segments",
        PickleValue::List(vec![PickleValue::dict([
            ("device", PickleValue::Int(0)),
            ("address", PickleValue::Int(-5)),
        ])]),
    )]);
    let msg = snapshot_from_value(&negative).unwrap_err().to_string();
    assert!(msg.contains("segments[0]"), "{msg}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any prefix of PyTorch's pickle is an error naming a position inside the prefix.
    #[test]
    fn pickle_random_truncations_are_errors(frac in 0.0f64..1.0) {
        let data = real_pickle();
        let n = ((data.len() as f64) * frac) as usize;
        match from_slice(&data[..n]) {
            Err(PickleError::Truncated { offset, len, .. }) => prop_assert!(offset < n && len == n),
            Err(PickleError::MissingStop { offset }) => prop_assert_eq!(offset, n),
            other => prop_assert!(false, "prefix {} gave {:?}", n, other),
        }
    }

    /// Corrupting bytes never panics; errors point inside the input.
    #[test]
    fn pickle_random_corruption_never_panics(
        edits in proptest::collection::vec((0.0f64..1.0, any::<u8>()), 1..8)
    ) {
        let mut data = real_pickle();
        for (frac, byte) in edits {
            let i = ((data.len() as f64) * frac) as usize;
            data[i] = byte;
        }
        match from_slice(&data) {
            Ok(v) => { let _ = snapshot_from_value(&v); }
            Err(PickleError::Truncated { offset, .. } | PickleError::MissingStop { offset }
                | PickleError::UnknownOpcode { offset, .. } | PickleError::Unsupported { offset, .. }
                | PickleError::Malformed { offset, .. }) => prop_assert!(offset <= data.len()),
            Err(e) => prop_assert!(false, "unexpected error {:?}", e),
        }
    }

    /// Random byte strings never panic the reader.
    #[test]
    fn pickle_random_bytes_never_panic(data in proptest::collection::vec(any::<u8>(), 0..64)) {
        let _ = from_slice(&data);
    }
}

/// A snapshot whose `allocator_settings.garbage_collection_threshold` is not a threshold (NaN,
/// negative, 1 or more) is refused, naming the field: a NaN loaded as-is made the settings
/// unequal to themselves, so dumping and loading the snapshot changed it (found by the `pickle`
/// fuzz target).
#[test]
fn pickle_snapshot_refuses_a_threshold_that_is_not_one() {
    for bad in [f64::NAN, -0.5, 1.0, f64::INFINITY] {
        let snap = PickleValue::dict([
            ("segments", PickleValue::List(vec![])),
            (
                "allocator_settings",
                PickleValue::dict([("garbage_collection_threshold", PickleValue::Float(bad))]),
            ),
        ]);
        let err = snapshot_from_value(&snap).unwrap_err();
        assert!(
            matches!(&err, PickleError::Schema { path, .. }
                if path == "allocator_settings.garbage_collection_threshold"),
            "{bad}: {err}"
        );
    }
    let ok = PickleValue::dict([
        ("segments", PickleValue::List(vec![])),
        (
            "allocator_settings",
            PickleValue::dict([("garbage_collection_threshold", PickleValue::Float(0.0))]),
        ),
    ]);
    assert!(snapshot_from_value(&ok).is_ok());
}
