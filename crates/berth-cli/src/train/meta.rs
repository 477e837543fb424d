//! `berth train --device meta`: predict the GPU's peak memory without allocating anything.
//!
//! The model is built on meta and two training steps (the first creates the momentum buffers,
//! the second is a steady-state step) plus two evaluation batches, fed one batch ahead as the
//! GPU run's device prefetcher does, run through the very functions
//! the real run uses ([`super::train_step`], [`super::eval_batch`], [`super::data::prepare`]),
//! while a [`MetaPlan`] is active: every meta tensor takes its bytes from PyTorch's caching
//! allocator on a simulated device, so the prediction includes 512-byte rounding, segment
//! sizes and caching (Note [Meta storage] in `berth::meta_plan`). With `--resident` the steps
//! gather their batches from the split kept on the device, as `super::resident` does on CUDA.

use berth::meta_plan::MetaPlan;
use berth::{DType, Device, Generator, Tensor};

use super::{data, eval_batch, train_step, Mlp, Sgd, TrainArgs};

/// Capacity of the simulated device when no GPU is present: an H200's 139.8 GiB
/// (150,109,880,320 bytes, from `torch.cuda.mem_get_info` on the GPU machine).
const DEFAULT_CAPACITY_BYTES: u64 = 150_109_880_320;

/// The prediction of a meta run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MetaPrediction {
    /// Predicted `max_memory_allocated()` of the GPU run, in bytes.
    pub peak_allocated: u64,
    /// Predicted `max_memory_reserved()` of the GPU run, in bytes.
    pub peak_reserved: u64,
    /// Sum of the parameter bytes (what `numel × element_size` gives, no rounding).
    pub parameter_bytes: u64,
    /// Bytes of the simulated device: device 0's total memory when a GPU is present, else an
    /// H200's.
    pub capacity_bytes: u64,
}

/// Runs the meta steps and returns the prediction.
///
/// # Errors
/// Shape errors (a bug) or a malformed `BERTH_ALLOC_CONF`.
pub fn predict(args: &TrainArgs) -> anyhow::Result<(MetaPrediction, MetaPlan)> {
    predict_with(args, berth::cuda::memory::config()?)
}

/// The name of the allocator policy a prediction is for (`BERTH_ALLOC_CONF`'s), as the summary
/// and the JSON report it: `pytorch`, `expandable` or `paged`.
fn policy_name() -> anyhow::Result<&'static str> {
    Ok(berth::cuda::memory::config()?.policy_name())
}

