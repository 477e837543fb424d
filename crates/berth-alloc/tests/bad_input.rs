//! Bad input, tried as a new user would: typed errors, never corruption.

use berth_alloc::backend::sim::SimBackend;
use berth_alloc::caching::CachingAllocator;
use berth_alloc::trace::{parse_trace, read_trace, TraceError};
use berth_alloc::{
    AllocError, AllocatorConfig, ConfigError, DeviceAllocator, DevicePtr, PagedBestFit, StreamId,
};

use crate::util::{trace_path, MIB};

const S0: StreamId = StreamId::DEFAULT;

fn fresh() -> CachingAllocator<SimBackend> {
    CachingAllocator::new(SimBackend::new(1 << 34))
}

#[test]
fn double_free_is_a_typed_error_and_changes_nothing() {
    let alloc = fresh();
    let p = alloc.raw_alloc(1000, S0).unwrap();
    let q = alloc.raw_alloc(1000, S0).unwrap();
    alloc.raw_delete(p).unwrap();
    let before = alloc.stats();
    assert_eq!(alloc.raw_delete(p), Err(AllocError::DoubleFree { ptr: p }));
    assert_eq!(alloc.stats(), before);
    alloc.validate().unwrap();
    alloc.raw_delete(q).unwrap();
    assert_eq!(alloc.stats().memory_allocated(), 0);
}

#[test]
fn foreign_and_interior_pointers_are_invalid() {
    let alloc = fresh();
    let p = alloc.raw_alloc(4096, S0).unwrap();
    for bad in [DevicePtr(0x1234_5600), DevicePtr(p.0 + 512)] {
        let e = alloc.raw_delete(bad).unwrap_err();
        assert_eq!(e, AllocError::InvalidPointer { ptr: bad });
        assert!(e.to_string().contains("invalid device pointer"), "{e}");
    }
    assert!(matches!(
        alloc.raw_record_stream(DevicePtr(0x1234_5600), StreamId(3)),
        Err(AllocError::InvalidPointer { .. })
    ));
    alloc.raw_delete(p).unwrap();
    alloc.raw_delete(DevicePtr::NULL).unwrap();
    alloc.validate().unwrap();
}

#[test]
fn drop_time_failure_is_sticky_and_read_once() {
    let alloc = fresh();
    let a = alloc.allocate(100, S0).unwrap();
    let raw = a.ptr();
    alloc.raw_delete(raw).unwrap(); // freed behind the Allocation's back
    drop(a); // its free now fails: recorded, not panicking
    assert_eq!(alloc.check_err(), Err(AllocError::DoubleFree { ptr: raw }));
    assert_eq!(alloc.check_err(), Ok(()));
}

#[test]
fn zero_byte_allocation_behaves_as_pytorch() {
    let alloc = fresh();
    let z = alloc.allocate(0, S0).unwrap();
    assert!(z.ptr().is_null());
    assert_eq!(z.size(), 0);
    let s = alloc.stats();
    assert_eq!(
        (
            s.memory_allocated(),
            s.memory_reserved(),
            s.allocation.all().allocated
        ),
        (0, 0, 0)
    );
    assert_eq!(alloc.raw_alloc(0, S0).unwrap(), DevicePtr::NULL);
    drop(z);
    assert_eq!(alloc.check_err(), Ok(()));
}

#[test]
fn absurd_request_is_too_large() {
    let alloc = fresh();
    let e = alloc.allocate(usize::MAX, S0).unwrap_err();
    assert!(matches!(e, AllocError::TooLarge { .. }), "{e:?}");
    assert!(e.to_string().contains("more than 1EB"), "{e}");
}

