//! Helpers shared by the test modules.

use berth::{DType, Device, Tensor};

/// An f32 CPU tensor from values and a shape.
pub fn t(v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(v, shape, Device::Cpu).unwrap()
}

/// The values of an f32 tensor.
pub fn v(t: &Tensor) -> Vec<f32> {
    t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap()
}

/// Assert two float slices agree within `tol` (absolute), with a readable message.
#[track_caller]
pub fn close(got: &[f32], want: &[f32], tol: f32) {
    assert_eq!(got.len(), want.len(), "length: got {got:?}, want {want:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol || (g.is_nan() && w.is_nan()),
            "element {i}: got {g}, want {w} (got {got:?}, want {want:?})"
        );
    }
}
