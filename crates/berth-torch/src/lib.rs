//! berth-torch: berth's device-memory policies as PyTorch's CUDA allocator.
//!
//! A shared library exporting the C functions of PyTorch's `CUDAPluggableAllocator`
//! (`torch.cuda.memory.CUDAPluggableAllocator`,
//! <https://pytorch.org/docs/stable/notes/cuda.html#using-custom-memory-allocators-for-cuda>)
//! over `berth-cuda`'s backends, with the policy chosen at install: `pytorch` (PyTorch's caching
//! allocator, byte for byte), `expandable` (with expandable segments) or `paged` (berth's own).
//! Built with the `python` feature (what maturin does) the same library is the extension
//! module `berth_torch._native` of the Python package `berth_torch`, whose C++ allocator
//! (`Note [The full allocator]`) PyTorch gets in place of its own, calling these functions for
//! every method of PyTorch's allocator interface (the pluggable hooks are the fallback where
//! the C++ part cannot be built):
//!
//! ```python
//! import berth_torch
//! berth_torch.use_allocator("paged")      # before any CUDA allocation
//! # ... an ordinary PyTorch program ...
//! berth_torch.memory_stats()              # torch.cuda.memory_stats()'s keys and meanings
//! ```
//!
//! Files:
//! - `install.rs` — the installed policy and one allocator per device (`Note [One allocator
//!   per process]`);
//! - `abi.rs` — the exported C functions (the hooks, install, errors, the test switch);
//! - `allocator_abi.rs` — the C functions of the full allocator beyond the hooks (statistics,
//!   snapshots, history, private pools, cache queries);
//! - `oom.cpp` — the alloc hook's failure path (`Note [Raising from the alloc hook]`);
//! - `python.rs` — the Python extension module (feature `python`).
//!
//! # Where this crate sits
//! ```text
//! berth-alloc  <-  berth-cuda  <-  berth  <-  berth-data  <-  berth-cli (the `berth` binary)
//!                      ^
//!                      +-- berth-torch (this crate)
//! ```
//!
//! It depends on [`berth_alloc`] (the policies) and [`berth_cuda`] (the CUDA backends, with
//! feature `cuda` always on), not on `berth`: PyTorch owns the tensors. Nothing in the workspace
//! depends on it; PyTorch loads it (by path, or as the Python package `berth_torch`).
//!
//! # Design notes
//! - `Note [One allocator per process]`: `src/install.rs`
//! - `Note [Raising from the alloc hook]`: `src/oom.cpp`
//! - `Note [The full allocator]`: `python/berth_torch/csrc/allocator.cpp` (the C++
//!   `CUDAAllocator` PyTorch gets; built at first use by the Python package)

pub mod abi;
pub mod allocator_abi;
pub mod install;
pub mod ipc_abi;
#[cfg(feature = "python")]
mod python;

pub use berth_alloc::{Policy, PolicyError};
pub use install::{install, installed, HookError, Installed};

use std::ffi::{c_int, c_void};

extern "C-unwind" {
    fn berth_torch_alloc_or_throw(size: usize, device: c_int, stream: *mut c_void) -> *mut c_void;
}

extern "C" {
    fn berth_torch_set_python_exception(oom_class: *mut c_void) -> c_int;
}

/// The `alloc` hook PyTorch calls by name: `size` bytes on `device`, ordered on `stream` (a
/// `cudaStream_t`). Returns the device pointer; NULL only for zero bytes, or, before Python
/// registered its exception class (no interpreter in the process: tests), when the request
/// cannot be served. In a Python process a request the policy cannot serve after freeing its
/// cached blocks and retrying throws PyTorch's `python_error` carrying
/// `torch.OutOfMemoryError` with berth's message (`Note [Raising from the alloc hook]`), so
/// the frames between here and PyTorch's Python binding unwind.
// `stream` is an opaque `cudaStream_t` handle, never dereferenced by berth.
#[allow(clippy::not_unsafe_ptr_arg_deref)]
#[no_mangle]
pub extern "C-unwind" fn berth_torch_alloc(
    size: usize,
    device: c_int,
    stream: *mut c_void,
) -> *mut c_void {
    // SAFETY: `berth_torch_alloc_or_throw` (oom.cpp) takes plain values and may only throw
    // the C++ exception described above, which the "C-unwind" ABI lets pass.
    unsafe { berth_torch_alloc_or_throw(size, device, stream) }
}

/// Registers `oom_class` (a `PyObject*` the caller keeps alive for the process) as the
/// exception the alloc hook raises for out-of-memory. Returns false when the process has no
/// Python interpreter to raise it in.
///
/// # Safety
/// `oom_class` is a live Python exception class, and the GIL is held.
pub unsafe fn set_python_exception(oom_class: *mut c_void) -> bool {
    // SAFETY: the caller's contract; the C++ side only stores the pointer and resolves the
    // interpreter's symbols.
    unsafe { berth_torch_set_python_exception(oom_class) == 0 }
}
