//! [`HostStats`]: the pinned host allocator's statistics with PyTorch's names
//! (`HostStats` in `aten/src/ATen/core/CachingHostAllocator.h`, `torch.cuda.host_memory_stats()`).

use std::collections::BTreeMap;

use crate::stats::Stat;

/// PyTorch's `DurationStat`: a running total, extremes and count of call durations, in
/// microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DurationStat {
    /// SUM: total duration in µs.
    pub total: i64,
    /// The longest duration in µs (0 before the first).
    pub max: i64,
    /// The shortest duration in µs (0 before the first).
    pub min: i64,
    /// COUNT: number of durations recorded.
    pub count: i64,
}

impl DurationStat {
    /// Records one duration of `us` microseconds.
    pub fn record(&mut self, us: i64) {
        self.total += us;
        self.max = if self.count == 0 {
            us
        } else {
            self.max.max(us)
        };
        self.min = if self.count == 0 {
            us
        } else {
            self.min.min(us)
        };
        self.count += 1;
    }

    /// The mean in µs, `total / count` in integer division as PyTorch computes it (0 when
    /// empty).
    pub fn avg(&self) -> i64 {
        if self.count == 0 {
            0
        } else {
            self.total / self.count
        }
    }

    /// Forgets every recorded duration (`reset_accumulated_host_memory_stats`).
    pub fn reset(&mut self) {
        *self = DurationStat::default();
    }
}

/// Statistics of a [`super::HostCachingAllocator`]; field names are the key prefixes of
/// `torch.cuda.host_memory_stats()`.
///
/// Unlike PyTorch (whose peaks are summed over 64 per-bucket counters and whose `active_*`
/// figures drift; `aten/src/ATen/core/CachingHostAllocator.h`,
/// <https://github.com/pytorch/pytorch/blob/main/aten/src/ATen/core/CachingHostAllocator.h>),
/// every figure here is updated under one lock and is exact.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostStats {
    /// COUNT: blocks owned by the allocator (checked out, waiting on events, or cached).
    pub allocations: Stat,
    /// SUM: bytes of blocks owned (rounded sizes), in use and cached.
    pub allocated_bytes: Stat,
    /// COUNT: blocks checked out (handed to a caller and not yet dropped).
    pub active_requests: Stat,
    /// SUM: bytes of blocks checked out (rounded sizes).
    pub active_bytes: Stat,
    /// Time spent in `cudaHostAlloc` / `cudaHostRegister`, in µs.
    pub host_alloc_time: DurationStat,
    /// Time spent in `cudaFreeHost` / `cudaHostUnregister`, in µs.
    pub host_free_time: DurationStat,
    /// COUNT: backend allocations (requests no cached block could serve).
    pub num_host_alloc: i64,
    /// COUNT: backend frees.
    pub num_host_free: i64,
}

impl HostStats {
    /// `torch.cuda.host_memory_stats()`: the 28 flat keys, sorted (`allocations.current`,
    /// `host_alloc_time.avg`, `num_host_alloc`, ...).
    pub fn to_map(&self) -> BTreeMap<String, i64> {
        let mut m = BTreeMap::new();
        for (name, s) in [
            ("active_bytes", &self.active_bytes),
            ("active_requests", &self.active_requests),
            ("allocated_bytes", &self.allocated_bytes),
            ("allocations", &self.allocations),
        ] {
            m.insert(format!("{name}.current"), s.current);
            m.insert(format!("{name}.peak"), s.peak);
            m.insert(format!("{name}.allocated"), s.allocated);
            m.insert(format!("{name}.freed"), s.freed);
        }
        for (name, d) in [
            ("host_alloc_time", &self.host_alloc_time),
            ("host_free_time", &self.host_free_time),
        ] {
            m.insert(format!("{name}.total"), d.total);
            m.insert(format!("{name}.max"), d.max);
            m.insert(format!("{name}.min"), d.min);
            m.insert(format!("{name}.count"), d.count);
            m.insert(format!("{name}.avg"), d.avg());
        }
        m.insert("num_host_alloc".into(), self.num_host_alloc);
        m.insert("num_host_free".into(), self.num_host_free);
        m
    }

    /// Sets every peak to its current value (`reset_peak_host_memory_stats`).
    pub fn reset_peak(&mut self) {
        for s in [
            &mut self.allocations,
            &mut self.allocated_bytes,
            &mut self.active_requests,
            &mut self.active_bytes,
        ] {
            s.reset_peak();
        }
    }

    /// Zeroes the accumulated counters, the durations and the call counts
    /// (`reset_accumulated_host_memory_stats`).
    pub fn reset_accumulated(&mut self) {
        for s in [
            &mut self.allocations,
            &mut self.allocated_bytes,
            &mut self.active_requests,
            &mut self.active_bytes,
        ] {
            s.reset_accumulated();
        }
        self.host_alloc_time.reset();
        self.host_free_time.reset();
        self.num_host_alloc = 0;
        self.num_host_free = 0;
    }
}
