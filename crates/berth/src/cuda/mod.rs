//! CUDA through cudarc with dynamic loading: discovery, contexts, streams, events, device and
//! pinned memory backends, transfers and kernels.

mod error;

pub use error::CudaError;
