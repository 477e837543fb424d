//! The `std`/loom shim: every lock and atomic of berth-alloc comes from here (tokio's
//! `src/loom/mod.rs`), so that building with `RUSTFLAGS="--cfg loom"` swaps them for
//! [loom](https://docs.rs/loom)'s model-checked versions and the loom tests in
//! `tests/loom.rs` explore every interleaving of the allocators' free and event paths.
//!
//! | item | normal build | `--cfg loom` |
//! |---|---|---|
//! | [`Mutex`], [`MutexGuard`] | `std::sync` | `loom::sync` |
//! | [`atomic`] (`AtomicU64`, `Ordering`) | `std::sync::atomic` | `loom::sync::atomic` |
//! //! | [`Arc`] | `std::sync` | `std::sync` (see below) |
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

/// Atomic integers (`std::sync::atomic`, or loom's under `--cfg loom`).
pub(crate) mod atomic {
    #[cfg(not(loom))]
    pub(crate) use std::sync::atomic::{AtomicU64, Ordering};

    #[cfg(loom)]
    pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
}
