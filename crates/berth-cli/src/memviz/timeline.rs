//! The active-memory timeline of `berth memviz`: allocated bytes over time, stacked per block,
//! computed from one device's trace (PyTorch `memory_viz`'s "Active Memory Timeline").
//!
//! The x axis counts *actions*, as PyTorch's viewer does: each `alloc` and each
//! `free_completed` of the trace is one step (`free_requested` only marks a time; segment
//! events move the reserved line; `oom` entries become markers). Blocks live when the trace
//! starts (freed in the trace without an `alloc` in it, or `active_allocated` in the
//! snapshot's segments without one) start at step 0.
//!
//! Blocks are stacked in allocation order: a block's offset is the sum of the sizes of the
//! live blocks allocated before it, so freeing a block moves every later block down.
//!
//! Note [Timeline downsampling]: a browser stays responsive only with a bounded number of
//! shapes, so what no pixel could show is merged before the page is written:
//!
//! 1. The steps are grouped into at most [`MAX_COLUMNS`] columns (about one pixel each at full
//!    width). Per column the page gets the highest allocated and reserved bytes reached in it,
//!    so a short peak still shows, and a block's offset is sampled once per column (where it
//!    stood when the column began; a block freed in a column is drawn through it), so a block
//!    has at most one vertex pair per column.
//! 2. Only blocks at least 1/[`VISIBLE_FRACTION`] of the peak tall (about half a pixel on a
//!    500-pixel plot) are drawn one by one. Everything else is the grey area under the
//!    columns' allocated line; hovering it says how many blocks were live.
//! 3. Of those, the ones covering the most pixels (bytes × columns alive) are kept while the
//!    page holds at most [`MAX_BANDS`] blocks and [`MAX_POINTS`] vertices in all; the rest fall
//!    into the grey area too.
//!
//! The page therefore holds O([`MAX_COLUMNS`] + [`MAX_POINTS`]) numbers whatever the trace's
//! length.

use std::collections::HashMap;

use berth_alloc::snapshot::{BlockState, MemorySnapshot, TraceAction};
use serde::Serialize;

/// The most columns the x axis is split into (one sample per column).
pub const MAX_COLUMNS: usize = 2048;
/// Blocks smaller than the peak divided by this are not drawn one by one.
pub const VISIBLE_FRACTION: u64 = 1024;
/// The most blocks drawn one by one.
pub const MAX_BANDS: usize = 10_000;
/// The most polygon vertices (sum over the drawn blocks' offset samples).
pub const MAX_POINTS: usize = 200_000;

/// Per-column samples, as parallel arrays (compact in JSON).
#[derive(Debug, Default, Serialize)]
pub struct Columns {
    /// First step of each column.
    pub step: Vec<usize>,
    /// Time of the column's first step, in microseconds (the trace's clock).
    pub t0_us: Vec<i64>,
    /// Time of the column's last step, in microseconds.
    pub t1_us: Vec<i64>,
    /// Highest allocated bytes reached in the column.
    pub alloc_max: Vec<u64>,
    /// Allocated bytes at the column's end.
    pub alloc_end: Vec<u64>,
    /// Highest reserved bytes (segments) in the column.
    pub reserved_max: Vec<u64>,
    /// Live blocks at the column's end (COUNT).
    pub live: Vec<usize>,
}

/// One block drawn on its own: a band of constant height whose offset steps over time.
#[derive(Debug, Serialize)]
pub struct Band {
    /// Its address, in hex.
    pub addr: String,
    /// Its size in bytes (the trace's size: the requested bytes).
    pub size: u64,
    /// Its stream, as a decimal string (stream handles may exceed JavaScript's exact integers).
    pub stream: String,
    /// When it was allocated, in microseconds; `None` when before the trace started.
    pub alloc_us: Option<i64>,
    /// When the program freed it (`free_requested`), in microseconds.
    pub free_requested_us: Option<i64>,
    /// When it became reusable (`free_completed`), in microseconds; `None` when still live.
    pub free_us: Option<i64>,
    /// First column drawn.
    pub x0: u32,
    /// One past the last column drawn.
    pub x1: u32,
    /// Flat `[column, offset_bytes, column, offset_bytes, ...]`: from each column on, the
    /// band's bottom sits at that offset. The first column is `x0`.
    pub points: Vec<u64>,
}

