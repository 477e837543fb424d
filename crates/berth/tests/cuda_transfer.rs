//! First-time `pin_memory()` through mapped, filled and registered blocks, and blocking
//! host↔device copies into existing tensors (`copy_`) and fresh ones (`.to(cpu)`), on a real
//! GPU. Every test is `#[ignore]`d (run them with `--include-ignored`) and starts at the one GPU
//! gate (`berth::cuda::testing::require_gpu`): it skips with a message without a GPU, and fails
//! there when `BERTH_REQUIRE_GPU=1`.

#![cfg(feature = "cuda")]

use berth::cuda::{self, memory::host_allocator, testing};
use berth::{DType, Device, Tensor};

const MIB: usize = 1 << 20;

/// A host f32 tensor of `n` elements with pseudo-random bit patterns (xorshift), per `seed`.
fn random_host(n: usize, seed: u64) -> Tensor {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let v: Vec<f32> = (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect();
    Tensor::from_slice(&v, &[n], Device::Cpu).unwrap()
}

fn bytes(t: &Tensor) -> Vec<u8> {
    let t = if t.device().is_cpu() {
        t.alias()
    } else {
        t.cpu().unwrap()
    };
    let r = t.storage().read_host("test").unwrap();
    let (at, n) = (
        t.storage_offset() * t.dtype().size_in_bytes(),
        t.numel() * t.dtype().size_in_bytes(),
    );
    r.bytes()[at..at + n].to_vec()
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn first_pin_maps_fills_and_registers_and_the_cache_reuses_the_block() {
    if !testing::require_gpu("first_pin_maps_fills_and_registers") {
        return;
    }
    // 5 MiB + 3 elements: an 8 MiB block, filled for its first 5 MiB + 12 bytes.
    let x = random_host((5 * MIB) / 4 + 3, 1);
    // No block of another test waits on an event: the cache empties completely.
    cuda::synchronize(0).unwrap();
    cuda::host_empty_cache().unwrap();
    let p = x.pin_memory().unwrap();
    assert!(p.is_pinned());
    let ptr = p.storage().data_ptr() as *const u8;
    let host = host_allocator().unwrap();
    assert!(
        host.backend().is_mapped_block(ptr),
        "a fresh large pin is a mapped block"
    );
    assert!(cuda::memory::is_pinned_ptr(ptr));
    assert_eq!(bytes(&p), bytes(&x));
    // The driver treats it as pinned memory: an async copy from it round-trips.
    let d = cuda::transfer::transfer(&p, Device::Cuda(0), true).unwrap();
    assert_eq!(bytes(&d), bytes(&x));
    drop((p, d));
    cuda::synchronize(0).unwrap();
    // Again: the cached block is reused (no new mapping), refilled by the ordinary copy.
    let y = random_host((5 * MIB) / 4 + 3, 2);
    let q = y.pin_memory().unwrap();
    assert_eq!(
        q.storage().data_ptr() as *const u8,
        ptr,
        "cached block reused"
    );
    assert_eq!(bytes(&q), bytes(&y));
    drop(q);
    // Emptying the cache unregisters and unmaps it.
    cuda::host_empty_cache().unwrap();
    assert!(!host.backend().is_mapped_block(ptr));
    assert!(!cuda::memory::is_pinned_ptr(ptr), "registration released");
}

/// `Tensor::empty_pinned` (`torch.empty(..., pin_memory=True)`): a contiguous pinned host
/// tensor of the shape and dtype asked for, holding its block (recorded on a stream by the
/// block), and a source of one-DMA copies.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn empty_pinned_is_a_pinned_contiguous_host_tensor() {
    if !testing::require_gpu("empty_pinned_is_a_pinned_contiguous_host_tensor") {
        return;
    }
    let p = Tensor::empty_pinned(&[3, 5], DType::F32).unwrap();
    assert_eq!(
        (
            p.shape(),
            p.dtype(),
            p.device(),
            p.is_pinned(),
            p.is_contiguous()
        ),
        (&[3usize, 5][..], DType::F32, Device::Cpu, true, true)
    );
    assert!(p.storage().pinned_block().is_some());
    p.fill_(1.5).unwrap();
    let d = p.cuda().unwrap();
    assert_eq!(d.to_vec::<f32>().unwrap(), vec![1.5; 15]);
    p.record_stream(&cuda::Stream::new(0, 0).unwrap()).unwrap();
    let z = Tensor::empty_pinned(&[0], DType::F32).unwrap();
    assert_eq!(z.numel(), 0);
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn small_pins_still_come_from_the_driver() {
    if !testing::require_gpu("small_pins_still_come_from_the_driver") {
        return;
    }
    let x = random_host(1000, 3);
    let p = x.pin_memory().unwrap();
    let ptr = p.storage().data_ptr() as *const u8;
    assert!(p.is_pinned());
    assert!(!host_allocator().unwrap().backend().is_mapped_block(ptr));
    assert_eq!(bytes(&p), bytes(&x));
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn copy_into_existing_host_tensors_is_exact() {
    if !testing::require_gpu("copy_into_existing_host_tensors_is_exact") {
        return;
    }
    // 40 MiB + 1 element: several staging chunks and a short last one.
    let n = (40 * MIB) / 4 + 1;
    let x = random_host(n, 4);
    let g = x.cuda().unwrap();
    let pageable = Tensor::zeros(&[n], DType::F32, Device::Cpu).unwrap();
    pageable.copy_(&g).unwrap();
    assert_eq!(bytes(&pageable), bytes(&x));
    let pinned = Tensor::zeros(&[n], DType::F32, Device::Cpu)
        .unwrap()
        .pin_memory()
        .unwrap();
    pinned.copy_(&g).unwrap();
    assert!(pinned.is_pinned());
    assert_eq!(bytes(&pinned), bytes(&x));
    // A view at an offset: only its elements change.
    let big = Tensor::zeros(&[n + 5], DType::F32, Device::Cpu).unwrap();
    big.narrow(0, 5, n).unwrap().copy_(&g).unwrap();
    let all = big.to_vec::<f32>().unwrap();
    assert_eq!(&all[..5], &[0.0; 5]);
    assert_eq!(all[5..], x.to_vec::<f32>().unwrap()[..]);
    // Not direct: strided destination, dtype conversion, broadcast.
    let m = Tensor::zeros(&[3, 2], DType::F32, Device::Cpu).unwrap();
    let src = Tensor::arange(0.0, 6.0, 1.0, DType::I64, Device::Cpu)
        .unwrap()
        .reshape(&[2, 3])
        .unwrap()
        .cuda()
        .unwrap();
    m.t().unwrap().copy_(&src).unwrap();
    assert_eq!(
        m.to_vec::<f32>().unwrap(),
        vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
    );
    let row = Tensor::from_slice(&[1.0f32, 2.0], &[2], Device::Cpu)
        .unwrap()
        .cuda()
        .unwrap();
    m.copy_(&row).unwrap();
    assert_eq!(
        m.to_vec::<f32>().unwrap(),
        vec![1.0, 2.0, 1.0, 2.0, 1.0, 2.0]
    );
    assert!(m.copy_(&g).is_err(), "a shape that does not broadcast");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn copy_into_existing_device_tensors_is_exact() {
    if !testing::require_gpu("copy_into_existing_device_tensors_is_exact") {
        return;
    }
    let n = (24 * MIB) / 4 + 7;
    let x = random_host(n, 5);
    let g = Tensor::zeros(&[n], DType::F32, Device::Cuda(0)).unwrap();
    g.copy_(&x).unwrap();
    assert_eq!(bytes(&g), bytes(&x));
    let y = random_host(n, 6).pin_memory().unwrap();
    g.copy_(&y).unwrap();
    assert_eq!(bytes(&g), bytes(&y));
    // The pinned source may be written at once after a blocking copy.
    y.fill_(1.0).unwrap();
    assert_ne!(bytes(&g), bytes(&y));
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn large_to_cpu_lands_in_unpinned_memory_with_the_exact_bytes() {
    if !testing::require_gpu("large_to_cpu_lands_in_unpinned_memory") {
        return;
    }
    let n = (20 * MIB) / 4 + 3;
    let x = random_host(n, 7);
    let g = x.cuda().unwrap();
    let back = g.cpu().unwrap();
    assert!(!back.is_pinned());
    assert_eq!(bytes(&back), bytes(&x));
    // Writable like any host tensor.
    back.fill_(2.0).unwrap();
    assert_eq!(back.to_vec::<f32>().unwrap()[n - 1], 2.0);
}
