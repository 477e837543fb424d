//! The per-device kernel interface, a leaf: the trait [`DeviceKernels`] and its operand types
//! ([`View`], [`SgdParam`], [`RandomDist`]). Its implementations (the CPU's in `crate::cpu`,
//! CUDA's in `crate::cuda::ops`) import this file; it imports none of them, nor the choice
//! between them (`dispatch.rs`, beside it). The contract every method keeps is on the trait.

use crate::ops::{BinaryOp, CmpOp, ReduceOp, UnaryOp};
use crate::{DType, Device, Error, Layout, Result, Storage, Tensor};

/// One operand of a kernel: storage + layout + dtype.
#[derive(Debug, Clone, Copy)]
pub struct View<'a> {
    /// The memory.
    pub storage: &'a Storage,
    /// Shape, strides and offset in elements.
    pub layout: &'a Layout,
    /// The element type.
    pub dtype: DType,
}

impl<'a> View<'a> {
    /// The view of a tensor.
    pub fn of(t: &'a Tensor) -> View<'a> {
        View {
            storage: t.storage(),
            layout: t.layout(),
            dtype: t.dtype(),
        }
    }
}

/// One parameter of [`DeviceKernels::sgd_momentum`]: the parameter, its gradient and its
/// momentum buffer, three contiguous views of one shape and dtype in distinct storages.
#[derive(Debug, Clone, Copy)]
pub struct SgdParam<'a> {
    /// `p`, read and written.
    pub param: View<'a>,
    /// `g`, read.
    pub grad: View<'a>,
    /// `v`, written (and read unless it is the first step).
    pub velocity: View<'a>,
}

/// A random distribution for [`DeviceKernels::random`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RandomDist {
    /// Uniform on `[low, high)`.
    Uniform {
        /// Lower bound (inclusive).
        low: f64,
        /// Upper bound (exclusive).
        high: f64,
    },
    /// Normal with `mean` and standard deviation `std`.
    Normal {
        /// Mean.
        mean: f64,
        /// Standard deviation.
        std: f64,
    },
}

fn missing(op: &'static str, device: Device) -> Error {
    if device.is_cuda() {
        crate::cuda::CudaError::Unavailable {
            reason: format!("no CUDA kernel for {op} in this build"),
        }
        .into()
    } else {
        Error::NoKernel { op, device }
    }
}

/// Kernels of one device kind. Every method has a default that returns an "unavailable" error
/// naming the op, so a partial implementation compiles and fails clearly.
///
/// # Contract (every method)
/// - Operands are [`View`]s: a storage, a layout (shape, strides, offset in elements) and a
///   dtype. All views of one call live on the kernel's device (checked by the front-end).
/// - `dst` of an out-of-place op is a fresh, contiguous storage allocated by [`DeviceKernels::alloc`]
///   for exactly the output shape; it never aliases an input.
/// - When an optional `src`/`lhs` is `None`, the op is in place: `dst` is read and written
///   (`dst[i] = f(dst[i], ...)`), and `dst` may be any strided view. Other inputs never share
///   storage with `dst` (the front-end copies them first when they do).
/// - Binary inputs are already broadcast to the output shape (stride 0 on broadcast
///   dimensions), and both have the same dtype except where a method says otherwise.
/// - Kernels may be asynchronous on their device's current stream; host reads synchronise
///   through the storage's pending-work list.
pub trait DeviceKernels: Send + Sync {
    /// The device kind these kernels run on, for error messages (`cuda:0` or `cpu`).
    fn kind(&self) -> Device;

    /// New memory of `nbytes` bytes on `device` (contents unspecified; the CPU zero-fills).
    /// `nbytes` is at most `isize::MAX` (checked by the front-end).
    ///
    /// # Errors
    /// Out of memory as a typed error ([`Error::HostOutOfMemory`] on the CPU,
    /// [`Error::Alloc`] on CUDA), never an abort; invalid device.
    fn alloc(&self, device: Device, nbytes: usize) -> Result<Storage> {
        let _ = (device, nbytes);
        Err(missing("alloc", self.kind()))
    }

    /// `dst[i] = cast(src[i])`: strided → strided copy of equal shapes, converting from
    /// `src.dtype` to `dst.dtype` (used by `contiguous`, `clone`, `to_dtype`, `copy_`).
    ///
    /// # Errors
    /// Device errors.
    fn copy(&self, dst: View<'_>, src: View<'_>) -> Result<()> {
        let _ = (dst, src);
        Err(missing("copy", self.kind()))
    }

