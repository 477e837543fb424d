//! Known PyTorch surprises the tensor layer must get right (aliasing of `.to()`, `contiguous()`
//! and `detach()`, meta tensors, out-of-range device indices), each test named after the
//! behaviour it checks, with the public bug report above it.

use berth::nn::{Linear, Module};
use berth::{storage, DType, Device, Error, Tensor};

use crate::util::v;

/// `.to()` / `.cpu()` return the same tensor when nothing changes.
/// <https://github.com/pytorch/pytorch/issues/12454>
#[test]
fn to_returns_self_when_nothing_changes() {
    let x = Tensor::ones(&[3], DType::F32, Device::Cpu).unwrap();
    let y = x.to_device(Device::Cpu).unwrap();
    y.add_scalar_(1.0).unwrap();
    assert_eq!(v(&x), vec![2.0, 2.0, 2.0]);
    assert!(x.to_dtype(DType::F32).unwrap().shares_storage(&x));
    assert!(x.cpu().unwrap().shares_storage(&x));
    assert_eq!(x.cpu().unwrap().data_ptr(), x.data_ptr());
    let c = x.to(Device::Cpu, DType::F32, false, true).unwrap();
    assert!(!c.shares_storage(&x));
    assert!(!x.to_dtype(DType::F64).unwrap().shares_storage(&x));
}

/// Device part: `cuda()`, `to("cuda")`, `to("cuda:0")` on a tensor already on the
/// current device are the same storage; `cpu()` of it is new.
/// <https://github.com/pytorch/pytorch/issues/12454>
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn device_to_returns_self_on_the_current_device() {
    if !berth::cuda::testing::require_gpu("device_to_returns_self_on_the_current_device") {
        return;
    }
    let x = match Tensor::ones(&[3], DType::F32, Device::Cuda(0)) {
        Ok(x) => x,
        Err(e) => panic!("allocation on cuda:0 failed: {e}"),
    };
    for y in [
        x.cuda().unwrap(),
        x.to_device("cuda".parse().unwrap()).unwrap(),
        x.to_device("cuda:0".parse().unwrap()).unwrap(),
    ] {
        assert!(y.shares_storage(&x));
    }
    let h = x.cpu().unwrap();
    assert!(!h.shares_storage(&x));
    assert_eq!(h.to_vec::<f32>().unwrap(), vec![1.0; 3]);
}

/// `contiguous()` and `detach()` alias; `clone()` of a narrowed view is dense.
/// <https://github.com/pytorch/pytorch/issues/35990>,
/// <https://github.com/huggingface/candle/issues/1930>
#[test]
fn contiguous_and_detach_alias_the_source() {
    // (a)
    let x = Tensor::arange(0.0, 6.0, 1.0, DType::I64, Device::Cpu)
        .unwrap()
        .reshape(&[2, 3])
        .unwrap();
    assert!(x.contiguous().unwrap().shares_storage(&x));
    let tc = x.t().unwrap().contiguous().unwrap();
    assert!(!tc.shares_storage(&x));
    assert_eq!(tc.strides(), &[2, 1]);
    assert_eq!(tc.to_vec::<i64>().unwrap(), vec![0, 3, 1, 4, 2, 5]);
    // (b)
    let n = Tensor::zeros(&[2, 10], DType::F32, Device::Cpu)
        .unwrap()
        .narrow(1, 0, 5)
        .unwrap();
    assert_eq!(n.strides(), &[10, 1]);
    assert!(!n.is_contiguous());
    let c = n.clone().unwrap();
    assert_eq!(c.strides(), &[5, 1]);
    assert!(c.is_contiguous());
    // (c)
    let x = Tensor::zeros(&[3], DType::F32, Device::Cpu)
        .unwrap()
        .with_requires_grad(true)
        .unwrap();
    let d = x.detach();
    d.add_scalar_(5.0).unwrap();
    assert_eq!(v(&x), vec![5.0, 5.0, 5.0]);
    assert!(!d.requires_grad());
    assert_eq!(d.data_ptr(), x.data_ptr());
    let mut d2 = x.detach();
    d2.resize_(&[5]).unwrap();
    assert_eq!(d2.shape(), &[5]);
    assert_eq!(x.shape(), &[3]);
    assert_eq!(v(&x), vec![5.0, 5.0, 5.0]);
}

