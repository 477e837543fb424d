//! Reductions: sum, mean, max, min, argmax, argmin over all elements or one dimension.
//!
//! Over one dimension of length `R`, the output has the input's other dimensions ("kept"
//! dimensions). Two kernels: `*_rows` gives each output one block that walks `R` with its
//! threads and combines with warp shuffles (used when the reduced dimension is contiguous),
//! `*_cols` gives each output one thread walking `R` in order (used when neighbouring outputs
//! are neighbours in memory, e.g. a sum over dim 0 of a row-major matrix: coalesced reads).
//! Over all elements one block of 1024 threads walks the input in any layout.
//!
//! Accumulators follow PyTorch: f32 for f32/f16/bf16, f64 for f64, i64 for integers and bool;
//! `sum` of integers writes i64 ([`sum_output`]). max/min propagate NaN and
//! argmax/argmin return the first index of the extreme value (the first NaN if any).

use super::{grid_for, kernel_params, numel, run, DeviceView, Family, Idx, KernelError, RawStream};
use crate::cuda::CudaError;
use crate::DType;

/// The dtype [`sum`] writes for an input of `dtype`: the same for floats, i64 for integers and
/// bool (PyTorch's `sum` promotes integers to `torch.int64`).
pub fn sum_output(dtype: DType) -> DType {
    if dtype.is_float() {
        dtype
    } else {
        DType::I64
    }
}

const REDUCE_SRC: &str = r#"
/* offset of the r-th element of the reduced dimensions */
__device__ __forceinline__ i64 roff(const Idx1& rix, i64 r) {
    if (rix.ndim == 1) return r * rix.st0[0];
    i64 o; off1(rix, r, o); return o;
}
extern "C" __global__ void KN(sum_rows)(i64 n_out, i64 R, Idx1 rix, Idx2 ix, const S* in, SO* out, int mean) {
    __shared__ A sh[32];
    for (i64 o = blockIdx.x; o < n_out; o += gridDim.x) {
        i64 bi, bo; off2(ix, o, bi, bo);
        A acc = 0;
        for (i64 r = threadIdx.x; r < R; r += blockDim.x) acc += (A)LD(in[bi + roff(rix, r)]);
        acc = block_sum(acc, sh);
        if (threadIdx.x == 0) out[bo] = STO(mean ? (A)(acc / (A)R) : acc);
    }
}
extern "C" __global__ void KN(sum_cols)(i64 n_out, i64 R, Idx1 rix, Idx2 ix, const S* in, SO* out, int mean) {
    GRID_STRIDE(o, n_out) {
        i64 bi, bo; off2(ix, o, bi, bo);
        A acc = 0;
        for (i64 r = 0; r < R; ++r) acc += (A)LD(in[bi + roff(rix, r)]);
        out[bo] = STO(mean ? (A)(acc / (A)R) : acc);
    }
}
extern "C" __global__ void KN(sum_all)(i64 n, Idx1 ix, const S* in, SO* out, int mean) {
    __shared__ A sh[32];
    A acc = 0;
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) { i64 o; off1(ix, i, o); acc += (A)LD(in[o]); }
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) out[0] = STO(mean ? (A)(acc / (A)n) : acc);
}

