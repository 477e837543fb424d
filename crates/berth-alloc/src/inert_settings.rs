//! Allocator settings PyTorch accepts and then ignores, or applies where they misbehave: berth
//! says so once per process when an allocator is built with them ([`crate::warnings`]).
//!
//! - `garbage_collection_threshold` acts only under a per-process memory fraction: without one
//!   PyTorch never collects (<https://github.com/pytorch/pytorch/issues/106660>). berth follows
//!   PyTorch (the threshold waits for a fraction) and says so.
//! - `roundup_power2_divisions` of 1 for an interval rounds nothing in PyTorch
//!   (<https://github.com/pytorch/pytorch/issues/161139>); berth follows and says so.
//! - `max_split_size_mb` with `expandable_segments:True`: PyTorch applies the oversize rule to
//!   blocks inside expandable segments, so a loop that frees two large blocks and asks for a
//!   smaller one maps new pages every cycle and reserved memory grows without bound
//!   (<https://github.com/pytorch/pytorch/issues/123548>). berth does not apply the rule inside
//!   expandable segments (PyTorch's maintainers' stated intent): `max_split_size_mb` has no
//!   effect there, and berth says so.

use crate::config::AllocatorConfig;
use crate::warnings::warn_once;

/// Says once per process, for each of the settings above that `cfg` sets, what it does and
/// what to set instead. Returns how many warnings this call said (0 when all were said before).
pub fn warn_inert_settings(cfg: &AllocatorConfig) -> usize {
    let mut said = 0;
    if cfg.garbage_collection_threshold > 0.0 {
        said += usize::from(warn_once(
            "alloc-conf-gc-threshold-without-fraction",
            || {
                format!(
                    "garbage_collection_threshold:{} takes effect only once a per-process memory \
                 fraction is set (torch.cuda.set_per_process_memory_fraction, or \
                 berth::cuda::set_per_process_memory_fraction); without one nothing is \
                 collected, as in PyTorch",
                    cfg.garbage_collection_threshold
                )
            },
        ));
    }
    if cfg.roundup_power2_divisions.contains(&1) {
        said += usize::from(warn_once("alloc-conf-roundup-divisions-of-one", || {
            "roundup_power2_divisions of 1 rounds nothing (PyTorch treats it as off); use 2 or \
             more divisions to round sizes up, or 0 to say off"
                .to_owned()
        }));
    }
    if cfg.expandable_segments && cfg.max_split_size.is_some() {
        said += usize::from(warn_once("alloc-conf-max-split-with-expandable", || {
            "max_split_size_mb has no effect with expandable_segments:True in berth: inside \
             expandable segments any free block may be split, because PyTorch's oversize rule \
             there grows reserved memory without bound (pytorch/pytorch#123548); drop one of \
             the two options"
                .to_owned()
        }));
    }
    said
}
