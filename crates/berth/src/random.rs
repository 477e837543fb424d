//! Random numbers: a seeded, counter-based generator (PyTorch's `torch.Generator` /
//! `manual_seed`), the same stream on every thread count.
//!
//! A [`Generator`] is a seed plus an offset. Drawing `n` values hands out the counter range
//! `[offset, offset + n)` and advances the offset, so element `i` of a draw is a pure function
//! of `(seed, offset + i)` (Philox-style; here `SplitMix64` mixing): kernels can fill in parallel
//! and reproduce exactly.

use std::sync::Mutex;

use crate::device_kernels::interface::RandomDist;

/// PyTorch's default CPU seed (`torch.initial_seed()` in a fresh process).
pub const DEFAULT_SEED: u64 = 67_280_421_310_721;

/// A seeded random stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Generator {
    seed: u64,
    offset: u64,
}

impl Generator {
    /// A generator at the start of `seed`'s stream.
    pub fn new(seed: u64) -> Generator {
        Generator { seed, offset: 0 }
    }

    /// Restart at the beginning of `seed`'s stream (`Generator.manual_seed`).
    pub fn manual_seed(&mut self, seed: u64) -> &mut Self {
        self.seed = seed;
        self.offset = 0;
        self
    }

    /// The seed.
    pub fn initial_seed(&self) -> u64 {
        self.seed
    }

    /// Reserve `n` counters: returns `(seed, first counter)`.
    pub fn advance(&mut self, n: u64) -> (u64, u64) {
        let start = self.offset;
        // Round to a multiple of 4, as Philox consumers do, so draws stay aligned.
        self.offset = self.offset.wrapping_add(n.div_ceil(4) * 4);
        (self.seed, start)
    }

    /// One uniform `f64` in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        let (s, o) = self.advance(1);
        uniform(s, o)
    }

    /// One uniform integer in `[0, n)` (`n > 0`; 0 when `n == 0`).
    pub fn next_below(&mut self, n: u64) -> u64 {
        let (s, o) = self.advance(1);
        if n == 0 {
            return 0;
        }
        // Multiply-shift on 64 random bits: bias below 2^-32 for n < 2^32.
        ((u128::from(bits(s, o)) * u128::from(n)) >> 64) as u64
    }
}

impl Default for Generator {
    fn default() -> Self {
        Generator::new(DEFAULT_SEED)
    }
}

static GLOBAL: Mutex<Generator> = Mutex::new(Generator {
    seed: DEFAULT_SEED,
    offset: 0,
});

/// Seed the global generator used by `rand`, `randn` and `nn` initialisation
/// (`torch.manual_seed`).
pub fn manual_seed(seed: u64) {
    GLOBAL
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .manual_seed(seed);
}

/// Run `f` with the global generator locked.
pub fn with_global<R>(f: impl FnOnce(&mut Generator) -> R) -> R {
    f(&mut GLOBAL.lock().unwrap_or_else(|p| p.into_inner()))
}

#[inline]
fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// 64 random bits for counter `i` of `seed`'s stream.
#[inline]
pub fn bits(seed: u64, i: u64) -> u64 {
    splitmix(splitmix(seed) ^ i.wrapping_mul(0xD1B5_4A32_D192_ED03))
}

/// Uniform `[0, 1)` for counter `i` (53 random bits).
#[inline]
pub fn uniform(seed: u64, i: u64) -> f64 {
    (bits(seed, i) >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// Sample `dist` at counter `i` of `seed`'s stream (normal: Box–Muller on two sub-draws).
#[inline]
pub fn sample(dist: RandomDist, seed: u64, i: u64) -> f64 {
    match dist {
        RandomDist::Uniform { low, high } => low + (high - low) * uniform(seed, i),
        RandomDist::Normal { mean, std } => {
            let u1 = 1.0 - uniform(seed, i.wrapping_mul(2));
            let u2 = uniform(seed, i.wrapping_mul(2).wrapping_add(1));
            mean + std * (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
        }
    }
}
