//! The CUDA implementation of the tensor layer's kernel interface
//! ([`crate::device_kernels::DeviceKernels`]): every op of [`crate::ops`] on berth's
//! own NVRTC kernels ([`kernels`]), cuBLAS ([`blas`]) and the
//! device Philox generator ([`rand`](super::rand)).
//!
//! Memory comes from the views' storages (`CudaMemory::device_ptr`); the kernels never
//! allocate. `alloc` and `transfer` delegate to the CUDA runtime ([`super::transfer`]): output
//! storages come from the device's caching allocator, ordered on the current stream. Work is
//! enqueued on the thread's current stream of the device ([`current_stream`]).

use super::blas::{self, MatrixView};
use super::kernels::{self, ArgReduce, DeviceView, RawStream};
use super::rand::fill_random_with;
use crate::device_kernels::interface::{DeviceKernels, RandomDist, SgdParam, View};
use crate::ops::{BinaryOp, CmpOp, ReduceOp, UnaryOp};
use crate::{DType, Device, Error, Result};

/// berth's CUDA kernels, as one value for [`crate::device_kernels`].
#[derive(Debug, Clone, Copy, Default)]
pub struct CudaKernels;

/// The stream kernels go to: the thread's current stream of `device`
/// ([`super::current_stream`], set with a `StreamGuard`), the legacy default stream when none
/// was set or it cannot be read.
pub fn current_stream(device: usize) -> RawStream {
    match super::current_stream(device) {
        Ok(s) => s.as_raw() as usize as RawStream,
        Err(_) => std::ptr::null_mut(),
    }
}

/// A view's device index, strides and first-element address.
struct Raw {
    device: usize,
    ptr: u64,
    strides: Vec<isize>,
    dtype: DType,
}

impl Raw {
    fn of(op: &'static str, v: &View<'_>) -> Result<Raw> {
        let mem = v
            .storage
            .cuda_memory()
            .ok_or_else(|| Error::InvalidArgument {
                op,
                what: "a CUDA kernel got a view whose storage is not device memory".into(),
            })?;
        let device = usize::from(mem.device().index().unwrap_or(0));
        let dtype = v.dtype;
        let ptr = mem.device_ptr() + (v.layout.offset() * dtype.size_in_bytes()) as u64;
        let strides = v.layout.strides().iter().map(|&s| s as isize).collect();
        Ok(Raw {
            device,
            ptr,
            strides,
            dtype,
        })
    }

    fn view(&self) -> DeviceView<'_> {
        DeviceView::new(self.ptr, self.dtype, &self.strides)
    }

    /// The stream kernels on this operand's device go to ([`current_stream`]).
    fn stream(&self) -> RawStream {
        current_stream(self.device)
    }

    fn is_contiguous_for(&self, shape: &[usize]) -> bool {
        let c = kernels::contiguous_strides(shape);
        shape
            .iter()
            .zip(self.strides.iter().zip(&c))
            .all(|(&d, (&s, &cs))| d == 1 || s == cs)
    }
}

fn not_contiguous(op: &'static str, which: &str) -> Error {
    Error::InvalidArgument {
        op,
        what: format!("the CUDA kernel needs a contiguous {which}; call contiguous() first"),
    }
}

impl DeviceKernels for CudaKernels {
    fn kind(&self) -> Device {
        Device::CudaCurrent
    }

    fn alloc(&self, device: Device, nbytes: usize) -> Result<crate::Storage> {
        let index = device.canonical()?.index().map_or(0, usize::from);
        super::transfer::alloc_storage(index, nbytes)
    }

    fn transfer(
        &self,
        src: &crate::Tensor,
        device: Device,
        non_blocking: bool,
    ) -> Result<crate::Tensor> {
        super::transfer::transfer(src, device, non_blocking)
    }

    fn copy(&self, dst: View<'_>, src: View<'_>) -> Result<()> {
        let (d, s) = (Raw::of("copy", &dst)?, Raw::of("copy", &src)?);
        // SAFETY: both views come from live storages whose layouts the front-end checked to fit
        // their memory; the stream is the device's.
        unsafe { kernels::copy(d.device, d.stream(), dst.layout.shape(), d.view(), s.view()) }?;
        Ok(())
    }

    fn fill(&self, dst: View<'_>, value: f64) -> Result<()> {
        let d = Raw::of("fill", &dst)?;
        // SAFETY: as in `copy`.
        unsafe { kernels::fill(d.device, d.stream(), dst.layout.shape(), d.view(), value) }?;
        Ok(())
    }

