//! `berth train` and `berth eval`: the Fashion-MNIST main job.

/// Arguments of `berth train`.
#[derive(clap::Args, Debug)]
pub struct TrainArgs {
    /// Print one final JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `berth eval`.
#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    /// Safetensors file written by `berth train --save`.
    #[arg(long)]
    pub load: std::path::PathBuf,
}

/// Runs `berth train`.
pub fn run_train(_args: TrainArgs) -> anyhow::Result<()> {
    anyhow::bail!("berth train: not built yet")
}

/// Runs `berth eval`.
pub fn run_eval(_args: EvalArgs) -> anyhow::Result<()> {
    anyhow::bail!("berth eval: not built yet")
}