/// Reading values of a meta tensor is one error kind with PyTorch's message.
/// <https://github.com/pytorch/pytorch/issues/119588>
#[test]
fn reading_meta_values_is_a_no_data_error() {
    let item = Tensor::ones(&[2], DType::F32, Device::Meta)
        .unwrap()
        .sum()
        .unwrap()
        .item::<f32>()
        .unwrap_err();
    let tolist = Tensor::ones(&[5], DType::F32, Device::Meta)
        .unwrap()
        .to_vec::<f32>()
        .unwrap_err();
    for e in [&item, &tolist] {
        assert!(matches!(e, Error::MetaNoData { .. }), "{e:?}");
        assert!(
            e.to_string().contains("cannot be called on meta tensors"),
            "{e}"
        );
    }
    assert!(
        item.to_string()
            .starts_with("Tensor.item() cannot be called on meta tensors"),
        "{item}"
    );
    // A constructor computing values from linspace-like data while on meta fails the same way.
    let steps = Tensor::arange(0.0, 4.0, 1.0, DType::F32, Device::Meta).unwrap();
    let e = steps
        .mul_scalar(0.1 / 3.0)
        .unwrap()
        .select(0, 1)
        .unwrap()
        .item::<f32>()
        .unwrap_err();
    assert!(matches!(e, Error::MetaNoData { .. }), "{e:?}");
}

/// `to(cpu)` from meta → "Cannot copy out of meta tensor; no data!"; `to_empty`
/// works.
/// <https://github.com/pytorch/pytorch/pull/53143>
#[test]
fn to_cpu_from_meta_fails_and_to_empty_materialises() {
    let e = Tensor::ones(&[5], DType::F32, Device::Meta)
        .unwrap()
        .to_device(Device::Cpu)
        .unwrap_err();
    assert!(matches!(e, Error::MetaNoData { .. }), "{e:?}");
    assert!(
        e.to_string()
            .contains("Cannot copy out of meta tensor; no data!"),
        "{e}"
    );
    let mut l = Linear::new(1024, 4096, Device::Meta).unwrap();
    l.to_empty(Device::Cpu).unwrap();
    assert_eq!(
        (l.weight.shape(), l.weight.device()),
        (&[4096usize, 1024][..], Device::Cpu)
    );
    assert_eq!(l.bias.as_ref().unwrap().device(), Device::Cpu);
    // A real tensor now: values can be written and read.
    l.weight.fill_(1.0).unwrap();
    assert_eq!(
        l.weight.sum().unwrap().item::<f32>().unwrap(),
        (4096 * 1024) as f32
    );
}

