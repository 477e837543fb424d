//! Sleep and wake of tagged device memory through the per-device registry: what
//! `berth_torch.sleep` / `wake` / `sleeping_bytes` and berth's own tensors use
//! (`Note [Sleep and wake]` in berth-alloc's `paged` module).
//!
//! Tag allocations with [`TagGuard`] (`berth_torch.region(tag)` in Python) while they are made;
//! [`sleep`] gives the tags' device memory back to the driver, copying the live blocks of the
//! tags named in `offload` to page-locked host memory first, and keeps their virtual addresses;
//! [`wake`] maps memory again at the same addresses and copies the backups back, so tensors, raw
//! pointers and CUDA graphs taken before the sleep stay valid. The contents of a tag slept
//! without offload are lost (its addresses are kept). Memory that NCCL registered at a sleeping
//! address must be registered again after the wake (the physical pages are new).
//! Only the `paged` policy can sleep: the others answer [`berth_alloc::AllocError::PolicyLacks`].
//! The same rules as vLLM's sleep mode
//! (<https://github.com/vllm-project/vllm/blob/main/vllm/device_allocator/cumem.py>) and
//! sglang's `torch_memory_saver`, over berth's own allocator.

use std::sync::{Arc, Mutex, MutexGuard};

use berth_alloc::host::{BackupMemory, SimHostBackend};
pub use berth_alloc::tags::{current_tag, SleepReport, SleepStats, TagGuard, WakeReport};

use crate::backup_memory::CudaBackupMemory;
use crate::memory::{allocator, is_simulated, CudaDeviceArg};
use crate::CudaError;

/// The process's backup memory (`Note [Backup host memory]`), made in the context of the
/// first device that offloads.
static BACKUPS: Mutex<Option<Arc<CudaBackupMemory>>> = Mutex::new(None);

fn backups_lock() -> MutexGuard<'static, Option<Arc<CudaBackupMemory>>> {
    BACKUPS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Host memory for the backups: page-locked CUDA host memory
/// (`Note [Backup host memory]`), or simulated host memory (up to 64 TiB) under
/// [`crate::memory::simulate`].
fn backup_memory() -> Result<Arc<dyn BackupMemory>, CudaError> {
    if is_simulated() {
        return Ok(Arc::new(SimHostBackend::new(1 << 46)));
    }
    let mut b = backups_lock();
    if let Some(m) = b.as_ref() {
        return Ok(Arc::clone(m) as Arc<dyn BackupMemory>);
    }
    let device = crate::current_device()?;
    crate::bind_context(device)?;
    let m = Arc::new(CudaBackupMemory::new(device));
    m.set_keep(KEEP.load(std::sync::atomic::Ordering::Relaxed));
    *b = Some(Arc::clone(&m));
    Ok(m)
}

/// Whether the host memory of backups freed by [`wake`] is kept page-locked for the next
/// [`sleep`] (`true`) or given back to the system (`false`, the default). Keeping it makes
/// every sleep after the first skip page-locking (which costs more than the copy itself:
/// `Note [Backup host memory]`) at the price of holding that host memory while awake;
/// [`kept_host_bytes`] says how much, [`release_host_memory`] frees it.
pub fn keep_host_memory(keep: bool) {
    if let Some(m) = backups_lock().as_ref() {
        m.set_keep(keep);
    }
    KEEP.store(keep, std::sync::atomic::Ordering::Relaxed);
}

/// The setting of [`keep_host_memory`], applied to the backup memory when it is made.
static KEEP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Host memory kept page-locked by [`keep_host_memory`] and not in use by a sleeping tag, in
/// bytes. Waits first for the backups that earlier wakes are still freeing in the background
/// (`Note [Backup host memory]`).
pub fn kept_host_bytes() -> u64 {
    backups_lock().as_ref().map_or(0, |m| m.kept_bytes())
}

/// Frees the host memory kept by [`keep_host_memory`]; returns the bytes freed. Backups of
/// tags still asleep are not touched. Waits first for the backups that earlier wakes are
/// still freeing in the background.
///
/// # Errors
/// [`CudaError::Driver`] when unregistering or freeing fails (those buffers stay kept).
pub fn release_host_memory() -> Result<u64, CudaError> {
    let m = backups_lock().clone();
    m.map_or(Ok(0), |m| m.release_kept())
}

/// Puts the tags `tags` of `device` to sleep: the live blocks of the tags in `offload` (a
/// subset of `tags`) are copied to page-locked host memory, then every page of every tag in
/// `tags` is unmapped and released to the driver. Synchronises the device first.
///
/// # Errors
/// The registry's errors ([`CudaError::InvalidDevice`], [`CudaError::Unavailable`], ...), and
/// [`CudaError::Alloc`] carrying the policy's: `InvalidTag`, `UnknownTag`, `AlreadyAsleep`,
/// `OffloadNotSlept` (an `offload` tag not in `tags`), `SleepDuringCapture`, `OffloadFailed`
/// (no host memory: nothing was released), `PolicyLacks` (a policy other than `paged`).
pub fn sleep(
    device: impl CudaDeviceArg,
    tags: &[&str],
    offload: &[&str],
) -> Result<SleepReport, CudaError> {
    let device = device.cuda_index()?;
    let a = allocator(device)?;
    let host = if offload.is_empty() {
        None
    } else {
        Some(backup_memory()?)
    };
    a.sleep(tags, offload, host)
        .map_err(|source| CudaError::Alloc { device, source })
}

/// Wakes the sleeping tags `tags` of `device`: maps device memory again at the same
/// addresses and copies the offloaded blocks back. Returns once the copies are done; unless
/// [`keep_host_memory`] is on, the backups' host memory is then freed by a background thread
/// (`Note [Backup host memory]`).
///
/// # Errors
/// The registry's errors, and [`CudaError::Alloc`] carrying the policy's: `UnknownTag`,
/// `NotAsleep`, `SleepDuringCapture`, `WakeFailed` (no device memory: every tag stays asleep
/// with its backups), `PolicyLacks`.
pub fn wake(device: impl CudaDeviceArg, tags: &[&str]) -> Result<WakeReport, CudaError> {
    let device = device.cuda_index()?;
    allocator(device)?
        .wake(tags)
        .map_err(|source| CudaError::Alloc { device, source })
}

/// `device`'s sleeping figures: bytes given back by sleeping tags, their live bytes, the host
/// bytes holding backups, the sleeping tags. All zero for a policy that cannot sleep.
///
/// # Errors
/// The registry's errors.
pub fn sleep_stats(device: impl CudaDeviceArg) -> Result<SleepStats, CudaError> {
    Ok(allocator(device)?.sleep_stats())
}
