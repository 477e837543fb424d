//! `TensorDataset`: rows of tensors that share their first dimension.

use berth::Tensor;

use crate::collatable::{Collatable, CollateContext};
use crate::dataset::{check_index, Dataset};
use crate::error::{DataError, Result};
use crate::pinning::collate_output;

/// Item `i` is row `i` of each tensor (`torch.utils.data.TensorDataset`). Items are *views*:
/// they share storage with the dataset's tensors, nothing is copied per item.
///
/// Batches through [`DefaultCollate`](crate::DefaultCollate) skip the per-item views: for host
/// tensors the rows of a batch are gathered straight into one output buffer per tensor (pinned
/// when the loader pins), one `memcpy` per row and no allocation per sample.
#[derive(Debug)]
pub struct TensorDataset {
    tensors: Vec<Tensor>,
    len: usize,
}

impl TensorDataset {
    /// A dataset over `tensors`, which must all have the same size in dimension 0.
    ///
    /// # Errors
    /// [`DataError::InvalidOption`] for no tensors, a 0-dim tensor, or differing first
    /// dimensions (PyTorch: "Size mismatch between tensors").
    pub fn new(tensors: Vec<Tensor>) -> Result<Self> {
        let Some(first) = tensors.first() else {
            return Err(DataError::option(
                "tensors",
                "TensorDataset needs at least one tensor",
            ));
        };
        if let Some(t) = tensors.iter().find(|t| t.rank() == 0) {
            return Err(DataError::option(
                "tensors",
                format!(
                    "TensorDataset needs tensors of at least one dimension, got shape {:?}",
                    t.shape()
                ),
            ));
        }
        let len = first.shape()[0];
        if let Some(t) = tensors.iter().find(|t| t.shape()[0] != len) {
            return Err(DataError::option(
                "tensors",
                format!(
                    "Size mismatch between tensors: first dimensions {} and {}",
                    len,
                    t.shape()[0]
                ),
            ));
        }
        Ok(TensorDataset { tensors, len })
    }

    /// The tensors.
    pub fn tensors(&self) -> &[Tensor] {
        &self.tensors
    }

    /// Gathers rows `indices` of `t` into a new `[indices.len(), ...]` tensor; `None` when `t`
    /// is not a contiguous host tensor.
    fn gather(t: &Tensor, indices: &[usize], ctx: &CollateContext) -> Option<Result<Tensor>> {
        if !t.device().is_cpu() || !t.is_contiguous() {
            return None;
        }
        Some((|| {
            let mut shape = t.shape().to_vec();
            shape[0] = indices.len();
            let out = collate_output(&shape, t.dtype(), ctx)?;
            let row = t.shape()[1..].iter().product::<usize>() * t.element_size();
            let base = t.storage_offset() * t.element_size();
            let src = t.storage().read_host("TensorDataset gather")?;
            let src = &src.bytes()[base..base + row * t.shape()[0]];
            let mut w = out.storage().write_host("TensorDataset gather")?;
            let dst = &mut w.bytes_mut()[..row * indices.len()];
            // Ordinary stores: streaming ones (`movntdq`, no read of the output lines) made
            // every loader figure 16-37% slower on the H200 host, whose 300 MiB L3 keeps the
            // recycled batch buffers for the next gather and for the copy engine
            // (docs/benchmarks/history.md, seventh session).
            for (d, &i) in dst.chunks_exact_mut(row.max(1)).zip(indices) {
                d.copy_from_slice(&src[i * row..(i + 1) * row]);
            }
            drop(w);
            Ok(out)
        })())
    }
}

impl Dataset for TensorDataset {
    type Item = Vec<Tensor>;

    fn len(&self) -> usize {
        self.len
    }

    /// Row `index` of every tensor, as views sharing their storage.
    fn get(&self, index: usize) -> Result<Vec<Tensor>> {
        check_index(index, self.len)?;
        self.tensors
            .iter()
            .map(|t| Ok(t.select(0, index)?))
            .collect()
    }

    fn collate_batch(&self, indices: &[usize], ctx: &CollateContext) -> Option<Result<Vec<Tensor>>>
    where
        Self::Item: Collatable,
    {
        if let Some(&bad) = indices.iter().find(|&&i| i >= self.len) {
            return Some(Err(DataError::IndexOutOfRange {
                index: bad,
                len: self.len,
            }));
        }
        if indices.is_empty() {
            return None;
        }
        let mut out = Vec::with_capacity(self.tensors.len());
        for t in &self.tensors {
            match Self::gather(t, indices, ctx)? {
                Ok(b) => out.push(b),
                Err(e) => return Some(Err(e)),
            }
        }
        Some(Ok(out))
    }
}
