//! Batched matrix product through the `gemm` crate (multithreaded on rayon for large
//! products). f32 and f64 run natively on any strides; f16/bf16 are computed in f32 (as
//! PyTorch without a half kernel); integers use an exact `i64` loop.

use half::{bf16, f16};

use super::{In, Num, Scalar};
use crate::device_kernels::View;
use crate::storage::Pod;
use crate::{DType, Layout, Result};

struct Dims {
    batches: Vec<(usize, usize)>,
    m: usize,
    n: usize,
    k: usize,
}

fn dims(l: &Layout, r: &Layout) -> Dims {
    let rank = l.rank();
    let (m, k, n) = (
        l.shape()[rank - 2],
        l.shape()[rank - 1],
        r.shape()[rank - 1],
    );
    let batch = |x: &Layout| {
        Layout::from_parts(
            x.shape()[..rank - 2].to_vec(),
            x.strides()[..rank - 2].to_vec(),
            x.offset(),
        )
        .indices()
        .collect::<Vec<_>>()
    };
    Dims {
        batches: batch(l).into_iter().zip(batch(r)).collect(),
        m,
        n,
        k,
    }
}

/// Multiply-adds a thread gets at least before `gemm` is split over more threads: about 25 µs
/// of one core's work, several times the cost of waking a rayon worker.
const MACS_PER_THREAD: usize = 1 << 20;

/// The threads for one `m × k · k × n` product: one per [`MACS_PER_THREAD`] multiply-adds, at
/// most rayon's pool, and none (the calling thread) below two. Note [Small matmuls]: the main
/// job's products are 64-row; `[64, 256] · [256, 10]` (164k multiply-adds) was split over every
/// core of the pool (the old rule: ≥ 48³), which costs more in wake-ups than the product, and
/// `[64, 784] · [784, 256]` (12.8M) gets 12 threads rather than all of a large pool.
fn parallelism(m: usize, n: usize, k: usize) -> gemm::Parallelism {
    let macs = m.saturating_mul(n).saturating_mul(k);
    let threads = (macs / MACS_PER_THREAD).min(rayon::current_num_threads());
    if threads >= 2 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    }
}

/// `gemm` over one dtype that it supports natively.
fn gemm_native<T: Pod + 'static>(
    out: &mut [T],
    a: &[T],
    la: &Layout,
    b: &[T],
    lb: &Layout,
    zero: T,
    one: T,
) {
    let d = dims(la, lb);
    let rank = la.rank();
    let (ars, acs) = (
        la.strides()[rank - 2] as isize,
        la.strides()[rank - 1] as isize,
    );
    let (brs, bcs) = (
        lb.strides()[rank - 2] as isize,
        lb.strides()[rank - 1] as isize,
    );
    if d.m * d.n == 0 {
        return;
    }
    let par = parallelism(d.m, d.n, d.k);
    for (i, &(ao, bo)) in d.batches.iter().enumerate() {
        let dst = &mut out[i * d.m * d.n..(i + 1) * d.m * d.n];
        if d.k == 0 {
            dst.fill(zero);
            continue;
        }
        // SAFETY: every index `ao + r*ars + c*acs` (r < m, c < k) is inside `a` because the
        // layout was validated against the storage size; likewise for `b`; `dst` holds m*n
        // elements with row stride n and column stride 1. `read_dst == false` so `dst`'s
        // initial contents are not read.
        unsafe {
            gemm::gemm(
                d.m,
                d.n,
                d.k,
                dst.as_mut_ptr(),
                1,
                d.n as isize,
                false,
                a.as_ptr().add(ao),
                acs,
                ars,
                b.as_ptr().add(bo),
                bcs,
                brs,
                zero,
                one,
                false,
                false,
                false,
                par,
            );
        }
    }
}

/// A dense f32 copy of a strided operand (for half types), with a contiguous layout.
///
/// # Errors
/// [`crate::Error::HostOutOfMemory`] when the copy (4 bytes an element of `l`, expanded
/// dimensions included) cannot be had.
fn to_f32<T: Num>(x: &[T], l: &Layout) -> Result<(Vec<f32>, Layout)> {
    let v = super::try_collect(l.numel(), l.indices().map(|i| x[i].to_c().to_f64() as f32))?;
    Ok((v, Layout::contiguous(l.shape())))
}

/// Half-type matmul through f32 copies of the operands and the output.
///
/// # Errors
/// As [`to_f32`].
fn matmul_via_f32<T: Num>(out: &mut [T], a: &[T], la: &Layout, b: &[T], lb: &Layout) -> Result<()> {
    let (a32, la32) = to_f32(a, la)?;
    let (b32, lb32) = to_f32(b, lb)?;
    let mut o32 = super::try_vec(out.len(), 0f32)?;
    gemm_native(&mut o32, &a32, &la32, &b32, &lb32, 0.0, 1.0);
    for (o, v) in out.iter_mut().zip(o32) {
        *o = T::from_c(<T::C as super::Scalar>::from_f64(v as f64));
    }
    Ok(())
}

fn matmul_int<T: Num>(out: &mut [T], a: &[T], la: &Layout, b: &[T], lb: &Layout) {
    let d = dims(la, lb);
    let rank = la.rank();
    let (ars, acs) = (la.strides()[rank - 2], la.strides()[rank - 1]);
    let (brs, bcs) = (lb.strides()[rank - 2], lb.strides()[rank - 1]);
    for (bi, &(ao, bo)) in d.batches.iter().enumerate() {
        for r in 0..d.m {
            for c in 0..d.n {
                let mut acc = 0i64;
                for x in 0..d.k {
                    let av = a[ao + r * ars + x * acs].to_c().to_f64() as i64;
                    let bv = b[bo + x * brs + c * bcs].to_c().to_f64() as i64;
                    acc = acc.wrapping_add(av.wrapping_mul(bv));
                }
                out[bi * d.m * d.n + r * d.n + c] =
                    T::from_c(<T::C as super::Scalar>::from_f64(acc as f64));
            }
        }
    }
}

pub(crate) fn matmul(dst: View<'_>, lhs: View<'_>, rhs: View<'_>) -> Result<()> {
    let l = In::new(lhs, "matmul")?;
    let r = In::new(rhs, "matmul")?;
    let mut w = dst.storage.write_host("matmul")?;
    let (off, n) = (dst.layout.offset(), dst.layout.numel());
    macro_rules! go {
        ($t:ty, $f:ident $(, $z:expr, $o:expr)?) => {{
            let out = &mut w.typed_mut::<$t>()[off..off + n];
            $f(out, l.typed::<$t>(), lhs.layout, r.typed::<$t>(), rhs.layout $(, $z, $o)?)
        }};
    }
    match lhs.dtype {
        DType::F32 => go!(f32, gemm_native, 0.0f32, 1.0f32),
        DType::F64 => go!(f64, gemm_native, 0.0f64, 1.0f64),
        DType::F16 => go!(f16, matmul_via_f32)?,
        DType::BF16 => go!(bf16, matmul_via_f32)?,
        DType::I64 => go!(i64, matmul_int),
        DType::I32 => go!(i32, matmul_int),
        DType::U8 | DType::Bool => go!(u8, matmul_int),
    }
    Ok(())
}
