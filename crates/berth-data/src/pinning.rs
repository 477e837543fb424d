//! Whether and where a loader pins its batches, decided in one place, and the pinning itself.
//!
//! Note [Where pinning is decided]: PyTorch's rule (`torch/utils/data/dataloader.py`,
//! `_utils/pin_memory.py`): `pin_memory=True` puts each batch in page-locked host memory on
//! the host, off the training thread (a pin thread beside the workers, or inline with
//! `num_workers=0`), so the later `.to(device, non_blocking=True)` is a true asynchronous copy;
//! without an accelerator it warns and pins nothing; `pin_memory_device` names the device the
//! pinned memory is for and means nothing without `pin_memory=True` (a warning). Where the batch
//! then goes is the caller's `.to(device)`, here a
//! [`DevicePrefetcher`](crate::prefetch::DevicePrefetcher). In berth-data:
//! - [`decide`] is the only place that turns the options (`pin_memory`, `pin_memory_device`,
//!   `pin_memory_target`) into a [`Pinning`] or nothing, with PyTorch's warnings; the loader
//!   builders call it once, at `build`.
//! - A loader that pins hands every collate a [`CollateContext`] whose `pin` is the target:
//!   [`collate_output`] is the only place a collate's output buffer is chosen (pinned, or a
//!   recycled pageable buffer, Note [Recycled collate buffers]).
//! - After the collate, [`Pinning::finish`] runs the batch's pin step in the worker (on the
//!   calling thread without workers): [`pin_memory`], one [`MapTensors`] walk of [`pin_tensor`],
//!   the one per-tensor rule (a tensor already pinned, or on a device, stays as it is).
//!
//! Note [Collate into pinned memory]: PyTorch collates a batch into ordinary (shared) memory and
//! its pin thread then copies it into page-locked memory: one full extra copy per batch.
//! berth-data's workers are threads (Note [Workers are threads]), so there is no pin thread:
//! tensor collates allocate their output in the target's pinned memory ([`collate_output`]),
//! the gather of rows *is* the pinning, and the pin step after the collate is a no-op for those
//! tensors. It still copies what a custom collate left in pageable memory, keeps container types
//! (<https://github.com/pytorch/pytorch/issues/70158>), and goes through a custom batch type's
//! own [`MapTensors`] (PyTorch's `pin_memory()` method hook,
//! <https://github.com/pytorch/pytorch/pull/16743>). PyTorch's thread workers pin the same way,
//! inside the worker, as a post-fetch step.

use std::sync::Arc;

use berth::{DType, Device, Tensor};

use crate::batch::MapTensors;
use crate::collatable::CollateContext;
use crate::error::Result;
use crate::pin::PinTarget;
use berth::alloc::warnings::warn_once;

/// The worker-side pin step of a loader, type-erased over the batch type (set by the builders'
/// `pin_memory(true)`, which is where the batch type is known to implement [`MapTensors`]).
pub(crate) type PinFn<B> = Arc<dyn Fn(B, &PinTarget) -> Result<B> + Send + Sync>;

/// The pin step for batches of type `B`: [`pin_memory`].
pub(crate) fn pin_fn<B: MapTensors + 'static>() -> PinFn<B> {
    Arc::new(|b: B, t: &PinTarget| pin_memory(b, t))
}

/// A loader's decided pinning: where batches are pinned, and how.
pub(crate) struct Pinning<B> {
    target: PinTarget,
    device: Option<Device>,
    pin: PinFn<B>,
}

impl<B> Clone for Pinning<B> {
    fn clone(&self) -> Self {
        Pinning {
            target: self.target.clone(),
            device: self.device,
            pin: Arc::clone(&self.pin),
        }
    }
}

impl<B> Pinning<B> {
    /// The `pin_memory_device` the loader was given, if any.
    pub(crate) fn device(&self) -> Option<Device> {
        self.device
    }

    /// The batch's pin step, run right after the collate in the worker.
    ///
    /// # Errors
    /// The pinned allocator's error.
    pub(crate) fn finish(&self, batch: B) -> Result<B> {
        (self.pin)(batch, &self.target)
    }
}

/// The [`CollateContext`] of one batch: the worker, and the pinned target when the loader pins.
pub(crate) fn context<B>(pinning: Option<&Pinning<B>>, worker_id: Option<usize>) -> CollateContext {
    CollateContext {
        worker_id,
        pin: pinning.map(|p| p.target.clone()),
    }
}

