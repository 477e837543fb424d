//! [`SimBackend`]: a simulated device, a first-class backend (cubecl's `BytesStorage`).
//!
//! It has a capacity in bytes, hands out non-overlapping, increasing addresses (or, on request,
//! the exact segment addresses a PyTorch trace recorded), supports virtual memory for expandable
//! segments, keeps events that complete only when told, counts every call, and can be told to
//! fail the Nth `malloc`. No memory is touched: addresses are numbers.
//!
//! Virtual memory is modelled as the CUDA driver does it: each `map` call makes one mapping
//! (one `cuMemCreate` handle on a GPU), and `unmap` takes whole mappings only. A range that
//! would split a mapping is refused with [`BackendError::SplitsMapping`], so a policy that
//! would fail on a GPU fails the same way in every simulated test.

use std::collections::{BTreeMap, HashMap, VecDeque};

use std::ptr::NonNull;

use super::sim_bytes::SimBytes;
use super::{DevicePtr, MemInfo, MemoryBackend, StreamId, VirtualMemoryBackend};
use crate::error::BackendError;
use crate::sync::{Mutex, MutexGuard};

/// The first address the simulator hands out.
const BASE_ADDR: u64 = 1 << 40;
/// Gap left between consecutive segments, so that neighbours are never contiguous by accident.
const GAP: u64 = 2 << 20;

/// The simulated address space ends here (2^62): every range handed out lies in
/// `[BASE_ADDR, ADDR_LIMIT)`, so no address sum of the simulator can overflow a `u64` (fuzzing
/// found `--real-addrs` near 2^64 giving a block address 0, and huge capacities wrapping).
const ADDR_LIMIT: u64 = 1 << 62;

/// Bytes of address space a [`SimBackend`] hands out, segments and reservations together
/// (`2^62 − 2^40`). Expandable segments reserve 9/8 of the capacity for each stream and pool,
/// `paged` twice the capacity for each stream while the address space lasts (then less:
/// `Note [Paged address space]`), so a capacity near [`MAX_SIM_CAPACITY`] leaves room for a
/// few dozen streams only of such reservations.
pub const ADDRESS_SPACE_BYTES: u64 = ADDR_LIMIT - BASE_ADDR;

/// The largest capacity a [`SimBackend`] simulates (2^56 bytes, 64 PiB); larger capacities are
/// clamped to it. Reservations of twice the capacity still fit under the address limit.
pub const MAX_SIM_CAPACITY: u64 = 1 << 56;

/// Counts of every backend call made on a [`SimBackend`] (failed calls included).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimCounts {
    /// `malloc` calls.
    pub malloc: u64,
    /// `malloc` calls that failed.
    pub malloc_failed: u64,
    /// `free` calls.
    pub free: u64,
    /// `mem_info` calls.
    pub mem_info: u64,
    /// `record_fence` calls.
    pub record_fence: u64,
    /// `query_fence` calls.
    pub query_fence: u64,
    /// `sync_fence` calls.
    pub sync_fence: u64,
    /// `reserve` calls (virtual address space).
    pub reserve: u64,
    /// `map` calls.
    pub map: u64,
    /// `unmap` calls.
    pub unmap: u64,
    /// `release` calls.
    pub release: u64,
    /// `copy_to_host` and `copy_from_host` calls.
    pub copies: u64,
}

impl SimCounts {
    /// Calls that create, map, unmap or free device memory (`malloc` + `free` + `map` + `unmap`),
    /// the `device_calls` figure of `berth replay`.
    pub fn device_calls(&self) -> u64 {
        self.malloc + self.free + self.map + self.unmap
    }
}

/// A fence of the simulator: a ticket on a stream's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SimFence {
    stream: StreamId,
    seq: u64,
}

impl SimFence {
    /// The stream it was recorded on.
    pub fn stream(&self) -> StreamId {
        self.stream
    }
}

#[derive(Default, Clone, Copy)]
struct StreamClock {
    recorded: u64,
    completed: u64,
}

