//! `berth-torch`'s C functions called as PyTorch's `CUDAPluggableAllocator` calls them, over
//! two simulated devices (the test switch `berth_torch_simulate`), in sequences decoded from
//! the fuzz input: alloc, free, `record_stream`, reset (`empty_cache`), memory fraction,
//! event completion, and misuse (double frees, unknown pointers, bad device indices).
//!
//! Checked after every operation: a live block never overlaps another on its device and is
//! 512-byte aligned; the allocation count and the requested, allocated, active and reserved
//! bytes agree with the blocks the driver holds; a `void` hook reports an error (through
//! `berth_torch_take_deferred_error`) exactly when the call was a misuse; no hook ever reports
//! a panic. At the end of each input everything is freed, every event completed and the cache
//! emptied, which must leave each device with nothing allocated or reserved, so inputs do not
//! leak state into each other (`Note [One allocator per process]`: one policy per process,
//! hence one target per policy).

use std::collections::BTreeMap;
use std::ffi::{c_char, c_void, CString};
use std::sync::Once;

use berth_torch::abi::*;
use berth_torch::berth_torch_alloc;

use crate::input::Bytes;

/// Each simulated device's memory, in bytes.
pub const CAPACITY: u64 = 1 << 30;

/// Operations decoded from one input, at most.
pub const MAX_OPS: usize = 256;

/// The streams used: the legacy default, the per-thread default and two user streams.
const STREAMS: [u64; 4] = [0, 2, 0x10, 0x20];

/// Device indices that are not devices.
const BAD_DEVICES: [i32; 4] = [-1, 64, i32::MAX, i32::MIN];

/// Simulated devices used.
const DEVICES: usize = 2;

static INSTALL: Once = Once::new();

/// Prints each hook call to stderr when `BERTH_FUZZ_TRACE` is set (to turn a crashing input
/// into a regression test).
macro_rules! trace {
    ($($arg:tt)*) => {
        if tracing() {
            eprintln!($($arg)*);
        }
    };
}

fn tracing() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("BERTH_FUZZ_TRACE").is_some())
}

/// A live block as the caller (PyTorch) sees it.
#[derive(Clone, Copy, Debug)]
struct Block {
    size: usize,
    stream: u64,
}

/// What the driver knows of one input's state.
struct Driver {
    /// Live blocks per device, by address.
    live: [BTreeMap<u64, Block>; DEVICES],
    /// Recently freed `(device, address)`s, for double frees.
    freed: Vec<(usize, u64)>,
    /// Whether a block may be waiting on another stream's event (`record_stream` was called
    /// and the events were not all completed since): requested bytes may then exceed the live
    /// blocks' (PyTorch keeps a pending block's requested bytes until it is reusable).
    pending: bool,
}

fn stream(s: u64) -> *mut c_void {
    s as usize as *mut c_void
}

fn ptr(p: u64) -> *mut c_void {
    p as usize as *mut c_void
}

fn message(f: impl FnOnce(*mut c_char, usize) -> usize) -> String {
    let mut buf = vec![0u8; 512];
    let n = f(buf.as_mut_ptr().cast(), buf.len());
    buf.truncate(n.min(511));
    String::from_utf8_lossy(&buf).into_owned()
}

fn last_error() -> String {
    // SAFETY: `buf` is valid for `len` bytes.
    message(|buf, len| unsafe { berth_torch_last_error(buf, len) })
}

fn deferred() -> Option<String> {
    // SAFETY: `buf` is valid for `len` bytes.
    let msg = message(|buf, len| unsafe { berth_torch_take_deferred_error(buf, len) });
    (!msg.is_empty()).then_some(msg)
}

/// Checks that a `void` hook reported an error exactly when `misuse`.
fn expect_deferred(what: &str, misuse: bool) {
    match deferred() {
        Some(msg) if msg.contains("internal error") => panic!("{what}: {msg}"),
        Some(msg) if !misuse => panic!("{what}: unexpected error: {msg}"),
        None if misuse => panic!("{what}: a misuse was not reported"),
        _ => {}
    }
}

fn stat(device: usize, key: &str) -> i64 {
    let k = CString::new(key).expect("no NUL in a key");
    // SAFETY: `k` is NUL-terminated.
    unsafe { berth_torch_stat(device as i32, k.as_ptr()) }
}

/// Installs `policy` on simulated devices, once per process.
fn install(policy: &str) {
    INSTALL.call_once(|| {
        assert_eq!(berth_torch_simulate(CAPACITY), 0);
        let p = CString::new(policy).expect("no NUL in a policy name");
        // SAFETY: `p` is NUL-terminated; null options are allowed.
        let rc = unsafe { berth_torch_install(p.as_ptr(), std::ptr::null()) };
        assert_eq!(rc, 0, "install {policy}: {}", last_error());
    });
}

