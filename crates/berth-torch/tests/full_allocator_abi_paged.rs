//! The private-pool functions of the full allocator under `paged` over a simulated device, as
//! the C++ `CUDAAllocator` calls them for `torch.cuda.graph`, `torch.cuda.MemPool` /
//! `use_mem_pool` and CUDA-graph trees (`Note [Private pools in paged]` in berth-alloc; one
//! policy per test process: `Note [One allocator per process]`).

use berth_torch::abi::*;
use berth_torch::allocator_abi::*;
use berth_torch::ipc_abi::berth_torch_ipc_share;
use std::collections::BTreeMap;
use std::ffi::{c_char, c_void, CStr, CString};

const MIB: usize = 1 << 20;
const GRAPH: (u64, u64) = (3, 0);
const MEMPOOL: (u64, u64) = (0, 4);
const CAPTURE: u64 = 9;

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
    map.insert(key.to_string_lossy().into_owned(), value);
}

fn reserved() -> i64 {
    let mut map = BTreeMap::new();
    // SAFETY: `collect_stat` takes the map as its context.
    let rc = unsafe {
        berth_torch_visit_stats(
            0,
            Some(collect_stat),
            (&mut map as *mut BTreeMap<String, i64>).cast(),
        )
    };
    assert_eq!(rc, 0, "{}", last_error());
    map["reserved_bytes.all.current"]
}

/// (segment pool id, allocated block addresses) of every segment.
type Segments = Vec<((u64, u64), Vec<u64>)>;

unsafe extern "C" fn on_segment(ctx: *mut c_void, s: *const SnapshotSegment) {
    // SAFETY: `ctx` is the list passed below; `s` is valid during the call.
    let (seen, s) = unsafe { (&mut *ctx.cast::<Segments>(), *s) };
    seen.push(((s.pool_id0, s.pool_id1), Vec::new()));
}

unsafe extern "C" fn on_block(ctx: *mut c_void, b: *const SnapshotBlock) {
    // SAFETY: as `on_segment`.
    let (seen, b) = unsafe { (&mut *ctx.cast::<Segments>(), *b) };
    if b.allocated {
        seen.last_mut().unwrap().1.push(b.address);
    }
}

fn segments() -> Segments {
    let mut seen = Segments::new();
    let v = SnapshotVisitor {
        ctx: (&mut seen as *mut Segments).cast(),
        segment: Some(on_segment),
        block: Some(on_block),
        trace: None,
    };
    // SAFETY: the callbacks take `seen` as their context, alive for the call.
    let devices = unsafe { berth_torch_visit_snapshot(&v) };
    assert_eq!(devices, 1, "{}", last_error());
    seen
}

/// The length of the error a `void` hook could not report (0: none), cleared.
fn deferred_error() -> usize {
    // SAFETY: a null buffer of length 0 is never written.
    unsafe { berth_torch_take_deferred_error(std::ptr::null_mut(), 0) }
}

/// The pool of the segment holding the allocated block `addr`.
fn pool_of(addr: u64) -> Option<(u64, u64)> {
    segments()
        .into_iter()
        .find(|(_, blocks)| blocks.contains(&addr))
        .map(|(pool, _)| pool)
}

/// Accepts the capturing stream only.
unsafe extern "C" fn capture_only(_ctx: *mut c_void, s: u64) -> bool {
    s == CAPTURE
}

fn check_live(pool: (u64, u64), live: &[u64]) -> i32 {
    // SAFETY: `live` is valid for its length.
    unsafe { berth_torch_check_pool_live_allocations(0, pool.0, pool.1, live.as_ptr(), live.len()) }
}

