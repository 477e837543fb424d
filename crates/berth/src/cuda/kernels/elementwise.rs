//! Elementwise kernels over strided, broadcast operands: unary and scalar ops, binary ops,
//! comparisons, fill, and the strided copy that also casts between dtypes.
//!
//! Every kernel is a grid-stride loop over the output's elements in row-major order; operand
//! offsets come from the packed [`Idx`] (broadcast dimensions have stride 0). In-place ops pass
//! the same view as output and input: each element is read before it is written by the same
//! thread, so that is safe as long as the output has no internal overlap.

use super::{grid_for, kernel_params, numel, DeviceView, Family, Idx, RawStream};
use crate::cuda::CudaError;
use crate::ops::CmpOp;
use crate::DType;
use std::ffi::c_void;

/// Threads per block of the elementwise kernels.
const BLOCK: u32 = 256;

const UNARY_SRC: &str = r#"
#define UNARY(name, expr) \
extern "C" __global__ void KN(name)(i64 n, Idx2 ix, S* out, const S* a, double p, double q) { \
    C cp = FD(p); C cq = FD(q); (void)cp; (void)cq; \
    GRID_STRIDE(i, n) { i64 o0, o1; off2(ix, i, o0, o1); C x = LD(a[o1]); out[o0] = ST(expr); } }
UNARY(neg, -x)
UNARY(relu, (m_isnan(x) ? x : (x > (C)0 ? x : (C)0)))
UNARY(exp, m_exp(x))
UNARY(log, m_log(x))
UNARY(sqrt, m_sqrt(x))
UNARY(abs, (x < (C)0 ? -x : x))
UNARY(sigmoid, ((C)1 / ((C)1 + m_exp(-x))))
UNARY(tanh, m_tanh(x))
UNARY(add_scalar, (x + cp))
UNARY(mul_scalar, (x * cp))
UNARY(div_scalar, (x / cp))
UNARY(rsub_scalar, (cp - x))
UNARY(pow_scalar, m_pow(x, cp))
UNARY(clamp, (x < cp ? cp : (x > cq ? cq : x)))
UNARY(affine, (x * cp + cq))
UNARY(rdiv_scalar, (cp / x))
UNARY(rpow_scalar, m_pow(cp, x))
UNARY(maximum_scalar, (m_isnan(x) ? x : (x > cp ? x : cp)))
UNARY(minimum_scalar, (m_isnan(x) ? x : (x < cp ? x : cp)))

extern "C" __global__ void KN(fill)(i64 n, Idx1 ix, S* out, double p) {
    S v = ST(FD(p));
    GRID_STRIDE(i, n) { i64 o; off1(ix, i, o); out[o] = v; }
}
"#;

const BINARY_SRC: &str = r#"
#define BINARY(name, expr) \
extern "C" __global__ void KN(name)(i64 n, Idx3 ix, S* out, const S* a, const S* b, double p) { \
    C cp = FD(p); (void)cp; \
    GRID_STRIDE(i, n) { i64 o0, o1, o2; off3(ix, i, o0, o1, o2); C x = LD(a[o1]); C y = LD(b[o2]); out[o0] = ST(expr); } }
#define COMPARE(name, expr) \
extern "C" __global__ void KN(name)(i64 n, Idx3 ix, unsigned char* out, const S* a, const S* b, double p) { \
    GRID_STRIDE(i, n) { i64 o0, o1, o2; off3(ix, i, o0, o1, o2); C x = LD(a[o1]); C y = LD(b[o2]); out[o0] = (expr) ? 1 : 0; } }
BINARY(add, (x + y))
BINARY(sub, (x - y))
BINARY(mul, (x * y))
BINARY(div, (x / y))
BINARY(pow, m_pow(x, y))
BINARY(maximum, (m_isnan(x) ? x : (m_isnan(y) ? y : (x > y ? x : y))))
BINARY(minimum, (m_isnan(x) ? x : (m_isnan(y) ? y : (x < y ? x : y))))
/* the product rounded before the sum: the bits of mul_scalar then add (no FMA) */
BINARY(add_scaled, m_add_rn(x, m_mul_rn(y, cp)))
/* x * mask with mask = (y > 0) as 0 or 1: the bits of gt, to and mul (Note [Fused updates are exact]) */
BINARY(relu_backward, m_mul_rn(x, (y > (C)0 ? (C)1 : (C)0)))
/* tensor-scalar: floats compare in their compute type (the scalar rounded to it, as PyTorch),
   integers in double so that 3 == 3.5 is false */
