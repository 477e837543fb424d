//! Gradient buckets as PyTorch's `DistributedDataParallel` forms them: which parameters'
//! gradients are all-reduced together, and in which order.
//!
//! Note [DDP buckets]: DDP all-reduces gradients in buckets so that communication overlaps the
//! rest of backward. The assignment is `compute_bucket_assignment_by_size` in
//! `torch/csrc/distributed/c10d/reducer.cpp`
//! (<https://github.com/pytorch/pytorch/blob/main/torch/csrc/distributed/c10d/reducer.cpp>),
//! reproduced by [`assign_buckets`]: parameters are taken in the order given and appended to the
//! open bucket; when the bucket's size reaches the current limit (`size >= limit`, tested
//! *after* appending) it is closed and the limit moves to the next of `limits` (the last one
//! repeats). So a bucket can exceed its limit by its last parameter, and a parameter larger than
//! a bucket closes the bucket it lands in: it is alone only when that bucket was empty (the
//! first parameter, or the one after a closed bucket). That is PyTorch's rule; berth keeps it
//! rather than a stricter "large parameters alone", so bucket lists match PyTorch's.
//!
//! DDP's order ([`ddp_buckets`]): gradients of a model used in definition order become ready in
//! *reverse* definition order during backward, and DDP's buckets (the ones its reducer rebuilds
//! after the first iteration from the order gradients became ready, and its initial ones under
//! `find_unused_parameters`) follow that order, with limits `[first_bucket_bytes,
//! bucket_cap]`: a small first bucket (1 MiB, `dist._DEFAULT_FIRST_BUCKET_BYTES`) launches its
//! all-reduce early, then 25 MiB buckets (`bucket_cap_mb=25`). Setting `bucket_cap_mb`
//! explicitly makes the first bucket that size too, as in PyTorch 2.15's
//! `torch/nn/parallel/distributed.py`
//! (<https://github.com/pytorch/pytorch/blob/main/torch/nn/parallel/distributed.py>).
//! PyTorch also keeps one bucket list per (dtype, device); berth's data-parallel parameters are
//! one dtype on one device per rank, so one list is formed. Tests compare against
//! `torch.distributed._compute_bucket_assignment_by_size` run by PyTorch 2.15.

use crate::error::{DistError, Result};

/// One MiB in bytes (PyTorch's `_MB_TO_BYTES`: DDP's "MB" are MiB).
pub const MIB: usize = 1024 * 1024;

/// DDP's first-bucket limit, in bytes (`dist._DEFAULT_FIRST_BUCKET_BYTES`, 1 MiB).
pub const DEFAULT_FIRST_BUCKET_BYTES: usize = MIB;

/// DDP's bucket limit, in MiB (`bucket_cap_mb`'s default, 25).
pub const DEFAULT_BUCKET_CAP_MB: f64 = 25.0;

/// One bucket: parameter indices in the order their gradients are packed, and the limit it
/// was formed under.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    /// Indices into the parameter list given, in packing order.
    pub params: Vec<usize>,
    /// Sum of the parameters' sizes, in bytes.
    pub size_bytes: usize,
    /// The limit the bucket was formed under, in bytes.
    pub limit_bytes: usize,
}

/// PyTorch's `compute_bucket_assignment_by_size` for one dtype and device: `sizes_bytes[i]` is
/// parameter `i`'s gradient size in bytes, taken in index order; `limits_bytes` the successive
/// bucket limits, the last repeating (Note [DDP buckets]). Buckets come back in the order they
/// were formed, each holding consecutive indices.
///
/// # Errors
/// [`DistError::InvalidBucketOption`] when `limits_bytes` is empty or holds a 0.
///
/// # Examples
/// ```
/// use berth_distributed::bucket::{assign_buckets, MIB};
///
/// let buckets = assign_buckets(&[MIB / 2, MIB / 2, MIB, 30 * MIB, 4], &[MIB, 25 * MIB])?;
/// let params: Vec<_> = buckets.iter().map(|b| b.params.clone()).collect();
/// assert_eq!(params, [vec![0, 1], vec![2, 3], vec![4]]);
/// # Ok::<(), berth_distributed::DistError>(())
/// ```
pub fn assign_buckets(sizes_bytes: &[usize], limits_bytes: &[usize]) -> Result<Vec<Bucket>> {
    if limits_bytes.is_empty() || limits_bytes.contains(&0) {
        return Err(DistError::InvalidBucketOption {
            option: "bucket_size_limits",
            message: format!(
                "limits must be at least one positive byte count, got {limits_bytes:?}"
            ),
        });
    }
    let mut buckets = Vec::new();
    let mut limit_index = 0;
    let mut open = Bucket {
        params: Vec::new(),
        size_bytes: 0,
        limit_bytes: limits_bytes[0],
    };
    for (i, &size) in sizes_bytes.iter().enumerate() {
        open.params.push(i);
        open.size_bytes = open.size_bytes.saturating_add(size);
        if open.size_bytes >= open.limit_bytes {
            limit_index = (limit_index + 1).min(limits_bytes.len() - 1);
            let next = Bucket {
                params: Vec::new(),
                size_bytes: 0,
                limit_bytes: limits_bytes[limit_index],
            };
            buckets.push(std::mem::replace(&mut open, next));
        }
    }
    if !open.params.is_empty() {
        buckets.push(open);
    }
    Ok(buckets)
}

