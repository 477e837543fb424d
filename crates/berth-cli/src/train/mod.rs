//! `berth train` and `berth eval`: the main job. An MLP (784 → hidden → 10, `ReLU`) trained on
//! Fashion-MNIST with SGD + momentum on the best device present, data through berth's
//! DataLoader (worker threads; pinned memory and `non_blocking` copies on CUDA), with a
//! progress bar, per-epoch timings (CUDA events on the GPU) and a memory report.
//!
//! `--device meta` runs one step on meta tensors and predicts the GPU's peak allocated and
//! reserved bytes without allocating anything (see [`meta`]).

mod data;
mod ddp;
#[cfg(test)]
mod ddp_tests;
pub mod devices;
mod fit;
mod meta;
mod mlp;
mod profile;
mod report;
mod resident;

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use berth::nn::{load_state_dict_file, save_state_dict, Module};
use berth::{DType, Device, Generator, Tensor};

use crate::UsageError;
pub use berth::optim::Sgd;
pub use mlp::Mlp;
use report::{EpochReport, MemoryReport, TrainReport};

/// The most epochs `berth train` accepts: a bound that keeps the step count and the per-epoch
/// report far from overflow (a million epochs at batch 1 is 6·10¹⁰ steps).
pub const MAX_EPOCHS: usize = 1_000_000;

