//! The per-device allocator registry and the memory API of `torch.cuda`
//! (<https://pytorch.org/docs/stable/notes/cuda.html#memory-management>).
//!
//! # Note [One allocator registry]
//! One [`DeviceAllocator`] over [`CudaBackend`] per device serves all device memory of the
//! process: berth's CUDA tensors, PyTorch's allocations through `berth_torch` (its hooks call
//! [`allocator`]), and the CLI. It is built on the first allocation on that device, by
//! [`berth_alloc::device_allocator`], with the configuration [`configure`] set or, when none
//! was set, the environment's ([`AllocatorConfig::from_env`]: `BERTH_ALLOC_CONF`, else
//! PyTorch's `PYTORCH_ALLOC_CONF`, else `PYTORCH_CUDA_ALLOC_CONF`, all in PyTorch's syntax):
//! `backend:paged`
//! (berth's [`PagedBestFit`](berth_alloc::PagedBestFit)) or `backend:native` (PyTorch's caching
//! allocator, `expandable_segments:True` for its expandable segments); without `backend:` the
//! policy is [`Policy::DEFAULT`](berth_alloc::Policy::DEFAULT) unless an option of PyTorch's
//! policy is set ([`AllocatorConfig::policy`]). A device without virtual-memory management
//! gets PyTorch's policy when none was chosen, and an error when `paged` or expandable
//! segments were (`Note [Policy without virtual memory]` in `berth_alloc::policy`). The
//! configuration is fixed once the first allocator is built (PyTorch's allocator pointer is
//! set once too: RMM's `per_device_resource` and c10's `CUDACachingAllocator::get()` are the
//! models). Every function below works the same for each policy.
//!
//! [`simulate`] (a test switch) puts simulated devices behind the same registry, so the
//! PyTorch bridge's tests run without a GPU.
//!
//! The functions take the device the way PyTorch's do (`memory_allocated(device=None)`): an
//! index (`0usize`, `0u16`, `0i32`), `None::<usize>` for the current device, or, through berth,
//! a `Device` ([`CudaDeviceArg`]). The statistics functions never build an allocator: asking
//! `memory_allocated(1)` before anything ran on cuda:1 answers 0 and creates no context
//! (<https://github.com/pytorch/pytorch/pull/4936>). [`empty_cache`] acts on every device that
//! has an allocator and on no other (<https://github.com/pytorch/pytorch/issues/25752>).
//!
//! One pinned [`HostCachingAllocator`] over [`CudaHostBackend`] serves every pinned tensor.

use crate::backend::CudaBackend;
use crate::pinned::CudaHostBackend;
use crate::registry::PerDevice;
use crate::{check_device, current_device, CudaError};
use berth_alloc::backend::sim::SimBackend;
use berth_alloc::{
    device_allocator, AllocatorConfig, DeviceAllocator, HostCachingAllocator, MemorySnapshot,
    MemoryStats,
};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};

/// The allocator of one CUDA device, whichever policy `BERTH_ALLOC_CONF` chose.
pub type CudaAllocator = Arc<dyn DeviceAllocator>;

/// The pinned host allocator.
pub type PinnedAllocator = HostCachingAllocator<CudaHostBackend>;

/// How many simulated devices [`simulate`] offers.
pub const SIMULATED_DEVICES: usize = 16;

/// Each device's allocator with the backend under it (kept for [`existing_backend`]).
static DEVICES: PerDevice<(CudaBackend, CudaAllocator)> = PerDevice::new();
static HOST: OnceLock<PinnedAllocator> = OnceLock::new();
static HOST_INIT: Mutex<()> = Mutex::new(());
/// The configuration every device allocator is built with: set by [`configure`], else read
/// from `BERTH_ALLOC_CONF` at the first build; `fixed` from the first build on.
static CONFIG: Mutex<Option<Configured>> = Mutex::new(None);

