//! CPU kernels: the host implementation of [`DeviceKernels`].
//!
//! Elements are computed in a *compute type*: `f32` for f32/f16/bf16 (PyTorch computes half
//! types in f32 where it has no half kernel), `f64` for f64, `i64` for integers and bool.
//! Large elementwise and reduction work runs on rayon; matmul goes through `gemm`.
//!
//! Note [Exact integers]: values that cross dtypes (casts, reductions, the staging buffers of
//! copies) travel in a [`Wide`] type: `f64` for floats, `i64` for integers and bool. An `f64`
//! holds integers exactly only up to 2^53, so `i64` values never go through it: integer sums
//! and products wrap in `i64` (PyTorch sums integer tensors into int64 and wraps), max, min
//! and argmax compare integers exactly, and int → int casts wrap as C++'s (and Rust's `as`)
//! do.

mod elementwise;
mod index;
mod matmul;
mod nnops;
mod optim;
mod reduce;

use half::{bf16, f16};

use crate::device_kernels::interface::{DeviceKernels, RandomDist, SgdParam, View};
use crate::ops::{BinaryOp, CmpOp, ReduceOp, UnaryOp};
use crate::storage::{HostRead, Pod};
use crate::{Device, Result, Storage};

/// Work below this many elements runs on the calling thread.
pub(crate) const PAR_MIN: usize = 1 << 15;

/// Arithmetic of a compute type.
pub(crate) trait Scalar: Copy + Send + Sync + PartialOrd + 'static {
    const IS_FLOAT: bool;
    /// The exact intermediate of this compute type (Note [Exact integers]).
    type Wide: Wide;
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    /// `v` as Rust's `as` converts it (wrapping for integers, rounded to nearest for floats).
    fn from_i64(v: i64) -> Self;
    /// The value in [`Scalar::Wide`], exactly.
    fn widen(self) -> Self::Wide;
    fn unary(op: UnaryOp, x: Self) -> Self;
    fn binary(op: BinaryOp, a: Self, b: Self) -> Self;
}

macro_rules! float_scalar {
    ($t:ty) => {
        impl Scalar for $t {
            const IS_FLOAT: bool = true;
            type Wide = f64;
            #[inline]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline]
            fn from_i64(v: i64) -> Self {
                v as $t
            }
            #[inline]
            fn widen(self) -> f64 {
                self as f64
            }
            #[inline]
            fn unary(op: UnaryOp, x: Self) -> Self {
                match op {
                    UnaryOp::Neg => -x,
                    // NaN propagates, as torch.relu.
                    UnaryOp::Relu => {
                        if x < 0.0 {
                            0.0
                        } else {
                            x
                        }
                    }
                    UnaryOp::Exp => x.exp(),
                    UnaryOp::Log => x.ln(),
                    UnaryOp::Sqrt => x.sqrt(),
                    UnaryOp::Abs => x.abs(),
                }
            }
            #[inline]
            fn binary(op: BinaryOp, a: Self, b: Self) -> Self {
                match op {
                    BinaryOp::Add => a + b,
                    BinaryOp::Sub => a - b,
                    BinaryOp::Mul => a * b,
                    BinaryOp::Div => a / b,
                    BinaryOp::Pow => a.powf(b),
                    // NaN propagates, as torch.maximum/minimum.
                    BinaryOp::Maximum => {
                        if a.is_nan() || a > b {
                            a
                        } else {
                            b
                        }
                    }
                    BinaryOp::Minimum => {
                        if a.is_nan() || a < b {
                            a
                        } else {
                            b
                        }
                    }
                }
            }
        }
    };
}
float_scalar!(f32);
float_scalar!(f64);

impl Scalar for i64 {
    const IS_FLOAT: bool = false;
    type Wide = i64;
    #[inline]
    fn from_f64(v: f64) -> Self {
        v as i64
    }
    #[inline]
    fn to_f64(self) -> f64 {
        self as f64
    }
    #[inline]
    fn from_i64(v: i64) -> Self {
        v
    }
    #[inline]
    fn widen(self) -> i64 {
        self
    }
    #[inline]
    fn unary(op: UnaryOp, x: Self) -> Self {
        match op {
            UnaryOp::Neg => x.wrapping_neg(),
            UnaryOp::Relu => x.max(0),
            UnaryOp::Abs => x.wrapping_abs(),
            // Float-only ops never reach integer kernels (checked by ops::infer).
            UnaryOp::Exp | UnaryOp::Log | UnaryOp::Sqrt => {
                <f64 as Scalar>::unary(op, x as f64) as i64
            }
        }
    }
    #[inline]
    fn binary(op: BinaryOp, a: Self, b: Self) -> Self {
        match op {
            BinaryOp::Add => a.wrapping_add(b),
            BinaryOp::Sub => a.wrapping_sub(b),
            BinaryOp::Mul => a.wrapping_mul(b),
            BinaryOp::Div => a.checked_div(b).unwrap_or(0),
            BinaryOp::Pow => (a as f64).powf(b as f64) as i64,
            BinaryOp::Maximum => a.max(b),
            BinaryOp::Minimum => a.min(b),
        }
    }
}

