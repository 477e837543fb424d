//! Streams and events on plain `u64` handles.

use super::device::check;
use crate::context::bind;
use crate::CudaError;
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

/// `cuStreamSynchronize`.
///
/// # Safety
/// `raw` is a live stream of `device`, or 0 (the legacy default stream).
pub(crate) unsafe fn stream_sync(device: usize, raw: u64) -> Result<(), CudaError> {
    bind(device)?;
    // SAFETY: the caller's contract.
    check("cuStreamSynchronize", device, unsafe {
        result::stream::synchronize(stream(raw))
    })
}

/// `cuStreamQuery`: `true` when all queued work has completed.
///
/// # Safety
/// `raw` is a live stream of `device`, or 0.
pub(crate) unsafe fn stream_query(device: usize, raw: u64) -> Result<bool, CudaError> {
    bind(device)?;
    // SAFETY: the caller's contract.
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
///
/// # Safety
/// `raw` is a live stream of `device` (or 0) and `ev` a live event.
pub(crate) unsafe fn stream_wait_event(device: usize, raw: u64, ev: u64) -> Result<(), CudaError> {
    bind(device)?;
    // SAFETY: the caller's contract.
    check("cuStreamWaitEvent", device, unsafe {
        result::stream::wait_event(
            stream(raw),
            event(ev),
            sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
        )
    })
}

unsafe extern "C" fn sleep_ms(arg: *mut std::ffi::c_void) {
    std::thread::sleep(std::time::Duration::from_millis(arg as usize as u64));
}

/// Queues a host function that sleeps `ms` milliseconds on stream `raw`: the stream is busy
/// that long (`cuLaunchHostFunc`). For tests of asynchronous behaviour.
///
/// # Safety
/// `raw` is a live stream of `device`, or 0.
pub(crate) unsafe fn stream_sleep(device: usize, raw: u64, ms: u64) -> Result<(), CudaError> {
    bind(device)?;
    // SAFETY: `sleep_ms` calls no CUDA API and reads its argument as an integer, not a
    // pointer; `raw` is a live stream of this device (the caller's contract).
    check("cuLaunchHostFunc", device, unsafe {
        result::stream::launch_host_function(
            stream(raw),
            sleep_ms,
            ms as usize as *mut std::ffi::c_void,
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

/// `cuEventRecord` of `ev` on stream `raw`.
///
/// # Safety
/// `ev` is a live event of `device`, `raw` a live stream of `device` (or 0).
pub(crate) unsafe fn event_record(device: usize, ev: u64, raw: u64) -> Result<(), CudaError> {
    bind(device)?;
    // SAFETY: the caller's contract.
    check("cuEventRecord", device, unsafe {
        result::event::record(event(ev), stream(raw))
    })
}

/// `cuEventQuery`: `true` when complete.
///
/// # Safety
/// `ev` is a live event of `device`.
pub(crate) unsafe fn event_query(device: usize, ev: u64) -> Result<bool, CudaError> {
    bind(device)?;
    // SAFETY: the caller's contract.
    match unsafe { result::event::query(event(ev)) } {
        Ok(()) => Ok(true),
        Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        Err(e) => Err(CudaError::from_driver("cuEventQuery", e, device, 0)),
    }
}

/// `cuEventSynchronize`.
///
/// # Safety
/// `ev` is a live event of `device`.
pub(crate) unsafe fn event_sync(device: usize, ev: u64) -> Result<(), CudaError> {
    bind(device)?;
    // SAFETY: the caller's contract.
    check("cuEventSynchronize", device, unsafe {
        result::event::synchronize(event(ev))
    })
}

/// `cuEventElapsedTime`, in ms.
///
/// # Safety
/// Both events are live, created on `device` with timing, and completed.
pub(crate) unsafe fn event_elapsed(device: usize, start: u64, end: u64) -> Result<f32, CudaError> {
    bind(device)?;
    // SAFETY: the caller's contract.
    check("cuEventElapsedTime", device, unsafe {
        result::event::elapsed(event(start), event(end))
    })
}

/// `cuEventDestroy`.
///
/// # Safety
/// `ev` came from [`event_create`] on `device`, is destroyed once, and is not used after.
pub(crate) unsafe fn event_destroy(device: usize, ev: u64) -> Result<(), CudaError> {
    bind(device)?;
    // SAFETY: the caller's contract.
    check("cuEventDestroy", device, unsafe {
        result::event::destroy(event(ev))
    })
}
