//! Snapshots and memory history with PyTorch's field and action names
//! (`torch.cuda.memory._snapshot()`, `TraceEntry` in `c10/cuda/CUDACachingAllocator.h`).

use std::collections::VecDeque;

use crate::backend::StreamId;
use crate::config::AllocatorConfig;

/// The state of a block in a snapshot (PyTorch's `state` strings).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum BlockState {
    /// Handed out (`"active_allocated"`).
    ActiveAllocated,
    /// Freed but waiting on other streams' events (`"active_pending_free"`).
    ActivePendingFree,
    /// Cached free memory (`"inactive"`).
    Inactive,
}

impl BlockState {
    /// PyTorch's string.
    pub fn as_str(self) -> &'static str {
        match self {
            BlockState::ActiveAllocated => "active_allocated",
            BlockState::ActivePendingFree => "active_pending_free",
            BlockState::Inactive => "inactive",
        }
    }
}

/// One block of a segment (PyTorch's `BlockInfo` as `_snapshot` writes it).
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct BlockInfo {
    /// Start address.
    pub address: u64,
    /// Size in bytes (rounded).
    pub size: u64,
    /// Bytes requested by its last allocation (kept after free, as in PyTorch).
    pub requested_size: u64,
    /// Its state.
    pub state: BlockState,
}

/// The pool kind of a segment (`segment_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum SegmentType {
    /// Small pool (`"small"`).
    Small,
    /// Large pool (`"large"`).
    Large,
}

impl SegmentType {
    /// PyTorch's string.
    pub fn as_str(self) -> &'static str {
        match self {
            SegmentType::Small => "small",
            SegmentType::Large => "large",
        }
    }
}

/// One segment (PyTorch's `SegmentInfo`); for expandable segments, one contiguous mapped range.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct SegmentInfo {
    /// Device index.
    pub device: i32,
    /// Start address.
    pub address: u64,
    /// Size in bytes.
    pub total_size: u64,
    /// Bytes of `active_allocated` blocks.
    pub allocated_size: u64,
    /// Bytes of active blocks (allocated or pending free).
    pub active_size: u64,
    /// Requested bytes of active blocks.
    pub requested_size: u64,
    /// The stream the segment belongs to.
    pub stream: StreamId,
    /// Small or large pool.
    pub segment_type: SegmentType,
    /// The graph / mempool id, `(0, 0)` for the default pools.
    pub segment_pool_id: (u64, u64),
    /// Whether it belongs to an expandable segment.
    pub is_expandable: bool,
    /// Its blocks in address order.
    pub blocks: Vec<BlockInfo>,
}

/// A trace action (PyTorch's `TraceEntry::Action`; strings as `parseTraceEntryAction`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(rename_all = "snake_case"))]
pub enum TraceAction {
    /// A block was handed out (`"alloc"`).
    Alloc,
    /// The program freed it (`"free_requested"`).
    FreeRequested,
    /// It became reusable (`"free_completed"`).
    FreeCompleted,
    /// A segment was obtained from the backend (`"segment_alloc"`).
    SegmentAlloc,
    /// A segment was returned (`"segment_free"`).
    SegmentFree,
    /// Pages of an expandable segment were mapped (`"segment_map"`).
    SegmentMap,
    /// Pages were unmapped (`"segment_unmap"`).
    SegmentUnmap,
    /// An out-of-memory error (`"oom"`; `addr` holds the device's free bytes).
    Oom,
    /// A snapshot was taken (`"snapshot"`).
    Snapshot,
}

impl TraceAction {
    /// Every action, in PyTorch's enum order.
    pub const ALL: [TraceAction; 9] = [
        TraceAction::Alloc,
        TraceAction::FreeRequested,
        TraceAction::FreeCompleted,
        TraceAction::SegmentAlloc,
        TraceAction::SegmentFree,
        TraceAction::SegmentMap,
        TraceAction::SegmentUnmap,
        TraceAction::Snapshot,
        TraceAction::Oom,
    ];

    /// PyTorch's string.
    pub fn as_str(self) -> &'static str {
        match self {
            TraceAction::Alloc => "alloc",
            TraceAction::FreeRequested => "free_requested",
            TraceAction::FreeCompleted => "free_completed",
            TraceAction::SegmentAlloc => "segment_alloc",
            TraceAction::SegmentFree => "segment_free",
            TraceAction::SegmentMap => "segment_map",
            TraceAction::SegmentUnmap => "segment_unmap",
            TraceAction::Oom => "oom",
            TraceAction::Snapshot => "snapshot",
        }
    }
}