/* (value, index) pairs; index -1 = empty. Is (a, ia) better than (b, ib)? */
__device__ __forceinline__ bool better(C a, i64 ia, C b, i64 ib, int is_min) {
    if (ia < 0) return false;
    if (ib < 0) return true;
    bool an = m_isnan(a), bn = m_isnan(b);
    if (an || bn) return (an && bn) ? ia < ib : an;
    if (a == b) return ia < ib;
    return is_min ? a < b : a > b;
}
__device__ void block_arg(C& v, i64& vi, int is_min, C* shv, i64* shi) {
    for (int o = 16; o > 0; o >>= 1) {
        C w = __shfl_down_sync(0xffffffffu, v, o); i64 wi = __shfl_down_sync(0xffffffffu, vi, o);
        if (better(w, wi, v, vi, is_min)) { v = w; vi = wi; }
    }
    int lane = threadIdx.x & 31, wp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    __syncthreads();
    if (lane == 0) { shv[wp] = v; shi[wp] = vi; }
    __syncthreads();
    if (wp == 0) {
        v = (lane < nw) ? shv[lane] : (C)0; vi = (lane < nw) ? shi[lane] : (i64)-1;
        for (int o = 16; o > 0; o >>= 1) {
            C w = __shfl_down_sync(0xffffffffu, v, o); i64 wi = __shfl_down_sync(0xffffffffu, vi, o);
            if (better(w, wi, v, vi, is_min)) { v = w; vi = wi; }
        }
    }
    __syncthreads();
}
extern "C" __global__ void KN(arg_rows)(i64 n_out, i64 R, Idx1 rix, Idx3 ix, const S* in, S* out_v, i64* out_i, int is_min) {
    __shared__ C shv[32]; __shared__ i64 shi[32];
    for (i64 o = blockIdx.x; o < n_out; o += gridDim.x) {
        i64 bi, bv, bx; off3(ix, o, bi, bv, bx);
        C v = 0; i64 vi = -1;
        for (i64 r = threadIdx.x; r < R; r += blockDim.x) {
            C x = LD(in[bi + roff(rix, r)]);
            if (better(x, r, v, vi, is_min)) { v = x; vi = r; }
        }
        block_arg(v, vi, is_min, shv, shi);
        if (threadIdx.x == 0) { if (out_v) out_v[bv] = ST(v); if (out_i) out_i[bx] = vi; }
    }
}
extern "C" __global__ void KN(arg_cols)(i64 n_out, i64 R, Idx1 rix, Idx3 ix, const S* in, S* out_v, i64* out_i, int is_min) {
    GRID_STRIDE(o, n_out) {
        i64 bi, bv, bx; off3(ix, o, bi, bv, bx);
        C v = 0; i64 vi = -1;
        for (i64 r = 0; r < R; ++r) {
            C x = LD(in[bi + roff(rix, r)]);
            if (better(x, r, v, vi, is_min)) { v = x; vi = r; }
        }
        if (out_v) out_v[bv] = ST(v);
        if (out_i) out_i[bx] = vi;
    }
}
extern "C" __global__ void KN(arg_all)(i64 n, Idx1 ix, const S* in, S* out_v, i64* out_i, int is_min) {
    __shared__ C shv[32]; __shared__ i64 shi[32];
    C v = 0; i64 vi = -1;
    for (i64 i = threadIdx.x; i < n; i += blockDim.x) {
        i64 o; off1(ix, i, o); C x = LD(in[o]);
        if (better(x, i, v, vi, is_min)) { v = x; vi = i; }
    }
    block_arg(v, vi, is_min, shv, shi);
    if (threadIdx.x == 0) { if (out_v) out_v[0] = ST(v); if (out_i) out_i[0] = vi; }
}
"#;

/// The reduction kernels, one module per dtype.
const REDUCE: Family = Family {
    key: "reduce",
    src: REDUCE_SRC,
};

/// Which extreme [`arg_reduce`] looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ArgReduce {
    /// The largest value (NaN counts as largest) and its first index.
    Max,
    /// The smallest value (NaN counts as smallest) and its first index.
    Min,
}

/// Threads per block of `*_rows` for a reduced length `r`: a multiple of 32, at most 256.
fn rows_block(r: i64) -> u32 {
    let r = u32::try_from(r.clamp(1, 256)).unwrap_or(256);
    r.div_ceil(32) * 32
}

/// The reduction split of `shape` over `dims`: kept shape and input strides, the packed
/// reduced dimensions, their element count, and whether one thread per output reads better
/// (the innermost reduced stride is not 1 and there are enough outputs).
struct Split {
    kept: Vec<usize>,
    kept_strides: Vec<isize>,
    rix: Idx<1>,
    r: i64,
    cols: bool,
}

