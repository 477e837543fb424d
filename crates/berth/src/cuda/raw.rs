//! The driver calls behind streams and events, on plain `u64` handles, with a twin that answers
//! [`CudaError::Unavailable`] when berth is built without `cuda` (so `stream.rs` and `event.rs`
//! carry no `cfg`).
//!
//! Every function binds the device's primary context first, maps failures through
//! [`CudaError::from_driver`], and is only reached after [`driver`](super::driver::driver)
//! succeeded (binding checks it).

#[cfg(feature = "cuda")]
pub(crate) use imp::*;
#[cfg(not(feature = "cuda"))]
pub(crate) use stub::*;

#[cfg(feature = "cuda")]
mod imp {
    use super::super::context::bind;
    use super::super::driver::check;
    use super::super::CudaError;
    use cudarc::driver::{result, sys};

    fn stream(raw: u64) -> sys::CUstream {
        raw as usize as sys::CUstream
    }

    fn event(raw: u64) -> sys::CUevent {
        raw as usize as sys::CUevent
    }

    /// `cuCtxGetStreamPriorityRange`: `(least, greatest)`, greatest numerically smaller.
    pub(crate) fn priority_range(device: usize) -> Result<(i32, i32), CudaError> {
        bind(device)?;
        check(
            "cuCtxGetStreamPriorityRange",
            device,
            result::stream::get_priority_range(),
        )
    }

    /// `cuStreamCreateWithPriority(CU_STREAM_NON_BLOCKING)`, as PyTorch's side streams.
    pub(crate) fn stream_create(device: usize, priority: i32) -> Result<u64, CudaError> {
        bind(device)?;
        let s = check(
            "cuStreamCreateWithPriority",
            device,
            result::stream::create_with_priority(result::stream::StreamKind::NonBlocking, priority),
        )?;
        Ok(s as usize as u64)
    }

    /// `cuStreamDestroy`. Queued work still completes (the driver defers the release).
    pub(crate) fn stream_destroy(device: usize, raw: u64) -> Result<(), CudaError> {
        bind(device)?;
        // SAFETY: `raw` was created by `stream_create` and is destroyed once, by its owner.
        check("cuStreamDestroy", device, unsafe {
            result::stream::destroy(stream(raw))
        })
    }

    /// `cuStreamSynchronize`.
    pub(crate) fn stream_sync(device: usize, raw: u64) -> Result<(), CudaError> {
        bind(device)?;
        // SAFETY: `raw` is a live stream of this device, or 0 (the legacy default stream).
        check("cuStreamSynchronize", device, unsafe {
            result::stream::synchronize(stream(raw))
        })
    }

    /// `cuStreamQuery`: `true` when all queued work has completed.
    pub(crate) fn stream_query(device: usize, raw: u64) -> Result<bool, CudaError> {
        bind(device)?;
        // SAFETY: `raw` is a live stream of this device, or 0.
        match unsafe { sys::cuStreamQuery(stream(raw)) } {
            sys::CUresult::CUDA_SUCCESS => Ok(true),
            sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            code => Err(CudaError::from_driver(
                "cuStreamQuery",
                result::DriverError(code),
                device,
                0,
            )),
        }
    }

