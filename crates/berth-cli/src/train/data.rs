//! Fashion-MNIST for `berth train`: where the files are, the loaders, and moving a batch to the
//! device (pinned host batches, `non_blocking` copies, a device prefetcher on CUDA).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use berth::{Device, Tensor};
use berth_data::fashion_mnist::{FashionMnist, Split as FmSplit};
use berth_data::prefetch::DevicePrefetcher;
use berth_data::{DataLoader, Generator};

use crate::UsageError;

/// Images per evaluation batch.
pub const EVAL_BATCH: usize = 1000;
/// Mean of Fashion-MNIST's training pixels scaled to [0, 1].
pub const PIXEL_MEAN: f64 = 0.2860;
/// Standard deviation of Fashion-MNIST's training pixels scaled to [0, 1].
pub const PIXEL_STD: f64 = 0.3530;

/// Which half of the dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// 60,000 training images.
    Train,
    /// 10,000 test images.
    Test,
}

/// One split in memory, shared by the loader's workers.
pub type FashionSplit = Arc<FashionMnist>;

/// A loader over one split: batches `([B, 784] f32 in [0, 1], [B] i64)`.
pub type FashionLoader = DataLoader<FashionMnist>;

/// Batches `(pixels, labels)` of a loader, already on their device.
pub type DeviceBatches<'a> = Box<dyn Iterator<Item = berth_data::Result<(Tensor, Tensor)>> + 'a>;

/// Loads a split.
///
/// # Errors
/// A [`UsageError`] naming the file and the reason (missing, truncated, corrupt).
pub fn load(dir: &Path, split: Split) -> anyhow::Result<FashionSplit> {
    let s = match split {
        Split::Train => FmSplit::Train,
        Split::Test => FmSplit::Test,
    };
    let data = FashionMnist::load(dir, s).map_err(|e| {
        UsageError(format!(
            "{e}; pass --data-dir DIR with the four Fashion-MNIST IDX files"
        ))
    })?;
    if berth_data::Dataset::len(&data) == 0 {
        let (file, name, verb) = match split {
            Split::Train => ("train-images-idx3-ubyte", "training", "train on"),
            Split::Test => ("t10k-images-idx3-ubyte", "test", "evaluate on"),
        };
        return Err(UsageError(format!(
            "{}: the {name} split holds 0 images ({file} declares none); nothing to {verb}. Use \
             the full Fashion-MNIST files (60,000 training and 10,000 test images)",
            dir.display()
        ))
        .into());
    }
    Ok(Arc::new(data))
}

