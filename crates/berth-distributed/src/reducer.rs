//! `Reducer`: `DistributedDataParallel`'s gradient reduction — gradients copied into
//! per-bucket flat buffers as backward produces them, each bucket's sum all-reduce launched
//! the moment its last gradient arrives, in bucket order, and all of them waited before the
//! optimizer step (PyTorch's `torch/csrc/distributed/c10d/reducer.cpp`; the model is
//! described in <https://pytorch.org/docs/stable/notes/ddp.html>).
//!
//! Note [Gradient averaging]: DDP averages gradients over the ranks by *dividing each gradient
//! by the world size as it is copied into its bucket*, then summing the buckets (reducer.cpp's
//! `mark_variable_ready_dense`: `at::mul_out(bucket_view, grad, 1 / div_factor)`). With every
//! rank's loss a mean over its local batch of `B / world_size` samples, the result is the mean
//! over the global batch of `B`, the gradient one process would compute on that batch: the
//! "same global batch semantics as one GPU". berth does the same (a copy, then an in-place
//! scale, skipped for one rank), so a world size of 2 scales by an exact ½.
//!
//! Note [Bucket launch order]: buckets come from [`ddp_buckets`] (reverse parameter order,
//! a small first bucket; Note [DDP buckets]), so a backward that produces the last layer's
//! gradients first fills bucket 0 first. A bucket is launched when all its gradients are in
//! *and* every earlier bucket has been launched, as reducer.cpp's `mark_bucket_ready` does
//! (`next_bucket_`): every rank then issues the same collectives in the same order, which
//! NCCL requires, even when backward makes gradients ready in a different order on some rank.
//!
//! Note [Bucket buffer lifetime]: only the bucket buffers cross from the compute stream to the
//! communication stream. A gradient is copied into its bucket *on the compute stream* and may
//! be freed right after (its memory is reused in compute-stream order, so the copy has read it
//! first); the all-reduce then waits an event recorded on the compute stream after the copy
//! (Note [Collective stream ordering]). The buckets are allocated once, in
//! [`Reducer::new`], and live as long as the reducer, so the caching allocator never sees them
//! freed while a collective uses them; within a step, the [`Work`](crate::Work) of each
//! launched bucket holds a reference until [`finish`](Reducer::finish) makes the compute stream
//! wait the collective's end event, after which the optimizer reads the averaged gradients and
//! the next step's copies overwrite the buckets, both in compute-stream order. That is FSDP2's
//! reference-until-`wait_event` rule, not `record_stream`: `record_stream` would only matter for
//! a buffer freed while a collective may still use it, which never happens here, and it would
//! cost an event per block and keep freed blocks reserved until the allocator sees those
//! events complete (the memory growth that made FSDP2 drop it).

use berth::{DType, Tensor};

use crate::bucket::{ddp_buckets, Bucket, BucketOptions};
use crate::communicator::{Communicator, PendingWork};
use crate::error::{DistError, Result};

/// Where one parameter's gradient lives: its bucket and its view of that bucket.
#[derive(Debug)]
struct Slot {
    bucket: usize,
    /// The parameter's shape, viewing its span of the bucket's flat buffer.
    view: Tensor,
}

/// DDP's bucketed gradient all-reduce over a [`Communicator`] (Notes [Gradient averaging],
/// [Bucket launch order], [Bucket buffer lifetime]). One step: [`mark_ready`](Self::mark_ready)
/// for each parameter's gradient as backward produces it, then [`finish`](Self::finish), which
/// gives the averaged gradients for the optimizer.
#[derive(Debug)]
pub struct Reducer<'c, C: Communicator> {
    comm: &'c C,
    buckets: Vec<Bucket>,
    /// One flat `f32` buffer per bucket, on the parameters' device.
    flat: Vec<Tensor>,
    slots: Vec<Slot>,
    /// Gradients still missing, per bucket, this step.
    missing: Vec<usize>,
    ready: Vec<bool>,
    /// The next bucket to launch this step.
    next: usize,
    works: Vec<C::Work>,
}

