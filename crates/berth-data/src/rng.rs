//! `Generator`: the seeded random source of samplers, splits and worker seeds.
//!
//! Note [No global RNG]: PyTorch's samplers and worker seeds fall back to the *global* torch RNG,
//! so iterating an unrelated loader changes the next shuffle
//! (<https://github.com/pytorch/pytorch/issues/11062>). berth-data
//! never reads a global RNG: every loader owns a [`Generator`], either the one given to it or a
//! private one seeded from OS entropy. The streams are xoshiro256** seeded through splitmix64; they
//! are reproducible from the seed on every platform but are not bit-identical to torch's Philox or
//! Mersenne Twister.

use std::sync::{Arc, Mutex, PoisonError};

/// A seeded random number generator shared by handle (like `torch.Generator`): clones draw from
/// the same stream.
#[derive(Clone, Debug)]
pub struct Generator {
    state: Arc<Mutex<GenState>>,
}

#[derive(Debug)]
struct GenState {
    initial_seed: u64,
    s: [u64; 4],
}

fn splitmix64(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl GenState {
    fn seeded(seed: u64) -> Self {
        let mut x = seed;
        let s = [
            splitmix64(&mut x),
            splitmix64(&mut x),
            splitmix64(&mut x),
            splitmix64(&mut x),
        ];
        GenState {
            initial_seed: seed,
            s,
        }
    }

    fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in `0..n` without modulo bias (Lemire's method). `n` must be > 0.
    fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }
}

impl Generator {
    /// A generator seeded with `seed` (`torch.Generator().manual_seed(seed)`).
    pub fn new(seed: u64) -> Self {
        Generator {
            state: Arc::new(Mutex::new(GenState::seeded(seed))),
        }
    }

    /// A generator seeded from OS entropy (std's per-process random hash keys, the time and a
    /// counter): used where no generator was given. See Note [No global RNG].
    pub fn from_entropy() -> Self {
        use std::hash::{BuildHasher, Hasher};
        use std::sync::atomic::{AtomicU64, Ordering};
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        h.write_u64(now);
        Generator::new(h.finish())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GenState> {
        // A panic while holding this lock cannot leave the state invalid (plain integers).
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reseeds the stream (`manual_seed`).
    pub fn manual_seed(&self, seed: u64) {
        *self.lock() = GenState::seeded(seed);
    }

    /// The seed the stream started from (`initial_seed`).
    pub fn initial_seed(&self) -> u64 {
        self.lock().initial_seed
    }

    /// The next 64 random bits.
    pub fn next_u64(&self) -> u64 {
        self.lock().next_u64()
    }

    /// A uniform integer in `0..n`; 0 when `n == 0`.
    pub fn below(&self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        self.lock().below(n as u64) as usize
    }

    /// A uniform float in `[0, 1)` (53 random bits).
    pub fn uniform(&self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A random permutation of `0..n` (`torch.randperm`), by Fisher–Yates.
    pub fn randperm(&self, n: usize) -> Vec<usize> {
        let mut v: Vec<usize> = (0..n).collect();
        let mut st = self.lock();
        for i in (1..n).rev() {
            let j = st.below(i as u64 + 1) as usize;
            v.swap(i, j);
        }
        v
    }

    /// Whether two handles share one stream.
    pub fn same_stream(&self, other: &Generator) -> bool {
        Arc::ptr_eq(&self.state, &other.state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_reseed_restarts() {
        let a = Generator::new(7);
        let b = Generator::new(7);
        let xa: Vec<u64> = (0..4).map(|_| a.next_u64()).collect();
        let xb: Vec<u64> = (0..4).map(|_| b.next_u64()).collect();
        assert_eq!(xa, xb);
        a.manual_seed(7);
        assert_eq!(a.next_u64(), xa[0]);
        assert_ne!(Generator::new(8).next_u64(), xa[0]);
    }

    #[test]
    fn randperm_is_a_permutation() {
        let g = Generator::new(1);
        let mut p = g.randperm(1000);
        assert_ne!(p, (0..1000).collect::<Vec<_>>());
        p.sort_unstable();
        assert_eq!(p, (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn below_is_in_range_and_covers_it() {
        let g = Generator::new(3);
        let mut seen = [0usize; 5];
        for _ in 0..5000 {
            seen[g.below(5)] += 1;
        }
        assert!(seen.iter().all(|&c| (800..1200).contains(&c)), "{seen:?}");
    }
}
