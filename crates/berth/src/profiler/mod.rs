//! A profiler in the spirit of `torch.profiler`
//! (<https://docs.pytorch.org/docs/stable/profiler.html>): start one, run a program, stop it,
//! and read what happened: every tensor op (name, device, shapes, dtype, bytes), every
//! host↔device and device↔device copy (bytes, GB/s, pinned or staged, stream), device time
//! per op and copy from CUDA events, allocator events (alloc, free, segment map/unmap, with
//! allocated and reserved bytes after each), each host wait with the op that caused it, and
//! [`record_function`] ranges.
//!
//! The result exports to a Chrome trace ([`Profile::export_chrome_trace`]; Perfetto and
//! `chrome://tracing` load it: a track per host thread, a track per CUDA stream, counter
//! tracks of allocated and reserved bytes per device) and summarises as
//! [`Profile::key_averages`] (`prof.key_averages().table(sort_by=...)`).
//!
//! Ops and copies are also `tracing` spans (target `berth::profiler`, names `op` and `copy`)
//! while a profiler is active, so a subscriber of your own sees them too; the profiler keeps
//! its own typed records ([`Records`]), which are what it exports.
//!
//! ```
//! use berth::profiler::{self, ProfilerActivity};
//! use berth::{Device, DType, Tensor};
//!
//! let prof = profiler::profile()
//!     .activities(&[ProfilerActivity::Cpu])
//!     .record_shapes(true)
//!     .profile_memory(true)
//!     .start()?;
//! let a = Tensor::ones(&[4, 4], DType::F32, Device::Cpu)?;
//! {
//!     let _step = profiler::record_function("step");
//!     let _b = a.matmul(&a)?.add(&a)?;
//! }
//! let profile = prof.stop()?;
//! assert_eq!(profile.records().ops.iter().filter(|o| o.name == "matmul").count(), 1);
//! println!("{}", profile.key_averages().table(profiler::SortBy::CpuTotal, 10));
//! # Ok::<(), berth::Error>(())
//! ```
//!
//! Note [Profiler off costs one load]: every kernel call goes through [`kernels_for`](crate::device_kernels::kernels_for), which
//! does one relaxed load of a global flag before anything else; with the flag clear it
//! returns the device's kernels as before. With it set, it returns a profiling wrapper of
//! them (one per device and op name, made once), which records the call. Copies and host
//! waits check the same flag; host storages, below the profiler, check the flag of
//! `crate::memory_events` instead, set while a profiler records memory
//! (`Note [Memory events are a leaf]`). The cost of the off path is measured by the
//! `profiler_off` criterion bench of this crate. One profiler is active at a time in a
//! process, and it sees every thread (DataLoader workers and prefetch threads included), as
//! `torch.profiler` does.

mod chrome;
pub(crate) mod device_time;
pub(crate) mod hooks;
pub(crate) mod kernels;
mod record;
mod table;

pub use record::{
    is_active, CopyKind, CopyRecord, DeviceSpan, MemoryAction, MemoryRecord, OpRecord, RangeRecord,
    Records, SyncRecord,
};
pub use table::{KeyAverage, KeyAverages, SortBy};

use crate::{Error, Result};
use std::sync::atomic::Ordering;
use std::sync::Mutex;

/// What a profiler records (`torch.profiler.ProfilerActivity`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ProfilerActivity {
    /// Host-side: ops, copies and ranges as seen from the calling thread.
    Cpu,
    /// Device-side: device time of CUDA ops and copies, from events on their streams.
    Cuda,
}

/// How activity `Cuda` measures device time (`Note [CUPTI device time]` in
/// `device_time.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum DeviceTimer {
    /// CUPTI's activity records where CUPTI loads, else CUDA events (the default).
    #[default]
    Auto,
    /// CUPTI's activity records (as `torch.profiler` through Kineto): one record per kernel,
    /// copy and memset, written by the driver; [`ProfilerBuilder::start`] fails without CUPTI.
    Cupti,
    /// A pair of CUDA events around each op and copy on its stream: works everywhere, but
    /// costs about one kernel launch of host time per op.
    CudaEvents,
}

