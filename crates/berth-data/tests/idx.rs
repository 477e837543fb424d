//! IDX reader and Fashion-MNIST: counts, checksums, file hashes, bad inputs.

use std::io::Write;
use std::path::{Path, PathBuf};

use berth_data::idx::{read_idx, read_images_labels, IdxError, IMAGES_MAGIC, LABELS_MAGIC};
use berth_data::{DataError, DataLoader, Dataset, FashionMnist, Split};
use sha2::{Digest, Sha256};

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../data/fashion-mnist")
}

/// A fresh scratch directory for one test, removed when dropped (also when the test fails).
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.0).ok();
    }
}

fn scratch(name: &str) -> Scratch {
    let d = std::env::temp_dir().join(format!("berth-data-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    Scratch(d)
}

fn idx_bytes(magic: u32, dims: &[u32], data: &[u8]) -> Vec<u8> {
    let mut v = magic.to_be_bytes().to_vec();
    for d in dims {
        v.extend(d.to_be_bytes());
    }
    v.extend_from_slice(data);
    v
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

#[test]
fn fashion_mnist_files_match_sha256sums() {
    let dir = data_dir();
    let sums = std::fs::read_to_string(dir.join("SHA256SUMS")).unwrap();
    let mut checked = 0;
    for line in sums.lines().filter(|l| !l.trim().is_empty()) {
        let (want, name) = line.split_once("  ").expect("`<hex>  <name>` lines");
        let got = Sha256::digest(std::fs::read(dir.join(name)).unwrap());
        let got: String = got.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(got, want, "{name}");
        checked += 1;
    }
    assert_eq!(checked, 4);
}

// Expected values computed once from the files with python3's gzip + struct, independently of
// this crate: total pixel sum; Σ_i sum(image_i) × (i mod 251 + 1) mod 2^64; first image's sum.
struct Expect {
    n: usize,
    per_class: usize,
    pixel_sum: u64,
    weighted: u64,
    first_sum: u64,
    first_labels: [u8; 10],
}

fn check_split(split: Split, e: Expect) {
    let ds = FashionMnist::load(data_dir(), split).unwrap();
    assert_eq!(ds.len(), e.n);
    let mut counts = [0usize; 10];
    for &l in ds.labels() {
        counts[usize::from(l)] += 1;
    }
    assert_eq!(counts, [e.per_class; 10]);
    let px = ds.pixels();
    assert_eq!(px.len(), e.n * 784);
    assert_eq!(px.iter().map(|&p| u64::from(p)).sum::<u64>(), e.pixel_sum);
    let weighted = px
        .chunks_exact(784)
        .enumerate()
        .map(|(i, img)| img.iter().map(|&p| u64::from(p)).sum::<u64>() * (i as u64 % 251 + 1))
        .fold(0u64, u64::wrapping_add);
    assert_eq!(weighted, e.weighted);
    assert_eq!(&ds.labels()[..10], &e.first_labels);
    let (x, y) = ds.get(0).unwrap();
    assert_eq!(x.shape(), &[784]);
    let s: f64 = x
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|&v| f64::from(v) * 255.0)
        .sum();
    assert!((s - e.first_sum as f64).abs() < 0.5, "{s}");
    assert_eq!(y, i64::from(e.first_labels[0]));
}

#[test]
fn fashion_mnist_train_counts_and_checksums() {
    check_split(
        Split::Train,
        Expect {
            n: 60_000,
            per_class: 6_000,
            pixel_sum: 3_431_114_169,
            weighted: 432_827_220_285,
            first_sum: 76_247,
            first_labels: [9, 0, 0, 3, 0, 2, 7, 2, 5, 5],
        },
    );
}

#[test]
fn fashion_mnist_test_counts_and_checksums() {
    check_split(
        Split::Test,
        Expect {
            n: 10_000,
            per_class: 1_000,
            pixel_sum: 573_469_082,
            weighted: 71_994_267_953,
            first_sum: 33_456,
            first_labels: [9, 2, 1, 1, 6, 1, 4, 6, 5, 7],
        },
    );
}

#[test]
fn fashion_mnist_batches_through_the_loader_match_items() {
    let ds = FashionMnist::load(data_dir(), Split::Test).unwrap();
    let dl = DataLoader::builder(ds.clone())
        .batch_size(64)
        .num_workers(2)
        .build()
        .unwrap();
    assert_eq!(dl.len(), 157);
    let (x, y) = dl.iter().next().unwrap().unwrap();
    assert_eq!(x.shape(), &[64, 784]);
    assert_eq!(y.shape(), &[64]);
    let xs = x.to_vec::<f32>().unwrap();
    let (x3, y3) = ds.get(3).unwrap();
    assert_eq!(&xs[3 * 784..4 * 784], &x3.to_vec::<f32>().unwrap()[..]);
    assert_eq!(y.to_vec::<i64>().unwrap()[3], y3);
}

#[test]
fn raw_and_gzip_files_read_the_same() {
    let d = scratch("raw");
    let img = idx_bytes(
        IMAGES_MAGIC,
        &[2, 2, 3],
        &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
    );
    let lab = idx_bytes(LABELS_MAGIC, &[2], &[3, 1]);
    std::fs::write(d.join("i.raw"), &img).unwrap();
    std::fs::write(d.join("i.gz"), gzip(&img)).unwrap();
    std::fs::write(d.join("l"), &lab).unwrap();
    let a = read_images_labels(d.join("i.raw"), d.join("l"), 10).unwrap();
    let b = read_images_labels(d.join("i.gz"), d.join("l"), 10).unwrap();
    assert_eq!(a, b);
    assert_eq!((a.rows, a.cols, a.len()), (2, 3, 2));
    assert_eq!(a.labels, vec![3, 1]);
}

#[test]
fn truncated_file_is_a_typed_error_naming_the_file() {
    let d = scratch("trunc");
    let mut img = idx_bytes(IMAGES_MAGIC, &[2, 28, 28], &[7; 2 * 784]);
    img.truncate(16 + 784 + 100);
    let p = d.join("train-images-idx3-ubyte");
    std::fs::write(&p, &img).unwrap();
    let err = read_idx(&p, IMAGES_MAGIC).unwrap_err();
    assert!(
        matches!(&err, IdxError::Truncated { what: "data", expected_bytes: 1584, actual_bytes: 900, path } if path == &p),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("train-images-idx3-ubyte") && msg.contains("truncated"),
        "{msg}"
    );
    // Cut inside the header.
    std::fs::write(&p, &img[..6]).unwrap();
    assert!(matches!(
        read_idx(&p, IMAGES_MAGIC),
        Err(IdxError::Truncated { what: "header", .. })
    ));
}

#[test]
fn corrupt_gzip_is_a_typed_error_naming_the_file() {
    let d = scratch("gz");
    let mut gz = gzip(&idx_bytes(LABELS_MAGIC, &[100], &[1; 100]));
    let n = gz.len();
    gz.truncate(n - 10); // cut the stream and its trailer
    let p = d.join("labels.gz");
    std::fs::write(&p, &gz).unwrap();
    let err = read_idx(&p, LABELS_MAGIC).unwrap_err();
    assert!(
        matches!(&err, IdxError::CorruptGzip { path, .. } if path == &p),
        "{err:?}"
    );
    // Garbage after a gzip magic.
    std::fs::write(&p, [0x1f, 0x8b, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]).unwrap();
    let err = read_idx(&p, LABELS_MAGIC).unwrap_err();
    assert!(
        err.to_string().contains("labels.gz") && err.to_string().contains("gzip"),
        "{err}"
    );
}

#[test]
fn wrong_magic_says_which_was_expected() {
    let d = scratch("magic");
    let p = d.join("swapped");
    std::fs::write(&p, idx_bytes(LABELS_MAGIC, &[1], &[0])).unwrap();
    let err = read_idx(&p, IMAGES_MAGIC).unwrap_err();
    assert!(
        matches!(
            err,
            IdxError::WrongMagic {
                found: 2049,
                expected: 2051,
                ..
            }
        ),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains("swapped") && msg.contains("2049") && msg.contains("2051"),
        "{msg}"
    );
}

#[test]
fn images_and_labels_of_different_counts() {
    let d = scratch("count");
    std::fs::write(
        d.join("train-images-idx3-ubyte"),
        idx_bytes(IMAGES_MAGIC, &[3, 28, 28], &[0; 3 * 784]),
    )
    .unwrap();
    std::fs::write(
        d.join("train-labels-idx1-ubyte"),
        idx_bytes(LABELS_MAGIC, &[2], &[0, 1]),
    )
    .unwrap();
    let err = FashionMnist::load(&*d, Split::Train).unwrap_err();
    match &err {
        DataError::Idx(IdxError::CountMismatch {
            images: 3,
            labels: 2,
            ..
        }) => {}
        other => panic!("{other:?}"),
    }
    let msg = err.to_string();
    assert!(
        msg.contains("3 images")
            && msg.contains("2 labels")
            && msg.contains("train-labels-idx1-ubyte"),
        "{msg}"
    );
}

#[test]
fn missing_file_and_bad_label() {
    let d = scratch("missing");
    let err = FashionMnist::load(&*d, Split::Test).unwrap_err();
    assert!(
        matches!(err, DataError::Idx(IdxError::Io { .. })),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("t10k-images-idx3-ubyte.gz"),
        "{err}"
    );
    std::fs::write(
        d.join("t10k-images-idx3-ubyte"),
        idx_bytes(IMAGES_MAGIC, &[2, 28, 28], &[0; 2 * 784]),
    )
    .unwrap();
    std::fs::write(
        d.join("t10k-labels-idx1-ubyte"),
        idx_bytes(LABELS_MAGIC, &[2], &[0, 12]),
    )
    .unwrap();
    let err = FashionMnist::load(&*d, Split::Test).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::Idx(IdxError::BadLabel {
                index: 1,
                label: 12,
                ..
            })
        ),
        "{err:?}"
    );
}

