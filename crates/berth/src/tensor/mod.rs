//! [`Tensor`] (its docs say what a tensor is and how aliases share storage). The split follows
//! the sub-modules: `create` (constructors), `view`, `to` (the `.to()` contract and host
//! reads), `ops` (math front-ends), `inplace`, `display`.

mod create;
mod display;
mod index;
mod inplace;
mod ops;
mod to;
mod view;

use std::fmt;
use std::sync::Arc;

use crate::{DType, Device, Layout, Result, Storage};

pub use to::ToOptions;

/// An n-dimensional array on a device: an `Arc<Storage>` plus a [`Layout`] (shape, strides,
/// offset in elements), a [`DType`] and a `requires_grad` flag.
///
/// A `Tensor` value is a *handle*: views ([`Tensor::reshape`], [`Tensor::t`],
/// [`Tensor::detach`], [`Tensor::alias`], `to` without a change ...) share the storage, and
/// in-place operations (`add_`, `copy_`, ...) write through it, visible to every alias (the
/// aliasing model is documented on [`Storage`]). `Tensor` deliberately does not implement
/// `Clone`: [`Tensor::clone`] is PyTorch's `clone()` (new storage), and [`Tensor::alias`] is the
/// cheap handle copy.
pub struct Tensor {
    storage: Arc<Storage>,
    layout: Layout,
    dtype: DType,
    requires_grad: bool,
}

impl Tensor {
    /// A tensor over `storage` with `layout`. Internal: callers guarantee the layout fits.
    pub(crate) fn from_storage(storage: Arc<Storage>, layout: Layout, dtype: DType) -> Tensor {
        debug_assert!(layout.required_elements() * dtype.size_in_bytes() <= storage.nbytes());
        Tensor {
            storage,
            layout,
            dtype,
            requires_grad: false,
        }
    }

    /// A tensor over an existing storage (e.g. host memory from a pinned allocator, or
    /// device memory from the CUDA runtime), checked: the layout must fit in the storage.
    ///
    /// # Errors
    /// [`crate::Error::NumelOverflow`] for a shape whose element count overflows;
    /// [`crate::Error::Shape`] when the strides do not have one entry per dimension, or the
    /// layout reaches past `storage.nbytes()`.
    pub fn from_parts(storage: Arc<Storage>, layout: Layout, dtype: DType) -> Result<Tensor> {
        if layout.shape().len() != layout.strides().len() {
            return Err(crate::Error::Shape {
                op: "from_parts",
                what: format!(
                    "shape {:?} has {} dimensions but strides {:?} has {}; give one stride per dimension",
                    layout.shape(),
                    layout.shape().len(),
                    layout.strides(),
                    layout.strides().len()
                ),
            });
        }
        crate::layout::checked_numel(layout.shape(), "from_parts")?;
        let need = layout
            .checked_required_elements()
            .and_then(|n| n.checked_mul(dtype.size_in_bytes()));
        if need.is_none_or(|need| need > storage.nbytes()) {
            let need = need.map_or_else(|| "more than usize::MAX".to_string(), |n| n.to_string());
            return Err(crate::Error::Shape {
                op: "from_parts",
                what: format!(
                    "layout {:?} with strides {:?} at offset {} needs {need} bytes of {dtype} but the storage holds {}",
                    layout.shape(),
                    layout.strides(),
                    layout.offset(),
                    storage.nbytes()
                ),
            });
        }
        Ok(Tensor {
            storage,
            layout,
            dtype,
            requires_grad: false,
        })
    }

    /// A contiguous tensor of `shape` over a fresh `storage`.
    pub(crate) fn from_contiguous(storage: Storage, shape: &[usize], dtype: DType) -> Tensor {
        Tensor::from_storage(Arc::new(storage), Layout::contiguous(shape), dtype)
    }

    /// Another view with a new layout over the same storage (keeps `requires_grad`).
    pub(crate) fn with_layout(&self, layout: Layout) -> Tensor {
        Tensor {
            storage: Arc::clone(&self.storage),
            layout,
            dtype: self.dtype,
            requires_grad: self.requires_grad,
        }
    }

    /// A new handle to the same tensor: same storage, layout, dtype and `requires_grad` (what
    /// `y = x` does in Python). Cheap; no data is copied.
    pub fn alias(&self) -> Tensor {
        self.with_layout(self.layout.clone())
    }

    /// The shape (sizes of each dimension).
    pub fn shape(&self) -> &[usize] {
        self.layout.shape()
    }

    /// Alias of [`Tensor::shape`] (PyTorch's `size()`).
    pub fn size(&self) -> &[usize] {
        self.layout.shape()
    }

    /// The strides of each dimension, in elements.
    pub fn strides(&self) -> &[usize] {
        self.layout.strides()
    }

    /// The offset of the first element in the storage, in elements.
    pub fn storage_offset(&self) -> usize {
        self.layout.offset()
    }

