//! `berth bench transfers | alloc | overlap | sync`: GPU measurements.

macro_rules! bench_args {
    ($name:ident, $doc:literal) => {
        #[doc = $doc]
        #[derive(clap::Args, Debug)]
        pub struct $name {
            /// Print JSON lines.
            #[arg(long)]
            pub json: bool,
        }
    };
}
bench_args!(TransfersArgs, "Arguments of `berth bench transfers`.");
bench_args!(AllocArgs, "Arguments of `berth bench alloc`.");
bench_args!(OverlapArgs, "Arguments of `berth bench overlap`.");
bench_args!(SyncArgs, "Arguments of `berth bench sync`.");

/// Runs `berth bench transfers`.
pub fn run_transfers(_a: TransfersArgs) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}
/// Runs `berth bench alloc`.
pub fn run_alloc(_a: AllocArgs) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}
/// Runs `berth bench overlap`.
pub fn run_overlap(_a: OverlapArgs) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}
/// Runs `berth bench sync`.
pub fn run_sync(_a: SyncArgs) -> anyhow::Result<()> {
    anyhow::bail!("not built yet")
}
