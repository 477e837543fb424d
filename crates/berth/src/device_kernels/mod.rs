//! The per-device kernel interface: what the tensor front-ends call once shapes and dtypes
//! have been checked by [`crate::ops::infer`]. The CPU implements [`DeviceKernels`] in
//! `crate::cpu`; the CUDA implementation (owned by the CUDA kernels, `crate::cuda::ops`) is
//! plugged in by [`kernels_for`]; the meta device never reaches it (front-ends build meta
//! results from the inferred shape). The contract every kernel keeps is on [`DeviceKernels`].
//!
//! This module is the public door; the code is in two files beside each other, so that the
//! interface is a leaf: `interface.rs` declares the trait and its operand types and imports
//! none of its implementations, `dispatch.rs` picks a device's implementation and wraps it
//! for the profiler. berth's own code imports those two files, never this door, so that no
//! implementation reaches the dispatch back through it. (The paths below are written from
//! `crate::` so that `scripts/ci/import_loops.py` counts these edges.)

pub(crate) mod dispatch;
pub(crate) mod interface;

pub use crate::device_kernels::dispatch::kernels_for;
pub use crate::device_kernels::interface::{DeviceKernels, RandomDist, SgdParam, View};