impl Split {
    /// Kernel name, grid and block for `n_out` kept outputs: `cols` with one thread per output
    /// ([`grid_for`] blocks of 128 threads) when [`Split::cols`], else `rows` with one block per
    /// output (at most 524 280 blocks) of [`rows_block`] threads.
    fn kept_launch(
        &self,
        n_out: i64,
        cols: &'static str,
        rows: &'static str,
    ) -> (&'static str, u32, u32) {
        if self.cols {
            (cols, grid_for(n_out as u64, 128), 128)
        } else {
            (rows, n_out.min(65_535 * 8) as u32, rows_block(self.r))
        }
    }
}

fn split(
    op: &'static str,
    shape: &[usize],
    strides: &[isize],
    dims: &[usize],
) -> Result<Split, KernelError> {
    if strides.len() != shape.len()
        || dims.iter().any(|&d| d >= shape.len())
        || dims.windows(2).any(|w| w[0] >= w[1])
    {
        return Err(KernelError::invalid(
            op,
            format!("dims {dims:?} must be sorted, distinct and below the rank of shape {shape:?}"),
        ));
    }
    let (mut kept, mut kept_strides, mut rshape, mut rstrides) = (vec![], vec![], vec![], vec![]);
    for (d, (&size, &st)) in shape.iter().zip(strides).enumerate() {
        if dims.contains(&d) {
            rshape.push(size);
            rstrides.push(st);
        } else {
            kept.push(size);
            kept_strides.push(st);
        }
    }
    let r = numel(op, &rshape)?;
    let rix = Idx::<1>::new(op, &rshape, [&rstrides])?;
    let n_out = numel(op, &kept)?;
    let unit_inner = rix.ndim == 0 || rix.strides[0][(rix.ndim - 1) as usize].abs() == 1;
    Ok(Split {
        kept,
        kept_strides,
        rix,
        r,
        cols: !unit_inner && n_out >= 64,
    })
}

/// Sum (or mean, when `mean`) of `input` (with `shape`) over the sorted, distinct `dims` into
/// `out`, whose `strides` describe the kept dimensions (`shape` without `dims`; keepdim is the
/// caller's view). All dimensions (or a 0-d input) reduce into the single element at `out.ptr`.
///
/// `out.dtype` must be [`sum_output`]`(input.dtype)`; an empty reduction sums to 0 (mean: NaN).
///
/// # Errors
/// [`KernelError::InvalidArgument`] for a wrong output dtype, dims or stride count; NVRTC and
/// launch failures; the errors of [`bind_context`](crate::cuda::bind_context).
///
/// # Safety
/// 1. `input` and `out` address device memory of `device` valid over `shape` (respectively the
///    kept shape) with their strides, until the kernel has run on `stream`.
/// 2. `stream` belongs to `device`'s primary context (or is null).
#[allow(clippy::too_many_arguments)]
pub unsafe fn sum(
    device: usize,
    stream: RawStream,
    shape: &[usize],
    input: DeviceView<'_>,
    dims: &[usize],
    mean: bool,
    out: DeviceView<'_>,
) -> Result<(), CudaError> {
    let op = if mean { "mean" } else { "sum" };
    if out.dtype != sum_output(input.dtype) {
        return Err(KernelError::invalid(
            op,
            format!(
                "output dtype {} for input {}: expected {}",
                out.dtype.as_str(),
                input.dtype.as_str(),
                sum_output(input.dtype).as_str()
            ),
        )
        .into());
    }
    let dt = input.dtype;
    let mut mean_flag = i32::from(mean);
    let (mut inp, mut o) = (input.ptr, out.ptr);
    if dims.len() == shape.len() {
        let mut n = numel(op, shape)?;
        let mut ix = Idx::<1>::new(op, shape, [input.strides])?;
        let mut params = kernel_params![n, ix, inp, o, mean_flag];
        // SAFETY: params match `sum_all`; pointers per the caller's contract.
        return unsafe { run(device, stream, REDUCE, dt, "sum_all", 1, 1024, &mut params) };
    }
    let sp = split(op, shape, input.strides, dims)?;
    let mut n_out = numel(op, &sp.kept)?;
    if n_out == 0 {
        return Ok(());
    }
    let (mut r, mut rix) = (sp.r, sp.rix);
    let mut ix = Idx::<2>::new(op, &sp.kept, [&sp.kept_strides, out.strides])?;
    let mut params = kernel_params![n_out, r, rix, ix, inp, o, mean_flag];
    let (name, grid, block) = sp.kept_launch(n_out, "sum_cols", "sum_rows");
    // SAFETY: params match `sum_rows` / `sum_cols`; pointers per the caller's contract.
    unsafe { run(device, stream, REDUCE, dt, name, grid, block, &mut params) }
}

