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
    #[error("IDX file {path} has {}{extra_bytes} bytes after the data its header declares; the file is corrupt", if *.at_least { "at least " } else { "" })]
    TrailingBytes {
        /// The file.
        path: PathBuf,
        /// Bytes past the end of the data (counted up to [`MAX_TRAILING_COUNT`]).
        extra_bytes: usize,
        /// Whether counting stopped at [`MAX_TRAILING_COUNT`] (a gzip stream is not inflated
        /// further than that past its declared size).
        at_least: bool,
    },
    /// A gzip file's header declares more data than the compressed stream can hold: deflate
    /// expands at most [`GZIP_MAX_RATIO`] times, so the header is corrupt (checked before
    /// anything past the header is inflated).
    #[error("IDX file {path} declares {declared_bytes} bytes (dimensions {dims:?}), but a gzip file of {compressed_bytes} bytes inflates to at most {max_bytes} ({GZIP_MAX_RATIO}× its size); the header is corrupt")]
    DeclaredTooLarge {
        /// The file.
        path: PathBuf,
        /// The dimensions read from the header.
        dims: Vec<usize>,
        /// Header plus data, in bytes, as the header declares.
        declared_bytes: usize,
        /// The compressed file's size, in bytes.
        compressed_bytes: usize,
        /// The most bytes it can inflate to.
        max_bytes: usize,
    },
    /// The header declares more data than this machine can address.
    #[error("IDX file {path} declares dimensions {dims:?}, whose product overflows a {}-bit size; the header is corrupt", usize::BITS)]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// The dimensions read from the header.
        dims: Vec<usize>,
    },
    /// The images are not the size the dataset has.
    #[error("IDX file {path} holds {rows}×{cols} images; this dataset's are {expected_rows}×{expected_cols} (the Fashion-MNIST files)")]
    ImageSize {
        /// The image file.
        path: PathBuf,
        /// Rows per image in the header.
        rows: usize,
        /// Columns per image in the header.
        cols: usize,
        /// Rows the dataset needs.
        expected_rows: usize,
        /// Columns the dataset needs.
        expected_cols: usize,
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

/// How many bytes past the declared data are counted before a [`IdxError::TrailingBytes`] is
/// reported (1 MiB): a gzip stream is never inflated further than that.
pub const MAX_TRAILING_COUNT: usize = 1 << 20;

/// The most a deflate stream expands: 1032 output bytes per input byte (a 258-byte match in
/// about two bits; zlib's technical details, <https://www.zlib.net/zlib_tech.html>). A gzip file
/// of `n` bytes, one member or several, inflates to at most `1032 × n` bytes.
pub const GZIP_MAX_RATIO: usize = 1032;

/// Reads an IDX file of u8 data whose magic must be `expected_magic`, gunzipping it when it
/// starts with the gzip magic (every member of a multi-member gzip file, as `gzip -d` and
/// Python's `gzip` module read them). The file is parsed as a stream: no more than the header
/// declares is ever held in memory, a gzip file's header may not declare more than the file
/// can inflate to ([`GZIP_MAX_RATIO`] times its size: checked before the data is inflated),
/// and a gzip bomb (a small file that inflates to gigabytes) fails after inflating at most
/// [`MAX_TRAILING_COUNT`] bytes past its declared size.
///
/// # Errors
/// [`IdxError::Io`], [`IdxError::CorruptGzip`], [`IdxError::Truncated`],
/// [`IdxError::WrongMagic`], [`IdxError::TooLarge`], [`IdxError::DeclaredTooLarge`] or
/// [`IdxError::TrailingBytes`], each naming the file.
pub fn read_idx(path: impl AsRef<Path>, expected_magic: u32) -> Result<IdxArray, IdxError> {
    let path = path.as_ref();
    let raw = std::fs::read(path).map_err(|source| IdxError::Io {
        path: path.into(),
        source,
    })?;
    read_idx_bytes(path, &raw, expected_magic)
}

/// [`read_idx`] for the bytes of a file already in memory (gzip or raw IDX); `path` only names
/// the file in errors.
///
/// # Errors
/// As [`read_idx`], except that nothing is read from `path`.
pub fn read_idx_bytes(
    path: impl AsRef<Path>,
    bytes: &[u8],
    expected_magic: u32,
) -> Result<IdxArray, IdxError> {
    let path = path.as_ref();
    if bytes.starts_with(&[0x1f, 0x8b]) {
        let source = Source::Gzip {
            compressed_bytes: bytes.len(),
        };
        parse_stream(
            path,
            flate2::read::MultiGzDecoder::new(bytes),
            expected_magic,
            source,
        )
    } else {
        parse_idx(path, bytes, expected_magic)
    }
}

fn kind_of(magic: u32) -> &'static str {
    match magic {
        IMAGES_MAGIC => "images: u8, 3 dimensions",
        LABELS_MAGIC => "labels: u8, 1 dimension",
        _ => "u8 data",
    }
}

fn parse_idx(path: &Path, bytes: &[u8], expected_magic: u32) -> Result<IdxArray, IdxError> {
    parse_stream(path, bytes, expected_magic, Source::Raw)
}

/// What [`parse_stream`] reads.
#[derive(Clone, Copy)]
enum Source {
    /// IDX bytes as they are.
    Raw,
    /// A gzip file of `compressed_bytes` bytes (read errors are a damaged gzip stream).
    Gzip { compressed_bytes: usize },
}

/// Appends up to `n` more bytes of `r` to `buf` (fewer at the end of the stream).
fn read_up_to(r: &mut impl Read, n: usize, buf: &mut Vec<u8>) -> std::io::Result<()> {
    r.take(n as u64).read_to_end(buf).map(|_| ())
}

