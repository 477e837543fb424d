//! Sleep and wake through the per-device registry (`berth_cuda::sleep`, what `berth_torch`
//! calls) over a simulated device with the `paged` policy: a tag's pages go back, an offloaded
//! tag's bytes come back at the same address, an allocation in a sleeping tag is refused naming
//! it, and the figures say what sleeps. One policy per test process (`Note [One allocator
//! registry]`), so this file holds one test.

use berth_alloc::{AllocError, AllocatorConfig, StreamId};
use berth_cuda::memory::{self, simulated_backend};
use berth_cuda::sleep::{self, TagGuard};
use berth_cuda::CudaError;

const MIB: usize = 1 << 20;

#[test]
fn sleep_and_wake_through_the_registry() {
    memory::configure(AllocatorConfig::parse("backend:paged").unwrap()).unwrap();
    memory::simulate(8 << 30).unwrap();
    let a = memory::allocator(0).unwrap();
    let s = StreamId::DEFAULT;
    let weights = {
        let _t = TagGuard::new("weights").unwrap();
        a.allocate(64 * MIB, s).unwrap()
    };
    let kv = {
        let _t = TagGuard::new("kv_cache").unwrap();
        a.allocate(256 * MIB, s).unwrap()
    };
    let untagged = a.allocate(MIB, s).unwrap();
    let sim = simulated_backend(0).unwrap();
    sim.write_bytes(weights.ptr(), b"weights survive").unwrap();
    let reserved = a.stats().memory_reserved();

    let slept = sleep::sleep(0, &["weights", "kv_cache"], &["weights"]).unwrap();
    assert!(slept.released_bytes >= 320 * MIB as u64, "{slept:?}");
    assert_eq!(
        a.stats().memory_reserved(),
        reserved - slept.released_bytes,
        "what sleeps is no longer reserved"
    );
    let st = sleep::sleep_stats(0).unwrap();
    assert_eq!(st.sleeping_tags, vec!["kv_cache", "weights"]);
    assert_eq!(st.sleeping_bytes, slept.released_bytes);
    assert_eq!(st.offloaded_bytes, 64 * MIB as u64);

    // A sleeping tag takes no new allocation, and says which tag.
    let refused = {
        let _t = TagGuard::new("kv_cache").unwrap();
        a.allocate(MIB, s).unwrap_err()
    };
    assert!(refused.to_string().contains("kv_cache"), "{refused}");
    // Sleeping twice is an error that changes nothing.
    match sleep::sleep(0, &["weights"], &[]) {
        Err(CudaError::Alloc {
            source: AllocError::AlreadyAsleep { .. },
            ..
        }) => {}
        other => panic!("sleeping twice: {other:?}"),
    }
    // Untagged memory is untouched.
    sim.write_bytes(untagged.ptr(), b"x").unwrap();

    let woke = sleep::wake(0, &["weights", "kv_cache"]).unwrap();
    assert_eq!(woke.mapped_bytes, slept.released_bytes);
    assert_eq!(a.stats().memory_reserved(), reserved);
    assert_eq!(
        sim.read_bytes(weights.ptr(), 15).unwrap(),
        b"weights survive",
        "the offloaded bytes are back at the same address"
    );
    assert_eq!(sleep::sleep_stats(0).unwrap(), Default::default());
    match sleep::wake(0, &["weights"]) {
        Err(CudaError::Alloc {
            source: AllocError::NotAsleep { .. },
            ..
        }) => {}
        other => panic!("waking what is awake: {other:?}"),
    }
    drop((weights, kv, untagged));
}
