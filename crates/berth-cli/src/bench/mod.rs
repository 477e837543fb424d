//! `berth bench`: measurements comparable with PyTorch's (`BENCHMARKS.md` has both sides).
//!
//! One file per benchmark; each owns its arguments.

mod collective;
mod dataloader;
mod gpu;
mod p2p;

/// Arguments of `berth bench`.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    #[command(subcommand)]
    which: Which,
}

#[derive(clap::Subcommand, Debug)]
enum Which {
    /// DataLoader throughput (host memory always; the GPU when present).
    Dataloader(dataloader::Args),
    /// Host/device transfer bandwidth: pageable, pinned, device to device, `pin_memory()`.
    Transfers(gpu::TransfersArgs),
    /// Allocation latency through berth's caching allocator and the raw driver.
    Alloc(gpu::AllocArgs),
    /// Copy/compute overlap on two streams.
    Overlap(gpu::OverlapArgs),
    /// Cost of synchronising reads (`item()` in a loop) and blocked host time of copies.
    Sync(gpu::SyncArgs),
    /// NCCL all-reduce time, algbw and busbw over message sizes (nccl-tests' `all_reduce_perf`).
    AllReduce(collective::AllReduceArgs),
    /// Copy bandwidth on each GPU and between every ordered pair of GPUs, with peer access
    /// disabled and enabled.
    #[command(long_about = p2p::LONG_ABOUT)]
    P2p(p2p::P2pArgs),
}

/// Runs `berth bench`.
pub fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.which {
        Which::Dataloader(a) => dataloader::run(a),
        Which::Transfers(a) => gpu::run_transfers(a),
        Which::Alloc(a) => gpu::run_alloc(a),
        Which::Overlap(a) => gpu::run_overlap(a),
        Which::Sync(a) => gpu::run_sync(a),
        Which::AllReduce(a) => collective::run_all_reduce(a),
        Which::P2p(a) => p2p::run_p2p(a),
    }
}
