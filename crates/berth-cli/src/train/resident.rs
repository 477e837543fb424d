//! `berth train --resident`: the whole training split in memory once, normalised, and batches
//! gathered by shuffled index: what an expert's PyTorch loop does when the data fits
//! (`torch_train.py`'s `resident` mode), beside the DataLoader path of PyTorch's guide.
//!
//! Note [Resident batches]: the shuffle draws exactly what the default loader draws (one
//! `base_seed` for its persistent workers, then one `randperm` per epoch from the loader's
//! generator seeded with `--seed`), and the pixels are normalised with the same f32 operations
//! as [`super::data::prepare`], so a resident run sees the same batches in the same order as
//! `--workers 1` or more and ends with the same figures. Each batch is gathered into one buffer
//! reused for every step (a step on the CPU is synchronous, so the previous batch is no longer
//! read). CPU only for now: a gather on the GPU needs a device index kernel berth lacks.

use berth::{DType, Device, Tensor};
use berth_data::Generator;

use super::data::{self, FashionSplit};
use super::mlp::INPUTS;

/// The training split as two host tensors and the shuffle's generator.
#[derive(Debug)]
pub struct Resident {
    /// `[N, 784]` f32, normalised.
    x: Tensor,
    /// `[N]` i64 class indices.
    y: Tensor,
    generator: Generator,
    batch_size: usize,
    /// The batch buffers, `[batch_size, 784]` f32 and `[batch_size]` i64.
    xb: Tensor,
    yb: Tensor,
}

impl Resident {
    /// The split `ds` normalised in memory, batches of `batch_size` (≥ 1) shuffled with a
    /// generator seeded by `seed`, for training on `device` (the CPU).
    ///
    /// # Errors
    /// A [`crate::UsageError`] for a device other than the CPU; allocation errors.
    pub fn new(
        ds: &FashionSplit,
        batch_size: usize,
        seed: u64,
        device: Device,
    ) -> anyhow::Result<Resident> {
        if !device.is_cpu() {
            return Err(crate::UsageError(format!(
                "--resident with --device {device}: resident batches are gathered on the CPU only \
                 for now (berth has no device gather kernel); drop --resident or use --device cpu"
            ))
            .into());
        }
        let (x, y) = ds.to_tensors()?;
        let x = data::prepare(&x)?;
        let generator = Generator::new(seed);
        // The loader's persistent workers draw their base seed first (Note [Resident batches]).
        let _base_seed = generator.next_u64();
        Ok(Resident {
            xb: Tensor::empty(&[batch_size, INPUTS], DType::F32, Device::Cpu)?,
            yb: Tensor::empty(&[batch_size], DType::I64, Device::Cpu)?,
            x,
            y,
            generator,
            batch_size,
        })
    }

    /// Batches per epoch (the last one partial).
    pub fn len(&self) -> usize {
        self.y.numel().div_ceil(self.batch_size)
    }

    /// Draws the epoch's order.
    pub fn epoch_order(&self) -> Vec<usize> {
        self.generator.randperm(self.y.numel())
    }

    /// Batch `i` of `order`: rows gathered into the reused buffers, returned as views of them
    /// (`[b, 784]` and `[b]`, `b = batch_size` but for the last batch). The views must be
    /// dropped before the next call (they are overwritten).
    ///
    /// # Errors
    /// Storage access errors (none for host tensors); `i` out of range is a caller bug and
    /// panics.
    pub fn batch(&self, order: &[usize], i: usize) -> berth::Result<(Tensor, Tensor)> {
        let idx = &order[i * self.batch_size..((i + 1) * self.batch_size).min(order.len())];
        {
            let src = self.x.storage().read_host("resident gather")?;
            let src = &src.typed::<f32>()[self.x.storage_offset()..];
            let mut w = self.xb.storage().write_host("resident gather")?;
            for (row, &j) in w.typed_mut::<f32>().chunks_exact_mut(INPUTS).zip(idx) {
                row.copy_from_slice(&src[j * INPUTS..(j + 1) * INPUTS]);
            }
        }
        {
            let src = self.y.storage().read_host("resident gather")?;
            let src = &src.typed::<i64>()[self.y.storage_offset()..];
            let mut w = self.yb.storage().write_host("resident gather")?;
            for (o, &j) in w.typed_mut::<i64>().iter_mut().zip(idx) {
                *o = src[j];
            }
        }
        let b = idx.len();
        Ok((self.xb.narrow(0, 0, b)?, self.yb.narrow(0, 0, b)?))
    }
}
