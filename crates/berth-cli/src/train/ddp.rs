//! `berth train --devices cuda:0,cuda:1`: data-parallel training, PyTorch's
//! `DistributedDataParallel` model (<https://pytorch.org/docs/stable/notes/ddp.html>), one
//! process per device.
//!
//! Without torchrun's `RANK` in the environment, `berth train --devices D0,D1,…` starts itself
//! once per device through [`crate::launch::run_ranks`] (the code of `berth launch`) on a free
//! port of 127.0.0.1, and waits for them; with `RANK` set (under `berth launch` or torchrun)
//! it is one rank, on device `LOCAL_RANK` of the list. Each rank:
//!
//! 1. joins the rendezvous and builds its communicator: the NCCL process group on CUDA, the
//!    store communicator on the CPU (`--devices cpu,cpu`; gloo's role);
//! 2. builds the model from `--seed`, then takes rank 0's parameters (a broadcast), as DDP's
//!    constructor does;
//! 3. reads its shard of the training set through a `DistributedSampler` (seeded with
//!    `--seed`, `set_epoch` every epoch) in local batches of `--batch-size / world size`, so
//!    the global batch is `--batch-size` and global batch *i* is the *i*-th `--batch-size`
//!    slice of the epoch's permutation;
//! 4. runs forward, then backward handing each gradient to DDP's reducer as it is produced
//!    (last layer first); each bucket's all-reduce starts as soon as it is full, on the
//!    communication stream, and the optimizer step waits for all of them (Notes [Gradient
//!    averaging], [Bucket launch order] and [Bucket buffer lifetime] in
//!    `berth_distributed::reducer`);
//! 5. sums the epoch's loss over the ranks, evaluates (every rank holds the same parameters);
//! 6. reports its memory (peaks and the driver's used bytes) to rank 0 through the store and
//!    prints it on standard error labelled with its rank; rank 0 alone writes `--save` and the
//!    final report, which lists every rank's memory.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use berth::nn::{save_state_dict, Module};
use berth::{DType, Device, Generator, Tensor};
use berth_data::DistributedSampler;
use berth_distributed::bucket::BucketOptions;
use berth_distributed::{
    broadcast_parameters, Communicator, PendingWork, Reducer, Rendezvous, RendezvousEnv,
    StoreCommunicator, DEFAULT_TIMEOUT,
};

use super::devices::resolve_devices;
use super::report::{self, EpochReport, MemoryReport, RankMemory, TrainReport};
use super::{data, evaluate, Mlp, Sgd, TrainArgs};
use crate::UsageError;

/// Runs `berth train --devices spec`: starts one process per device, or, inside a launched
/// job (`RANK` set), trains as one rank.
///
/// # Errors
/// A [`super::devices::DevicesError`] for a bad list; [`UsageError`]s for options a
/// data-parallel run cannot take; a rank's failure.
pub fn run(args: &TrainArgs, spec: &str) -> anyhow::Result<()> {
    let devices = resolve_devices(spec)?;
    check_ddp_args(args, devices.len())?;
    for d in &devices {
        super::fit::check_fits(args.hidden, args.batch_size / devices.len(), *d)?;
    }
    if let Some(path) = &args.save {
        super::check_output_path("--save", path, "mlp.safetensors")?;
    }
    let dir = data::resolve_dir(
        args.data_dir.as_deref(),
        &[data::Split::Train, data::Split::Test],
    )?;
    if std::env::var_os("RANK").is_none() {
        return spawn(&devices);
    }
    let env = RendezvousEnv::from_env()?;
    let device = device_of_rank(&devices, env.local_rank, local_world_size())?;
    let train = data::load(&dir, data::Split::Train)?;
    let test = data::load(&dir, data::Split::Test)?;
    let rdzv = Rendezvous::join(env, DEFAULT_TIMEOUT)?;
    if device.is_cuda() {
        return run_nccl(args, rdzv, device, &train, &test);
    }
    let comm = StoreCommunicator::new(rdzv);
    finish_rank(args, &comm, device, &train, &test)?;
    comm.finish()?;
    Ok(())
}