    /// `cuStreamWaitEvent`: work queued on `raw` after this waits for `ev`.
    pub(crate) fn stream_wait_event(device: usize, raw: u64, ev: u64) -> Result<(), CudaError> {
        bind(device)?;
        // SAFETY: both handles are live (the caller holds them).
        check("cuStreamWaitEvent", device, unsafe {
            result::stream::wait_event(
                stream(raw),
                event(ev),
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        })
    }

    /// `cuEventCreate`, with `CU_EVENT_DISABLE_TIMING` unless `timing`.
    pub(crate) fn event_create(device: usize, timing: bool) -> Result<u64, CudaError> {
        bind(device)?;
        let flags = if timing {
            sys::CUevent_flags::CU_EVENT_DEFAULT
        } else {
            sys::CUevent_flags::CU_EVENT_DISABLE_TIMING
        };
        let e = check("cuEventCreate", device, result::event::create(flags))?;
        Ok(e as usize as u64)
    }

    /// `cuEventRecord` on stream `raw`.
    pub(crate) fn event_record(device: usize, ev: u64, raw: u64) -> Result<(), CudaError> {
        bind(device)?;
        // SAFETY: both handles are live and of this device.
        check("cuEventRecord", device, unsafe {
            result::event::record(event(ev), stream(raw))
        })
    }

    /// `cuEventQuery`: `true` when complete.
    pub(crate) fn event_query(device: usize, ev: u64) -> Result<bool, CudaError> {
        bind(device)?;
        // SAFETY: `ev` is live.
        match unsafe { result::event::query(event(ev)) } {
            Ok(()) => Ok(true),
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
            Err(e) => Err(CudaError::from_driver("cuEventQuery", e, device, 0)),
        }
    }

    /// `cuEventSynchronize`.
    pub(crate) fn event_sync(device: usize, ev: u64) -> Result<(), CudaError> {
        bind(device)?;
        // SAFETY: `ev` is live.
        check("cuEventSynchronize", device, unsafe {
            result::event::synchronize(event(ev))
        })
    }

    /// `cuEventElapsedTime`, in ms.
    pub(crate) fn event_elapsed(device: usize, start: u64, end: u64) -> Result<f32, CudaError> {
        bind(device)?;
        // SAFETY: both events are live, created on this device with timing, and completed
        // (the caller checked).
        check("cuEventElapsedTime", device, unsafe {
            result::event::elapsed(event(start), event(end))
        })
    }

    unsafe extern "C" fn sleep_ms(arg: *mut std::ffi::c_void) {
        std::thread::sleep(std::time::Duration::from_millis(arg as usize as u64));
    }

    /// Queues a host function that sleeps `ms` milliseconds on stream `raw`: the stream is busy
    /// that long (`cuLaunchHostFunc`). For tests of asynchronous behaviour.
    pub(crate) fn stream_sleep(device: usize, raw: u64, ms: u64) -> Result<(), CudaError> {
        bind(device)?;
        // SAFETY: `sleep_ms` calls no CUDA API and reads its argument as an integer, not a
        // pointer; `raw` is a live stream of this device.
        check("cuLaunchHostFunc", device, unsafe {
            result::stream::launch_host_function(
                stream(raw),
                sleep_ms,
                ms as usize as *mut std::ffi::c_void,
            )
        })
    }

    /// `cuEventDestroy`.
    pub(crate) fn event_destroy(device: usize, ev: u64) -> Result<(), CudaError> {
        bind(device)?;
        // SAFETY: `ev` is live and destroyed once, by its owner.
        check("cuEventDestroy", device, unsafe {
            result::event::destroy(event(ev))
        })
    }
}

#[cfg(not(feature = "cuda"))]
#[allow(clippy::missing_errors_doc)]
mod stub {
    use super::super::driver::driver;
    use super::super::CudaError;

    fn no<T>() -> Result<T, CudaError> {
        driver().and(Err(CudaError::unavailable(
            "berth was built without the `cuda` feature",
        )))
    }

    pub(crate) fn priority_range(_: usize) -> Result<(i32, i32), CudaError> {
        no()
    }
    pub(crate) fn stream_create(_: usize, _: i32) -> Result<u64, CudaError> {
        no()
    }
    pub(crate) fn stream_destroy(_: usize, _: u64) -> Result<(), CudaError> {
        no()
    }
    pub(crate) fn stream_sync(_: usize, _: u64) -> Result<(), CudaError> {
        no()
    }
    pub(crate) fn stream_query(_: usize, _: u64) -> Result<bool, CudaError> {
        no()
    }
    pub(crate) fn stream_wait_event(_: usize, _: u64, _: u64) -> Result<(), CudaError> {
        no()
    }
    pub(crate) fn event_create(_: usize, _: bool) -> Result<u64, CudaError> {
        no()
    }
    pub(crate) fn event_record(_: usize, _: u64, _: u64) -> Result<(), CudaError> {
        no()
    }
    pub(crate) fn event_query(_: usize, _: u64) -> Result<bool, CudaError> {
        no()
    }
    pub(crate) fn event_sync(_: usize, _: u64) -> Result<(), CudaError> {
        no()
    }
    pub(crate) fn event_elapsed(_: usize, _: u64, _: u64) -> Result<f32, CudaError> {
        no()
    }
    pub(crate) fn event_destroy(_: usize, _: u64) -> Result<(), CudaError> {
        no()
    }
    pub(crate) fn stream_sleep(_: usize, _: u64, _: u64) -> Result<(), CudaError> {
        no()
    }
}
