//! `DevicePrefetcher`: copies batch n+1 to the device on a side stream while the caller computes
//! on batch n.
//!
//! Note [Prefetch stream ordering]: the memory of batch n+1 is allocated on the caller's
//! current (compute) stream, and its copy is queued with `non_blocking` on a dedicated copy
//! stream that first waits for the compute stream (so memory the compute stream freed is not
//! overwritten while queued kernels still use it); an event is recorded after the copy. When
//! the caller takes the batch, the compute stream waits for that event, so kernels never read
//! a half-copied batch. The batch's memory belongs to the compute stream's pool: freed there
//! after use, it is reusable at once, in stream order, with no `record_stream` and no deferred
//! free (PyTorch's "allocate on the consumer stream" pattern). Allocating on the copy stream
//! instead, with `record_stream`, left every freed batch waiting for an event while the host
//! ran ahead of the GPU, and the copy stream's pool grew with the lag: 151 MB reserved for a
//! 14 MB peak in `berth train` on an H200. If the caller switches its current stream between
//! taking batches, the batch is also `record_stream`ed on the new one. The pinned source is
//! protected by the transfer layer itself, which records the copy stream on the pinned block
//! and makes host writes wait for the copy. On a CPU target the prefetcher just moves batches
//! through (`to(cpu)` is a no-op).
//!
//! Both per-tensor steps here, the copy and `record_stream`, walk the batch through its
//! [`MapTensors`] (Note [One batch traversal]).

use berth::cuda::{current_stream, Event, Stream};
use berth::{Device, Tensor};

use crate::batch::MapTensors;
use crate::error::Result;

/// `t` copied to `device` with `non_blocking = true`: with `copy_stream`, a host tensor gets
/// memory from `device`'s current stream and its copy is queued on `copy_stream`
/// ([`berth::cuda::transfer::to_device_on`]); without, the copy is queued on the current stream
/// (`Tensor::to`).
///
/// # Errors
/// The copy's error.
fn to_device_async(t: Tensor, device: Device, copy_stream: Option<&Stream>) -> Result<Tensor> {
    match copy_stream {
        Some(s) if t.device().is_cpu() && device.is_cuda() => {
            Ok(berth::cuda::transfer::to_device_on(&t, device, s)?)
        }
        _ => Ok(t.to(device, t.dtype(), true, false)?),
    }
}

/// [`Tensor::record_stream`] for a CUDA tensor; host tensors are left alone.
///
/// # Errors
/// The allocator's error.
fn record_stream(t: Tensor, stream: &Stream) -> Result<Tensor> {
    if t.device().is_cuda() {
        t.record_stream(stream)?;
    }
    Ok(t)
}

/// Wraps a batch iterator (usually a [`LoaderIter`](crate::LoaderIter) with `pin_memory`) and
/// yields its batches on `device`, one batch copied ahead on a side stream. See Note [Prefetch
/// stream ordering].
pub struct DevicePrefetcher<I, B> {
    inner: I,
    device: Device,
    cuda_index: Option<usize>,
    side: Option<Stream>,
    next: Option<(Result<B>, Option<Event>)>,
}

impl<I, B> std::fmt::Debug for DevicePrefetcher<I, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevicePrefetcher")
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

impl<I: Iterator<Item = Result<B>>, B: MapTensors> DevicePrefetcher<I, B> {
    /// Starts prefetching `inner`'s batches to `device`: creates the copy stream (on a CUDA
    /// device) and queues the copy of the first batch.
    ///
    /// # Errors
    /// The device cannot be used (no CUDA, index out of range) or the stream cannot be created.
    pub fn new(inner: I, device: Device) -> Result<Self> {
        let device = device.canonical()?;
        let (cuda_index, side) = if device.is_cuda() {
            let idx = usize::from(device.index().unwrap_or(0));
            (
                Some(idx),
                Some(Stream::new(idx, 0).map_err(berth::Error::from)?),
            )
        } else {
            (None, None)
        };
        let mut p = DevicePrefetcher {
            inner,
            device,
            cuda_index,
            side,
            next: None,
        };
        p.preload();
        Ok(p)
    }

    /// The copy stream (`None` on a CPU target).
    pub fn copy_stream(&self) -> Option<&Stream> {
        self.side.as_ref()
    }

    fn preload(&mut self) {
        self.next = match self.inner.next() {
            None => None,
            Some(Err(e)) => Some((Err(e), None)),
            Some(Ok(batch)) => match &self.side {
                Some(side) => {
                    // Memory from the current (compute) stream, copies on the side stream
                    // (Note [Prefetch stream ordering]).
                    let device = self.device;
                    let moved = batch.map_tensors(&mut |t| to_device_async(t, device, Some(side)));
                    match side.record_event() {
                        Ok(ev) => Some((moved, Some(ev))),
                        Err(e) => Some((Err(berth::Error::from(e).into()), None)),
                    }
                }
                None => {
                    let device = self.device;
                    let moved = batch.map_tensors(&mut |t| to_device_async(t, device, None));
                    Some((moved, None))
                }
            },
        };
    }

    fn hand_over(&self, batch: B, ready: &Event) -> Result<B> {
        let idx = self.cuda_index.unwrap_or(0);
        let compute = current_stream(idx).map_err(berth::Error::from)?;
        compute.wait_event(ready).map_err(berth::Error::from)?;
        // A no-op on the stream the batch was allocated on (the usual case); needed only when
        // the caller switched its current stream since (Note [Prefetch stream ordering]).
        batch.map_tensors(&mut |t| record_stream(t, &compute))
    }
}

impl<I: Iterator<Item = Result<B>>, B: MapTensors> Iterator for DevicePrefetcher<I, B> {
    type Item = Result<B>;

    fn next(&mut self) -> Option<Result<B>> {
        let (batch, ready) = self.next.take()?;
        let batch = match (batch, ready) {
            (Ok(b), Some(ev)) => self.hand_over(b, &ev),
            (other, _) => other,
        };
        self.preload();
        Some(batch)
    }
}