/// Parses an IDX stream read from `source`.
fn parse_stream(
    path: &Path,
    mut r: impl Read,
    expected_magic: u32,
    source: Source,
) -> Result<IdxArray, IdxError> {
    let gzip = matches!(source, Source::Gzip { .. });
    let io_err = |source| {
        if gzip {
            IdxError::CorruptGzip {
                path: path.into(),
                source,
            }
        } else {
            IdxError::Io {
                path: path.into(),
                source,
            }
        }
    };
    let truncated = |what, expected_bytes, actual_bytes| IdxError::Truncated {
        path: path.into(),
        what,
        expected_bytes,
        actual_bytes,
    };
    let mut head = Vec::with_capacity(4);
    read_up_to(&mut r, 4, &mut head).map_err(io_err)?;
    if head.len() < 4 {
        return Err(truncated("header", 4, head.len()));
    }
    let magic = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
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
    read_up_to(&mut r, header - 4, &mut head).map_err(io_err)?;
    if head.len() < header {
        return Err(truncated("header", header, head.len()));
    }
    let dims: Vec<usize> = head[4..header]
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize)
        .collect();
    let Some((len, end)) = dims
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .and_then(|len| Some((len, header.checked_add(len)?)))
    else {
        return Err(IdxError::TooLarge {
            path: path.into(),
            dims,
        });
    };
    if let Source::Gzip { compressed_bytes } = source {
        let max_bytes = compressed_bytes.saturating_mul(GZIP_MAX_RATIO);
        if end > max_bytes {
            return Err(IdxError::DeclaredTooLarge {
                path: path.into(),
                dims,
                declared_bytes: end,
                compressed_bytes,
                max_bytes,
            });
        }
    }
    // Grown as bytes arrive, never reserved from the header: a short file declaring terabytes
    // fails as truncated without allocating them.
    let mut data = Vec::new();
    read_up_to(&mut r, len, &mut data).map_err(io_err)?;
    if data.len() < len {
        return Err(truncated("data", end, header + data.len()));
    }
    let extra = std::io::copy(
        &mut r.by_ref().take(MAX_TRAILING_COUNT as u64),
        &mut std::io::sink(),
    )
    .map_err(io_err)? as usize;
    if extra > 0 {
        let more = {
            let mut one = [0u8; 1];
            extra == MAX_TRAILING_COUNT && r.read(&mut one).map_err(io_err)? > 0
        };
        return Err(IdxError::TrailingBytes {
            path: path.into(),
            extra_bytes: extra,
            at_least: more,
        });
    }
    Ok(IdxArray { magic, dims, data })
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

    /// Found by fuzzing: the element count overflowed `usize` (in release a 16-byte file with
    /// huge dims parsed `Ok` with no data).
    #[test]
    fn overflowing_dims_are_refused() {
        let b = header(IMAGES_MAGIC, &[u32::MAX, u32::MAX, u32::MAX]);
        match parse_idx(Path::new("x"), &b, IMAGES_MAGIC) {
            Err(IdxError::TooLarge { dims, .. }) => assert_eq!(dims.len(), 3),
            other => panic!("{other:?}"),
        }
        // Large but representable: truncated, without allocating what the header declares.
        let b = header(IMAGES_MAGIC, &[60_000, 100_000, 100_000]);
        assert!(matches!(
            parse_idx(Path::new("x"), &b, IMAGES_MAGIC),
            Err(IdxError::Truncated { what: "data", .. })
        ));
    }

    /// Found by fuzzing: a gzip bomb was inflated whole before the size check. Now inflation
    /// stops at the declared size plus [`MAX_TRAILING_COUNT`].
    #[test]
    fn a_gzip_bomb_is_not_inflated_past_its_declared_size() {
        use flate2::write::GzEncoder;
        use std::io::Write;
        let mut raw = header(LABELS_MAGIC, &[4]);
        raw.extend([1, 2, 3, 4]);
        let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&raw).unwrap();
        let zeros = vec![0u8; 1 << 20];
        for _ in 0..64 {
            gz.write_all(&zeros).unwrap(); // 64 MiB of zeros after the declared data
        }
        let file = std::env::temp_dir().join(format!("berth-idx-bomb-{}.gz", std::process::id()));
        std::fs::write(&file, gz.finish().unwrap()).unwrap();
        let r = read_idx(&file, LABELS_MAGIC);
        std::fs::remove_file(&file).ok();
        match r {
            Err(e @ IdxError::TrailingBytes { at_least: true, .. }) => {
                assert!(e.to_string().contains("at least 1048576 bytes"), "{e}")
            }
            other => panic!("{other:?}"),
        }
        // The same data without the bomb reads fine through gzip.
        let mut gz = GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&raw).unwrap();
        let file = std::env::temp_dir().join(format!("berth-idx-ok-{}.gz", std::process::id()));
        std::fs::write(&file, gz.finish().unwrap()).unwrap();
        let a = read_idx(&file, LABELS_MAGIC);
        std::fs::remove_file(&file).ok();
        assert_eq!(a.unwrap().data, vec![1, 2, 3, 4]);
    }

    #[test]
    fn trailing_bytes_are_counted_exactly_when_few() {
        let mut b = header(LABELS_MAGIC, &[2]);
        b.extend([1, 2, 9, 9, 9]);
        match parse_idx(Path::new("x"), &b, LABELS_MAGIC) {
            Err(IdxError::TrailingBytes {
                extra_bytes: 3,
                at_least: false,
                ..
            }) => {}
            other => panic!("{other:?}"),
        }
    }
}
