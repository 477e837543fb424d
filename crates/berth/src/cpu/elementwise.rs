//! Strided elementwise kernels: copy/cast, fill, unary, binary, scalar, compare.
//!
//! One engine, [`apply2`], walks a destination and two sources of the same shape: a flat
//! (rayon-parallel) path when all three are contiguous, else row by row over the last
//! dimension with per-row start offsets.

use rayon::prelude::*;

use super::{with_repr, In, Num, Scalar, Wide, PAR_MIN};
use crate::device_kernels::interface::View;
use crate::ops::{BinaryOp, CmpOp, UnaryOp};
use crate::storage::{HostWrite, Pod};
use crate::{DType, Layout, Result};

const CHUNK: usize = 1 << 14;

/// Row decomposition: start offset of each row, row length, stride inside a row.
fn rows(l: &Layout) -> (Vec<usize>, usize, usize) {
    let r = l.rank();
    if r == 0 {
        return (vec![l.offset()], 1, 0);
    }
    let outer = Layout::from_parts(
        l.shape()[..r - 1].to_vec(),
        l.strides()[..r - 1].to_vec(),
        l.offset(),
    );
    (
        outer.indices().collect(),
        l.shape()[r - 1],
        l.strides()[r - 1],
    )
}

/// `dst[i] = f(dst[i], a[i], b[i])` over equal shapes (layouts already broadcast).
pub(crate) fn apply2<D: Pod, A: Pod, B: Pod, F>(
    dst: &mut [D],
    dl: &Layout,
    a: &[A],
    al: &Layout,
    b: &[B],
    bl: &Layout,
    f: F,
) where
    F: Fn(D, A, B) -> D + Sync + Send,
{
    let n = dl.numel();
    if n == 0 {
        return;
    }
    if dl.is_contiguous() && al.is_contiguous() && bl.is_contiguous() {
        let d = &mut dst[dl.offset()..dl.offset() + n];
        let a = &a[al.offset()..al.offset() + n];
        let b = &b[bl.offset()..bl.offset() + n];
        let body = |((d, a), b): ((&mut [D], &[A]), &[B])| {
            for i in 0..d.len() {
                d[i] = f(d[i], a[i], b[i]);
            }
        };
        if n >= PAR_MIN {
            d.par_chunks_mut(CHUNK)
                .zip(a.par_chunks(CHUNK))
                .zip(b.par_chunks(CHUNK))
                .for_each(body);
        } else {
            body(((d, a), b));
        }
        return;
    }
    let (ds, inner, dstr) = rows(dl);
    let (as_, _, astr) = rows(al);
    let (bs, _, bstr) = rows(bl);
    if dl.is_contiguous() && dstr <= 1 {
        let d = &mut dst[dl.offset()..dl.offset() + n];
        let body =
            |(r, row): (usize, &mut [D])| row_apply(row, a, as_[r], astr, b, bs[r], bstr, &f);
        if n >= PAR_MIN {
            d.par_chunks_mut(inner).enumerate().for_each(body);
        } else {
            d.chunks_mut(inner).enumerate().for_each(body);
        }
        return;
    }
    for r in 0..ds.len() {
        let (d0, ao, bo) = (ds[r], as_[r], bs[r]);
        for j in 0..inner {
            let di = d0 + j * dstr;
            dst[di] = f(dst[di], a[ao + j * astr], b[bo + j * bstr]);
        }
    }
}

