//! `berth launch`: starts one process per GPU with torchrun's environment (`RANK`,
//! `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`), as
//! `torchrun --nproc-per-node N` does (<https://docs.pytorch.org/docs/stable/elastic/run.html>),
//! without its elastic restarts: when one process fails, the others on this node are stopped
//! and berth reports which rank failed.

use std::ffi::{OsStr, OsString};
use std::process::{Child, Command};
use std::time::Duration;

use crate::UsageError;

/// Arguments of `berth launch`.
#[derive(clap::Args, Debug)]
pub struct LaunchArgs {
    /// Processes to start on this node, one per GPU (torchrun's `--nproc-per-node`).
    #[arg(long, value_parser = crate::whole_usize("--nproc-per-node", "the number of processes", 1, 2))]
    pub nproc_per_node: usize,
    /// Number of nodes in the job (torchrun's `--nnodes`).
    #[arg(long, default_value_t = 1, value_parser = crate::whole_usize("--nnodes", "the number of nodes", 1, 2))]
    pub nnodes: usize,
    /// This node's index, from 0 to nnodes − 1 (torchrun's `--node-rank`).
    #[arg(long, default_value_t = 0)]
    pub node_rank: usize,
    /// Host name or address of node 0, where rank 0 hosts the store (`MASTER_ADDR`).
    #[arg(long, default_value = "127.0.0.1")]
    pub master_addr: String,
    /// TCP port of rank 0's store (`MASTER_PORT`; torchrun's default, 29500).
    #[arg(long, default_value_t = 29500)]
    pub master_port: u16,
    /// The program to start and its arguments, after `--`.
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<String>,
}

/// Runs `berth launch`.
pub fn run(a: LaunchArgs) -> anyhow::Result<()> {
    if a.node_rank >= a.nnodes {
        return Err(UsageError(format!(
            "--node-rank {}: node ranks of --nnodes {} are 0 to {}",
            a.node_rank,
            a.nnodes,
            a.nnodes - 1
        ))
        .into());
    }
    if a.master_port == 0 {
        return Err(UsageError(
            "--master-port 0: give the port rank 0's store listens on (e.g. --master-port 29500)"
                .into(),
        )
        .into());
    }
    let world = a
        .nnodes
        .checked_mul(a.nproc_per_node)
        .ok_or_else(|| UsageError("--nnodes × --nproc-per-node overflows".into()))?;
    let (program, args) = a
        .command
        .split_first()
        .ok_or_else(|| UsageError("give the program to start after `--`".into()))?;
    let args: Vec<OsString> = args.iter().map(OsString::from).collect();
    run_ranks(&RankSpawn {
        nproc_per_node: a.nproc_per_node,
        world_size: world,
        node_rank: a.node_rank,
        master_addr: &a.master_addr,
        master_port: a.master_port,
        program: program.as_ref(),
        args: &args,
    })
}

/// What [`run_ranks`] starts: `nproc_per_node` processes of `program args`, ranks
/// `node_rank × nproc_per_node ..` of `world_size`, meeting at `master_addr:master_port`.
/// `berth launch` and `berth train --devices` (which starts itself once per device) both
/// start their ranks through it.
#[derive(Debug)]
pub struct RankSpawn<'a> {
    /// Processes on this node.
    pub nproc_per_node: usize,
    /// Processes in the job (`WORLD_SIZE`).
    pub world_size: usize,
    /// This node's index.
    pub node_rank: usize,
    /// `MASTER_ADDR`.
    pub master_addr: &'a str,
    /// `MASTER_PORT`.
    pub master_port: u16,
    /// The program to start.
    pub program: &'a OsStr,
    /// Its arguments.
    pub args: &'a [OsString],
}

/// Starts the processes of `spec` with torchrun's environment and waits for all of them;
/// when one fails, stops the others and reports which rank failed.
///
/// # Errors
/// A process that cannot be started, or one that exits unsuccessfully (naming its rank and
/// status).
pub fn run_ranks(spec: &RankSpawn<'_>) -> anyhow::Result<()> {
    let program = spec.program;
    let mut children: Vec<(usize, Child)> = Vec::with_capacity(spec.nproc_per_node);
    for local in 0..spec.nproc_per_node {
        let rank = spec.node_rank * spec.nproc_per_node + local;
        let child = Command::new(program)
            .args(spec.args)
            .env("RANK", rank.to_string())
            .env("WORLD_SIZE", spec.world_size.to_string())
            .env("LOCAL_RANK", local.to_string())
            .env("LOCAL_WORLD_SIZE", spec.nproc_per_node.to_string())
            .env("MASTER_ADDR", spec.master_addr)
            .env("MASTER_PORT", spec.master_port.to_string())
            .spawn();
        match child {
            Ok(c) => children.push((rank, c)),
            Err(e) => {
                stop(&mut children);
                anyhow::bail!(
                    "cannot start rank {rank} ({}): {e}",
                    program.to_string_lossy()
                );
            }
        }
    }
    // Wait for all; the first failure stops the rest.
    while !children.is_empty() {
        let mut i = 0;
        while i < children.len() {
            match children[i].1.try_wait()? {
                None => i += 1,
                Some(status) if status.success() => {
                    children.remove(i);
                }
                Some(status) => {
                    let rank = children.remove(i).0;
                    let left = children.len();
                    stop(&mut children);
                    anyhow::bail!(
                        "rank {rank} exited with {status}; stopped the {left} other rank(s) still running on this node"
                    );
                }
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Kills and reaps the processes this launch started (the processes themselves: a shell's own
/// children are not followed; start programs directly, or with `exec` in a shell).
fn stop(children: &mut Vec<(usize, Child)>) {
    for (rank, mut c) in children.drain(..) {
        // A child that already exited cannot be killed; waiting reaps it either way.
        if let Err(e) = c.kill() {
            if c.try_wait().ok().flatten().is_none() {
                eprintln!("berth: warning: cannot stop rank {rank}: {e}");
            }
        }
        drop(c.wait());
    }
}
