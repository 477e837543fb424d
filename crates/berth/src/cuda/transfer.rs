//! Transfers behind `.to()`: cpu→cuda, cuda→cpu, cuda:i→cuda:j, and the device memory and
//! pinned memory that tensor storages hold.
//!
//! - **Device memory** comes from the device's caching allocator on the current stream
//!   ([`alloc_storage`]); [`CudaMemory`] is the tensor layer's [`DeviceMemory`].
//! - **host→device**: from pinned memory, one `cuMemcpyHtoDAsync` on the current stream; the
//!   source storage gets a pending event so a host write waits for the copy (BUG-02 (a)), and
//!   the pinned block is `record_stream`ed so it is not reused before the copy ran. From
//!   pageable memory, the data is staged through pinned blocks of [`STAGING_CHUNK_BYTES`] in a
//!   pipeline (copy chunk i into pinned memory on the CPU while the DMA of chunk i−1 runs);
//!   the caller returns once the last chunk was staged, without waiting for the DMA.
//! - **device→host**: `non_blocking` lands in pinned memory and the result carries a pending
//!   event, so any host read waits for the copy (BUG-01 design (a): a stale read is
//!   impossible). Blocking copies are sync points ([`sync_point`](super::sync_point)). A
//!   blocking copy into pageable memory goes through two pinned staging blocks, the DMA of one
//!   chunk running while the CPU copies the previous one out from several threads; `.to(cpu)`
//!   lands in a fresh huge-page mapping (no zero-filling pass), and [`copy_to_host`] into an
//!   existing tensor (`Tensor::copy_`) allocates nothing.
//! - **device→device**: `cuMemcpyDtoDAsync` on one device, `cuMemcpyPeerAsync` across devices
//!   (the driver uses peer access when the devices have it).

use super::event::Event;
use super::hostmem::{copy_by_huge_pages, Mapping, Pages};
use super::memory::{allocator, host_allocator};
use super::stream::{current_stream, Stream};
use super::CudaError;
use crate::alloc::{Allocation, DeviceAllocator, HostAllocation};
use crate::storage::{DeviceMemory, ExternalHostMemory, PendingWork};
use crate::{Device, Result, Storage, Tensor};
use std::sync::Arc;

/// Size of one staging block for pageable host→device copies, in bytes.
pub const STAGING_CHUNK_BYTES: usize = 16 << 20;

/// Size of one of the two staging blocks for blocking device→pageable-host copies, in bytes:
/// 16 huge pages, one per host thread of the copy-out.
pub const DTOH_STAGING_CHUNK_BYTES: usize = 32 << 20;

/// A device allocation held by a tensor storage; returns to its caching allocator on drop.
#[derive(Debug)]
pub struct CudaMemory {
    alloc: Allocation,
    device: usize,
    len: usize,
}

impl CudaMemory {
    /// The allocation (for `record_stream`).
    pub fn allocation(&self) -> &Allocation {
        &self.alloc
    }
}

