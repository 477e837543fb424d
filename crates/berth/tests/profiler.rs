//! Tests of `berth::profiler` that read the exported Chrome trace back (issue 16).
//!
//! Their own test binary, not a module of `tests.rs`: the profiler sees every thread of the
//! process and the host counters are process-wide, so a test running beside these in the
//! same process would add ops and allocations to their profiles. The tests here run one at a
//! time (a lock); the GPU ones are `#[ignore]`d and open at the gate, as everywhere.

use berth::profiler::{self, CopyKind, DeviceTimer, MemoryAction, ProfilerActivity, SortBy};
use berth::storage::host_memory_allocated;
use berth::{DType, Device, Tensor};
use serde_json::Value;
use std::sync::{Mutex, MutexGuard};

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The trace, written to a file and read back with `serde_json`.
fn exported(p: &profiler::Profile, name: &str) -> Value {
    let path =
        std::env::temp_dir().join(format!("berth-profiler-{}-{name}.json", std::process::id()));
    p.export_chrome_trace(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    serde_json::from_str(&text).unwrap()
}

fn events(trace: &Value) -> &[Value] {
    trace["traceEvents"].as_array().unwrap()
}

fn with_cat<'a>(trace: &'a Value, cat: &str) -> Vec<&'a Value> {
    events(trace).iter().filter(|e| e["cat"] == cat).collect()
}

fn shapes(v: &Value) -> Vec<Vec<u64>> {
    serde_json::from_value(v.clone()).unwrap()
}

