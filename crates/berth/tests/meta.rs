//! The meta device: every op infers shape and dtype with the CPU's checks and allocates
//! nothing; reading values is one typed error.

use berth::nn::{Linear, Module};
use berth::{storage, DType, Device, Error, Tensor};

fn meta(shape: &[usize]) -> Tensor {
    Tensor::empty(shape, DType::F32, Device::Meta).unwrap()
}

#[test]
fn every_op_on_meta_gives_the_cpu_shape_and_dtype() {
    let cpu = |shape: &[usize]| Tensor::ones(shape, DType::F32, Device::Cpu).unwrap();
    type Op = fn(&Tensor, &Tensor) -> berth::Result<Tensor>;
    let ops: [(&str, Op); 10] = [
        ("add", |a, b| a.add(b)),
        ("mul", |a, b| a.mul(b)),
        ("matmul", |a, b| a.matmul(&b.t()?)),
        ("eq", |a, b| a.eq(b)),
        ("sum_dim", |a, _| a.sum_dim(1, true)),
        ("argmax", |a, _| a.argmax_dim(-1, false)),
        ("softmax", |a, _| a.softmax(0)),
        ("relu", |a, _| a.relu()),
        ("mean", |a, _| a.mean()),
        ("to_dtype", |a, _| a.to_dtype(DType::BF16)),
    ];
    for (name, op) in ops {
        let (m, c) = (
            op(&meta(&[4, 3]), &meta(&[3])),
            op(&cpu(&[4, 3]), &cpu(&[3])),
        );
        let (m, c) = match (m, c) {
            (Ok(m), Ok(c)) => (m, c),
            // matmul's [4,3]@[3]ᵀ: same typed error on both.
            (Err(m), Err(c)) => {
                assert_eq!(m.to_string(), c.to_string(), "{name}");
                continue;
            }
            (m, c) => panic!("{name}: meta {m:?} vs cpu {c:?}"),
        };
        assert_eq!((m.shape(), m.dtype()), (c.shape(), c.dtype()), "{name}");
        assert_eq!(m.device(), Device::Meta, "{name}");
        assert_eq!(m.strides(), c.strides(), "{name}");
    }
}

#[test]
fn mismatched_matmul_fails_identically_on_meta_and_cpu() {
    let m = meta(&[2, 3]).matmul(&meta(&[4, 5])).unwrap_err();
    let c = Tensor::zeros(&[2, 3], DType::F32, Device::Cpu)
        .unwrap()
        .matmul(&Tensor::zeros(&[4, 5], DType::F32, Device::Cpu).unwrap())
        .unwrap_err();
    assert!(matches!(m, Error::MatmulShape { .. }));
    assert_eq!(m.to_string(), c.to_string());
}

#[test]
fn linear_1024_on_meta_applied_to_randn_allocates_zero_bytes() {
    let before = storage::host_memory_allocated();
    let layer = Linear::new(1024, 1024, Device::Meta).unwrap();
    let x = Tensor::randn(&[8, 1024], DType::F32, Device::Meta).unwrap();
    let y = layer.forward(&x).unwrap();
    assert_eq!((y.shape(), y.device()), (&[8usize, 1024][..], Device::Meta));
    assert_eq!(y.nbytes(), 8 * 1024 * 4);
    assert_eq!(y.data_ptr(), 0);
    assert_eq!(layer.weight.shape(), &[1024, 1024]);
    // No host bytes were taken by the meta tensors (other tests may allocate concurrently,
    // so compare against a bound far below the 4 MiB a real weight would need).
    let grown = storage::host_memory_allocated().saturating_sub(before);
    assert!(grown < 1 << 20, "grew by {grown} bytes");
}

#[test]
fn reading_meta_is_one_typed_error_with_both_torch_messages() {
    let x = Tensor::ones(&[2], DType::F32, Device::Meta).unwrap();
    for e in [
        x.sum().unwrap().item::<f32>().unwrap_err(),
        x.to_vec::<f32>().unwrap_err(),
        x.cpu().unwrap_err(),
        Tensor::zeros(&[2], DType::F32, Device::Cpu)
            .unwrap()
            .copy_(&x)
            .unwrap_err(),
    ] {
        assert!(matches!(e, Error::MetaNoData { .. }), "{e:?}");
        let msg = e.to_string();
        assert!(msg.contains("cannot be called on meta tensors"), "{msg}");
        assert!(
            msg.contains("Cannot copy out of meta tensor; no data!"),
            "{msg}"
        );
    }
    // In-place ops on meta are shape-checked no-ops.
    x.add_scalar_(1.0).unwrap();
    assert!(x
        .add_(&Tensor::ones(&[3], DType::F32, Device::Meta).unwrap())
        .is_err());
}

/// Each guard deactivates its own plan, whatever the order guards are dropped in: dropping the
/// outer guard first left the inner plan's guard deactivating the outer plan.
#[test]
fn plan_guards_dropped_out_of_order_deactivate_their_own_plan() {
    use berth::alloc::AllocatorConfig;
    use berth::meta_plan::MetaPlan;
    let plan = || {
        MetaPlan::with_config(1 << 30, AllocatorConfig::parse("backend:native").unwrap()).unwrap()
    };
    let (p1, p2) = (plan(), plan());
    let g1 = p1.activate();
    let g2 = p2.activate();
    let _a = Tensor::zeros(&[1000], DType::F32, Device::Meta).unwrap();
    drop(g1);
    let _b = Tensor::zeros(&[1000], DType::F32, Device::Meta).unwrap();
    assert_eq!(
        (p1.max_memory_allocated(), p2.max_memory_allocated()),
        (0, 8192)
    );
    drop(g2);
    let _c = Tensor::zeros(&[1000], DType::F32, Device::Meta).unwrap();
    assert_eq!(
        (p1.max_memory_allocated(), p2.max_memory_allocated()),
        (0, 8192)
    );
}

/// A tensor that does not fit the plan's device is counted by `num_ooms` and left out of the
/// peak; meta code itself goes on.
#[test]
fn a_plan_counts_what_does_not_fit() {
    use berth::alloc::AllocatorConfig;
    use berth::meta_plan::MetaPlan;
    for conf in ["backend:native", "backend:paged"] {
        let plan = MetaPlan::with_config(1 << 20, AllocatorConfig::parse(conf).unwrap()).unwrap();
        let _g = plan.activate();
        let t = Tensor::zeros(&[1024, 1024], DType::F32, Device::Meta).unwrap();
        assert_eq!(t.shape(), [1024, 1024]);
        assert_eq!(plan.num_ooms(), 1, "{conf}");
        assert_eq!(plan.max_memory_allocated(), 0, "{conf}");
        assert_eq!(plan.num_ooms(), plan.stats().num_ooms as u64);
    }
}
