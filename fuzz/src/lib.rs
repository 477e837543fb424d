//! Shared code of berth's fuzz targets (`fuzz_targets/*.rs`): a byte reader that decodes
//! operations from a fuzz input, the bounded replay of a trace on every policy, the checks
//! of a snapshot's layout, and the driver of `berth-torch`'s C ABI over simulated devices.
//!
//! Every target caps what one input may cost (input bytes, trace rows, simulated capacity),
//! so that a slow or memory-hungry input is a finding about berth, never about the target.

pub mod abi;
pub mod input;
pub mod replay;
pub mod snapshot;