    fn unary(&self, op: UnaryOp, dst: View<'_>, src: Option<View<'_>>) -> Result<()> {
        let k = match op {
            UnaryOp::Neg => kernels::UnaryOp::Neg,
            UnaryOp::Relu => kernels::UnaryOp::Relu,
            UnaryOp::Exp => kernels::UnaryOp::Exp,
            UnaryOp::Log => kernels::UnaryOp::Log,
            UnaryOp::Sqrt => kernels::UnaryOp::Sqrt,
            UnaryOp::Abs => kernels::UnaryOp::Abs,
        };
        unary_kernel(op.name(), k, dst, src)
    }

    fn binary(
        &self,
        op: BinaryOp,
        dst: View<'_>,
        lhs: Option<View<'_>>,
        rhs: View<'_>,
    ) -> Result<()> {
        let d = Raw::of(op.name(), &dst)?;
        let a = Raw::of(op.name(), lhs.as_ref().unwrap_or(&dst))?;
        let b = Raw::of(op.name(), &rhs)?;
        let k = match op {
            BinaryOp::Add => kernels::BinaryOp::Add,
            BinaryOp::Sub => kernels::BinaryOp::Sub,
            BinaryOp::Mul => kernels::BinaryOp::Mul,
            BinaryOp::Div => kernels::BinaryOp::Div,
            BinaryOp::Pow => kernels::BinaryOp::Pow,
            BinaryOp::Maximum => kernels::BinaryOp::Maximum,
            BinaryOp::Minimum => kernels::BinaryOp::Minimum,
        };
        // SAFETY: as in `unary`.
        unsafe {
            kernels::binary(
                d.device,
                d.stream(),
                k,
                dst.layout.shape(),
                d.view(),
                a.view(),
                b.view(),
            )
        }?;
        Ok(())
    }

    fn scalar(
        &self,
        op: BinaryOp,
        dst: View<'_>,
        src: Option<View<'_>>,
        scalar: f64,
        scalar_first: bool,
    ) -> Result<()> {
        use kernels::UnaryOp as U;
        let k = match (op, scalar_first) {
            (BinaryOp::Add, _) => U::AddScalar(scalar),
            (BinaryOp::Mul, _) => U::MulScalar(scalar),
            (BinaryOp::Sub, false) => U::AddScalar(-scalar),
            (BinaryOp::Sub, true) => U::RsubScalar(scalar),
            (BinaryOp::Div, false) => U::DivScalar(scalar),
            (BinaryOp::Div, true) => U::RdivScalar(scalar),
            (BinaryOp::Pow, false) => U::PowScalar(scalar),
            (BinaryOp::Pow, true) => U::RpowScalar(scalar),
            (BinaryOp::Maximum, _) => U::MaximumScalar(scalar),
            (BinaryOp::Minimum, _) => U::MinimumScalar(scalar),
        };
        unary_kernel(op.name(), k, dst, src)
    }

    fn compare(
        &self,
        op: CmpOp,
        dst: View<'_>,
        lhs: View<'_>,
        rhs: Option<View<'_>>,
        scalar: f64,
    ) -> Result<()> {
        let d = Raw::of(op.name(), &dst)?;
        let a = Raw::of(op.name(), &lhs)?;
        let b = rhs.map(|v| Raw::of(op.name(), &v)).transpose()?;
        // SAFETY: as in `copy`.
        unsafe {
            kernels::compare(
                d.device,
                d.stream(),
                op,
                dst.layout.shape(),
                d.view(),
                a.view(),
                b.as_ref().map(Raw::view),
                scalar,
            )
        }?;
        Ok(())
    }

