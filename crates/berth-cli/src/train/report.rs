//! Timings, progress and the memory report of `berth train`.

use std::path::Path;
use std::time::Instant;

use berth::nn::StateDict;
use berth::Device;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Steps between two reads of the running loss for the progress bar (each read is one
/// explicit host sync on a GPU).
pub const LOG_EVERY: usize = 50;

/// One epoch's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct EpochReport {
    /// 1-based epoch number.
    pub epoch: usize,
    /// Mean training cross-entropy over the epoch's samples.
    pub train_loss: f64,
    /// Fraction of the 10,000 test images classified correctly, in [0, 1].
    pub test_accuracy: f64,
    /// Wall time of the epoch's training steps in seconds (CUDA events on the GPU).
    pub seconds: f64,
    /// Training samples per second.
    pub samples_per_second: f64,
}

impl EpochReport {
    /// Prints the epoch's line.
    pub fn print(&self) {
        println!(
            "epoch {:>2}  train loss {:.4}  test accuracy {:6.2}%  {:6.2} s  {:>8.0} samples/s",
            self.epoch,
            self.train_loss,
            self.test_accuracy * 100.0,
            self.seconds,
            self.samples_per_second
        );
    }
}

/// Peak memory of a run, in bytes.
#[derive(Debug, Clone, serde::Serialize)]
pub struct MemoryReport {
    /// Peak bytes allocated to tensors (CUDA: the caching allocator's `max_memory_allocated`;
    /// CPU: the peak host bytes held by tensor storages).
    pub peak_allocated: u64,
    /// Peak bytes reserved (CUDA: `max_memory_reserved`; CPU: equal to `peak_allocated`, as host
    /// tensors are not cached).
    pub peak_reserved: u64,
    /// `memory_summary()` of the device (CUDA), `None` on the CPU.
    #[serde(skip)]
    pub summary: Option<String>,
    /// The CUDA allocator's policy (`paged`, `pytorch`, `expandable`), `None` on the CPU.
    pub policy: Option<String>,
    /// Bytes of the device in use by every process at the end of the run, as the driver
    /// counts them (`total − free` of `cudaMemGetInfo`, what `nvidia-smi` shows: the caching
    /// allocator's reserved bytes, the CUDA context, NCCL's buffers); `None` on the CPU.
    pub driver_used_bytes: Option<u64>,
}

impl MemoryReport {
    /// Resets the peak counters of `device` so the report covers this run only.
    ///
    /// # Errors
    /// CUDA errors on a CUDA device.
    pub fn start(device: Device) -> anyhow::Result<MemoryStart> {
        match cuda_index(device) {
            Some(i) => berth::cuda::reset_peak_memory_stats(i)?,
            None => berth::storage::reset_peak_host_memory_stats(),
        }
        Ok(MemoryStart)
    }
}

/// Marker returned by [`MemoryReport::start`].
#[derive(Debug)]
pub struct MemoryStart;

impl MemoryStart {
    /// Reads the peaks (and the summary on CUDA).
    ///
    /// # Errors
    /// CUDA errors.
    pub fn finish(self, device: Device) -> anyhow::Result<MemoryReport> {
        Ok(match cuda_index(device) {
            Some(i) => MemoryReport {
                peak_allocated: berth::cuda::max_memory_allocated(i)?,
                peak_reserved: berth::cuda::max_memory_reserved(i)?,
                summary: Some(berth::cuda::memory_summary(i, false)?),
                policy: Some(berth::cuda::allocator_policy(i)?),
                driver_used_bytes: {
                    let (free, total) = berth::cuda::mem_get_info(i)?;
                    Some(total.saturating_sub(free) as u64)
                },
            },
            None => {
                let peak = berth::storage::max_host_memory_allocated() as u64;
                MemoryReport {
                    peak_allocated: peak,
                    peak_reserved: peak,
                    summary: None,
                    policy: None,
                    driver_used_bytes: None,
                }
            }
        })
    }
}

/// The CUDA device index of a canonical `cuda:i` device, `None` for any other device.
pub fn cuda_index(device: Device) -> Option<usize> {
    if device.is_cuda() {
        device.index().map(usize::from)
    } else {
        None
    }
}

/// Host waits (explicit and implicit syncs) counted by berth's CUDA layer so far.
pub fn host_waits() -> u64 {
    berth::cuda::host_waits()
}

/// Host waits per training step (0 for a run of no steps): the report's
/// `implicit_syncs_per_step`.
pub fn syncs_per_step(waits: u64, steps: u64) -> f64 {
    if steps == 0 {
        0.0
    } else {
        waits as f64 / steps as f64
    }
}

/// Times epochs: CUDA events on a CUDA device, the host clock elsewhere.
pub struct EpochTimer {
    cuda: Option<(berth::cuda::Event, berth::cuda::Event)>,
    host: std::cell::Cell<Option<Instant>>,
}

impl EpochTimer {
    /// A timer for `device`.
    ///
    /// # Errors
    /// CUDA errors creating the events.
    pub fn new(device: Device) -> anyhow::Result<EpochTimer> {
        let cuda = cuda_index(device)
            .map(|_| (berth::cuda::Event::new(true), berth::cuda::Event::new(true)));
        Ok(EpochTimer {
            cuda,
            host: std::cell::Cell::new(None),
        })
    }

    /// Marks the start.
    ///
    /// # Errors
    /// CUDA errors recording the event.
    pub fn start(&self) -> anyhow::Result<()> {
        if let Some((s, _)) = &self.cuda {
            s.record()?;
        }
        self.host.set(Some(Instant::now()));
        Ok(())
    }

