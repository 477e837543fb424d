//! cuBLAS for berth's matmul: one handle per device and a strided batched gemm.
//!
//! The cuBLAS calls are made in `ffi/cublas.rs`; this module keeps each device's handle (in a
//! [`PerDevice`] registry, created with the device's context current on first use, used
//! under its lock: cuBLAS handles are not thread-safe when their stream changes; PyTorch keeps
//! one per (device, thread)) and describes a gemm without cudarc's types. Only with the `cuda`
//! feature. The matmul itself (row-major views, TF32 policy) is `berth::cuda::blas`.
//!
//! A missing `libcublas` is [`KernelError::Unavailable`], never a panic.

use crate::ffi;
use crate::kernel::RawStream;
use crate::registry::PerDevice;
use crate::{CudaError, KernelError};
use std::ffi::c_void;
use std::sync::Mutex;

/// Element and compute types of a gemm (`cudaDataType` and `cublasComputeType_t`): the three
/// operands share the element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum GemmType {
    /// f32 operands, f32 compute (`CUBLAS_COMPUTE_32F`).
    F32,
    /// f32 operands on TF32 tensor cores (`CUBLAS_COMPUTE_32F_FAST_TF32`).
    F32FastTf32,
    /// f64 operands, f64 compute (`CUBLAS_COMPUTE_64F`).
    F64,
    /// f16 operands, f32 compute.
    F16,
    /// bf16 operands, f32 compute.
    BF16,
}

impl GemmType {
    /// The cuBLAS data and compute types, and whether alpha/beta are `f64` (else `f32`).
    fn raw(self) -> (ffi::DataType, ffi::ComputeType, bool) {
        use ffi::ComputeType as C;
        use ffi::DataType as D;
        match self {
            GemmType::F32 => (D::CUDA_R_32F, C::CUBLAS_COMPUTE_32F, false),
            GemmType::F32FastTf32 => (D::CUDA_R_32F, C::CUBLAS_COMPUTE_32F_FAST_TF32, false),
            GemmType::F64 => (D::CUDA_R_64F, C::CUBLAS_COMPUTE_64F, true),
            GemmType::F16 => (D::CUDA_R_16F, C::CUBLAS_COMPUTE_32F, false),
            GemmType::BF16 => (D::CUDA_R_16BF, C::CUBLAS_COMPUTE_32F, false),
        }
    }
}

/// One operand of [`gemm_strided_batched`]: a batch of column-major matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmOperand {
    /// `CUdeviceptr` of the first matrix's first element.
    pub ptr: u64,
    /// Whether cuBLAS reads the matrix transposed (`CUBLAS_OP_T`; ignored for the output).
    pub transposed: bool,
    /// Leading dimension, in elements.
    pub ld: i32,
    /// Distance between consecutive matrices, in elements (0 broadcasts one matrix).
    pub batch_stride: i64,
}

/// A cuBLAS handle, used only under its device's lock.
struct Handle(ffi::Handle);

// SAFETY: a cuBLAS handle may be used from any thread as long as calls on it are serialised,
// which the `Mutex` around it guarantees.
unsafe impl Send for Handle {}

/// Each device's handle, created with the device's context current on first use.
static HANDLES: PerDevice<Mutex<Handle>> = PerDevice::new();

/// `C[i] = op(A[i]) @ op(B[i])` for `i < batch` (`cublasGemmStridedBatchedEx`, alpha 1, beta
/// 0, default algorithm), column-major, `op(A)` `m x k`, `op(B)` `k x n`, `C` `m x n`, all of
/// `ty` on `device`, enqueued on `stream` with the device's handle.
///
/// # Errors
/// [`KernelError::Unavailable`] without `libcublas`, [`KernelError::Cublas`] when cuBLAS
/// fails; [`PerDevice`]'s errors for a bad device index.
///
/// # Safety
/// 1. `device`'s primary context is current on this thread
///    ([`bind_context`](crate::bind_context)).
/// 2. `a`, `b` and `c` address device memory of `device` valid for every element the sizes,
///    leading dimensions and strides reach, until the gemm has run on `stream`; `c` does not
///    overlap `a` or `b`.
/// 3. `stream` belongs to `device`'s primary context (or is null).
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_strided_batched(
    device: usize,
    stream: RawStream,
    ty: GemmType,
    batch: i32,
    m: i32,
    n: i32,
    k: i32,
    a: GemmOperand,
    b: GemmOperand,
    c: GemmOperand,
) -> Result<(), CudaError> {
    if !ffi::cublas_present() {
        return Err(KernelError::Unavailable {
            reason:
                "the cuBLAS library (libcublas.so) was not found; add the CUDA toolkit's lib64 \
                     directory to LD_LIBRARY_PATH"
                    .into(),
        }
        .into());
    }
    let (data, compute, f64_scalars) = ty.raw();
    let (alpha32, beta32, alpha64, beta64) = (1.0f32, 0.0f32, 1.0f64, 0.0f64);
    let (alpha, beta): (*const c_void, *const c_void) = if f64_scalars {
        ((&raw const alpha64).cast(), (&raw const beta64).cast())
    } else {
        ((&raw const alpha32).cast(), (&raw const beta32).cast())
    };
    // Precondition 1: a new handle belongs to `device`'s context.
    let guard = HANDLES
        .get_or_try_init(device, |d| Ok(Mutex::new(Handle(ffi::create_handle(d)?))))?
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let handle = guard.0;
    // SAFETY: `handle` belongs to `device`'s context (created with it current) and is used
    // under the lock; the stream belongs to the same context (precondition 3).
    unsafe { ffi::set_stream(device, handle, stream) }?;
    // SAFETY: the handle is valid, serialised and on `stream`; the operands are the caller's
    // (precondition 2); alpha/beta are live locals of the type `compute` takes.
    unsafe {
        ffi::gemm_strided_batched_ex(
            device,
            handle,
            a.transposed,
            b.transposed,
            m,
            n,
            k,
            alpha,
            a.ptr,
            a.ld,
            a.batch_stride,
            b.ptr,
            b.ld,
            b.batch_stride,
            beta,
            c.ptr,
            c.ld,
            c.batch_stride,
            batch,
            data,
            compute,
        )
    }?;
    Ok(())
}
