//! Transfers behind `.to()`: cpu→cuda, cuda→cpu, cuda:i→cuda:j, and the device memory and
//! pinned memory that tensor storages hold. The byte-level copies and staging pipelines they
//! use are berth-cuda's ([`copy`](super::copy); re-exported here under their old paths).
//!
//! - **Device memory** comes from the device's caching allocator on the current stream
//!   ([`alloc_storage`]), held by the storage as [`CudaMemory`]; its `Drop` (the free, told to
//!   the profiler) is here.
//! - **host→device**: from pinned memory, one `cuMemcpyHtoDAsync` on the current stream; the
//!   source storage gets a pending event so a host write waits for the copy (where PyTorch lets
//!   it race, <https://github.com/pytorch/pytorch/issues/127612>), and
//!   the pinned block is `record_stream`ed so it is not reused before the copy ran. From
//!   pageable memory, the data is staged through pinned blocks of [`STAGING_CHUNK_BYTES`] in a
//!   pipeline (copy chunk i into pinned memory on the CPU while the DMA of chunk i−1 runs);
//!   the caller returns once the last chunk was staged, without waiting for the DMA.
//! - **device→host**: `non_blocking` lands in pinned memory and the result carries a pending
//!   event, so any host read waits for the copy: a stale read is impossible
//!   (<https://github.com/pytorch/pytorch/issues/86264>). Blocking copies are sync points
//!   ([`sync_point`](super::sync_point)). A
//!   blocking copy into pageable memory goes through two pinned staging blocks, the DMA of one
//!   chunk running while the CPU copies the previous one out from several threads; `.to(cpu)`
//!   lands in a fresh huge-page mapping (no zero-filling pass), and [`copy_to_host`] into an
//!   existing tensor (`Tensor::copy_`) allocates nothing.
//! - **device→device**: `cuMemcpyDtoDAsync` on one device, `cuMemcpyPeerAsync` across devices
//!   (the driver uses peer access when the devices have it).

use super::copy::{
    copy_dtod_async, copy_dtoh_async, copy_htod_async, copy_peer_async, stage_dtoh, stage_htod,
    PinnedBuffer,
};
use super::hostmem::{Mapping, Pages};
use super::memory::allocator;
use super::{current_stream, CudaError, Event, Stream};
use crate::profiler::{hooks, CopyKind};
use crate::storage::{ExternalHostMemory, PendingWork};
use crate::{Device, Result, Storage, Tensor};
use std::mem::ManuallyDrop;
use std::sync::Arc;

pub use super::copy::{copy_dtod_raw, DTOH_STAGING_CHUNK_BYTES, STAGING_CHUNK_BYTES};

pub use crate::storage::CudaMemory;

/// The free of a device storage's memory: back to its caching allocator, reported to the
/// profiler when one is active (here rather than in `crate::storage`, which sits below the
/// profiler).
impl Drop for CudaMemory {
    fn drop(&mut self) {
        let reserved_before = crate::profiler::is_active()
            .then(|| hooks::cuda_stats(self.device).map(|(_, r)| r))
            .flatten();
        // SAFETY: `alloc` is dropped here once and never used again.
        unsafe { ManuallyDrop::drop(&mut self.alloc) };
        if let Some(before) = reserved_before {
            hooks::cuda_memory(false, self.device, self.len, before);
        }
    }
}

/// Runs the copy `f` of `bytes` bytes on `stream`, recorded by the profiler when one is
/// active (`pinned`: one DMA from or to pinned memory, else staged; `blocking`: `f` returns
/// once the data landed).
fn profiled_copy<R>(
    kind: CopyKind,
    bytes: usize,
    pinned: bool,
    blocking: bool,
    stream: &Stream,
    f: impl FnOnce() -> Result<R>,
) -> Result<R> {
    if !crate::profiler::is_active() {
        return f();
    }
    let start = hooks::copy_start(kind, bytes, stream);
    let r = f();
    if r.is_ok() {
        hooks::copy_end(start, kind, bytes, pinned, blocking, stream);
    } else {
        hooks::copy_abort(start);
    }
    r
}

/// Device work a storage must wait for: an event recorded after a copy.
#[derive(Debug)]
pub struct EventWork {
    event: Event,
}

impl PendingWork for EventWork {
    fn wait(&self) -> Result<()> {
        Ok(self.event.synchronize()?)
    }
    fn is_complete(&self) -> bool {
        self.event.query().unwrap_or(true)
    }
}

