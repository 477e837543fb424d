//! Row-wise kernels: softmax / log-softmax over the last dimension, mean cross-entropy and its
//! gradient, and random fills. Rows are computed in `f64` and run in parallel on rayon.

use rayon::prelude::*;

use super::{with_repr, In, Num, Scalar, PAR_MIN};
use crate::device_kernels::interface::{RandomDist, View};
use crate::{DType, Error, Layout, Result};

/// Row start offsets, row length and in-row stride of a layout whose last dim is the row.
///
/// # Errors
/// [`crate::Error::HostOutOfMemory`] when the list of row starts cannot be had.
fn rows(l: &Layout) -> Result<(Vec<usize>, usize, usize)> {
    let r = l.rank();
    let outer = Layout::from_parts(
        l.shape()[..r - 1].to_vec(),
        l.strides()[..r - 1].to_vec(),
        l.offset(),
    );
    Ok((
        super::try_collect(outer.numel(), outer.indices())?,
        l.shape()[r - 1],
        l.strides()[r - 1],
    ))
}

/// `(max, log(sum(exp(x - max))))` of one row.
fn row_stats<T: Num>(x: &[T], start: usize, len: usize, stride: usize) -> (f64, f64) {
    let v = |j: usize| x[start + j * stride].to_c().to_f64();
    let max = (0..len).map(v).fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = (0..len).map(|j| (v(j) - max).exp()).sum();
    (max, sum.ln())
}

pub(crate) fn softmax(dst: View<'_>, src: View<'_>, log: bool) -> Result<()> {
    let op = if log { "log_softmax" } else { "softmax" };
    let s = In::new(src, op)?;
    let mut w = dst.storage.write_host(op)?;
    let (starts, len, stride) = rows(src.layout)?;
    if len == 0 {
        return Ok(());
    }
    let (off, n) = (dst.layout.offset(), dst.layout.numel());
    with_repr!(src.dtype, T => {
        let x = s.typed::<T>();
        let out = &mut w.typed_mut::<T>()[off..off + n];
        let body = |(r, row): (usize, &mut [T])| {
            let (max, lse) = row_stats(x, starts[r], len, stride);
            for (j, o) in row.iter_mut().enumerate() {
                let z = x[starts[r] + j * stride].to_c().to_f64() - max - lse;
                *o = T::from_c(<T as Num>::C::from_f64(if log { z } else { z.exp() }));
            }
        };
        if n >= PAR_MIN {
            out.par_chunks_mut(len).enumerate().for_each(body);
        } else {
            out.chunks_mut(len).enumerate().for_each(body);
        }
    });
    Ok(())
}

/// PyTorch's default `ignore_index` of `F.cross_entropy`: rows with this target are skipped.
pub(crate) const IGNORE_INDEX: i64 = -100;

/// Mean cross-entropy (`backward == false`, into a 0-dim `dst`) or its gradient w.r.t. the
/// logits (`backward == true`, into `[N, C]`). Rows whose target is [`IGNORE_INDEX`] add no
/// loss and get a zero gradient, and the mean is over the other rows (NaN when there are
/// none), as PyTorch's `ignore_index=-100`.
pub(crate) fn cross_entropy(
    dst: View<'_>,
    logits: View<'_>,
    targets: View<'_>,
    backward: bool,
) -> Result<()> {
    let op = if backward {
        "cross_entropy_backward"
    } else {
        "cross_entropy"
    };
    let s = In::new(logits, op)?;
    let t = In::new(targets, op)?;
    let (starts, classes, stride) = rows(logits.layout)?;
    let batch = starts.len();
    let tg: Vec<i64> = super::try_collect(
        targets.layout.numel(),
        targets.layout.indices().map(|i| t.typed::<i64>()[i]),
    )?;
    if let Some(&bad) = tg
        .iter()
        .find(|&&v| v != IGNORE_INDEX && (v < 0 || v as usize >= classes))
    {
        return Err(Error::InvalidArgument {
            op,
            what: format!(
                "Target {bad} is out of bounds: expected class indices in [0, {classes}), or {IGNORE_INDEX} (ignore_index) to skip a sample"
            ),
        });
    }
    // The mean is over the rows that are not ignored.
    let counted = tg.iter().filter(|&&v| v != IGNORE_INDEX).count() as f64;
    let mut w = dst.storage.write_host(op)?;
    let off = dst.layout.offset();
    let parallel = batch * classes >= PAR_MIN;
    with_repr!(logits.dtype, T => {
        let x = s.typed::<T>();
        if backward {
            let out = &mut w.typed_mut::<T>()[off..off + batch * classes];
            // Each row's `exp(x - max)` is computed once, into `e`, and divided by its sum:
            // one `exp` an element (the log-sum-exp form took two and a `ln`, and most of
            // the 18 µs of the main job's `[64, 10]`).
            let body = |e: &mut Vec<f64>, (r, row): (usize, &mut [T])| {
                if tg[r] == IGNORE_INDEX {
                    row.fill(T::default());
                    return;
                }
                let v = |j: usize| x[starts[r] + j * stride].to_c().to_f64();
                let max = (0..classes).map(v).fold(f64::NEG_INFINITY, f64::max);
                e.clear();
                e.extend((0..classes).map(|j| (v(j) - max).exp()));
                let sum: f64 = e.iter().sum();
                for (j, (o, &ej)) in row.iter_mut().zip(e.iter()).enumerate() {
                    let g = (ej / sum - f64::from(u8::from(j as i64 == tg[r]))) / counted;
                    *o = T::from_c(<T as Num>::C::from_f64(g));
                }
            };
            if parallel {
                out.par_chunks_mut(classes.max(1))
                    .enumerate()
                    .for_each_init(|| Vec::with_capacity(classes), body);
            } else {
                let mut e = Vec::with_capacity(classes);
                out.chunks_mut(classes.max(1))
                    .enumerate()
                    .for_each(|r| body(&mut e, r));
            }
        } else {
            let loss = |r: usize| {
                if tg[r] == IGNORE_INDEX {
                    return 0.0;
                }
                let (max, lse) = row_stats(x, starts[r], classes, stride);
                max + lse - x[starts[r] + tg[r] as usize * stride].to_c().to_f64()
            };
            let total: f64 = if parallel {
                (0..batch).into_par_iter().map(loss).sum()
            } else {
                (0..batch).map(loss).sum()
            };
            // PyTorch: the mean over an empty batch, or one whose every row is ignored, is NaN.
            w.typed_mut::<T>()[off] = T::from_c(<T as Num>::C::from_f64(total / counted));
        }
    });
    Ok(())
}

pub(crate) fn random(dst: View<'_>, dist: RandomDist, seed: u64, offset: u64) -> Result<()> {
    let mut w = dst.storage.write_host("random")?;
    let (off, n) = (dst.layout.offset(), dst.layout.numel());
    with_repr!(dst.dtype, T => {
        let out = &mut w.typed_mut::<T>()[off..off + n];
        let sample = |i: usize| crate::random::sample(dist, seed, offset + i as u64);
        let body = |(c, ch): (usize, &mut [T])| {
            for (j, o) in ch.iter_mut().enumerate() {
                *o = T::from_c(<T as Num>::C::from_f64(sample(c * 4096 + j)));
            }
        };
        if n >= PAR_MIN {
            out.par_chunks_mut(4096).enumerate().for_each(body);
        } else {
            out.chunks_mut(4096).enumerate().for_each(body);
        }
    });
    let _ = DType::F32;
    Ok(())
}
