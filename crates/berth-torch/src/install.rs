//! The installed policy and its per-device allocators: what every hook PyTorch calls reaches.
//!
//! # Note [One allocator per process]
//! PyTorch takes a pluggable allocator once, before CUDA starts, and never swaps it
//! (`change_current_allocator` raises "Can't swap an already initialized allocator"). berth
//! follows: [`install`] fixes the policy for the life of the process (installing the same
//! policy again is a no-op, another one is [`HookError::AlreadyInstalled`]). The allocators
//! themselves are berth's one per-device registry, `berth_cuda::memory` (`Note [One allocator
//! registry]` there): [`install`] configures it ([`berth_cuda::memory::configure`]), and each
//! device's allocator is built on its first use, over that device's CUDA backend (or a
//! simulated device under the test switch, [`simulate`]), the same allocator berth's own
//! tensors use in the process. The hot path (`alloc` / `free`) reads two `OnceLock`s per call
//! and takes no lock of its own; each policy locks its own state.
//!
//! PyTorch hands over its own `cudaStream_t` handles, which are driver `CUstream`s: the legacy
//! default stream (0), the per-thread default stream (`cudaStreamPerThread`, 2) and user
//! streams. They are used unchanged as berth's [`StreamId`]s, so events recorded at a free
//! after `record_stream` are recorded on PyTorch's streams, as PyTorch's own allocator does
//! (<https://github.com/pytorch/pytorch/blob/main/c10/cuda/CUDACachingAllocator.cpp>,
//! `insert_events`). Every driver call of a hook runs in a [`berth_cuda::ForeignContextScope`]
//! (`Note [Foreign contexts]`), so PyTorch's current device is the same after the hook as
//! before it.

use berth_alloc::{AllocError, AllocatorConfig, DevicePtr, Policy, PolicyError, StreamId};
use berth_cuda::memory::{self, CudaAllocator, CudaDeviceArg};
use berth_cuda::{CudaError, ForeignContextScope};
use std::sync::{Mutex, OnceLock};

/// What went wrong in a hook or an install; the C functions keep its message for
/// `berth_torch_last_error`, the Python package raises it.
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    /// A hook or statistic was used before [`install`].
    #[error("berth's allocator is not installed: call berth_torch.use_allocator(policy) first")]
    NotInstalled,
    /// [`install`] of a second, different policy.
    #[error("berth's allocator is already installed with policy {installed:?}; a process keeps one allocator (PyTorch cannot swap it either), so start a new process to use {requested:?}")]
    AlreadyInstalled {
        /// The policy in use.
        installed: &'static str,
        /// The policy asked for.
        requested: String,
    },
    /// [`simulate`] after [`install`].
    #[error("the simulated device must be chosen before the allocator is installed")]
    SimulateAfterInstall,
    /// The process's device allocators are already built with another configuration (by
    /// berth's own tensors, or `BERTH_ALLOC_CONF`).
    #[error(transparent)]
    Registry(CudaError),
    /// A bad policy name or options.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// The driver layer failed (no driver, context creation, a policy the device cannot run).
    #[error("cuda:{device}: {source}")]
    Cuda {
        /// The device.
        device: i32,
        /// The driver layer's error.
        #[source]
        source: CudaError,
    },
    /// The policy refused: out of memory after freeing cached blocks and retrying, a bad
    /// pointer, a bad fraction.
    #[error("{source}")]
    Alloc {
        /// The device.
        device: i32,
        /// The allocator's error (its message is PyTorch's for out-of-memory).
        #[source]
        source: AllocError,
    },
    /// `record_stream` of a pointer no device's allocator handed out.
    #[error("record_stream: {ptr} was not allocated by berth (or was already freed)")]
    UnknownPointer {
        /// The pointer.
        ptr: DevicePtr,
    },
}

impl HookError {
    /// Whether this is an out-of-memory refusal (what Python raises as
    /// `torch.OutOfMemoryError`).
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            HookError::Alloc { source, .. } => source.is_out_of_memory(),
            HookError::Cuda { source, .. } => source.is_out_of_memory(),
            _ => false,
        }
    }
}