struct Configured {
    config: AllocatorConfig,
    /// An allocator was (or is being) built with it.
    fixed: bool,
}
static SIMULATED: OnceLock<Simulated> = OnceLock::new();

/// The simulated devices of [`simulate`]: a [`SimBackend`] of `capacity` bytes and its
/// allocator per device, built on first use.
struct Simulated {
    capacity: u64,
    devices: [OnceLock<(Arc<SimBackend>, CudaAllocator)>; SIMULATED_DEVICES],
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A device argument of the memory functions, as PyTorch's `device=None | int | torch.device`.
///
/// Implemented for indices (`usize`, `u16`, `i32`; a negative `i32` is
/// [`CudaError::InvalidArgument`]), for `Option<T>` (`None` = the thread's current device, as
/// PyTorch's default), and in berth for `Device` (`cuda:i`; `cuda` = the current device; any
/// other kind is [`CudaError::NotCuda`]).
pub trait CudaDeviceArg {
    /// The device index this argument names (not yet checked against the device count).
    ///
    /// # Errors
    /// [`CudaError::NotCuda`], [`CudaError::InvalidArgument`], or the errors of
    /// [`current_device`] for "the current device".
    fn cuda_index(self) -> Result<usize, CudaError>;
}

impl CudaDeviceArg for usize {
    fn cuda_index(self) -> Result<usize, CudaError> {
        Ok(self)
    }
}

impl CudaDeviceArg for u16 {
    fn cuda_index(self) -> Result<usize, CudaError> {
        Ok(usize::from(self))
    }
}

impl CudaDeviceArg for i32 {
    fn cuda_index(self) -> Result<usize, CudaError> {
        usize::try_from(self).map_err(|_| CudaError::InvalidArgument {
            op: "device",
            what: format!(
                "device index {self} is negative; use 0 or more, or None for the current device"
            ),
        })
    }
}

impl<T: CudaDeviceArg> CudaDeviceArg for Option<T> {
    fn cuda_index(self) -> Result<usize, CudaError> {
        match self {
            Some(d) => d.cuda_index(),
            None => current_device(),
        }
    }
}

fn index(device: impl CudaDeviceArg) -> Result<usize, CudaError> {
    let i = device.cuda_index()?;
    if SIMULATED.get().is_some() {
        if i >= SIMULATED_DEVICES {
            return Err(CudaError::InvalidDevice {
                index: i,
                count: SIMULATED_DEVICES,
            });
        }
        return Ok(i);
    }
    check_device(i)?;
    Ok(i)
}

/// The configuration the device allocators use: the one [`configure`] set or the first build
/// fixed, else `BERTH_ALLOC_CONF`'s (read now).
///
/// # Errors
/// [`CudaError::Config`] for a malformed `BERTH_ALLOC_CONF`.
pub fn config() -> Result<AllocatorConfig, CudaError> {
    match &*lock(&CONFIG) {
        Some(c) => Ok(c.config.clone()),
        None => Ok(AllocatorConfig::from_env()?),
    }
}

/// Sets the configuration (policy and options) of every device allocator of the process, in
/// place of `BERTH_ALLOC_CONF`; what `berth_torch.use_allocator(policy, options)` calls, with
/// [`berth_alloc::Policy::config`]'s result. Setting the configuration already in use is a
/// no-op.
///
/// # Errors
/// [`CudaError::AllocatorConfigured`] once an allocator was built with another configuration
/// (`Note [One allocator registry]`).
pub fn configure(config: AllocatorConfig) -> Result<(), CudaError> {
    let mut slot = lock(&CONFIG);
    match &*slot {
        Some(c) if c.fixed && c.config == config => Ok(()),
        Some(c) if c.fixed => Err(CudaError::AllocatorConfigured {
            in_use: describe(&c.config),
            requested: describe(&config),
        }),
        _ => {
            *slot = Some(Configured {
                config,
                fixed: false,
            });
            Ok(())
        }
    }
}

/// `paged`, or `pytorch with max_split_size_mb:512` (the options as written).
fn describe(c: &AllocatorConfig) -> String {
    if c.conf_string.trim().is_empty() {
        c.policy_name().to_owned()
    } else {
        format!("{} ({})", c.policy_name(), c.conf_string.trim())
    }
}

/// The configuration of the first build, fixed for the process.
fn config_for_build() -> Result<AllocatorConfig, CudaError> {
    let mut slot = lock(&CONFIG);
    let c = match slot.take() {
        Some(c) => c.config,
        None => AllocatorConfig::from_env()?,
    };
    *slot = Some(Configured {
        config: c.clone(),
        fixed: true,
    });
    Ok(c)
}

/// Builds `device`'s allocator: the configured policy over a [`CudaBackend`].
fn build(device: usize) -> Result<(CudaBackend, CudaAllocator), CudaError> {
    let cfg = config_for_build()?;
    let backend = CudaBackend::new(device)?;
    let a = device_allocator(backend.clone(), cfg, device as i32)
        .map_err(|source| CudaError::Alloc { device, source })?;
    Ok((backend, a))
}

/// The allocator of `device`, built on first use (which creates the device's context).
///
/// # Errors
/// [`CudaError::InvalidDevice`], [`CudaError::Unavailable`], [`CudaError::Driver`],
/// [`CudaError::Config`] for a bad `BERTH_ALLOC_CONF`, [`CudaError::Alloc`] when a chosen policy
/// cannot run on the device (`backend:paged` or `expandable_segments:True` without virtual
/// memory support).
pub fn allocator(device: impl CudaDeviceArg) -> Result<&'static CudaAllocator, CudaError> {
    let device = index(device)?;
    if let Some(sim) = SIMULATED.get() {
        return sim_allocator(sim, device).map(|(_, a)| a);
    }
    DEVICES.get_or_try_init(device, build).map(|(_, a)| a)
}

