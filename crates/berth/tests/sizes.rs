//! Shapes too large to describe or to allocate: typed errors on every creation path and on
//! views, never a wrapped size, a panic or an abort.

use berth::{DType, Device, Error, Tensor};

/// `[1 << 62, 8]` has 2^65 elements: the product wraps to 0 in `usize`.
const WRAPS: [usize; 2] = [1 << 62, 8];

#[track_caller]
fn numel_overflow(r: berth::Result<Tensor>, op: &str, shape: &[usize]) {
    let e = r.unwrap_err();
    match &e {
        Error::NumelOverflow { op: o, shape: s } => {
            assert_eq!((*o, s.as_slice()), (op, shape), "{e}");
        }
        _ => panic!("expected NumelOverflow, got {e:?}"),
    }
    assert_eq!(
        e.to_string(),
        format!(
            "{op}: numel: integer multiplication overflow: the number of elements of shape \
             {shape:?} does not fit in isize (the product of the sizes, counting a size 0 as 1, \
             must be at most 9223372036854775807); use smaller sizes"
        )
    );
}

#[test]
fn creating_a_shape_whose_element_count_overflows_is_a_typed_error() {
    for device in [Device::Cpu, Device::Meta] {
        numel_overflow(Tensor::zeros(&WRAPS, DType::F32, device), "zeros", &WRAPS);
        numel_overflow(Tensor::ones(&WRAPS, DType::U8, device), "ones", &WRAPS);
        numel_overflow(
            Tensor::full(&WRAPS, 2.0, DType::F32, device),
            "full",
            &WRAPS,
        );
        numel_overflow(Tensor::empty(&WRAPS, DType::F32, device), "empty", &WRAPS);
        numel_overflow(Tensor::rand(&WRAPS, DType::F32, device), "rand", &WRAPS);
        numel_overflow(
            Tensor::from_slice::<f32>(&[], &[1 << 62, 8, 0], device),
            "from_slice",
            &[1 << 62, 8, 0],
        );
    }
    numel_overflow(
        Tensor::zeros(&[usize::MAX, 2], DType::F32, Device::Meta),
        "zeros",
        &[usize::MAX, 2],
    );
    // A size 0 makes the tensor empty, but the other sizes must still be describable (PyTorch
    // refuses them too, in the stride calculation).
    numel_overflow(
        Tensor::zeros(&[0, 1 << 62, 8], DType::F32, Device::Cpu),
        "zeros",
        &[0, 1 << 62, 8],
    );
    let empty = Tensor::zeros(&[0, 1 << 40], DType::F32, Device::Cpu).unwrap();
    assert_eq!((empty.numel(), empty.nbytes()), (0, 0));
}

#[test]
fn a_count_that_fits_but_whose_bytes_do_not_is_a_storage_size_error() {
    for device in [Device::Cpu, Device::Meta] {
        let e = Tensor::zeros(&[1 << 62], DType::F32, device).unwrap_err();
        assert!(
            matches!(
                &e,
                Error::StorageSizeOverflow { op: "zeros", shape, dtype: DType::F32, numel }
                    if shape == &[1usize << 62] && *numel == 1 << 62
            ),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "zeros: Storage size calculation overflowed: shape [4611686018427387904] of f32 \
             needs 4611686018427387904 elements × 4 bytes, more than 9223372036854775807 \
             bytes; use smaller sizes or a smaller dtype"
        );
    }
}

#[test]
fn meta_sizes_are_exact_up_to_the_limit() {
    let m = Tensor::zeros(&[1 << 40, 2], DType::F32, Device::Meta).unwrap();
    assert_eq!((m.numel(), m.nbytes()), (1 << 41, 1 << 43));
    assert_eq!(m.storage().nbytes(), 1 << 43);
}