#[derive(Default)]
struct SimState {
    next_addr: u64,
    planned: VecDeque<u64>,
    /// Live segments: address → bytes.
    segments: BTreeMap<u64, u64>,
    /// Address reservations: base → bytes.
    reservations: BTreeMap<u64, u64>,
    /// Live mappings: start address → (bytes, page bytes). A run of equal pages mapped by one
    /// [`VirtualMemoryBackend::map_pages`] call is one entry of `count × page` bytes, each page
    /// its own mapping; a `map` call is one entry whose page is the whole range.
    mappings: BTreeMap<u64, (u64, u64)>,
    /// What was written into mapped memory.
    bytes: SimBytes,
    used: u64,
    clocks: HashMap<StreamId, StreamClock>,
    fail_malloc_at: Option<u64>,
    auto_complete: bool,
    initialized: bool,
    counts: SimCounts,
}

/// A simulated device of a fixed capacity.
///
/// ```
/// use berth_alloc::backend::{sim::SimBackend, MemoryBackend, StreamId};
/// let sim = SimBackend::new(1 << 30);
/// let p = sim.malloc(4 << 20, StreamId::DEFAULT).unwrap();
/// assert_eq!(sim.used_bytes(), 4 << 20);
/// // SAFETY: `p` came from this backend with this size and is freed once.
/// unsafe { sim.free(p, 4 << 20, StreamId::DEFAULT).unwrap() };
/// assert_eq!(sim.counts().malloc, 1);
/// ```
pub struct SimBackend {
    capacity: u64,
    context_bytes: u64,
    alignment: usize,
    granularity: usize,
    state: Mutex<SimState>,
}

impl std::fmt::Debug for SimBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimBackend")
            .field("capacity", &self.capacity)
            .field("used", &self.used_bytes())
            .finish()
    }
}

/// `v` rounded up to a multiple of `a`, saturating at `u64::MAX` (then refused by the range
/// checks as outside the address space).
fn align_up(v: u64, a: u64) -> u64 {
    v.div_ceil(a).saturating_mul(a)
}

impl SimBackend {
    /// A device with `capacity` bytes (at most [`MAX_SIM_CAPACITY`]; more is clamped), 512-byte
    /// alignment and 2 MiB mapping granularity.
    pub fn new(capacity: u64) -> Self {
        SimBackend {
            capacity: capacity.min(MAX_SIM_CAPACITY),
            context_bytes: 0,
            alignment: 512,
            granularity: 2 << 20,
            state: Mutex::new(SimState {
                next_addr: BASE_ADDR,
                ..Default::default()
            }),
        }
    }

    /// The capacity of an H200 as `cudaMemGetInfo` reports it (150 109 880 320 bytes), the
    /// device PyTorch's traces were recorded on.
    pub const H200_BYTES: u64 = 150_109_880_320;

    /// Simulates a driver context of `bytes` bytes that counts as used device memory once the
    /// device is first used, outside any allocator: why `empty_cache()` never brings a
    /// process's device usage to zero (<https://github.com/pytorch/pytorch/issues/60150>).
    pub fn with_context_bytes(mut self, bytes: u64) -> Self {
        self.context_bytes = bytes;
        self
    }

    /// Hands out these segment addresses, in order, to the next `malloc` calls (a trace's
    /// `segment_alloc` rows); an address that would overlap a live segment is skipped, and when
    /// the list runs out fresh increasing addresses follow.
    pub fn with_addresses(self, addrs: impl IntoIterator<Item = u64>) -> Self {
        self.lock().planned = addrs.into_iter().collect();
        self
    }

    /// Makes every event complete as soon as it is recorded (a device that is always idle).
    pub fn with_events_completing_immediately(self) -> Self {
        self.lock().auto_complete = true;
        self
    }

    fn lock(&self) -> MutexGuard<'_, SimState> {
        // A panic while holding this lock cannot leave the state half-updated in a way that
        // matters for a simulator; keep going.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes the `n`-th `malloc` call (1-based, counted from creation) fail with
    /// [`BackendError::OutOfMemory`]; later calls succeed again.
    pub fn fail_malloc_at(&self, n: u64) {
        self.lock().fail_malloc_at = Some(n);
    }

