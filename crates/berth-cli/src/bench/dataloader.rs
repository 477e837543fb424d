//! `berth bench dataloader`: PyTorch's DataLoader workload (its PyTorch twin: `BENCHMARKS.md`):
//! a `TensorDataset` of 100,000 × 3072 f32 samples with i64 labels, batch 256, shuffle, for
//! several worker counts; batches to host memory always, and to the GPU (pinned, copied with
//! `non_blocking` through the device prefetcher) when one is present, and the same pinned
//! batches left on the host (`host-pinned`, no copy). By default it sweeps the worker counts
//! 0, 1, 2, 4, 8, … up to the cores present, and the core count itself. In the same run it
//! times a `memcpy` of the same total bytes with one thread and with each thread count of the
//! sweep (`max(workers, 1)` threads, each copying one contiguous part): the physical limit of a
//! gather by that many threads on this machine; every host figure is compared with the memcpy
//! of its own thread count (`vs_parallel_memcpy`). Every figure is the median of `--epochs`
//! epochs after one warm-up epoch.

use std::time::Instant;

use anyhow::Context;
use berth::{DType, Device, Tensor};
use berth_data::prefetch::DevicePrefetcher;
use berth_data::{DataLoader, Generator, TensorDataset};

/// Arguments of `berth bench dataloader`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print JSON lines.
    #[arg(long)]
    pub json: bool,
    /// Samples in the dataset (PyTorch's workload: 100000).
    #[arg(long, default_value_t = 100_000, allow_negative_numbers = true,
          value_parser = crate::whole_usize("--samples", "the number of samples", 1, 100_000))]
    pub samples: usize,
    /// f32 features per sample (PyTorch's workload: 3072).
    #[arg(long, default_value_t = 3072, allow_negative_numbers = true,
          value_parser = crate::whole_usize("--features", "the number of features", 1, 3072))]
    pub features: usize,
    /// Batch size.
    #[arg(long, default_value_t = 256, allow_negative_numbers = true,
          value_parser = crate::whole_usize("--batch-size", "the batch size", 1, 256))]
    pub batch_size: usize,
    /// Worker counts to measure, comma-separated (each at most 1024). Default: 0, 1, 2, 4, 8,
    /// … up to the cores present, and the core count itself.
    #[arg(long, value_delimiter = ',', allow_negative_numbers = true,
          value_parser = crate::whole_usize("--workers", "the number of worker threads", 0, 4))]
    pub workers: Vec<usize>,
    /// Timed epochs per figure (the median is reported; at most 10000), after one warm-up epoch.
    #[arg(long, default_value_t = 3, allow_negative_numbers = true,
          value_parser = crate::whole_usize("--epochs", "the number of timed epochs", 1, 3))]
    pub epochs: usize,
}

/// One printed figure.
#[derive(serde::Serialize)]
struct Figure {
    bench: &'static str,
    target: &'static str,
    workers: Option<usize>,
    pin_memory: bool,
    samples_per_second: f64,
    gb_per_s: f64,
    /// This figure's bytes/s over the single-threaded memcpy's bytes/s of the same run.
    vs_memcpy: f64,
    /// Threads of the parallel memcpy this figure is compared with (`max(workers, 1)`).
    #[serde(skip_serializing_if = "Option::is_none")]
    memcpy_threads: Option<usize>,
    /// This figure's bytes/s over the parallel memcpy's with `memcpy_threads` threads.
    #[serde(skip_serializing_if = "Option::is_none")]
    vs_parallel_memcpy: Option<f64>,
}