#[test]
fn views_to_an_overflowing_shape_are_typed_errors() {
    let empty = Tensor::zeros(&[0], DType::F32, Device::Cpu).unwrap();
    // Before: the target's product wrapped to 0 and matched the empty tensor.
    numel_overflow(empty.view(&WRAPS), "view", &WRAPS);
    numel_overflow(empty.reshape(&WRAPS), "reshape", &WRAPS);
    numel_overflow(empty.reshape_infer(&[-1, 1 << 62, 8]), "reshape", &WRAPS);
    let row = Tensor::zeros(&[1, 8], DType::F32, Device::Cpu).unwrap();
    numel_overflow(row.expand(&WRAPS), "expand", &WRAPS);
    let mut r = Tensor::zeros(&[2], DType::F32, Device::Cpu).unwrap();
    numel_overflow(r.resize_(&WRAPS).map(|t| t.alias()), "resize_", &WRAPS);
    assert_eq!(r.shape(), &[2]);
}

#[test]
fn an_allocation_the_system_refuses_is_a_typed_out_of_memory_error() {
    // 2^60 bytes: fits the size checks, exceeds any machine's address space.
    let e = Tensor::zeros(&[1 << 58], DType::F32, Device::Cpu).unwrap_err();
    assert!(
        matches!(
            e,
            Error::HostOutOfMemory {
                device: Device::Cpu,
                requested_bytes
            } if requested_bytes == 1 << 60
        ),
        "{e:?}"
    );
    assert!(e.is_out_of_memory());
    assert_eq!(
        e.to_string(),
        "cpu: out of memory: DefaultCPUAllocator: not enough memory: you tried to allocate \
         1152921504606846976 bytes (1073741824.00 GiB); free some tensors or use smaller shapes"
    );
    // Every CPU allocation path reports it the same way.
    let big = Tensor::zeros(&[1 << 57], DType::U8, Device::Meta).unwrap();
    let e = big.to_empty(Device::Cpu).unwrap_err();
    assert!(
        matches!(e, Error::HostOutOfMemory { device: Device::Cpu, requested_bytes } if requested_bytes == 1 << 57),
        "{e:?}"
    );
    let e = Tensor::arange(0.0, 1e18, 1.0, DType::F64, Device::Cpu).unwrap_err();
    assert!(
        matches!(e, Error::HostOutOfMemory { requested_bytes, .. } if requested_bytes == 8_000_000_000_000_000_000),
        "{e:?}"
    );
    // The process goes on allocating.
    let ok = Tensor::ones(&[4], DType::F32, Device::Cpu).unwrap();
    assert_eq!(ok.to_vec::<f32>().unwrap(), vec![1.0; 4]);
}

#[test]
fn arange_allocates_its_output_in_the_target_dtype_first() {
    // Meta: no data at all, however long (was 59 s and 19.5 GB for 1e9 elements).
    let start = std::time::Instant::now();
    let m = Tensor::arange(0.0, 1e9, 1.0, DType::F32, Device::Meta).unwrap();
    assert_eq!(
        (m.shape(), m.dtype(), m.nbytes(), m.device()),
        (
            &[1_000_000_000usize][..],
            DType::F32,
            4_000_000_000,
            Device::Meta
        )
    );
    let m = Tensor::arange(0.0, 1e18, 1.0, DType::F32, Device::Meta).unwrap();
    assert_eq!(m.nbytes(), 4_000_000_000_000_000_000);
    let m = Tensor::arange(0.0, 2e18, 1.0, DType::F32, Device::Meta).unwrap();
    assert_eq!(m.numel(), 2_000_000_000_000_000_000);
    assert!(start.elapsed() < std::time::Duration::from_secs(5));
    // Too large in f32 (3e18 × 4 bytes > isize::MAX): the error names f32, on meta too.
    for device in [Device::Meta, Device::Cpu] {
        let e = Tensor::arange(0.0, 3e18, 1.0, DType::F32, device).unwrap_err();
        assert!(
            matches!(
                &e,
                Error::StorageSizeOverflow { op: "arange", shape, dtype: DType::F32, numel }
                    if shape == &[3_000_000_000_000_000_000usize] && *numel == 3_000_000_000_000_000_000
            ),
            "{e:?}"
        );
    }
    // On the CPU the out-of-memory error names the bytes of f32, not of an f64 staging buffer.
    let e = Tensor::arange(0.0, 1e18, 1.0, DType::F32, Device::Cpu).unwrap_err();
    assert!(
        matches!(e, Error::HostOutOfMemory { device: Device::Cpu, requested_bytes } if requested_bytes == 4_000_000_000_000_000_000),
        "{e:?}"
    );
    // Values are unchanged: computed as start + i * step, converted to the dtype.
    let a = Tensor::arange(-1.0, 1.0, 0.5, DType::F16, Device::Cpu).unwrap();
    assert_eq!(
        a.to_vec::<half::f16>().unwrap(),
        [-1.0f32, -0.5, 0.0, 0.5].map(half::f16::from_f32).to_vec()
    );
    let a = Tensor::arange(5.0, 0.0, -2.0, DType::I32, Device::Cpu).unwrap();
    assert_eq!(a.to_vec::<i32>().unwrap(), vec![5, 3, 1]);
    let a = Tensor::arange(0.0, 3.0, 1.0, DType::Bool, Device::Cpu).unwrap();
    assert_eq!(a.to_vec::<bool>().unwrap(), vec![false, true, true]);
    let a = Tensor::arange(0.0, 40000.0, 1.0, DType::F32, Device::Cpu).unwrap();
    let v = a.to_vec::<f32>().unwrap();
    assert_eq!((v.len(), v[0], v[39999]), (40000, 0.0, 39999.0));
}

