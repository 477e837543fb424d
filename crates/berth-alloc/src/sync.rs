//! The `std`/loom shim: every lock and atomic of berth-alloc comes from here (tokio's
//! `src/loom/mod.rs`), so that building with `RUSTFLAGS="--cfg loom"` swaps them for
//! [loom](https://docs.rs/loom)'s model-checked versions and the loom tests in
//! `tests/loom.rs` explore every interleaving of the allocators' free and event paths.
//!
//! | item | normal build | `--cfg loom` |
//! |---|---|---|
//! | [`Mutex`], [`MutexGuard`] | `std::sync` | `loom::sync` |
//! | [`SpinMutex`], [`SpinGuard`] | a test-and-test-and-set lock (below) | over `loom::sync::Mutex` |
//! | [`atomic`] (`AtomicU64`, `Ordering`) | `std::sync::atomic` | `loom::sync::atomic` |
//! | [`Arc`] | `std::sync` | `std::sync` (see below) |
//!
//! loom's `Mutex::lock` returns the same `LockResult` as std's (it never poisons), so call
//! sites keep `lock().unwrap_or_else(|e| e.into_inner())` unchanged under both builds.
//!
//! [`Arc`] stays `std::sync::Arc` under loom: the policies coerce `Arc<Shared<B>>` into the
//! public `Arc<dyn AllocationOwner>` of [`crate::Allocation::new`], and loom's `Arc` cannot be
//! unsize-coerced on stable Rust (it needs `loom::sync::Arc::from_std` on a unique `Arc`).
//! Reference counts are not where the allocators synchronise (all state is behind a
//! [`Mutex`]), so loom loses nothing it could check there. A `std` `Arc` is sound inside a
//! loom model: loom runs its threads one at a time on one OS thread.
//!
//! berth-alloc spawns no threads of its own (only tests do, with `std::thread::scope`, which
//! has no loom counterpart); the loom tests spawn theirs with `loom::thread`.

#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};

pub(crate) use std::sync::Arc;

#[cfg(not(loom))]
pub(crate) use spin::{SpinGuard, SpinMutex};

#[cfg(loom)]
pub(crate) use loom_spin::{SpinGuard, SpinMutex};

/// The device allocators' state lock.
///
/// # Note [Spin lock]
/// Every allocation and free takes the policy's state lock once, for about 100 ns. With `std`'s
/// futex mutex both taking it (`cmpxchg`) and releasing it (`xchg`, to learn whether a waiter
/// must be woken) are atomic read-modify-writes, and on the trace replays the two were a fifth
/// of all the time spent (sampled with `perf`). This lock takes with one `cmpxchg` and
/// releases with a plain release store. A thread that finds it held spins on a load (no
/// cache-line ping-pong) for a few dozen rounds, then yields its time slice between checks, so
/// a holder that waits on the driver (`empty_cache` freeing segments) costs waiters
/// `sched_yield`s, not a core each. It never poisons: the state is kept consistent so that a
/// panic mid-operation cannot occur on user input.
///
/// Under `--cfg loom` it is a thin wrapper over loom's mutex, so the loom models explore the
/// allocators' interleavings as before; the lock itself is checked by the std-thread test
/// below and under Miri.
#[cfg(not(loom))]
mod spin {
    use std::cell::UnsafeCell;
    use std::marker::PhantomData;
    use std::ops::{Deref, DerefMut};
    use std::sync::atomic::{AtomicBool, Ordering};

    /// A mutual-exclusion lock for short critical sections. See `Note [Spin lock]`.
    pub(crate) struct SpinMutex<T> {
        locked: AtomicBool,
        value: UnsafeCell<T>,
    }

    // SAFETY: the lock hands out access to `value` to one thread at a time (`Acquire` on taking
    // it, `Release` on giving it back), as `std::sync::Mutex` does; `T: Send` suffices.
    unsafe impl<T: Send> Send for SpinMutex<T> {}
    // SAFETY: as above.
    unsafe impl<T: Send> Sync for SpinMutex<T> {}