/// The default sweep: 0, 1, 2, 4, 8, … while at most `cores`, then `cores` itself.
fn default_sweep(cores: usize) -> Vec<usize> {
    let mut v = vec![0];
    let mut w = 1;
    while w <= cores {
        v.push(w);
        w *= 2;
    }
    if v.last() != Some(&cores) && cores > 0 {
        v.push(cores);
    }
    v
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn emit(json: bool, f: &Figure) {
    if json {
        println!("{}", serde_json::to_string(f).unwrap_or_default());
    } else {
        let threads = |t: usize| {
            if t == 1 {
                "1 thread".to_owned()
            } else {
                format!("{t} threads")
            }
        };
        // The references first: the single `copy_from_slice` ("x memcpy"), then the parallel
        // copy of each thread count ("x memcpy on N threads"), each measured on its own.
        let (label, tail) = match (f.workers, f.vs_parallel_memcpy) {
            (None, None) => (
                "single copy, the reference of \"x memcpy\"".to_owned(),
                String::new(),
            ),
            (None, Some(_)) => {
                let t = threads(f.memcpy_threads.unwrap_or(1));
                (
                    format!("{t} in parallel, the reference of \"on {t}\""),
                    format!("  {:>5.2}x memcpy", f.vs_memcpy),
                )
            }
            (Some(w), par) => {
                let par = match (f.memcpy_threads, par) {
                    (Some(t), Some(r)) => format!("  {r:>5.2}x memcpy on {}", threads(t)),
                    _ => String::new(),
                };
                (
                    format!("workers={w:<3} pin_memory={}", f.pin_memory),
                    format!("  {:>5.2}x memcpy{par}", f.vs_memcpy),
                )
            }
        };
        println!(
            "{:<11} {label:<52} {:>12.0} samples/s {:>8.2} GB/s{tail}",
            f.target, f.samples_per_second, f.gb_per_s
        );
    }
}

/// A host f32 tensor of `shape` with every page written (pseudo-random values), so no read is
/// served by the kernel's shared zero page.
fn filled(shape: &[usize], dtype: DType) -> anyhow::Result<Tensor> {
    let t = Tensor::empty(shape, dtype, Device::Cpu)?;
    {
        let mut w = t.storage().write_host("bench")?;
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        for chunk in w.bytes_mut().chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let b = (x & 0x3F7F_FFFF_3F7F_FFFF).to_le_bytes(); // finite f32 pairs
            chunk.copy_from_slice(&b[..chunk.len()]);
        }
    }
    Ok(t)
}

/// `bytes` bytes of host memory set to 1, or [`berth::Error::HostOutOfMemory`] when the system
/// allocator refuses them (`vec!` would abort the process: found with `--samples` large enough
/// for the dataset but not for this second buffer).
fn host_buffer(bytes: usize) -> anyhow::Result<Vec<u8>> {
    let mut v = Vec::new();
    v.try_reserve_exact(bytes)
        .map_err(|_| berth::Error::HostOutOfMemory {
            device: Device::Cpu,
            requested_bytes: bytes,
        })?;
    v.resize(bytes, 1);
    Ok(v)
}

/// Seconds of one single-threaded copy of `src` into `dst` (both fully touched beforehand).
fn memcpy_secs(src: &[u8], dst: &mut [u8]) -> f64 {
    let t0 = Instant::now();
    dst.copy_from_slice(src);
    std::hint::black_box(&dst[dst.len() / 2]);
    t0.elapsed().as_secs_f64()
}

/// Seconds of one copy of `src` into `dst` by `threads` threads, each copying one contiguous
/// part (both buffers fully touched beforehand).
fn par_memcpy_secs(src: &[u8], dst: &mut [u8], threads: usize) -> f64 {
    let part = src.len().div_ceil(threads.max(1)).max(1);
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for (d, c) in dst.chunks_mut(part).zip(src.chunks(part)) {
            s.spawn(move || d.copy_from_slice(c));
        }
    });
    std::hint::black_box(&dst[dst.len() / 2]);
    t0.elapsed().as_secs_f64()
}

/// The most timed epochs per figure: the medians keep one timing per epoch, and more than this
/// measures nothing a median of fewer would not.
const MAX_EPOCHS: usize = 10_000;

