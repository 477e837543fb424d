//! `berth train --profile PATH`: profiles a few training steps after a warm-up with
//! [`berth::profiler`] (CPU and CUDA activities, shapes, memory), each step a
//! `record_function("step N")` range, then writes the Chrome trace to `PATH` and prints the
//! `key_averages()` table.

use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
    /// The value as typed on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Timer::Auto => "auto",
            Timer::Cupti => "cupti",
            Timer::Events => "events",
        }
    }

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

/// What the profiler cost the training loop outside the profiled steps, in the loop's own
/// thread: starting it (CUPTI's setup, the allocators' statistics) and stopping it (waiting for
/// the device, CUPTI's flush and teardown, resolving device spans). Writing the trace and the
/// table run on another thread (`Note [Export off the loop]`), so they are not in it.
#[derive(Debug, Clone, Copy, Default)]
struct Overhead {
    start: Duration,
    stop: Duration,
}

/// The written trace and its table, or the error writing it.
type Written = anyhow::Result<String>;

// Note [Export off the loop]: writing the Chrome trace and building the `key_averages()` table
// take milliseconds for a few steps and more for long profiles, and `berth train` times its
// epochs. So once the profiled steps are done the profile is stopped in the loop (stopping
// waits for the device and tears CUPTI down, which must happen before the next step's
// launches) and handed to a thread that writes the trace and formats the table; the loop goes
// on. The table is printed, and any error writing the trace reported, when training ends
// (`StepProfiler::finish`), so a failed write still fails the run.

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
    overhead: Overhead,
    writer: Option<JoinHandle<Written>>,
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
            overhead: Overhead::default(),
            writer: None,
        }
    }

    fn builder(&self) -> profiler::ProfilerBuilder {
        profiler::profile()
            .activities(&self.activities)
            .device_timer(self.timer.device_timer())
            .record_shapes(true)
            .profile_memory(true)
    }

    /// Called once before the first epoch: does the slow part of starting the profiler
    /// (loading and attaching CUPTI, [`profiler::ProfilerBuilder::prepare`]) outside the
    /// timed epochs, so the profiled steps and their epoch run as unprofiled ones do.
    ///
    /// # Errors
    /// `--profile-device-timer cupti` and CUPTI cannot trace.
    pub fn prepare(&self) -> anyhow::Result<()> {
        if self.path.is_some() {
            self.builder().prepare()?;
        }
        Ok(())
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
            let t = Instant::now();
            self.active = Some(self.builder().start()?);
            self.overhead.start = t.elapsed();
        }
        Ok(Some(profiler::record_function(format!("step {step}"))))
    }

    /// Called after a step that [`StepProfiler::before_step`] profiled: once the profiled
    /// steps are done, stops the profiler and starts writing its trace on another thread.
    ///
    /// # Errors
    /// Stopping the profiler.
    pub fn after_step(&mut self) -> anyhow::Result<()> {
        if self.active.is_some() {
            self.profiled += 1;
            if self.done() {
                self.stop()?;
            }
        }
        Ok(())
    }

    /// Stops an active profiler and hands its profile to the writing thread.
    fn stop(&mut self) -> anyhow::Result<()> {
        let (Some(p), Some(path)) = (self.active.take(), self.path.clone()) else {
            return Ok(());
        };
        let t = Instant::now();
        let profile = p.stop()?;
        self.overhead.stop = t.elapsed();
        let sort = if self.activities.contains(&ProfilerActivity::Cuda) {
            SortBy::DeviceTotal
        } else {
            SortBy::CpuTotal
        };
        let head = self.head(&profile, &path);
        self.writer = Some(std::thread::spawn(move || {
            profile
                .export_chrome_trace(&path)
                .with_context(|| format!("writing the profile to {}", path.display()))?;
            let table = profile.key_averages().table(sort, TABLE_ROWS);
            Ok(format!("{head}\n{table}"))
        }));
        Ok(())
    }

    /// The line above the table: what was profiled, where the trace is, how device time was
    /// measured and what starting and stopping the profiler cost the loop.
    fn head(&self, profile: &profiler::Profile, path: &std::path::Path) -> String {
        let timed = match (profile.device_timer(), profile.device_timer_fallback()) {
            (None, _) => String::new(),
            (Some(DeviceTimer::Cupti), _) => "; device time from CUPTI".to_owned(),
            (Some(_), Some(why)) => format!("; device time from CUDA events ({why})"),
            (Some(_), None) => "; device time from CUDA events".to_owned(),
        };
        format!(
            "profile of {} after {} warm-up {}: {} (open it in https://ui.perfetto.dev or chrome://tracing){timed}\n\
             profiler start {:.1} ms, stop {:.1} ms (in the training loop; the trace is written on another thread)",
            if self.profiled == 1 { "1 step".to_owned() } else { format!("{} steps", self.profiled) },
            self.warmup,
            if self.warmup == 1 { "step" } else { "steps" },
            path.display(),
            self.overhead.start.as_secs_f64() * 1e3,
            self.overhead.stop.as_secs_f64() * 1e3,
        )
    }

    /// At the end of training: stops a profiler still active (one profiling every step, or
    /// training shorter than its steps), waits for its trace to be written and prints its
    /// table (to stderr under `--json`, so stdout stays one JSON object).
    ///
    /// # Errors
    /// Stopping the profiler or writing the trace.
    pub fn finish(&mut self) -> anyhow::Result<()> {
        self.stop()?;
        let Some(writer) = self.writer.take() else {
            return Ok(());
        };
        let text = writer
            .join()
            .map_err(|_| anyhow::anyhow!("the thread writing the profile panicked"))??;
        if self.json {
            eprintln!("{text}");
        } else {
            println!("{text}");
        }
        Ok(())
    }
}