/// An out-of-memory error for exactly `bytes` host bytes.
#[track_caller]
fn host_oom(r: berth::Result<impl std::fmt::Debug>, bytes: usize) {
    let e = r.unwrap_err();
    assert!(
        matches!(e, Error::HostOutOfMemory { device: Device::Cpu, requested_bytes } if requested_bytes == bytes),
        "expected HostOutOfMemory of {bytes} bytes, got {e:?}"
    );
}

#[test]
fn reading_a_tensor_whose_bytes_overflow_is_a_storage_size_error() {
    // 2^62 expanded f32 elements need 2^64 bytes to read: not a saturated out-of-memory
    // request of 18446744073709551615 bytes, but the size error that says why.
    let x = Tensor::zeros(&[1], DType::F32, Device::Cpu)
        .unwrap()
        .expand(&[1 << 62])
        .unwrap();
    for e in [x.to_vec::<f32>().unwrap_err(), x.to_vec_f64().unwrap_err()] {
        assert!(
            matches!(&e, Error::StorageSizeOverflow { op: "to_vec", shape, numel, .. }
                if shape == &[1usize << 62] && *numel == 1 << 62),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .contains("Storage size calculation overflowed"),
            "{e}"
        );
    }
}

#[test]
fn reading_a_huge_expanded_tensor_is_a_typed_out_of_memory_error_not_an_abort() {
    // 2^46 elements over one real f32: the views are free, index or value lists are not. Every
    // list below is 2^48 bytes or more, beyond x86-64's 47-bit user address space, so the
    // system refuses it even where memory is overcommitted (a 2^41-byte request succeeded on a
    // 128 GiB GPU host with overcommit and was then killed while being filled).
    const N: usize = 1 << 46;
    let x = Tensor::zeros(&[1], DType::F32, Device::Cpu)
        .unwrap()
        .expand(&[N])
        .unwrap();
    // Reductions list the 2^46 reduced offsets (8 bytes each).
    host_oom(x.sum(), N * 8);
    host_oom(x.mean(), N * 8);
    host_oom(x.max(), N * 8);
    host_oom(x.argmax(), N * 8);
    // Reads list the values: 4 bytes each as f32, 8 as f64.
    host_oom(x.to_vec::<f32>(), N * 4);
    host_oom(x.to_vec_f64(), N * 8);
    // An f16 matmul makes an f32 copy of each (expanded) operand: [2^23, 2^23] × 4 bytes.
    let a = Tensor::zeros(&[1, 1], DType::F16, Device::Cpu)
        .unwrap()
        .expand(&[1 << 23, 1 << 23])
        .unwrap();
    let b = Tensor::zeros(&[1 << 23, 1], DType::F16, Device::Cpu).unwrap();
    host_oom(a.matmul(&b), N * 4);
    // The process goes on.
    let ok = Tensor::ones(&[4], DType::F32, Device::Cpu).unwrap();
    assert_eq!(
        ok.expand(&[2, 4])
            .unwrap()
            .sum()
            .unwrap()
            .item::<f32>()
            .unwrap(),
        8.0
    );
}