impl std::fmt::Display for TraceAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for TraceAction {
    type Err = UnknownTraceAction;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        TraceAction::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| UnknownTraceAction {
                action: s.to_owned(),
            })
    }
}

/// A trace action string that is not one of PyTorch's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown trace action '{action}'; expected one of alloc, free_requested, free_completed, segment_alloc, segment_free, segment_map, segment_unmap, oom, snapshot")]
pub struct UnknownTraceAction {
    /// The string found.
    pub action: String,
}

/// One entry of the memory history (PyTorch's `TraceEntry`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct TraceEntry {
    /// What happened.
    pub action: TraceAction,
    /// The address (for `oom`: the device's free bytes, PyTorch's `device_free`).
    pub addr: u64,
    /// Bytes: requested size for alloc/free actions, segment or range size for segment
    /// actions, rounded request for `oom`, active bytes for `snapshot`.
    pub size: u64,
    /// The stream.
    pub stream: StreamId,
    /// Microseconds since the Unix epoch (or the replay's clock).
    pub time_us: i64,
}

/// A bounded ring of [`TraceEntry`]s: when full, new entries overwrite the oldest
/// (PyTorch's `TraceEntryRingBuffer`).
#[derive(Clone, Debug, Default)]
pub struct TraceRing {
    entries: VecDeque<TraceEntry>,
    max_entries: usize,
}

impl TraceRing {
    /// An empty ring keeping at most `max_entries` (0 keeps nothing).
    pub fn new(max_entries: usize) -> Self {
        TraceRing {
            entries: VecDeque::with_capacity(max_entries.min(1 << 16)),
            max_entries,
        }
    }

    /// Appends `entry`, dropping the oldest when full.
    pub fn push(&mut self, entry: TraceEntry) {
        if self.max_entries == 0 {
            return;
        }
        if self.entries.len() == self.max_entries {
            self.entries.pop_front();
        }
        self.entries.push_back(entry);
    }

    /// The entries, oldest first.
    pub fn to_vec(&self) -> Vec<TraceEntry> {
        self.entries.iter().copied().collect()
    }

    /// Number of entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the ring holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The capacity.
    pub fn max_entries(&self) -> usize {
        self.max_entries
    }
}

/// A whole allocator snapshot (`torch.cuda.memory._snapshot()`): what
/// `_dump_snapshot` pickles.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct MemorySnapshot {
    /// Segments sorted by address.
    pub segments: Vec<SegmentInfo>,
    /// One history per device (index = device), oldest entry first.
    pub device_traces: Vec<Vec<TraceEntry>>,
    /// The allocator's configuration.
    pub allocator_settings: AllocatorConfig,
    /// The tags asleep when the snapshot was taken (`Note [Sleep and wake]` in
    /// [`crate::paged`]), sorted by tag: their memory is in no segment (it was given back to
    /// the driver), so it is listed here apart. Empty for every policy but `paged`. Written
    /// to pickles under the key `berth_sleeping`, which PyTorch's tools ignore.
    #[cfg_attr(feature = "serde", serde(default))]
    pub sleeping: Vec<SleepingTag>,
}

/// A sleeping tag in a [`MemorySnapshot`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct SleepingTag {
    /// The tag's name.
    pub tag: String,
    /// Device memory the tag gave back to the driver, in bytes.
    pub released_bytes: u64,
    /// Its live blocks (still owned by their tensors), in bytes.
    pub allocated_bytes: u64,
    /// Host memory holding its backups, in bytes (0 when slept without offload).
    pub offloaded_bytes: u64,
}

impl MemorySnapshot {
    /// Total bytes of all segments.
    pub fn total_reserved(&self) -> u64 {
        self.segments.iter().map(|s| s.total_size).sum()
    }

    /// Device bytes given back by sleeping tags (in no segment).
    pub fn sleeping_bytes(&self) -> u64 {
        self.sleeping.iter().map(|t| t.released_bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_ring_keeps_newest() {
        let mut ring = TraceRing::new(2);
        for addr in 1..=3 {
            ring.push(TraceEntry {
                action: TraceAction::Alloc,
                addr,
                size: 1,
                stream: StreamId(0),
                time_us: 0,
            });
        }
        let addrs: Vec<u64> = ring.to_vec().iter().map(|e| e.addr).collect();
        assert_eq!(addrs, vec![2, 3]);
    }

    #[test]
    fn trace_actions_round_trip() {
        for a in TraceAction::ALL {
            assert_eq!(a.as_str().parse::<TraceAction>(), Ok(a));
        }
        assert!("allocate".parse::<TraceAction>().is_err());
    }
}