/// One dense destination row: `row[j] = f(row[j], a[ao + j·astr], b[bo + j·bstr])`.
///
/// The sources' in-row strides of a broadcast op are almost always 1 (a dense row) or 0 (one
/// value for the row: a bias, a column): those four cases run on slices, whose loops
/// vectorise (a `[64, 256] + [256]` bias add went from 15 to about 2 µs); any other stride
/// takes the indexed loop.
#[allow(clippy::too_many_arguments)]
#[inline]
fn row_apply<D: Pod, A: Pod, B: Pod, F>(
    row: &mut [D],
    a: &[A],
    ao: usize,
    astr: usize,
    b: &[B],
    bo: usize,
    bstr: usize,
    f: &F,
) where
    F: Fn(D, A, B) -> D,
{
    let len = row.len();
    match (astr, bstr) {
        (1, 1) => {
            for ((x, &y), &z) in row.iter_mut().zip(&a[ao..ao + len]).zip(&b[bo..bo + len]) {
                *x = f(*x, y, z);
            }
        }
        (1, 0) => {
            let z = b[bo];
            for (x, &y) in row.iter_mut().zip(&a[ao..ao + len]) {
                *x = f(*x, y, z);
            }
        }
        (0, 1) => {
            let y = a[ao];
            for (x, &z) in row.iter_mut().zip(&b[bo..bo + len]) {
                *x = f(*x, y, z);
            }
        }
        (0, 0) => {
            let (y, z) = (a[ao], b[bo]);
            for x in row.iter_mut() {
                *x = f(*x, y, z);
            }
        }
        _ => {
            for (j, x) in row.iter_mut().enumerate() {
                *x = f(*x, a[ao + j * astr], b[bo + j * bstr]);
            }
        }
    }
}

/// A one-element dummy source broadcast to `shape` (for ops with fewer real sources).
fn dummy(shape: &[usize]) -> Layout {
    Layout::from_parts(shape.to_vec(), vec![0; shape.len()], 0)
}

/// The conversion of an `f64` value into a dtype's compute domain (bool → 0/1).
#[inline]
fn conv(v: f64, to: DType) -> f64 {
    if to == DType::Bool {
        f64::from(u8::from(v != 0.0))
    } else {
        v
    }
}

/// A source value in its [`Wide`] type, converted into `to`'s domain (bool → 0/1).
#[inline]
fn conv_wide<W: Wide>(v: W, to: DType) -> W {
    if to == DType::Bool {
        v.to_bool()
    } else {
        v
    }
}

pub(crate) fn copy(dst: View<'_>, src: View<'_>) -> Result<()> {
    if dst.storage.id() == src.storage.id() {
        // Aliased copy: stage the source (PyTorch errors on some overlaps; staging is safe).
        let tmp = crate::Storage::try_host_from_bytes(src.storage.read_host("copy_")?.bytes())?;
        return copy(
            dst,
            View {
                storage: &tmp,
                ..src
            },
        );
    }
    let s = In::new(src, "copy_")?;
    let mut w = dst.storage.write_host("copy_")?;
    if src.dtype == dst.dtype {
        with_repr!(dst.dtype, T => {
            let a = s.typed::<T>();
            apply2::<T, T, T, _>(w.typed_mut::<T>(), dst.layout, a, src.layout, a, src.layout, |_, x, _| x);
        });
        return Ok(());
    }
    // A cast into a contiguous f32 destination from a contiguous source (masks and labels
    // made floats in training) is one direct pass: 8 instantiations, no staging buffer.
    // Integers convert straight from `i64` (one rounding, as C++'s cast).
    if dst.dtype == DType::F32 && dst.layout.is_contiguous() && src.layout.is_contiguous() {
        let n = dst.layout.numel();
        let (doff, soff) = (dst.layout.offset(), src.layout.offset());
        let d = &mut w.typed_mut::<f32>()[doff..doff + n];
        with_repr!(src.dtype, S => {
            let a = &s.typed::<S>()[soff..soff + n];
            for (o, x) in d.iter_mut().zip(a) {
                *o = x.to_c().widen().store::<f32>();
            }
        });
        return Ok(());
    }
    // Any other cast goes through the source's `Wide` type (f64 for floats, i64 for
    // integers: Note [Exact integers]) in two single-dispatch passes: read the source in
    // row-major order, then write the destination. The staging buffer is as large as the
    // tensor (8 bytes an element): allocated fallibly, like storage.
    let n = src.layout.numel();
    with_repr!(src.dtype, S => {
        let a = s.typed::<S>();
        let vals = super::try_collect(n, src.layout.indices().map(|i| conv_wide(a[i].to_c().widen(), dst.dtype)))?;
        write_cast(&mut w, dst, &vals);
    });
    Ok(())
}

/// Writes the row-major `vals` into `dst` (any strides), converted to its dtype.
fn write_cast<W: Wide>(w: &mut HostWrite<'_>, dst: View<'_>, vals: &[W]) {
    let dense = Layout::contiguous(dst.layout.shape());
    with_repr!(dst.dtype, D => {
        apply2::<D, W, W, _>(w.typed_mut::<D>(), dst.layout, vals, &dense, vals, &dense, |_, x, _| {
            x.store::<D>()
        });
    });
}

