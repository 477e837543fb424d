//! Device activity tracing with CUPTI: the start and end of every kernel, copy and memset the
//! GPU ran, tagged with an id of the caller's (an *external correlation id*), as PyTorch's
//! profiler gets its device times (Kineto over CUPTI).
//!
//! Note [Activity tracing]: timing each op with a pair of CUDA events costs two
//! `cuEventRecord` calls on the launch path and two `cuEventElapsedTime` calls later, about as
//! much host time as launching the op itself; in a host-bound loop that more than doubles a
//! step. CUPTI's activity API instead writes one record per kernel, copy and memset into
//! buffers it hands back on its own thread
//! (<https://docs.nvidia.com/cupti/main/main.html#cupti-activity-api>). A caller brackets its
//! work with [`push_external_id`] and [`pop_external_id`]
//! (`cuptiActivityPushExternalCorrelationId`); every driver or runtime call made in between is
//! tied to that id by an external-correlation record, and the kernel or copy it launched by
//! CUPTI's own correlation id, so [`ActivityTrace::stop`] hands back device spans per external
//! id. The driver and runtime API records that carry the correlation are enabled too (CUPTI
//! writes external-correlation records only beside API records) and dropped when parsed.
//!
//! Clock: CUPTI's timestamps are nanoseconds on its own clock (`cuptiGetTimestamp`). When a
//! trace starts, the caller's clock and CUPTI's are read back to back three times and the
//! tightest pair fixes the offset, so a span is on the caller's clock to within that pair's
//! gap (well under a microsecond).
//!
//! Teardown: once enabled, CUPTI's instrumentation of the driver stays in place after its
//! activities are disabled, and every later launch pays part of its cost: PyTorch measured
//! training 10–20% slower after a profile had ended until Kineto called `cuptiFinalize`
//! (<https://github.com/pytorch/pytorch/pull/146604>). [`ActivityTrace::stop`] (and dropping
//! a trace) therefore calls `cuptiFinalize` after the last flush, and the next
//! [`start_trace`] registers its buffer callbacks again. `BERTH_CUPTI_TEARDOWN=0` keeps CUPTI
//! attached (as Kineto's `TEARDOWN_CUPTI=0`), for measuring what the teardown saves.
//!
//! Loading: CUPTI is found at run time like the driver (cudarc's dynamic loading, by the names
//! `libcupti.so`, `libcupti.so.13`, … on the library path). If it is not on the path, the
//! CUDA toolkit's usual places are tried (`$CUDA_HOME`, `$CUDA_PATH`, `/usr/local/cuda`, each
//! with `extras/CUPTI/lib64`, `lib64` and `targets/x86_64-linux/lib`). No CUPTI, or a CUPTI
//! that refuses (another tool holds it, or profiling is not permitted), is an
//! [`ActivityError`], and callers fall back to events.
//!
//! Cost: on the H200 host (one measurement, 2026-12-01, every step of `berth train --device
//! cuda` profiled, medians of two runs each), the host-bound loop ran about 1.7× slower with
//! every kind on, 1.5× with the kernel, copy and memset records alone, and 1.4× with the API and
//! correlation records alone: CUPTI roughly doubles the host cost of each launch, whichever
//! records are kept. To repeat such a measurement, `BERTH_CUPTI_KINDS` (comma-separated:
//! `kernel`, `memcpy`, `memset`, `driver`, `runtime`, `external`) enables only the kinds named
//! (then spans may not reach their ops), and `BERTH_CUPTI_ALL_API_RECORDS=1` keeps the API
//! records of every driver and runtime call, not only of those that queue device work.

use std::sync::atomic::{AtomicBool, Ordering};

/// What a [`DeviceActivity`] was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ActivityKind {
    /// A kernel (`CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL`).
    Kernel,
    /// A copy (`CUPTI_ACTIVITY_KIND_MEMCPY`).
    Memcpy,
    /// A memset (`CUPTI_ACTIVITY_KIND_MEMSET`).
    Memset,
}

/// One piece of device work as CUPTI timed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceActivity {
    /// Kernel, copy or memset.
    pub kind: ActivityKind,
    /// The innermost id [`push_external_id`] had pushed on the launching thread.
    pub external_id: u64,
    /// The CUDA device (CUPTI's `deviceId`).
    pub device: u32,
    /// Start on the clock given to [`start_trace`], nanoseconds.
    pub start_ns: u64,
    /// End on that clock, nanoseconds (≥ `start_ns`).
    pub end_ns: u64,
    /// Bytes copied or set (0 for kernels).
    pub bytes: u64,
}

