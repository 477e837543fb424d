//! The driver wrappers when berth is built without the `cuda` feature: the same signatures,
//! answering [`CudaError::Unavailable`] (or `false` / "absent"). The callers reach them only
//! after [`driver`](crate::driver) succeeded, which it never does without `cuda`: these are
//! here so that no other file needs a `cfg`. `# Safety` sections are the real wrappers'.
#![allow(clippy::missing_errors_doc, clippy::missing_safety_doc)]

use super::Attribute;
use crate::CudaError;

fn no<T>() -> Result<T, CudaError> {
    Err(CudaError::unavailable(
        "berth was built without the `cuda` feature",
    ))
}

pub(crate) fn driver_library_present() -> bool {
    false
}
pub(crate) fn driver_get_version() -> Result<i32, CudaError> {
    no()
}
pub(crate) fn missing_driver_symbols(names: &[&'static str]) -> Vec<&'static str> {
    names.to_vec()
}
pub(crate) fn init() -> Result<(), CudaError> {
    no()
}
pub(crate) fn device_get_count() -> Result<i32, CudaError> {
    no()
}
pub(crate) fn device_get(_: usize) -> Result<i32, CudaError> {
    no()
}
pub(crate) fn device_name(_: usize, _: i32) -> Result<String, CudaError> {
    no()
}
pub(crate) fn device_total_mem(_: usize, _: i32) -> Result<usize, CudaError> {
    no()
}
pub(crate) fn device_attribute(_: usize, _: i32, _: Attribute) -> Result<i32, CudaError> {
    no()
}
pub(crate) fn primary_ctx_retain(_: usize, _: i32) -> Result<u64, CudaError> {
    no()
}
pub(crate) unsafe fn ctx_set_current(_: usize, _: u64) -> Result<(), CudaError> {
    no()
}
pub(crate) fn ctx_get_current(_: usize) -> Result<u64, CudaError> {
    no()
}
pub(crate) unsafe fn ctx_restore(_: usize, _: u64) -> Result<(), CudaError> {
    no()
}
pub(crate) fn ctx_synchronize(_: usize) -> Result<(), CudaError> {
    no()
}
pub(crate) fn mem_get_info(_: usize) -> Result<(usize, usize), CudaError> {
    no()
}
pub(crate) fn device_can_access_peer(_: usize, _: i32, _: i32) -> Result<bool, CudaError> {
    no()
}
pub(crate) fn ctx_enable_peer_access(_: usize, _: usize) -> Result<bool, CudaError> {
    no()
}
pub(crate) fn ctx_disable_peer_access(_: usize, _: usize) -> Result<bool, CudaError> {
    no()
}

pub(crate) fn priority_range(_: usize) -> Result<(i32, i32), CudaError> {
    no()
}
pub(crate) fn stream_create(_: usize, _: i32) -> Result<u64, CudaError> {
    no()
}
pub(crate) unsafe fn stream_sync(_: usize, _: u64) -> Result<(), CudaError> {
    no()
}
pub(crate) unsafe fn stream_query(_: usize, _: u64) -> Result<bool, CudaError> {
    no()
}
pub(crate) unsafe fn stream_wait_event(_: usize, _: u64, _: u64) -> Result<(), CudaError> {
    no()
}
pub(crate) unsafe fn stream_sleep(_: usize, _: u64, _: u64) -> Result<(), CudaError> {
    no()
}
pub(crate) fn event_create(_: usize, _: bool) -> Result<u64, CudaError> {
    no()
}
pub(crate) unsafe fn event_record(_: usize, _: u64, _: u64) -> Result<(), CudaError> {
    no()
}
pub(crate) unsafe fn event_query(_: usize, _: u64) -> Result<bool, CudaError> {
    no()
}
pub(crate) unsafe fn event_sync(_: usize, _: u64) -> Result<(), CudaError> {
    no()
}
pub(crate) unsafe fn event_elapsed(_: usize, _: u64, _: u64) -> Result<f32, CudaError> {
    no()
}
pub(crate) unsafe fn event_destroy(_: usize, _: u64) -> Result<(), CudaError> {
    no()
}

pub(crate) fn mem_alloc(_: usize, _: usize) -> Result<u64, CudaError> {
    no()
}
pub(crate) unsafe fn mem_free(_: usize, _: u64) -> Result<(), CudaError> {
    no()
}
pub(crate) fn mem_allocation_granularity(_: usize) -> Result<usize, CudaError> {
    no()
}
pub(crate) fn address_reserve(_: usize, _: usize) -> Result<u64, CudaError> {
    no()
}
pub(crate) unsafe fn address_free(_: usize, _: u64, _: usize) -> Result<(), CudaError> {
    no()
}
pub(crate) fn mem_export_fd(_: usize, _: u64) -> Result<i32, CudaError> {
    no()
}
pub(crate) fn mem_import_fd(_: usize, _: i32) -> Result<u64, CudaError> {
    no()
}
pub(crate) fn mem_create(_: usize, _: usize) -> Result<u64, CudaError> {
    no()
}
pub(crate) unsafe fn mem_map(_: usize, _: u64, _: usize, _: u64) -> Result<(), CudaError> {
    no()
}
pub(crate) fn mem_set_access(_: usize, _: u64, _: usize) -> Result<(), CudaError> {
    no()
}
pub(crate) unsafe fn mem_unmap(_: usize, _: u64, _: usize) -> Result<(), CudaError> {
    no()
}
pub(crate) unsafe fn mem_release(_: usize, _: u64) -> Result<(), CudaError> {
    no()
}
pub(crate) fn host_alloc(_: usize, _: usize) -> Result<*mut u8, CudaError> {
    no()
}
pub(crate) unsafe fn host_free(_: usize, _: *mut u8) -> Result<(), CudaError> {
    no()
}
pub(crate) fn host_register(_: usize, _: *mut u8, _: usize) -> Result<(), CudaError> {
    no()
}
pub(crate) unsafe fn host_unregister(_: usize, _: *mut u8) -> Result<(), CudaError> {
    no()
}
pub(crate) fn pointer_is_host(_: usize, _: *const u8) -> bool {
    false
}
pub(crate) unsafe fn memcpy_htod_async(
    _: usize,
    _: u64,
    _: *const u8,
    _: usize,
    _: u64,
) -> Result<(), CudaError> {
    no()
}
pub(crate) unsafe fn memcpy_dtoh_async(
    _: usize,
    _: *mut u8,
    _: u64,
    _: usize,
    _: u64,
) -> Result<(), CudaError> {
    no()
}
pub(crate) unsafe fn memcpy_dtod_async(
    _: usize,
    _: u64,
    _: u64,
    _: usize,
    _: u64,
) -> Result<(), CudaError> {
    no()
}
pub(crate) unsafe fn memcpy_peer_async(
    _: usize,
    _: u64,
    _: usize,
    _: u64,
    _: usize,
    _: u64,
) -> Result<(), CudaError> {
    no()
}
