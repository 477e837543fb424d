//! Snapshots and invariant checks of the caching allocator state.

use super::block::{Block, NIL};
use super::pool::BlockPool;
use super::state::State;
use crate::backend::StreamId;
use crate::snapshot::{
    BlockInfo, BlockState, MemorySnapshot, SegmentInfo, SegmentType, TraceAction,
};
use crate::stats::{MemoryStats, StatArray};

fn state_of(b: &Block) -> BlockState {
    if b.allocated {
        BlockState::ActiveAllocated
    } else if b.event_count > 0 || !b.stream_uses.is_empty() {
        BlockState::ActivePendingFree
    } else {
        BlockState::Inactive
    }
}

fn segment_info(
    device: i32,
    stream: StreamId,
    small: bool,
    pool_id: (u64, u64),
    expandable: bool,
    blocks: &[&Block],
) -> SegmentInfo {
    let mut s = SegmentInfo {
        device,
        address: blocks.first().map_or(0, |b| b.ptr),
        total_size: blocks.iter().map(|b| b.size).sum(),
        allocated_size: 0,
        active_size: 0,
        requested_size: 0,
        stream,
        segment_type: if small {
            SegmentType::Small
        } else {
            SegmentType::Large
        },
        segment_pool_id: pool_id,
        is_expandable: expandable,
        blocks: Vec::with_capacity(blocks.len()),
    };
    for b in blocks {
        let state = state_of(b);
        if state == BlockState::ActiveAllocated {
            s.allocated_size += b.size;
        }
        if state != BlockState::Inactive {
            s.active_size += b.size;
            s.requested_size += b.requested;
        }
        s.blocks.push(BlockInfo {
            address: b.ptr,
            size: b.size,
            requested_size: b.requested,
            state,
        });
    }
    s
}

impl<E> State<E> {
    /// Live blocks sorted by address.
    fn sorted_blocks(&self) -> Vec<(u32, &Block)> {
        let mut v: Vec<_> = self.blocks.iter().collect();
        v.sort_unstable_by_key(|(_, b)| b.ptr);
        v
    }

    /// `_snapshot()`: segments (one per contiguous mapped range of an expandable segment) with
    /// their blocks, plus the history; records a `snapshot` trace entry.
    pub fn snapshot(&mut self) -> MemorySnapshot {
        // The history is read first, then the snapshot is recorded as an event of it: a
        // snapshot's trace ends before the snapshot, and the next one's shows it (PyTorch's
        // order: `trace()` is collected before `snapshot()` records `SNAPSHOT`).
        let device_traces = vec![self
            .history
            .as_ref()
            .map(|h| h.to_vec())
            .unwrap_or_default()];
        let active = self.stats.active_bytes.all().current.max(0) as u64;
        self.trace(TraceAction::Snapshot, 0, active, StreamId::DEFAULT);
        let sorted = self.sorted_blocks();
        let in_range = |base: u64, size: u64| {
            let lo = sorted.partition_point(|(_, b)| b.ptr < base);
            let hi = sorted.partition_point(|(_, b)| b.ptr < base + size);
            &sorted[lo..hi]
        };
        let mut segments = Vec::new();
        for (&base, m) in &self.segments {
            let blocks: Vec<&Block> = in_range(base, m.size).iter().map(|(_, b)| *b).collect();
            segments.push(segment_info(
                self.device,
                m.stream,
                m.small,
                self.private.id_of(m.pool / 2),
                false,
                &blocks,
            ));
        }
        for es in self.expandable.iter().flatten() {
            let mut run: Vec<&Block> = Vec::new();
            for (_, b) in in_range(es.base, es.size) {
                if b.mapped {
                    run.push(b);
                } else if !run.is_empty() {
                    segments.push(segment_info(
                        self.device,
                        es.stream,
                        es.small,
                        self.private.id_of(es.pool / 2),
                        true,
                        &run,
                    ));
                    run.clear();
                }
            }
            if !run.is_empty() {
                segments.push(segment_info(
                    self.device,
                    es.stream,
                    es.small,
                    self.private.id_of(es.pool / 2),
                    true,
                    &run,
                ));
            }
        }
        segments.sort_by_key(|s| s.address);
        MemorySnapshot {
            segments,
            device_traces,
            allocator_settings: self.cfg.clone(),
            sleeping: Vec::new(),
        }
    }

