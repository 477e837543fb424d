//! `Storage`: the memory behind one or more tensors, shared through `Arc<Storage>`.
//!
//! # Aliasing model
//! Views (`reshape`, `transpose`, `narrow`, `detach`, `to` without a change ...) share one
//! `Arc<Storage>`; in-place operations (`add_`, `copy_`, `fill_` ...) write through the shared
//! storage, so every alias sees the write — as in PyTorch. Host memory sits behind a
//! `RwLock`: any number of readers, or one writer, at a time, so a data race is impossible even
//! when two threads write through aliases (the writes are serialised; their order is the
//! callers' business, as in PyTorch). An in-place op whose input aliases its output reads
//! first, then writes.
//!
//! # Pending device work
//! A storage carries a list of [`PendingWork`] (e.g. an event after a non-blocking device→host
//! copy into this memory, or after a host→device copy *from* this memory). Every host read and
//! write waits for all of it first: a non-blocking copy can never be read before it lands
//! (PyTorch reads stale data there, <https://github.com/pytorch/pytorch/issues/86264>), and a
//! pinned source cannot be overwritten while a copy from it is in flight (PyTorch lets the write
//! reach the device, <https://github.com/pytorch/pytorch/issues/127612>).
//!
//! # Host memory accounting
//! Every live host storage counts its bytes in a process-wide counter
//! ([`host_memory_allocated`], peak [`max_host_memory_allocated`]), so `berth train` can
//! report the host bytes held by tensors on the CPU.

use std::alloc::{self, Layout as AllocLayout};
use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use std::mem::ManuallyDrop;

use crate::alloc::{Allocation, HostAllocation};
use crate::{Device, Error, Result};

/// Alignment of owned host buffers, in bytes (one cache line; enough for every dtype and SIMD).
pub const HOST_ALIGNMENT: usize = 64;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);
static HOST_CURRENT: AtomicUsize = AtomicUsize::new(0);
static HOST_PEAK: AtomicUsize = AtomicUsize::new(0);

/// Bytes of host memory currently held by live tensor storages (owned and external buffers).
pub fn host_memory_allocated() -> usize {
    HOST_CURRENT.load(Ordering::Relaxed)
}

/// The peak of [`host_memory_allocated`] since start or the last
/// [`reset_peak_host_memory_stats`], in bytes.
pub fn max_host_memory_allocated() -> usize {
    HOST_PEAK.load(Ordering::Relaxed)
}

/// Reset the host peak to the current value (`torch.cuda.reset_peak_memory_stats` semantics).
pub fn reset_peak_host_memory_stats() {
    HOST_PEAK.store(HOST_CURRENT.load(Ordering::Relaxed), Ordering::Relaxed);
}

fn host_account_add(bytes: usize) {
    let now = HOST_CURRENT.fetch_add(bytes, Ordering::Relaxed) + bytes;
    HOST_PEAK.fetch_max(now, Ordering::Relaxed);
    crate::memory_events::host_memory(true, bytes, now);
}

/// Device work that must finish before the host touches a storage's memory (an event, a
/// stream position). Implemented by the CUDA runtime.
pub trait PendingWork: Send + Sync + fmt::Debug {
    /// Block until the work has completed.
    ///
    /// # Errors
    /// The device error that the work ended with, if any.
    fn wait(&self) -> Result<()>;
    /// Whether the work has completed (never blocks).
    fn is_complete(&self) -> bool;
}

/// Host memory of another owner (e.g. a recycled buffer of berth-data's collate pool, a
/// huge-page mapping); dropping it returns the memory to its owner. A pinned host allocator's
/// block is no such memory: [`Storage::host_pinned`] holds it as it is.
///
/// # Safety
/// berth reads and writes `len()` bytes from `as_ptr()` (host slices, and device copies that
/// run after the call returned), trusting both. An implementation must guarantee that
/// `as_ptr()` is aligned to at least 8 bytes and valid for reads and writes of `len()` bytes
/// for as long as the value lives (it may be null when `len()` is 0); that both return the same values on every
/// call; and that nothing else accesses the memory while berth's storage owns the value.
pub unsafe trait ExternalHostMemory: Send + Sync + fmt::Debug {
    /// Start of the memory. Must be aligned to at least 8 bytes and valid for `len()` bytes
    /// for as long as `self` lives.
    fn as_ptr(&self) -> *mut u8;
    /// Size in bytes.
    fn len(&self) -> usize;
    /// Whether the size is zero.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Whether the memory is page-locked (pinned).
    fn is_pinned(&self) -> bool;
}

