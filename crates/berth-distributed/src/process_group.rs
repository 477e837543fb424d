//! `ProcessGroup`: one process per GPU, NCCL collectives on berth tensors, PyTorch's
//! `ProcessGroupNCCL` shape (`init_process_group("nccl")`, `all_reduce`, `broadcast`,
//! `all_gather_into_tensor`, `reduce_scatter_tensor`, `barrier`, each returning a [`Work`]).
//!
//! Each collective is ordered with the compute stream by events and keeps its tensors alive
//! by reference (Note [Collective stream ordering] in `src/collective.rs`, shared with
//! [`LocalGroup`](crate::LocalGroup)).

use std::time::Duration;

use berth::cuda::{CudaError, Stream};
use berth::{DType, Device, Tensor};
use berth_cuda::nccl::{unique_id, Communicator, NcclDType, ReduceOp};

use crate::collective::{check_sizes, nccl_dtype, ordered, Work};
use crate::env::RendezvousEnv;
use crate::error::{DistError, Result};
use crate::rendezvous::Rendezvous;

/// A group of one process per GPU with an NCCL communicator (`ProcessGroupNCCL`).
#[derive(Debug)]
pub struct ProcessGroup {
    comm: Communicator,
    comm_stream: Stream,
    device: usize,
    rdzv: Rendezvous,
}

impl ProcessGroup {
    /// Joins the job in `env` (torchrun's variables, [`RendezvousEnv::from_env`]) on GPU
    /// `LOCAL_RANK`: the rendezvous, rank 0's `ncclGetUniqueId` handed to every rank through
    /// the store, `ncclCommInitRank` (PyTorch's `init_process_group("nccl")` with
    /// `init_method="env://"`).
    ///
    /// # Errors
    /// The rendezvous's errors ([`Rendezvous::join`]); [`DistError::Cuda`] when the device or
    /// NCCL is not available (`CudaError::NcclUnavailable`) or NCCL fails.
    pub fn init(env: RendezvousEnv, timeout: Duration) -> Result<ProcessGroup> {
        let device = env.local_rank;
        let rdzv = Rendezvous::join(env, timeout)?;
        Self::from_rendezvous(rdzv, device)
    }

    /// As [`init`](Self::init), on a joined rendezvous and a chosen `device`.
    ///
    /// # Errors
    /// As [`init`](Self::init).
    pub fn from_rendezvous(rdzv: Rendezvous, device: usize) -> Result<ProcessGroup> {
        berth::cuda::check_device(device)?;
        let id = rdzv.broadcast_from_rank0("nccl_unique_id", || Ok(unique_id()?.to_vec()))?;
        let id: [u8; 128] = id.try_into().map_err(|v: Vec<u8>| DistError::Protocol {
            addr: rdzv.store().addr().to_string(),
            what: format!("the NCCL unique id has {} bytes, not 128", v.len()),
        })?;
        let comm = Communicator::init_rank(device, rdzv.world_size(), rdzv.rank(), &id)?;
        let comm_stream = Stream::new(device, 0)?;
        Ok(ProcessGroup {
            comm,
            comm_stream,
            device,
            rdzv,
        })
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.rdzv.rank()
    }

    /// The number of processes.
    pub fn world_size(&self) -> usize {
        self.rdzv.world_size()
    }

    /// The GPU this rank uses.
    pub fn device(&self) -> usize {
        self.device
    }

    /// The rendezvous (its store, host-side barriers).
    pub fn rendezvous(&self) -> &Rendezvous {
        &self.rdzv
    }

    /// Checks `t` and gives its NCCL element type.
    fn check(&self, op: &'static str, t: &Tensor) -> Result<NcclDType> {
        if t.device() != Device::Cuda(self.device as u16) {
            return Err(DistError::InvalidTensor {
                op,
                what: format!(
                    "the tensor is on {}; this rank's collectives take tensors on cuda:{}",
                    t.device(),
                    self.device
                ),
            });
        }
        nccl_dtype(op, t)
    }

    /// Note [Collective stream ordering] around `launch`, on this rank's communication stream.
    fn run(
        &self,
        keep: Vec<Tensor>,
        launch: impl FnOnce(&Stream) -> std::result::Result<(), CudaError>,
    ) -> Result<Work> {
        ordered(std::slice::from_ref(&self.comm_stream), keep, || {
            launch(&self.comm_stream)
        })
    }

    /// All-reduces `t` in place over the ranks (`dist.all_reduce(t, op)`).
    ///
    /// # Errors
    /// [`DistError::InvalidTensor`] for a tensor not on this rank's GPU, not contiguous, or of
    /// a type NCCL cannot reduce; [`DistError::Cuda`].
    pub fn all_reduce(&self, t: &Tensor, op: ReduceOp) -> Result<Work> {
        let dtype = self.check("all_reduce", t)?;
        let (ptr, n) = (t.data_ptr(), t.numel());
        self.run(vec![t.alias()], |s| {
            // SAFETY: `t` is a contiguous tensor of `n` elements on this device, kept alive by
            // the Work until the compute stream waits the collective (Note [Collective stream
            // ordering]); the group issues its collectives from `&self` one at a time in the
            // caller's order.
            unsafe { self.comm.all_reduce(ptr, ptr, n, dtype, op, s) }
        })
    }