    /// The layout (shape, strides, offset).
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.layout.rank()
    }

    /// Alias of [`Tensor::rank`] (PyTorch's `dim()`).
    pub fn dim(&self) -> usize {
        self.layout.rank()
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The device (`cpu`, `cuda:i` with an index, or `meta`).
    pub fn device(&self) -> Device {
        self.storage.device_of()
    }

    /// The number of elements.
    pub fn numel(&self) -> usize {
        self.layout.numel()
    }

    /// Size of one element in bytes.
    pub fn element_size(&self) -> usize {
        self.dtype.size_in_bytes()
    }

    /// `numel × element_size`, in bytes (PyTorch's `nbytes`; a view counts its own elements).
    pub fn nbytes(&self) -> usize {
        // Fits: every tensor's shape passed `layout::checked_nbytes` or is a view of one.
        self.numel().saturating_mul(self.element_size())
    }

    /// Whether the elements are dense and row-major.
    pub fn is_contiguous(&self) -> bool {
        self.layout.is_contiguous()
    }

    /// The storage, shared by every alias.
    pub fn storage(&self) -> &Arc<Storage> {
        &self.storage
    }

    /// A process-unique identity of the storage: equal for aliases, different after a copy.
    pub fn storage_id(&self) -> u64 {
        self.storage.id()
    }

    /// The address of the first element (host pointer, device pointer, or 0 for meta);
    /// like PyTorch's `data_ptr()`, it includes the storage offset.
    pub fn data_ptr(&self) -> u64 {
        let base = self.storage.data_ptr();
        if base == 0 {
            return 0;
        }
        base + (self.layout.offset() * self.element_size()) as u64
    }

    /// Whether two tensors share a storage.
    pub fn shares_storage(&self, other: &Tensor) -> bool {
        Arc::ptr_eq(&self.storage, &other.storage)
    }

    /// Whether the tensor is in page-locked host memory.
    pub fn is_pinned(&self) -> bool {
        self.storage.is_pinned()
    }

    /// Whether gradients would be tracked for this tensor (berth has no autograd; the flag
    /// exists for `detach()` semantics and for `nn` parameters).
    pub fn requires_grad(&self) -> bool {
        self.requires_grad
    }

    /// Set the `requires_grad` flag on this handle (PyTorch's `requires_grad_`). Only
    /// floating-point tensors can require gradients; clearing the flag always works.
    ///
    /// # Errors
    /// [`crate::Error::UnsupportedDType`] for `true` on an integer or bool tensor (PyTorch:
    /// "only Tensors of floating point dtype can require gradients").
    pub fn set_requires_grad(&mut self, requires_grad: bool) -> Result<&mut Self> {
        check_grad_dtype(self.dtype, requires_grad)?;
        self.requires_grad = requires_grad;
        Ok(self)
    }

    /// The same tensor with `requires_grad` set (builder style).
    ///
    /// # Errors
    /// As [`Tensor::set_requires_grad`].
    pub fn with_requires_grad(mut self, requires_grad: bool) -> Result<Tensor> {
        self.set_requires_grad(requires_grad)?;
        Ok(self)
    }

    /// A view sharing storage with `requires_grad == false` (PyTorch's `detach()`): writes
    /// through it reach the original (<https://github.com/pytorch/pytorch/issues/35990>).
    pub fn detach(&self) -> Tensor {
        Tensor {
            requires_grad: false,
            ..self.alias()
        }
    }

    /// `self` when already contiguous (same storage); otherwise a dense copy with row-major
    /// strides (<https://github.com/vllm-project/vllm/pull/14540>).
    ///
    /// # Errors
    /// A kernel or allocation error of the device.
    pub fn contiguous(&self) -> Result<Tensor> {
        if self.is_contiguous() {
            return Ok(self.alias());
        }
        self.clone()
    }

    /// A copy in new storage on the same device with dense row-major strides. Keeps
    /// `requires_grad`.
    ///
    /// PyTorch's `clone()` gives row-major strides for a view with gaps too (a `narrow` or a
    /// step: <https://github.com/huggingface/candle/issues/1930>), but keeps the strides of a
    /// dense tensor laid out in another order (`memory_format=torch.preserve_format`:
    /// `x.t().clone().stride()` is `(1, 3)` for a `[2, 3]` `x`). berth gives row-major strides
    /// there as well (`[2, 1]`); the values are the same.
    ///
    /// # Errors
    /// A kernel or allocation error of the device.
    #[allow(clippy::should_implement_trait)]
    pub fn clone(&self) -> Result<Tensor> {
        let mut t = crate::device_kernels::dispatch::contiguous_copy(self)?;
        t.requires_grad = self.requires_grad;
        Ok(t)
    }
}

/// PyTorch's rule for `requires_grad`: only floating-point tensors can require gradients.
///
/// # Errors
/// [`crate::Error::UnsupportedDType`] for `true` and a dtype that is not floating-point.
fn check_grad_dtype(dtype: DType, requires_grad: bool) -> Result<()> {
    if requires_grad && !dtype.is_float() {
        return Err(crate::Error::UnsupportedDType {
            op: "requires_grad_",
            dtype,
            expected:
                "a floating dtype: only Tensors of floating point dtype can require gradients",
        });
    }
    Ok(())
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("Tensor");
        d.field("shape", &self.shape())
            .field("dtype", &self.dtype)
            .field("device", &self.device());
        if self.device().is_cpu() && self.numel() <= 16 {
            if let Ok(v) = self.to_vec_f64() {
                d.field("data", &v);
            }
        }
        d.finish()
    }
}