/// max/min with argmax/argmin of `input` over the sorted, distinct `dims` (all dimensions: the
/// flat row-major index, as `torch.argmax(x)`; otherwise the index within the reduced
/// dimensions). Writes the values into `values` and the i64 indices into `indices` when given;
/// their strides describe the kept dimensions as in [`sum`].
///
/// # Errors
/// [`KernelError::InvalidArgument`] for an empty reduction (PyTorch: `"max(): Expected
/// reduction dim to be specified for input.numel() == 0"`), a wrong dtype or dims; as [`sum`].
///
/// # Safety
/// As [`sum`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn arg_reduce(
    device: usize,
    stream: RawStream,
    which: ArgReduce,
    shape: &[usize],
    input: DeviceView<'_>,
    dims: &[usize],
    values: Option<DeviceView<'_>>,
    indices: Option<DeviceView<'_>>,
) -> Result<(), CudaError> {
    let op = match which {
        ArgReduce::Max => "max",
        ArgReduce::Min => "min",
    };
    if values.is_some_and(|v| v.dtype != input.dtype) {
        return Err(KernelError::invalid(op, "values must have the input's dtype").into());
    }
    if indices.is_some_and(|i| i.dtype != DType::I64) {
        return Err(KernelError::invalid(op, "indices must be i64").into());
    }
    let sp = split(op, shape, input.strides, dims)?;
    if sp.r == 0 {
        return Err(KernelError::invalid(
            op,
            format!("cannot reduce empty dimensions {dims:?} of shape {shape:?}: the result is undefined"),
        )
        .into());
    }
    let dt = input.dtype;
    let mut is_min = i32::from(which == ArgReduce::Min);
    let mut inp = input.ptr;
    let mut vp = values.map_or(0, |v| v.ptr);
    let mut ip = indices.map_or(0, |v| v.ptr);
    if dims.len() == shape.len() {
        let mut n = sp.r;
        let mut ix = Idx::<1>::new(op, shape, [input.strides])?;
        let mut params = kernel_params![n, ix, inp, vp, ip, is_min];
        // SAFETY: params match `arg_all`; pointers per the caller's contract.
        return unsafe { run(device, stream, REDUCE, dt, "arg_all", 1, 1024, &mut params) };
    }
    let mut n_out = numel(op, &sp.kept)?;
    if n_out == 0 {
        return Ok(());
    }
    let zeros = vec![0isize; sp.kept.len()];
    let vst = values.map_or(zeros.as_slice(), |v| v.strides);
    let ist = indices.map_or(zeros.as_slice(), |v| v.strides);
    let mut ix = Idx::<3>::new(op, &sp.kept, [&sp.kept_strides, vst, ist])?;
    let (mut r, mut rix) = (sp.r, sp.rix);
    let mut params = kernel_params![n_out, r, rix, ix, inp, vp, ip, is_min];
    let (name, grid, block) = sp.kept_launch(n_out, "arg_cols", "arg_rows");
    // SAFETY: params match `arg_rows` / `arg_cols`; pointers per the caller's contract.
    unsafe { run(device, stream, REDUCE, dt, name, grid, block, &mut params) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sum_output_promotes_integers_and_bool_to_i64() {
        for d in DType::ALL {
            let want = if d.is_float() { d } else { DType::I64 };
            assert_eq!(sum_output(d), want, "{d}");
        }
        assert_eq!(sum_output(DType::F16), DType::F16);
        assert_eq!(sum_output(DType::Bool), DType::I64);
    }
}