/// Arguments of `berth train`.
#[derive(clap::Args, Debug, Clone)]
pub struct TrainArgs {
    /// Device: `auto` (cuda:0 when present, else cpu), `cpu`, `cuda`, `cuda:i` or `meta`.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Data-parallel training (PyTorch's DDP), one process per listed device: `cuda:0,cuda:1`
    /// (NCCL), or `cpu,cpu` (the same path over a TCP store, slow). `--batch-size` is the
    /// global batch, split evenly over the devices. Starts the processes itself, or, under
    /// `berth launch`/torchrun (`RANK` set), runs as the rank on device `LOCAL_RANK` of the list.
    #[arg(long, value_name = "DEVICE,...", conflicts_with = "device")]
    pub devices: Option<String>,
    /// With `--devices`: DDP's gradient bucket size in MiB (`bucket_cap_mb`; default 25, after
    /// a 1 MiB first bucket).
    #[arg(
        long,
        value_name = "MIB",
        requires = "devices",
        allow_negative_numbers = true
    )]
    pub bucket_cap_mb: Option<f64>,
    /// Passes over the 60,000 training images (1 to 1,000,000).
    #[arg(long, default_value_t = 5, allow_negative_numbers = true,
          value_parser = crate::whole_usize("--epochs", "the number of epochs", 1, 5))]
    pub epochs: usize,
    /// Images per step.
    #[arg(long, default_value_t = 64, allow_negative_numbers = true,
          value_parser = crate::whole_usize("--batch-size", "the batch size", 1, 64))]
    pub batch_size: usize,
    /// Width of the hidden layer.
    #[arg(long, default_value_t = 256, allow_negative_numbers = true,
          value_parser = crate::whole_usize("--hidden", "the hidden layer's width", 1, 256))]
    pub hidden: usize,
    /// SGD learning rate.
    #[arg(long, default_value_t = 0.05, allow_negative_numbers = true)]
    pub lr: f64,
    /// SGD momentum (PyTorch's rule, dampening 0).
    #[arg(long, default_value_t = 0.9, allow_negative_numbers = true)]
    pub momentum: f64,
    /// DataLoader worker threads (at most 1024).
    #[arg(long, default_value_t = 2, allow_negative_numbers = true,
          value_parser = crate::whole_usize("--workers", "the number of worker threads", 0, 2))]
    pub workers: usize,
    /// Keep the whole training split in memory, normalised once, and gather each batch by
    /// shuffled index instead of using the DataLoader (an expert's loop; `torch_train.py
    /// --modes resident`). Same batches in the same order as with workers. On CUDA the split
    /// is kept on the device and each batch gathered there. Uses no workers, so it cannot be
    /// given with `--workers`.
    #[arg(long, conflicts_with = "workers")]
    pub resident: bool,
    /// Seed of the model's initialisation and of the shuffle.
    #[arg(long, default_value_t = 0, allow_negative_numbers = true,
          value_parser = crate::whole_number("--seed", "the seed", 0, 0))]
    pub seed: u64,
    /// Write the trained state dict (CPU copies) to this safetensors file.
    #[arg(long)]
    pub save: Option<PathBuf>,
    /// Folder with the four Fashion-MNIST IDX files (default: `$BERTH_DATA_DIR`, else the
    /// repository's `data/fashion-mnist`).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Print one final JSON object instead of text (no progress bar).
    #[arg(long)]
    pub json: bool,
    /// Record the CUDA allocator's history during the run and write its snapshot to this file
    /// at the end, as `torch.cuda.memory._dump_snapshot` does (open it with `berth memviz` or
    /// PyTorch's `memory_viz`). CUDA only.
    #[arg(long, value_name = "PATH")]
    pub memory_snapshot: Option<PathBuf>,
    /// Profile `--profile-steps` steps after `--profile-warmup` steps with `berth::profiler`,
    /// write the Chrome trace (Perfetto, `chrome://tracing`) to this file and print the
    /// `key_averages()` table.
    #[arg(long, value_name = "PATH")]
    pub profile: Option<PathBuf>,
    /// Steps run before `--profile` starts recording.
    #[arg(long, default_value_t = 20, allow_negative_numbers = true, requires = "profile",
          value_parser = crate::whole_number("--profile-warmup", "the number of warm-up steps", 0, 20))]
    pub profile_warmup: u64,
    /// Steps `--profile` records (0: every step after the warm-up, to the end of training).
    #[arg(long, default_value_t = 5, allow_negative_numbers = true, requires = "profile",
          value_parser = crate::whole_number("--profile-steps", "the number of profiled steps", 0, 5))]
    pub profile_steps: u64,
    /// What `--profile` records, as `torch.profiler`'s `activities`: `cpu` (ops, copies and
    /// ranges on the host), `cuda` (their device time, as `--profile-device-timer` says; CUDA
    /// devices only). Default: both on a CUDA device, `cpu` otherwise.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        value_name = "cpu,cuda",
        requires = "profile"
    )]
    pub profile_activities: Vec<profile::Activity>,
    /// How `--profile` times CUDA work: `cupti` (CUPTI's activity records, as `torch.profiler`;
    /// fails without CUPTI), `events` (CUDA events around each op, about one launch of host
    /// time per op), or `auto` (CUPTI where it loads, else events).
    #[arg(long, value_enum, default_value_t = profile::Timer::Auto, requires = "profile")]
    pub profile_device_timer: profile::Timer,
}

/// Entries of allocator history kept for `--memory-snapshot` (PyTorch's default `max_entries`).
const SNAPSHOT_HISTORY: usize = 100_000;

/// Arguments of `berth eval`.
#[derive(clap::Args, Debug, Clone)]
pub struct EvalArgs {
    /// Safetensors file written by `berth train --save`.
    #[arg(long)]
    pub load: PathBuf,
    /// Device: `auto`, `cpu`, `cuda`, `cuda:i`.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Images per evaluation step.
    #[arg(long, default_value_t = 1000, allow_negative_numbers = true,
          value_parser = crate::whole_usize("--batch-size", "the batch size", 1, 1000))]
    pub batch_size: usize,
    /// Folder with the Fashion-MNIST IDX files (as for `train`).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Says on standard error which device `--device auto` chose and, for the CPU, why CUDA was
/// not used (called once the arguments are checked, before the run starts).
pub fn announce_device(spec: &str, device: Device) {
    if spec != "auto" {
        return;
    }
    match berth::cuda::unavailable_reason() {
        Some(why) if !device.is_cuda() => {
            eprintln!("device: {device} (--device auto; CUDA is not used: {why})")
        }
        _ => eprintln!("device: {device} (--device auto)"),
    }
}

