//! Streams with CUDA's and PyTorch's names: `Stream::new(device, priority)`, the default stream,
//! a thread-local current stream set by a scoped guard ([`Stream::scope`], PyTorch's
//! `with torch.cuda.stream(s):`), `wait_stream`, `wait_event`.
//!
//! The default stream of every device is the legacy NULL stream (handle 0), as PyTorch's; side
//! streams are created non-blocking, as PyTorch's pool streams. A stream's [`StreamId`] is its
//! raw handle, the value PyTorch's traces carry.
//!
//! # Note [Streams are never destroyed]
//! The allocators keep a stream's [`StreamId`] after the last [`Stream`] handle is gone: a
//! block freed after `record_stream` waits for an event on it, and berth's `paged` policy keeps
//! a reservation per stream and synchronises the stream before unmapping its pages. Were the
//! `CUstream` destroyed, those later driver calls would get a dangling handle (a crash seen on
//! the H200, not an error). So, like PyTorch, whose side streams come from a pool and live for
//! the process (`c10/cuda/CUDAStream.cpp`), berth never destroys a stream it created: when the
//! last handle drops, the `CUstream` goes back to a per-device, per-priority pool, and the next
//! [`Stream::new`] of that device and priority reuses it (its queued work still completes
//! first, in stream order). The number of live `CUstream`s is the most ever held at once.

use crate::device::{check_device, current_device};
use crate::{ffi, CudaError, Event};
use berth_alloc::{DeviceStream, StreamId};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A CUDA stream of one device. Cloning shares the handle; when the last clone of a created
/// stream drops, its `CUstream` returns to a pool for the next [`Stream::new`] (Note [Streams
/// are never destroyed]).
#[derive(Clone)]
pub struct Stream {
    inner: Arc<Inner>,
}

struct Inner {
    device: usize,
    raw: u64,
    priority: i32,
    owned: bool,
}

/// Created streams no handle holds any more, as `(device, priority, raw)`, for reuse (Note
/// [Streams are never destroyed]).
static POOL: Mutex<Vec<(usize, i32, u64)>> = Mutex::new(Vec::new());

fn pool() -> std::sync::MutexGuard<'static, Vec<(usize, i32, u64)>> {
    // Each critical section is one push or search: a poisoned pool is still consistent.
    POOL.lock().unwrap_or_else(|p| p.into_inner())
}

impl Drop for Inner {
    fn drop(&mut self) {
        if self.owned {
            pool().push((self.device, self.priority, self.raw));
        }
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Stream(cuda:{}, {:#x})",
            self.inner.device, self.inner.raw
        )
    }
}

impl PartialEq for Stream {
    fn eq(&self, other: &Self) -> bool {
        self.inner.device == other.inner.device && self.inner.raw == other.inner.raw
    }
}

impl Eq for Stream {}

thread_local! {
    /// The thread's current stream per device; absent = the default stream.
    static CURRENT: RefCell<HashMap<usize, Stream>> = RefCell::new(HashMap::new());
}

impl Stream {
    /// Creates a non-blocking stream on `device` with `priority` (`torch.cuda.Stream(device,
    /// priority)`): 0 is the default, lower numbers run first; the valid range is
    /// [`Stream::priority_range`]. Creates `device`'s context if needed (the named device).
    ///
    /// # Errors
    /// [`CudaError::InvalidDevice`], [`CudaError::Unavailable`], [`CudaError::InvalidPriority`],
    /// [`CudaError::Driver`].
    pub fn new(device: usize, priority: i32) -> Result<Stream, CudaError> {
        check_device(device)?;
        let (least, greatest) = ffi::priority_range(device)?;
        if priority > least || priority < greatest {
            return Err(CudaError::InvalidPriority {
                priority,
                least,
                greatest,
            });
        }
        let pooled = {
            let mut p = pool();
            p.iter()
                .position(|&(d, pr, _)| d == device && pr == priority)
                .map(|i| p.swap_remove(i).2)
        };
        let raw = match pooled {
            Some(raw) => raw,
            None => ffi::stream_create(device, priority)?,
        };
        Ok(Stream {
            inner: Arc::new(Inner {
                device,
                raw,
                priority,
                owned: true,
            }),
        })
    }

    /// `(least, greatest)` stream priorities of `device` (`cuCtxGetStreamPriorityRange`); the
    /// greatest priority is the numerically smallest (e.g. `(0, -5)`).
    ///
    /// # Errors
    /// As [`Stream::new`].
    pub fn priority_range(device: usize) -> Result<(i32, i32), CudaError> {
        check_device(device)?;
        ffi::priority_range(device)
    }

    /// The default (legacy NULL) stream of `device` (`torch.cuda.default_stream(i)`). Creates
    /// no context.
    ///
    /// # Errors
    /// [`CudaError::InvalidDevice`], [`CudaError::Unavailable`].
    pub fn default_stream(device: usize) -> Result<Stream, CudaError> {
        check_device(device)?;
        Ok(Stream {
            inner: Arc::new(Inner {
                device,
                raw: 0,
                priority: 0,
                owned: false,
            }),
        })
    }

    /// The device index.
    pub fn device(&self) -> usize {
        self.inner.device
    }

    /// The priority the stream was created with (0 for the default stream).
    pub fn priority(&self) -> i32 {
        self.inner.priority
    }

