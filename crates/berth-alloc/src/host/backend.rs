//! [`HostBackend`]: the raw pinned-host-memory source, and [`SimHostBackend`], its simulator.

use std::collections::BTreeMap;
use std::ptr::NonNull;

use crate::backend::sim::{SimBackend, SimFence};
use crate::backend::{DeviceStream, MemoryBackend, StreamId};
use crate::error::BackendError;
use crate::sync::{Arc, Mutex, MutexGuard};

/// Raw page-locked host memory and the stream events that guard its reuse: the four hooks of
/// PyTorch's `CachingHostAllocatorImpl` (`allocate_host_memory`, `free_block`, `record_stream`,
/// `query_event`), plus `cudaHostRegister` for `pinned_use_cuda_host_register`.
///
/// The fence type is that of [`MemoryBackend`] (`Note [Fences and events]` there), so the CUDA
/// backend can share one event pool
/// between its device and host allocators. Events are recorded on a [`DeviceStream`], a stream
/// *and its device*: pinned memory serves every device, and every device's default stream is
/// [`StreamId::DEFAULT`].
///
/// All methods take `&self`; implementations are `Send + Sync` and do their own locking. The
/// caching policy ([`super::HostCachingAllocator`]) never calls them while holding its locks.
pub trait HostBackend: Send + Sync + 'static {
    /// A fence: a point recorded on a stream (a `CUevent` on CUDA, the simulator's
    /// [`SimHostFence`]); see `Note [Fences and events]` in [`crate::backend`].
    type Fence: Send + Sync + 'static;

    /// Allocates `bytes` bytes of page-locked host memory (`cudaHostAlloc(.., cudaHostAllocDefault)`).
    /// The contents are unspecified (not necessarily zero).
    ///
    /// # Errors
    /// 1. [`BackendError::OutOfMemory`] when the memory cannot be pinned now (the caller may free
    ///    cached blocks and retry).
    /// 2. [`BackendError::Other`] for any other failure.
    fn alloc_pinned(&self, bytes: usize) -> Result<NonNull<u8>, BackendError>;

    /// Frees memory from [`HostBackend::alloc_pinned`] (`cudaFreeHost`).
    ///
    /// # Safety
    /// 1. `ptr` was returned by `alloc_pinned` on this backend with this `bytes`, and is not
    ///    freed yet.
    /// 2. No queued copy still reads or writes it (its events have completed).
    ///
    /// # Errors
    /// [`BackendError::InvalidPointer`] when the backend can tell `ptr` is not live;
    /// [`BackendError::Other`] for driver failures.
    unsafe fn free_pinned(&self, ptr: NonNull<u8>, bytes: usize) -> Result<(), BackendError>;

    /// Page-locks `bytes` bytes of ordinary host memory at `ptr` (`cudaHostRegister`), used with
    /// `pinned_use_cuda_host_register:True`. Default: not supported.
    ///
    /// # Errors
    /// [`BackendError::Other`] when registration is not supported or fails.
    fn register(&self, ptr: NonNull<u8>, bytes: usize) -> Result<(), BackendError> {
        let _ = (ptr, bytes);
        Err(BackendError::Other {
            op: "register",
            message: "this host backend cannot register host memory; \
                      set pinned_use_cuda_host_register:False"
                .into(),
        })
    }

    /// Undoes [`HostBackend::register`] (`cudaHostUnregister`). Default: not supported.
    ///
    /// # Safety
    /// 1. `ptr` was registered with [`HostBackend::register`] with this `bytes`.
    /// 2. No queued copy still uses it.
    ///
    /// # Errors
    /// [`BackendError::Other`] when unregistration is not supported or fails.
    unsafe fn unregister(&self, ptr: NonNull<u8>, bytes: usize) -> Result<(), BackendError> {
        let _ = (ptr, bytes);
        Err(BackendError::Other {
            op: "unregister",
            message: "not supported by this host backend".into(),
        })
    }

    /// Records an event on `stream` (on `stream.device`, whatever device the calling thread
    /// has current) that completes when the work queued there so far completes.
    ///
    /// # Errors
    /// [`BackendError::Other`] when the driver call fails.
    fn record_fence(&self, stream: DeviceStream) -> Result<Self::Fence, BackendError>;

    /// Whether `event` has completed (`cudaEventQuery`; "not ready" is `Ok(false)`).
    ///
    /// # Errors
    /// [`BackendError::Other`] when the query fails.
    fn query_fence(&self, event: &Self::Fence) -> Result<bool, BackendError>;

    /// Blocks until `event` has completed (`cudaEventSynchronize`); used only when the allocator
    /// itself is dropped with blocks still waiting on events.
    ///
    /// # Errors
    /// [`BackendError::Other`] when the driver call fails.
    fn sync_fence(&self, event: &Self::Fence) -> Result<(), BackendError>;

    /// Whether the driver considers `ptr` page-locked host memory (`cudaPointerGetAttributes`,
    /// type == host), for memory pinned outside the caching allocator. Default: `false`.
    fn is_pinned(&self, ptr: *const u8) -> bool {
        let _ = ptr;
        false
    }
}