pub(crate) fn fill(dst: View<'_>, value: f64) -> Result<()> {
    let mut w = dst.storage.write_host("fill_")?;
    let value = conv(value, dst.dtype);
    with_repr!(dst.dtype, D => {
        let v = D::from_c(<D as Num>::C::from_f64(value));
        let one = [0u8];
        let l = dummy(dst.layout.shape());
        apply2::<D, u8, u8, _>(w.typed_mut::<D>(), dst.layout, &one, &l, &one, &l, |_, _, _| v);
    });
    Ok(())
}

/// Fill the dense host tensor `dst` with `start + i * step` (computed in f64, then converted
/// to `dst`'s dtype as [`copy`] converts: `torch.arange` into the output, no staging buffer).
pub(crate) fn arange(dst: View<'_>, start: f64, step: f64) -> Result<()> {
    let mut w = dst.storage.write_host("arange")?;
    with_repr!(dst.dtype, D => {
        let o = w.typed_mut::<D>();
        let n = dst.layout.numel().min(o.len());
        let f = |(i, o): (usize, &mut D)| {
            *o = D::from_c(<D as Num>::C::from_f64(conv(start + i as f64 * step, dst.dtype)));
        };
        if n >= PAR_MIN {
            o[..n].par_iter_mut().enumerate().for_each(f);
        } else {
            o[..n].iter_mut().enumerate().for_each(f);
        }
    });
    Ok(())
}

/// Runs `$body` with `$k` bound to `$op`, as a constant for each listed variant (the four
/// arithmetic ops, relu and neg, gt and eq): the per-element `match` on the op in
/// [`Scalar::binary`] (and its unary and comparison kin) then folds away and the loop
/// vectorises (with the op as a runtime value it stays in the loop: the SGD update of a
/// 784 × 256 weight took 2.9 ms a step on one core instead of about 0.1 ms).
macro_rules! with_const_op {
    ($op:expr, $ty:ident :: {$($v:ident),+}, $k:ident => $body:expr) => {
        match $op {
            $(
                $ty::$v => {
                    const $k: $ty = $ty::$v;
                    $body
                }
            )+
            #[allow(non_snake_case)]
            $k => $body,
        }
    };
}

pub(crate) fn unary(op: UnaryOp, dst: View<'_>, src: Option<View<'_>>) -> Result<()> {
    // Relu and Neg as constants, as for the arithmetic ops.
    with_const_op!(op, UnaryOp::{Relu, Neg}, K => with_repr!(dst.dtype, T => {
        let f = |x: T| T::from_c(<T as Num>::C::unary(K, x.to_c()));
        match src {
            Some(src) => {
                let s = In::new(src, op.name())?;
                let mut w = dst.storage.write_host(op.name())?;
                let a = s.typed::<T>();
                apply2(w.typed_mut::<T>(), dst.layout, a, src.layout, a, src.layout, |_, x, _| f(x));
            }
            None => {
                let mut w = dst.storage.write_host(op.name())?;
                let one = [0u8];
                let l = dummy(dst.layout.shape());
                apply2(w.typed_mut::<T>(), dst.layout, &one, &l, &one, &l, |d, _, _| f(d));
            }
        }
    }));
    Ok(())
}

pub(crate) fn binary(
    op: BinaryOp,
    dst: View<'_>,
    lhs: Option<View<'_>>,
    rhs: View<'_>,
) -> Result<()> {
    with_const_op!(op, BinaryOp::{Add, Sub, Mul, Div}, K => with_repr!(dst.dtype, T => {
        let f = |a: T, b: T| T::from_c(<T as Num>::C::binary(K, a.to_c(), b.to_c()));
        let r = In::new(rhs, op.name())?;
        let b = r.typed::<T>();
        match lhs {
            Some(lhs) => {
                let l = In::new(lhs, op.name())?;
                let mut w = dst.storage.write_host(op.name())?;
                apply2(w.typed_mut::<T>(), dst.layout, l.typed::<T>(), lhs.layout, b, rhs.layout, |_, x, y| f(x, y));
            }
            None => {
                let mut w = dst.storage.write_host(op.name())?;
                apply2(w.typed_mut::<T>(), dst.layout, b, rhs.layout, b, rhs.layout, |d, y, _| f(d, y));
            }
        }
    }));
    Ok(())
}

