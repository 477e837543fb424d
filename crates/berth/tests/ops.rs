//! CPU ops against PyTorch's values.

use berth::{DType, Device, Error, Tensor};

use crate::util::{close, t, v};

#[test]
fn elementwise_with_broadcasting() {
    let a = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let b = t(&[10.0, 20.0, 30.0], &[3]);
    assert_eq!(
        v(&a.add(&b).unwrap()),
        vec![11.0, 22.0, 33.0, 14.0, 25.0, 36.0]
    );
    let col = t(&[1.0, 2.0], &[2, 1]);
    assert_eq!(v(&a.sub(&col).unwrap()), vec![0.0, 1.0, 2.0, 2.0, 3.0, 4.0]);
    assert_eq!(
        v(&a.mul(&col).unwrap()),
        vec![1.0, 2.0, 3.0, 8.0, 10.0, 12.0]
    );
    close(
        &v(&a.div(&b).unwrap()),
        &[0.1, 0.1, 0.1, 0.4, 0.25, 0.2],
        1e-6,
    );
    // [2,1] + [3] → [2,3]
    assert_eq!(col.add(&b).unwrap().shape(), &[2, 3]);
    let e = a.add(&t(&[1.0, 2.0], &[2])).unwrap_err();
    assert!(matches!(e, Error::BroadcastMismatch { .. }), "{e:?}");
    assert!(
        e.to_string().contains("[2, 3]") && e.to_string().contains("[2]"),
        "{e}"
    );
    // Strided inputs: the transpose.
    assert_eq!(
        v(&a.t().unwrap().add_scalar(1.0).unwrap()),
        vec![2.0, 5.0, 3.0, 6.0, 4.0, 7.0]
    );
}

#[test]
fn scalar_and_unary_ops_match_torch() {
    let x = t(&[-1.0, 0.0, 1.0, 4.0], &[4]);
    assert_eq!(v(&x.neg().unwrap()), vec![1.0, 0.0, -1.0, -4.0]);
    assert_eq!(v(&x.relu().unwrap()), vec![0.0, 0.0, 1.0, 4.0]);
    close(
        &v(&x.exp().unwrap()),
        &[0.367_879_4, 1.0, std::f32::consts::E, 54.598_15],
        1e-4,
    );
    let l = v(&x.log().unwrap());
    assert!(l[0].is_nan() && l[1] == f32::NEG_INFINITY && l[2] == 0.0);
    close(&l[3..], &[1.386_294_4], 1e-6);
    close(&v(&x.sqrt().unwrap())[2..], &[1.0, 2.0], 0.0);
    close(&v(&x.pow_scalar(2.0).unwrap()), &[1.0, 0.0, 1.0, 16.0], 0.0);
    close(
        &v(&x.pow(&t(&[3.0, 2.0, 2.0, 0.5], &[4])).unwrap()),
        &[-1.0, 0.0, 1.0, 2.0],
        1e-6,
    );
    assert_eq!(v(&x.rsub_scalar(1.0).unwrap()), vec![2.0, 1.0, 0.0, -3.0]);
    assert_eq!(
        v(&x.mul_scalar(2.0).unwrap().div_scalar(4.0).unwrap()),
        vec![-0.5, 0.0, 0.5, 2.0]
    );
    // Integers: add works, exp and div are float-only.
    let i = Tensor::from_slice(&[1i64, 2, 3], &[3], Device::Cpu).unwrap();
    assert_eq!(i.add(&i).unwrap().to_vec::<i64>().unwrap(), vec![2, 4, 6]);
    assert!(matches!(
        i.exp().unwrap_err(),
        Error::UnsupportedDType { .. }
    ));
    assert!(matches!(
        i.div(&i).unwrap_err(),
        Error::UnsupportedDType { .. }
    ));
    // Mixed dtypes are not promoted implicitly.
    assert!(matches!(
        x.add(&x.to_dtype(DType::F64).unwrap()).unwrap_err(),
        Error::DTypeMismatch { .. }
    ));
}

