//! Statistics with PyTorch's names and meanings (`c10/core/CachingDeviceAllocator.h`,
//! `DeviceStats`; `torch.cuda.memory_stats()`).

use std::collections::BTreeMap;

/// One statistic: PyTorch's `Stat` (all values signed 64-bit like PyTorch's `int64_t`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Stat {
    /// The value now.
    pub current: i64,
    /// The largest `current` since creation or the last peak reset.
    pub peak: i64,
    /// The sum of all increases since creation or the last accumulated reset.
    pub allocated: i64,
    /// The sum of all decreases since creation or the last accumulated reset.
    pub freed: i64,
}

impl Stat {
    /// Adds `amount` (PyTorch's `Stat::increase`).
    #[inline]
    pub fn increase(&mut self, amount: i64) {
        self.current += amount;
        self.allocated += amount;
        if self.current > self.peak {
            self.peak = self.current;
        }
    }

    /// Subtracts `amount` (PyTorch's `Stat::decrease`).
    #[inline]
    pub fn decrease(&mut self, amount: i64) {
        self.current -= amount;
        self.freed += amount;
    }

    /// Sets `peak` to `current` (`reset_peak`).
    pub fn reset_peak(&mut self) {
        self.peak = self.current;
    }

    /// Zeroes `allocated` and `freed` (`reset_accumulated`).
    pub fn reset_accumulated(&mut self) {
        self.allocated = 0;
        self.freed = 0;
    }
}

/// Which pool a statistic covers (PyTorch's `StatType`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StatKind {
    /// Both pools (`all`).
    Aggregate = 0,
    /// The small pool, blocks ≤ 1 MiB (`small_pool`).
    SmallPool = 1,
    /// The large pool (`large_pool`).
    LargePool = 2,
}

impl StatKind {
    /// PyTorch's key segment: `all`, `small_pool`, `large_pool`.
    pub fn as_str(self) -> &'static str {
        match self {
            StatKind::Aggregate => "all",
            StatKind::SmallPool => "small_pool",
            StatKind::LargePool => "large_pool",
        }
    }

    /// All three, in PyTorch's order.
    pub const ALL: [StatKind; 3] = [
        StatKind::Aggregate,
        StatKind::SmallPool,
        StatKind::LargePool,
    ];
}

/// Three [`Stat`]s indexed by [`StatKind`] (PyTorch's `StatArray`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct StatArray(pub [Stat; 3]);

impl StatArray {
    /// The entry for `kind`.
    pub fn get(&self, kind: StatKind) -> &Stat {
        &self.0[kind as usize]
    }

    /// The `all` entry.
    pub fn all(&self) -> &Stat {
        &self.0[0]
    }

    /// Increases `all` and the entry of the pool (`small` or large).
    #[inline]
    pub fn increase(&mut self, small: bool, amount: i64) {
        self.0[0].increase(amount);
        self.0[if small { 1 } else { 2 }].increase(amount);
    }

    /// Decreases `all` and the entry of the pool (`small` or large).
    #[inline]
    pub fn decrease(&mut self, small: bool, amount: i64) {
        self.0[0].decrease(amount);
        self.0[if small { 1 } else { 2 }].decrease(amount);
    }

    fn for_each(&mut self, f: impl Fn(&mut Stat)) {
        self.0.iter_mut().for_each(f);
    }
}

/// Every statistic of one device allocator (PyTorch's `DeviceStats`); field names are the keys
/// of `torch.cuda.memory_stats()`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct MemoryStats {
    /// COUNT: allocated blocks (handed out, free not yet requested).
    pub allocation: StatArray,
    /// COUNT: segments (`cudaMalloc` results).
    pub segment: StatArray,
    /// COUNT: active blocks (allocated or pending free).
    pub active: StatArray,
    /// COUNT: free blocks inside partly used segments ("non-releasable").
    pub inactive_split: StatArray,
    /// SUM (bytes, rounded): allocated blocks.
    pub allocated_bytes: StatArray,
    /// SUM (bytes): segments, i.e. memory reserved from the backend.
    pub reserved_bytes: StatArray,
    /// SUM (bytes, rounded): active blocks.
    pub active_bytes: StatArray,
    /// SUM (bytes): inactive split blocks.
    pub inactive_split_bytes: StatArray,
    /// SUM (bytes, as requested, unrounded): active blocks.
    pub requested_bytes: StatArray,
    /// COUNT: allocated blocks of at least `max_split_size` bytes.
    pub oversize_allocations: Stat,
    /// COUNT: segments of at least `max_split_size` bytes.
    pub oversize_segments: Stat,
    /// COUNT: full flushes followed by a retry (step 5c of the fallback).
    pub num_alloc_retries: i64,
    /// COUNT: out-of-memory errors raised.
    pub num_ooms: i64,
    /// COUNT: waits on every pending cross-stream event (flushes, `empty_cache`).
    pub num_sync_all_streams: i64,
    /// COUNT: backend segment allocations and page-map calls (`cudaMalloc`, `cuMemMap`).
    pub num_device_alloc: i64,
    /// COUNT: backend segment frees and page-unmap calls (`cudaFree`, `cuMemUnmap`).
    pub num_device_free: i64,
    /// SIZE (bytes): the `max_split_size` setting, −1 when unlimited.
    pub max_split_size: i64,
}