    /// `dst[i] = value` converted to `dst.dtype`.
    ///
    /// # Errors
    /// Device errors.
    fn fill(&self, dst: View<'_>, value: f64) -> Result<()> {
        let _ = (dst, value);
        Err(missing("fill", self.kind()))
    }

    /// `dst[i] = op(src[i])`, or in place when `src` is `None`.
    ///
    /// # Errors
    /// Device errors.
    fn unary(&self, op: UnaryOp, dst: View<'_>, src: Option<View<'_>>) -> Result<()> {
        let _ = (dst, src);
        Err(missing(op.name(), self.kind()))
    }

    /// `dst[i] = op(lhs[i], rhs[i])`, or `dst[i] = op(dst[i], rhs[i])` when `lhs` is `None`.
    ///
    /// # Errors
    /// Device errors.
    fn binary(
        &self,
        op: BinaryOp,
        dst: View<'_>,
        lhs: Option<View<'_>>,
        rhs: View<'_>,
    ) -> Result<()> {
        let _ = (dst, lhs, rhs);
        Err(missing(op.name(), self.kind()))
    }

    /// `dst[i] = op(src[i], scalar)` (or `op(scalar, src[i])` when `scalar_first`), in place
    /// when `src` is `None`. The scalar is converted to the compute type of `dst.dtype`.
    ///
    /// # Errors
    /// Device errors.
    fn scalar(
        &self,
        op: BinaryOp,
        dst: View<'_>,
        src: Option<View<'_>>,
        scalar: f64,
        scalar_first: bool,
    ) -> Result<()> {
        let _ = (dst, src, scalar, scalar_first);
        Err(missing(op.name(), self.kind()))
    }

    /// `dst[i] = op(lhs[i], rhs[i])` with `dst` of dtype `bool`; `rhs` `None` compares with
    /// `scalar`.
    ///
    /// # Errors
    /// Device errors.
    fn compare(
        &self,
        op: CmpOp,
        dst: View<'_>,
        lhs: View<'_>,
        rhs: Option<View<'_>>,
        scalar: f64,
    ) -> Result<()> {
        let _ = (dst, lhs, rhs, scalar);
        Err(missing(op.name(), self.kind()))
    }

    /// Reduce `src` over `dims` (sorted, distinct) into `dst`, whose shape is `src`'s without
    /// `dims` (keepdim is a front-end reshape). `dst.dtype` may differ from `src.dtype`
    /// (integer sums are `i64`, argmax is `i64`).
    ///
    /// # Errors
    /// Device errors.
    fn reduce(&self, op: ReduceOp, dst: View<'_>, src: View<'_>, dims: &[usize]) -> Result<()> {
        let _ = (dst, src, dims);
        Err(missing(op.name(), self.kind()))
    }

    /// Batched matrix product: `lhs` `[B.., m, k]`, `rhs` `[B.., k, n]` (equal batch shapes,
    /// any strides, possibly 0 on broadcast batch dims), `dst` contiguous `[B.., m, n]`.
    ///
    /// # Errors
    /// Device errors.
    fn matmul(&self, dst: View<'_>, lhs: View<'_>, rhs: View<'_>) -> Result<()> {
        let _ = (dst, lhs, rhs);
        Err(missing("matmul", self.kind()))
    }

    /// Softmax (or log-softmax when `log`) over the LAST dimension of `src` into contiguous
    /// `dst` of the same shape.
    ///
    /// # Errors
    /// Device errors.
    fn softmax(&self, dst: View<'_>, src: View<'_>, log: bool) -> Result<()> {
        let _ = (dst, src, log);
        Err(missing(
            if log { "log_softmax" } else { "softmax" },
            self.kind(),
        ))
    }

    /// Mean cross-entropy of `logits` `[N, C]` against class indices `targets` `[N]` (`i64`)
    /// into the 0-dim `dst` (dtype of logits).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when a target is outside `[0, C)`; device errors.
    fn cross_entropy(&self, dst: View<'_>, logits: View<'_>, targets: View<'_>) -> Result<()> {
        let _ = (dst, logits, targets);
        Err(missing("cross_entropy", self.kind()))
    }

