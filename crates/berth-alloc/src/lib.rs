//! berth-alloc
