//! Fashion-MNIST (Zalando): 60,000 training and 10,000 test images of 28×28 u8 pixels in 10
//! classes, read from the IDX files of Debian's `dataset-fashion-mnist` (gzip or raw). Never
//! downloads anything.

use std::path::{Path, PathBuf};

use berth::{DType, Device, Tensor};

use crate::collatable::{Collatable, CollateContext};
use crate::dataset::{check_index, Dataset};
use crate::error::{DataError, Result};
use crate::idx::{read_images_labels, IdxError};
use crate::pinning::collate_output;

/// The class names, by label.
pub const CLASSES: [&str; 10] = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
];

/// Pixels per image (28 × 28).
pub const PIXELS: usize = 28 * 28;

/// Where Debian's `dataset-fashion-mnist` installs the files.
pub const DEBIAN_DIR: &str = "/usr/share/datasets/fashion-mnist";

/// The training (60,000) or test (10,000) set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Split {
    /// `train-*-ubyte`.
    Train,
    /// `t10k-*-ubyte`.
    Test,
}

impl Split {
    fn prefix(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Test => "t10k",
        }
    }
}

/// The Fashion-MNIST images and labels of one split, in memory.
///
/// Item `i` is `(image, label)`: the image a `[784]` f32 tensor of pixels scaled to `[0, 1]`
/// (PyTorch's `ToTensor`, flattened), the label an `i64` in `0..10`. Batches through
/// [`DefaultCollate`](crate::DefaultCollate) are built in one pass, converting the gathered u8
/// pixels straight into the (possibly pinned) `[B, 784]` f32 output: `([B, 784] f32, [B] i64)`.
#[derive(Debug, Clone)]
pub struct FashionMnist {
    pixels: Vec<u8>,
    labels: Vec<u8>,
    split: Split,
}

/// The file `dir/name.gz` if it exists, else `dir/name` if that exists, else `dir/name.gz`
/// (whose absence the reader then reports).
fn idx_path(dir: &Path, name: &str) -> PathBuf {
    let gz = dir.join(format!("{name}.gz"));
    let raw = dir.join(name);
    if !gz.exists() && raw.exists() {
        raw
    } else {
        gz
    }
}

impl FashionMnist {
    /// Reads `split` from `dir` (files `{train,t10k}-{images-idx3,labels-idx1}-ubyte`, each
    /// `.gz` or raw).
    ///
    /// # Errors
    /// [`DataError::Idx`] naming the file and the reason (missing, corrupt gzip, truncated, wrong
    /// magic, images/labels count mismatch, a label ≥ 10, or images not 28×28).
    pub fn load(dir: impl AsRef<Path>, split: Split) -> Result<Self> {
        let dir = dir.as_ref();
        let p = split.prefix();
        let images = idx_path(dir, &format!("{p}-images-idx3-ubyte"));
        let labels = idx_path(dir, &format!("{p}-labels-idx1-ubyte"));
        let data = read_images_labels(&images, &labels, CLASSES.len())?;
        if (data.rows, data.cols) != (28, 28) {
            return Err(DataError::Idx(IdxError::ImageSize {
                path: images,
                rows: data.rows,
                cols: data.cols,
                expected_rows: 28,
                expected_cols: 28,
            }));
        }
        Ok(FashionMnist {
            pixels: data.pixels,
            labels: data.labels,
            split,
        })
    }

    /// The first directory holding the files: `$BERTH_FASHION_MNIST`, then `data/fashion-mnist`
    /// in the current directory or one of its ancestors, then [`DEBIAN_DIR`].
    pub fn find_dir() -> Option<PathBuf> {
        let has = |d: &Path| {
            d.join("train-labels-idx1-ubyte.gz").exists()
                || d.join("train-labels-idx1-ubyte").exists()
        };
        if let Some(d) = std::env::var_os("BERTH_FASHION_MNIST").map(PathBuf::from) {
            if has(&d) {
                return Some(d);
            }
        }
        if let Ok(cwd) = std::env::current_dir() {
            for a in cwd.ancestors() {
                let d = a.join("data/fashion-mnist");
                if has(&d) {
                    return Some(d);
                }
            }
        }
        Some(PathBuf::from(DEBIAN_DIR)).filter(|d| has(d))
    }

    /// Number of images.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there is no image.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Which split this is.
    pub fn split(&self) -> Split {
        self.split
    }

    /// All pixels, `len() × 784` u8, row-major.
    pub fn pixels(&self) -> &[u8] {
        &self.pixels
    }

    /// All labels, u8 in `0..10`.
    pub fn labels(&self) -> &[u8] {
        &self.labels
    }

    /// All images as one `[N, 784]` f32 tensor in `[0, 1]` and all labels as `[N]` i64 (for a
    /// [`TensorDataset`](crate::TensorDataset) or whole-set evaluation).
    ///
    /// # Errors
    /// A tensor constructor's error.
    pub fn to_tensors(&self) -> Result<(Tensor, Tensor)> {
        let x: Vec<f32> = self.pixels.iter().map(|&p| f32::from(p) / 255.0).collect();
        let y: Vec<i64> = self.labels.iter().map(|&l| i64::from(l)).collect();
        Ok((
            Tensor::from_vec(x, &[self.len(), PIXELS], Device::Cpu)?,
            Tensor::from_vec(y, &[self.len()], Device::Cpu)?,
        ))
    }
}

impl Dataset for FashionMnist {
    type Item = (Tensor, i64);

    fn len(&self) -> usize {
        self.labels.len()
    }

    fn get(&self, index: usize) -> Result<(Tensor, i64)> {
        check_index(index, self.len())?;
        let px = &self.pixels[index * PIXELS..(index + 1) * PIXELS];
        let x: Vec<f32> = px.iter().map(|&p| f32::from(p) / 255.0).collect();
        Ok((
            Tensor::from_vec(x, &[PIXELS], Device::Cpu)?,
            i64::from(self.labels[index]),
        ))
    }

    fn collate_batch(
        &self,
        indices: &[usize],
        ctx: &CollateContext,
    ) -> Option<Result<(Tensor, Tensor)>>
    where
        Self::Item: Collatable,
    {
        Some((|| {
            if let Some(&bad) = indices.iter().find(|&&i| i >= self.len()) {
                return Err(DataError::IndexOutOfRange {
                    index: bad,
                    len: self.len(),
                });
            }
            let b = indices.len();
            let x = collate_output(&[b, PIXELS], DType::F32, ctx)?;
            let y = collate_output(&[b], DType::I64, ctx)?;
            {
                let mut w = x.storage().write_host("FashionMnist collate")?;
                let dst = w.typed_mut::<f32>();
                for (row, &i) in dst.chunks_exact_mut(PIXELS).zip(indices) {
                    for (o, &p) in row
                        .iter_mut()
                        .zip(&self.pixels[i * PIXELS..(i + 1) * PIXELS])
                    {
                        *o = f32::from(p) / 255.0;
                    }
                }
            }
            {
                let mut w = y.storage().write_host("FashionMnist collate")?;
                for (o, &i) in w.typed_mut::<i64>().iter_mut().zip(indices) {
                    *o = i64::from(self.labels[i]);
                }
            }
            Ok((x, y))
        })())
    }
}
