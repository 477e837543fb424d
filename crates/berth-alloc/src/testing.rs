//! A conformance suite every [`DeviceAllocator`] must pass, whatever its policy and backend
//! (RMM's `mr_ref_test`). Behind the `testing` feature.
//!
//! Each check takes a factory `capacity_bytes → allocator over a fresh device of that capacity`
//! and panics with a message naming the violated property.
//!
//! ```
//! use std::sync::Arc;
//! use berth_alloc::{backend::sim::SimBackend, caching::CachingAllocator, testing, DeviceAllocator};
//! testing::conformance(&|cap| Arc::new(CachingAllocator::new(SimBackend::new(cap))) as Arc<dyn DeviceAllocator>);
//! ```

use std::sync::Arc;

use crate::allocator::DeviceAllocator;
use crate::backend::{DevicePtr, StreamId};
use crate::error::AllocError;

/// Builds a fresh allocator over a device of the given capacity in bytes.
pub type Factory<'a> = &'a dyn Fn(u64) -> Arc<dyn DeviceAllocator>;

const GIB: u64 = 1 << 30;

/// Runs every check.
///
/// # Panics
/// When the allocator violates a property (the message names it).
pub fn conformance(factory: Factory<'_>) {
    distinct_pointers(factory);
    alignment(factory);
    zero_size(factory);
    oom_surfaces_and_recovers(factory);
    empty_cache_releases_all(factory);
    bad_frees_are_typed(factory);
    multithreaded(factory);
}

/// Marsaglia's xorshift64 (shifts 13, 7, 17) from `seed` (non-zero): the deterministic
/// pseudo-random `u64`s of berth-alloc's tests and benches.
pub fn xorshift(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// One request of [`churn`]: its size in bytes, its stream, and after how many later requests
/// it is freed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChurnOp {
    /// Bytes requested.
    pub bytes: usize,
    /// The stream it is allocated on (`StreamId(0)` or `StreamId(stream_b)`, see [`churn`]).
    pub stream: StreamId,
    /// It is freed just before request `index + lifetime` (1 to 40).
    pub lifetime: usize,
}

/// A deterministic churn of `n` requests (xorshift from `seed`): six in ten of 512 B to
/// 1 MiB, three in ten of 1 to 25 MiB, one in ten of 32 to 192 MiB; half on the default
/// stream and half on `stream_b`, each freed after 1 to 40 later requests. The same
/// sequence serves every pass of [`run_churn`].
pub fn churn(seed: u64, n: usize, stream_b: StreamId) -> Vec<ChurnOp> {
    const MIB: usize = 1 << 20;
    let mut next = xorshift(seed | 1);
    (0..n)
        .map(|_| {
            let r = next() as usize;
            let bytes = match r % 10 {
                0..=5 => 512 + r % MIB,
                6..=8 => (1 + (r >> 8) % 24) * MIB + (r >> 16) % MIB,
                _ => (32 + (r >> 8) % 160) * MIB,
            };
            let stream = if (r >> 40).is_multiple_of(2) {
                StreamId::DEFAULT
            } else {
                stream_b
            };
            ChurnOp {
                bytes,
                stream,
                lifetime: 1 + (r >> 32) % 40,
            }
        })
        .collect()
}

