//! IDX files (the Fashion-MNIST reader, `berth_data::idx::read_idx_bytes`; raw or gzip):
//! parsing never panics nor allocates beyond what the input holds, an accepted file holds
//! exactly its declared bytes, and the same bytes gzipped parse to the same array.
#![no_main]

use berth_data::idx::{read_idx_bytes, IdxError, IMAGES_MAGIC, LABELS_MAGIC};
use libfuzzer_sys::fuzz_target;
use std::io::Write;

fuzz_target!(|data: &[u8]| {
    if data.len() > 256 << 10 {
        return;
    }
    let gzipped = data.starts_with(&[0x1f, 0x8b]);
    for magic in [IMAGES_MAGIC, LABELS_MAGIC] {
        let raw = read_idx_bytes("fuzz.idx", data, magic);
        if let Ok(a) = &raw {
            let numel = a.dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
            assert_eq!(numel, Some(a.data.len()), "dims {:?}", a.dims);
            assert_eq!(a.magic, magic);
            if !gzipped {
                assert_eq!(4 + 4 * a.dims.len() + a.data.len(), data.len());
            }
        }
        if gzipped {
            continue;
        }
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(data).expect("writing to a Vec");
        let gz = gz.finish().expect("writing to a Vec");
        let from_gz = read_idx_bytes("fuzz.idx.gz", &gz, magic);
        match (&raw, &from_gz) {
            (Ok(a), Ok(b)) => assert_eq!(a, b),
            (Err(IdxError::TooLarge { .. }), Err(IdxError::TooLarge { .. }))
            | (Err(IdxError::WrongMagic { .. }), Err(IdxError::WrongMagic { .. }))
            | (Err(IdxError::Truncated { .. }), Err(IdxError::Truncated { .. }))
            | (Err(IdxError::TrailingBytes { .. }), Err(IdxError::TrailingBytes { .. })) => {}
            // A header declaring more than its gzip file can inflate to is refused before
            // inflating (berth-data's `DeclaredTooLarge`): the raw file is short of it too.
            (
                Err(IdxError::Truncated { .. } | IdxError::TooLarge { .. }),
                Err(IdxError::DeclaredTooLarge { .. }),
            ) => {}
            (a, b) => panic!("raw {a:?} but gzipped {b:?}"),
        }
    }
});
