//! `Layout`: how a tensor's elements sit in its storage — shape, strides and offset, all in
//! elements (never bytes). Every view op (`reshape`, `transpose`, `narrow` ...) only computes a
//! new `Layout` over the same storage (candle's `Layout`, PyTorch's `TensorImpl` sizes/strides).

use crate::{DType, Error, Result};

/// Shape, strides (elements) and storage offset (elements) of a tensor view.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Layout {
    shape: Vec<usize>,
    strides: Vec<usize>,
    offset: usize,
}

/// The dense row-major strides of `shape` (last dimension stride 1), in elements.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; shape.len()];
    let mut acc = 1usize;
    for (s, &d) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc = acc.saturating_mul(d.max(1));
    }
    strides
}

/// The number of elements of `shape`, checked: PyTorch's `safe_compute_numel` ("numel: integer
/// multiplication overflow") together with the stride check of `empty_tensor_restride`
/// ("Stride calculation overflowed"). The product of the sizes, with a size 0 counted as 1 (as
/// the contiguous strides count it), must be at most `isize::MAX`, PyTorch's `int64_t` limit;
/// so every contiguous stride and offset of a shape that passes fits as well.
///
/// # Errors
/// [`Error::NumelOverflow`] naming `op` and `shape`.
pub fn checked_numel(shape: &[usize], op: &'static str) -> Result<usize> {
    let mut strided = 1usize;
    for &d in shape {
        strided = strided
            .checked_mul(d.max(1))
            .filter(|&p| p <= isize::MAX as usize)
            .ok_or_else(|| Error::NumelOverflow {
                op,
                shape: shape.to_vec(),
            })?;
    }
    Ok(if shape.contains(&0) { 0 } else { strided })
}

/// The size in bytes of a dense tensor of `shape` and `dtype`, checked: [`checked_numel`],
/// then `numel × element size` at most `isize::MAX` (PyTorch's `computeStorageNbytes`:
/// "Storage size calculation overflowed"; no Rust allocation can be larger).
///
/// # Errors
/// [`Error::NumelOverflow`] or [`Error::StorageSizeOverflow`], naming `op` and `shape`.
pub fn checked_nbytes(shape: &[usize], dtype: DType, op: &'static str) -> Result<usize> {
    let numel = checked_numel(shape, op)?;
    numel
        .checked_mul(dtype.size_in_bytes())
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| Error::StorageSizeOverflow {
            op,
            shape: shape.to_vec(),
            dtype,
            numel,
        })
}

/// Normalise a possibly negative dimension index against `rank` (PyTorch's `maybe_wrap_dim`).
/// A 0-d tensor (`rank == 0`) takes `0` and `-1` as a 1-D one does (both give 0), as
/// PyTorch's; callers for which a 0-d tensor has no dimension to index check that first.
///
/// # Errors
/// [`Error::DimOutOfRange`] when `dim` is outside `[-rank, rank - 1]` (`[-1, 0]` for rank 0).
pub fn wrap_dim(dim: isize, rank: usize, op: &'static str) -> Result<usize> {
    let r = rank.max(1) as isize;
    let d = if dim < 0 { dim + r } else { dim };
    if d < 0 || d >= r {
        return Err(Error::DimOutOfRange { op, dim, rank });
    }
    Ok(d as usize)
}

/// The broadcast shape of `a` and `b` (NumPy/PyTorch rules: align from the right; sizes must
/// be equal or one of them 1).
///
/// # Errors
/// [`Error::BroadcastMismatch`] naming both shapes.
pub fn broadcast_shapes(a: &[usize], b: &[usize], op: &'static str) -> Result<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(Error::BroadcastMismatch {
                op,
                lhs: a.to_vec(),
                rhs: b.to_vec(),
            });
        };
    }
    Ok(out)
}

impl Layout {
    /// A dense row-major layout of `shape` at offset 0.
    pub fn contiguous(shape: &[usize]) -> Layout {
        Layout {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
        }
    }

    /// A layout from its parts (strides and offset in elements). Not checked here:
    /// [`crate::Tensor::from_parts`] refuses one whose `strides` do not have one entry per
    /// dimension of `shape`, or that reaches past its storage.
    pub fn from_parts(shape: Vec<usize>, strides: Vec<usize>, offset: usize) -> Layout {
        Layout {
            shape,
            strides,
            offset,
        }
    }

