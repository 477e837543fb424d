//! The `.to()` contract (PyTorch's `Tensor.to`) and host reads (`to_vec`, `item`).
//!
//! Rules (PyTorch's, <https://github.com/pytorch/pytorch/issues/12454> and
//! <https://github.com/pytorch/pytorch/pull/53143>):
//! 1. The target device is canonicalised first (`cuda` → `cuda:<current>`; an index past the
//!    device count is a typed error).
//! 2. Same device and same dtype and `copy == false` → the *same* tensor: a handle sharing
//!    storage (writes through it are visible in the original).
//! 3. Otherwise a new tensor with new storage: a dtype change converts, a device change copies.
//! 4. Out of meta there is no data: `to(cpu)` from meta is [`Error::MetaNoData`] ("Cannot copy
//!    out of meta tensor; no data!"); use [`Tensor::to_empty`].
//!
//! One difference from PyTorch: a new tensor always has dense row-major strides. PyTorch's
//! default `memory_format=torch.preserve_format` keeps the strides of a dense tensor whose
//! elements fill their storage without gaps in another order (`x.t().to("cuda").stride()` is
//! `(1, 3)` for a `[2, 3]` `x`; berth gives `[2, 1]`). The values are the same; only the layout
//! differs. [`Tensor::clone`] does the same.

use super::Tensor;
use crate::device_kernels::dispatch::{alloc_tensor, kernels_for};
use crate::device_kernels::interface::View;
use crate::{DType, Device, Element, Error, Result};

/// Options of [`Tensor::to_with`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ToOptions {
    /// Return before a host↔device copy completes (from/into pinned memory); host reads of
    /// the result wait for the copy.
    pub non_blocking: bool,
    /// Always return new storage, even when nothing changes.
    pub copy: bool,
}

impl Tensor {
    /// Move and/or convert (`Tensor.to(device, dtype, non_blocking, copy)`); see the module
    /// rules. The two flags are positional as in PyTorch's signature, where Python callers
    /// name them; in Rust prefer [`Tensor::to_with`] with [`ToOptions`]
    /// (`ToOptions { copy: true, ..Default::default() }`), which names them, or
    /// [`Tensor::to_device`] / [`Tensor::to_dtype`] when both are false. The result keeps `requires_grad` unless `dtype` is not floating-point (only
    /// floating-point tensors can require gradients, as in PyTorch). Integer to integer
    /// conversions are exact and wrap as C++'s casts (`2^53 + 1` as i32 is 1).
    ///
    /// # Errors
    /// 1. The device cannot be used (out-of-range index, no CUDA, `mps`).
    /// 2. [`Error::MetaNoData`] when copying out of meta.
    /// 3. Device, allocation or transfer errors.
    pub fn to(
        &self,
        device: Device,
        dtype: DType,
        non_blocking: bool,
        copy: bool,
    ) -> Result<Tensor> {
        let target = device.canonical()?;
        let here = self.device();
        if here == target && dtype == self.dtype() && !copy {
            return Ok(self.alias());
        }
        if here.is_meta() && !target.is_meta() {
            return Err(Error::MetaNoData { op: "to" });
        }
        let mut out = if target.is_meta() {
            alloc_tensor(target, self.shape(), dtype, "to")?
        } else {
            // Convert where the data is, then move.
            let converted = if dtype != self.dtype() {
                let dst = alloc_tensor(here, self.shape(), dtype, "to")?;
                kernels_for(here, "to")?.copy(View::of(&dst), View::of(self))?;
                dst
            } else if here == target {
                self.clone()?
            } else {
                self.contiguous()?
            };
            if here == target {
                converted
            } else {
                let cuda_side = if here.is_cuda() { here } else { target };
                kernels_for(cuda_side, "to")?.transfer(&converted, target, non_blocking)?
            }
        };
        // A conversion to an integer or bool dtype is not differentiable: only floating-point
        // tensors can require gradients, as in PyTorch.
        out.requires_grad = self.requires_grad && dtype.is_float();
        Ok(out)
    }

    /// [`Tensor::to`] with options.
    ///
    /// # Errors
    /// As [`Tensor::to`].
    pub fn to_with(&self, device: Device, dtype: DType, opts: ToOptions) -> Result<Tensor> {
        self.to(device, dtype, opts.non_blocking, opts.copy)
    }

    /// Move to `device`, keeping the dtype (`x.to(device)`).
    ///
    /// # Errors
    /// As [`Tensor::to`].
    pub fn to_device(&self, device: Device) -> Result<Tensor> {
        self.to(device, self.dtype(), false, false)
    }

    /// Convert to `dtype` on the same device (`x.to(dtype)`).
    ///
    /// # Errors
    /// As [`Tensor::to`].
    pub fn to_dtype(&self, dtype: DType) -> Result<Tensor> {
        self.to(self.device(), dtype, false, false)
    }

    /// `to_device(cpu)` (`x.cpu()`): the same tensor when already on the CPU.
    ///
    /// # Errors
    /// As [`Tensor::to`].
    pub fn cpu(&self) -> Result<Tensor> {
        self.to_device(Device::Cpu)
    }

    /// `to_device(cuda)` on the current CUDA device (`x.cuda()`).
    ///
    /// # Errors
    /// As [`Tensor::to`]; CUDA not available.
    pub fn cuda(&self) -> Result<Tensor> {
        self.to_device(Device::CudaCurrent)
    }

    /// `to_dtype(f16)` (`x.half()`).
    ///
    /// # Errors
    /// As [`Tensor::to`].
    pub fn half(&self) -> Result<Tensor> {
        self.to_dtype(DType::F16)
    }

