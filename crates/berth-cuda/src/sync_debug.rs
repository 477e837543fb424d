//! Sync points: `set_sync_debug_mode` (`torch.cuda.set_sync_debug_mode`) and counters of host
//! waits (each `.item()` is one: <https://github.com/meta-pytorch/torchtune/pull/522>).
//!
//! A *sync point* is an operation that blocks the host until device work has run without the
//! caller asking for a synchronisation by name: `item()`, `to_vec()` and blocking device→host
//! copies. berth's tensor and transfer code calls [`sync_point`] right before blocking; in
//! [`SyncDebugMode::Warn`] it prints one line naming the op, in [`SyncDebugMode::Error`] it
//! fails with [`CudaError::SyncDebug`]. Calls the user makes by name (`synchronize()`,
//! `Event::synchronize`, `Stream::synchronize`) are never reported, as in PyTorch; every host
//! wait, reported or not, is counted in [`host_waits`].
//!
//! The mode is **per thread** (PyTorch's is per process): a DataLoader worker or a parallel
//! test cannot turn another thread's loop into errors.

use crate::CudaError;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// A function told about every host wait: the sync point's op (`Some("item")`) or `None` for
/// a wait the caller asked for by name (`synchronize()`). berth's profiler installs one.
pub type HostWaitHook = fn(Option<&'static str>);

static HOOK: OnceLock<HostWaitHook> = OnceLock::new();

/// Installs the process's [`HostWaitHook`], called on the waiting thread right before each
/// host wait is counted. Only the first call installs; later calls return `false`. The hook
/// runs on every wait, so it must be cheap (berth's profiler checks one flag and returns).
pub fn set_host_wait_hook(hook: HostWaitHook) -> bool {
    HOOK.set(hook).is_ok()
}

/// What to do at a sync point.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SyncDebugMode {
    /// Do nothing (the default; PyTorch's `"default"` / 0).
    #[default]
    Off,
    /// Print `berth: warning: synchronizing CUDA operation: <op>` to stderr (PyTorch's
    /// `"warn"` / 1).
    Warn,
    /// Fail the operation with [`CudaError::SyncDebug`] (PyTorch's `"error"` / 2).
    Error,
}

static HOST_WAITS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    static MODE: Cell<SyncDebugMode> = const { Cell::new(SyncDebugMode::Off) };
    static THREAD_WAITS: Cell<u64> = const { Cell::new(0) };
    static REPORTS: RefCell<Vec<&'static str>> = const { RefCell::new(Vec::new()) };
}

/// Sets this thread's sync-debug mode.
pub fn set_sync_debug_mode(mode: SyncDebugMode) {
    MODE.with(|m| m.set(mode));
}

/// This thread's sync-debug mode.
pub fn get_sync_debug_mode() -> SyncDebugMode {
    MODE.with(Cell::get)
}

/// Host waits on device work in the whole process (COUNT): sync points and explicit
/// `synchronize()` calls alike.
pub fn host_waits() -> u64 {
    HOST_WAITS.load(Ordering::Relaxed)
}

/// Host waits made by the calling thread (COUNT). A loop of 1000 `item()` calls adds 1000 here;
/// accumulating on the device and reading once adds 1
/// (<https://github.com/meta-pytorch/torchtune/pull/522>).
pub fn thread_host_waits() -> u64 {
    THREAD_WAITS.with(Cell::get)
}

/// The ops reported at sync points on this thread while the mode was `Warn` or `Error`,
/// oldest first; the list is emptied.
pub fn take_sync_reports() -> Vec<&'static str> {
    REPORTS.with(|r| std::mem::take(&mut *r.borrow_mut()))
}

/// Counts one host wait asked for by name (`synchronize()`).
pub(crate) fn count_host_wait() {
    count_wait(None);
}

/// Counts one host wait, `op` naming the sync point (`None`: asked for by name), after telling
/// the [`HostWaitHook`].
fn count_wait(op: Option<&'static str>) {
    if let Some(hook) = HOOK.get() {
        hook(op);
    }
    HOST_WAITS.fetch_add(1, Ordering::Relaxed);
    THREAD_WAITS.with(|w| w.set(w.get() + 1));
}

/// Declares a sync point named `op` that is about to block the host: reports it according to
/// the mode, then counts the wait. Call it before blocking (tensor code: `item`, `to_vec`,
/// blocking `to(cpu)`).
///
/// # Errors
/// [`CudaError::SyncDebug`] in [`SyncDebugMode::Error`]; the caller must not block then.
pub fn sync_point(op: &'static str) -> Result<(), CudaError> {
    match get_sync_debug_mode() {
        SyncDebugMode::Off => {}
        SyncDebugMode::Warn => {
            REPORTS.with(|r| r.borrow_mut().push(op));
            eprintln!("berth: warning: synchronizing CUDA operation: {op}");
        }
        SyncDebugMode::Error => {
            REPORTS.with(|r| r.borrow_mut().push(op));
            return Err(CudaError::SyncDebug { op });
        }
    }
    count_wait(Some(op));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Host waits are counted and reported per sync-debug mode:
    /// <https://github.com/meta-pytorch/torchtune/pull/522>
    #[test]
    fn sync_points_are_reported_per_mode_and_counted() {
        let before = thread_host_waits();
        sync_point("item").unwrap();
        assert!(take_sync_reports().is_empty(), "Off reports nothing");
        set_sync_debug_mode(SyncDebugMode::Warn);
        sync_point("to_vec").unwrap();
        set_sync_debug_mode(SyncDebugMode::Error);
        assert_eq!(sync_point("item"), Err(CudaError::SyncDebug { op: "item" }));
        set_sync_debug_mode(SyncDebugMode::Off);
        assert_eq!(take_sync_reports(), vec!["to_vec", "item"]);
        assert_eq!(
            thread_host_waits() - before,
            2,
            "the refused wait is not counted"
        );
    }
}
