//! Integration tests of berth-data (one binary, modules per area).

mod bad_input;
mod bugs;
mod distributed_sampler;
mod idx;
mod iterable;
mod lazy_epochs;
mod loader;
mod pinned;
mod sampler;
mod tensors;
mod util;
mod worker_failures;