impl<'c, C: Communicator> Reducer<'c, C> {
    /// A reducer for `params` (in definition order: `fc1.weight, fc1.bias, …`), bucketed by
    /// [`ddp_buckets`] under `options`, with one flat buffer per bucket allocated now on the
    /// parameters' device.
    ///
    /// # Errors
    /// [`DistError::Reduction`] when `params` is empty, or its tensors are not all `f32` on
    /// one device; [`DistError::InvalidBucketOption`]; [`DistError::Tensor`] when allocating
    /// the buffers fails.
    pub fn new(comm: &'c C, params: &[&Tensor], options: BucketOptions) -> Result<Self> {
        let Some(first) = params.first() else {
            return Err(DistError::Reduction {
                what: "no parameters to reduce; give the model's parameters in definition order"
                    .into(),
            });
        };
        let device = first.device();
        if let Some((i, p)) = params
            .iter()
            .enumerate()
            .find(|(_, p)| p.dtype() != DType::F32 || p.device() != device)
        {
            return Err(DistError::Reduction {
                what: format!(
                    "parameter {i} is {:?} on {}; every parameter must be f32 on {device}, as parameter 0",
                    p.dtype(),
                    p.device()
                ),
            });
        }
        let sizes: Vec<usize> = params.iter().map(|p| p.numel() * 4).collect();
        let buckets = ddp_buckets(&sizes, options)?;
        let mut flat = Vec::with_capacity(buckets.len());
        let mut slots: Vec<Option<Slot>> = params.iter().map(|_| None).collect();
        for (b, bucket) in buckets.iter().enumerate() {
            let buf = Tensor::zeros(&[bucket.size_bytes / 4], DType::F32, device)?;
            let mut offset = 0;
            for &i in &bucket.params {
                let n = params[i].numel();
                let view = buf.narrow(0, offset, n)?.view(params[i].shape())?;
                slots[i] = Some(Slot { bucket: b, view });
                offset += n;
            }
            flat.push(buf);
        }
        let slots = slots
            .into_iter()
            .map(|s| s.expect("ddp_buckets places every parameter in one bucket"))
            .collect();
        let missing = buckets.iter().map(|b| b.params.len()).collect();
        Ok(Reducer {
            comm,
            ready: vec![false; params.len()],
            buckets,
            flat,
            slots,
            missing,
            next: 0,
            works: Vec::new(),
        })
    }

    /// The buckets, in launch order (bucket 0 first), with definition-order indices.
    pub fn buckets(&self) -> &[Bucket] {
        &self.buckets
    }

    /// Takes parameter `index`'s gradient (its shape, on its device; this rank's mean over its
    /// local batch): copies it, divided by the world size, into its bucket, and launches every
    /// bucket that is now complete and next in order (Note [Bucket launch order]). `grad` may
    /// be dropped when this returns (Note [Bucket buffer lifetime]).
    ///
    /// # Errors
    /// [`DistError::Reduction`] for an index that is not a parameter, a gradient marked twice
    /// in one step, or one of the wrong shape; the communicator's errors when a launch fails.
    pub fn mark_ready(&mut self, index: usize, grad: &Tensor) -> Result<()> {
        let Some(slot) = self.slots.get(index) else {
            return Err(DistError::Reduction {
                what: format!(
                    "parameter {index} does not exist; the model has {} parameters",
                    self.slots.len()
                ),
            });
        };
        if self.ready[index] {
            return Err(DistError::Reduction {
                what: format!(
                    "parameter {index}'s gradient was marked ready twice in one step; call finish() before the next step's backward"
                ),
            });
        }
        if grad.shape() != slot.view.shape() {
            return Err(DistError::Reduction {
                what: format!(
                    "parameter {index}'s gradient has shape {:?}; the parameter has shape {:?}",
                    grad.shape(),
                    slot.view.shape()
                ),
            });
        }
        slot.view.copy_(grad)?;
        let world = self.comm.world_size();
        if world > 1 {
            slot.view.mul_scalar_(1.0 / world as f64)?;
        }
        self.ready[index] = true;
        self.missing[slot.bucket] -= 1;
        while self.next < self.buckets.len() && self.missing[self.next] == 0 {
            let work = self.comm.all_reduce_sum(&self.flat[self.next])?;
            self.works.push(work);
            self.next += 1;
        }
        Ok(())
    }

    /// Ends the step: waits every bucket's all-reduce (the compute stream waits; the host does
    /// not) and returns the averaged gradients, in definition order, as views of the buckets
    /// (DDP's `gradient_as_bucket_view`). They are overwritten by the next step's
    /// [`mark_ready`](Self::mark_ready) calls.
    ///
    /// # Errors
    /// [`DistError::Reduction`] naming the parameters whose gradients were never marked ready
    /// (PyTorch: "Expected to have finished reduction in the prior iteration"); the
    /// communicator's errors.
    pub fn finish(&mut self) -> Result<Vec<&Tensor>> {
        if self.next < self.buckets.len() {
            let missing: Vec<usize> = (0..self.ready.len()).filter(|&i| !self.ready[i]).collect();
            return Err(DistError::Reduction {
                what: format!(
                    "the step ended before parameter(s) {missing:?} had gradients; mark every parameter's gradient ready (DDP's find_unused_parameters is not supported)"
                ),
            });
        }
        for work in self.works.drain(..) {
            work.wait()?;
        }
        self.next = 0;
        self.ready.iter_mut().for_each(|r| *r = false);
        for (m, b) in self.missing.iter_mut().zip(&self.buckets) {
            *m = b.params.len();
        }
        Ok(self.slots.iter().map(|s| &s.view).collect())
    }
}

/// Copies rank 0's parameters into every rank's (DDP's `_sync_module_states` at
/// construction), each in place, in definition order.
///
/// # Errors
/// The communicator's errors.
pub fn broadcast_parameters<C: Communicator>(comm: &C, params: &[&Tensor]) -> Result<()> {
    for p in params {
        comm.broadcast(p, 0)?;
    }
    Ok(())
}
