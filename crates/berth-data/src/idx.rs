//! The IDX file format of (Fashion-)MNIST, read raw or gzip-compressed.
//!
//! Layout (big-endian): two zero bytes, a type code (`0x08` = u8), the number of dimensions `d`,
//! then `d` u32 sizes, then the data. Images are magic 2051 (`0x00000803`, 3 dims: count, rows,
//! cols), labels 2049 (`0x00000801`, 1 dim). A file starting with the gzip magic `1f 8b` is
//! decompressed first, so the `.gz` files Debian's `dataset-fashion-mnist` ships load as is.

use std::io::Read;
use std::path::{Path, PathBuf};

/// Magic number of an IDX image file (u8 data, 3 dimensions).
pub const IMAGES_MAGIC: u32 = 2051;
/// Magic number of an IDX label file (u8 data, 1 dimension).
pub const LABELS_MAGIC: u32 = 2049;

/// Why an IDX file could not be read. Every variant names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IdxError {
    /// The file could not be opened or read.
    #[error("cannot read IDX file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The file starts with the gzip magic but does not decompress (damaged or cut short).
    #[error(
        "IDX file {path} is not a valid gzip stream ({source}); re-download or reinstall the file"
    )]
    CorruptGzip {
        /// The file.
        path: PathBuf,
        /// The decompressor's error.
        source: std::io::Error,
    },
    /// The (decompressed) file ends before its header or data does.
    #[error("IDX file {path} is truncated: {what} needs {expected_bytes} bytes, the file has {actual_bytes}")]
    Truncated {
        /// The file.
        path: PathBuf,
        /// `"header"` or `"data"`.
        what: &'static str,
        /// Bytes the header says the file needs.
        expected_bytes: usize,
        /// Bytes the file has.
        actual_bytes: usize,
    },
    /// The magic number is not the expected one.
    #[error("IDX file {path} has magic number {found} (0x{found:08x}); expected {expected} (0x{expected:08x}, {kind})")]
    WrongMagic {
        /// The file.
        path: PathBuf,
        /// The magic found.
        found: u32,
        /// The magic expected.
        expected: u32,
        /// `"images"` or `"labels"`.
        kind: &'static str,
    },
    /// The file holds more bytes than its header declares.
    #[error("IDX file {path} has {extra_bytes} bytes after the data its header declares; the file is corrupt")]
    TrailingBytes {
        /// The file.
        path: PathBuf,
        /// Bytes past the end of the data.
        extra_bytes: usize,
    },
    /// The image and label files disagree on the number of items.
    #[error("{images_path} holds {images} images but {labels_path} holds {labels} labels; they must be equal")]
    CountMismatch {
        /// The image file.
        images_path: PathBuf,
        /// The label file.
        labels_path: PathBuf,
        /// Images in the image file.
        images: usize,
        /// Labels in the label file.
        labels: usize,
    },
    /// A label is not a valid class index.
    #[error("IDX file {path}: label {label} at item {index} is not a class in 0..{classes}")]
    BadLabel {
        /// The file.
        path: PathBuf,
        /// The item.
        index: usize,
        /// The label found.
        label: u8,
        /// Number of classes.
        classes: usize,
    },
}

/// An IDX array of u8: its dimensions and its data, row-major.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdxArray {
    /// The magic number read.
    pub magic: u32,
    /// Dimension sizes, in elements.
    pub dims: Vec<usize>,
    /// The data (`dims.iter().product()` bytes).
    pub data: Vec<u8>,
}

/// Reads the file whole, gunzipping it when it starts with the gzip magic.
fn read_bytes(path: &Path) -> Result<Vec<u8>, IdxError> {
    let raw = std::fs::read(path).map_err(|source| IdxError::Io {
        path: path.into(),
        source,
    })?;
    if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::with_capacity(raw.len() * 4);
        flate2::read::GzDecoder::new(&raw[..])
            .read_to_end(&mut out)
            .map_err(|source| IdxError::CorruptGzip {
                path: path.into(),
                source,
            })?;
        Ok(out)
    } else {
        Ok(raw)
    }
}

/// Reads an IDX file of u8 data whose magic must be `expected_magic`.
///
/// # Errors
/// [`IdxError::Io`], [`IdxError::CorruptGzip`], [`IdxError::Truncated`],
/// [`IdxError::WrongMagic`] or [`IdxError::TrailingBytes`], each naming the file.
pub fn read_idx(path: impl AsRef<Path>, expected_magic: u32) -> Result<IdxArray, IdxError> {
    let path = path.as_ref();
    let bytes = read_bytes(path)?;
    parse_idx(path, &bytes, expected_magic)
}