impl DeviceTimer {
    /// `"auto"`, `"cupti"` or `"cuda_events"`.
    pub fn name(self) -> &'static str {
        match self {
            DeviceTimer::Auto => "auto",
            DeviceTimer::Cupti => "cupti",
            DeviceTimer::CudaEvents => "cuda_events",
        }
    }
}

/// Options of a profiler; see [`profile`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a builder does nothing until start()"]
pub struct ProfilerBuilder {
    cpu: bool,
    cuda: bool,
    record_shapes: bool,
    profile_memory: bool,
    device_timer: DeviceTimer,
}

/// A profiler builder with PyTorch's defaults: activities CPU and CUDA, no shapes, no memory.
pub fn profile() -> ProfilerBuilder {
    ProfilerBuilder {
        cpu: true,
        cuda: true,
        record_shapes: false,
        profile_memory: false,
        device_timer: DeviceTimer::Auto,
    }
}

impl ProfilerBuilder {
    /// The activities to record (`activities=[ProfilerActivity.CPU, ...]`). Ops and copies
    /// are recorded on the host whatever the list (the table needs them); `Cuda` adds their
    /// device time; without `Cpu` the Chrome trace leaves out the host tracks' ops, copies and
    /// ranges.
    pub fn activities(mut self, activities: &[ProfilerActivity]) -> Self {
        self.cpu = activities.contains(&ProfilerActivity::Cpu);
        self.cuda = activities.contains(&ProfilerActivity::Cuda);
        self
    }

    /// Whether to record the shapes of each op's inputs and output (`record_shapes`).
    pub fn record_shapes(mut self, on: bool) -> Self {
        self.record_shapes = on;
        self
    }

    /// Whether to record allocator events and counters (`profile_memory`).
    pub fn profile_memory(mut self, on: bool) -> Self {
        self.profile_memory = on;
        self
    }

    /// How activity `Cuda` measures device time ([`DeviceTimer::Auto`] by default).
    pub fn device_timer(mut self, timer: DeviceTimer) -> Self {
        self.device_timer = timer;
        self
    }

    /// Does the slow part of [`start`](Self::start) now, while nothing is recorded: with
    /// activity `Cuda` timed by CUPTI, loads CUPTI and attaches it to the driver (about 11 ms
    /// on an H200 host, 2026-12-02), so that the later start costs well under a millisecond and
    /// the first profiled steps run as unprofiled ones do. `torch.profiler`'s schedule does the
    /// same in its warm-up steps (Kineto's `prepareTrace`). Call it before a loop's timed part;
    /// it records nothing, and a profile's stop undoes it (`Note [Activity tracing]` in
    /// berth-cuda), so prepare again before the next profile. Without activity `Cuda`, or with
    /// [`DeviceTimer::CudaEvents`], it does nothing.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when [`DeviceTimer::Cupti`] was asked for and CUPTI cannot
    /// trace (the message says why). With [`DeviceTimer::Auto`] a CUPTI that cannot trace is
    /// not an error: `start` then falls back to CUDA events.
    pub fn prepare(&self) -> Result<()> {
        if !self.cuda || self.device_timer == DeviceTimer::CudaEvents {
            return Ok(());
        }
        match berth_cuda::activity::prepare() {
            Err(why) if self.device_timer == DeviceTimer::Cupti => {
                Err(cupti_refused("profiler::prepare", why))
            }
            _ => Ok(()),
        }
    }

