//! The allocator front desk: which policy serves a device ([`Policy`]). Its configuration is
//! [`crate::AllocatorConfig`] ([`Policy::config`] adds options to a policy), and one factory,
//! [`crate::device_allocator`], builds it.
//!
//! Every door into berth's device allocators goes through here: berth's tensors (the per-device
//! registry of `berth-cuda`, configured by `BERTH_ALLOC_CONF`), PyTorch programs through
//! `berth_torch.use_allocator(policy, options)`, and `berth replay --policy`. The same names
//! mean the same policy everywhere.
//!
//! # Note [Policy without virtual memory]
//! `expandable` and `paged` map physical memory into reserved address ranges, which needs the
//! driver's virtual-memory management
//! (<https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__VA.html>; the device attribute
//! `CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED`). On a device without it berth
//! gives one answer at every door:
//! - a policy the user **chose** (`backend:` or `expandable_segments:True` in the options,
//!   `berth_torch.use_allocator("paged")`, `berth replay --policy paged`) is an error,
//!   [`crate::AllocError::Unsupported`], saying what is missing; berth does not silently run
//!   something else;
//! - the **default** (no `backend:` and no option of PyTorch's policy written) is
//!   [`Policy::DEFAULT`] where the device can run it and PyTorch's caching allocator
//!   ([`Policy::Pytorch`]) where it cannot; the allocator's
//!   [`crate::DeviceAllocator::policy_name`] then says `pytorch`.
//!
//! PyTorch does the same for the one such option it has: `expandable_segments:True` on a
//! device without virtual memory fails at the first allocation
//! (<https://github.com/pytorch/pytorch/blob/main/c10/cuda/CUDACachingAllocator.cpp>,
//! `ExpandableSegment`).

use crate::error::PolicyError;

/// Which of berth's device-memory policies serves a device.
///
/// Named as `berth_torch.use_allocator` and `berth replay --policy` take them; in
/// `BERTH_ALLOC_CONF` (PyTorch's `PYTORCH_CUDA_ALLOC_CONF` syntax) they are written
/// `backend:native`, `backend:native,expandable_segments:True` (or `expandable_segments:True`
/// alone, as in PyTorch) and `backend:paged`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Policy {
    /// PyTorch's caching allocator, byte for byte ([`crate::caching::CachingAllocator`],
    /// `backend:native`):
    /// same segments, same reserved bytes, same number of device mallocs as PyTorch's default.
    Pytorch,
    /// PyTorch's caching allocator with expandable segments (`expandable_segments:True`).
    Expandable,
    /// berth's own policy ([`crate::PagedBestFit`], `backend:paged`): best fit over a virtual range
    /// per stream with physical memory mapped on demand.
    Paged,
}

impl Policy {
    /// The policy used when none is chosen (no `backend:` and no option of PyTorch's policy):
    /// the one that holds the least device memory in live use (`BENCHMARKS.md`).
    pub const DEFAULT: Policy = Policy::Paged;

    /// Every policy, in the order error messages list them.
    pub const ALL: [Policy; 3] = [Policy::Pytorch, Policy::Expandable, Policy::Paged];

    /// The policy named `name`: `"pytorch"`, `"expandable"` or `"paged"`.
    ///
    /// # Errors
    /// [`PolicyError::Unknown`], naming the valid ones.
    pub fn parse(name: &str) -> Result<Policy, PolicyError> {
        Policy::ALL
            .into_iter()
            .find(|p| p.name() == name)
            .ok_or_else(|| PolicyError::Unknown {
                given: name.to_owned(),
            })
    }

    /// The policy's name, as [`Policy::parse`] takes it and summaries print it.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Pytorch => "pytorch",
            Policy::Expandable => "expandable",
            Policy::Paged => "paged",
        }
    }

    /// Whether the policy maps memory into reserved address ranges, so the device must support
    /// virtual-memory management (`Note [Policy without virtual memory]`).
    pub fn needs_virtual_memory(self) -> bool {
        !matches!(self, Policy::Pytorch)
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_list_the_valid_ones() {
        for p in Policy::ALL {
            assert_eq!(Policy::parse(p.name()), Ok(p));
            assert_eq!(p.to_string(), p.name());
        }
        let e = Policy::parse("cudaMallocAsync").unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("\"cudaMallocAsync\""), "{msg}");
        for p in Policy::ALL {
            assert!(msg.contains(p.name()), "{msg}");
        }
    }
}
