//! Byte-level copies: raw host↔device and device↔device copies on a stream, the parallel host
//! copy, and the staged pipelines for pageable host memory (copied through pinned staging
//! blocks of the pinned caching allocator), plus [`PinnedBuffer`], a pinned block held by
//! value.
//!
//! berth's tensor-level transfers (`.to()`, `copy_`) are built on these. Addresses are raw
//! `u64` device pointers and raw host pointers, so the copy functions are `unsafe`: the caller
//! guarantees the memory is live, large enough, and not used by anyone else until the copy
//! ran (queued work is ordered on the stream; the host side is the caller's to keep alive).
//!
//! - **host→device** from pageable memory ([`stage_htod`]): the data is staged through pinned
//!   blocks of [`STAGING_CHUNK_BYTES`] in a pipeline (copy chunk i into pinned memory on the
//!   CPU while the DMA of chunk i−1 runs); it returns once the last chunk was staged, without
//!   waiting for the DMA.
//! - **device→host** into pageable memory ([`stage_dtoh`]): two pinned staging blocks of
//!   [`DTOH_STAGING_CHUNK_BYTES`], the DMA of one chunk running while the CPU copies the
//!   previous one out from several threads; returns when the data is on the host.
//! - **device→device**: `cuMemcpyDtoDAsync` on one device ([`copy_dtod_async`],
//!   [`copy_dtod_raw`]), `cuMemcpyPeerAsync` across devices ([`copy_peer_async`]; the driver
//!   uses peer access when the devices have it).

use crate::event::Event;
use crate::hostmem::copy_by_huge_pages;
use crate::memory::host_allocator;
use crate::stream::{current_stream, Stream};
use crate::{ffi, CudaError};
use berth_alloc::HostAllocation;

/// Size of one staging block for pageable host→device copies, in bytes.
pub const STAGING_CHUNK_BYTES: usize = 16 << 20;

/// Size of one of the two staging blocks for blocking device→pageable-host copies, in bytes:
/// 16 huge pages, one per host thread of the copy-out.
pub const DTOH_STAGING_CHUNK_BYTES: usize = 32 << 20;

/// A block of pinned host memory from the pinned caching allocator
/// ([`memory::host_allocator`](crate::memory::host_allocator)); returns to the cache on drop,
/// reused only after the streams that used it passed their events. Contents unspecified when
/// new.
#[derive(Debug)]
pub struct PinnedBuffer {
    block: HostAllocation,
}

impl PinnedBuffer {
    /// At least `nbytes` bytes of pinned host memory (builds the pinned allocator on first
    /// use, in the context of the thread's current device).
    ///
    /// # Errors
    /// [`CudaError::Unavailable`] without CUDA, [`CudaError::PinnedAlloc`] when the pinned
    /// allocator refuses.
    pub fn new(nbytes: usize) -> Result<PinnedBuffer, CudaError> {
        let block = host_allocator()?
            .allocate(nbytes)
            .map_err(|source| CudaError::PinnedAlloc { source })?;
        Ok(PinnedBuffer { block })
    }

    /// The start of the block.
    pub fn as_ptr(&self) -> *mut u8 {
        self.block.as_ptr()
    }

    /// The block's usable length, in bytes.
    pub fn len(&self) -> usize {
        self.block.len()
    }

    /// Whether the block holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The pinned allocator's block itself (to hand it to a host storage).
    pub fn into_allocation(self) -> HostAllocation {
        self.block
    }
}

