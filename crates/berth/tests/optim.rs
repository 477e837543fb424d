//! `berth::optim`: the fused SGD-with-momentum update and the one-kernel `add_scaled_` give
//! the same bits as the unfused tensor ops, on the CPU (`Note [Fused host SGD]`,
//! `Note [Fused updates are exact]`); the GPU versions are in `cuda_optim.rs`.

use berth::optim::{sgd_momentum_, Sgd};
use berth::{DType, Device, Error, Generator, Tensor};

/// The rayon chunk of the host kernels (`cpu::optim::CHUNK`): sizes around four of them take
/// the parallel path with a ragged last chunk.
const CHUNK: usize = 1 << 14;

pub(super) fn randn(shape: &[usize], dtype: DType, g: &mut Generator) -> Tensor {
    Tensor::randn_with(shape, DType::F32, Device::Cpu, g)
        .unwrap()
        .to_dtype(dtype)
        .unwrap()
}

pub(super) fn r(ts: &[Tensor]) -> Vec<&Tensor> {
    ts.iter().collect()
}

/// The bit patterns of `t`'s elements (f32 widened, f64 as is), read on the host.
pub(super) fn bits(t: &Tensor) -> Vec<u64> {
    let t = t.to_device(Device::Cpu).unwrap();
    match t.dtype() {
        DType::F32 => t
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|x| u64::from(x.to_bits()))
            .collect(),
        _ => t
            .to_vec::<f64>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect(),
    }
}

/// `p += v·alpha` the unfused way: a temporary and an `add_` (what `add_scaled_` did before
/// it became one kernel).
fn add_scaled_unfused(p: &Tensor, v: &Tensor, alpha: f64) {
    p.add_(&v.mul_scalar(alpha).unwrap()).unwrap();
}

/// One momentum step the unfused way: `v ← g` or `v ← v·μ + g`, then `p += v·(−lr)`.
pub(super) fn step_unfused(p: &Tensor, g: &Tensor, v: &Tensor, lr: f64, mu: f64, first: bool) {
    if first {
        v.copy_(g).unwrap();
    } else {
        v.mul_scalar_(mu).unwrap();
        v.add_(g).unwrap();
    }
    add_scaled_unfused(p, v, -lr);
}

/// The MLP's four parameter shapes plus one on the parallel path, each step with fresh
/// gradients: the fused update (one call for all of them) keeps the bits of the unfused ops
/// for five steps, the first (`v ← g`) included, in f32 and f64.
#[test]
fn optim_fused_sgd_is_bit_identical_to_the_tensor_ops_over_steps() {
    for dtype in [DType::F32, DType::F64] {
        let mut gen = Generator::new(11);
        let shapes: [&[usize]; 5] = [&[256, 784], &[256], &[10, 256], &[10], &[4 * CHUNK + 7]];
        let fused: Vec<Tensor> = shapes.iter().map(|s| randn(s, dtype, &mut gen)).collect();
        let plain: Vec<Tensor> = fused.iter().map(|p| p.clone().unwrap()).collect();
        let vf: Vec<Tensor> = shapes
            .iter()
            .map(|s| Tensor::full(s, 7.0, dtype, Device::Cpu).unwrap()) // overwritten by v ← g
            .collect();
        let vp: Vec<Tensor> = shapes
            .iter()
            .map(|s| Tensor::zeros(s, dtype, Device::Cpu).unwrap())
            .collect();
        for step in 0..5 {
            let grads: Vec<Tensor> = shapes.iter().map(|s| randn(s, dtype, &mut gen)).collect();
            let first = step == 0;
            sgd_momentum_(&r(&fused), &r(&grads), &r(&vf), 0.05, 0.9, first).unwrap();
            for ((p, g), v) in plain.iter().zip(&grads).zip(&vp) {
                step_unfused(p, g, v, 0.05, 0.9, first);
            }
            for i in 0..shapes.len() {
                assert_eq!(
                    bits(&fused[i]),
                    bits(&plain[i]),
                    "{dtype} step {step} param {i}"
                );
                assert_eq!(bits(&vf[i]), bits(&vp[i]), "{dtype} step {step} buffer {i}");
            }
        }
    }
}

