//! Random numbers on the device: a counter-based Philox4x32-10 generator (Salmon et al.,
//! "Parallel random numbers: as easy as 1, 2, 3", SC'11; the generator behind PyTorch's CUDA
//! `rand`/`randn` through curand's Philox), one per device, seeded with [`manual_seed`].
//!
//! Element `i` of a call is a pure function of (seed, call offset, i), so the numbers do not
//! depend on the launch configuration, and [`philox4x32_10`] reproduces them bit for bit on the
//! CPU. f32 uniforms take the top 24 bits of one 32-bit word (`[0, 1)`); f64 uniforms take 53
//! bits of two words; normals use Box-Muller on pairs of uniforms.

use super::kernels::{function, grid_for, launch, module_source, KernelError, RawStream};
use super::CudaError;
use crate::device_kernels::interface::RandomDist;
use crate::DType;
use berth_cuda::registry::PerDevice;
use std::ffi::c_void;
use std::sync::Mutex;

const RAND_SRC: &str = r#"
__device__ __forceinline__ void philox(u32 c[4], u32 k0, u32 k1) {
    for (int r = 0; r < 10; ++r) {
        u32 hi0 = __umulhi(0xD2511F53u, c[0]), lo0 = 0xD2511F53u * c[0];
        u32 hi1 = __umulhi(0xCD9E8D57u, c[2]), lo1 = 0xCD9E8D57u * c[2];
        u32 n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
        c[0] = n0; c[1] = lo1; c[2] = n2; c[3] = lo0;
        k0 += 0x9E3779B9u; k1 += 0xBB67AE85u;
    }
}
#if IS_DOUBLE
#define PER 2
__device__ __forceinline__ double unit(u32 a, u32 b) {
    return (double)(((u64)(a >> 5) << 26) | (u64)(b >> 6)) * (1.0 / 9007199254740992.0);
}
#else
#define PER 4
__device__ __forceinline__ float unit(u32 a) { return (float)(a >> 8) * (1.0f / 16777216.0f); }
#endif
extern "C" __global__ void KN(rand_uniform)(i64 n, u64 seed, u64 offset, S* out, double lo, double hi) {
    i64 groups = (n + PER - 1) / PER;
    A l = (A)lo, w = (A)hi - (A)lo;
    GRID_STRIDE(g, groups) {
        u32 c[4] = {(u32)g, (u32)((u64)g >> 32), (u32)offset, (u32)(offset >> 32)};
        philox(c, (u32)seed, (u32)(seed >> 32));
        for (int j = 0; j < PER; ++j) {
            i64 i = g * PER + j;
#if IS_DOUBLE
            if (i < n) out[i] = ST(l + w * unit(c[2 * j], c[2 * j + 1]));
#else
            if (i < n) out[i] = ST(l + w * unit(c[j]));
#endif
        }
    }
}
extern "C" __global__ void KN(rand_normal)(i64 n, u64 seed, u64 offset, S* out, double mean, double stdv) {
    i64 groups = (n + PER - 1) / PER;
    A mu = (A)mean, sd = (A)stdv;
    GRID_STRIDE(g, groups) {
        u32 c[4] = {(u32)g, (u32)((u64)g >> 32), (u32)offset, (u32)(offset >> 32)};
        philox(c, (u32)seed, (u32)(seed >> 32));
        A z[PER];
#if IS_DOUBLE
        double u1 = (double)((((u64)(c[0] >> 5) << 26) | (u64)(c[1] >> 6)) + 1) * (1.0 / 9007199254740992.0);
        double u2 = unit(c[2], c[3]);
        double r = sqrt(-2.0 * log(u1));
        z[0] = r * cos(6.283185307179586 * u2); z[1] = r * sin(6.283185307179586 * u2);
#else
        for (int j = 0; j < 4; j += 2) {
            float u1 = (float)((c[j] >> 8) + 1) * (1.0f / 16777216.0f);
            float u2 = unit(c[j + 1]);
            float r = sqrtf(-2.0f * logf(u1));
            z[j] = r * cosf(6.2831855f * u2); z[j + 1] = r * sinf(6.2831855f * u2);
        }
#endif
        for (int j = 0; j < PER; ++j) { i64 i = g * PER + j; if (i < n) out[i] = ST(mu + sd * z[j]); }
    }
}
"#;

/// One round-function application of Philox4x32 (Random123's `philox4x32round`).
fn round(c: [u32; 4], k: [u32; 2]) -> [u32; 4] {
    let p0 = u64::from(0xD251_1F53u32) * u64::from(c[0]);
    let p1 = u64::from(0xCD9E_8D57u32) * u64::from(c[2]);
    let (hi0, lo0) = ((p0 >> 32) as u32, p0 as u32);
    let (hi1, lo1) = ((p1 >> 32) as u32, p1 as u32);
    [hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0]
}

