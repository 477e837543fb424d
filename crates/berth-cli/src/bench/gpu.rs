//! `berth bench transfers | alloc | overlap | sync`: GPU measurements comparable with
//! PyTorch's baseline figures in `BENCHMARKS.md` (same sizes, same definitions).
//!
//! Device times come from CUDA events on the stream that ran the work; host times from the
//! host clock. Every figure runs a warm-up first and reports the median of its repetitions;
//! host inputs are filled with fresh pseudo-random bytes for each figure.

use anyhow::Context;
use berth::alloc::{HostBackend, MemoryBackend, StreamId};
use berth::cuda::{self, CudaBackend, CudaHostBackend, Event, Stream};
use berth::{DType, Device, Tensor};
use std::time::Instant;

macro_rules! bench_args {
    ($name:ident, $doc:literal) => {
        #[doc = $doc]
        #[derive(clap::Args, Debug)]
        pub struct $name {
            /// Print JSON lines.
            #[arg(long)]
            pub json: bool,
            /// Repetitions per figure (the median is reported); at least 1.
            #[arg(long, default_value_t = 10, allow_negative_numbers = true,
                  value_parser = crate::whole_usize("--reps", "the number of repetitions", 1, 10))]
            pub reps: usize,
        }
    };
}
/// Arguments of `berth bench transfers`.
#[derive(clap::Args, Debug)]
pub struct TransfersArgs {
    /// Print JSON lines.
    #[arg(long)]
    pub json: bool,
    /// Repetitions per figure (the median is reported); at least 1.
    #[arg(long, default_value_t = 10, allow_negative_numbers = true,
          value_parser = crate::whole_usize("--reps", "the number of repetitions", 1, 10))]
    pub reps: usize,
    /// Instead of the figures: time one way of making the process's first pinned copy
    /// (`berth::cuda::pin_probe` variant name, or `pin_memory`), then `reps` more.
    #[arg(long, hide = true)]
    pub pin_probe: Option<String>,
    /// Size of the probe's source in MiB.
    #[arg(long, hide = true, default_value_t = 256)]
    pub probe_mib: usize,
}
bench_args!(AllocArgs, "Arguments of `berth bench alloc`.");
bench_args!(OverlapArgs, "Arguments of `berth bench overlap`.");
bench_args!(SyncArgs, "Arguments of `berth bench sync`.");

const MIB: usize = 1 << 20;

/// One printed figure.
#[derive(serde::Serialize)]
struct Figure<'a> {
    bench: &'a str,
    figure: String,
    value: f64,
    unit: &'a str,
}

