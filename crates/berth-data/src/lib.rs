//! berth-data
