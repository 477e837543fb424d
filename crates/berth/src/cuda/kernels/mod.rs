//! berth's own CUDA kernels: elementwise, cast/copy, reductions, softmax and cross-entropy,
//! compiled at run time with NVRTC, once per (device, module) and process.
//!
//! This is the raw layer under [`ops`](super::ops): every function takes device addresses
//! (`CUdeviceptr` as `u64`) of memory that berth's allocators own, with the shape and strides
//! (in elements) of each operand, and enqueues work on a stream. Nothing here allocates device
//! memory, and no cudarc `CudaSlice` is involved. The NVRTC and driver calls (compile, load,
//! look up, launch) are berth-cuda's ([`berth_cuda::kernel`]); this crate names no cudarc.
//!
//! Files: `prelude.rs` (shared CUDA C: dtype table, half conversions, index structs, block
//! reductions), `module.rs` (grid sizing, kernel families, bind + look up + launch over
//! [`berth_cuda::kernel`]), `elementwise.rs` (unary, scalar,
//! binary, comparison, fill, copy/cast), `reduce.rs` (sum, mean, max, min, argmax, argmin),
//! `softmax.rs` (softmax, `log_softmax` and their backward, cross-entropy forward/backward),
//! `optim.rs` (the multi-tensor SGD update; `Note [Fused updates are exact]`), `index.rs`
//! (`index_select`).
//!
//! # Note [Kernel modules]
//! A module is compiled for one dtype (`"binary.f32"`, `"reduce.bf16"`, ...) so a program that
//! only trains in f32 compiles only f32 code (about 0.1-0.3 s per module on first use). Half
//! types are stored as `unsigned short` and converted by hand (PTX `cvt` for f16, bit shifts
//! for bf16), so NVRTC needs no CUDA include directory. f16/bf16 compute in f32, integers in
//! their own width, as PyTorch's `opmath_type`.

mod elementwise;
mod index;
mod module;
mod optim;
mod prelude;
mod reduce;
mod softmax;

pub use berth_cuda::KernelError;
pub use elementwise::{binary, compare, copy, fill, unary, BinaryOp, UnaryOp};
pub use index::index_select;
pub use optim::{sgd_momentum, SgdTensor, SGD_MAX_TENSORS};
pub use reduce::{arg_reduce, sum, sum_output, ArgReduce};
pub use softmax::{cross_entropy, cross_entropy_backward, softmax, softmax_backward, Reduction};

pub(crate) use module::{function, grid_for, launch, run, Family};
pub(crate) use prelude::module_source;

use crate::DType;

/// The `kernelParams` array of `cuLaunchKernel`: the address of each named local, in order, as
/// `*mut c_void`. The locals must be `mut`, of the kernel parameters' exact types, and live
/// until the launch call returns.
macro_rules! kernel_params {
    ($first:ident $(, $rest:ident)* $(,)?) => {
        [(&raw mut $first).cast::<::std::ffi::c_void>() $(, (&raw mut $rest).cast())*]
    };
}
pub(crate) use kernel_params;

pub use berth_cuda::kernel::RawStream;

/// The most dimensions a kernel operand may have after merging contiguous dimensions
/// (PyTorch's limit is 25; berth's index struct holds 8).
pub const MAX_DIMS: usize = 8;

/// One strided operand on the device: the address of its first element (the storage's
/// address plus the view's offset, in bytes) and its strides in elements (0 for broadcast
/// dimensions). The shape is the operation's, given separately.
#[derive(Debug, Clone, Copy)]
pub struct DeviceView<'a> {
    /// `CUdeviceptr` of element `[0, 0, ...]`.
    pub ptr: u64,
    /// The element type.
    pub dtype: DType,
    /// Strides in elements, one per dimension of the operation's shape.
    pub strides: &'a [isize],
}

impl<'a> DeviceView<'a> {
    /// A view of `ptr` with `strides` (in elements).
    pub fn new(ptr: u64, dtype: DType, strides: &'a [isize]) -> Self {
        Self {
            ptr,
            dtype,
            strides,
        }
    }
}

/// Row-major contiguous strides (in elements) of `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<isize> {
    let mut strides = vec![0isize; shape.len()];
    let mut acc = 1isize;
    for (s, &d) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc = acc.saturating_mul(isize::try_from(d).unwrap_or(isize::MAX));
    }
    strides
}