    fn reduce(&self, op: ReduceOp, dst: View<'_>, src: View<'_>, dims: &[usize]) -> Result<()> {
        let d = Raw::of(op.name(), &dst)?;
        let s = Raw::of(op.name(), &src)?;
        let shape = src.layout.shape();
        let stream = s.stream();
        match op {
            // SAFETY: as in `copy`: both views come from live device storages whose layouts the
            // front-end checked to fit their memory, and `stream` is the device's; `dst` has the
            // kept shape of `src` reduced over `dims`.
            ReduceOp::Sum | ReduceOp::Mean => unsafe {
                kernels::sum(
                    s.device,
                    stream,
                    shape,
                    s.view(),
                    dims,
                    op == ReduceOp::Mean,
                    d.view(),
                )
            }?,
            ReduceOp::Max | ReduceOp::Min => {
                let which = if op == ReduceOp::Max {
                    ArgReduce::Max
                } else {
                    ArgReduce::Min
                };
                // SAFETY: as for `Sum` above; `dst` (the values) has the kept shape.
                unsafe {
                    kernels::arg_reduce(
                        s.device,
                        stream,
                        which,
                        shape,
                        s.view(),
                        dims,
                        Some(d.view()),
                        None,
                    )
                }?
            }
            // SAFETY: as for `Sum` above; `dst` (the i64 indices) has the kept shape.
            ReduceOp::ArgMax => unsafe {
                kernels::arg_reduce(
                    s.device,
                    stream,
                    ArgReduce::Max,
                    shape,
                    s.view(),
                    dims,
                    None,
                    Some(d.view()),
                )
            }?,
        }
        Ok(())
    }

    fn matmul(&self, dst: View<'_>, lhs: View<'_>, rhs: View<'_>) -> Result<()> {
        let (d, a, b) = (
            Raw::of("matmul", &dst)?,
            Raw::of("matmul", &lhs)?,
            Raw::of("matmul", &rhs)?,
        );
        let ls = lhs.layout.shape();
        let rs = rhs.layout.shape();
        let nd = ls.len();
        if nd < 2 || rs.len() != nd || dst.layout.shape().len() != nd {
            return Err(Error::InvalidArgument {
                op: "matmul",
                what: format!("expected [.., m, k] @ [.., k, n] views, got {ls:?} @ {rs:?}"),
            });
        }
        let (m, k, n) = (ls[nd - 2], ls[nd - 1], rs[nd - 1]);
        let batch_shape = &ls[..nd - 2];
        let bs = |r: &Raw| r.strides[..nd - 2].to_vec();
        let mat = |r: &Raw, ptr: u64, batch_stride: i64| MatrixView {
            ptr,
            batch_stride,
            row_stride: r.strides[nd - 2] as i64,
            col_stride: r.strides[nd - 1] as i64,
        };
        // Batch dimensions: merge what merges; loop on the host over the rest.
        let (ab, bb, db) = (bs(&a), bs(&b), bs(&d));
        let outer: Vec<(usize, [isize; 3])> = {
            let mut dims: Vec<(usize, [isize; 3])> = Vec::new();
            for i in 0..batch_shape.len() {
                if batch_shape[i] == 1 {
                    continue;
                }
                let st = [ab[i], bb[i], db[i]];
                if let Some(last) = dims.last_mut() {
                    let size = batch_shape[i] as isize;
                    if (0..3).all(|j| last.1[j] == st[j] * size) {
                        last.0 *= batch_shape[i];
                        last.1 = st;
                        continue;
                    }
                }
                dims.push((batch_shape[i], st));
            }
            dims
        };
        let (inner, loops) = match outer.split_last() {
            Some((last, rest)) => (*last, rest.to_vec()),
            None => ((1, [0, 0, 0]), vec![]),
        };
        let count: usize = loops.iter().map(|l| l.0).product();
        let stream = d.stream();
        for flat in 0..count {
            let (mut rem, mut off) = (flat, [0isize; 3]);
            for (size, st) in loops.iter().rev() {
                let c = (rem % size) as isize;
                rem /= size;
                for j in 0..3 {
                    off[j] += c * st[j];
                }
            }
            let at = |r: &Raw, o: isize| {
                (r.ptr as i64 + o as i64 * r.dtype.size_in_bytes() as i64) as u64
            };
            // SAFETY: as in `copy`; every batch offset stays inside its view.
            unsafe {
                blas::matmul(
                    d.device,
                    stream,
                    d.dtype,
                    inner.0,
                    m,
                    n,
                    k,
                    mat(&a, at(&a, off[0]), inner.1[0] as i64),
                    mat(&b, at(&b, off[1]), inner.1[1] as i64),
                    mat(&d, at(&d, off[2]), inner.1[2] as i64),
                )
            }?;
        }
        Ok(())
    }

