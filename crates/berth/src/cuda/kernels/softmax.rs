//! Row-wise softmax / `log_softmax` (+ backward) and cross-entropy (+ backward), float dtypes.
//!
//! Inputs are contiguous and seen as `[outer, classes, inner]` with the softmax dimension in
//! the middle (`inner` = 1 for the last dimension); each row (`outer * inner` of them) gets one
//! block, which finds the row's max, then the sum of `exp(x - max)` with warp shuffles, then
//! writes (the numerically stable form PyTorch uses). f16/bf16 compute in f32.
//!
//! Cross-entropy takes logits `[N, C]` and i64 class indices `[N]` (PyTorch's
//! `F.cross_entropy(logits, target)` without weights or label smoothing). A target outside
//! `[0, C)` gives a NaN loss and NaN gradients for its row, where PyTorch stops with a
//! device-side assert: checking would need a host sync.

use super::{kernel_params, numel, run, Family, KernelError, RawStream};
use crate::cuda::CudaError;
use crate::DType;
use std::ffi::c_void;

const SOFTMAX_SRC: &str = r#"
#define NEG_INF ((A)(-__int_as_float(0x7f800000)))
#define QNAN ((A)(__int_as_float(0x7fffffff)))
extern "C" __global__ void KN(softmax_fwd)(i64 rows, i64 K, i64 inner, const S* in, S* out, int logm) {
    __shared__ A sh[32];
    for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
        i64 base = (row / inner) * K * inner + row % inner;
        A m = NEG_INF;
        for (i64 c = threadIdx.x; c < K; c += blockDim.x) m = nan_max(m, (A)LD(in[base + c * inner]));
        m = block_max(m, sh);
        A s = 0;
        for (i64 c = threadIdx.x; c < K; c += blockDim.x) s += m_exp((A)LD(in[base + c * inner]) - m);
        s = block_sum(s, sh);
        A ls = m_log(s);
        for (i64 c = threadIdx.x; c < K; c += blockDim.x) {
            A x = (A)LD(in[base + c * inner]) - m;
            out[base + c * inner] = ST(logm ? x - ls : m_exp(x) / s);
        }
    }
}
/* softmax: gin = y * (g - sum(g * y)); log_softmax: gin = g - exp(y) * sum(g) */
extern "C" __global__ void KN(softmax_bwd)(i64 rows, i64 K, i64 inner, const S* y, const S* g, S* gin, int logm) {
    __shared__ A sh[32];
    for (i64 row = blockIdx.x; row < rows; row += gridDim.x) {
        i64 base = (row / inner) * K * inner + row % inner;
        A d = 0;
        for (i64 c = threadIdx.x; c < K; c += blockDim.x) {
            i64 o = base + c * inner;
            d += logm ? (A)LD(g[o]) : (A)LD(g[o]) * (A)LD(y[o]);
        }
        d = block_sum(d, sh);
        for (i64 c = threadIdx.x; c < K; c += blockDim.x) {
            i64 o = base + c * inner;
            A yy = LD(y[o]), gg = LD(g[o]);
            gin[o] = ST(logm ? gg - m_exp(yy) * d : yy * (gg - d));
        }
    }
}
/* one warp per row; reduction 0 = none (out[N]), 1 = mean, 2 = sum (out[0], grid must be 1) */
extern "C" __global__ void KN(ce_fwd)(i64 N, i64 K, const S* x, const i64* t, S* out, int reduction) {
    __shared__ A sh[32];
    int lane = threadIdx.x & 31;
    i64 warp = ((i64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    i64 nwarps = ((i64)gridDim.x * blockDim.x) >> 5;
    A total = 0;
    for (i64 r = warp; r < N; r += nwarps) {
        const S* row = x + r * K;
        A m = NEG_INF;
        for (i64 c = lane; c < K; c += 32) m = nan_max(m, (A)LD(row[c]));
        m = warp_max(m);
        m = __shfl_sync(0xffffffffu, m, 0);
        A s = 0;
        for (i64 c = lane; c < K; c += 32) s += m_exp((A)LD(row[c]) - m);
        s = warp_sum(s);
        if (lane == 0) {
            i64 ti = t[r];
            A loss = (ti < 0 || ti >= K) ? QNAN : m + m_log(s) - (A)LD(row[ti]);
            if (reduction == 0) out[r] = ST(loss); else total += loss;
        }
    }
    if (reduction != 0) {
        total = block_sum(total, sh);
        if (threadIdx.x == 0) out[0] = ST(reduction == 1 ? total / (A)N : total);
    }
}
/* d loss / d logits = (softmax(x) - onehot(t)) * g (g / N for mean) */
extern "C" __global__ void KN(ce_bwd)(i64 N, i64 K, const S* x, const i64* t, const S* g, S* gx, int reduction) {
    __shared__ A sh[32];
    for (i64 r = blockIdx.x; r < N; r += gridDim.x) {
        const S* row = x + r * K;
        A m = NEG_INF;
        for (i64 c = threadIdx.x; c < K; c += blockDim.x) m = nan_max(m, (A)LD(row[c]));
        m = block_max(m, sh);
        A s = 0;
        for (i64 c = threadIdx.x; c < K; c += blockDim.x) s += m_exp((A)LD(row[c]) - m);
        s = block_sum(s, sh);
        A gv = g ? (A)LD(g[reduction == 0 ? r : 0]) : (A)1;
        A scale = reduction == 1 ? gv / (A)N : gv;
        i64 ti = t[r];
        bool bad = ti < 0 || ti >= K;
        for (i64 c = threadIdx.x; c < K; c += blockDim.x) {
            A p = m_exp((A)LD(row[c]) - m) / s;
            A v = bad ? QNAN : (p - (c == ti ? (A)1 : (A)0)) * scale;
            gx[r * K + c] = ST(v);
        }
    }
}
"#;

/// How cross-entropy combines the per-row losses (`reduction=` of `F.cross_entropy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reduction {
    /// One loss per row.
    None,
    /// The mean over rows (PyTorch's default).
    Mean,
    /// The sum over rows.
    Sum,
}

impl Reduction {
    fn code(self) -> i32 {
        match self {
            Self::None => 0,
            Self::Mean => 1,
            Self::Sum => 2,
        }
    }
}

fn float_only(op: &'static str, dtype: DType) -> Result<(), KernelError> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(KernelError::UnsupportedDType {
            op,
            dtype: dtype.as_str(),
            supported: "f32, f64, f16, bf16",
        })
    }
}