/// Runs the operations `data` decodes to on the installed `policy` (installed on first call).
///
/// # Panics
/// On a broken invariant (a finding).
pub fn run(policy: &str, data: &[u8]) {
    install(policy);
    let mut d = Driver {
        live: Default::default(),
        freed: Vec::new(),
        pending: false,
    };
    let mut b = Bytes::new(data);
    for _ in 0..MAX_OPS {
        if b.is_empty() {
            break;
        }
        d.step(&mut b);
        d.check_stats(false);
    }
    d.finish();
}

/// A device index: mostly 0, sometimes 1, rarely no device at all.
fn device(b: &mut Bytes) -> Result<usize, i32> {
    match b.u8() % 16 {
        0..=10 => Ok(0),
        11..=14 => Ok(1),
        _ => Err(BAD_DEVICES[usize::from(b.u8()) % BAD_DEVICES.len()]),
    }
}

fn index(device: Result<usize, i32>) -> i32 {
    device.map_or_else(|bad| bad, |d| d as i32)
}

/// A size in bytes: `k << shift` for `shift` below 40 (up to 1 TiB, beyond the device), zero,
/// or an arbitrary 64-bit value.
fn size(b: &mut Bytes) -> usize {
    let shift = b.u8();
    match shift {
        0..=239 => usize::from(b.u16()) << (shift % 40),
        240..=247 => 0,
        _ => b.u64() as usize,
    }
}

impl Driver {
    fn pick(&self, b: &mut Bytes) -> Option<(usize, u64, Block)> {
        let n: usize = self.live.iter().map(BTreeMap::len).sum();
        if n == 0 {
            return None;
        }
        let mut i = usize::from(b.u16()) % n;
        for (dev, m) in self.live.iter().enumerate() {
            if i < m.len() {
                let (&p, &blk) = m.iter().nth(i).expect("i < len");
                return Some((dev, p, blk));
            }
            i -= m.len();
        }
        None
    }

    fn step(&mut self, b: &mut Bytes) {
        match b.u8() % 10 {
            0..=2 => self.alloc(b),
            3 | 4 => {
                if let Some((dev, p, blk)) = self.pick(b) {
                    trace!("free({p:#x}, {}, {dev}, {:#x})", blk.size, blk.stream);
                    berth_torch_free(ptr(p), blk.size, dev as i32, stream(blk.stream));
                    expect_deferred("free of a live block", false);
                    self.live[dev].remove(&p);
                    if self.freed.len() == 16 {
                        self.freed.remove(0);
                    }
                    self.freed.push((dev, p));
                }
            }
            5 => {
                if let Some((_, p, _)) = self.pick(b) {
                    let s = STREAMS[usize::from(b.u8()) % STREAMS.len()];
                    trace!("record_stream({p:#x}, {s:#x})");
                    berth_torch_record_stream(ptr(p), stream(s));
                    expect_deferred("record_stream of a live block", false);
                    self.pending = true;
                }
            }
            6 => {
                trace!("reset()");
                berth_torch_reset();
                expect_deferred("reset", false);
            }
            7 => {
                let dev = device(b);
                let v = b.u8();
                let fraction = match v {
                    0..=200 => f64::from(v) / 200.0,
                    201 => f64::NAN,
                    202 => -0.5,
                    203 => 1.5,
                    204 => f64::INFINITY,
                    _ => 1.0,
                };
                trace!("set_memory_fraction({fraction}, {})", index(dev));
                berth_torch_set_memory_fraction(fraction, index(dev));
                let valid = (0.0..=1.0).contains(&fraction);
                expect_deferred("set_memory_fraction", dev.is_err() || !valid);
            }
            8 => {
                let dev = device(b);
                let s = STREAMS[usize::from(b.u8()) % STREAMS.len()];
                trace!("sim_complete_events({}, {s:#x})", index(dev));
                berth_torch_sim_complete_events(index(dev), stream(s));
            }
            _ => self.misuse(b),
        }
    }

    fn alloc(&mut self, b: &mut Bytes) {
        let dev = device(b);
        let s = STREAMS[usize::from(b.u8()) % STREAMS.len()];
        let n = size(b);
        let p = berth_torch_alloc(n, index(dev), stream(s)) as u64;
        trace!("alloc({n}, {}, {s:#x}) = {p:#x}", index(dev));
        if n == 0 {
            assert_eq!(p, 0, "zero bytes give a null pointer");
            return;
        }
        let Ok(dev) = dev else {
            assert_eq!(p, 0, "an allocation on device {} succeeded", index(dev));
            // A negative index is a bad argument, a too-large one a missing device; both say
            // what would be right.
            let e = last_error();
            let why = if index(dev) < 0 { "is negative; use 0 or more" } else { "out of range" };
            assert!(e.contains(why), "{e}");
            return;
        };
        if p == 0 {
            let e = last_error();
            assert!(
                !e.is_empty() && !e.contains("internal error"),
                "alloc({n}): {e:?}"
            );
            return;
        }
        assert_eq!(p % 512, 0, "alloc({n}) = {p:#x}: not 512-byte aligned");
        let end = p
            .checked_add(n as u64)
            .unwrap_or_else(|| panic!("alloc({n}) = {p:#x} wraps the address space"));
        let m = &mut self.live[dev];
        if let Some((&q, blk)) = m.range(..end).next_back() {
            assert!(
                q + blk.size as u64 <= p,
                "alloc({n}) = [{p:#x}, {end:#x}) overlaps the live [{q:#x}, {:#x}) on device {dev}",
                q + blk.size as u64
            );
        }
        m.insert(p, Block { size: n, stream: s });
    }

