//! Integration tests of berth-alloc (one binary, modules per area).

mod util;

mod faithful;
