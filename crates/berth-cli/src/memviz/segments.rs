//! The segment view of `berth memviz`: every segment of the snapshot with its blocks, allocated
//! or free (PyTorch `memory_viz`'s segment / allocator-state view).
//!
//! Note [Segment downsampling]: a segment is drawn as one row about a thousand pixels wide, so
//! a block narrower than 1/[`SEGMENT_COLUMNS`] of its segment covers less than a pixel. Runs
//! of such neighbours are merged into one entry (state [`STATE_MERGED`], with their count and
//! allocated bytes) until the run is a pixel wide, so a segment holds at most about
//! 2 × [`SEGMENT_COLUMNS`] entries however many blocks it has. Blocks a pixel wide or more are
//! kept as they are. A pixel is 1/[`SEGMENT_COLUMNS`] of the segment's span: the larger of its
//! `total_size` and its blocks' summed sizes, so a damaged segment (`total_size` 0, or smaller
//! than its blocks: newcomer defect 17, where every block was kept) is bounded the same way.

use berth_alloc::snapshot::{BlockState, MemorySnapshot, SegmentInfo};
use serde::Serialize;

/// Entries per segment row before small blocks are merged (about one per pixel).
pub const SEGMENT_COLUMNS: u64 = 1024;

/// Block state code: `active_allocated`.
pub const STATE_ALLOCATED: u64 = 0;
/// Block state code: `active_pending_free`.
pub const STATE_PENDING_FREE: u64 = 1;
/// Block state code: `inactive` (cached free memory).
pub const STATE_INACTIVE: u64 = 2;
/// Block state code: several blocks under a pixel wide, merged.
pub const STATE_MERGED: u64 = 3;

/// One segment row.
#[derive(Debug, Serialize)]
pub struct SegmentRow {
    /// Its address, in hex.
    pub addr: String,
    /// Its size in bytes.
    pub size: u64,
    /// Bytes of its `active_allocated` blocks.
    pub allocated: u64,
    /// Bytes of its active blocks (allocated or pending free).
    pub active: u64,
    /// Requested bytes of its active blocks.
    pub requested: u64,
    /// Its stream, as a decimal string.
    pub stream: String,
    /// `"small"` or `"large"` pool.
    pub kind: &'static str,
    /// Its memory pool id, `[0, 0]` for the default pools (as decimal strings).
    pub pool: [String; 2],
    /// Whether it is part of an expandable segment.
    pub expandable: bool,
    /// Blocks it holds (COUNT), before merging.
    pub block_count: usize,
    /// `[offset_bytes, size_bytes, requested_bytes, state, count]` per entry, in address
    /// order: `offset_bytes` from the segment's start; for [`STATE_MERGED`] entries
    /// `requested_bytes` holds the merged blocks' allocated bytes and `count` how many.
    pub blocks: Vec<[u64; 5]>,
}

fn state_code(s: BlockState) -> u64 {
    match s {
        BlockState::ActiveAllocated => STATE_ALLOCATED,
        BlockState::ActivePendingFree => STATE_PENDING_FREE,
        BlockState::Inactive => STATE_INACTIVE,
    }
}

/// A run of sub-pixel blocks being merged.
#[derive(Default)]
struct Run {
    entry: Option<[u64; 5]>,
}

impl Run {
    fn add(&mut self, e: [u64; 5], allocated: u64) {
        match &mut self.entry {
            None => self.entry = Some(e),
            Some(r) => {
                if r[4] == 1 {
                    // Turn the single block into a merged entry.
                    r[2] = if r[3] == STATE_ALLOCATED { r[1] } else { 0 };
                    r[3] = STATE_MERGED;
                }
                // Saturating: a damaged snapshot may hold sizes near 2^64.
                r[1] = e[0].saturating_add(e[1]).saturating_sub(r[0]);
                r[2] = r[2].saturating_add(allocated);
                r[4] += 1;
            }
        }
    }

    fn size(&self) -> u64 {
        self.entry.map_or(0, |e| e[1])
    }

    fn flush(&mut self, out: &mut Vec<[u64; 5]>) {
        if let Some(e) = self.entry.take() {
            out.push(e);
        }
    }
}

