//! Views: new layouts over the same storage (`view`, `reshape`, `transpose`, `t`, `permute`,
//! `narrow`, `select`, `unsqueeze`, `squeeze`, `expand`, `flatten`), and `resize_`.

use super::Tensor;
use crate::layout::{checked_numel, wrap_dim};
use crate::{Error, Layout, Result};

impl Tensor {
    /// PyTorch's "`op`() cannot be applied to a 0-dim tensor." for ops that index a dimension.
    ///
    /// # Errors
    /// [`Error::Shape`] for a 0-d tensor.
    fn not_0d(&self, op: &'static str) -> Result<()> {
        if self.rank() == 0 {
            return Err(Error::Shape {
                op,
                what: format!("{op}() cannot be applied to a 0-dim tensor. (give it a dimension first: unsqueeze(0))"),
            });
        }
        Ok(())
    }
}

fn check_numel(op: &'static str, from: &[usize], to: &[usize]) -> Result<()> {
    let (a, b) = (from.iter().product::<usize>(), checked_numel(to, op)?);
    if a != b {
        return Err(Error::Shape {
            op,
            what: format!("shape {to:?} is invalid for input of size {a} (shape {from:?}); the number of elements must stay {a}, got {b}"),
        });
    }
    Ok(())
}

impl Tensor {
    /// The same storage seen with another shape (`Tensor.view`): needs compatible strides.
    ///
    /// # Errors
    /// [`Error::Shape`] when the element count differs or the strides do not allow a view
    /// (then use [`Tensor::reshape`], which copies); [`Error::NumelOverflow`] when `shape`'s
    /// element count overflows.
    pub fn view(&self, shape: &[usize]) -> Result<Tensor> {
        check_numel("view", self.shape(), shape)?;
        match self.layout().view_as(shape) {
            Some(l) => Ok(self.with_layout(l)),
            None => Err(Error::Shape {
                op: "view",
                what: format!(
                    "view size {shape:?} is not compatible with input tensor's size {:?} and stride {:?}; use .reshape(...) instead",
                    self.shape(),
                    self.strides()
                ),
            }),
        }
    }

    /// A view when the strides allow it, else a contiguous copy (`Tensor.reshape`).
    ///
    /// # Errors
    /// [`Error::Shape`] when the element count differs; [`Error::NumelOverflow`].
    pub fn reshape(&self, shape: &[usize]) -> Result<Tensor> {
        check_numel("reshape", self.shape(), shape)?;
        match self.layout().view_as(shape) {
            Some(l) => Ok(self.with_layout(l)),
            None => self.contiguous()?.view(shape),
        }
    }

    /// `reshape` with at most one `-1` size inferred from the others (`x.reshape(-1, 784)`).
    ///
    /// # Errors
    /// More than one `-1`, a negative size, or a count that does not divide.
    pub fn reshape_infer(&self, shape: &[isize]) -> Result<Tensor> {
        let holes = shape.iter().filter(|&&d| d == -1).count();
        if holes > 1 || shape.iter().any(|&d| d < -1) {
            return Err(Error::Shape {
                op: "reshape",
                what: format!(
                    "shape {shape:?}: only one dimension can be -1 and sizes must be non-negative"
                ),
            });
        }
        let sizes: Vec<usize> = shape
            .iter()
            .filter(|&&d| d >= 0)
            .map(|&d| d as usize)
            .collect();
        let known = checked_numel(&sizes, "reshape")?;
        let fill = if holes == 1 {
            if known == 0 || !self.numel().is_multiple_of(known) {
                return Err(Error::Shape {
                    op: "reshape",
                    what: format!(
                        "shape {shape:?} is invalid for input of size {}",
                        self.numel()
                    ),
                });
            }
            self.numel() / known
        } else {
            0
        };
        let s: Vec<usize> = shape
            .iter()
            .map(|&d| if d == -1 { fill } else { d as usize })
            .collect();
        self.reshape(&s)
    }

