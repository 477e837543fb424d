//! The C functions of the full allocator (`berth_torch::allocator_abi`) as the C++
//! `CUDAAllocator` calls them, under the `pytorch` policy over a simulated device (one policy
//! per test process: `Note [One allocator per process]`).

use berth_torch::abi::*;
use berth_torch::allocator_abi::*;
use std::collections::BTreeMap;
use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::atomic::{AtomicUsize, Ordering};

const MIB: usize = 1 << 20;
const POOL: (u64, u64) = (0, 7);

fn stream(s: u64) -> *mut c_void {
    s as usize as *mut c_void
}

fn last_error() -> String {
    let mut buf = vec![0u8; 1024];
    // SAFETY: `buf` is valid for its length.
    let n = unsafe { berth_torch_last_error(buf.as_mut_ptr().cast(), buf.len()) };
    buf.truncate(n.min(1023));
    String::from_utf8(buf).unwrap()
}

unsafe extern "C" fn collect_stat(ctx: *mut c_void, key: *const c_char, value: i64) {
    // SAFETY: `ctx` is the map passed below; `key` is a valid C string during the call.
    let (map, key) = unsafe {
        (
            &mut *ctx.cast::<BTreeMap<String, i64>>(),
            CStr::from_ptr(key),
        )
    };
    let key = key.to_string_lossy().into_owned();
    map.insert(key, value);
}

fn stats() -> BTreeMap<String, i64> {
    let mut map = BTreeMap::new();
    // SAFETY: `collect_stat` takes the map as its context.
    let rc = unsafe {
        berth_torch_visit_stats(
            0,
            Some(collect_stat),
            (&mut map as *mut BTreeMap<_, _>).cast(),
        )
    };
    assert_eq!(rc, 0, "{}", last_error());
    map
}

#[derive(Default)]
struct Seen {
    segments: Vec<(SnapshotSegment, Vec<SnapshotBlock>)>,
    traces: Vec<(String, u64, u64)>,
}

unsafe extern "C" fn on_segment(ctx: *mut c_void, s: *const SnapshotSegment) {
    // SAFETY: `ctx` is the `Seen` passed below; `s` is valid during the call.
    let (seen, s) = unsafe { (&mut *ctx.cast::<Seen>(), *s) };
    seen.segments.push((s, Vec::new()));
}

unsafe extern "C" fn on_block(ctx: *mut c_void, b: *const SnapshotBlock) {
    // SAFETY: as `on_segment`.
    let (seen, b) = unsafe { (&mut *ctx.cast::<Seen>(), *b) };
    seen.segments.last_mut().unwrap().1.push(b);
}

unsafe extern "C" fn on_trace(ctx: *mut c_void, t: *const SnapshotTrace) {
    // SAFETY: as `on_segment`; `action` is a valid C string during the call.
    let (seen, t) = unsafe { (&mut *ctx.cast::<Seen>(), &*t) };
    // SAFETY: `action` is a valid C string during the call.
    let action = unsafe { CStr::from_ptr(t.action) };
    let action = action.to_string_lossy().into_owned();
    seen.traces.push((action, t.addr, t.size));
}

fn snapshot() -> Seen {
    let mut seen = Seen::default();
    let v = SnapshotVisitor {
        ctx: (&mut seen as *mut Seen).cast(),
        segment: Some(on_segment),
        block: Some(on_block),
        trace: Some(on_trace),
    };
    // SAFETY: the callbacks take `seen` as their context, alive for the call.
    let devices = unsafe { berth_torch_visit_snapshot(&v) };
    assert_eq!(devices, 1, "{}", last_error());
    seen
}

static FILTER_CALLS: AtomicUsize = AtomicUsize::new(0);
static FILTER_DROPS: AtomicUsize = AtomicUsize::new(0);

/// Accepts stream `*ctx` only.
unsafe extern "C" fn only_stream(ctx: *mut c_void, s: u64) -> bool {
    FILTER_CALLS.fetch_add(1, Ordering::SeqCst);
    // SAFETY: `ctx` is the boxed stream id below, alive until `drop_stream`.
    s == unsafe { *ctx.cast::<u64>() }
}

unsafe extern "C" fn drop_stream(ctx: *mut c_void) {
    FILTER_DROPS.fetch_add(1, Ordering::SeqCst);
    // SAFETY: `ctx` came from `Box::into_raw` and is dropped once.
    drop(unsafe { Box::from_raw(ctx.cast::<u64>()) });
}