fn sim_allocator(
    sim: &'static Simulated,
    device: usize,
) -> Result<&'static (Arc<SimBackend>, CudaAllocator), CudaError> {
    let slot = &sim.devices[device];
    if let Some(built) = slot.get() {
        return Ok(built);
    }
    static BUILD: Mutex<()> = Mutex::new(());
    let _g = lock(&BUILD);
    if let Some(built) = slot.get() {
        return Ok(built);
    }
    let backend = Arc::new(SimBackend::new(sim.capacity));
    let a = device_allocator(Arc::clone(&backend), config_for_build()?, device as i32)
        .map_err(|source| CudaError::Alloc { device, source })?;
    Ok(slot.get_or_init(|| (backend, a)))
}

/// The allocator of `device` if it was built; never builds one.
pub fn existing_allocator(device: usize) -> Option<&'static CudaAllocator> {
    match SIMULATED.get() {
        Some(sim) => sim.devices.get(device)?.get().map(|(_, a)| a),
        None => DEVICES.get(device).map(|(_, a)| a),
    }
}

/// The driver backend under `device`'s allocator if it was built (never under [`simulate`]):
/// what [`ipc`](crate::ipc) exports memory from.
pub(crate) fn existing_backend(device: usize) -> Option<&'static CudaBackend> {
    match SIMULATED.get() {
        Some(_) => None,
        None => DEVICES.get(device).map(|(b, _)| b),
    }
}

/// Every built allocator with its device index, in index order.
pub fn built_allocators() -> Vec<(usize, &'static CudaAllocator)> {
    match SIMULATED.get() {
        Some(sim) => sim
            .devices
            .iter()
            .enumerate()
            .filter_map(|(i, d)| d.get().map(|(_, a)| (i, a)))
            .collect(),
        None => DEVICES.built().map(|(i, (_, a))| (i, a)).collect(),
    }
}

