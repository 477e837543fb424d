//! Row-wise kernels: softmax / log-softmax over the last dimension, mean cross-entropy and its
//! gradient, and random fills. Rows are computed in `f64` and run in parallel on rayon.

use rayon::prelude::*;

use super::{with_repr, In, Num, Scalar, PAR_MIN};
use crate::device_kernels::{RandomDist, View};
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

/// Mean cross-entropy (`backward == false`, into a 0-dim `dst`) or its gradient w.r.t. the
/// logits (`backward == true`, into `[N, C]`).
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
    if let Some(&bad) = tg.iter().find(|&&v| v < 0 || v as usize >= classes) {
        return Err(Error::InvalidArgument {
            op,
            what: format!(
                "Target {bad} is out of bounds: expected class indices in [0, {classes})"
            ),
        });
    }
    let mut w = dst.storage.write_host(op)?;
    let off = dst.layout.offset();
    with_repr!(logits.dtype, T => {
        let x = s.typed::<T>();
        if backward {
            let out = &mut w.typed_mut::<T>()[off..off + batch * classes];
            let body = |(r, row): (usize, &mut [T])| {
                let (max, lse) = row_stats(x, starts[r], classes, stride);
                for (j, o) in row.iter_mut().enumerate() {
                    let p = (x[starts[r] + j * stride].to_c().to_f64() - max - lse).exp();
                    let g = (p - f64::from(u8::from(j as i64 == tg[r]))) / batch as f64;
                    *o = T::from_c(<T as Num>::C::from_f64(g));
                }
            };
            if batch * classes >= PAR_MIN {
                out.par_chunks_mut(classes.max(1)).enumerate().for_each(body);
            } else {
                out.chunks_mut(classes.max(1)).enumerate().for_each(body);
            }
        } else {
            let total: f64 = (0..batch)
                .into_par_iter()
                .map(|r| {
                    let (max, lse) = row_stats(x, starts[r], classes, stride);
                    max + lse - x[starts[r] + tg[r] as usize * stride].to_c().to_f64()
                })
                .sum();
            // PyTorch: the mean over an empty batch is NaN.
            w.typed_mut::<T>()[off] = T::from_c(<T as Num>::C::from_f64(total / batch as f64));
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
