//! Constructors: values, dtypes, seeded random streams, `cat` / `stack`.

use berth::{DType, Device, Generator, Tensor};

use crate::util::{close, t, v};

#[test]
fn zeros_ones_full_have_the_values_shape_and_dtype() {
    let z = Tensor::zeros(&[2, 3], DType::F32, Device::Cpu).unwrap();
    assert_eq!(
        (z.shape(), z.dtype(), z.numel(), z.nbytes()),
        (&[2usize, 3][..], DType::F32, 6, 24)
    );
    assert_eq!(z.to_vec::<f32>().unwrap(), vec![0.0; 6]);
    let o = Tensor::ones(&[3], DType::I64, Device::Cpu).unwrap();
    assert_eq!(o.to_vec::<i64>().unwrap(), vec![1, 1, 1]);
    let f = Tensor::full(&[2], 2.5, DType::BF16, Device::Cpu).unwrap();
    assert_eq!(f.element_size(), 2);
    assert_eq!(
        f.to_vec::<half::bf16>().unwrap(),
        vec![half::bf16::from_f32(2.5); 2]
    );
    let b = Tensor::full(&[2], 3.0, DType::Bool, Device::Cpu).unwrap();
    assert_eq!(b.to_vec::<bool>().unwrap(), vec![true, true]);
}

#[test]
fn arange_follows_torch_lengths() {
    let a = Tensor::arange(0.0, 5.0, 1.0, DType::I64, Device::Cpu).unwrap();
    assert_eq!(a.to_vec::<i64>().unwrap(), vec![0, 1, 2, 3, 4]);
    // torch.arange(1, 2.5, 0.5) → [1.0, 1.5, 2.0]
    let b = Tensor::arange(1.0, 2.5, 0.5, DType::F32, Device::Cpu).unwrap();
    assert_eq!(b.to_vec::<f32>().unwrap(), vec![1.0, 1.5, 2.0]);
    assert!(Tensor::arange(0.0, 5.0, 0.0, DType::F32, Device::Cpu).is_err());
    assert!(Tensor::arange(0.0, 5.0, -1.0, DType::F32, Device::Cpu).is_err());
}

