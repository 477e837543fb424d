//! The profiler's typed records and the process-wide collector they are pushed into while a
//! profiler is active (see `Note [Profiler off costs one load]` in [`super`]).

use crate::{DType, Device};
use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Instant;

/// Whether a profiler is active: the one load every op does when profiling is off.
pub(crate) static ACTIVE: AtomicBool = AtomicBool::new(false);
/// Whether the active profiler records operand shapes (`record_shapes`).
pub(crate) static RECORD_SHAPES: AtomicBool = AtomicBool::new(false);
/// Whether the active profiler records allocator events (`profile_memory`).
pub(crate) static PROFILE_MEMORY: AtomicBool = AtomicBool::new(false);
/// Whether the active profiler times CUDA work with events (activity `Cuda`).
pub(crate) static PROFILE_CUDA: AtomicBool = AtomicBool::new(false);

/// Whether a profiler is active (one relaxed load).
#[inline(always)]
pub fn is_active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

static BASE: OnceLock<Instant> = OnceLock::new();

/// Nanoseconds since the first profiler of the process started: the host clock of every
/// record.
pub(crate) fn now_ns() -> u64 {
    let base = BASE.get_or_init(Instant::now);
    u64::try_from(base.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static THREAD: Cell<u64> = const { Cell::new(0) };
    /// The names of the ops and ranges open on this thread, innermost last: what a host
    /// sync is blamed on.
    static OPEN: RefCell<Vec<Cow<'static, str>>> = const { RefCell::new(Vec::new()) };
}

/// This thread's profiler id (1, 2, ... in the order threads first recorded something); the
/// first call registers the thread's name for the trace.
pub(crate) fn thread_id() -> u64 {
    THREAD.with(|t| {
        if t.get() == 0 {
            let id = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
            t.set(id);
            let name = std::thread::current()
                .name()
                .map_or_else(|| format!("thread {id}"), str::to_owned);
            lock(&THREAD_NAMES).insert(id, name);
        }
        t.get()
    })
}

static THREAD_NAMES: Mutex<BTreeMap<u64, String>> = Mutex::new(BTreeMap::new());

/// The registered names of profiler thread ids.
pub(crate) fn thread_names() -> BTreeMap<u64, String> {
    lock(&THREAD_NAMES).clone()
}

/// Marks `name` open on this thread until [`close`] (an op's name: no allocation).
pub(crate) fn open(name: impl Into<Cow<'static, str>>) {
    OPEN.with(|o| o.borrow_mut().push(name.into()));
}

/// Closes the innermost open op or range of this thread.
pub(crate) fn close() {
    OPEN.with(|o| {
        o.borrow_mut().pop();
    });
}

/// The ops and ranges open on this thread, outermost first.
pub(crate) fn open_stack() -> Vec<String> {
    OPEN.with(|o| o.borrow().iter().map(|n| n.to_string()).collect())
}

/// A span of device time: when a stream ran a piece of work, on the host clock of the records
/// (nanoseconds), aligned at the end of the profile (see `Note [Device clock]` in
/// `src/profiler/device_time.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceSpan {
    /// The CUDA device index.
    pub device: usize,
    /// The stream (its raw handle; the same value for every record of one stream).
    pub stream: u64,
    /// Start, in nanoseconds on the profile's clock.
    pub start_ns: u64,
    /// End, in nanoseconds on the profile's clock.
    pub end_ns: u64,
}

impl DeviceSpan {
    /// The span's duration, in nanoseconds.
    pub fn dur_ns(&self) -> u64 {
        self.end_ns.saturating_sub(self.start_ns)
    }
}

