//! The per-device allocator registry and the memory API of `torch.cuda` (BUG-11/12/13/22).
//!
//! One [`CachingAllocator`] over [`CudaBackend`] per device serves every CUDA tensor; it is
//! built on the first allocation on that device, with the configuration of `BERTH_ALLOC_CONF`
//! (PyTorch's `PYTORCH_CUDA_ALLOC_CONF` syntax). The statistics functions never build one:
//! asking `memory_allocated(1)` before anything ran on cuda:1 answers 0 and creates no context
//! (PyTorch #4936, BUG-12). [`empty_cache`] acts on every device that has an allocator and on
//! no other (BUG-22).
//!
//! One pinned [`HostCachingAllocator`] over [`CudaHostBackend`] serves every pinned tensor.

use crate::backend::CudaBackend;
use crate::pinned::CudaHostBackend;
use crate::{check_device, driver::driver, CudaError};
use berth_alloc::caching::CachingAllocator;
use berth_alloc::{AllocatorConfig, DeviceAllocator, HostCachingAllocator, MemoryStats};
use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};

/// The caching allocator of one CUDA device.
pub type CudaAllocator = CachingAllocator<CudaBackend>;

/// The pinned host allocator.
pub type PinnedAllocator = HostCachingAllocator<CudaHostBackend>;

static DEVICES: OnceLock<Vec<OnceLock<CudaAllocator>>> = OnceLock::new();
static HOST: OnceLock<PinnedAllocator> = OnceLock::new();
static INIT: Mutex<()> = Mutex::new(());

fn slots() -> Option<&'static [OnceLock<CudaAllocator>]> {
    let count = driver().ok()?;
    Some(DEVICES.get_or_init(|| (0..count).map(|_| OnceLock::new()).collect()))
}

fn config() -> Result<AllocatorConfig, CudaError> {
    AllocatorConfig::from_env().map_err(|e| CudaError::InvalidArgument {
        op: "BERTH_ALLOC_CONF",
        what: e.to_string(),
    })
}

/// The caching allocator of `device`, built on first use (which creates the device's context).
///
/// # Errors
/// [`CudaError::InvalidDevice`], [`CudaError::Unavailable`], [`CudaError::Driver`], or
/// [`CudaError::InvalidArgument`] for a bad `BERTH_ALLOC_CONF`.
pub fn allocator(device: usize) -> Result<&'static CudaAllocator, CudaError> {
    check_device(device)?;
    let slot = slots()
        .and_then(|s| s.get(device))
        .ok_or(CudaError::InvalidDevice {
            index: device,
            count: driver()?,
        })?;
    if let Some(a) = slot.get() {
        return Ok(a);
    }
    let _g = INIT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(a) = slot.get() {
        return Ok(a);
    }
    let backend = CudaBackend::new(device)?;
    let alloc = CachingAllocator::with_config(backend, config()?).map_err(|e| {
        CudaError::InvalidArgument {
            op: "BERTH_ALLOC_CONF",
            what: e.to_string(),
        }
    })?;
    alloc.set_device_index(device as i32);
    Ok(slot.get_or_init(|| alloc))
}

/// The allocator of `device` if it was built; never builds one.
pub fn existing_allocator(device: usize) -> Option<&'static CudaAllocator> {
    DEVICES.get()?.get(device)?.get()
}

fn stats(device: usize) -> Result<Option<MemoryStats>, CudaError> {
    check_device(device)?;
    Ok(existing_allocator(device).map(DeviceAllocator::stats))
}

/// Bytes held by live allocations on `device` (`torch.cuda.memory_allocated(i)`); 0 before
/// the device's first allocation (nothing is initialised to answer).
///
/// # Errors
/// [`CudaError::InvalidDevice`] ("device index 5 is out of range [0, 1)", BUG-20) or
/// [`CudaError::Unavailable`].
pub fn memory_allocated(device: usize) -> Result<u64, CudaError> {
    Ok(stats(device)?.map_or(0, |s| s.memory_allocated()))
}

/// Bytes reserved from the driver by `device`'s allocator (`memory_reserved`).
///
/// # Errors
/// As [`memory_allocated`].
pub fn memory_reserved(device: usize) -> Result<u64, CudaError> {
    Ok(stats(device)?.map_or(0, |s| s.memory_reserved()))
}

/// Peak of [`memory_allocated`] since start or the last [`reset_peak_memory_stats`].
///
/// # Errors
/// As [`memory_allocated`].
pub fn max_memory_allocated(device: usize) -> Result<u64, CudaError> {
    Ok(stats(device)?.map_or(0, |s| s.max_memory_allocated()))
}

