//! A fast hash for device addresses, used by [`super::PagedBestFit`]'s maps.
//!
//! Addresses are 512-byte aligned and often differ only in their middle bits, so the key is
//! multiplied (`FxHash`'s constant) and the well-mixed high bits are rotated down in `finish`:
//! `hashbrown` picks the bucket from the low bits. `SipHash` would cost more than the whole
//! best-fit search.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// `FxHash`-style hasher; see the module documentation.
#[derive(Default, Clone, Copy)]
pub(crate) struct AddrHasher(u64);

const K: u64 = 0xf135_7aea_2e62_a9c5;

impl Hasher for AddrHasher {
    #[inline]
    fn finish(&self) -> u64 {
        self.0.rotate_left(26)
    }

    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(K);
        }
    }

    #[inline]
    fn write_u64(&mut self, v: u64) {
        self.0 = (self.0 ^ v).wrapping_mul(K);
    }

    #[inline]
    fn write_usize(&mut self, v: usize) {
        self.write_u64(v as u64);
    }
}

/// A hash map keyed by device address.
pub(crate) type AddrMap<V> = HashMap<u64, V, BuildHasherDefault<AddrHasher>>;