/// Runs `passes` passes of `ops` on `alloc` and then `empty_cache`, asserting after every
/// operation that the policy's reserved bytes (`reserved_bytes.all.current`) equal
/// `device_used()`: the device memory held for this allocator as the device sees it (the
/// simulator's used bytes; on a GPU, `cuMemGetInfo`'s used bytes minus those before the
/// allocator existed). Returns the peak of `device_used()` in each pass.
///
/// # Panics
/// When the two differ (the message names the operation), when an allocation fails, or when
/// `empty_cache` leaves reserved bytes.
pub fn run_churn(
    alloc: &dyn DeviceAllocator,
    device_used: &dyn Fn() -> u64,
    ops: &[ChurnOp],
    passes: usize,
) -> Vec<u64> {
    let policy = alloc.policy_name().to_owned();
    let check = |what: &dyn Fn() -> String| {
        let reserved = alloc.stats().memory_reserved();
        let used = device_used();
        assert_eq!(
            reserved,
            used,
            "{policy}: reserved {reserved} differs from the device's {used} used bytes after {}",
            what()
        );
        used
    };
    let mut peaks = Vec::new();
    for pass in 0..passes {
        let mut peak = 0;
        let mut live: Vec<(usize, DevicePtr)> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            while let Some(k) = live.iter().position(|&(due, _)| due <= i) {
                let (_, p) = live.swap_remove(k);
                alloc.raw_delete(p).expect("a live pointer frees");
                peak = peak.max(check(&|| {
                    format!("a free before request {i} of pass {pass}")
                }));
            }
            let p = alloc
                .raw_alloc(op.bytes, op.stream)
                .unwrap_or_else(|e| panic!("{policy}: request {i} of pass {pass}: {e}"));
            live.push((i + op.lifetime, p));
            peak = peak.max(check(&|| format!("request {i} of pass {pass}")));
        }
        for (_, p) in live {
            alloc.raw_delete(p).expect("a live pointer frees");
            peak = peak.max(check(&|| format!("the last frees of pass {pass}")));
        }
        peaks.push(peak);
    }
    alloc.empty_cache().expect("empty_cache");
    assert_eq!(
        check(&|| "empty_cache".to_owned()),
        0,
        "{policy}: empty_cache gives every byte back"
    );
    peaks
}

/// A deterministic size sequence (xorshift), 1 byte to 24 MiB.
fn sizes(n: usize, seed: u64) -> Vec<usize> {
    let mut next = xorshift(seed | 1);
    (0..n)
        .map(|_| {
            let x = next();
            let class = x % 4;
            let limit = [4096, 1 << 20, 8 << 20, 24 << 20][class as usize];
            (x >> 8) as usize % limit + 1
        })
        .collect()
}

/// Live allocations never overlap.
///
/// # Panics
/// On overlap or allocation failure.
pub fn distinct_pointers(factory: Factory<'_>) {
    let a = factory(4 * GIB);
    let mut live: Vec<(u64, u64)> = Vec::new();
    let mut keep = Vec::new();
    for (k, size) in sizes(300, 7).into_iter().enumerate() {
        let al = a
            .allocate(size, StreamId((k % 2) as u64))
            .expect("allocation within capacity");
        live.push((al.ptr().0, size as u64));
        keep.push(al);
        if k % 3 == 0 {
            keep.swap_remove(k % keep.len());
            live.swap_remove(k % live.len());
        }
        let s = a.stats();
        assert_eq!(
            a.allocated_and_reserved(),
            (s.memory_allocated(), s.memory_reserved()),
            "allocated_and_reserved() disagrees with stats() after allocation {k}"
        );
        assert!(s.memory_reserved() >= s.memory_allocated());
    }
    live.sort_unstable();
    for w in live.windows(2) {
        assert!(
            w[0].0 + w[0].1 <= w[1].0,
            "allocations {:#x}+{} and {:#x} overlap",
            w[0].0,
            w[0].1,
            w[1].0
        );
    }
}

/// Every pointer is at least 256-byte aligned (`cudaMalloc`'s guarantee).
///
/// # Panics
/// On a misaligned pointer.
pub fn alignment(factory: Factory<'_>) {
    let a = factory(4 * GIB);
    for size in sizes(100, 11) {
        let al = a
            .allocate(size, StreamId::DEFAULT)
            .expect("allocation within capacity");
        assert_eq!(
            al.ptr().0 % 256,
            0,
            "pointer {} for {size} bytes is not 256-byte aligned",
            al.ptr()
        );
    }
}

/// Zero bytes: a null pointer and no memory (PyTorch).
///
/// # Panics
/// If a zero-byte request takes memory.
pub fn zero_size(factory: Factory<'_>) {
    let a = factory(GIB);
    let z = a
        .allocate(0, StreamId::DEFAULT)
        .expect("zero bytes always succeed");
    assert!(
        z.ptr().is_null(),
        "zero-byte allocation returned {}",
        z.ptr()
    );
    assert_eq!(a.stats().memory_allocated(), 0);
    assert_eq!(a.stats().memory_reserved(), 0);
    drop(z);
    a.check_err()
        .expect("dropping a zero-byte allocation is fine");
}