/// Peak of [`memory_reserved`].
///
/// # Errors
/// As [`memory_allocated`].
pub fn max_memory_reserved(device: usize) -> Result<u64, CudaError> {
    Ok(stats(device)?.map_or(0, |s| s.max_memory_reserved()))
}

/// Sets every peak of `device` to its current value (`reset_peak_memory_stats`).
///
/// # Errors
/// As [`memory_allocated`].
pub fn reset_peak_memory_stats(device: usize) -> Result<(), CudaError> {
    check_device(device)?;
    if let Some(a) = existing_allocator(device) {
        a.reset_peak_memory_stats();
    }
    Ok(())
}

/// PyTorch's flat statistics map (`torch.cuda.memory_stats(i)`); empty before the device's
/// first allocation, as PyTorch's.
///
/// # Errors
/// As [`memory_allocated`].
pub fn memory_stats(device: usize) -> Result<BTreeMap<String, i64>, CudaError> {
    check_device(device)?;
    Ok(existing_allocator(device)
        .map(|a| a.memory_stats())
        .unwrap_or_default())
}

/// PyTorch's table (`torch.cuda.memory_summary(i)`).
///
/// # Errors
/// As [`memory_allocated`].
pub fn memory_summary(device: usize, abbreviated: bool) -> Result<String, CudaError> {
    check_device(device)?;
    let s = stats(device)?.unwrap_or_else(|| MemoryStats::new(None));
    Ok(berth_alloc::summary::memory_summary(
        &s,
        device as i32,
        abbreviated,
    ))
}

/// Returns every entirely free cached segment of every initialised device to the driver
/// (`torch.cuda.empty_cache()`); never initialises a device (BUG-12, BUG-22).
///
/// # Errors
/// [`CudaError::Driver`] wrapped as text when a free fails (`InvalidArgument` naming
/// `empty_cache`).
pub fn empty_cache() -> Result<(), CudaError> {
    let Some(slots) = DEVICES.get() else {
        return Ok(());
    };
    for a in slots.iter().filter_map(OnceLock::get) {
        a.empty_cache().map_err(|e| CudaError::InvalidArgument {
            op: "empty_cache",
            what: e.to_string(),
        })?;
    }
    Ok(())
}

/// The pinned host allocator, built on first use in the context of the thread's current device.
///
/// # Errors
/// [`CudaError::Unavailable`], [`CudaError::Driver`], [`CudaError::InvalidArgument`] for a bad
/// `BERTH_ALLOC_CONF`.
pub fn host_allocator() -> Result<&'static PinnedAllocator, CudaError> {
    if let Some(h) = HOST.get() {
        return Ok(h);
    }
    let cfg = config()?;
    let _g = INIT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(h) = HOST.get() {
        return Ok(h);
    }
    let backend = CudaHostBackend::new()?;
    Ok(HOST.get_or_init(|| HostCachingAllocator::with_config(backend, (&cfg).into())))
}

/// Whether `ptr` is pinned memory (what `is_pinned()` of a host tensor asks). Never creates the
/// host allocator or a context (BUG-06): before any pinning nothing is pinned by berth.
pub fn is_pinned_ptr(ptr: *const u8) -> bool {
    HOST.get().is_some_and(|h| h.is_pinned(ptr))
}

/// Frees every cached pinned block (`torch._C._host_emptyCache()`); a no-op before the first
/// pinning.
///
/// # Errors
/// [`CudaError::InvalidArgument`] naming `host_empty_cache` when a free fails.
pub fn host_empty_cache() -> Result<(), CudaError> {
    match HOST.get() {
        Some(h) => h.empty_cache().map_err(|e| CudaError::InvalidArgument {
            op: "host_empty_cache",
            what: e.to_string(),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bug_12_statistics_and_empty_cache_initialise_nothing() {
        let before = crate::contexts_created();
        empty_cache().unwrap();
        host_empty_cache().unwrap();
        assert!(!is_pinned_ptr([1u8, 2].as_ptr()));
        if !crate::is_available() {
            let _g = crate::testing::fake_device_count(1);
            assert_eq!(memory_allocated(0), Ok(0));
            assert_eq!(memory_reserved(0), Ok(0));
            assert!(memory_stats(0).unwrap().is_empty());
            assert_eq!(
                memory_allocated(5),
                Err(CudaError::InvalidDevice { index: 5, count: 1 })
            );
            assert!(existing_allocator(0).is_none());
        }
        assert_eq!(crate::contexts_created(), before);
    }
}
