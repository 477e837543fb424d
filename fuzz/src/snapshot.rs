//! Layout checks of a [`MemorySnapshot`] taken from a live allocator.

use berth_alloc::{BlockState, MemorySnapshot};

/// Checks that the segments of `snapshot` do not overlap, that each segment's blocks tile it
/// exactly in address order, and that its per-segment sums match its blocks. Returns the bytes
/// of `active_allocated` blocks, over all segments.
///
/// # Panics
/// When any of these does not hold (a finding).
pub fn check_layout(snapshot: &MemorySnapshot) -> u64 {
    let mut allocated = 0u64;
    let mut segments: Vec<(u64, u64)> = Vec::new();
    for seg in &snapshot.segments {
        let end = seg
            .address
            .checked_add(seg.total_size)
            .unwrap_or_else(|| panic!("segment {:#x}+{} wraps", seg.address, seg.total_size));
        segments.push((seg.address, end));
        let mut at = seg.address;
        let (mut seg_allocated, mut seg_active) = (0u64, 0u64);
        for b in &seg.blocks {
            assert_eq!(
                b.address, at,
                "segment {:#x}: block at {:#x}, expected {at:#x} (blocks must tile the segment)",
                seg.address, b.address
            );
            at = at.checked_add(b.size).expect("block end wraps");
            match b.state {
                BlockState::ActiveAllocated => {
                    seg_allocated += b.size;
                    seg_active += b.size;
                }
                BlockState::ActivePendingFree => seg_active += b.size,
                BlockState::Inactive => {}
            }
        }
        if !seg.blocks.is_empty() {
            assert_eq!(
                at, end,
                "segment {:#x}: blocks do not reach its end",
                seg.address
            );
        }
        assert_eq!(
            seg.allocated_size, seg_allocated,
            "segment {:#x}",
            seg.address
        );
        assert_eq!(seg.active_size, seg_active, "segment {:#x}", seg.address);
        allocated += seg_allocated;
    }
    segments.sort_unstable();
    for w in segments.windows(2) {
        assert!(
            w[0].1 <= w[1].0,
            "segments [{:#x}, {:#x}) and [{:#x}, {:#x}) overlap",
            w[0].0,
            w[0].1,
            w[1].0,
            w[1].1
        );
    }
    allocated
}
