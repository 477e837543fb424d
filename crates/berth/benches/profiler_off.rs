//! What the profiler costs when it is off, and per op when it is on (issue 16): the off path
//! is one relaxed load in `kernels_for` (`Note [Profiler off costs one load]`).
//!
//! `cargo bench -p berth --bench profiler_off`. Compare `kernels_for/off` with
//! `kernels_for/baseline` (the same dispatch without the check cannot be built, so the
//! baseline is the load alone) and `add_4_f32/off` with `add_4_f32/on`.

use berth::device_kernels::kernels_for;
use berth::profiler;
use berth::{DType, Device, Tensor};
use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("kernels_for");
    g.bench_function("baseline", |b| b.iter(|| black_box(profiler::is_active())));
    g.bench_function("off", |b| {
        b.iter(|| kernels_for(black_box(Device::Cpu), "add").map(|k| black_box(k).kind()))
    });
    g.finish();

    let a = Tensor::ones(&[4], DType::F32, Device::Cpu).unwrap();
    let mut g = c.benchmark_group("add_4_f32");
    g.bench_function("off", |b| b.iter(|| black_box(a.add(&a).unwrap())));
    g.bench_function("on", |b| {
        let p = profiler::profile().start().unwrap();
        b.iter(|| black_box(a.add(&a).unwrap()));
        // Records pile up while on: drop them rather than export.
        drop(p);
    });
    // What `berth train --profile` records: shapes and allocator events too.
    g.bench_function("on_shapes_memory", |b| {
        let p = profiler::profile()
            .record_shapes(true)
            .profile_memory(true)
            .start()
            .unwrap();
        b.iter(|| black_box(a.add(&a).unwrap()));
        drop(p);
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
