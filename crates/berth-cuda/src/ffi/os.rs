//! Anonymous host mappings (`mmap` / `munmap` / `madvise`) for [`Mapping`](crate::hostmem::Mapping),
//! and taking a file descriptor from another process (`pidfd_open` / `pidfd_getfd`) for
//! [`ipc`](crate::ipc): Linux only; elsewhere they answer [`CudaError::Unavailable`](crate::CudaError)
//! or an `Unsupported` I/O error.

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

    /// `pidfd_open` and `pidfd_getfd`'s system call numbers (Linux 5.3 and 5.6; the same on
    /// every architecture, from the common table).
    const SYS_PIDFD_OPEN: std::ffi::c_long = 434;
    const SYS_PIDFD_GETFD: std::ffi::c_long = 438;

    extern "C" {
        fn syscall(number: std::ffi::c_long, ...) -> std::ffi::c_long;
    }

    /// A copy, in this process, of file descriptor `fd` of process `pid` (`pidfd_open` then
    /// `pidfd_getfd`, <https://man7.org/linux/man-pages/man2/pidfd_getfd.2.html>): the kernel
    /// allows it where this process may ptrace `pid` (same user, and Yama's `ptrace_scope` 0,
    /// or `pid` a descendant of this process).
    pub(crate) fn fd_of_process(pid: i32, fd: i32) -> std::io::Result<std::os::fd::OwnedFd> {
        use std::os::fd::{FromRawFd, OwnedFd};
        // SAFETY: a plain system call with integer arguments.
        let pidfd = unsafe {
            syscall(
                SYS_PIDFD_OPEN,
                pid as std::ffi::c_long,
                0 as std::ffi::c_long,
            )
        };
        if pidfd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: a descriptor the kernel just opened for this process, owned here alone.
        let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as c_int) };
        use std::os::fd::AsRawFd;
        // SAFETY: a plain system call with integer arguments.
        let got = unsafe {
            syscall(
                SYS_PIDFD_GETFD,
                pidfd.as_raw_fd() as std::ffi::c_long,
                fd as std::ffi::c_long,
                0 as std::ffi::c_long,
            )
        };
        if got < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: as above: a new descriptor of this process.
        Ok(unsafe { OwnedFd::from_raw_fd(got as c_int) })
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

    pub(crate) fn fd_of_process(_: i32, _: i32) -> std::io::Result<std::os::fd::OwnedFd> {
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "taking another process's file descriptor is implemented for Linux only",
        ))
    }
}