/// Resolves `--device`: `auto` → [`Device::best`]; anything else parsed with PyTorch's grammar
/// and checked against the devices present. Errors are [`UsageError`]s naming the fix.
pub fn resolve_device(spec: &str) -> anyhow::Result<Device> {
    let device = if spec == "auto" {
        Device::best()
    } else {
        let d: Device = spec
            .parse()
            .map_err(|e| UsageError(format!("--device {spec}: {e} (or `auto`)")))?;
        d.canonical()
            .map_err(|e| UsageError(format!("--device {spec}: {e}; use --device cpu or auto")))?
    };
    Ok(device)
}

/// `x` as a user typed it: plain decimals for ordinary magnitudes (`0.05`), scientific notation
/// for very large or small ones (`1e300`, not 301 digits).
fn short_float(x: f64) -> String {
    if x == 0.0 || !x.is_finite() || (1e-4..1e6).contains(&x.abs()) {
        format!("{x}")
    } else {
        format!("{x:e}")
    }
}

fn check_train_args(a: &TrainArgs) -> anyhow::Result<()> {
    crate::check_at_least_one("--epochs", a.epochs, "epochs", 5)?;
    if a.epochs > MAX_EPOCHS {
        return Err(UsageError(format!(
            "--epochs {}: at most {MAX_EPOCHS} epochs (each is a pass over the 60,000 training images; e.g. --epochs 5)",
            a.epochs
        ))
        .into());
    }
    crate::check_workers(a.workers)?;
    if a.batch_size == 0 {
        return Err(UsageError(
            "--batch-size 0: the batch size must be at least 1 (e.g. --batch-size 64)".into(),
        )
        .into());
    }
    if a.hidden == 0 {
        return Err(UsageError(
            "--hidden 0: the hidden layer needs at least 1 unit (e.g. --hidden 256)".into(),
        )
        .into());
    }
    // The largest tensors of a step, as f32: fc1.weight [hidden, 784] and the activations
    // [batch, max(784, hidden)]. A size whose byte count overflows is a usage error naming the
    // flag here, not an overflow error from deep inside the model.
    let f32_bytes = |rows: usize, cols: usize| {
        rows.checked_mul(cols)
            .and_then(|n| n.checked_mul(4))
            .filter(|&b| b <= isize::MAX as usize)
    };
    if f32_bytes(a.hidden, mlp::INPUTS).is_none() {
        return Err(UsageError(format!(
            "--hidden {}: fc1.weight would be [{}, {}] f32, more than {} bytes; use a smaller --hidden (e.g. --hidden 256)",
            a.hidden,
            a.hidden,
            mlp::INPUTS,
            isize::MAX
        ))
        .into());
    }
    if f32_bytes(a.batch_size, a.hidden.max(mlp::INPUTS)).is_none() {
        return Err(UsageError(format!(
            "--batch-size {}: one batch's activations would be [{}, {}] f32, more than {} bytes; use a smaller --batch-size (e.g. --batch-size 64)",
            a.batch_size,
            a.batch_size,
            a.hidden.max(mlp::INPUTS),
            isize::MAX
        ))
        .into());
    }
    if !(a.lr.is_finite() && a.lr > 0.0) {
        return Err(UsageError(format!(
            "--lr {}: the learning rate must be a positive number (e.g. --lr 0.05)",
            short_float(a.lr)
        ))
        .into());
    }
    if !(0.0..1.0).contains(&a.momentum) {
        return Err(UsageError(format!(
            "--momentum {}: momentum must be in [0, 1) (e.g. --momentum 0.9)",
            short_float(a.momentum)
        ))
        .into());
    }
    Ok(())
}

