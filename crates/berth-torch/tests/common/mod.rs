//! The C functions exactly as PyTorch calls them, over simulated devices (the test switch), for
//! one policy per test process (`Note [One allocator per process]`): each `hooks_*.rs` file is
//! its own test binary and calls [`run_all`] once.

use berth_torch::abi::*;
use berth_torch::berth_torch_alloc;
use std::ffi::{c_void, CString};

/// Each simulated device: 1 GiB.
pub const CAPACITY: u64 = 1 << 30;
const MIB: usize = 1 << 20;

fn stream(s: u64) -> *mut c_void {
    s as usize as *mut c_void
}

fn alloc(size: usize, s: u64) -> u64 {
    berth_torch_alloc(size, 0, stream(s)) as u64
}

fn free(p: u64, size: usize, s: u64) {
    berth_torch_free(p as usize as *mut c_void, size, 0, stream(s));
}

fn stat(key: &str) -> i64 {
    let k = CString::new(key).unwrap();
    // SAFETY: `k` is NUL-terminated.
    unsafe { berth_torch_stat(0, k.as_ptr()) }
}

fn last_error() -> String {
    let mut buf = vec![0u8; 1024];
    // SAFETY: `buf` is valid for its length.
    let n = unsafe { berth_torch_last_error(buf.as_mut_ptr().cast(), buf.len()) };
    buf.truncate(n.min(1023));
    String::from_utf8(buf).unwrap()
}

fn deferred() -> Option<String> {
    take_deferred_error()
}

fn install(policy: &str, options: &str) -> Result<(), String> {
    let (p, o) = (
        CString::new(policy).unwrap(),
        CString::new(options).unwrap(),
    );
    // SAFETY: both are NUL-terminated.
    match unsafe { berth_torch_install(p.as_ptr(), o.as_ptr()) } {
        0 => Ok(()),
        _ => Err(last_error()),
    }
}

/// Installs `policy` on simulated devices and runs every check.
pub fn run_all(policy: &str) {
    // Before install: the hooks fail cleanly and nothing is allocated.
    assert_eq!(alloc(MIB, 0), 0);
    assert!(last_error().contains("not installed"), "{}", last_error());
    let e = install("cudaMallocAsync", "").unwrap_err();
    assert!(
        e.contains("\"pytorch\"") && e.contains("\"paged\"") && e.contains("\"expandable\""),
        "{e}"
    );
    assert_eq!(berth_torch_simulate(CAPACITY), 0);
    install(policy, "").unwrap();
    install(policy, "").unwrap(); // the same policy again: a no-op
    let other = if policy == "paged" {
        "pytorch"
    } else {
        "paged"
    };
    let e = install(other, "").unwrap_err();
    assert!(e.contains("already installed"), "{e}");
    assert_eq!(berth_torch_simulate(CAPACITY), -1, "simulate after install");

    zero_bytes_and_stats();
    record_stream_defers_reuse();
    out_of_memory_raises_nothing_and_recovers();
    memory_fraction_caps_and_bad_fractions_are_reported();
    reset_returns_cached_memory();
    bad_frees_are_reported_not_fatal();
    many_threads();
    assert_eq!(stat("allocated_bytes.all.current"), 0);
}

fn zero_bytes_and_stats() {
    assert_eq!(alloc(0, 0), 0, "zero bytes: a null pointer, as PyTorch");
    let p = alloc(3 * MIB + 5, 0);
    assert_ne!(p, 0);
    assert_eq!(p % 512, 0, "pointers are 512-byte aligned");
    assert_eq!(
        stat("allocated_bytes.all.current"),
        (3 * MIB + 5 + 511) as i64 / 512 * 512
    );
    assert_eq!(stat("requested_bytes.all.current"), (3 * MIB + 5) as i64);
    assert!(stat("reserved_bytes.all.current") >= stat("allocated_bytes.all.current"));
    assert_eq!(stat("no.such.key"), -1);
    free(p, 3 * MIB + 5, 0);
    assert_eq!(stat("allocated_bytes.all.current"), 0);
    assert_eq!(stat("num_alloc_retries"), 0);
}