/// A CUDA allocation held by a device storage: a block of a device's caching allocator, on
/// device `cuda:device_index()`, of `len()` bytes. The one kind of device memory berth has, so
/// [`Storage`] names it in a variant (`match` is the dispatch, no trait object to downcast).
///
/// It returns to its caching allocator on drop. That `Drop` (the free, reported to the
/// profiler) lives beside the allocation, in `crate::cuda::transfer`: this file sits below
/// the profiler and imports nothing above it (Note [Memory events are a leaf]).
#[derive(Debug)]
pub struct CudaMemory {
    // Dropped by hand in `Drop` (`crate::cuda::transfer`), so the profiler reads the
    // allocator's statistics after the free.
    pub(crate) alloc: ManuallyDrop<Allocation>,
    pub(crate) device: usize,
    pub(crate) len: usize,
}

impl CudaMemory {
    /// Wraps `alloc`, `len` bytes of device `device`'s caching allocator (the transfer layer's
    /// `alloc_storage` is the one caller).
    pub(crate) fn new(alloc: Allocation, device: usize, len: usize) -> CudaMemory {
        CudaMemory {
            alloc: ManuallyDrop::new(alloc),
            device,
            len,
        }
    }

    /// The allocation (for `record_stream`).
    pub fn allocation(&self) -> &Allocation {
        &self.alloc
    }

    /// The index of the CUDA device the memory is on.
    pub fn device_index(&self) -> usize {
        self.device
    }

    /// The device it lives on (`cuda:i`, always with an index).
    pub fn device(&self) -> Device {
        Device::Cuda(self.device as u16)
    }

    /// The device address (`CUdeviceptr`).
    pub fn device_ptr(&self) -> u64 {
        self.alloc.ptr().0
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the size is zero.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// An owned, zero-initialised, [`HOST_ALIGNMENT`]-aligned host buffer.
struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the buffer is plain memory owned by this value; access is synchronised by the
// storage's RwLock.
unsafe impl Send for AlignedBuf {}
// SAFETY: as above; shared access only hands out raw pointers under the lock.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// `len` zeroed bytes, or `None` when the system allocator refuses them (or `len` is too
    /// large to describe as an allocation). Never aborts: the caller turns `None` into
    /// [`Error::HostOutOfMemory`].
    fn try_zeroed(len: usize) -> Option<AlignedBuf> {
        if len == 0 {
            // A dangling, aligned pointer: never dereferenced for zero bytes.
            let ptr = NonNull::new(HOST_ALIGNMENT as *mut u8).expect("non-zero constant");
            return Some(AlignedBuf { ptr, len });
        }
        let layout = AllocLayout::from_size_align(len, HOST_ALIGNMENT).ok()?;
        // SAFETY: `layout` has non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(raw)?;
        Some(AlignedBuf { ptr, len })
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.len > 0 {
            let layout =
                AllocLayout::from_size_align(self.len, HOST_ALIGNMENT).expect("checked at alloc");
            // SAFETY: allocated in `try_zeroed` with this layout.
            unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) };
        }
    }
}

/// What a host storage holds: its own buffer, a pinned block of a host allocator (held as the
/// allocator returned it: the storage asks the block, never the allocator by address), or
/// memory of another owner.
enum HostBuf {
    Owned(AlignedBuf),
    Pinned(HostAllocation),
    External(Box<dyn ExternalHostMemory>),
}

impl HostBuf {
    fn ptr(&self) -> *mut u8 {
        match self {
            HostBuf::Owned(b) => b.ptr.as_ptr(),
            // A zero-byte block may be null (an empty pinned allocation); slices need a
            // non-null, aligned pointer even for zero bytes.
            HostBuf::Pinned(b) if b.as_ptr().is_null() => {
                NonNull::<u64>::dangling().as_ptr().cast()
            }
            HostBuf::Pinned(b) => b.as_ptr(),
            HostBuf::External(e) if e.as_ptr().is_null() => {
                NonNull::<u64>::dangling().as_ptr().cast()
            }
            HostBuf::External(e) => e.as_ptr(),
        }
    }

