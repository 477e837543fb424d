//! Matrix multiplication through cuBLAS (`cublasGemmStridedBatchedEx`): f32, f64, f16 and
//! bf16 (f16/bf16 with f32 accumulation, as PyTorch), 2-D and batched, on strided operands.
//!
//! TF32 is off unless [`set_allow_tf32`]`(true)` (`torch.backends.cuda.matmul.allow_tf32`,
//! default `False` since PyTorch 1.12): f32 matmuls then use `CUBLAS_COMPUTE_32F_FAST_TF32`.
//!
//! Row-major `C = A @ B` is computed as the column-major `C^T = B^T A^T`, so no operand is
//! copied: a row-major matrix is a transposed column-major one. An operand whose rows and
//! columns both have non-unit strides cannot be described to cuBLAS and is rejected with
//! [`KernelError::InvalidArgument`] (the caller makes it contiguous).
//!
//! The cuBLAS calls (handle per device, `cublasSetStream`, the gemm) are berth-cuda's
//! [`berth_cuda::cublas`]; this file maps dtypes, views and the TF32 switch onto them.

use super::kernels::{KernelError, RawStream};
use super::CudaError;
use crate::DType;
use berth_cuda::cublas::{gemm_strided_batched, GemmOperand, GemmType};
use std::sync::atomic::{AtomicBool, Ordering};

static ALLOW_TF32: AtomicBool = AtomicBool::new(false);

/// Allows (or forbids) TF32 tensor cores for f32 matmuls
/// (`torch.backends.cuda.matmul.allow_tf32 = allow`). Default `false`: f32 matmuls are exact
/// f32 (up to summation order).
pub fn set_allow_tf32(allow: bool) {
    ALLOW_TF32.store(allow, Ordering::SeqCst);
}

/// Whether f32 matmuls may use TF32 ([`set_allow_tf32`]).
pub fn allow_tf32() -> bool {
    ALLOW_TF32.load(Ordering::SeqCst)
}

/// One matrix operand of [`matmul`]: a batch of row-major matrices with strides in elements.
#[derive(Debug, Clone, Copy)]
pub struct MatrixView {
    /// `CUdeviceptr` of element `[0, 0, 0]`.
    pub ptr: u64,
    /// Distance between consecutive matrices, in elements (0 broadcasts one matrix).
    pub batch_stride: i64,
    /// Distance between consecutive rows, in elements.
    pub row_stride: i64,
    /// Distance between consecutive columns, in elements.
    pub col_stride: i64,
}

/// How cuBLAS sees a column-major `rows x cols` matrix stored with element `(x, y)` at
/// `x * sx + y * sy`: `(transpose?, leading dimension)`, or `None` when it cannot.
fn describe(rows: i64, cols: i64, sx: i64, sy: i64) -> Option<(bool, i64)> {
    if (sx == 1 || rows == 1) && (cols == 1 || sy >= rows.max(1)) {
        let ld = if cols == 1 { rows.max(1) } else { sy };
        return Some((false, ld));
    }
    if (sy == 1 || cols == 1) && (rows == 1 || sx >= cols.max(1)) {
        let ld = if rows == 1 { cols.max(1) } else { sx };
        return Some((true, ld));
    }
    None
}

fn to_int(what: &str, v: i64) -> Result<i32, KernelError> {
    i32::try_from(v).map_err(|_| {
        KernelError::invalid(
            "matmul",
            format!("{what} = {v} exceeds cuBLAS's int range (2^31 - 1)"),
        )
    })
}

