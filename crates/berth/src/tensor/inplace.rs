//! In-place operations (`add_`, `sub_`, `mul_`, `div_`, `add_scalar_`, `mul_scalar_`,
//! `add_scaled_`, `copy_`, `fill_`, `zero_`): they write through the shared storage, so every
//! alias sees the result (see the aliasing model on [`crate::Storage`]). The right-hand side
//! must broadcast to `self`'s shape; when it shares `self`'s storage it is read into a
//! temporary first, so `x.add_(&x)` is well defined.
//!
//! `self` itself must not have two elements at one memory location (a dimension of size > 1
//! with stride 0, as after `expand`): PyTorch's `assert_no_internal_overlap`, a typed
//! [`Error::InternalOverlap`] here, checked before any kernel on every device. `fill_` and
//! `zero_` are the exception, as in PyTorch: writing one value is idempotent, so overlap is
//! harmless.

use super::Tensor;
use crate::device_kernels::interface::View;
use crate::layout::broadcast_shapes;
use crate::ops::{infer, BinaryOp};
use crate::{Error, Layout, Result};

impl Tensor {
    /// `rhs` broadcast to `self`'s shape, staged when it aliases `self`.
    fn inplace_rhs(&self, op: &'static str, rhs: &Tensor) -> Result<(Tensor, Layout)> {
        infer::same_device(op, self, rhs)?;
        let shape = broadcast_shapes(self.shape(), rhs.shape(), op)?;
        if shape != self.shape() {
            return Err(Error::Shape {
                op,
                what: format!(
                    "output with shape {:?} doesn't match the broadcast shape {:?}",
                    self.shape(),
                    shape
                ),
            });
        }
        let r = if rhs.shares_storage(self) {
            rhs.clone()?
        } else {
            rhs.alias()
        };
        let l = r.layout().broadcast_to(self.shape(), op)?;
        Ok((r, l))
    }

    fn binary_(&self, op: BinaryOp, rhs: &Tensor) -> Result<()> {
        let (_, dtype) = infer::binary(op.name(), op.float_only(), self, rhs)?;
        let kop = infer::kernel_op(op, dtype, false)?;
        infer::no_internal_overlap(op.name(), self)?;
        let (r, l) = self.inplace_rhs(op.name(), rhs)?;
        if let Some(k) = self.kernels(op.name())? {
            k.binary(
                kop,
                View::of(self),
                None,
                View {
                    storage: r.storage(),
                    layout: &l,
                    dtype: r.dtype(),
                },
            )?;
        }
        Ok(())
    }

    fn scalar_(&self, op: BinaryOp, s: f64) -> Result<()> {
        let dtype = infer::scalar_inplace(op, self, s)?;
        let kop = infer::kernel_op(op, dtype, true)?;
        let s = infer::kernel_scalar(s, dtype);
        infer::no_internal_overlap(op.name(), self)?;
        if let Some(k) = self.kernels(op.name())? {
            k.scalar(kop, View::of(self), None, s, false)?;
        }
        Ok(())
    }

    /// `self += rhs` (broadcast to `self`'s shape; logical or for bool, as [`Tensor::add`]).
    ///
    /// # Errors
    /// [`Error::InternalOverlap`] when `self` has elements sharing memory (`expand`); shape
    /// that does not broadcast to `self`; dtype or device mismatch.
    pub fn add_(&self, rhs: &Tensor) -> Result<()> {
        self.binary_(BinaryOp::Add, rhs)
    }
    /// `self -= rhs`.
    ///
    /// # Errors
    /// As [`Tensor::add_`]; [`Error::BoolArithmetic`] for bool.
    pub fn sub_(&self, rhs: &Tensor) -> Result<()> {
        self.binary_(BinaryOp::Sub, rhs)
    }
    /// `self *= rhs`.
    ///
    /// # Errors
    /// As [`Tensor::add_`].
    pub fn mul_(&self, rhs: &Tensor) -> Result<()> {
        self.binary_(BinaryOp::Mul, rhs)
    }
    /// `self /= rhs` (floats).
    ///
    /// # Errors
    /// As [`Tensor::add_`]; integer dtypes.
    pub fn div_(&self, rhs: &Tensor) -> Result<()> {
        self.binary_(BinaryOp::Div, rhs)
    }
    /// `self += s` (`s` converted to the dtype; for bool logical or with `s != 0`; an
    /// integral `s` wraps into an integer dtype, as PyTorch's).
    ///
    /// # Errors
    /// [`Error::ResultTypeCast`] for an integer or bool tensor and an `s` that is not an
    /// integer in `i64`'s range (PyTorch: "result type Float can't be cast to the desired
    /// output type Long"; [`Tensor::add_scalar`] returns the f32 result instead);
    /// [`Error::InternalOverlap`]; device errors.
    pub fn add_scalar_(&self, s: f64) -> Result<()> {
        self.scalar_(BinaryOp::Add, s)
    }
    /// `self *= s` (`s` converted to the dtype; for bool logical and with `s != 0`).
    ///
    /// # Errors
    /// As [`Tensor::add_scalar_`].
    pub fn mul_scalar_(&self, s: f64) -> Result<()> {
        self.scalar_(BinaryOp::Mul, s)
    }
    /// `self += alpha * other` (`Tensor.add_(other, alpha=alpha)`; the SGD update).
    ///
    /// f32 and f64 tensors of one shape, both contiguous and in distinct storages, take one
    /// kernel and no temporary ([`DeviceKernels::add_scaled`](crate::device_kernels::DeviceKernels::add_scaled));
    /// anything else is `other.mul_scalar(alpha)` then `add_`. Both give the same bits
    /// (`Note [Fused updates are exact]`).
    ///
    /// # Errors
    /// As [`Tensor::add_`]; [`Error::InvalidArgument`] for an integer or bool `self` and an
    /// `alpha` that is not an integer (PyTorch: "For integral input tensors, argument alpha
    /// must not be a floating point number.").
    pub fn add_scaled_(&self, other: &Tensor, alpha: f64) -> Result<()> {
        if alpha == 1.0 {
            return self.add_(other);
        }
        if !self.dtype().is_float() && infer::integral_i64(alpha).is_none() {
            // PyTorch's `alpha_check` (else `other * alpha` would be f32: Note [Scalar
            // promotion]).
            return Err(Error::InvalidArgument {
                op: "add_",
                what: format!(
                    "For integral input tensors, argument alpha must not be a floating point number (got {alpha}; the tensor is {})",
                    self.dtype()
                ),
            });
        }
        let fused = matches!(self.dtype(), crate::DType::F32 | crate::DType::F64)
            && other.dtype() == self.dtype()
            && other.device() == self.device()
            && other.shape() == self.shape()
            && self.is_contiguous()
            && other.is_contiguous()
            && !self.shares_storage(other);
        if !fused {
            return self.add_(&other.mul_scalar(alpha)?);
        }
        if let Some(k) = self.kernels("add")? {
            k.add_scaled(View::of(self), View::of(other), alpha)?;
        }
        Ok(())
    }