/// [`predict`] for the allocator `config` selects instead of `BERTH_ALLOC_CONF`'s.
///
/// # Errors
/// As [`predict`].
pub fn predict_with(
    args: &TrainArgs,
    config: berth::alloc::AllocatorConfig,
) -> anyhow::Result<(MetaPrediction, MetaPlan)> {
    let capacity = match berth::cuda::mem_get_info(0) {
        Ok((_, total)) => total as u64,
        Err(_) => DEFAULT_CAPACITY_BYTES,
    };
    // A resident run keeps the whole training split on the device: its length decides the
    // bytes, so the split's files are read (its images are not needed).
    let resident_rows = if args.resident {
        let dir = data::resolve_dir(args.data_dir.as_deref(), &[data::Split::Train])?;
        Some(berth_data::Dataset::len(&*data::load(
            &dir,
            data::Split::Train,
        )?))
    } else {
        None
    };
    let plan = MetaPlan::with_config(capacity, config)?;
    let parameter_bytes;
    {
        let _active = plan.activate();
        let mut g = Generator::new(args.seed);
        let model = Mlp::new(args.hidden, Device::Meta, &mut g)?;
        parameter_bytes = model.params().iter().map(|p| p.nbytes() as u64).sum();
        let mut opt = Sgd::new(args.lr, args.momentum);
        // Kept live through the evaluation below, as in the real run: the running loss, and
        // for a resident run the split on the device and the epoch's order.
        let loss_sum;
        let _resident;
        if let Some(n) = resident_rows {
            // `super::resident::Resident` on CUDA, in the order the real run allocates: the
            // normalised split and its labels, then per epoch the running loss and the
            // shuffled order (i64), then per step two `index_select` outputs.
            let x_all = Tensor::empty(&[n, super::mlp::INPUTS], DType::F32, Device::Meta)?;
            let y_all = Tensor::empty(&[n], DType::I64, Device::Meta)?;
            loss_sum = Tensor::zeros(&[], DType::F32, Device::Meta)?;
            let order = Tensor::empty(&[n], DType::I64, Device::Meta)?;
            for i in 0..2 {
                let start = (i * args.batch_size).min(n);
                let b = args.batch_size.min(n - start);
                let rows = order.narrow(0, start, b)?;
                let x = x_all.index_select(0, &rows)?;
                let y = y_all.index_select(0, &rows)?;
                train_step(&model, &mut opt, &x, &y, &loss_sum)?;
            }
            _resident = Some((x_all, y_all, order));
        } else {
            _resident = None;
            loss_sum = Tensor::zeros(&[], DType::F32, Device::Meta)?;
            // The GPU run feeds batches through a `DevicePrefetcher`: when the loop takes
            // batch n, the copy of batch n+1 is already allocated, so two raw batches are
            // live during a step.
            let mut next = raw_batch(args.batch_size)?;
            for _ in 0..2 {
                let (pixels, y) = std::mem::replace(&mut next, raw_batch(args.batch_size)?);
                let x = data::prepare(&pixels)?;
                drop(pixels);
                train_step(&model, &mut opt, &x, &y, &loss_sum)?;
            }
            drop(next);
        }
        let correct = Tensor::zeros(&[], DType::I64, Device::Meta)?;
        let mut next = raw_batch(data::EVAL_BATCH)?;
        for _ in 0..2 {
            let (pixels, y) = std::mem::replace(&mut next, raw_batch(data::EVAL_BATCH)?);
            let x = data::prepare(&pixels)?;
            drop(pixels);
            eval_batch(&model, &x, &y, &correct)?;
        }
    }
    let ooms = plan.num_ooms();
    if ooms > 0 {
        anyhow::bail!(
            "the step does not fit a device of {capacity} bytes: {ooms} of its allocations failed \
             on the simulated device (at least {} B were allocated when it ran out); lower \
             --batch-size or --hidden",
            plan.max_memory_allocated()
        );
    }
    let p = MetaPrediction {
        peak_allocated: plan.max_memory_allocated(),
        peak_reserved: plan.max_memory_reserved(),
        parameter_bytes,
        capacity_bytes: capacity,
    };
    Ok((p, plan))
}

/// A batch as it arrives on the device: f32 pixels `[batch, 784]`, i64 labels `[batch]`.
fn raw_batch(batch: usize) -> berth::Result<(Tensor, Tensor)> {
    let pixels = Tensor::empty(&[batch, super::mlp::INPUTS], DType::F32, Device::Meta)?;
    let labels = Tensor::empty(&[batch], DType::I64, Device::Meta)?;
    Ok((pixels, labels))
}

