//! `berth info`: version, CPU cores, CUDA devices.

/// Arguments of `berth info`.
#[derive(clap::Args, Debug)]
pub struct InfoArgs {
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Runs `berth info`.
pub fn run(_args: InfoArgs) -> anyhow::Result<()> {
    anyhow::bail!("berth info: not built yet")
}