/// One tensor op: one kernel call of a device.
#[derive(Debug, Clone, PartialEq)]
pub struct OpRecord {
    /// The op's name (PyTorch's where there is one: `add`, `matmul`, `clone`, `fill_`).
    pub name: &'static str,
    /// The device the kernel ran on.
    pub device: Device,
    /// The output's dtype.
    pub dtype: DType,
    /// The shapes of the inputs, in argument order (empty unless `record_shapes`).
    pub input_shapes: Vec<Vec<usize>>,
    /// The output's shape (empty unless `record_shapes`).
    pub output_shape: Vec<usize>,
    /// Bytes the op read from its inputs (elements of their views × element size).
    pub bytes_read: u64,
    /// Bytes the op wrote (elements of the output view × element size).
    pub bytes_written: u64,
    /// The profiler thread id of the calling thread.
    pub thread: u64,
    /// Host start, in nanoseconds on the profile's clock.
    pub start_ns: u64,
    /// Host end (the kernel was launched or, on the CPU, ran), in nanoseconds.
    pub end_ns: u64,
    /// When the device ran it (CUDA ops under activity `Cuda`; `None` otherwise).
    pub device_span: Option<DeviceSpan>,
}

/// The direction of a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum CopyKind {
    /// Host to device (`cuMemcpyHtoDAsync`).
    HostToDevice,
    /// Device to host (`cuMemcpyDtoHAsync`).
    DeviceToHost,
    /// Within one device (`cuMemcpyDtoDAsync`).
    DeviceToDevice,
    /// Between two devices (`cuMemcpyPeerAsync`).
    Peer,
}

impl CopyKind {
    /// The short name used in traces and tables (`HtoD`, `DtoH`, `DtoD`, `PtoP`, as Nsight).
    pub fn name(self) -> &'static str {
        match self {
            CopyKind::HostToDevice => "HtoD",
            CopyKind::DeviceToHost => "DtoH",
            CopyKind::DeviceToDevice => "DtoD",
            CopyKind::Peer => "PtoP",
        }
    }
}

/// One host↔device or device↔device copy of tensor memory.
#[derive(Debug, Clone, PartialEq)]
pub struct CopyRecord {
    /// Direction.
    pub kind: CopyKind,
    /// Bytes copied.
    pub bytes: u64,
    /// Whether the host side was pinned (one DMA); `false` for a pageable host side, which
    /// is staged through pinned blocks. Always `true` for device↔device.
    pub pinned: bool,
    /// The CUDA device whose stream ran the copy.
    pub device: usize,
    /// The stream (raw handle).
    pub stream: u64,
    /// Whether the host waited for the copy (a blocking copy).
    pub blocking: bool,
    /// The profiler thread id of the calling thread.
    pub thread: u64,
    /// Host start, in nanoseconds on the profile's clock.
    pub start_ns: u64,
    /// Host end (queued, or landed for a blocking copy), in nanoseconds.
    pub end_ns: u64,
    /// When the stream ran it (activity `Cuda`).
    pub device_span: Option<DeviceSpan>,
}

impl CopyRecord {
    /// Throughput in GB/s (10^9 bytes per second) over the device span, or over the host span
    /// when there is none; `None` for a zero duration.
    pub fn gbps(&self) -> Option<f64> {
        let ns = match self.device_span {
            Some(d) => d.dur_ns(),
            None => self.end_ns.saturating_sub(self.start_ns),
        };
        (ns > 0).then(|| self.bytes as f64 / ns as f64)
    }
}

/// What the allocator did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MemoryAction {
    /// The allocator's statistics when the profile started (`bytes` is 0): where the counter
    /// tracks begin.
    Start,
    /// A tensor storage was allocated.
    Alloc,
    /// A tensor storage was freed (returned to its allocator).
    Free,
    /// The allocator's reserved bytes grew (segments allocated or pages mapped).
    SegmentMap,
    /// The allocator's reserved bytes shrank (segments freed or pages unmapped).
    SegmentUnmap,
}

impl MemoryAction {
    /// The lowercase name used in traces (`start`, `alloc`, `free`, `segment_map`,
    /// `segment_unmap`).
    pub fn name(self) -> &'static str {
        match self {
            MemoryAction::Start => "start",
            MemoryAction::Alloc => "alloc",
            MemoryAction::Free => "free",
            MemoryAction::SegmentMap => "segment_map",
            MemoryAction::SegmentUnmap => "segment_unmap",
        }
    }
}