/// The installed policy and its configuration (the allocators are `berth_cuda::memory`'s).
pub struct Installed {
    policy: Policy,
    config: AllocatorConfig,
}

static INSTALLED: OnceLock<Installed> = OnceLock::new();
static INSTALL: Mutex<()> = Mutex::new(());

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Makes the next [`install`] use simulated devices of `capacity_bytes` bytes each instead of
/// CUDA (the test switch: CI has no GPU; [`berth_cuda::memory::simulate`]). Events on simulated
/// streams complete only when [`Installed::sim_complete_events`] says so.
///
/// # Errors
/// [`HookError::SimulateAfterInstall`].
pub fn simulate(capacity_bytes: u64) -> Result<(), HookError> {
    let _g = lock(&INSTALL);
    if INSTALLED.get().is_some() {
        return Err(HookError::SimulateAfterInstall);
    }
    memory::simulate(capacity_bytes).map_err(HookError::Registry)
}

/// Installs `policy` (`"pytorch"`, `"expandable"` or `"paged"`) with `options` (PyTorch's
/// `PYTORCH_CUDA_ALLOC_CONF` syntax, empty for none) for the rest of the process. See
/// `Note [One allocator per process]`.
///
/// # Errors
/// [`HookError::Policy`] for an unknown policy or bad options; [`HookError::AlreadyInstalled`]
/// when another policy is installed; [`HookError::Registry`] when berth's allocators of this
/// process already run another configuration.
pub fn install(policy: &str, options: &str) -> Result<&'static Installed, HookError> {
    let _g = lock(&INSTALL);
    let p = Policy::parse(policy)?;
    let config = p.config(options)?;
    if let Some(inst) = INSTALLED.get() {
        if inst.policy == p && inst.config == config {
            return Ok(inst);
        }
        return Err(HookError::AlreadyInstalled {
            installed: inst.policy.name(),
            requested: if options.trim().is_empty() {
                policy.to_owned()
            } else {
                format!("{policy} with {options}")
            },
        });
    }
    memory::configure(config.clone()).map_err(HookError::Registry)?;
    // Said now, while the installing caller (Python: `use_allocator`) can show them, rather
    // than at the first allocation.
    berth_alloc::inert_settings::warn_inert_settings(&config);
    Ok(INSTALLED.get_or_init(|| Installed { policy: p, config }))
}

/// The installed policy.
///
/// # Errors
/// [`HookError::NotInstalled`].
pub fn installed() -> Result<&'static Installed, HookError> {
    INSTALLED.get().ok_or(HookError::NotInstalled)
}

/// `device` as an index; a negative one is [`HookError::Cuda`] with
/// [`CudaError::InvalidArgument`].
fn index(device: i32) -> Result<usize, HookError> {
    device
        .cuda_index()
        .map_err(|source| HookError::Cuda { device, source })
}

impl Installed {
    /// The installed policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Whether the devices are simulated (the test switch).
    pub fn is_simulated(&self) -> bool {
        memory::is_simulated()
    }

    /// Makes `device`'s context current for the duration of a hook (nothing when simulated).
    ///
    /// # Errors
    /// [`HookError::Cuda`] for a bad device index or a driver failure.
    pub fn scope(&self, device: i32) -> Result<Option<ForeignContextScope>, HookError> {
        let d = index(device)?;
        if memory::is_simulated() {
            return Ok(None);
        }
        berth_cuda::foreign_context_scope(d)
            .map(Some)
            .map_err(|source| HookError::Cuda { device, source })
    }

