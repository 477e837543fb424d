//! The C functions behind the full allocator's `shareIpcHandle` / `getIpcDevPtr` for memory
//! that berth's `expandable` and `paged` policies mapped through CUDA's virtual memory
//! (`Note [Sharing mapped memory]` in berth-cuda's `ipc.rs`): what `torch.multiprocessing`
//! calls to send a CUDA tensor to another process. Memory from `cuMemAlloc` (the `pytorch`
//! policy) is shared by the C++ layer with `cudaIpcGetMemHandle`, in PyTorch's own format.

use crate::abi::guarded;
use crate::install::{self, HookError};
use berth_cuda::ipc::{self, OpenedRange, SharedRange};
use berth_cuda::memory;
use std::ffi::{c_int, c_void};

fn cuda(device: usize, source: berth_cuda::CudaError) -> HookError {
    HookError::Cuda {
        device: device as i32,
        source,
    }
}

/// The device and block (start, size) of berth's allocation holding `ptr`, if any.
fn block_of(ptr: u64) -> Option<(usize, u64, u64)> {
    memory::built_allocators().into_iter().find_map(|(d, a)| {
        a.snapshot()
            .segments
            .iter()
            .filter(|s| s.address <= ptr && ptr < s.address + s.total_size)
            .flat_map(|s| &s.blocks)
            .find(|b| b.address <= ptr && ptr < b.address + b.size)
            .map(|b| (d, b.address, b.size))
    })
}

/// Shares the block holding `ptr` with other processes: writes the handle (berth's format,
/// [`SharedRange::to_bytes`]) to `buf` and the device address where the shared range starts
/// to `base`. Returns the handle's length; 0 when `ptr` is not memory berth's policy mapped
/// (share it with `cudaIpcGetMemHandle`: the `pytorch` policy, or `cuMemAlloc` segments); the
/// negated length needed when `cap` is too small (nothing written); `i64::MIN` on an error
/// (message in `berth_torch_last_error`).
///
/// # Safety
/// `buf` is valid for `cap` bytes of writes; `base` for one write.
#[no_mangle]
pub unsafe extern "C" fn berth_torch_ipc_share(
    ptr: *mut c_void,
    buf: *mut u8,
    cap: usize,
    base: *mut u64,
) -> i64 {
    let shared = guarded(|| {
        install::installed()?;
        let Some((device, start, size)) = block_of(ptr as u64) else {
            return Ok(None);
        };
        ipc::share(device, start, size as usize).map_err(|e| cuda(device, e))
    });
    match shared {
        Err(_) => i64::MIN,
        Ok(None) => 0,
        Ok(Some((b, range))) => {
            let bytes = range.to_bytes();
            if bytes.len() > cap {
                return -(bytes.len() as i64);
            }
            // SAFETY: the caller's contract: `buf` holds `cap` ≥ `bytes.len()` bytes, `base`
            // one u64.
            unsafe {
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), buf, bytes.len());
                *base = b;
            }
            bytes.len() as i64
        }
    }
}

/// Maps the range another process shared with [`berth_torch_ipc_share`] (`len` bytes of
/// handle at `handle`) on `device`, writing its address to `ptr`. Returns an owner to pass to
/// [`berth_torch_ipc_close`] once the memory is no longer used, or null on an error (message
/// in `berth_torch_last_error`).
///
/// # Safety
/// `handle` is valid for `len` bytes of reads; `ptr` for one write.
#[no_mangle]
pub unsafe extern "C" fn berth_torch_ipc_open(
    handle: *const u8,
    len: usize,
    device: c_int,
    ptr: *mut u64,
) -> *mut c_void {
    let opened = guarded(|| {
        let d = usize::try_from(device).map_err(|_| {
            cuda(
                0,
                berth_cuda::CudaError::InvalidArgument {
                    op: "open shared memory",
                    what: format!("device {device}; expected a device index of 0 or more"),
                },
            )
        })?;
        // SAFETY: the caller's contract.
        let bytes = unsafe { std::slice::from_raw_parts(handle, len) };
        let range = SharedRange::from_bytes(bytes).map_err(|e| cuda(d, e))?;
        ipc::open(d, &range).map_err(|e| cuda(d, e))
    });
    match opened {
        Err(_) => std::ptr::null_mut(),
        Ok(o) => {
            // SAFETY: the caller's contract.
            unsafe { *ptr = o.ptr() };
            Box::into_raw(Box::new(o)).cast()
        }
    }
}

/// Unmaps and releases a range opened by [`berth_torch_ipc_open`].
///
/// # Safety
/// `owner` came from [`berth_torch_ipc_open`], is closed once, and no work uses its memory.
#[no_mangle]
pub unsafe extern "C" fn berth_torch_ipc_close(owner: *mut c_void) {
    if !owner.is_null() {
        // SAFETY: the caller's contract: a Box made by `berth_torch_ipc_open`, dropped once.
        drop(unsafe { Box::from_raw(owner.cast::<OpenedRange>()) });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_handle_is_an_error_not_a_mapping() {
        let mut ptr = 0u64;
        // SAFETY: a 3-byte handle and a valid out-pointer.
        let owner = unsafe { berth_torch_ipc_open([1u8, 2, 3].as_ptr(), 3, 0, &mut ptr) };
        assert!(owner.is_null());
        assert_eq!(ptr, 0);
        let mut buf = [0 as std::ffi::c_char; 256];
        // SAFETY: a buffer of its own length.
        let n = unsafe { crate::abi::berth_torch_last_error(buf.as_mut_ptr(), buf.len()) };
        let msg: String = buf[..n.min(buf.len() - 1)]
            .iter()
            .map(|&c| c as u8 as char)
            .collect();
        assert!(msg.contains("fewer than its 12-byte header"), "{msg}");
        // SAFETY: null is accepted and ignored.
        unsafe { berth_torch_ipc_close(std::ptr::null_mut()) };
    }
}