/// Records an event on `stream` and wraps it as pending work.
fn pending_after(stream: &Stream) -> Result<Arc<dyn PendingWork>> {
    let event = Event::new(false);
    event.record_on(stream)?;
    Ok(Arc::new(EventWork { event }))
}

/// `nbytes` bytes of device memory on `device` from its caching allocator, ordered on the
/// thread's current stream of `device`, as a tensor storage.
///
/// # Errors
/// [`CudaError::InvalidDevice`], [`CudaError::Unavailable`], or the allocator's error (typed
/// out-of-memory) converted into [`crate::Error`].
pub fn alloc_storage(device: usize, nbytes: usize) -> Result<Storage> {
    let stream = current_stream(device)?;
    let allocator = allocator(device)?;
    let reserved_before =
        crate::profiler::is_active().then(|| allocator.allocated_and_reserved().1);
    let alloc = allocator
        .allocate(nbytes, stream.id())
        .map_err(|source| CudaError::Alloc { device, source })?;
    if let Some(before) = reserved_before {
        hooks::cuda_memory(true, device, nbytes, before);
    }
    Ok(Storage::device(CudaMemory::new(alloc, device, nbytes)))
}

/// `nbytes` bytes of pinned host memory as a host storage (contents unspecified).
///
/// # Errors
/// [`CudaError::Unavailable`] or the pinned allocator's error.
pub fn alloc_pinned_storage(nbytes: usize) -> Result<Storage> {
    let block = PinnedBuffer::new(nbytes)?;
    Ok(Storage::host_pinned(block.into_allocation()))
}

fn cuda_index(d: Device) -> Result<usize> {
    match d.canonical()?.index() {
        Some(i) => Ok(usize::from(i)),
        None => Err(CudaError::InvalidArgument {
            op: "to",
            what: format!("{d} is not a CUDA device"),
        }
        .into()),
    }
}

/// `src` made contiguous, with the byte offset of its first element in its storage and its
/// byte length: what a copy of the whole tensor reads.
fn contiguous_bytes(src: &Tensor) -> Result<(Tensor, usize, usize)> {
    let src = src.contiguous()?;
    let elem = src.dtype().size_in_bytes();
    let (offset, nbytes) = (src.storage_offset() * elem, src.numel() * elem);
    Ok((src, offset, nbytes))
}

/// Copies `src` to `device` (one side CUDA), returning a contiguous tensor of the same dtype.
/// What the CUDA [`DeviceKernels::transfer`](crate::device_kernels::DeviceKernels) calls.
///
/// # Errors
/// Invalid device, out of memory, driver errors; [`CudaError::SyncDebug`] for a blocking
/// device→host copy in sync-debug `Error` mode.
pub fn transfer(src: &Tensor, device: Device, non_blocking: bool) -> Result<Tensor> {
    let (src, offset, nbytes) = contiguous_bytes(src)?;
    let from = src.device();
    let storage = if from.is_cpu() {
        htod(&src, cuda_index(device)?, offset, nbytes, non_blocking)?
    } else if device.is_cpu() {
        dtoh(&src, cuda_index(from)?, offset, nbytes, non_blocking)?
    } else {
        dtod(&src, cuda_index(from)?, cuda_index(device)?, offset, nbytes)?
    };
    Ok(Tensor::from_contiguous(storage, src.shape(), src.dtype()))
}

/// Copies host tensor `src` to CUDA `device` with `non_blocking = true`, the copy queued on
/// `copy_stream` while the memory comes from `device`'s *current* stream (the consumer's): the
/// pattern that overlaps a copy with compute without `record_stream` (PyTorch's CUDA
/// semantics notes, "allocate on the consumer stream":
/// <https://docs.pytorch.org/docs/stable/notes/cuda.html#cuda-streams>).
///
/// `copy_stream` first waits for the current stream, so memory that stream freed earlier is
/// not overwritten before the work still using it ran; the caller makes the consumer wait for
/// `copy_stream` (an event recorded after this call) before reading the result. Freeing the
/// result on the consumer stream after that wait is then ordered after the copy: the memory
/// returns to the consumer stream's pool at once, with no deferred free. A pinned source is
/// protected as by `.to()` (its block waits for `copy_stream`'s event).
///
/// # Errors
/// [`CudaError::DeviceMismatch`] when `copy_stream` is not on `device`;
/// [`CudaError::InvalidArgument`] when `src` is not a host tensor or `device` not a CUDA device;
/// allocation and driver errors.
pub fn to_device_on(src: &Tensor, device: Device, copy_stream: &Stream) -> Result<Tensor> {
    if !src.device().is_cpu() {
        return Err(CudaError::InvalidArgument {
            op: "to_device_on",
            what: format!("the source is on {}; pass a host tensor", src.device()),
        }
        .into());
    }
    let dev = cuda_index(device)?;
    if copy_stream.device() != dev {
        return Err(CudaError::DeviceMismatch {
            op: "to_device_on",
            expected: dev,
            actual: copy_stream.device(),
        }
        .into());
    }
    let (src, offset, nbytes) = contiguous_bytes(src)?;
    let consumer = current_stream(dev)?;
    let dst = alloc_storage(dev, nbytes)?;
    if nbytes > 0 && consumer != *copy_stream {
        copy_stream.wait_stream(&consumer)?;
    }
    let storage = htod_into(&src, dst, offset, nbytes, true, copy_stream)?;
    Ok(Tensor::from_contiguous(storage, src.shape(), src.dtype()))
}