/// Runs `berth train`.
pub fn run_train(args: TrainArgs) -> anyhow::Result<()> {
    check_train_args(&args)?;
    if let Some(spec) = &args.devices {
        return ddp::run(&args, spec);
    }
    let device = resolve_device(&args.device)?;
    if args.memory_snapshot.is_some() && !device.is_cuda() {
        return Err(UsageError(format!(
            "--memory-snapshot with --device {device}: snapshots are of the CUDA allocator; \
             train on cuda (or use --device meta without it for a prediction)"
        ))
        .into());
    }
    if device == Device::Meta {
        if args.profile.is_some() {
            return Err(UsageError("--profile with --device meta: meta tensors run no kernels to profile; train on cpu or cuda".into()).into());
        }
        if args.save.is_some() {
            return Err(UsageError("--save with --device meta: meta tensors have no values to save; train on cpu or cuda".into()).into());
        }
        return meta::run(&args);
    }
    // Newcomer defect 7: what training needs, against what the device has, before anything
    // is allocated.
    fit::check_fits(args.hidden, args.batch_size, device)?;
    check_distinct_outputs(&[
        ("--save", args.save.as_deref()),
        ("--profile", args.profile.as_deref()),
        ("--memory-snapshot", args.memory_snapshot.as_deref()),
    ])?;
    if let Some(path) = &args.save {
        check_output_path("--save", path, "mlp.safetensors")?;
    }
    // Checked before training, not when the file is written at the end.
    if let Some(path) = &args.profile {
        check_output_path("--profile", path, "trace.json")?;
        if !device.is_cuda() && args.profile_device_timer != profile::Timer::Auto {
            return Err(UsageError(format!(
                "--profile-device-timer {} with --device {device}: it times CUDA work, and a run \
                 on {device} has none; drop it, or train on cuda",
                args.profile_device_timer.name()
            ))
            .into());
        }
        if !device.is_cuda() && args.profile_activities.contains(&profile::Activity::Cuda) {
            return Err(UsageError(format!(
                "--profile-activities cuda with --device {device}: device time is recorded for \
                 CUDA devices only; use --profile-activities cpu, or train on cuda"
            ))
            .into());
        }
    }
    if let Some(path) = &args.memory_snapshot {
        check_output_path("--memory-snapshot", path, "snapshot.pickle")?;
    }
    let dir = data::resolve_dir(
        args.data_dir.as_deref(),
        &[data::Split::Train, data::Split::Test],
    )?;
    let train = data::load(&dir, data::Split::Train)?;
    let test = data::load(&dir, data::Split::Test)?;
    announce_device(&args.device, device);
    let report = train_on(&args, device, &train, &test)?;
    if let Some(path) = &args.save {
        // state_dict() returns CPU copies.
        save_state_dict(&report.state_dict, path)
            .with_context(|| format!("saving the state dict to {}", path.display()))?;
    }
    report.print(args.json, args.save.as_deref())?;
    Ok(())
}

/// A file path for `flag` to write at the end of the run: not a folder, in a folder that
/// exists, and one this process can open for writing now, so that a bad path fails before the
/// training, not after it (`example` names a file to suggest). A file the check creates is
/// removed again; an existing one is opened without truncating it.
pub(crate) fn check_output_path(
    flag: &str,
    path: &std::path::Path,
    example: &str,
) -> Result<(), UsageError> {
    if path.is_dir() {
        return Err(UsageError(format!(
            "{flag} {}: that is a folder; give a file path such as {}",
            path.display(),
            path.join(example).display()
        )));
    }
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    if !parent.is_dir() {
        return Err(UsageError(format!(
            "{flag} {}: the folder {} does not exist; create it or write elsewhere",
            path.display(),
            parent.display()
        )));
    }
    let existed = path.exists();
    match std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
    {
        Ok(_) => {
            if !existed {
                // Best effort: the file is written again at the end of the run.
                let _ = std::fs::remove_file(path);
            }
            Ok(())
        }
        Err(e) => Err(UsageError(format!(
            "{flag} {}: cannot write there ({e}); give a path in a folder you can write to",
            path.display()
        ))),
    }
}