#[cfg(feature = "cuda")]
fn run_nccl(
    args: &TrainArgs,
    rdzv: Rendezvous,
    device: Device,
    train: &data::FashionSplit,
    test: &data::FashionSplit,
) -> anyhow::Result<()> {
    let index = report::cuda_index(device).context("a CUDA device with an index")?;
    let pg = berth_distributed::ProcessGroup::from_rendezvous(rdzv, index)?;
    finish_rank(args, &pg, device, train, test)?;
    pg.finish()?;
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn run_nccl(
    _args: &TrainArgs,
    _rdzv: Rendezvous,
    device: Device,
    _train: &data::FashionSplit,
    _test: &data::FashionSplit,
) -> anyhow::Result<()> {
    Err(UsageError(format!(
        "--devices {device}: this berth was built without the `cuda` feature; use --devices cpu,cpu"
    ))
    .into())
}

/// Options a data-parallel run cannot take, and a global batch the ranks cannot share.
fn check_ddp_args(args: &TrainArgs, world: usize) -> Result<(), UsageError> {
    if !args.batch_size.is_multiple_of(world) {
        let lower = (args.batch_size / world).max(1) * world;
        return Err(UsageError(format!(
            "--batch-size {} with {world} devices: the global batch is split evenly over the ranks, \
             so it must be a multiple of {world} (e.g. --batch-size {lower})",
            args.batch_size
        )));
    }
    for (given, flag) in [
        (args.resident, "--resident"),
        (args.profile.is_some(), "--profile"),
        (args.memory_snapshot.is_some(), "--memory-snapshot"),
    ] {
        if given {
            return Err(UsageError(format!(
                "{flag} with --devices: not supported for data-parallel runs yet; drop {flag}, or train on one device with --device"
            )));
        }
    }
    if let Some(mb) = args.bucket_cap_mb {
        BucketOptions {
            bucket_cap_mb: Some(mb),
            first_bucket_bytes: None,
        }
        .limits_bytes()
        .map_err(|e| UsageError(format!("--bucket-cap-mb {mb}: {e}")))?;
    }
    Ok(())
}

/// `LOCAL_WORLD_SIZE` (set by `berth launch` and torchrun), when present and a number.
fn local_world_size() -> Option<usize> {
    std::env::var("LOCAL_WORLD_SIZE").ok()?.trim().parse().ok()
}

/// The device of the rank with `local_rank` on this node: entry `local_rank` of the list,
/// which must hold one device per process of the node.
fn device_of_rank(
    devices: &[Device],
    local_rank: usize,
    local_world: Option<usize>,
) -> Result<Device, UsageError> {
    let list = || {
        devices
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    if let Some(n) = local_world.filter(|&n| n != devices.len()) {
        return Err(UsageError(format!(
            "--devices {}: {} device(s) for {n} processes on this node (LOCAL_WORLD_SIZE={n}); list one device per process, or start {} processes per node",
            list(),
            devices.len(),
            devices.len()
        )));
    }
    devices.get(local_rank).copied().ok_or_else(|| {
        UsageError(format!(
            "--devices {}: no device for LOCAL_RANK={local_rank}; list one device per process on this node",
            list()
        ))
    })
}

/// Starts this program once per device with torchrun's environment, on a free local port.
fn spawn(devices: &[Device]) -> anyhow::Result<()> {
    let port = berth_distributed::store::free_port()?;
    let program =
        std::env::current_exe().context("finding the berth executable to start the ranks")?;
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    let names: Vec<String> = devices.iter().map(ToString::to_string).collect();
    eprintln!(
        "berth: starting {} rank(s) on {} (MASTER_ADDR=127.0.0.1 MASTER_PORT={port})",
        devices.len(),
        names.join(", ")
    );
    crate::launch::run_ranks(&crate::launch::RankSpawn {
        nproc_per_node: devices.len(),
        world_size: devices.len(),
        node_rank: 0,
        master_addr: "127.0.0.1",
        master_port: port,
        program: program.as_os_str(),
        args: &args,
    })
}

/// Trains this rank, gathers the ranks' memory on rank 0, and lets rank 0 alone save and
/// print the final report; other ranks print their memory line on standard error.
fn finish_rank<C: Communicator>(
    args: &TrainArgs,
    comm: &C,
    device: Device,
    train: &data::FashionSplit,
    test: &data::FashionSplit,
) -> anyhow::Result<()> {
    let mut report = train_rank(args, comm, device, train, test)?;
    let rank = comm.rank();
    let mine = RankMemory::new(rank, device, &report.memory);
    let store = comm.rendezvous().store();
    store.set(&format!("ddp/memory/{rank}"), &serde_json::to_vec(&mine)?)?;
    if rank != 0 {
        eprintln!("{}", mine.line());
        return Ok(());
    }
    for r in 0..comm.world_size() {
        let bytes = store.get(&format!("ddp/memory/{r}"), comm.rendezvous().timeout())?;
        report.ranks.push(serde_json::from_slice(&bytes)?);
    }
    let saved = write_checkpoint(rank, args.save.as_deref(), &report)?;
    report.print(args.json, saved.as_deref())
}

/// Writes the state dict to `path` on rank 0 (DDP's rule: one copy of the parameters, written
/// once) and returns where; other ranks write nothing.
///
/// # Errors
/// Writing the file fails.
pub fn write_checkpoint(
    rank: usize,
    path: Option<&std::path::Path>,
    report: &TrainReport,
) -> anyhow::Result<Option<PathBuf>> {
    match path {
        Some(p) if rank == 0 => {
            save_state_dict(&report.state_dict, p)
                .with_context(|| format!("saving the state dict to {}", p.display()))?;
            Ok(Some(p.to_path_buf()))
        }
        _ => Ok(None),
    }
}

/// One data-parallel step on this rank's local batch (`x [b, 784]` f32, `y [b]` i64): forward,
/// backward with each gradient handed to `reducer` as it is produced, the optimizer step on the
/// averaged gradients; adds the local batch's summed loss to `loss_sum`.
///
/// # Errors
/// Tensor and communication errors.
pub fn ddp_step<C: Communicator>(
    model: &Mlp,
    opt: &mut Sgd,
    reducer: &mut Reducer<'_, C>,
    x: &Tensor,
    y: &Tensor,
    loss_sum: &Tensor,
) -> anyhow::Result<()> {
    let acts = model.forward_train(x)?;
    model.backward_with(x, &acts, y, |i, g| reducer.mark_ready(i, g))?;
    let grads = reducer.finish()?;
    opt.step(&model.params(), &grads)?;
    let loss = acts.logits.cross_entropy(y)?;
    loss_sum.add_scaled_(&loss, y.numel() as f64)?;
    Ok(())
}

/// The model of a data-parallel run, rank 0's parameters on every rank, and its reducer.
///
/// # Errors
/// Tensor and communication errors; a bad `bucket_cap_mb`.
pub fn ddp_model<'c, C: Communicator>(
    comm: &'c C,
    hidden: usize,
    seed: u64,
    bucket_cap_mb: Option<f64>,
    device: Device,
) -> anyhow::Result<(Mlp, Reducer<'c, C>)> {
    let mut g = Generator::new(seed);
    let model = Mlp::new(hidden, device, &mut g)?;
    broadcast_parameters(comm, &model.params())?;
    let options = BucketOptions {
        bucket_cap_mb,
        first_bucket_bytes: None,
    };
    let reducer = Reducer::new(comm, &model.params(), options)?;
    Ok((model, reducer))
}

/// Trains this rank of a data-parallel run and returns its report (the epochs' figures are
/// global: loss and samples summed over the ranks).
///
/// # Errors
/// Data, tensor and communication errors; a diverging run.
pub fn train_rank<C: Communicator>(
    args: &TrainArgs,
    comm: &C,
    device: Device,
    train: &data::FashionSplit,
    test: &data::FashionSplit,
) -> anyhow::Result<TrainReport> {
    let (rank, world) = (comm.rank(), comm.world_size());
    let (model, mut reducer) = ddp_model(comm, args.hidden, args.seed, args.bucket_cap_mb, device)?;
    let mut opt = Sgd::new(args.lr, args.momentum);
    let sampler =
        DistributedSampler::new(berth_data::Dataset::len(&**train), world, rank)?.seed(args.seed);
    let loader = data::sharded_loader(
        train,
        args.batch_size / world,
        args.workers,
        sampler.clone(),
        device,
    )?;
    let test_loader = data::eval_loader(test, data::EVAL_BATCH, device)?;
    let timer = report::EpochTimer::new(device)?;
    let mem = MemoryReport::start(device)?;
    let waits_before = report::host_waits();
    let quiet = args.json || rank != 0;
    let mut epochs = Vec::new();
    let mut steps = 0u64;
    for epoch in 1..=args.epochs {
        sampler.set_epoch(epoch as u64 - 1);
        let bar = report::progress_bar(loader.len() as u64, epoch, args.epochs, quiet);
        let started = Instant::now();
        timer.start()?;
        let loss_sum = Tensor::zeros(&[], DType::F32, device)?;
        let mut seen = 0usize;
        for (i, batch) in data::device_batches(&loader, device)?.enumerate() {
            let (x, y) = data::to_device(
                batch.with_context(|| format!("epoch {epoch}, batch {i}"))?,
                device,
            )?;
            ddp_step(&model, &mut opt, &mut reducer, &x, &y, &loss_sum)?;
            seen += y.numel();
            steps += 1;
            bar.set_message(format!(
                "{:.0} samples/s on this rank",
                seen as f64 / started.elapsed().as_secs_f64()
            ));
            bar.inc(1);
        }
        let seconds = timer.stop()?;
        bar.finish_and_clear();
        // [loss sum, samples] summed over the ranks.
        let totals = Tensor::zeros(&[2], DType::F32, device)?;
        totals.narrow(0, 0, 1)?.copy_(&loss_sum.reshape(&[1])?)?;
        totals.narrow(0, 1, 1)?.fill_(seen as f64)?;
        comm.all_reduce_sum(&totals)?.wait()?;
        let totals = totals.to_vec::<f32>()?;
        let (loss_total, samples) = (f64::from(totals[0]), f64::from(totals[1]));
        let train_loss = loss_total / samples.max(1.0);
        if !train_loss.is_finite() {
            anyhow::bail!(
                "training diverged: the mean train loss of epoch {epoch} is {train_loss}; lower --lr \
                 (now {}) or --momentum (now {})",
                super::short_float(args.lr),
                super::short_float(args.momentum)
            );
        }
        let e = EpochReport {
            epoch,
            train_loss,
            test_accuracy: evaluate(&model, &test_loader, device)?,
            seconds,
            samples_per_second: samples / seconds,
        };
        if !quiet {
            e.print();
        }
        epochs.push(e);
    }
    let memory = mem.finish(device)?;
    let waits = report::host_waits() - waits_before;
    Ok(TrainReport {
        device,
        epochs,
        memory,
        implicit_syncs_per_step: report::syncs_per_step(waits, steps),
        state_dict: model.state_dict()?,
        ranks: Vec::new(),
    })
}