    /// Flatten dims `start..=end` into one (`torch.flatten`).
    ///
    /// # Errors
    /// Dims out of range or `start > end`.
    pub fn flatten(&self, start: isize, end: isize) -> Result<Tensor> {
        if self.rank() == 0 {
            return self.reshape(&[1]);
        }
        let (s, e) = (
            wrap_dim(start, self.rank(), "flatten")?,
            wrap_dim(end, self.rank(), "flatten")?,
        );
        if s > e {
            return Err(Error::InvalidArgument {
                op: "flatten",
                what: format!("start_dim {s} must not come after end_dim {e}"),
            });
        }
        let mut shape = self.shape()[..s].to_vec();
        shape.push(self.shape()[s..=e].iter().product());
        shape.extend_from_slice(&self.shape()[e + 1..]);
        self.reshape(&shape)
    }

    /// Swap dimensions `d0` and `d1` (negative counts from the end). A view.
    ///
    /// # Errors
    /// [`Error::DimOutOfRange`].
    pub fn transpose(&self, d0: isize, d1: isize) -> Result<Tensor> {
        let r = self.rank();
        let (a, b) = (wrap_dim(d0, r, "transpose")?, wrap_dim(d1, r, "transpose")?);
        if self.rank() == 0 {
            return Ok(self.alias());
        }
        Ok(self.with_layout(self.layout().transpose(a, b)))
    }

    /// Transpose of a ≤ 2-D tensor (`Tensor.t()`). A view.
    ///
    /// # Errors
    /// [`Error::Shape`] for rank > 2.
    pub fn t(&self) -> Result<Tensor> {
        match self.rank() {
            0 | 1 => Ok(self.alias()),
            2 => self.transpose(0, 1),
            r => Err(Error::Shape { op: "t", what: format!("t() expects a tensor with <= 2 dimensions, but self is {r}D; use transpose(d0, d1)") }),
        }
    }

    /// Reorder dimensions (`Tensor.permute`): output dim `i` is input dim `dims[i]`. A view.
    ///
    /// # Errors
    /// [`Error::Shape`] unless `dims` is a permutation of `0..rank`.
    pub fn permute(&self, dims: &[isize]) -> Result<Tensor> {
        let r = self.rank();
        let ds = dims
            .iter()
            .map(|&d| wrap_dim(d, r, "permute"))
            .collect::<Result<Vec<_>>>()?;
        let mut seen = vec![false; r];
        let ok = ds.len() == r && ds.iter().all(|&d| !std::mem::replace(&mut seen[d], true));
        if !ok {
            return Err(Error::Shape {
                op: "permute",
                what: format!("dims {dims:?} must be a permutation of 0..{r}"),
            });
        }
        Ok(self.with_layout(self.layout().permute(&ds)))
    }

    /// Elements `start..start + len` of dimension `dim` (`Tensor.narrow`). A view.
    ///
    /// # Errors
    /// [`Error::Shape`] for a 0-d tensor (PyTorch: "`narrow()` cannot be applied to a 0-dim
    /// tensor."); [`Error::DimOutOfRange`]; [`Error::Shape`] for `start + len` past the size,
    /// with PyTorch's message ("start (2) + length (2) exceeds dimension size (3).").
    pub fn narrow(&self, dim: isize, start: usize, len: usize) -> Result<Tensor> {
        self.not_0d("narrow")?;
        let d = wrap_dim(dim, self.rank(), "narrow")?;
        let size = self.shape()[d];
        if start.checked_add(len).is_none_or(|end| end > size) {
            return Err(Error::Shape {
                op: "narrow",
                what: format!(
                    "start ({start}) + length ({len}) exceeds dimension size ({size}) of dimension {d}."
                ),
            });
        }
        Ok(self.with_layout(self.layout().narrow(d, start, len)))
    }

    /// Index `index` of dimension `dim`, removing that dimension (`Tensor.select`). A view.
    ///
    /// # Errors
    /// [`Error::Shape`] for a 0-d tensor (PyTorch: "`select()` cannot be applied to a 0-dim
    /// tensor."); [`Error::DimOutOfRange`]; [`Error::IndexOutOfRange`].
    pub fn select(&self, dim: isize, index: usize) -> Result<Tensor> {
        self.not_0d("select")?;
        let d = wrap_dim(dim, self.rank(), "select")?;
        let size = self.shape()[d];
        if index >= size {
            return Err(Error::IndexOutOfRange {
                op: "select",
                dim: d,
                index,
                size,
            });
        }
        Ok(self.with_layout(self.layout().select(d, index)))
    }