/// Threads per block for rows of `k` elements: a multiple of 32, at most 512.
fn row_block(k: i64) -> u32 {
    let k = u32::try_from(k.clamp(1, 512)).unwrap_or(512);
    k.div_ceil(32) * 32
}

/// The softmax and cross-entropy kernels, one module per dtype.
const SOFTMAX: Family = Family {
    key: "softmax",
    src: SOFTMAX_SRC,
};

/// Splits a contiguous `shape` around `dim` into `(rows, classes, inner)`.
fn rows_of(op: &'static str, shape: &[usize], dim: usize) -> Result<(i64, i64, i64), KernelError> {
    if dim >= shape.len() {
        return Err(KernelError::invalid(
            op,
            format!("dim {dim} out of range for shape {shape:?}"),
        ));
    }
    let outer = numel(op, &shape[..dim])?;
    let k = shape[dim] as i64;
    let inner = numel(op, &shape[dim + 1..])?;
    Ok((outer * inner, k, inner))
}

/// Launches the row kernel `name` (`softmax_fwd` or `softmax_bwd`, whose parameters are
/// `(rows, K, inner, buffers..., logm)`) over the contiguous `shape` split around `dim`: one
/// block per row (at most 524 280 blocks) of [`row_block`] threads; nothing when there are no
/// rows or `dim` is empty.
///
/// # Errors
/// [`KernelError::UnsupportedDType`] for non-float dtypes, [`KernelError::InvalidArgument`] for
/// a bad dim (both naming `op`); NVRTC and launch failures.
///
/// # Safety
/// 1. `buffers` are the device addresses `name` takes, in its order, each contiguous with
///    `shape` and valid until the kernel has run on `stream`.
/// 2. `stream` belongs to `device`'s primary context (or is null).
#[allow(clippy::too_many_arguments)]
unsafe fn run_rows<const N: usize>(
    device: usize,
    stream: RawStream,
    dtype: DType,
    op: &'static str,
    name: &str,
    shape: &[usize],
    dim: usize,
    log: bool,
    mut buffers: [u64; N],
) -> Result<(), CudaError> {
    float_only(op, dtype)?;
    let (mut rows, mut k, mut inner) = rows_of(op, shape, dim)?;
    if rows == 0 || k == 0 {
        return Ok(());
    }
    let mut l = i32::from(log);
    let mut params: Vec<*mut c_void> = Vec::with_capacity(N + 4);
    params.extend(kernel_params![rows, k, inner]);
    params.extend(
        buffers
            .iter_mut()
            .map(|b| std::ptr::from_mut(b).cast::<c_void>()),
    );
    params.extend(kernel_params![l]);
    let grid = rows.min(65_535 * 8) as u32;
    // SAFETY: `params` are `(rows, K, inner, buffers..., logm)` with the kernel's types (i64,
    // i64, i64, `N` device pointers, int); the buffers per the caller's contract.
    unsafe {
        run(
            device,
            stream,
            SOFTMAX,
            dtype,
            name,
            grid,
            row_block(k),
            &mut params,
        )
    }
}