/// Test switch: from now on the registry serves [`SIMULATED_DEVICES`] simulated devices of
/// `capacity_bytes` each ([`SimBackend`], events completing only when
/// [`simulated_backend`]'s `complete_events_on` says so) instead of CUDA, so code over the
/// registry (the PyTorch bridge's hooks) is tested without a GPU. Memory only: the pointers
/// are not device memory, so no kernel or copy may touch them. Setting the same capacity again
/// is a no-op.
///
/// # Errors
/// [`CudaError::AllocatorConfigured`] once a CUDA allocator was built, or when simulating with
/// another capacity already.
pub fn simulate(capacity_bytes: u64) -> Result<(), CudaError> {
    let _g = lock(&CONFIG);
    if let Some(sim) = SIMULATED.get() {
        if sim.capacity == capacity_bytes {
            return Ok(());
        }
        return Err(CudaError::AllocatorConfigured {
            in_use: format!("simulated devices of {} bytes", sim.capacity),
            requested: format!("simulated devices of {capacity_bytes} bytes"),
        });
    }
    if DEVICES.built().next().is_some() {
        return Err(CudaError::AllocatorConfigured {
            in_use: "CUDA devices".to_owned(),
            requested: "simulated devices".to_owned(),
        });
    }
    let _ = SIMULATED.set(Simulated {
        capacity: capacity_bytes,
        devices: std::array::from_fn(|_| OnceLock::new()),
    });
    Ok(())
}

/// Whether [`simulate`] is on.
pub fn is_simulated() -> bool {
    SIMULATED.get().is_some()
}

/// The simulated backend of `device` when [`simulate`] is on and the device's allocator was
/// built; `None` otherwise.
pub fn simulated_backend(device: usize) -> Option<Arc<SimBackend>> {
    SIMULATED
        .get()?
        .devices
        .get(device)?
        .get()
        .map(|(b, _)| Arc::clone(b))
}

fn stats(device: impl CudaDeviceArg) -> Result<Option<MemoryStats>, CudaError> {
    Ok(queried_allocator(device)?.map(|a| a.stats()))
}