/// Why activity tracing cannot run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ActivityError {
    /// No CUPTI library was found, or berth was built without CUDA.
    #[error("CUPTI is not available: {reason}")]
    Unavailable {
        /// What was looked for, and where.
        reason: String,
    },
    /// A CUPTI call failed (for instance `CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED` when
    /// another profiler holds CUPTI, or `CUPTI_ERROR_INSUFFICIENT_PRIVILEGES`).
    #[error("CUPTI call {op} failed: {code}")]
    Cupti {
        /// The CUPTI function.
        op: &'static str,
        /// CUPTI's result code, by name.
        code: String,
    },
    /// A trace is already running; one per process.
    #[error("a CUPTI activity trace is already running; stop it first (one per process)")]
    Busy,
}

/// Set while a trace runs: [`push_external_id`] and [`pop_external_id`] do nothing otherwise.
static TRACING: AtomicBool = AtomicBool::new(false);

/// A running activity trace; [`ActivityTrace::stop`] ends it and returns what the device ran.
/// Dropping it without `stop` ends it and discards the records.
#[derive(Debug)]
#[must_use = "dropping the trace stops it and discards its records"]
pub struct ActivityTrace {
    /// Caller's clock minus CUPTI's, nanoseconds.
    offset_ns: i128,
    stopped: bool,
}

/// Starts tracing the device activity of the whole process. `now_ns` is the caller's clock;
/// the spans [`ActivityTrace::stop`] returns are on it.
///
/// # Errors
/// [`ActivityError::Unavailable`] without CUPTI, [`ActivityError::Cupti`] when CUPTI refuses,
/// [`ActivityError::Busy`] while another trace runs.
pub fn start_trace(now_ns: fn() -> u64) -> Result<ActivityTrace, ActivityError> {
    if TRACING
        .compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        return Err(ActivityError::Busy);
    }
    match imp::start(now_ns) {
        Ok(offset_ns) => Ok(ActivityTrace {
            offset_ns,
            stopped: false,
        }),
        Err(e) => {
            TRACING.store(false, Ordering::SeqCst);
            Err(e)
        }
    }
}

/// Does the slow part of [`start_trace`] ahead of it: loads CUPTI and attaches it to the
/// driver (`cuptiActivityRegisterCallbacks`, about 11 ms on an H200 host, 2026-12-02), without
/// enabling any record, so that a later [`start_trace`] costs well under a millisecond and the
/// first traced work runs as it would untraced. Kineto does the same in a profiler schedule's
/// warm-up steps (`prepareTrace`, <https://github.com/pytorch/kineto>). Idempotent; a trace's
/// teardown (`Note [Activity tracing]`) undoes it, so prepare again before the next trace.
///
/// # Errors
/// As [`start_trace`]: [`ActivityError::Unavailable`] without CUPTI, [`ActivityError::Cupti`]
/// when CUPTI refuses.
pub fn prepare() -> Result<(), ActivityError> {
    imp::prepare()
}

/// Tags the device work the calling thread launches from now on with `id`, until the matching
/// [`pop_external_id`] (ids nest: the innermost wins). Does nothing while no trace runs.
#[inline]
pub fn push_external_id(id: u64) {
    if TRACING.load(Ordering::Relaxed) {
        imp::push(id);
    }
}

/// Ends the innermost [`push_external_id`] of the calling thread. Does nothing while no trace
/// runs.
#[inline]
pub fn pop_external_id() {
    if TRACING.load(Ordering::Relaxed) {
        imp::pop();
    }
}

