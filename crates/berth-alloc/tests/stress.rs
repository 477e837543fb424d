//! Concurrency stress, bounded in time: 8 threads of random allocate / free (on the thread that
//! allocated or on another) / `record_stream` / fence completion (the simulator's `complete_*`)
//! / `empty_cache` / statistics reads on every allocator: PyTorch's caching policy, expandable
//! segments, `paged`, and the pinned host allocator. The simulated devices hold 1 GiB, so the
//! out-of-memory retry paths run too (a few percent of the allocations fail, typed). What
//! `invariants.rs` and `host_invariants.rs` check for random sequences on one thread, and
//! `loom.rs` for every interleaving of two or three tiny threads, this checks for many long
//! interleaved sequences:
//!
//! * while running, no two live allocations overlap (each is entered in a shared registry as
//!   soon as it is handed out, and checked against its neighbours there), host blocks keep the
//!   tag written into them, and `reserved >= allocated` in every statistics read;
//! * at the end, with the survivors still live: the allocator's own invariant check (the
//!   caching policy's `validate`), allocated == the sum of the live blocks' sizes, requested ==
//!   the sum of the live requests, one active block per live allocation at its address,
//!   reserved == the simulator's used bytes;
//! * after freeing everything and `empty_cache`: nothing allocated, nothing reserved, nothing
//!   held in the simulator, no sticky error.
//!
//! The test thread is the watchdog: a run without any operation completing for
//! `BERTH_STRESS_WATCHDOG_SECS` (30 s) fails as a deadlock. Each test runs for
//! `BERTH_STRESS_SECS` seconds (default 2; the issue-13 run was 60 s per allocator).

use std::any::Any;
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use berth_alloc::backend::sim::SimBackend;
use berth_alloc::caching::CachingAllocator;
use berth_alloc::host::{HostAllocation, HostCachingAllocator, SimHostBackend};
use berth_alloc::testing::xorshift;
use berth_alloc::{
    Allocation, AllocatorConfig, BlockState, DeviceAllocator, DeviceStream, PagedBestFit, StreamId,
};

const THREADS: usize = 8;
const STREAMS: u64 = 4;
/// Live allocations a thread holds at most (it frees instead of allocating beyond).
const MAX_LIVE: usize = 32;
/// Operations each thread runs even when the time is up (a loaded machine still tests).
const MIN_OPS: u64 = 2_000;

fn env_secs(name: &str, default: f64) -> Duration {
    let secs = std::env::var(name)
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|s| s.is_finite() && *s >= 0.0)
        .unwrap_or(default);
    Duration::from_secs_f64(secs)
}

/// Shared between the workers and the watchdog.
struct Progress {
    ops: AtomicU64,
    deadline: Instant,
    /// Set by the first worker that panics: the others stop at their next operation.
    failed: AtomicBool,
    /// That first panic, re-raised by the test thread (later ones are often its consequences).
    first_panic: Mutex<Option<Box<dyn Any + Send>>>,
}

impl Progress {
    fn keep_going(&self, done: u64) -> bool {
        !self.failed.load(Ordering::Relaxed) && (done < MIN_OPS || Instant::now() < self.deadline)
    }

    fn tick(&self) {
        self.ops.fetch_add(1, Ordering::Relaxed);
    }
}

