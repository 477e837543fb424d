//! Peak-memory prediction on meta: run code on meta tensors while a [`MetaPlan`] is active and
//! every meta storage allocates its byte size from a caching allocator over a simulated device.
//!
//! Note [Meta storage]: meta storage owns no memory. Its size is still known, so while a plan is
//! active on the creating thread, [`crate::Storage::meta`] also takes an
//! [`berth_alloc::Allocation`] of that size from the plan's allocator (the policy that serves
//! CUDA tensors, configured from `BERTH_ALLOC_CONF`, over [`SimBackend`])
//! and keeps it until the storage is dropped. The allocator's statistics then show what the
//! same sequence of tensors would have cost on the GPU *including* 512-byte rounding, pages or
//! segments, and caching: `max_memory_allocated` and `max_memory_reserved` of the plan are the
//! prediction. Nothing is allocated on any real device.
//!
//! ```
//! use berth::alloc::AllocatorConfig;
//! use berth::{meta_plan::MetaPlan, DType, Device, Tensor};
//! let run = |conf: &str| -> berth::Result<MetaPlan> {
//!     let plan = MetaPlan::with_config(80 << 30, AllocatorConfig::parse(conf).unwrap())?;
//!     let _active = plan.activate();
//!     let a = Tensor::zeros(&[1024, 1024], DType::F32, Device::Meta)?; // 4 MiB
//!     let _b = a.matmul(&a)?;                                          // 4 MiB more
//!     Ok(plan.clone())
//! };
//! let native = run("backend:native")?;
//! assert_eq!(native.max_memory_allocated(), 8 << 20);
//! // PyTorch's policy: both 4 MiB blocks are carved from one 20 MiB segment.
//! assert_eq!(native.max_memory_reserved(), 20 << 20);
//! // berth's paged policy maps 2 MiB pages as the blocks need them: exactly their 8 MiB.
//! let paged = run("backend:paged")?;
//! assert_eq!(paged.max_memory_allocated(), 8 << 20);
//! assert_eq!(paged.max_memory_reserved(), 8 << 20);
//! # Ok::<(), berth::Error>(())
//! ```

use std::cell::RefCell;
use std::sync::Arc;

use berth_alloc::backend::sim::SimBackend;
use berth_alloc::{Allocation, AllocatorConfig, DeviceAllocator, MemoryStats, StreamId};

use crate::{Error, Result};

thread_local! {
    /// The active plans of this thread, innermost last, each with its guard's id.
    static ACTIVE: RefCell<Vec<(u64, Arc<dyn DeviceAllocator>)>> = const { RefCell::new(Vec::new()) };
    /// The id of the next guard on this thread.
    static NEXT_GUARD: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// A simulated device whose caching allocator records what meta tensors would have allocated.
#[derive(Clone)]
pub struct MetaPlan {
    allocator: Arc<dyn DeviceAllocator>,
}

impl std::fmt::Debug for MetaPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaPlan")
            .field("policy", &self.allocator.policy_name())
            .finish()
    }
}

impl MetaPlan {
    /// A plan over a simulated device of `capacity_bytes` (use the real GPU's total memory to
    /// also predict out-of-memory: [`MetaPlan::num_ooms`] then counts what would not fit), with the policy and options `BERTH_ALLOC_CONF` selects for
    /// CUDA devices ([`AllocatorConfig::policy`]: berth's `paged` by default, PyTorch's
    /// caching allocator with `backend:native`), so the prediction is of the allocator the
    /// real run uses.
    ///
    /// # Errors
    /// [`Error::Alloc`] for a malformed `BERTH_ALLOC_CONF`.
    pub fn new(capacity_bytes: u64) -> Result<MetaPlan> {
        let config = AllocatorConfig::from_env().map_err(|e| Error::Alloc(e.into()))?;
        MetaPlan::with_config(capacity_bytes, config)
    }

    /// A plan over a simulated device of `capacity_bytes` with the policy and options of
    /// `config` (what [`MetaPlan::new`] reads from `BERTH_ALLOC_CONF`).
    ///
    /// # Errors
    /// [`Error::Alloc`] when the policy cannot run on the simulated device (it cannot: the
    /// simulator has virtual memory).
    pub fn with_config(capacity_bytes: u64, config: AllocatorConfig) -> Result<MetaPlan> {
        let allocator = berth_alloc::device_allocator(SimBackend::new(capacity_bytes), config, 0)?;
        Ok(MetaPlan { allocator })
    }

    /// Makes this plan record the meta storages created on this thread until the guard drops.
    /// Plans nest; the most recently activated one whose guard is alive records. Dropping a
    /// guard deactivates its own plan, in whatever order guards are dropped.
    pub fn activate(&self) -> MetaPlanGuard {
        let id = NEXT_GUARD.with(|n| {
            let id = n.get();
            n.set(id + 1);
            id
        });
        ACTIVE.with(|a| a.borrow_mut().push((id, Arc::clone(&self.allocator))));
        MetaPlanGuard {
            id,
            _not_send: std::marker::PhantomData,
        }
    }

    /// Planned allocations that did not fit the simulated device (the allocator's
    /// `num_ooms`): the real run would have run out of memory. The peaks
    /// ([`MetaPlan::max_memory_allocated`], [`MetaPlan::max_memory_reserved`]) leave out the
    /// requests that did not fit, so a prediction is complete only when this is 0. Meta code
    /// itself never fails for lack of memory.
    pub fn num_ooms(&self) -> u64 {
        self.allocator.stats().num_ooms.max(0) as u64
    }

    /// The plan's allocator (statistics, `memory_summary`, snapshot).
    pub fn allocator(&self) -> &Arc<dyn DeviceAllocator> {
        &self.allocator
    }

    /// All statistics of the plan's allocator.
    pub fn stats(&self) -> MemoryStats {
        self.allocator.stats()
    }

    /// Predicted peak bytes allocated to tensors (`max_memory_allocated`).
    pub fn max_memory_allocated(&self) -> u64 {
        self.allocator
            .memory_stats()
            .get("allocated_bytes.all.peak")
            .copied()
            .unwrap_or(0)
            .max(0) as u64
    }

    /// Predicted peak bytes reserved from the device (`max_memory_reserved`).
    pub fn max_memory_reserved(&self) -> u64 {
        self.allocator
            .memory_stats()
            .get("reserved_bytes.all.peak")
            .copied()
            .unwrap_or(0)
            .max(0) as u64
    }

    /// Predicted `memory_summary()` table.
    pub fn memory_summary(&self) -> String {
        self.allocator.memory_summary(false)
    }
}

/// Deactivates its [`MetaPlan`] on drop. Not `Send`: a plan is active on one thread.
#[derive(Debug)]
pub struct MetaPlanGuard {
    /// Which entry of this thread's active plans is this guard's.
    id: u64,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for MetaPlanGuard {
    fn drop(&mut self) {
        ACTIVE.with(|a| {
            let mut a = a.borrow_mut();
            if let Some(i) = a.iter().rposition(|(id, _)| *id == self.id) {
                a.remove(i);
            }
        });
    }
}

/// The planned allocation for a new meta storage of `nbytes`, when a plan is active. A failed
/// planned allocation (the simulated device is full) is counted by the plan's allocator
/// (`num_ooms`) and yields `None`: meta code itself never fails for lack of memory.
pub(crate) fn plan_allocation(nbytes: usize) -> Option<Allocation> {
    ACTIVE.with(|a| {
        let a = a.borrow();
        let (_, alloc) = a.last()?;
        alloc.allocate(nbytes, StreamId::DEFAULT).ok()
    })
}