fn htod(
    src: &Tensor,
    dev: usize,
    offset: usize,
    nbytes: usize,
    non_blocking: bool,
) -> Result<Storage> {
    let stream = current_stream(dev)?;
    let dst = alloc_storage(dev, nbytes)?;
    htod_into(src, dst, offset, nbytes, non_blocking, &stream)
}

/// Copies `nbytes` of `src`'s host memory from byte `offset` into the fresh device storage
/// `dst` on `stream`.
fn htod_into(
    src: &Tensor,
    dst: Storage,
    offset: usize,
    nbytes: usize,
    non_blocking: bool,
    stream: &Stream,
) -> Result<Storage> {
    if nbytes == 0 {
        return Ok(dst);
    }
    let dptr = dst.data_ptr();
    let storage = src.storage();
    if !non_blocking {
        super::sync_point("copy_htod")?;
    }
    let pinned = storage.is_pinned();
    let kind = CopyKind::HostToDevice;
    profiled_copy(kind, nbytes, pinned, !non_blocking, stream, || {
        if pinned {
            let guard = storage.read_host("to")?;
            let sptr = guard.bytes()[offset..].as_ptr();
            // SAFETY: the source is `nbytes` bytes of a pinned block that stays out of reuse
            // until the copy ran (`record_stream` below) and whose host writes wait for it
            // (the pending event); `dptr` is the fresh allocation `dst`, of `nbytes` bytes on
            // `dev`.
            unsafe { copy_htod_async(dptr, sptr, nbytes, stream)? };
            drop(guard);
            // Keep the pinned block from reuse until the copy ran, and make host writes wait.
            if let Some(block) = storage.pinned_block() {
                let _ = block.record_stream(stream.device_stream());
            }
            storage.add_pending_work(pending_after(stream)?);
        } else {
            let guard = storage.read_host("to")?;
            let bytes = &guard.bytes()[offset..offset + nbytes];
            // SAFETY: `dptr` is the fresh allocation `dst`, of `nbytes` bytes on `dev`.
            unsafe { stage_htod(dptr, bytes, stream)? };
        }
        if !non_blocking {
            stream.synchronize_uncounted()?;
        }
        Ok(())
    })?;
    Ok(dst)
}

fn dtoh(
    src: &Tensor,
    dev: usize,
    offset: usize,
    nbytes: usize,
    non_blocking: bool,
) -> Result<Storage> {
    let stream = current_stream(dev)?;
    let sptr = src.storage().data_ptr() + offset as u64;
    if non_blocking {
        let dst = alloc_pinned_storage(nbytes)?;
        if nbytes > 0 {
            if let Some(block) = dst.pinned_block() {
                let hptr = block.as_ptr();
                let kind = CopyKind::DeviceToHost;
                profiled_copy(kind, nbytes, true, false, &stream, || {
                    // SAFETY: `hptr` is the fresh pinned block of `dst` (`nbytes` bytes),
                    // kept from reuse by `record_stream` and from host access by the pending
                    // event; `sptr` is `nbytes` bytes of `src`'s live device storage.
                    unsafe { copy_dtoh_async(hptr, sptr, nbytes, &stream) }.map_err(Into::into)
                })?;
                let _ = block.record_stream(stream.device_stream());
                dst.add_pending_work(pending_after(&stream)?);
            }
        }
        return Ok(dst);
    }
    super::sync_point("copy_dtoh")?;
    let dst = host_destination(nbytes)?;
    if nbytes > 0 {
        let mut guard = dst.write_host("to")?;
        profiled_copy(CopyKind::DeviceToHost, nbytes, false, true, &stream, || {
            // SAFETY: `sptr` is `nbytes` bytes of `src`'s live device storage.
            unsafe { stage_dtoh(&mut guard.bytes_mut()[..nbytes], sptr, &stream) }
                .map_err(Into::into)
        })?;
    }
    Ok(dst)
}