/// Every op of a small CPU program is in the trace exactly once, with its name, device,
/// shapes, dtype and bytes.
#[test]
fn every_op_of_a_cpu_program_is_in_the_trace_once() {
    let _g = serial();
    let p = profiler::profile()
        .activities(&[ProfilerActivity::Cpu])
        .record_shapes(true)
        .start()
        .unwrap();
    let a = Tensor::ones(&[2, 3], DType::F32, Device::Cpu).unwrap();
    let b = Tensor::ones(&[3, 4], DType::F32, Device::Cpu).unwrap();
    let c = a.matmul(&b).unwrap();
    let d = c.add(&c).unwrap();
    let e = d.relu().unwrap();
    let t = e.transpose(0, 1).unwrap().contiguous().unwrap();
    let s = t.sum().unwrap();
    let profile = p.stop().unwrap();
    assert_eq!(s.item::<f32>().unwrap(), 48.0);
    let trace = exported(&profile, "ops");
    let ops = with_cat(&trace, "cpu_op");
    let names: Vec<&str> = ops.iter().map(|o| o["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["ones", "ones", "matmul", "add", "relu", "clone", "sum"],
        "each op once, in order"
    );
    let matmul = ops[2];
    assert_eq!(matmul["ph"], "X");
    assert_eq!(matmul["pid"], 0);
    assert_eq!(matmul["args"]["device"], "cpu");
    assert_eq!(matmul["args"]["dtype"], DType::F32.to_string());
    assert_eq!(
        shapes(&matmul["args"]["input_shapes"]),
        [vec![2, 3], vec![3, 4]]
    );
    assert_eq!(matmul["args"]["output_shape"], serde_json::json!([2, 4]));
    assert_eq!(matmul["args"]["bytes_read"], (6 + 12) * 4);
    assert_eq!(matmul["args"]["bytes_written"], 8 * 4);
    let add = ops[3];
    assert_eq!(
        shapes(&add["args"]["input_shapes"]),
        [vec![2, 4], vec![2, 4]]
    );
    assert_eq!(add["args"]["bytes_written"], 32);
    let sum = ops[6];
    assert_eq!(
        sum["args"]["output_shape"],
        serde_json::json!([]),
        "a 0-dim output"
    );
    assert!(ops.iter().all(|o| o["dur"].as_f64().unwrap() >= 0.0));
    // No device work on the CPU: no stream tracks, no copies.
    assert!(with_cat(&trace, "kernel").is_empty());
    assert!(with_cat(&trace, "copy").is_empty());
    // The typed records agree with the trace.
    assert_eq!(profile.records().ops.len(), 7);
    assert!(profile.records().copies.is_empty());
}

/// Without `record_shapes` the shapes are left out (bytes are still there).
#[test]
fn shapes_only_with_record_shapes() {
    let _g = serial();
    let p = profiler::profile().start().unwrap();
    let a = Tensor::ones(&[5], DType::F32, Device::Cpu).unwrap();
    let _b = a.mul(&a).unwrap();
    let profile = p.stop().unwrap();
    let ops = &profile.records().ops;
    assert_eq!(ops.len(), 2);
    assert!(ops[1].input_shapes.is_empty() && ops[1].output_shape.is_empty());
    assert_eq!(ops[1].bytes_written, 20);
}

/// The counter tracks equal the allocator's own statistics (here the host's,
/// `host_memory_allocated`) at each point: read after every statement of the program, each
/// of which allocates or frees exactly one storage.
#[test]
fn memory_counters_equal_the_allocator_stats_at_each_point() {
    let _g = serial();
    let p = profiler::profile()
        .activities(&[ProfilerActivity::Cpu])
        .profile_memory(true)
        .start()
        .unwrap();
    let mut seen = vec![host_memory_allocated() as u64];
    let mut note = || seen.push(host_memory_allocated() as u64);
    let a = Tensor::ones(&[16, 16], DType::F32, Device::Cpu).unwrap();
    note();
    let b = a.matmul(&a).unwrap();
    note();
    let c = b.add(&a).unwrap();
    note();
    drop(b);
    note();
    let d = c.to_dtype(DType::F64).unwrap();
    note();
    drop(c);
    note();
    drop(d);
    note();
    drop(a);
    note();
    let profile = p.stop().unwrap();
    let trace = exported(&profile, "memory");
    let counter = |name: &str| -> Vec<u64> {
        events(&trace)
            .iter()
            .filter(|e| e["ph"] == "C" && e["pid"] == 0 && e["name"] == name)
            .map(|e| e["args"]["bytes"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(
        counter("allocated_bytes"),
        seen,
        "one sample per event, equal to the stats"
    );
    assert_eq!(
        counter("reserved_bytes"),
        seen,
        "the host reserves what it allocates"
    );
    // Host events only: where an earlier test used a GPU, its device has a start sample too.
    let actions: Vec<&str> = with_cat(&trace, "memory")
        .iter()
        .filter(|e| e["args"]["device"] == "cpu")
        .map(|e| e["args"]["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        ["start", "alloc", "alloc", "alloc", "free", "alloc", "free", "free", "free"],
        "the start sample, then every alloc and free"
    );
    let m: Vec<_> = profile
        .records()
        .memory
        .iter()
        .filter(|m| m.device == Device::Cpu)
        .collect();
    assert_eq!(m[1].action, MemoryAction::Alloc);
    assert_eq!(m[1].bytes, 16 * 16 * 4);
    assert_eq!(m[5].bytes, 16 * 16 * 8, "the f64 copy");
}

/// `record_function` ranges are spans of their own category; `key_averages` counts calls and
/// takes the ops inside a range out of its self time.
#[test]
fn record_function_ranges_and_key_averages() {
    let _g = serial();
    let p = profiler::profile().start().unwrap();
    let a = Tensor::ones(&[64, 64], DType::F32, Device::Cpu).unwrap();
    for _ in 0..3 {
        let _r = profiler::record_function("block");
        let b = a.matmul(&a).unwrap();
        let _c = b.relu().unwrap();
    }
    let profile = p.stop().unwrap();
    let trace = exported(&profile, "ranges");
    let ranges = with_cat(&trace, "user_annotation");
    assert_eq!(ranges.len(), 3);
    assert!(ranges.iter().all(|r| r["name"] == "block"));
    let k = profile.key_averages();
    let block = k.get("block").unwrap();
    let matmul = k.get("matmul").unwrap();
    let relu = k.get("relu").unwrap();
    assert_eq!((block.calls, matmul.calls, relu.calls), (3, 3, 3));
    assert_eq!(k.get("ones").unwrap().calls, 1);
    assert_eq!(
        matmul.self_cpu_ns, matmul.cpu_total_ns,
        "an op with nothing inside"
    );
    assert_eq!(
        block.self_cpu_ns,
        block.cpu_total_ns - matmul.cpu_total_ns - relu.cpu_total_ns,
        "the range's self time leaves out its ops"
    );
    assert_eq!(
        matmul.bytes,
        3 * 3 * 64 * 64 * 4,
        "two inputs read, one output written"
    );
    let table = k.table(SortBy::CpuTotal, 10);
    for head in [
        "Name",
        "Self CPU",
        "CPU total",
        "Device total",
        "# of Calls",
        "Bytes",
    ] {
        assert!(table.contains(head), "{table}");
    }
    assert!(
        table.contains("matmul") && table.contains("block"),
        "{table}"
    );
    let limited = k.table(SortBy::Calls, 1);
    assert_eq!(
        limited
            .lines()
            .filter(|l| l.starts_with("block")
                || l.starts_with("matmul")
                || l.starts_with("relu")
                || l.starts_with("ones"))
            .count(),
        1,
        "{limited}"
    );
}

/// Each host thread gets its own track, named.
#[test]
fn each_host_thread_has_a_track() {
    let _g = serial();
    let p = profiler::profile().start().unwrap();
    let a = Tensor::ones(&[4], DType::F32, Device::Cpu).unwrap();
    std::thread::Builder::new()
        .name("worker-7".into())
        .spawn(|| {
            let x = Tensor::zeros(&[4], DType::F32, Device::Cpu).unwrap();
            let _ = x.exp().unwrap();
        })
        .unwrap()
        .join()
        .unwrap();
    let profile = p.stop().unwrap();
    drop(a);
    let trace = exported(&profile, "threads");
    let ops = with_cat(&trace, "cpu_op");
    let tid = |name: &str| -> Vec<u64> {
        ops.iter()
            .filter(|o| o["name"] == name)
            .map(|o| o["tid"].as_u64().unwrap())
            .collect()
    };
    let (main, worker) = (tid("ones"), tid("exp"));
    assert!(
        tid("zeros").is_empty(),
        "zeros on the CPU is zero-filled memory, no kernel"
    );
    assert_ne!(main, worker);
    let names: Vec<(u64, &str)> = events(&trace)
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name" && e["pid"] == 0)
        .map(|e| {
            (
                e["tid"].as_u64().unwrap(),
                e["args"]["name"].as_str().unwrap(),
            )
        })
        .collect();
    assert!(names.contains(&(worker[0], "worker-7")), "{names:?}");
}

/// One profiler at a time; nothing is recorded while none is active, and dropping one
/// without `stop` discards its records.
#[test]
fn one_profiler_at_a_time_and_nothing_when_off() {
    let _g = serial();
    let a = Tensor::ones(&[4], DType::F32, Device::Cpu).unwrap();
    let _ = a.neg().unwrap();
    let p = profiler::profile().start().unwrap();
    assert!(profiler::is_active());
    let err = profiler::profile().start().unwrap_err();
    assert!(
        err.to_string().contains("another profiler is active"),
        "{err}"
    );
    let profile = p.stop().unwrap();
    assert!(!profiler::is_active());
    assert!(
        profile.records().ops.is_empty(),
        "ops before the start are not recorded"
    );
    let _ = a.neg().unwrap();
    let dropped = profiler::profile().start().unwrap();
    let _ = a.neg().unwrap();
    drop(dropped);
    let p = profiler::profile().start().unwrap();
    let profile = p.stop().unwrap();
    assert!(
        profile.records().ops.is_empty(),
        "a dropped profile's records are gone"
    );
}

/// `prepare` starts nothing and records nothing; only an explicit CUPTI timer can refuse
/// (with the reason), and without CUDA activity or with CUDA events it does nothing.
#[test]
fn prepare_records_nothing_and_only_an_explicit_cupti_refuses() {
    let _g = serial();
    let a = Tensor::ones(&[4], DType::F32, Device::Cpu).unwrap();
    for b in [
        profiler::profile(),
        profiler::profile().device_timer(DeviceTimer::CudaEvents),
        profiler::profile()
            .activities(&[ProfilerActivity::Cpu])
            .device_timer(DeviceTimer::Cupti),
    ] {
        b.prepare().unwrap();
        assert!(!profiler::is_active());
    }
    match profiler::profile()
        .device_timer(DeviceTimer::Cupti)
        .prepare()
    {
        Ok(()) => {}
        Err(e) => assert!(
            e.to_string().contains("DeviceTimer::Auto to fall back"),
            "the error says what to do instead: {e}"
        ),
    }
    // Prepared, nothing records: an op now runs unprofiled and a profile can still start.
    let _ = a.neg().unwrap();
    assert!(!profiler::is_active());
    let p = profiler::profile()
        .activities(&[ProfilerActivity::Cpu])
        .start()
        .unwrap();
    let _ = a.neg().unwrap();
    let profile = p.stop().unwrap();
    assert_eq!(
        profile.records().ops.len(),
        1,
        "the op after the start is recorded"
    );
}

/// A subscriber of the user's own (here a minimal one, on this thread) sees each op as a
/// `tracing` span of target `berth::profiler` named `op`, with the op's name as a field.
#[test]
fn a_users_tracing_subscriber_sees_the_ops() {
    use std::sync::Arc;
    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Metadata, Subscriber};

    #[derive(Default)]
    struct Seen(Mutex<Vec<(String, String)>>);
    struct Names<'a>(&'a mut String);
    impl Visit for Names<'_> {
        fn record_str(&mut self, f: &Field, v: &str) {
            if f.name() == "name" {
                self.0.push_str(v);
            }
        }
        fn record_debug(&mut self, _: &Field, _: &dyn std::fmt::Debug) {}
    }
    struct Collect(Arc<Seen>);
    impl Subscriber for Collect {
        fn enabled(&self, m: &Metadata<'_>) -> bool {
            m.target() == "berth::profiler"
        }
        fn new_span(&self, a: &Attributes<'_>) -> Id {
            let mut name = String::new();
            a.record(&mut Names(&mut name));
            let mut seen = self.0 .0.lock().unwrap();
            seen.push((a.metadata().name().to_owned(), name));
            Id::from_u64(seen.len() as u64)
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, _: &Event<'_>) {}
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    let _g = serial();
    let seen = Arc::new(Seen::default());
    let p = profiler::profile().start().unwrap();
    tracing::subscriber::with_default(Collect(seen.clone()), || {
        let a = Tensor::ones(&[3], DType::F32, Device::Cpu).unwrap();
        let _b = a.exp().unwrap();
    });
    let profile = p.stop().unwrap();
    let spans = seen.0.lock().unwrap().clone();
    let want: Vec<(String, String)> = [("op", "ones"), ("op", "exp")]
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(spans, want);
    assert_eq!(
        profile.records().ops.len(),
        2,
        "and the profiler has them too"
    );
}

/// The trace is the JSON object format with `traceEvents`, and every event has the fields
/// the viewers require.
#[test]
fn trace_events_have_the_fields_viewers_need() {
    let _g = serial();
    let p = profiler::profile().profile_memory(true).start().unwrap();
    let a = Tensor::ones(&[8], DType::F32, Device::Cpu).unwrap();
    let _b = a.sqrt().unwrap();
    let profile = p.stop().unwrap();
    let trace = exported(&profile, "fields");
    for e in events(&trace) {
        let ph = e["ph"].as_str().unwrap();
        assert!(e["name"].is_string() && e["pid"].is_u64(), "{e}");
        match ph {
            "X" => assert!(
                e["ts"].is_f64() && e["dur"].is_f64() && e["tid"].is_u64(),
                "{e}"
            ),
            "i" => assert!(e["ts"].is_f64() && e["s"] == "t", "{e}"),
            "C" => assert!(e["ts"].is_f64() && e["args"].is_object(), "{e}"),
            "M" => assert!(e["args"]["name"].is_string(), "{e}"),
            other => panic!("unexpected phase {other}: {e}"),
        }
    }
}

/// On the GPU: copies with bytes, GB/s, pinned or staged and their stream; the batch copy on
/// a side stream and the kernels on the compute stream on separate stream tracks, with
/// device time from events; the device's counters equal `memory_allocated` /
/// `memory_reserved` after each event; the host wait of `item()` with its cause.
///
/// With [`DeviceTimer::Auto`] the device time comes from CUPTI where it loads (the trace's
/// `otherData` says which timer ran); the same checks hold with CUDA events.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn cuda_profile_has_stream_tracks_copies_device_time_and_counters() {
    if !berth::cuda::testing::require_gpu(
        "cuda_profile_has_stream_tracks_copies_device_time_and_counters",
    ) {
        return;
    }
    cuda_profile_with(DeviceTimer::Auto);
}

/// [`cuda_profile_has_stream_tracks_copies_device_time_and_counters`] timed with CUDA events.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn cuda_profile_timed_with_events_has_the_same_tracks_and_spans() {
    if !berth::cuda::testing::require_gpu(
        "cuda_profile_timed_with_events_has_the_same_tracks_and_spans",
    ) {
        return;
    }
    cuda_profile_with(DeviceTimer::CudaEvents);
}

fn cuda_profile_with(timer: DeviceTimer) {
    let _g = serial();
    let dev = Device::Cuda(0);
    let side = berth::cuda::Stream::new(0, 0).unwrap();
    let host = Tensor::ones(&[256, 256], DType::F32, Device::Cpu)
        .unwrap()
        .pin_memory()
        .unwrap();
    let pageable = Tensor::ones(&[1024], DType::F32, Device::Cpu).unwrap();
    let w = Tensor::ones(&[256, 256], DType::F32, dev).unwrap();
    berth::cuda::synchronize(0).unwrap();
    let builder = profiler::profile()
        .activities(&[ProfilerActivity::Cpu, ProfilerActivity::Cuda])
        .record_shapes(true)
        .profile_memory(true)
        .device_timer(timer);
    // As `berth train --profile` does: CUPTI attached before the start, nothing recorded yet.
    builder.prepare().unwrap();
    assert!(!profiler::is_active(), "prepare records nothing");
    let p = builder.start().unwrap();
    let mut seen = Vec::new();
    let mut note = || {
        seen.push((
            berth::cuda::memory_allocated(0usize).unwrap() as u64,
            berth::cuda::memory_reserved(0usize).unwrap() as u64,
        ))
    };
    let x = berth::cuda::transfer::to_device_on(&host, dev, &side).unwrap();
    note();
    let ev = side.record_event().unwrap();
    berth::cuda::current_stream(0)
        .unwrap()
        .wait_event(&ev)
        .unwrap();
    let y = x.matmul(&w).unwrap();
    note();
    let z = y.relu().unwrap();
    note();
    let small = pageable.to(dev, DType::F32, false, false).unwrap();
    note();
    let total = z.sum().unwrap();
    note();
    let v = {
        let _r = profiler::record_function("read");
        total.item::<f32>().unwrap()
    };
    drop((x, y, small));
    note();
    let profile = p.stop().unwrap();
    assert_eq!(v, 256.0 * 256.0 * 256.0);
    let trace = exported(&profile, "cuda");
    let used = profile.device_timer().unwrap();
    match (timer, profile.device_timer_fallback()) {
        (DeviceTimer::CudaEvents, _) => assert_eq!(used, DeviceTimer::CudaEvents),
        // CUPTI ships with the toolkit (and PyTorch's wheels); a machine without it falls
        // back, with CUPTI's reason in the trace.
        (_, Some(why)) => {
            eprintln!("CUPTI not used: {why}");
            assert_eq!(used, DeviceTimer::CudaEvents);
        }
        (_, None) => assert_eq!(used, DeviceTimer::Cupti),
    }
    assert_eq!(trace["otherData"]["device_timer"], used.name());
    // Copies: the pinned batch on the side stream, the staged pageable one and item()'s
    // copy back on the current stream.
    let r = profile.records();
    assert_eq!(r.copies.len(), 3, "{:?}", r.copies);
    let (batch, staged, back) = (&r.copies[0], &r.copies[1], &r.copies[2]);
    assert_eq!(
        (batch.kind, batch.pinned, batch.bytes, batch.blocking),
        (CopyKind::HostToDevice, true, 256 * 256 * 4, false)
    );
    assert_eq!(batch.stream, side.as_raw());
    assert_eq!(
        (staged.kind, staged.pinned, staged.bytes, staged.blocking),
        (CopyKind::HostToDevice, false, 4096, true)
    );
    assert_eq!(
        (back.kind, back.bytes, back.blocking),
        (CopyKind::DeviceToHost, 4, true)
    );
    assert!(batch.gbps().unwrap() > 0.0);
    assert!(r.copies.iter().all(|c| c.device_span.is_some()));
    // Separate stream tracks: the batch copy on one, the kernels on the other.
    let memcpy = with_cat(&trace, "gpu_memcpy");
    let kernels = with_cat(&trace, "kernel");
    assert_eq!(memcpy.len(), 3);
    for name in ["matmul", "relu", "sum"] {
        assert_eq!(
            kernels.iter().filter(|k| k["name"] == name).count(),
            1,
            "{name}"
        );
    }
    assert!(kernels
        .iter()
        .all(|k| k["pid"] == 1 && k["dur"].as_f64().unwrap() > 0.0));
    let compute_tid = &kernels[0]["tid"];
    assert!(kernels.iter().all(|k| &k["tid"] == compute_tid));
    assert_ne!(
        &memcpy[0]["tid"], compute_tid,
        "the side stream has its own track"
    );
    assert_eq!(
        &memcpy[1]["tid"], compute_tid,
        "the staged copy ran on the current stream"
    );
    let stream_tracks = events(&trace)
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name" && e["pid"] == 1)
        .count();
    assert_eq!(stream_tracks, 2);
    // The matmul waited for the batch copy.
    let matmul = kernels.iter().find(|k| k["name"] == "matmul").unwrap();
    let copy_end = memcpy[0]["ts"].as_f64().unwrap() + memcpy[0]["dur"].as_f64().unwrap();
    assert!(copy_end <= matmul["ts"].as_f64().unwrap() + 1.0);
    // Counters of cuda:0 equal the allocator's stats after each event, and the last one
    // equals memory_allocated / memory_reserved read by this test.
    let counter = |name: &str| -> Vec<u64> {
        events(&trace)
            .iter()
            .filter(|e| e["ph"] == "C" && e["pid"] == 1 && e["name"] == name)
            .map(|e| e["args"]["bytes"].as_u64().unwrap())
            .collect()
    };
    let on_dev: Vec<_> = r.memory.iter().filter(|m| m.device == dev).collect();
    let col =
        |f: fn(&&berth::profiler::MemoryRecord) -> u64| on_dev.iter().map(f).collect::<Vec<_>>();
    assert_eq!(counter("allocated_bytes"), col(|m| m.allocated_bytes));
    assert_eq!(counter("reserved_bytes"), col(|m| m.reserved_bytes));
    let last = on_dev.last().unwrap();
    assert_eq!(
        (last.allocated_bytes, last.reserved_bytes),
        *seen.last().unwrap()
    );
    // Each alloc or free moves allocated bytes by at least its size (the allocator rounds).
    let blocks: Vec<_> = on_dev
        .iter()
        .filter(|m| matches!(m.action, MemoryAction::Alloc | MemoryAction::Free))
        .collect();
    for w in blocks.windows(2) {
        let delta = w[1].allocated_bytes as i64 - w[0].allocated_bytes as i64;
        assert!(
            delta.unsigned_abs() >= w[1].bytes,
            "{:?} after {:?}",
            w[1],
            w[0]
        );
        assert_eq!(delta > 0, w[1].action == MemoryAction::Alloc, "{:?}", w[1]);
    }
    assert_eq!(
        blocks
            .iter()
            .filter(|m| m.action == MemoryAction::Free)
            .count(),
        3,
        "x, y and the staged copy freed"
    );
    // The host waits: the blocking pageable copy, and item()'s copy to the host (op `to`)
    // in the range it ran in.
    let points: Vec<_> = r.syncs.iter().filter_map(|s| s.point).collect();
    assert_eq!(points, ["copy_htod", "copy_dtoh"], "{:?}", r.syncs);
    let read = r
        .syncs
        .iter()
        .find(|s| s.point == Some("copy_dtoh"))
        .unwrap();
    assert_eq!(read.cause.as_deref(), Some("to"));
    assert_eq!(read.stack, ["read", "to"]);
    assert!(with_cat(&trace, "sync")
        .iter()
        .any(|s| s["name"] == "sync: copy_dtoh"));
}

/// The fused SGD update is one op for all parameters (not four to five per parameter), and
/// `add_scaled_` on contiguous f32 is one `add`.
#[test]
fn a_fused_sgd_step_is_one_op() {
    let _g = serial();
    let z = |shape: &[usize]| Tensor::zeros(shape, DType::F32, Device::Cpu).unwrap();
    let shapes: [&[usize]; 4] = [&[8, 5], &[8], &[3, 8], &[3]];
    let (ps, gs, vs): (Vec<Tensor>, Vec<Tensor>, Vec<Tensor>) = (
        shapes.iter().map(|s| z(s)).collect(),
        shapes.iter().map(|s| z(s)).collect(),
        shapes.iter().map(|s| z(s)).collect(),
    );
    let p = profiler::profile()
        .activities(&[ProfilerActivity::Cpu])
        .record_shapes(true)
        .start()
        .unwrap();
    let (pr, gr, vr): (Vec<&Tensor>, Vec<&Tensor>, Vec<&Tensor>) = (
        ps.iter().collect(),
        gs.iter().collect(),
        vs.iter().collect(),
    );
    berth::optim::sgd_momentum_(&pr, &gr, &vr, 0.1, 0.9, false).unwrap();
    ps[0].add_scaled_(&gs[0], 0.5).unwrap();
    let profile = p.stop().unwrap();
    let names: Vec<&str> = profile.records().ops.iter().map(|o| o.name).collect();
    assert_eq!(names, ["fused_sgd", "add"]);
    let sgd = &profile.records().ops[0];
    let numel: u64 = shapes
        .iter()
        .map(|s| s.iter().product::<usize>() as u64)
        .sum();
    assert_eq!(
        sgd.bytes_read,
        3 * numel * 4,
        "p, g and v of every parameter"
    );
    assert_eq!(
        sgd.bytes_written,
        2 * numel * 4,
        "p and v of every parameter"
    );
    assert_eq!(sgd.input_shapes.len(), 12);
}