/// Meta shape inference that must hold, and an explicit error for a missing rule.
/// <https://github.com/mlverse/torch/issues/877>
#[test]
fn meta_shape_inference_and_missing_rules() {
    let before = storage::host_memory_allocated();
    let a = Tensor::empty(&[2, 3], DType::F32, Device::Meta).unwrap();
    let b = Tensor::empty(&[3, 4], DType::F32, Device::Meta).unwrap();
    let p = a.matmul(&b).unwrap();
    assert_eq!(
        (p.shape(), p.device(), p.nbytes()),
        (&[2usize, 4][..], Device::Meta, 32)
    );
    let l = Linear::new(1024, 4096, Device::Meta).unwrap();
    assert_eq!(
        (l.weight.shape(), l.weight.device()),
        (&[4096usize, 1024][..], Device::Meta)
    );
    assert!(storage::host_memory_allocated().saturating_sub(before) < 1 << 20);
    // An op without a meta rule: the kernel table refuses meta explicitly.
    let e = berth::device_kernels::kernels_for(Device::Meta, "conv2d")
        .err()
        .unwrap();
    assert!(matches!(e, Error::NoMetaImpl { op: "conv2d" }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "no meta implementation for conv2d: it cannot run on the meta device"
    );
    // Same shape and strides as the real kernel.
    let c = Tensor::zeros(&[2, 3], DType::F32, Device::Cpu)
        .unwrap()
        .matmul(&Tensor::zeros(&[3, 4], DType::F32, Device::Cpu).unwrap())
        .unwrap();
    assert_eq!((c.shape(), c.strides()), (p.shape(), p.strides()));
    let _ = l
        .forward(&Tensor::empty(&[8, 1024], DType::F32, Device::Meta).unwrap())
        .unwrap();
}

/// `cuda:5` parses; every use with one visible device is "device index 5 is out of
/// range [0, 1)"; bad strings are parse errors; the process stays usable.
/// <https://github.com/pytorch/pytorch/issues/136849>
#[test]
fn out_of_range_device_index_sim() {
    let _one = berth::cuda::testing::fake_device_count(1);
    let d: Device = "cuda:5".parse().unwrap();
    assert_eq!((d.kind(), d.index()), (berth::DeviceKind::Cuda, Some(5)));
    let uses = [
        Tensor::zeros(&[2], DType::F32, d).unwrap_err(),
        Tensor::ones(&[2], DType::F32, Device::Cpu)
            .unwrap()
            .to_device(d)
            .unwrap_err(),
        d.canonical().unwrap_err(),
    ];
    for e in uses {
        assert!(
            matches!(
                e,
                Error::Cuda(berth::cuda::CudaError::InvalidDevice { index: 5, count: 1 })
            ),
            "{e:?}"
        );
        assert!(
            e.to_string()
                .starts_with("device index 5 is out of range [0, 1)"),
            "{e}"
        );
    }
    for s in ["cuda:-1", "cuda:"] {
        assert!(s.parse::<Device>().is_err(), "{s}");
    }
    let gpu = "gpu".parse::<Device>().unwrap_err().to_string();
    assert!(gpu.contains("cpu, cuda, cuda:<index>, mps, meta"), "{gpu}");
    // The process is still usable.
    assert_eq!(
        Tensor::ones(&[2], DType::F32, Device::Cpu)
            .unwrap()
            .sum()
            .unwrap()
            .item::<f32>()
            .unwrap(),
        2.0
    );
}

/// The out-of-range device index on a real GPU: the same error from the driver-reported count.
/// <https://github.com/pytorch/pytorch/issues/136849>
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn out_of_range_device_index_gpu() {
    if !berth::cuda::testing::require_gpu("out_of_range_device_index_gpu") {
        return;
    }
    let n = berth::cuda::device_count();
    let d = Device::Cuda(n as u16);
    let e = Tensor::zeros(&[2], DType::F32, d).unwrap_err();
    assert!(
        e.to_string()
            .starts_with(&format!("device index {n} is out of range [0, {n})")),
        "{e}"
    );
    let ok = Tensor::zeros(&[2], DType::F32, Device::Cuda(0)).unwrap();
    assert_eq!(ok.device(), Device::Cuda(0));
}

/// An empty view whose offset lies past its storage (narrowing to zero elements at the end of
/// each dimension) reduces and gathers as PyTorch does: `sum` 0, `mean` NaN, an empty
/// `index_select`, never an index out of range (newcomer pass 2026-12-03, defect 1).
#[test]
fn empty_views_past_their_storage_reduce_and_gather_without_panicking() {
    let a = Tensor::arange(0.0, 24.0, 1.0, DType::F32, Device::Cpu)
        .unwrap()
        .reshape(&[2, 3, 4])
        .unwrap();
    let c = a.narrow(0, 2, 0).unwrap().narrow(1, 3, 0).unwrap();
    let d = c.narrow(2, 4, 0).unwrap();
    assert!(d.storage_offset() > 24, "the view starts past the storage");
    assert_eq!(d.sum().unwrap().item::<f32>().unwrap(), 0.0);
    assert!(d.mean().unwrap().item::<f32>().unwrap().is_nan());
    let idx = Tensor::zeros(&[0], DType::I64, Device::Cpu).unwrap();
    assert_eq!(d.index_select(0, &idx).unwrap().shape(), &[0, 0, 0]);
    assert_eq!(c.sum_dim(2, false).unwrap().shape(), &[0, 0]);
    assert_eq!(d.contiguous().unwrap().numel(), 0);
    assert_eq!(Tensor::cat(&[&d, &d], 0).unwrap().shape(), &[0, 0, 0]);
}

/// An empty tensor built from parts at an offset far past its storage (`usize::MAX`) answers
/// every operation as an empty tensor (newcomer pass 2026-12-03, defect 1).
#[test]
fn an_empty_tensor_at_any_offset_is_just_empty() {
    let st = std::sync::Arc::new(berth::Storage::try_host_zeroed(16).unwrap());
    for off in [5, usize::MAX] {
        let t = Tensor::from_parts(
            st.clone(),
            berth::Layout::from_parts(vec![0], vec![1], off),
            DType::F32,
        )
        .unwrap();
        assert_eq!(t.contiguous().unwrap().numel(), 0);
        assert!(t.to_vec::<f32>().unwrap().is_empty());
        assert_eq!(t.sum().unwrap().item::<f32>().unwrap(), 0.0);
        assert_eq!(t.to_dtype(DType::F16).unwrap().numel(), 0);
        assert_eq!(t.add(&t).unwrap().numel(), 0);
        assert_eq!(t.clone().unwrap().numel(), 0);
        t.fill_(1.0).unwrap();
        t.copy_(&Tensor::zeros(&[0], DType::F32, Device::Cpu).unwrap())
            .unwrap();
        assert!(format!("{t}").contains("[]"), "{t}");
    }
}