/// Counts of every call made on a [`SimHostBackend`] (failed calls included).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimHostCounts {
    /// `alloc_pinned` calls.
    pub alloc_pinned: u64,
    /// `alloc_pinned` calls that failed.
    pub alloc_failed: u64,
    /// `free_pinned` calls.
    pub free_pinned: u64,
    /// `register` calls.
    pub register: u64,
    /// `unregister` calls.
    pub unregister: u64,
}

#[derive(Default)]
struct SimHostState {
    /// Live regions from `alloc_pinned`: address → bytes.
    pinned: BTreeMap<usize, usize>,
    /// Registered regions: address → bytes.
    registered: BTreeMap<usize, usize>,
    used: u64,
    counts: SimHostCounts,
    fail_alloc_at: Option<u64>,
    fail_free: bool,
    initialized: bool,
}

/// Page alignment of the simulator's memory, in bytes.
const PAGE: usize = 4096;

/// A simulated pinned-host-memory source: real, zeroed host memory (so tests can write and read
/// it), a capacity in bytes, call counts, fault injection, and an "initialised" flag that the
/// first allocation sets (the lazy device initialisation whose absence made a first
/// `pin_memory()` report unpinned, <https://github.com/pytorch/pytorch/issues/149032>).
///
/// Events come from one [`SimBackend`] per simulated device, by default a private one (device
/// 0); [`SimHostBackend::with_events`] and [`SimHostBackend::with_devices`] share device
/// simulators' streams so that completing work on a device releases host blocks too. An event
/// on a [`DeviceStream`] is recorded on that device's simulator; a device index without a
/// simulator is a [`BackendError::Other`] (`cudaErrorInvalidDevice`).
///
/// ```
/// use berth_alloc::host::{HostBackend, SimHostBackend};
/// let sim = SimHostBackend::new(1 << 20);
/// assert!(!sim.is_initialized());
/// let p = sim.alloc_pinned(4096).unwrap();
/// assert!(sim.is_initialized() && sim.is_pinned(p.as_ptr()));
/// // SAFETY: `p` came from this backend with this size and is freed once; nothing uses it.
/// unsafe { sim.free_pinned(p, 4096).unwrap() };
/// assert_eq!(sim.used_bytes(), 0);
/// ```
pub struct SimHostBackend {
    capacity: u64,
    /// The event source of each simulated device, by device index.
    devices: Vec<Arc<SimBackend>>,
    state: Mutex<SimHostState>,
}

/// A fence of a [`SimHostBackend`]: the device it was recorded on and the simulator's fence.
#[derive(Debug)]
pub struct SimHostFence {
    /// The device index of the stream the event was recorded on.
    pub device: u32,
    /// The event in that device's simulator.
    pub event: SimFence,
}

