//! The installed policy and its per-device allocators: what every hook PyTorch calls reaches.
//!
//! # Note [One allocator per process]
//! PyTorch takes a pluggable allocator once, before CUDA starts, and never swaps it
//! (`change_current_allocator` raises "Can't swap an already initialized allocator"). berth
//! follows: [`install`] fixes the policy for the life of the process (installing the same
//! policy again is a no-op, another one is [`HookError::AlreadyInstalled`]); each device's
//! allocator is built on its first use, over [`CudaBackend`] of that device (or a simulated
//! device under the test switch, [`simulate`]). The hot path (`alloc` / `free`) reads one
//! `OnceLock` per call and takes no lock of its own; each policy locks its own state.
//!
//! PyTorch hands over its own `cudaStream_t` handles, which are driver `CUstream`s: the legacy
//! default stream (0), the per-thread default stream (`cudaStreamPerThread`, 2) and user
//! streams. They are used unchanged as berth's [`StreamId`]s, so events recorded at a free
//! after `record_stream` are recorded on PyTorch's streams, as PyTorch's own allocator does
//! (<https://github.com/pytorch/pytorch/blob/main/c10/cuda/CUDACachingAllocator.cpp>,
//! `insert_events`). Every driver call of a hook runs in a [`berth_cuda::ForeignContextScope`]
//! (`Note [Foreign contexts]`), so PyTorch's current device is the same after the hook as
//! before it.

use crate::policy::{Policy, PolicyError};
use berth_alloc::backend::sim::SimBackend;
use berth_alloc::{
    device_allocator, AllocError, AllocatorConfig, DeviceAllocator, DevicePtr, StreamId,
};
use berth_cuda::{CudaBackend, CudaError, ForeignContextScope};
use std::sync::{Arc, Mutex, OnceLock};

/// The most CUDA devices one process can use through berth's hooks.
pub const MAX_DEVICES: usize = 64;

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
    /// A bad policy name or options.
    #[error(transparent)]
    Policy(#[from] PolicyError),
    /// A device index outside `[0, MAX_DEVICES)` or the machine's device count.
    #[error("device index {device} is out of range [0, {count})")]
    BadDevice {
        /// The index given.
        device: i32,
        /// How many devices there are (or [`MAX_DEVICES`]).
        count: usize,
    },
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
        matches!(
            self,
            HookError::Alloc {
                source: AllocError::OutOfMemory { .. }
                    | AllocError::CapExceeded { .. }
                    | AllocError::TooLarge { .. },
                ..
            }
        )
    }
}

/// Where device memory comes from.
#[derive(Debug)]
enum Source {
    Cuda,
    /// Simulated devices of this many bytes each (the test switch).
    Sim(u64),
}

/// The installed policy with one lazily built allocator per device.
pub struct Installed {
    policy: Policy,
    config: AllocatorConfig,
    source: Source,
    devices: [OnceLock<Arc<dyn DeviceAllocator>>; MAX_DEVICES],
    sims: [OnceLock<Arc<SimBackend>>; MAX_DEVICES],
    build: Mutex<()>,
}

static INSTALLED: OnceLock<Installed> = OnceLock::new();
static SIMULATE: Mutex<Option<u64>> = Mutex::new(None);
static INSTALL: Mutex<()> = Mutex::new(());

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Makes the next [`install`] use simulated devices of `capacity_bytes` bytes each instead of
/// CUDA (the test switch: CI has no GPU). Events on simulated streams complete only when
/// [`Installed::sim_complete_events`] says so.
///
/// # Errors
/// [`HookError::SimulateAfterInstall`].
pub fn simulate(capacity_bytes: u64) -> Result<(), HookError> {
    let _g = lock(&INSTALL);
    if INSTALLED.get().is_some() {
        return Err(HookError::SimulateAfterInstall);
    }
    *lock(&SIMULATE) = Some(capacity_bytes);
    Ok(())
}