/// Parameters the fused kernel does not take (a transposed view, a gradient aliasing its
/// parameter's storage, f16) go through the tensor ops, with the same result as the fused
/// parameters beside them.
#[test]
fn optim_unfused_parameters_take_the_tensor_ops_with_the_same_bits() {
    let mut gen = Generator::new(5);
    let base = randn(&[6, 9], DType::F32, &mut gen);
    let g = randn(&[9, 6], DType::F32, &mut gen);
    let (p_view, p_ref) = (base.clone().unwrap(), base.clone().unwrap());
    let pt = p_view.t().unwrap(); // [9, 6], not contiguous
    let contiguous = base.t().unwrap().contiguous().unwrap();
    let (v1, v2) = (
        Tensor::zeros(&[9, 6], DType::F32, Device::Cpu).unwrap(),
        Tensor::zeros(&[9, 6], DType::F32, Device::Cpu).unwrap(),
    );
    for first in [true, false] {
        sgd_momentum_(&[&pt, &contiguous], &[&g, &g], &[&v1, &v2], 0.1, 0.5, first).unwrap();
    }
    assert_eq!(bits(&pt.contiguous().unwrap()), bits(&contiguous));
    let _ = p_ref;
    // f16 is not fused: the tensor ops round to 16 bits at each op.
    let h = randn(&[33], DType::F16, &mut gen);
    let hg = randn(&[33], DType::F16, &mut gen);
    let hv = Tensor::zeros(&[33], DType::F16, Device::Cpu).unwrap();
    let (h2, hv2) = (h.clone().unwrap(), hv.clone().unwrap());
    sgd_momentum_(&[&h], &[&hg], &[&hv], 0.1, 0.5, true).unwrap();
    step_unfused(&h2, &hg, &hv2, 0.1, 0.5, true);
    let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(f(&h), f(&h2));
}

#[test]
fn optim_sgd_checks_its_operands_before_writing() {
    let z = |shape: &[usize], dtype| Tensor::zeros(shape, dtype, Device::Cpu).unwrap();
    let p = Tensor::ones(&[3], DType::F32, Device::Cpu).unwrap();
    let e = sgd_momentum_(&[&p], &[], &[], 0.1, 0.9, true).unwrap_err();
    assert!(
        matches!(
            e,
            Error::InvalidArgument {
                op: "fused_sgd",
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("1 parameters, 0 gradients"), "{e}");
    let e = sgd_momentum_(
        &[&p],
        &[&z(&[4], DType::F32)],
        &[&z(&[3], DType::F32)],
        0.1,
        0.9,
        true,
    )
    .unwrap_err();
    assert!(matches!(e, Error::Shape { .. }), "{e}");
    assert!(e.to_string().contains("gradient of shape [4]"), "{e}");
    let e = sgd_momentum_(
        &[&p],
        &[&z(&[3], DType::F32)],
        &[&z(&[3], DType::F64)],
        0.1,
        0.9,
        true,
    )
    .unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { .. }), "{e}");
    assert_eq!(p.to_vec::<f32>().unwrap(), vec![1.0; 3], "nothing written");
}

#[test]
fn optim_sgd_follows_pytorch_rule() {
    let p = Tensor::from_vec(vec![1.0f32, 2.0], &[2], Device::Cpu).unwrap();
    let g = Tensor::from_vec(vec![0.5f32, -1.0], &[2], Device::Cpu).unwrap();
    let mut opt = Sgd::new(0.1, 0.9);
    assert!(opt.momentum_buffers().is_none());
    opt.step(&[&p], &[&g]).unwrap();
    // v = g; p = p - 0.1 g
    assert_eq!(p.to_vec::<f32>().unwrap(), vec![0.95, 2.1]);
    assert_eq!(
        opt.momentum_buffers().unwrap()[0].to_vec::<f32>().unwrap(),
        vec![0.5, -1.0]
    );
    opt.step(&[&p], &[&g]).unwrap();
    // v = 0.9 g + g = 1.9 g; p -= 0.19 g
    let got = p.to_vec::<f32>().unwrap();
    assert!(
        (got[0] - 0.855).abs() < 1e-6 && (got[1] - 2.29).abs() < 1e-6,
        "{got:?}"
    );
    // Momentum 0: plain SGD, no buffers.
    let mut plain = Sgd::new(0.5, 0.0);
    plain.step(&[&p], &[&g]).unwrap();
    assert!(plain.momentum_buffers().is_none());
    let e = opt.step(&[&p, &g], &[&g, &p]).unwrap_err();
    assert!(e.to_string().contains("1 momentum buffers"), "{e}");
}