/// Philox4x32 with 10 rounds: the four 32-bit words for `counter` under `key`, exactly as the
/// device kernels compute them (Random123's known-answer vectors hold; see the tests).
pub fn philox4x32_10(counter: [u32; 4], key: [u32; 2]) -> [u32; 4] {
    let (mut c, mut k) = (counter, key);
    for _ in 0..10 {
        c = round(c, k);
        k = [
            k[0].wrapping_add(0x9E37_79B9),
            k[1].wrapping_add(0xBB67_AE85),
        ];
    }
    c
}

/// The f32 uniforms in `[low, high)` that the device writes for `(seed, offset)`, on the CPU:
/// element `i` is `low + (high - low) * (word >> 8) * 2^-24` with `word` the `i % 4`-th output
/// of [`philox4x32_10`] for counter `(i / 4, offset)` and key `seed`.
pub fn uniform_f32_reference(seed: u64, offset: u64, n: usize, low: f32, high: f32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let g = (i / 4) as u64;
            let w = philox4x32_10(
                [
                    g as u32,
                    (g >> 32) as u32,
                    offset as u32,
                    (offset >> 32) as u32,
                ],
                [seed as u32, (seed >> 32) as u32],
            )[i % 4];
            low + (high - low) * ((w >> 8) as f32 * (1.0 / 16_777_216.0))
        })
        .collect()
}

/// The per-device generator state: the seed and the next call's offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct State {
    seed: u64,
    offset: u64,
}

impl State {
    /// A generator at the start of `seed`'s sequence.
    const fn new(seed: u64) -> Self {
        State { seed, offset: 0 }
    }

    /// The `(seed, offset)` of the next call; advances the offset.
    fn take(&mut self) -> (u64, u64) {
        let taken = (self.seed, self.offset);
        self.offset = self.offset.wrapping_add(1);
        taken
    }
}

/// Each device's generator, created at [`DEFAULT_SEED`] on first use.
static STATES: PerDevice<Mutex<State>> = PerDevice::new();

/// `device`'s generator, created on first use (no context is created).
fn state(device: usize) -> Result<&'static Mutex<State>, CudaError> {
    STATES.get_or_try_init(device, |_| Ok(Mutex::new(State::new(DEFAULT_SEED))))
}

/// The seed a device generator starts with before any [`manual_seed`] (PyTorch's default CUDA
/// seed is also fixed, 67280421310721).
pub const DEFAULT_SEED: u64 = 67_280_421_310_721;

/// Seeds `device`'s generator (`torch.cuda.manual_seed(seed)` for that device) and restarts
/// its offset at 0, so the same seed gives the same numbers again.
///
/// As PyTorch's, it is silently ignored without a driver, and so for an index past the device
/// count: there is no generator to seed, and [`fill_random`] on that device fails with
/// [`CudaError::Unavailable`] or [`CudaError::InvalidDevice`].
pub fn manual_seed(device: usize, seed: u64) {
    if let Ok(s) = state(device) {
        *s.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = State::new(seed);
    }
}

/// Takes the `(seed, offset)` for the next call on `device` and advances the offset.
///
/// # Errors
/// [`CudaError::Unavailable`] without a driver, [`CudaError::InvalidDevice`] for an index at
/// or past the device count.
fn next(device: usize) -> Result<(u64, u64), CudaError> {
    let mut s = state(device)?
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    Ok(s.take())
}

/// Fills the contiguous `out` (`n` elements of float `dtype`) with draws from `dist`, using
/// `device`'s generator; returns the `(seed, offset)` the call used.
///
/// # Errors
/// [`KernelError::UnsupportedDType`] for non-float dtypes; NVRTC and launch failures;
/// [`bind_context`](super::bind_context)'s errors.
///
/// # Safety
/// 1. `out` addresses `n` elements of `dtype` of device memory of `device`, valid until the
///    kernel has run on `stream`.
/// 2. `stream` belongs to `device`'s primary context (or is null).
pub unsafe fn fill_random(
    device: usize,
    stream: RawStream,
    dtype: DType,
    n: usize,
    dist: RandomDist,
    out: u64,
) -> Result<(u64, u64), CudaError> {
    if !dtype.is_float() {
        return Err(KernelError::UnsupportedDType {
            op: "rand",
            dtype: dtype.as_str(),
            supported: "f32, f64, f16, bf16",
        }
        .into());
    }
    let (seed, offset) = next(device)?;
    // SAFETY: the caller's contract.
    unsafe { fill_random_with(device, stream, dtype, n, dist, out, seed, offset) }?;
    Ok((seed, offset))
}