    /// Whether the memory is page-locked.
    fn is_pinned(&self) -> bool {
        match self {
            HostBuf::Owned(_) => false,
            HostBuf::Pinned(b) => b.is_pinned(),
            HostBuf::External(e) => e.is_pinned(),
        }
    }
}

enum Memory {
    Host {
        lock: RwLock<()>,
        buf: HostBuf,
    },
    Cuda(CudaMemory),
    /// No memory. While a [`crate::meta_plan::MetaPlan`] is active on the creating thread, the
    /// planned allocation on its simulated device rides along and is released with the storage
    /// (Note [Meta storage]).
    Meta(#[allow(dead_code)] Option<berth_alloc::Allocation>),
}

/// The memory of a tensor: host bytes, device memory, or nothing (meta). Always behind an
/// `Arc`; not `Clone` (a copy can fail, see [`Storage::try_clone_host`]).
pub struct Storage {
    id: u64,
    device: Device,
    nbytes: usize,
    memory: Memory,
    pending: Mutex<Vec<std::sync::Arc<dyn PendingWork>>>,
}

impl fmt::Debug for Storage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Storage")
            .field("id", &self.id)
            .field("device", &self.device)
            .field("nbytes", &self.nbytes)
            .field("pinned", &self.is_pinned())
            .finish()
    }
}

impl Storage {
    fn with_memory(device: Device, nbytes: usize, memory: Memory) -> Storage {
        if matches!(memory, Memory::Host { .. }) {
            host_account_add(nbytes);
        }
        Storage {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            device,
            nbytes,
            memory,
            pending: Mutex::new(Vec::new()),
        }
    }

    /// Zero-filled host memory of `nbytes` bytes, allocated fallibly: every tensor's CPU
    /// storage comes from here.
    ///
    /// # Errors
    /// [`Error::HostOutOfMemory`] (device `cpu`, the bytes requested) when the system
    /// allocator refuses; the process does not abort.
    pub fn try_host_zeroed(nbytes: usize) -> Result<Storage> {
        let buf = AlignedBuf::try_zeroed(nbytes).ok_or(Error::HostOutOfMemory {
            device: Device::Cpu,
            requested_bytes: nbytes,
        })?;
        Ok(Storage::with_memory(
            Device::Cpu,
            nbytes,
            Memory::Host {
                lock: RwLock::new(()),
                buf: HostBuf::Owned(buf),
            },
        ))
    }

    /// Zero-filled host memory of `nbytes` bytes, for small buffers whose failure is not
    /// worth a `Result` (as `Vec`).
    ///
    /// # Panics
    /// Aborts the process through [`std::alloc::handle_alloc_error`] when the system allocator
    /// refuses; use [`Storage::try_host_zeroed`] for anything sized by a caller.
    pub fn host_zeroed(nbytes: usize) -> Storage {
        Storage::try_host_zeroed(nbytes).unwrap_or_else(|_| {
            alloc::handle_alloc_error(
                AllocLayout::from_size_align(nbytes.max(1), HOST_ALIGNMENT)
                    .unwrap_or(AllocLayout::new::<u8>()),
            )
        })
    }

    /// Host memory that holds a copy of `bytes`, allocated fallibly.
    ///
    /// # Errors
    /// As [`Storage::try_host_zeroed`].
    pub fn try_host_from_bytes(bytes: &[u8]) -> Result<Storage> {
        let s = Storage::try_host_zeroed(bytes.len())?;
        if let Memory::Host { buf, .. } = &s.memory {
            // SAFETY: fresh buffer of exactly `bytes.len()` bytes, not yet shared.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf.ptr(), bytes.len()) };
        }
        Ok(s)
    }

    /// Host storage over external memory of another owner (e.g. a recycled buffer of a pool);
    /// the storage's size is the memory's `len()`. A pinned host allocator's block goes to
    /// [`Storage::host_pinned`] instead.
    pub fn host_external(mem: Box<dyn ExternalHostMemory>) -> Storage {
        let n = mem.len();
        Storage::host(n, HostBuf::External(mem))
    }