/// Everything the timeline view draws.
#[derive(Debug, Default, Serialize)]
pub struct Timeline {
    /// Steps (alloc and `free_completed` actions) on the x axis; at least 1.
    pub steps: usize,
    /// The columns (at most [`MAX_COLUMNS`]).
    pub columns: Columns,
    /// The blocks drawn one by one.
    pub bands: Vec<Band>,
    /// Blocks in the timeline (COUNT), drawn or not.
    pub blocks: usize,
    /// Blocks tall enough to draw (COUNT), before the band and vertex caps.
    pub visible_blocks: usize,
    /// Highest allocated bytes over the trace.
    pub peak_bytes: u64,
    /// Highest reserved bytes over the trace.
    pub peak_reserved_bytes: u64,
    /// Columns holding an `oom` entry.
    pub oom_columns: Vec<u32>,
    /// Time of the trace's first entry, in microseconds (0 without a trace).
    pub start_us: i64,
}

/// A block of the timeline.
struct Element {
    addr: u64,
    size: u64,
    stream: u64,
    alloc_us: Option<i64>,
    free_requested_us: Option<i64>,
    free_us: Option<i64>,
}

/// One step: a block appears (`alloc`) or goes (`free`).
struct Step {
    elem: usize,
    alloc: bool,
    time_us: i64,
    /// Reserved bytes at this step, relative to the trace's start (the segment events so far).
    reserved_rel: i128,
}

/// Prefix sums over stack positions (a Fenwick tree), for offsets in O(log n).
struct Fenwick(Vec<i128>);

impl Fenwick {
    fn add(&mut self, pos: usize, delta: i128) {
        let mut i = pos + 1;
        while i < self.0.len() {
            self.0[i] += delta;
            i += i & i.wrapping_neg();
        }
    }

    /// The sum over positions below `pos`.
    fn below(&self, pos: usize) -> i128 {
        let mut i = pos;
        let mut s = 0;
        while i > 0 {
            s += self.0[i];
            i &= i - 1;
        }
        s
    }
}

fn clamp_u64(v: i128) -> u64 {
    u64::try_from(v.max(0)).unwrap_or(u64::MAX)
}