/// Images of the wrong size are called that, not a truncated file.
#[test]
fn images_that_are_not_28_by_28() {
    let d = scratch("size");
    std::fs::write(
        d.join("train-images-idx3-ubyte"),
        idx_bytes(IMAGES_MAGIC, &[2, 14, 14], &[0; 2 * 196]),
    )
    .unwrap();
    std::fs::write(
        d.join("train-labels-idx1-ubyte"),
        idx_bytes(LABELS_MAGIC, &[2], &[0, 1]),
    )
    .unwrap();
    let err = FashionMnist::load(&*d, Split::Train).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::Idx(IdxError::ImageSize {
                rows: 14,
                cols: 14,
                expected_rows: 28,
                expected_cols: 28,
                ..
            })
        ),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("holds 14×14 images; this dataset's are 28×28"),
        "{err}"
    );
}

#[test]
fn a_gzip_header_declaring_more_than_the_file_can_inflate_to_is_refused_before_inflating() {
    // The reproducer: 2 MB of gzip declaring 2^32 − 1 images of 28×28 (3.4 TB); 2.2 GB were
    // inflated before the file was found truncated. Scaled down: 1 MiB of zeros.
    let dir = scratch("declares-huge");
    let file = dir.join("bomb-idx3-ubyte.gz");
    let bytes = gzip(&idx_bytes(
        IMAGES_MAGIC,
        &[u32::MAX, 28, 28],
        &vec![0u8; 1 << 20],
    ));
    std::fs::write(&file, &bytes).unwrap();
    let err = read_idx(&file, IMAGES_MAGIC).unwrap_err();
    let declared = 16 + u32::MAX as usize * 784;
    match &err {
        IdxError::DeclaredTooLarge {
            declared_bytes,
            compressed_bytes,
            max_bytes,
            dims,
            ..
        } => {
            assert_eq!(*declared_bytes, declared);
            assert_eq!(*compressed_bytes, bytes.len());
            assert_eq!(*max_bytes, bytes.len() * 1032);
            assert_eq!(dims, &[u32::MAX as usize, 28, 28]);
        }
        other => panic!("{other:?}"),
    }
    let msg = err.to_string();
    assert!(msg.contains(&format!("declares {declared} bytes")), "{msg}");
    assert!(msg.contains("1032×"), "{msg}");
    // A header within the bound that is then short is still reported as truncated.
    let short = gzip(&idx_bytes(LABELS_MAGIC, &[100], &[1u8; 10]));
    std::fs::write(&file, &short).unwrap();
    assert!(matches!(
        read_idx(&file, LABELS_MAGIC).unwrap_err(),
        IdxError::Truncated {
            what: "data",
            expected_bytes: 108,
            actual_bytes: 18,
            ..
        }
    ));
}

#[test]
fn a_multi_member_gzip_file_is_read_to_its_last_member() {
    // `cat a.gz b.gz > c.gz` is one valid gzip file (RFC 1952 §2.2; `gzip -d` and Python read
    // every member). The reader stopped at the end of the first member: "truncated".
    let labels: Vec<u8> = (0..10u8).collect();
    let whole = idx_bytes(LABELS_MAGIC, &[10], &labels);
    let mut bytes = gzip(&whole[..11]);
    bytes.extend(gzip(&whole[11..15]));
    bytes.extend(gzip(&whole[15..]));
    let dir = scratch("multi-member");
    let file = dir.join("t10k-labels-idx1-ubyte.gz");
    std::fs::write(&file, &bytes).unwrap();
    let arr = read_idx(&file, LABELS_MAGIC).unwrap();
    assert_eq!(arr.dims, [10]);
    assert_eq!(arr.data, labels);
}