/// Host memory for the backups of a sleeping tag (`Note [Sleep and wake]` in
/// [`crate::paged`]): page-locked on CUDA, so the copies run at link speed. Every
/// [`HostBackend`] is one; object-safe, so a sleeping tag can keep the memory source of its
/// backups.
pub trait BackupMemory: Send + Sync {
    /// Allocates `bytes` bytes of host memory.
    ///
    /// # Errors
    /// [`BackendError::OutOfMemory`] when the memory is not available.
    fn alloc_backup(&self, bytes: usize) -> Result<NonNull<u8>, BackendError>;
    /// Frees memory from [`BackupMemory::alloc_backup`].
    ///
    /// # Safety
    /// 1. `ptr` came from `alloc_backup` on this source with this `bytes` and is not freed yet.
    /// 2. No copy still uses it.
    ///
    /// # Errors
    /// As [`HostBackend::free_pinned`].
    unsafe fn free_backup(&self, ptr: NonNull<u8>, bytes: usize) -> Result<(), BackendError>;
}

impl<H: HostBackend> BackupMemory for H {
    fn alloc_backup(&self, bytes: usize) -> Result<NonNull<u8>, BackendError> {
        self.alloc_pinned(bytes)
    }

    unsafe fn free_backup(&self, ptr: NonNull<u8>, bytes: usize) -> Result<(), BackendError> {
        // SAFETY: the caller's contract is `free_pinned`'s.
        unsafe { self.free_pinned(ptr, bytes) }
    }
}

impl std::fmt::Debug for SimHostBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimHostBackend")
            .field("capacity", &self.capacity)
            .field("used", &self.used_bytes())
            .finish()
    }
}

impl SimHostBackend {
    /// A simulated host with `capacity` bytes of pinnable memory and its own event clocks.
    pub fn new(capacity: u64) -> Self {
        Self::with_events(capacity, Arc::new(SimBackend::new(0)))
    }

    /// A simulated host whose events are recorded on `device`'s streams (device 0).
    pub fn with_events(capacity: u64, device: Arc<SimBackend>) -> Self {
        Self::with_devices(capacity, vec![device])
    }

    /// A simulated host serving several simulated devices: an event on
    /// `DeviceStream { device: i, .. }` is recorded on `devices[i]`.
    pub fn with_devices(capacity: u64, devices: Vec<Arc<SimBackend>>) -> Self {
        SimHostBackend {
            capacity,
            devices,
            state: Mutex::new(SimHostState::default()),
        }
    }

    fn device(&self, device: u32) -> Result<&Arc<SimBackend>, BackendError> {
        self.devices
            .get(device as usize)
            .ok_or_else(|| BackendError::Other {
                op: "record_fence",
                message: format!(
                    "invalid device ordinal {device}: this simulated host serves {} device(s)",
                    self.devices.len()
                ),
            })
    }

    fn lock(&self) -> MutexGuard<'_, SimHostState> {
        // The state stays consistent between statements; a poisoned lock is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The simulator that records and completes the events of device 0.
    pub fn event_source(&self) -> &Arc<SimBackend> {
        &self.devices[0]
    }

    /// Completes every event recorded so far on `stream` of device 0.
    pub fn complete_events_on(&self, stream: StreamId) {
        self.complete_events_on_device(DeviceStream::new(0, stream));
    }

    /// Completes every event recorded so far on `stream` of its device (no-op for a device
    /// without a simulator).
    pub fn complete_events_on_device(&self, stream: DeviceStream) {
        if let Ok(d) = self.device(stream.device) {
            d.complete_events_on(stream.stream);
        }
    }

    /// Completes every event recorded so far on every stream of every device.
    pub fn complete_all(&self) {
        for d in &self.devices {
            d.complete_all();
        }
    }

    /// Makes the `n`-th `alloc_pinned` call (1-based, counted from creation) fail with
    /// [`BackendError::OutOfMemory`]; later calls succeed again.
    pub fn fail_alloc_at(&self, n: u64) {
        self.lock().fail_alloc_at = Some(n);
    }

    /// Makes every later `free_pinned` / `unregister` fail with [`BackendError::Other`]
    /// (`false` restores them); the memory then stays allocated.
    pub fn set_fail_free(&self, fail: bool) {
        self.lock().fail_free = fail;
    }