    /// `select(0, index)`: row `index` (`x[i]`).
    ///
    /// # Errors
    /// As [`Tensor::select`].
    pub fn get(&self, index: usize) -> Result<Tensor> {
        self.select(0, index)
    }

    /// Insert a size-1 dimension at `dim` (in `[-rank-1, rank]`). A view.
    ///
    /// # Errors
    /// [`Error::DimOutOfRange`].
    pub fn unsqueeze(&self, dim: isize) -> Result<Tensor> {
        let d = wrap_dim(dim, self.rank() + 1, "unsqueeze")?;
        Ok(self.with_layout(self.layout().unsqueeze(d)))
    }

    /// Remove every size-1 dimension. A view.
    pub fn squeeze(&self) -> Tensor {
        self.with_layout(self.layout().squeeze(None))
    }

    /// Remove dimension `dim` if its size is 1 (else unchanged, as PyTorch). A view. A 0-d
    /// tensor takes `dim` 0 or -1 and stays as it is, as PyTorch's.
    ///
    /// # Errors
    /// [`Error::DimOutOfRange`] (for a 0-d tensor: outside `[-1, 0]`).
    pub fn squeeze_dim(&self, dim: isize) -> Result<Tensor> {
        let d = wrap_dim(dim, self.rank(), "squeeze")?;
        if self.rank() == 0 {
            return Ok(self.alias());
        }
        Ok(self.with_layout(self.layout().squeeze(Some(d))))
    }

    /// Broadcast to `shape` without copying (`Tensor.expand`; stride 0 on grown dims). The
    /// result cannot be written in place (its elements share memory; see
    /// [`Error::InternalOverlap`]); `clone()` it first.
    ///
    /// # Errors
    /// [`Error::ExpandMismatch`]; [`Error::NumelOverflow`] when `shape`'s element count
    /// overflows.
    pub fn expand(&self, shape: &[usize]) -> Result<Tensor> {
        let l = self.layout().broadcast_to(shape, "expand")?;
        checked_numel(shape, "expand")?;
        Ok(self.with_layout(l))
    }

    /// Alias of [`Tensor::expand`].
    ///
    /// # Errors
    /// As [`Tensor::expand`].
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<Tensor> {
        self.expand(shape)
    }

    /// Change this handle's shape (`Tensor.resize_`): keeps the storage when it is large
    /// enough (contiguous layout from the current offset), else moves *this handle only* to
    /// new storage holding the old elements first. Other aliases are never changed
    /// (`x.detach().resize_(5)` leaves `x` as it was;
    /// <https://github.com/pytorch/pytorch/pull/13645>).
    ///
    /// # Errors
    /// [`Error::NumelOverflow`] / [`Error::StorageSizeOverflow`]; device errors (out of
    /// memory) when new storage is needed.
    pub fn resize_(&mut self, shape: &[usize]) -> Result<&mut Self> {
        let nbytes = crate::layout::checked_nbytes(shape, self.dtype(), "resize_")?;
        let need = (self.storage_offset() * self.element_size()).saturating_add(nbytes);
        if need <= self.storage().nbytes() {
            let l = Layout::from_parts(
                shape.to_vec(),
                crate::layout::contiguous_strides(shape),
                self.storage_offset(),
            );
            self.layout = l;
            return Ok(self);
        }
        let mut grown = Tensor::zeros(shape, self.dtype(), self.device())?;
        let keep = self.numel().min(grown.numel());
        if keep > 0 {
            let src = self.reshape(&[self.numel()])?.narrow(0, 0, keep)?;
            grown
                .reshape(&[grown.numel()])?
                .narrow(0, 0, keep)?
                .copy_(&src)?;
        }
        grown.requires_grad = self.requires_grad;
        *self = grown;
        Ok(self)
    }
}
