//! Anonymous host mappings for the fast first `pin_memory()` and for fresh host destinations
//! of device→host copies.
//!
//! `cuMemHostAlloc` of 256 MiB costs ~95–130 ms on the H200 host: the driver allocates and
//! zeroes 65,536 small pages one by one and locks each. An anonymous `mmap` with
//! `madvise(MADV_HUGEPAGE)` is backed by 2 MiB transparent huge pages instead (512× fewer
//! faults, zeroed by the kernel in large runs); when the *copy of the source itself* touches
//! the pages first, from several threads, the fault and the copy are one pass, and the single
//! `cuMemHostRegister` that follows only locks pages that already exist. Where the kernel
//! offers no huge pages the advice is ignored and small pages are used (still faulted by the
//! parallel copy).
//!
//! Linux only; elsewhere [`Mapping::new`] answers an error and callers keep the driver's
//! allocation.

use crate::{ffi, CudaError};
use std::ptr::NonNull;

/// Size of a transparent huge page on x86-64 and aarch64 with 4 KiB base pages, in bytes.
pub const HUGE_PAGE: usize = 2 << 20;

/// An anonymous, private, read-write mapping of whole huge pages, aligned to [`HUGE_PAGE`];
/// unmapped on drop. Its pages are not touched by [`Mapping::new`] (the kernel supplies zeroed
/// pages on first touch).
#[derive(Debug)]
pub struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; whoever shares its pointer
// synchronises access (the host caching allocator hands a block to one owner at a time).
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` only exposes the address and length.
unsafe impl Sync for Mapping {}

/// How the kernel should back a [`Mapping`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pages {
    /// `madvise(MADV_HUGEPAGE)`: transparent huge pages where the kernel offers them.
    Huge,
    /// `madvise(MADV_NOHUGEPAGE)`: small pages only (for comparisons).
    Small,
}

impl Mapping {
    /// Maps at least `bytes` bytes (rounded up to whole huge pages), aligned to
    /// [`HUGE_PAGE`], with the given page advice.
    ///
    /// # Errors
    /// [`CudaError::HostAlloc`] when `bytes` is 0 or too large, or the kernel refuses the
    /// mapping (`ENOMEM`); [`CudaError::Unavailable`] off Linux.
    pub fn new(bytes: usize, pages: Pages) -> Result<Mapping, CudaError> {
        let len = bytes
            .checked_next_multiple_of(HUGE_PAGE)
            .filter(|&l| l > 0 && l <= isize::MAX as usize / 2)
            .ok_or_else(|| CudaError::HostAlloc {
                message: format!("cannot map {bytes} bytes of host memory"),
            })?;
        let ptr = ffi::os::map_aligned(len, pages)?;
        Ok(Mapping { ptr, len })
    }

    /// The start of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The mapped length in bytes (a multiple of [`HUGE_PAGE`]).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always `false`: a mapping has at least one page.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Copies `src` to the start of the mapping, touching each page first from the thread
    /// that copies it (the fault and the copy in one pass), in pieces of one huge page over
    /// the rayon pool.
    ///
    /// # Panics
    /// If `src` is longer than the mapping (a caller's bug).
    pub fn fill_from(&mut self, src: &[u8]) {
        assert!(src.len() <= self.len, "source larger than the mapping");
        // SAFETY: the mapping is `self.len` bytes of live, writable memory owned by `self`,
        // and `&mut self` excludes every other access.
        let dst = unsafe { std::slice::from_raw_parts_mut(self.as_ptr(), src.len()) };
        copy_by_huge_pages(dst, src);
    }

    /// Touches one byte of every 4 KiB page, over `threads` threads, so that every page exists
    /// (PyTorch's pre-faulting before `cudaHostRegister`). The contents stay zero.
    pub fn prefault(&mut self, threads: usize) {
        let base = self.as_ptr() as usize;
        let pages = self.len / 4096;
        let threads = threads.clamp(1, 128);
        let per = pages.div_ceil(threads);
        std::thread::scope(|s| {
            for t in 0..threads {
                let (first, last) = (t * per, ((t + 1) * per).min(pages));
                s.spawn(move || {
                    for page in first..last {
                        // SAFETY: `page < pages`, so the byte is inside the mapping, which
                        // `&mut self` gives us alone; writing the zero the kernel supplied
                        // keeps the contents.
                        unsafe { ((base + page * 4096) as *mut u8).write_volatile(0) };
                    }
                });
            }
        });
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr..ptr+len` is a mapping made by `map_aligned` and owned by `self`.
        unsafe { ffi::os::unmap(self.ptr, self.len) };
    }
}

/// `dst.copy_from_slice(src)` in pieces of one huge page over the rayon pool (so that each
/// huge page is faulted by one thread).
pub fn copy_by_huge_pages(dst: &mut [u8], src: &[u8]) {
    use rayon::prelude::*;
    if src.len() <= HUGE_PAGE {
        dst.copy_from_slice(src);
        return;
    }
    dst.par_chunks_mut(HUGE_PAGE)
        .zip(src.par_chunks(HUGE_PAGE))
        .for_each(|(d, s)| d.copy_from_slice(s));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[cfg(target_os = "linux")]
    fn a_mapping_is_aligned_whole_huge_pages_and_holds_what_was_copied() {
        let src: Vec<u8> = (0..(5 << 20) + 123).map(|i| (i % 251) as u8).collect();
        let mut m = Mapping::new(src.len(), Pages::Huge).unwrap();
        assert_eq!(m.len(), 6 << 20);
        assert_eq!(m.as_ptr() as usize % HUGE_PAGE, 0);
        m.fill_from(&src);
        // SAFETY: the mapping holds `m.len()` bytes; nothing else writes it.
        let got = unsafe { std::slice::from_raw_parts(m.as_ptr(), m.len()) };
        assert_eq!(&got[..src.len()], &src[..]);
        assert!(got[src.len()..].iter().all(|&b| b == 0));
        let mut z = Mapping::new(1, Pages::Small).unwrap();
        z.prefault(3);
        // SAFETY: as above.
        let zs = unsafe { std::slice::from_raw_parts(z.as_ptr(), z.len()) };
        assert!(zs.iter().all(|&b| b == 0));
    }

    #[test]
    fn zero_or_huge_sizes_are_typed_errors() {
        assert!(matches!(
            Mapping::new(0, Pages::Huge),
            Err(CudaError::HostAlloc { .. })
        ));
        assert!(matches!(
            Mapping::new(usize::MAX - 5, Pages::Huge),
            Err(CudaError::HostAlloc { .. })
        ));
    }
}