#[test]
fn the_full_allocator_abi_under_the_pytorch_policy() {
    // Nothing installed: every call fails cleanly.
    assert_eq!(
        // SAFETY: the pointers passed are valid for the lengths given, or null.
        unsafe { berth_torch_visit_stats(0, Some(collect_stat), std::ptr::null_mut()) },
        -1
    );
    assert_eq!(berth_torch_pool_use_count(0, 0, 7), -1);
    assert_eq!(berth_torch_create_or_incref_pool(0, 0, 7), -1);
    assert!(last_error().contains("not installed"), "{}", last_error());

    assert_eq!(berth_torch_simulate(1 << 30), 0);
    let (p, o) = (CString::new("pytorch").unwrap(), CString::new("").unwrap());
    // SAFETY: both are NUL-terminated.
    assert_eq!(unsafe { berth_torch_install(p.as_ptr(), o.as_ptr()) }, 0);
    // Before the first allocation: no statistics, no segments, no cached block.
    assert!(stats().is_empty());
    assert_eq!(berth_torch_largest_cached_block(0), 0);

    // History, then a 3 MiB allocation and a free on stream 5.
    assert_eq!(berth_torch_record_history(0, 1000), 0);
    let a = berth_torch_try_alloc(3 * MIB, 0, stream(5)) as u64;
    assert_ne!(a, 0, "{}", last_error());
    let s = stats();
    assert_eq!(s["allocated_bytes.all.current"], 3 * MIB as i64);
    assert_eq!(
        s["reserved_bytes.all.current"],
        20 * MIB as i64,
        "a 20 MiB large segment"
    );
    let seen = snapshot();
    assert_eq!(seen.segments.len(), 1);
    let (seg, blocks) = &seen.segments[0];
    assert_eq!(
        (seg.total_size, seg.allocated_size, seg.stream),
        (20 << 20, 3 << 20, 5)
    );
    assert!(seg.is_large && !seg.is_expandable);
    assert_eq!(
        (seg.pool_id0, seg.pool_id1, seg.blocks),
        (0, 0, blocks.len())
    );
    assert_eq!(blocks[0].address, a);
    assert!(blocks[0].allocated && blocks[0].active);
    assert!(!blocks[1].allocated && !blocks[1].active);
    let actions: Vec<&str> = seen.traces.iter().map(|t| t.0.as_str()).collect();
    assert_eq!(
        actions,
        ["segment_alloc", "alloc"],
        "the snapshot's own event comes after"
    );
    assert_eq!(seen.traces[1].1, a);
    // The base of an address inside the allocation is the segment's start.
    let mut size = 0u64;
    // SAFETY: `size` is a valid u64.
    let base =
        unsafe { berth_torch_base_allocation((a + 4096) as usize as *mut c_void, &mut size) };
    assert_eq!((base, size), (seg.address, 20 << 20));
    assert_eq!(
        // SAFETY: the pointers passed are valid for the lengths given, or null.
        unsafe { berth_torch_base_allocation(8 as *mut c_void, &mut size) },
        0
    );
    berth_torch_free(a as usize as *mut c_void, 3 * MIB, 0, stream(5));
    assert_eq!(berth_torch_largest_cached_block(0), 20 << 20);

    // Peaks reset to the current values; accumulated counters to zero.
    assert_eq!(stats()["allocated_bytes.all.peak"], 3 * MIB as i64);
    assert_eq!(berth_torch_reset_peak_stats(0), 0);
    assert_eq!(stats()["allocated_bytes.all.peak"], 0);
    assert_eq!(berth_torch_reset_accumulated_stats(0), 0);
    assert_eq!(stats()["allocation.all.allocated"], 0);

    // A private pool, as torch.cuda.MemPool + use_mem_pool on stream 9.
    assert_eq!(berth_torch_create_or_incref_pool(0, POOL.0, POOL.1), 0);
    assert_eq!(berth_torch_pool_use_count(0, POOL.0, POOL.1), 1);
    let ctx = Box::into_raw(Box::new(9u64)).cast::<c_void>();
    // SAFETY: `only_stream` and `drop_stream` take the boxed id.
    let rc = unsafe {
        berth_torch_begin_allocate_to_pool(
            0,
            POOL.0,
            POOL.1,
            Some(only_stream),
            ctx,
            Some(drop_stream),
        )
    };
    assert_eq!(rc, 0, "{}", last_error());
    assert_eq!(berth_torch_pool_use_count(0, POOL.0, POOL.1), 2);
    let in_pool = berth_torch_try_alloc(MIB, 0, stream(9)) as u64;
    let outside = berth_torch_try_alloc(MIB, 0, stream(5)) as u64;
    assert!(in_pool != 0 && outside != 0, "{}", last_error());
    assert!(
        FILTER_CALLS.load(Ordering::SeqCst) >= 2,
        "the filter decides each request"
    );
    assert_eq!(berth_torch_end_allocate_to_pool(0, POOL.0, POOL.1), 0);
    assert_eq!(
        FILTER_DROPS.load(Ordering::SeqCst),
        1,
        "the filter is let go at the end"
    );
    let pools: Vec<(u64, u64, u64)> = snapshot()
        .segments
        .iter()
        .flat_map(|(s, b)| {
            b.iter()
                .filter(|b| b.allocated)
                .map(move |b| (b.address, s.pool_id0, s.pool_id1))
        })
        .collect();
    assert!(pools.contains(&(in_pool, POOL.0, POOL.1)), "{pools:?}");
    assert!(pools.contains(&(outside, 0, 0)), "{pools:?}");
    // CUDA-graph trees' check: exactly the live set of the pool.
    let live = [in_pool];
    // SAFETY: `live` has one element.
    assert_eq!(
        // SAFETY: the pointers passed are valid for the lengths given, or null.
        unsafe { berth_torch_check_pool_live_allocations(0, POOL.0, POOL.1, live.as_ptr(), 1) },
        1
    );
    assert_eq!(
        // SAFETY: the pointers passed are valid for the lengths given, or null.
        unsafe { berth_torch_check_pool_live_allocations(0, POOL.0, POOL.1, std::ptr::null(), 0) },
        0
    );
    let both = [in_pool, outside];
    assert_eq!(
        // SAFETY: the pointers passed are valid for the lengths given, or null.
        unsafe { berth_torch_check_pool_live_allocations(0, POOL.0, POOL.1, both.as_ptr(), 2) },
        0
    );
    // CUDA-graph trees' restore: to an empty checkpoint (the block is freed), back to one
    // holding the block (it comes back at its address), and a checkpoint with a block outside
    // the pool (refused, nothing changed).
    let size = snapshot()
        .segments
        .iter()
        .flat_map(|(_, b)| b.iter())
        .find(|b| b.allocated && b.address == in_pool)
        .map(|b| b.size)
        .unwrap();
    // SAFETY: a null pointer with 0 pairs.
    let emptied = unsafe { berth_torch_restore_pool(0, POOL.0, POOL.1, std::ptr::null(), 0) };
    assert_eq!(emptied, 0, "{}", last_error());
    // SAFETY: the pointers passed are valid for the lengths given, or null.
    let none =
        unsafe { berth_torch_check_pool_live_allocations(0, POOL.0, POOL.1, live.as_ptr(), 0) };
    assert_eq!(none, 1, "the pool holds nothing after the empty checkpoint");
    let checkpoint = [in_pool, size];
    // SAFETY: one pair.
    let restored = unsafe { berth_torch_restore_pool(0, POOL.0, POOL.1, checkpoint.as_ptr(), 1) };
    assert_eq!(restored, 0, "{}", last_error());
    assert_eq!(
        // SAFETY: the pointers passed are valid for the lengths given, or null.
        unsafe { berth_torch_check_pool_live_allocations(0, POOL.0, POOL.1, live.as_ptr(), 1) },
        1
    );
    let foreign = [outside, MIB as u64];
    // SAFETY: one pair.
    let refused = unsafe { berth_torch_restore_pool(0, POOL.0, POOL.1, foreign.as_ptr(), 1) };
    assert_eq!(refused, -1);
    assert!(
        last_error().contains("not in the pool's memory"),
        "{}",
        last_error()
    );
    assert_eq!(
        // SAFETY: the pointers passed are valid for the lengths given, or null.
        unsafe { berth_torch_check_pool_live_allocations(0, POOL.0, POOL.1, live.as_ptr(), 1) },
        1
    );
    // Unknown pools are typed errors.
    assert_eq!(berth_torch_release_pool(0, 0, 99), -1);
    assert!(last_error().contains("99"), "{}", last_error());
    assert_eq!(berth_torch_pool_use_count(0, 0, 99), 0);
    // Release both uses; the pool's segment goes back on its emptyCache.
    berth_torch_free(in_pool as usize as *mut c_void, MIB, 0, stream(9));
    assert_eq!(berth_torch_release_pool(0, POOL.0, POOL.1), 0);
    assert_eq!(berth_torch_release_pool(0, POOL.0, POOL.1), 0);
    assert_eq!(berth_torch_pool_use_count(0, POOL.0, POOL.1), 0);
    let reserved = stats()["reserved_bytes.all.current"];
    assert_eq!(
        berth_torch_empty_pool_cache(0, POOL.0, POOL.1),
        0,
        "{}",
        last_error()
    );
    assert_eq!(
        stats()["reserved_bytes.all.current"],
        reserved - 2 * MIB as i64
    );
    assert!(snapshot()
        .segments
        .iter()
        .all(|(s, _)| (s.pool_id0, s.pool_id1) == (0, 0)));

    // A null filter accepts every stream, and its context is let go at once.
    let ctx = Box::into_raw(Box::new(0u64)).cast::<c_void>();
    // SAFETY: `drop_stream` takes the boxed id.
    assert_eq!(
        // SAFETY: the pointers passed are valid for the lengths given, or null.
        unsafe { berth_torch_begin_allocate_to_pool(0, 0, 8, None, ctx, Some(drop_stream)) },
        0
    );
    assert_eq!(FILTER_DROPS.load(Ordering::SeqCst), 2);
    let p = berth_torch_try_alloc(MIB, 0, stream(3)) as u64;
    assert_eq!(berth_torch_end_allocate_to_pool(0, 0, 8), 0);
    assert!(snapshot()
        .segments
        .iter()
        .any(|(s, b)| s.pool_id1 == 8 && b.iter().any(|b| b.address == p)));
    berth_torch_free(p as usize as *mut c_void, MIB, 0, stream(3));
    berth_torch_free(outside as usize as *mut c_void, MIB, 0, stream(5));
    assert_eq!(berth_torch_record_history(0, -1), 0);
    assert!(snapshot().traces.is_empty(), "stopping clears the history");
}
