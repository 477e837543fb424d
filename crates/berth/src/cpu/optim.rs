//! Host fused kernels of the training step: `add_scaled`, `relu_backward` and the
//! SGD-with-momentum update, each one pass over its operands (split over rayon for large
//! tensors).
//!
//! Note [Fused host SGD]: the three tensor ops of the momentum update (`v *= μ`, `v += g`,
//! `p += −lr·v`, the last with a temporary) made five passes and an allocation: 1.5 ms a step
//! on one core of the 2-core box for the 784 × 256 weight, about half of `berth train`'s step.
//! One pass computes each element with the same operations in the same order (`v·μ`, `+ g`,
//! then `p + v·(−lr)`; Rust never contracts them into a fused multiply-add), so the result is
//! bit for bit the same (`Note [Fused updates are exact]` in `cuda/kernels/optim.rs`, the
//! device counterpart).

use std::ops::{Add, Mul};

use rayon::prelude::*;

use super::Scalar;
use crate::device_kernels::interface::{SgdParam, View};
use crate::storage::Pod;
use crate::{DType, Error, Result};

/// Elements per rayon task (64 KiB of f32 per operand); tensors under four chunks run on the
/// calling thread.
pub(crate) const CHUNK: usize = 1 << 14;

/// The element types of the fused kernels: f32 and f64, whose compute type is themselves.
trait Float: Scalar + Pod + Mul<Output = Self> + Add<Output = Self> {}
impl Float for f32 {}
impl Float for f64 {}

fn unsupported(op: &'static str, dtype: DType) -> Error {
    Error::UnsupportedDType {
        op,
        dtype,
        expected: "f32 or f64",
    }
}

/// `dst += src·alpha` over contiguous `dst` and `src` of one shape (the
/// [`DeviceKernels::add_scaled`](crate::device_kernels::DeviceKernels::add_scaled) contract).
///
/// # Errors
/// [`Error::UnsupportedDType`] for a dtype other than f32 or f64.
pub(crate) fn add_scaled(dst: View<'_>, src: View<'_>, alpha: f64) -> Result<()> {
    match dst.dtype {
        DType::F32 => add_scaled_typed::<f32>(dst, src, alpha),
        DType::F64 => add_scaled_typed::<f64>(dst, src, alpha),
        d => Err(unsupported("add_scaled", d)),
    }
}

fn add_scaled_typed<T: Float>(dst: View<'_>, src: View<'_>, alpha: f64) -> Result<()> {
    let n = dst.layout.numel();
    let a = T::from_f64(alpha);
    let mut dw = dst.storage.write_host("add_scaled")?;
    let sr = src.storage.read_host("add_scaled")?;
    let (d0, s0) = (dst.layout.offset(), src.layout.offset());
    let d = &mut dw.typed_mut::<T>()[d0..d0 + n];
    let s = &sr.typed::<T>()[s0..s0 + n];
    let body = |(dc, sc): (&mut [T], &[T])| {
        for (d, &s) in dc.iter_mut().zip(sc) {
            *d = *d + s * a;
        }
    };
    if n >= 4 * CHUNK {
        d.par_chunks_mut(CHUNK)
            .zip(s.par_chunks(CHUNK))
            .for_each(body);
    } else {
        body((d, s));
    }
    Ok(())
}

/// `dst = grad · (input > 0 ? 1 : 0)` over contiguous operands of one shape (the
/// [`DeviceKernels::relu_backward`](crate::device_kernels::DeviceKernels::relu_backward)
/// contract): the bits of `grad * input.gt_scalar(0).to_dtype(..)`.
///
/// # Errors
/// [`Error::UnsupportedDType`] for a dtype other than f32 or f64.
pub(crate) fn relu_backward(dst: View<'_>, grad: View<'_>, input: View<'_>) -> Result<()> {
    match dst.dtype {
        DType::F32 => relu_backward_typed::<f32>(dst, grad, input),
        DType::F64 => relu_backward_typed::<f64>(dst, grad, input),
        d => Err(unsupported("relu_backward", d)),
    }
}

fn relu_backward_typed<T: Float>(dst: View<'_>, grad: View<'_>, input: View<'_>) -> Result<()> {
    let n = dst.layout.numel();
    let (zero, one) = (T::from_f64(0.0), T::from_f64(1.0));
    let mut dw = dst.storage.write_host("relu_backward")?;
    let gr = grad.storage.read_host("relu_backward")?;
    let xr = input.storage.read_host("relu_backward")?;
    let (d0, g0, x0) = (
        dst.layout.offset(),
        grad.layout.offset(),
        input.layout.offset(),
    );
    let d = &mut dw.typed_mut::<T>()[d0..d0 + n];
    let g = &gr.typed::<T>()[g0..g0 + n];
    let x = &xr.typed::<T>()[x0..x0 + n];
    let body = |((dc, gc), xc): ((&mut [T], &[T]), &[T])| {
        for ((d, &g), &x) in dc.iter_mut().zip(gc).zip(xc) {
            *d = g * if x > zero { one } else { zero };
        }
    };
    if n >= 4 * CHUNK {
        d.par_chunks_mut(CHUNK)
            .zip(g.par_chunks(CHUNK))
            .zip(x.par_chunks(CHUNK))
            .for_each(body);
    } else {
        body(((d, g), x));
    }
    Ok(())
}

/// The momentum update of every parameter of `params` (the
/// [`DeviceKernels::sgd_momentum`](crate::device_kernels::DeviceKernels::sgd_momentum)
/// contract), Note [Fused host SGD].
///
/// # Errors
/// [`Error::UnsupportedDType`] for a dtype other than f32 or f64.
pub(crate) fn sgd_momentum(
    params: &[SgdParam<'_>],
    momentum: f64,
    lr: f64,
    first_step: bool,
) -> Result<()> {
    for sp in params {
        match sp.param.dtype {
            DType::F32 => sgd_one::<f32>(sp, momentum, lr, first_step)?,
            DType::F64 => sgd_one::<f64>(sp, momentum, lr, first_step)?,
            d => return Err(unsupported("sgd_momentum", d)),
        }
    }
    Ok(())
}

fn sgd_one<T: Float>(sp: &SgdParam<'_>, momentum: f64, lr: f64, first_step: bool) -> Result<()> {
    let n = sp.param.layout.numel();
    let (mu, neg_lr) = (T::from_f64(momentum), T::from_f64(-lr));
    let mut pw = sp.param.storage.write_host("sgd_momentum")?;
    let mut vw = sp.velocity.storage.write_host("sgd_momentum")?;
    let gr = sp.grad.storage.read_host("sgd_momentum")?;
    let (p0, v0, g0) = (
        sp.param.layout.offset(),
        sp.velocity.layout.offset(),
        sp.grad.layout.offset(),
    );
    let pd = &mut pw.typed_mut::<T>()[p0..p0 + n];
    let vd = &mut vw.typed_mut::<T>()[v0..v0 + n];
    let gd = &gr.typed::<T>()[g0..g0 + n];
    let body = |((pc, vc), gc): ((&mut [T], &mut [T]), &[T])| {
        for ((p, v), &g) in pc.iter_mut().zip(vc.iter_mut()).zip(gc) {
            *v = if first_step { g } else { *v * mu + g };
            *p = *p + *v * neg_lr;
        }
    };
    if n >= 4 * CHUNK {
        pd.par_chunks_mut(CHUNK)
            .zip(vd.par_chunks_mut(CHUNK))
            .zip(gd.par_chunks(CHUNK))
            .for_each(body);
    } else {
        body(((pd, vd), gd));
    }
    Ok(())
}