/// `C[b] = A[b] @ B[b]` for `b < batch`, with `A[b]` `m x k`, `B[b]` `k x n` and `C[b]` `m x n`,
/// all of `dtype` on `device`, enqueued on `stream`. `c` must have unit column stride.
///
/// # Errors
/// [`KernelError::UnsupportedDType`] for integer and bool dtypes (PyTorch: `"addmm_cuda" not
/// implemented for 'Long'`), [`KernelError::InvalidArgument`] for operands cuBLAS cannot take
/// or sizes past `i32::MAX`, [`KernelError::Cublas`] when cuBLAS fails,
/// [`KernelError::Unavailable`] without `libcublas`; [`bind_context`](super::bind_context)'s
/// errors.
///
/// # Safety
/// 1. `a`, `b` and `c` address device memory of `device` valid for every element their strides
///    reach, until the matmul has run on `stream`; `c` does not overlap `a` or `b`.
/// 2. `stream` belongs to `device`'s primary context (or is null).
#[allow(clippy::too_many_arguments)]
pub unsafe fn matmul(
    device: usize,
    stream: RawStream,
    dtype: DType,
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    a: MatrixView,
    b: MatrixView,
    c: MatrixView,
) -> Result<(), CudaError> {
    let ty = match dtype {
        DType::F32 if allow_tf32() => GemmType::F32FastTf32,
        DType::F32 => GemmType::F32,
        DType::F64 => GemmType::F64,
        DType::F16 => GemmType::F16,
        DType::BF16 => GemmType::BF16,
        other => {
            return Err(KernelError::UnsupportedDType {
                op: "matmul",
                dtype: other.as_str(),
                supported: "f32, f64, f16, bf16",
            }
            .into())
        }
    };
    if batch == 0 || m == 0 || n == 0 {
        return Ok(());
    }
    let (m, n, k) = (m as i64, n as i64, k as i64);
    // cuBLAS "A" is B^T (n x k, (j, l) at j*cs + l*rs); cuBLAS "B" is A^T (k x m).
    let (ta, lda) = describe(n, k, b.col_stride, b.row_stride).ok_or_else(|| {
        KernelError::invalid(
            "matmul",
            format!("right operand strides {b:?} need a contiguous copy"),
        )
    })?;
    let (tb, ldb) = describe(k, m, a.col_stride, a.row_stride).ok_or_else(|| {
        KernelError::invalid(
            "matmul",
            format!("left operand strides {a:?} need a contiguous copy"),
        )
    })?;
    if c.col_stride != 1 && n > 1 || c.row_stride < n && m > 1 {
        return Err(KernelError::invalid(
            "matmul",
            format!("output strides {c:?}: need unit column stride"),
        )
        .into());
    }
    let ldc = if m == 1 { n.max(1) } else { c.row_stride };
    let (mi, ni, ki) = (to_int("m", m)?, to_int("n", n)?, to_int("k", k)?);
    let (ldai, ldbi, ldci) = (
        to_int("lda", lda)?,
        to_int("ldb", ldb)?,
        to_int("ldc", ldc)?,
    );
    let batch_i = to_int("batch", batch as i64)?;
    super::kernels::bind(device)?;
    // cuBLAS "A" is B^T, cuBLAS "B" is A^T, cuBLAS "C" is C^T: (n x k) @ (k x m) = n x m.
    // SAFETY: `bind` made `device`'s context current; the operands' memory is the caller's
    // (precondition 1) and the leading dimensions and strides were derived from it above; the
    // stream is the caller's (precondition 2).
    unsafe {
        gemm_strided_batched(
            device,
            stream,
            ty,
            batch_i,
            ni,
            mi,
            ki,
            GemmOperand {
                ptr: b.ptr,
                transposed: ta,
                ld: ldai,
                batch_stride: b.batch_stride,
            },
            GemmOperand {
                ptr: a.ptr,
                transposed: tb,
                ld: ldbi,
                batch_stride: a.batch_stride,
            },
            GemmOperand {
                ptr: c.ptr,
                transposed: false,
                ld: ldci,
                batch_stride: c.batch_stride,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::describe;

    #[test]
    fn describe_row_major_and_transposed() {
        // Row-major 3x4 B seen as column-major 4x3 (B^T): (j, l) at j*1 + l*4.
        assert_eq!(describe(4, 3, 1, 4), Some((false, 4)));
        // B = W^T with W row-major 4x3: B (3x4) has rs = 1, cs = 3; B^T at j*3 + l*1.
        assert_eq!(describe(4, 3, 3, 1), Some((true, 3)));
        // Both strides non-unit: not describable.
        assert_eq!(describe(4, 3, 2, 8), None);
        // Vectors accept any stride on their unit dimension.
        assert_eq!(describe(1, 5, 7, 1), Some((false, 1)));
    }
}
