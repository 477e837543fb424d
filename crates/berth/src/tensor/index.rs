//! Indexing by a tensor of indices: [`Tensor::index_select`].

use super::Tensor;
use crate::device_kernels::dispatch::alloc_tensor;
use crate::device_kernels::interface::View;
use crate::layout::wrap_dim;
use crate::ops::infer;
use crate::{DType, Error, Result};

impl Tensor {
    /// The slices `index[0], index[1], ...` of dimension `dim`, in that order, as a new
    /// tensor (`torch.index_select`): its shape is `self`'s with dimension `dim` of size
    /// `index.numel()`. `index` is a 1-D (or 0-d) `i64` tensor on `self`'s device; `dim` may
    /// be negative (counted from the end). On CUDA the gather is one kernel, so a batch can
    /// be gathered on the device from a data set kept there.
    ///
    /// A 0-d `self` takes `dim` 0 or -1 and a one-element index (0), and gives a 0-d
    /// result, as PyTorch.
    ///
    /// # Errors
    /// [`Error::DimOutOfRange`]; [`Error::InvalidArgument`] for a 0-d `self` and an index of
    /// other than one element; [`Error::UnsupportedDType`] for an index that is not `i64`;
    /// [`Error::Shape`] for an index of more than one dimension; [`Error::DeviceMismatch`];
    /// on the CPU [`Error::IndexOutOfRange`] (or [`Error::InvalidArgument`] for a negative
    /// index). CUDA indices are not read back (that would be a sync): one outside the
    /// dimension gives a slice of zeros there, where PyTorch raises a device-side assert.
    ///
    /// # Examples
    /// ```
    /// use berth::{Device, Tensor};
    /// let x = Tensor::from_vec((0..6).map(|v| v as f32).collect(), &[3, 2], Device::Cpu)?;
    /// let i = Tensor::from_vec(vec![2i64, 0], &[2], Device::Cpu)?;
    /// assert_eq!(x.index_select(0, &i)?.to_vec::<f32>()?, vec![4.0, 5.0, 0.0, 1.0]);
    /// assert_eq!(x.index_select(1, &i.narrow(0, 1, 1)?)?.to_vec::<f32>()?, vec![0.0, 2.0, 4.0]);
    /// # Ok::<(), berth::Error>(())
    /// ```
    pub fn index_select(&self, dim: isize, index: &Tensor) -> Result<Tensor> {
        let op = "index_select";
        let d = wrap_dim(dim, self.dim(), op)?;
        if self.dim() == 0 {
            // A 0-d tensor is indexed as the one element of dimension 0 (`dim` 0 or -1): the
            // index must hold one value, 0, and the result is 0-d, as PyTorch's.
            if index.numel() != 1 {
                return Err(Error::InvalidArgument {
                    op,
                    what: format!(
                        "index_select(): Index to scalar can have only 1 value, got {} value(s)",
                        index.numel()
                    ),
                });
            }
            return self.reshape(&[1])?.index_select(0, index)?.reshape(&[]);
        }
        infer::same_device(op, self, index)?;
        if index.dtype() != DType::I64 {
            return Err(Error::UnsupportedDType {
                op,
                dtype: index.dtype(),
                expected: "i64 (indices)",
            });
        }
        if index.dim() > 1 {
            return Err(Error::Shape {
                op,
                what: format!(
                    "the index must be 1-D, got shape {:?}: flatten it first",
                    index.shape()
                ),
            });
        }
        let shape = self.shape();
        let (outer, size, inner) = (
            shape[..d].iter().product::<usize>(),
            shape[d],
            shape[d + 1..].iter().product::<usize>(),
        );
        let mut out_shape = shape.to_vec();
        out_shape[d] = index.numel();
        let out = alloc_tensor(self.device(), &out_shape, self.dtype(), op)?;
        if self.device().is_cpu() {
            for &k in &index.to_vec::<i64>()? {
                let k = usize::try_from(k).map_err(|_| Error::InvalidArgument {
                    op,
                    what: format!("index {k} is negative; indices must be in 0..{size}"),
                })?;
                if k >= size {
                    return Err(Error::IndexOutOfRange {
                        op,
                        dim: d,
                        index: k,
                        size,
                    });
                }
            }
        }
        if let Some(k) = self.kernels(op)? {
            let (src, idx) = (self.contiguous()?, index.contiguous()?);
            k.index_select(
                View::of(&out),
                View::of(&src),
                View::of(&idx),
                [outer, size, inner],
            )?;
        }
        Ok(out)
    }
}
