//! `torch.randperm(n, generator=torch.Generator().manual_seed(seed))` on the CPU, reproduced
//! bit for bit, so that a shuffled [`DistributedSampler`](crate::DistributedSampler) deals every
//! rank the same indices as PyTorch's.
//!
//! Note [Torch's CPU permutation]: berth-data's own [`Generator`](crate::Generator) is
//! xoshiro256** and is not PyTorch's stream (Note [No global RNG]). `DistributedSampler` is the
//! one place where matching PyTorch's exact order matters across frameworks: a job that mixes
//! berth and PyTorch ranks, or resumes a PyTorch run on berth, must give each rank the same
//! shard. Its shuffle is a fresh `torch.Generator` seeded `seed + epoch` and one
//! `torch.randperm`, so it is reproduced here and nowhere else:
//! - `manual_seed(seed)` seeds PyTorch's CPU generator, a standard 32-bit MT19937
//!   (`aten/src/ATen/core/MT19937RNGEngine.h`,
//!   <https://github.com/pytorch/pytorch/blob/main/aten/src/ATen/core/MT19937RNGEngine.h>),
//!   with the seed's low 32 bits (`init_with_uint32`);
//! - `randperm_cpu` (`aten/src/ATen/native/TensorFactories.cpp`,
//!   <https://github.com/pytorch/pytorch/blob/main/aten/src/ATen/native/TensorFactories.cpp>)
//!   starts from `0..n` and, for `i` in `0..n - 1`, swaps `r[i]` with `r[i + z]` where
//!   `z = random() % (n - i)` and `random()` is one 32-bit MT19937 output.
//!
//! That loop is PyTorch's for `n < u32::MAX / 20` ([`TORCH_RANDPERM_EXACT_BELOW`]); above it
//! PyTorch switches to 64-bit draws and another loop, which berth does not reproduce (it
//! cannot be checked against PyTorch on a test machine: the permutation alone would be
//! 1.6 GiB). Tests compare against index lists printed by PyTorch 2.15.

/// Sizes below this are permuted exactly as PyTorch's CPU `randperm` does (`u32::MAX / 20`,
/// PyTorch's own switch point). Counted in items.
pub const TORCH_RANDPERM_EXACT_BELOW: usize = (u32::MAX / 20) as usize;

const N: usize = 624;
const M: usize = 397;

/// PyTorch's CPU generator engine: MT19937 with 32-bit outputs.
struct Mt19937 {
    state: [u32; N],
    index: usize,
}

impl Mt19937 {
    /// `at::mt19937(seed)`: only the low 32 bits of the seed are used.
    fn new(seed: u64) -> Self {
        let mut state = [0u32; N];
        state[0] = seed as u32;
        for i in 1..N {
            let prev = state[i - 1];
            state[i] = 1_812_433_253u32
                .wrapping_mul(prev ^ (prev >> 30))
                .wrapping_add(i as u32);
        }
        Mt19937 { state, index: N }
    }

    fn twist(&mut self) {
        for i in 0..N {
            let y = (self.state[i] & 0x8000_0000) | (self.state[(i + 1) % N] & 0x7fff_ffff);
            let mut next = self.state[(i + M) % N] ^ (y >> 1);
            if y & 1 != 0 {
                next ^= 0x9908_b0df;
            }
            self.state[i] = next;
        }
        self.index = 0;
    }

    fn next_u32(&mut self) -> u32 {
        if self.index >= N {
            self.twist();
        }
        let mut y = self.state[self.index];
        self.index += 1;
        y ^= y >> 11;
        y ^= (y << 7) & 0x9d2c_5680;
        y ^= (y << 15) & 0xefc6_0000;
        y ^ (y >> 18)
    }
}

/// The permutation of `0..n` that `torch.randperm(n, generator=g)` returns on the CPU for a
/// fresh generator `g` seeded with `seed` (`g.manual_seed(seed)`), or `None` when
/// `n >= TORCH_RANDPERM_EXACT_BELOW` (Note [Torch's CPU permutation]).
///
/// # Examples
/// ```
/// // torch.randperm(10, generator=torch.Generator().manual_seed(0)).tolist()
/// assert_eq!(
///     berth_data::torch_randperm(10, 0),
///     Some(vec![4, 1, 7, 5, 3, 9, 0, 8, 6, 2])
/// );
/// ```
pub fn torch_randperm(n: usize, seed: u64) -> Option<Vec<usize>> {
    if n >= TORCH_RANDPERM_EXACT_BELOW {
        return None;
    }
    let mut engine = Mt19937::new(seed);
    let mut r: Vec<usize> = (0..n).collect();
    for i in 0..n.saturating_sub(1) {
        let z = engine.next_u32() as usize % (n - i);
        r.swap(i, i + z);
    }
    Some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values printed by PyTorch 2.15:
    /// `torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()`.
    #[test]
    fn matches_pytorch_randperm() {
        assert_eq!(
            torch_randperm(10, 1).unwrap(),
            [5, 6, 1, 2, 0, 8, 9, 3, 7, 4]
        );
        assert_eq!(
            torch_randperm(17, 42).unwrap()[..10],
            [13, 4, 3, 15, 8, 16, 9, 11, 12, 10]
        );
        // n = 1000 draws past the first 624 outputs, so the twist is exercised twice.
        assert_eq!(
            torch_randperm(1000, 5).unwrap()[..10],
            [411, 49, 291, 695, 678, 515, 112, 606, 6, 942]
        );
        assert_eq!(torch_randperm(3, 7).unwrap(), [0, 1, 2]);
        assert_eq!(torch_randperm(0, 7).unwrap(), Vec::<usize>::new());
        assert_eq!(torch_randperm(1, 7).unwrap(), [0]);
    }

    #[test]
    fn high_seed_bits_are_ignored_as_in_pytorch() {
        assert_eq!(torch_randperm(10, 1 << 32), torch_randperm(10, 0));
    }

    #[test]
    fn refuses_sizes_it_cannot_reproduce() {
        assert_eq!(torch_randperm(TORCH_RANDPERM_EXACT_BELOW, 0), None);
    }
}
