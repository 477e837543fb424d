//! `Communicator`: what data-parallel training needs from a process group — a sum all-reduce
//! that may still be in flight when it returns, a broadcast, and the host-side rendezvous —
//! so that DDP's bucketed [`Reducer`](crate::reducer::Reducer) runs over NCCL on GPUs
//! ([`ProcessGroup`](crate::ProcessGroup), feature `cuda`) and over the TCP store on CPUs
//! ([`StoreCommunicator`](crate::StoreCommunicator), PyTorch's gloo role: slow, correct, and
//! runnable on CI without a GPU).
//!
//! This file declares the interface only (Part 1.11 of the house style: interfaces are
//! leaves); the implementations live beside the types they wrap.

use berth::Tensor;

use crate::error::Result;
use crate::rendezvous::Rendezvous;

/// A collective in flight. [`wait`](PendingWork::wait) orders later work on the caller's
/// compute stream after it (on the CPU it has already finished).
pub trait PendingWork {
    /// Makes later compute see the collective's result (on a GPU: the compute stream waits
    /// the collective's end event; the host does not block).
    ///
    /// # Errors
    /// [`DistError::Cuda`](crate::DistError::Cuda) when the driver fails.
    fn wait(self) -> Result<()>;
}

/// The collectives of data-parallel training, over one rank's tensors.
///
/// Every rank must issue the same collectives in the same order (as with any process group).
/// Tensors are contiguous `f32` on the communicator's device; the result is written in place.
pub trait Communicator {
    /// A collective in flight.
    type Work: PendingWork;

    /// This process's rank, `0..world_size`.
    fn rank(&self) -> usize;

    /// The number of ranks.
    fn world_size(&self) -> usize;

    /// The job's rendezvous: its store carries host-side metadata (each rank's report).
    fn rendezvous(&self) -> &Rendezvous;

    /// Starts summing `t` over the ranks, in place (`dist.all_reduce(t, ReduceOp.SUM,
    /// async_op=True)`); `t` must not be read or written until the returned work is waited.
    ///
    /// # Errors
    /// [`DistError::InvalidTensor`](crate::DistError::InvalidTensor) for a tensor the
    /// communicator cannot take (wrong device, not contiguous, not f32); transport errors
    /// ([`DistError::Cuda`](crate::DistError::Cuda), [`DistError::Io`](crate::DistError::Io),
    /// [`DistError::KeyTimeout`](crate::DistError::KeyTimeout) when a rank never sends).
    fn all_reduce_sum(&self, t: &Tensor) -> Result<Self::Work>;

    /// Copies rank `src`'s `t` into every rank's `t` (`dist.broadcast(t, src)`), ordered
    /// before later compute on return.
    ///
    /// # Errors
    /// As [`all_reduce_sum`](Self::all_reduce_sum).
    fn broadcast(&self, t: &Tensor, src: usize) -> Result<()>;

    /// Ends the group: waits for this rank's queued collectives and for every rank to finish
    /// with rank 0's store ([`Rendezvous::finish`]).
    ///
    /// # Errors
    /// As [`Rendezvous::finish`]; [`DistError::Cuda`](crate::DistError::Cuda).
    fn finish(self) -> Result<()>
    where
        Self: Sized;
}
