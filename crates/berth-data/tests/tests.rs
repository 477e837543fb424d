//! Integration tests of berth-data (one binary, modules per area).

mod bugs;
mod idx;
mod loader;
mod pinned;
mod sampler;
mod tensors;
mod util;
