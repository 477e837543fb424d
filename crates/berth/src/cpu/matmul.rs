//! Batched matrix product through the `gemm` crate (multithreaded on rayon for large
//! products). f32 and f64 run natively on any strides; f16/bf16 are computed in f32 (as
//! PyTorch without a half kernel); integers use an exact, wrapping `i64` loop.

use half::{bf16, f16};

use super::{In, Num, Scalar};
use crate::device_kernels::interface::View;
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

/// Multiply-adds a thread gets at least before a product is split over more threads: about
/// 10 µs of one core's work, a few times the cost of waking a rayon worker.
const MACS_PER_THREAD: usize = 1 << 19;

/// The narrowest slice of output rows or columns a thread gets: one AVX-512 register of f32.
const MIN_SLICE: usize = 16;

/// How one `m × k · k × n` product is split: `parts` slices of `width` output rows
/// (`by_rows`) or columns, the last one narrower.
///
/// Note [Small matmuls]: the main job's products are 64-row, and `gemm`'s own threading
/// splits them badly. On the 16 cores of the H200 host (AVX-512 kernels, hot caches),
/// `[64, 784] · [784, 256]` (fc1 forward, 12.8M multiply-adds) took 261 µs on 16 `gemm`
/// threads, 1.7× one thread; `[64, 256] · [256, 10]` (164k) was once split over every core,
/// which costs more in wake-ups than the product. Slicing the larger output dimension into
/// one slice per thread, each a single-threaded `gemm` over the whole `k`, took 68 µs for fc1
/// forward and 62 µs for its weight gradient `[256, 64] · [64, 784]` (`gemm`'s threads: 70 µs);
/// PyTorch took 47 and 41 µs in the same call (`BENCHMARKS.md`). Each slice packs its
/// own copy of the other operand, which costs `1/width` of its work: slices are at least
/// [`MIN_SLICE`] wide. Threads: one per [`MACS_PER_THREAD`] multiply-adds, at most rayon's
/// pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Split {
    by_rows: bool,
    parts: usize,
    width: usize,
}

fn split(m: usize, n: usize, k: usize, pool: usize) -> Split {
    let macs = m.saturating_mul(n).saturating_mul(k);
    let by_rows = m > n;
    let dim = m.max(n);
    let threads = (macs / MACS_PER_THREAD)
        .min(pool)
        .min(dim / MIN_SLICE)
        .max(1);
    let width = dim.div_ceil(threads).next_multiple_of(MIN_SLICE).min(dim);
    Split {
        by_rows,
        parts: dim.div_ceil(width.max(1)),
        width,
    }
}

/// A pointer that may cross to rayon's threads: each slice of a split product reads the
/// operands and writes its own rows or columns of the output, disjoint from every other's.
#[derive(Debug, Clone, Copy)]
struct Shared<P>(P);
// SAFETY: see the type's doc: the slices' writes are disjoint and the operands are read only.
unsafe impl<P> Send for Shared<P> {}
// SAFETY: as `Send`: shared references only read the pointers.
unsafe impl<P> Sync for Shared<P> {}

/// One strided operand or output of `gemm`: base pointer, row stride, column stride (elements).
#[derive(Debug, Clone, Copy)]
struct Mat<P> {
    ptr: P,
    rs: isize,
    cs: isize,
}