/// The data folder holding the files of `splits`: `--data-dir`, else `$BERTH_DATA_DIR`, else
/// `data/fashion-mnist` in the working directory or an ancestor, else the copy in this source
/// tree, else Debian's `/usr/share/datasets/fashion-mnist`. A folder given explicitly needs only
/// the files of `splits` (`berth eval` needs the two `t10k` files alone).
///
/// # Errors
/// A [`UsageError`] when none of them holds the files, naming the ones needed.
pub fn resolve_dir(explicit: Option<&Path>, splits: &[Split]) -> anyhow::Result<PathBuf> {
    let stem = |s: &Split| match s {
        Split::Train => "train",
        Split::Test => "t10k",
    };
    let has = |d: &Path| {
        splits.iter().all(|s| {
            let labels = format!("{}-labels-idx1-ubyte", stem(s));
            d.join(format!("{labels}.gz")).exists() || d.join(labels).exists()
        })
    };
    if let Some(d) = explicit {
        if has(d) {
            return Ok(d.to_path_buf());
        }
        let needed: Vec<String> = splits
            .iter()
            .flat_map(|s| {
                [
                    format!("{}-images-idx3-ubyte.gz", stem(s)),
                    format!("{}-labels-idx1-ubyte.gz", stem(s)),
                ]
            })
            .collect();
        return Err(UsageError(format!(
            "--data-dir {}: no Fashion-MNIST files there (expected {}, gzipped or not); point \
             it at the repository's data/fashion-mnist",
            d.display(),
            needed.join(", ")
        ))
        .into());
    }
    if let Some(d) = std::env::var_os("BERTH_DATA_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
    {
        if has(&d) {
            return Ok(d);
        }
        return Err(UsageError(format!(
            "BERTH_DATA_DIR={}: no Fashion-MNIST files there; unset it or point it at the \
             repository's data/fashion-mnist",
            d.display()
        ))
        .into());
    }
    let source_tree = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/fashion-mnist");
    FashionMnist::find_dir()
        .or_else(|| has(&source_tree).then_some(source_tree))
        .ok_or_else(|| {
            UsageError(
                "Fashion-MNIST not found: run from the berth repository (it ships data/fashion-mnist), \
                 pass --data-dir DIR, or install Debian's dataset-fashion-mnist"
                    .into(),
            )
            .into()
        })
}

/// The training loader: shuffled with its own generator seeded by `seed`, `workers` threads,
/// pinned batches when training on CUDA.
///
/// # Errors
/// DataLoader option errors.
pub fn train_loader(
    ds: &FashionSplit,
    batch_size: usize,
    workers: usize,
    seed: u64,
    device: Device,
) -> anyhow::Result<FashionLoader> {
    let mut b = DataLoader::builder(Arc::clone(ds))
        .batch_size(batch_size)
        .shuffle(true)
        .num_workers(workers as isize)
        .generator(Generator::new(seed))
        .pin_memory(device.is_cuda());
    if workers > 0 {
        b = b.persistent_workers(true);
    }
    Ok(b.build()?)
}

/// The evaluation loader: in order, `batch_size` images per batch.
///
/// # Errors
/// DataLoader option errors.
pub fn eval_loader(
    ds: &FashionSplit,
    batch_size: usize,
    device: Device,
) -> anyhow::Result<FashionLoader> {
    Ok(DataLoader::builder(Arc::clone(ds))
        .batch_size(batch_size)
        .pin_memory(device.is_cuda())
        .build()?)
}

/// Batches of `loader` on `device`: through a [`DevicePrefetcher`] (batch n+1 copied on a side
/// stream while batch n computes) on CUDA, as they come elsewhere.
///
/// # Errors
/// Stream creation errors.
pub fn device_batches<'a>(
    loader: &'a FashionLoader,
    device: Device,
) -> anyhow::Result<DeviceBatches<'a>> {
    if device.is_cuda() {
        Ok(Box::new(DevicePrefetcher::new(loader.iter(), device)?))
    } else {
        Ok(Box::new(loader.iter()))
    }
}

/// Normalises pixels in [0, 1] with Fashion-MNIST's mean and standard deviation, on whatever
/// device they are (`[B, 784]` f32 → `[B, 784]` f32).
///
/// # Errors
/// Allocation errors.
pub fn prepare(pixels: &Tensor) -> berth::Result<Tensor> {
    pixels.sub_scalar(PIXEL_MEAN)?.div_scalar(PIXEL_STD)
}

/// A loader batch on `device` (a no-op move when it is already there: the prefetcher did the
/// copy) and normalised.
///
/// # Errors
/// Transfer or allocation errors.
pub fn to_device(batch: (Tensor, Tensor), device: Device) -> berth::Result<(Tensor, Tensor)> {
    let (x, y) = batch;
    let x = x.to(device, x.dtype(), true, false)?;
    let y = y.to(device, y.dtype(), true, false)?;
    Ok((prepare(&x)?, y))
}

/// A data-parallel rank's training loader: this rank's shard from `sampler` (a
/// [`berth_data::DistributedSampler`]; keep a clone to call `set_epoch` on), `batch_size`
/// images per local batch, `workers` threads, pinned batches on CUDA.
///
/// # Errors
/// DataLoader option errors.
pub fn sharded_loader(
    ds: &FashionSplit,
    batch_size: usize,
    workers: usize,
    sampler: berth_data::DistributedSampler,
    device: Device,
) -> anyhow::Result<FashionLoader> {
    let mut b = DataLoader::builder(Arc::clone(ds))
        .batch_size(batch_size)
        .sampler(sampler)
        .num_workers(workers as isize)
        .pin_memory(device.is_cuda());
    if workers > 0 {
        b = b.persistent_workers(true);
    }
    Ok(b.build()?)
}