    fn softmax(&self, dst: View<'_>, src: View<'_>, log: bool) -> Result<()> {
        let op = if log { "log_softmax" } else { "softmax" };
        let (d, s) = (Raw::of(op, &dst)?, Raw::of(op, &src)?);
        let shape = src.layout.shape();
        if shape.is_empty() {
            return Err(Error::InvalidArgument {
                op,
                what: "softmax of a 0-d tensor: give it a dimension".into(),
            });
        }
        let stream = d.stream();
        let input = if s.is_contiguous_for(shape) {
            s.ptr
        } else {
            // SAFETY: as in `copy`; `dst` is contiguous and distinct from `src`.
            unsafe { kernels::copy(d.device, stream, shape, d.view(), s.view()) }?;
            d.ptr
        };
        // SAFETY: contiguous input and output of `shape`; in place is allowed.
        unsafe {
            kernels::softmax(
                d.device,
                stream,
                d.dtype,
                shape,
                shape.len() - 1,
                log,
                input,
                d.ptr,
            )
        }?;
        Ok(())
    }

    fn cross_entropy(&self, dst: View<'_>, logits: View<'_>, targets: View<'_>) -> Result<()> {
        let a = CeArgs::of("cross_entropy", dst, logits, targets)?;
        let mean = kernels::Reduction::Mean;
        // SAFETY: contiguous logits [n, c], targets [n], a 1-element dst.
        unsafe { kernels::cross_entropy(a.dev, a.stream, a.dt, a.n, a.c, a.x, a.t, mean, a.out) }?;
        Ok(())
    }

    fn cross_entropy_backward(
        &self,
        dst: View<'_>,
        logits: View<'_>,
        targets: View<'_>,
    ) -> Result<()> {
        let op = "cross_entropy_backward";
        let a = CeArgs::of(op, dst, logits, targets)?;
        let mean = kernels::Reduction::Mean;
        // SAFETY: contiguous buffers; grad_out 0 means an incoming gradient of 1.
        unsafe {
            kernels::cross_entropy_backward(
                a.dev, a.stream, a.dt, a.n, a.c, a.x, a.t, mean, 0, a.out,
            )
        }?;
        Ok(())
    }

    fn add_scaled(&self, dst: View<'_>, src: View<'_>, alpha: f64) -> Result<()> {
        let (d, s) = (Raw::of("add_scaled", &dst)?, Raw::of("add_scaled", &src)?);
        // SAFETY: as in `copy`; in place, each element of `dst` is read before it is written
        // by the same thread, and `src` is another storage.
        unsafe {
            kernels::binary(
                d.device,
                d.stream(),
                kernels::BinaryOp::AddScaled(alpha),
                dst.layout.shape(),
                d.view(),
                d.view(),
                s.view(),
            )
        }?;
        Ok(())
    }

    fn relu_backward(&self, dst: View<'_>, grad: View<'_>, input: View<'_>) -> Result<()> {
        let op = "relu_backward";
        let (d, g, x) = (
            Raw::of(op, &dst)?,
            Raw::of(op, &grad)?,
            Raw::of(op, &input)?,
        );
        // SAFETY: as in `copy`: live device storages whose layouts fit their memory; `dst` is a
        // fresh storage; the stream is the device's.
        unsafe {
            kernels::binary(
                d.device,
                d.stream(),
                kernels::BinaryOp::ReluBackward,
                dst.layout.shape(),
                d.view(),
                g.view(),
                x.view(),
            )
        }?;
        Ok(())
    }

    fn index_select(
        &self,
        dst: View<'_>,
        src: View<'_>,
        index: View<'_>,
        dims: [usize; 3],
    ) -> Result<()> {
        let op = "index_select";
        let (d, s, i) = (Raw::of(op, &dst)?, Raw::of(op, &src)?, Raw::of(op, &index)?);
        for (r, v, which) in [
            (&d, &dst, "output"),
            (&s, &src, "input"),
            (&i, &index, "index"),
        ] {
            if !r.is_contiguous_for(v.layout.shape()) {
                return Err(not_contiguous(op, which));
            }
        }
        let len = index.layout.numel();
        // SAFETY: the three views come from live device storages whose layouts the front-end
        // checked to fit their memory, contiguous (checked above) with the extents of the
        // contract; `dst` is a fresh storage; the stream is the device's.
        unsafe {
            kernels::index_select(
                d.device,
                d.stream(),
                d.dtype,
                dims,
                len,
                d.ptr,
                s.ptr,
                i.ptr,
            )
        }?;
        Ok(())
    }