    /// Gradient of the mean cross-entropy w.r.t. the logits: `(softmax(logits) − onehot) / N`
    /// into contiguous `dst` `[N, C]`.
    ///
    /// # Errors
    /// As [`DeviceKernels::cross_entropy`].
    fn cross_entropy_backward(
        &self,
        dst: View<'_>,
        logits: View<'_>,
        targets: View<'_>,
    ) -> Result<()> {
        let _ = (dst, logits, targets);
        Err(missing("cross_entropy_backward", self.kind()))
    }

    /// `dst[i] = dst[i] + src[i]·alpha` in place (`Tensor.add_(src, alpha=alpha)`), the
    /// product rounded to the dtype before the sum, so the result is bit for bit
    /// `mul_scalar(alpha)` then `add_` (`Note [Fused updates are exact]` in
    /// `cuda/kernels/optim.rs`). Called only for f32 or f64 `dst` and `src` of one dtype, both
    /// contiguous, `src` of `dst`'s shape and in another storage.
    ///
    /// # Errors
    /// Device errors.
    fn add_scaled(&self, dst: View<'_>, src: View<'_>, alpha: f64) -> Result<()> {
        let _ = (dst, src, alpha);
        Err(missing("add_scaled", self.kind()))
    }

    /// `dst[q, j, i] = src[q, index[j], i]`: whole slices gathered along one dimension
    /// (`torch.index_select`), with `src` seen as `[outer, size, inner]` = `dims` (the sizes
    /// before, of and after the dimension), `index` i64 `[len]` and `dst`
    /// `[outer, len, inner]`, all three contiguous, `dst` of `src`'s dtype and in a storage of
    /// its own. An index outside `[0, size)` gives a zero slice (the front-end checks host
    /// indices; device indices cannot be read without a sync).
    ///
    /// # Errors
    /// Device errors.
    fn index_select(
        &self,
        dst: View<'_>,
        src: View<'_>,
        index: View<'_>,
        dims: [usize; 3],
    ) -> Result<()> {
        let _ = (dst, src, index, dims);
        Err(missing("index_select", self.kind()))
    }

    /// `dst[i] = grad[i] · (input[i] > 0 ? 1 : 0)`: `ReLU`'s backward in one pass, bit for bit
    /// `grad * input.gt_scalar(0).to_dtype(dtype)` (the mask multiplies, it does not select).
    /// Called only for f32 or f64 `grad` and `input` of one dtype and `dst`'s shape, both
    /// contiguous; `dst` fresh and contiguous.
    ///
    /// # Errors
    /// Device errors.
    fn relu_backward(&self, dst: View<'_>, grad: View<'_>, input: View<'_>) -> Result<()> {
        let _ = (dst, grad, input);
        Err(missing("relu_backward", self.kind()))
    }

    /// One step of SGD with momentum (dampening 0, no Nesterov) over every parameter of
    /// `params`, in as few passes (on CUDA, launches) as the device allows:
    /// `v ← v·μ + g` (`v ← g` when `first_step`), then `p ← p + v·(−lr)`, with
    /// `μ = momentum`. Bit for bit the unfused tensor ops (`Note [Fused updates are exact]`).
    /// Called only with f32 or f64 views of one dtype, contiguous, of one shape per parameter,
    /// no two of all the views sharing a storage.
    ///
    /// # Errors
    /// Device errors.
    fn sgd_momentum(
        &self,
        params: &[SgdParam<'_>],
        momentum: f64,
        lr: f64,
        first_step: bool,
    ) -> Result<()> {
        let _ = (params, momentum, lr, first_step);
        Err(missing("sgd_momentum", self.kind()))
    }

    /// Fill contiguous float `dst` with samples of `dist` from the stream `(seed, offset)`
    /// (a counter-based generator: same seed and offset → same values on a device).
    ///
    /// # Errors
    /// Device errors.
    fn random(&self, dst: View<'_>, dist: RandomDist, seed: u64, offset: u64) -> Result<()> {
        let _ = (dst, dist, seed, offset);
        Err(missing("random", self.kind()))
    }

    /// Copy a tensor to another device (host↔device or device↔device), returning a
    /// contiguous tensor of the same dtype on `device`. Called with `src` on this kernel's
    /// device or `device` being this kernel's device, whichever is not the CPU.
    ///
    /// # Errors
    /// Device errors.
    fn transfer(&self, src: &Tensor, device: Device, non_blocking: bool) -> Result<Tensor> {
        let _ = (src, device, non_blocking);
        Err(missing("to", self.kind()))
    }
}