    /// Completes every event recorded so far on `stream`.
    pub fn complete_events_on(&self, stream: StreamId) {
        let mut st = self.lock();
        let clock = st.clocks.entry(stream).or_default();
        clock.completed = clock.recorded;
    }

    /// Completes every event recorded so far on every stream.
    pub fn complete_all(&self) {
        for clock in self.lock().clocks.values_mut() {
            clock.completed = clock.recorded;
        }
    }

    /// Events recorded on `stream` and not completed yet.
    pub fn pending_events(&self, stream: StreamId) -> u64 {
        self.lock()
            .clocks
            .get(&stream)
            .map_or(0, |c| c.recorded - c.completed)
    }

    /// Counts of every call so far.
    pub fn counts(&self) -> SimCounts {
        self.lock().counts
    }

    /// Bytes of device memory in use (live segments plus mapped pages; the context excluded).
    pub fn used_bytes(&self) -> u64 {
        self.lock().used
    }

    /// Number of live (not freed) segments.
    pub fn live_segments(&self) -> usize {
        self.lock().segments.len()
    }

    /// Number of live mappings: successful `map` calls whose range is not unmapped yet (on a
    /// GPU, the physical handles mapped).
    pub fn live_mappings(&self) -> usize {
        self.lock()
            .mappings
            .values()
            .map(|&(n, page)| usize::try_from(n / page).unwrap_or(usize::MAX))
            .fold(0, usize::saturating_add)
    }

    /// The live mappings `(start, bytes)` in address order, a run of pages as its pages (one
    /// entry each: for tests of small ranges).
    pub fn mappings(&self) -> Vec<(DevicePtr, u64)> {
        self.lock()
            .mappings
            .iter()
            .flat_map(|(&a, &(n, page))| {
                (0..n / page).map(move |k| (DevicePtr(a + k * page), page))
            })
            .collect()
    }

    /// Live mapping entries as recorded (a run of pages is one): the simulator's bookkeeping.
    pub fn mapping_entries(&self) -> usize {
        self.lock().mappings.len()
    }

    /// Whether any call has used the device yet (the simulated context exists).
    pub fn is_initialized(&self) -> bool {
        self.lock().initialized
    }

    /// The capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    fn available(&self, st: &SimState) -> u64 {
        let context = if st.initialized {
            self.context_bytes
        } else {
            0
        };
        self.capacity.saturating_sub(st.used + context)
    }

    /// A fresh range of `bytes`, or `None` when the simulated address space is exhausted.
    /// Records a mapping of `bytes` bytes at `addr` in pages of `page` bytes (`count` of them:
    /// the `map` calls it stands for).
    fn map_run(&self, addr: u64, bytes: u64, page: u64, count: u64) -> Result<(), BackendError> {
        let mut st = self.lock();
        st.counts.map += count;
        self.check_range(&st, addr, bytes, "map")?;
        let overlaps = st
            .mappings
            .range(..addr.saturating_add(bytes))
            .next_back()
            .is_some_and(|(&a, &(n, _))| a.saturating_add(n) > addr);
        if overlaps {
            return Err(BackendError::Other {
                op: "map",
                message: format!("range {addr:#x}+{bytes} is already partly mapped"),
            });
        }
        if bytes > self.available(&st) {
            return Err(BackendError::OutOfMemory { op: "map", bytes });
        }
        st.mappings.insert(addr, (bytes, page));
        st.used += bytes;
        Ok(())
    }

    fn fresh_range(&self, st: &mut SimState, bytes: u64) -> Option<u64> {
        let g = self.granularity as u64;
        let addr = align_up(st.next_addr, g);
        let next = addr
            .checked_add(align_up(bytes.max(1), g))
            .and_then(|e| e.checked_add(GAP))
            .filter(|&e| e <= ADDR_LIMIT)?;
        st.next_addr = next;
        Some(addr)
    }

    fn overlaps(st: &SimState, addr: u64, bytes: u64) -> bool {
        let end = addr.saturating_add(bytes);
        let seg = st
            .segments
            .range(..end)
            .next_back()
            .is_some_and(|(&a, &b)| a.saturating_add(b) > addr);
        let res = st
            .reservations
            .range(..end)
            .next_back()
            .is_some_and(|(&a, &b)| a.saturating_add(b) > addr);
        seg || res
    }
}