fn row(seg: &SegmentInfo) -> SegmentRow {
    // The span bounds the entries even for a damaged segment (Note [Segment downsampling]).
    let blocks_bytes = seg
        .blocks
        .iter()
        .map(|b| b.size)
        .fold(0, u64::saturating_add);
    let min_bytes = (seg.total_size.max(blocks_bytes) / SEGMENT_COLUMNS).max(1);
    let mut blocks = Vec::new();
    let mut run = Run::default();
    for b in &seg.blocks {
        let state = state_code(b.state);
        let e = [
            b.address.saturating_sub(seg.address),
            b.size,
            b.requested_size,
            state,
            1,
        ];
        if b.size >= min_bytes {
            run.flush(&mut blocks);
            blocks.push(e);
            continue;
        }
        let allocated = if state == STATE_ALLOCATED { b.size } else { 0 };
        run.add(e, allocated);
        if run.size() >= min_bytes {
            run.flush(&mut blocks);
        }
    }
    run.flush(&mut blocks);
    SegmentRow {
        addr: format!("0x{:x}", seg.address),
        size: seg.total_size,
        allocated: seg.allocated_size,
        active: seg.active_size,
        requested: seg.requested_size,
        stream: seg.stream.0.to_string(),
        kind: seg.segment_type.as_str(),
        pool: [
            seg.segment_pool_id.0.to_string(),
            seg.segment_pool_id.1.to_string(),
        ],
        expandable: seg.is_expandable,
        block_count: seg.blocks.len(),
        blocks,
    }
}

/// The rows of `device`'s segments, by address.
pub fn build(snapshot: &MemorySnapshot, device: usize) -> Vec<SegmentRow> {
    let mut segs: Vec<&SegmentInfo> = snapshot
        .segments
        .iter()
        .filter(|s| usize::try_from(s.device).ok() == Some(device))
        .collect();
    segs.sort_by_key(|s| s.address);
    segs.into_iter().map(row).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_damaged_segment_of_size_zero_is_downsampled_too() {
        // Newcomer defect 17 (gen_pickles.py's snap-zero-total-many-blocks): total_size 0 and
        // 100,000 blocks of 512 bytes gave 100,000 entries.
        let mut s = seg(vec![(512, BlockState::ActiveAllocated); 100_000]);
        s.total_size = 0;
        let r = row(&s);
        assert!(
            r.blocks.len() <= 2 * SEGMENT_COLUMNS as usize + 1,
            "{}",
            r.blocks.len()
        );
        assert_eq!(r.block_count, 100_000);
        // Every block is accounted for: the merged counts add up.
        assert_eq!(r.blocks.iter().map(|e| e[4]).sum::<u64>(), 100_000);
    }

    use berth_alloc::backend::StreamId;
    use berth_alloc::snapshot::{BlockInfo, SegmentType};

    fn seg(blocks: Vec<(u64, BlockState)>) -> SegmentInfo {
        let mut addr = 1 << 20;
        let start = addr;
        let blocks: Vec<BlockInfo> = blocks
            .into_iter()
            .map(|(size, state)| {
                let b = BlockInfo {
                    address: addr,
                    size,
                    requested_size: size,
                    state,
                };
                addr += size;
                b
            })
            .collect();
        SegmentInfo {
            device: 0,
            address: start,
            total_size: addr - start,
            allocated_size: 0,
            active_size: 0,
            requested_size: 0,
            stream: StreamId(0),
            segment_type: SegmentType::Large,
            segment_pool_id: (0, 0),
            is_expandable: false,
            blocks,
        }
    }

    #[test]
    fn wide_blocks_are_kept() {
        let r = row(&seg(vec![
            (4096, BlockState::ActiveAllocated),
            (4096, BlockState::Inactive),
        ]));
        assert_eq!(r.blocks.len(), 2);
        assert_eq!(r.blocks[1], [4096, 4096, 4096, STATE_INACTIVE, 1]);
    }

    #[test]
    fn sub_pixel_blocks_are_merged_up_to_a_pixel() {
        // One large block and 100_000 tiny ones: the tiny ones fall far under a pixel.
        let mut b = vec![(1u64 << 30, BlockState::Inactive)];
        b.extend((0..100_000).map(|i| {
            let s = if i % 2 == 0 {
                BlockState::ActiveAllocated
            } else {
                BlockState::Inactive
            };
            (512, s)
        }));
        let s = seg(b);
        let r = row(&s);
        assert!(
            r.blocks.len() <= 2 * SEGMENT_COLUMNS as usize,
            "{}",
            r.blocks.len()
        );
        assert_eq!(r.block_count, 100_001);
        let count: u64 = r.blocks.iter().map(|e| e[4]).sum();
        assert_eq!(count, 100_001);
        let covered: u64 = r.blocks.iter().map(|e| e[1]).sum();
        assert_eq!(covered, s.total_size);
        let allocated: u64 = r
            .blocks
            .iter()
            .filter(|e| e[3] == STATE_MERGED)
            .map(|e| e[2])
            .sum();
        assert_eq!(allocated, 50_000 * 512);
    }
}