    /// The sizes of each dimension.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The stride of each dimension, in elements.
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }

    /// The offset of the first element in the storage, in elements.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The number of elements (1 for a 0-dim tensor). Every tensor's shape passed
    /// [`checked_numel`]; for a layout built from an unchecked shape an overflowing product
    /// saturates at `usize::MAX` rather than wrapping (to 0, which would read as empty); a size 0
    /// anywhere still gives 0 (`usize::MAX.saturating_mul(0) == 0`).
    pub fn numel(&self) -> usize {
        self.shape
            .iter()
            .fold(1usize, |acc, &d| acc.saturating_mul(d))
    }

    /// Whether the elements are dense and row-major (PyTorch's `is_contiguous()`: dimensions of
    /// size 1 may have any stride, and a tensor without elements is always contiguous, as in
    /// `_compute_contiguous`).
    pub fn is_contiguous(&self) -> bool {
        if self.numel() == 0 {
            return true;
        }
        let mut expected = 1usize;
        for (&d, &s) in self.shape.iter().zip(&self.strides).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected *= d;
        }
        true
    }

    /// One past the largest storage element index this layout touches (0 if empty), in
    /// elements: the storage must hold at least this many.
    pub fn required_elements(&self) -> usize {
        if self.numel() == 0 {
            return 0;
        }
        self.offset
            + self
                .shape
                .iter()
                .zip(&self.strides)
                .map(|(&d, &s)| (d - 1) * s)
                .sum::<usize>()
            + 1
    }

    /// Whether two elements of this layout share one storage location because a dimension of
    /// size > 1 has stride 0 (PyTorch's `has_internal_overlap` returning `MemOverlap::Yes`,
    /// e.g. after `expand`). Writing in place through such a layout is refused.
    pub fn has_internal_overlap(&self) -> bool {
        self.shape
            .iter()
            .zip(&self.strides)
            .any(|(&d, &s)| d > 1 && s == 0)
    }

    /// [`Layout::required_elements`], or `None` when it does not fit in `usize` (strides or
    /// an offset from outside, as in [`crate::Tensor::from_parts`]).
    pub fn checked_required_elements(&self) -> Option<usize> {
        if self.numel() == 0 {
            return Some(0);
        }
        self.shape
            .iter()
            .zip(&self.strides)
            .try_fold(self.offset, |acc, (&d, &s)| {
                (d - 1).checked_mul(s).and_then(|x| acc.checked_add(x))
            })?
            .checked_add(1)
    }

    /// A layout of the same storage with another shape, without copying
    /// (PyTorch's `view`). Only possible when the strides allow it; `None` otherwise (then
    /// `reshape` copies). `new_shape` must have the same numel.
    pub fn view_as(&self, new_shape: &[usize]) -> Option<Layout> {
        // PyTorch's `computeStride` (aten/src/ATen/TensorUtils.cpp): with no elements the
        // strides are arbitrary; the same shape keeps its strides, any other gets the strides
        // "as if computed via resize" (contiguous, a size 0 counted as 1).
        if self.numel() == 0 {
            let strides = if new_shape == self.shape.as_slice() {
                self.strides.clone()
            } else {
                contiguous_strides(new_shape)
            };
            return Some(Layout {
                shape: new_shape.to_vec(),
                strides,
                offset: self.offset,
            });
        }
        if self.is_contiguous() {
            return Some(Layout {
                shape: new_shape.to_vec(),
                strides: contiguous_strides(new_shape),
                offset: self.offset,
            });
        }
        // PyTorch's `computeStride` (aten/src/ATen/TensorUtils.cpp): walk the old dimensions
        // from the right in chunks that are contiguous among themselves, and split each chunk
        // across new dimensions.
        let (os, ost) = (&self.shape, &self.strides);
        let mut new_strides = vec![0usize; new_shape.len()];
        let mut view_d = new_shape.len() as isize - 1;
        let mut chunk_base_stride = *ost.last()?;
        let mut tensor_numel = 1usize;
        let mut view_numel = 1usize;
        for tensor_d in (0..os.len()).rev() {
            tensor_numel *= os[tensor_d];
            if tensor_d == 0
                || (os[tensor_d - 1] != 1 && ost[tensor_d - 1] != tensor_numel * chunk_base_stride)
            {
                while view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d as usize] == 1)
                {
                    new_strides[view_d as usize] = view_numel * chunk_base_stride;
                    view_numel *= new_shape[view_d as usize];
                    view_d -= 1;
                }
                if view_numel != tensor_numel {
                    return None;
                }
                if tensor_d > 0 {
                    chunk_base_stride = ost[tensor_d - 1];
                    tensor_numel = 1;
                    view_numel = 1;
                }
            }
        }
        if view_d != -1 {
            return None;
        }
        Some(Layout {
            shape: new_shape.to_vec(),
            strides: new_strides,
            offset: self.offset,
        })
    }

    /// Swap two dimensions (already wrapped).
    pub fn transpose(&self, d0: usize, d1: usize) -> Layout {
        let mut l = self.clone();
        l.shape.swap(d0, d1);
        l.strides.swap(d0, d1);
        l
    }

    /// Reorder dimensions: output dim `i` is input dim `perm[i]` (already validated).
    pub fn permute(&self, perm: &[usize]) -> Layout {
        Layout {
            shape: perm.iter().map(|&p| self.shape[p]).collect(),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
        }
    }

    /// Restrict dimension `dim` to `[start, start + len)` (already validated).
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Layout {
        let mut l = self.clone();
        l.offset += start * l.strides[dim];
        l.shape[dim] = len;
        l
    }

    /// Pick index `index` of dimension `dim`, removing it (already validated).
    pub fn select(&self, dim: usize, index: usize) -> Layout {
        let mut l = self.clone();
        l.offset += index * l.strides[dim];
        l.shape.remove(dim);
        l.strides.remove(dim);
        l
    }

    /// Insert a dimension of size 1 at `dim` (already wrapped against rank + 1).
    pub fn unsqueeze(&self, dim: usize) -> Layout {
        let mut l = self.clone();
        let stride = if dim < l.rank() {
            l.strides[dim] * l.shape[dim]
        } else {
            1
        };
        l.shape.insert(dim, 1);
        l.strides.insert(dim, stride);
        l
    }

    /// Remove dimension `dim` (must have size 1) or, with `None`, every size-1 dimension.
    pub fn squeeze(&self, dim: Option<usize>) -> Layout {
        let keep = |i: usize, d: usize| d != 1 || dim.is_some_and(|x| x != i);
        let mut shape = Vec::new();
        let mut strides = Vec::new();
        for (i, (&d, &s)) in self.shape.iter().zip(&self.strides).enumerate() {
            if keep(i, d) {
                shape.push(d);
                strides.push(s);
            }
        }
        Layout {
            shape,
            strides,
            offset: self.offset,
        }
    }

    /// Broadcast to `shape` (PyTorch's `expand`): size-1 (or missing leading) dimensions get
    /// stride 0.
    ///
    /// # Errors
    /// [`Error::ExpandMismatch`] when a non-1 size differs from the target.
    pub fn broadcast_to(&self, shape: &[usize], op: &'static str) -> Result<Layout> {
        if shape.len() < self.rank() {
            return Err(Error::ExpandMismatch {
                op,
                from: self.shape.clone(),
                to: shape.to_vec(),
            });
        }
        let lead = shape.len() - self.rank();
        let mut strides = vec![0usize; shape.len()];
        for (i, &target) in shape.iter().enumerate() {
            if i < lead {
                continue;
            }
            let (d, s) = (self.shape[i - lead], self.strides[i - lead]);
            strides[i] = if d == target {
                s
            } else if d == 1 {
                0
            } else {
                return Err(Error::ExpandMismatch {
                    op,
                    from: self.shape.clone(),
                    to: shape.to_vec(),
                });
            };
        }
        Ok(Layout {
            shape: shape.to_vec(),
            strides,
            offset: self.offset,
        })
    }

    /// The storage element index of every element in row-major order.
    pub fn indices(&self) -> StridedIndex<'_> {
        StridedIndex::new(self)
    }

    /// When the elements form one dense run (contiguous), the `[start, end)` storage range.
    pub fn contiguous_range(&self) -> Option<(usize, usize)> {
        self.is_contiguous()
            .then(|| (self.offset, self.offset + self.numel()))
    }
}