/// Runs `work(thread, progress)` on [`THREADS`] threads and watches them: fails when no
/// operation completes for the watchdog period (a deadlock; the stuck threads are left behind)
/// and re-raises the first worker panic. Returns each thread's result.
fn run_watched<T: Send + 'static>(
    name: &str,
    work: impl Fn(usize, &Progress) -> T + Send + Sync + 'static,
) -> (Vec<T>, u64, Duration) {
    let secs = env_secs("BERTH_STRESS_SECS", 2.0);
    let watchdog = env_secs("BERTH_STRESS_WATCHDOG_SECS", 30.0);
    let start = Instant::now();
    let progress = Arc::new(Progress {
        ops: AtomicU64::new(0),
        deadline: start + secs,
        failed: AtomicBool::new(false),
        first_panic: Mutex::new(None),
    });
    let work = Arc::new(work);
    let mut handles: Vec<Option<JoinHandle<Option<T>>>> = (0..THREADS)
        .map(|t| {
            let (work, progress) = (work.clone(), progress.clone());
            let h = std::thread::Builder::new()
                .name(format!("{name}-{t}"))
                .spawn(move || {
                    match std::panic::catch_unwind(AssertUnwindSafe(|| work(t, &progress))) {
                        Ok(v) => Some(v),
                        Err(panic) => {
                            if !progress.failed.swap(true, Ordering::SeqCst) {
                                *progress.first_panic.lock().unwrap() = Some(panic);
                            }
                            None
                        }
                    }
                })
                .expect("spawn a stress thread");
            Some(h)
        })
        .collect();
    let mut results: Vec<Option<T>> = (0..THREADS).map(|_| None).collect();
    let (mut seen, mut since) = (0, Instant::now());
    while handles.iter().any(Option::is_some) {
        for (h, r) in handles.iter_mut().zip(&mut results) {
            if h.as_ref().is_some_and(JoinHandle::is_finished) {
                *r = h
                    .take()
                    .unwrap()
                    .join()
                    .expect("the worker catches its panics");
            }
        }
        let ops = progress.ops.load(Ordering::Relaxed);
        if ops != seen {
            (seen, since) = (ops, Instant::now());
        } else if since.elapsed() > watchdog {
            let stuck: Vec<usize> = (0..THREADS).filter(|&t| handles[t].is_some()).collect();
            panic!(
                "{name}: no operation completed for {watchdog:?} after {ops} operations \
                 (deadlock?); threads still running: {stuck:?}"
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if let Some(panic) = progress.first_panic.lock().unwrap().take() {
        std::panic::resume_unwind(panic);
    }
    let ops = progress.ops.load(Ordering::Relaxed);
    (
        results.into_iter().map(Option::unwrap).collect(),
        ops,
        start.elapsed(),
    )
}

/// A request size: mostly small-pool sizes, a fifth large, one in twenty above 12 MiB.
fn request_size(r: u64) -> usize {
    let x = (r >> 8) as usize;
    match r % 20 {
        0..=7 => 1 + x % 4096,
        8..=14 => 4096 + x % ((1 << 20) - 4096),
        15..=18 => (1 << 20) + x % (11 << 20),
        _ => (12 << 20) + x % (28 << 20),
    }
}

/// Live device allocations by address → requested bytes; a new one must not overlap any.
#[derive(Default)]
struct Registry(Mutex<BTreeMap<u64, u64>>);

impl Registry {
    fn insert(&self, addr: u64, bytes: u64) {
        let mut m = self.0.lock().unwrap();
        if let Some((&a, &n)) = m.range(..=addr).next_back() {
            assert!(
                a + n <= addr,
                "{addr:#x}+{bytes} handed out while {a:#x}+{n} is live"
            );
        }
        if let Some((&a, &n)) = m.range(addr..).next() {
            assert!(
                addr + bytes <= a,
                "{addr:#x}+{bytes} handed out while {a:#x}+{n} is live"
            );
        }
        m.insert(addr, bytes);
    }

    fn remove(&self, addr: u64) {
        assert!(
            self.0.lock().unwrap().remove(&addr).is_some(),
            "{addr:#x} freed twice"
        );
    }
}

/// A policy's own invariant check.
type Validate = Box<dyn Fn() -> Result<(), String> + Send + Sync>;

/// One device allocator under stress, with its simulator.
struct DeviceCase {
    alloc: Arc<dyn DeviceAllocator>,
    sim: Arc<SimBackend>,
    /// The policy's own invariant check, when it has one.
    validate: Option<Validate>,
    live: Registry,
    /// Allocations handed from one thread to another, which frees them.
    exchange: Mutex<Vec<Allocation>>,
    ooms: AtomicU64,
}

/// What a device worker does until the time is up; returns its surviving allocations.
fn device_worker(case: &DeviceCase, t: usize, progress: &Progress) -> Vec<Allocation> {
    let mut next = xorshift(0x9E37_79B9_7F4A_7C15 ^ ((t as u64 + 1) << 32));
    let mut own: Vec<Allocation> = Vec::new();
    let free = |a: Allocation| {
        case.live.remove(a.ptr().0);
        drop(a);
    };
    let mut done = 0;
    while progress.keep_going(done) {
        let r = next();
        let pick = (r >> 32) as usize;
        match r % 100 {
            0..=39 if own.len() < MAX_LIVE => {
                let bytes = request_size(next());
                match case
                    .alloc
                    .allocate(bytes, StreamId((r >> 60) & (STREAMS - 1)))
                {
                    Ok(a) => {
                        case.live.insert(a.ptr().0, bytes as u64);
                        own.push(a);
                    }
                    Err(e) if e.is_out_of_memory() => {
                        case.ooms.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => panic!("allocate({bytes}): {e}"),
                }
            }
            0..=64 if !own.is_empty() => free(own.swap_remove(pick % own.len())),
            65..=74 if !own.is_empty() => {
                let a = &own[pick % own.len()];
                a.record_stream(StreamId((r >> 40) & (STREAMS - 1)))
                    .expect("record_stream on a live allocation");
            }
            75..=78 if !own.is_empty() => {
                let a = own.swap_remove(pick % own.len());
                case.exchange.lock().unwrap().push(a);
            }
            79..=82 => {
                let theirs = case.exchange.lock().unwrap().pop();
                if let Some(a) = theirs {
                    free(a);
                }
            }
            83..=90 => case
                .sim
                .complete_events_on(StreamId((r >> 40) & (STREAMS - 1))),
            91..=92 => case.sim.complete_all(),
            93..=94 => case.alloc.empty_cache().expect("empty_cache"),
            95..=98 => {
                let s = case.alloc.stats();
                let (allocated, reserved) = (
                    s.allocated_bytes.all().current,
                    s.reserved_bytes.all().current,
                );
                assert!(
                    0 <= allocated && allocated <= reserved,
                    "allocated {allocated}, reserved {reserved}"
                );
            }
            99 => {
                if let Some(validate) = &case.validate {
                    validate().unwrap_or_else(|e| panic!("invariant broken while running: {e}"));
                }
            }
            _ => {}
        }
        done += 1;
        progress.tick();
    }
    own
}

fn stress_device(
    name: &str,
    alloc: Arc<dyn DeviceAllocator>,
    sim: Arc<SimBackend>,
    validate: Option<Validate>,
) {
    let case = Arc::new(DeviceCase {
        alloc,
        sim,
        validate,
        live: Registry::default(),
        exchange: Mutex::new(Vec::new()),
        ooms: AtomicU64::new(0),
    });
    let worker = case.clone();
    let (results, ops, took) = run_watched(name, move |t, p| device_worker(&worker, t, p));
    let mut live: Vec<Allocation> = results.into_iter().flatten().collect();
    live.append(&mut case.exchange.lock().unwrap());
    let (alloc, sim) = (&case.alloc, &case.sim);
    let s = alloc.stats();
    println!(
        "{name}: {ops} operations on {THREADS} threads in {took:.1?}, {} out-of-memory, \
         {} live at the end, peak reserved {} MiB, {} device mallocs",
        case.ooms.load(Ordering::Relaxed),
        live.len(),
        s.max_memory_reserved() >> 20,
        s.num_device_alloc,
    );

    // Every fence completed and processed: no free is pending any more.
    sim.complete_all();
    alloc.empty_cache().unwrap();
    if let Some(validate) = &case.validate {
        validate().unwrap();
    }
    let s = alloc.stats();
    let snap = alloc.snapshot();
    let mut blocks: Vec<_> = snap.segments.iter().flat_map(|g| &g.blocks).collect();
    blocks.sort_by_key(|b| b.address);
    for w in blocks.windows(2) {
        assert!(
            w[0].address + w[0].size <= w[1].address,
            "blocks {:#x}+{} and {:#x} overlap",
            w[0].address,
            w[0].size,
            w[1].address
        );
    }
    assert!(
        blocks
            .iter()
            .all(|b| b.state != BlockState::ActivePendingFree),
        "a free is still pending after every fence completed"
    );
    let active: BTreeMap<u64, u64> = blocks
        .iter()
        .filter(|b| b.state == BlockState::ActiveAllocated)
        .map(|b| (b.address, b.size))
        .collect();
    let requested: BTreeMap<u64, u64> = live.iter().map(|a| (a.ptr().0, a.size() as u64)).collect();
    assert_eq!(
        active.keys().collect::<Vec<_>>(),
        requested.keys().collect::<Vec<_>>(),
        "one active block per live allocation, at its address"
    );
    for (addr, bytes) in &requested {
        assert!(
            active[addr] >= *bytes,
            "block {addr:#x} smaller than its request"
        );
    }
    assert_eq!(s.allocation.all().current, live.len() as i64);
    assert_eq!(
        s.allocated_bytes.all().current,
        active.values().sum::<u64>() as i64,
        "allocated == the sum of the live blocks"
    );
    assert_eq!(
        s.requested_bytes.all().current,
        requested.values().sum::<u64>() as i64,
        "requested == the sum of the live requests"
    );
    assert_eq!(snap.total_reserved(), s.memory_reserved());
    assert_eq!(
        s.memory_reserved(),
        sim.used_bytes(),
        "reserved == device memory held"
    );

    // Everything freed: nothing stays anywhere.
    for a in live {
        case.live.remove(a.ptr().0);
        drop(a);
    }
    sim.complete_all();
    alloc.empty_cache().unwrap();
    let s = alloc.stats();
    assert_eq!(
        (
            s.allocated_bytes.all().current,
            s.reserved_bytes.all().current,
            s.active_bytes.all().current,
            s.segment.all().current,
            sim.used_bytes(),
        ),
        (0, 0, 0, 0, 0),
        "(allocated, reserved, active, segments, device bytes) after freeing everything"
    );
    alloc.check_err().unwrap();
}

fn caching(conf: &str) -> (Arc<dyn DeviceAllocator>, Arc<SimBackend>, Validate) {
    let sim = Arc::new(SimBackend::new(1 << 30));
    let cfg = AllocatorConfig::parse(conf).unwrap();
    let alloc = Arc::new(CachingAllocator::with_config(sim.clone(), cfg).unwrap());
    let check = alloc.clone();
    (alloc, sim, Box::new(move || check.validate()))
}

#[test]
fn stress_pytorch_policy_8_threads() {
    let (alloc, sim, validate) = caching("");
    stress_device("pytorch", alloc, sim, Some(validate));
}

#[test]
fn stress_expandable_segments_8_threads() {
    let (alloc, sim, validate) = caching("expandable_segments:True");
    stress_device("expandable", alloc, sim, Some(validate));
}

#[test]
fn stress_paged_8_threads() {
    let sim = Arc::new(SimBackend::new(1 << 30));
    let alloc = Arc::new(PagedBestFit::new(sim.clone()).unwrap());
    stress_device("paged", alloc, sim, None);
}

/// Where a host allocation's tag goes: its first 8 bytes, and its last 8 when they do not
/// overlap the first (requests start at 8 bytes).
fn tag_offsets(a: &HostAllocation) -> impl Iterator<Item = usize> {
    let last = a.len() - 8;
    std::iter::once(0).chain((last >= 8).then_some(last))
}

/// A tag unique to each host allocation, written at both ends of its request.
fn write_tag(a: &HostAllocation, tag: u64) {
    for at in tag_offsets(a) {
        // SAFETY: `a` is live and owns `len >= 8` bytes at `as_ptr()` (sizes start at 8); no
        // copy is queued on it; `write_unaligned` needs no alignment.
        unsafe { a.as_ptr().add(at).cast::<u64>().write_unaligned(tag) };
    }
}

fn check_tag(a: &HostAllocation, tag: u64) {
    for at in tag_offsets(a) {
        // SAFETY: as in `write_tag`; the bytes were written there.
        let got = unsafe { a.as_ptr().add(at).cast::<u64>().read_unaligned() };
        assert_eq!(
            got,
            tag,
            "host block {:p}+{} overwritten at +{at}: handed out twice?",
            a.as_ptr(),
            a.capacity()
        );
    }
}

struct HostCase {
    host: HostCachingAllocator<Arc<SimHostBackend>>,
    sim: Arc<SimHostBackend>,
    live: Registry,
    exchange: Mutex<Vec<(HostAllocation, u64)>>,
}

fn host_worker(case: &HostCase, t: usize, progress: &Progress) -> Vec<(HostAllocation, u64)> {
    let mut next = xorshift(0xD1B5_4A32_D192_ED03 ^ ((t as u64 + 1) << 32));
    let mut own: Vec<(HostAllocation, u64)> = Vec::new();
    let free = |(a, tag): (HostAllocation, u64)| {
        check_tag(&a, tag);
        case.live.remove(a.as_ptr() as u64);
        drop(a);
    };
    let stream = |r: u64| DeviceStream::new(0, StreamId((r >> 40) & (STREAMS - 1)));
    let mut done = 0;
    while progress.keep_going(done) {
        let r = next();
        let pick = (r >> 32) as usize;
        match r % 100 {
            0..=39 if own.len() < MAX_LIVE => {
                // 8 bytes to 256 KiB, one in sixteen up to 4 MiB (real memory: keep it small).
                let limit = if r.is_multiple_of(16) {
                    4 << 20
                } else {
                    256 << 10
                };
                let bytes = 8 + (next() as usize) % limit;
                let a = case.host.allocate(bytes).expect("host allocate");
                let tag = ((t as u64) << 56) | done;
                write_tag(&a, tag);
                case.live.insert(a.as_ptr() as u64, a.capacity() as u64);
                own.push((a, tag));
            }
            0..=64 if !own.is_empty() => free(own.swap_remove(pick % own.len())),
            65..=74 if !own.is_empty() => {
                let (a, _) = &own[pick % own.len()];
                a.record_stream(stream(r)).expect("record_stream");
            }
            75..=78 if !own.is_empty() => {
                let a = own.swap_remove(pick % own.len());
                case.exchange.lock().unwrap().push(a);
            }
            79..=82 => {
                let theirs = case.exchange.lock().unwrap().pop();
                if let Some(a) = theirs {
                    free(a);
                }
            }
            83..=90 => case.sim.complete_events_on(stream(r).stream),
            91..=92 => case.sim.complete_all(),
            93..=94 => case.host.empty_cache().expect("host empty_cache"),
            95..=99 => {
                let s = case.host.stats();
                assert!(
                    0 <= s.active_bytes.current
                        && s.active_bytes.current <= s.allocated_bytes.current,
                    "active {}, allocated {}",
                    s.active_bytes.current,
                    s.allocated_bytes.current
                );
            }
            _ => {}
        }
        done += 1;
        progress.tick();
    }
    own
}

#[test]
fn stress_host_pinned_8_threads() {
    let sim = Arc::new(SimHostBackend::new(1 << 40));
    let case = Arc::new(HostCase {
        host: HostCachingAllocator::new(sim.clone()),
        sim,
        live: Registry::default(),
        exchange: Mutex::new(Vec::new()),
    });
    let worker = case.clone();
    let (results, ops, took) = run_watched("host", move |t, p| host_worker(&worker, t, p));
    let mut live: Vec<(HostAllocation, u64)> = results.into_iter().flatten().collect();
    live.append(&mut case.exchange.lock().unwrap());
    let (host, sim) = (&case.host, &case.sim);
    println!(
        "host: {ops} operations on {THREADS} threads in {took:.1?}, {} live at the end, \
         peak pinned {} MiB, {} backend allocations",
        live.len(),
        host.stats().allocated_bytes.peak >> 20,
        host.stats().num_host_alloc,
    );

    sim.complete_all();
    host.empty_cache().unwrap();
    let s = host.stats();
    for (a, tag) in &live {
        check_tag(a, *tag);
    }
    assert_eq!(s.active_requests.current, live.len() as i64);
    assert_eq!(
        s.active_bytes.current,
        live.iter().map(|(a, _)| a.capacity() as i64).sum::<i64>(),
        "active == the sum of the live blocks"
    );
    assert_eq!(s.allocated_bytes.current as u64, sim.used_bytes());
    assert_eq!(s.allocations.current as usize, sim.live_regions());
    assert!(host.cached_bytes() <= sim.used_bytes());

    for (a, tag) in live {
        check_tag(&a, tag);
        case.live.remove(a.as_ptr() as u64);
        drop(a);
    }
    sim.complete_all();
    host.empty_cache().unwrap();
    let s = host.stats();
    assert_eq!(
        (
            s.allocations.current,
            s.allocated_bytes.current,
            s.active_bytes.current,
            sim.used_bytes(),
            host.pending_events(),
        ),
        (0, 0, 0, 0, 0),
        "(blocks, pinned bytes, active bytes, simulator bytes, pending events) after freeing everything"
    );
}