impl ActivityTrace {
    /// Ends the trace and returns every kernel, copy and memset launched under an external id
    /// while it ran, in no particular order. Work still queued is not waited for: synchronise
    /// the devices first (`crate::synchronize`) to have all of it. CUPTI is then detached
    /// (`cuptiFinalize`, see Teardown above) unless `BERTH_CUPTI_TEARDOWN=0`.
    pub fn stop(mut self) -> Vec<DeviceActivity> {
        self.stopped = true;
        let raw = imp::stop();
        TRACING.store(false, Ordering::SeqCst);
        let on_caller = |t: u64| -> u64 {
            u64::try_from((i128::from(t) + self.offset_ns).max(0)).unwrap_or(u64::MAX)
        };
        raw.activities
            .into_iter()
            .filter_map(|a| {
                let external_id = *raw.externals.get(&a.correlation)?;
                let start_ns = on_caller(a.start);
                Some(DeviceActivity {
                    kind: a.kind,
                    external_id,
                    device: a.device,
                    start_ns,
                    end_ns: on_caller(a.end).max(start_ns),
                    bytes: a.bytes,
                })
            })
            .collect()
    }
}

impl Drop for ActivityTrace {
    fn drop(&mut self) {
        if !self.stopped {
            drop(imp::stop());
            TRACING.store(false, Ordering::SeqCst);
        }
    }
}

/// An activity record as parsed, on CUPTI's clock, before its correlation is resolved.
#[derive(Debug, Clone, Copy)]
struct RawActivity {
    kind: ActivityKind,
    correlation: u32,
    device: u32,
    start: u64,
    end: u64,
    bytes: u64,
}

/// What the buffers of one trace held.
#[derive(Debug, Default)]
struct Collected {
    activities: Vec<RawActivity>,
    /// CUPTI correlation id → external id.
    externals: std::collections::HashMap<u32, u64>,
}

#[cfg(feature = "cuda")]
mod imp {
    use super::{ActivityError, ActivityKind, Collected, RawActivity};
    use cudarc::cupti::result::activity;
    use cudarc::cupti::sys::{self, CUpti_ActivityKind as Kind};
    use std::alloc::{alloc, dealloc, Layout};
    use std::sync::Mutex;

    /// What the completed buffers held so far.
    static COLLECTED: Mutex<Option<Collected>> = Mutex::new(None);
    /// Whether the buffer callbacks are registered with the CUPTI now loaded.
    static REGISTERED: Mutex<bool> = Mutex::new(false);
    /// The activity kinds enabled while a trace runs.
    const KINDS: [Kind; 6] = [
        Kind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
        Kind::CUPTI_ACTIVITY_KIND_MEMCPY,
        Kind::CUPTI_ACTIVITY_KIND_MEMSET,
        Kind::CUPTI_ACTIVITY_KIND_DRIVER,
        Kind::CUPTI_ACTIVITY_KIND_RUNTIME,
        Kind::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION,
    ];
    /// Bytes per activity buffer (CUPTI's samples use 8 MiB; 4 MiB holds about 20 000 kernel
    /// records).
    const BUFFER_BYTES: usize = 4 << 20;
    /// `CUPTI_ACTIVITY_FLAG_FLUSH_FORCED`: hand back partly filled buffers too.
    const FLUSH_FORCED: u32 = 1;
    const EXTERNAL_KIND: sys::CUpti_ExternalCorrelationKind =
        sys::CUpti_ExternalCorrelationKind::CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0;

    fn lock() -> std::sync::MutexGuard<'static, Option<Collected>> {
        COLLECTED.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn layout() -> Layout {
        // 4 MiB aligned to 8: a valid layout.
        Layout::from_size_align(BUFFER_BYTES, 8).unwrap_or(Layout::new::<u64>())
    }

    fn cupti_err(op: &'static str, e: cudarc::cupti::result::CuptiError) -> ActivityError {
        ActivityError::Cupti {
            op,
            code: format!("{:?}", e.0),
        }
    }