/// Refuses two output flags naming the same file (`--save`, `--profile`, `--memory-snapshot`):
/// the last one written would silently replace the other.
fn check_distinct_outputs(outputs: &[(&str, Option<&std::path::Path>)]) -> Result<(), UsageError> {
    let named: Vec<(&str, &std::path::Path)> = outputs
        .iter()
        .filter_map(|&(flag, p)| p.map(|p| (flag, p)))
        .collect();
    for (i, &(flag_a, a)) in named.iter().enumerate() {
        for &(flag_b, b) in &named[i + 1..] {
            if crate::paths::same_file(a, b) {
                return Err(UsageError(format!(
                    "{flag_a} and {flag_b} both name {}: one file would overwrite the other; give each its own path",
                    a.display()
                )));
            }
        }
    }
    Ok(())
}

/// Trains on `device` and returns the report (state dict included).
pub fn train_on(
    args: &TrainArgs,
    device: Device,
    train: &data::FashionSplit,
    test: &data::FashionSplit,
) -> anyhow::Result<TrainReport> {
    let mut g = Generator::new(args.seed);
    let model = Mlp::new(args.hidden, device, &mut g)?;
    let mut opt = Sgd::new(args.lr, args.momentum);
    let resident = if args.resident {
        Some(resident::Resident::new(
            train,
            args.batch_size,
            args.seed,
            device,
        )?)
    } else {
        None
    };
    // No loader (and no workers) for a resident run.
    let workers = if resident.is_some() { 0 } else { args.workers };
    let loader = data::train_loader(train, args.batch_size, workers, args.seed, device)?;
    let test_loader = data::eval_loader(test, data::EVAL_BATCH, device)?;
    let steps_per_epoch = resident
        .as_ref()
        .map_or(loader.len(), resident::Resident::len);
    let total_steps = steps_per_epoch as u64 * args.epochs as u64;
    if args.profile.is_some() && args.profile_warmup >= total_steps {
        return Err(UsageError(format!(
            "--profile-warmup {}: training runs {total_steps} steps ({} of {steps_per_epoch}), \
             so the profile would never start; give a warm-up below {total_steps} \
             (e.g. --profile-warmup {})",
            args.profile_warmup,
            if args.epochs == 1 {
                "1 epoch".to_owned()
            } else {
                format!("{} epochs", args.epochs)
            },
            total_steps / 2
        ))
        .into());
    }
    let timer = report::EpochTimer::new(device)?;
    let mem = MemoryReport::start(device)?;
    let snapshot_device = match (&args.memory_snapshot, report::cuda_index(device)) {
        (Some(_), Some(i)) => {
            berth::cuda::record_memory_history(i, Some(SNAPSHOT_HISTORY))?;
            Some(i)
        }
        _ => None,
    };
    let mut prof = profile::StepProfiler::new(
        args.profile.clone(),
        args.profile_warmup,
        args.profile_steps,
        profile::activities(&args.profile_activities, device.is_cuda()),
        args.profile_device_timer,
        args.json,
    );
    prof.prepare()?;
    let waits_before = report::host_waits();
    let mut epochs = Vec::new();
    let mut steps = 0u64;
    for epoch in 1..=args.epochs {
        let bar = report::progress_bar(steps_per_epoch as u64, epoch, args.epochs, args.json);
        let started = Instant::now();
        timer.start()?;
        // The loss is summed on the device and read once per epoch (and every `LOG_EVERY`
        // steps for the progress bar): a read per step would be a host sync per step
        // (https://github.com/meta-pytorch/torchtune/pull/522).
        let loss_sum = Tensor::zeros(&[], DType::F32, device)?;
        let mut seen = 0usize;
        // None until the first read: the bar says "loss …" then, not "loss NaN" (a new user
        // took the NaN of the first LOG_EVERY - 1 steps for a diverged model).
        let mut shown_loss: Option<f64> = None;
        let order = resident
            .as_ref()
            .map(resident::Resident::epoch_order)
            .transpose()?;
        let mut batches = match &resident {
            Some(_) => None,
            None => Some(data::device_batches(&loader, device)?),
        };
        for i in 0..steps_per_epoch {
            // The step's range covers the batch's normalisation and the step; the prefetcher's
            // copy of the next batch is queued in the loader's `next()`, inside the range
            // (a resident run gathers its batch there instead).
            let range = prof.before_step(steps)?;
            let (x, y) = match (&resident, &order, &mut batches) {
                (Some(r), Some(order), _) => r.batch(order, i)?,
                (_, _, Some(it)) => {
                    let Some(batch) = it.next() else { break };
                    data::to_device(
                        batch.with_context(|| format!("epoch {epoch}, batch {i}"))?,
                        device,
                    )?
                }
                _ => unreachable!("a resident split or a loader"),
            };
            train_step(&model, &mut opt, &x, &y, &loss_sum)?;
            drop(range);
            prof.after_step()?;
            seen += y.numel();
            steps += 1;
            if i % report::LOG_EVERY == report::LOG_EVERY - 1 {
                shown_loss = Some(loss_sum.item::<f32>()? as f64 / seen as f64);
            }
            bar.set_message(format!(
                "loss {}  {:.0} samples/s",
                loss_label(shown_loss),
                seen as f64 / started.elapsed().as_secs_f64()
            ));
            bar.inc(1);
        }
        let seconds = timer.stop()?;
        bar.finish_and_clear();
        let train_loss = loss_sum.item::<f32>()? as f64 / seen.max(1) as f64;
        if !train_loss.is_finite() {
            anyhow::bail!(
                "training diverged: the mean train loss of epoch {epoch} is {train_loss}; lower --lr \
                 (now {}) or --momentum (now {})",
                short_float(args.lr),
                short_float(args.momentum)
            );
        }
        let test_accuracy = evaluate(&model, &test_loader, device)?;
        let e = EpochReport {
            epoch,
            train_loss,
            test_accuracy,
            seconds,
            samples_per_second: seen as f64 / seconds,
        };
        if !args.json {
            e.print();
        }
        epochs.push(e);
    }
    prof.finish()?;
    let memory = mem.finish(device)?;
    if let (Some(i), Some(path)) = (snapshot_device, &args.memory_snapshot) {
        let snapshot = berth::cuda::memory_snapshot(i)?;
        std::fs::write(
            path,
            // History is recorded for the whole run (above): the file says so (Note
            // [Snapshot history flag]).
            berth::alloc::pickle::dump_snapshot_with_history(&snapshot, true),
        )
        .with_context(|| format!("writing the memory snapshot to {}", path.display()))?;
    }
    let waits = report::host_waits() - waits_before;
    let state_dict = model.state_dict()?;
    Ok(TrainReport {
        device,
        epochs,
        memory,
        implicit_syncs_per_step: report::syncs_per_step(waits, steps),
        state_dict,
        ranks: Vec::new(),
    })
}

