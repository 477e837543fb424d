//! Integer tensors stay exact past 2^53 (`Note [Exact integers]`): reductions, casts, matmul,
//! comparisons with scalars and printing never go through `f64`; sums and products wrap
//! as PyTorch's int64 arithmetic does. And tensor–scalar ops on integer tensors promote as
//! PyTorch's (`Note [Scalar promotion]`). Expected values are PyTorch's for the same calls.

use berth::{DType, Device, Error, Tensor};

/// 2^53 + 1: the first integer an `f64` cannot hold.
const BIG: i64 = (1 << 53) + 1;
const P53: i64 = 1 << 53;

fn i64s(v: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_slice(v, shape, Device::Cpu).unwrap()
}

fn got(t: &Tensor) -> Vec<i64> {
    t.to_vec::<i64>().unwrap()
}

#[test]
fn integer_reductions_are_exact_above_2_pow_53() {
    assert_eq!(got(&i64s(&[BIG], &[1]).max().unwrap()), vec![BIG]);
    assert_eq!(got(&i64s(&[BIG, BIG + 2], &[2]).min().unwrap()), vec![BIG]);
    assert_eq!(got(&i64s(&[BIG, 0], &[2]).sum().unwrap()), vec![BIG]);
    assert_eq!(got(&i64s(&[P53, BIG], &[2]).argmax().unwrap()), vec![1]);
    // torch.tensor([2**63 - 1, 1]).sum() wraps to -2**63, as berth's `add` does.
    assert_eq!(
        got(&i64s(&[i64::MAX, 1], &[2]).sum().unwrap()),
        vec![i64::MIN]
    );
    // Over dimensions: the leading-dims sum, the strided walk, max and argmax by dim.
    let m = i64s(&[BIG, 1, 0, 1], &[2, 2]);
    assert_eq!(got(&m.sum_dim(0, false).unwrap()), vec![BIG, 2]);
    assert_eq!(got(&m.sum_dim(1, false).unwrap()), vec![BIG + 1, 1]);
    assert_eq!(
        got(&m.t().unwrap().sum_dim(0, false).unwrap()),
        vec![BIG + 1, 1]
    );
    let n = i64s(&[P53, BIG, BIG, P53], &[2, 2]);
    assert_eq!(got(&n.max_dim(1, false).unwrap()), vec![BIG, BIG]);
    assert_eq!(got(&n.min_dim(0, false).unwrap()), vec![P53, P53]);
    assert_eq!(got(&n.argmax_dim(1, false).unwrap()), vec![1, 0]);
    // i32 sums into i64 without overflow; max keeps the dtype.
    let i = Tensor::from_slice(&[i32::MAX, i32::MAX], &[2], Device::Cpu).unwrap();
    assert_eq!(got(&i.sum().unwrap()), vec![2 * i64::from(i32::MAX)]);
    assert_eq!(i.max().unwrap().to_vec::<i32>().unwrap(), vec![i32::MAX]);
}

#[test]
fn large_integer_reductions_are_exact_on_the_parallel_path() {
    // 2^16 elements (past the parallel threshold): the sum of 2^16 copies of 2^53 + 1 is
    // 2^69 + 2^16, which wraps to 2^16 in int64.
    let n = 1 << 16;
    let mut vals = vec![BIG; n];
    let x = i64s(&vals, &[n]);
    assert_eq!(got(&x.sum().unwrap()), vec![1 << 16]);
    vals[40_000] = BIG + 1;
    let x = i64s(&vals, &[n]);
    assert_eq!(got(&x.argmax().unwrap()), vec![40_000]);
    assert_eq!(got(&x.max().unwrap()), vec![BIG + 1]);
    assert_eq!(got(&x.min().unwrap()), vec![BIG]);
}