impl DeviceMemory for CudaMemory {
    fn device_ptr(&self) -> u64 {
        self.alloc.ptr().0
    }
    fn len(&self) -> usize {
        self.len
    }
    fn device(&self) -> Device {
        Device::Cuda(self.device as u16)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A pinned block held by a host tensor storage; returns to the pinned cache on drop (reused
/// only after the streams that used it passed their events).
#[derive(Debug)]
pub struct PinnedMemory {
    block: HostAllocation,
}

impl ExternalHostMemory for PinnedMemory {
    fn as_ptr(&self) -> *mut u8 {
        self.block.as_ptr()
    }
    fn len(&self) -> usize {
        self.block.len()
    }
    fn is_pinned(&self) -> bool {
        true
    }
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
    let alloc = allocator(device)?
        .allocate(nbytes, stream.id())
        .map_err(|e| CudaError::Alloc {
            device,
            out_of_memory: e.is_out_of_memory(),
            message: e.to_string(),
        })?;
    Ok(Storage::device(Box::new(CudaMemory {
        alloc,
        device,
        len: nbytes,
    })))
}

/// `nbytes` bytes of pinned host memory as a host storage (contents unspecified).
///
/// # Errors
/// [`CudaError::Unavailable`] or the pinned allocator's error.
pub fn alloc_pinned_storage(nbytes: usize) -> Result<Storage> {
    let block = host_allocator()?
        .allocate(nbytes)
        .map_err(|e| CudaError::HostAlloc {
            message: e.to_string(),
        })?;
    Ok(Storage::host_external(Box::new(PinnedMemory { block })))
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

/// Copies `src` to `device` (one side CUDA), returning a contiguous tensor of the same dtype.
/// What the CUDA [`DeviceKernels::transfer`](crate::backend::DeviceKernels) calls.
///
/// # Errors
/// Invalid device, out of memory, driver errors; [`CudaError::SyncDebug`] for a blocking
/// device→host copy in sync-debug `Error` mode.
pub fn transfer(src: &Tensor, device: Device, non_blocking: bool) -> Result<Tensor> {
    let src = src.contiguous()?;
    let elem = src.dtype().size_in_bytes();
    let nbytes = src.numel() * elem;
    let offset = src.storage_offset() * elem;
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

fn htod(
    src: &Tensor,
    dev: usize,
    offset: usize,
    nbytes: usize,
    non_blocking: bool,
) -> Result<Storage> {
    let stream = current_stream(dev)?;
    let dst = alloc_storage(dev, nbytes)?;
    if nbytes == 0 {
        return Ok(dst);
    }
    let dptr = dst.data_ptr();
    let storage = src.storage();
    if !non_blocking {
        super::sync_point("copy_htod")?;
    }
    if let Some(ext) = storage.external_host_memory().filter(|e| e.is_pinned()) {
        let guard = storage.read_host("to")?;
        let sptr = guard.bytes()[offset..].as_ptr();
        ffi::htod_async(dev, dptr, sptr, nbytes, stream.as_raw())?;
        drop(guard);
        // Keep the pinned block from reuse until the copy ran, and make host writes wait.
        let _ = host_allocator()?.record_stream(ext.as_ptr(), stream.id());
        storage.add_pending_work(pending_after(&stream)?);
    } else {
        let guard = storage.read_host("to")?;
        let bytes = &guard.bytes()[offset..offset + nbytes];
        stage_htod(dev, dptr, bytes, &stream)?;
    }
    if !non_blocking {
        stream.synchronize_uncounted()?;
    }
    Ok(dst)
}

/// Pageable host→device through pinned staging blocks, pipelined: the DMA of one chunk runs
/// while the CPU fills the next block. Returns once every chunk is queued.
fn stage_htod(dev: usize, dptr: u64, bytes: &[u8], stream: &Stream) -> Result<()> {
    let host = host_allocator()?;
    for (i, chunk) in bytes.chunks(STAGING_CHUNK_BYTES).enumerate() {
        let block = host
            .allocate(chunk.len())
            .map_err(|e| CudaError::HostAlloc {
                message: e.to_string(),
            })?;
        // SAFETY: `block` is a fresh pinned block of at least `chunk.len()` bytes that no
        // queued copy uses (the cache hands it out only after its events passed).
        let dst = unsafe { std::slice::from_raw_parts_mut(block.as_ptr(), chunk.len()) };
        parallel_copy(dst, chunk);
        let at = dptr + (i * STAGING_CHUNK_BYTES) as u64;
        ffi::htod_async(dev, at, block.as_ptr(), chunk.len(), stream.as_raw())?;
        // The block goes back to the cache now, reusable once this stream passed the copy.
        let _ = block.record_stream(stream.id());
    }
    Ok(())
}

/// `dst.copy_from_slice(src)` on several threads for large buffers.
pub(crate) fn parallel_copy(dst: &mut [u8], src: &[u8]) {
    use rayon::prelude::*;
    const PIECE: usize = 1 << 20;
    if src.len() < 4 * PIECE {
        dst.copy_from_slice(src);
    } else {
        dst.par_chunks_mut(PIECE)
            .zip(src.par_chunks(PIECE))
            .for_each(|(d, s)| d.copy_from_slice(s));
    }
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
            let ext = dst.external_host_memory().map(|e| e.as_ptr());
            if let Some(hptr) = ext {
                ffi::dtoh_async(dev, hptr, sptr, nbytes, stream.as_raw())?;
                let _ = host_allocator()?.record_stream(hptr, stream.id());
                dst.add_pending_work(pending_after(&stream)?);
            }
        }
        return Ok(dst);
    }
    super::sync_point("copy_dtoh")?;
    let dst = host_destination(nbytes)?;
    if nbytes > 0 {
        let mut guard = dst.write_host("to")?;
        stage_dtoh(dev, &mut guard.bytes_mut()[..nbytes], sptr, &stream)?;
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

impl ExternalHostMemory for MappedHostMemory {
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
    if pinned {
        ffi::dtoh_async(c.dev, out.as_mut_ptr(), sptr, c.nbytes, c.stream.as_raw())?;
        c.stream.synchronize_uncounted()?;
        Ok(())
    } else {
        stage_dtoh(c.dev, out, sptr, &c.stream)
    }
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
    if storage.is_pinned() {
        ffi::htod_async(c.dev, dptr, bytes.as_ptr(), c.nbytes, c.stream.as_raw())?;
    } else {
        stage_htod(c.dev, dptr, bytes, &c.stream)?;
    }
    // The source stays read-locked until the copies from it ran.
    c.stream.synchronize_uncounted()?;
    drop(guard);
    Ok(())
}

/// The common start of [`copy_to_host`] and [`copy_from_host`], after their checks: the CUDA
/// device of the pair, the device's current stream, the contiguous source, its element size
/// (in bytes) and its size in bytes.
struct DirectCopy {
    dev: usize,
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
        dev,
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

/// Blocking device→pageable host through two pinned staging blocks of
/// [`DTOH_STAGING_CHUNK_BYTES`]: the DMA of chunk i+1 runs while the CPU copies chunk i out in
/// huge-page pieces from several threads (PyTorch copies straight into pageable memory, which
/// the driver stages itself).
fn stage_dtoh(dev: usize, out: &mut [u8], sptr: u64, stream: &Stream) -> Result<()> {
    let host = host_allocator()?;
    let chunk = DTOH_STAGING_CHUNK_BYTES.min(out.len());
    let err = |e: crate::alloc::host::HostAllocError| CudaError::HostAlloc {
        message: e.to_string(),
    };
    let blocks = [
        host.allocate(chunk).map_err(err)?,
        host.allocate(chunk).map_err(err)?,
    ];
    let events = [Event::new(false), Event::new(false)];
    let pieces: Vec<(usize, usize)> = (0..out.len())
        .step_by(chunk)
        .map(|at| (at, chunk.min(out.len() - at)))
        .collect();
    let issue = |i: usize| -> Result<()> {
        let (at, len) = pieces[i];
        ffi::dtoh_async(
            dev,
            blocks[i % 2].as_ptr(),
            sptr + at as u64,
            len,
            stream.as_raw(),
        )?;
        events[i % 2].record_on(stream)?;
        Ok(())
    };
    issue(0)?;
    for i in 0..pieces.len() {
        if i + 1 < pieces.len() {
            issue(i + 1)?;
        }
        events[i % 2].synchronize_uncounted()?;
        let (at, len) = pieces[i];
        // SAFETY: the block holds `len` bytes that the DMA completed (its event passed), and
        // no other copy writes it until the next `issue` for this slot, which comes after.
        let src = unsafe { std::slice::from_raw_parts(blocks[i % 2].as_ptr(), len) };
        copy_by_huge_pages(&mut out[at..at + len], src);
    }
    Ok(())
}

/// Copies `bytes` bytes from device address `src` to `dst` on `device`, ordered on the
/// thread's current stream of `device` (`cuMemcpyDtoDAsync`). For benchmarks and kernels
/// working on raw storages.
///
/// # Errors
/// [`CudaError::InvalidDevice`], [`CudaError::Driver`].
pub fn copy_dtod_raw(device: usize, dst: u64, src: u64, bytes: usize) -> Result<()> {
    let stream = current_stream(device)?;
    Ok(ffi::dtod_async(device, dst, src, bytes, stream.as_raw())?)
}

fn dtod(src: &Tensor, from: usize, to: usize, offset: usize, nbytes: usize) -> Result<Storage> {
    let stream = current_stream(to)?;
    let dst = alloc_storage(to, nbytes)?;
    if nbytes == 0 {
        return Ok(dst);
    }
    let sptr = src.storage().data_ptr() + offset as u64;
    if from == to {
        ffi::dtod_async(to, dst.data_ptr(), sptr, nbytes, stream.as_raw())?;
    } else {
        // The copy runs on the destination's stream: make it wait for the source's work.
        let src_stream = current_stream(from)?;
        stream.wait_stream(&src_stream)?;
        ffi::peer_async(to, dst.data_ptr(), from, sptr, nbytes, stream.as_raw())?;
        if let Some(mem) = src.storage().device_memory() {
            if let Some(cm) = mem.as_any().downcast_ref::<CudaMemory>() {
                let _ = cm.allocation().record_stream(stream.id());
            }
        }
    }
    Ok(dst)
}

#[cfg(feature = "cuda")]
mod ffi {
    use super::super::context::bind;
    use super::super::CudaError;
    use cudarc::driver::sys;

    fn r(
        op: &'static str,
        device: usize,
        bytes: usize,
        code: sys::CUresult,
    ) -> Result<(), CudaError> {
        code.result()
            .map_err(|e| CudaError::from_driver(op, e, device, bytes))
    }

    fn s(raw: u64) -> sys::CUstream {
        raw as usize as sys::CUstream
    }

    pub(super) fn htod_async(
        dev: usize,
        dst: u64,
        src: *const u8,
        n: usize,
        stream: u64,
    ) -> Result<(), CudaError> {
        bind(dev)?;
        // SAFETY: `src..src+n` is live host memory kept alive (and write-guarded) until the
        // copy ran; `dst..dst+n` is a live allocation of this device.
        r("cuMemcpyHtoDAsync", dev, n, unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), n, s(stream))
        })
    }

    pub(super) fn dtoh_async(
        dev: usize,
        dst: *mut u8,
        src: u64,
        n: usize,
        stream: u64,
    ) -> Result<(), CudaError> {
        bind(dev)?;
        // SAFETY: `dst..dst+n` is host memory that outlives the copy (pinned block guarded by
        // a pending event, or a buffer the caller synchronises on before releasing).
        r("cuMemcpyDtoHAsync", dev, n, unsafe {
            sys::cuMemcpyDtoHAsync_v2(dst.cast(), src, n, s(stream))
        })
    }

    pub(super) fn dtod_async(
        dev: usize,
        dst: u64,
        src: u64,
        n: usize,
        stream: u64,
    ) -> Result<(), CudaError> {
        bind(dev)?;
        // SAFETY: both ranges are live allocations of this device.
        r("cuMemcpyDtoDAsync", dev, n, unsafe {
            sys::cuMemcpyDtoDAsync_v2(dst, src, n, s(stream))
        })
    }

    pub(super) fn peer_async(
        to: usize,
        dst: u64,
        from: usize,
        src: u64,
        n: usize,
        stream: u64,
    ) -> Result<(), CudaError> {
        let src_ctx = bind(from)?;
        let dst_ctx = bind(to)?;
        // SAFETY: both ranges are live allocations of their devices; contexts are retained.
        r("cuMemcpyPeerAsync", to, n, unsafe {
            sys::cuMemcpyPeerAsync(dst, dst_ctx, src, src_ctx, n, s(stream))
        })
    }
}

#[cfg(not(feature = "cuda"))]
mod ffi {
    use super::super::CudaError;

    fn no() -> Result<(), CudaError> {
        Err(CudaError::unavailable(
            "berth was built without the `cuda` feature",
        ))
    }
    pub(super) fn htod_async(
        _: usize,
        _: u64,
        _: *const u8,
        _: usize,
        _: u64,
    ) -> Result<(), CudaError> {
        no()
    }
    pub(super) fn dtoh_async(
        _: usize,
        _: *mut u8,
        _: u64,
        _: usize,
        _: u64,
    ) -> Result<(), CudaError> {
        no()
    }
    pub(super) fn dtod_async(_: usize, _: u64, _: u64, _: usize, _: u64) -> Result<(), CudaError> {
        no()
    }
    pub(super) fn peer_async(
        _: usize,
        _: u64,
        _: usize,
        _: u64,
        _: usize,
        _: u64,
    ) -> Result<(), CudaError> {
        no()
    }
}