    /// Copy `src`'s values into `self` (broadcast to `self`'s shape, converted to `self`'s
    /// dtype) (`Tensor.copy_`), also between the CPU and a CUDA device or two CUDA devices.
    /// A host↔device copy of equal dtype and shape into a contiguous `self` goes straight into
    /// `self`'s memory ([`crate::cuda::transfer::copy_to_host`] /
    /// [`copy_from_host`](crate::cuda::transfer::copy_from_host): pipelined through pinned
    /// staging blocks, nothing allocated); any other cross-device copy moves `src` to `self`'s
    /// device first. Cross-device copies are blocking, as PyTorch's default
    /// (`non_blocking=False`).
    ///
    /// # Errors
    /// [`Error::InternalOverlap`] when `self` has elements sharing memory (`expand`); shape
    /// that does not broadcast; the CPU or a CUDA device against meta; reading a meta `src`
    /// into a real tensor; transfer errors.
    pub fn copy_(&self, src: &Tensor) -> Result<()> {
        infer::no_internal_overlap("copy_", self)?;
        if src.device().is_meta() && !self.device().is_meta() {
            return Err(Error::MetaNoData { op: "copy_" });
        }
        if self.device() != src.device() && !self.device().is_meta() {
            return self.copy_across_(src);
        }
        let (r, l) = self.inplace_rhs("copy_", src)?;
        if let Some(k) = self.kernels("copy_")? {
            k.copy(
                View::of(self),
                View {
                    storage: r.storage(),
                    layout: &l,
                    dtype: r.dtype(),
                },
            )?;
        }
        Ok(())
    }

    /// `copy_` from another device (neither is meta).
    fn copy_across_(&self, src: &Tensor) -> Result<()> {
        let shape = broadcast_shapes(self.shape(), src.shape(), "copy_")?;
        if shape != self.shape() {
            return Err(Error::Shape {
                op: "copy_",
                what: format!(
                    "output with shape {:?} doesn't match the broadcast shape {:?}",
                    self.shape(),
                    shape
                ),
            });
        }
        let direct = self.dtype() == src.dtype()
            && self.shape() == src.shape()
            && self.is_contiguous()
            && (self.device().is_cpu() || src.device().is_cpu());
        #[cfg(feature = "cuda")]
        if direct {
            return if self.device().is_cpu() {
                crate::cuda::transfer::copy_to_host(self, src)
            } else {
                crate::cuda::transfer::copy_from_host(self, src)
            };
        }
        #[cfg(not(feature = "cuda"))]
        let _ = direct;
        let moved = src.to(self.device(), src.dtype(), false, false)?;
        self.copy_(&moved)
    }

    /// Set every element to `value` (converted to the dtype). Allowed on a view whose
    /// elements share memory (`expand`), as PyTorch's `fill_`: the write is idempotent.
    ///
    /// # Errors
    /// [`Error::ValueOverflow`] when `value` does not fit the dtype (as [`Tensor::full`]);
    /// device errors.
    pub fn fill_(&self, value: f64) -> Result<()> {
        infer::fill_value("fill_", value, self.dtype())?;
        if let Some(k) = self.kernels("fill_")? {
            k.fill(View::of(self), value)?;
        }
        Ok(())
    }

    /// Set every element to zero.
    ///
    /// # Errors
    /// Device errors.
    pub fn zero_(&self) -> Result<()> {
        self.fill_(0.0)
    }
}