pub(crate) fn scalar(
    op: BinaryOp,
    dst: View<'_>,
    src: Option<View<'_>>,
    scalar: f64,
    scalar_first: bool,
) -> Result<()> {
    with_const_op!(op, BinaryOp::{Add, Sub, Mul, Div}, K => with_repr!(dst.dtype, T => {
        let s = <T as Num>::C::from_f64(scalar);
        // The operand order is chosen once, outside the loop.
        let first = move |x: T| T::from_c(<T as Num>::C::binary(K, s, x.to_c()));
        let second = move |x: T| T::from_c(<T as Num>::C::binary(K, x.to_c(), s));
        macro_rules! go {
            ($f:expr) => {{
                let f = $f;
                match src {
                    Some(src) => {
                        let r = In::new(src, op.name())?;
                        let mut w = dst.storage.write_host(op.name())?;
                        let a = r.typed::<T>();
                        apply2(w.typed_mut::<T>(), dst.layout, a, src.layout, a, src.layout, |_, x, _| f(x));
                    }
                    None => {
                        let mut w = dst.storage.write_host(op.name())?;
                        let one = [0u8];
                        let l = dummy(dst.layout.shape());
                        apply2(w.typed_mut::<T>(), dst.layout, &one, &l, &one, &l, |d, _, _| f(d));
                    }
                }
            }};
        }
        if scalar_first {
            go!(first)
        } else {
            go!(second)
        }
    }));
    Ok(())
}

#[inline]
fn cmp<C: PartialOrd>(op: CmpOp, a: C, b: C) -> u8 {
    u8::from(match op {
        CmpOp::Eq => a == b,
        CmpOp::Ne => a != b,
        CmpOp::Gt => a > b,
        CmpOp::Ge => a >= b,
        CmpOp::Lt => a < b,
        CmpOp::Le => a <= b,
    })
}

pub(crate) fn compare(
    op: CmpOp,
    dst: View<'_>,
    lhs: View<'_>,
    rhs: Option<View<'_>>,
    scalar: f64,
) -> Result<()> {
    let l = In::new(lhs, op.name())?;
    let r = rhs.map(|v| In::new(v, op.name())).transpose()?;
    let mut w = dst.storage.write_host(op.name())?;
    // Gt and Eq (the masks of relu's backward and of accuracy) as constants.
    with_const_op!(op, CmpOp::{Gt, Eq}, K => with_repr!(lhs.dtype, T => {
        let a = l.typed::<T>();
        match (&r, rhs) {
            (Some(r), Some(rv)) => {
                apply2(w.typed_mut::<u8>(), dst.layout, a, lhs.layout, r.typed::<T>(), rv.layout, |_, x, y| cmp(K, x.to_c(), y.to_c()));
            }
            _ => {
                let floaty = <T as Num>::C::IS_FLOAT;
                let exact = crate::ops::infer::integral_i64(scalar);
                if floaty {
                    let s = <T as Num>::C::from_f64(scalar);
                    apply2(w.typed_mut::<u8>(), dst.layout, a, lhs.layout, a, lhs.layout, |_, x, _| cmp(K, x.to_c(), s));
                } else if let Some(si) = exact {
                    // An integral scalar in i64's range: compared exactly (Note [Exact integers]).
                    let s = <T as Num>::C::from_i64(si);
                    apply2(w.typed_mut::<u8>(), dst.layout, a, lhs.layout, a, lhs.layout, |_, x, _| cmp(K, x.to_c(), s));
                } else {
                    // A fraction (only below 2^52 in size, where comparing in f64 is exact),
                    // NaN, ±inf, or an integral value past i64's range, which compares with
                    // every i64 as the infinity of its sign does.
                    let s = if scalar.is_finite() && scalar.fract() == 0.0 {
                        f64::INFINITY.copysign(scalar)
                    } else {
                        scalar
                    };
                    apply2(w.typed_mut::<u8>(), dst.layout, a, lhs.layout, a, lhs.layout, |_, x, _| cmp(K, x.to_c().to_f64(), s));
                }
            }
        }
    }));
    Ok(())
}
