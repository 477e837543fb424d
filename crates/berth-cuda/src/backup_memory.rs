//! Page-locked host memory for the backups of sleeping tags (`Note [Sleep and wake]` in
//! berth-alloc's `paged`), fast to get and optionally kept between sleeps.
//!
//! # Note [Backup host memory]
//! A sleep offloads a tag into one host buffer (one per tag, not per block). `cuMemHostAlloc`
//! of 256 MiB costs ~100 ms on the H200 host (the driver zeroes and locks 65,536 small pages
//! one by one), ten times the copy itself. A buffer of [`FAST_MIN_BYTES`] or more is instead
//! an anonymous mapping with transparent huge pages, faulted from several threads at once and
//! page-locked with one `cuMemHostRegister` (the route of `Note [Filled first pins]` in
//! [`crate::pinned`], without a source to fill from); freeing unregisters and unmaps it.
//!
//! Reinforcement-learning loops sleep and wake every iteration. With
//! [`crate::sleep::keep_host_memory`]`(true)` the buffers freed at wake are kept page-locked
//! and the next sleep takes the smallest kept buffer that fits, so only the first sleep pays
//! for locking pages. Off by default: PyTorch users of vLLM's sleep mode report the host
//! memory still held after wake (it stays in PyTorch's pinned cache there, unseen); berth
//! frees it unless asked, and [`crate::sleep::release_host_memory`] gives kept buffers back.
//!
//! Freeing a mapped buffer (unregistering its chunks, unmapping it) costs about as long as the
//! copy that filled it (~12 ms for 500 MB on the H200 host), and a wake that waited for it
//! would take twice its copy time. So a buffer freed without `keep` goes to one freeing thread
//! per backup memory, started at the first such free, and the wake returns once the copies
//! are done: the host memory is back with the system a few milliseconds later. Whatever reads
//! host figures ([`crate::sleep::kept_host_bytes`], [`crate::sleep::release_host_memory`],
//! dropping the backup memory) first waits for the frees in flight, so they never show a
//! buffer half gone. A free the driver refuses keeps its buffer as a kept one (counted by
//! `kept_host_bytes`, retried by `release_host_memory`) and warns once; nothing is lost.
//! Where no thread can be started, the buffer is freed in the caller, as before.
//!
//! # Note [Registered in chunks]
//! Locking pages is the slow part of a first sleep: one `cuMemHostRegister` of 512 MiB locks
//! about 10 GB/s on the H200 host, five times slower than the copy that follows. So a buffer of
//! [`FAST_MIN_BYTES`] or more is registered in chunks of [`CHUNK_BYTES`], each faulted and
//! registered by one of up to 16 threads started for the buffer (chunks taken in address
//! order), and [`CudaBackupMemory::
//! alloc_backup`] returns before they are done. The copy queue asks [`registered_pieces`]
//! before queueing a copy to or from host memory: it waits for the chunks under the range
//! (only those) and cuts the copy at chunk boundaries, each chunk being a registration of its
//! own. The copies of the first chunks thus run while later chunks are still being locked.
//! Freeing a buffer waits for every chunk, then unregisters the chunks that were registered;
//! a chunk whose registration failed makes the copies into it fail with the driver's error,
//! and the sleep fails with nothing released.

use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use berth_alloc::host::BackupMemory;
use berth_alloc::BackendError;

use crate::hostmem::{Mapping, Pages};
use crate::{ffi, CudaError};

/// Smallest buffer, in bytes, mapped and registered instead of taken from `cuMemHostAlloc`.
pub const FAST_MIN_BYTES: usize = 4 << 20;

/// Bytes registered by one `cuMemHostRegister` of a mapped buffer (`Note [Registered in
/// chunks]`): a multiple of the huge page.
pub const CHUNK_BYTES: usize = 16 << 20;

/// Threads that register a buffer's chunks (the host's cores, at most 16).
fn register_threads() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get().min(16))
}

/// How far one chunk's registration got.
#[derive(Debug, Clone)]
enum Chunk {
    /// A registering thread is faulting and registering it.
    Pending,
    Registered,
    /// The driver refused; copies into the chunk fail with this error.
    Failed(CudaError),
    /// Registered, then unregistered by a free that failed on another chunk.
    Unregistered,
}