impl MemoryStats {
    /// Fresh statistics with `max_split_size` (bytes; `None` = unlimited, reported as −1).
    pub fn new(max_split_size: Option<u64>) -> Self {
        MemoryStats {
            max_split_size: max_split_size.map_or(-1, |v| v as i64),
            ..Default::default()
        }
    }

    fn arrays(&self) -> [(&'static str, &StatArray); 9] {
        [
            ("active", &self.active),
            ("active_bytes", &self.active_bytes),
            ("allocated_bytes", &self.allocated_bytes),
            ("allocation", &self.allocation),
            ("inactive_split", &self.inactive_split),
            ("inactive_split_bytes", &self.inactive_split_bytes),
            ("requested_bytes", &self.requested_bytes),
            ("reserved_bytes", &self.reserved_bytes),
            ("segment", &self.segment),
        ]
    }

    fn arrays_mut(&mut self) -> [&mut StatArray; 9] {
        [
            &mut self.active,
            &mut self.active_bytes,
            &mut self.allocated_bytes,
            &mut self.allocation,
            &mut self.inactive_split,
            &mut self.inactive_split_bytes,
            &mut self.requested_bytes,
            &mut self.reserved_bytes,
            &mut self.segment,
        ]
    }

    /// `torch.cuda.memory_stats()`: the 122 dotted keys, sorted (`active.all.current`, ...,
    /// `num_ooms`, `oversize_allocations.peak`, ...).
    pub fn to_map(&self) -> BTreeMap<String, i64> {
        let mut map = BTreeMap::new();
        let fields = |s: &Stat| {
            [
                ("current", s.current),
                ("peak", s.peak),
                ("allocated", s.allocated),
                ("freed", s.freed),
            ]
        };
        for (group, array) in self.arrays() {
            for kind in StatKind::ALL {
                for (field, value) in fields(array.get(kind)) {
                    map.insert(format!("{group}.{}.{field}", kind.as_str()), value);
                }
            }
        }
        for (group, stat) in [
            ("oversize_allocations", &self.oversize_allocations),
            ("oversize_segments", &self.oversize_segments),
        ] {
            for (field, value) in fields(stat) {
                map.insert(format!("{group}.{field}"), value);
            }
        }
        map.insert("num_alloc_retries".into(), self.num_alloc_retries);
        map.insert("num_ooms".into(), self.num_ooms);
        map.insert("num_sync_all_streams".into(), self.num_sync_all_streams);
        map.insert("num_device_alloc".into(), self.num_device_alloc);
        map.insert("num_device_free".into(), self.num_device_free);
        map.insert("max_split_size".into(), self.max_split_size);
        map
    }

    /// `reset_peak_memory_stats`: every peak becomes its current value; nothing else changes.
    pub fn reset_peak(&mut self) {
        for array in self.arrays_mut() {
            array.for_each(Stat::reset_peak);
        }
        self.oversize_allocations.reset_peak();
        self.oversize_segments.reset_peak();
    }

    /// `reset_accumulated_memory_stats`: zero every `allocated`/`freed` and the five event
    /// counters.
    pub fn reset_accumulated(&mut self) {
        for array in self.arrays_mut() {
            array.for_each(Stat::reset_accumulated);
        }
        self.oversize_allocations.reset_accumulated();
        self.oversize_segments.reset_accumulated();
        self.num_alloc_retries = 0;
        self.num_ooms = 0;
        self.num_sync_all_streams = 0;
        self.num_device_alloc = 0;
        self.num_device_free = 0;
    }

    /// `memory_allocated()`: bytes currently allocated.
    pub fn memory_allocated(&self) -> u64 {
        self.allocated_bytes.all().current.max(0) as u64
    }

    /// `max_memory_allocated()`: peak of allocated bytes.
    pub fn max_memory_allocated(&self) -> u64 {
        self.allocated_bytes.all().peak.max(0) as u64
    }

    /// `memory_reserved()`: bytes currently reserved from the backend.
    pub fn memory_reserved(&self) -> u64 {
        self.reserved_bytes.all().current.max(0) as u64
    }

    /// `max_memory_reserved()`: peak of reserved bytes.
    pub fn max_memory_reserved(&self) -> u64 {
        self.reserved_bytes.all().peak.max(0) as u64
    }
}

/// PyTorch's `format_size` (IEC units, two decimals): ≤ 1024 → "N bytes", ≤ 1 MiB → KiB,
/// ≤ 1 GiB → MiB, else GiB.
pub fn format_size(bytes: u64) -> String {
    const KIB: u64 = 1024;
    const MIB: u64 = 1024 * KIB;
    const GIB: u64 = 1024 * MIB;
    if bytes <= KIB {
        format!("{bytes} bytes")
    } else if bytes <= MIB {
        format!("{:.2} KiB", bytes as f64 / KIB as f64)
    } else if bytes <= GIB {
        format!("{:.2} MiB", bytes as f64 / MIB as f64)
    } else {
        format!("{:.2} GiB", bytes as f64 / GIB as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_stats_has_pytorchs_122_keys() {
        let map = MemoryStats::new(None).to_map();
        assert_eq!(map.len(), 122);
        assert_eq!(map["max_split_size"], -1);
        assert!(map.contains_key("inactive_split_bytes.small_pool.freed"));
        assert!(map.contains_key("oversize_segments.peak"));
    }

    #[test]
    fn format_size_matches_pytorch() {
        assert_eq!(format_size(1024), "1024 bytes");
        assert_eq!(format_size(20 << 20), "20.00 MiB");
        assert_eq!(format_size(75_054_940_160), "69.90 GiB");
    }
}
