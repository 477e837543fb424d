//! `berth train --resident`: the whole training split in memory once, normalised, and batches
//! gathered by shuffled index: what an expert's PyTorch loop does when the data fits
//! (`torch_train.py`'s `resident` mode), beside the DataLoader path of PyTorch's guide.
//!
//! Note [Resident batches]: the shuffle draws exactly what the default loader draws (one
//! `base_seed` for its persistent workers, then one `randperm` per epoch from the loader's
//! generator seeded with `--seed`), and the pixels are normalised with the same f32 operations
//! as [`super::data::prepare`], so a resident run sees the same batches in the same order as
//! `--workers 1` or more and ends with the same figures. On the CPU each batch is gathered into
//! one buffer reused for every step (a step on the CPU is synchronous, so the previous batch is
//! no longer read). On CUDA the normalised split is copied to the device once, each epoch's
//! order once per epoch (an i64 tensor), and each batch is two `index_select` kernels on the
//! device from a view of that order: no host copy, no pinned staging and no normalisation
//! kernels per step. The pixels are normalised on the host with the same f32 `sub` and `div`
//! as the loader path's device kernels (both correctly rounded), so the figures stay the same.

use berth::{DType, Device, Tensor};
use berth_data::Generator;

use super::data::{self, FashionSplit};
use super::mlp::INPUTS;

/// The training split as two tensors on the training device and the shuffle's generator.
#[derive(Debug)]
pub struct Resident {
    /// `[N, 784]` f32, normalised.
    x: Tensor,
    /// `[N]` i64 class indices.
    y: Tensor,
    generator: Generator,
    batch_size: usize,
    /// The CPU's batch buffers, `[batch_size, 784]` f32 and `[batch_size]` i64 (`None` on
    /// CUDA, where each batch is a fresh `index_select` output).
    buffers: Option<(Tensor, Tensor)>,
}

/// One epoch's order: the shuffled sample indices, and on CUDA the same as an i64 tensor on
/// the device.
#[derive(Debug)]
pub struct EpochOrder {
    indices: Vec<usize>,
    on_device: Option<Tensor>,
}

impl Resident {
    /// The split `ds` normalised in memory (on the host, then copied once to `device`),
    /// batches of `batch_size` (≥ 1) shuffled with a generator seeded by `seed`, for training
    /// on `device` (the CPU or a CUDA device).
    ///
    /// # Errors
    /// A [`crate::UsageError`] for a device other than the CPU or CUDA; allocation and
    /// transfer errors.
    pub fn new(
        ds: &FashionSplit,
        batch_size: usize,
        seed: u64,
        device: Device,
    ) -> anyhow::Result<Resident> {
        if !(device.is_cpu() || device.is_cuda()) {
            return Err(crate::UsageError(format!(
                "--resident with --device {device}: resident batches are gathered on the CPU or a \
                 CUDA device; drop --resident or use --device cpu"
            ))
            .into());
        }
        let (x, y) = ds.to_tensors()?;
        let x = data::prepare(&x)?;
        let generator = Generator::new(seed);
        // The loader's persistent workers draw their base seed first (Note [Resident batches]).
        let _base_seed = generator.next_u64();
        let buffers = if device.is_cpu() {
            Some((
                Tensor::empty(&[batch_size, INPUTS], DType::F32, Device::Cpu)?,
                Tensor::empty(&[batch_size], DType::I64, Device::Cpu)?,
            ))
        } else {
            None
        };
        Ok(Resident {
            x: x.to_device(device)?,
            y: y.to_device(device)?,
            generator,
            batch_size,
            buffers,
        })
    }

    /// Batches per epoch (the last one partial).
    pub fn len(&self) -> usize {
        self.y.numel().div_ceil(self.batch_size)
    }

    /// Draws the epoch's order (and on CUDA copies it to the device).
    ///
    /// # Errors
    /// Allocation and transfer errors.
    pub fn epoch_order(&self) -> berth::Result<EpochOrder> {
        let indices = self.generator.randperm(self.y.numel());
        let on_device = if self.buffers.is_none() {
            let as_i64: Vec<i64> = indices.iter().map(|&i| i as i64).collect();
            let n = as_i64.len();
            Some(Tensor::from_vec(as_i64, &[n], Device::Cpu)?.to_device(self.x.device())?)
        } else {
            None
        };
        Ok(EpochOrder { indices, on_device })
    }

    /// Batch `i` of `order` (`[b, 784]` and `[b]`, `b = batch_size` but for the last batch).
    /// On the CPU the rows are gathered into the reused buffers and the results are views of
    /// them, which must be dropped before the next call (they are overwritten); on CUDA they
    /// are new tensors gathered on the device.
    ///
    /// # Errors
    /// Storage access errors (none for host tensors), device errors; `i` out of range is a
    /// caller bug and panics.
    pub fn batch(&self, order: &EpochOrder, i: usize) -> berth::Result<(Tensor, Tensor)> {
        let start = i * self.batch_size;
        let idx = &order.indices[start..(start + self.batch_size).min(order.indices.len())];
        let b = idx.len();
        let Some((xb, yb)) = &self.buffers else {
            let on_device = order
                .on_device
                .as_ref()
                .expect("epoch_order makes a device order when there are no host buffers");
            let rows = on_device.narrow(0, start, b)?;
            return Ok((
                self.x.index_select(0, &rows)?,
                self.y.index_select(0, &rows)?,
            ));
        };
        {
            let src = self.x.storage().read_host("resident gather")?;
            let src = &src.typed::<f32>()[self.x.storage_offset()..];
            let mut w = xb.storage().write_host("resident gather")?;
            for (row, &j) in w.typed_mut::<f32>().chunks_exact_mut(INPUTS).zip(idx) {
                row.copy_from_slice(&src[j * INPUTS..(j + 1) * INPUTS]);
            }
        }
        {
            let src = self.y.storage().read_host("resident gather")?;
            let src = &src.typed::<i64>()[self.y.storage_offset()..];
            let mut w = yb.storage().write_host("resident gather")?;
            for (o, &j) in w.typed_mut::<i64>().iter_mut().zip(idx) {
                *o = src[j];
            }
        }
        Ok((xb.narrow(0, 0, b)?, yb.narrow(0, 0, b)?))
    }
}