#[test]
fn every_constructor_names_itself_in_its_errors() {
    for (r, op) in [
        (Tensor::zeros(&WRAPS, DType::F32, Device::Meta), "zeros"),
        (Tensor::ones(&WRAPS, DType::F32, Device::Meta), "ones"),
        (Tensor::full(&WRAPS, 1.0, DType::F32, Device::Meta), "full"),
        (Tensor::empty(&WRAPS, DType::F32, Device::Meta), "empty"),
        (Tensor::rand(&WRAPS, DType::F32, Device::Meta), "rand"),
        (Tensor::randn(&WRAPS, DType::F32, Device::Meta), "randn"),
    ] {
        numel_overflow(r, op, &WRAPS);
    }
    // [3, 2^60] f32 has a describable count but 3 × 2^62 bytes.
    #[track_caller]
    fn storage_overflow(r: berth::Result<impl std::fmt::Debug>, op: &str) {
        let e = r.unwrap_err();
        assert!(
            matches!(&e, Error::StorageSizeOverflow { op: o, dtype: DType::F32, numel, .. }
                if *o == op && *numel == 3 << 60),
            "{e:?}"
        );
        assert!(
            e.to_string().starts_with(&format!("{op}: Storage size")),
            "{e}"
        );
    }
    let x = Tensor::zeros(&[1 << 60], DType::F32, Device::Meta).unwrap();
    storage_overflow(Tensor::stack(&[&x, &x, &x], 0), "stack");
    storage_overflow(Tensor::cat(&[&x, &x, &x], 0), "cat");
    storage_overflow(berth::nn::Linear::new(1 << 60, 3, Device::Meta), "Linear");
    storage_overflow(
        Tensor::randn(&[3, 1 << 60], DType::F32, Device::Meta),
        "randn",
    );
    // Dtype checks name the function too.
    let e = Tensor::randn(&[2], DType::I64, Device::Cpu).unwrap_err();
    assert!(
        matches!(e, Error::UnsupportedDType { op: "randn", .. }),
        "{e:?}"
    );
    let e = Tensor::ones(&[2], DType::U8, Device::Cpu)
        .unwrap()
        .to_empty(Device::Meta)
        .unwrap();
    assert_eq!((e.shape(), e.dtype()), (&[2usize][..], DType::U8));
}

/// A device allocator's out-of-memory (here a simulated device's), as it reaches berth's error
/// whichever way it is wrapped: directly (`Error::Alloc`) or through the CUDA layer
/// (`Error::Cuda(CudaError::Alloc)`, the way CUDA tensors report it). Both answer
/// `is_out_of_memory()`; a non-memory error of the same shapes does not.
#[test]
fn an_allocator_out_of_memory_is_out_of_memory_through_every_layer() {
    use berth::alloc::backend::sim::SimBackend;
    use berth::alloc::{AllocError, Policy, StreamId};
    use berth::cuda::CudaError;
    for p in Policy::ALL {
        let alloc =
            berth::alloc::device_allocator(SimBackend::new(64 << 20), p.config("").unwrap(), 0)
                .unwrap();
        let oom = alloc.raw_alloc(1 << 30, StreamId::DEFAULT).unwrap_err();
        assert!(oom.is_out_of_memory(), "{p}: {oom}");
        let direct = Error::Alloc(oom.clone());
        let through_cuda = Error::from(CudaError::Alloc {
            device: 0,
            source: oom,
        });
        assert!(direct.is_out_of_memory(), "{p}: {direct}");
        assert!(through_cuda.is_out_of_memory(), "{p}: {through_cuda}");
    }
    let not_oom = AllocError::InvalidFraction { fraction: 2.0 };
    assert!(!Error::Alloc(not_oom.clone()).is_out_of_memory());
    assert!(!Error::from(CudaError::Alloc {
        device: 0,
        source: not_oom
    })
    .is_out_of_memory());
}
