//! `Display` for tensors: PyTorch's `repr` (`torch/_tensor_str.py`, default print options).
//! Each expected string below is what PyTorch 2.11 prints for the same values.

use berth::half::f16;
use berth::{DType, Device, Tensor};

fn t(v: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(v, shape, Device::Cpu).unwrap()
}

#[test]
fn floats_share_one_format() {
    assert_eq!(
        t(&[0.1, 2.0], &[1, 2]).to_string(),
        "tensor([[0.1000, 2.0000]])"
    );
    assert_eq!(
        t(&[1.0, -2.0, 3.0], &[3]).to_string(),
        "tensor([ 1., -2.,  3.])"
    );
    assert_eq!(
        t(&[1e5, 1.0], &[2]).to_string(),
        "tensor([1.0000e+05, 1.0000e+00])"
    );
    assert_eq!(
        t(&[1e-5, 0.5], &[2]).to_string(),
        "tensor([1.0000e-05, 5.0000e-01])"
    );
    assert_eq!(
        t(&[f32::NAN, 1.0, f32::NEG_INFINITY], &[3]).to_string(),
        "tensor([nan, 1., -inf])"
    );
    assert_eq!(t(&[3.5], &[]).to_string(), "tensor(3.5000)");
}

#[test]
fn rows_and_planes_nest_like_pytorch() {
    let x = Tensor::arange(0.0, 8.0, 1.0, DType::I64, Device::Cpu)
        .unwrap()
        .view(&[2, 2, 2])
        .unwrap();
    assert_eq!(
        x.to_string(),
        "tensor([[[0, 1],\n         [2, 3]],\n\n        [[4, 5],\n         [6, 7]]])"
    );
    let b = Tensor::from_slice(&[true, false], &[2], Device::Cpu).unwrap();
    assert_eq!(b.to_string(), "tensor([ True, False])");
}

#[test]
fn dtype_device_and_grad_suffixes() {
    let h = Tensor::from_slice(&[f16::from_f32(0.5)], &[1], Device::Cpu).unwrap();
    assert_eq!(h.to_string(), "tensor([0.5000], dtype=f16)");
    let g = t(&[1.0], &[1]).with_requires_grad(true).unwrap();
    assert_eq!(g.to_string(), "tensor([1.], requires_grad=True)");
    let m = Tensor::empty(&[2, 3], DType::F32, Device::Meta).unwrap();
    assert_eq!(m.to_string(), "tensor(..., device='meta', size=(2, 3))");
    let e = Tensor::empty(&[0, 3], DType::F32, Device::Cpu).unwrap();
    assert_eq!(e.to_string(), "tensor([], size=(0, 3))");
    let e1 = Tensor::empty(&[0], DType::F32, Device::Cpu).unwrap();
    assert_eq!(e1.to_string(), "tensor([])");
}

#[test]
fn large_tensors_are_summarised_from_their_edges() {
    let x = Tensor::arange(0.0, 2000.0, 1.0, DType::I64, Device::Cpu).unwrap();
    assert_eq!(
        x.to_string(),
        "tensor([   0,    1,    2,  ..., 1997, 1998, 1999])"
    );
    let y = x.view(&[40, 50]).unwrap();
    let s = y.to_string();
    assert!(
        s.starts_with("tensor([[   0,    1,    2,  ...,   47,   48,   49],\n        [  50,"),
        "{s}"
    );
    assert!(s.contains("        ...,\n"), "{s}");
    assert!(
        s.ends_with("[1950, 1951, 1952,  ..., 1997, 1998, 1999]])"),
        "{s}"
    );
}

#[test]
fn long_rows_wrap_at_80_columns() {
    let x = Tensor::arange(0.0, 30.0, 1.0, DType::I64, Device::Cpu).unwrap();
    let s = x.to_string();
    assert!(s.lines().all(|l| l.len() <= 80), "{s}");
    assert_eq!(
        s,
        "tensor([ 0,  1,  2,  3,  4,  5,  6,  7,  8,  9, 10, 11, 12, 13, 14, 15, 16, 17,\n        18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29])"
    );
}

#[test]
fn a_huge_expanded_tensor_prints_at_once() {
    // 2^60 elements over one: only the edges are visited, so this returns at once, with the
    // text of any summarised all-zero matrix.
    let z = Tensor::zeros(&[1], DType::F32, Device::Cpu).unwrap();
    let huge = z.expand(&[1 << 40, 1 << 20]).unwrap();
    let row = "[0., 0., 0.,  ..., 0., 0., 0.]";
    let want = format!(
        "tensor([{row},\n        {row},\n        {row},\n        ...,\n        {row},\n        {row},\n        {row}])"
    );
    assert_eq!(huge.to_string(), want);
    assert_eq!(z.expand(&[2000, 2000]).unwrap().to_string(), want);
}