/// `out = softmax(input, dim)` (or `log_softmax` when `log`), both contiguous with `shape`.
///
/// # Errors
/// [`KernelError::UnsupportedDType`] for non-float dtypes, [`KernelError::InvalidArgument`] for
/// a bad dim; NVRTC and launch failures; [`bind_context`](crate::cuda::bind_context)'s errors.
///
/// # Safety
/// 1. `input` and `out` are contiguous device buffers of `device` holding `shape` elements of
///    `dtype`, valid until the kernel has run on `stream`; they may be the same buffer.
/// 2. `stream` belongs to `device`'s primary context (or is null).
#[allow(clippy::too_many_arguments)]
pub unsafe fn softmax(
    device: usize,
    stream: RawStream,
    dtype: DType,
    shape: &[usize],
    dim: usize,
    log: bool,
    input: u64,
    out: u64,
) -> Result<(), CudaError> {
    let op = if log { "log_softmax" } else { "softmax" };
    // SAFETY: `softmax_fwd` takes `(in, out)` between `inner` and `logm`; pointers per the
    // caller's contract.
    unsafe {
        run_rows(
            device,
            stream,
            dtype,
            op,
            "softmax_fwd",
            shape,
            dim,
            log,
            [input, out],
        )
    }
}

/// Gradient of [`softmax`] (or `log_softmax` when `log`) with respect to its input, given its
/// output `y` and the incoming gradient `grad`, into `grad_input`; all contiguous with `shape`.
///
/// # Errors
/// As [`softmax`].
///
/// # Safety
/// As [`softmax`], for the three buffers.
#[allow(clippy::too_many_arguments)]
pub unsafe fn softmax_backward(
    device: usize,
    stream: RawStream,
    dtype: DType,
    shape: &[usize],
    dim: usize,
    log: bool,
    y: u64,
    grad: u64,
    grad_input: u64,
) -> Result<(), CudaError> {
    let op = if log {
        "log_softmax_backward"
    } else {
        "softmax_backward"
    };
    let buffers = [y, grad, grad_input];
    // SAFETY: `softmax_bwd` takes `(y, g, gin)` between `inner` and `logm`; pointers per the
    // caller's contract.
    unsafe {
        run_rows(
            device,
            stream,
            dtype,
            op,
            "softmax_bwd",
            shape,
            dim,
            log,
            buffers,
        )
    }
}

/// Cross-entropy of contiguous `logits` `[n, classes]` against contiguous i64 `targets` `[n]`
/// into `out`: `[n]` for [`Reduction::None`], one element otherwise (mean over rows: NaN for
/// `n = 0`, as PyTorch).
///
/// # Errors
/// As [`softmax`].
///
/// # Safety
/// As [`softmax`], for `logits`, `targets` and `out`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn cross_entropy(
    device: usize,
    stream: RawStream,
    dtype: DType,
    n: usize,
    classes: usize,
    logits: u64,
    targets: u64,
    reduction: Reduction,
    out: u64,
) -> Result<(), CudaError> {
    float_only("cross_entropy", dtype)?;
    if classes == 0 {
        return Err(KernelError::invalid(
            "cross_entropy",
            "logits have 0 classes: need at least 1",
        )
        .into());
    }
    let mut nn = numel("cross_entropy", &[n])?;
    let mut k = classes as i64;
    let (mut x, mut t, mut o, mut red) = (logits, targets, out, reduction.code());
    let mut params = kernel_params![nn, k, x, t, o, red];
    let (grid, block) = match reduction {
        Reduction::None => (super::grid_for(nn as u64 * 32, 256), 256),
        Reduction::Mean | Reduction::Sum => (1, 1024),
    };
    if reduction == Reduction::None && nn == 0 {
        return Ok(());
    }
    // SAFETY: params match `ce_fwd`; pointers per the caller's contract.
    unsafe {
        run(
            device,
            stream,
            SOFTMAX,
            dtype,
            "ce_fwd",
            grid,
            block,
            &mut params,
        )
    }
}

/// Gradient of [`cross_entropy`] with respect to the logits into contiguous `grad_logits`
/// `[n, classes]`, given the incoming gradient `grad_out` (`[n]` for [`Reduction::None`], one
/// element otherwise; 0 for an incoming gradient of 1): `(softmax(logits) - onehot(targets)) *
/// grad` (`/ n` for the mean).
///
/// # Errors
/// As [`softmax`].
///
/// # Safety
/// As [`softmax`], for every buffer.
#[allow(clippy::too_many_arguments)]
pub unsafe fn cross_entropy_backward(
    device: usize,
    stream: RawStream,
    dtype: DType,
    n: usize,
    classes: usize,
    logits: u64,
    targets: u64,
    reduction: Reduction,
    grad_out: u64,
    grad_logits: u64,
) -> Result<(), CudaError> {
    float_only("cross_entropy_backward", dtype)?;
    let mut nn = numel("cross_entropy_backward", &[n])?;
    if nn == 0 || classes == 0 {
        return Ok(());
    }
    let mut k = classes as i64;
    let (mut x, mut t, mut g, mut gx, mut red) =
        (logits, targets, grad_out, grad_logits, reduction.code());
    let mut params = kernel_params![nn, k, x, t, g, gx, red];
    let grid = nn.min(65_535 * 8) as u32;
    // SAFETY: params match `ce_bwd`; pointers per the caller's contract.
    unsafe {
        run(
            device,
            stream,
            SOFTMAX,
            dtype,
            "ce_bwd",
            grid,
            row_block(k),
            &mut params,
        )
    }
}
