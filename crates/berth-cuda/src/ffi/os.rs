//! Anonymous host mappings (`mmap` / `munmap` / `madvise`) for [`Mapping`](crate::hostmem::Mapping):
//! Linux only; elsewhere mapping answers [`CudaError::Unavailable`](crate::CudaError).

#[cfg(target_os = "linux")]
pub(crate) use imp::*;
#[cfg(not(target_os = "linux"))]
pub(crate) use other::*;

#[cfg(target_os = "linux")]
mod imp {
    use crate::hostmem::{Pages, HUGE_PAGE};
    use crate::CudaError;
    use std::ffi::{c_int, c_void};
    use std::ptr::NonNull;

    const PROT_READ: c_int = 1;
    const PROT_WRITE: c_int = 2;
    const MAP_PRIVATE: c_int = 0x02;
    const MAP_ANONYMOUS: c_int = 0x20;
    const MADV_HUGEPAGE: c_int = 14;
    const MADV_NOHUGEPAGE: c_int = 15;

    extern "C" {
        fn mmap(
            addr: *mut c_void,
            len: usize,
            prot: c_int,
            flags: c_int,
            fd: c_int,
            offset: i64,
        ) -> *mut c_void;
        fn munmap(addr: *mut c_void, len: usize) -> c_int;
        fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int;
    }

    /// Maps `len` bytes (a multiple of `HUGE_PAGE`) aligned to `HUGE_PAGE`: one mapping a huge
    /// page longer, with the unaligned head and the tail cut off.
    pub(crate) fn map_aligned(len: usize, pages: Pages) -> Result<NonNull<u8>, CudaError> {
        let total = len + HUGE_PAGE;
        // SAFETY: an anonymous private mapping at an address of the kernel's choosing; no
        // existing memory is affected.
        let raw = unsafe {
            mmap(
                std::ptr::null_mut(),
                total,
                PROT_READ | PROT_WRITE,
                MAP_PRIVATE | MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw as isize == -1 || raw.is_null() {
            return Err(CudaError::HostAlloc {
                message: format!(
                    "mmap of {total} bytes failed: {}",
                    std::io::Error::last_os_error()
                ),
            });
        }
        let start = raw as usize;
        let aligned = start.next_multiple_of(HUGE_PAGE);
        let head = aligned - start;
        let tail = total - head - len;
        // SAFETY: both ranges lie inside the mapping just made and are not used by anyone; a
        // zero length is skipped.
        unsafe {
            if head > 0 {
                munmap(raw, head);
            }
            if tail > 0 {
                munmap((aligned + len) as *mut c_void, tail);
            }
        }
        let advice = match pages {
            Pages::Huge => MADV_HUGEPAGE,
            Pages::Small => MADV_NOHUGEPAGE,
        };
        // SAFETY: the range is the aligned mapping; advice only changes how it is backed.
        // Failure (no THP support in this kernel) leaves small pages, which is correct.
        let _ = unsafe { madvise(aligned as *mut c_void, len, advice) };
        NonNull::new(aligned as *mut u8).ok_or_else(|| CudaError::HostAlloc {
            message: "mmap returned a null address".into(),
        })
    }

    /// Unmaps a mapping made by `map_aligned`.
    ///
    /// # Safety
    /// `ptr..ptr+len` is such a mapping, no longer used (and unregistered from the driver).
    pub(crate) unsafe fn unmap(ptr: NonNull<u8>, len: usize) {
        // SAFETY: the caller's contract; munmap of a whole mapping cannot fail otherwise.
        let _ = unsafe { munmap(ptr.as_ptr().cast(), len) };
    }
}

#[cfg(not(target_os = "linux"))]
mod other {
    use crate::hostmem::Pages;
    use crate::CudaError;
    use std::ptr::NonNull;

    pub(crate) fn map_aligned(_: usize, _: Pages) -> Result<NonNull<u8>, CudaError> {
        Err(CudaError::unavailable(
            "anonymous huge-page mappings are implemented for Linux only",
        ))
    }

    /// # Safety
    /// Never called: no mapping exists off Linux.
    pub(crate) unsafe fn unmap(_: NonNull<u8>, _: usize) {}
}