/// One allocator event, with the allocator's statistics right after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryRecord {
    /// The device (`cpu` for host storages).
    pub device: Device,
    /// What happened.
    pub action: MemoryAction,
    /// Bytes of the storage (alloc/free) or the change of reserved bytes (segments).
    pub bytes: u64,
    /// The allocator's allocated bytes after the event (CUDA: `allocated_bytes.all.current`;
    /// CPU: `host_memory_allocated()`).
    pub allocated_bytes: u64,
    /// The allocator's reserved bytes after the event (CUDA: `reserved_bytes.all.current`;
    /// CPU: equal to allocated, the system allocator caches nothing berth sees).
    pub reserved_bytes: u64,
    /// The profiler thread id of the calling thread.
    pub thread: u64,
    /// When, in nanoseconds on the profile's clock.
    pub ts_ns: u64,
}

/// One host wait on device work.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncRecord {
    /// The sync point (`item`, `to_vec`, `copy_dtoh`), or `None` for a wait asked for by name
    /// (`synchronize()`).
    pub point: Option<&'static str>,
    /// The innermost op or `record_function` range open on the thread when it waited (the
    /// op that caused the wait: `to` for `item()` on CUDA, whose copy to the host blocks).
    pub cause: Option<String>,
    /// Every op and range open on the thread then, outermost first (`["step 3", "to"]`).
    pub stack: Vec<String>,
    /// The profiler thread id of the waiting thread.
    pub thread: u64,
    /// When, in nanoseconds on the profile's clock.
    pub ts_ns: u64,
}

/// One `record_function` range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeRecord {
    /// The name given to `record_function`.
    pub name: String,
    /// The profiler thread id of the thread.
    pub thread: u64,
    /// Start, in nanoseconds on the profile's clock.
    pub start_ns: u64,
    /// End, in nanoseconds on the profile's clock.
    pub end_ns: u64,
}

/// Everything one profile recorded, in the order the records completed.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Records {
    /// Tensor ops.
    pub ops: Vec<OpRecord>,
    /// Copies.
    pub copies: Vec<CopyRecord>,
    /// Allocator events.
    pub memory: Vec<MemoryRecord>,
    /// Host waits.
    pub syncs: Vec<SyncRecord>,
    /// `record_function` ranges.
    pub ranges: Vec<RangeRecord>,
}

/// The collector: what the active profiler recorded so far.
pub(crate) static RECORDS: Mutex<Records> = Mutex::new(Records {
    ops: Vec::new(),
    copies: Vec::new(),
    memory: Vec::new(),
    syncs: Vec::new(),
    ranges: Vec::new(),
});

/// Locks a collector mutex, taking it over when a panicking thread poisoned it (records are
/// plain data: a half-pushed record cannot exist).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Pushes an op (returns its index, for its device span).
pub(crate) fn push_op(op: OpRecord) -> usize {
    let mut r = lock(&RECORDS);
    r.ops.push(op);
    r.ops.len() - 1
}

/// Pushes a copy (returns its index, for its device span).
pub(crate) fn push_copy(c: CopyRecord) -> usize {
    let mut r = lock(&RECORDS);
    r.copies.push(c);
    r.copies.len() - 1
}

/// Pushes allocator events.
pub(crate) fn push_memory(m: impl IntoIterator<Item = MemoryRecord>) {
    lock(&RECORDS).memory.extend(m);
}

/// Pushes a host wait.
pub(crate) fn push_sync(s: SyncRecord) {
    lock(&RECORDS).syncs.push(s);
}

/// Pushes a range.
pub(crate) fn push_range(r: RangeRecord) {
    lock(&RECORDS).ranges.push(r);
}

/// Takes everything recorded, leaving the collector empty.
pub(crate) fn take() -> Records {
    std::mem::take(&mut *lock(&RECORDS))
}

thread_local! {
    /// Set while the profiler itself waits (its clocks), so those waits are not recorded.
    static INTERNAL: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` as the profiler's own work: host waits inside are not recorded (the host-wait
/// hook asks [`in_internal`]).
pub(crate) fn internal<R>(f: impl FnOnce() -> R) -> R {
    let was = INTERNAL.with(|i| i.replace(true));
    let r = f();
    INTERNAL.with(|i| i.set(was));
    r
}

/// Whether this thread is inside [`internal`].
pub(crate) fn in_internal() -> bool {
    INTERNAL.with(Cell::get)
}