    /// `device`'s allocator, built on first use (call inside [`Installed::scope`]).
    ///
    /// # Errors
    /// [`HookError::Cuda`]: a bad device index, no driver, or a policy the device cannot run
    /// (`paged` and `expandable` need virtual memory).
    pub fn allocator(&self, device: i32) -> Result<&'static CudaAllocator, HookError> {
        memory::allocator(index(device)?).map_err(|source| HookError::Cuda { device, source })
    }

    /// `device`'s allocator if it was built; never builds one.
    pub fn existing(&self, device: i32) -> Option<&'static CudaAllocator> {
        memory::existing_allocator(usize::try_from(device).ok()?)
    }

    /// `alloc`: `size` bytes on `device` for `stream` (PyTorch's `cudaStream_t`); 0 for zero
    /// bytes, as PyTorch.
    ///
    /// # Errors
    /// [`HookError::Alloc`] (out of memory after freeing cached blocks and retrying), and the
    /// errors of [`Installed::allocator`].
    pub fn alloc(&self, size: usize, device: i32, stream: u64) -> Result<u64, HookError> {
        if size == 0 {
            return Ok(0);
        }
        let _scope = self.scope(device)?;
        self.allocator(device)?
            .raw_alloc(size, StreamId(stream))
            .map(|p| p.0)
            .map_err(|source| HookError::Alloc { device, source })
    }

    /// `free`: gives `ptr` back to `device`'s allocator; the memory is reused once the streams
    /// it was recorded on have passed the events recorded now.
    ///
    /// # Errors
    /// [`HookError::Alloc`] for a pointer this allocator did not hand out or already freed.
    pub fn free(&self, ptr: u64, device: i32) -> Result<(), HookError> {
        if ptr == 0 {
            return Ok(());
        }
        let _scope = self.scope(device)?;
        let Some(a) = self.existing(device) else {
            return Err(HookError::Alloc {
                device,
                source: AllocError::InvalidPointer {
                    ptr: DevicePtr(ptr),
                },
            });
        };
        a.raw_delete(DevicePtr(ptr))
            .map_err(|source| HookError::Alloc { device, source })
    }

    /// `record_stream`: marks `ptr` as used on `stream`. The hook gets no device, so each built
    /// allocator is asked in turn.
    ///
    /// # Errors
    /// [`HookError::UnknownPointer`] when no allocator owns `ptr`.
    pub fn record_stream(&self, ptr: u64, stream: u64) -> Result<(), HookError> {
        for (device, a) in memory::built_allocators() {
            let device = device as i32;
            match a.raw_record_stream(DevicePtr(ptr), StreamId(stream)) {
                Ok(()) => return Ok(()),
                Err(AllocError::InvalidPointer { .. }) => continue,
                Err(source) => return Err(HookError::Alloc { device, source }),
            }
        }
        Err(HookError::UnknownPointer {
            ptr: DevicePtr(ptr),
        })
    }

    /// `reset` (`torch.cuda.empty_cache()`): returns every free cached segment or page of
    /// every built device.
    ///
    /// # Errors
    /// The first device's failure, after trying every device.
    pub fn empty_cache(&self) -> Result<(), HookError> {
        let mut first = Ok(());
        for (device, a) in memory::built_allocators() {
            let device = device as i32;
            let r = self.scope(device).and_then(|_scope| {
                a.empty_cache()
                    .map_err(|source| HookError::Alloc { device, source })
            });
            first = first.and(r);
        }
        first
    }

    /// `set_per_process_memory_fraction(fraction, device)`.
    ///
    /// # Errors
    /// [`HookError::Alloc`] with [`AllocError::InvalidFraction`] unless `0 ≤ fraction ≤ 1`.
    pub fn set_memory_fraction(&self, fraction: f64, device: i32) -> Result<(), HookError> {
        let _scope = self.scope(device)?;
        self.allocator(device)?
            .set_memory_fraction(fraction)
            .map_err(|source| HookError::Alloc { device, source })
    }

    /// Completes the simulated events recorded so far on `stream` of `device` (test switch).
    /// Returns false when `device` is not simulated or has no allocator yet.
    pub fn sim_complete_events(&self, device: i32, stream: u64) -> bool {
        match usize::try_from(device)
            .ok()
            .and_then(memory::simulated_backend)
        {
            Some(sim) => {
                sim.complete_events_on(StreamId(stream));
                true
            }
            None => false,
        }
    }
}