/// Runs the DataLoader benchmark.
pub fn run(args: Args) -> anyhow::Result<()> {
    for (flag, value, example) in [
        // The examples are the defaults (PyTorch's workload in `torch_baseline.py`).
        ("--samples", args.samples, 100_000),
        ("--features", args.features, 3072),
        ("--batch-size", args.batch_size, 256),
        ("--epochs", args.epochs, 3),
    ] {
        if value == 0 {
            return Err(crate::UsageError(format!(
                "{flag} 0: must be at least 1 (e.g. {flag} {example})"
            ))
            .into());
        }
    }
    if args.epochs > MAX_EPOCHS {
        return Err(crate::UsageError(format!(
            "--epochs {}: at most {MAX_EPOCHS} timed epochs per figure (e.g. --epochs 3)",
            args.epochs
        ))
        .into());
    }
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let workers = if args.workers.is_empty() {
        default_sweep(cores)
    } else {
        // Each count once, in the order given (`--workers 1,1` measures 1 once).
        let mut seen = std::collections::BTreeSet::new();
        args.workers
            .iter()
            .copied()
            .filter(|w| seen.insert(*w))
            .collect()
    };
    for &w in &workers {
        crate::check_workers(w)?;
    }
    let (n, f) = (args.samples, args.features);
    let x = filled(&[n, f], DType::F32).context("allocating the dataset")?;
    let y = Tensor::arange(0.0, n as f64, 1.0, DType::I64, Device::Cpu)?;
    let epoch_bytes = (n * f * 4 + n * 8) as f64;

    // The memcpy of the same total bytes, measured in this run: one thread, then each thread
    // count of the sweep.
    let mut par_bps = std::collections::BTreeMap::new();
    let memcpy_bps = {
        let src = x.storage().read_host("bench")?;
        let src = &src.bytes()[..n * f * 4];
        let mut dst = host_buffer(src.len() + n * 8).context("allocating the memcpy buffer")?;
        let (dx, _) = dst.split_at_mut(src.len());
        memcpy_secs(src, dx); // warm-up
        let secs = median((0..args.epochs).map(|_| memcpy_secs(src, dx)).collect());
        for t in workers.iter().map(|&w| w.max(1)) {
            if par_bps.contains_key(&t) {
                continue;
            }
            par_memcpy_secs(src, dx, t); // warm-up
            let s = median(
                (0..args.epochs)
                    .map(|_| par_memcpy_secs(src, dx, t))
                    .collect(),
            );
            par_bps.insert(t, (n * f * 4) as f64 / s);
        }
        (n * f * 4) as f64 / secs
    };
    emit(
        args.json,
        &Figure {
            bench: "dataloader",
            target: "memcpy",
            workers: None,
            pin_memory: false,
            samples_per_second: memcpy_bps / (f * 4) as f64,
            gb_per_s: memcpy_bps / 1e9,
            vs_memcpy: 1.0,
            memcpy_threads: Some(1),
            vs_parallel_memcpy: None,
        },
    );
    for (&t, &bps) in &par_bps {
        emit(
            args.json,
            &Figure {
                bench: "dataloader",
                target: "memcpy",
                workers: None,
                pin_memory: false,
                samples_per_second: bps / (f * 4) as f64,
                gb_per_s: bps / 1e9,
                vs_memcpy: bps / memcpy_bps,
                memcpy_threads: Some(t),
                vs_parallel_memcpy: Some(1.0),
            },
        );
    }

    let ds = std::sync::Arc::new(TensorDataset::new(vec![x, y])?);
    let loader = |w: usize, pin: bool| {
        DataLoader::<TensorDataset>::builder(std::sync::Arc::clone(&ds))
            .batch_size(args.batch_size)
            .shuffle(true)
            .num_workers(w as isize)
            .persistent_workers(w > 0)
            .pin_memory(pin)
            .generator(Generator::new(0))
            .build()
    };
    // One figure from the median epoch seconds `s`.
    let figure = |target, w: usize, pin_memory, s: f64, parallel: bool| {
        let bps = epoch_bytes / s;
        Figure {
            bench: "dataloader",
            target,
            workers: Some(w),
            pin_memory,
            samples_per_second: n as f64 / s,
            gb_per_s: bps / 1e9,
            vs_memcpy: bps / memcpy_bps,
            memcpy_threads: parallel.then_some(w.max(1)),
            vs_parallel_memcpy: par_bps.get(&w.max(1)).filter(|_| parallel).map(|p| bps / p),
        }
    };
    for &w in &workers {
        let dl = loader(w, false)?;
        let s = epoch_secs(args.epochs, n, || host_epoch(&dl))?;
        emit(args.json, &figure("host", w, false, s, true));
    }

    if !berth::cuda::is_available() {
        let reason = berth::cuda::unavailable_reason().unwrap_or_default();
        if args.json {
            // One JSON object per line, so a reader of the figures sees the GPU part was skipped.
            println!(
                "{}",
                serde_json::json!({ "bench": "dataloader", "target": "cuda", "skipped": reason })
            );
        } else {
            println!("gpu: skipped ({reason})");
        }
        return Ok(());
    }
    let device: Device = "cuda:0".parse()?;
    for &w in &workers {
        let dl = loader(w, true)?;
        // The same pinned batches left on the host (no copy): what the workers deliver into
        // pinned memory, so the copy's share of the `cuda:0` figure shows.
        let s = epoch_secs(args.epochs, n, || host_epoch(&dl))?;
        emit(
            args.json,
            &figure("host-pinned", w, dl.pin_memory(), s, false),
        );
        let s = epoch_secs(args.epochs, n, || {
            let mut seen = 0usize;
            for b in DevicePrefetcher::new(dl.iter(), device)? {
                seen += b?[1].numel();
            }
            berth::cuda::current_stream(0)?.synchronize()?;
            Ok(seen)
        })?;
        emit(args.json, &figure("cuda:0", w, dl.pin_memory(), s, false));
    }
    Ok(())
}