/// Iterator over the storage indices of a layout in row-major order.
#[derive(Debug)]
pub struct StridedIndex<'a> {
    layout: &'a Layout,
    counter: Vec<usize>,
    next: Option<usize>,
    remaining: usize,
}

impl<'a> StridedIndex<'a> {
    fn new(layout: &'a Layout) -> Self {
        let n = layout.numel();
        StridedIndex {
            layout,
            counter: vec![0; layout.rank()],
            next: (n > 0).then_some(layout.offset),
            remaining: n,
        }
    }
}

impl Iterator for StridedIndex<'_> {
    type Item = usize;

    #[inline]
    fn next(&mut self) -> Option<usize> {
        let cur = self.next?;
        self.remaining -= 1;
        if self.remaining == 0 {
            self.next = None;
            return Some(cur);
        }
        let mut idx = cur;
        for d in (0..self.counter.len()).rev() {
            self.counter[d] += 1;
            idx += self.layout.strides[d];
            if self.counter[d] < self.layout.shape[d] {
                break;
            }
            idx -= self.layout.strides[d] * self.counter[d];
            self.counter[d] = 0;
        }
        self.next = Some(idx);
        Some(cur)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.remaining, Some(self.remaining))
    }
}

impl ExactSizeIterator for StridedIndex<'_> {}