#[test]
fn from_slice_checks_the_length_against_the_shape() {
    let e = Tensor::from_slice(&[1.0f32, 2.0, 3.0], &[2, 2], Device::Cpu).unwrap_err();
    assert!(
        matches!(
            e,
            berth::Error::DataLength {
                expected: 4,
                got: 3,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("[2, 2]"), "{e}");
}

#[test]
fn rand_is_uniform_in_unit_interval_and_reproducible_with_a_seed() {
    let mut g = Generator::new(7);
    let a = Tensor::rand_with(&[10_000], DType::F32, Device::Cpu, &mut g).unwrap();
    let xs = a.to_vec::<f32>().unwrap();
    assert!(xs.iter().all(|&x| (0.0..1.0).contains(&x)));
    let mean = xs.iter().sum::<f32>() / xs.len() as f32;
    assert!((mean - 0.5).abs() < 0.02, "mean {mean}");
    // Same seed → same values; the generator advanced, so the next draw differs.
    let b = Tensor::rand_with(&[10_000], DType::F32, Device::Cpu, &mut Generator::new(7)).unwrap();
    assert_eq!(xs, b.to_vec::<f32>().unwrap());
    let c = Tensor::rand_with(&[10_000], DType::F32, Device::Cpu, &mut g).unwrap();
    assert_ne!(xs, c.to_vec::<f32>().unwrap());
}

#[test]
fn randn_has_zero_mean_unit_variance_and_manual_seed_restarts_it() {
    berth::manual_seed(3);
    let a = Tensor::randn(&[50_000], DType::F64, Device::Cpu)
        .unwrap()
        .to_vec::<f64>()
        .unwrap();
    let mean = a.iter().sum::<f64>() / a.len() as f64;
    let var = a.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / a.len() as f64;
    assert!(
        mean.abs() < 0.02 && (var - 1.0).abs() < 0.03,
        "mean {mean} var {var}"
    );
    // Integer dtypes are rejected like torch ("normal_kernel_cpu" not implemented for 'Long').
    assert!(Tensor::randn(&[2], DType::I64, Device::Cpu).is_err());
}

#[test]
fn cat_and_stack_collate_like_torch() {
    let a = t(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let b = t(&[5.0, 6.0], &[1, 2]);
    let c = Tensor::cat(&[&a, &b], 0).unwrap();
    assert_eq!(c.shape(), &[3, 2]);
    assert_eq!(v(&c), vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let d = Tensor::cat(&[&a, &a.t().unwrap()], 1).unwrap();
    assert_eq!(v(&d), vec![1.0, 2.0, 1.0, 3.0, 3.0, 4.0, 2.0, 4.0]);
    let s = Tensor::stack(&[&t(&[1.0, 2.0], &[2]), &t(&[3.0, 4.0], &[2])], 0).unwrap();
    assert_eq!(s.shape(), &[2, 2]);
    close(&v(&s), &[1.0, 2.0, 3.0, 4.0], 0.0);
    let s1 = Tensor::stack(&[&t(&[1.0, 2.0], &[2]), &t(&[3.0, 4.0], &[2])], 1).unwrap();
    assert_eq!(v(&s1), vec![1.0, 3.0, 2.0, 4.0]);
    assert!(Tensor::cat(&[&a, &t(&[1.0, 2.0, 3.0], &[1, 3])], 0).is_err());
    assert!(Tensor::stack(&[], 0).is_err());
}

#[track_caller]
fn arange_err(start: f64, end: f64, step: f64) -> String {
    match Tensor::arange(start, end, step, DType::F32, Device::Cpu) {
        Err(berth::Error::InvalidArgument { op: "arange", what }) => what,
        other => panic!("expected InvalidArgument from arange, got {other:?}"),
    }
}

#[test]
fn arange_refuses_what_torch_refuses_with_torchs_messages() {
    assert_eq!(
        arange_err(0.0, f64::INFINITY, 1.0),
        "unsupported range: 0 -> inf (start and end must be finite numbers)"
    );
    assert_eq!(
        arange_err(0.0, f64::NAN, 1.0),
        "unsupported range: 0 -> nan (start and end must be finite numbers)"
    );
    assert_eq!(
        arange_err(f64::NEG_INFINITY, 0.0, 1.0),
        "unsupported range: -inf -> 0 (start and end must be finite numbers)"
    );
    for step in [0.0, -0.0, f64::NAN] {
        assert!(
            arange_err(0.0, 5.0, step).starts_with("step must be nonzero (got "),
            "{step}"
        );
    }
    assert_eq!(
        arange_err(0.0, 5.0, -1.0),
        "upper bound and larger bound inconsistent with step sign (start 0, end 5, step -1: a \
         positive step needs end >= start, a negative one end <= start)"
    );
    assert!(arange_err(5.0, 0.0, 1.0)
        .starts_with("upper bound and larger bound inconsistent with step sign"));
    assert!(arange_err(-1e308, 1e308, 1e-300).starts_with("invalid size, possible overflow?"));
    // The valid edge cases keep torch's values.
    let down = Tensor::arange(5.0, 0.0, -2.0, DType::I64, Device::Cpu).unwrap();
    assert_eq!(down.to_vec::<i64>().unwrap(), vec![5, 3, 1]);
    let none = Tensor::arange(3.0, 3.0, 1.0, DType::F32, Device::Cpu).unwrap();
    assert_eq!(none.shape(), &[0]);
    let m = Tensor::arange(0.0, 10.0, 3.0, DType::F32, Device::Meta).unwrap();
    assert_eq!(m.shape(), &[4]);
}

#[track_caller]
fn overflow(r: berth::Result<Tensor>, value: f64, dtype: DType, ctype: &str) {
    let e = r.unwrap_err();
    assert!(
        matches!(&e, berth::Error::ValueOverflow { op: "full", value: v, dtype: d }
            if (*v == value || v.is_nan() && value.is_nan()) && *d == dtype),
        "{e:?}"
    );
    assert!(
        e.to_string().starts_with(&format!(
            "full: value cannot be converted to type {ctype} without overflow"
        )),
        "{e}"
    );
}

#[test]
fn full_refuses_values_the_dtype_cannot_hold() {
    let cpu = Device::Cpu;
    overflow(
        Tensor::full(&[2], 300.0, DType::U8, cpu),
        300.0,
        DType::U8,
        "uint8_t",
    );
    overflow(
        Tensor::full(&[2], -1.0, DType::U8, cpu),
        -1.0,
        DType::U8,
        "uint8_t",
    );
    overflow(
        Tensor::full(&[2], f64::NAN, DType::I64, cpu),
        f64::NAN,
        DType::I64,
        "int64_t",
    );
    overflow(
        Tensor::full(&[2], f64::INFINITY, DType::I32, cpu),
        f64::INFINITY,
        DType::I32,
        "int",
    );
    overflow(
        Tensor::full(&[2], 3e9, DType::I32, cpu),
        3e9,
        DType::I32,
        "int",
    );
    overflow(
        Tensor::full(&[1], 1e300, DType::F32, cpu),
        1e300,
        DType::F32,
        "float",
    );
    overflow(
        Tensor::full(&[1], 70000.0, DType::F16, cpu),
        70000.0,
        DType::F16,
        "at::Half",
    );
    // The same check on meta, before any memory.
    overflow(
        Tensor::full(&[2], 300.0, DType::U8, Device::Meta),
        300.0,
        DType::U8,
        "uint8_t",
    );
    // What fits: the range ends, fractions truncated toward zero, inf/NaN in floats, and any
    // value in bool (non-zero → true), as torch.full.
    let u = Tensor::full(&[2], 255.0, DType::U8, cpu).unwrap();
    assert_eq!(u.to_vec::<u8>().unwrap(), vec![255, 255]);
    let i = Tensor::full(&[2], -2.7, DType::I64, cpu).unwrap();
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![-2, -2]);
    let f = Tensor::full(&[1], f64::INFINITY, DType::F16, cpu).unwrap();
    assert_eq!(f.to_vec::<half::f16>().unwrap(), vec![half::f16::INFINITY]);
    for (value, want) in [(300.0, true), (f64::NAN, true), (-0.5, true), (0.0, false)] {
        let b = Tensor::full(&[2], value, DType::Bool, cpu).unwrap();
        assert_eq!(b.to_vec::<bool>().unwrap(), vec![want; 2], "{value}");
    }
    // fill_ is the same operation.
    let z = Tensor::zeros(&[2], DType::U8, cpu).unwrap();
    let e = z.fill_(256.0).unwrap_err();
    assert!(
        matches!(e, berth::Error::ValueOverflow { op: "fill_", value, dtype: DType::U8 } if value == 256.0),
        "{e:?}"
    );
    assert_eq!(z.to_vec::<u8>().unwrap(), vec![0, 0]);
}

#[test]
fn stack_with_a_dim_out_of_range_names_stack() {
    let x = t(&[1.0, 2.0, 3.0, 4.0], &[2, 2]);
    let e = Tensor::stack(&[&x, &x], 3).unwrap_err();
    assert!(
        matches!(
            e,
            berth::Error::DimOutOfRange {
                op: "stack",
                dim: 3,
                rank: 3
            }
        ),
        "{e:?}"
    );
    let e = Tensor::stack(&[&x, &x], -4).unwrap_err();
    assert!(
        matches!(
            e,
            berth::Error::DimOutOfRange {
                op: "stack",
                dim: -4,
                rank: 3
            }
        ),
        "{e:?}"
    );
    let last = Tensor::stack(&[&x, &x], 2).unwrap();
    assert_eq!(last.shape(), &[2, 2, 2]);
    assert_eq!(v(&last), vec![1.0, 1.0, 2.0, 2.0, 3.0, 3.0, 4.0, 4.0]);
    let first = Tensor::stack(&[&x, &x], -3).unwrap();
    assert_eq!(first.shape(), &[2, 2, 2]);
}