    /// Counts of every call so far.
    pub fn counts(&self) -> SimHostCounts {
        self.lock().counts
    }

    /// Bytes currently pinned through `alloc_pinned` or `register`.
    pub fn used_bytes(&self) -> u64 {
        self.lock().used
    }

    /// Number of live pinned regions (allocated or registered).
    pub fn live_regions(&self) -> usize {
        let st = self.lock();
        st.pinned.len() + st.registered.len()
    }

    /// Whether the simulated device context exists (set by the first `alloc_pinned` or
    /// `register`, as the first `pin_memory()` initialises CUDA lazily).
    pub fn is_initialized(&self) -> bool {
        self.lock().initialized
    }

    /// The capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    fn layout(bytes: usize) -> Result<std::alloc::Layout, BackendError> {
        std::alloc::Layout::from_size_align(bytes.max(1), PAGE).map_err(|_| BackendError::Other {
            op: "alloc_pinned",
            message: format!("{bytes} bytes is too large a layout"),
        })
    }
}

fn contains(map: &BTreeMap<usize, usize>, addr: usize) -> bool {
    map.range(..=addr)
        .next_back()
        .is_some_and(|(&a, &n)| addr < a + n.max(1))
}

impl HostBackend for SimHostBackend {
    type Fence = SimHostFence;

    fn alloc_pinned(&self, bytes: usize) -> Result<NonNull<u8>, BackendError> {
        let layout = Self::layout(bytes)?;
        {
            let mut st = self.lock();
            st.initialized = true;
            st.counts.alloc_pinned += 1;
            let fail = st.fail_alloc_at == Some(st.counts.alloc_pinned);
            if fail || st.used + bytes as u64 > self.capacity {
                st.counts.alloc_failed += 1;
                return Err(BackendError::OutOfMemory {
                    op: "alloc_pinned",
                    bytes: bytes as u64,
                });
            }
            st.used += bytes as u64;
        }
        // SAFETY: `layout` has a non-zero size (`bytes.max(1)`) and a valid power-of-two alignment.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(ptr) else {
            let mut st = self.lock();
            st.used -= bytes as u64;
            st.counts.alloc_failed += 1;
            return Err(BackendError::OutOfMemory {
                op: "alloc_pinned",
                bytes: bytes as u64,
            });
        };
        self.lock().pinned.insert(ptr.as_ptr() as usize, bytes);
        Ok(ptr)
    }

    unsafe fn free_pinned(&self, ptr: NonNull<u8>, bytes: usize) -> Result<(), BackendError> {
        let mut st = self.lock();
        st.counts.free_pinned += 1;
        if st.fail_free {
            return Err(BackendError::Other {
                op: "free_pinned",
                message: "injected failure".into(),
            });
        }
        let addr = ptr.as_ptr() as usize;
        match st.pinned.get(&addr) {
            Some(&n) if n == bytes => {
                st.pinned.remove(&addr);
                st.used -= bytes as u64;
                drop(st);
                let layout = Self::layout(bytes)?;
                // SAFETY: `ptr` was allocated by `alloc_zeroed` with this same layout (same
                // `bytes`, checked against the record above) and the record is now removed, so
                // it is deallocated exactly once.
                unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
                Ok(())
            }
            Some(&n) => Err(BackendError::Other {
                op: "free_pinned",
                message: format!(
                    "region {addr:#x} has {n} bytes but free_pinned was given {bytes}"
                ),
            }),
            None => Err(BackendError::InvalidPointer {
                op: "free_pinned",
                ptr: crate::DevicePtr(addr as u64),
            }),
        }
    }

    fn register(&self, ptr: NonNull<u8>, bytes: usize) -> Result<(), BackendError> {
        let mut st = self.lock();
        st.initialized = true;
        st.counts.register += 1;
        if st.used + bytes as u64 > self.capacity {
            return Err(BackendError::OutOfMemory {
                op: "register",
                bytes: bytes as u64,
            });
        }
        let addr = ptr.as_ptr() as usize;
        if contains(&st.registered, addr) || contains(&st.pinned, addr) {
            return Err(BackendError::Other {
                op: "register",
                message: format!(
                    "{addr:#x} is already page-locked (cudaErrorHostMemoryAlreadyRegistered)"
                ),
            });
        }
        st.registered.insert(addr, bytes);
        st.used += bytes as u64;
        Ok(())
    }

    unsafe fn unregister(&self, ptr: NonNull<u8>, bytes: usize) -> Result<(), BackendError> {
        let mut st = self.lock();
        st.counts.unregister += 1;
        if st.fail_free {
            return Err(BackendError::Other {
                op: "unregister",
                message: "injected failure".into(),
            });
        }
        let addr = ptr.as_ptr() as usize;
        match st.registered.remove(&addr) {
            Some(n) => {
                st.used -= n as u64;
                let _ = bytes;
                Ok(())
            }
            None => Err(BackendError::InvalidPointer {
                op: "unregister",
                ptr: crate::DevicePtr(addr as u64),
            }),
        }
    }

    fn record_fence(&self, stream: DeviceStream) -> Result<SimHostFence, BackendError> {
        let event = self.device(stream.device)?.record_fence(stream.stream)?;
        Ok(SimHostFence {
            device: stream.device,
            event,
        })
    }

    fn query_fence(&self, event: &SimHostFence) -> Result<bool, BackendError> {
        self.device(event.device)?.query_fence(&event.event)
    }

    fn sync_fence(&self, event: &SimHostFence) -> Result<(), BackendError> {
        self.device(event.device)?.sync_fence(&event.event)
    }

    fn is_pinned(&self, ptr: *const u8) -> bool {
        let st = self.lock();
        let addr = ptr as usize;
        contains(&st.pinned, addr) || contains(&st.registered, addr)
    }
}

