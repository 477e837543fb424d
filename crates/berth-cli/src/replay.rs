//! `berth replay`: PyTorch allocator traces through berth's allocators.

/// Arguments of `berth replay`.
#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// Trace files (`*.trace.json.gz`, JSON, or PyTorch snapshot pickles).
    pub traces: Vec<std::path::PathBuf>,
}

/// Runs `berth replay`.
pub fn run(_args: ReplayArgs) -> anyhow::Result<()> {
    anyhow::bail!("berth replay: not built yet")
}