/// The chunks of one mapped buffer and how far their registration got.
#[derive(Debug)]
struct Registration {
    device: usize,
    start: usize,
    len: usize,
    state: Mutex<Vec<Chunk>>,
    done: Condvar,
}

impl Registration {
    fn chunks(&self) -> usize {
        self.len.div_ceil(CHUNK_BYTES)
    }

    /// `(start, length)` of chunk `i`.
    fn chunk(&self, i: usize) -> (usize, usize) {
        let a = self.start + i * CHUNK_BYTES;
        (a, CHUNK_BYTES.min(self.start + self.len - a))
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Chunk>> {
        // Each critical section writes or reads whole entries: a poisoned lock is consistent.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Waits until no chunk of `first..last` is pending.
    fn settled(&self, first: usize, last: usize) -> MutexGuard<'_, Vec<Chunk>> {
        let mut st = self.lock();
        while st[first..last].iter().any(|c| matches!(c, Chunk::Pending)) {
            st = self.done.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        st
    }

    /// Faults and registers chunk `i` (on a registering thread).
    fn register(&self, i: usize) {
        let (a, n) = self.chunk(i);
        for page in (0..n).step_by(4096) {
            // SAFETY: the chunk lies in the buffer's mapping, which outlives every task (its
            // free waits for all chunks); no one else touches a chunk being registered, and
            // writing the zero the kernel supplied keeps the contents.
            unsafe { ((a + page) as *mut u8).write_volatile(0) };
        }
        let r = ffi::host_register(self.device, a as *mut u8, n);
        self.lock()[i] = match r {
            Ok(()) => Chunk::Registered,
            Err(e) => Chunk::Failed(e),
        };
        self.done.notify_all();
    }

    /// Waits until chunks `first..last` are registered; the first failure among them.
    fn wait(&self, first: usize, last: usize) -> Result<(), CudaError> {
        let st = self.settled(first, last);
        match st[first..last]
            .iter()
            .find(|c| !matches!(c, Chunk::Registered))
        {
            Some(Chunk::Failed(e)) => Err(e.clone()),
            Some(_) => Err(CudaError::HostAlloc {
                message: "a backup buffer's memory was unregistered while in use".into(),
            }),
            None => Ok(()),
        }
    }

    /// Waits for every chunk, then unregisters those that are registered.
    ///
    /// # Safety
    /// No copy still uses the buffer.
    unsafe fn unregister(&self) -> Result<(), CudaError> {
        let mut st = self.settled(0, self.chunks());
        let mut first = None;
        for i in 0..self.chunks() {
            if matches!(st[i], Chunk::Registered) {
                // SAFETY: chunk `i` is registered; the caller's contract.
                match unsafe { ffi::host_unregister(self.device, self.chunk(i).0 as *mut u8) } {
                    Ok(()) => st[i] = Chunk::Unregistered,
                    Err(e) => {
                        first.get_or_insert(e);
                    }
                }
            }
        }
        first.map_or(Ok(()), Err)
    }
}

/// Registrations of mapped buffers in use or kept, by start address.
static REGISTRATIONS: Mutex<BTreeMap<usize, Arc<Registration>>> = Mutex::new(BTreeMap::new());

fn registrations() -> MutexGuard<'static, BTreeMap<usize, Arc<Registration>>> {
    // Each critical section is one map operation: a poisoned lock is still consistent.
    REGISTRATIONS.lock().unwrap_or_else(|p| p.into_inner())
}

/// The pieces, `(address, bytes)`, in which a copy of `bytes` bytes to or from host `ptr` is
/// queued: the range itself unless it lies in a backup buffer registered in chunks (`Note
/// [Registered in chunks]`), else one piece per chunk under it, after waiting for those
/// chunks' registration.
///
/// # Errors
/// The driver's error when a chunk under the range could not be registered.
pub(crate) fn registered_pieces(
    ptr: usize,
    bytes: usize,
) -> Result<Vec<(usize, usize)>, CudaError> {
    let reg = registrations()
        .range(..=ptr)
        .next_back()
        .filter(|(_, r)| ptr < r.start + r.len)
        .map(|(_, r)| Arc::clone(r));
    let Some(reg) = reg else {
        return Ok(vec![(ptr, bytes)]);
    };
    if bytes == 0 {
        return Ok(vec![(ptr, 0)]);
    }
    let end = ptr.saturating_add(bytes);
    if end > reg.start + reg.len {
        return Err(CudaError::InvalidArgument {
            op: "registered_pieces",
            what: format!(
                "a copy of {bytes} bytes at {ptr:#x} runs past its backup buffer ({:#x}, {} bytes)",
                reg.start, reg.len
            ),
        });
    }
    let (first, last) = (
        (ptr - reg.start) / CHUNK_BYTES,
        (end - reg.start).div_ceil(CHUNK_BYTES),
    );
    reg.wait(first, last)?;
    let pieces = (first..last)
        .map(|i| {
            let (a, n) = reg.chunk(i);
            let (lo, hi) = (a.max(ptr), (a + n).min(end));
            (lo, hi - lo)
        })
        .collect();
    Ok(pieces)
}

/// One buffer: its real size and how it was made.
#[derive(Debug)]
struct Buffer {
    bytes: usize,
    /// `Some` for a mapped buffer registered in chunks, `None` for `cuMemHostAlloc`.
    mapping: Option<(Mapping, Arc<Registration>)>,
}

#[derive(Debug, Default)]
struct Buffers {
    /// Buffers handed out, by address.
    out: BTreeMap<usize, Buffer>,
    /// Buffers kept for reuse, by address.
    kept: BTreeMap<usize, Buffer>,
    /// Buffers sent to the freeing thread and not freed yet.
    freeing: usize,
}

/// The buffers, shared with the freeing thread.
#[derive(Debug, Default)]
struct Shared {
    buffers: Mutex<Buffers>,
    /// Notified each time the freeing thread is done with a buffer.
    freed: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Buffers> {
        // Each critical section is one map operation or one count: a poisoned lock is
        // still consistent.
        self.buffers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The buffers once no free is in flight.
    fn settled(&self) -> MutexGuard<'_, Buffers> {
        let mut bufs = self.lock();
        while bufs.freeing > 0 {
            bufs = self.freed.wait(bufs).unwrap_or_else(|p| p.into_inner());
        }
        bufs
    }
}

/// The thread that frees buffers in the background, and the way to send it one.
type Freer = (Sender<(usize, Buffer)>, JoinHandle<()>);

/// The backup memory of every sleep in this process (`Note [Backup host memory]`).
#[derive(Debug)]
pub(crate) struct CudaBackupMemory {
    /// The device whose context registers the memory (`PORTABLE`: usable by every device).
    device: usize,
    keep: AtomicBool,
    shared: Arc<Shared>,
    /// Started at the first free without `keep`.
    freer: Mutex<Option<Freer>>,
}

impl CudaBackupMemory {
    pub(crate) fn new(device: usize) -> CudaBackupMemory {
        CudaBackupMemory {
            device,
            keep: AtomicBool::new(false),
            shared: Arc::default(),
            freer: Mutex::new(None),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Buffers> {
        self.shared.lock()
    }

    pub(crate) fn set_keep(&self, keep: bool) {
        self.keep.store(keep, Ordering::Relaxed);
    }

    /// Bytes of buffers kept for reuse, once the frees in flight are done.
    pub(crate) fn kept_bytes(&self) -> u64 {
        self.shared
            .settled()
            .kept
            .values()
            .map(|b| b.bytes as u64)
            .sum()
    }

    /// Frees every kept buffer, once the frees in flight are done; the bytes freed.
    ///
    /// # Errors
    /// The first driver error (the buffers that failed stay kept).
    pub(crate) fn release_kept(&self) -> Result<u64, CudaError> {
        let kept = std::mem::take(&mut self.shared.settled().kept);
        let mut freed = 0;
        let mut first = None;
        for (addr, b) in kept {
            let bytes = b.bytes as u64;
            // SAFETY: a kept buffer is owned by the pool alone: no backup uses it.
            match unsafe { free_now(self.device, addr, b) } {
                Ok(()) => freed += bytes,
                Err((e, b)) => {
                    self.lock().kept.insert(addr, b);
                    first.get_or_insert(e);
                }
            }
        }
        first.map_or(Ok(freed), Err)
    }

    /// Hands `b` at `addr` to the freeing thread, starting it if needed; gives `b` back when
    /// no thread can be started (`Note [Backup host memory]`).
    fn free_in_background(&self, addr: usize, b: Buffer) -> Option<(usize, Buffer)> {
        let mut freer = self.freer.lock().unwrap_or_else(|p| p.into_inner());
        if freer.is_none() {
            let (tx, rx) = channel::<(usize, Buffer)>();
            let (shared, device) = (Arc::clone(&self.shared), self.device);
            let spawned = std::thread::Builder::new()
                .name("berth-backup-free".into())
                .spawn(move || {
                    for (addr, b) in rx {
                        // SAFETY: `free_backup`'s contract, passed on with the buffer: no copy
                        // still uses it.
                        let failed = unsafe { free_now(device, addr, b) }.err();
                        let mut bufs = shared.lock();
                        if let Some((e, b)) = failed {
                            berth_alloc::warnings::warn_once("backup-free", || {
                                format!(
                                    "freeing a sleep backup's host memory ({} bytes) failed: {e}; \
                                     it stays kept (release_host_memory retries)",
                                    b.bytes
                                )
                            });
                            bufs.kept.insert(addr, b);
                        }
                        bufs.freeing -= 1;
                        shared.freed.notify_all();
                    }
                });
            match spawned {
                Ok(handle) => *freer = Some((tx, handle)),
                Err(_) => return Some((addr, b)),
            }
        }
        let (tx, _) = freer.as_ref()?;
        self.lock().freeing += 1;
        match tx.send((addr, b)) {
            Ok(()) => None,
            Err(back) => {
                // The thread is gone (it never panics; only a dropped receiver gets here).
                let mut bufs = self.lock();
                bufs.freeing -= 1;
                self.shared.freed.notify_all();
                Some(back.0)
            }
        }
    }

    /// A new buffer of `bytes` bytes; a mapped one is still being registered when this
    /// returns (`Note [Registered in chunks]`).
    fn make(&self, bytes: usize) -> Result<(usize, Buffer), CudaError> {
        if bytes >= FAST_MIN_BYTES {
            if let Ok(m) = Mapping::new(bytes, Pages::Huge) {
                let addr = m.as_ptr() as usize;
                let reg = Arc::new(Registration {
                    device: self.device,
                    start: addr,
                    len: m.len(),
                    state: Mutex::new(vec![Chunk::Pending; m.len().div_ceil(CHUNK_BYTES)]),
                    done: Condvar::new(),
                });
                registrations().insert(addr, Arc::clone(&reg));
                // Threads of their own (not a shared pool, which a waiting caller could
                // occupy): each takes the next chunk in address order.
                let next = Arc::new(AtomicUsize::new(0));
                for _ in 0..register_threads().min(reg.chunks()) {
                    let (r, next) = (Arc::clone(&reg), Arc::clone(&next));
                    let spawned = std::thread::Builder::new()
                        .name("berth-backup-register".into())
                        .spawn(move || loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            if i >= r.chunks() {
                                break;
                            }
                            r.register(i);
                        });
                    if spawned.is_err() {
                        break; // the threads already running take every chunk
                    }
                }
                if next.load(Ordering::Relaxed) == 0 && Arc::strong_count(&next) == 1 {
                    // No thread could be started: register here.
                    for i in 0..reg.chunks() {
                        reg.register(i);
                    }
                }
                let buf = Buffer {
                    bytes,
                    mapping: Some((m, reg)),
                };
                return Ok((addr, buf));
            }
        }
        let p = ffi::host_alloc(self.device, bytes)?;
        if p.is_null() {
            return Err(CudaError::HostAlloc {
                message: "cuMemHostAlloc returned a null pointer".into(),
            });
        }
        Ok((
            p as usize,
            Buffer {
                bytes,
                mapping: None,
            },
        ))
    }
}

/// Frees `b` at `addr`, made for `device`'s context; on failure gives it back with the error.
///
/// # Safety
/// No copy still uses the buffer.
#[allow(clippy::result_large_err)] // the buffer goes back to its list on failure
unsafe fn free_now(device: usize, addr: usize, b: Buffer) -> Result<(), (CudaError, Buffer)> {
    let p = addr as *mut u8;
    let r = match &b.mapping {
        // SAFETY: registered by `make`; the caller's contract. Dropping `b` unmaps it.
        Some((_, reg)) => unsafe { reg.unregister() },
        // SAFETY: from `cuMemHostAlloc` in `make`; the caller's contract.
        None => unsafe { ffi::host_free(device, p) },
    };
    match r {
        Ok(()) => {
            if b.mapping.is_some() {
                registrations().remove(&addr);
            }
            Ok(())
        }
        Err(e) => Err((e, b)),
    }
}

impl BackupMemory for CudaBackupMemory {
    fn alloc_backup(&self, bytes: usize) -> Result<NonNull<u8>, BackendError> {
        let mut bufs = self.lock();
        // The smallest kept buffer that fits, unless it would waste more than half of itself.
        let reuse = bufs
            .kept
            .iter()
            .filter(|(_, b)| b.bytes >= bytes && b.bytes / 2 <= bytes)
            .min_by_key(|(_, b)| b.bytes)
            .map(|(&a, _)| a);
        let (addr, buf) = match reuse.and_then(|a| bufs.kept.remove_entry(&a)) {
            Some(found) => found,
            None => {
                drop(bufs);
                let made = self.make(bytes)?;
                bufs = self.lock();
                made
            }
        };
        bufs.out.insert(addr, buf);
        NonNull::new(addr as *mut u8).ok_or(BackendError::Other {
            op: "alloc_backup",
            message: "a buffer at a null address".into(),
        })
    }

