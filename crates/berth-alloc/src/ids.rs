//! The plain identifiers every layer shares: stream and device-stream handles, device
//! pointers and the driver's memory figures. A leaf: it imports nothing of this crate, so the
//! backend trait, the errors and the policies can all name them (re-exported from
//! [`crate::backend`] and the crate root).

/// A stream handle as an integer, exactly as PyTorch's traces and snapshots write it.
///
/// The CUDA backend uses the raw `CUstream` value; `StreamId(0)` is the default (legacy) stream.
/// Ordering is numeric, which is the order PyTorch's pools sort streams in (by handle value).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct StreamId(pub u64);

impl StreamId {
    /// The default stream (handle 0).
    pub const DEFAULT: StreamId = StreamId(0);
}

impl std::fmt::Display for StreamId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "stream {:#x}", self.0)
    }
}

/// A stream together with the device it belongs to: PyTorch's `c10::Stream`
/// (<https://github.com/pytorch/pytorch/blob/main/c10/core/Stream.h>), a device index plus a
/// stream id.
///
/// A bare [`StreamId`] names a stream only within one device: every CUDA device's default
/// stream is handle 0. A per-device allocator never needs more, but the pinned host allocator
/// serves every device, so it records its events on a `DeviceStream`: the event of a block
/// read by a copy on `cuda:1`'s default stream is recorded on `cuda:1`, whichever device the
/// freeing thread has current.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct DeviceStream {
    /// The device index (`cuda:<device>`).
    pub device: u32,
    /// The stream on that device.
    pub stream: StreamId,
}

impl DeviceStream {
    /// The stream `stream` of device `device`.
    pub const fn new(device: u32, stream: StreamId) -> DeviceStream {
        DeviceStream { device, stream }
    }
}

impl std::fmt::Display for DeviceStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} of device {}", self.stream, self.device)
    }
}

/// A device address (a `CUdeviceptr` on CUDA). `DevicePtr(0)` is the null pointer, returned for
/// zero-byte allocations as PyTorch does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct DevicePtr(pub u64);

impl DevicePtr {
    /// The null device pointer.
    pub const NULL: DevicePtr = DevicePtr(0);

    /// Whether this is the null pointer.
    pub fn is_null(self) -> bool {
        self.0 == 0
    }
}

impl std::fmt::Display for DevicePtr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// Device memory as the driver reports it (`cudaMemGetInfo`), in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct MemInfo {
    /// Free device memory in bytes (all processes and the context included).
    pub free_bytes: u64,
    /// Total device memory in bytes.
    pub total_bytes: u64,
}

/// The id of a private pool: PyTorch's `MempoolId_t`, a pair of which one element is nonzero
/// (graphs use `(n, 0)`, `torch.cuda.MemPool` uses `(0, n)`); `(0, 0)` is the general pool
/// and names no private pool.
pub type MempoolId = (u64, u64);

/// Which streams allocate into a pool while it is being allocated to (PyTorch's
/// `std::function<bool(cudaStream_t)>` filter: the capturing stream, or the current thread's
/// streams for `use_mem_pool`).
pub type StreamFilter = std::sync::Arc<dyn Fn(StreamId) -> bool + Send + Sync>;