/// DDP's bucket options (`bucket_cap_mb`, and the first bucket's limit); the default is
/// PyTorch's (25 MiB buckets after a 1 MiB first one).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct BucketOptions {
    /// The bucket limit in MiB (`bucket_cap_mb`); `None` is PyTorch's default, 25, with a
    /// 1 MiB first bucket.
    pub bucket_cap_mb: Option<f64>,
    /// The first bucket's limit in bytes; `None` is PyTorch's rule: 1 MiB with the default
    /// `bucket_cap_mb`, the bucket limit when `bucket_cap_mb` is given.
    pub first_bucket_bytes: Option<usize>,
}

impl BucketOptions {
    /// The limits, in bytes, that [`ddp_buckets`] forms buckets under: `[first, cap]`, or
    /// `[cap]` when the first is not smaller (PyTorch's `compute_bucket_size_limits`).
    ///
    /// # Errors
    /// [`DistError::InvalidBucketOption`] when `bucket_cap_mb` is not a positive finite
    /// number of MiB under 2⁴⁰ (whose bytes fit), or `first_bucket_bytes` is 0.
    pub fn limits_bytes(&self) -> Result<Vec<usize>> {
        let cap_mb = self.bucket_cap_mb.unwrap_or(DEFAULT_BUCKET_CAP_MB);
        if !(cap_mb.is_finite() && cap_mb > 0.0 && cap_mb < (1u64 << 40) as f64) {
            return Err(DistError::InvalidBucketOption {
                option: "bucket_cap_mb",
                message: format!(
                    "{cap_mb} is not a positive size in MiB; DDP's default is {DEFAULT_BUCKET_CAP_MB}"
                ),
            });
        }
        // int(bucket_cap_mb * _MB_TO_BYTES), truncating as Python's int().
        let cap = ((cap_mb * MIB as f64) as usize).max(1);
        let first = match (self.first_bucket_bytes, self.bucket_cap_mb) {
            (Some(0), _) => {
                return Err(DistError::InvalidBucketOption {
                    option: "first_bucket_bytes",
                    message: format!(
                        "0 bytes; use a positive limit such as DDP's {DEFAULT_FIRST_BUCKET_BYTES}"
                    ),
                })
            }
            (Some(first), _) => first,
            (None, None) => DEFAULT_FIRST_BUCKET_BYTES,
            (None, Some(_)) => cap,
        };
        Ok(if first < cap {
            vec![first, cap]
        } else {
            vec![cap]
        })
    }
}

/// DDP's buckets for parameters of `sizes_bytes` (in definition order, bytes each): formed in
/// reverse definition order, the order backward makes gradients ready (Note [DDP buckets]).
/// Bucket 0 is the first to fill and launch; indices are definition-order indices.
///
/// # Errors
/// As [`BucketOptions::limits_bytes`].
///
/// # Examples
/// ```
/// use berth_distributed::bucket::{ddp_buckets, BucketOptions};
///
/// // A 784-512-512-10 MLP in f32: weight, bias, weight, bias, weight, bias.
/// let sizes = [784 * 512 * 4, 512 * 4, 512 * 512 * 4, 512 * 4, 512 * 10 * 4, 10 * 4];
/// let buckets = ddp_buckets(&sizes, BucketOptions::default())?;
/// let params: Vec<_> = buckets.iter().map(|b| b.params.clone()).collect();
/// assert_eq!(params, [vec![5, 4, 3, 2], vec![1, 0]]);
/// # Ok::<(), berth_distributed::DistError>(())
/// ```
pub fn ddp_buckets(sizes_bytes: &[usize], options: BucketOptions) -> Result<Vec<Bucket>> {
    let limits = options.limits_bytes()?;
    let n = sizes_bytes.len();
    let reversed: Vec<usize> = sizes_bytes.iter().rev().copied().collect();
    let mut buckets = assign_buckets(&reversed, &limits)?;
    for b in &mut buckets {
        for p in &mut b.params {
            *p = n - 1 - *p;
        }
    }
    Ok(buckets)
}