#[test]
fn half_types_compute_in_f32() {
    let x = t(&[1.0, 2.0, 3.0], &[3]).to_dtype(DType::BF16).unwrap();
    let y = x.mul(&x).unwrap().sum().unwrap();
    assert_eq!(y.dtype(), DType::BF16);
    assert_eq!(y.item::<f32>().unwrap(), 14.0);
    let h = t(&[0.5, 0.25], &[2]).half().unwrap();
    assert_eq!(v(&h.add(&h).unwrap()), vec![1.0, 0.5]);
}

#[test]
fn reductions_all_and_per_dim_with_keepdim() {
    let a = t(&[1.0, 5.0, 3.0, 4.0, 2.0, 6.0], &[2, 3]);
    assert_eq!(a.sum().unwrap().item::<f32>().unwrap(), 21.0);
    assert_eq!(a.mean().unwrap().item::<f32>().unwrap(), 3.5);
    assert_eq!(v(&a.sum_dim(0, false).unwrap()), vec![5.0, 7.0, 9.0]);
    let k = a.sum_dim(1, true).unwrap();
    assert_eq!((k.shape(), v(&k)), (&[2usize, 1][..], vec![9.0, 12.0]));
    assert_eq!(v(&a.mean_dim(-1, false).unwrap()), vec![3.0, 4.0]);
    assert_eq!(a.max().unwrap().item::<f32>().unwrap(), 6.0);
    assert_eq!(v(&a.max_dim(1, false).unwrap()), vec![5.0, 6.0]);
    assert_eq!(v(&a.min_dim(0, false).unwrap()), vec![1.0, 2.0, 3.0]);
    let am = a.argmax().unwrap();
    assert_eq!((am.dtype(), am.item::<i64>().unwrap()), (DType::I64, 5));
    assert_eq!(
        a.argmax_dim(1, false).unwrap().to_vec::<i64>().unwrap(),
        vec![1, 2]
    );
    assert_eq!(a.argmax_dim(0, true).unwrap().shape(), &[1, 3]);
    // Ties: the first index, as torch on CPU.
    assert_eq!(
        t(&[2.0, 7.0, 7.0], &[3])
            .argmax()
            .unwrap()
            .item::<i64>()
            .unwrap(),
        1
    );
    // Reductions over a transposed (strided) view.
    assert_eq!(
        v(&a.t().unwrap().sum_dim(1, false).unwrap()),
        vec![5.0, 7.0, 9.0]
    );
    assert_eq!(
        v(&a.t().unwrap().sum_dim(0, false).unwrap()),
        vec![9.0, 12.0]
    );
    // Integer sums are i64; integer mean is an error, as torch.
    let i = Tensor::from_slice(&[1i32, 2, 3], &[3], Device::Cpu).unwrap();
    let s = i.sum().unwrap();
    assert_eq!((s.dtype(), s.item::<i64>().unwrap()), (DType::I64, 6));
    assert!(i.mean().is_err());
    assert!(Tensor::zeros(&[0], DType::F32, Device::Cpu)
        .unwrap()
        .max()
        .is_err());
    // Large reduction (parallel path) is exact for integers-valued floats.
    let big = Tensor::ones(&[1 << 20], DType::F32, Device::Cpu).unwrap();
    assert_eq!(big.sum().unwrap().item::<f32>().unwrap(), (1 << 20) as f32);
}

