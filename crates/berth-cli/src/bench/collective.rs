//! `berth bench all-reduce`: NCCL all-reduce bandwidth over message sizes, as nccl-tests'
//! `all_reduce_perf` reports it (copy bandwidth between GPUs is `berth bench p2p`, in
//! `p2p.rs`).
//!
//! Bandwidths follow nccl-tests' `doc/PERFORMANCE.md`
//! (<https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md>): `algbw = bytes /
//! time` in GB/s (10⁹ bytes per second) and, for all-reduce, `busbw = algbw × 2(n − 1)/n` for
//! `n` ranks, the figure comparable with the hardware's link bandwidth. With one rank
//! `busbw` is 0 by that formula (nothing crosses a link); the one-rank row still runs NCCL's
//! code paths and gives the time and `algbw`.

use berth::cuda;
use berth::{DType, Device, Tensor};

use super::gpu::{check_reps, emit, gbps, require_gpu, time_events};

/// Arguments of `berth bench all-reduce`.
#[derive(clap::Args, Debug)]
pub struct AllReduceArgs {
    /// Print JSON lines.
    #[arg(long)]
    pub json: bool,
    /// Repetitions per size (the median is reported); at least 1.
    #[arg(long, default_value_t = 20, allow_negative_numbers = true,
          value_parser = crate::whole_usize("--reps", "the number of repetitions", 1, 20))]
    pub reps: usize,
    /// Smallest message in bytes (nccl-tests' `-b`); a multiple of 4 (f32 elements).
    #[arg(long, default_value_t = 8, value_parser = crate::whole_usize("--min-bytes", "a message size in bytes", 4, 8))]
    pub min_bytes: usize,
    /// Largest message in bytes (nccl-tests' `-e`), 1 GiB by default.
    #[arg(long, default_value_t = 1 << 30, value_parser = crate::whole_usize("--max-bytes", "a message size in bytes", 4, 1 << 30))]
    pub max_bytes: usize,
    /// Factor between sizes (nccl-tests' `-f`), at least 2.
    #[arg(long, default_value_t = 2, value_parser = crate::whole_usize("--factor", "the factor between sizes", 2, 2))]
    pub factor: usize,
}

/// torchrun's environment when this process was started under it, else a job of one rank
/// on GPU 0 with its store on a free local port.
#[cfg(feature = "cuda")]
fn job_env() -> anyhow::Result<berth_distributed::RendezvousEnv> {
    use anyhow::Context;
    use berth_distributed::RendezvousEnv;
    if std::env::var_os("WORLD_SIZE").is_some() {
        return Ok(RendezvousEnv::from_env()?);
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .context("finding a free local port for the one-rank store")?
        .port();
    Ok(RendezvousEnv {
        rank: 0,
        world_size: 1,
        local_rank: 0,
        master_addr: "127.0.0.1".into(),
        master_port: port,
    })
}

/// Runs `berth bench all-reduce`. Built without the `cuda` feature it answers that CUDA is
/// not available, as every GPU benchmark.
#[cfg(not(feature = "cuda"))]
pub fn run_all_reduce(a: AllReduceArgs) -> anyhow::Result<()> {
    check_reps(a.reps)?;
    require_gpu()
}

/// Runs `berth bench all-reduce`: one rank on GPU 0, or, started by torchrun, every rank of
/// the job (rank 0 prints).
#[cfg(feature = "cuda")]
pub fn run_all_reduce(a: AllReduceArgs) -> anyhow::Result<()> {
    use berth_distributed::{ProcessGroup, ReduceOp, DEFAULT_TIMEOUT};
    check_reps(a.reps)?;
    if a.min_bytes > a.max_bytes {
        return Err(crate::UsageError(format!(
            "--min-bytes {} is larger than --max-bytes {}; give a range such as --min-bytes 8 --max-bytes 1073741824",
            a.min_bytes, a.max_bytes
        ))
        .into());
    }
    require_gpu()?;
    if let Some(reason) = berth_distributed::nccl_unavailable_reason() {
        return Err(crate::UsageError(reason).into());
    }
    let pg = ProcessGroup::init(job_env()?, DEFAULT_TIMEOUT)?;
    let n = pg.world_size();
    let lead = pg.rank() == 0;
    if lead && n == 1 {
        let visible = cuda::device_count();
        println!(
            "# one rank on cuda:0 ({visible} GPU(s) visible): busbw is 0 by nccl-tests' formula; \
             for n GPUs start one process per GPU: torchrun --nproc-per-node n --no-python berth bench all-reduce"
        );
    }
    let device = Device::Cuda(pg.device() as u16);
    let stream = cuda::current_stream(pg.device())?;
    let mut bytes = a.min_bytes / 4 * 4;
    while bytes <= a.max_bytes {
        let t = Tensor::zeros(&[bytes / 4], DType::F32, device)?;
        let ms = time_events(&stream, a.reps, || {
            pg.all_reduce(&t, ReduceOp::Sum)?.wait()?;
            Ok(())
        })?;
        let algbw = gbps(bytes, ms);
        let busbw = algbw * 2.0 * (n as f64 - 1.0) / n as f64;
        if lead {
            let what = format!("all_reduce f32 sum {bytes} B, {n} rank(s)");
            emit(
                a.json,
                "all-reduce",
                format!("{what}: time"),
                ms * 1e3,
                "us",
            );
            emit(
                a.json,
                "all-reduce",
                format!("{what}: algbw"),
                algbw,
                "GB/s",
            );
            emit(
                a.json,
                "all-reduce",
                format!("{what}: busbw"),
                busbw,
                "GB/s",
            );
        }
        bytes = match bytes.checked_mul(a.factor) {
            Some(b) if b > bytes => b,
            _ => break,
        };
    }
    pg.finish()?;
    Ok(())
}