impl MemoryBackend for SimBackend {
    type Fence = SimFence;

    fn malloc(&self, bytes: usize, _stream: StreamId) -> Result<DevicePtr, BackendError> {
        let mut st = self.lock();
        st.initialized = true;
        st.counts.malloc += 1;
        let bytes = bytes as u64;
        let fail = st.fail_malloc_at == Some(st.counts.malloc);
        if fail || bytes > self.available(&st) {
            st.counts.malloc_failed += 1;
            return Err(BackendError::OutOfMemory {
                op: "malloc",
                bytes,
            });
        }
        let addr = loop {
            match st.planned.pop_front() {
                // A planned address is used only if its whole range stays inside the simulated
                // address space.
                Some(a)
                    if a >= BASE_ADDR
                        && a.is_multiple_of(self.alignment as u64)
                        && a.checked_add(bytes).is_some_and(|e| e <= ADDR_LIMIT - GAP)
                        && !Self::overlaps(&st, a, bytes) =>
                {
                    st.next_addr = st.next_addr.max(a + bytes + GAP);
                    break a;
                }
                Some(_) => continue,
                None => match self.fresh_range(&mut st, bytes) {
                    Some(a) => break a,
                    None => {
                        st.counts.malloc_failed += 1;
                        return Err(BackendError::OutOfMemory {
                            op: "malloc",
                            bytes,
                        });
                    }
                },
            }
        };
        st.segments.insert(addr, bytes);
        st.used += bytes;
        Ok(DevicePtr(addr))
    }

    unsafe fn free(
        &self,
        ptr: DevicePtr,
        bytes: usize,
        _stream: StreamId,
    ) -> Result<(), BackendError> {
        let mut st = self.lock();
        st.counts.free += 1;
        match st.segments.get(&ptr.0) {
            Some(&b) if b == bytes as u64 => {
                st.segments.remove(&ptr.0);
                st.used -= b;
                Ok(())
            }
            Some(&b) => Err(BackendError::Other {
                op: "free",
                message: format!("segment {ptr} has {b} bytes but free was given {bytes}"),
            }),
            None => Err(BackendError::InvalidPointer { op: "free", ptr }),
        }
    }

    fn mem_info(&self) -> Result<MemInfo, BackendError> {
        let mut st = self.lock();
        st.initialized = true;
        st.counts.mem_info += 1;
        Ok(MemInfo {
            free_bytes: self.available(&st),
            total_bytes: self.capacity,
        })
    }

    fn record_fence(&self, stream: StreamId) -> Result<SimFence, BackendError> {
        let mut st = self.lock();
        st.initialized = true;
        st.counts.record_fence += 1;
        let auto = st.auto_complete;
        let clock = st.clocks.entry(stream).or_default();
        clock.recorded += 1;
        if auto {
            clock.completed = clock.recorded;
        }
        Ok(SimFence {
            stream,
            seq: clock.recorded,
        })
    }

    fn query_fence(&self, event: &SimFence) -> Result<bool, BackendError> {
        let mut st = self.lock();
        st.counts.query_fence += 1;
        Ok(st
            .clocks
            .get(&event.stream)
            .is_some_and(|c| c.completed >= event.seq))
    }

    fn sync_fence(&self, event: &SimFence) -> Result<(), BackendError> {
        let mut st = self.lock();
        st.counts.sync_fence += 1;
        let clock = st.clocks.entry(event.stream).or_default();
        clock.completed = clock.completed.max(event.seq);
        Ok(())
    }

    fn alignment(&self) -> usize {
        self.alignment
    }

    fn as_virtual(&self) -> Option<&dyn VirtualMemoryBackend> {
        Some(self)
    }
}