pub(super) fn emit(json: bool, bench: &str, figure: impl Into<String>, value: f64, unit: &str) {
    let f = Figure {
        bench,
        figure: figure.into(),
        value,
        unit,
    };
    if json {
        println!("{}", serde_json::to_string(&f).unwrap_or_default());
    } else {
        println!("{:<60} {:>12.3} {}", f.figure, f.value, f.unit);
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Rejects `--reps 0` (a median of no repetitions), before any GPU work.
pub(super) fn check_reps(reps: usize) -> anyhow::Result<()> {
    Ok(crate::check_at_least_one(
        "--reps",
        reps,
        "repetitions",
        10,
    )?)
}

pub(super) fn require_gpu() -> anyhow::Result<()> {
    if let Some(reason) = cuda::unavailable_reason() {
        // Exit status 2, as `train --device cuda` and `replay --device cuda:N` give.
        return Err(crate::UsageError(format!(
            "CUDA is not available ({reason}); GPU benchmarks need a CUDA device (try `berth bench dataloader`)"
        ))
        .into());
    }
    Ok(())
}

/// A host tensor of `bytes` bytes (f32) with pseudo-random contents.
fn random_host(bytes: usize, seed: u64) -> anyhow::Result<Tensor> {
    let t = Tensor::empty(&[bytes / 4], DType::F32, Device::Cpu)?;
    {
        let mut w = t.storage().write_host("bench")?;
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        for chunk in w.bytes_mut().chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let b = x.to_le_bytes();
            chunk.copy_from_slice(&b[..chunk.len()]);
        }
    }
    Ok(t)
}

/// Device ms of `f` on `stream`, measured with timing events, median over `reps` after one
/// warm-up.
pub(super) fn time_events(
    stream: &Stream,
    reps: usize,
    mut f: impl FnMut() -> anyhow::Result<()>,
) -> anyhow::Result<f64> {
    let _g = stream.scope();
    f()?;
    stream.synchronize()?;
    let mut ms = Vec::with_capacity(reps);
    for _ in 0..reps {
        let (a, b) = (Event::new(true), Event::new(true));
        a.record_on(stream)?;
        f()?;
        b.record_on(stream)?;
        b.synchronize()?;
        ms.push(f64::from(a.elapsed_time(&b)?));
    }
    Ok(median(ms))
}

pub(super) fn gbps(bytes: usize, ms: f64) -> f64 {
    bytes as f64 / (ms * 1e-3) / 1e9
}

/// `berth bench transfers --pin-probe VARIANT`: the process's first pinned copy of a
/// `probe_mib` MiB source made with `VARIANT` (context already created, as PyTorch's
/// `pin_memory()` figure), phase by phase, then the median of `reps` more.
fn run_pin_probe(a: &TransfersArgs, variant: &str) -> anyhow::Result<()> {
    let n = a.probe_mib.max(1) * MIB;
    let _s = Stream::new(0, 0)?;
    let src = random_host(n, 7)?;
    let bytes = src.storage().read_host("bench")?.bytes().to_vec();
    let one = |first: bool| -> anyhow::Result<[f64; 5]> {
        if variant == "pin_memory" {
            if !first {
                cuda::host_empty_cache()?;
            }
            let t0 = Instant::now();
            let p = src.pin_memory()?;
            let total = t0.elapsed().as_secs_f64() * 1e3;
            anyhow::ensure!(p.is_pinned(), "pin_memory() result is not pinned");
            drop(p);
            let t0 = Instant::now();
            cuda::host_empty_cache()?;
            let free = t0.elapsed().as_secs_f64() * 1e3;
            return Ok([0.0, 0.0, 0.0, total, free]);
        }
        let v = cuda::pin_probe::Variant::parse(variant)
            .with_context(|| format!("unknown pin probe variant {variant:?}"))?;
        let p = cuda::pin_probe::run(v, &bytes, 0)?;
        Ok([p.alloc_ms, p.copy_ms, p.register_ms, p.total_ms, p.free_ms])
    };
    let first = one(true)?;
    let mut again: Vec<[f64; 5]> = Vec::new();
    for _ in 0..a.reps {
        again.push(one(false)?);
    }
    let names = ["alloc", "copy", "register", "total", "free"];
    for (i, name) in names.iter().enumerate() {
        emit(
            a.json,
            "pin-probe",
            format!("{variant} {} MiB first {name} (ms)", a.probe_mib),
            first[i],
            "ms",
        );
        if !again.is_empty() {
            emit(
                a.json,
                "pin-probe",
                format!("{variant} {} MiB again {name} (ms)", a.probe_mib),
                median(again.iter().map(|p| p[i]).collect()),
                "ms",
            );
        }
    }
    Ok(())
}

/// Runs `berth bench transfers`.
pub fn run_transfers(a: TransfersArgs) -> anyhow::Result<()> {
    check_reps(a.reps)?;
    require_gpu()?;
    if let Some(v) = &a.pin_probe {
        return run_pin_probe(&a, v);
    }
    let s = Stream::new(0, 0)?;
    let n = 256 * MIB;
    let reps = a.reps;
    // pin_memory() first, as PyTorch's figure: the process's first pinned allocation, with the
    // context already created (by the stream above); then again (host cache warm).
    let fresh = random_host(n, 3)?;
    let t0 = Instant::now();
    let p = fresh.pin_memory()?;
    let first = t0.elapsed().as_secs_f64() * 1e3;
    drop(p);
    let t0 = Instant::now();
    let p = fresh.pin_memory()?;
    let again = t0.elapsed().as_secs_f64() * 1e3;
    anyhow::ensure!(p.is_pinned(), "pin_memory() result is not pinned");
    drop((p, fresh));
    emit(
        a.json,
        "transfers",
        "pin_memory() 256 MiB first (ms)",
        first,
        "ms",
    );
    emit(
        a.json,
        "transfers",
        "pin_memory() 256 MiB again (ms)",
        again,
        "ms",
    );
    let pageable = random_host(n, 1)?;
    let pinned = random_host(n, 2)?.pin_memory()?;
    let to = |t: &Tensor, d: Device, nb: bool| cuda::transfer::transfer(t, d, nb);
    let h2d = |t: &Tensor, nb: bool| -> anyhow::Result<f64> {
        let mut keep = Vec::new();
        let ms = time_events(&s, reps, || {
            keep.push(to(t, Device::Cuda(0), nb)?);
            if keep.len() > 2 {
                keep.remove(0);
            }
            Ok(())
        })?;
        Ok(gbps(n, ms))
    };
    emit(
        a.json,
        "transfers",
        "h2d pageable 256 MiB (GB/s)",
        h2d(&pageable, false)?,
        "GB/s",
    );
    emit(
        a.json,
        "transfers",
        "h2d pageable non_blocking 256 MiB (GB/s)",
        h2d(&pageable, true)?,
        "GB/s",
    );
    emit(
        a.json,
        "transfers",
        "h2d pinned 256 MiB (GB/s)",
        h2d(&pinned, true)?,
        "GB/s",
    );
    let dev = to(&pageable, Device::Cuda(0), false)?;
    // Into an existing tensor, as PyTorch's `x.copy_(g)` / `xp.copy_(g, non_blocking=True)`.
    let pinned_out = random_host(n, 8)?.pin_memory()?;
    for (name, out) in [
        ("d2h pageable 256 MiB (GB/s)", &pageable),
        ("d2h pinned 256 MiB (GB/s)", &pinned_out),
    ] {
        let ms = time_events(&s, reps, || Ok(out.copy_(&dev)?))?;
        emit(a.json, "transfers", name, gbps(n, ms), "GB/s");
    }
    {
        let back = dev.cpu()?;
        let (x, y) = (
            pageable.storage().read_host("bench")?,
            back.storage().read_host("bench")?,
        );
        anyhow::ensure!(
            x.bytes() == y.bytes(),
            "copy_ from the device changed the bytes"
        );
    }
    drop(pinned_out);
    for (name, nb) in [
        (
            "d2h pageable 256 MiB, .to(cpu) into a new tensor (GB/s)",
            false,
        ),
        (
            "d2h .to(cpu, non_blocking) into a new pinned tensor (GB/s)",
            true,
        ),
    ] {
        let mut out = None;
        let ms = time_events(&s, reps, || {
            out = Some(to(&dev, Device::Cpu, nb)?);
            Ok(())
        })?;
        emit(a.json, "transfers", name, gbps(n, ms), "GB/s");
    }
    let big = 4 * 1024 * MIB;
    let src = cuda::transfer::alloc_storage(0, big).context("4 GiB device buffer")?;
    let dst = cuda::transfer::alloc_storage(0, big)?;
    let ms = time_events(&s, reps, || {
        // SAFETY: `src` and `dst` are live 4 GiB storages on cuda:0, used by nothing else;
        // the copies are ordered on the current stream, which `time_events` times.
        unsafe { cuda::transfer::copy_dtod_raw(0, dst.data_ptr(), src.data_ptr(), big)? };
        Ok(())
    })?;
    emit(
        a.json,
        "transfers",
        "d2d copy 4 GiB, bytes read + written (GB/s)",
        gbps(2 * big, ms),
        "GB/s",
    );
    drop((src, dst));
    Ok(())
}

/// Runs `berth bench alloc`.
pub fn run_alloc(a: AllocArgs) -> anyhow::Result<()> {
    check_reps(a.reps)?;
    require_gpu()?;
    let alloc = cuda::memory::allocator(0)?;
    let backend = CudaBackend::new(0)?;
    let iters = 10_000;
    for (label, bytes) in [("512 B", 512), ("1 MiB", MIB), ("64 MiB", 64 * MIB)] {
        drop(alloc.allocate(bytes, StreamId::DEFAULT)?);
        let t0 = Instant::now();
        for _ in 0..iters {
            drop(alloc.allocate(bytes, StreamId::DEFAULT)?);
        }
        let us = t0.elapsed().as_secs_f64() * 1e6 / iters as f64;
        emit(
            a.json,
            "alloc",
            format!("berth caching allocate + free {label} (us)"),
            us,
            "us",
        );
        let mut v = Vec::new();
        for _ in 0..a.reps {
            let t0 = Instant::now();
            let p = backend.malloc(bytes, StreamId::DEFAULT)?;
            // SAFETY: `p` was just allocated with `bytes`; nothing uses it.
            unsafe { backend.free(p, bytes, StreamId::DEFAULT)? };
            v.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        emit(
            a.json,
            "alloc",
            format!("raw cuMemAlloc + cuMemFree {label} (us)"),
            median(v),
            "us",
        );
    }
    let host = CudaHostBackend::new()?;
    let mut v = Vec::new();
    for _ in 0..3 {
        let t0 = Instant::now();
        let p = host.alloc_pinned(256 * MIB)?;
        v.push(t0.elapsed().as_secs_f64() * 1e3);
        // SAFETY: `p` was just allocated with this size; nothing uses it.
        unsafe { host.free_pinned(p, 256 * MIB)? };
    }
    emit(
        a.json,
        "alloc",
        "cuMemHostAlloc 256 MiB (ms)",
        median(v),
        "ms",
    );
    Ok(())
}

/// Runs `berth bench overlap`: a 1 GiB pinned host→device copy on a side stream beside device
/// work on the main stream (8 bf16 8192×8192 matmuls when the CUDA kernels provide matmul,
/// else 16 device-to-device copies of 1 GiB, named as such).
pub fn run_overlap(a: OverlapArgs) -> anyhow::Result<()> {
    check_reps(a.reps)?;
    require_gpu()?;
    let main = Stream::new(0, 0)?;
    let side = Stream::new(0, 0)?;
    let reps = a.reps;
    let gib = 1024 * MIB;
    let src = random_host(gib, 4)?.pin_memory()?;
    let m = {
        let _g = main.scope();
        Tensor::randn(&[8192, 8192], DType::BF16, Device::Cuda(0))
    };
    let (label, compute): (&str, Box<dyn Fn() -> anyhow::Result<()>>) = match m {
        Ok(m) if m.matmul(&m).is_ok() => (
            "8 bf16 8192x8192 matmuls",
            Box::new(move || {
                for _ in 0..8 {
                    drop(m.matmul(&m)?);
                }
                Ok(())
            }),
        ),
        _ => {
            let a1 = cuda::transfer::alloc_storage(0, gib)?;
            let b1 = cuda::transfer::alloc_storage(0, gib)?;
            (
                "16 device copies of 1 GiB (matmul unavailable)",
                Box::new(move || {
                    for _ in 0..16 {
                        // SAFETY: `a1` and `b1` are 1 GiB storages on cuda:0 owned by this
                        // closure, used by nothing else; copies are ordered on the current
                        // stream.
                        unsafe {
                            cuda::transfer::copy_dtod_raw(0, b1.data_ptr(), a1.data_ptr(), gib)?
                        };
                    }
                    Ok(())
                }),
            )
        }
    };
    let copy = || -> anyhow::Result<Tensor> {
        let _g = side.scope();
        Ok(cuda::transfer::transfer(&src, Device::Cuda(0), true)?)
    };
    let host_ms = |f: &dyn Fn() -> anyhow::Result<()>| -> anyhow::Result<f64> {
        f()?;
        cuda::synchronize(0)?;
        let mut v = Vec::new();
        for _ in 0..reps {
            let t0 = Instant::now();
            f()?;
            cuda::synchronize(0)?;
            v.push(t0.elapsed().as_secs_f64() * 1e3);
        }
        Ok(median(v))
    };
    let compute_ms = {
        let _g = main.scope();
        host_ms(&*compute)?
    };
    let copy_ms = host_ms(&|| copy().map(drop))?;
    let both_ms = {
        let _g = main.scope();
        host_ms(&|| {
            let t = copy()?;
            compute()?;
            drop(t);
            Ok(())
        })?
    };
    emit(
        a.json,
        "overlap",
        format!("{label} alone (ms)"),
        compute_ms,
        "ms",
    );
    emit(
        a.json,
        "overlap",
        "1 GiB pinned h2d on a side stream alone (ms)",
        copy_ms,
        "ms",
    );
    emit(a.json, "overlap", "both (ms)", both_ms, "ms");
    emit(
        a.json,
        "overlap",
        "both / longer alone",
        both_ms / compute_ms.max(copy_ms),
        "x",
    );
    Ok(())
}

/// Runs `berth bench sync`: blocking reads in a loop, and host time blocked by a
/// `non_blocking` 256 MiB upload from pageable and from pinned memory.
pub fn run_sync(a: SyncArgs) -> anyhow::Result<()> {
    check_reps(a.reps)?;
    require_gpu()?;
    let s = Stream::new(0, 0)?;
    let _g = s.scope();
    let d = cuda::transfer::transfer(&random_host(4096, 5)?, Device::Cuda(0), false)?;
    let iters = 1000;
    let t0 = Instant::now();
    for _ in 0..iters {
        drop(cuda::transfer::transfer(&d, Device::Cpu, false)?);
    }
    let each = t0.elapsed().as_secs_f64() * 1e3;
    let t0 = Instant::now();
    let mut last = None;
    for _ in 0..iters {
        last = Some(cuda::transfer::transfer(&d, Device::Cpu, true)?);
    }
    if let Some(l) = last {
        l.storage().wait_pending()?;
    }
    let once = t0.elapsed().as_secs_f64() * 1e3;
    emit(
        a.json,
        "sync",
        "1000 blocking reads of 4 KiB (ms)",
        each,
        "ms",
    );
    emit(
        a.json,
        "sync",
        "1000 non_blocking reads, one wait (ms)",
        once,
        "ms",
    );
    for (name, pin) in [("pageable", false), ("pinned", true)] {
        let mut src = random_host(256 * MIB, 6)?;
        if pin {
            src = src.pin_memory()?;
        }
        let mut v = Vec::new();
        for _ in 0..a.reps + 1 {
            s.synchronize()?;
            let t0 = Instant::now();
            let t = cuda::transfer::transfer(&src, Device::Cuda(0), true)?;
            v.push(t0.elapsed().as_secs_f64() * 1e3);
            s.synchronize()?;
            drop(t);
        }
        v.remove(0);
        emit(
            a.json,
            "sync",
            format!("host blocked by non_blocking 256 MiB upload, {name} (ms)"),
            median(v),
            "ms",
        );
    }
    Ok(())
}
