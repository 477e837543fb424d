//! `Tensor::pin_memory()`: page-locked copies of host tensors through the pinned host caching
//! allocator.
//!
//! `Tensor::is_pinned()` lives with the tensor (it asks the storage, which never touches the
//! driver: `is_pinned` creates no context, <https://github.com/pytorch/pytorch/issues/128988>).

use super::copy::parallel_copy;
use super::pinned::with_fill_source;
use super::transfer::alloc_pinned_storage;
use super::CudaError;
use crate::{DType, Result, Tensor};
use std::sync::Arc;

/// PyTorch's legacy type name of a tensor, e.g. `torch.cuda.FloatTensor` (used in messages).
pub fn legacy_type_name(device_is_cuda: bool, dtype: DType) -> String {
    dtype.torch_tensor_type(device_is_cuda)
}

impl Tensor {
    /// A contiguous host tensor of `shape` and `dtype` in page-locked memory, its contents
    /// unspecified (`torch.empty(shape, dtype=dtype, pin_memory=True)`): a block of berth's
    /// pinned host caching allocator, so `is_pinned()` is `true` and a copy from it to a device
    /// is one DMA. The block may be a recycled one holding an earlier tensor's bytes; it goes
    /// back to the cache when the tensor's storage is dropped, reused only after the streams it
    /// was used on passed their work. The first call initialises the pinned allocator (and the
    /// current device's context). A zero-byte tensor holds an empty block.
    ///
    /// # Errors
    /// 1. [`crate::Error::NumelOverflow`] / [`crate::Error::StorageSizeOverflow`] for a shape
    ///    too large to describe.
    /// 2. [`CudaError::Unavailable`] without CUDA (no driver or device, or berth built without
    ///    its `cuda` feature): a typed error, never a panic. [`CudaError::PinnedAlloc`] when the
    ///    memory cannot be pinned; [`CudaError::Driver`] / [`CudaError::Config`] when the pinned
    ///    allocator cannot be built.
    pub fn empty_pinned(shape: &[usize], dtype: DType) -> Result<Tensor> {
        let nbytes = crate::layout::checked_nbytes(shape, dtype, "empty_pinned")?;
        let storage = alloc_pinned_storage(nbytes)?;
        Ok(Tensor::from_storage(
            Arc::new(storage),
            crate::Layout::contiguous(shape),
            dtype,
        ))
    }

    /// A copy of this host tensor in page-locked memory (`Tensor.pin_memory()`), with the same
    /// shape and strides at offset 0, holding only the bytes the view spans (a 10-float slice
    /// of a 100-float tensor pins 40 bytes; an expanded tensor pins its one row). An already pinned tensor is returned as is, sharing its
    /// storage (<https://github.com/pytorch/pytorch/pull/23484>). The first call initialises the
    /// pinned allocator (and the current device's context), so `is_pinned()` is `true` at once
    /// (<https://github.com/pytorch/pytorch/issues/149032>).
    ///
    /// A block of 4 MiB or more that the pinned cache cannot serve is mapped with transparent
    /// huge pages, filled by a parallel copy of `self` (which faults its pages) and page-locked
    /// with one `cuMemHostRegister`, instead of `cuMemHostAlloc` + copy (see Note [Filled
    /// first pins] in berth-cuda's `pinned.rs`); it is cached and reused like any pinned block,
    /// and unregistered and unmapped when the cache frees it.
    ///
    /// # Errors
    /// 1. [`CudaError::CannotPin`] for a device or meta tensor: "cannot pin
    ///    'torch.cuda.FloatTensor' only dense CPU tensors can be pinned", PyTorch's message
    ///    (<https://github.com/unit8co/darts/issues/436>).
    /// 2. [`CudaError::Unavailable`] without CUDA; [`CudaError::HostAlloc`] when the memory
    ///    cannot be pinned.
    pub fn pin_memory(&self) -> Result<Tensor> {
        if !self.device().is_cpu() {
            let name = if self.device().is_meta() {
                format!("torch.meta.{}", &legacy_type_name(false, self.dtype())[6..])
            } else {
                legacy_type_name(true, self.dtype())
            };
            return Err(CudaError::CannotPin { tensor_type: name }.into());
        }
        if self.is_pinned() {
            return Ok(self.alias());
        }
        // Only the bytes the view spans are pinned, at offset 0 with the same strides
        // (PyTorch's `_pin_memory`: a storage of `computeStorageNbytes(sizes, strides)`):
        // a 10-float slice of a 100-float tensor pins 40 bytes, not 400.
        let layout = self.layout();
        let isz = self.dtype().size_in_bytes();
        let span = (layout.required_elements().saturating_sub(layout.offset())) * isz;
        // An empty view may sit at an offset past its storage: it spans nothing.
        let start = if span == 0 { 0 } else { layout.offset() * isz };
        let src = self.storage();
        let from = src.read_host("pin_memory")?;
        let bytes = &from.bytes()[start..start + span];
        // A block the cache must create is filled as it is made (Note [Filled first pins]).
        let (dst, filled) = with_fill_source(bytes, || alloc_pinned_storage(span));
        let dst = dst?;
        if !filled {
            let mut to = dst.write_host("pin_memory")?;
            parallel_copy(&mut to.bytes_mut()[..span], bytes);
        }
        drop(from);
        Ok(Tensor::from_storage(
            Arc::new(dst),
            crate::Layout::from_parts(layout.shape().to_vec(), layout.strides().to_vec(), 0),
            self.dtype(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// <https://github.com/unit8co/darts/issues/436>
    #[test]
    fn cannot_pin_type_names_are_pytorchs() {
        assert_eq!(legacy_type_name(true, DType::F32), "torch.cuda.FloatTensor");
        assert_eq!(legacy_type_name(false, DType::I64), "torch.LongTensor");
        assert_eq!(
            CudaError::CannotPin {
                tensor_type: legacy_type_name(true, DType::F32)
            }
            .to_string(),
            "cannot pin 'torch.cuda.FloatTensor' only dense CPU tensors can be pinned"
        );
    }
}