/// A block used on another stream (`record_stream`) is not handed out again until that
/// stream passed the event recorded at its free; then it is.
fn record_stream_defers_reuse() {
    let (s1, s2) = (0x10, 0x20);
    let a = alloc(MIB, s1);
    berth_torch_record_stream(a as usize as *mut c_void, stream(s2));
    free(a, MIB, s1);
    let b = alloc(MIB, s1);
    assert_ne!(b, a, "reused while stream 0x20 may still read it");
    let reserved = stat("reserved_bytes.all.current");
    assert_eq!(berth_torch_sim_complete_events(0, stream(s2)), 0);
    let c = alloc(MIB, s1);
    assert_eq!(c, a, "reused once the event completed");
    assert_eq!(
        stat("reserved_bytes.all.current"),
        reserved,
        "no new memory"
    );
    free(b, MIB, s1);
    free(c, MIB, s1);
    // record_stream of an unknown pointer is reported, not fatal.
    berth_torch_record_stream(0x1234 as *mut c_void, stream(s2));
    let e = deferred().expect("an unknown pointer is reported");
    assert!(e.contains("not allocated by berth"), "{e}");
}

fn out_of_memory_raises_nothing_and_recovers() {
    let huge = 2 * CAPACITY as usize;
    assert_eq!(
        alloc(huge, 0),
        0,
        "no Python here: NULL instead of an exception"
    );
    assert_eq!(berth_torch_last_error_is_oom(), 1);
    let e = last_error();
    assert!(e.contains("out of memory"), "{e}");
    assert!(e.contains("Tried to allocate"), "{e}");
    assert!(stat("num_ooms") >= 1);
    let p = alloc(MIB, 0);
    assert_ne!(p, 0, "the next ordinary allocation succeeds");
    free(p, MIB, 0);
}

fn memory_fraction_caps_and_bad_fractions_are_reported() {
    berth_torch_set_memory_fraction(0.25, 0);
    assert!(deferred().is_none());
    assert_eq!(alloc(CAPACITY as usize / 2, 0), 0, "over the cap");
    assert_eq!(berth_torch_last_error_is_oom(), 1);
    berth_torch_set_memory_fraction(1.5, 0);
    let e = deferred().expect("a fraction above 1 is reported");
    assert!(e.contains("1.5"), "{e}");
    berth_torch_set_memory_fraction(1.0, 0);
    let p = alloc(CAPACITY as usize / 2, 0);
    assert_ne!(p, 0, "allowed again under the full device");
    free(p, CAPACITY as usize / 2, 0);
}

fn reset_returns_cached_memory() {
    let p = alloc(64 * MIB, 0);
    free(p, 64 * MIB, 0);
    assert!(
        stat("reserved_bytes.all.current") > 0,
        "freed memory stays cached"
    );
    berth_torch_reset();
    assert!(deferred().is_none());
    assert_eq!(
        stat("reserved_bytes.all.current"),
        0,
        "empty_cache returns it"
    );
}

fn bad_frees_are_reported_not_fatal() {
    let p = alloc(MIB, 0);
    free(p, MIB, 0);
    free(p, MIB, 0);
    let e = deferred().expect("a double free is reported");
    assert!(e.contains(&format!("{p:#x}")), "{e}");
    assert!(deferred().is_none(), "taken once");
    // The all-ones pointer (found by fuzzing: `paged` took it for a live block, as it marks
    // the free slots of its block table) is unknown to every policy.
    let ones = u64::MAX;
    berth_torch_record_stream(ones as usize as *mut c_void, stream(0x10));
    let e = deferred().expect("record_stream of an unknown pointer is reported");
    assert!(e.contains("0xffffffffffffffff"), "{e}");
    free(ones, MIB, 0);
    assert!(
        deferred().is_some(),
        "a free of an unknown pointer is reported"
    );
    assert_eq!(stat("allocated_bytes.all.current"), 0);
}

/// Autograd and DataLoader pin threads call the hooks at the same time.
fn many_threads() {
    let threads: Vec<_> = (0..8u64)
        .map(|t| {
            std::thread::spawn(move || {
                let s = 0x100 + t;
                let mut live: Vec<(u64, usize)> = Vec::new();
                let mut x = t * 7919 + 1;
                for _ in 0..2000 {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let size = 512 + (x >> 33) as usize % (4 * MIB);
                    let p = alloc(size, s);
                    assert_ne!(p, 0, "{}", last_error());
                    live.push((p, size));
                    if live.len() > 8 {
                        let (q, n) = live.swap_remove((x >> 20) as usize % live.len());
                        free(q, n, s);
                    }
                }
                for (q, n) in live {
                    free(q, n, s);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(deferred().is_none());
    assert_eq!(stat("allocated_bytes.all.current"), 0);
    assert!(stat("allocation.all.allocated") >= 16_000);
}