#if IS_FLOAT
#define SCAL(p) FD(p)
#else
#define SCAL(p) (p)
#endif
#define COMPARE_S(name, expr) \
extern "C" __global__ void KN(name)(i64 n, Idx3 ix, unsigned char* out, const S* a, const S* b, double p) { \
    GRID_STRIDE(i, n) { i64 o0, o1, o2; off3(ix, i, o0, o1, o2); C x = LD(a[o1]); out[o0] = (expr) ? 1 : 0; } }
COMPARE_S(eqs, x == SCAL(p))
COMPARE_S(nes, x != SCAL(p))
COMPARE_S(gts, x > SCAL(p))
COMPARE_S(lts, x < SCAL(p))
COMPARE_S(ges, x >= SCAL(p))
COMPARE_S(les, x <= SCAL(p))
COMPARE(eq, x == y)
COMPARE(ne, x != y)
COMPARE(gt, x > y)
COMPARE(lt, x < y)
COMPARE(ge, x >= y)
COMPARE(le, x <= y)
"#;

const COPY_SRC: &str = r#"
#define COPY(D) \
extern "C" __global__ void CAT(CAT(copy_, D), CAT(_from_, SUF))(i64 n, Idx2 ix, CAT(s_, D)* out, const S* a) { \
    GRID_STRIDE(i, n) { i64 o0, o1; off2(ix, i, o0, o1); out[o0] = CAT(st_, D)(CAT(cv_, D)(LD(a[o1]))); } }
COPY(f32) COPY(f64) COPY(f16) COPY(bf16) COPY(i64) COPY(i32) COPY(u8) COPY(bool)
"#;

/// Unary and scalar elementwise ops (`out = op(a)`); scalars are converted to the dtype's
/// compute type first (f32 for f16/bf16), as PyTorch does.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum UnaryOp {
    /// `-x`.
    Neg,
    /// `max(x, 0)`, NaN stays NaN.
    Relu,
    /// `e^x`.
    Exp,
    /// Natural logarithm.
    Log,
    /// Square root.
    Sqrt,
    /// `|x|`.
    Abs,
    /// `1 / (1 + e^-x)`.
    Sigmoid,
    /// Hyperbolic tangent.
    Tanh,
    /// `x + s`.
    AddScalar(f64),
    /// `x * s`.
    MulScalar(f64),
    /// `x / s`.
    DivScalar(f64),
    /// `s - x`.
    RsubScalar(f64),
    /// `x ^ s`.
    PowScalar(f64),
    /// `min(max(x, lo), hi)`.
    Clamp(f64, f64),
    /// `x * a + b`.
    Affine(f64, f64),
    /// `s / x`.
    RdivScalar(f64),
    /// `s ^ x`.
    RpowScalar(f64),
    /// `max(x, s)`, NaN-propagating.
    MaximumScalar(f64),
    /// `min(x, s)`, NaN-propagating.
    MinimumScalar(f64),
}

impl UnaryOp {
    fn kernel(self) -> (&'static str, f64, f64) {
        match self {
            Self::Neg => ("neg", 0.0, 0.0),
            Self::Relu => ("relu", 0.0, 0.0),
            Self::Exp => ("exp", 0.0, 0.0),
            Self::Log => ("log", 0.0, 0.0),
            Self::Sqrt => ("sqrt", 0.0, 0.0),
            Self::Abs => ("abs", 0.0, 0.0),
            Self::Sigmoid => ("sigmoid", 0.0, 0.0),
            Self::Tanh => ("tanh", 0.0, 0.0),
            Self::AddScalar(s) => ("add_scalar", s, 0.0),
            Self::MulScalar(s) => ("mul_scalar", s, 0.0),
            Self::DivScalar(s) => ("div_scalar", s, 0.0),
            Self::RsubScalar(s) => ("rsub_scalar", s, 0.0),
            Self::PowScalar(s) => ("pow_scalar", s, 0.0),
            Self::Clamp(lo, hi) => ("clamp", lo, hi),
            Self::Affine(a, b) => ("affine", a, b),
            Self::RdivScalar(s) => ("rdiv_scalar", s, 0.0),
            Self::RpowScalar(s) => ("rpow_scalar", s, 0.0),
            Self::MaximumScalar(s) => ("maximum_scalar", s, 0.0),
            Self::MinimumScalar(s) => ("minimum_scalar", s, 0.0),
        }
    }
}