    /// Access to a [`SpinMutex`]'s value; releases the lock when dropped.
    pub(crate) struct SpinGuard<'a, T> {
        lock: &'a SpinMutex<T>,
        /// Makes the guard `Sync` only when `T` is (sharing `&SpinGuard` shares `&T`), as
        /// `std::sync::MutexGuard`; without it the guard would be `Sync` for any `T: Send`.
        _access: PhantomData<&'a mut T>,
    }

    /// Rounds of `spin_loop` before a waiter starts yielding its time slice.
    const SPINS: u32 = 64;

    impl<T> SpinMutex<T> {
        pub(crate) fn new(value: T) -> Self {
            SpinMutex {
                locked: AtomicBool::new(false),
                value: UnsafeCell::new(value),
            }
        }

        /// Takes the lock, waiting while another thread holds it.
        #[inline]
        pub(crate) fn lock(&self) -> SpinGuard<'_, T> {
            if self
                .locked
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_err()
            {
                self.lock_contended();
            }
            SpinGuard {
                lock: self,
                _access: PhantomData,
            }
        }

        #[cold]
        fn lock_contended(&self) {
            let mut spins = 0;
            loop {
                while self.locked.load(Ordering::Relaxed) {
                    if spins < SPINS {
                        spins += 1;
                        std::hint::spin_loop();
                    } else {
                        std::thread::yield_now();
                    }
                }
                if self
                    .locked
                    .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    return;
                }
            }
        }
    }

    impl<T> Deref for SpinGuard<'_, T> {
        type Target = T;

        #[inline]
        fn deref(&self) -> &T {
            // SAFETY: the guard exists only while this thread holds the lock.
            unsafe { &*self.lock.value.get() }
        }
    }

    impl<T> DerefMut for SpinGuard<'_, T> {
        #[inline]
        fn deref_mut(&mut self) -> &mut T {
            // SAFETY: as in `deref`; `&mut self` makes the access unique.
            unsafe { &mut *self.lock.value.get() }
        }
    }

    impl<T> Drop for SpinGuard<'_, T> {
        #[inline]
        fn drop(&mut self) {
            self.lock.locked.store(false, Ordering::Release);
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;

        /// Threads incrementing a non-atomic pair under the lock never see it torn and lose no
        /// update (run under Miri too, which checks the lock's happens-before edges).
        #[test]
        fn excludes_and_publishes_across_threads() {
            let threads = 4;
            let rounds = if cfg!(miri) { 50 } else { 20_000 };
            let m = SpinMutex::new((0u64, 0u64));
            std::thread::scope(|s| {
                for _ in 0..threads {
                    s.spawn(|| {
                        for _ in 0..rounds {
                            let mut g = m.lock();
                            assert_eq!(g.0, g.1, "a reader saw a half-done update");
                            g.0 += 1;
                            std::hint::black_box(&mut *g);
                            g.1 += 1;
                        }
                    });
                }
            });
            let g = m.lock();
            assert_eq!(*g, (threads * rounds, threads * rounds));
        }
    }
}

/// [`SpinMutex`] under loom: loom's mutex with the same interface.
#[cfg(loom)]
mod loom_spin {
    pub(crate) type SpinGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

    pub(crate) struct SpinMutex<T>(loom::sync::Mutex<T>);

    impl<T> SpinMutex<T> {
        pub(crate) fn new(value: T) -> Self {
            SpinMutex(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> SpinGuard<'_, T> {
            self.0.lock().unwrap_or_else(|e| e.into_inner())
        }
    }
}

/// Atomic integers (`std::sync::atomic`, or loom's under `--cfg loom`).
pub(crate) mod atomic {
    #[cfg(not(loom))]
    pub(crate) use std::sync::atomic::{AtomicU64, Ordering};

    #[cfg(loom)]
    pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
}
