//! Reductions (sum, mean, max, min, argmax) over any set of dimensions.
//!
//! Values are accumulated in their [`Wide`] type (Note [Exact integers]): floats in `f64`,
//! integers and bool in `i64`, whose sums wrap as PyTorch's int64 sums do and whose max, min
//! and argmax compare exactly. NaN propagates through max/min/argmax and the first index
//! wins ties, as PyTorch on the CPU.

use rayon::prelude::*;

use super::{with_repr, In, Num, Scalar, Wide, PAR_MIN};
use crate::device_kernels::interface::View;
use crate::ops::ReduceOp;
use crate::storage::HostWrite;
use crate::{Layout, Result};

const NONE: usize = usize::MAX;

/// The accumulator of a source element type.
type Acc<T> = <<T as Num>::C as Scalar>::Wide;

#[derive(Clone, Copy)]
struct State<W> {
    acc: W,
    idx: usize,
}

#[inline]
fn init<W: Wide>(op: ReduceOp) -> State<W> {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => State {
            acc: W::ZERO,
            idx: 0,
        },
        _ => State {
            acc: W::ZERO,
            idx: NONE,
        },
    }
}

/// Whether `new` replaces `cur` for max-like (`max == true`) or min-like selection.
#[inline]
fn better<W: Wide>(cur: State<W>, new: State<W>, max: bool) -> bool {
    if new.idx == NONE {
        return false;
    }
    if cur.idx == NONE {
        return true;
    }
    if cur.acc.is_nan() {
        return false;
    }
    new.acc.is_nan()
        || if max {
            new.acc > cur.acc
        } else {
            new.acc < cur.acc
        }
}

#[inline]
fn step<W: Wide>(op: ReduceOp, s: State<W>, v: W, i: usize) -> State<W> {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => State {
            acc: s.acc.add(v),
            idx: 0,
        },
        ReduceOp::Max | ReduceOp::ArgMax => {
            if better(s, State { acc: v, idx: i }, true) {
                State { acc: v, idx: i }
            } else {
                s
            }
        }
        ReduceOp::Min => {
            if better(s, State { acc: v, idx: i }, false) {
                State { acc: v, idx: i }
            } else {
                s
            }
        }
    }
}

#[inline]
fn combine<W: Wide>(op: ReduceOp, l: State<W>, r: State<W>) -> State<W> {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => State {
            acc: l.acc.add(r.acc),
            idx: 0,
        },
        ReduceOp::Max | ReduceOp::ArgMax => {
            if better(l, r, true) {
                r
            } else {
                l
            }
        }
        ReduceOp::Min => {
            if better(l, r, false) {
                r
            } else {
                l
            }
        }
    }
}

#[inline]
fn finish<W: Wide>(op: ReduceOp, s: State<W>, count: usize) -> W {
    match op {
        ReduceOp::Sum => s.acc,
        ReduceOp::Mean => s.acc.div_count(count),
        ReduceOp::Max | ReduceOp::Min => s.acc,
        ReduceOp::ArgMax => W::from_index(s.idx),
    }
}

fn fold_slice<T: Num>(op: ReduceOp, xs: &[T], base: usize) -> State<Acc<T>> {
    xs.iter().enumerate().fold(init(op), |s, (i, x)| {
        step(op, s, x.to_c().widen(), base + i)
    })
}

/// `out[j] = Σ_r xs[r·inner + j]` for a dense `[rows, inner]` source (`inner = out.len()`):
/// the sum over leading dimensions (a bias gradient's `sum_dim(0)`), added one source row at a
/// time so the loop runs along contiguous memory and vectorises. Each output sums its
/// elements in the same order (rows ascending, in the [`Wide`] type) as the strided walk, so
/// the result is the same to the bit; wide outputs are split over rayon by column blocks.
fn sum_leading<T: Num>(out: &mut [Acc<T>], xs: &[T], rows: usize) {
    let inner = out.len();
    out.fill(Acc::<T>::ZERO);
    if inner == 0 {
        return;
    }
    let block = |(c, o): (usize, &mut [Acc<T>])| {
        let j0 = c * COLUMN_BLOCK;
        for r in 0..rows {
            let row = &xs[r * inner + j0..r * inner + j0 + o.len()];
            for (acc, x) in o.iter_mut().zip(row) {
                *acc = acc.add(x.to_c().widen());
            }
        }
    };
    if rows * inner >= PAR_MIN && inner > COLUMN_BLOCK {
        out.par_chunks_mut(COLUMN_BLOCK).enumerate().for_each(block);
    } else {
        block((0, out));
    }
}