    unsafe fn free_backup(&self, ptr: NonNull<u8>, _bytes: usize) -> Result<(), BackendError> {
        let addr = ptr.as_ptr() as usize;
        let Some(buf) = self.lock().out.remove(&addr) else {
            return Err(BackendError::InvalidPointer {
                op: "free_backup",
                ptr: berth_alloc::DevicePtr(addr as u64),
            });
        };
        if self.keep.load(Ordering::Relaxed) {
            self.lock().kept.insert(addr, buf);
            return Ok(());
        }
        // The trait's contract (no copy still uses it) goes with the buffer.
        let Some((addr, buf)) = self.free_in_background(addr, buf) else {
            return Ok(());
        };
        // SAFETY: the trait's contract: no copy still uses it.
        unsafe { free_now(self.device, addr, buf) }.map_err(|(e, b)| {
            self.lock().out.insert(addr, b);
            e.into()
        })
    }
}

impl Drop for CudaBackupMemory {
    fn drop(&mut self) {
        // Closing the channel ends the freeing thread once it freed what it was sent.
        let freer = self
            .freer
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some((tx, handle)) = freer {
            drop(tx);
            drop(handle.join());
        }
        let bufs = std::mem::take(&mut *self.lock());
        for (addr, b) in bufs.kept.into_iter().chain(bufs.out) {
            // SAFETY: the last owner is going away: nothing uses its buffers.
            drop(unsafe { free_now(self.device, addr, b) });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A registration of `chunks` chunks at a made-up address (never dereferenced: only
    /// `registered_pieces` reads it), in the given states.
    fn fake(start: usize, len: usize, states: Vec<Chunk>) -> Arc<Registration> {
        let reg = Arc::new(Registration {
            device: 0,
            start,
            len,
            state: Mutex::new(states),
            done: Condvar::new(),
        });
        registrations().insert(start, Arc::clone(&reg));
        reg
    }

    #[test]
    fn copies_are_cut_at_chunk_boundaries_and_wait_for_their_chunks() {
        const C: usize = CHUNK_BYTES;
        let start = 1 << 44;
        let reg = fake(
            start,
            3 * C + (2 << 20),
            vec![
                Chunk::Registered,
                Chunk::Registered,
                Chunk::Pending,
                Chunk::Registered,
            ],
        );
        // Inside one chunk: one piece.
        assert_eq!(
            registered_pieces(start + 10, 100).unwrap(),
            vec![(start + 10, 100)]
        );
        // Across the first two chunks: two pieces, cut at the boundary.
        assert_eq!(
            registered_pieces(start + C - 8, 24).unwrap(),
            vec![(start + C - 8, 8), (start + C, 16)]
        );
        // The pending third chunk: the copy waits until it is registered.
        let waiter = std::thread::spawn(move || registered_pieces(start + C, 2 * C + (2 << 20)));
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            !waiter.is_finished(),
            "a copy into a chunk being registered waits"
        );
        reg.lock()[2] = Chunk::Registered;
        reg.done.notify_all();
        assert_eq!(
            waiter.join().unwrap().unwrap(),
            vec![(start + C, C), (start + 2 * C, C), (start + 3 * C, 2 << 20)]
        );
        // Past the buffer's end: an error, not a copy out of bounds.
        let past = registered_pieces(start + 3 * C, C).unwrap_err();
        assert!(
            past.to_string().contains("runs past its backup buffer"),
            "{past}"
        );
        // Memory outside every backup buffer is copied whole.
        assert_eq!(
            registered_pieces(start - 4096, 4096).unwrap(),
            vec![(start - 4096, 4096)]
        );
        registrations().remove(&start);
    }

    /// Hands `buf` out at `addr` from `m`, as `alloc_backup` would.
    fn hand_out(m: &CudaBackupMemory, addr: usize, buf: Buffer) -> NonNull<u8> {
        m.lock().out.insert(addr, buf);
        NonNull::new(addr as *mut u8).unwrap()
    }

    #[test]
    fn a_backup_freed_without_keep_is_freed_by_the_background_thread() {
        // A mapped buffer whose chunks were never registered: freeing it needs no driver
        // (nothing to unregister), only the unmap.
        let m = CudaBackupMemory::new(0);
        let bytes = 8 << 20;
        let map = Mapping::new(bytes, Pages::Huge).unwrap();
        let addr = map.as_ptr() as usize;
        let refused = CudaError::HostAlloc {
            message: "not registered in this test".into(),
        };
        let reg = Arc::new(Registration {
            device: 0,
            start: addr,
            len: map.len(),
            state: Mutex::new(vec![
                Chunk::Failed(refused);
                map.len().div_ceil(CHUNK_BYTES)
            ]),
            done: Condvar::new(),
        });
        registrations().insert(addr, Arc::clone(&reg));
        let buf = Buffer {
            bytes,
            mapping: Some((map, reg)),
        };
        let p = hand_out(&m, addr, buf);
        // SAFETY: handed out above; no copy uses it.
        unsafe { m.free_backup(p, bytes) }.unwrap();
        assert!(
            m.freer.lock().unwrap().is_some(),
            "the freeing thread was started"
        );
        assert_eq!(m.kept_bytes(), 0, "freed, not kept");
        let bufs = m.lock();
        assert!(bufs.out.is_empty() && bufs.kept.is_empty() && bufs.freeing == 0);
        drop(bufs);
        assert!(
            !registrations().contains_key(&addr),
            "its registration is forgotten"
        );
        // Freeing it again is an error, not a double free.
        // SAFETY: not handed out any more: the call only looks it up.
        let again = unsafe { m.free_backup(p, bytes) }.unwrap_err();
        assert!(
            matches!(again, BackendError::InvalidPointer { .. }),
            "{again}"
        );
    }

    #[test]
    fn a_background_free_the_driver_refuses_keeps_its_buffer() {
        // `cuMemFreeHost` of a made-up address fails (without a driver as well): the buffer
        // stays kept and is counted, once the background free is done.
        let m = CudaBackupMemory::new(0);
        let (addr, bytes) = (1usize << 46, 4096);
        let p = hand_out(
            &m,
            addr,
            Buffer {
                bytes,
                mapping: None,
            },
        );
        // SAFETY: handed out above; no copy uses it (nothing is ever read at the address).
        unsafe { m.free_backup(p, bytes) }.unwrap();
        assert_eq!(m.kept_bytes(), bytes as u64, "kept after the refused free");
        assert!(m.release_kept().is_err(), "the retry fails the same way");
        assert_eq!(m.kept_bytes(), bytes as u64, "and keeps it again");
        // Dropping `m` tries once more and says nothing.
    }

    #[test]
    fn a_chunk_the_driver_refused_fails_the_copies_into_it_only() {
        const C: usize = CHUNK_BYTES;
        let start = 1 << 45;
        let refused = CudaError::HostAlloc {
            message: "cuMemHostRegister refused".into(),
        };
        fake(
            start,
            2 * C,
            vec![Chunk::Registered, Chunk::Failed(refused.clone())],
        );
        assert_eq!(registered_pieces(start, C).unwrap(), vec![(start, C)]);
        assert_eq!(registered_pieces(start + C - 1, 2).unwrap_err(), refused);
        registrations().remove(&start);
    }
}