/// `relu_backward` as one kernel keeps the bits of `gt_scalar`, `to_dtype`, `mul`: signed
/// zeros, infinities and NaNs included.
#[test]
fn optim_relu_backward_is_bit_identical_to_the_mask_multiply() {
    for dtype in [DType::F32, DType::F64] {
        let special = [
            0.0,
            -0.0,
            1.5,
            -2.0,
            f64::INFINITY,
            f64::NEG_INFINITY,
            f64::NAN,
        ];
        let mut g: Vec<f64> = Vec::new();
        let mut x: Vec<f64> = Vec::new();
        for &a in &special {
            for &b in &special {
                g.push(a);
                x.push(b);
            }
        }
        let n = g.len();
        let t = |v: &[f64]| {
            Tensor::from_vec(v.to_vec(), &[v.len()], Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap()
        };
        let (gt, xt) = (t(&g), t(&x));
        let mask = xt.gt_scalar(0.0).unwrap().to_dtype(dtype).unwrap();
        assert_eq!(
            bits(&gt.relu_backward(&xt).unwrap()),
            bits(&gt.mul(&mask).unwrap())
        );
        // The parallel path.
        let mut gen = Generator::new(n as u64);
        let (gb, xb) = (
            randn(&[4 * CHUNK + 5], dtype, &mut gen),
            randn(&[4 * CHUNK + 5], dtype, &mut gen),
        );
        let mask = xb.gt_scalar(0.0).unwrap().to_dtype(dtype).unwrap();
        assert_eq!(
            bits(&gb.relu_backward(&xb).unwrap()),
            bits(&gb.mul(&mask).unwrap())
        );
    }
}

/// `add_scaled_` as one kernel keeps the bits of `mul_scalar` then `add_` (f32, f64, the
/// parallel path included); other cases still take the two ops.
#[test]
fn optim_add_scaled_is_bit_identical_to_mul_then_add() {
    for dtype in [DType::F32, DType::F64] {
        for n in [1, 1000, 4 * CHUNK + 3] {
            let mut gen = Generator::new(n as u64);
            let (a, x) = (randn(&[n], dtype, &mut gen), randn(&[n], dtype, &mut gen));
            let b = a.clone().unwrap();
            a.add_scaled_(&x, -0.037).unwrap();
            add_scaled_unfused(&b, &x, -0.037);
            assert_eq!(bits(&a), bits(&b), "{dtype} n={n}");
        }
    }
    // A 0-d loss accumulator, as `berth train` keeps one.
    let sum = Tensor::zeros(&[], DType::F32, Device::Cpu).unwrap();
    sum.add_scaled_(&Tensor::scalar(0.25f32), 64.0).unwrap();
    assert_eq!(sum.item::<f32>().unwrap(), 16.0);
    // Broadcast and aliased operands take the two ops.
    let m = Tensor::ones(&[2, 3], DType::F32, Device::Cpu).unwrap();
    m.add_scaled_(
        &Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3], Device::Cpu).unwrap(),
        2.0,
    )
    .unwrap();
    assert_eq!(
        m.to_vec::<f32>().unwrap(),
        vec![3.0, 5.0, 7.0, 3.0, 5.0, 7.0]
    );
    m.add_scaled_(&m, -0.5).unwrap();
    assert_eq!(
        m.to_vec::<f32>().unwrap(),
        vec![1.5, 2.5, 3.5, 1.5, 2.5, 3.5]
    );
}
