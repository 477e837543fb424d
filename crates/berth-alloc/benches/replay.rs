//! Allocator speed: each real trace (every committed one) replayed with a warm cache through PyTorch's policy
//! ([`CachingAllocator`]) and berth's own ([`PagedBestFit`]), and the cost of one
//! allocate + free pair with 100 / 10k / 100k blocks live.
//!
//! One criterion iteration is one whole replay; ns per operation = reported time / ops
//! (printed for each trace before its group runs). Run: `cargo bench -p berth-alloc --bench replay`;
//! `BERTH_TRACE_DIR` overrides where the traces are read from (default `tests/data`).

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use berth_alloc::backend::sim::SimBackend;
use berth_alloc::caching::CachingAllocator;
use berth_alloc::trace::read_trace;
use berth_alloc::{DeviceAllocator, DevicePtr, PagedBestFit, StreamId, TraceAction};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};

/// The trace directory: `BERTH_TRACE_DIR`, or the committed traces of `tests/data`.
fn trace_dir() -> PathBuf {
    std::env::var_os("BERTH_TRACE_DIR").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data"),
        PathBuf::from,
    )
}

/// Every `*.trace.json.gz` in [`trace_dir`], by name.
fn traces() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(trace_dir())
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .filter_map(|e| {
                    e.file_name()
                        .to_str()
                        .and_then(|n| n.strip_suffix(".trace.json.gz"))
                        .map(str::to_owned)
                })
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// One operation of a pre-digested trace: allocate into a slot, or free a slot.
#[derive(Clone, Copy)]
enum Op {
    Alloc {
        bytes: usize,
        stream: StreamId,
        slot: usize,
    },
    Free {
        slot: usize,
    },
}

/// The trace's `alloc` / `free_completed` rows as slot operations (the replay rules of
/// `berth_alloc::replay`), so the timed loop does no hashing of its own.
fn ops_of(name: &str) -> Option<(Vec<Op>, usize)> {
    let path = trace_dir().join(format!("{name}.trace.json.gz"));
    let trace = read_trace(&path).ok()?;
    let mut slots = std::collections::HashMap::new();
    let mut ops = Vec::new();
    let mut next = 0;
    for e in &trace.events {
        match e.action {
            TraceAction::Alloc => {
                let slot = *slots.entry(e.addr).or_insert_with(|| {
                    next += 1;
                    next - 1
                });
                ops.push(Op::Alloc {
                    bytes: e.size as usize,
                    stream: e.stream,
                    slot,
                });
            }
            TraceAction::FreeCompleted => {
                if let Some(&slot) = slots.get(&e.addr) {
                    ops.push(Op::Free { slot });
                }
            }
            _ => {}
        }
    }
    Some((ops, next))
}

/// Replays `ops` once; every block is freed at the end, so the next replay starts warm.
fn replay(alloc: &dyn DeviceAllocator, ops: &[Op], ptrs: &mut [DevicePtr]) {
    for op in ops {
        match *op {
            Op::Alloc {
                bytes,
                stream,
                slot,
            } => {
                if !ptrs[slot].is_null() {
                    let _ = alloc.raw_delete(ptrs[slot]);
                }
                ptrs[slot] = alloc.raw_alloc(bytes, stream).expect("fits on an H200");
            }
            Op::Free { slot } => {
                let _ = alloc.raw_delete(std::mem::take(&mut ptrs[slot]));
            }
        }
    }
    for p in ptrs.iter_mut() {
        if !p.is_null() {
            let _ = alloc.raw_delete(std::mem::take(p));
        }
    }
}

fn policies() -> Vec<(&'static str, Box<dyn DeviceAllocator>)> {
    vec![
        (
            "pytorch",
            Box::new(CachingAllocator::new(SimBackend::new(
                SimBackend::H200_BYTES,
            ))),
        ),
        (
            "paged",
            Box::new(
                PagedBestFit::new(SimBackend::new(SimBackend::H200_BYTES)).expect("sim has VMM"),
            ),
        ),
    ]
}

fn bench_traces(c: &mut Criterion) {
    for name in traces() {
        let Some((ops, slots)) = ops_of(&name) else {
            eprintln!("skipping {name}: tests/data/{name}.trace.json.gz not readable");
            continue;
        };
        let mut group = c.benchmark_group(format!("replay/{name}"));
        group.throughput(Throughput::Elements(ops.len() as u64));
        group.sample_size(10);
        for (policy, alloc) in policies() {
            let mut ptrs = vec![DevicePtr::NULL; slots];
            replay(alloc.as_ref(), &ops, &mut ptrs); // warm the cache
            let t = Instant::now();
            replay(alloc.as_ref(), &ops, &mut ptrs);
            eprintln!(
                "{name} {policy}: {} ops, warm {:.0} ns/op",
                ops.len(),
                t.elapsed().as_nanos() as f64 / ops.len() as f64
            );
            group.bench_function(BenchmarkId::from_parameter(policy), |b| {
                b.iter(|| replay(alloc.as_ref(), black_box(&ops), &mut ptrs))
            });
        }
        group.finish();
    }
}

/// One allocate + free pair of mixed sizes with `live` other blocks live (on the default
/// stream), for each policy: the per-operation cost must not grow with `live`.
fn bench_live_blocks(c: &mut Criterion) {
    let mut group = c.benchmark_group("live_blocks");
    group.throughput(Throughput::Elements(2));
    for live in [100usize, 10_000, 100_000] {
        for (policy, alloc) in policies() {
            // Sizes 512 B .. 64 KiB, a pseudo-random mix; every other block freed to leave holes.
            let mut next = berth_alloc::testing::xorshift(0x9e37_79b9_7f4a_7c15);
            let mut size = || 512 * (1 + (next() % 128) as usize);
            let mut held = Vec::with_capacity(2 * live);
            for _ in 0..2 * live {
                held.push(alloc.raw_alloc(size(), StreamId::DEFAULT).unwrap());
            }
            for p in held.iter().skip(1).step_by(2) {
                alloc.raw_delete(*p).unwrap();
            }
            let sizes: Vec<usize> = (0..1024).map(|_| size()).collect();
            group.bench_function(BenchmarkId::new(policy, live), |b| {
                let mut i = 0;
                b.iter(|| {
                    let p = alloc.raw_alloc(sizes[i & 1023], StreamId::DEFAULT).unwrap();
                    alloc.raw_delete(black_box(p)).unwrap();
                    i += 1;
                })
            });
            for p in held.iter().step_by(2) {
                alloc.raw_delete(*p).unwrap();
            }
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    targets = bench_traces, bench_live_blocks
}
criterion_main!(benches);