fn kind_of(magic: u32) -> &'static str {
    match magic {
        IMAGES_MAGIC => "images: u8, 3 dimensions",
        LABELS_MAGIC => "labels: u8, 1 dimension",
        _ => "u8 data",
    }
}

fn parse_idx(path: &Path, bytes: &[u8], expected_magic: u32) -> Result<IdxArray, IdxError> {
    let truncated = |what, expected_bytes| IdxError::Truncated {
        path: path.into(),
        what,
        expected_bytes,
        actual_bytes: bytes.len(),
    };
    if bytes.len() < 4 {
        return Err(truncated("header", 4));
    }
    let magic = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    if magic != expected_magic {
        return Err(IdxError::WrongMagic {
            path: path.into(),
            found: magic,
            expected: expected_magic,
            kind: kind_of(expected_magic),
        });
    }
    let ndims = (magic & 0xff) as usize;
    let header = 4 + 4 * ndims;
    if bytes.len() < header {
        return Err(truncated("header", header));
    }
    let dims: Vec<usize> = bytes[4..header]
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize)
        .collect();
    let len = dims.iter().product::<usize>();
    let end = header + len;
    if bytes.len() < end {
        return Err(truncated("data", end));
    }
    if bytes.len() > end {
        return Err(IdxError::TrailingBytes {
            path: path.into(),
            extra_bytes: bytes.len() - end,
        });
    }
    Ok(IdxArray {
        magic,
        dims,
        data: bytes[header..].to_vec(),
    })
}

/// Images and labels read from a pair of IDX files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdxImagesLabels {
    /// Rows per image.
    pub rows: usize,
    /// Columns per image.
    pub cols: usize,
    /// `count × rows × cols` pixels, row-major.
    pub pixels: Vec<u8>,
    /// `count` labels.
    pub labels: Vec<u8>,
}

impl IdxImagesLabels {
    /// Number of items.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there is no item.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }
}

/// Reads an image file and a label file and checks they agree, and that every label is below
/// `classes`.
///
/// # Errors
/// Any error of [`read_idx`] for either file, [`IdxError::CountMismatch`] and
/// [`IdxError::BadLabel`].
pub fn read_images_labels(
    images_path: impl AsRef<Path>,
    labels_path: impl AsRef<Path>,
    classes: usize,
) -> Result<IdxImagesLabels, IdxError> {
    let (ip, lp) = (images_path.as_ref(), labels_path.as_ref());
    let images = read_idx(ip, IMAGES_MAGIC)?;
    let labels = read_idx(lp, LABELS_MAGIC)?;
    if images.dims[0] != labels.dims[0] {
        return Err(IdxError::CountMismatch {
            images_path: ip.into(),
            labels_path: lp.into(),
            images: images.dims[0],
            labels: labels.dims[0],
        });
    }
    if let Some((index, &label)) = labels
        .data
        .iter()
        .enumerate()
        .find(|(_, l)| usize::from(**l) >= classes)
    {
        return Err(IdxError::BadLabel {
            path: lp.into(),
            index,
            label,
            classes,
        });
    }
    Ok(IdxImagesLabels {
        rows: images.dims[1],
        cols: images.dims[2],
        pixels: images.data,
        labels: labels.data,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(magic: u32, dims: &[u32]) -> Vec<u8> {
        let mut v = magic.to_be_bytes().to_vec();
        for d in dims {
            v.extend(d.to_be_bytes());
        }
        v
    }

    #[test]
    fn parses_a_small_label_array() {
        let mut b = header(LABELS_MAGIC, &[3]);
        b.extend([1, 2, 3]);
        let a = parse_idx(Path::new("x"), &b, LABELS_MAGIC).unwrap();
        assert_eq!(a.dims, vec![3]);
        assert_eq!(a.data, vec![1, 2, 3]);
    }

    #[test]
    fn short_data_is_truncated_with_sizes() {
        let mut b = header(IMAGES_MAGIC, &[2, 2, 2]);
        b.extend([0; 7]);
        match parse_idx(Path::new("x"), &b, IMAGES_MAGIC) {
            Err(IdxError::Truncated {
                what: "data",
                expected_bytes: 24,
                actual_bytes: 23,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
    }
}