/// Outputs per rayon task of [`sum_leading`].
const COLUMN_BLOCK: usize = 1 << 10;

/// # Errors
/// [`crate::Error::HostOutOfMemory`] when the index lists (as many as the elements reduced
/// and kept) cannot be had.
fn reduce_typed<T: Num>(
    op: ReduceOp,
    out: &mut [Acc<T>],
    src: &[T],
    l: &Layout,
    dims: &[usize],
) -> Result<()> {
    let rank = l.rank();
    let kept: Vec<usize> = (0..rank).filter(|d| !dims.contains(d)).collect();
    let count: usize = dims.iter().map(|&d| l.shape()[d]).product();
    if l.numel() == 0 {
        // Nothing to read (an empty view may even start past its storage): every output
        // reduces nothing, as PyTorch's `sum` of an empty tensor is 0 and its `mean` NaN.
        out.iter_mut()
            .for_each(|o| *o = finish(op, init(op), count));
        return Ok(());
    }
    if kept.is_empty() && l.is_contiguous() {
        // Full reduction of a dense tensor: parallel over chunks of the slice.
        let xs = &src[l.offset()..l.offset() + count];
        let s = if count >= PAR_MIN {
            xs.par_chunks(1 << 14)
                .enumerate()
                .map(|(c, ch)| fold_slice(op, ch, c << 14))
                .reduce(|| init(op), |a, b| combine(op, a, b))
        } else {
            fold_slice(op, xs, 0)
        };
        out[0] = finish(op, s, count);
        return Ok(());
    }
    let leading = dims.len() < rank && dims.iter().enumerate().all(|(i, &d)| d == i);
    if leading && l.is_contiguous() && matches!(op, ReduceOp::Sum | ReduceOp::Mean) {
        sum_leading(out, &src[l.offset()..l.offset() + l.numel()], count);
        out.iter_mut()
            .for_each(|o| *o = finish(op, State { acc: *o, idx: 0 }, count));
        return Ok(());
    }
    let pick = |ds: &[usize], v: &[usize]| ds.iter().map(|&d| v[d]).collect::<Vec<_>>();
    let kept_l = Layout::from_parts(pick(&kept, l.shape()), pick(&kept, l.strides()), l.offset());
    let red_l = Layout::from_parts(pick(dims, l.shape()), pick(dims, l.strides()), 0);
    let red = super::try_collect(red_l.numel(), red_l.indices())?;
    let starts = super::try_collect(kept_l.numel(), kept_l.indices())?;
    let one = |o: usize| {
        let base = starts[o];
        let s = red.iter().enumerate().fold(init(op), |s, (i, &r)| {
            step(op, s, src[base + r].to_c().widen(), i)
        });
        finish(op, s, count)
    };
    if starts.len() * count >= PAR_MIN && starts.len() > 1 {
        out.par_iter_mut()
            .enumerate()
            .for_each(|(o, x)| *x = one(o));
    } else {
        out.iter_mut().enumerate().for_each(|(o, x)| *x = one(o));
    }
    Ok(())
}

pub(crate) fn reduce(op: ReduceOp, dst: View<'_>, src: View<'_>, dims: &[usize]) -> Result<()> {
    let s = In::new(src, op.name())?;
    let mut w = dst.storage.write_host(op.name())?;
    let n = dst.layout.numel();
    // Values go through the source's `Wide` type: one dispatch on the source, one on the
    // destination for each of the two `Wide` types.
    with_repr!(src.dtype, T => {
        let mut vals = super::try_vec(n, Acc::<T>::ZERO)?;
        reduce_typed::<T>(op, &mut vals, s.typed::<T>(), src.layout, dims)?;
        store(&mut w, dst, &vals);
    });
    Ok(())
}

/// Writes `vals` into the dense `dst`, converted to its dtype ([`Wide::store`]).
fn store<W: Wide>(w: &mut HostWrite<'_>, dst: View<'_>, vals: &[W]) {
    let (off, n) = (dst.layout.offset(), dst.layout.numel());
    with_repr!(dst.dtype, O => {
        for (o, &x) in w.typed_mut::<O>()[off..off + n].iter_mut().zip(vals) {
            *o = x.store::<O>();
        }
    });
}