#[test]
fn integer_casts_wrap_and_are_exact() {
    // torch.tensor([2**53 + 1]).to(torch.int32) is tensor([1], dtype=torch.int32).
    let x = i64s(&[BIG, (1 << 32) + 5, -1], &[3]);
    assert_eq!(
        x.to_dtype(DType::I32).unwrap().to_vec::<i32>().unwrap(),
        vec![1, 5, -1]
    );
    assert_eq!(
        x.to_dtype(DType::U8).unwrap().to_vec::<u8>().unwrap(),
        vec![1, 5, 255]
    );
    assert_eq!(
        x.to_dtype(DType::Bool).unwrap().to_vec::<bool>().unwrap(),
        vec![true, true, true]
    );
    // A strided source takes the staged path: still exact.
    let m = i64s(&[BIG, 2, 3, BIG + 2], &[2, 2]).t().unwrap();
    assert_eq!(got(&m.contiguous().unwrap()), vec![BIG, 3, 2, BIG + 2]);
    assert_eq!(
        m.to_dtype(DType::I32).unwrap().to_vec::<i32>().unwrap(),
        vec![1, 3, 2, 3]
    );
    // i64 -> f32 rounds once, as C++'s cast: 2^60 + 2^36 + 1 is just above the midpoint of
    // two f32s and rounds up (through an f64 it would round to the midpoint, then to even).
    let v = (1i64 << 60) + (1 << 36) + 1;
    let want = ((1i64 << 60) + (1 << 37)) as f32;
    let f = i64s(&[v, v], &[2]);
    assert_eq!(
        f.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(),
        vec![want; 2]
    );
    let strided = f.expand(&[2, 2]).unwrap().t().unwrap();
    assert_eq!(
        strided
            .to_dtype(DType::F32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        vec![want; 4]
    );
    // `item` converts as PyTorch's C++ `item<T>()` (`checked_convert`): exactly when the
    // value fits, an error when it does not (it wrapped to 1 before).
    assert_eq!(
        i64s(&[i64::from(i32::MIN)], &[]).item::<i32>().unwrap(),
        i32::MIN,
        "item between integer dtypes is exact"
    );
    let e = i64s(&[BIG], &[]).item::<i32>().unwrap_err();
    assert!(
        matches!(
            e,
            berth::Error::ValueOverflow {
                op: "item",
                dtype: DType::I32,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .starts_with("item: value cannot be converted to type int without overflow"),
        "{e}"
    );
}

#[test]
fn integer_matmul_is_exact_and_wraps() {
    let a = i64s(&[BIG, 3], &[1, 2]);
    let b = i64s(&[1, 0], &[2, 1]);
    assert_eq!(got(&a.matmul(&b).unwrap()), vec![BIG]);
    let w = i64s(&[i64::MAX], &[1, 1])
        .matmul(&i64s(&[2], &[1, 1]))
        .unwrap();
    assert_eq!(got(&w), vec![-2]);
    // A bool product is a logical or of ands: it holds only 0 and 1.
    let t = Tensor::from_slice(&[true, true, true, true], &[2, 2], Device::Cpu).unwrap();
    let p = t.matmul(&t).unwrap();
    assert_eq!(p.dtype(), DType::Bool);
    assert_eq!(
        p.to_dtype(DType::U8).unwrap().to_vec::<u8>().unwrap(),
        vec![1; 4]
    );
}

#[test]
fn integer_comparisons_with_integral_scalars_are_exact() {
    let x = i64s(&[BIG, P53, i64::MAX, i64::MIN, 3], &[5]);
    let b = |t: Tensor| t.to_vec::<bool>().unwrap();
    assert_eq!(
        b(x.eq_scalar(P53 as f64).unwrap()),
        vec![false, true, false, false, false]
    );
    assert_eq!(
        b(x.gt_scalar(P53 as f64).unwrap()),
        vec![true, false, true, false, false]
    );
    // 2^63 is past i64: every i64 is below it.
    assert_eq!(b(x.lt_scalar(2f64.powi(63)).unwrap()), vec![true; 5]);
    assert_eq!(
        b(x.eq_scalar(-(2f64.powi(63))).unwrap()),
        vec![false, false, false, true, false]
    );
    assert_eq!(
        b(x.gt_scalar(2.5).unwrap()),
        vec![true, true, true, false, true]
    );
    assert_eq!(b(x.eq_scalar(f64::NAN).unwrap()), vec![false; 5]);
    assert_eq!(b(x.lt_scalar(f64::INFINITY).unwrap()), vec![true; 5]);
}

#[test]
fn integers_print_exactly() {
    assert_eq!(
        i64s(&[BIG, -1], &[2]).to_string(),
        format!("tensor([9007199254740993, {:>16}])", "-1")
    );
    assert_eq!(i64s(&[BIG], &[]).to_string(), "tensor(9007199254740993)");
}

#[test]
fn scalar_ops_with_a_float_scalar_promote_integer_tensors_to_f32() {
    let x = i64s(&[1], &[1]);
    let f = |t: Tensor| {
        assert_eq!(t.dtype(), DType::F32);
        t.to_vec::<f32>().unwrap()
    };
    // torch.tensor([1]) + 0.5 is tensor([1.5000]).
    assert_eq!(f(x.add_scalar(0.5).unwrap()), vec![1.5]);
    assert_eq!(f(x.add_scalar(1e30).unwrap()), vec![1e30]);
    assert!(f(x.mul_scalar(f64::NAN).unwrap())[0].is_nan());
    assert_eq!(
        f(x.sub_scalar(f64::INFINITY).unwrap()),
        vec![f32::NEG_INFINITY]
    );
    assert_eq!(f(x.rsub_scalar(0.5).unwrap()), vec![-0.5]);
    let mask = Tensor::from_slice(&[true, false], &[2], Device::Cpu).unwrap();
    assert_eq!(f(mask.mul_scalar(0.5).unwrap()), vec![0.5, 0.0]);
    // PyTorch's sub_check refuses a bool tensor whatever the scalar.
    assert!(matches!(
        mask.sub_scalar(0.5).unwrap_err(),
        Error::BoolArithmetic { .. }
    ));
    // Meta infers the same dtype.
    let meta = Tensor::zeros(&[2], DType::I64, Device::Meta).unwrap();
    assert_eq!(meta.add_scalar(0.5).unwrap().dtype(), DType::F32);
    // An integral scalar keeps the dtype and wraps into it, as PyTorch.
    assert_eq!(got(&x.add_scalar(1.0).unwrap()), vec![2]);
    let u = Tensor::from_slice(&[1u8], &[1], Device::Cpu).unwrap();
    assert_eq!(
        u.add_scalar(300.0).unwrap().to_vec::<u8>().unwrap(),
        vec![45]
    );
    let i = Tensor::from_slice(&[i32::MAX], &[1], Device::Cpu).unwrap();
    assert_eq!(
        i.add_scalar(1.0).unwrap().to_vec::<i32>().unwrap(),
        vec![i32::MIN]
    );
}

#[test]
fn inplace_scalar_ops_refuse_a_float_result_in_an_integer_tensor() {
    let u = Tensor::from_slice(&[7u8], &[1], Device::Cpu).unwrap();
    let e = u.mul_scalar_(f64::NAN).unwrap_err();
    assert!(
        matches!(
            e,
            Error::ResultTypeCast {
                result: DType::F32,
                output: DType::U8,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .contains("result type Float can't be cast to the desired output type Byte"),
        "{e}"
    );
    assert_eq!(u.to_vec::<u8>().unwrap(), vec![7], "nothing written");
    let x = i64s(&[1], &[1]);
    let e = x.add_scalar_(0.5).unwrap_err();
    assert!(e.to_string().contains("desired output type Long"), "{e}");
    assert_eq!(got(&x), vec![1]);
    u.add_scalar_(300.0).unwrap();
    assert_eq!(u.to_vec::<u8>().unwrap(), vec![51]);
    x.add_scalar_(P53 as f64).unwrap();
    assert_eq!(got(&x), vec![BIG]);
}

#[test]
fn add_scaled_refuses_a_fractional_alpha_for_integer_tensors() {
    let x = i64s(&[1, 2], &[2]);
    let e = x.add_scaled_(&i64s(&[1, 1], &[2]), 0.5).unwrap_err();
    assert!(
        e.to_string().contains(
            "For integral input tensors, argument alpha must not be a floating point number"
        ),
        "{e}"
    );
    assert_eq!(got(&x), vec![1, 2]);
    x.add_scaled_(&i64s(&[BIG - 1, 1], &[2]), 1.0).unwrap();
    x.add_scaled_(&i64s(&[1, 1], &[2]), 3.0).unwrap();
    assert_eq!(got(&x), vec![BIG + 3, 6]);
}
