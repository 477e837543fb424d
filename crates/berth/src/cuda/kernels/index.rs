//! Indexing kernels: `index_select` (a gather of whole slices along one dimension), for
//! `berth train --resident`'s batches on the device (`Note [Resident batches]` in
//! `berth-cli`).

use super::{grid_for, kernel_params, numel, Family, RawStream};
use crate::cuda::CudaError;
use crate::DType;

/// Threads per block.
const BLOCK: u32 = 256;

const INDEX_SRC: &str = r#"
/* out [outer, len, inner] = src [outer, size, inner] at rows idx[0..len) of the middle
   dimension; all contiguous. An index outside [0, size) gives a zero slice (the front-end
   cannot check device indices without a sync; PyTorch raises a device-side assert). */
extern "C" __global__ void KN(index_select)(i64 n, i64 len, i64 size, i64 inner, S* out,
                                            const S* src, const i64* idx) {
    GRID_STRIDE(o, n) {
        i64 i = o % inner; i64 r = o / inner; i64 j = r % len; i64 q = r / len;
        i64 k = idx[j];
        out[o] = (k >= 0 && k < size) ? src[(q * size + k) * inner + i] : (S)0;
    }
}
"#;

const INDEX: Family = Family {
    key: "index",
    src: INDEX_SRC,
};

/// `out[q, j, i] = src[q, idx[j], i]` for `q < outer`, `j < len`, `i < inner`, with `src`
/// `[outer, size, inner]`, `idx` `[len]` (i64) and `out` `[outer, len, inner]`, all
/// contiguous, of `dtype` (any; elements are copied, not converted). An index outside
/// `[0, size)` gives zeros.
///
/// # Errors
/// [`KernelError::InvalidArgument`](super::KernelError) when the sizes overflow `i64`; NVRTC
/// or launch failures; the errors of [`bind_context`](crate::cuda::bind_context).
///
/// # Safety
/// 1. `out`, `src` and `idx` are device memory of `device` valid for the contiguous extents
///    above until the kernel has run on `stream`; `out` overlaps neither input.
/// 2. `stream` belongs to `device`'s primary context (or is null).
#[allow(clippy::too_many_arguments)]
pub unsafe fn index_select(
    device: usize,
    stream: RawStream,
    dtype: DType,
    [outer, size, inner]: [usize; 3],
    len: usize,
    out: u64,
    src: u64,
    idx: u64,
) -> Result<(), CudaError> {
    let mut n = numel("index_select", &[outer, len, inner])?;
    if n == 0 {
        return Ok(());
    }
    let as_i64 = |v: usize| numel("index_select", &[v]);
    let (mut l, mut s, mut i) = (as_i64(len)?, as_i64(size)?, as_i64(inner)?);
    let (mut o, mut x, mut ix) = (out, src, idx);
    let mut params = kernel_params![n, l, s, i, o, x, ix];
    let grid = grid_for(n as u64, BLOCK);
    // SAFETY: the params match `index_select`'s signature (four i64, three pointers); the
    // memory and stream per the caller's contract.
    unsafe {
        super::run(
            device,
            stream,
            INDEX,
            dtype,
            "index_select",
            grid,
            BLOCK,
            &mut params,
        )
    }
}