/// One SGD step on a prepared batch (`x [batch, 784]` f32, `y [batch]` i64, both on the model's
/// device); adds the batch's summed loss to `loss_sum` (a device scalar, so nothing syncs).
///
/// # Errors
/// Shape, device or allocation errors.
pub fn train_step(
    model: &Mlp,
    opt: &mut Sgd,
    x: &Tensor,
    y: &Tensor,
    loss_sum: &Tensor,
) -> berth::Result<()> {
    let acts = model.forward_train(x)?;
    let grads = model.backward(x, &acts, y)?;
    opt.step(&model.params(), &grads.as_slice())?;
    let loss = acts.logits.cross_entropy(y)?;
    loss_sum.add_scaled_(&loss, y.numel() as f64)
}

/// Adds the number of correct predictions of `model` on a prepared batch to `correct` (an i64
/// device scalar).
///
/// # Errors
/// Shape, device or allocation errors.
pub fn eval_batch(model: &Mlp, x: &Tensor, y: &Tensor, correct: &Tensor) -> berth::Result<()> {
    let pred = model.forward(x)?.argmax_dim(1, false)?;
    let hits = pred.eq(y)?.to_dtype(DType::I64)?.sum()?;
    correct.add_(&hits)
}

/// Test accuracy of `model` over every batch of `loader`, in [0, 1]. The count of correct
/// predictions stays on the device until the end (one read).
pub fn evaluate(model: &Mlp, loader: &data::FashionLoader, device: Device) -> anyhow::Result<f64> {
    let correct = Tensor::zeros(&[], DType::I64, device)?;
    let mut total = 0usize;
    for batch in data::device_batches(loader, device)? {
        let (x, y) = data::to_device(batch?, device)?;
        eval_batch(model, &x, &y, &correct)?;
        total += y.numel();
    }
    Ok(correct.item::<i64>()? as f64 / total.max(1) as f64)
}