/// Decides whether a loader pins, and into what (Note [Where pinning is decided]).
///
/// - `pin` is `Some` exactly when `pin_memory(true)` was asked for.
/// - `device` (`pin_memory_device`) without `pin_memory(true)`: PyTorch's warning, no pinning.
///   A device that is not CUDA: a warning, no pinning (pinned memory is for copies to an
///   accelerator).
/// - `target` (`pin_memory_target`) given: pin there. Otherwise berth's pinned host caching
///   allocator when CUDA is available, else PyTorch's "no accelerator" warning and no pinning.
pub(crate) fn decide<B>(
    pin: Option<PinFn<B>>,
    device: Option<Device>,
    target: Option<PinTarget>,
) -> Option<Pinning<B>> {
    let Some(pin) = pin else {
        if device.is_some() {
            warn_once("pin_memory_device-without-pin_memory", || {
                "pin memory device is set and pin_memory flag is not used then device pinned memory won't be used, please set pin_memory to true, if you need to use the device pin memory".into()
            });
        }
        return None;
    };
    if let Some(d) = device.filter(|d| !d.is_cuda()) {
        warn_once("pin_memory_device-not-accelerator", || {
            format!(
                "pin_memory_device={d} is not an accelerator, then device pinned memory won't be used"
            )
        });
        return None;
    }
    let target =
        target.or_else(|| crate::pinned_default::default_pinned_host().map(PinTarget::new));
    match target {
        Some(target) => Some(Pinning {
            target,
            device,
            pin,
        }),
        None => {
            warn_once("pin_memory-no-accelerator", || {
                "'pin_memory' argument is set as true but no accelerator is found, then device pinned memory won't be used.".into()
            });
            None
        }
    }
}

/// `batch` with every tensor in `target`'s page-locked memory (PyTorch's `pin_memory` on a
/// batch): one [`MapTensors`] walk of [`pin_tensor`]. Containers keep their type; a type with its
/// own [`MapTensors`] body is called through it.
///
/// # Errors
/// The pinned allocator's error.
pub fn pin_memory<B: MapTensors>(batch: B, target: &PinTarget) -> Result<B> {
    batch.map_tensors(&mut |t| pin_tensor(t, target))
}

/// A pinned copy of a pageable host tensor; a tensor already pinned, or on a device, is
/// returned as is (`Tensor.pin_memory()`; no second copy, pytorch#21076).
///
/// # Errors
/// The pinned allocator's error.
pub fn pin_tensor(t: Tensor, target: &PinTarget) -> Result<Tensor> {
    if t.is_pinned() || !t.device().is_cpu() || target.host().is_pinned(&t) {
        return Ok(t);
    }
    let out = target.host().empty_pinned(t.shape(), t.dtype())?;
    {
        let mut w = out.storage().write_host("pin_memory")?;
        copy_tensor_bytes(&t, w.bytes_mut())?;
    }
    Ok(out)
}

/// A contiguous host tensor of `shape`/`dtype` for a collate's output: pinned when `ctx` asks,
/// else over a recycled pageable buffer (Note [Recycled collate buffers] in `host_pool.rs`).
/// Its bytes are unspecified: the collate must write every one of them.
///
/// # Errors
/// The pinned allocator's error, [`berth::Error::HostOutOfMemory`], or the tensor
/// constructor's error.
pub fn collate_output(shape: &[usize], dtype: DType, ctx: &CollateContext) -> Result<Tensor> {
    match &ctx.pin {
        Some(target) => target.host().empty_pinned(shape, dtype),
        None => crate::host_pool::empty_recycled(shape, dtype),
    }
}

/// Copies the bytes of `src` (any layout, on the host) into `dst[..src.nbytes()]`.
///
/// A tensor with no elements copies nothing: its strides and storage offset are not looked at,
/// since a view of zero elements may point past the end of an empty storage (a row of a `[5, 0]`
/// tensor has offset 4 in a storage of 0 bytes).
pub(crate) fn copy_tensor_bytes(src: &Tensor, dst: &mut [u8]) -> Result<()> {
    if src.numel() == 0 {
        return Ok(());
    }
    let owned;
    let src = if src.is_contiguous() {
        src
    } else {
        owned = src.contiguous()?;
        &owned
    };
    let n = src.nbytes();
    let off = src.storage_offset() * src.element_size();
    let r = src.storage().read_host("collate")?;
    dst[..n].copy_from_slice(&r.bytes()[off..off + n]);
    Ok(())
}