/// Asking for more than the device has is a typed OOM, and the allocator keeps working.
///
/// # Panics
/// If the error is not an OOM or the allocator is unusable afterwards.
pub fn oom_surfaces_and_recovers(factory: Factory<'_>) {
    let a = factory(GIB);
    let held = a
        .allocate(600 << 20, StreamId::DEFAULT)
        .expect("600 MiB fit in 1 GiB");
    let err = a
        .allocate(600 << 20, StreamId::DEFAULT)
        .expect_err("1.2 GiB cannot fit in 1 GiB");
    assert!(
        err.is_out_of_memory(),
        "expected an out-of-memory error, got {err:?}"
    );
    assert!(!err.to_string().is_empty());
    assert_eq!(a.stats().num_ooms, 1, "num_ooms counts the failure");
    drop(held);
    let again = a
        .allocate(600 << 20, StreamId::DEFAULT)
        .expect("usable after OOM");
    drop(again);
    a.check_err().expect("no sticky error");
}

/// Freeing everything then `empty_cache` leaves nothing reserved.
///
/// # Panics
/// If memory stays reserved.
pub fn empty_cache_releases_all(factory: Factory<'_>) {
    let a = factory(4 * GIB);
    let live: Vec<_> = sizes(200, 3)
        .into_iter()
        .enumerate()
        .map(|(k, s)| {
            a.allocate(s, StreamId((k % 3) as u64))
                .expect("within capacity")
        })
        .collect();
    assert!(a.stats().memory_reserved() >= a.stats().memory_allocated());
    drop(live);
    assert_eq!(a.stats().memory_allocated(), 0);
    a.empty_cache().expect("empty_cache");
    assert_eq!(
        a.stats().memory_reserved(),
        0,
        "reserved after freeing everything and empty_cache"
    );
}

/// Double free and foreign pointers are typed errors and change nothing.
///
/// # Panics
/// If they are accepted or corrupt the state.
pub fn bad_frees_are_typed(factory: Factory<'_>) {
    let a = factory(GIB);
    let p = a
        .raw_alloc(4096, StreamId::DEFAULT)
        .expect("within capacity");
    let keep = a
        .raw_alloc(4096, StreamId::DEFAULT)
        .expect("within capacity");
    a.raw_delete(p).expect("first free");
    let before = a.stats();
    let e = a.raw_delete(p).expect_err("double free must fail");
    assert!(
        matches!(
            e,
            AllocError::DoubleFree { .. } | AllocError::InvalidPointer { .. }
        ),
        "{e:?}"
    );
    let e = a
        .raw_delete(DevicePtr(0xdead_0000))
        .expect_err("foreign pointer must fail");
    assert!(matches!(e, AllocError::InvalidPointer { .. }), "{e:?}");
    assert_eq!(a.stats(), before, "failed frees changed the statistics");
    a.raw_delete(keep).expect("the other block is intact");
}

/// Four threads allocating and freeing concurrently leave consistent state.
///
/// # Panics
/// On any failure or leak.
pub fn multithreaded(factory: Factory<'_>) {
    let a = factory(8 * GIB);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let a = &a;
            s.spawn(move || {
                let mut live = Vec::new();
                for (k, size) in sizes(400, 100 + t).into_iter().enumerate() {
                    live.push(a.allocate(size, StreamId(t % 2)).expect("within capacity"));
                    if k % 2 == 1 {
                        live.swap_remove((k * 7) % live.len());
                    }
                }
            });
        }
    });
    assert_eq!(
        a.stats().memory_allocated(),
        0,
        "allocated after all threads freed everything"
    );
    a.empty_cache().expect("empty_cache");
    assert_eq!(a.stats().memory_reserved(), 0);
    a.check_err().expect("no sticky error");
}
