//! `berth train --profile PATH`: profiles a few training steps after a warm-up with
//! [`berth::profiler`] (CPU and CUDA activities, shapes, memory), each step a
//! `record_function("step N")` range, then writes the Chrome trace to `PATH` and prints the
//! `key_averages()` table.

use std::path::PathBuf;

use anyhow::Context;
use berth::profiler::{self, DeviceTimer, ProfilerActivity, RecordFunction, SortBy};

/// A `--profile-activities` value (`torch.profiler.ProfilerActivity`'s names, lower case).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Activity {
    /// Ops, copies and ranges on the host.
    Cpu,
    /// Device time of CUDA ops and copies.
    Cuda,
}

/// The activities to record: `chosen`, or when none was given, CPU and (on a CUDA device) CUDA.
pub fn activities(chosen: &[Activity], cuda_device: bool) -> Vec<ProfilerActivity> {
    if chosen.is_empty() {
        let mut all = vec![ProfilerActivity::Cpu];
        if cuda_device {
            all.push(ProfilerActivity::Cuda);
        }
        return all;
    }
    chosen
        .iter()
        .map(|a| match a {
            Activity::Cpu => ProfilerActivity::Cpu,
            Activity::Cuda => ProfilerActivity::Cuda,
        })
        .collect()
}

/// A `--profile-device-timer` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Timer {
    /// CUPTI where it loads, else CUDA events.
    Auto,
    /// CUPTI's activity records.
    Cupti,
    /// CUDA events around each op and copy.
    Events,
}

impl Timer {
    fn device_timer(self) -> DeviceTimer {
        match self {
            Timer::Auto => DeviceTimer::Auto,
            Timer::Cupti => DeviceTimer::Cupti,
            Timer::Events => DeviceTimer::CudaEvents,
        }
    }
}

/// Rows of the printed table.
const TABLE_ROWS: usize = 25;

/// The profiler of a training run: idle until the warm-up steps are done, active for the
/// profiled steps, then done.
pub struct StepProfiler {
    path: Option<PathBuf>,
    warmup: u64,
    steps: u64,
    activities: Vec<ProfilerActivity>,
    timer: Timer,
    json: bool,
    active: Option<profiler::Profiler>,
    profiled: u64,
}

impl StepProfiler {
    /// A profiler writing to `path` (none: never profiles) after `warmup` steps, for `steps`
    /// steps (0: until the end of training), recording `activities`, timing CUDA work with
    /// `timer`.
    pub fn new(
        path: Option<PathBuf>,
        warmup: u64,
        steps: u64,
        activities: Vec<ProfilerActivity>,
        timer: Timer,
        json: bool,
    ) -> Self {
        StepProfiler {
            path,
            warmup,
            steps,
            activities,
            timer,
            json,
            active: None,
            profiled: 0,
        }
    }

    fn done(&self) -> bool {
        self.steps != 0 && self.profiled >= self.steps
    }

    /// Called before global step `step` (0-based): starts the profiler at the end of the
    /// warm-up and returns the step's range while profiling.
    ///
    /// # Errors
    /// Another profiler is active.
    pub fn before_step(&mut self, step: u64) -> anyhow::Result<Option<RecordFunction>> {
        if self.path.is_none() || self.done() || step < self.warmup {
            return Ok(None);
        }
        if self.active.is_none() {
            self.active = Some(
                profiler::profile()
                    .activities(&self.activities)
                    .device_timer(self.timer.device_timer())
                    .record_shapes(true)
                    .profile_memory(true)
                    .start()?,
            );
        }
        Ok(Some(profiler::record_function(format!("step {step}"))))
    }

    /// Called after a step that [`StepProfiler::before_step`] profiled: stops and writes once
    /// the profiled steps are done.
    ///
    /// # Errors
    /// Writing the trace.
    pub fn after_step(&mut self) -> anyhow::Result<()> {
        if self.active.is_some() {
            self.profiled += 1;
            if self.done() {
                self.finish()?;
            }
        }
        Ok(())
    }

    /// Stops an active profiler, writes its trace and prints its table (to stderr under
    /// `--json`, so stdout stays one JSON object).
    ///
    /// # Errors
    /// Writing the trace.
    pub fn finish(&mut self) -> anyhow::Result<()> {
        let (Some(p), Some(path)) = (self.active.take(), &self.path) else {
            return Ok(());
        };
        let profile = p.stop()?;
        profile
            .export_chrome_trace(path)
            .with_context(|| format!("writing the profile to {}", path.display()))?;
        let sort = if self.activities.contains(&ProfilerActivity::Cuda) {
            SortBy::DeviceTotal
        } else {
            SortBy::CpuTotal
        };
        let table = profile.key_averages().table(sort, TABLE_ROWS);
        let timed = match (profile.device_timer(), profile.device_timer_fallback()) {
            (None, _) => String::new(),
            (Some(DeviceTimer::Cupti), _) => "; device time from CUPTI".to_owned(),
            (Some(_), Some(why)) => format!("; device time from CUDA events ({why})"),
            (Some(_), None) => "; device time from CUDA events".to_owned(),
        };
        let head = format!(
            "profile of {} after {} warm-up {}: {} (open it in https://ui.perfetto.dev or chrome://tracing){timed}",
            if self.profiled == 1 { "1 step".to_owned() } else { format!("{} steps", self.profiled) },
            self.warmup,
            if self.warmup == 1 { "step" } else { "steps" },
            path.display()
        );
        if self.json {
            eprintln!("{head}\n{table}");
        } else {
            println!("{head}\n{table}");
        }
        Ok(())
    }
}