#[test]
fn oom_message_carries_pytorchs_content() {
    let alloc = CachingAllocator::new(SimBackend::new(100 * MIB));
    let keep = alloc.allocate(5 * MIB as usize, S0).unwrap();
    let e = alloc.allocate(90 * MIB as usize, S0).unwrap_err();
    match &e {
        AllocError::OutOfMemory {
            requested,
            device_total,
            allocated,
            reserved_unallocated,
            allowed,
            ..
        } => {
            assert_eq!(*requested, 90 * MIB);
            assert_eq!(*device_total, 100 * MIB);
            assert_eq!(*allocated, 5 * MIB);
            assert_eq!(*reserved_unallocated, 15 * MIB);
            assert_eq!(*allowed, None);
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    let msg = e.to_string();
    for part in [
        "CUDA out of memory. Tried to allocate 90.00 MiB.",
        "GPU 0 has a total capacity of 100.00 MiB of which 80.00 MiB is free.",
        "5.00 MiB is allocated by PyTorch, and 15.00 MiB is reserved by PyTorch but unallocated.",
        "expandable_segments:True",
    ] {
        assert!(msg.contains(part), "missing {part:?} in {msg}");
    }
    // Usable after OOM; the retry sequence ran once.
    assert_eq!(alloc.stats().num_alloc_retries, 1);
    drop(keep);
    let ok = alloc.allocate(90 * MIB as usize, S0).unwrap();
    assert_eq!(ok.size(), 90 * MIB as usize);
    // With expandable segments on, the hint names max_split_size_mb instead.
    let cfg = AllocatorConfig::parse("expandable_segments:True").unwrap();
    let exp = CachingAllocator::with_config(SimBackend::new(100 * MIB), cfg).unwrap();
    let msg = exp
        .allocate(200 * MIB as usize, S0)
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("max_split_size_mb") && !msg.contains("expandable_segments:True"),
        "{msg}"
    );
}

/// `paged` has neither `max_split_size_mb` nor expandable segments (it refuses both options), so
/// its out-of-memory message must not suggest them.
#[test]
fn paged_out_of_memory_suggests_nothing_paged_refuses() {
    let paged = PagedBestFit::new(SimBackend::new(100 * MIB)).unwrap();
    let e = paged.allocate(200 * MIB as usize, S0).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    let msg = e.to_string();
    assert!(
        msg.starts_with("CUDA out of memory. Tried to allocate"),
        "{msg}"
    );
    assert!(
        !msg.contains("max_split_size_mb") && !msg.contains("expandable_segments"),
        "{msg}"
    );
    assert!(msg.contains(berth_alloc::OomHint::Paged.text()), "{msg}");
}

/// An expandable segment that cannot grow to a request larger than the device unmaps the pages
/// it mapped for it, so nothing of the device stays held after the refusal (on the H200 a
/// 4 TiB request once left the whole card held, and the next kernel launch failed with "CUDA
/// error: out of memory").
#[test]
fn expandable_out_of_memory_gives_the_pages_back() {
    let cfg = AllocatorConfig::parse("expandable_segments:True").unwrap();
    let exp = CachingAllocator::with_config(SimBackend::new(100 * MIB), cfg).unwrap();
    let e = exp.allocate(400 * MIB as usize, S0).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    let sim = exp.backend();
    assert!(sim.counts().map > 1, "pages were mapped before the refusal");
    assert_eq!((sim.live_mappings(), sim.used_bytes()), (0, 0));
    let ok = exp.allocate(50 * MIB as usize, S0).unwrap();
    assert_eq!(ok.size(), 50 * MIB as usize);
}

#[test]
fn malformed_config_names_the_key() {
    let cases: [(&str, &str); 6] = [
        ("max_split_size_mb:abc", "max_split_size_mb"),
        ("max_split_size_mb:10", "max_split_size_mb"),
        ("expandable_segments:yes", "expandable_segments"),
        (
            "garbage_collection_threshold:1.5",
            "garbage_collection_threshold",
        ),
        ("roundup_power2_divisions:3", "roundup_power2_divisions"),
        ("max_spilt_size_mb:128", "max_spilt_size_mb"),
    ];
    for (conf, key) in cases {
        let e = AllocatorConfig::parse(conf).unwrap_err();
        assert!(e.to_string().contains(key), "{conf}: {e}");
    }
    assert!(matches!(
        AllocatorConfig::parse("expandable_segments:True,,max_split_size_mb"),
        Err(ConfigError::Syntax { .. })
    ));
}

#[test]
fn malformed_trace_names_the_position() {
    match parse_trace(b"{\"events\": [[\"alloc\", 1, 2, 0, 0],\n [\"alloc\", 1 2]]}") {
        Err(TraceError::Json { line, column, .. }) => assert_eq!((line, column), (2, 14)),
        other => panic!("expected a JSON error with a position, got {other:?}"),
    }
    match parse_trace(br#"{"events": [["alloc", 1, 2, 0, 0], ["allocate", 1, 2, 0, 0]]}"#) {
        Err(e @ TraceError::Row { index: 1, .. }) => {
            assert!(e.to_string().contains("allocate"), "{e}")
        }
        other => panic!("expected a row error, got {other:?}"),
    }
    match parse_trace(br#"{"events": [["alloc", -1, 2, 0, 0]]}"#) {
        Err(e @ TraceError::Row { index: 0, .. }) => assert!(e.to_string().contains("addr"), "{e}"),
        other => panic!("expected a row error, got {other:?}"),
    }
}

#[test]
fn truncated_trace_is_an_error_naming_the_position() {
    let Some(path) = trace_path("two_stream_pipeline") else {
        return;
    };
    let bytes = std::fs::read(path).unwrap();
    let e = parse_trace(&bytes[..bytes.len() / 2]).unwrap_err();
    assert!(
        matches!(e, TraceError::Gzip { decompressed, .. } if decompressed > 0),
        "{e:?}"
    );
    // Truncated JSON inside a valid gzip stream: a JSON error at the end of the text.
    let e = parse_trace(br#"{"events": [["alloc", 1, 2, 0, 0], ["free_completed", 1"#).unwrap_err();
    assert!(matches!(e, TraceError::Json { line: 1, .. }), "{e:?}");
}

#[test]
fn trace_without_events_says_so_without_naming_an_event() {
    let e = parse_trace(b"{}").unwrap_err();
    assert!(matches!(e, TraceError::NoEvents), "{e:?}");
    assert_eq!(
        e.to_string(),
        "the trace object has no \"events\" array; expected {\"events\": [[action, addr, size, stream, time_us], ...]}"
    );
}

#[test]
fn a_gz_name_over_other_bytes_is_not_gzip_data() {
    let dir = std::env::temp_dir().join(format!("berth-alloc-notgz-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("random.trace.json.gz");
    std::fs::write(&path, [0x5a, 0x13, 0xc7, 0x00, 0xff, 0x42]).unwrap();
    let e = read_trace(&path).unwrap_err();
    std::fs::remove_dir_all(&dir).ok();
    assert!(matches!(e, TraceError::NotGzip), "{e:?}");
    assert!(
        e.to_string()
            .starts_with("the file name ends in .gz but the content is not gzip data"),
        "{e}"
    );
}

#[test]
fn json_errors_state_the_position_once() {
    let e = parse_trace(b"@ not json").unwrap_err();
    assert_eq!(
        e.to_string(),
        "malformed trace JSON at line 1, column 1: expected value"
    );
}

/// `paged`: a pointer inside a live block is not the start of an allocation (as the other
/// policies say), and freeing a freed block is still a double free.
#[test]
fn paged_interior_pointer_is_invalid_not_a_double_free() {
    let alloc = PagedBestFit::new(SimBackend::new(1 << 30)).unwrap();
    let p = alloc.raw_alloc(4096, S0).unwrap();
    let inside = DevicePtr(p.0 + 512);
    let e = alloc.raw_delete(inside).unwrap_err();
    assert_eq!(e, AllocError::InvalidPointer { ptr: inside });
    assert!(
        e.to_string().contains("not the start of an allocation"),
        "{e}"
    );
    assert_eq!(
        alloc.stats().memory_allocated(),
        4096,
        "the block stays live"
    );
    alloc.raw_delete(p).unwrap();
    assert_eq!(alloc.raw_delete(p), Err(AllocError::DoubleFree { ptr: p }));
    assert_eq!(alloc.stats().memory_allocated(), 0);
}

/// `paged` under a memory fraction: a request whose pages alone exceed the cap is
/// `CapExceeded` ("raise it with `set_memory_fraction`"), not advice to free tensors; one that
/// only fails because of what is live stays `OutOfMemory`.
#[test]
fn paged_request_over_the_fraction_alone_is_cap_exceeded() {
    let alloc = PagedBestFit::new(SimBackend::new(1 << 30)).unwrap();
    alloc.set_memory_fraction(0.0).unwrap();
    let e = alloc.raw_alloc(10, S0).unwrap_err();
    assert!(matches!(e, AllocError::CapExceeded { cap: 0, .. }), "{e:?}");
    assert!(e.is_out_of_memory());
    assert!(
        e.to_string().contains("raise it with set_memory_fraction"),
        "{e}"
    );
    assert_eq!(alloc.stats().num_ooms, 1);
    alloc.set_memory_fraction(0.5).unwrap(); // 512 MiB
    let held = alloc.raw_alloc(400 * MIB as usize, S0).unwrap();
    let e = alloc.raw_alloc(200 * MIB as usize, S0).unwrap_err();
    assert!(matches!(e, AllocError::OutOfMemory { .. }), "{e:?}");
    assert_eq!(alloc.stats().num_ooms, 2);
    alloc.raw_delete(held).unwrap();
    drop(alloc.allocate(200 * MIB as usize, S0).unwrap());
}

/// Sizes in MiB whose bytes do not fit a u64 are refused, not saturated (PyTorch's `stoi`
/// throws past its range).
#[test]
fn config_sizes_past_u64_bytes_are_refused() {
    for key in ["max_split_size_mb", "max_non_split_rounding_mb"] {
        for v in [
            "17592186044416",
            "99999999999999999",
            "18446744073709551615",
        ] {
            let e = AllocatorConfig::parse(&format!("{key}:{v}")).unwrap_err();
            assert!(e.to_string().contains("2^44"), "{key}:{v}: {e}");
        }
        let c = AllocatorConfig::parse(&format!("{key}:17592186044415"));
        assert!(c.is_ok(), "{key}: the largest value is accepted: {c:?}");
    }
}