#[test]
fn private_pools_under_paged_work_as_pytorch_calls_them() {
    assert_eq!(berth_torch_simulate(1 << 30), 0);
    let (p, o) = (CString::new("paged").unwrap(), CString::new("").unwrap());
    // SAFETY: both are NUL-terminated.
    assert_eq!(unsafe { berth_torch_install(p.as_ptr(), o.as_ptr()) }, 0);

    // A cached general block of the size the graph will ask for.
    let cached = berth_torch_try_alloc(4 * MIB, 0, stream(CAPTURE));
    assert!(!cached.is_null(), "{}", last_error());

    // What torch.multiprocessing shares of a pointer inside a block of mapped memory is that
    // block, not its whole segment (`getBaseAllocation`, then `shareIpcHandle`).
    let second = berth_torch_try_alloc(3 * MIB, 0, stream(CAPTURE));
    assert!(!second.is_null(), "{}", last_error());
    let mut size = 0u64;
    // SAFETY: `size` is a valid u64.
    let base =
        unsafe { berth_torch_base_allocation(second.cast::<u8>().add(4096).cast(), &mut size) };
    assert_eq!((base, size), (second as u64, 3 * MIB as u64));
    // A simulated device's memory is no driver mapping: nothing for berth to export (0), so
    // the C++ layer would try cudaIpcGetMemHandle.
    let (mut buf, mut at) = ([0u8; 64], 0u64);
    // SAFETY: `buf` and `at` are valid for the lengths given.
    let shared = unsafe { berth_torch_ipc_share(second, buf.as_mut_ptr(), buf.len(), &mut at) };
    assert_eq!(shared, 0);
    berth_torch_free(second, 3 * MIB, 0, stream(CAPTURE));
    berth_torch_free(cached, 4 * MIB, 0, stream(CAPTURE));

    // torch.cuda.graph: capture into the graph's pool on the capturing stream.
    // SAFETY: `capture_only` ignores its context; there is none to drop.
    let rc = unsafe {
        berth_torch_begin_allocate_to_pool(
            0,
            GRAPH.0,
            GRAPH.1,
            Some(capture_only),
            std::ptr::null_mut(),
            None,
        )
    };
    assert_eq!(rc, 0, "{}", last_error());
    assert_eq!(berth_torch_pool_use_count(0, GRAPH.0, GRAPH.1), 1);
    let out = berth_torch_try_alloc(4 * MIB, 0, stream(CAPTURE)) as u64;
    let tmp = berth_torch_try_alloc(MIB, 0, stream(CAPTURE)) as u64;
    let side = berth_torch_try_alloc(4 * MIB, 0, stream(5)) as u64;
    assert!(out != 0 && tmp != 0 && side != 0, "{}", last_error());
    assert_ne!(
        out, cached as u64,
        "the general cache does not serve the graph"
    );
    berth_torch_free(tmp as usize as *mut c_void, MIB, 0, stream(CAPTURE));
    assert_eq!(berth_torch_end_allocate_to_pool(0, GRAPH.0, GRAPH.1), 0);
    assert_eq!(pool_of(out), Some(GRAPH));
    assert_eq!(pool_of(side), Some((0, 0)));

    // CUDA-graph trees: the graph's live outputs are exactly `out`.
    assert_eq!(check_live(GRAPH, &[out]), 1, "{}", last_error());
    assert_eq!(check_live(GRAPH, &[out, side]), 0);
    assert_eq!(check_live(GRAPH, &[]), 0);

    // empty_cache keeps the pool in use: its pages stay mapped.
    berth_torch_reset();
    assert_eq!(deferred_error(), 0);
    let with_graph = reserved();
    assert!(with_graph >= 6 * MIB as i64, "{with_graph}");

    // torch.cuda.MemPool + use_mem_pool on the default stream.
    assert_eq!(
        berth_torch_create_or_incref_pool(0, MEMPOOL.0, MEMPOOL.1),
        0
    );
    // SAFETY: a null filter accepts every stream; no context.
    let rc = unsafe {
        berth_torch_begin_allocate_to_pool(
            0,
            MEMPOOL.0,
            MEMPOOL.1,
            None,
            std::ptr::null_mut(),
            None,
        )
    };
    assert_eq!(rc, 0, "{}", last_error());
    assert_eq!(berth_torch_pool_use_count(0, MEMPOOL.0, MEMPOOL.1), 2);
    let m = berth_torch_try_alloc(MIB, 0, stream(0)) as u64;
    assert_ne!(m, 0, "{}", last_error());
    assert_eq!(berth_torch_end_allocate_to_pool(0, MEMPOOL.0, MEMPOOL.1), 0);
    assert_eq!(berth_torch_release_pool(0, MEMPOOL.0, MEMPOOL.1), 0);
    assert_eq!(pool_of(m), Some(MEMPOOL));
    assert_eq!(reserved(), with_graph + 2 * MIB as i64, "one 2 MiB page");
    // MemPool's destructor: release, then empty the pool's cache; the pool is then gone.
    berth_torch_free(m as usize as *mut c_void, MIB, 0, stream(0));
    assert_eq!(berth_torch_release_pool(0, MEMPOOL.0, MEMPOOL.1), 0);
    assert_eq!(berth_torch_empty_pool_cache(0, MEMPOOL.0, MEMPOOL.1), 0);
    assert_eq!(reserved(), with_graph);
    assert_eq!(berth_torch_pool_use_count(0, MEMPOOL.0, MEMPOOL.1), 0);
    assert_eq!(berth_torch_empty_pool_cache(0, MEMPOOL.0, MEMPOOL.1), -1);
    assert!(last_error().contains("no such pool"), "{}", last_error());

    // The graph is destroyed: its output dies, its use is given back, its memory goes.
    berth_torch_free(out as usize as *mut c_void, 4 * MIB, 0, stream(CAPTURE));
    berth_torch_free(side as usize as *mut c_void, 4 * MIB, 0, stream(5));
    assert_eq!(berth_torch_release_pool(0, GRAPH.0, GRAPH.1), 0);
    assert_eq!(berth_torch_pool_use_count(0, GRAPH.0, GRAPH.1), 0);
    berth_torch_reset();
    assert_eq!(deferred_error(), 0);
    assert_eq!(reserved(), 0);
    assert!(segments().is_empty());
    // Unknown pools are typed errors.
    assert_eq!(berth_torch_release_pool(0, GRAPH.0, GRAPH.1), -1);
    assert!(
        last_error().contains("private pool (3, 0)"),
        "{}",
        last_error()
    );
}