/// Runs `berth train --device meta` and prints the prediction.
///
/// # Errors
/// As [`predict`].
pub fn run(args: &TrainArgs) -> anyhow::Result<()> {
    let (p, plan) = predict(args)?;
    let policy = policy_name()?;
    if args.json {
        // The same keys as a real run's report (`peak_allocated`, `peak_reserved`), marked as
        // a prediction, with the policy it is for.
        let obj = serde_json::json!({
            "device": "meta",
            "prediction": true,
            "policy": policy,
            "batch_size": args.batch_size,
            "hidden": args.hidden,
            "resident": args.resident,
            "peak_allocated": p.peak_allocated,
            "peak_reserved": p.peak_reserved,
            "parameter_bytes": p.parameter_bytes,
            "allocated_on_any_device": 0,
        });
        println!("{}", serde_json::to_string(&obj)?);
        return Ok(());
    }
    println!(
        "Prediction (nothing was allocated): the CUDA memory summary of `berth train --device \
         cuda` with the `{policy}` allocator policy (BERTH_ALLOC_CONF) on a device of {} B, \
         computed on meta tensors:",
        p.capacity_bytes
    );
    println!("{}", plan.memory_summary());
    println!(
        "meta: one training step (batch {}, hidden {}{}) and one evaluation batch ({}) on meta tensors",
        args.batch_size,
        args.hidden,
        if args.resident {
            ", the training split resident on the device"
        } else {
            ""
        },
        data::EVAL_BATCH
    );
    println!(
        "predicted GPU peak allocated {} B ({:.2} MiB), peak reserved {} B ({:.2} MiB); parameters {} B; nothing was allocated",
        p.peak_allocated,
        p.peak_allocated as f64 / 1048576.0,
        p.peak_reserved,
        p.peak_reserved as f64 / 1048576.0,
        p.parameter_bytes
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(batch: usize, hidden: usize) -> TrainArgs {
        TrainArgs {
            devices: None,
            bucket_cap_mb: None,
            device: "meta".into(),
            epochs: 1,
            batch_size: batch,
            hidden,
            lr: 0.05,
            momentum: 0.9,
            workers: 0,
            resident: false,
            seed: 0,
            save: None,
            data_dir: None,
            json: true,
            memory_snapshot: None,
            profile: None,
            profile_warmup: 20,
            profile_steps: 5,
            profile_activities: Vec::new(),
            profile_device_timer: crate::train::profile::Timer::Auto,
        }
    }

    /// Hidden 256: parameters 784·256 + 256 + 256·10 + 10 floats = 814,120 B (203,530 floats). The eval
    /// batch's `[1000, 784]` f32 input (3,136,000 B) and its normalised copies are large-pool
    /// blocks (20 MiB segments); everything else is ≤ 1 MiB (2 MiB small segments). Every block
    /// is rounded to 512 B.
    fn conf(s: &str) -> berth::alloc::AllocatorConfig {
        berth::alloc::AllocatorConfig::parse(s).unwrap()
    }

    /// With berth's `paged` policy memory is mapped in 2 MiB pages, not 20 MiB segments: the
    /// prediction is a whole number of pages, at least the peak allocated, and below PyTorch's.
    #[test]
    fn meta_prediction_of_the_paged_policy_maps_pages() {
        let (paged, plan) = predict_with(&args(64, 256), conf("backend:paged")).unwrap();
        let (native, _) = predict_with(&args(64, 256), conf("backend:native")).unwrap();
        assert_eq!(plan.allocator().policy_name(), "paged");
        assert_eq!(
            paged.peak_reserved % (2 << 20),
            0,
            "{}",
            paged.peak_reserved
        );
        assert!(paged.peak_reserved >= paged.peak_allocated);
        assert!(
            paged.peak_reserved < native.peak_reserved,
            "{paged:?} {native:?}"
        );
        assert!(plan.memory_summary().contains("allocator policy: paged"));
    }

    #[test]
    fn meta_prediction_counts_rounded_blocks_and_segments() {
        let (p, _) = predict_with(&args(64, 256), conf("backend:native")).unwrap();
        assert_eq!(p.parameter_bytes, 814_120);
        assert!(
            p.peak_allocated >= 2 * 814_120,
            "params + momentum: {}",
            p.peak_allocated
        );
        assert_eq!(p.peak_allocated % 512, 0);
        assert!(p.peak_reserved >= 20 << 20);
        assert_eq!(p.peak_reserved % (2 << 20), 0, "{}", p.peak_reserved);
        assert!(p.peak_reserved >= p.peak_allocated);
    }

    #[test]
    fn meta_prediction_grows_with_the_model() {
        let (small, _) = predict_with(&args(64, 64), conf("")).unwrap();
        let (big, _) = predict_with(&args(64, 1024), conf("")).unwrap();
        // hidden 1024: fc1.weight alone is 3,211,264 B, a large-pool block.
        assert!(big.peak_allocated >= small.peak_allocated + 2 * 3_211_264);
    }
}
