//! Snapshots of [`super::PagedBestFit`] (`torch.cuda.memory._snapshot`): each mapped range of
//! one reservation is a segment, with its live blocks, its blocks waiting for other streams and
//! the free gaps between them; a segment carries its arena's pool id (`Note [Private pools in
//! paged]` in [`super::pools`]).

use super::state::State;
use crate::backend::StreamId;
use crate::config::AllocatorConfig;
use crate::snapshot::{BlockInfo, BlockState, MemorySnapshot, SegmentInfo, SegmentType, TraceRing};

impl<E> State<E> {
    /// Mapped ranges as segments, with their live blocks and the free gaps between them.
    pub(crate) fn snapshot(&self) -> MemorySnapshot {
        // Live blocks, and freed blocks still waiting for other streams (PyTorch's
        // `active_pending_free`): (address, size, requested, state).
        let mut blocks: Vec<(u64, u64, u64, BlockState)> = self
            .live
            .iter()
            .map(|(&a, l)| (a, l.size, l.requested, BlockState::ActiveAllocated))
            .chain(
                self.pending
                    .iter()
                    .map(|p| (p.addr, p.size, p.requested, BlockState::ActivePendingFree)),
            )
            .chain(
                self.deferred
                    .iter()
                    .map(|(a, l)| (*a, l.size, l.requested, BlockState::ActivePendingFree)),
            )
            .collect();
        blocks.sort_unstable_by_key(|b| b.0);
        // Every reservation with its arena, in address order: a mapped interval that spans
        // two adjacent reservations (of two pools, or two streams) is two segments.
        let mut reservations: Vec<(u64, u64, usize)> = self
            .arenas
            .iter()
            .enumerate()
            .flat_map(|(i, a)| a.reservations.iter().map(move |&(b, n)| (b, b + n, i)))
            .collect();
        reservations.sort_unstable();
        let mut pieces: Vec<(u64, u64, Option<usize>)> = Vec::new();
        for (start, end) in self.pages.intervals() {
            let before = pieces.len();
            let first = reservations.partition_point(|r| r.1 <= start);
            for r in reservations[first..].iter().take_while(|r| r.0 < end) {
                pieces.push((start.max(r.0), end.min(r.1), Some(r.2)));
            }
            if pieces.len() == before {
                // Mapped pages outside every reservation cannot happen; kept visible anyway.
                pieces.push((start, end, None));
            }
        }
        let mut segments = Vec::new();
        let mut next = 0;
        for (start, end, arena) in pieces {
            let arena = arena.map(|i| &self.arenas[i]);
            let stream = arena.map_or(StreamId::DEFAULT, |a| a.stream);
            let pool = arena.map_or((0, 0), |a| self.private.id_of(a.pair));
            let mut seg = SegmentInfo {
                device: self.device,
                address: start,
                total_size: end - start,
                allocated_size: 0,
                active_size: 0,
                requested_size: 0,
                stream,
                segment_type: SegmentType::Large,
                segment_pool_id: pool,
                is_expandable: true,
                blocks: Vec::new(),
            };
            let mut at = start;
            while next < blocks.len() && blocks[next].0 < end {
                let (a, size, requested, state) = blocks[next];
                if a >= start {
                    if a > at {
                        seg.blocks.push(BlockInfo {
                            address: at,
                            size: a - at,
                            requested_size: 0,
                            state: BlockState::Inactive,
                        });
                    }
                    seg.blocks.push(BlockInfo {
                        address: a,
                        size,
                        requested_size: requested,
                        state,
                    });
                    // As PyTorch's snapshot (and the caching policy's): a pending free is
                    // active, with its requested bytes, but not allocated.
                    if state == BlockState::ActiveAllocated {
                        seg.allocated_size += size;
                    }
                    seg.active_size += size;
                    seg.requested_size += requested;
                    at = a + size;
                }
                next += 1;
            }
            if at < end {
                seg.blocks.push(BlockInfo {
                    address: at,
                    size: end - at,
                    requested_size: 0,
                    state: BlockState::Inactive,
                });
            }
            segments.push(seg);
        }
        let trace = self
            .history
            .as_ref()
            .map(TraceRing::to_vec)
            .unwrap_or_default();
        MemorySnapshot {
            segments,
            device_traces: vec![trace],
            allocator_settings: AllocatorConfig::default(),
            sleeping: self.sleeping_tags(),
        }
    }
}