    /// Checks the invariants listed at [`super::CachingAllocator::validate`].
    pub fn validate(&self) -> Result<(), String> {
        let sorted = self.sorted_blocks();
        // Blocks never overlap.
        for w in sorted.windows(2) {
            let (a, b) = (w[0].1, w[1].1);
            if a.ptr + a.size > b.ptr {
                return Err(format!(
                    "blocks {:#x}+{} and {:#x} overlap",
                    a.ptr, a.size, b.ptr
                ));
            }
        }
        // Segments are tiled by their linked blocks.
        let mut covered = 0usize;
        let ranges = self
            .segments
            .iter()
            .map(|(&base, m)| (base, m.size, false))
            .chain(
                self.expandable
                    .iter()
                    .flatten()
                    .map(|e| (e.base, e.size, true)),
            );
        for (base, size, exp) in ranges {
            let lo = sorted.partition_point(|(_, b)| b.ptr < base);
            let hi = sorted.partition_point(|(_, b)| b.ptr < base + size);
            let blocks = &sorted[lo..hi];
            let mut expect = base;
            for (k, (i, b)) in blocks.iter().enumerate() {
                if b.ptr != expect {
                    return Err(format!(
                        "segment {base:#x}: gap or overlap at {:#x} (expected {expect:#x})",
                        b.ptr
                    ));
                }
                let want_prev = if k == 0 { NIL } else { blocks[k - 1].0 };
                let want_next = if k + 1 == blocks.len() {
                    NIL
                } else {
                    blocks[k + 1].0
                };
                if b.prev != want_prev || b.next != want_next {
                    return Err(format!(
                        "segment {base:#x}: broken links at block {i} ({:#x})",
                        b.ptr
                    ));
                }
                if b.is_expandable() != exp {
                    return Err(format!(
                        "block {:#x}: expandable flag disagrees with its segment",
                        b.ptr
                    ));
                }
                expect += b.size;
            }
            if expect != base + size {
                return Err(format!(
                    "segment {base:#x}+{size}: blocks end at {expect:#x}"
                ));
            }
            covered += blocks.len();
        }
        if covered != self.blocks.len() {
            return Err(format!(
                "{} blocks lie outside every segment",
                self.blocks.len() - covered
            ));
        }
        // Pools and the allocated map hold exactly the right blocks; free neighbours are merged.
        let mut pooled = 0;
        for (i, b) in &sorted {
            let pool = &self.pools[b.pool as usize];
            let in_blocks = pool.blocks.contains(&BlockPool::size_key(b, *i));
            let in_unmapped = pool.unmapped.contains(&BlockPool::addr_key(b, *i));
            let reusable = b.is_reusable();
            if reusable != (in_blocks || in_unmapped)
                || (in_blocks && !b.mapped)
                || (in_unmapped && b.mapped)
            {
                return Err(format!(
                    "block {:#x}: pool membership wrong (reusable {reusable})",
                    b.ptr
                ));
            }
            pooled += usize::from(in_blocks || in_unmapped);
            if b.allocated != (self.allocated.get(&b.ptr) == Some(i)) {
                return Err(format!("block {:#x}: allocated map disagrees", b.ptr));
            }
            if reusable && b.next != NIL {
                let n = &self.blocks[b.next];
                if n.is_reusable() && n.mapped == b.mapped {
                    return Err(format!(
                        "free neighbours {:#x} and {:#x} not merged",
                        b.ptr, n.ptr
                    ));
                }
            }
        }
        let pool_total: usize = self
            .pools
            .iter()
            .map(|p| p.blocks.len() + p.unmapped.len())
            .sum();
        if pooled != pool_total {
            return Err(format!(
                "pools hold {pool_total} entries but {pooled} blocks are pooled"
            ));
        }
        // Every current statistic equals its recomputation.
        let want = self.recompute_current();
        let got = &self.stats;
        let arrays = [
            ("allocation", &got.allocation, &want.allocation),
            (
                "allocated_bytes",
                &got.allocated_bytes,
                &want.allocated_bytes,
            ),
            ("active", &got.active, &want.active),
            ("active_bytes", &got.active_bytes, &want.active_bytes),
            (
                "requested_bytes",
                &got.requested_bytes,
                &want.requested_bytes,
            ),
            ("segment", &got.segment, &want.segment),
            ("reserved_bytes", &got.reserved_bytes, &want.reserved_bytes),
            ("inactive_split", &got.inactive_split, &want.inactive_split),
            (
                "inactive_split_bytes",
                &got.inactive_split_bytes,
                &want.inactive_split_bytes,
            ),
        ];
        for (name, g, w) in arrays {
            for k in 0..3 {
                if g.0[k].current != w.0[k].current {
                    return Err(format!(
                        "{name}[{k}].current is {} but recomputes to {}",
                        g.0[k].current, w.0[k].current
                    ));
                }
                if g.0[k].peak < g.0[k].current {
                    return Err(format!("{name}[{k}].peak below current"));
                }
            }
        }
        if got.oversize_allocations.current != want.oversize_allocations.current
            || got.oversize_segments.current != want.oversize_segments.current
        {
            return Err("oversize counters disagree with the blocks".into());
        }
        if self.total_reserved as i64 != got.reserved_bytes.all().current {
            return Err("total_reserved disagrees with reserved_bytes".into());
        }
        Ok(())
    }

    fn recompute_current(&self) -> MemoryStats {
        let mut s = MemoryStats::default();
        let inc = |a: &mut StatArray, small: bool, v: u64| a.increase(small, v as i64);
        for (_, b) in self.blocks.iter() {
            let active = b.allocated || b.event_count > 0 || !b.stream_uses.is_empty();
            if b.allocated {
                inc(&mut s.allocation, b.small, 1);
                inc(&mut s.allocated_bytes, b.small, b.size);
                if b.size >= self.max_split {
                    s.oversize_allocations.increase(1);
                }
            }
            if active {
                inc(&mut s.active, b.small, 1);
                inc(&mut s.active_bytes, b.small, b.size);
                inc(&mut s.requested_bytes, b.small, b.requested);
            } else if b.is_split() && !b.is_expandable() {
                inc(&mut s.inactive_split, b.small, 1);
                inc(&mut s.inactive_split_bytes, b.small, b.size);
            }
            if b.is_expandable() && b.mapped {
                inc(&mut s.reserved_bytes, b.small, b.size);
            }
        }
        for m in self.segments.values() {
            inc(&mut s.segment, m.small, 1);
            inc(&mut s.reserved_bytes, m.small, m.size);
            if m.size >= self.max_split {
                s.oversize_segments.increase(1);
            }
        }
        s
    }
}
