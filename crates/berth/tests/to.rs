//! The `.to()` contract, asserted through storage identity (PyTorch's rules).

use berth::{DType, Device, Tensor, ToOptions};

use crate::util::v;

#[test]
fn same_device_and_dtype_returns_the_same_storage() {
    let x = Tensor::ones(&[3], DType::F32, Device::Cpu).unwrap();
    for y in [
        x.to(Device::Cpu, DType::F32, false, false).unwrap(),
        x.to_device(Device::Cpu).unwrap(),
        x.to_dtype(DType::F32).unwrap(),
        x.cpu().unwrap(),
        x.float().unwrap(),
        x.to_with(Device::Cpu, DType::F32, ToOptions::default())
            .unwrap(),
    ] {
        assert!(y.shares_storage(&x));
        assert_eq!(y.data_ptr(), x.data_ptr());
    }
}

#[test]
fn copy_true_or_a_dtype_change_gives_new_storage() {
    let x = Tensor::ones(&[3], DType::F32, Device::Cpu).unwrap();
    let c = x.to(Device::Cpu, DType::F32, false, true).unwrap();
    assert!(!c.shares_storage(&x));
    assert_eq!(v(&c), vec![1.0; 3]);
    let d = x.to_dtype(DType::F64).unwrap();
    assert!(!d.shares_storage(&x));
    assert_eq!(d.to_vec::<f64>().unwrap(), vec![1.0; 3]);
    let h = x.half().unwrap();
    assert_eq!((h.dtype(), h.element_size()), (DType::F16, 2));
}

#[test]
fn clone_is_new_storage_and_detach_is_the_same_storage() {
    let x = Tensor::ones(&[3], DType::F32, Device::Cpu)
        .unwrap()
        .with_requires_grad(true)
        .unwrap();
    let c = x.clone().unwrap();
    assert!(!c.shares_storage(&x) && c.requires_grad());
    let d = x.detach();
    assert!(d.shares_storage(&x) && !d.requires_grad());
}

#[test]
fn dtype_conversions_round_and_truncate_like_torch() {
    let x = Tensor::from_slice(&[-1.7f32, 0.0, 2.5, 300.0], &[4], Device::Cpu).unwrap();
    // float → int truncates toward zero.
    assert_eq!(
        x.to_dtype(DType::I64).unwrap().to_vec::<i64>().unwrap(),
        vec![-1, 0, 2, 300]
    );
    assert_eq!(
        x.to_dtype(DType::Bool).unwrap().to_vec::<bool>().unwrap(),
        vec![true, false, true, true]
    );
    assert_eq!(
        x.to_dtype(DType::BF16)
            .unwrap()
            .to_vec::<half::bf16>()
            .unwrap()[2],
        half::bf16::from_f32(2.5)
    );
    let b = Tensor::from_slice(&[true, false], &[2], Device::Cpu).unwrap();
    assert_eq!(
        b.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap(),
        vec![1.0, 0.0]
    );
}

#[test]
fn to_meta_keeps_the_shape_and_allocates_nothing() {
    let x = Tensor::ones(&[2, 5], DType::F32, Device::Cpu).unwrap();
    let m = x.to_device(Device::Meta).unwrap();
    assert_eq!(
        (m.shape(), m.device(), m.data_ptr()),
        (&[2usize, 5][..], Device::Meta, 0)
    );
}

#[test]
fn only_floating_point_tensors_can_require_gradients() {
    // torch.zeros(1, dtype=torch.long).requires_grad_(): "only Tensors of floating point
    // dtype can require gradients".
    let mut i = Tensor::zeros(&[1], DType::I64, Device::Cpu).unwrap();
    let e = i.set_requires_grad(true).unwrap_err();
    assert!(
        matches!(
            e,
            berth::Error::UnsupportedDType {
                dtype: DType::I64,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(
        e.to_string()
            .contains("only Tensors of floating point dtype can require gradients"),
        "{e}"
    );
    assert!(!i.requires_grad());
    assert!(i.set_requires_grad(false).is_ok());
    let b = Tensor::zeros(&[1], DType::Bool, Device::Cpu).unwrap();
    assert!(b.with_requires_grad(true).is_err());
    // A float tensor that requires grad, converted to an integer dtype, does not.
    let f = Tensor::zeros(&[1], DType::F32, Device::Cpu)
        .unwrap()
        .with_requires_grad(true)
        .unwrap();
    assert!(f.requires_grad());
    assert!(!f.to_dtype(DType::I64).unwrap().requires_grad());
    assert!(f.to_dtype(DType::F64).unwrap().requires_grad());
}

/// Issue 32's API point: `to_vec::<f64>()` of an f32 tensor does not convert (its type names
/// the stored elements); the error says so and names `to_vec_f64()`, which converts any dtype
/// as PyTorch's `tolist()` does.
#[test]
fn to_vec_of_another_type_names_to_vec_f64_which_converts() {
    let x = Tensor::ones(&[2], DType::F32, Device::Cpu).unwrap();
    let e = x.to_vec::<f64>().unwrap_err().to_string();
    assert!(
        e.contains("dtype f32 but f64 was requested") && e.contains("to_vec_f64()"),
        "{e}"
    );
    assert_eq!(x.to_vec_f64().unwrap(), vec![1.0, 1.0]);
}
