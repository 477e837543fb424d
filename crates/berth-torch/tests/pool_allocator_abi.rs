//! `berth_torch_create_pool_with_allocator` as the C++ `createOrIncrefPool` calls it for
//! `torch.cuda.MemPool(allocator=...)`, under the `pytorch` policy over a simulated device (one
//! policy per test process: `Note [One allocator per process]`): the pool's segments come from
//! the C callbacks and go back to them, and the context is dropped once, also on failure.

use berth_torch::abi::*;
use berth_torch::allocator_abi::*;
use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

const MIB: usize = 1 << 20;
const POOL: (u64, u64) = (0, 11);

/// The pool allocator's state: the next address (below the simulator's first, 1 << 40), what
/// it handed out and took back.
struct OwnAllocator {
    next: AtomicU64,
    allocs: AtomicUsize,
    frees: AtomicUsize,
    live_bytes: AtomicU64,
}

static DROPS: AtomicUsize = AtomicUsize::new(0);
/// Frees of every pool allocator (readable after the allocator is dropped).
static FREES: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn own_alloc(ctx: *mut c_void, bytes: u64) -> u64 {
    // SAFETY: `ctx` is the boxed allocator, alive until `own_drop`.
    let own = unsafe { &*ctx.cast::<OwnAllocator>() };
    own.allocs.fetch_add(1, Ordering::SeqCst);
    own.live_bytes.fetch_add(bytes, Ordering::SeqCst);
    own.next.fetch_add(bytes, Ordering::SeqCst)
}

unsafe extern "C" fn own_free(ctx: *mut c_void, _ptr: u64) {
    // SAFETY: as in `own_alloc`.
    let own = unsafe { &*ctx.cast::<OwnAllocator>() };
    own.frees.fetch_add(1, Ordering::SeqCst);
    FREES.fetch_add(1, Ordering::SeqCst);
}

unsafe extern "C" fn own_drop(ctx: *mut c_void) {
    DROPS.fetch_add(1, Ordering::SeqCst);
    // SAFETY: `ctx` came from `Box::into_raw` and is dropped once.
    drop(unsafe { Box::from_raw(ctx.cast::<OwnAllocator>()) });
}

fn new_own() -> *mut OwnAllocator {
    Box::into_raw(Box::new(OwnAllocator {
        next: AtomicU64::new(1 << 36),
        allocs: AtomicUsize::new(0),
        frees: AtomicUsize::new(0),
        live_bytes: AtomicU64::new(0),
    }))
}

fn create(pool: (u64, u64), own: *mut OwnAllocator) -> i32 {
    // SAFETY: the callbacks take the boxed allocator, callable from any thread until dropped.
    unsafe {
        berth_torch_create_pool_with_allocator(
            0,
            pool.0,
            pool.1,
            own_alloc,
            own_free,
            own.cast(),
            Some(own_drop),
        )
    }
}

#[test]
fn a_mempool_with_its_own_allocator_through_the_c_functions() {
    // Nothing installed: the call fails and the context is dropped at once.
    assert_eq!(create(POOL, new_own()), -1);
    assert_eq!(DROPS.load(Ordering::SeqCst), 1);

    assert_eq!(berth_torch_simulate(1 << 30), 0);
    let (p, o) = (CString::new("pytorch").unwrap(), CString::new("").unwrap());
    // SAFETY: both are NUL-terminated.
    assert_eq!(unsafe { berth_torch_install(p.as_ptr(), o.as_ptr()) }, 0);

    let own = new_own();
    assert_eq!(create(POOL, own), 0);
    assert_eq!(berth_torch_pool_use_count(0, POOL.0, POOL.1), 1);
    // with torch.cuda.use_mem_pool(pool): every stream (a null filter).
    // SAFETY: a null filter and context.
    let began = unsafe {
        berth_torch_begin_allocate_to_pool(0, POOL.0, POOL.1, None, std::ptr::null_mut(), None)
    };
    assert_eq!(began, 0);
    let ptr = berth_torch_try_alloc(3 * MIB, 0, std::ptr::null_mut());
    assert!(!ptr.is_null());
    // SAFETY: `own` is alive: the pool holds it.
    let (allocs, live) = unsafe {
        (
            (*own).allocs.load(Ordering::SeqCst),
            (*own).live_bytes.load(Ordering::SeqCst),
        )
    };
    assert_eq!((allocs, live), (1, 20 * MIB as u64), "one 20 MiB segment");
    assert_eq!(
        ptr as u64,
        1 << 36,
        "the block is at the start of the pool's segment"
    );
    berth_torch_free(ptr, 3 * MIB, 0, std::ptr::null_mut());
    assert_eq!(berth_torch_end_allocate_to_pool(0, POOL.0, POOL.1), 0);
    // A second creation of the same pool with an allocator fails and drops its context.
    assert_eq!(create(POOL, new_own()), -1);
    assert_eq!(DROPS.load(Ordering::SeqCst), 2);
    // use_mem_pool's exit and ~MemPool give back their uses; emptyCache(pool) returns the
    // segment to the pool's allocator, and berth lets go of it.
    assert_eq!(berth_torch_release_pool(0, POOL.0, POOL.1), 0);
    // SAFETY: `own` is alive until the pool is forgotten.
    assert_eq!(unsafe { (*own).frees.load(Ordering::SeqCst) }, 0);
    assert_eq!(berth_torch_release_pool(0, POOL.0, POOL.1), 0);
    // ~MemPool's emptyCache(id) walks every device (-1), as PyTorch's: a device without the
    // pool is no error.
    assert_eq!(berth_torch_empty_pool_cache(-1, 0, 999), 0);
    assert_eq!(berth_torch_empty_pool_cache(0, 0, 999), -1);
    assert_eq!(berth_torch_empty_pool_cache(-1, POOL.0, POOL.1), 0);
    assert_eq!(
        FREES.load(Ordering::SeqCst),
        1,
        "the segment went back to the pool's allocator"
    );
    assert_eq!(
        DROPS.load(Ordering::SeqCst),
        3,
        "dropped once the pool is forgotten"
    );
}