    /// Seconds since [`EpochTimer::start`]; on CUDA it waits for the end event (an explicit sync).
    ///
    /// # Errors
    /// CUDA errors.
    pub fn stop(&self) -> anyhow::Result<f64> {
        if let Some((s, e)) = &self.cuda {
            e.record()?;
            e.synchronize()?;
            return Ok(f64::from(s.elapsed_time(e)?) / 1000.0);
        }
        Ok(self.host.get().map_or(0.0, |t| t.elapsed().as_secs_f64()))
    }
}

/// An epoch's progress bar on stderr (hidden with `--json` or when stderr is not a terminal).
pub fn progress_bar(steps: u64, epoch: usize, epochs: usize, json: bool) -> ProgressBar {
    let bar = ProgressBar::new(steps);
    if json {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    } else {
        bar.set_draw_target(ProgressDrawTarget::stderr());
    }
    if let Ok(style) = ProgressStyle::with_template(&format!(
        "epoch {epoch}/{epochs} [{{bar:30}}] {{pos}}/{{len}} {{msg}} ({{elapsed}})"
    )) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// What `berth train` reports.
pub struct TrainReport {
    /// Where it ran.
    pub device: Device,
    /// One entry per epoch.
    pub epochs: Vec<EpochReport>,
    /// Peak memory.
    pub memory: MemoryReport,
    /// Host waits per training step (the loss reads for the progress bar and the epoch timer
    /// included); 0 on the CPU.
    pub implicit_syncs_per_step: f64,
    /// The trained parameters as CPU tensors.
    pub state_dict: StateDict,
    /// A data-parallel run's memory per rank, in rank order (rank 0's is also in `memory`);
    /// empty for a run on one device.
    pub ranks: Vec<RankMemory>,
}

/// One rank's memory report in a data-parallel run (`berth train --devices`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct RankMemory {
    /// The rank.
    pub rank: usize,
    /// Its device, as `cuda:1` or `cpu`.
    pub device: String,
    /// Peak bytes allocated to tensors ([`MemoryReport::peak_allocated`]).
    pub peak_allocated: u64,
    /// Peak bytes reserved ([`MemoryReport::peak_reserved`]).
    pub peak_reserved: u64,
    /// Bytes in use on the device per the driver ([`MemoryReport::driver_used_bytes`]).
    pub driver_used_bytes: Option<u64>,
}

impl RankMemory {
    /// Rank `rank`'s entry for its `memory` on `device`.
    pub fn new(rank: usize, device: Device, memory: &MemoryReport) -> RankMemory {
        RankMemory {
            rank,
            device: device.to_string(),
            peak_allocated: memory.peak_allocated,
            peak_reserved: memory.peak_reserved,
            driver_used_bytes: memory.driver_used_bytes,
        }
    }

    /// The rank's one-line report, labelled with its rank.
    pub fn line(&self) -> String {
        let driver = self.driver_used_bytes.map_or_else(String::new, |b| {
            format!(", driver used {b} B ({:.1} MiB)", mib(b))
        });
        format!(
            "rank {} memory on {}: peak allocated {} B ({:.1} MiB), peak reserved {} B ({:.1} MiB){driver}",
            self.rank,
            self.device,
            self.peak_allocated,
            mib(self.peak_allocated),
            self.peak_reserved,
            mib(self.peak_reserved)
        )
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

impl TrainReport {
    /// Prints the final report: text, or one JSON object.
    ///
    /// # Errors
    /// JSON serialisation errors.
    pub fn print(&self, json: bool, saved: Option<&Path>) -> anyhow::Result<()> {
        let last = self.epochs.last();
        if json {
            let obj = serde_json::json!({
                "device": self.device.to_string(),
                "epochs": self.epochs.len(),
                "test_accuracy": last.map(|e| e.test_accuracy),
                "train_loss": last.map(|e| e.train_loss),
                "epoch_seconds": self.epochs.iter().map(|e| e.seconds).collect::<Vec<_>>(),
                "samples_per_second": last.map(|e| e.samples_per_second),
                "peak_allocated": self.memory.peak_allocated,
                "peak_reserved": self.memory.peak_reserved,
                "allocator_policy": self.memory.policy,
                "driver_used_bytes": self.memory.driver_used_bytes,
                "world_size": self.ranks.len().max(1),
                "ranks": self.ranks,
                "implicit_syncs_per_step": self.implicit_syncs_per_step,
                "per_epoch": self.epochs,
                // Lossy: a path that is not UTF-8 still gets a JSON string (with U+FFFD).
                "saved": saved.map(|p| p.to_string_lossy().into_owned()),
            });
            println!("{}", serde_json::to_string(&obj)?);
            return Ok(());
        }
        if let Some(summary) = &self.memory.summary {
            println!("{summary}");
        }
        let what = match &self.memory.policy {
            Some(policy) => format!("allocator policy {policy}"),
            None => "host bytes held by tensors".to_owned(),
        };
        println!(
            "memory on {} ({what}): peak allocated {} B ({:.1} MiB), peak reserved {} B ({:.1} MiB)",
            self.device,
            self.memory.peak_allocated,
            mib(self.memory.peak_allocated),
            self.memory.peak_reserved,
            mib(self.memory.peak_reserved)
        );
        for r in &self.ranks {
            println!("{}", r.line());
        }
        println!("host syncs per step: {:.3}", self.implicit_syncs_per_step);
        if let Some(p) = saved {
            println!("saved the state dict (CPU copies) to {}", p.display());
        }
        Ok(())
    }
}
