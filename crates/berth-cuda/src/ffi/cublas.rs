//! cuBLAS: the handle calls and `cublasGemmStridedBatchedEx`, for berth's matmul.
//!
//! Thin wrappers over cudarc's `cublas::result`; failures become [`KernelError::Cublas`] with
//! the entry point, the device and the `cublasStatus_t` name. Nothing here may be called
//! before [`cublas_present`] said yes: cudarc's loader panics when `libcublas` is missing.
//!
//! See the [cuBLAS docs](https://docs.nvidia.com/cuda/cublas/index.html).

use super::module::RawStream;
use crate::KernelError;
use cudarc::cublas::{result, sys};
use std::ffi::c_void;
use std::sync::OnceLock;

/// A cuBLAS handle (`cublasHandle_t`).
pub(crate) type Handle = sys::cublasHandle_t;

/// The element type of a gemm operand (`cudaDataType`).
pub(crate) type DataType = sys::cudaDataType;

/// The compute type of a gemm (`cublasComputeType_t`).
pub(crate) type ComputeType = sys::cublasComputeType_t;

/// `op` failed on `device` with cuBLAS status `e`.
fn failed(op: &'static str, device: usize) -> impl Fn(result::CublasError) -> KernelError {
    move |e| KernelError::Cublas {
        op,
        device,
        status: format!("{:?}", e.0),
    }
}

/// Whether the cuBLAS library (`libcublas.so`) can be loaded; asked once per process. Calls
/// no cuBLAS function.
pub(crate) fn cublas_present() -> bool {
    static PRESENT: OnceLock<bool> = OnceLock::new();
    // SAFETY: `is_culib_present` only tries `dlopen` on candidate names; it calls no cuBLAS
    // function.
    *PRESENT.get_or_init(|| unsafe { sys::is_culib_present() })
}

/// `cublasCreate`: a handle bound to the current context.
///
/// See [`cublasCreate`](https://docs.nvidia.com/cuda/cublas/index.html#cublascreate).
///
/// # Errors
/// [`KernelError::Cublas`] with the status.
///
/// # Panics
/// cudarc's loader panics when `libcublas` is missing: call it after [`cublas_present`].
pub(crate) fn create_handle(device: usize) -> Result<Handle, KernelError> {
    result::create_handle().map_err(failed("cublasCreate", device))
}

/// `cublasSetStream`: later calls on `handle` are enqueued on `stream`.
///
/// See [`cublasSetStream`](https://docs.nvidia.com/cuda/cublas/index.html#cublassetstream).
///
/// # Errors
/// [`KernelError::Cublas`] with the status.
///
/// # Safety
/// 1. `handle` was created by [`create_handle`] on `device` and calls on it are serialised.
/// 2. `stream` belongs to `device`'s primary context (or is null).
pub(crate) unsafe fn set_stream(
    device: usize,
    handle: Handle,
    stream: RawStream,
) -> Result<(), KernelError> {
    // SAFETY: preconditions 1 and 2.
    unsafe { result::set_stream(handle, stream.cast()) }.map_err(failed("cublasSetStream", device))
}

/// `cublasGemmStridedBatchedEx` with the default algorithm: for each `i < batch`,
/// `C[i] = alpha * op_a(A[i]) @ op_b(B[i]) + beta * C[i]`, column-major, with `A[i]` at
/// `a + i * stride_a` elements (likewise `B`, `C`). `trans_a` / `trans_b` pick `CUBLAS_OP_T`
/// over `CUBLAS_OP_N`. All three operands have element type `data`.
///
/// See [`cublasGemmStridedBatchedEx`](https://docs.nvidia.com/cuda/cublas/index.html#cublasgemmstridedbatchedex).
///
/// # Errors
/// [`KernelError::Cublas`] with the status.
///
/// # Safety
/// 1. `handle` was created by [`create_handle`] on `device`, calls on it are serialised, and
///    its stream (set by [`set_stream`]) belongs to `device`'s primary context.
/// 2. `a`, `b` and `c` address device memory of `device` valid for every element the sizes,
///    leading dimensions and strides reach, until the gemm has run on the handle's stream;
///    `c` does not overlap `a` or `b`.
/// 3. `alpha` and `beta` point to host scalars of the type `compute` takes (`f64` for
///    `CUBLAS_COMPUTE_64F`, `f32` otherwise), live across the call.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_strided_batched_ex(
    device: usize,
    handle: Handle,
    trans_a: bool,
    trans_b: bool,
    m: i32,
    n: i32,
    k: i32,
    alpha: *const c_void,
    a: u64,
    lda: i32,
    stride_a: i64,
    b: u64,
    ldb: i32,
    stride_b: i64,
    beta: *const c_void,
    c: u64,
    ldc: i32,
    stride_c: i64,
    batch: i32,
    data: DataType,
    compute: ComputeType,
) -> Result<(), KernelError> {
    let op = |t: bool| {
        if t {
            sys::cublasOperation_t::CUBLAS_OP_T
        } else {
            sys::cublasOperation_t::CUBLAS_OP_N
        }
    };
    // SAFETY: preconditions 1 to 3.
    unsafe {
        result::gemm_strided_batched_ex(
            handle,
            op(trans_a),
            op(trans_b),
            m,
            n,
            k,
            alpha,
            a as *const c_void,
            data,
            lda,
            stride_a,
            b as *const c_void,
            data,
            ldb,
            stride_b,
            beta,
            c as *mut c_void,
            data,
            ldc,
            stride_c,
            batch,
            compute,
            sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
    .map_err(failed("cublasGemmStridedBatchedEx", device))
}
