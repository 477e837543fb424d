//! Optimiser kernels: the multi-tensor SGD-with-momentum update (PyTorch's `_fused_sgd_` /
//! `_foreach` path of `torch.optim.SGD`), one launch for up to [`SGD_MAX_TENSORS`] parameters.
//!
//! # Note [Fused updates are exact]
//! The fused kernels compute each element with the same f32 (or f64) operations, in the same
//! order and with the same roundings, as the tensor ops they replace, so results are bit for
//! bit those of the unfused path:
//! - SGD with momentum: `v ← v·μ + g` then `p ← p + v·(−lr)` is what `v.mul_scalar_(μ)`,
//!   `v.add_(g)` and `p.add_scaled_(v, −lr)` (itself `v.mul_scalar(−lr)` then `p.add_(..)`)
//!   compute; the first step sets `v ← g` (a copy) and `p ← p + g·(−lr)`.
//! - `add_scaled` (`p.add_(x, alpha=α)`): `p + x·α`, the product rounded before the sum.
//! - `relu_backward`: `g · (x > 0 ? 1 : 0)`, the mask multiplied, not selected, so a negative
//!   `g` still gives `−0` and an infinite one NaN where `x ≤ 0`, as `gt_scalar`, `to_dtype`
//!   and `mul` give (three launches and two mask tensors before).
//!
//! NVRTC contracts `a * b + c` into one fused multiply-add by default (`--fmad=true`), which
//! rounds once instead of twice and so can differ in the last bit; the kernels therefore use
//! `m_mul_rn` / `m_add_rn` (`__fmul_rn`, `__fadd_rn`, never contracted). The scalars are
//! converted from f64 to the compute type exactly as the scalar kernels convert them (`FD`).
//! Only f32 and f64 take these kernels: their compute type is their storage type, while the
//! unfused ops on f16/bf16 round every intermediate to 16 bits.

use super::{grid_for, kernel_params, Family, RawStream};
use crate::cuda::CudaError;
use crate::DType;

/// Parameters one SGD launch updates; more take several launches.
pub const SGD_MAX_TENSORS: usize = 16;

/// Threads per block.
const BLOCK: u32 = 256;

const OPTIM_SRC: &str = r#"
#define SGD_MAX 16
/* contiguous tensors t = 0..count: elements start[t]..start[t+1] of the flat index space */
struct SgdList { i64 count; i64 start[SGD_MAX + 1]; S* p[SGD_MAX]; const S* g[SGD_MAX]; S* v[SGD_MAX]; };
extern "C" __global__ void KN(sgd_momentum)(SgdList l, double mu_, double neg_lr_, int first) {
    C mu = FD(mu_); C nlr = FD(neg_lr_);
    i64 n = l.start[l.count];
    int t = 0;
    GRID_STRIDE(i, n) {
        /* a thread's indices only grow, so its tensor only moves forward */
        while (i >= l.start[t + 1]) ++t;
        i64 j = i - l.start[t];
        C g = LD(l.g[t][j]);
        C v = first ? g : m_add_rn(m_mul_rn(LD(l.v[t][j]), mu), g);
        l.v[t][j] = ST(v);
        l.p[t][j] = ST(m_add_rn(LD(l.p[t][j]), m_mul_rn(v, nlr)));
    }
}
"#;

const OPTIM: Family = Family {
    key: "optim",
    src: OPTIM_SRC,
};

/// The kernel's `SgdList`, field for field (`#[repr(C)]`, 8-byte fields only).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct SgdList {
    count: i64,
    start: [i64; SGD_MAX_TENSORS + 1],
    p: [u64; SGD_MAX_TENSORS],
    g: [u64; SGD_MAX_TENSORS],
    v: [u64; SGD_MAX_TENSORS],
}

/// One parameter of [`sgd_momentum`]: the device addresses of its first elements and its
/// element count (all three contiguous).
#[derive(Debug, Clone, Copy)]
pub struct SgdTensor {
    /// The parameter `p`, read and written.
    pub param: u64,
    /// The gradient `g`, read.
    pub grad: u64,
    /// The momentum buffer `v`, written (and read unless `first_step`).
    pub velocity: u64,
    /// Elements of each of the three.
    pub len: usize,
}

/// SGD with momentum over `tensors` of `dtype` (f32 or f64), in launches of at most
/// [`SGD_MAX_TENSORS`] tensors: `v ← v·μ + g` (`v ← g` when `first_step`), `p ← p + v·(−lr)`
/// with `μ = momentum` and `neg_lr = −lr`, bit for bit the unfused tensor ops
/// (Note [Fused updates are exact]).
///
/// # Errors
/// [`KernelError::InvalidArgument`](super::KernelError) for another dtype or more than
/// `i64::MAX` elements; NVRTC or launch failures; the errors of
/// [`bind_context`](crate::cuda::bind_context).
///
/// # Safety
/// 1. Every address is device memory of `device` valid for `len` contiguous elements of
///    `dtype` until the kernel has run on `stream`.
/// 2. No two of all the ranges overlap.
/// 3. `stream` belongs to `device`'s primary context (or is null).
pub unsafe fn sgd_momentum(
    device: usize,
    stream: RawStream,
    dtype: DType,
    tensors: &[SgdTensor],
    momentum: f64,
    neg_lr: f64,
    first_step: bool,
) -> Result<(), CudaError> {
    if !matches!(dtype, DType::F32 | DType::F64) {
        return Err(super::KernelError::invalid(
            "sgd_momentum",
            format!(
                "the fused SGD kernel takes f32 or f64, got {}",
                dtype.as_str()
            ),
        )
        .into());
    }
    for chunk in tensors.chunks(SGD_MAX_TENSORS) {
        let mut list = SgdList {
            count: chunk.len() as i64,
            start: [0; SGD_MAX_TENSORS + 1],
            p: [0; SGD_MAX_TENSORS],
            g: [0; SGD_MAX_TENSORS],
            v: [0; SGD_MAX_TENSORS],
        };
        let mut total = 0i64;
        for (k, t) in chunk.iter().enumerate() {
            list.p[k] = t.param;
            list.g[k] = t.grad;
            list.v[k] = t.velocity;
            total = i64::try_from(t.len)
                .ok()
                .and_then(|n| total.checked_add(n))
                .ok_or_else(|| super::KernelError::invalid("sgd_momentum", "too many elements"))?;
            list.start[k + 1] = total;
        }
        // Past `count`, `start` stays at the total so the kernel's forward scan stops.
        for s in &mut list.start[chunk.len() + 1..] {
            *s = total;
        }
        if total == 0 {
            continue;
        }
        let (mut mu, mut nlr, mut first) = (momentum, neg_lr, i32::from(first_step));
        let mut params = kernel_params![list, mu, nlr, first];
        let grid = grid_for(total as u64, BLOCK);
        // SAFETY: the params match `sgd_momentum`'s signature (`SgdList` by value, two
        // doubles, an int); the addresses per the caller's contract 1-2; stream per 3.
        unsafe {
            super::run(
                device,
                stream,
                OPTIM,
                dtype,
                "sgd_momentum",
                grid,
                BLOCK,
                &mut params,
            )
        }?;
    }
    Ok(())
}