    /// Starts profiling the whole process.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when another profiler is active, or when
    /// [`DeviceTimer::Cupti`] was asked for and CUPTI cannot trace (the message says why).
    pub fn start(self) -> Result<Profiler> {
        static START: Mutex<()> = Mutex::new(());
        let _g = record::lock(&START);
        if is_active() {
            return Err(Error::InvalidArgument {
                op: "profiler::start",
                what: "another profiler is active; stop it first (one per process)".into(),
            });
        }
        let _ = crate::cuda::set_host_wait_hook(hooks::host_wait);
        drop(record::take());
        device_time::clear();
        if self.cuda {
            device_time::begin(self.device_timer)
                .map_err(|why| cupti_refused("profiler::start", why))?;
        }
        record::RECORD_SHAPES.store(self.record_shapes, Ordering::Relaxed);
        record::PROFILE_MEMORY.store(self.profile_memory, Ordering::Relaxed);
        record::PROFILE_CUDA.store(self.cuda, Ordering::Relaxed);
        let start_ns = record::now_ns();
        let start_memory = if self.profile_memory {
            initial_memory()
        } else {
            Vec::new()
        };
        record::ACTIVE.store(true, Ordering::SeqCst);
        if self.profile_memory {
            crate::memory_events::listen(hooks::host_memory);
        }
        Ok(Profiler {
            cpu: self.cpu,
            start_ns,
            start_memory,
            stopped: false,
        })
    }
}

/// The error of `op` when [`DeviceTimer::Cupti`] was asked for and CUPTI cannot trace.
fn cupti_refused(op: &'static str, why: impl std::fmt::Display) -> Error {
    Error::InvalidArgument {
        op,
        what: format!(
            "device_timer(DeviceTimer::Cupti): {why}; use DeviceTimer::Auto to fall back to \
             CUDA events"
        ),
    }
}

/// The allocators' statistics when a profile starts, one record per device with an
/// allocator, so the counter tracks start at the right level.
fn initial_memory() -> Vec<MemoryRecord> {
    let thread = record::thread_id();
    let ts_ns = record::now_ns();
    let host = crate::storage::host_memory_allocated() as u64;
    let mut out = vec![MemoryRecord {
        device: crate::Device::Cpu,
        action: MemoryAction::Start,
        bytes: 0,
        allocated_bytes: host,
        reserved_bytes: host,
        thread,
        ts_ns,
    }];
    for d in crate::cuda::initialized_devices() {
        if let Some((allocated_bytes, reserved_bytes)) = hooks::cuda_stats(d) {
            out.push(MemoryRecord {
                device: crate::Device::Cuda(d as u16),
                action: MemoryAction::Start,
                bytes: 0,
                allocated_bytes,
                reserved_bytes,
                thread,
                ts_ns,
            });
        }
    }
    out
}

/// An active profiler; [`Profiler::stop`] ends it and returns what it recorded. Dropping it
/// without `stop` ends it and discards the records.
#[derive(Debug)]
#[must_use = "dropping the profiler stops it and discards what it recorded"]
pub struct Profiler {
    cpu: bool,
    start_ns: u64,
    start_memory: Vec<MemoryRecord>,
    stopped: bool,
}

impl Profiler {
    /// Stops profiling and returns the records. The device time still pending is resolved
    /// here: each CUDA device with such work is synchronised once (`Note [Device clock]` in
    /// `device_time.rs`).
    ///
    /// # Errors
    /// None today; the `Result` leaves room for device errors of the last synchronisation.
    pub fn stop(mut self) -> Result<Profile> {
        self.stopped = true;
        crate::memory_events::stop();
        record::ACTIVE.store(false, Ordering::SeqCst);
        let mut records = record::take();
        let mut memory = std::mem::take(&mut self.start_memory);
        memory.append(&mut records.memory);
        records.memory = memory;
        let timer = device_time::resolve(&mut records);
        Ok(Profile {
            cpu: self.cpu,
            device_timer: timer.as_ref().map(|t| t.timer),
            device_timer_fallback: timer.and_then(|t| t.fallback),
            start_ns: self.start_ns,
            end_ns: record::now_ns(),
            records,
            threads: record::thread_names(),
        })
    }
}

