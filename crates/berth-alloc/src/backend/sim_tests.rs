//! Unit tests of [`super::SimBackend`] (kept beside it, in their own file for length).

use super::*;

#[test]
fn addresses_increase_and_never_overlap() {
    let sim = SimBackend::new(1 << 30);
    let a = sim.malloc(3 << 20, StreamId(0)).unwrap();
    let b = sim.malloc(1 << 20, StreamId(0)).unwrap();
    assert!(b.0 >= a.0 + (3 << 20) + GAP);
    assert!(matches!(
        sim.malloc(2 << 30, StreamId(0)),
        Err(BackendError::OutOfMemory { .. })
    ));
}

#[test]
fn planned_addresses_are_used_in_order() {
    let sim = SimBackend::new(1 << 30).with_addresses([0x2000_0000_0000, 0x1000_0000_0000]);
    assert_eq!(
        sim.malloc(2 << 20, StreamId(0)).unwrap(),
        DevicePtr(0x2000_0000_0000)
    );
    assert_eq!(
        sim.malloc(2 << 20, StreamId(0)).unwrap(),
        DevicePtr(0x1000_0000_0000)
    );
}

#[test]
fn events_complete_only_when_told() {
    let sim = SimBackend::new(1 << 30);
    let e = sim.record_fence(StreamId(7)).unwrap();
    assert!(!sim.query_fence(&e).unwrap());
    sim.complete_events_on(StreamId(7));
    assert!(sim.query_fence(&e).unwrap());
}

#[test]
fn nth_malloc_fails() {
    let sim = SimBackend::new(1 << 30);
    sim.fail_malloc_at(2);
    assert!(sim.malloc(512, StreamId(0)).is_ok());
    assert!(sim.malloc(512, StreamId(0)).unwrap_err().is_out_of_memory());
    assert!(sim.malloc(512, StreamId(0)).is_ok());
}

#[test]
fn map_unmap_account_mappings() {
    const P: u64 = 2 << 20;
    let s = StreamId(0);
    let sim = SimBackend::new(1 << 30);
    let base = sim.reserve(64 << 20).unwrap();
    let at = |k: u64| DevicePtr(base.0 + k * P);
    sim.map(at(0), 2 * P as usize, s).unwrap();
    sim.map(at(2), P as usize, s).unwrap();
    assert!(sim.map(at(1), P as usize, s).is_err(), "already mapped");
    assert_eq!((sim.used_bytes(), sim.live_mappings()), (3 * P, 2));
    assert_eq!(sim.mappings(), vec![(at(0), 2 * P), (at(2), P)]);
    // SAFETY: the ranges were mapped above and nothing uses them; refused calls change
    // nothing.
    unsafe {
        assert!(sim.unmap(at(3), P as usize, s).is_err(), "not mapped");
        // Two whole mappings in one call are fine.
        sim.unmap(at(0), 3 * P as usize, s).unwrap();
    }
    assert_eq!((sim.used_bytes(), sim.live_mappings()), (0, 0));
    sim.map(at(4), P as usize, s).unwrap();
    // SAFETY: still a mapping in the reservation → error expected, nothing released.
    assert!(unsafe { sim.release(base, 64 << 20) }.is_err());
    assert_eq!(sim.counts().map, 4);
}

/// `cuMemUnmap` takes whole mappings only; the simulator refuses the same calls, with a
/// typed error naming the mapping that would be split, and changes nothing.
#[test]
fn unmap_that_splits_a_mapping_is_refused() {
    const P: u64 = 2 << 20;
    let s = StreamId(0);
    let sim = SimBackend::new(1 << 30);
    let base = sim.reserve(64 << 20).unwrap();
    let at = |k: u64| DevicePtr(base.0 + k * P);
    sim.map(at(0), 4 * P as usize, s).unwrap();
    sim.map(at(4), P as usize, s).unwrap();
    let split = |addr: DevicePtr, bytes: u64| BackendError::SplitsMapping {
        op: "unmap",
        addr,
        bytes,
        mapping: at(0),
        mapping_bytes: 4 * P,
    };
    // SAFETY: every range lies in mapped memory nothing uses; each call is refused.
    unsafe {
        // The tail, the head, the middle of the 4-page mapping, and a range ending in it.
        assert_eq!(
            sim.unmap(at(2), 2 * P as usize, s),
            Err(split(at(2), 2 * P))
        );
        assert_eq!(
            sim.unmap(at(0), 2 * P as usize, s),
            Err(split(at(0), 2 * P))
        );
        assert_eq!(sim.unmap(at(1), P as usize, s), Err(split(at(1), P)));
        assert_eq!(
            sim.unmap(at(3), 2 * P as usize, s),
            Err(split(at(3), 2 * P))
        );
    }
    assert_eq!((sim.used_bytes(), sim.live_mappings()), (5 * P, 2));
    // SAFETY: whole mappings, nothing uses them.
    unsafe {
        sim.unmap(at(4), P as usize, s).unwrap();
        sim.unmap(at(0), 4 * P as usize, s).unwrap();
    }
    assert_eq!((sim.used_bytes(), sim.live_mappings()), (0, 0));
}

/// Found by fuzzing: address arithmetic near 2^64 wrapped (`--real-addrs` with a planned
/// address near the top gave a block at address 0), and huge capacities or reservations
/// overflowed. Every range now stays inside the simulated address space.
#[test]
fn address_arithmetic_never_wraps() {
    let sim = SimBackend::new(u64::MAX).with_addresses([u64::MAX - 4095, 0, 512]);
    assert_eq!(sim.capacity(), MAX_SIM_CAPACITY, "capacity is clamped");
    let p = sim.malloc(1 << 20, StreamId::DEFAULT).unwrap();
    assert!(p.0 >= BASE_ADDR && p.0 + (1 << 20) <= ADDR_LIMIT, "{p}");
    assert!(matches!(
        sim.reserve(usize::MAX),
        Err(BackendError::OutOfMemory { op: "reserve", .. })
    ));
    let r = sim.reserve(1 << 30).unwrap();
    assert!(matches!(
        sim.map(
            DevicePtr(u64::MAX - (2 << 20) + 1),
            2 << 20,
            StreamId::DEFAULT
        ),
        Err(BackendError::Other { .. })
    ));
    sim.map(r, 2 << 20, StreamId::DEFAULT).unwrap();
    // SAFETY: mapped just above, nothing uses it.
    unsafe { sim.unmap(r, 2 << 20, StreamId::DEFAULT).unwrap() };
}
