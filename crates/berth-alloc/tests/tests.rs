//! Integration tests of berth-alloc (one binary, modules per area).

mod util;

mod accounting;
mod bad_input;
mod behaviour_cases;
mod conformance;
mod expandable_huge;
mod faithful;
mod fuzz_found;
mod host;
mod host_invariants;
mod inert_settings;
mod invariants;
#[cfg(loom)]
mod loom;
mod paged;
mod paged_huge;
mod pickle;
mod pickle_bad_input;
mod policy;
mod pool_checkpoint;
mod pool_settings;
mod pool_source;
mod private_pools;
mod private_pools_paged;
mod recorded;
mod sleep_wake;
mod stress;
mod trace_stream;
