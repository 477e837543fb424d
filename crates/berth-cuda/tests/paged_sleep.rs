//! Sleep and wake of the paged policy on a real GPU (`Note [Sleep and wake]` in berth-alloc):
//! a tag's pages go back to the driver (`cuMemGetInfo`), its offloaded contents come back at
//! the same addresses, a tag slept without offload keeps its addresses. The simulator's twin is
//! berth-alloc's `tests/sleep_wake.rs`.

use std::ptr::NonNull;
use std::sync::Arc;

use berth_alloc::host::BackupMemory;
use berth_alloc::tags::TagGuard;
use berth_alloc::{DeviceAllocator, MemoryBackend, PagedBestFit, StreamId};
use berth_cuda::{mem_get_info, CudaBackend, CudaHostBackend};

const MIB: usize = 1 << 20;

fn used() -> u64 {
    let (free, total) = mem_get_info(0).unwrap();
    (total - free) as u64
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn paged_sleep_gives_pages_back_and_wake_restores_the_offloaded_bytes() {
    if !berth_cuda::testing::require_gpu(
        "paged_sleep_gives_pages_back_and_wake_restores_the_offloaded_bytes",
    ) {
        return;
    }
    let paged = PagedBestFit::new(CudaBackend::new(0).unwrap()).unwrap();
    let vm = || paged.backend().as_virtual().unwrap();
    let s = StreamId::DEFAULT;
    let (weights, kv) = {
        let _w = TagGuard::new("weights").unwrap();
        let w = paged.allocate(256 * MIB, s).unwrap();
        drop(_w);
        let _k = TagGuard::new("kv_cache").unwrap();
        (w, paged.allocate(1024 * MIB, s).unwrap())
    };
    let pattern: Vec<u8> = (0..256 * MIB).map(|i| (i % 251) as u8).collect();
    // SAFETY: `pattern` holds 256 MiB and the block is mapped and idle.
    unsafe {
        vm().copy_from_host(
            weights.ptr(),
            NonNull::new(pattern.as_ptr() as *mut u8).unwrap(),
            pattern.len(),
        )
    }
    .unwrap();
    let before = used();
    let host: Arc<dyn BackupMemory> = Arc::new(CudaHostBackend::new().unwrap());
    let t = std::time::Instant::now();
    let slept = paged
        .sleep(&["weights", "kv_cache"], &["weights"], Some(host))
        .unwrap();
    let sleep_s = t.elapsed().as_secs_f64();
    let after = used();
    println!(
        "sleep: released {} MiB in {:.3} s; driver used {} -> {} MiB",
        slept.released_bytes >> 20,
        sleep_s,
        before >> 20,
        after >> 20
    );
    assert_eq!(slept.released_bytes, 1280 * MIB as u64);
    // At least 99% of what the tags held goes back to the driver.
    assert!(
        before - after >= slept.released_bytes * 99 / 100,
        "{before} -> {after}"
    );
    let t = std::time::Instant::now();
    let woke = paged.wake(&["weights", "kv_cache"]).unwrap();
    println!(
        "wake: mapped {} MiB in {:.3} s",
        woke.mapped_bytes >> 20,
        t.elapsed().as_secs_f64()
    );
    let mut back = vec![0u8; pattern.len()];
    // SAFETY: `back` holds 256 MiB; the block is mapped again and idle.
    unsafe {
        vm().copy_to_host(
            weights.ptr(),
            NonNull::new(back.as_mut_ptr()).unwrap(),
            back.len(),
        )
    }
    .unwrap();
    assert!(
        back == pattern,
        "the offloaded bytes came back at the same address"
    );
    drop((weights, kv));
    paged.empty_cache().unwrap();
    paged.check_err().unwrap();
}