    /// The allocator's name for this stream: its raw handle (0 for the default stream). It
    /// names the stream only within its device (every device's default stream is 0): the
    /// device allocators are per device; what serves several devices (the pinned host
    /// allocator) takes [`Stream::device_stream`].
    pub fn id(&self) -> StreamId {
        StreamId(self.inner.raw)
    }

    /// The stream with its device (PyTorch's `c10::Stream`), as the pinned host allocator
    /// records its events: on this stream's device, whatever device the thread has current.
    pub fn device_stream(&self) -> DeviceStream {
        DeviceStream::new(self.inner.device as u32, self.id())
    }

    /// The raw `CUstream` as an integer (0 = the legacy default stream).
    pub fn as_raw(&self) -> u64 {
        self.inner.raw
    }

    /// Whether this is the device's default stream.
    pub fn is_default(&self) -> bool {
        self.inner.raw == 0
    }

    /// Whether all work queued so far has completed (`Stream.query()`, `cuStreamQuery`).
    ///
    /// # Errors
    /// [`CudaError::Driver`] (e.g. an earlier kernel failed).
    pub fn query(&self) -> Result<bool, CudaError> {
        // SAFETY: `self` keeps the stream alive (or it is the default stream, 0).
        unsafe { ffi::stream_query(self.inner.device, self.inner.raw) }
    }

    /// Blocks the host until all work queued so far has completed (`Stream.synchronize()`).
    /// An explicit sync: counted in [`host_waits`](super::host_waits), never reported by
    /// sync-debug mode.
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    pub fn synchronize(&self) -> Result<(), CudaError> {
        crate::sync_debug::count_host_wait();
        // SAFETY: `self` keeps the stream alive (or it is the default stream, 0).
        unsafe { ffi::stream_sync(self.inner.device, self.inner.raw) }
    }

    /// Blocks until queued work completed without counting a host wait (the caller counted it
    /// through [`sync_point`](super::sync_point)).
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    #[doc(hidden)]
    pub fn synchronize_uncounted(&self) -> Result<(), CudaError> {
        // SAFETY: `self` keeps the stream alive (or it is the default stream, 0).
        unsafe { ffi::stream_sync(self.inner.device, self.inner.raw) }
    }

    /// Makes work queued on `self` from now on wait for `event` (`Stream.wait_event`); the host
    /// does not wait. An event never recorded is complete: nothing to wait for.
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    pub fn wait_event(&self, event: &Event) -> Result<(), CudaError> {
        match event.recorded() {
            // SAFETY: `self` keeps the stream alive and `event` (borrowed) its driver event.
            Some((_, ev)) => unsafe {
                ffi::stream_wait_event(self.inner.device, self.inner.raw, ev)
            },
            None => Ok(()),
        }
    }

    /// Makes work queued on `self` from now on wait for all work queued on `other` so far
    /// (`Stream.wait_stream`); the host does not wait.
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    pub fn wait_stream(&self, other: &Stream) -> Result<(), CudaError> {
        if self == other {
            return Ok(());
        }
        let event = Event::new(false);
        event.record_on(other)?;
        self.wait_event(&event)
    }

    /// Records a new event (timing disabled) on this stream (`Stream.record_event()`).
    ///
    /// # Errors
    /// [`CudaError::Driver`].
    pub fn record_event(&self) -> Result<Event, CudaError> {
        let event = Event::new(false);
        event.record_on(self)?;
        Ok(event)
    }

    /// Makes this stream the thread's current stream of its device, and its device the current
    /// device, until the guard drops (`with torch.cuda.stream(s):`).
    pub fn scope(&self) -> StreamGuard {
        let device = self.inner.device;
        let previous_stream = CURRENT.with(|c| c.borrow_mut().insert(device, self.clone()));
        let previous_device = crate::device::replace_current(device);
        StreamGuard {
            device,
            previous_stream,
            previous_device,
        }
    }
}

/// The thread's current stream of `device` (`torch.cuda.current_stream(i)`): the stream of the
/// innermost live [`Stream::scope`] guard, else the default stream.
///
/// # Errors
/// [`CudaError::InvalidDevice`] ("device index 5 is out of range [0, 1)";
/// <https://github.com/pytorch/pytorch/issues/136849>),
/// [`CudaError::Unavailable`].
pub fn current_stream(device: usize) -> Result<Stream, CudaError> {
    check_device(device)?;
    match CURRENT.with(|c| c.borrow().get(&device).cloned()) {
        Some(s) => Ok(s),
        None => Stream::default_stream(device),
    }
}

/// The current stream of the current device.
///
/// # Errors
/// [`CudaError::Unavailable`].
pub fn current_stream_of_current_device() -> Result<Stream, CudaError> {
    current_stream(current_device()?)
}

/// Restores the previous current stream and device on drop; made by [`Stream::scope`].
#[must_use = "the previous stream is restored when the guard is dropped"]
pub struct StreamGuard {
    device: usize,
    previous_stream: Option<Stream>,
    previous_device: usize,
}

impl std::fmt::Debug for StreamGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "StreamGuard(cuda:{})", self.device)
    }
}

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let previous = self.previous_stream.take();
        CURRENT.with(|c| {
            let mut c = c.borrow_mut();
            match previous {
                Some(s) => c.insert(self.device, s),
                None => c.remove(&self.device),
            }
        });
        crate::device::replace_current(self.previous_device);
    }
}
