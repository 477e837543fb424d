//! Ways to make a first pinned copy of host bytes, timed phase by phase, for choosing what
//! `pin_memory()` does (`berth bench transfers --pin-probe VARIANT`). Not a stable API.
//!
//! Every variant ends with a page-locked block holding a copy of the source; then the block is
//! freed (timed apart) after its contents were checked against the source.

use crate::hostmem::{copy_by_huge_pages, Mapping, Pages};
use crate::{ffi, CudaError};
use std::time::Instant;

/// One way to pin a copy of host bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// `cuMemHostAlloc` of the block, then a parallel copy (what PyTorch does).
    HostAlloc,
    /// Anonymous mapping with huge pages, filled by the parallel copy, one `cuMemHostRegister`.
    FillRegisterHuge,
    /// As `FillRegisterHuge` with small pages only (`MADV_NOHUGEPAGE`).
    FillRegisterSmall,
    /// Huge-page mapping, pages pre-faulted from 16 threads, registered, then copied.
    PrefaultRegisterHuge,
    /// Small-page mapping, pre-faulted from 16 threads, registered, then copied (PyTorch's
    /// `pinned_use_cuda_host_register` with 16 register threads).
    PrefaultRegisterSmall,
    /// Huge-page mapping filled by the copy, then 8 concurrent `cuMemHostRegister` calls over
    /// disjoint slices.
    FillRegisterHugeSplit8,
}

impl Variant {
    /// Every variant, in a fixed order.
    pub const ALL: [Variant; 6] = [
        Variant::HostAlloc,
        Variant::FillRegisterHuge,
        Variant::FillRegisterSmall,
        Variant::PrefaultRegisterHuge,
        Variant::PrefaultRegisterSmall,
        Variant::FillRegisterHugeSplit8,
    ];

    /// The variant's command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Variant::HostAlloc => "hostalloc",
            Variant::FillRegisterHuge => "fill-register-huge",
            Variant::FillRegisterSmall => "fill-register-small",
            Variant::PrefaultRegisterHuge => "prefault-register-huge",
            Variant::PrefaultRegisterSmall => "prefault-register-small",
            Variant::FillRegisterHugeSplit8 => "fill-register-huge-split8",
        }
    }

    /// The variant called `name`, if any.
    pub fn parse(name: &str) -> Option<Variant> {
        Variant::ALL.into_iter().find(|v| v.name() == name)
    }
}

/// Phase times of one pinned copy, in ms (0 for a phase the variant does not have).
#[derive(Clone, Copy, Debug, Default)]
pub struct Phases {
    /// `cuMemHostAlloc` or `mmap` (+ pre-faulting).
    pub alloc_ms: f64,
    /// The copy of the source into the block.
    pub copy_ms: f64,
    /// `cuMemHostRegister` (all of them).
    pub register_ms: f64,
    /// From the first call to the block holding the copy.
    pub total_ms: f64,
    /// Freeing the block (`cuMemFreeHost`, or unregister + `munmap`), after the check.
    pub free_ms: f64,
}

fn ms(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1e3
}

fn mismatch() -> CudaError {
    CudaError::HostAlloc {
        message: "pinned copy differs from its source".into(),
    }
}

/// Makes one page-locked copy of `src` on `device`'s context with `variant`, checks it, and
/// frees it, timing each phase.
///
/// # Errors
/// Driver errors ([`CudaError::Driver`], [`CudaError::OutOfMemory`]),
/// [`CudaError::HostAlloc`] when a mapping fails or the copy differs from the source.
pub fn run(variant: Variant, src: &[u8], device: usize) -> Result<Phases, CudaError> {
    let n = src.len();
    let mut ph = Phases::default();
    let t0 = Instant::now();
    if variant == Variant::HostAlloc {
        let p = ffi::host_alloc(device, n)?;
        ph.alloc_ms = ms(t0);
        let t = Instant::now();
        // SAFETY: `p` is a fresh pinned block of `n` bytes that only this function uses.
        let dst = unsafe { std::slice::from_raw_parts_mut(p, n) };
        copy_by_huge_pages(dst, src);
        ph.copy_ms = ms(t);
        ph.total_ms = ms(t0);
        let same = dst == src;
        let t = Instant::now();
        // SAFETY: `p` came from `host_alloc` above, is freed once, and `dst` is not used after.
        unsafe { ffi::host_free(device, p)? };
        ph.free_ms = ms(t);
        return if same { Ok(ph) } else { Err(mismatch()) };
    }
    let pages = match variant {
        Variant::FillRegisterSmall | Variant::PrefaultRegisterSmall => Pages::Small,
        _ => Pages::Huge,
    };
    let prefault = matches!(
        variant,
        Variant::PrefaultRegisterHuge | Variant::PrefaultRegisterSmall
    );
    let mut m = Mapping::new(n, pages)?;
    if prefault {
        m.prefault(16);
    }
    ph.alloc_ms = ms(t0);
    if !prefault {
        let t = Instant::now();
        m.fill_from(src);
        ph.copy_ms = ms(t);
    }
    let t = Instant::now();
    let base = m.as_ptr() as usize;
    let slices: Vec<(usize, usize)> = if variant == Variant::FillRegisterHugeSplit8 {
        let per = n.div_ceil(8).next_multiple_of(crate::hostmem::HUGE_PAGE);
        (0..n)
            .step_by(per)
            .map(|at| (at, per.min(n - at)))
            .collect()
    } else {
        vec![(0, n)]
    };
    let results: Vec<Result<(), CudaError>> = std::thread::scope(|s| {
        let handles: Vec<_> = slices
            .iter()
            .map(|&(at, len)| {
                s.spawn(move || ffi::host_register(device, (base + at) as *mut u8, len))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(CudaError::HostAlloc {
                        message: "register thread panicked".into(),
                    })
                })
            })
            .collect()
    });
    ph.register_ms = ms(t);
    let registered: Vec<(usize, usize)> = slices
        .iter()
        .zip(&results)
        .filter(|(_, r)| r.is_ok())
        .map(|(s, _)| *s)
        .collect();
    let first_err = results.into_iter().find_map(Result::err);
    let mut same = true;
    if first_err.is_none() {
        if prefault {
            let t = Instant::now();
            m.fill_from(src);
            ph.copy_ms = ms(t);
        }
        ph.total_ms = ms(t0);
        // SAFETY: the mapping holds at least `n` bytes; nothing else writes it now.
        same = unsafe { std::slice::from_raw_parts(m.as_ptr(), n) } == src;
    }
    let t = Instant::now();
    let mut unreg_err = None;
    for (at, _) in registered {
        // SAFETY: this slice was registered above; no copy uses it.
        if let Err(e) = unsafe { ffi::host_unregister(device, (base + at) as *mut u8) } {
            unreg_err.get_or_insert(e);
        }
    }
    if unreg_err.is_some() {
        // Still locked: leak the mapping rather than unmap locked pages.
        std::mem::forget(m);
    } else {
        drop(m);
    }
    ph.free_ms = ms(t);
    if let Some(e) = first_err.or(unreg_err) {
        return Err(e);
    }
    if same {
        Ok(ph)
    } else {
        Err(mismatch())
    }
}
