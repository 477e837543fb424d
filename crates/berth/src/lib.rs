//! berth