impl SimBackend {
    /// Refuses a range that is not entirely mapped.
    fn check_mapped(
        st: &SimState,
        addr: u64,
        bytes: u64,
        op: &'static str,
    ) -> Result<(), BackendError> {
        let mut at = addr;
        let end = addr.saturating_add(bytes);
        if let Some((&a, &(n, _))) = st.mappings.range(..=addr).next_back() {
            at = if a + n > addr { a + n } else { addr };
        }
        for (&a, &(n, _)) in st.mappings.range(addr.saturating_add(1)..end) {
            if a > at {
                break;
            }
            at = at.max(a + n);
        }
        if at < end {
            return Err(BackendError::Other {
                op,
                message: format!("range {addr:#x}+{bytes} is not entirely mapped"),
            });
        }
        Ok(())
    }

    /// Writes `data` into mapped device memory at `ptr` (what a kernel would do), so a test
    /// can check that the memory survives a copy.
    ///
    /// # Errors
    /// [`BackendError::Other`] when the range is not entirely mapped.
    pub fn write_bytes(&self, ptr: DevicePtr, data: &[u8]) -> Result<(), BackendError> {
        let mut st = self.lock();
        Self::check_mapped(&st, ptr.0, data.len() as u64, "write_bytes")?;
        st.bytes.write(ptr.0, data);
        Ok(())
    }

    /// Reads `len` bytes of mapped device memory at `ptr` (zero where nothing was written
    /// since it was mapped).
    ///
    /// # Errors
    /// [`BackendError::Other`] when the range is not entirely mapped.
    pub fn read_bytes(&self, ptr: DevicePtr, len: usize) -> Result<Vec<u8>, BackendError> {
        let st = self.lock();
        Self::check_mapped(&st, ptr.0, len as u64, "read_bytes")?;
        let mut out = vec![0u8; len];
        st.bytes.read(ptr.0, &mut out);
        Ok(out)
    }

    fn check_range(
        &self,
        st: &SimState,
        addr: u64,
        bytes: u64,
        op: &'static str,
    ) -> Result<(), BackendError> {
        let g = self.granularity as u64;
        if !addr.is_multiple_of(g) || !bytes.is_multiple_of(g) || bytes == 0 {
            return Err(BackendError::Other {
                op,
                message: format!("range {addr:#x}+{bytes} is not a non-empty multiple of the {g}-byte granularity"),
            });
        }
        let inside = st
            .reservations
            .range(..=addr)
            .next_back()
            .is_some_and(|(&a, &b)| {
                addr.checked_add(bytes)
                    .is_some_and(|end| end <= a.saturating_add(b))
            });
        if !inside {
            return Err(BackendError::Other {
                op,
                message: format!("range {addr:#x}+{bytes} is outside every reservation"),
            });
        }
        Ok(())
    }
}

impl VirtualMemoryBackend for SimBackend {
    fn granularity(&self) -> usize {
        self.granularity
    }

    fn reserve(&self, bytes: usize) -> Result<DevicePtr, BackendError> {
        let mut st = self.lock();
        st.initialized = true;
        st.counts.reserve += 1;
        let bytes = align_up(bytes as u64, self.granularity as u64);
        let addr = self
            .fresh_range(&mut st, bytes)
            .ok_or(BackendError::OutOfMemory {
                op: "reserve",
                bytes,
            })?;
        st.reservations.insert(addr, bytes);
        Ok(DevicePtr(addr))
    }

    fn map(&self, addr: DevicePtr, bytes: usize, _stream: StreamId) -> Result<(), BackendError> {
        self.map_run(addr.0, bytes as u64, bytes as u64, 1)
    }

    fn map_pages(
        &self,
        addr: DevicePtr,
        page_bytes: usize,
        count: usize,
        _stream: StreamId,
    ) -> Result<(), BackendError> {
        let Some(bytes) = (page_bytes as u64).checked_mul(count as u64) else {
            return Err(BackendError::OutOfMemory {
                op: "map",
                bytes: u64::MAX,
            });
        };
        if count == 0 {
            return Ok(());
        }
        self.map_run(addr.0, bytes, page_bytes as u64, count as u64)
    }