    /// Host storage over a block of a pinned host allocator (berth's CUDA pinned cache, or any
    /// [`HostAllocator`](crate::alloc::host::HostAllocator)); the storage's size is the block's
    /// `len()`. The block returns to its allocator's cache when the storage drops, reused only
    /// after the streams it was used on ([`HostAllocation::record_stream`], reached through
    /// [`Storage::pinned_block`]) passed their events. The storage is pinned
    /// ([`Storage::is_pinned`]) unless the block is empty.
    pub fn host_pinned(block: HostAllocation) -> Storage {
        let n = block.len();
        Storage::host(n, HostBuf::Pinned(block))
    }

    fn host(nbytes: usize, buf: HostBuf) -> Storage {
        Storage::with_memory(
            Device::Cpu,
            nbytes,
            Memory::Host {
                lock: RwLock::new(()),
                buf,
            },
        )
    }

    /// Storage over CUDA memory, on its device.
    pub fn device(mem: CudaMemory) -> Storage {
        let (device, n) = (mem.device(), mem.len());
        Storage::with_memory(device, n, Memory::Cuda(mem))
    }

    /// Meta storage: a size and no memory.
    pub fn meta(nbytes: usize) -> Storage {
        Storage::with_memory(
            Device::Meta,
            nbytes,
            Memory::Meta(crate::meta_plan::plan_allocation(nbytes)),
        )
    }

    /// A process-unique identity (never reused), for aliasing checks.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// The device of the memory (`cpu`, `cuda:i` or `meta`).
    pub fn device_of(&self) -> Device {
        self.device
    }

    /// Size in bytes.
    pub fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// Whether this is page-locked host memory.
    pub fn is_pinned(&self) -> bool {
        matches!(&self.memory, Memory::Host { buf, .. } if buf.is_pinned())
    }

    /// The address of the memory: host pointer, device pointer, or 0 for meta.
    pub fn data_ptr(&self) -> u64 {
        match &self.memory {
            Memory::Host { buf, .. } => buf.ptr() as u64,
            Memory::Cuda(d) => d.device_ptr(),
            Memory::Meta(_) => 0,
        }
    }

    /// The CUDA memory, when this is device storage.
    pub fn cuda_memory(&self) -> Option<&CudaMemory> {
        match &self.memory {
            Memory::Cuda(d) => Some(d),
            _ => None,
        }
    }

    /// The pinned allocator's block, when this host storage holds one
    /// ([`Storage::host_pinned`]): what `record_stream` and the transfers mark as used on a
    /// stream.
    pub fn pinned_block(&self) -> Option<&HostAllocation> {
        match &self.memory {
            Memory::Host {
                buf: HostBuf::Pinned(b),
                ..
            } => Some(b),
            _ => None,
        }
    }

    /// The external host memory, when this host storage was built over one
    /// ([`Storage::host_external`]; a pinned allocator's block is [`Storage::pinned_block`]).
    pub fn external_host_memory(&self) -> Option<&dyn ExternalHostMemory> {
        match &self.memory {
            Memory::Host {
                buf: HostBuf::External(e),
                ..
            } => Some(e.as_ref()),
            _ => None,
        }
    }

    /// Register device work that must complete before the host reads or writes this memory.
    pub fn add_pending_work(&self, work: std::sync::Arc<dyn PendingWork>) {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(work);
    }

    /// Whether every registered pending work has completed (never blocks).
    pub fn pending_work_complete(&self) -> bool {
        self.pending
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .all(|w| w.is_complete())
    }