impl Drop for Profiler {
    fn drop(&mut self) {
        if !self.stopped {
            crate::memory_events::stop();
            record::ACTIVE.store(false, Ordering::SeqCst);
            drop(record::take());
            device_time::clear();
        }
    }
}

/// What one profiler recorded.
#[derive(Debug, Clone)]
pub struct Profile {
    cpu: bool,
    device_timer: Option<DeviceTimer>,
    device_timer_fallback: Option<String>,
    start_ns: u64,
    end_ns: u64,
    records: Records,
    threads: std::collections::BTreeMap<u64, String>,
}

impl Profile {
    /// The typed records. Times are nanoseconds on the profile's clock; the first memory
    /// record of each device in use ([`MemoryAction::Start`]) is its statistics when the
    /// profile started.
    pub fn records(&self) -> &Records {
        &self.records
    }

    /// When the profile started and stopped, in nanoseconds on its clock.
    pub fn span_ns(&self) -> (u64, u64) {
        (self.start_ns, self.end_ns)
    }

    /// How device time was measured: [`DeviceTimer::Cupti`] or [`DeviceTimer::CudaEvents`]
    /// (never `Auto`); `None` without activity `Cuda`.
    pub fn device_timer(&self) -> Option<DeviceTimer> {
        self.device_timer
    }

    /// Why [`DeviceTimer::Auto`] fell back to CUDA events (CUPTI's error), if it did.
    pub fn device_timer_fallback(&self) -> Option<&str> {
        self.device_timer_fallback.as_deref()
    }

    /// The names of the host threads that recorded something, by profiler thread id.
    pub fn thread_names(&self) -> &std::collections::BTreeMap<u64, String> {
        &self.threads
    }

    /// The Chrome trace of the profile (the JSON object format of
    /// <https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU>),
    /// which Perfetto and `chrome://tracing` load.
    pub fn chrome_trace(&self) -> serde_json::Value {
        chrome::trace(self)
    }

    /// Writes [`Profile::chrome_trace`] to `path` (`prof.export_chrome_trace(path)`).
    ///
    /// # Errors
    /// [`Error::Io`] when the file cannot be written.
    pub fn export_chrome_trace(&self, path: impl AsRef<std::path::Path>) -> Result<()> {
        let path = path.as_ref();
        let io = |source| Error::Io {
            op: "export_chrome_trace",
            path: path.display().to_string(),
            source,
        };
        let file = std::fs::File::create(path).map_err(io)?;
        let mut w = std::io::BufWriter::new(file);
        serde_json::to_writer(&mut w, &self.chrome_trace()).map_err(|e| io(e.into()))?;
        std::io::Write::flush(&mut w).map_err(io)
    }

    /// Statistics per op, copy direction and range name (`prof.key_averages()`).
    pub fn key_averages(&self) -> KeyAverages {
        table::key_averages(&self.records)
    }
}

/// A named range of the program, shown as a span on its thread's track and as a row of
/// [`Profile::key_averages`] (`torch.profiler.record_function`). The range ends when the
/// guard drops. Costs one load when no profiler is active.
pub fn record_function(name: impl Into<String>) -> RecordFunction {
    if !is_active() {
        return RecordFunction { open: None };
    }
    let name = name.into();
    record::open(name.clone());
    RecordFunction {
        open: Some((name, record::now_ns())),
    }
}

/// The guard of a [`record_function`] range.
#[derive(Debug)]
#[must_use = "the range ends when this guard drops"]
pub struct RecordFunction {
    open: Option<(String, u64)>,
}

impl Drop for RecordFunction {
    fn drop(&mut self) {
        if let Some((name, start_ns)) = self.open.take() {
            record::close();
            if is_active() {
                record::push_range(RangeRecord {
                    name,
                    thread: record::thread_id(),
                    start_ns,
                    end_ns: record::now_ns(),
                });
            }
        }
    }
}
