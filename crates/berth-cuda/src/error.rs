//! `CudaError`: every failure of the CUDA layer, typed.
//!
//! Driver failures are mapped in exactly one place, [`CudaError::from_driver`]: that is where
//! `CUDA_ERROR_OUT_OF_MEMORY` becomes [`CudaError::OutOfMemory`], the typed, retryable
//! out-of-memory error.

/// Errors of the CUDA layer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// CUDA cannot be used here: built without the `cuda` feature, or the driver library
    /// (`libcuda.so`) was not found, or it reported no device.
    #[error("CUDA is not available: {reason}")]
    Unavailable {
        /// Why, in words.
        reason: String,
    },

    /// The NVIDIA driver is older than berth's floor: `cuDriverGetVersion` (`found`) is below
    /// `required` (12080, CUDA 12.8: the cuda-13000 bindings call `cuEventElapsedTime_v2`,
    /// which older drivers lack). CUDA is then unavailable; updating the driver fixes it.
    #[error(
        "the NVIDIA driver supports CUDA {}.{} (cuDriverGetVersion {found}); berth needs a \
         driver for CUDA {}.{} or newer (R570+, Linux 570.26+): update the NVIDIA driver",
        .found / 1000, .found % 1000 / 10, .required / 1000, .required % 1000 / 10
    )]
    DriverTooOld {
        /// The driver's `cuDriverGetVersion`, `1000 * major + 10 * minor`.
        found: i32,
        /// The lowest version berth runs on.
        required: i32,
    },

    /// A device index at or past the number of visible devices (PyTorch's good message is
    /// "Device index value 5 is out of index range [0, 1)",
    /// <https://github.com/pytorch/pytorch/pull/155318>).
    #[error("device index {index} is out of range [0, {count}); use an index below {count}")]
    InvalidDevice {
        /// The index that was asked for.
        index: usize,
        /// The number of visible devices.
        count: usize,
    },

    /// A CUDA driver call failed with a code other than the ones mapped to their own variant.
    #[error("CUDA driver call {op} failed: {name} (code {code})")]
    Driver {
        /// The driver entry point, e.g. `"cuMemAlloc"`.
        op: &'static str,
        /// The numeric `CUresult`.
        code: u32,
        /// The `CUresult`'s name, e.g. `"CUDA_ERROR_INVALID_VALUE"`.
        name: String,
    },

    /// The device could not provide the memory (`CUDA_ERROR_OUT_OF_MEMORY`). Transient: freeing
    /// memory (or `empty_cache()`) and retrying may succeed.
    #[error(
        "CUDA out of memory on cuda:{device}: {op} of {requested_bytes} bytes failed; \
         free memory caches or request less"
    )]
    OutOfMemory {
        /// The device index.
        device: usize,
        /// The driver entry point that failed.
        op: &'static str,
        /// The size asked for, in bytes (0 when the call was not a sized allocation).
        requested_bytes: usize,
    },

    /// `Event::elapsed_time` with an event that has not completed (PyTorch's message;
    /// <https://github.com/pytorch/pytorch/issues/85796>).
    #[error("Both events must be completed before calculating elapsed time.")]
    EventNotReady,

    /// `Event::elapsed_time` with an event created without timing (PyTorch's message;
    /// <https://github.com/pytorch/pytorch/issues/85796>).
    #[error("Both events must be created with argument 'enable_timing=True'.")]
    TimingDisabled,

    /// `Event::elapsed_time` with an event that was never recorded.
    #[error("event was never recorded: call record() on both events before elapsed_time()")]
    EventNotRecorded,

    /// Two handles that must be on one device are not (e.g. a stream waiting on another
    /// device's event is allowed, but a copy on a stream of the wrong device is not).
    #[error("{op}: expected a handle on cuda:{expected}, got one on cuda:{actual}")]
    DeviceMismatch {
        /// The operation.
        op: &'static str,
        /// The device the operation runs on.
        expected: usize,
        /// The device of the handle that was passed.
        actual: usize,
    },

    /// A stream priority outside the device's range (`cuCtxGetStreamPriorityRange`).
    #[error(
        "stream priority {priority} is out of range: use a value from {greatest} (highest) to \
         {least} (lowest)"
    )]
    InvalidPriority {
        /// The priority asked for.
        priority: i32,
        /// The numerically greatest (lowest) priority.
        least: i32,
        /// The numerically least (highest) priority.
        greatest: i32,
    },

    /// A synchronising operation ran while [`SyncDebugMode::Error`](crate::SyncDebugMode) was set
    /// (`torch.cuda.set_sync_debug_mode("error")`).
    #[error("called a synchronizing CUDA operation: {op} (sync debug mode is 'error')")]
    SyncDebug {
        /// The operation that synchronised, e.g. `"item"`.
        op: &'static str,
    },

    /// Only dense CPU tensors can be pinned (PyTorch's message;
    /// <https://github.com/unit8co/darts/issues/436>).
    #[error("cannot pin '{tensor_type}' only dense CPU tensors can be pinned")]
    CannotPin {
        /// The tensor's type in PyTorch's spelling, e.g. `"torch.cuda.FloatTensor"`.
        tensor_type: String,
    },

    /// A failure of berth's kernels, cuBLAS or the device generator (`cuda::kernels`).
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    Kernel(#[from] crate::KernelError),

    /// The device's allocator refused a request or failed (its message is PyTorch's, e.g.
    /// "CUDA out of memory. Tried to allocate ..."); [`AllocError::is_out_of_memory`] on
    /// `source` (or [`CudaError::is_out_of_memory`]) tells whether freeing memory and retrying
    /// may succeed.
    ///
    /// [`AllocError::is_out_of_memory`]: berth_alloc::AllocError::is_out_of_memory
    #[error("{source}")]
    Alloc {
        /// The device index.
        device: usize,
        /// The allocator's error, as the policy returned it.
        #[source]
        source: berth_alloc::AllocError,
    },

    /// The pinned host allocator refused a request or failed.
    #[error("pinned host memory: {source}")]
    PinnedAlloc {
        /// The pinned allocator's error.
        #[source]
        source: berth_alloc::host::HostAllocError,
    },

    /// [`crate::memory::configure`] (or [`crate::memory::simulate`]) after an allocator was
    /// built with another configuration: a process keeps one allocator configuration, as
    /// PyTorch keeps one allocator.
    #[error("the device allocators are already built with policy {in_use}; they keep it for the life of the process, so start a new process to use {requested}")]
    AllocatorConfigured {
        /// The configuration in use (policy and options).
        in_use: String,
        /// The one asked for.
        requested: String,
    },
    /// The allocator configuration read from the environment (`BERTH_ALLOC_CONF`, else
    /// PyTorch's `PYTORCH_ALLOC_CONF` or `PYTORCH_CUDA_ALLOC_CONF`) could not be used; the
    /// error names the variable ([`berth_alloc::ConfigError::InVariable`]).
    #[error("{0}")]
    Config(#[from] berth_alloc::ConfigError),

    /// A host mapping (huge-page destination or first pin) could not be made.
    #[error("pinned host memory: {message}")]
    HostAlloc {
        /// The operating system's or the mapping's message.
        message: String,
    },

    /// A CUDA function was given a device of another kind (PyTorch's message).
    #[error("Expected a cuda device, but got: {device}")]
    NotCuda {
        /// The device as written, e.g. `"cpu"`.
        device: String,
    },

    /// No NCCL library could be loaded (Note [Loading NCCL] in `src/ffi/nccl.rs`).
    #[error("NCCL is not available: {reason}")]
    NcclUnavailable {
        /// What was tried, and how to make NCCL available.
        reason: String,
    },

    /// An NCCL call failed (`ncclResult_t` other than `ncclSuccess`).
    #[error("NCCL call {op} failed: {message} (ncclResult_t {code})")]
    Nccl {
        /// The NCCL function, e.g. `"ncclAllReduce"`.
        op: &'static str,
        /// The `ncclResult_t` code.
        code: i32,
        /// `ncclGetErrorString`'s text.
        message: String,
    },

    /// A peer-access call named one device as both sides (`Note [Peer access]` in
    /// `src/peer.rs`): peer access is a relation between two different devices.
    #[error("{op}: cuda:{device} is both the device and its peer; name two different devices")]
    SameDevice {
        /// The operation, e.g. `"enable_peer_access"`.
        op: &'static str,
        /// The device given twice.
        device: usize,
    },

    /// `device` cannot access `peer`'s memory directly: `cuDeviceCanAccessPeer` answers 0, or
    /// `cuCtxEnablePeerAccess` failed with `CUDA_ERROR_PEER_ACCESS_UNSUPPORTED`. Final for this
    /// pair of devices: copies between them still work, staged by the driver.
    #[error(
        "cuda:{device} cannot access memory of cuda:{peer} directly (peer access is not \
         supported between them); copies between them still work without it"
    )]
    PeerAccessUnsupported {
        /// The device that would access.
        device: usize,
        /// The device whose memory would be accessed.
        peer: usize,
    },

    /// Memory shared by another process cannot be opened, or this process's cannot be shared
    /// (`Note [Sharing mapped memory]` in `ipc.rs`).
    #[error("CUDA memory sharing between processes: {reason}")]
    Ipc {
        /// What failed and what to do.
        reason: String,
    },

    /// An argument outside what the call accepts.
    #[error("{op}: invalid argument: {what}")]
    InvalidArgument {
        /// The operation.
        op: &'static str,
        /// What was wrong and what would be right.
        what: String,
    },
}