    /// `to_dtype(bf16)` (`x.bfloat16()`).
    ///
    /// # Errors
    /// As [`Tensor::to`].
    pub fn bfloat16(&self) -> Result<Tensor> {
        self.to_dtype(DType::BF16)
    }

    /// `to_dtype(f32)` (`x.float()`).
    ///
    /// # Errors
    /// As [`Tensor::to`].
    pub fn float(&self) -> Result<Tensor> {
        self.to_dtype(DType::F32)
    }

    /// `to_dtype(f64)` (`x.double()`).
    ///
    /// # Errors
    /// As [`Tensor::to`].
    pub fn double(&self) -> Result<Tensor> {
        self.to_dtype(DType::F64)
    }

    /// A tensor of the same shape and dtype on `device` with unspecified contents
    /// (`Module.to_empty` for one tensor; the way out of meta,
    /// <https://github.com/pytorch/pytorch/pull/53143>).
    ///
    /// # Errors
    /// The device cannot be used; allocation failure.
    pub fn to_empty(&self, device: Device) -> Result<Tensor> {
        let mut t = Tensor::empty_op("to_empty", self.shape(), self.dtype(), device)?;
        t.requires_grad = self.requires_grad;
        Ok(t)
    }

    /// The elements in row-major order (`Tensor.tolist()` flattened). Device tensors are
    /// copied to the host first. `T` must be the tensor's dtype: unlike `tolist()`, which
    /// converts every element to a Python number, this does not convert (a silent f32 → f64
    /// widening would hide a dtype mistake); [`Tensor::to_vec_f64`] is the converting read.
    ///
    /// # Errors
    /// 1. [`Error::ElementType`] when `T` is not the tensor's dtype.
    /// 2. [`Error::MetaNoData`] for meta tensors
    ///    (<https://github.com/pytorch/pytorch/issues/119588>).
    /// 3. [`Error::StorageSizeOverflow`] when the elements would take more than `isize::MAX`
    ///    bytes (an expanded tensor has as many as its shape says, whatever its storage);
    ///    [`Error::HostOutOfMemory`] when the host cannot hold them.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        if self.dtype() != T::DTYPE {
            return Err(Error::ElementType {
                op: "to_vec",
                actual: self.dtype(),
                requested: T::DTYPE,
            });
        }
        crate::layout::checked_nbytes(self.shape(), self.dtype(), "to_vec")?;
        self.read_host("to_vec", |l, s| {
            crate::cpu::try_collect(l.numel(), l.indices().map(|i| T::from_repr(s[i])))
        })?
    }

    /// The elements converted to `f64`, whatever the dtype.
    ///
    /// # Errors
    /// [`Error::MetaNoData`] for meta tensors; [`Error::StorageSizeOverflow`] (8 bytes an
    /// element) and [`Error::HostOutOfMemory`] as [`Tensor::to_vec`].
    pub fn to_vec_f64(&self) -> Result<Vec<f64>> {
        crate::layout::checked_nbytes(self.shape(), DType::F64, "to_vec")?;
        crate::cpu::with_repr!(self.dtype(), R => {
            self.read_host("to_vec", |l, s: &[R]| {
                crate::cpu::try_collect(l.numel(), l.indices().map(|i| crate::cpu::num_to_f64(s[i])))
            })?
        })
    }

    /// The value of a one-element tensor, converted to `T` (`Tensor.item()`).
    ///
    /// # Errors
    /// 1. [`Error::MetaNoData`] for meta tensors (PyTorch's message
    ///    `Tensor.item() cannot be called on meta tensors`,
    ///    <https://github.com/pytorch/pytorch/issues/119588>).
    /// 2. [`Error::NotAScalar`] when the tensor has other than one element.
    /// 3. [`Error::ValueOverflow`] when `T` cannot hold the value (PyTorch's C++
    ///    `item<T>()`, which converts with `checked_convert`: `300.0` as `u8`, `2^40` as
    ///    `i32`, NaN as an integer).
    pub fn item<T: Element>(&self) -> Result<T> {
        if self.device().is_meta() {
            return Err(Error::MetaNoData { op: "item" });
        }
        if self.numel() != 1 {
            return Err(Error::NotAScalar {
                numel: self.numel(),
            });
        }
        if self.dtype() == T::DTYPE {
            return Ok(self.to_vec::<T>()?[0]);
        }
        // PyTorch's `item<T>()` converts with `checked_convert`: a value `T` cannot hold is an
        // error, not a clamped or wrapped number.
        let value = self.to_vec_f64()?[0];
        if !T::DTYPE.holds(value) {
            return Err(Error::ValueOverflow {
                op: "item",
                value,
                dtype: T::DTYPE,
            });
        }
        // Exact for every value that passed: an integer that fits an integer `T` is one an f64
        // holds exactly (i64, the one source wider than 2^53, fits no narrower integer dtype;
        // i64 to i64 returned above), and bool only asks whether it is non-zero.
        Ok(T::from_f64(value))
    }

    /// Read the host data (copying device data to the host first) through `f`.
    fn read_host<R: crate::storage::Pod, O>(
        &self,
        op: &'static str,
        f: impl FnOnce(&crate::Layout, &[R]) -> O,
    ) -> Result<O> {
        if self.device().is_meta() {
            return Err(Error::MetaNoData { op });
        }
        if !self.device().is_cpu() {
            return self.cpu()?.read_host(op, f);
        }
        let guard = self.storage().read_host(op)?;
        Ok(f(self.layout(), guard.typed::<R>()))
    }
}
