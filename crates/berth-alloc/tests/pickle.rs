//! Pickles: the reader and writer on their own, PyTorch's real snapshot pickle, export of a
//! snapshot taken after a replay, and bad input.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;

use berth_alloc::backend::sim::SimBackend;
use berth_alloc::caching::CachingAllocator;
use berth_alloc::pickle::{
    dump_snapshot, from_slice, load_snapshot, load_trace_pickle, snapshot_to_value, to_vec,
    PickleError, PickleValue,
};
use berth_alloc::replay::replay;
use berth_alloc::snapshot::SegmentType;
use berth_alloc::trace::read_trace;
use berth_alloc::{BlockState, DeviceAllocator, MemorySnapshot, StreamId, TraceAction};

use crate::util::trace_path;

fn real_pickle_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/two_stream_pipeline.snapshot.pickle")
}

fn real_pickle() -> Vec<u8> {
    std::fs::read(real_pickle_path())
        .expect("tests/data/two_stream_pipeline.snapshot.pickle is checked in")
}

/// Runs `script` with python3 (argv[1..] = `args`); `None` (with a message) when python3 is absent.
fn python(script: &str, args: &[&str]) -> Option<String> {
    match Command::new("python3")
        .arg("-c")
        .arg(script)
        .args(args)
        .output()
    {
        Ok(out) => {
            assert!(
                out.status.success(),
                "python3 failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            Some(String::from_utf8(out.stdout).unwrap())
        }
        Err(e) => {
            eprintln!("skipping the python3 part: cannot run python3 ({e})");
            None
        }
    }
}

fn temp_file(name: &str, bytes: &[u8]) -> PathBuf {
    let path = std::env::temp_dir().join(format!("berth-alloc-{}-{name}", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn pickle_reads_pytorchs_snapshot() {
    let s = load_snapshot(&real_pickle()).unwrap();
    assert_eq!(s.segments.len(), 12);
    let small = s
        .segments
        .iter()
        .filter(|g| g.segment_type == SegmentType::Small)
        .count();
    assert_eq!(small, 3);
    let first = &s.segments[0];
    assert_eq!(
        (first.address, first.total_size, first.stream),
        (140529444585472, 2097152, StreamId(0))
    );
    assert_eq!(first.blocks.len(), 1);
    assert_eq!(
        (first.blocks[0].requested_size, first.blocks[0].state),
        (4000, BlockState::Inactive)
    );
    let mut states = BTreeMap::new();
    for b in s.segments.iter().flat_map(|g| &g.blocks) {
        *states.entry(b.state.as_str()).or_insert(0) += 1;
    }
    assert_eq!(
        states,
        BTreeMap::from([
            ("active_allocated", 3),
            ("active_pending_free", 1),
            ("inactive", 12)
        ])
    );
    // Blocks tile their segment.
    for g in &s.segments {
        assert_eq!(g.blocks.iter().map(|b| b.size).sum::<u64>(), g.total_size);
    }
    assert_eq!(s.device_traces.len(), 1);
    let t = &s.device_traces[0];
    assert_eq!(t.len(), 3350);
    let count = |a: TraceAction| t.iter().filter(|e| e.action == a).count();
    assert_eq!(
        [
            count(TraceAction::Alloc),
            count(TraceAction::FreeRequested),
            count(TraceAction::FreeCompleted)
        ],
        [1115, 1112, 1111]
    );
    assert_eq!(count(TraceAction::SegmentAlloc), 12);
    assert!(t.iter().any(|e| e.stream == StreamId(467288144)));
    assert_eq!(
        (t[0].action, t[0].size, t[0].time_us),
        (TraceAction::SegmentAlloc, 67108864, 1795986078892084)
    );
    assert_eq!(
        s.allocator_settings,
        berth_alloc::AllocatorConfig::default()
    );
}

#[test]
fn pickle_trace_matches_the_json_trace_and_replays_identically() {
    let Some(json_path) = trace_path("two_stream_pipeline") else {
        return;
    };
    let from_pickle = load_trace_pickle(&real_pickle()).unwrap();
    let json = read_trace(json_path).unwrap();
    // The JSON was flattened from the same history plus a final `snapshot` row.
    let json_rows: Vec<_> = json
        .events
        .iter()
        .copied()
        .filter(|e| e.action != TraceAction::Snapshot)
        .collect();
    assert_eq!(from_pickle.events, json_rows);
    let a = replay(
        &from_pickle.events,
        &CachingAllocator::new(SimBackend::new(SimBackend::H200_BYTES)),
    )
    .unwrap();
    let b = replay(
        &json.events,
        &CachingAllocator::new(SimBackend::new(SimBackend::H200_BYTES)),
    )
    .unwrap();
    assert_eq!(
        (a.ops, a.peak_requested, a.peak_reserved, a.device_allocs),
        (b.ops, b.peak_requested, b.peak_reserved, b.device_allocs)
    );
    assert_eq!(a.peak_requested, 268738372);
}

#[test]
fn pickle_value_round_trips_through_the_writer() {
    let data = real_pickle();
    let v = from_slice(&data).unwrap();
    let out = to_vec(&v);
    assert_eq!(from_slice(&out).unwrap(), v);
    // String memoisation keeps it as compact as Python's own output.
    assert!(out.len() < data.len(), "{} vs {}", out.len(), data.len());
}

fn sample_value(with_bytes: bool) -> PickleValue {
    use PickleValue as P;
    let big: Vec<P> = (0..2500).map(|i| P::Int(i * 1_000_003 - 7)).collect();
    let many_strings: Vec<P> = (0..300).map(|i| P::str(format!("key{i}"))).collect();
    let mut items = vec![
        ("none", P::None),
        ("bools", P::List(vec![P::Bool(true), P::Bool(false)])),
        (
            "ints",
            P::List(
                [
                    0,
                    1,
                    255,
                    256,
                    65535,
                    65536,
                    -1,
                    -256,
                    i32::MAX as i64,
                    i32::MIN as i64,
                    1 << 40,
                    i64::MAX,
                    i64::MIN,
                ]
                .into_iter()
                .map(P::Int)
                .collect(),
            ),
        ),
        ("huge", P::from(u64::MAX)),
        (
            "floats",
            P::List(vec![
                P::Float(0.5),
                P::Float(-1e300),
                P::Float(f64::INFINITY),
                P::Float(3.0),
            ]),
        ),
        (
            "text",
            P::str("snowman ☃, tab\t, newline\n, backslash \\ and ü"),
        ),
        (
            "tuples",
            P::List(vec![
                P::Tuple(vec![]),
                P::Tuple(vec![P::Int(1)]),
                P::Tuple(vec![P::Int(0), P::Int(0)]),
                P::Tuple(vec![P::None; 5]),
            ]),
        ),
        (
            "nested",
            P::dict([(
                "a",
                P::dict([("b", P::List(vec![P::dict([("c", P::Int(3))])]))]),
            )]),
        ),
        (
            "int_keys",
            P::Dict(vec![
                (P::Int(1), P::str("one")),
                (P::Tuple(vec![P::Int(0), P::Int(0)]), P::str("pool")),
            ]),
        ),
        ("big_list", P::List(big)),
        ("many_strings", P::List(many_strings.clone())),
        ("repeated", P::List(many_strings)),
        ("long_text", P::str("x".repeat(70_000))),
    ];
    if with_bytes {
        items.push((
            "bytes",
            P::List(vec![
                P::Bytes(vec![]),
                P::Bytes(vec![0, 255, 10]),
                P::Bytes(vec![7; 300]),
            ]),
        ));
    }
    P::dict(items)
}

#[test]
fn pickle_reader_reads_every_protocol_python_writes() {
    for (with_bytes, protocols) in [(false, "0,1,2"), (true, "3,4,5")] {
        let v = sample_value(with_bytes);
        let ours = temp_file(&format!("sample-{with_bytes}.pickle"), &to_vec(&v));
        let script = "import pickle,sys\n\
            v = pickle.load(open(sys.argv[1], 'rb'))\n\
            assert v['huge'] == 2**64 - 1 and v['text'].startswith('snowman')\n\
            for p in map(int, sys.argv[2].split(',')):\n\
            \x20   open(sys.argv[1] + '.p%d' % p, 'wb').write(pickle.dumps(v, protocol=p))\n\
            print('ok')";
        let Some(out) = python(script, &[ours.to_str().unwrap(), protocols]) else {
            return;
        };
        assert_eq!(out.trim(), "ok");
        for p in protocols.split(',') {
            let path = format!("{}.p{p}", ours.display());
            let theirs = std::fs::read(&path).unwrap();
            assert_eq!(from_slice(&theirs).unwrap(), v, "protocol {p}");
            std::fs::remove_file(path).ok();
        }
        std::fs::remove_file(ours).ok();
    }
}

/// A snapshot taken after replaying the two-stream trace, with live, pending and cached blocks.
fn replayed_snapshot() -> MemorySnapshot {
    let trace = load_trace_pickle(&real_pickle()).unwrap();
    let alloc = CachingAllocator::new(SimBackend::new(SimBackend::H200_BYTES));
    alloc.record_memory_history(Some(100_000));
    replay(&trace.events, &alloc).unwrap();
    let side = StreamId(467288144);
    let live = alloc.allocate(3 << 20, StreamId::DEFAULT).unwrap();
    let pending = alloc.allocate(1000, StreamId::DEFAULT).unwrap();
    alloc.record_stream(&pending, side).unwrap();
    drop(pending);
    let snap = alloc.snapshot();
    drop(live);
    snap
}

#[test]
fn pickle_exported_snapshot_round_trips_and_python_reads_it() {
    let snap = replayed_snapshot();
    assert!(!snap.segments.is_empty());
    assert!(snap.device_traces.iter().map(Vec::len).sum::<usize>() > 3000);
    let states: Vec<_> = snap
        .segments
        .iter()
        .flat_map(|s| &s.blocks)
        .map(|b| b.state)
        .collect();
    assert!(states.contains(&BlockState::ActiveAllocated));
    assert!(states.contains(&BlockState::ActivePendingFree));
    let bytes = dump_snapshot(&snap);
    assert_eq!(load_snapshot(&bytes).unwrap(), snap);
    let v = snapshot_to_value(&snap);
    assert_eq!(
        v.str_keys(),
        [
            "segments",
            "device_traces",
            "allocator_settings",
            "external_annotations"
        ]
    );

    let ours = temp_file("export.pickle", &bytes);
    let script = "import pickle,sys,json\n\
        ours = pickle.load(open(sys.argv[1], 'rb'))\n\
        real = pickle.load(open(sys.argv[2], 'rb'))\n\
        def keys(d):\n\
        \x20   seg = d['segments'][0]\n\
        \x20   return {'top': list(d), 'segment': list(seg), 'block': list(seg['blocks'][0]),\n\
        \x20           'trace': list(d['device_traces'][0][0]), 'settings': list(d['allocator_settings']),\n\
        \x20           'divisions': list(d['allocator_settings']['roundup_power2_divisions'])}\n\
        states = sorted({b['state'] for s in ours['segments'] for b in s['blocks']})\n\
        addrs = [s['address'] for s in ours['segments']]\n\
        assert addrs == sorted(addrs)\n\
        for s in ours['segments']:\n\
        \x20   at = s['address']\n\
        \x20   for b in s['blocks']:\n\
        \x20       assert b['address'] == at, (b, at)\n\
        \x20       assert b['state'] == 'inactive' or b['requested_size'] <= b['size'], b\n\
        \x20       at += b['size']\n\
        \x20   assert at == s['address'] + s['total_size']\n\
        \x20   act = [b for b in s['blocks'] if b['state'] != 'inactive']\n\
        \x20   assert s['active_size'] == sum(b['size'] for b in act)\n\
        \x20   assert s['allocated_size'] == sum(b['size'] for b in act if b['state'] == 'active_allocated')\n\
        print(json.dumps({'ours': keys(ours), 'real': keys(real), 'states': states,\n\
        \x20   'segments': len(ours['segments']), 'pool': list(ours['segments'][0]['segment_pool_id']),\n\
        \x20   'actions': sorted({e['action'] for e in ours['device_traces'][0]})}))";
    let real = real_pickle_path();
    let Some(out) = python(script, &[ours.to_str().unwrap(), real.to_str().unwrap()]) else {
        return;
    };
    std::fs::remove_file(&ours).ok();
    let got: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        got["ours"], got["real"],
        "keys differ from PyTorch's pickle"
    );
    assert_eq!(
        got["ours"]["top"],
        serde_json::json!([
            "segments",
            "device_traces",
            "allocator_settings",
            "external_annotations"
        ])
    );
    assert_eq!(
        got["states"],
        serde_json::json!(["active_allocated", "active_pending_free", "inactive"])
    );
    assert_eq!(got["segments"], serde_json::json!(snap.segments.len()));
    assert_eq!(got["pool"], serde_json::json!([0, 0]));
    let actions = got["actions"].as_array().unwrap();
    for a in ["alloc", "free_requested", "free_completed", "segment_alloc"] {
        assert!(
            actions.contains(&serde_json::json!(a)),
            "{a} missing from {actions:?}"
        );
    }
}

#[test]
fn pickle_every_truncation_of_an_exported_snapshot_is_an_error() {
    let mut snap = replayed_snapshot();
    snap.device_traces[0].truncate(40);
    let bytes = dump_snapshot(&snap);
    assert!(bytes.len() > 1500, "{} bytes", bytes.len());
    for n in 0..bytes.len() {
        match load_snapshot(&bytes[..n]) {
            Err(PickleError::Truncated { offset, len, .. }) => {
                assert!(offset < n && len == n, "{n}")
            }
            Err(PickleError::MissingStop { offset }) => assert_eq!(offset, n),
            other => panic!("truncation to {n} bytes gave {other:?}"),
        }
    }
}

#[test]
fn pickle_truncations_of_pytorchs_pickle_name_the_opcode() {
    let data = real_pickle();
    let lens = (0..600)
        .chain(data.len() - 4000..data.len())
        .chain((600..data.len()).step_by(977));
    for n in lens {
        let err = from_slice(&data[..n]).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("pickle truncated"), "{n}: {msg}");
        if n > 2 {
            // Past PROTO, every message names an opcode and a byte offset.
            assert!(
                msg.contains(" at byte ") || msg.contains("without a STOP"),
                "{n}: {msg}"
            );
        }
    }
    assert_eq!(
        from_slice(&data[..100]).unwrap_err(),
        PickleError::Truncated {
            offset: 2,
            opcode: "FRAME",
            needed: 65542 - (100 - 11),
            len: 100
        }
    );
}

/// `snapshot` as a pickle value whose first trace entry of device 0 has `action`.
fn with_first_action(snapshot: &MemorySnapshot, action: &str) -> Vec<u8> {
    let mut v = snapshot_to_value(snapshot);
    let PickleValue::Dict(top) = &mut v else {
        panic!("a snapshot is a dict")
    };
    let (_, traces) = top
        .iter_mut()
        .find(|(k, _)| k.as_str() == Some("device_traces"))
        .expect("device_traces");
    let PickleValue::List(devices) = traces else {
        panic!("a list of devices")
    };
    let PickleValue::List(entries) = &mut devices[0] else {
        panic!("a list of entries")
    };
    let PickleValue::Dict(first) = &mut entries[0] else {
        panic!("an entry is a dict")
    };
    let (_, a) = first
        .iter_mut()
        .find(|(k, _)| k.as_str() == Some("action"))
        .expect("action");
    *a = PickleValue::str(action);
    to_vec(&v)
}

/// PyTorch's `user_defined` entries mark a moment and are skipped; an action that is none of
/// PyTorch's is refused, naming the entry, instead of being dropped silently.
#[test]
fn pickle_unknown_trace_actions_are_refused_but_user_defined_is_skipped() {
    let s = replayed_snapshot();
    let entries = s.device_traces[0].len();
    let skipped = load_snapshot(&with_first_action(&s, "user_defined")).unwrap();
    assert_eq!(skipped.device_traces[0].len(), entries - 1);
    assert_eq!(skipped.device_traces[0][..], s.device_traces[0][1..]);
    let err = load_snapshot(&with_first_action(&s, "bogus"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("field `device_traces[0][0].action`: expected one of PyTorch's trace actions (alloc, free_requested,"),
        "{err}"
    );
    assert!(
        err.ends_with("user_defined and annotate are skipped), found str \"bogus\""),
        "{err}"
    );
}

#[test]
fn berth_snapshot_files_say_whether_history_was_recorded() {
    // Issue 32, item 4: an empty trace is "nothing happened" only if history was recorded.
    use berth_alloc::pickle::{
        dump_snapshot, dump_snapshot_with_history, load_snapshot, load_snapshot_with_history,
        HISTORY_RECORDED_KEY,
    };
    let snap = berth_alloc::MemorySnapshot {
        device_traces: vec![vec![]],
        ..Default::default()
    };
    for recorded in [true, false] {
        let bytes = dump_snapshot_with_history(&snap, recorded);
        let (back, flag) = load_snapshot_with_history(&bytes).unwrap();
        assert_eq!(flag, Some(recorded));
        assert_eq!(back, snap);
        // The plain reader (and PyTorch's memory_viz) reads the same dict, the key ignored.
        assert_eq!(load_snapshot(&bytes).unwrap(), snap);
        let root = berth_alloc::pickle::from_slice(&bytes).unwrap();
        assert_eq!(
            root.get(HISTORY_RECORDED_KEY),
            Some(&berth_alloc::pickle::PickleValue::Bool(recorded))
        );
    }
    // A file that does not say (PyTorch's, or dump_snapshot): None.
    let (_, flag) = load_snapshot_with_history(&dump_snapshot(&snap)).unwrap();
    assert_eq!(flag, None);
}
