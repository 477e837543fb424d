//! A random permutation of `0..n` walked one index at a time, in constant memory.
//!
//! Note [Lazy epochs]: PyTorch's `RandomSampler` materialises `torch.randperm(n)` at the start of
//! every epoch (<https://github.com/pytorch/pytorch/blob/main/torch/utils/data/sampler.py>), and
//! berth's loaders used to collect every index of an epoch before the first batch: 3·10⁸ items
//! took 4.8 GB, and a dataset of 2⁴⁰ items aborted. An epoch is now an iterator:
//! [`SequentialSampler`](crate::SequentialSampler) counts, and
//! [`RandomSampler`](crate::RandomSampler) keeps PyTorch's Fisher–Yates `randperm` for epochs of
//! at most [`EAGER_EPOCH_LIMIT`] indices (at most 8 MiB held, exact orders unchanged) and walks a
//! [`LazyPermutation`] above that: a keyed Feistel network over the smallest power-of-four domain
//! that holds `n`, restricted to `0..n` by skipping the values past `n` (at most three of every
//! four values are skipped, so a step costs O(1) on average). Its keys (48 bytes) are drawn when
//! the permutation is made, so the epoch's draws still all happen when the epoch starts.

use crate::rng::Generator;

/// Epochs of at most this many indices are drawn eagerly, by Fisher–Yates, as PyTorch does
/// (2²⁰ indices: 8 MiB on a 64-bit target); longer ones are walked lazily.
pub const EAGER_EPOCH_LIMIT: usize = 1 << 20;

const ROUNDS: usize = 6;

/// A pseudo-random permutation of `0..n`, yielding each index exactly once, holding O(1) memory.
///
/// The order is reproducible from the generator's seed; it is not Fisher–Yates' order, and (as
/// any keyed permutation over a large domain) it reaches only a subset of all `n!` orders, which
/// is immaterial for shuffling a dataset. See Note [Lazy epochs].
#[derive(Debug, Clone)]
pub struct LazyPermutation {
    n: u64,
    half_bits: u32,
    keys: [u64; ROUNDS],
    /// Next point of the power-of-four domain to map.
    counter: u64,
    /// Indices yielded so far (the walk stops at `n`, before `counter` can overflow).
    yielded: u64,
}

impl LazyPermutation {
    /// A permutation of `0..n` keyed by draws from `generator` (six 64-bit draws).
    pub fn new(n: usize, generator: &Generator) -> Self {
        let n = n as u64;
        // Smallest even bit count 2h with 2^(2h) >= n, h >= 1.
        let bits = (64 - n.saturating_sub(1).leading_zeros()).max(2);
        let half_bits = bits.div_ceil(2);
        let mut keys = [0u64; ROUNDS];
        for k in &mut keys {
            *k = generator.next_u64();
        }
        LazyPermutation {
            n,
            half_bits,
            keys,
            counter: 0,
            yielded: 0,
        }
    }

    fn round(x: u64, key: u64) -> u64 {
        // splitmix64's finaliser of the half and the key.
        let mut z = x ^ key;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// The Feistel network: a bijection of `0..4^h`.
    fn permute(&self, x: u64) -> u64 {
        let h = self.half_bits;
        let mask = if h >= 64 { u64::MAX } else { (1u64 << h) - 1 };
        let (mut left, mut right) = ((x >> h) & mask, x & mask);
        for &key in &self.keys {
            let next = left ^ (Self::round(right, key) & mask);
            left = right;
            right = next;
        }
        (left << h) | right
    }
}

impl Iterator for LazyPermutation {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        while self.yielded < self.n {
            let x = self.permute(self.counter);
            self.counter = self.counter.wrapping_add(1);
            if x < self.n {
                self.yielded += 1;
                // x < n <= usize::MAX.
                return Some(x as usize);
            }
        }
        None
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = (self.n - self.yielded) as usize;
        (left, Some(left))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_permutation(n: usize, seed: u64) -> Vec<usize> {
        let p: Vec<usize> = LazyPermutation::new(n, &Generator::new(seed)).collect();
        assert_eq!(p.len(), n);
        let mut seen = vec![false; n];
        for &i in &p {
            assert!(!seen[i], "index {i} yielded twice for n = {n}");
            seen[i] = true;
        }
        p
    }

    #[test]
    fn every_index_once_for_small_and_odd_sizes() {
        for n in [0, 1, 2, 3, 4, 5, 17, 1000, 4097] {
            check_permutation(n, 11);
        }
    }

    #[test]
    fn shuffles_and_depends_on_the_seed() {
        let a = check_permutation(1000, 1);
        assert_ne!(a, (0..1000).collect::<Vec<_>>());
        assert_ne!(a, check_permutation(1000, 2));
        assert_eq!(a, check_permutation(1000, 1));
        // Not a rotation of the identity either: the first ten are not consecutive.
        assert!(a[..10].windows(2).any(|w| w[1] != w[0] + 1));
    }

    #[test]
    fn huge_domains_start_at_once() {
        // 2^40 and usize::MAX items: the first indices come without touching the rest.
        for n in [1usize << 40, usize::MAX] {
            let first: Vec<usize> = LazyPermutation::new(n, &Generator::new(5))
                .take(4)
                .collect();
            assert_eq!(first.len(), 4);
            assert!(first.iter().all(|&i| i < n));
        }
    }
}