impl Drop for SimHostBackend {
    fn drop(&mut self) {
        // Return whatever the allocator leaked (for example after injected free failures), so
        // that tests do not leak real memory.
        let st = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        for (&addr, &bytes) in &st.pinned {
            if let (Ok(layout), Some(p)) = (Self::layout(bytes), NonNull::new(addr as *mut u8)) {
                // SAFETY: every entry of `pinned` is a live `alloc_zeroed` region of this layout;
                // the map is dropped right after, so each is deallocated once.
                unsafe { std::alloc::dealloc(p.as_ptr(), layout) };
            }
        }
        st.pinned.clear();
    }
}

/// A shared backend is a backend: lets a test or the CUDA layer keep a handle on the backend
/// the allocator owns (for counts, fault injection, or event completion after the allocator is
/// gone).
impl<B: HostBackend> HostBackend for Arc<B> {
    type Fence = B::Fence;

    fn alloc_pinned(&self, bytes: usize) -> Result<NonNull<u8>, BackendError> {
        (**self).alloc_pinned(bytes)
    }

    unsafe fn free_pinned(&self, ptr: NonNull<u8>, bytes: usize) -> Result<(), BackendError> {
        // SAFETY: the caller upholds `free_pinned`'s contract, which is the same for `B`.
        unsafe { (**self).free_pinned(ptr, bytes) }
    }

    fn register(&self, ptr: NonNull<u8>, bytes: usize) -> Result<(), BackendError> {
        (**self).register(ptr, bytes)
    }

    unsafe fn unregister(&self, ptr: NonNull<u8>, bytes: usize) -> Result<(), BackendError> {
        // SAFETY: the caller upholds `unregister`'s contract, which is the same for `B`.
        unsafe { (**self).unregister(ptr, bytes) }
    }

    fn record_fence(&self, stream: DeviceStream) -> Result<Self::Fence, BackendError> {
        (**self).record_fence(stream)
    }

    fn query_fence(&self, event: &Self::Fence) -> Result<bool, BackendError> {
        (**self).query_fence(event)
    }

    fn sync_fence(&self, event: &Self::Fence) -> Result<(), BackendError> {
        (**self).sync_fence(event)
    }

    fn is_pinned(&self, ptr: *const u8) -> bool {
        (**self).is_pinned(ptr)
    }
}
