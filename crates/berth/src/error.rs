//! `berth::Error`: the one error type of the `berth` crate.

/// Errors of the `berth` crate. Lower-level errors convert into it with `?`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A CUDA error (driver, availability, device index).
    #[error(transparent)]
    Cuda(#[from] crate::cuda::CudaError),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