/// `dst.copy_from_slice(src)` on several threads (rayon) for buffers of 4 MiB and more.
///
/// # Panics
/// When the lengths differ, as `copy_from_slice`.
pub fn parallel_copy(dst: &mut [u8], src: &[u8]) {
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

/// Queues a copy of `bytes` bytes from host address `src` to device address `dst` on `stream`
/// (`cuMemcpyHtoDAsync`). From pinned memory the copy is asynchronous; from pageable memory
/// the driver returns once it has read the source.
///
/// # Safety
/// `src..src+bytes` is live host memory, not written until the copy ran (the caller
/// synchronises on `stream` or records an event before reusing it); `dst..dst+bytes` is
/// device memory of `stream`'s device that nothing else uses until the copy ran.
///
/// # Errors
/// [`CudaError::Driver`], [`CudaError::Unavailable`].
pub unsafe fn copy_htod_async(
    dst: u64,
    src: *const u8,
    bytes: usize,
    stream: &Stream,
) -> Result<(), CudaError> {
    // SAFETY: the caller's contract; `stream` (borrowed) keeps its handle alive.
    unsafe { ffi::memcpy_htod_async(stream.device(), dst, src, bytes, stream.as_raw()) }
}

/// Queues a copy of `bytes` bytes from device address `src` to host address `dst` on
/// `stream` (`cuMemcpyDtoHAsync`).
///
/// # Safety
/// `dst..dst+bytes` is host memory that stays alive, unread and unwritten until the copy ran;
/// `src..src+bytes` is live device memory of `stream`'s device.
///
/// # Errors
/// [`CudaError::Driver`], [`CudaError::Unavailable`].
pub unsafe fn copy_dtoh_async(
    dst: *mut u8,
    src: u64,
    bytes: usize,
    stream: &Stream,
) -> Result<(), CudaError> {
    // SAFETY: the caller's contract; `stream` (borrowed) keeps its handle alive.
    unsafe { ffi::memcpy_dtoh_async(stream.device(), dst, src, bytes, stream.as_raw()) }
}

/// Queues a copy of `bytes` bytes between device addresses of `stream`'s device
/// (`cuMemcpyDtoDAsync`).
///
/// # Safety
/// Both ranges are live device memory of `stream`'s device until the copy ran, and nothing
/// else writes `dst..dst+bytes` meanwhile.
///
/// # Errors
/// [`CudaError::Driver`], [`CudaError::Unavailable`].
pub unsafe fn copy_dtod_async(
    dst: u64,
    src: u64,
    bytes: usize,
    stream: &Stream,
) -> Result<(), CudaError> {
    // SAFETY: the caller's contract; `stream` (borrowed) keeps its handle alive.
    unsafe { ffi::memcpy_dtod_async(stream.device(), dst, src, bytes, stream.as_raw()) }
}

/// Queues a copy of `bytes` bytes from `src` on device `src_device` to `dst` on `stream`'s
/// device, on `stream` (`cuMemcpyPeerAsync`). The copy is ordered on `stream` only: make it
/// wait for the source device's work first ([`Stream::wait_stream`]).
///
/// # Safety
/// Both ranges are live device memory of their devices until the copy ran, and nothing else
/// writes `dst..dst+bytes` meanwhile.
///
/// # Errors
/// [`CudaError::InvalidDevice`], [`CudaError::Driver`], [`CudaError::Unavailable`].
pub unsafe fn copy_peer_async(
    dst: u64,
    src_device: usize,
    src: u64,
    bytes: usize,
    stream: &Stream,
) -> Result<(), CudaError> {
    // SAFETY: the caller's contract; `stream` (borrowed) keeps its handle alive.
    unsafe {
        ffi::memcpy_peer_async(
            stream.device(),
            dst,
            src_device,
            src,
            bytes,
            stream.as_raw(),
        )
    }
}

/// Copies `bytes` bytes from device address `src` to `dst` on `device`, ordered on the
/// thread's current stream of `device` (`cuMemcpyDtoDAsync`). For benchmarks and kernels
/// working on raw storages.
///
/// # Safety
/// `src..src+bytes` and `dst..dst+bytes` are device memory of `device` that stays allocated
/// until the copy ran (e.g. memory of live tensors or allocations, with work ordered on the
/// current stream), and nothing else reads `dst..dst+bytes` or writes either range
/// meanwhile.
///
/// # Errors
/// [`CudaError::InvalidDevice`], [`CudaError::Driver`], [`CudaError::Unavailable`].
pub unsafe fn copy_dtod_raw(
    device: usize,
    dst: u64,
    src: u64,
    bytes: usize,
) -> Result<(), CudaError> {
    let stream = current_stream(device)?;
    // SAFETY: the caller's contract; `stream` is `device`'s.
    unsafe { copy_dtod_async(dst, src, bytes, &stream) }
}

/// Pageable host→device through pinned staging blocks of [`STAGING_CHUNK_BYTES`], pipelined:
/// the DMA of one chunk runs while the CPU fills the next block. Returns once every chunk is
/// queued on `stream`; the staging blocks go back to the cache, reusable once `stream` passed
/// their copies, and `bytes` may be reused at once.
///
/// # Safety
/// `dptr..dptr+bytes.len()` is device memory of `stream`'s device that nothing else uses
/// until the copies ran.
///
/// # Errors
/// [`CudaError::PinnedAlloc`] when no staging block can be had; driver errors.
pub unsafe fn stage_htod(dptr: u64, bytes: &[u8], stream: &Stream) -> Result<(), CudaError> {
    let host = host_allocator()?;
    for (i, chunk) in bytes.chunks(STAGING_CHUNK_BYTES).enumerate() {
        let block = host
            .allocate(chunk.len())
            .map_err(|source| CudaError::PinnedAlloc { source })?;
        // SAFETY: `block` is a fresh pinned block of at least `chunk.len()` bytes that no
        // queued copy uses (the cache hands it out only after its events passed).
        let dst = unsafe { std::slice::from_raw_parts_mut(block.as_ptr(), chunk.len()) };
        parallel_copy(dst, chunk);
        let at = dptr + (i * STAGING_CHUNK_BYTES) as u64;
        // SAFETY: the block stays out of reuse until `stream` passed this copy
        // (`record_stream` below); the destination is the caller's.
        unsafe { copy_htod_async(at, block.as_ptr(), chunk.len(), stream)? };
        // The block goes back to the cache now, reusable once this stream passed the copy.
        let _ = block.record_stream(stream.device_stream());
    }
    Ok(())
}

/// Blocking device→pageable host through two pinned staging blocks of
/// [`DTOH_STAGING_CHUNK_BYTES`]: the DMA of chunk i+1 runs while the CPU copies chunk i out in
/// huge-page pieces from several threads (PyTorch copies straight into pageable memory, which
/// the driver stages itself). Returns when `out` holds the data. Not a counted sync point:
/// the caller declares one ([`sync_point`](crate::sync_point)).
///
/// # Safety
/// `sptr..sptr+out.len()` is live device memory of `stream`'s device, not written until the
/// copies ran.
///
/// # Errors
/// [`CudaError::PinnedAlloc`] when no staging block can be had; driver errors.
pub unsafe fn stage_dtoh(out: &mut [u8], sptr: u64, stream: &Stream) -> Result<(), CudaError> {
    let host = host_allocator()?;
    let chunk = DTOH_STAGING_CHUNK_BYTES.min(out.len());
    let err = |source| CudaError::PinnedAlloc { source };
    let blocks = [
        host.allocate(chunk).map_err(err)?,
        host.allocate(chunk).map_err(err)?,
    ];
    let events = [Event::new(false), Event::new(false)];
    let pieces: Vec<(usize, usize)> = (0..out.len())
        .step_by(chunk)
        .map(|at| (at, chunk.min(out.len() - at)))
        .collect();
    let issue = |i: usize| -> Result<(), CudaError> {
        let (at, len) = pieces[i];
        // SAFETY: the slot's block holds `chunk >= len` bytes that nothing reads until its
        // event passed (the loop below waits for it); the source is the caller's.
        unsafe { copy_dtoh_async(blocks[i % 2].as_ptr(), sptr + at as u64, len, stream)? };
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