/// As [`fill_random`] with an explicit `(seed, offset)`, leaving the device generator alone.
///
/// # Errors
/// As [`fill_random`].
///
/// # Safety
/// As [`fill_random`].
#[allow(clippy::too_many_arguments)]
pub unsafe fn fill_random_with(
    device: usize,
    stream: RawStream,
    dtype: DType,
    n: usize,
    dist: RandomDist,
    out: u64,
    seed: u64,
    offset: u64,
) -> Result<(), CudaError> {
    if !dtype.is_float() {
        return Err(KernelError::UnsupportedDType {
            op: "rand",
            dtype: dtype.as_str(),
            supported: "f32, f64, f16, bf16",
        }
        .into());
    }
    let mut nn = i64::try_from(n).map_err(|_| KernelError::invalid("rand", "too many elements"))?;
    if nn == 0 {
        return Ok(());
    }
    super::kernels::bind(device)?;
    let (name, mut p, mut q) = match dist {
        RandomDist::Uniform { low, high } => ("rand_uniform", low, high),
        RandomDist::Normal { mean, std } => ("rand_normal", mean, std),
    };
    let key = format!("rand.{}", dtype.as_str());
    let full = format!("{name}_{}", dtype.as_str());
    let is_double = i32::from(dtype == DType::F64);
    // SAFETY: `bind` made the context current.
    let f = unsafe {
        function(device, &key, &full, || {
            module_source(&format!("#define IS_DOUBLE {is_double}\n{RAND_SRC}"), dtype)
        })
    }?;
    let (mut s, mut o, mut ptr) = (seed, offset, out);
    let per: u64 = if dtype == DType::F64 { 2 } else { 4 };
    let mut params = [
        (&raw mut nn).cast::<c_void>(),
        (&raw mut s).cast(),
        (&raw mut o).cast(),
        (&raw mut ptr).cast(),
        (&raw mut p).cast(),
        (&raw mut q).cast(),
    ];
    let grid = grid_for((n as u64).div_ceil(per), 256);
    // SAFETY: params match `rand_*`; `out` per the caller's contract.
    unsafe { launch(device, f, grid, 256, 0, stream, &mut params) }?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn philox_matches_random123_known_answers() {
        assert_eq!(
            philox4x32_10([0; 4], [0; 2]),
            [0x6627_e8d5, 0xe169_c58d, 0xbc57_ac4c, 0x9b00_dbd8]
        );
        assert_eq!(
            philox4x32_10([u32::MAX; 4], [u32::MAX; 2]),
            [0x408f_276d, 0x41c8_3b0e, 0xa20b_c7c6, 0x6d54_51fd]
        );
        assert_eq!(
            philox4x32_10(
                [0x243f_6a88, 0x85a3_08d3, 0x1319_8a2e, 0x0370_7344],
                [0xa409_3822, 0x299f_31d0]
            ),
            [0xd16c_fe09, 0x94fd_cceb, 0x5001_e420, 0x2412_6ea1]
        );
    }

    #[test]
    fn uniform_reference_is_in_range_and_seed_dependent() {
        let a = uniform_f32_reference(1, 0, 1000, 0.0, 1.0);
        assert!(a.iter().all(|&x| (0.0..1.0).contains(&x)));
        let mean = a.iter().sum::<f32>() / 1000.0;
        assert!((mean - 0.5).abs() < 0.05, "{mean}");
        assert_ne!(a, uniform_f32_reference(2, 0, 1000, 0.0, 1.0));
        assert_ne!(a, uniform_f32_reference(1, 1, 1000, 0.0, 1.0));
    }

    #[test]
    fn a_seed_restarts_the_sequence() {
        let mut s = State::new(5);
        assert_eq!(s.take(), (5, 0));
        assert_eq!(s.take(), (5, 1));
        s = State::new(5);
        assert_eq!(s.take(), (5, 0));
    }

    #[test]
    fn generators_exist_only_for_devices_that_exist() {
        let count = crate::cuda::device_count();
        // Seeding a device that does not exist is ignored; drawing on it is a typed error.
        manual_seed(count, 5);
        let e = next(count).unwrap_err();
        if crate::cuda::is_available() {
            assert!(
                matches!(e, CudaError::InvalidDevice { index, .. } if index == count),
                "{e}"
            );
            manual_seed(0, 5);
            assert_eq!(next(0).unwrap(), (5, 0));
            assert_eq!(next(0).unwrap(), (5, 1));
            manual_seed(0, 5);
            assert_eq!(next(0).unwrap(), (5, 0));
        } else {
            assert!(matches!(e, CudaError::Unavailable { .. }), "{e}");
        }
    }
}