    /// Wait for all registered pending work and forget it.
    ///
    /// # Errors
    /// The first error a pending work reports (the rest are still waited for).
    pub fn wait_pending(&self) -> Result<()> {
        let works = std::mem::take(&mut *self.pending.lock().unwrap_or_else(|p| p.into_inner()));
        let mut first = Ok(());
        for w in works {
            if let Err(e) = w.wait() {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }

    /// Read access to host memory, after waiting for pending device work.
    ///
    /// # Errors
    /// 1. [`Error::MetaNoData`] for meta storage (`op` names the caller).
    /// 2. [`Error::NoKernel`] for device storage (copy it to the host first).
    /// 3. A pending work's error.
    pub fn read_host(&self, op: &'static str) -> Result<HostRead<'_>> {
        match &self.memory {
            Memory::Host { lock, buf } => {
                self.wait_pending()?;
                let guard = lock.read().unwrap_or_else(|p| p.into_inner());
                Ok(HostRead {
                    _guard: guard,
                    ptr: buf.ptr(),
                    len: self.nbytes,
                })
            }
            Memory::Meta(_) => Err(Error::MetaNoData { op }),
            Memory::Cuda(_) => Err(Error::NoKernel {
                op,
                device: self.device,
            }),
        }
    }

    /// Write access to host memory, after waiting for pending device work.
    ///
    /// # Errors
    /// As [`Storage::read_host`].
    pub fn write_host(&self, op: &'static str) -> Result<HostWrite<'_>> {
        match &self.memory {
            Memory::Host { lock, buf } => {
                self.wait_pending()?;
                let guard = lock.write().unwrap_or_else(|p| p.into_inner());
                Ok(HostWrite {
                    _guard: guard,
                    ptr: buf.ptr(),
                    len: self.nbytes,
                })
            }
            Memory::Meta(_) => Err(Error::MetaNoData { op }),
            Memory::Cuda(_) => Err(Error::NoKernel {
                op,
                device: self.device,
            }),
        }
    }

    /// A new owned host (or meta) storage with the same bytes.
    ///
    /// # Errors
    /// As [`Storage::read_host`] (meta storage gives a new meta storage instead);
    /// [`Error::HostOutOfMemory`].
    pub fn try_clone_host(&self) -> Result<Storage> {
        if let Memory::Meta(_) = self.memory {
            return Ok(Storage::meta(self.nbytes));
        }
        let r = self.read_host("clone")?;
        Storage::try_host_from_bytes(r.bytes())
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        if let Memory::Host { buf, .. } = &self.memory {
            // Owned (pageable) memory is freed right here, so it must not be released under an
            // in-flight copy (https://github.com/pytorch/pytorch/issues/127612): wait. A pinned
            // block goes back to its host caching allocator, which the transfer layer told
            // about every stream that used it (`record_stream`) and which reuses it only after
            // their events complete (PyTorch's host policy), so dropping it never blocks the
            // host.
            let pinned = buf.is_pinned();
            if !pinned {
                let _ = self.wait_pending();
            }
            let now = HOST_CURRENT
                .fetch_sub(self.nbytes, Ordering::Relaxed)
                .wrapping_sub(self.nbytes);
            crate::memory_events::host_memory(false, self.nbytes, now);
        }
    }
}

/// Plain-old-data element representations that any bit pattern makes valid (every element
/// type except `bool`, which is stored as `u8`).
pub trait Pod: Copy + Send + Sync + 'static + private::Sealed {}

mod private {
    pub trait Sealed {}
}

macro_rules! pod {
    ($($t:ty),*) => { $(impl private::Sealed for $t {} impl Pod for $t {})* };
}
pod!(f32, f64, half::f16, half::bf16, i64, i32, u8);

/// Read access to host storage; the memory cannot be written while this lives.
pub struct HostRead<'a> {
    _guard: RwLockReadGuard<'a, ()>,
    ptr: *const u8,
    len: usize,
}

impl HostRead<'_> {
    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: ptr is valid for len bytes while the storage lives; the read lock excludes
        // writers. len may be 0 with an aligned dangling pointer.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    /// The memory as elements of `T` (whole elements only).
    pub fn typed<T: Pod>(&self) -> &[T] {
        debug_assert_eq!(self.ptr as usize % std::mem::align_of::<T>(), 0);
        // SAFETY: as in `bytes`; host memory is aligned to ≥ 8 bytes (owned: 64, external:
        // documented requirement) and every bit pattern is a valid `T: Pod`.
        unsafe {
            std::slice::from_raw_parts(self.ptr as *const T, self.len / std::mem::size_of::<T>())
        }
    }
}

/// Write access to host storage; no other reader or writer while this lives.
pub struct HostWrite<'a> {
    _guard: RwLockWriteGuard<'a, ()>,
    ptr: *mut u8,
    len: usize,
}

impl HostWrite<'_> {
    /// The bytes, writable.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: ptr is valid for len bytes; the write lock makes this the only access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    /// The memory as writable elements of `T`.
    pub fn typed_mut<T: Pod>(&mut self) -> &mut [T] {
        debug_assert_eq!(self.ptr as usize % std::mem::align_of::<T>(), 0);
        // SAFETY: as in `bytes_mut`, plus alignment and `Pod` validity as in `HostRead::typed`.
        unsafe {
            std::slice::from_raw_parts_mut(self.ptr as *mut T, self.len / std::mem::size_of::<T>())
        }
    }
}