/// Builds the timeline of `device` (its trace, and its segments' live blocks).
pub fn build(snapshot: &MemorySnapshot, device: usize) -> Timeline {
    let trace = snapshot
        .device_traces
        .get(device)
        .map_or(&[][..], Vec::as_slice);
    let mut elements: Vec<Element> = Vec::new();
    let mut steps: Vec<Step> = Vec::new();
    let mut live: HashMap<u64, usize> = HashMap::new();
    // Blocks freed in the trace but allocated before it, in order of their free.
    let mut freed_before: Vec<usize> = Vec::new();
    let mut in_trace: Vec<usize> = Vec::new();
    let mut oom_steps: Vec<usize> = Vec::new();
    let mut reserved: i128 = 0;
    for e in trace {
        match e.action {
            TraceAction::Alloc => {
                if let Some(old) = live.remove(&e.addr) {
                    // A second alloc at a live address (a damaged trace): end the first.
                    elements[old].free_us = Some(e.time_us);
                    steps.push(Step {
                        elem: old,
                        alloc: false,
                        time_us: e.time_us,
                        reserved_rel: reserved,
                    });
                }
                elements.push(Element {
                    addr: e.addr,
                    size: e.size,
                    stream: e.stream.0,
                    alloc_us: Some(e.time_us),
                    free_requested_us: None,
                    free_us: None,
                });
                let id = elements.len() - 1;
                live.insert(e.addr, id);
                in_trace.push(id);
                steps.push(Step {
                    elem: id,
                    alloc: true,
                    time_us: e.time_us,
                    reserved_rel: reserved,
                });
            }
            TraceAction::FreeRequested => {
                if let Some(&id) = live.get(&e.addr) {
                    elements[id].free_requested_us = Some(e.time_us);
                }
            }
            TraceAction::FreeCompleted => {
                let id = match live.remove(&e.addr) {
                    Some(id) => id,
                    None => {
                        elements.push(Element {
                            addr: e.addr,
                            size: e.size,
                            stream: e.stream.0,
                            alloc_us: None,
                            free_requested_us: None,
                            free_us: None,
                        });
                        freed_before.push(elements.len() - 1);
                        elements.len() - 1
                    }
                };
                elements[id].free_us = Some(e.time_us);
                steps.push(Step {
                    elem: id,
                    alloc: false,
                    time_us: e.time_us,
                    reserved_rel: reserved,
                });
            }
            TraceAction::SegmentAlloc | TraceAction::SegmentMap => {
                reserved += i128::from(e.size);
            }
            TraceAction::SegmentFree | TraceAction::SegmentUnmap => reserved -= i128::from(e.size),
            TraceAction::Oom => oom_steps.push(steps.len()),
            TraceAction::Snapshot => {}
        }
    }
    // Blocks live in the snapshot without an alloc in the trace: allocated before it.
    let mut live_before: Vec<usize> = Vec::new();
    let segments = snapshot
        .segments
        .iter()
        .filter(|s| usize::try_from(s.device).ok() == Some(device));
    for seg in segments.clone() {
        for b in &seg.blocks {
            if b.state == BlockState::ActiveAllocated && !live.contains_key(&b.address) {
                let size = if b.requested_size > 0 {
                    b.requested_size
                } else {
                    b.size
                };
                elements.push(Element {
                    addr: b.address,
                    size,
                    stream: seg.stream.0,
                    alloc_us: None,
                    free_requested_us: None,
                    free_us: None,
                });
                live_before.push(elements.len() - 1);
            }
        }
    }
    let final_reserved: i128 = segments.map(|s| i128::from(s.total_size)).sum();
    let reserved_start = (final_reserved - reserved).max(0);

    // Stack order (PyTorch's): blocks still live at the end at the bottom, then the blocks
    // freed in the trace (the first freed on top), then the trace's allocations in order.
    let mut seq = vec![0usize; elements.len()];
    let order = live_before
        .iter()
        .chain(freed_before.iter().rev())
        .chain(in_trace.iter());
    for (pos, &id) in order.enumerate() {
        seq[id] = pos;
    }
    let initial: Vec<usize> = live_before
        .iter()
        .chain(freed_before.iter().rev())
        .copied()
        .collect();

    let n_steps = steps.len().max(1);
    let n_cols = n_steps.min(MAX_COLUMNS);
    let col_of = |step: usize| -> usize {
        let c = (step as u128 * n_cols as u128 / n_steps as u128) as usize;
        c.min(n_cols - 1)
    };

    // Pass 1: the peak, for the visibility threshold.
    let mut total: i128 = initial.iter().map(|&i| i128::from(elements[i].size)).sum();
    let mut peak = total;
    for s in &steps {
        let size = i128::from(elements[s.elem].size);
        total += if s.alloc { size } else { -size };
        peak = peak.max(total);
    }
    let peak_bytes = clamp_u64(peak);
    let threshold = (peak_bytes / VISIBLE_FRACTION).max(1);
    let visible = |id: usize| elements[id].size >= threshold;

    // Pass 2: columns and the offsets of visible blocks.
    let mut fen = Fenwick(vec![0; elements.len() + 1]);
    let mut cand_points: Vec<Vec<u64>> = vec![Vec::new(); elements.len()];
    let mut cand_x1 = vec![0u32; elements.len()];
    let mut alive: Vec<usize> = Vec::new();
    let mut alive_pos = vec![usize::MAX; elements.len()];
    let mut total: i128 = 0;
    let mut n_live = 0usize;
    for &id in &initial {
        fen.add(seq[id], i128::from(elements[id].size));
        total += i128::from(elements[id].size);
        n_live += 1;
    }
    for &id in &initial {
        if visible(id) {
            cand_points[id] = vec![0, clamp_u64(fen.below(seq[id]))];
            alive_pos[id] = alive.len();
            alive.push(id);
        }
    }
    let start_us = trace.first().map_or(0, |e| e.time_us);
    let mut cols = Columns::default();
    let mut oom_cols: Vec<u32> = oom_steps.iter().map(|&s| col_of(s) as u32).collect();
    oom_cols.dedup();
    let mut peak_reserved: i128 = 0;
    let mut step = 0usize;
    // Without steps, the one column shows the reserved bytes at the end.
    let mut last_reserved = if steps.is_empty() {
        final_reserved
    } else {
        reserved_start
    };
    for c in 0..n_cols {
        let end = if c + 1 == n_cols {
            steps.len()
        } else {
            // The first step of column c + 1.
            ((c as u128 + 1) * n_steps as u128).div_ceil(n_cols as u128) as usize
        };
        let first = step;
        let mut a_max = total;
        let mut r_max = last_reserved;
        while step < end.min(steps.len()) {
            let s = &steps[step];
            let id = s.elem;
            let size = i128::from(elements[id].size);
            if s.alloc {
                fen.add(seq[id], size);
                total += size;
                n_live += 1;
                if visible(id) {
                    cand_points[id] = vec![c as u64, clamp_u64(fen.below(seq[id]))];
                    alive_pos[id] = alive.len();
                    alive.push(id);
                }
            } else {
                fen.add(seq[id], -size);
                total -= size;
                n_live = n_live.saturating_sub(1);
                if alive_pos[id] != usize::MAX {
                    let p = alive_pos[id];
                    alive.swap_remove(p);
                    if let Some(&moved) = alive.get(p) {
                        alive_pos[moved] = p;
                    }
                    alive_pos[id] = usize::MAX;
                    cand_x1[id] = c as u32 + 1;
                }
            }
            last_reserved = (reserved_start + s.reserved_rel).max(0);
            a_max = a_max.max(total);
            r_max = r_max.max(last_reserved);
            step += 1;
        }
        peak_reserved = peak_reserved.max(r_max);
        let t = |i: usize| steps.get(i).map_or(start_us, |s| s.time_us);
        cols.step.push(first);
        cols.t0_us.push(t(first));
        cols.t1_us.push(t(step.saturating_sub(1).max(first)));
        cols.alloc_max.push(clamp_u64(a_max));
        cols.alloc_end.push(clamp_u64(total));
        cols.reserved_max.push(clamp_u64(r_max));
        cols.live.push(n_live);
        if c + 1 < n_cols {
            for &id in &alive {
                let off = clamp_u64(fen.below(seq[id]));
                let pts = &mut cand_points[id];
                if pts[pts.len() - 1] != off {
                    pts.push(c as u64 + 1);
                    pts.push(off);
                }
            }
        }
    }
    for &id in &alive {
        cand_x1[id] = n_cols as u32;
    }

    // Keep the largest visible blocks within the band and vertex budgets.
    let mut cands: Vec<usize> = (0..elements.len())
        .filter(|&id| !cand_points[id].is_empty())
        .collect();
    let visible_blocks = cands.len();
    // Largest area on screen first: height (bytes) times width (columns).
    let area = |id: usize| {
        let x0 = cand_points[id][0];
        let width = u64::from(cand_x1[id]).saturating_sub(x0).max(1);
        u128::from(elements[id].size) * u128::from(width)
    };
    cands.sort_by_key(|&id| (std::cmp::Reverse(area(id)), seq[id]));
    let mut kept = Vec::new();
    let mut points = 0usize;
    for id in cands {
        let n = cand_points[id].len() / 2 + 1;
        if kept.len() < MAX_BANDS && points + n <= MAX_POINTS {
            points += n;
            kept.push(id);
        }
    }
    kept.sort_by_key(|&id| seq[id]);
    let bands = kept
        .into_iter()
        .map(|id| {
            let e = &elements[id];
            let points = std::mem::take(&mut cand_points[id]);
            Band {
                addr: format!("0x{:x}", e.addr),
                size: e.size,
                stream: e.stream.to_string(),
                alloc_us: e.alloc_us,
                free_requested_us: e.free_requested_us,
                free_us: e.free_us,
                x0: points[0] as u32,
                x1: cand_x1[id].max(points[0] as u32 + 1),
                points,
            }
        })
        .collect();
    Timeline {
        steps: n_steps,
        columns: cols,
        bands,
        blocks: elements.len(),
        visible_blocks,
        peak_bytes,
        peak_reserved_bytes: clamp_u64(peak_reserved),
        oom_columns: oom_cols,
        start_us,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use berth_alloc::backend::StreamId;
    use berth_alloc::snapshot::{BlockInfo, SegmentInfo, SegmentType, TraceEntry};

    fn e(action: TraceAction, addr: u64, size: u64) -> TraceEntry {
        TraceEntry {
            action,
            addr,
            size,
            stream: StreamId(0),
            time_us: addr as i64,
        }
    }

    fn snapshot(trace: Vec<TraceEntry>, live: &[(u64, u64)]) -> MemorySnapshot {
        let blocks: Vec<BlockInfo> = live
            .iter()
            .map(|&(address, size)| BlockInfo {
                address,
                size,
                requested_size: size,
                state: BlockState::ActiveAllocated,
            })
            .collect();
        MemorySnapshot {
            segments: vec![SegmentInfo {
                device: 0,
                address: 0,
                total_size: 1 << 20,
                allocated_size: 0,
                active_size: 0,
                requested_size: 0,
                stream: StreamId(0),
                segment_type: SegmentType::Large,
                segment_pool_id: (0, 0),
                is_expandable: false,
                blocks,
            }],
            device_traces: vec![trace],
            ..MemorySnapshot::default()
        }
    }

    #[test]
    fn freeing_a_lower_block_moves_the_ones_above_down() {
        use TraceAction::{Alloc, FreeCompleted, FreeRequested};
        let s = snapshot(
            vec![
                e(Alloc, 100, 10),
                e(Alloc, 200, 20),
                e(FreeRequested, 100, 10),
                e(FreeCompleted, 100, 10),
                e(Alloc, 300, 1),
            ],
            &[(200, 20), (300, 1)],
        );
        let t = build(&s, 0);
        assert_eq!(t.steps, 4);
        assert_eq!(
            t.blocks, 3,
            "the live blocks are in the trace, not before it"
        );
        assert_eq!(t.peak_bytes, 30);
        assert_eq!(t.columns.alloc_end, vec![10, 30, 20, 21]);
        let a = &t.bands[0];
        assert_eq!((a.x0, a.x1, a.points.clone()), (0, 3, vec![0, 0]));
        assert_eq!(a.free_requested_us, Some(100));
        let b = &t.bands[1];
        assert_eq!((b.x0, b.x1), (1, 4));
        // Freed in column 2, block 100 is drawn through it; block 200 moves down after it.
        assert_eq!(b.points, vec![1, 10, 3, 0]);
        assert_eq!(b.free_us, None, "still live");
        assert_eq!(t.bands[2].points, vec![3, 20]);
    }

    #[test]
    fn blocks_from_before_the_trace_start_at_the_bottom() {
        use TraceAction::{Alloc, FreeCompleted, SegmentAlloc};
        // 500 was allocated before the trace and is freed in it; 900 is live in the snapshot
        // with no alloc in the trace.
        let s = snapshot(
            vec![
                e(SegmentAlloc, 0, 1 << 20),
                e(Alloc, 100, 10),
                e(FreeCompleted, 500, 5),
                e(Alloc, 300, 1),
            ],
            &[(900, 7), (100, 10), (300, 1)],
        );
        let t = build(&s, 0);
        assert_eq!(t.blocks, 4);
        assert_eq!(t.columns.alloc_max, vec![22, 22, 18]);
        assert_eq!(t.columns.alloc_end, vec![22, 17, 18]);
        assert_eq!(t.columns.reserved_max, vec![1 << 20; 3]);
        let addrs: Vec<&str> = t.bands.iter().map(|b| b.addr.as_str()).collect();
        let order = ["0x384", "0x1f4", "0x64", "0x12c"];
        assert_eq!(addrs, order, "live, then freed, then the trace's");
        assert_eq!(t.bands[2].points, vec![0, 12, 2, 7]);
    }

    #[test]
    fn a_second_alloc_at_a_live_address_ends_the_first() {
        use TraceAction::Alloc;
        let s = snapshot(vec![e(Alloc, 100, 10), e(Alloc, 100, 4)], &[]);
        let t = build(&s, 0);
        assert_eq!(t.steps, 3);
        assert_eq!(t.columns.alloc_end, vec![10, 0, 4]);
    }

    #[test]
    fn long_traces_fall_into_bounded_columns() {
        let trace: Vec<TraceEntry> = (0..20_000u64)
            .flat_map(|i| {
                [
                    e(TraceAction::Alloc, 1000 + i, 1 + i % 7),
                    e(TraceAction::FreeCompleted, 1000 + i, 1 + i % 7),
                ]
            })
            .collect();
        let t = build(&snapshot(trace, &[]), 0);
        assert_eq!(t.steps, 40_000);
        assert_eq!(t.columns.step.len(), MAX_COLUMNS);
        assert_eq!(t.peak_bytes, 7);
        assert_eq!(t.columns.alloc_max.iter().max(), Some(&7));
        assert!(t.bands.len() <= MAX_BANDS);
    }
}