/// Smallest blocking device→host result, in bytes, that lands in a fresh huge-page mapping
/// rather than a zero-filled allocation.
pub const MAPPED_DESTINATION_MIN_BYTES: usize = 16 << 20;

/// Pageable host memory in an anonymous huge-page mapping (see [`super::hostmem`]): the
/// destination of a large blocking device→host copy, whose pages the parallel copy-out faults
/// (512× fewer faults than small pages, and no zero-filling pass by berth).
#[derive(Debug)]
struct MappedHostMemory {
    map: Mapping,
    len: usize,
}

// SAFETY: the mapping is live, page-aligned host memory of its length, unmapped only on drop.
unsafe impl ExternalHostMemory for MappedHostMemory {
    fn as_ptr(&self) -> *mut u8 {
        self.map.as_ptr()
    }
    fn len(&self) -> usize {
        self.len
    }
    fn is_pinned(&self) -> bool {
        false
    }
}

/// A host storage of `nbytes` bytes that a copy will overwrite entirely: a huge-page mapping
/// from [`MAPPED_DESTINATION_MIN_BYTES`] on (zero until written, like every fresh mapping),
/// else a zeroed allocation (also when the mapping fails).
///
/// # Errors
/// [`crate::Error::HostOutOfMemory`] when neither can be had.
fn host_destination(nbytes: usize) -> Result<Storage> {
    if nbytes >= MAPPED_DESTINATION_MIN_BYTES {
        if let Ok(map) = Mapping::new(nbytes, Pages::Huge) {
            return Ok(Storage::host_external(Box::new(MappedHostMemory {
                map,
                len: nbytes,
            })));
        }
    }
    Storage::try_host_zeroed(nbytes)
}

/// Blocking copy of CUDA tensor `src` into the existing host tensor `dst` (`dst.copy_(src)`):
/// same dtype and shape, `dst` contiguous. Pinned `dst` gets one DMA; pageable `dst` is
/// filled through pinned staging blocks in a pipeline with a parallel copy-out, without
/// allocating a destination. A sync point (`copy_dtoh`).
///
/// # Errors
/// [`CudaError::InvalidArgument`] when the tensors do not meet the conditions above;
/// [`CudaError::SyncDebug`] in sync-debug `Error` mode; driver and staging errors.
pub fn copy_to_host(dst: &Tensor, src: &Tensor) -> Result<()> {
    let Some(c) = direct_copy(dst, src, src.device(), "copy_dtoh")? else {
        return Ok(());
    };
    let sptr = c.src.storage().data_ptr() + (c.src.storage_offset() * c.elem) as u64;
    let at = dst.storage_offset() * c.elem;
    let storage = dst.storage();
    let pinned = storage.is_pinned();
    let mut guard = storage.write_host("copy_")?;
    let out = &mut guard.bytes_mut()[at..at + c.nbytes];
    profiled_copy(
        CopyKind::DeviceToHost,
        c.nbytes,
        pinned,
        true,
        &c.stream,
        || {
            if pinned {
                // SAFETY: `out` is `c.nbytes` bytes of `dst`'s pinned storage, write-locked by
                // `guard` until the synchronisation below; `sptr` is `c.nbytes` bytes of the
                // contiguous source's live device storage.
                unsafe { copy_dtoh_async(out.as_mut_ptr(), sptr, c.nbytes, &c.stream)? };
                c.stream.synchronize_uncounted()?;
                Ok(())
            } else {
                // SAFETY: `sptr` is `c.nbytes` bytes of the contiguous source's live device
                // storage.
                unsafe { stage_dtoh(out, sptr, &c.stream) }.map_err(Into::into)
            }
        },
    )
}

