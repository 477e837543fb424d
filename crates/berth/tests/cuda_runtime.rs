//! The CUDA runtime on a real GPU: discovery, contexts, streams, events, the device and pinned
//! allocators, transfers, sync points. Every test starts at the one GPU gate
//! (`berth::cuda::testing::require_gpu`): it skips with a message on a machine without a GPU,
//! and fails there when `BERTH_REQUIRE_GPU=1`. Tests of known PyTorch surprises have the
//! public bug report above them; the SIM parts run everywhere.

#![cfg(feature = "cuda")]

use berth::alloc::{caching::CachingAllocator, AllocatorConfig, DeviceAllocator, MemoryBackend};
use berth::cuda::{self, testing, CudaBackend, CudaError, Event, Stream};
use berth::{DType, Device, Tensor};
use std::time::Instant;

fn gpu(name: &str) -> bool {
    testing::require_gpu(name)
}

fn host(data: &[f32]) -> Tensor {
    Tensor::from_slice(data, &[data.len()], Device::Cpu).unwrap()
}

fn to_cuda(t: &Tensor, non_blocking: bool) -> Tensor {
    cuda::transfer::transfer(t, Device::Cuda(0), non_blocking).unwrap()
}

fn to_cpu(t: &Tensor, non_blocking: bool) -> Tensor {
    cuda::transfer::transfer(t, Device::Cpu, non_blocking).unwrap()
}

/// A deterministic pseudo-random vector (xorshift), different per `seed`.
fn random_vec(n: usize, seed: u64) -> Vec<f32> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 24) as f32
        })
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn discovery_names_the_device_with_its_memory() {
    if !gpu("discovery_names_the_device_with_its_memory") {
        return;
    }
    assert!(cuda::is_available());
    assert!(cuda::unavailable_reason().is_none());
    let n = cuda::device_count();
    assert!(n >= 1);
    let p = cuda::get_device_properties(0).unwrap();
    assert!(!p.name.is_empty());
    assert_eq!(cuda::get_device_name(0).unwrap(), p.name);
    assert!(p.total_memory > (1 << 30), "total {}", p.total_memory);
    assert!(p.major >= 3 && p.multi_processor_count > 0);
    let (free, total) = cuda::mem_get_info(0).unwrap();
    assert_eq!(total, p.total_memory);
    assert!(free > 0 && free <= total);
    println!(
        "{} cc {}.{} {} SMs, {free}/{total} bytes free",
        p.name, p.major, p.minor, p.multi_processor_count
    );
}

/// A device index past the (faked) device count is a typed error naming index and range:
/// <https://github.com/pytorch/pytorch/issues/136849>
#[test]
fn index_past_the_fake_device_count_is_a_typed_error() {
    let _g = testing::fake_device_count(1);
    assert_eq!(cuda::device_count(), 1);
    let e = cuda::set_device(5).unwrap_err();
    assert_eq!(e, CudaError::InvalidDevice { index: 5, count: 1 });
    assert!(e
        .to_string()
        .contains("device index 5 is out of range [0, 1)"));
    assert_eq!(
        cuda::memory_allocated(5),
        Err(CudaError::InvalidDevice { index: 5, count: 1 })
    );
    assert!(matches!(
        cuda::current_stream(5),
        Err(CudaError::InvalidDevice { index: 5, count: 1 })
    ));
    assert!(matches!(
        Device::Cuda(5).canonical(),
        Err(berth::Error::Cuda(CudaError::InvalidDevice {
            index: 5,
            count: 1
        }))
    ));
}

