//! The main job's CPU step, op by op (issue 15): `berth train --device cpu`'s MLP
//! `784 → 256 → 10` at batch 64, each op on its real shapes, and the whole step.
//!
//! `cargo bench -p berth --bench cpu_step`; `RAYON_NUM_THREADS` sets the pool. The two
//! 12.8M multiply-add products (`fc1` forward and its weight gradient) were most of a step on
//! the 16-core H200 host; `BENCHMARKS.md` has the figures.

use berth::optim::Sgd;
use berth::{DType, Device, Tensor};
use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;

const BATCH: usize = 64;
const INPUTS: usize = 784;
const HIDDEN: usize = 256;
const CLASSES: usize = 10;

fn randn(shape: &[usize]) -> Tensor {
    Tensor::randn(shape, DType::F32, Device::Cpu).expect("host tensor")
}

fn bench(c: &mut Criterion) {
    let x = randn(&[BATCH, INPUTS]);
    let w1 = randn(&[HIDDEN, INPUTS]);
    let b1 = randn(&[HIDDEN]);
    let w2 = randn(&[CLASSES, HIDDEN]);
    let b2 = randn(&[CLASSES]);
    let targets = Tensor::from_vec(
        (0..BATCH as i64).map(|i| i % CLASSES as i64).collect(),
        &[BATCH],
        Device::Cpu,
    )
    .expect("targets");
    let pre = x.matmul(&w1.t().unwrap()).unwrap().add(&b1).unwrap();
    let h = pre.relu().unwrap();
    let logits = h.matmul(&w2.t().unwrap()).unwrap().add(&b2).unwrap();
    let g = logits.cross_entropy_backward(&targets).unwrap();
    let dpre = g.matmul(&w2).unwrap().relu_backward(&pre).unwrap();

    let mut grp = c.benchmark_group("cpu_step");
    grp.bench_function("fc1_forward_matmul", |b| {
        b.iter(|| black_box(x.matmul(&w1.t().unwrap()).unwrap()))
    });
    grp.bench_function("fc1_weight_grad_matmul", |b| {
        b.iter(|| black_box(dpre.t().unwrap().matmul(&x).unwrap()))
    });
    grp.bench_function("fc2_forward_matmul", |b| {
        b.iter(|| black_box(h.matmul(&w2.t().unwrap()).unwrap()))
    });
    grp.bench_function("bias_add_64x256", |b| {
        b.iter(|| black_box(pre.add(&b1).unwrap()))
    });
    // The weight gradient's output: allocated (zeroed) and freed each step.
    grp.bench_function("empty_256x784", |b| {
        b.iter(|| black_box(Tensor::empty(&[HIDDEN, INPUTS], DType::F32, Device::Cpu).unwrap()))
    });
    grp.bench_function("relu_64x256", |b| b.iter(|| black_box(pre.relu().unwrap())));
    grp.bench_function("sum_dim0_64x256", |b| {
        b.iter(|| black_box(dpre.sum_dim(0, false).unwrap()))
    });
    grp.bench_function("cross_entropy_64x10", |b| {
        b.iter(|| black_box(logits.cross_entropy(&targets).unwrap()))
    });
    grp.bench_function("cross_entropy_backward_64x10", |b| {
        b.iter(|| black_box(logits.cross_entropy_backward(&targets).unwrap()))
    });
    grp.bench_function("relu_backward_64x256", |b| {
        b.iter(|| black_box(dpre.relu_backward(&pre).unwrap()))
    });
    let params = [&w1, &b1, &w2, &b2];
    let grads = [
        randn(&[HIDDEN, INPUTS]),
        randn(&[HIDDEN]),
        randn(&[CLASSES, HIDDEN]),
        randn(&[CLASSES]),
    ];
    let grads: Vec<&Tensor> = grads.iter().collect();
    let mut opt = Sgd::new(1e-9, 0.9);
    grp.bench_function("fused_sgd_203k", |b| {
        b.iter(|| opt.step(&params, &grads).unwrap())
    });
    grp.bench_function("whole_step", |b| {
        let mut opt = Sgd::new(1e-9, 0.9);
        b.iter(|| {
            let pre = x.matmul(&w1.t().unwrap()).unwrap().add(&b1).unwrap();
            let h = pre.relu().unwrap();
            let logits = h.matmul(&w2.t().unwrap()).unwrap().add(&b2).unwrap();
            black_box(logits.cross_entropy(&targets).unwrap());
            let g = logits.cross_entropy_backward(&targets).unwrap();
            let gw2 = g.t().unwrap().matmul(&h).unwrap();
            let gb2 = g.sum_dim(0, false).unwrap();
            let dpre = g.matmul(&w2).unwrap().relu_backward(&pre).unwrap();
            let gw1 = dpre.t().unwrap().matmul(&x).unwrap();
            let gb1 = dpre.sum_dim(0, false).unwrap();
            opt.step(&params, &[&gw1, &gb1, &gw2, &gb2]).unwrap();
        })
    });
    grp.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(std::time::Duration::from_millis(300))
        .measurement_time(std::time::Duration::from_secs(1))
        .sample_size(30);
    targets = bench
}
criterion_main!(benches);