/// The index struct the kernels take (`Idx1` / `Idx2` / `Idx3` of the prelude): `N` stride
/// arrays over one shape. `#[repr(C)]` with `i64` fields only, so its layout is the C one.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct Idx<const N: usize> {
    ndim: i64,
    shape: [i64; MAX_DIMS],
    strides: [[i64; MAX_DIMS]; N],
}

impl<const N: usize> Idx<N> {
    /// Packs `shape` and the operands' strides, first dropping size-1 dimensions and merging
    /// neighbours that are contiguous for every operand (so most calls become 1-D).
    ///
    /// # Errors
    /// [`KernelError::InvalidArgument`] when a stride list has the wrong length or more than
    /// [`MAX_DIMS`] dimensions remain.
    pub(crate) fn new(
        op: &'static str,
        shape: &[usize],
        strides: [&[isize]; N],
    ) -> Result<Self, KernelError> {
        for s in &strides {
            if s.len() != shape.len() {
                return Err(KernelError::invalid(
                    op,
                    format!(
                        "an operand has {} strides for a {}-d shape {shape:?}",
                        s.len(),
                        shape.len()
                    ),
                ));
            }
        }
        // (size, strides) of the kept dimensions, outermost first.
        let mut dims: Vec<(i64, [i64; N])> = Vec::with_capacity(shape.len());
        for (d, &size) in shape.iter().enumerate() {
            if size == 1 {
                continue;
            }
            let st: [i64; N] = std::array::from_fn(|k| strides[k][d] as i64);
            if let Some(last) = dims.last_mut() {
                let mergeable = (0..N).all(|k| last.1[k] == st[k] * size as i64);
                if mergeable {
                    last.0 *= size as i64;
                    last.1 = st;
                    continue;
                }
            }
            dims.push((size as i64, st));
        }
        if dims.len() > MAX_DIMS {
            return Err(KernelError::invalid(
                op,
                format!(
                    "shape {shape:?} has {} non-mergeable dimensions; kernels take at most {MAX_DIMS}: \
                     make the operands contiguous first",
                    dims.len()
                ),
            ));
        }
        let mut idx = Self {
            ndim: dims.len() as i64,
            shape: [1; MAX_DIMS],
            strides: [[0; MAX_DIMS]; N],
        };
        for (d, (size, st)) in dims.iter().enumerate() {
            idx.shape[d] = *size;
            for (row, &s) in idx.strides.iter_mut().zip(st.iter()) {
                row[d] = s;
            }
        }
        Ok(idx)
    }
}

/// Number of elements of `shape`, as the `i64` kernels take.
pub(crate) fn numel(op: &'static str, shape: &[usize]) -> Result<i64, KernelError> {
    shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .and_then(|n| i64::try_from(n).ok())
        .ok_or_else(|| KernelError::invalid(op, format!("shape {shape:?} has too many elements")))
}

/// Makes `device`'s context current.
pub(crate) fn bind(device: usize) -> Result<(), super::CudaError> {
    super::bind_context(device)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn idx_merges_contiguous_dims_and_drops_ones() {
        let shape = [2, 1, 3, 4];
        let c = contiguous_strides(&shape);
        let idx = Idx::<1>::new("t", &shape, [&c]).unwrap();
        assert_eq!(idx.ndim, 1);
        assert_eq!(idx.shape[0], 24);
        assert_eq!(idx.strides[0][0], 1);
    }

    #[test]
    fn idx_keeps_broadcast_and_transposed_dims_apart() {
        let shape = [3, 4];
        let out = contiguous_strides(&shape);
        let bcast = [0isize, 1];
        let idx = Idx::<2>::new("t", &shape, [&out, &bcast]).unwrap();
        assert_eq!(idx.ndim, 2);
        assert_eq!(&idx.shape[..2], &[3, 4]);
        assert_eq!(&idx.strides[1][..2], &[0, 1]);
        let t = [1isize, 3];
        let idx = Idx::<2>::new("t", &shape, [&out, &t]).unwrap();
        assert_eq!(idx.ndim, 2);
    }

    #[test]
    fn idx_rejects_wrong_stride_count_and_too_many_dims() {
        let e = Idx::<1>::new("t", &[2, 3], [&[1isize][..]]).unwrap_err();
        assert!(e.to_string().contains("1 strides for a 2-d shape"), "{e}");
        let shape = [2usize; 10];
        // Every dimension non-mergeable: strides grow by 3 instead of 2.
        let strides: Vec<isize> = (0..10).rev().map(|d| 3isize.pow(d)).collect();
        let e = Idx::<1>::new("t", &shape, [&strides]).unwrap_err();
        assert!(e.to_string().contains("at most 8"), "{e}");
    }
}
