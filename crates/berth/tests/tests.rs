//! berth's integration tests: one binary, one module per area (house style: `autotests =
//! false`). CUDA modules (`cuda_*.rs`) are added by their owners with one line each.

mod util;

mod bugs;
mod creation;
#[cfg(feature = "cuda")]
mod cuda_index;
#[cfg(feature = "cuda")]
mod cuda_ops;
#[cfg(feature = "cuda")]
mod cuda_optim;
#[cfg(feature = "cuda")]
mod cuda_runtime;
#[cfg(feature = "cuda")]
mod cuda_transfer;
mod device;
mod display;
mod index;
mod integers;
mod meta;
mod nn;
mod nn_buffers;
mod ops;
mod optim;
mod sizes;
mod storage;
mod to;
mod views;