    unsafe fn unmap(
        &self,
        addr: DevicePtr,
        bytes: usize,
        _stream: StreamId,
    ) -> Result<(), BackendError> {
        let mut st = self.lock();
        st.counts.unmap += 1;
        let (addr, bytes) = (addr.0, bytes as u64);
        self.check_range(&st, addr, bytes, "unmap")?;
        let end = addr + bytes;
        let splits = |a: u64, n: u64| BackendError::SplitsMapping {
            op: "unmap",
            addr: DevicePtr(addr),
            bytes,
            mapping: DevicePtr(a),
            mapping_bytes: n,
        };
        // A mapping that starts before the range and reaches into it would be cut in two,
        // unless it is a run of pages cut at a page boundary (each page is its own mapping).
        let mut head = None;
        if let Some((&a, &(n, page))) = st.mappings.range(..addr).next_back() {
            if a + n > addr {
                if (addr - a) % page != 0 {
                    return Err(splits(a, n));
                }
                head = Some((a, n, page));
            }
        }
        let mut at = head.map_or(addr, |(a, n, _)| (a + n).min(end));
        let mut tail = None;
        if head.is_none_or(|(a, n, _)| a + n < end) {
            for (&a, &(n, page)) in st.mappings.range(addr..end) {
                if a != at {
                    break; // a hole: reported below
                }
                if a + n > end {
                    if (end - a) % page != 0 {
                        return Err(splits(a, n));
                    }
                    tail = Some((a, n, page));
                    at = end;
                    break;
                }
                at = a + n;
            }
        }
        if at != end {
            return Err(BackendError::Other {
                op: "unmap",
                message: format!("range {addr:#x}+{bytes} is not entirely mapped"),
            });
        }
        let starts: Vec<u64> = st.mappings.range(addr..end).map(|(&a, _)| a).collect();
        for a in starts {
            st.mappings.remove(&a);
        }
        // What is left of runs cut at a page boundary.
        if let Some((a, n, page)) = head {
            st.mappings.insert(a, (addr - a, page));
            if a + n > end {
                st.mappings.insert(end, (a + n - end, page));
            }
        }
        if let Some((a, n, page)) = tail {
            st.mappings.insert(end, (a + n - end, page));
        }
        st.bytes.forget(addr, bytes);
        st.used -= bytes;
        Ok(())
    }

    unsafe fn copy_to_host(
        &self,
        src: DevicePtr,
        dst: NonNull<u8>,
        bytes: usize,
    ) -> Result<(), BackendError> {
        let mut st = self.lock();
        st.counts.copies += 1;
        Self::check_mapped(&st, src.0, bytes as u64, "copy_to_host")?;
        // SAFETY: the caller promised `dst` is valid for writes of `bytes` bytes.
        let out = unsafe { std::slice::from_raw_parts_mut(dst.as_ptr(), bytes) };
        st.bytes.read(src.0, out);
        Ok(())
    }

    unsafe fn copy_from_host(
        &self,
        dst: DevicePtr,
        src: NonNull<u8>,
        bytes: usize,
    ) -> Result<(), BackendError> {
        let mut st = self.lock();
        st.counts.copies += 1;
        Self::check_mapped(&st, dst.0, bytes as u64, "copy_from_host")?;
        // SAFETY: the caller promised `src` is valid for reads of `bytes` bytes.
        let data = unsafe { std::slice::from_raw_parts(src.as_ptr(), bytes) };
        st.bytes.write(dst.0, data);
        Ok(())
    }

    unsafe fn release(&self, base: DevicePtr, bytes: usize) -> Result<(), BackendError> {
        let mut st = self.lock();
        st.counts.release += 1;
        let Some(&b) = st.reservations.get(&base.0) else {
            return Err(BackendError::InvalidPointer {
                op: "release",
                ptr: base,
            });
        };
        if b != align_up(bytes as u64, self.granularity as u64) {
            return Err(BackendError::Other {
                op: "release",
                message: format!("reservation {base} has {b} bytes, not {bytes}"),
            });
        }
        if st.mappings.range(base.0..base.0 + b).next().is_some() {
            return Err(BackendError::Other {
                op: "release",
                message: format!("reservation {base} still has mapped pages"),
            });
        }
        st.reservations.remove(&base.0);
        Ok(())
    }
}

#[cfg(test)]
#[path = "sim_tests.rs"]
mod tests;
