//! `CudaError`.

/// Errors of the CUDA layer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// CUDA cannot be used here: built without the `cuda` feature, or the driver library
    /// (`libcuda.so`) was not found, or it reported no device.
    #[error("CUDA is not available: {reason}")]
    Unavailable {
        /// Why, in words.
        reason: String,
    },
}