#[test]
fn matmul_2d_batched_and_vectors() {
    let a = t(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
    let b = t(&[7.0, 8.0, 9.0, 10.0, 11.0, 12.0], &[3, 2]);
    let c = a.matmul(&b).unwrap();
    assert_eq!(
        (c.shape(), v(&c)),
        (&[2usize, 2][..], vec![58.0, 64.0, 139.0, 154.0])
    );
    // Transposed operands go through strides.
    assert_eq!(
        v(&b.t().unwrap().matmul(&a.t().unwrap()).unwrap()),
        vec![58.0, 139.0, 64.0, 154.0]
    );
    // Batched with a broadcast batch dim: [2,2,3] @ [3,2].
    let ab = Tensor::stack(&[&a, &a.mul_scalar(2.0).unwrap()], 0).unwrap();
    let cb = ab.matmul(&b).unwrap();
    assert_eq!(cb.shape(), &[2, 2, 2]);
    assert_eq!(
        v(&cb),
        vec![58.0, 64.0, 139.0, 154.0, 116.0, 128.0, 278.0, 308.0]
    );
    // Vector cases.
    let x = t(&[1.0, 1.0, 1.0], &[3]);
    assert_eq!(v(&a.matmul(&x).unwrap()), vec![6.0, 15.0]);
    assert_eq!(x.matmul(&x).unwrap().shape(), &[] as &[usize]);
    // Large f32 product through gemm against a naive loop.
    let m = Tensor::randn(&[64, 96], DType::F32, Device::Cpu).unwrap();
    let n = Tensor::randn(&[96, 80], DType::F32, Device::Cpu).unwrap();
    let (mv, nv) = (v(&m), v(&n));
    let got = v(&m.matmul(&n).unwrap());
    for (i, j) in [(0, 0), (13, 77), (63, 79)] {
        let want: f32 = (0..96).map(|k| mv[i * 96 + k] * nv[k * 80 + j]).sum();
        assert!((got[i * 80 + j] - want).abs() < 1e-3, "{i},{j}");
    }
    // Integers are exact; f16 computed in f32.
    let ia = a.to_dtype(DType::I64).unwrap();
    assert_eq!(
        ia.matmul(&b.to_dtype(DType::I64).unwrap())
            .unwrap()
            .to_vec::<i64>()
            .unwrap(),
        vec![58, 64, 139, 154]
    );
    assert_eq!(
        v(&a.half().unwrap().matmul(&b.half().unwrap()).unwrap()),
        vec![58.0, 64.0, 139.0, 154.0]
    );
}

#[test]
fn mismatched_matmul_is_a_typed_error_naming_both_shapes() {
    let e = t(&[0.0; 6], &[2, 3])
        .matmul(&t(&[0.0; 8], &[4, 2]))
        .unwrap_err();
    assert!(
        matches!(e, Error::MatmulShape { k1: 3, k2: 4, .. }),
        "{e:?}"
    );
    let msg = e.to_string();
    assert!(
        msg.contains("[2, 3]") && msg.contains("[4, 2]") && msg.contains("cannot be multiplied"),
        "{msg}"
    );
}

#[test]
fn softmax_log_softmax_match_torch() {
    let x = t(&[1.0, 2.0, 3.0], &[3]);
    close(&v(&x.softmax(0).unwrap()), &[0.0900, 0.2447, 0.6652], 1e-4);
    close(
        &v(&x.log_softmax(-1).unwrap()),
        &[-2.4076, -1.4076, -0.4076],
        1e-4,
    );
    // Over dim 0 of a matrix: columns sum to one, result is contiguous.
    let m = t(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let s = m.softmax(0).unwrap();
    assert!(s.is_contiguous());
    close(&v(&s), &[0.1192, 0.1192, 0.8808, 0.8808], 1e-4);
    // Large inputs do not overflow (max subtraction).
    close(
        &v(&t(&[1000.0, 1000.0], &[2]).softmax(0).unwrap()),
        &[0.5, 0.5],
        1e-6,
    );
}

#[test]
fn cross_entropy_and_its_gradient_match_torch() {
    // torch.nn.functional.cross_entropy(torch.tensor([[1.,2.,3.],[1.,2.,3.]]), torch.tensor([2,0]))
    // = mean(0.4076, 2.4076) = 1.4076
    let logits = t(&[1.0, 2.0, 3.0, 1.0, 2.0, 3.0], &[2, 3]);
    let targets = Tensor::from_slice(&[2i64, 0], &[2], Device::Cpu).unwrap();
    let loss = logits.cross_entropy(&targets).unwrap();
    assert_eq!(loss.shape(), &[] as &[usize]);
    close(&[loss.item::<f32>().unwrap()], &[1.4076], 1e-4);
    let g = logits.cross_entropy_backward(&targets).unwrap();
    close(
        &v(&g),
        &[0.0450, 0.1224, -0.1674, -0.4550, 0.1224, 0.3326],
        1e-4,
    );
    let bad = Tensor::from_slice(&[2i64, 3], &[2], Device::Cpu).unwrap();
    let e = logits.cross_entropy(&bad).unwrap_err();
    assert!(e.to_string().contains("Target 3 is out of bounds"), "{e}");
    assert!(logits
        .cross_entropy(&targets.to_dtype(DType::I32).unwrap())
        .is_err());
}

#[test]
fn cross_entropy_skips_targets_of_minus_100_as_torch_ignore_index() {
    // F.cross_entropy(torch.tensor([[1.,2.,3.],[1.,2.,3.]]), torch.tensor([2,-100]))
    // = 0.4076: the mean over the one sample that counts.
    let logits = t(&[1.0, 2.0, 3.0, 1.0, 2.0, 3.0], &[2, 3]);
    let targets = Tensor::from_slice(&[2i64, -100], &[2], Device::Cpu).unwrap();
    let loss = logits.cross_entropy(&targets).unwrap();
    close(&[loss.item::<f32>().unwrap()], &[0.4076], 1e-4);
    // The gradient: softmax - one_hot for the counted row (divided by 1), zeros for the
    // ignored one.
    let g = logits.cross_entropy_backward(&targets).unwrap();
    close(&v(&g), &[0.0900, 0.2447, -0.3348, 0.0, 0.0, 0.0], 1e-4);
    // Three rows, one ignored: the mean divides by 2.
    let l3 = t(&[1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 9.0, 0.0, 0.0], &[3, 3]);
    let t3 = Tensor::from_slice(&[2i64, -100, 0], &[3], Device::Cpu).unwrap();
    let want = (0.407_606 + (1.0 + 2.0 * (-9f64).exp()).ln()) / 2.0;
    close(
        &[l3.cross_entropy(&t3).unwrap().item::<f32>().unwrap()],
        &[want as f32],
        1e-4,
    );
    // Every target ignored: NaN, as PyTorch; the gradient is all zeros.
    let none = Tensor::from_slice(&[-100i64, -100], &[2], Device::Cpu).unwrap();
    assert!(logits
        .cross_entropy(&none)
        .unwrap()
        .item::<f32>()
        .unwrap()
        .is_nan());
    assert_eq!(
        v(&logits.cross_entropy_backward(&none).unwrap()),
        vec![0.0; 6]
    );
    // Other negative targets are still out of bounds.
    let bad = Tensor::from_slice(&[2i64, -5], &[2], Device::Cpu).unwrap();
    let e = logits.cross_entropy(&bad).unwrap_err();
    assert!(e.to_string().contains("Target -5 is out of bounds"), "{e}");
}

#[test]
fn sum_over_an_empty_dim_list_reduces_everything_as_torch() {
    // torch.ones(2, 3).sum(dim=[]) is tensor(6.).
    let x = Tensor::ones(&[2, 3], DType::F32, Device::Cpu).unwrap();
    let s = x.sum_dims(&[], false).unwrap();
    assert_eq!(s.shape(), &[] as &[usize]);
    assert_eq!(v(&s), vec![6.0]);
    let k = x.sum_dims(&[], true).unwrap();
    assert_eq!((k.shape(), v(&k)), (&[1usize, 1][..], vec![6.0]));
    let i = Tensor::from_slice(&[1i64, 2, 3, 4], &[2, 2], Device::Cpu).unwrap();
    assert_eq!(
        i.sum_dims(&[], false).unwrap().to_vec::<i64>().unwrap(),
        vec![10]
    );
    // Meta plans the same shape.
    let m = Tensor::zeros(&[2, 3], DType::F32, Device::Meta).unwrap();
    assert_eq!(m.sum_dims(&[], true).unwrap().shape(), &[1, 1]);
}

#[test]
fn comparisons_give_bool_tensors() {
    let a = t(&[1.0, 2.0, 3.0], &[3]);
    let b = t(&[3.0, 2.0, 1.0], &[3]);
    assert_eq!(
        a.eq(&b).unwrap().to_vec::<bool>().unwrap(),
        vec![false, true, false]
    );
    assert_eq!(
        a.gt(&b).unwrap().to_vec::<bool>().unwrap(),
        vec![false, false, true]
    );
    assert_eq!(
        a.lt(&b).unwrap().to_vec::<bool>().unwrap(),
        vec![true, false, false]
    );
    let m = a.gt_scalar(1.5).unwrap();
    assert_eq!(
        (m.dtype(), m.to_vec::<bool>().unwrap()),
        (DType::Bool, vec![false, true, true])
    );
    // Accuracy idiom: (pred == target).sum()
    let pred = Tensor::from_slice(&[1i64, 2, 3], &[3], Device::Cpu).unwrap();
    let tgt = Tensor::from_slice(&[1i64, 0, 3], &[3], Device::Cpu).unwrap();
    assert_eq!(
        pred.eq(&tgt).unwrap().sum().unwrap().item::<i64>().unwrap(),
        2
    );
}

#[test]
fn training_helpers_relu_backward_and_in_place_updates() {
    let x = t(&[-1.0, 0.0, 2.0], &[3]);
    let g = t(&[5.0, 5.0, 5.0], &[3]);
    assert_eq!(v(&g.relu_backward(&x).unwrap()), vec![0.0, 0.0, 5.0]);
    let p = t(&[1.0, 1.0, 1.0], &[3]);
    p.add_scaled_(&g, -0.1).unwrap();
    close(&v(&p), &[0.5, 0.5, 0.5], 1e-6);
    p.mul_scalar_(2.0).unwrap();
    p.sub_(&t(&[1.0, 0.0, 0.0], &[3])).unwrap();
    assert_eq!(v(&p), vec![0.0, 1.0, 1.0]);
    p.add_(&p).unwrap(); // aliased rhs is staged
    assert_eq!(v(&p), vec![0.0, 2.0, 2.0]);
    p.zero_().unwrap();
    assert_eq!(v(&p), vec![0.0; 3]);
    // In-place broadcast: a row added to every row; the reverse shape is an error.
    let m = Tensor::zeros(&[2, 3], DType::F32, Device::Cpu).unwrap();
    m.add_(&t(&[1.0, 2.0, 3.0], &[3])).unwrap();
    assert_eq!(v(&m), vec![1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
    assert!(t(&[1.0, 2.0, 3.0], &[3]).add_(&m).is_err());
    // copy_ converts dtype and writes through a strided view.
    m.t()
        .unwrap()
        .copy_(
            &Tensor::arange(0.0, 6.0, 1.0, DType::I64, Device::Cpu)
                .unwrap()
                .reshape(&[3, 2])
                .unwrap(),
        )
        .unwrap();
    assert_eq!(v(&m), vec![0.0, 2.0, 4.0, 1.0, 3.0, 5.0]);
    // sum_dim over the batch: the bias gradient.
    assert_eq!(v(&m.sum_dim(0, false).unwrap()), vec![1.0, 5.0, 9.0]);
}

#[test]
fn item_reads_one_element_and_rejects_more() {
    assert_eq!(t(&[3.5], &[1]).item::<f32>().unwrap(), 3.5);
    assert_eq!(t(&[3.5], &[1]).item::<f64>().unwrap(), 3.5);
    let e = t(&[1.0, 2.0], &[2]).item::<f32>().unwrap_err();
    assert!(matches!(e, Error::NotAScalar { numel: 2 }), "{e:?}");
    assert!(
        e.to_string()
            .contains("a Tensor with 2 elements cannot be converted to Scalar"),
        "{e}"
    );
    let e = t(&[1.0], &[1]).to_vec::<f64>().unwrap_err();
    assert!(matches!(e, Error::ElementType { .. }), "{e:?}");
    // A value the requested type cannot hold is PyTorch's `checked_convert` error, not a
    // clamped or wrapped number (300 as u8 gave 255, 2^40 as i32 gave 0, NaN as i64 gave 0).
    let scalar = |v: f32| Tensor::scalar(v);
    for (e, dtype) in [
        (scalar(300.0).item::<u8>().unwrap_err(), DType::U8),
        (scalar(-1.0).item::<u8>().unwrap_err(), DType::U8),
        (scalar(f32::NAN).item::<i64>().unwrap_err(), DType::I64),
        (
            Tensor::scalar(1i64 << 40).item::<i32>().unwrap_err(),
            DType::I32,
        ),
        (
            Tensor::scalar(1e300f64).item::<f32>().unwrap_err(),
            DType::F32,
        ),
    ] {
        assert!(
            matches!(e, Error::ValueOverflow { op: "item", dtype: d, .. } if d == dtype),
            "{e:?}"
        );
        assert!(e.to_string().contains("without overflow"), "{e}");
    }
    assert_eq!(scalar(255.0).item::<u8>().unwrap(), 255);
    assert_eq!(
        scalar(2.75).item::<i64>().unwrap(),
        2,
        "in range: truncated as C++"
    );
    assert!(
        scalar(f32::NAN).item::<f64>().unwrap().is_nan(),
        "floats hold NaN"
    );
}

fn bools(v: &[bool]) -> Tensor {
    Tensor::from_slice(v, &[v.len()], Device::Cpu).unwrap()
}

/// The stored bytes of a bool tensor (a cast to u8 reads them unchanged).
fn bytes(t: &Tensor) -> Vec<u8> {
    assert_eq!(t.dtype(), DType::Bool);
    t.to_dtype(DType::U8).unwrap().to_vec::<u8>().unwrap()
}

#[track_caller]
fn bool_err(r: berth::Result<impl std::fmt::Debug>, op: &str, message: &str) {
    let e = r.unwrap_err();
    assert!(
        matches!(&e, Error::BoolArithmetic { op: o, message: m, .. } if *o == op && *m == message),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .starts_with(&format!("{op}: {message} (in berth: ")),
        "{e}"
    );
}

#[test]
fn bool_arithmetic_stays_bool_or_is_refused_as_in_torch() {
    let s = bools(&[true, true, false, false]);
    let t = bools(&[true, false, true, false]);
    // add is logical or (True + True is True), mul logical and.
    let sum = s.add(&s).unwrap();
    assert_eq!(sum.dtype(), DType::Bool);
    assert_eq!(bytes(&sum), vec![1, 1, 0, 0]);
    assert_eq!(v(&sum), vec![1.0, 1.0, 0.0, 0.0]);
    assert_eq!(bytes(&s.add(&t).unwrap()), vec![1, 1, 1, 0]);
    assert_eq!(bytes(&s.mul(&t).unwrap()), vec![1, 0, 0, 0]);
    assert_eq!(bytes(&s.maximum(&t).unwrap()), vec![1, 1, 1, 0]);
    assert_eq!(bytes(&s.minimum(&t).unwrap()), vec![1, 0, 0, 0]);
    assert_eq!(s.add(&s).unwrap().sum().unwrap().item::<i64>().unwrap(), 2);
    // Scalars convert to bool (non-zero → true).
    assert_eq!(bytes(&s.add_scalar(5.0).unwrap()), vec![1, 1, 1, 1]);
    assert_eq!(bytes(&s.add_scalar(0.0).unwrap()), vec![1, 1, 0, 0]);
    assert_eq!(bytes(&s.mul_scalar(2.0).unwrap()), vec![1, 1, 0, 0]);
    assert_eq!(bytes(&s.mul_scalar(0.0).unwrap()), vec![0, 0, 0, 0]);
    // Subtraction and negation have no bool meaning: PyTorch's errors.
    let two = "Subtraction, the `-` operator, with two bool tensors is not supported. Use the \
               `^` or `logical_xor()` operator instead.";
    let one = "Subtraction, the `-` operator, with a bool tensor is not supported. If you are \
               trying to invert a mask, use the `~` or `logical_not()` operator instead.";
    let neg = "Negation, the `-` operator, on a bool tensor is not supported. If you are trying \
               to invert a mask, use the `~` or `logical_not()` operator instead.";
    bool_err(s.sub(&t), "sub", two);
    bool_err(s.sub_scalar(1.0), "sub", one);
    bool_err(s.rsub_scalar(1.0), "sub", one);
    bool_err(s.neg(), "neg", neg);
    // The alternatives the messages name exist: ne is xor, eq_scalar(0) is not.
    assert_eq!(bytes(&s.ne(&t).unwrap()), vec![0, 1, 1, 0]);
    assert_eq!(bytes(&s.eq_scalar(0.0).unwrap()), vec![0, 0, 1, 1]);
    // The same rules in place.
    let u = s.clone().unwrap();
    u.add_(&s).unwrap();
    assert_eq!(bytes(&u), vec![1, 1, 0, 0]);
    u.add_scalar_(3.0).unwrap();
    assert_eq!(bytes(&u), vec![1, 1, 1, 1]);
    u.mul_(&t).unwrap();
    assert_eq!(bytes(&u), vec![1, 0, 1, 0]);
    u.add_scaled_(&s, 2.0).unwrap();
    assert_eq!(bytes(&u), vec![1, 1, 1, 0]);
    bool_err(u.sub_(&t), "sub", two);
    assert_eq!(bytes(&u), vec![1, 1, 1, 0]);
    // And on meta, before any kernel.
    let m = Tensor::zeros(&[2], DType::Bool, Device::Meta).unwrap();
    bool_err(m.sub(&m), "sub", two);
    bool_err(m.neg(), "neg", neg);
}

#[test]
fn matmul_with_an_empty_inner_dimension_is_zeros() {
    let a = Tensor::zeros(&[2, 0], DType::F32, Device::Cpu).unwrap();
    let b = Tensor::zeros(&[0, 4], DType::F32, Device::Cpu).unwrap();
    let c = a.matmul(&b).unwrap();
    assert_eq!(c.shape(), &[2, 4]);
    assert_eq!(v(&c), vec![0.0; 8]);
    let batched = Tensor::ones(&[3, 2, 0], DType::F64, Device::Cpu)
        .unwrap()
        .matmul(&Tensor::ones(&[0, 4], DType::F64, Device::Cpu).unwrap())
        .unwrap();
    assert_eq!(batched.shape(), &[3, 2, 4]);
    assert_eq!(batched.to_vec::<f64>().unwrap(), vec![0.0; 24]);
    let e = Tensor::zeros(&[0], DType::F32, Device::Cpu).unwrap();
    let dot = e.matmul(&e).unwrap();
    assert_eq!((dot.shape(), dot.item::<f32>().unwrap()), (&[][..], 0.0));
    let m = Tensor::zeros(&[2, 0], DType::F32, Device::Meta).unwrap();
    let mb = Tensor::zeros(&[0, 4], DType::F32, Device::Meta).unwrap();
    assert_eq!(m.matmul(&mb).unwrap().shape(), &[2, 4]);
}

/// Products large enough to be sliced over threads (by output columns, by output rows, with a
/// narrower last slice, batched, on transposed views) equal a naive loop exactly: the
/// operands are small integers, so every partial sum is exact in f32.
#[test]
fn threaded_matmul_slices_equal_a_naive_product() {
    let ints = |shape: &[usize], seed: usize| {
        let n: usize = shape.iter().product();
        let data: Vec<f32> = (0..n).map(|i| ((i * 7 + seed) % 9) as f32 - 4.0).collect();
        Tensor::from_vec(data, shape, Device::Cpu).unwrap()
    };
    let naive = |a: &[f32], b: &[f32], (m, k, n): (usize, usize, usize)| {
        let mut c = vec![0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|x| a[i * k + x] * b[x * n + j]).sum();
            }
        }
        c
    };
    // (m, k, n): the main job's fc1 forward and weight gradient, a wide and a tall product
    // whose sliced dimension is no multiple of 16.
    for (m, k, n) in [
        (64, 784, 256),
        (256, 64, 784),
        (70, 300, 1001),
        (1003, 200, 50),
    ] {
        let a = ints(&[m, k], 1);
        // The right operand as the transpose of an `[n, k]` tensor (a column-major view), as
        // `Linear` multiplies by its weight.
        let bt = ints(&[n, k], 2);
        let b = bt.t().unwrap();
        let want = naive(&v(&a), &v(&b.contiguous().unwrap()), (m, k, n));
        assert_eq!(v(&a.matmul(&b).unwrap()), want, "[{m}, {k}] · [{k}, {n}]");
        // Transposed left operand too (`dpre.t().matmul(x)` in the backward).
        let at = a.t().unwrap().contiguous().unwrap().t().unwrap();
        assert_eq!(v(&at.matmul(&b).unwrap()), want, "transposed [{m}, {k}]");
    }
    // Batched: each batch's slices land in its own output.
    let a = ints(&[3, 96, 200], 3);
    let b = ints(&[200, 400], 4);
    let got = v(&a.matmul(&b).unwrap());
    let (av, bv) = (v(&a), v(&b));
    for i in 0..3 {
        let want = naive(&av[i * 96 * 200..(i + 1) * 96 * 200], &bv, (96, 200, 400));
        assert_eq!(got[i * 96 * 400..(i + 1) * 96 * 400], want[..], "batch {i}");
    }
}

/// Sums and means over leading dimensions of a dense tensor (the row-at-a-time path, split
/// over threads when wide) equal a naive per-column sum, for f32 and i64.
#[test]
fn leading_dimension_sums_equal_a_naive_sum() {
    let (rows, cols) = (64, 3000);
    let data: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 13) % 11) as f32 - 5.0)
        .collect();
    let x = Tensor::from_vec(data.clone(), &[rows, cols], Device::Cpu).unwrap();
    let want: Vec<f32> = (0..cols)
        .map(|j| (0..rows).map(|r| data[r * cols + j]).sum())
        .collect();
    assert_eq!(v(&x.sum_dim(0, false).unwrap()), want);
    let mean = v(&x.mean_dim(0, true).unwrap());
    assert_eq!(mean.len(), cols);
    for (m, w) in mean.iter().zip(&want) {
        assert_eq!(*m, w / rows as f32);
    }
    // Two leading dimensions of a 3-d tensor: [4, 16, 3000] → [3000].
    let x3 = x.reshape(&[4, 16, cols]).unwrap();
    assert_eq!(v(&x3.sum_dims(&[0, 1], false).unwrap()), want);
    // Integers, exactly.
    let xi = x.to_dtype(DType::I64).unwrap();
    let got = xi.sum_dim(0, false).unwrap().to_vec::<i64>().unwrap();
    assert_eq!(got, want.iter().map(|&w| w as i64).collect::<Vec<_>>());
    // A view that is not dense (the transpose) takes the strided path, same values.
    let xt = x.t().unwrap().contiguous().unwrap().t().unwrap();
    assert_eq!(v(&xt.sum_dim(0, false).unwrap()), want);
}