/// Installs `policy` (`"pytorch"`, `"expandable"` or `"paged"`) with `options` (PyTorch's
/// `PYTORCH_CUDA_ALLOC_CONF` syntax, empty for none) for the rest of the process. See
/// `Note [One allocator per process]`.
///
/// # Errors
/// [`HookError::Policy`] for an unknown policy or bad options; [`HookError::AlreadyInstalled`]
/// when another policy is installed.
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
    let source = match *lock(&SIMULATE) {
        Some(bytes) => Source::Sim(bytes),
        None => Source::Cuda,
    };
    Ok(INSTALLED.get_or_init(|| Installed {
        policy: p,
        config,
        source,
        devices: std::array::from_fn(|_| OnceLock::new()),
        sims: std::array::from_fn(|_| OnceLock::new()),
        build: Mutex::new(()),
    }))
}

/// The installed policy.
///
/// # Errors
/// [`HookError::NotInstalled`].
pub fn installed() -> Result<&'static Installed, HookError> {
    INSTALLED.get().ok_or(HookError::NotInstalled)
}

fn slot(device: i32) -> Result<usize, HookError> {
    usize::try_from(device)
        .ok()
        .filter(|&d| d < MAX_DEVICES)
        .ok_or(HookError::BadDevice {
            device,
            count: MAX_DEVICES,
        })
}

impl Installed {
    /// The installed policy.
    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Whether the devices are simulated (the test switch).
    pub fn is_simulated(&self) -> bool {
        matches!(self.source, Source::Sim(_))
    }

    /// Makes `device`'s context current for the duration of a hook (nothing when simulated).
    ///
    /// # Errors
    /// [`HookError::BadDevice`], [`HookError::Cuda`].
    pub fn scope(&self, device: i32) -> Result<Option<ForeignContextScope>, HookError> {
        let d = slot(device)?;
        match self.source {
            Source::Sim(_) => Ok(None),
            Source::Cuda => berth_cuda::foreign_context_scope(d)
                .map(Some)
                .map_err(|source| HookError::Cuda { device, source }),
        }
    }

    /// `device`'s allocator, built on first use (call inside [`Installed::scope`]).
    ///
    /// # Errors
    /// [`HookError::BadDevice`]; [`HookError::Cuda`] when the device's backend cannot be made
    /// or the policy cannot run on it (`paged` and `expandable` need virtual memory).
    pub fn allocator(&self, device: i32) -> Result<&Arc<dyn DeviceAllocator>, HookError> {
        let d = slot(device)?;
        if let Some(a) = self.devices[d].get() {
            return Ok(a);
        }
        let _g = lock(&self.build);
        if let Some(a) = self.devices[d].get() {
            return Ok(a);
        }
        let cuda_err = |source| HookError::Cuda { device, source };
        let built = match self.source {
            Source::Sim(bytes) => {
                let sim = self.sims[d].get_or_init(|| Arc::new(SimBackend::new(bytes)));
                device_allocator(Arc::clone(sim), self.config.clone(), device)
            }
            Source::Cuda => device_allocator(
                CudaBackend::new(d).map_err(cuda_err)?,
                self.config.clone(),
                device,
            ),
        }
        .map_err(|source| cuda_err(CudaError::Alloc { device: d, source }))?;
        Ok(self.devices[d].get_or_init(|| built))
    }

    /// `device`'s allocator if it was built; never builds one.
    pub fn existing(&self, device: i32) -> Option<&Arc<dyn DeviceAllocator>> {
        slot(device).ok().and_then(|d| self.devices[d].get())
    }

    /// Every built allocator with its device index, in index order.
    pub fn built(&self) -> impl Iterator<Item = (i32, &Arc<dyn DeviceAllocator>)> {
        self.devices
            .iter()
            .enumerate()
            .filter_map(|(d, a)| a.get().map(|a| (d as i32, a)))
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
        for (device, a) in self.built() {
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
        for (device, a) in self.built() {
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
        match slot(device).ok().and_then(|d| self.sims[d].get()) {
            Some(sim) => {
                sim.complete_events_on(StreamId(stream));
                true
            }
            None => false,
        }
    }
}
