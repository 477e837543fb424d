//! Math front-ends: each op (1) infers the output shape and dtype with the shared rules of
//! [`crate::ops::infer`] — the same checks on every device — then (2) on meta returns an
//! output without memory, else (3) runs the device's kernel.

use super::Tensor;
use crate::device_kernels::dispatch::{alloc_tensor, kernels_for};
use crate::device_kernels::interface::{DeviceKernels, View};
use crate::ops::{infer, BinaryOp, CmpOp, ReduceOp, UnaryOp};
use crate::{DType, Error, Layout, Result};

/// A view of `t` with another layout (broadcast) for a kernel call.
fn view<'a>(t: &'a Tensor, l: &'a Layout) -> View<'a> {
    View {
        storage: t.storage(),
        layout: l,
        dtype: t.dtype(),
    }
}

impl Tensor {
    /// The kernels of this tensor's device, or `None` on meta (nothing to compute).
    pub(crate) fn kernels(&self, op: &'static str) -> Result<Option<&'static dyn DeviceKernels>> {
        if self.device().is_meta() {
            return Ok(None);
        }
        kernels_for(self.device(), op).map(Some)
    }

    pub(crate) fn unary_op(&self, op: UnaryOp) -> Result<Tensor> {
        let dtype = infer::unary(op, self)?;
        let out = alloc_tensor(self.device(), self.shape(), dtype, op.name())?;
        if let Some(k) = self.kernels(op.name())? {
            k.unary(op, View::of(&out), Some(View::of(self)))?;
        }
        Ok(out)
    }

    pub(crate) fn binary_op(&self, op: BinaryOp, rhs: &Tensor) -> Result<Tensor> {
        let (shape, dtype) = infer::binary(op.name(), op.float_only(), self, rhs)?;
        let kop = infer::kernel_op(op, dtype, false)?;
        let out = alloc_tensor(self.device(), &shape, dtype, op.name())?;
        if let Some(k) = self.kernels(op.name())? {
            let la = self.layout().broadcast_to(&shape, op.name())?;
            let lb = rhs.layout().broadcast_to(&shape, op.name())?;
            k.binary(kop, View::of(&out), Some(view(self, &la)), view(rhs, &lb))?;
        }
        Ok(out)
    }

    pub(crate) fn scalar_op(&self, op: BinaryOp, s: f64, scalar_first: bool) -> Result<Tensor> {
        let dtype = infer::scalar(op, self)?;
        let result = infer::scalar_result(dtype, s);
        if result != dtype {
            // An integer tensor and a float scalar compute in f32 (Note [Scalar promotion]).
            return self.to_dtype(result)?.scalar_op(op, s, scalar_first);
        }
        let kop = infer::kernel_op(op, dtype, true)?;
        let s = infer::kernel_scalar(s, dtype);
        let out = alloc_tensor(self.device(), self.shape(), dtype, op.name())?;
        if let Some(k) = self.kernels(op.name())? {
            k.scalar(kop, View::of(&out), Some(View::of(self)), s, scalar_first)?;
        }
        Ok(out)
    }

    fn compare_op(&self, op: CmpOp, rhs: Option<&Tensor>, s: f64) -> Result<Tensor> {
        let shape = match rhs {
            Some(r) => infer::binary(op.name(), false, self, r)?.0,
            None => self.shape().to_vec(),
        };
        let out = alloc_tensor(self.device(), &shape, DType::Bool, op.name())?;
        if let Some(k) = self.kernels(op.name())? {
            let la = self.layout().broadcast_to(&shape, op.name())?;
            match rhs {
                Some(r) => {
                    let lb = r.layout().broadcast_to(&shape, op.name())?;
                    k.compare(op, View::of(&out), view(self, &la), Some(view(r, &lb)), 0.0)?;
                }
                None => k.compare(op, View::of(&out), view(self, &la), None, s)?,
            }
        }
        Ok(out)
    }

    fn reduce_op(&self, op: ReduceOp, dims: Option<&[isize]>, keepdim: bool) -> Result<Tensor> {
        let plan = infer::reduce(op, self, dims)?;
        let out = alloc_tensor(self.device(), &plan.shape, plan.dtype, op.name())?;
        if let Some(k) = self.kernels(op.name())? {
            k.reduce(op, View::of(&out), View::of(self), &plan.dims)?;
        }
        if keepdim {
            return out.view(&plan.keepdim_shape);
        }
        Ok(out)
    }

    /// `self + rhs` with broadcasting. On bool it is logical or (`true + true` is `true`,
    /// PyTorch's result), so a bool tensor only ever holds 0 and 1.
    ///
    /// # Errors
    /// Shapes that do not broadcast; different devices or dtypes.
    pub fn add(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary_op(BinaryOp::Add, rhs)
    }
    /// `self - rhs` with broadcasting.
    ///
    /// # Errors
    /// As [`Tensor::add`]; [`Error::BoolArithmetic`] for bool (PyTorch: "Subtraction, the `-`
    /// operator, with two bool tensors is not supported. Use the `^` or `logical_xor()`
    /// operator instead.").
    pub fn sub(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary_op(BinaryOp::Sub, rhs)
    }
    /// `self * rhs` elementwise with broadcasting (logical and on bool).
    ///
    /// # Errors
    /// As [`Tensor::add`].
    pub fn mul(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary_op(BinaryOp::Mul, rhs)
    }
    /// `self / rhs` (floats; convert integers with `to_dtype` first).
    ///
    /// # Errors
    /// As [`Tensor::add`]; integer dtypes.
    pub fn div(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary_op(BinaryOp::Div, rhs)
    }
    /// `self ^ rhs` (floats).
    ///
    /// # Errors
    /// As [`Tensor::div`].
    pub fn pow(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary_op(BinaryOp::Pow, rhs)
    }
    /// Elementwise maximum (`torch.maximum`).
    ///
    /// # Errors
    /// As [`Tensor::add`].
    pub fn maximum(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary_op(BinaryOp::Maximum, rhs)
    }
    /// Elementwise minimum (`torch.minimum`).
    ///
    /// # Errors
    /// As [`Tensor::add`].
    pub fn minimum(&self, rhs: &Tensor) -> Result<Tensor> {
        self.binary_op(BinaryOp::Minimum, rhs)
    }

    /// `self + s` (`s` converted to the dtype; on bool logical or with `s != 0`).
    ///
    /// The result has `self`'s dtype, except for an integer or bool tensor and an `s` that is
    /// not an integer in `i64`'s range (a fraction, NaN, ±inf, or beyond): then it is f32, as
    /// PyTorch's `torch.tensor([1]) + 0.5` is `tensor([1.5])` (`Note [Scalar promotion]` in
    /// [`crate::ops::infer`]). An integral `s` wraps into an integer dtype, as PyTorch's.
    ///
    /// # Errors
    /// Device errors.
    ///
    /// # Examples
    /// ```
    /// use berth::{DType, Device, Tensor};
    /// let x = Tensor::from_slice(&[1i64, 2], &[2], Device::Cpu)?;
    /// assert_eq!(x.add_scalar(3.0)?.to_vec::<i64>()?, vec![4, 5]);
    /// let y = x.add_scalar(0.5)?;
    /// assert_eq!(y.dtype(), DType::F32);
    /// assert_eq!(y.to_vec::<f32>()?, vec![1.5, 2.5]);
    /// # Ok::<(), berth::Error>(())
    /// ```
    pub fn add_scalar(&self, s: f64) -> Result<Tensor> {
        self.scalar_op(BinaryOp::Add, s, false)
    }
    /// `self - s` (the result's dtype as [`Tensor::add_scalar`]'s).
    ///
    /// # Errors
    /// [`Error::BoolArithmetic`] for bool; device errors.
    pub fn sub_scalar(&self, s: f64) -> Result<Tensor> {
        self.scalar_op(BinaryOp::Sub, s, false)
    }
    /// `s - self` (`torch.rsub`; the result's dtype as [`Tensor::add_scalar`]'s).
    ///
    /// # Errors
    /// [`Error::BoolArithmetic`] for bool; device errors.
    pub fn rsub_scalar(&self, s: f64) -> Result<Tensor> {
        self.scalar_op(BinaryOp::Sub, s, true)
    }
    /// `self * s` (`s` converted to the dtype; on bool logical and with `s != 0`; the
    /// result's dtype as [`Tensor::add_scalar`]'s).
    ///
    /// # Errors
    /// Device errors.
    pub fn mul_scalar(&self, s: f64) -> Result<Tensor> {
        self.scalar_op(BinaryOp::Mul, s, false)
    }
    /// `self / s` (floats).
    ///
    /// # Errors
    /// Integer dtypes; device errors.
    pub fn div_scalar(&self, s: f64) -> Result<Tensor> {
        self.scalar_op(BinaryOp::Div, s, false)
    }
    /// `self ^ s` (floats).
    ///
    /// # Errors
    /// Integer dtypes; device errors.
    pub fn pow_scalar(&self, s: f64) -> Result<Tensor> {
        self.scalar_op(BinaryOp::Pow, s, false)
    }

    /// `-self`.
    ///
    /// # Errors
    /// [`Error::BoolArithmetic`] for bool (PyTorch: "Negation, the `-` operator, on a bool
    /// tensor is not supported. ..."; use a comparison or `eq_scalar(0.0)` to invert a mask);
    /// device errors.
    pub fn neg(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Neg)
    }
    /// `max(self, 0)`.
    ///
    /// # Errors
    /// Device errors.
    pub fn relu(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Relu)
    }
    /// `e^self` (floats).
    ///
    /// # Errors
    /// Integer dtypes; device errors.
    pub fn exp(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Exp)
    }
    /// Natural logarithm (floats).
    ///
    /// # Errors
    /// Integer dtypes; device errors.
    pub fn log(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Log)
    }
    /// Square root (floats).
    ///
    /// # Errors
    /// Integer dtypes; device errors.
    pub fn sqrt(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Sqrt)
    }
    /// `|self|`.
    ///
    /// # Errors
    /// Device errors.
    pub fn abs(&self) -> Result<Tensor> {
        self.unary_op(UnaryOp::Abs)
    }

    /// `self == rhs` (bool, broadcasting).
    ///
    /// # Errors
    /// As [`Tensor::add`].
    pub fn eq(&self, rhs: &Tensor) -> Result<Tensor> {
        self.compare_op(CmpOp::Eq, Some(rhs), 0.0)
    }
    /// `self != rhs`.
    ///
    /// # Errors
    /// As [`Tensor::add`].
    pub fn ne(&self, rhs: &Tensor) -> Result<Tensor> {
        self.compare_op(CmpOp::Ne, Some(rhs), 0.0)
    }
    /// `self > rhs`.
    ///
    /// # Errors
    /// As [`Tensor::add`].
    pub fn gt(&self, rhs: &Tensor) -> Result<Tensor> {
        self.compare_op(CmpOp::Gt, Some(rhs), 0.0)
    }
    /// `self >= rhs`.
    ///
    /// # Errors
    /// As [`Tensor::add`].
    pub fn ge(&self, rhs: &Tensor) -> Result<Tensor> {
        self.compare_op(CmpOp::Ge, Some(rhs), 0.0)
    }
    /// `self < rhs`.
    ///
    /// # Errors
    /// As [`Tensor::add`].
    pub fn lt(&self, rhs: &Tensor) -> Result<Tensor> {
        self.compare_op(CmpOp::Lt, Some(rhs), 0.0)
    }
    /// `self <= rhs`.
    ///
    /// # Errors
    /// As [`Tensor::add`].
    pub fn le(&self, rhs: &Tensor) -> Result<Tensor> {
        self.compare_op(CmpOp::Le, Some(rhs), 0.0)
    }
    /// `self == s`. On the CPU an integer tensor is compared exactly with an `s` that is an
    /// integer in `i64`'s range (`2^53 + 1 != 2^53`), else in `f64`; a float tensor with `s`
    /// converted to its dtype.
    ///
    /// # Errors
    /// Device errors.
    pub fn eq_scalar(&self, s: f64) -> Result<Tensor> {
        self.compare_op(CmpOp::Eq, None, s)
    }
    /// `self > s` (compared as [`Tensor::eq_scalar`]).
    ///
    /// # Errors
    /// Device errors.
    pub fn gt_scalar(&self, s: f64) -> Result<Tensor> {
        self.compare_op(CmpOp::Gt, None, s)
    }
    /// `self < s` (compared as [`Tensor::eq_scalar`]).
    ///
    /// # Errors
    /// Device errors.
    pub fn lt_scalar(&self, s: f64) -> Result<Tensor> {
        self.compare_op(CmpOp::Lt, None, s)
    }

    /// Sum of all elements (0-dim; integers and bool sum to `i64`, exactly and wrapping on
    /// overflow as PyTorch's; floats are accumulated in `f64`).
    ///
    /// # Errors
    /// Device errors; [`crate::Error::HostOutOfMemory`] on the CPU when the offsets of the
    /// elements reduced (8 bytes each, expanded dimensions included) cannot be listed.
    pub fn sum(&self) -> Result<Tensor> {
        self.reduce_op(ReduceOp::Sum, None, false)
    }
    /// Sum over `dim` (`x.sum(dim, keepdim)`).
    ///
    /// # Errors
    /// Dim out of range.
    pub fn sum_dim(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce_op(ReduceOp::Sum, Some(&[dim]), keepdim)
    }
    /// Sum over several dims (`x.sum(dims, keepdim)`). An empty `dims` sums over every
    /// dimension, as PyTorch's `x.sum(dim=[])` (`tensor(6.)` for `ones(2, 3)`).
    ///
    /// # Errors
    /// Dims out of range or repeated.
    pub fn sum_dims(&self, dims: &[isize], keepdim: bool) -> Result<Tensor> {
        self.reduce_op(ReduceOp::Sum, Some(dims), keepdim)
    }
    /// Mean of all elements (floats).
    ///
    /// # Errors
    /// Integer dtypes.
    pub fn mean(&self) -> Result<Tensor> {
        self.reduce_op(ReduceOp::Mean, None, false)
    }
    /// Mean over `dim`.
    ///
    /// # Errors
    /// Integer dtypes; dim out of range.
    pub fn mean_dim(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce_op(ReduceOp::Mean, Some(&[dim]), keepdim)
    }
    /// Maximum of all elements (0-dim).
    ///
    /// # Errors
    /// An empty tensor.
    pub fn max(&self) -> Result<Tensor> {
        self.reduce_op(ReduceOp::Max, None, false)
    }
    /// Maximum over `dim` (the values of `torch.max(x, dim)`).
    ///
    /// # Errors
    /// Dim out of range; empty dim.
    pub fn max_dim(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce_op(ReduceOp::Max, Some(&[dim]), keepdim)
    }
    /// Minimum of all elements (0-dim).
    ///
    /// # Errors
    /// An empty tensor.
    pub fn min(&self) -> Result<Tensor> {
        self.reduce_op(ReduceOp::Min, None, false)
    }
    /// Minimum over `dim`.
    ///
    /// # Errors
    /// Dim out of range; empty dim.
    pub fn min_dim(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce_op(ReduceOp::Min, Some(&[dim]), keepdim)
    }
    /// Flat index of the maximum (0-dim `i64`; the first on ties).
    ///
    /// # Errors
    /// An empty tensor.
    pub fn argmax(&self) -> Result<Tensor> {
        self.reduce_op(ReduceOp::ArgMax, None, false)
    }
    /// Index of the maximum along `dim` (`i64`).
    ///
    /// # Errors
    /// Dim out of range; empty dim.
    pub fn argmax_dim(&self, dim: isize, keepdim: bool) -> Result<Tensor> {
        self.reduce_op(ReduceOp::ArgMax, Some(&[dim]), keepdim)
    }

    /// Matrix product with `torch.matmul`'s rules: 1-D·1-D, 2-D, and batched with broadcast
    /// batch dimensions.
    ///
    /// An inner dimension of 0 gives zeros (`[2, 0] @ [0, 4]` is a 2×4 zero matrix, as
    /// PyTorch).
    ///
    /// # Errors
    /// [`Error::MatmulShape`] when inner sizes differ (the same on meta and every device).
    pub fn matmul(&self, rhs: &Tensor) -> Result<Tensor> {
        let plan = infer::matmul(self, rhs)?;
        let out = alloc_tensor(self.device(), &plan.kernel_shape, plan.dtype, "matmul")?;
        let inner = plan.lhs_shape[plan.lhs_shape.len() - 1];
        if inner == 0 {
            // A sum over no terms: zeros, as PyTorch (`[2, 0] @ [0, 4]` is a 2×4 zero matrix).
            // Filled here so every device gives it, whatever its GEMM does with k = 0.
            if let Some(k) = self.kernels("matmul")? {
                k.fill(View::of(&out), 0.0)?;
            }
        } else if let Some(k) = self.kernels("matmul")? {
            let a = self.reshape(&shape_2d(self.shape(), true))?;
            let b = rhs.reshape(&shape_2d(rhs.shape(), false))?;
            let la = a.layout().broadcast_to(&plan.lhs_shape, "matmul")?;
            let lb = b.layout().broadcast_to(&plan.rhs_shape, "matmul")?;
            k.matmul(View::of(&out), view(&a, &la), view(&b, &lb))?;
        }
        out.view(&plan.out_shape)
    }

    /// Softmax over `dim` (floats).
    ///
    /// # Errors
    /// Integer dtypes; dim out of range.
    pub fn softmax(&self, dim: isize) -> Result<Tensor> {
        self.softmax_impl(dim, false)
    }

    /// Log-softmax over `dim` (floats).
    ///
    /// # Errors
    /// As [`Tensor::softmax`].
    pub fn log_softmax(&self, dim: isize) -> Result<Tensor> {
        self.softmax_impl(dim, true)
    }

    fn softmax_impl(&self, dim: isize, log: bool) -> Result<Tensor> {
        let op = if log { "log_softmax" } else { "softmax" };
        infer::require_float(op, self.dtype())?;
        if self.rank() == 0 {
            return self.unsqueeze(0)?.softmax_impl(0, log)?.reshape(&[]);
        }
        let d = crate::layout::wrap_dim(dim, self.rank(), op)?;
        let last = self.rank() - 1;
        let src = if d == last {
            self.alias()
        } else {
            self.transpose(d as isize, last as isize)?
        };
        let out = alloc_tensor(self.device(), src.shape(), self.dtype(), op)?;
        if let Some(k) = self.kernels(op)? {
            k.softmax(View::of(&out), View::of(&src), log)?;
        }
        if d == last {
            Ok(out)
        } else {
            out.transpose(d as isize, last as isize)?.contiguous()
        }
    }

    /// Mean cross-entropy of logits `[N, C]` against class indices `[N]` (`i64`), as
    /// `torch.nn.functional.cross_entropy` with `reduction='mean'`. 0-dim result.
    ///
    /// A target of -100 (PyTorch's default `ignore_index`) skips its sample: the mean is over
    /// the other samples, and NaN when every one is ignored, as PyTorch's. That holds on the
    /// CPU. The CUDA kernel does not know `ignore_index`: there a target of -100, like any
    /// other outside `[0, C)`, makes the loss NaN (the targets are not read back to the host
    /// to check them, which would synchronise every training step); drop ignored samples
    /// first (`index_select`) or compute the loss on the CPU.
    ///
    /// # Errors
    /// Shapes/dtypes (checked on every device); on the CPU, a target outside `[0, C)` other
    /// than -100 ([`Error::InvalidArgument`], "Target 5 is out of bounds").
    ///
    /// # Examples
    /// ```
    /// use berth::{Device, Tensor};
    /// let logits = Tensor::from_slice(&[0.0f32, 0.0, 5.0, -5.0], &[2, 2], Device::Cpu)?;
    /// let targets = Tensor::from_slice(&[1i64, -100], &[2], Device::Cpu)?;
    /// // Only the first sample counts: -log(1/2).
    /// let loss = logits.cross_entropy(&targets)?.item::<f32>()?;
    /// assert!((loss - std::f32::consts::LN_2).abs() < 1e-6);
    /// # Ok::<(), berth::Error>(())
    /// ```
    pub fn cross_entropy(&self, targets: &Tensor) -> Result<Tensor> {
        infer::cross_entropy(self, targets)?;
        let out = alloc_tensor(self.device(), &[], self.dtype(), "cross_entropy")?;
        if let Some(k) = self.kernels("cross_entropy")? {
            k.cross_entropy(View::of(&out), View::of(self), View::of(targets))?;
        }
        Ok(out)
    }

    /// Gradient of [`Tensor::cross_entropy`] w.r.t. these logits: `(softmax − one_hot) / N`,
    /// where on the CPU a sample whose target is -100 (`ignore_index`) gets a zero row and `N`
    /// counts only the other samples, as PyTorch's (on CUDA, see [`Tensor::cross_entropy`]).
    ///
    /// # Errors
    /// As [`Tensor::cross_entropy`].
    pub fn cross_entropy_backward(&self, targets: &Tensor) -> Result<Tensor> {
        infer::cross_entropy(self, targets)?;
        let out = alloc_tensor(
            self.device(),
            self.shape(),
            self.dtype(),
            "cross_entropy_backward",
        )?;
        if let Some(k) = self.kernels("cross_entropy_backward")? {
            k.cross_entropy_backward(View::of(&out), View::of(self), View::of(targets))?;
        }
        Ok(out)
    }

    /// Gradient of `relu(x)` given the upstream gradient `self`: `self * (x > 0)`.
    ///
    /// Contiguous f32 and f64 operands take one kernel and no mask tensors
    /// ([`DeviceKernels::relu_backward`](crate::device_kernels::DeviceKernels::relu_backward)),
    /// with the bits of the three ops `gt_scalar`, `to_dtype`, `mul`, which anything else takes.
    ///
    /// # Errors
    /// Shape, dtype or device mismatch.
    pub fn relu_backward(&self, x: &Tensor) -> Result<Tensor> {
        if self.shape() != x.shape() {
            return Err(Error::Shape {
                op: "relu_backward",
                what: format!(
                    "grad shape {:?} must equal input shape {:?}",
                    self.shape(),
                    x.shape()
                ),
            });
        }
        let fused = matches!(self.dtype(), DType::F32 | DType::F64)
            && x.dtype() == self.dtype()
            && x.device() == self.device()
            && self.is_contiguous()
            && x.is_contiguous();
        if !fused {
            let mask = x.gt_scalar(0.0)?.to_dtype(self.dtype())?;
            return self.mul(&mask);
        }
        let out = alloc_tensor(self.device(), self.shape(), self.dtype(), "relu_backward")?;
        if let Some(k) = self.kernels("relu_backward")? {
            k.relu_backward(View::of(&out), View::of(self), View::of(x))?;
        }
        Ok(out)
    }
}

/// The ≥ 2-D shape a matmul operand is viewed as (a 1-D lhs is a row, a 1-D rhs a column).
fn shape_2d(s: &[usize], lhs: bool) -> Vec<usize> {
    match (s.len(), lhs) {
        (1, true) => vec![1, s[0]],
        (1, false) => vec![s[0], 1],
        _ => s.to_vec(),
    }
}