/// One epoch of `dl`'s batches on the host: the samples delivered.
fn host_epoch(dl: &DataLoader<TensorDataset>) -> anyhow::Result<usize> {
    let mut seen = 0usize;
    for b in dl {
        seen += b?[1].numel();
    }
    Ok(seen)
}

/// The median seconds of `epochs` timed runs of `epoch` after one warm-up run; each must
/// deliver all `n` samples (`epoch` returns how many it did).
///
/// # Errors
/// `epoch`'s error, or an epoch that delivered other than `n` samples.
fn epoch_secs(
    epochs: usize,
    n: usize,
    mut epoch: impl FnMut() -> anyhow::Result<usize>,
) -> anyhow::Result<f64> {
    let mut secs = Vec::new();
    for e in 0..=epochs {
        let t0 = Instant::now();
        let seen = epoch()?;
        anyhow::ensure!(seen == n, "epoch delivered {seen} samples, expected {n}");
        if e > 0 {
            secs.push(t0.elapsed().as_secs_f64());
        }
    }
    Ok(median(secs))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A buffer the system cannot provide is a typed out-of-memory error, not an abort.
    #[test]
    fn an_impossible_buffer_is_a_typed_error() {
        let e = host_buffer(usize::MAX / 2).unwrap_err();
        let be = e.downcast_ref::<berth::Error>().expect("a berth::Error");
        assert!(be.is_out_of_memory(), "{be}");
        assert!(e.to_string().contains("not enough memory"), "{e}");
        assert_eq!(host_buffer(3).unwrap(), vec![1, 1, 1]);
    }

    #[test]
    fn the_default_sweep_reaches_the_core_count() {
        assert_eq!(default_sweep(1), vec![0, 1]);
        assert_eq!(default_sweep(2), vec![0, 1, 2]);
        assert_eq!(default_sweep(16), vec![0, 1, 2, 4, 8, 16]);
        assert_eq!(default_sweep(12), vec![0, 1, 2, 4, 8, 12]);
        assert_eq!(default_sweep(3), vec![0, 1, 2, 3]);
    }

    #[test]
    fn the_parallel_memcpy_copies_every_byte() {
        let src: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
        for t in [1, 3, 7, 2000] {
            let mut dst = vec![0u8; 1000];
            par_memcpy_secs(&src, &mut dst, t);
            assert_eq!(dst, src, "{t} threads");
        }
    }
}
