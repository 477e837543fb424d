//! Size classes of free blocks and a bitmap of the non-empty ones: the constant-time part of
//! finding a best fit, shared by `paged`'s arena (`paged::bins`) and the PyTorch policy's pools
//! (`caching::sorted`).
//!
//! # Note [Size classes]
//! Blocks are multiples of 512 bytes (PyTorch's `kMinBlockSize`). Let `u = size / 512`. Up to
//! 1 MiB (`u <= 2048`) every size has its own class, so a class holds blocks of one size only.
//! Above, classes are log-linear as in TLSF (Masmano et al., "TLSF: a new dynamic memory
//! allocator for real-time systems", 2004): 64 classes per power of two, so a class spans sizes
//! within 1/64 of each other. [`class_of`] is non-decreasing in the size for every `u64` (also
//! sizes that are not multiples of 512), so ordering blocks by class, then by size within a
//! class, is ordering them by size. A [`ClassSet`] of the non-empty classes, with a summary word
//! over its bitmap, finds the first non-empty class at or above any class, or the last at or
//! below, with two bit scans.

/// The largest `size / 512` with a class of its own (1 MiB).
const EXACT_UNITS: u64 = 2048;
/// Classes per power of two above [`EXACT_UNITS`].
const SUB: u64 = 64;
/// `log2(SUB)`.
const SUB_BITS: u32 = 6;
/// Number of classes: exact ones (including class 0, sizes below 512 bytes) plus 64 per power
/// of two from 2^11 to 2^54 units (every `u64` size in bytes).
pub(crate) const CLASSES: usize = EXACT_UNITS as usize + 1 + 44 * SUB as usize;
/// Words of the bitmap.
const WORDS: usize = CLASSES.div_ceil(64);

/// The class of a block of `size` bytes. Non-decreasing in `size`; at most `CLASSES - 1`.
#[inline]
pub(crate) fn class_of(size: u64) -> usize {
    let u = size >> 9;
    if u <= EXACT_UNITS {
        return u as usize;
    }
    let e = 63 - u.leading_zeros(); // >= 11
    let m = (u >> (e - SUB_BITS)) & (SUB - 1);
    (EXACT_UNITS + 1 + u64::from(e - 11) * SUB + m) as usize
}

/// Whether every multiple of 512 bytes in class `class` has the same size.
#[inline]
pub(crate) fn is_exact(class: usize) -> bool {
    class as u64 <= EXACT_UNITS
}

/// A set of classes (`0..CLASSES`): a bitmap with a summary word over it.
#[derive(Clone, Debug)]
pub(crate) struct ClassSet {
    /// Bit `c` set when class `c` is in the set.
    bits: [u64; WORDS],
    /// Bit `w` set when `bits[w] != 0`.
    summary: u128,
}

impl Default for ClassSet {
    fn default() -> Self {
        ClassSet {
            bits: [0; WORDS],
            summary: 0,
        }
    }
}

impl ClassSet {
    /// Adds `class` (< `CLASSES`).
    #[inline]
    pub(crate) fn insert(&mut self, class: usize) {
        self.bits[class / 64] |= 1 << (class % 64);
        self.summary |= 1 << (class / 64);
    }

    /// Removes `class` (< `CLASSES`).
    #[inline]
    pub(crate) fn remove(&mut self, class: usize) {
        let w = class / 64;
        self.bits[w] &= !(1 << (class % 64));
        if self.bits[w] == 0 {
            self.summary &= !(1 << w);
        }
    }

    /// The smallest class `>= class` in the set.
    #[inline]
    pub(crate) fn next_at_or_above(&self, class: usize) -> Option<usize> {
        if class >= CLASSES {
            return None;
        }
        let w = class / 64;
        let here = self.bits[w] & (!0u64 << (class % 64));
        if here != 0 {
            return Some(w * 64 + here.trailing_zeros() as usize);
        }
        let above = if w + 1 >= 128 {
            0
        } else {
            self.summary & (!0u128 << (w + 1))
        };
        if above == 0 {
            return None;
        }
        let w = above.trailing_zeros() as usize;
        Some(w * 64 + self.bits[w].trailing_zeros() as usize)
    }

    /// The largest class `<= class` in the set (`class` may be `CLASSES` or more: then the
    /// largest in the set).
    #[inline]
    pub(crate) fn last_at_or_below(&self, class: usize) -> Option<usize> {
        let class = class.min(CLASSES - 1);
        let w = class / 64;
        let here = self.bits[w] & (!0u64 >> (63 - class % 64));
        if here != 0 {
            return Some(w * 64 + 63 - here.leading_zeros() as usize);
        }
        let below = self.summary & ((1u128 << w) - 1);
        if below == 0 {
            return None;
        }
        let w = 127 - below.leading_zeros() as usize;
        Some(w * 64 + 63 - self.bits[w].leading_zeros() as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_are_exact_to_1_mib_then_log_linear() {
        assert_eq!(class_of(0), 0);
        assert_eq!(class_of(511), 0);
        assert_eq!(class_of(512), 1);
        assert_eq!(class_of(1 << 20), 2048);
        assert!(is_exact(2048) && !is_exact(2049));
        // 1 MiB + 512 .. 1 MiB + 16 KiB share the first log-linear class (width 32 units).
        assert_eq!(class_of((1 << 20) + 512), 2049);
        assert_eq!(class_of((1 << 20) + 16 * 1024 - 512), 2049);
        assert_eq!(class_of((1 << 20) + 16 * 1024), 2050);
        assert_eq!(class_of(2 << 20), 2049 + 64);
        assert_eq!(class_of(!511), CLASSES - 1);
        assert_eq!(class_of(u64::MAX), CLASSES - 1);
        // Non-decreasing, and within a class sizes differ by less than 1/64.
        let mut last = 0;
        let mut first_of_class = 512u64;
        for u in 1..200_000u64 {
            let c = class_of(u * 512);
            assert!(c >= last, "class_of is monotonic at {u}");
            if c != last {
                first_of_class = u * 512;
            }
            assert!(u * 512 - first_of_class < first_of_class / 64 + 512);
            last = c;
        }
    }

    /// Every query agrees with a scan of a `BTreeSet` of classes, across word boundaries and
    /// the ends of the range.
    #[test]
    fn class_set_queries_agree_with_a_sorted_set() {
        let mut set = ClassSet::default();
        let mut want = std::collections::BTreeSet::new();
        let mut next = crate::testing::xorshift(0x9e37_79b9_7f4a_7c15);
        for step in 0..20_000 {
            let x = next();
            let c = if step % 3 == 0 {
                [0, 63, 64, 127, CLASSES - 1][step / 3 % 5]
            } else {
                (x % CLASSES as u64) as usize
            };
            if x >> 60 < 9 {
                set.insert(c);
                want.insert(c);
            } else {
                set.remove(c);
                want.remove(&c);
            }
            let probe = ((x >> 20) % (CLASSES as u64 + 10)) as usize;
            assert_eq!(
                set.next_at_or_above(probe),
                want.range(probe..).next().copied()
            );
            assert_eq!(
                set.last_at_or_below(probe),
                want.range(..=probe).next_back().copied()
            );
        }
        assert!(!want.is_empty());
    }
}