    /// Broadcasts `t` from rank `src` to every rank, in place (`dist.broadcast(t, src)`).
    ///
    /// # Errors
    /// As [`all_reduce`](Self::all_reduce); [`DistError::Cuda`] with
    /// `CudaError::InvalidArgument` when `src` is not a rank.
    pub fn broadcast(&self, t: &Tensor, src: usize) -> Result<Work> {
        let dtype = self.check("broadcast", t)?;
        let (ptr, n) = (t.data_ptr(), t.numel());
        self.run(vec![t.alias()], |s| {
            // SAFETY: as all_reduce.
            unsafe { self.comm.broadcast(ptr, ptr, n, dtype, src, s) }
        })
    }

    /// Gathers every rank's `input` into `output`, in rank order
    /// (`dist.all_gather_into_tensor(output, input)`): `output` has `world_size ×
    /// input.numel()` elements of `input`'s type.
    ///
    /// # Errors
    /// As [`all_reduce`](Self::all_reduce); [`DistError::InvalidTensor`] when the sizes or
    /// types do not match.
    pub fn all_gather(&self, output: &Tensor, input: &Tensor) -> Result<Work> {
        let dtype = self.check("all_gather", input)?;
        self.check_pair("all_gather", "the output", output, input, input.numel())?;
        let (o, i, n) = (output.data_ptr(), input.data_ptr(), input.numel());
        self.run(vec![output.alias(), input.alias()], |s| {
            // SAFETY: as all_reduce; `output` holds world_size × n elements (checked).
            unsafe { self.comm.all_gather(i, o, n, dtype, s) }
        })
    }

    /// Reduces `input` over the ranks and keeps this rank's share in `output`
    /// (`dist.reduce_scatter_tensor(output, input, op)`): `input` has `world_size ×
    /// output.numel()` elements.
    ///
    /// # Errors
    /// As [`all_gather`](Self::all_gather).
    pub fn reduce_scatter(&self, output: &Tensor, input: &Tensor, op: ReduceOp) -> Result<Work> {
        let dtype = self.check("reduce_scatter", output)?;
        self.check_pair("reduce_scatter", "the input", input, output, output.numel())?;
        let (o, i, n) = (output.data_ptr(), input.data_ptr(), output.numel());
        self.run(vec![output.alias(), input.alias()], |s| {
            // SAFETY: as all_reduce; `input` holds world_size × n elements (checked).
            unsafe { self.comm.reduce_scatter(i, o, n, dtype, op, s) }
        })
    }

    /// Checks that `big` is on this GPU with `world_size × per_rank` elements of `small`'s type.
    fn check_pair(
        &self,
        op: &'static str,
        which: &str,
        big: &Tensor,
        small: &Tensor,
        per_rank: usize,
    ) -> Result<()> {
        self.check(op, big)?;
        check_sizes(op, which, big, small, per_rank * self.world_size())
    }

    /// Waits on the host until every rank has reached this barrier and the collectives queued
    /// before it have finished on this GPU (`dist.barrier()`, which PyTorch's NCCL group also
    /// implements as a one-element all-reduce).
    ///
    /// # Errors
    /// As [`all_reduce`](Self::all_reduce).
    pub fn barrier(&self) -> Result<()> {
        let one = Tensor::zeros(&[1], DType::F32, Device::Cuda(self.device as u16))?;
        let work = self.all_reduce(&one, ReduceOp::Sum)?;
        work.synchronize_host()?;
        work.wait()
    }
}

impl ProcessGroup {
    /// Ends the group (`destroy_process_group`): waits for this rank's queued collectives,
    /// then [`Rendezvous::finish`] (rank 0 keeps its store until every rank has finished).
    ///
    /// # Errors
    /// [`DistError::Cuda`]; as [`Rendezvous::finish`].
    pub fn finish(self) -> Result<()> {
        self.comm_stream.synchronize()?;
        let ProcessGroup { comm, rdzv, .. } = self;
        drop(comm);
        rdzv.finish()
    }
}

impl crate::communicator::Communicator for ProcessGroup {
    type Work = Work;

    fn rank(&self) -> usize {
        ProcessGroup::rank(self)
    }

    fn world_size(&self) -> usize {
        ProcessGroup::world_size(self)
    }

    fn rendezvous(&self) -> &Rendezvous {
        &self.rdzv
    }

    fn all_reduce_sum(&self, t: &Tensor) -> Result<Work> {
        self.all_reduce(t, ReduceOp::Sum)
    }

    fn broadcast(&self, t: &Tensor, src: usize) -> Result<()> {
        ProcessGroup::broadcast(self, t, src)?.wait()
    }

    fn finish(self) -> Result<()> {
        ProcessGroup::finish(self)
    }
}