    fn sgd_momentum(
        &self,
        params: &[SgdParam<'_>],
        momentum: f64,
        lr: f64,
        first_step: bool,
    ) -> Result<()> {
        let op = "sgd_momentum";
        let Some(first) = params.first() else {
            return Ok(());
        };
        let head = Raw::of(op, &first.param)?;
        let mut tensors = Vec::with_capacity(params.len());
        for sp in params {
            let shape = sp.param.layout.shape();
            let (p, g, v) = (
                Raw::of(op, &sp.param)?,
                Raw::of(op, &sp.grad)?,
                Raw::of(op, &sp.velocity)?,
            );
            for (r, which) in [(&p, "parameter"), (&g, "gradient"), (&v, "momentum buffer")] {
                if !r.is_contiguous_for(shape) {
                    return Err(not_contiguous(op, which));
                }
            }
            tensors.push(kernels::SgdTensor {
                param: p.ptr,
                grad: g.ptr,
                velocity: v.ptr,
                len: shape.iter().product(),
            });
        }
        // SAFETY: every view comes from a live device storage whose layout the front-end
        // checked to fit its memory, contiguous (checked above) with `len` elements; the
        // front-end checked that no two share a storage, so no ranges overlap; the stream is
        // the device's.
        unsafe {
            kernels::sgd_momentum(
                head.device,
                head.stream(),
                head.dtype,
                &tensors,
                momentum,
                -lr,
                first_step,
            )
        }?;
        Ok(())
    }

    fn random(&self, dst: View<'_>, dist: RandomDist, seed: u64, offset: u64) -> Result<()> {
        let d = Raw::of("random", &dst)?;
        let shape = dst.layout.shape();
        if !d.is_contiguous_for(shape) {
            return Err(not_contiguous("random", "output"));
        }
        let n = shape.iter().product();
        // SAFETY: contiguous `dst` of `n` elements.
        unsafe { fill_random_with(d.device, d.stream(), d.dtype, n, dist, d.ptr, seed, offset) }?;
        Ok(())
    }
}

/// `dst = k(src)` with the kernel's unary op `k` (in place on `dst` when `src` is `None`):
/// the launch behind [`DeviceKernels::unary`] and [`DeviceKernels::scalar`], errors naming `op`.
fn unary_kernel(
    op: &'static str,
    k: kernels::UnaryOp,
    dst: View<'_>,
    src: Option<View<'_>>,
) -> Result<()> {
    let d = Raw::of(op, &dst)?;
    let s = Raw::of(op, src.as_ref().unwrap_or(&dst))?;
    // SAFETY: as in `CudaKernels::copy`: both views come from live storages whose layouts the
    // front-end checked to fit their memory; the stream is the device's. In place, `dst` is
    // read and written element by element.
    unsafe {
        kernels::unary(
            d.device,
            d.stream(),
            k,
            dst.layout.shape(),
            d.view(),
            s.view(),
        )
    }?;
    Ok(())
}

/// The arguments the cross-entropy kernels share, checked: the device and its current
/// stream, the logits' dtype, `n` rows of `c` classes, and the addresses of the contiguous
/// logits `[n, c]`, the contiguous targets `[n]` and the output.
struct CeArgs {
    dev: usize,
    stream: RawStream,
    dt: DType,
    n: usize,
    c: usize,
    /// The logits' address.
    x: u64,
    /// The targets' address.
    t: u64,
    out: u64,
}

impl CeArgs {
    /// Errors, naming `op`: [`Error::InvalidArgument`] for a view that is not device memory,
    /// logits that are not `[N, C]`, or non-contiguous logits or targets (in that order).
    fn of(op: &'static str, dst: View<'_>, logits: View<'_>, targets: View<'_>) -> Result<Self> {
        let (d, x, t) = (
            Raw::of(op, &dst)?,
            Raw::of(op, &logits)?,
            Raw::of(op, &targets)?,
        );
        let shape = logits.layout.shape();
        let (n, c) = two_d(op, shape)?;
        if !x.is_contiguous_for(shape) {
            return Err(not_contiguous(op, "logits tensor"));
        }
        if !t.is_contiguous_for(targets.layout.shape()) {
            return Err(not_contiguous(op, "targets tensor"));
        }
        Ok(Self {
            dev: d.device,
            stream: d.stream(),
            dt: x.dtype,
            n,
            c,
            x: x.ptr,
            t: t.ptr,
            out: d.ptr,
        })
    }
}

fn two_d(op: &'static str, shape: &[usize]) -> Result<(usize, usize)> {
    match shape {
        [n, c] => Ok((*n, *c)),
        _ => Err(Error::InvalidArgument {
            op,
            what: format!("logits must be [N, C], got {shape:?}"),
        }),
    }
}