/// Runs `berth eval`.
pub fn run_eval(args: EvalArgs) -> anyhow::Result<()> {
    if args.batch_size == 0 {
        return Err(UsageError("--batch-size 0: the batch size must be at least 1".into()).into());
    }
    let device = resolve_device(&args.device)?;
    if device == Device::Meta {
        return Err(UsageError(
            "berth eval --device meta: meta tensors have no data to evaluate; use cpu or cuda"
                .into(),
        )
        .into());
    }
    let state = load_state_dict_file(&args.load).map_err(|e| {
        UsageError(format!(
            "--load {}: {e} (expected a safetensors file written by `berth train --save`)",
            args.load.display()
        ))
    })?;
    let hidden = mlp::hidden_of(&state)
        .map_err(|e| UsageError(format!("--load {}: {e}", args.load.display())))?;
    let mut g = Generator::new(0);
    let mut model = Mlp::new(hidden, Device::Cpu, &mut g)?;
    model
        .load_state_dict(&state)
        .map_err(|e| UsageError(format!("--load {}: {e}", args.load.display())))?;
    model.to_device(device)?;
    let dir = data::resolve_dir(args.data_dir.as_deref(), &[data::Split::Test])?;
    let test = data::load(&dir, data::Split::Test)?;
    announce_device(&args.device, device);
    let loader = data::eval_loader(&test, args.batch_size, device)?;
    let acc = evaluate(&model, &loader, device)?;
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "device": device.to_string(),
                "test_accuracy": acc,
                "load": args.load.to_string_lossy(),
            })
        );
    } else {
        println!(
            "test accuracy {:.2}% on {} ({} images)",
            acc * 100.0,
            device,
            berth_data::Dataset::len(&*test)
        );
    }
    Ok(())
}

/// The progress bar's loss: four decimals once read, "…" before the first read.
fn loss_label(loss: Option<f64>) -> String {
    loss.map_or_else(|| "…".to_owned(), |l| format!("{l:.4}"))
}

#[cfg(test)]
mod tests {
    use super::{loss_label, short_float};

    #[test]
    fn the_progress_loss_is_an_ellipsis_until_first_read() {
        assert_eq!(loss_label(None), "…");
        assert_eq!(loss_label(Some(0.51234)), "0.5123");
        assert_eq!(loss_label(Some(f64::NAN)), "NaN", "a real NaN still shows");
    }

    #[test]
    fn floats_print_short() {
        assert_eq!(short_float(0.05), "0.05");
        assert_eq!(short_float(0.9), "0.9");
        assert_eq!(short_float(1e300), "1e300");
        assert_eq!(short_float(1e-9), "1e-9");
        assert_eq!(short_float(f64::INFINITY), "inf");
    }
}
