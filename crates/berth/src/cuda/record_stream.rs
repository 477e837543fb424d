//! `Tensor::record_stream`: PyTorch's `Tensor.record_stream(stream)`
//! (<https://docs.pytorch.org/docs/stable/generated/torch.Tensor.record_stream.html>).

use crate::cuda::{CudaError, Stream};
use crate::{Error, Result, Tensor};

impl Tensor {
    /// Marks this tensor's memory as used by the work queued on `stream`, so that when the
    /// tensor is freed its memory is handed out again only after `stream` has passed the work
    /// queued on it at that moment (PyTorch's `Tensor.record_stream`). Needed when memory
    /// allocated on one stream is used on another.
    ///
    /// - A CUDA tensor: `stream` must be a stream of the tensor's device; its allocator defers
    ///   the reuse (``Note [`record_stream` and deferred free]`` in berth-alloc). A no-op on the
    ///   stream the memory was allocated on.
    /// - A pinned host tensor of berth's pinned allocator (`pin_memory()`, a non-blocking copy
    ///   to the host, a pinned DataLoader batch): the pinned allocator records an event on `stream`'s own device
    ///   when the tensor is freed, so a copy queued there still reading the block is safe.
    /// - A zero-byte tensor: nothing to protect, a no-op.
    ///
    /// Views share their base's memory, so recording a view records the whole allocation.
    ///
    /// # Errors
    /// [`CudaError::DeviceMismatch`] for a stream of another device than the tensor's;
    /// [`CudaError::InvalidArgument`] for a tensor whose memory no stream can use (pageable
    /// host memory, meta) or that no berth allocator owns (host memory that another owner
    /// reports pinned); [`CudaError::Alloc`] / [`CudaError::PinnedAlloc`] if the allocator
    /// no longer knows the memory.
    pub fn record_stream(&self, stream: &Stream) -> Result<()> {
        let storage = self.storage();
        if storage.nbytes() == 0 {
            return Ok(());
        }
        if let Some(cm) = storage.cuda_memory() {
            if cm.device_index() != stream.device() {
                return Err(CudaError::DeviceMismatch {
                    op: "record_stream",
                    expected: cm.device_index(),
                    actual: stream.device(),
                }
                .into());
            }
            return cm
                .allocation()
                .record_stream(stream.id())
                .map_err(|source| {
                    Error::from(CudaError::Alloc {
                        device: cm.device_index(),
                        source,
                    })
                });
        }
        // The storage holds its pinned block: ask the block, not the allocator by address.
        let pinned = storage.pinned_block().ok_or_else(|| not_recordable(self))?;
        pinned
            .record_stream(stream.device_stream())
            .map_err(|source| CudaError::PinnedAlloc { source }.into())
    }
}

fn not_recordable(t: &Tensor) -> Error {
    CudaError::InvalidArgument {
        op: "record_stream",
        what: format!(
            "a tensor on {} in {} memory is used by no CUDA stream; record_stream takes a CUDA \
             tensor or a pinned host tensor",
            t.device(),
            if t.is_pinned() {
                "another owner's pinned"
            } else if t.device().is_cpu() {
                "pageable"
            } else {
                "no"
            }
        ),
    }
    .into()
}