/// Binary elementwise ops (`out = op(a, b)`), operands of one dtype.
#[derive(Debug, Clone, Copy, PartialEq)]
#[non_exhaustive]
pub enum BinaryOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b` (C division for integers).
    Div,
    /// `a ^ b`.
    Pow,
    /// Elementwise maximum, NaN-propagating (`torch.maximum`).
    Maximum,
    /// Elementwise minimum, NaN-propagating (`torch.minimum`).
    Minimum,
    /// `a + alpha * b` (`torch.add(a, b, alpha=alpha)`, `add_scaled_`).
    AddScaled(f64),
    /// `a · (b > 0 ? 1 : 0)` with `a` the incoming gradient and `b` relu's input: the bits of
    /// `a * (b > 0).to(dtype)`, berth's relu backward (so `−0` for a negative `a` where
    /// `b ≤ 0` and NaN for an infinite one, where PyTorch's `threshold_backward` selects 0).
    ReluBackward,
}

impl BinaryOp {
    fn kernel(self) -> (&'static str, f64) {
        match self {
            Self::Add => ("add", 0.0),
            Self::Sub => ("sub", 0.0),
            Self::Mul => ("mul", 0.0),
            Self::Div => ("div", 0.0),
            Self::Pow => ("pow", 0.0),
            Self::Maximum => ("maximum", 0.0),
            Self::Minimum => ("minimum", 0.0),
            Self::AddScaled(s) => ("add_scaled", s),
            Self::ReluBackward => ("relu_backward", 0.0),
        }
    }
}

fn same_dtype(op: &'static str, want: DType, got: DType) -> Result<(), CudaError> {
    if want == got {
        Ok(())
    } else {
        Err(super::KernelError::invalid(
            op,
            format!(
                "operands must share one dtype, got {} and {}: cast first",
                want.as_str(),
                got.as_str()
            ),
        )
        .into())
    }
}

/// The elementwise kernel families, one module per dtype each.
const UNARY: Family = Family {
    key: "unary",
    src: UNARY_SRC,
};
const BINARY: Family = Family {
    key: "binary",
    src: BINARY_SRC,
};
const COPY: Family = Family {
    key: "copy",
    src: COPY_SRC,
};

/// Launches kernel `KN(name)` of `family`'s module for `dtype` on `device` (binding its
/// context; see [`super::run`]) over `n` elements: [`grid_for`] blocks of [`BLOCK`] threads;
/// nothing when `n` is 0.
///
/// # Safety
/// As [`launch`](super::launch): `params` match the kernel's signature and every pointer is
/// valid; `stream` belongs to `device`'s primary context (or is null).
unsafe fn run(
    device: usize,
    stream: RawStream,
    family: Family,
    dtype: DType,
    name: &str,
    n: i64,
    params: &mut [*mut c_void],
) -> Result<(), CudaError> {
    if n == 0 {
        return Ok(());
    }
    let grid = grid_for(n as u64, BLOCK);
    // SAFETY: the caller's contract.
    unsafe { super::run(device, stream, family, dtype, name, grid, BLOCK, params) }
}

/// `out = op(a)` over `shape`, on `stream` of `device`.
///
/// # Errors
/// [`CudaError::Kernel`] for dtype or shape problems, NVRTC or launch failures; the errors of
/// [`bind_context`](crate::cuda::bind_context).
///
/// # Safety
/// 1. `out` and `a` address device memory of `device` valid for every element their strides
///    reach over `shape`, until the kernel has run on `stream`.
/// 2. `stream` belongs to `device`'s primary context (or is null).
/// 3. `out` has no two elements at one address.
pub unsafe fn unary(
    device: usize,
    stream: RawStream,
    op: UnaryOp,
    shape: &[usize],
    out: DeviceView<'_>,
    a: DeviceView<'_>,
) -> Result<(), CudaError> {
    same_dtype("unary", out.dtype, a.dtype)?;
    let (name, mut p, mut q) = op.kernel();
    let mut n = numel("unary", shape)?;
    let mut ix = Idx::<2>::new("unary", shape, [out.strides, a.strides])?;
    let (mut o, mut x) = (out.ptr, a.ptr);
    let mut params = kernel_params![n, ix, o, x, p, q];
    // SAFETY: the params match `UNARY`'s signature; pointers per the caller's contract.
    unsafe { run(device, stream, UNARY, a.dtype, name, n, &mut params) }
}

/// Writes `value` (converted to `out`'s dtype; bool is `value != 0`) into every element of
/// `out` over `shape` (`fill_`).
///
/// # Errors
/// As [`unary`].
///
/// # Safety
/// As [`unary`].
pub unsafe fn fill(
    device: usize,
    stream: RawStream,
    shape: &[usize],
    out: DeviceView<'_>,
    value: f64,
) -> Result<(), CudaError> {
    let mut n = numel("fill", shape)?;
    let mut ix = Idx::<1>::new("fill", shape, [out.strides])?;
    let mut o = out.ptr;
    let mut p = value;
    let mut params = kernel_params![n, ix, o, p];
    // SAFETY: the params match `fill`'s signature; pointers per the caller's contract.
    unsafe { run(device, stream, UNARY, out.dtype, "fill", n, &mut params) }
}

/// `out = op(a, b)` over `shape` (broadcast operands have stride 0).
///
/// # Errors
/// As [`unary`]; operands of different dtypes are [`KernelError::InvalidArgument`](super::KernelError).
///
/// # Safety
/// As [`unary`], for `a` and `b` too.
pub unsafe fn binary(
    device: usize,
    stream: RawStream,
    op: BinaryOp,
    shape: &[usize],
    out: DeviceView<'_>,
    a: DeviceView<'_>,
    b: DeviceView<'_>,
) -> Result<(), CudaError> {
    same_dtype("binary", out.dtype, a.dtype)?;
    same_dtype("binary", a.dtype, b.dtype)?;
    let (name, mut p) = op.kernel();
    let mut n = numel("binary", shape)?;
    let mut ix = Idx::<3>::new("binary", shape, [out.strides, a.strides, b.strides])?;
    let (mut o, mut x, mut y) = (out.ptr, a.ptr, b.ptr);
    let mut params = kernel_params![n, ix, o, x, y, p];
    // SAFETY: the params match `BINARY`'s signature; pointers per the caller's contract.
    unsafe { run(device, stream, BINARY, a.dtype, name, n, &mut params) }
}

/// `out = a <op> b` into a bool `out` over `shape`; with `b` `None`, `out = a <op> scalar`
/// (floats compare with the scalar rounded to their compute type, integers in f64).
///
/// # Errors
/// As [`binary`]; `out` must be bool.
///
/// # Safety
/// As [`binary`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn compare(
    device: usize,
    stream: RawStream,
    op: CmpOp,
    shape: &[usize],
    out: DeviceView<'_>,
    a: DeviceView<'_>,
    b: Option<DeviceView<'_>>,
    scalar: f64,
) -> Result<(), CudaError> {
    same_dtype("compare", DType::Bool, out.dtype)?;
    if let Some(b) = b {
        same_dtype("compare", a.dtype, b.dtype)?;
    }
    let zeros = vec![0isize; shape.len()];
    let b_strides = b.map_or(zeros.as_slice(), |b| b.strides);
    let mut n = numel("compare", shape)?;
    let mut ix = Idx::<3>::new("compare", shape, [out.strides, a.strides, b_strides])?;
    let (mut o, mut x, mut y, mut p) = (out.ptr, a.ptr, b.map_or(0, |b| b.ptr), scalar);
    let mut params = kernel_params![n, ix, o, x, y, p];
    let suffix = if b.is_some() { "" } else { "s" };
    let name = format!("{}{suffix}", op.name());
    // SAFETY: the params match `COMPARE` (whose last parameter is absent and ignored) or
    // `COMPARE_S`; pointers per the caller's contract.
    unsafe { run(device, stream, BINARY, a.dtype, &name, n, &mut params) }
}

/// Copies `src` into `out` over `shape`, converting between their dtypes: the strided to
/// contiguous copy (`contiguous()`), `copy_`, broadcasting materialisation (`expand` then copy)
/// and `to_dtype`. Float to integer truncates toward zero, anything to bool is `!= 0`, f32 to
/// f16/bf16 rounds to nearest even.
///
/// # Errors
/// As [`unary`].
///
/// # Safety
/// As [`unary`]; `out` and `src` must not overlap (unless they are the same view).
pub unsafe fn copy(
    device: usize,
    stream: RawStream,
    shape: &[usize],
    out: DeviceView<'_>,
    src: DeviceView<'_>,
) -> Result<(), CudaError> {
    let mut n = numel("copy", shape)?;
    let mut ix = Idx::<2>::new("copy", shape, [out.strides, src.strides])?;
    let (mut o, mut x) = (out.ptr, src.ptr);
    let mut params = kernel_params![n, ix, o, x];
    // `copy_<out>_from_<src>`: `run` appends `_<src>`, the module's dtype.
    let name = format!("copy_{}_from", out.dtype.as_str());
    // SAFETY: the params match `COPY`'s signature; pointers per the caller's contract.
    unsafe { run(device, stream, COPY, src.dtype, &name, n, &mut params) }
}
