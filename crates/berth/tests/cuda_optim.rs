//! GPU tests of the fused optimiser kernels (`Note [Fused updates are exact]`): the multi-tensor
//! SGD update and the one-kernel `add_scaled_` on `cuda:0` give bit for bit what the unfused
//! CUDA tensor ops give, and what the host gives. Ignored unless run with `--include-ignored`;
//! then skipped with a message without a GPU unless `BERTH_REQUIRE_GPU=1`.

use berth::cuda::testing;
use berth::optim::sgd_momentum_;
use berth::{DType, Device, Generator, Tensor};

use super::optim::{bits, r, randn, step_unfused};

const GPU: Device = Device::Cuda(0);

/// `bits` with every NaN pattern (f32 or f64) replaced by one value.
fn nan_as_one(v: Vec<u64>) -> Vec<u64> {
    let nan =
        |b: u64| f32::from_bits(b as u32).is_nan() && b >> 32 == 0 || f64::from_bits(b).is_nan();
    v.into_iter()
        .map(|b| if nan(b) { u64::MAX } else { b })
        .collect()
}

/// Five steps of the MLP's four parameters plus 20 small ones (two launches of at most 16
/// tensors), f32 and f64, the first step (`v ← g` into an uninitialised buffer) included:
/// the fused CUDA update equals the unfused CUDA ops and the host's fused update bit for bit.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn cuda_fused_sgd_is_bit_identical_to_the_unfused_ops_and_the_host() {
    if !testing::require_gpu("cuda_fused_sgd_is_bit_identical_to_the_unfused_ops_and_the_host") {
        return;
    }
    for dtype in [DType::F32, DType::F64] {
        let mut gen = Generator::new(21);
        let mut shapes: Vec<Vec<usize>> = vec![vec![256, 784], vec![256], vec![10, 256], vec![10]];
        shapes.extend((0..20).map(|i| vec![i * 37 % 101])); // sizes 0..100, one empty
        let host: Vec<Tensor> = shapes.iter().map(|s| randn(s, dtype, &mut gen)).collect();
        let fused: Vec<Tensor> = host.iter().map(|p| p.to_device(GPU).unwrap()).collect();
        let plain: Vec<Tensor> = host.iter().map(|p| p.to_device(GPU).unwrap()).collect();
        let empty = |dev| -> Vec<Tensor> {
            shapes
                .iter()
                .map(|s| Tensor::empty(s, dtype, dev).unwrap())
                .collect()
        };
        let (vf, vp, vh) = (empty(GPU), empty(GPU), empty(Device::Cpu));
        for step in 0..5 {
            let gh: Vec<Tensor> = shapes.iter().map(|s| randn(s, dtype, &mut gen)).collect();
            let gd: Vec<Tensor> = gh.iter().map(|g| g.to_device(GPU).unwrap()).collect();
            let first = step == 0;
            sgd_momentum_(&r(&fused), &r(&gd), &r(&vf), 0.05, 0.9, first).unwrap();
            sgd_momentum_(&r(&host), &r(&gh), &r(&vh), 0.05, 0.9, first).unwrap();
            for ((p, g), v) in plain.iter().zip(&gd).zip(&vp) {
                step_unfused(p, g, v, 0.05, 0.9, first);
            }
            for i in 0..shapes.len() {
                let what = format!("{dtype} step {step} param {i} {:?}", shapes[i]);
                assert_eq!(bits(&fused[i]), bits(&plain[i]), "{what}: fused vs unfused");
                assert_eq!(bits(&vf[i]), bits(&vp[i]), "{what}: buffers");
                assert_eq!(bits(&fused[i]), bits(&host[i]), "{what}: cuda vs host");
            }
        }
    }
}

