//! `berth bench dataloader`.

/// Arguments of `berth bench dataloader`.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print JSON lines.
    #[arg(long)]
    pub json: bool,
}

/// Runs the DataLoader benchmark.
pub fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!("berth bench dataloader: not built yet")
}
