//! `KernelError`: failures of berth's own CUDA kernels, cuBLAS and the device generator.
//!
//! It is the error of this crate's kernel-layer calls: NVRTC, module loading and launches
//! (`berth_cuda::kernel`, over `ffi/nvrtc.rs` and `ffi/module.rs`) and cuBLAS
//! (`berth_cuda::cublas`, over `ffi/cublas.rs`), both with the `cuda` feature. berth's
//! kernels (`berth::cuda::kernels`, `blas`, `rand`) add the argument and dtype checks;
//! [`CudaError::Kernel`](crate::CudaError) carries it upward.

/// Errors of the kernel layer (NVRTC, module loading, launches, cuBLAS).
///
/// Converts into [`CudaError`](crate::CudaError) and from there into `berth::Error` with `?`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KernelError {
    /// A library the kernels need (`libcuda`, `libnvrtc`, `libcublas`) is missing or CUDA is
    /// unusable for another reason.
    #[error("CUDA kernels are not available: {reason}")]
    Unavailable {
        /// Why, in words.
        reason: String,
    },

    /// NVRTC rejected a kernel source (a bug in berth: the log says where).
    #[error("NVRTC could not compile kernel module {module}: {error}\n{log}")]
    Compile {
        /// The module key, e.g. `"unary.f32"`.
        module: String,
        /// NVRTC's status.
        error: String,
        /// The compiler log.
        log: String,
    },

    /// A driver call of the kernel layer failed (`cuModuleLoadData`, `cuLaunchKernel`, ...).
    #[error("CUDA driver call {op} failed on cuda:{device}: {name}")]
    Driver {
        /// The driver entry point.
        op: &'static str,
        /// The device index.
        device: usize,
        /// The `CUresult` name, e.g. `"CUDA_ERROR_INVALID_VALUE"`.
        name: String,
    },

    /// A cuBLAS call failed.
    #[error("cuBLAS call {op} failed on cuda:{device}: {status}")]
    Cublas {
        /// The cuBLAS entry point, e.g. `"cublasGemmStridedBatchedEx"`.
        op: &'static str,
        /// The device index.
        device: usize,
        /// The `cublasStatus_t` name.
        status: String,
    },

    /// The op has no CUDA kernel for this dtype (PyTorch: `"addmm_cuda" not implemented for
    /// 'Long'`).
    #[error("{op} is not implemented on CUDA for dtype {dtype}; use one of: {supported}")]
    UnsupportedDType {
        /// The operation.
        op: &'static str,
        /// The dtype that was passed.
        dtype: &'static str,
        /// The dtypes the kernel accepts.
        supported: &'static str,
    },

    /// Arguments the kernel cannot take (mismatched shapes, too many dimensions, sizes past
    /// `i32::MAX` where cuBLAS needs an `int`, ...).
    #[error("{op}: {what}")]
    InvalidArgument {
        /// The operation.
        op: &'static str,
        /// What was wrong and what would be right.
        what: String,
    },
}

impl KernelError {
    /// [`KernelError::InvalidArgument`] for `op`.
    #[doc(hidden)]
    pub fn invalid(op: &'static str, what: impl Into<String>) -> Self {
        Self::InvalidArgument {
            op,
            what: what.into(),
        }
    }
}

#[cfg(feature = "cuda")]
impl KernelError {
    /// Maps a cudarc driver error of the kernel layer (`ffi/module.rs`).
    pub(crate) fn driver(op: &'static str, device: usize, e: cudarc::driver::DriverError) -> Self {
        Self::Driver {
            op,
            device,
            name: format!("{:?}", e.0),
        }
    }
}