/// The exact intermediate of values crossing dtypes: `f64` for floats, `i64` for integers
/// and bool (Note [Exact integers]).
pub(crate) trait Wide: Pod + PartialOrd {
    /// `0`.
    const ZERO: Self;
    /// `self + o` (wrapping for `i64`, as PyTorch's integer sums).
    fn add(self, o: Self) -> Self;
    /// Whether this is NaN (never for `i64`).
    fn is_nan(self) -> bool;
    /// `self / count` (a mean; integer means are rejected before any kernel).
    fn div_count(self, count: usize) -> Self;
    /// An element index (argmax) as this type.
    fn from_index(i: usize) -> Self;
    /// `1` for non-zero (NaN included), else `0`: the value as a bool.
    fn to_bool(self) -> Self;
    /// The value stored as `O`: from `f64` as [`Scalar::from_f64`] converts, from `i64` as
    /// [`Scalar::from_i64`] (so int → int wraps, as a C++ cast).
    fn store<O: Num>(self) -> O;
}

impl Wide for f64 {
    const ZERO: f64 = 0.0;
    #[inline]
    fn add(self, o: f64) -> f64 {
        self + o
    }
    #[inline]
    fn is_nan(self) -> bool {
        f64::is_nan(self)
    }
    #[inline]
    fn div_count(self, count: usize) -> f64 {
        self / count as f64
    }
    #[inline]
    fn from_index(i: usize) -> f64 {
        i as f64
    }
    #[inline]
    fn to_bool(self) -> f64 {
        f64::from(u8::from(self != 0.0))
    }
    #[inline]
    fn store<O: Num>(self) -> O {
        O::from_c(<O::C as Scalar>::from_f64(self))
    }
}

impl Wide for i64 {
    const ZERO: i64 = 0;
    #[inline]
    fn add(self, o: i64) -> i64 {
        self.wrapping_add(o)
    }
    #[inline]
    fn is_nan(self) -> bool {
        false
    }
    #[inline]
    fn div_count(self, count: usize) -> i64 {
        i64::try_from(count).map_or(0, |c| self.checked_div(c).unwrap_or(0))
    }
    #[inline]
    fn from_index(i: usize) -> i64 {
        i as i64
    }
    #[inline]
    fn to_bool(self) -> i64 {
        i64::from(self != 0)
    }
    #[inline]
    fn store<O: Num>(self) -> O {
        O::from_c(<O::C as Scalar>::from_i64(self))
    }
}

/// A stored element type and its compute type.
pub(crate) trait Num: Pod + Default {
    type C: Scalar;
    fn to_c(self) -> Self::C;
    fn from_c(c: Self::C) -> Self;
}

macro_rules! num {
    ($t:ty, $c:ty, |$x:ident| $to:expr, |$y:ident| $from:expr) => {
        impl Num for $t {
            type C = $c;
            #[inline]
            fn to_c(self) -> $c {
                let $x = self;
                $to
            }
            #[inline]
            fn from_c($y: $c) -> Self {
                $from
            }
        }
    };
}
num!(f32, f32, |x| x, |y| y);
num!(f64, f64, |x| x, |y| y);
num!(f16, f32, |x| x.to_f32(), |y| f16::from_f32(y));
num!(bf16, f32, |x| x.to_f32(), |y| bf16::from_f32(y));
num!(i64, i64, |x| x, |y| y);
num!(i32, i64, |x| x as i64, |y| y as i32);
num!(u8, i64, |x| x as i64, |y| y as u8);

/// Run `$body` with `$T` bound to the stored Rust type of `$dt` (bool is stored as `u8`).
macro_rules! with_repr {
    ($dt:expr, $T:ident => $body:expr) => {
        match $dt {
            $crate::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::DType::F64 => {
                type $T = f64;
                $body
            }
            $crate::DType::F16 => {
                type $T = half::f16;
                $body
            }
            $crate::DType::BF16 => {
                type $T = half::bf16;
                $body
            }
            $crate::DType::I64 => {
                type $T = i64;
                $body
            }
            $crate::DType::I32 => {
                type $T = i32;
                $body
            }
            $crate::DType::U8 | $crate::DType::Bool => {
                type $T = u8;
                $body
            }
        }
    };
}
pub(crate) use with_repr;

/// Read guard + layout of one operand.
pub(crate) struct In<'a> {
    guard: HostRead<'a>,
}

impl<'a> In<'a> {
    pub(crate) fn new(v: View<'a>, op: &'static str) -> Result<In<'a>> {
        Ok(In {
            guard: v.storage.read_host(op)?,
        })
    }
    pub(crate) fn typed<T: Pod>(&self) -> &[T] {
        self.guard.typed::<T>()
    }
}

/// The CPU kernels.
#[derive(Debug, Clone, Copy)]
pub struct CpuKernels;