/// `berth train`'s optimiser on CUDA, step by step, against the unfused ops.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn cuda_sgd_optimizer_matches_the_unfused_ops() {
    if !testing::require_gpu("cuda_sgd_optimizer_matches_the_unfused_ops") {
        return;
    }
    let mut gen = Generator::new(3);
    let p = randn(&[64, 33], DType::F32, &mut gen)
        .to_device(GPU)
        .unwrap();
    let q = p.clone().unwrap();
    let vq = Tensor::empty(&[64, 33], DType::F32, GPU).unwrap();
    let mut opt = berth::optim::Sgd::new(0.01, 0.8);
    for step in 0..4 {
        let g = randn(&[64, 33], DType::F32, &mut gen)
            .to_device(GPU)
            .unwrap();
        opt.step(&[&p], &[&g]).unwrap();
        step_unfused(&q, &g, &vq, 0.01, 0.8, step == 0);
        assert_eq!(bits(&p), bits(&q), "step {step}");
    }
}

/// The one-kernel `relu_backward` equals `gt_scalar`, `to_dtype`, `mul` on CUDA (signed zeros,
/// infinities and NaNs included) and the host's result.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn cuda_relu_backward_is_bit_identical_to_the_mask_multiply() {
    if !testing::require_gpu("cuda_relu_backward_is_bit_identical_to_the_mask_multiply") {
        return;
    }
    let special = [
        0.0,
        -0.0,
        1.5,
        -2.0,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
    ];
    let (mut g, mut x) = (Vec::new(), Vec::new());
    for &a in &special {
        for &b in &special {
            g.push(a);
            x.push(b);
        }
    }
    let mut gen = Generator::new(2);
    for dtype in [DType::F32, DType::F64] {
        let t = |v: &[f64]| {
            Tensor::from_vec(v.to_vec(), &[v.len()], Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap()
        };
        let cases = [
            (t(&g), t(&x)),
            (
                randn(&[64, 256], dtype, &mut gen),
                randn(&[64, 256], dtype, &mut gen),
            ),
        ];
        for (gh, xh) in cases {
            let (gd, xd) = (gh.to_device(GPU).unwrap(), xh.to_device(GPU).unwrap());
            let mask = xd.gt_scalar(0.0).unwrap().to_dtype(dtype).unwrap();
            let fused = gd.relu_backward(&xd).unwrap();
            assert_eq!(
                bits(&fused),
                bits(&gd.mul(&mask).unwrap()),
                "{dtype}: fused vs unfused"
            );
            // NaN bit patterns differ between the GPU (canonical 0x7fffffff) and x86.
            assert_eq!(
                nan_as_one(bits(&fused)),
                nan_as_one(bits(&gh.relu_backward(&xh).unwrap())),
                "{dtype}: cuda vs host"
            );
        }
    }
}

/// The one-kernel `add_scaled_` (no FMA contraction) equals `mul_scalar` then `add_` on CUDA
/// and the host's result, in f32 and f64; a 0-d accumulator too.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn cuda_add_scaled_is_bit_identical_to_mul_then_add() {
    if !testing::require_gpu("cuda_add_scaled_is_bit_identical_to_mul_then_add") {
        return;
    }
    for dtype in [DType::F32, DType::F64] {
        for shape in [vec![], vec![1], vec![1000], vec![300, 301]] {
            let mut gen = Generator::new(9);
            let (ah, xh) = (
                randn(&shape, dtype, &mut gen),
                randn(&shape, dtype, &mut gen),
            );
            let (a, x) = (ah.to_device(GPU).unwrap(), xh.to_device(GPU).unwrap());
            let b = a.clone().unwrap();
            a.add_scaled_(&x, -0.037).unwrap();
            b.add_(&x.mul_scalar(-0.037).unwrap()).unwrap();
            ah.add_scaled_(&xh, -0.037).unwrap();
            assert_eq!(bits(&a), bits(&b), "{dtype} {shape:?}: fused vs unfused");
            assert_eq!(bits(&a), bits(&ah), "{dtype} {shape:?}: cuda vs host");
        }
    }
}