/// `device`'s allocator for a query that builds nothing: `None` before its first allocation,
/// and `None` when CUDA is unavailable (no driver, no device, berth built without `cuda`), as
/// PyTorch's statistics answer 0 / empty without CUDA (`torch.cuda.memory_stats()` returns `{}`
/// while CUDA is not initialised). A bad or out-of-range index is still an error.
fn queried_allocator(
    device: impl CudaDeviceArg,
) -> Result<Option<&'static CudaAllocator>, CudaError> {
    match index(device) {
        Ok(i) => Ok(existing_allocator(i)),
        Err(CudaError::Unavailable { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The policy name of `device`'s allocator (`"paged"`, `"pytorch"` or `"expandable"`): the
/// built one's, else the one `BERTH_ALLOC_CONF` selects (the allocator is not built).
///
/// # Errors
/// As [`memory_allocated`]; [`CudaError::Config`] for a bad `BERTH_ALLOC_CONF`.
pub fn allocator_policy(device: impl CudaDeviceArg) -> Result<String, CudaError> {
    let device = index(device)?;
    match existing_allocator(device) {
        Some(a) => Ok(a.policy_name().to_owned()),
        None => Ok(config()?.policy_name().to_owned()),
    }
}

/// Bytes held by live allocations on `device` (`torch.cuda.memory_allocated(device)`); 0
/// before the device's first allocation (nothing is initialised to answer) and 0 without CUDA,
/// as PyTorch.
///
/// # Errors
/// [`CudaError::InvalidDevice`] ("device index 5 is out of range [0, 1)", not PyTorch's
/// internal assert of <https://github.com/pytorch/pytorch/issues/24463>), or the argument's
/// error ([`CudaDeviceArg`]).
pub fn memory_allocated(device: impl CudaDeviceArg) -> Result<u64, CudaError> {
    Ok(stats(device)?.map_or(0, |s| s.memory_allocated()))
}

/// Bytes reserved from the driver by `device`'s allocator (`memory_reserved`).
///
/// # Errors
/// As [`memory_allocated`].
pub fn memory_reserved(device: impl CudaDeviceArg) -> Result<u64, CudaError> {
    Ok(stats(device)?.map_or(0, |s| s.memory_reserved()))
}

/// Peak of [`memory_allocated`] since start or the last [`reset_peak_memory_stats`].
///
/// # Errors
/// As [`memory_allocated`].
pub fn max_memory_allocated(device: impl CudaDeviceArg) -> Result<u64, CudaError> {
    Ok(stats(device)?.map_or(0, |s| s.max_memory_allocated()))
}

/// Peak of [`memory_reserved`].
///
/// # Errors
/// As [`memory_allocated`].
pub fn max_memory_reserved(device: impl CudaDeviceArg) -> Result<u64, CudaError> {
    Ok(stats(device)?.map_or(0, |s| s.max_memory_reserved()))
}

/// Sets every peak of `device` to its current value (`reset_peak_memory_stats`).
///
/// # Errors
/// As [`memory_allocated`].
pub fn reset_peak_memory_stats(device: impl CudaDeviceArg) -> Result<(), CudaError> {
    if let Some(a) = queried_allocator(device)? {
        a.reset_peak_memory_stats();
    }
    Ok(())
}

/// Zeroes every accumulated counter of `device` (`reset_accumulated_memory_stats`).
///
/// # Errors
/// As [`memory_allocated`].
pub fn reset_accumulated_memory_stats(device: impl CudaDeviceArg) -> Result<(), CudaError> {
    if let Some(a) = queried_allocator(device)? {
        a.reset_accumulated_memory_stats();
    }
    Ok(())
}

/// PyTorch's flat statistics map (`torch.cuda.memory_stats(device)`); empty before the
/// device's first allocation, as PyTorch's.
///
/// # Errors
/// As [`memory_allocated`].
pub fn memory_stats(device: impl CudaDeviceArg) -> Result<BTreeMap<String, i64>, CudaError> {
    Ok(queried_allocator(device)?
        .map(|a| a.memory_stats())
        .unwrap_or_default())
}

/// PyTorch's table (`torch.cuda.memory_summary(device)`), with a line naming the policy.
///
/// # Errors
/// As [`allocator_policy`].
pub fn memory_summary(device: impl CudaDeviceArg, abbreviated: bool) -> Result<String, CudaError> {
    let device = index(device)?;
    match existing_allocator(device) {
        Some(a) => Ok(a.memory_summary(abbreviated)),
        None => Ok(berth_alloc::summary::memory_summary(
            &MemoryStats::new(None),
            device as i32,
            &allocator_policy(device)?,
            abbreviated,
            None,
        )),
    }
}

/// The segments, blocks and recorded history of `device`'s allocator
/// (`torch.cuda.memory._snapshot()`); empty before the device's first allocation.
///
/// # Errors
/// As [`memory_allocated`].
pub fn memory_snapshot(device: impl CudaDeviceArg) -> Result<MemorySnapshot, CudaError> {
    Ok(queried_allocator(device)?
        .map(|a| a.snapshot())
        .unwrap_or_default())
}

/// Starts (`Some(max_entries)`) or stops (`None`) recording `device`'s allocation history
/// (`torch.cuda.memory._record_memory_history`); builds the allocator.
///
/// # Errors
/// As [`allocator`].
pub fn record_memory_history(
    device: impl CudaDeviceArg,
    max_entries: Option<usize>,
) -> Result<(), CudaError> {
    allocator(device)?.record_memory_history(max_entries);
    Ok(())
}

/// Caps what `device`'s allocator may reserve at `fraction` of the device's memory
/// (`torch.cuda.set_per_process_memory_fraction(fraction, device)`); builds the allocator.
///
/// # Errors
/// As [`allocator`]; [`CudaError::Alloc`] with
/// [`AllocError::InvalidFraction`](berth_alloc::AllocError::InvalidFraction) unless
/// `0 ≤ fraction ≤ 1`.
pub fn set_per_process_memory_fraction(
    fraction: f64,
    device: impl CudaDeviceArg,
) -> Result<(), CudaError> {
    let device = index(device)?;
    allocator(device)?
        .set_memory_fraction(fraction)
        .map_err(|source| CudaError::Alloc { device, source })
}

/// Returns every entirely free cached segment (or page) of every initialised device to the
/// driver (`torch.cuda.empty_cache()`); never initialises a device
/// (<https://github.com/pytorch/pytorch/pull/4936>,
/// <https://github.com/pytorch/pytorch/issues/25752>).
///
/// # Errors
/// [`CudaError::Alloc`] with the device and the allocator's error when a free fails.
pub fn empty_cache() -> Result<(), CudaError> {
    for (device, a) in built_allocators() {
        a.empty_cache()
            .map_err(|source| CudaError::Alloc { device, source })?;
    }
    Ok(())
}

/// The pinned host allocator, built on first use in the context of the thread's current device.
///
/// # Errors
/// [`CudaError::Unavailable`], [`CudaError::Driver`], [`CudaError::Config`] for a bad
/// `BERTH_ALLOC_CONF`.
pub fn host_allocator() -> Result<&'static PinnedAllocator, CudaError> {
    if let Some(h) = HOST.get() {
        return Ok(h);
    }
    let cfg = config()?;
    let _g = HOST_INIT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(h) = HOST.get() {
        return Ok(h);
    }
    let backend = CudaHostBackend::new()?;
    Ok(HOST.get_or_init(|| HostCachingAllocator::with_config(backend, (&cfg).into())))
}

/// Whether `ptr` is pinned memory (what `is_pinned()` of a host tensor asks). Never creates the
/// host allocator or a context (<https://github.com/pytorch/pytorch/issues/128988>): before any
/// pinning nothing is pinned by berth.
pub fn is_pinned_ptr(ptr: *const u8) -> bool {
    HOST.get().is_some_and(|h| h.is_pinned(ptr))
}

/// Frees every cached pinned block (`torch._C._host_emptyCache()`); a no-op before the first
/// pinning.
///
/// # Errors
/// [`CudaError::PinnedAlloc`] when a free fails.
pub fn host_empty_cache() -> Result<(), CudaError> {
    match HOST.get() {
        Some(h) => h
            .empty_cache()
            .map_err(|source| CudaError::PinnedAlloc { source }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Statistics and `empty_cache` before any device use initialise nothing:
    /// <https://github.com/pytorch/pytorch/pull/4936>
    #[test]
    fn statistics_and_empty_cache_initialise_nothing() {
        let before = crate::contexts_created();
        empty_cache().unwrap();
        host_empty_cache().unwrap();
        assert!(!is_pinned_ptr([1u8, 2].as_ptr()));
        if !crate::is_available() {
            let _g = crate::testing::fake_device_count(1);
            assert_eq!(memory_allocated(0usize), Ok(0));
            assert_eq!(memory_reserved(0u16), Ok(0));
            assert_eq!(memory_allocated(None::<usize>), Ok(0));
            assert!(memory_stats(0i32).unwrap().is_empty());
            assert_eq!(
                memory_allocated(5usize),
                Err(CudaError::InvalidDevice { index: 5, count: 1 })
            );
            assert!(matches!(
                memory_allocated(-1i32),
                Err(CudaError::InvalidArgument { op: "device", .. })
            ));
            assert!(existing_allocator(0).is_none());
            assert!(memory_snapshot(0usize).unwrap().segments.is_empty());
            // The summary names the policy without building the allocator.
            let summary = memory_summary(0usize, true).unwrap();
            let policy = config().unwrap().policy_name();
            assert!(
                summary.contains(&format!("allocator policy: {policy}")),
                "{summary}"
            );
        }
        assert_eq!(crate::contexts_created(), before);
    }
}