    /// Makes CUPTI loadable: on the library path already, or from the toolkit's usual places
    /// (loaded globally and kept, so cudarc's load by soname finds it).
    fn ensure_loaded() -> Result<(), ActivityError> {
        // SAFETY: loading CUPTI runs its initialisers, which are sound to run any time.
        if unsafe { sys::is_culib_present() } {
            return Ok(());
        }
        let mut roots: Vec<std::path::PathBuf> = ["CUDA_HOME", "CUDA_PATH"]
            .iter()
            .filter_map(|v| std::env::var_os(v).map(Into::into))
            .collect();
        roots.push("/usr/local/cuda".into());
        let mut tried = Vec::new();
        for root in &roots {
            for dir in ["extras/CUPTI/lib64", "lib64", "targets/x86_64-linux/lib"] {
                for name in ["libcupti.so", "libcupti.so.13", "libcupti.so.12"] {
                    let path = root.join(dir).join(name);
                    if !path.exists() {
                        continue;
                    }
                    tried.push(path.display().to_string());
                    // SAFETY: as above; RTLD_GLOBAL so the later load by name resolves to it.
                    let lib = unsafe {
                        libloading::os::unix::Library::open(
                            Some(&path),
                            libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
                        )
                    };
                    if let Ok(lib) = lib {
                        // Kept for the life of the process, as cudarc keeps its own handle.
                        std::mem::forget(lib);
                        // SAFETY: as above.
                        if unsafe { sys::is_culib_present() } {
                            return Ok(());
                        }
                    }
                }
            }
        }
        Err(ActivityError::Unavailable {
            reason: format!(
                "no libcupti on the library path (LD_LIBRARY_PATH) nor under {} ({}); \
                 add the CUDA toolkit's CUPTI directory to LD_LIBRARY_PATH",
                roots
                    .iter()
                    .map(|r| r.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
                if tried.is_empty() {
                    "none found".to_owned()
                } else {
                    format!("found but not loadable: {}", tried.join(", "))
                }
            ),
        })
    }

    unsafe extern "C" fn buffer_requested(
        buffer: *mut *mut u8,
        size: *mut usize,
        max_records: *mut usize,
    ) {
        // SAFETY: CUPTI passes valid out-pointers; a null buffer tells it to drop records.
        unsafe {
            let p = alloc(layout());
            *buffer = p;
            *size = if p.is_null() { 0 } else { BUFFER_BYTES };
            *max_records = 0;
        }
    }

    /// Reads field `$f` of the record at `$p` viewed as `$t` (CUPTI's records are packed).
    macro_rules! field {
        ($p:expr, $t:ty, $f:ident) => {
            // SAFETY: `$p` points at a live record of kind `$t` or a later version of it,
            // whose leading fields are `$t`'s.
            unsafe { std::ptr::addr_of!((*($p as *const $t)).$f).read_unaligned() }
        };
    }

    fn parse(buffer: *mut u8, valid: usize, into: &mut Collected) {
        let mut record: *mut sys::CUpti_Activity = std::ptr::null_mut();
        loop {
            // SAFETY: `buffer` holds `valid` bytes of records written by CUPTI.
            if unsafe { activity::get_next_record(buffer, valid, &mut record) }.is_err() {
                break;
            }
            // SAFETY: every record starts with its kind, a u32.
            let kind = unsafe { (record as *const u32).read_unaligned() };
            let r = record as *const u8;
            match kind {
                k if k == Kind::CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL as u32
                    || k == Kind::CUPTI_ACTIVITY_KIND_KERNEL as u32 =>
                {
                    into.activities.push(RawActivity {
                        kind: ActivityKind::Kernel,
                        correlation: field!(r, sys::CUpti_ActivityKernel9, correlationId),
                        device: field!(r, sys::CUpti_ActivityKernel9, deviceId),
                        start: field!(r, sys::CUpti_ActivityKernel9, start),
                        end: field!(r, sys::CUpti_ActivityKernel9, end),
                        bytes: 0,
                    });
                }
                k if k == Kind::CUPTI_ACTIVITY_KIND_MEMCPY as u32 => {
                    into.activities.push(RawActivity {
                        kind: ActivityKind::Memcpy,
                        correlation: field!(r, sys::CUpti_ActivityMemcpy5, correlationId),
                        device: field!(r, sys::CUpti_ActivityMemcpy5, deviceId),
                        start: field!(r, sys::CUpti_ActivityMemcpy5, start),
                        end: field!(r, sys::CUpti_ActivityMemcpy5, end),
                        bytes: field!(r, sys::CUpti_ActivityMemcpy5, bytes),
                    });
                }
                k if k == Kind::CUPTI_ACTIVITY_KIND_MEMSET as u32 => {
                    into.activities.push(RawActivity {
                        kind: ActivityKind::Memset,
                        correlation: field!(r, sys::CUpti_ActivityMemset, correlationId),
                        device: field!(r, sys::CUpti_ActivityMemset, deviceId),
                        start: field!(r, sys::CUpti_ActivityMemset, start),
                        end: field!(r, sys::CUpti_ActivityMemset, end),
                        bytes: field!(r, sys::CUpti_ActivityMemset, bytes),
                    });
                }
                k if k == Kind::CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION as u32 => {
                    let ext_kind = field!(r, sys::CUpti_ActivityExternalCorrelation, externalKind);
                    if ext_kind == EXTERNAL_KIND {
                        into.externals.insert(
                            field!(r, sys::CUpti_ActivityExternalCorrelation, correlationId),
                            field!(r, sys::CUpti_ActivityExternalCorrelation, externalId),
                        );
                    }
                }
                _ => {}
            }
        }
    }

    unsafe extern "C" fn buffer_completed(
        _context: cudarc::driver::sys::CUcontext,
        _stream_id: u32,
        buffer: *mut u8,
        _size: usize,
        valid: usize,
    ) {
        if buffer.is_null() {
            return;
        }
        if let Some(c) = lock().as_mut() {
            parse(buffer, valid, c);
        }
        // SAFETY: `buffer` came from `buffer_requested`, with this layout.
        unsafe { dealloc(buffer, layout()) };
    }

    fn cupti_now() -> Option<u64> {
        let mut t = 0u64;
        // SAFETY: `t` is a valid out-pointer.
        unsafe { cudarc::cupti::result::get_timestamp(&mut t) }
            .ok()
            .map(|()| t)
    }

    /// Loads CUPTI and registers the buffer callbacks unless they are registered (at the
    /// first start, or the first after a teardown).
    pub(super) fn prepare() -> Result<(), ActivityError> {
        ensure_loaded()?;
        let mut registered = REGISTERED.lock().unwrap_or_else(|p| p.into_inner());
        if !*registered {
            activity::register_callbacks(Some(buffer_requested), Some(buffer_completed))
                .map_err(|e| cupti_err("cuptiActivityRegisterCallbacks", e))?;
            *registered = true;
        }
        Ok(())
    }

    pub(super) fn start(now_ns: fn() -> u64) -> Result<i128, ActivityError> {
        prepare()?;
        *lock() = Some(Collected::default());
        let kinds = enabled_kinds();
        for (i, kind) in kinds.iter().enumerate() {
            if let Err(e) = activity::enable(*kind) {
                for k in &kinds[..i] {
                    let _ = activity::disable(*k);
                }
                *lock() = None;
                return Err(cupti_err("cuptiActivityEnable", e));
            }
        }
        if std::env::var_os("BERTH_CUPTI_ALL_API_RECORDS").is_none() {
            keep_only_launch_api_records();
        }
        // The tightest of three back-to-back readings fixes the offset.
        let mut best: Option<(u64, i128)> = None;
        for _ in 0..3 {
            let before = now_ns();
            let Some(c) = cupti_now() else { continue };
            let after = now_ns();
            let gap = after.saturating_sub(before);
            let offset = i128::from(before + gap / 2) - i128::from(c);
            if best.is_none_or(|(g, _)| gap < g) {
                best = Some((gap, offset));
            }
        }
        match best {
            Some((_, offset)) => Ok(offset),
            None => {
                drop(stop());
                Err(ActivityError::Cupti {
                    op: "cuptiGetTimestamp",
                    code: "failed".into(),
                })
            }
        }
    }

    /// [`KINDS`], or for measuring what each kind costs, the subset named in
    /// `BERTH_CUPTI_KINDS` (comma-separated: `kernel`, `memcpy`, `memset`, `driver`, `runtime`,
    /// `external`; without `driver`/`runtime` and `external` no span can be tied to an op).
    fn enabled_kinds() -> Vec<Kind> {
        let Ok(list) = std::env::var("BERTH_CUPTI_KINDS") else {
            return KINDS.to_vec();
        };
        let names = [
            "kernel", "memcpy", "memset", "driver", "runtime", "external",
        ];
        KINDS
            .iter()
            .zip(names)
            .filter(|(_, n)| list.split(',').any(|w| w.trim() == *n))
            .map(|(k, _)| *k)
            .collect()
    }

    /// Highest callback id tried per API domain (CUDA 13.0 has about 760 driver and 500
    /// runtime ones; an id with no name is skipped).
    const MAX_CBID: u32 = 2048;

    /// Whether API records of the function `name` are kept: the calls that put work on a
    /// device, whose records carry the external correlation of the kernels and copies.
    fn queues_work(name: &str) -> bool {
        ["Launch", "Memcpy", "Memset", "Graph"]
            .iter()
            .any(|k| name.contains(k))
    }

    /// Turns off the API records of every driver and runtime function that queues no device
    /// work (context, stream, event and attribute calls: most of berth's calls per op), so
    /// that CUPTI writes one API record per launch or copy, not one per driver call
    /// (`cuptiActivityEnableDriverApi`, `cuptiActivityEnableRuntimeApi`). Failures leave
    /// those records on, which costs time, not correctness.
    fn keep_only_launch_api_records() {
        use sys::CUpti_CallbackDomain as D;
        for (domain, set) in [
            (
                D::CUPTI_CB_DOMAIN_DRIVER_API,
                sys::cuptiActivityEnableDriverApi as unsafe fn(u32, u8) -> sys::CUptiResult,
            ),
            (
                D::CUPTI_CB_DOMAIN_RUNTIME_API,
                sys::cuptiActivityEnableRuntimeApi,
            ),
        ] {
            for cbid in 1..MAX_CBID {
                let mut name: *const std::ffi::c_char = std::ptr::null();
                // SAFETY: `name` is a valid out-pointer; CUPTI sets it to a static string.
                let named =
                    unsafe { cudarc::cupti::result::get_callback_name(domain, cbid, &mut name) };
                if named.is_err() || name.is_null() {
                    continue;
                }
                // SAFETY: a NUL-terminated static string from CUPTI.
                let n = unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy();
                if !queues_work(&n) {
                    // SAFETY: a plain CUPTI call on a callback id it named.
                    let _ = unsafe { set(cbid, 0) };
                }
            }
        }
    }

    pub(super) fn push(id: u64) {
        let _ = activity::push_external_correlation_id(EXTERNAL_KIND, id);
    }

    pub(super) fn pop() {
        let mut last = 0u64;
        // SAFETY: `last` is a valid out-pointer.
        let _ = unsafe { activity::pop_external_correlation_id(EXTERNAL_KIND, &mut last) };
    }

    pub(super) fn stop() -> Collected {
        let _ = activity::flush_all(FLUSH_FORCED);
        for k in &enabled_kinds() {
            let _ = activity::disable(*k);
        }
        // Records of the last moment may arrive with the flush of the disable.
        let _ = activity::flush_all(FLUSH_FORCED);
        let collected = lock().take().unwrap_or_default();
        if teardown() {
            // Detach CUPTI (Note [Activity tracing], teardown): the next start registers the
            // buffer callbacks again.
            let mut registered = REGISTERED.lock().unwrap_or_else(|p| p.into_inner());
            if cudarc::cupti::result::finalize().is_ok() {
                *registered = false;
            }
        }
        collected
    }

    /// Whether `stop` tears CUPTI down: yes unless `BERTH_CUPTI_TEARDOWN=0`.
    fn teardown() -> bool {
        std::env::var("BERTH_CUPTI_TEARDOWN").map_or(true, |v| v.trim() != "0")
    }
}

#[cfg(not(feature = "cuda"))]
mod imp {
    use super::{ActivityError, Collected};

    pub(super) fn prepare() -> Result<(), ActivityError> {
        Err(ActivityError::Unavailable {
            reason: "berth was built without the `cuda` feature".into(),
        })
    }

    pub(super) fn start(_now_ns: fn() -> u64) -> Result<i128, ActivityError> {
        prepare().map(|()| 0)
    }

    pub(super) fn push(_id: u64) {}

    pub(super) fn pop() {}

    pub(super) fn stop() -> Collected {
        Collected::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clock() -> u64 {
        7
    }

    /// Without a GPU (or CUPTI) a trace does not start, with a reason, and the id calls are
    /// no-ops; a second start while one runs is `Busy`.
    #[test]
    fn push_and_pop_are_no_ops_without_a_trace() {
        push_external_id(3);
        pop_external_id();
        match start_trace(clock) {
            Ok(t) => {
                assert_eq!(start_trace(clock).unwrap_err(), ActivityError::Busy);
                assert!(t.stop().is_empty(), "no work was tagged");
            }
            Err(ActivityError::Unavailable { reason }) => assert!(!reason.is_empty()),
            Err(e) => eprintln!("CUPTI refused here: {e}"),
        }
    }
}
