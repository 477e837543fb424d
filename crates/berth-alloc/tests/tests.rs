//! Integration tests of berth-alloc (one binary, modules per area).

mod util;

mod bad_input;
mod behaviour_cases;
mod conformance;
mod faithful;
mod invariants;
mod paged;