impl DeviceKernels for CpuKernels {
    fn kind(&self) -> Device {
        Device::Cpu
    }

    fn alloc(&self, _device: Device, nbytes: usize) -> Result<Storage> {
        Storage::try_host_zeroed(nbytes)
    }

    fn copy(&self, dst: View<'_>, src: View<'_>) -> Result<()> {
        elementwise::copy(dst, src)
    }

    fn fill(&self, dst: View<'_>, value: f64) -> Result<()> {
        elementwise::fill(dst, value)
    }

    fn unary(&self, op: UnaryOp, dst: View<'_>, src: Option<View<'_>>) -> Result<()> {
        elementwise::unary(op, dst, src)
    }

    fn binary(
        &self,
        op: BinaryOp,
        dst: View<'_>,
        lhs: Option<View<'_>>,
        rhs: View<'_>,
    ) -> Result<()> {
        elementwise::binary(op, dst, lhs, rhs)
    }

    fn scalar(
        &self,
        op: BinaryOp,
        dst: View<'_>,
        src: Option<View<'_>>,
        scalar: f64,
        scalar_first: bool,
    ) -> Result<()> {
        elementwise::scalar(op, dst, src, scalar, scalar_first)
    }

    fn compare(
        &self,
        op: CmpOp,
        dst: View<'_>,
        lhs: View<'_>,
        rhs: Option<View<'_>>,
        scalar: f64,
    ) -> Result<()> {
        elementwise::compare(op, dst, lhs, rhs, scalar)
    }

    fn reduce(&self, op: ReduceOp, dst: View<'_>, src: View<'_>, dims: &[usize]) -> Result<()> {
        reduce::reduce(op, dst, src, dims)
    }

    fn matmul(&self, dst: View<'_>, lhs: View<'_>, rhs: View<'_>) -> Result<()> {
        matmul::matmul(dst, lhs, rhs)
    }

    fn softmax(&self, dst: View<'_>, src: View<'_>, log: bool) -> Result<()> {
        nnops::softmax(dst, src, log)
    }

    fn cross_entropy(&self, dst: View<'_>, logits: View<'_>, targets: View<'_>) -> Result<()> {
        nnops::cross_entropy(dst, logits, targets, false)
    }

    fn cross_entropy_backward(
        &self,
        dst: View<'_>,
        logits: View<'_>,
        targets: View<'_>,
    ) -> Result<()> {
        nnops::cross_entropy(dst, logits, targets, true)
    }

    fn random(&self, dst: View<'_>, dist: RandomDist, seed: u64, offset: u64) -> Result<()> {
        nnops::random(dst, dist, seed, offset)
    }

    fn add_scaled(&self, dst: View<'_>, src: View<'_>, alpha: f64) -> Result<()> {
        optim::add_scaled(dst, src, alpha)
    }

    fn relu_backward(&self, dst: View<'_>, grad: View<'_>, input: View<'_>) -> Result<()> {
        optim::relu_backward(dst, grad, input)
    }

    fn index_select(
        &self,
        dst: View<'_>,
        src: View<'_>,
        index: View<'_>,
        dims: [usize; 3],
    ) -> Result<()> {
        index::index_select(dst, src, index, dims)
    }

    fn sgd_momentum(
        &self,
        params: &[SgdParam<'_>],
        momentum: f64,
        lr: f64,
        first_step: bool,
    ) -> Result<()> {
        optim::sgd_momentum(params, momentum, lr, first_step)
    }
}

/// `torch.arange` into the dense host tensor `dst`: element `i` is `start + i * step`.
pub(crate) fn arange(dst: View<'_>, start: f64, step: f64) -> Result<()> {
    elementwise::arange(dst, start, step)
}

/// Collect the `n` items of `iter` into a `Vec` whose memory is requested fallibly, as tensor
/// storage is: index and value lists the size of a tensor (an expanded one can have 2^38
/// elements over one real one) must be a typed out-of-memory error, never an abort.
///
/// # Errors
/// [`crate::Error::HostOutOfMemory`] (device `cpu`, `n × size_of::<T>()` bytes) when the
/// system allocator refuses.
pub(crate) fn try_collect<T>(n: usize, iter: impl Iterator<Item = T>) -> Result<Vec<T>> {
    let mut v = Vec::new();
    v.try_reserve_exact(n)
        .map_err(|_| crate::Error::HostOutOfMemory {
            device: Device::Cpu,
            requested_bytes: n.saturating_mul(std::mem::size_of::<T>()),
        })?;
    v.extend(iter.take(n));
    Ok(v)
}

/// `n` copies of `value` in a fallibly allocated `Vec` (as [`try_collect`]).
///
/// # Errors
/// As [`try_collect`].
pub(crate) fn try_vec<T: Clone>(n: usize, value: T) -> Result<Vec<T>> {
    try_collect(n, std::iter::repeat_n(value, n))
}

/// A stored element as `f64`.
#[inline]
pub(crate) fn num_to_f64<T: Num>(x: T) -> f64 {
    x.to_c().to_f64()
}