/// Every use of `cuda:N` with N >= the device count fails with one typed error:
/// <https://github.com/pytorch/pytorch/issues/136849>
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn every_use_of_a_missing_device_index_fails_and_the_process_stays_usable() {
    if !gpu("every_use_of_a_missing_device_index_fails_and_the_process_stays_usable") {
        return;
    }
    let n = cuda::device_count();
    let want = CudaError::InvalidDevice { index: n, count: n };
    assert_eq!(cuda::set_device(n), Err(want.clone()));
    assert_eq!(cuda::memory_allocated(n), Err(want.clone()));
    assert_eq!(cuda::current_stream(n).unwrap_err(), want.clone());
    assert_eq!(cuda::mem_get_info(n), Err(want.clone()));
    assert!(cuda::transfer::transfer(&host(&[1.0]), Device::Cuda(n as u16), false).is_err());
    let x = to_cuda(&host(&[1.0, 2.0]), false);
    assert_eq!(to_cpu(&x, false).to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn contexts_are_created_lazily_once_per_device() {
    if !gpu("contexts_are_created_lazily_once_per_device") {
        return;
    }
    cuda::synchronize(0).unwrap();
    assert!(cuda::is_initialized(0));
    let created = cuda::contexts_created();
    cuda::synchronize(0).unwrap();
    let _ = cuda::mem_get_info(0).unwrap();
    assert_eq!(
        cuda::contexts_created(),
        created,
        "no second context on cuda:0"
    );
    assert!(cuda::contexts_created() <= cuda::device_count());
}

/// Work on cuda:1 (allocate, free, `empty_cache`, pin) creates no context on cuda:0:
/// <https://github.com/pytorch/pytorch/issues/25752>
#[test]
#[ignore = "needs two CUDA GPUs: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without any)"]
fn work_on_cuda1_creates_no_context_on_cuda0() {
    if !testing::require_gpus("work_on_cuda1_creates_no_context_on_cuda0", 2) {
        return;
    }
    // Runs only on a machine with two GPUs; in this process cuda:0 may already be in use by
    // other tests, so the assertion is about cuda:1's work not touching an uninitialised one.
    let before0 = cuda::is_initialized(0);
    let s = Stream::new(1, 0).unwrap();
    let _g = s.scope();
    let t = cuda::transfer::transfer(&host(&[1.0; 1024]), Device::Cuda(1), false).unwrap();
    drop(t);
    cuda::empty_cache().unwrap();
    assert_eq!(cuda::is_initialized(0), before0);
}

/// `elapsed_time` before the end event completed is "not ready", not a driver error:
/// <https://github.com/pytorch/pytorch/issues/85796>
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn elapsed_time_before_completion_is_not_ready_then_positive() {
    if !gpu("elapsed_time_before_completion_is_not_ready_then_positive") {
        return;
    }
    let s = Stream::new(0, 0).unwrap();
    let (start, end) = (Event::new(true), Event::new(true));
    start.record_on(&s).unwrap();
    testing::busy_stream(&s, 200).unwrap();
    end.record_on(&s).unwrap();
    assert_eq!(start.elapsed_time(&end), Err(CudaError::EventNotReady));
    assert!(!end.query().unwrap());
    end.synchronize().unwrap();
    assert!(end.query().unwrap());
    let ms = start.elapsed_time(&end).unwrap();
    assert!((150.0..1000.0).contains(&ms), "{ms} ms");
    let (a, b) = (Event::new(false), Event::new(false));
    a.record_on(&s).unwrap();
    b.record_on(&s).unwrap();
    s.synchronize().unwrap();
    let e = a.elapsed_time(&b).unwrap_err();
    assert_eq!(
        e.to_string(),
        "Both events must be created with argument 'enable_timing=True'."
    );
}

/// Timing GPU work with a host clock and no synchronize measures the launch only:
/// <https://www.speechmatics.com/company/articles-and-news/timing-operations-in-pytorch>
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn host_clock_without_sync_measures_only_the_launch() {
    if !gpu("host_clock_without_sync_measures_only_the_launch") {
        return;
    }
    let s = Stream::new(0, 0).unwrap();
    let (start, end) = (Event::new(true), Event::new(true));
    let t0 = Instant::now();
    start.record_on(&s).unwrap();
    testing::busy_stream(&s, 150).unwrap();
    end.record_on(&s).unwrap();
    let nosync = t0.elapsed().as_secs_f64() * 1e3;
    s.synchronize().unwrap();
    let sync = t0.elapsed().as_secs_f64() * 1e3;
    let ev = f64::from(start.elapsed_time(&end).unwrap());
    assert!(
        nosync < 0.5 * ev,
        "host no-sync {nosync} ms vs events {ev} ms"
    );
    assert!(
        (sync - ev).abs() / ev < 0.1,
        "host sync {sync} ms vs events {ev} ms"
    );
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn streams_wait_for_each_other_and_the_guard_restores_the_current_stream() {
    if !gpu("streams_wait") {
        return;
    }
    let a = Stream::new(0, 0).unwrap();
    let (least, greatest) = Stream::priority_range(0).unwrap();
    let b = Stream::new(0, greatest).unwrap();
    assert_eq!(b.priority(), greatest);
    assert!(matches!(
        Stream::new(0, least + 1),
        Err(CudaError::InvalidPriority { .. })
    ));
    testing::busy_stream(&a, 150).unwrap();
    b.wait_stream(&a).unwrap();
    let e = b.record_event().unwrap();
    assert!(!e.query().unwrap(), "b waits for a's 150 ms");
    e.synchronize().unwrap();
    assert!(a.query().unwrap());
    assert!(cuda::current_stream(0).unwrap().is_default());
    {
        let _g = a.scope();
        assert_eq!(cuda::current_stream(0).unwrap(), a);
        {
            let _g2 = b.scope();
            assert_eq!(cuda::current_stream(0).unwrap(), b);
        }
        assert_eq!(cuda::current_stream(0).unwrap(), a);
    }
    assert!(cuda::current_stream(0).unwrap().is_default());
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn cuda_backend_allocates_reports_memory_and_maps_virtual_memory() {
    if !gpu("cuda_backend") {
        return;
    }
    let b = CudaBackend::new(0).unwrap();
    let before = b.mem_info().unwrap();
    let p = b.malloc(64 << 20, berth::alloc::StreamId::DEFAULT).unwrap();
    assert_eq!(p.0 % 256, 0);
    let during = b.mem_info().unwrap();
    assert!(before.free_bytes - during.free_bytes >= 64 << 20);
    // SAFETY: `p` came from `malloc` with this size; nothing uses it.
    unsafe {
        b.free(p, 64 << 20, berth::alloc::StreamId::DEFAULT)
            .unwrap()
    };
    let v = b.as_virtual().expect("H200 has VMM");
    let g = v.granularity();
    assert!(g >= 4096);
    let base = v.reserve(8 * g).unwrap();
    v.map(base, 2 * g, berth::alloc::StreamId::DEFAULT).unwrap();
    v.map(
        berth::alloc::DevicePtr(base.0 + 2 * g as u64),
        g,
        berth::alloc::StreamId::DEFAULT,
    )
    .unwrap();
    // SAFETY: both chunks were mapped above and nothing uses them.
    unsafe {
        v.unmap(base, 3 * g, berth::alloc::StreamId::DEFAULT)
            .unwrap();
        v.release(base, 8 * g).unwrap();
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn expandable_segments_run_on_the_virtual_memory_backend() {
    if !gpu("expandable_segments") {
        return;
    }
    let cfg = AllocatorConfig::parse("expandable_segments:True").unwrap();
    let a = CachingAllocator::with_config(CudaBackend::new(0).unwrap(), cfg).unwrap();
    let x = a
        .allocate(50 << 20, berth::alloc::StreamId::DEFAULT)
        .unwrap();
    let y = a
        .allocate(30 << 20, berth::alloc::StreamId::DEFAULT)
        .unwrap();
    assert!(a.stats().memory_allocated() >= 80 << 20);
    drop((x, y));
    a.empty_cache().unwrap();
    assert_eq!(a.stats().memory_reserved(), 0);
}

/// `empty_cache` returns the released segment to the driver, not the context:
/// <https://github.com/pytorch/pytorch/issues/60150>
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn empty_cache_returns_exactly_the_released_segment() {
    if !gpu("empty_cache_returns_exactly_the_released_segment") {
        return;
    }
    let n = 4000 * 4000;
    let x = to_cuda(
        &Tensor::zeros(&[n], DType::F32, Device::Cpu).unwrap(),
        false,
    );
    assert!(cuda::memory_allocated(0).unwrap() >= 64_000_000);
    drop(x);
    cuda::synchronize(0).unwrap();
    let reserved = cuda::memory_reserved(0).unwrap();
    let allocated = cuda::memory_allocated(0).unwrap();
    let (free_before, _) = cuda::mem_get_info(0).unwrap();
    cuda::empty_cache().unwrap();
    let (free_after, total) = cuda::mem_get_info(0).unwrap();
    let released = reserved - cuda::memory_reserved(0).unwrap();
    assert!(released >= 65_011_712, "released {released}");
    assert_eq!(
        (free_after - free_before) as u64,
        released,
        "cuMemGetInfo sees what was released"
    );
    assert!(total - free_after > 0, "the context stays");
    if allocated == 0 {
        assert_eq!(cuda::memory_reserved(0).unwrap(), 0);
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn out_of_memory_is_typed_and_the_next_allocation_succeeds() {
    if !gpu("out_of_memory") {
        return;
    }
    let total = cuda::get_device_properties(0).unwrap().total_memory;
    let e = cuda::transfer::alloc_storage(0, total + (1 << 30)).unwrap_err();
    // The one question, asked of berth's own error: true for a CUDA out-of-memory too.
    assert!(e.is_out_of_memory(), "{e}");
    match e {
        berth::Error::Cuda(c) => assert!(c.is_out_of_memory(), "{c}"),
        other => panic!("expected a CUDA OOM, got {other}"),
    }
    // Through the tensor API the same.
    let numel = (total + (1 << 30)) as usize / 4;
    let e = berth::Tensor::zeros(&[numel], berth::DType::F32, berth::Device::Cuda(0)).unwrap_err();
    assert!(e.is_out_of_memory(), "{e}");
    let ok = cuda::transfer::alloc_storage(0, 1 << 20).unwrap();
    assert_eq!(ok.nbytes(), 1 << 20);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn a_block_freed_while_a_side_stream_uses_it_is_not_reused_until_that_work_is_done() {
    if !gpu("record_stream") {
        return;
    }
    let a = cuda::memory::allocator(0).unwrap();
    let side = Stream::new(0, 0).unwrap();
    let x = a
        .allocate(3 << 20, berth::alloc::StreamId::DEFAULT)
        .unwrap();
    let px = x.ptr();
    testing::busy_stream(&side, 200).unwrap();
    x.record_stream(side.id()).unwrap();
    drop(x);
    let y = a
        .allocate(3 << 20, berth::alloc::StreamId::DEFAULT)
        .unwrap();
    assert_ne!(y.ptr(), px, "handed out while the side stream still runs");
    side.synchronize().unwrap();
    drop(y);
}

/// `Tensor::record_stream`: a CUDA tensor freed while a side stream still uses it keeps its
/// memory out of reuse until that work is done; a pinned host tensor is accepted (the pinned
/// allocator defers its block); a pageable one is a typed error.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn record_stream_from_the_tensor_api() {
    if !gpu("tensor_record_stream") {
        return;
    }
    let side = Stream::new(0, 0).unwrap();
    let x = Tensor::zeros(&[3 << 18], DType::F32, Device::Cuda(0)).unwrap(); // 3 MiB
    let px = x.storage().data_ptr();
    testing::busy_stream(&side, 200).unwrap();
    x.record_stream(&side).unwrap();
    drop(x);
    let y = Tensor::zeros(&[3 << 18], DType::F32, Device::Cuda(0)).unwrap();
    assert_ne!(
        y.storage().data_ptr(),
        px,
        "handed out while the side stream still runs"
    );
    side.synchronize().unwrap();

    let pinned = host(&[1.0, 2.0]).pin_memory().unwrap();
    pinned.record_stream(&side).unwrap();
    let err = host(&[1.0]).record_stream(&side).unwrap_err().to_string();
    assert!(
        err.contains("record_stream takes a CUDA tensor or a pinned host tensor"),
        "{err}"
    );
}

/// The rule of Note [Streams are never destroyed] (berth-cuda's `stream.rs`): the allocator
/// keeps using a stream's id after the last handle is gone (deferred frees, the paged policy's
/// per-stream reservation), so dropping a stream must not free its `CUstream`: memory used on
/// a dropped stream is reclaimed safely, and the next stream of that device and priority reuses
/// the handle.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn a_dropped_stream_stays_valid_for_the_allocator_and_is_reused() {
    if !gpu("dropped_stream") {
        return;
    }
    let side = Stream::new(0, 0).unwrap();
    let raw = side.as_raw();
    {
        let _g = side.scope();
        let x = Tensor::zeros(&[1 << 20], DType::F32, Device::Cuda(0)).unwrap(); // on `side`
        let y = Tensor::zeros(&[1 << 20], DType::F32, Device::Cuda(0)).unwrap();
        y.record_stream(&Stream::default_stream(0).unwrap())
            .unwrap();
        drop((x, y));
    }
    drop(side);
    // The allocator now synchronises / records on the dropped stream's id.
    cuda::empty_cache().unwrap();
    let _z = Tensor::zeros(&[1 << 20], DType::F32, Device::Cuda(0)).unwrap();
    cuda::synchronize(0).unwrap();
    let again = Stream::new(0, 0).unwrap();
    assert_eq!(again.as_raw(), raw, "the pooled CUstream is reused");
}

/// The memory functions take a device as PyTorch's do: an index, `None` (current), a `Device`.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn memory_api_by_device() {
    if !gpu("memory_api_by_device") {
        return;
    }
    let x = Tensor::zeros(&[1 << 20], DType::F32, Device::Cuda(0)).unwrap();
    // Other tests of this binary may allocate on cuda:0 in parallel: each form must see at
    // least this tensor's 4 MiB (the same device), not exactly equal figures.
    for allocated in [
        cuda::memory_allocated(0).unwrap(),
        cuda::memory_allocated(0usize).unwrap(),
        cuda::memory_allocated(Device::Cuda(0)).unwrap(),
        cuda::memory_allocated(Device::CudaCurrent).unwrap(),
        cuda::memory_allocated(None::<usize>).unwrap(),
    ] {
        assert!(allocated >= 4 << 20, "{allocated}");
    }
    assert!(cuda::memory_reserved(Device::Cuda(0)).unwrap() >= 4 << 20);
    assert_eq!(
        cuda::memory_allocated(Device::Cpu).unwrap_err().to_string(),
        "Expected a cuda device, but got: cpu"
    );
    let policy = cuda::allocator_policy(Device::Cuda(0)).unwrap();
    assert!(cuda::memory_summary(Device::Cuda(0), true)
        .unwrap()
        .contains(&format!("allocator policy: {policy}")));
    drop(x);
}

/// `pin_memory()` of a pinned tensor shares it; a device tensor cannot be pinned:
/// <https://github.com/pytorch/pytorch/issues/21076>, <https://github.com/unit8co/darts/issues/436>
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn pin_memory_rules() {
    if !gpu("pin_memory_rules") {
        return;
    }
    let x = Tensor::ones(&[4], DType::F32, Device::Cpu).unwrap();
    assert!(!x.is_pinned());
    let p = x.pin_memory().unwrap();
    assert!(p.is_pinned());
    assert_ne!(p.storage_id(), x.storage_id());
    assert_eq!(p.to_vec::<f32>().unwrap(), vec![1.0; 4]);
    let p2 = p.pin_memory().unwrap();
    assert_eq!(p2.storage_id(), p.storage_id(), "no second copy");
    let d = to_cuda(&x, false);
    assert!(!d.is_pinned());
    let e = d.pin_memory().unwrap_err();
    assert!(e
        .to_string()
        .contains("cannot pin 'torch.cuda.FloatTensor' only dense CPU tensors can be pinned"));
}

/// `pin_memory()` of a view pins only the bytes the view spans, keeping its strides and values
/// (PyTorch's `_pin_memory` allocates `computeStorageNbytes(sizes, strides)`); an expanded
/// tensor pins its one row.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn pin_memory_of_a_view_pins_only_its_bytes() {
    if !gpu("pin_memory_of_a_view") {
        return;
    }
    let x = Tensor::arange(0.0, 100.0, 1.0, DType::F32, Device::Cpu).unwrap();
    let slice = x.narrow(0, 30, 10).unwrap();
    let p = slice.pin_memory().unwrap();
    assert!(p.is_pinned());
    assert_eq!(
        p.storage().nbytes(),
        40,
        "10 floats, not the 400 bytes of the base"
    );
    assert_eq!(p.storage_offset(), 0);
    assert_eq!(p.to_vec::<f32>().unwrap(), slice.to_vec::<f32>().unwrap());
    // A stride-2 view of 20 floats: 10 elements spanning 19 floats, 76 bytes.
    let m = Tensor::arange(0.0, 20.0, 1.0, DType::F32, Device::Cpu)
        .unwrap()
        .reshape(&[10, 2])
        .unwrap()
        .select(1, 0)
        .unwrap();
    assert_eq!(m.strides(), &[2]);
    let q = m.pin_memory().unwrap();
    assert_eq!(q.storage().nbytes(), 76);
    assert_eq!(q.strides(), &[2]);
    assert_eq!(
        q.to_vec::<f32>().unwrap(),
        (0..10).map(|i| (2 * i) as f32).collect::<Vec<_>>()
    );
    // Expanded (stride 0): pins the one row, no error.
    let row = Tensor::arange(0.0, 4.0, 1.0, DType::F32, Device::Cpu).unwrap();
    let e = row.unsqueeze(0).unwrap().expand(&[3, 4]).unwrap();
    let pe = e.pin_memory().unwrap();
    assert_eq!(pe.storage().nbytes(), 16);
    assert_eq!(pe.to_vec::<f32>().unwrap(), e.to_vec::<f32>().unwrap());
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn round_trips_are_exact_in_every_direction() {
    if !gpu("round_trips") {
        return;
    }
    for (i, n) in [1usize, 1000, 5 << 20].into_iter().enumerate() {
        let v = random_vec(n, i as u64 + 1);
        let h = host(&v);
        for nb in [false, true] {
            let d = to_cuda(&h, nb);
            let d2 = cuda::transfer::transfer(&d, Device::Cuda(0), false).unwrap();
            assert_eq!(
                to_cpu(&d2, nb).to_vec::<f32>().unwrap(),
                v,
                "n={n} non_blocking={nb}"
            );
        }
        let pinned = h.pin_memory().unwrap();
        assert_eq!(
            to_cpu(&to_cuda(&pinned, true), true)
                .to_vec::<f32>()
                .unwrap(),
            v
        );
    }
}

/// A non-blocking device-to-host copy read at once is never stale:
/// <https://github.com/pytorch/pytorch/issues/86264>
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn non_blocking_dtoh_read_at_once_is_correct_in_100_of_100_trials() {
    if !gpu("non_blocking_dtoh_read_at_once_is_correct_in_100_of_100_trials") {
        return;
    }
    let s = Stream::new(0, 0).unwrap();
    let _g = s.scope();
    for trial in 0..100u64 {
        let v = random_vec(1 << 16, trial + 100);
        let d = to_cuda(&host(&v), false);
        if trial % 10 == 0 {
            testing::busy_stream(&s, 30).unwrap();
        }
        let y = to_cpu(&d, true);
        assert!(y.is_pinned());
        if trial % 10 == 0 {
            assert!(
                !s.query().unwrap(),
                "the copy is still queued: really asynchronous"
            );
        }
        assert_eq!(y.to_vec::<f32>().unwrap(), v, "trial {trial}");
    }
}

/// A write to the pinned source of a non-blocking upload waits for the copy:
/// <https://github.com/pytorch/pytorch/issues/127612>
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn pinned_source_write_waits_for_the_copy_and_the_call_returns_early() {
    if !gpu("pinned_source_write_waits_for_the_copy_and_the_call_returns_early") {
        return;
    }
    let s = Stream::new(0, 0).unwrap();
    let _g = s.scope();
    let src = Tensor::ones(&[4 << 20], DType::F32, Device::Cpu)
        .unwrap()
        .pin_memory()
        .unwrap();
    testing::busy_stream(&s, 200).unwrap();
    let t0 = Instant::now();
    let dst = to_cuda(&src, true);
    let call_ms = t0.elapsed().as_secs_f64() * 1e3;
    assert!(
        call_ms < 50.0,
        "non_blocking from pinned returned after {call_ms} ms"
    );
    src.storage().write_host("test").unwrap().typed_mut::<f32>()[(4 << 20) - 1] = -1.0;
    let back = to_cpu(&dst, false).to_vec::<f32>().unwrap();
    assert_eq!(back[(4 << 20) - 1], 1.0, "the write waited for the copy");
    // Pageable source: the data is staged before the call returns.
    let pageable = Tensor::ones(&[4 << 20], DType::F32, Device::Cpu).unwrap();
    testing::busy_stream(&s, 200).unwrap();
    let dst = to_cuda(&pageable, true);
    pageable
        .storage()
        .write_host("test")
        .unwrap()
        .typed_mut::<f32>()[0] = -1.0;
    assert_eq!(to_cpu(&dst, false).to_vec::<f32>().unwrap()[0], 1.0);
}

/// Each `item()` is one host wait:
/// <https://github.com/meta-pytorch/torchtune/pull/522>
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn each_blocking_read_is_one_host_wait_and_sync_debug_flags_only_those() {
    if !gpu("each_blocking_read_is_one_host_wait_and_sync_debug_flags_only_those") {
        return;
    }
    let d = to_cuda(&host(&[2.0]), false);
    let before = cuda::thread_host_waits();
    for _ in 0..100 {
        let _ = to_cpu(&d, false);
    }
    assert_eq!(cuda::thread_host_waits() - before, 100);
    cuda::set_sync_debug_mode(cuda::SyncDebugMode::Warn);
    let _ = cuda::take_sync_reports();
    for _ in 0..5 {
        let x = to_cuda(&host(&[1.0; 64]), true); // non-blocking upload: not a sync
        let _y = cuda::transfer::transfer(&x, Device::Cuda(0), false).unwrap(); // d2d: not a sync
        let _z = to_cpu(&x, false); // blocking download: a sync
    }
    cuda::set_sync_debug_mode(cuda::SyncDebugMode::Error);
    assert!(matches!(
        cuda::transfer::transfer(&d, Device::Cpu, false),
        Err(berth::Error::Cuda(CudaError::SyncDebug { .. }))
    ));
    cuda::set_sync_debug_mode(cuda::SyncDebugMode::Off);
    let reports = cuda::take_sync_reports();
    assert_eq!(reports, vec!["copy_dtoh"; 6]);
}

/// berth-alloc's conformance suite (distinct pointers, alignment, zero size, OOM then recovery,
/// `empty_cache` releasing everything, typed bad frees, several threads) on real device memory:
/// the PyTorch policy over `cuMemAlloc`, expandable segments and berth's `paged` policy over
/// `cuMemCreate` / `cuMemMap`, each behind a byte cap (`Limit`) that stands for the device
/// capacity the suite asks for.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn conformance_suite_on_cuda_backend() {
    use berth::alloc::adaptor::Limit;
    use berth::alloc::{testing as suite, PagedBestFit};
    use std::sync::Arc;
    if !gpu("conformance_suite_on_cuda_backend") {
        return;
    }
    let backend = |cap: u64| Limit::new(CudaBackend::new(0).expect("cuda:0 backend"), cap);
    suite::conformance(&|cap| {
        Arc::new(CachingAllocator::new(backend(cap))) as Arc<dyn DeviceAllocator>
    });
    suite::conformance(&|cap| {
        let config = AllocatorConfig::parse("expandable_segments:True").unwrap();
        Arc::new(CachingAllocator::with_config(backend(cap), config).unwrap())
            as Arc<dyn DeviceAllocator>
    });
    suite::conformance(&|cap| {
        Arc::new(PagedBestFit::new(backend(cap)).expect("VMM supported"))
            as Arc<dyn DeviceAllocator>
    });
}