/// `gemm` of output rows `r0..r0 + mm` and columns `c0..c0 + nn` on the calling thread.
///
/// # Safety
/// As [`gemm_split`], for that block of `dst`, those rows of `a` and those columns of `b`.
#[allow(clippy::too_many_arguments)]
unsafe fn gemm_block<T: Pod + 'static>(
    dst: Mat<*mut T>,
    a: Mat<*const T>,
    b: Mat<*const T>,
    k: usize,
    (r0, mm): (usize, usize),
    (c0, nn): (usize, usize),
    (zero, one): (T, T),
) {
    // SAFETY: the caller's contract; offsets of in-bounds rows and columns stay in bounds.
    unsafe {
        gemm::gemm(
            mm,
            nn,
            k,
            dst.ptr.offset(r0 as isize * dst.rs + c0 as isize * dst.cs),
            dst.cs,
            dst.rs,
            false,
            a.ptr.offset(r0 as isize * a.rs),
            a.cs,
            a.rs,
            b.ptr.offset(c0 as isize * b.cs),
            b.cs,
            b.rs,
            zero,
            one,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

/// `dst = a · b` for one `m × k · k × n` product, split as [`split`] says.
///
/// # Safety
/// Every element `a.ptr + r·a.rs + c·a.cs` (`r < m`, `c < k`) and likewise of `b` (`k × n`) is
/// readable, every element of `dst` (`m × n`) writable, and `dst` overlaps neither operand.
unsafe fn gemm_split<T: Pod + 'static>(
    (m, n, k): (usize, usize, usize),
    dst: Mat<*mut T>,
    a: Mat<*const T>,
    b: Mat<*const T>,
    zero: T,
    one: T,
) {
    let s = split(m, n, k, rayon::current_num_threads());
    if s.parts <= 1 {
        // SAFETY: the caller's contract, for the whole product.
        return unsafe { gemm_block(dst, a, b, k, (0, m), (0, n), (zero, one)) };
    }
    let shared = Shared((dst, a, b));
    rayon::scope(|scope| {
        for p in 0..s.parts {
            let start = p * s.width;
            let len = s.width.min(if s.by_rows { m } else { n } - start);
            scope.spawn(move |_| {
                // The whole wrapper moves in (not its fields, which are not `Send`).
                let whole = shared;
                let (dst, a, b) = whole.0;
                let (rows, cols) = if s.by_rows {
                    ((start, len), (0, n))
                } else {
                    ((0, m), (start, len))
                };
                // SAFETY: the caller's contract, for one slice; the slices' outputs are
                // disjoint, so no two threads write one element.
                unsafe { gemm_block(dst, a, b, k, rows, cols, (zero, one)) }
            });
        }
    });
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
    let stride = |l: &Layout, i: usize| l.strides()[rank - 2 + i] as isize;
    if d.m * d.n == 0 {
        return;
    }
    for (i, &(ao, bo)) in d.batches.iter().enumerate() {
        let dst = &mut out[i * d.m * d.n..(i + 1) * d.m * d.n];
        if d.k == 0 {
            dst.fill(zero);
            continue;
        }
        // SAFETY: every index `ao + r*ars + c*acs` (r < m, c < k) is inside `a` because the
        // layout was validated against the storage size; likewise for `b`; `dst` holds m*n
        // elements with row stride n and column stride 1, and is the output's own storage.
        unsafe {
            gemm_split(
                (d.m, d.n, d.k),
                Mat {
                    ptr: dst.as_mut_ptr(),
                    rs: d.n as isize,
                    cs: 1,
                },
                Mat {
                    ptr: a.as_ptr().add(ao),
                    rs: stride(la, 0),
                    cs: stride(la, 1),
                },
                Mat {
                    ptr: b.as_ptr().add(bo),
                    rs: stride(lb, 0),
                    cs: stride(lb, 1),
                },
                zero,
                one,
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

/// Integer matmul: products and sums wrap in `i64` (Note [Exact integers]; PyTorch's integer
/// matmul accumulates in its own dtype and wraps), then are stored as `T` with a wrapping
/// cast. For bool (`logical`) an output is 1 when any product is (logical or of ands), so a
/// bool tensor still holds only 0 and 1.
fn matmul_int<T: Num<C = i64>>(
    out: &mut [T],
    a: &[T],
    la: &Layout,
    b: &[T],
    lb: &Layout,
    logical: bool,
) {
    let d = dims(la, lb);
    let rank = la.rank();
    let (ars, acs) = (la.strides()[rank - 2], la.strides()[rank - 1]);
    let (brs, bcs) = (lb.strides()[rank - 2], lb.strides()[rank - 1]);
    for (bi, &(ao, bo)) in d.batches.iter().enumerate() {
        for r in 0..d.m {
            for c in 0..d.n {
                let mut acc = 0i64;
                for x in 0..d.k {
                    let av = a[ao + r * ars + x * acs].to_c();
                    let bv = b[bo + x * brs + c * bcs].to_c();
                    acc = acc.wrapping_add(av.wrapping_mul(bv));
                }
                if logical {
                    acc = i64::from(acc != 0);
                }
                out[bi * d.m * d.n + r * d.n + c] = T::from_c(acc);
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
        ($t:ty, $f:ident $(, $extra:expr)*) => {{
            let out = &mut w.typed_mut::<$t>()[off..off + n];
            $f(out, l.typed::<$t>(), lhs.layout, r.typed::<$t>(), rhs.layout $(, $extra)*)
        }};
    }
    match lhs.dtype {
        DType::F32 => go!(f32, gemm_native, 0.0f32, 1.0f32),
        DType::F64 => go!(f64, gemm_native, 0.0f64, 1.0f64),
        DType::F16 => go!(f16, matmul_via_f32)?,
        DType::BF16 => go!(bf16, matmul_via_f32)?,
        DType::I64 => go!(i64, matmul_int, false),
        DType::I32 => go!(i32, matmul_int, false),
        DType::U8 => go!(u8, matmul_int, false),
        DType::Bool => go!(u8, matmul_int, true),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{split, Split};

    #[test]
    fn products_are_sliced_along_their_larger_output_dimension() {
        // fc1 forward `[64, 784] · [784, 256]` on 16 threads: 16 column slices of 16.
        assert_eq!(
            split(64, 256, 784, 16),
            Split {
                by_rows: false,
                parts: 16,
                width: 16
            }
        );
        // Its weight gradient `[256, 64] · [64, 784]`: columns, 16 slices of 49 → 13 of 64.
        assert_eq!(
            split(256, 784, 64, 16),
            Split {
                by_rows: false,
                parts: 13,
                width: 64
            }
        );
        // Tall: by rows.
        assert!(split(1000, 50, 200, 8).by_rows);
        // `[64, 256] · [256, 10]` (164k multiply-adds) stays on the calling thread.
        assert_eq!(split(64, 10, 256, 16).parts, 1);
        // No slice narrower than 16, however many threads.
        assert_eq!(split(40, 40, 100_000, 16).parts, 2);
        // A one-thread pool, and degenerate sizes, give one slice of the whole dimension.
        assert_eq!(split(64, 256, 784, 1).parts, 1);
        assert_eq!(
            split(1, 1, 1, 16),
            Split {
                by_rows: false,
                parts: 1,
                width: 1
            }
        );
    }
}