/// Blocking copy of host tensor `src` into the existing CUDA tensor `dst` (`dst.copy_(src)`):
/// same dtype and shape, `dst` contiguous. From pinned memory one DMA, from pageable memory
/// through the pipelined staging of `.to()`; returns when the data is on the device. A sync
/// point (`copy_htod`).
///
/// # Errors
/// As [`copy_to_host`].
pub fn copy_from_host(dst: &Tensor, src: &Tensor) -> Result<()> {
    let Some(c) = direct_copy(dst, src, dst.device(), "copy_htod")? else {
        return Ok(());
    };
    let dptr = dst.storage().data_ptr() + (dst.storage_offset() * c.elem) as u64;
    let at = c.src.storage_offset() * c.elem;
    let storage = c.src.storage();
    let guard = storage.read_host("copy_")?;
    let bytes = &guard.bytes()[at..at + c.nbytes];
    let pinned = storage.is_pinned();
    profiled_copy(
        CopyKind::HostToDevice,
        c.nbytes,
        pinned,
        true,
        &c.stream,
        || {
            if pinned {
                // SAFETY: `bytes` is read-locked by `guard` until the synchronisation below;
                // `dptr` is `c.nbytes` bytes of `dst`'s contiguous device storage on the stream's
                // device.
                unsafe { copy_htod_async(dptr, bytes.as_ptr(), c.nbytes, &c.stream)? };
            } else {
                // SAFETY: `dptr` is `c.nbytes` bytes of `dst`'s contiguous device storage on the
                // stream's device.
                unsafe { stage_htod(dptr, bytes, &c.stream)? };
            }
            // The source stays read-locked until the copies from it ran.
            Ok(c.stream.synchronize_uncounted()?)
        },
    )?;
    drop(guard);
    Ok(())
}

/// The common start of [`copy_to_host`] and [`copy_from_host`], after their checks: the
/// current stream of the pair's CUDA device, the contiguous source, its element size (in
/// bytes) and its size in bytes.
struct DirectCopy {
    // Declared before `src` so that it drops first, as the locals it replaces did.
    stream: Stream,
    src: Tensor,
    elem: usize,
    nbytes: usize,
}

/// Checks the pair ([`check_copy_pair`]) and the CUDA side's device `cuda`, makes `src`
/// contiguous; `None` when there are no bytes to copy, else passes the sync point `sync`
/// (`copy_dtoh` / `copy_htod`) and takes the device's current stream.
fn direct_copy(
    dst: &Tensor,
    src: &Tensor,
    cuda: Device,
    sync: &'static str,
) -> Result<Option<DirectCopy>> {
    check_copy_pair(dst, src)?;
    let dev = cuda_index(cuda)?;
    let src = src.contiguous()?;
    let elem = src.dtype().size_in_bytes();
    let nbytes = src.numel() * elem;
    if nbytes == 0 {
        return Ok(None);
    }
    super::sync_point(sync)?;
    let stream = current_stream(dev)?;
    Ok(Some(DirectCopy {
        src,
        elem,
        nbytes,
        stream,
    }))
}

fn check_copy_pair(dst: &Tensor, src: &Tensor) -> Result<()> {
    if dst.dtype() != src.dtype() || dst.shape() != src.shape() || !dst.is_contiguous() {
        return Err(CudaError::InvalidArgument {
            op: "copy_",
            what: format!(
                "a direct host/device copy needs equal dtypes and shapes and a contiguous \
                 destination (got {:?} {:?} from {:?} {:?})",
                dst.dtype(),
                dst.shape(),
                src.dtype(),
                src.shape()
            ),
        }
        .into());
    }
    Ok(())
}

fn dtod(src: &Tensor, from: usize, to: usize, offset: usize, nbytes: usize) -> Result<Storage> {
    let stream = current_stream(to)?;
    let dst = alloc_storage(to, nbytes)?;
    if nbytes == 0 {
        return Ok(dst);
    }
    let sptr = src.storage().data_ptr() + offset as u64;
    if from == to {
        profiled_copy(
            CopyKind::DeviceToDevice,
            nbytes,
            true,
            false,
            &stream,
            || {
                // SAFETY: `dst` is a fresh allocation of `nbytes` bytes on `to`; `sptr` is
                // `nbytes` bytes of `src`'s live storage on the same device, ordered on the same
                // stream.
                unsafe { copy_dtod_async(dst.data_ptr(), sptr, nbytes, &stream) }
                    .map_err(Into::into)
            },
        )?;
    } else {
        // The copy runs on the destination's stream: make it wait for the source's work.
        let src_stream = current_stream(from)?;
        stream.wait_stream(&src_stream)?;
        profiled_copy(CopyKind::Peer, nbytes, true, false, &stream, || {
            // SAFETY: `dst` is a fresh allocation of `nbytes` bytes on `to`; `sptr` is
            // `nbytes` bytes of `src`'s live storage on `from`, kept from reuse by
            // `record_stream` below.
            unsafe { copy_peer_async(dst.data_ptr(), from, sptr, nbytes, &stream) }
                .map_err(Into::into)
        })?;
        if let Some(cm) = src.storage().cuda_memory() {
            let _ = cm.allocation().record_stream(stream.id());
        }
    }
    Ok(dst)
}