impl CudaError {
    /// `Unavailable` with a reason.
    pub(crate) fn unavailable(reason: impl Into<String>) -> Self {
        Self::Unavailable {
            reason: reason.into(),
        }
    }

    /// Whether this is an out-of-memory condition: [`CudaError::OutOfMemory`], a
    /// [`CudaError::Alloc`] whose source is out of memory, or a [`CudaError::PinnedAlloc`] of
    /// [`HostAllocError::OutOfMemory`](berth_alloc::host::HostAllocError::OutOfMemory).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(
            self,
            Self::OutOfMemory { .. }
                | Self::PinnedAlloc {
                    source: berth_alloc::host::HostAllocError::OutOfMemory { .. }
                }
        ) || matches!(self, Self::Alloc { source, .. } if source.is_out_of_memory())
    }
}

#[cfg(feature = "cuda")]
impl CudaError {
    /// THE mapping of a driver error into a `CudaError` (the one place OOM is recognised).
    ///
    /// `device` and `requested_bytes` feed [`CudaError::OutOfMemory`]; pass 0 for
    /// `requested_bytes` when the call was not a sized allocation.
    pub(crate) fn from_driver(
        op: &'static str,
        err: cudarc::driver::DriverError,
        device: usize,
        requested_bytes: usize,
    ) -> Self {
        use cudarc::driver::sys::CUresult;
        match err.0 {
            CUresult::CUDA_ERROR_OUT_OF_MEMORY => Self::OutOfMemory {
                device,
                op,
                requested_bytes,
            },
            code => Self::Driver {
                op,
                code: code as u32,
                name: format!("{code:?}"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Allocator and pinned-allocator errors reach callers as themselves, not as text.
    #[test]
    fn allocator_errors_keep_their_type_as_the_source() {
        use std::error::Error as _;
        let e = CudaError::Alloc {
            device: 1,
            source: berth_alloc::AllocError::InvalidFraction { fraction: 2.0 },
        };
        assert!(!e.is_out_of_memory());
        let src = e
            .source()
            .unwrap()
            .downcast_ref::<berth_alloc::AllocError>();
        assert_eq!(
            src,
            Some(&berth_alloc::AllocError::InvalidFraction { fraction: 2.0 })
        );
        let oom = CudaError::PinnedAlloc {
            source: berth_alloc::host::HostAllocError::OutOfMemory {
                requested: 3,
                rounded: 4,
                allocated: 0,
                in_use: 0,
            },
        };
        assert!(oom.is_out_of_memory());
        let read = |var: &'static str| {
            berth_alloc::AllocatorConfig::from_vars(|v| match v == var {
                true => Ok("backend:x".into()),
                false => Err(std::env::VarError::NotPresent),
            })
        };
        for var in berth_alloc::config::CONFIG_VARIABLES {
            let conf = CudaError::from(read(var).unwrap_err());
            assert!(matches!(conf, CudaError::Config(_)), "{conf:?}");
            assert!(
                conf.to_string()
                    .starts_with(&format!("{var}: invalid value 'x'")),
                "{conf}"
            );
        }
    }

    /// A driver error keeps its `CUresult` when it reaches berth-alloc.
    #[test]
    fn driver_errors_keep_their_code_in_the_backend_error() {
        let e = berth_alloc::BackendError::from(CudaError::Driver {
            op: "cuMemMap",
            code: 1,
            name: "CUDA_ERROR_INVALID_VALUE".into(),
        });
        assert_eq!(
            e,
            berth_alloc::BackendError::Driver {
                op: "cuMemMap",
                code: 1,
                name: "CUDA_ERROR_INVALID_VALUE".into()
            }
        );
    }

    /// <https://github.com/pytorch/pytorch/issues/136849>
    #[test]
    fn invalid_device_message_names_index_and_range() {
        let e = CudaError::InvalidDevice { index: 5, count: 1 };
        assert!(e
            .to_string()
            .starts_with("device index 5 is out of range [0, 1)"));
    }

    /// <https://github.com/pytorch/pytorch/issues/85796>
    #[test]
    fn event_timing_messages_are_pytorchs() {
        assert_eq!(
            CudaError::EventNotReady.to_string(),
            "Both events must be completed before calculating elapsed time."
        );
        assert_eq!(
            CudaError::TimingDisabled.to_string(),
            "Both events must be created with argument 'enable_timing=True'."
        );
    }

    #[cfg(feature = "cuda")]
    #[test]
    fn out_of_memory_is_mapped_from_the_driver_code() {
        use cudarc::driver::{sys::CUresult, DriverError};
        let oom = CudaError::from_driver(
            "cuMemAlloc",
            DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY),
            0,
            1 << 40,
        );
        assert!(oom.is_out_of_memory());
        assert!(oom.to_string().contains("1099511627776 bytes"));
        let other = CudaError::from_driver(
            "cuMemAlloc",
            DriverError(CUresult::CUDA_ERROR_INVALID_VALUE),
            0,
            0,
        );
        assert_eq!(
            other,
            CudaError::Driver {
                op: "cuMemAlloc",
                code: 1,
                name: "CUDA_ERROR_INVALID_VALUE".into()
            }
        );
    }
}
