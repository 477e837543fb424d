//! GPU tests of `Tensor::index_select` (the gather behind `berth train --resident` on CUDA):
//! the same values as the host gather. Ignored unless run with `--include-ignored`; then
//! skipped with a message without a GPU unless `BERTH_REQUIRE_GPU=1`.

use berth::cuda::testing;
use berth::{DType, Device, Generator, Tensor};

const GPU: Device = Device::Cuda(0);

/// Rows of a `[600, 784]` f32 split and its i64 labels by a shuffled index (a narrowed view
/// of an epoch order, as the resident batches take it), a middle dimension of a transposed
/// f64 tensor, and an empty index: equal to the host's gather element for element.
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored (BERTH_REQUIRE_GPU=1 fails without one)"]
fn cuda_index_select_matches_the_host_gather() {
    if !testing::require_gpu("cuda_index_select_matches_the_host_gather") {
        return;
    }
    let mut g = Generator::new(4);
    let x = Tensor::randn_with(&[600, 784], DType::F32, Device::Cpu, &mut g).unwrap();
    let y = Tensor::from_vec(
        (0..600).map(|v| v % 10).collect::<Vec<i64>>(),
        &[600],
        Device::Cpu,
    )
    .unwrap();
    // A permutation of 0..600 (7919 is prime, so coprime with 600).
    let order: Vec<i64> = (0..600).map(|i| i * 7919 % 600).collect();
    let order = Tensor::from_vec(order, &[600], Device::Cpu).unwrap();
    let (xd, yd, od) = (
        x.to_device(GPU).unwrap(),
        y.to_device(GPU).unwrap(),
        order.to_device(GPU).unwrap(),
    );
    for (start, len) in [(0, 64), (64, 64), (576, 24)] {
        let (ih, id) = (
            order.narrow(0, start, len).unwrap(),
            od.narrow(0, start, len).unwrap(),
        );
        let (xb, yb) = (
            xd.index_select(0, &id).unwrap(),
            yd.index_select(0, &id).unwrap(),
        );
        assert_eq!(xb.shape(), &[len, 784]);
        assert_eq!(
            xb.to_device(Device::Cpu).unwrap().to_vec::<f32>().unwrap(),
            x.index_select(0, &ih).unwrap().to_vec::<f32>().unwrap(),
            "rows {start}..{}",
            start + len
        );
        assert_eq!(
            yb.to_device(Device::Cpu).unwrap().to_vec::<i64>().unwrap(),
            y.index_select(0, &ih).unwrap().to_vec::<i64>().unwrap()
        );
    }
    let t = Tensor::randn_with(&[5, 7, 3], DType::F32, Device::Cpu, &mut g)
        .unwrap()
        .to_dtype(DType::F64)
        .unwrap()
        .transpose(0, 2)
        .unwrap();
    let i = Tensor::from_vec(vec![6i64, 0, 6, 3], &[4], Device::Cpu).unwrap();
    let got = t
        .to_device(GPU)
        .unwrap()
        .index_select(1, &i.to_device(GPU).unwrap())
        .unwrap();
    assert_eq!(
        got.to_device(Device::Cpu).unwrap().to_vec::<f64>().unwrap(),
        t.index_select(1, &i).unwrap().to_vec::<f64>().unwrap()
    );
    let none = Tensor::zeros(&[0], DType::I64, GPU).unwrap();
    assert_eq!(xd.index_select(0, &none).unwrap().shape(), &[0, 784]);
}