    /// Calls that are errors: each must be reported, and change nothing.
    fn misuse(&mut self, b: &mut Bytes) {
        match b.u8() % 4 {
            0 => {
                let Some(&(dev, p)) = self.freed.get(usize::from(b.u8()) % 16) else {
                    return;
                };
                if self.live[dev].contains_key(&p) {
                    return; // reused since: not a double free
                }
                trace!("free({p:#x}, 0, {dev}, 0) (double)");
                berth_torch_free(ptr(p), 0, dev as i32, stream(0));
                expect_deferred("double free", true);
            }
            1 => {
                // Odd, so never the start of a (512-byte aligned) block.
                let p = b.u64() | 1;
                trace!("free({p:#x}, 0, 0, 0) (unknown)");
                berth_torch_free(ptr(p), 0, 0, stream(0));
                expect_deferred("free of an unknown pointer", true);
            }
            2 => {
                let p = b.u64() | 1;
                trace!("record_stream({p:#x}, {:#x}) (unknown)", STREAMS[2]);
                berth_torch_record_stream(ptr(p), stream(STREAMS[2]));
                expect_deferred("record_stream of an unknown pointer", true);
            }
            _ => {
                if let Some((_, p, blk)) = self.pick(b) {
                    let bad = BAD_DEVICES[usize::from(b.u8()) % BAD_DEVICES.len()];
                    trace!(
                        "free({p:#x}, {}, {bad}, {:#x}) (bad device)",
                        blk.size,
                        blk.stream
                    );
                    berth_torch_free(ptr(p), blk.size, bad, stream(blk.stream));
                    expect_deferred("free on a bad device index", true);
                }
            }
        }
    }

    /// The statistics of every built device against the live blocks (and, when `layout`, the
    /// snapshot's blocks too).
    fn check_stats(&self, layout: bool) {
        let inst = berth_torch::installed().expect("installed");
        for (dev, live) in self.live.iter().enumerate() {
            let Some(a) = inst.existing(dev as i32) else {
                assert!(
                    live.is_empty(),
                    "blocks on device {dev}, which has no allocator"
                );
                continue;
            };
            let s = a.stats();
            let live_bytes: i64 = live.values().map(|b| b.size as i64).sum();
            let policy = a.policy_name();
            let ctx = || format!("{policy}, device {dev}, {} live blocks", live.len());
            assert_eq!(s.allocation.all().current, live.len() as i64, "{}", ctx());
            let requested = s.requested_bytes.all().current;
            if self.pending {
                assert!(
                    requested >= live_bytes,
                    "requested {requested} < {live_bytes}: {}",
                    ctx()
                );
            } else {
                assert_eq!(requested, live_bytes, "requested bytes: {}", ctx());
            }
            let allocated = s.allocated_bytes.all().current;
            assert!(
                allocated >= live_bytes,
                "allocated {allocated} < {live_bytes}: {}",
                ctx()
            );
            let active = s.active_bytes.all().current;
            assert!(
                active >= allocated,
                "active {active} < allocated {allocated}: {}",
                ctx()
            );
            let reserved = s.reserved_bytes.all().current;
            assert!(
                reserved >= active,
                "reserved {reserved} < active {active}: {}",
                ctx()
            );
            if layout {
                let in_blocks = crate::snapshot::check_layout(&a.snapshot());
                assert_eq!(in_blocks as i64, allocated, "snapshot vs stats: {}", ctx());
            }
        }
    }

    /// Frees everything, completes every event and empties the cache: every device must be
    /// left with nothing allocated, requested or reserved.
    fn finish(mut self) {
        self.check_stats(true);
        for dev in 0..DEVICES {
            for (p, blk) in std::mem::take(&mut self.live[dev]) {
                berth_torch_free(ptr(p), blk.size, dev as i32, stream(blk.stream));
                expect_deferred("free at the end", false);
            }
        }
        let inst = berth_torch::installed().expect("installed");
        for dev in 0..DEVICES {
            if inst.existing(dev as i32).is_some() {
                berth_torch_set_memory_fraction(1.0, dev as i32);
                expect_deferred("set_memory_fraction(1.0)", false);
            }
            for s in STREAMS {
                berth_torch_sim_complete_events(dev as i32, stream(s));
            }
        }
        berth_torch_reset();
        expect_deferred("reset at the end", false);
        self.pending = false;
        self.check_stats(true);
        // Through the C function too (one key: each call builds all 122 statistics).
        for dev in 0..DEVICES {
            let key = "reserved_bytes.all.current";
            assert_eq!(
                stat(dev, key),
                0,
                "device {dev}: {key} after freeing everything"
            );
        }
    }
}
